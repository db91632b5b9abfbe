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
* **A10G** ``compute_efficiency`` and ``kernel_overhead_s`` (its host, AWS g5), and the host launch cost
  (``GPUPool.kernel_overhead_s``) of FASOP's AWS p4d A100 machines and of its RTX 3090 server
  (:data:`hetplan.estimate.validation.FASOP_HOSTS`) — robust least squares (soft-L1, scale 0.1) on
  log(predicted / measured) over the calibration half of ``fasop_layers`` (FASOP's per-layer forward times at
  micro-batch 1; :func:`fit_fasop`). A100's e_max / x½ stay the vTrain fit, RTX 3090's e_max the Espresso-trace fit
  (FASOP has one TP-1 row for it, which cannot separate its host floor from its efficiency). ``gemm_half_dim`` of
  A10G stays the A100 value (micro-batch-1 data do not identify it). A leave-one-model-out cross-validation
  (:func:`cross_validate_fasop`) reports the error on models the fit has not seen.

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


A10G = "A10G"


def _fasop_set(theta) -> None:
    """Install (A10G e_max, A10G/g5 kernel overhead, p4d kernel overhead, RTX 3090 host kernel overhead)."""
    e, tau_g5, tau_p4d, tau_3090 = (float(x) for x in theta)
    validation.CATALOG = _catalog_with({A10G: {"compute_efficiency": min(e, 1.0), "kernel_overhead_s": tau_g5}})
    hosts = dict(validation.FASOP_HOSTS)
    hosts["A100-SXM-40GB"] = (hosts["A100-SXM-40GB"][0], tau_p4d)
    hosts["RTX-3090"] = (hosts["RTX-3090"][0], tau_3090)
    validation.FASOP_HOSTS = hosts


def _fit_fasop_rows(rows, x0=(0.6, 70e-6, 70e-6, 70e-6)):
    from scipy.optimize import least_squares

    hosts0 = validation.FASOP_HOSTS

    def resid(theta):
        _fasop_set(theta)
        return np.array([np.log(validation.fasop_layer_forward_s(m, dev, s, tp) / meas)
                         for _, m, s, dev, tp, meas in rows])

    try:
        sol = least_squares(resid, x0=np.array(x0), bounds=([0.05, 0.0, 0.0, 0.0], [1.0, 3e-4, 3e-4, 3e-4]),
                            x_scale=np.array([0.1, 1e-5, 1e-5, 1e-5]), diff_step=1e-3, loss="soft_l1", f_scale=0.1)
    finally:
        validation.CATALOG = None
        validation.FASOP_HOSTS = hosts0
    return sol


def _fasop_errors(theta, rows) -> np.ndarray:
    hosts0 = validation.FASOP_HOSTS
    try:
        _fasop_set(theta)
        return np.array([validation.fasop_layer_forward_s(m, dev, s, tp) / meas - 1 for _, m, s, dev, tp, meas in rows])
    finally:
        validation.CATALOG = None
        validation.FASOP_HOSTS = hosts0


def fit_fasop() -> dict:
    """Fit A10G's e_max and g5 kernel overhead and the p4d / RTX 3090 host kernel overheads on the calibration half
    of ``fasop_layers`` (rows chosen by a hash of ``fasop:{model}:{gpu}:tp{t}``); report the error on both halves."""
    rows = validation.fasop_rows()
    keys = [f"fasop:{r[0]}:{r[3]}:tp{r[4]}" for r in rows]
    cal_mask = [validation._is_calibration(k, validation.FASOP_CALIBRATION_FRACTION) for k in keys]
    cal = [r for r, c in zip(rows, cal_mask) if c]
    held = [r for r, c in zip(rows, cal_mask) if not c]
    sol = _fit_fasop_rows(cal)
    e, tau_g5, tau_p4d, tau_3090 = (float(x) for x in sol.x)
    err_cal, err_held = _fasop_errors(sol.x, cal), _fasop_errors(sol.x, held)
    return {"A10G_compute_efficiency": e, "A10G_kernel_overhead_s": tau_g5, "p4d_kernel_overhead_s": tau_p4d,
            "rtx3090_host_kernel_overhead_s": tau_3090,
            "calibration": {"n": len(cal), "mape": float(np.mean(np.abs(err_cal)))},
            "held_out": {"n": len(held), "mape": float(np.mean(np.abs(err_held))),
                         "max_abs_error": float(np.max(np.abs(err_held)))}}


def cross_validate_fasop() -> dict:
    """Leave-one-model-out: for each FASOP model, fit the four constants of :func:`fit_fasop` on all rows of the
    other models and report the MAPE on the left-out model's rows (A100, A10G, RTX 3090; TP 1/2/4)."""
    rows = validation.fasop_rows()
    out = {}
    for label in dict.fromkeys(r[0] for r in rows):
        train = [r for r in rows if r[0] != label]
        test = [r for r in rows if r[0] == label]
        sol = _fit_fasop_rows(train)
        err = _fasop_errors(sol.x, test)
        out[label] = {"n": len(test), "mape": float(np.mean(np.abs(err))), "max_abs_error": float(np.max(np.abs(err))),
                      "A10G_compute_efficiency": float(sol.x[0])}
    allerr = np.concatenate([[out[k]["mape"]] * out[k]["n"] for k in out])
    out["all"] = {"n": len(rows), "mape": float(np.mean(allerr))}
    return out


def main(argv: list[str] | None = None) -> int:
    """Print the fitted constants as JSON."""
    out = {"A100": fit_a100(), "V100": fit_v100(), "FASOP": fit_fasop(), "FASOP_leave_one_model_out": cross_validate_fasop()}
    json.dump(out, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
