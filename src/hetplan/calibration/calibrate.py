"""Reproduce the fit of the estimator's per-GPU constants (``python -m hetplan.calibration.calibrate``).

Every fit evaluates its trial values by passing them as data (:class:`hetplan.calibration.validation.Constants`:
catalog, communication constants, FASOP's host launch costs) to the predictions; no module state is rewritten.

What is fitted, on which data (everything else is held out, see :mod:`hetplan.calibration.validation`):

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
  (:data:`hetplan.calibration.validation.FASOP_HOSTS`) — robust least squares (soft-L1, scale 0.1) on
  log(predicted / measured) over the calibration half of ``fasop_layers`` (FASOP's per-layer forward times at
  micro-batch 1; :func:`fit_fasop`). A100's e_max / x½ stay the vTrain fit, RTX 3090's e_max the Espresso-trace fit
  (FASOP has one TP-1 row for it, which cannot separate its host floor from its efficiency). ``gemm_half_dim`` of
  A10G stays the A100 value (micro-batch-1 data do not identify it). A leave-one-model-out cross-validation
  (:func:`cross_validate_fasop`) reports the error on models the fit has not seen.
* **A30, RTX A4000, RTX A6000, RTX 3090** ``compute_efficiency`` — on Espresso's measured DeepSpeed pipelines
  (``../shared/data/traces/espresso_hetero`` or ``$HETPLAN_ESPRESSO_TRACES``; not package data, skipped when
  absent): per GPU type, the value at which the mean forward-time error of its stages in the calibration runs
  (:data:`~hetplan.calibration.traces.ESPRESSO_CALIBRATION_RUNS`) is zero, evaluated with the attention the runs used (fused,
  ``attention="flash"``, on these four types; :data:`~hetplan.calibration.traces.ESPRESSO_STANDARD_ATTENTION_GPUS`) and
  ``framework="deepspeed"``; backward times and the other runs are held out (:func:`fit_espresso`, which also
  reports the standard-attention fit the catalog held before). ``gemm_half_dim`` and ``kernel_overhead_s`` stay
  the A100 values. The catalog bounds ``compute_efficiency`` by 1; the RTX 3090 needs more (its stages run
  faster than 71 TFLOP/s FP32-accumulate at the rated boost clock allow) and stays at 1.

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
from dataclasses import replace
from pathlib import Path

import numpy as np

from hetplan.calibration import validation
from hetplan.calibration.traces import (ESPRESSO_CALIBRATION_RUNS, ESPRESSO_FITTED, ESPRESSO_TRACES, espresso_attention,
                                        espresso_plan, espresso_runs, read_pipeline)
from hetplan.calibration.validation import Constants
from hetplan.estimate.comm import CommConstants
from hetplan.hardware.catalog import Catalog, load_catalog

A100_NAMES = ("A100-SXM-80GB", "A100-SXM-40GB")


def _catalog_with(updates: dict[str, dict]) -> Catalog:
    base = load_catalog()
    gpus = dict(base.gpus)
    for name, upd in updates.items():
        gpus[name] = gpus[name].model_copy(update=upd)
    return Catalog(gpus, base.date)


def _log_residuals(cases, constants: Constants) -> np.ndarray:
    return np.array([np.log(c.predict(constants) / c.measured) for c in cases])


def fit_a100(cases=None, x0=(0.8, 150.0, 45e-6, 5e-6)) -> dict:
    """Fit (e_max, x½, kernel overhead) of A100 and the intra-node collective step latency α on the vTrain
    calibration rows: least squares on log(predicted / measured)."""
    from scipy.optimize import least_squares

    if cases is None:
        cases = [c for c in validation.vtrain_cases("single") + validation.vtrain_cases("multi") if c.is_calibration]

    def resid(theta):
        e, half, tau, alpha = theta
        upd = {"compute_efficiency": float(min(e, 1.0)), "gemm_half_dim": float(half), "kernel_overhead_s": float(tau)}
        return _log_residuals(cases, Constants(catalog=_catalog_with({n: upd for n in A100_NAMES}),
                                               comm=CommConstants(alpha_intra_node_s=float(alpha))))

    sol = least_squares(resid, x0=np.array(x0), bounds=([0.3, 0.0, 0.0, 0.0], [1.0, 1024.0, 1e-4, 1e-4]),
                        x_scale=np.array([0.1, 32.0, 5e-6, 5e-6]), diff_step=1e-3)
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


def fasop_constants(theta, base: Constants = validation.DEFAULT) -> Constants:
    """``base`` with (A10G e_max, A10G/g5 kernel overhead, p4d kernel overhead, RTX 3090 host kernel overhead)."""
    e, tau_g5, tau_p4d, tau_3090 = (float(x) for x in theta)
    hosts = dict(base.fasop_hosts)
    hosts["A100-SXM-40GB"] = (hosts["A100-SXM-40GB"][0], tau_p4d)
    hosts["RTX-3090"] = (hosts["RTX-3090"][0], tau_3090)
    return replace(base, catalog=_catalog_with({A10G: {"compute_efficiency": min(e, 1.0), "kernel_overhead_s": tau_g5}}),
                   fasop_hosts=hosts)


def _fit_fasop_rows(rows, x0=(0.6, 70e-6, 70e-6, 70e-6)):
    from scipy.optimize import least_squares

    def resid(theta):
        c = fasop_constants(theta)
        return np.array([np.log(validation.fasop_layer_forward_s(m, dev, s, tp, 1, c) / meas)
                         for _, m, s, dev, tp, meas in rows])

    return least_squares(resid, x0=np.array(x0), bounds=([0.05, 0.0, 0.0, 0.0], [1.0, 3e-4, 3e-4, 3e-4]),
                         x_scale=np.array([0.1, 1e-5, 1e-5, 1e-5]), diff_step=1e-3, loss="soft_l1", f_scale=0.1)


def _fasop_errors(theta, rows) -> np.ndarray:
    c = fasop_constants(theta)
    return np.array([validation.fasop_layer_forward_s(m, dev, s, tp, 1, c) / meas - 1 for _, m, s, dev, tp, meas in rows])


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
    allerr = np.concatenate([np.full(out[k]["n"], out[k]["mape"]) for k in out])
    out["all"] = {"n": len(rows), "mape": float(np.mean(allerr))}
    return out


# --- Espresso's DeepSpeed traces (hetplan.calibration.traces): compute_efficiency of A30, RTX A4000, RTX A6000,
# RTX 3090 --------------------------------------------------------------------------------------------------------

class EspressoTraces:
    """The traced stages, read once, and their predictions under any catalog.

    Attributes:
        stages: one dict per traced stage: ``run``, ``stage``, ``gpu``, ``calibration`` (bool), ``forward_s``,
            ``backward_s`` (measured medians, seconds), ``memory_bytes`` (measured allocated peak).
        skipped: runs that could not be read.
    """

    def __init__(self, root: Path | None = None):
        self.skipped: list[str] = []
        self.runs = list(espresso_runs(root, self.skipped))
        if not self.runs:
            raise FileNotFoundError(f"no motivation1_* runs under {ESPRESSO_TRACES if root is None else root} "
                                    "(set HETPLAN_ESPRESSO_TRACES to Espresso's trace folder)")
        self.stages = []
        for name, gpus, _, folders in self.runs:
            tp = read_pipeline(name, gpus, folders)
            for i in range(len(folders)):
                self.stages.append({"run": name, "stage": i, "gpu": gpus[i],
                                    "calibration": name in ESPRESSO_CALIBRATION_RUNS,
                                    "forward_s": tp.forward_s[i], "backward_s": tp.backward_s[i],
                                    "memory_bytes": tp.memory_bytes[i]})

    def predict(self, catalog: Catalog | None = None, attention: str = "auto", framework: str = "deepspeed",
                gpus: set[str] | None = None) -> list[dict | None]:
        """Predicted ``forward_s``, ``backward_s`` and allocated peak ``memory_bytes`` (states + activations +
        transient: what ``max_memory_allocated`` counts, no CUDA context or allocator margin) per stage, with the
        stage's attention (:func:`espresso_attention`). ``gpus``: only runs holding one of these types (the
        others' entries are None)."""
        from hetplan.estimate.estimator import estimate_detailed

        catalog = catalog or load_catalog()
        out: list[dict | None] = []
        for name, kinds, bounds, folders in self.runs:
            if gpus is not None and not set(kinds) & gpus:
                out += [None] * len(folders)
                continue
            costs: dict = {}
            for att in sorted({espresso_attention(g, attention) for g in kinds}):
                plan, m = espresso_plan(kinds, bounds, att, framework)
                est, _, c, _ = estimate_detailed(plan, catalog, m)
                costs[att] = (est, c)
            for i, g in enumerate(kinds):
                est, c = costs[espresso_attention(g, attention)]
                mem = c[i].memory
                out.append({"forward_s": est.stages[i].forward_s, "backward_s": est.stages[i].backward_s,
                            "memory_bytes": float(mem.weights + mem.gradients + mem.optimizer
                                                  + mem.activations + mem.transient)})
        return out

    def errors(self, predictions: list[dict | None]) -> dict:
        """Per GPU type and part (``calibration`` / ``held_out``): ``n`` and, for ``forward`` / ``backward`` /
        ``memory``, the mean signed and mean absolute error of ours / measured - 1 (fractions)."""
        out: dict = {}
        for st, pr in zip(self.stages, predictions):
            if pr is None:
                continue
            part = out.setdefault(st["gpu"], {}).setdefault("calibration" if st["calibration"] else "held_out", [])
            part.append([pr[k] / st[k] - 1 for k in ("forward_s", "backward_s", "memory_bytes")])
        res: dict = {}
        for g, parts in sorted(out.items()):
            res[g] = {}
            for part, errs in parts.items():
                e = np.array(errs)
                res[g][part] = {"n": len(e), **{f"{k}_{stat}": float(fn(e[:, j]))
                                                for j, k in enumerate(("forward", "backward", "memory"))
                                                for stat, fn in (("mean", np.mean), ("mape", lambda x: np.mean(np.abs(x))))}}
        return res


