"""Loading, predicting and scoring the modern sets: :func:`run_modern` predicts every expressible row of the sets
with :func:`hetplan.estimate.estimator.estimate` and reports the metrics of :func:`set_metrics` per set."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable

import numpy as np

from hetplan.calibration.modern.bigscience import bigscience_cases, oom_check
from hetplan.calibration.modern.dgxc import dgxc_cases
from hetplan.calibration.modern.llama3 import llama3_cases
from hetplan.calibration.modern.long_context import long_context_cases
from hetplan.calibration.modern.mapping import ModernCase
from hetplan.calibration.modern.megatron_bridge import megatron_bridge_cases
from hetplan.calibration.modern.megatron_lm import megatron_lm_cases
from hetplan.calibration.modern.moe import moe_cases
from hetplan.calibration.modern.rows import NotExpressible
from hetplan.calibration.modern.sets import CONVENTIONS, SET_NAMES, TARGETS
from hetplan.calibration.modern.torchtitan import torchtitan_cases
from hetplan.calibration.validation import metrics
from hetplan.hardware.catalog import Catalog

#: The loader of each set: ``loader(catalog) -> (cases, not expressible)``.
LOADERS = {
    "dgxc_h100": lambda catalog=None: dgxc_cases("dgxc_h100", catalog),
    "dgxc_gb200": lambda catalog=None: dgxc_cases("dgxc_gb200", catalog),
    "torchtitan": torchtitan_cases,
    "llama3_405b": llama3_cases,
    "megatron_lm_h100": megatron_lm_cases,
    "moe_h100": moe_cases,
    "long_context_cp": long_context_cases,
    "bigscience_a100": bigscience_cases,
    "megatron_bridge": megatron_bridge_cases,
}


def memory_metrics(cases: list[ModernCase]) -> dict:
    """Memory error over the cases that report memory: n, MAPE, max |error| (fractions)."""
    cs = [c for c in cases if c.measured_memory_bytes]
    if not cs:
        return {"n": 0, "mape": math.nan, "max_abs_error": math.nan}
    err = np.array([c.predicted_memory_bytes / c.measured_memory_bytes - 1 for c in cs])
    return {"n": len(cs), "mape": float(np.mean(np.abs(err))), "max_abs_error": float(np.max(np.abs(err)))}


def set_metrics(name: str, cases: list[ModernCase], skipped: list[NotExpressible], convention: str | None = None,
                target: dict | None = None) -> dict:
    """Metrics of one modern set (module doc) plus its convention, target and the rows it cannot express
    (``convention`` / ``target``: a set outside :data:`CONVENTIONS` / :data:`TARGETS`)."""
    res = metrics(cases)
    res["median_abs_error"] = float(np.median([abs(c.predicted / c.measured - 1) for c in cases])) if cases else math.nan
    res["measured"] = sorted({c.quantity for c in cases})
    res["convention"] = convention or CONVENTIONS[name]
    cal = [c for c in cases if c.is_calibration]
    res["calibration"] = metrics(cal)
    res["held_out"] = metrics([c for c in cases if not c.is_calibration])
    if any(c.measured_memory_bytes for c in cases):
        res["memory"] = memory_metrics(cases)
    res["per_dtype"] = {d: metrics([c for c in cases if c.dtype == d]) for d in sorted({c.dtype for c in cases})}
    if name == "dgxc_h100":
        dense = [c for c in cases if c.dense_cp1]
        res["dense_cp1"] = metrics(dense)
        res["dense_cp1_per_dtype"] = {d: metrics([c for c in dense if c.dtype == d]) for d in sorted({c.dtype for c in dense})}
    res["per_gpu_dtype"] = {f"{g}:{d}": metrics([c for c in cases if (c.gpu, c.dtype) == (g, d)])
                            for g, d in sorted({(c.gpu, c.dtype) for c in cases})}
    res["does_not_fit"] = [c.key for c in cases if not c.fits]
    if name == "bigscience_a100":  # the view (error by TP and PP degree); its "OOM" rows refused too?
        res["per_tp"] = per_info(cases, "tp")
        res["per_pp"] = per_info(cases, "pp")
        res["measured_oom"] = oom_check()
    res["approximations"] = dict(Counter(n for c in cases for n in c.notes).most_common())
    res["not_expressible"] = {"n": len(skipped), "rows": [{"key": s.key, "reason": s.reason} for s in skipped]}
    res["target"] = target if target is not None else TARGETS.get(name, {})
    return res


def per_info(cases: list[ModernCase], field) -> dict[str, dict]:
    """:func:`metrics` of ``cases`` grouped by the layout value ``info[field]`` (e.g. ``"tp"``, ``"pp"``), or by
    ``field(case)`` where ``field`` is a function; keys its values as text, in order."""
    key = field if callable(field) else (lambda c: c.info[field])
    groups: dict = {}
    for c in cases:
        groups.setdefault(key(c), []).append(c)
    return {str(k): metrics(cs) for k, cs in sorted(groups.items())}


def load_sets(names: Iterable[str] = SET_NAMES, catalog: Catalog | None = None):
    """``{name: (cases, not_expressible)}`` of the modern sets (plans built, nothing predicted yet)."""
    return {n: LOADERS[n](catalog) for n in names}


def run_modern(names: Iterable[str] = SET_NAMES, catalog: Catalog | None = None) -> tuple[dict, list[ModernCase]]:
    """Predict every expressible row of the sets ``names`` with ``catalog`` (default: the package catalog);
    return ``({name: set_metrics}, cases)``."""
    out, every = {}, []
    for name, (cases, skipped) in load_sets(names, catalog).items():
        for c in cases:
            c.evaluate(catalog)
        out[name] = set_metrics(name, cases, skipped)
        every += cases
    return out, every
