"""Calibration and validation of the estimator against public measurements (above :mod:`hetplan.estimate`).

* :mod:`hetplan.calibration.validation` — the named validation sets (:data:`~hetplan.calibration.validation.SETS`)
  and their metrics (``hetplan validate``); every prediction takes the fitted constants as data
  (:class:`~hetplan.calibration.validation.Constants`);
* :mod:`hetplan.calibration.modern` — the modern H100 / H200 / B200 / GB200 sets, one module per source, and
  :mod:`hetplan.calibration.modern_fit`, the GEMM efficiencies fitted on their seeded fraction;
* :mod:`hetplan.calibration.independent` — ``independent_h100``, published H100 runs (a seeded half of llm-foundry's
  fitted that stack's residuals, the rest held out), and ``llm_foundry_a100``, llm-foundry's A100 runs, held out;
* :mod:`hetplan.calibration.serving` — the ``serving`` set (engines' published measurements);
* :mod:`hetplan.calibration.calibrate` — the fits of the constants (``python -m hetplan.calibration.calibrate``);
* :mod:`hetplan.calibration.traces` — Espresso's measured heterogeneous DeepSpeed pipelines;
* :mod:`hetplan.calibration.intervals` — the 80 % prediction interval of a plan from its regime's residuals;
* :mod:`hetplan.calibration.user` and :mod:`hetplan.calibration.logs` — a user's own runs (RUNS CSVs, Megatron-LM
  and torchtitan logs) into residual factors and intervals (``hetplan calibrate``).
"""