def _catalog_efficiencies(base: Catalog, effs: dict[str, float]) -> Catalog:
    """``base`` with the given ``compute_efficiency`` values. ``model_copy`` does not validate, so a value above
    the catalog's limit of 1 can be tried (to report what an unconstrained fit would need)."""
    gpus = dict(base.gpus)
    for name, e in effs.items():
        gpus[name] = gpus[name].model_copy(update={"compute_efficiency": float(e)})
    return Catalog(gpus, base.date)


def fit_espresso_efficiency(traces: EspressoTraces, attention: str = "auto", gpus=ESPRESSO_FITTED,
                            upper: float = 2.0) -> dict[str, dict]:
    """Per GPU type: the ``compute_efficiency`` at which the mean forward-time error of its **calibration** stages
    (:data:`~hetplan.calibration.traces.ESPRESSO_CALIBRATION_RUNS`) is zero (Brent's root search, other catalog figures unchanged). Backward
    times are not fitted (they check the fit). Returns ``{gpu: {"fitted": e (unconstrained, up to upper),
    "catalog": min(e, 1), "capped": e > 1}}`` — the catalog bounds ``compute_efficiency`` by 1."""
    from scipy.optimize import brentq

    base = load_catalog()
    out = {}
    for g in gpus:
        idx = [i for i, st in enumerate(traces.stages) if st["gpu"] == g and st["calibration"]]

        def err(e, g=g, idx=idx):
            pred = traces.predict(_catalog_efficiencies(base, {g: e}), attention, gpus={g})
            return float(np.mean([pred[i]["forward_s"] / traces.stages[i]["forward_s"] - 1 for i in idx]))

        e = float(brentq(err, 0.05, upper, xtol=1e-5))
        out[g] = {"fitted": round(e, 3), "catalog": round(min(e, 1.0), 3), "capped": e > 1.0,
                  "n_calibration": len(idx)}
    return out


