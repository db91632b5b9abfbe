"""Calibration and validation of the estimator against public measurements (above :mod:`hetplan.estimate`).

* :mod:`hetplan.calibration.validation` — the named validation sets (:data:`~hetplan.calibration.validation.SETS`)
  and their metrics (``hetplan validate``); every prediction takes the fitted constants as data
  (:class:`~hetplan.calibration.validation.Constants`);
* :mod:`hetplan.calibration.modern` — the modern H100 / H200 / B200 / GB200 sets;
* :mod:`hetplan.calibration.calibrate` — the fits of those constants (``python -m hetplan.calibration.calibrate``);
* :mod:`hetplan.calibration.traces` — Espresso's measured heterogeneous DeepSpeed pipelines.
"""
