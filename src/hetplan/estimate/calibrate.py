"""Reproduce the fit of the estimator's per-GPU constants (``python -m hetplan.estimate.calibrate``).

What is fitted, on which data (everything else is held out, see :mod:`hetplan.estimate.validation`):

* **A100** (``A100-SXM-80GB`` and, by the same silicon, ``A100-SXM-40GB``): ``compute_efficiency`` (large-GEMM
  efficiency e_max), ``gemm_half_dim`` (x½ of the shape factor) and ``kernel_overhead_s``, plus the intra-node
  collective step latency :data:`hetplan.estimate.comm.ALPHA_INTRA_NODE_S` — least squares on
  log(predicted / measured) over the
  calibration rows of ``vtrain_single_node`` and ``vtrain_multi_node`` (a seeded 25 % of each, chosen by a hash
  of the row: ``validation.Case.is_calibration``). Megatron SC'21 and Korthikanti Table 5 are entirely held out.
* **V100** (``V100-SXM-32GB``): ``compute_efficiency`` on the TP-1 rows of Aceso's per-layer V100 profile
  (``gemm_half_dim`` and ``kernel_overhead_s`` kept at the A100 values).

Link efficiencies and the inter-node latency are not fitted: they come from NCCL-tests
(:mod:`hetplan.estimate.comm`). The smooth-maximum exponent :data:`hetplan.estimate.compute.FLOOR_NORM` = 4 was
chosen among {2, 4, 8} by the same calibration residual (rms 0.103 / 0.101 / 0.107).

The fit prints the constants; they are then written (by hand, in a reviewed commit) into
``hardware/data/gpus.toml`` (per GPU; the A100 values are also the ``GPUSpec`` defaults of ``gemm_half_dim`` and
``kernel_overhead_s``) and ``estimate/comm.py`` (α).
"""

from __future__ import annotations

import json
import sys

import numpy as np

from hetplan.estimate import comm, validation
from hetplan.hardware.catalog import Catalog, load_catalog

A100_NAMES = ("A100-SXM-80GB", "A100-SXM-40GB")


def _catalog_with(updates: dict[str, dict]) -> Catalog:
    base = load_catalog()
    gpus = dict(base.gpus)
    for name, upd in updates.items():
        gpus[name] = gpus[name].model_copy(update=upd)
    return Catalog(gpus, base.date)


def _log_residuals(cases) -> np.ndarray:
    return np.array([np.log(c.predict() / c.measured) for c in cases])


def fit_a100(cases=None, x0=(0.8, 150.0, 45e-6, 5e-6)) -> dict:
    """Fit (e_max, x½, kernel overhead) of A100 and the intra-node collective step latency α on the vTrain
    calibration rows: least squares on log(predicted / measured)."""
    from scipy.optimize import least_squares

    if cases is None:
        cases = [c for c in validation.vtrain_cases("single") + validation.vtrain_cases("multi") if c.is_calibration]
    alpha0 = comm.ALPHA_INTRA_NODE_S

    def resid(theta):
        e, half, tau, alpha = theta
        comm.ALPHA_INTRA_NODE_S = float(alpha)
        upd = {"compute_efficiency": float(min(e, 1.0)), "gemm_half_dim": float(half), "kernel_overhead_s": float(tau)}
        validation.CATALOG = _catalog_with({n: upd for n in A100_NAMES})
        return _log_residuals(cases)

    try:
        sol = least_squares(resid, x0=np.array(x0), bounds=([0.3, 0.0, 0.0, 0.0], [1.0, 1024.0, 1e-4, 1e-4]),
                            x_scale=np.array([0.1, 32.0, 5e-6, 5e-6]), diff_step=1e-3)
    finally:
        validation.CATALOG = None
        comm.ALPHA_INTRA_NODE_S = alpha0
    e, half, tau, alpha = sol.x
    return {"compute_efficiency": float(e), "gemm_half_dim": float(half), "kernel_overhead_s": float(tau),
            "alpha_intra_node_s": float(alpha), "rms_log_error": float(np.sqrt(np.mean(sol.fun**2))), "n": len(cases)}


def fit_v100() -> dict:
    """Fit e_max of V100 on Aceso's per-op profile: the geometric mean of measured / predicted-at-e_max=1 over the
    16 forward times of the four linear GEMMs (QKV, attention output, MLP up, MLP down) of GPT-3 1.3B at TP 1,
    micro-batch 1/2/4/8 (no TP communication inside them). ``gemm_half_dim`` and ``kernel_overhead_s`` stay at
    the A100 values. Whole-layer times at TP 2/4 are held out (``aceso_v100`` set)."""
    import csv

    from hetplan.estimate import compute

    gpu = load_catalog().get("V100-SXM-32GB").model_copy(update={"compute_efficiency": 1.0})
    h = 2048
    ratios = []
    for mbs in (1, 2, 4, 8):
        text = validation._data(f"aceso_v100/gpt_1_3B_mbs{mbs}_tp1_algo0.csv")
        rows = {r["op_name"]: r for r in csv.DictReader(text.splitlines())}
        T = mbs * 2048
        shapes = {"enc-attention-qkv": (T, 3 * h, h), "enc-attention-dense": (T, h, h),
                  "enc-MLP-GEMM-1": (T, 4 * h, h), "enc-MLP-GEMM-2": (T, h, 4 * h)}
        for op, (M, N, K) in shapes.items():
            pred = float(compute.gemm_time_s(gpu, "fp16", M, N, K))
            ratios.append(pred / (float(rows[op]["forward-compute"]) / 1e6))
    logs = np.log(ratios)
    return {"compute_efficiency": float(np.exp(logs.mean())), "rms_log_error": float(logs.std()), "n": len(ratios)}


def main(argv: list[str] | None = None) -> int:
    """Print the fitted constants as JSON."""
    out = {"A100": fit_a100(), "V100": fit_v100()}
    json.dump(out, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