def fit_espresso(root: Path | None = None) -> dict:
    """The Espresso-trace fit, before and after taking the attention the runs used into account:

    * ``standard``: every stage evaluated with standard attention (s x s element-wise passes), as the catalog
      values until this fit were obtained;
    * ``auto`` (the catalog values): fused attention (``attention="flash"``) on every traced GPU type but the A10G
      (:data:`ESPRESSO_STANDARD_ATTENTION_GPUS`), ``framework="deepspeed"``.

    Each is fitted on the calibration runs only; forward and backward errors per GPU type on the calibration and
    held-out stages, with the efficiencies the fit puts in the catalog (capped at 1). ``compute_efficiency`` does
    not change memory: ``benchmarks/bench_memory_traces.py`` reports it."""
    traces = EspressoTraces(root)
    base = load_catalog()
    out = {"calibration_runs": sorted(ESPRESSO_CALIBRATION_RUNS), "skipped_runs": traces.skipped,
           "catalog_now": {g: base.get(g).compute_efficiency for g in ESPRESSO_FITTED}}
    for attention in ("standard", "auto"):
        fit = fit_espresso_efficiency(traces, attention)
        cat = _catalog_efficiencies(base, {g: v["catalog"] for g, v in fit.items()})
        errs = traces.errors(traces.predict(cat, attention))
        out[attention] = {"compute_efficiency": fit,
                          "errors": {g: {part: {k: v for k, v in e.items() if not k.startswith("memory")}
                                         for part, e in parts.items()} for g, parts in errs.items()}}
    return out


def main(argv: list[str] | None = None) -> int:
    """Print the fitted constants as JSON."""
    out = {"A100": fit_a100(), "V100": fit_v100(), "FASOP": fit_fasop(), "FASOP_leave_one_model_out": cross_validate_fasop()}
    try:
        out["Espresso"] = fit_espresso()
    except FileNotFoundError as exc:  # the traces are not package data
        out["Espresso"] = {"skipped": str(exc)}
    json.dump(out, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
