"""Turning search results and estimates into JSON-ready dicts (the stable ``--json`` field names)."""

from __future__ import annotations

import math
from dataclasses import asdict

from hetplan.errors import HetplanError
from hetplan.estimate.estimator import Estimate
from hetplan.estimate.memory import fit_warning
from hetplan.plan import Plan


def _uniform(values: list):
    return values[0] if len(set(values)) == 1 else None


def plan_summary(plan: Plan, est: Estimate, reason: str = "") -> dict:
    """One plan as the flat dict that ``hetplan plan --json`` prints (field names are a stable interface).

    ``gpu``, ``tp``, ``dp``, ``recompute`` are ``None`` when stages differ (heterogeneous plans); ``stages`` always
    lists each stage's GPU type, layers, TP and DP; ``stack`` is the software stack and release that priced it
    (``Job.stack``, else the framework's default: what ``hetplan export`` writes). Units: seconds, bytes, USD.
    """
    check_estimate(est)
    gpus = [s.gpu for s in est.stages]
    return {
        "gpu": _uniform(gpus) or "+".join(gpus),
        "num_gpus": plan.num_gpus,
        "tp": _uniform([s.tp for s in plan.stages]),
        "pp": plan.pp,
        "dp": _uniform([s.dp for s in plan.stages]),
        "mbs": plan.mbs,
        "num_microbatches": plan.num_microbatches(0),
        "zero": plan.zero,
        "recompute": _uniform([s.recompute for s in plan.stages]),
        "sequence_parallel": plan.sequence_parallel,
        "schedule": plan.schedule,
        "virtual_stages": plan.virtual_stages,
        "stack": plan.job.stack_spec().id,
        "stages": [
            {"gpu": se.gpu, "num_layers": se.num_layers, "tp": se.tp, "dp": se.dp, "recompute": se.recompute,
             "memory_bytes": se.memory.total, "memory_required_bytes": se.memory.required,
             "memory_warning": fit_warning(se.memory.required, se.memory.total, se.memory_capacity_bytes),
             "time_source": se.time_source}
            for se in est.stages
        ],
        "iteration_time_s": est.iteration_time_s,
        "tokens_per_s": est.tokens_per_s,
        "mfu": est.mfu,
        "hfu": est.hfu,
        "bubble_fraction": est.bubble_fraction,
        "memory_bytes_per_gpu": asdict(est.memory_bytes_per_gpu),
        "usd_per_hour": est.usd_per_hour,
        "usd_per_iteration": est.usd_per_iteration,
        "iterations": est.iterations,
        "job_time_s": est.job_time_s,
        "job_usd": est.job_usd,
        "reason": reason,
        "plan": plan.model_dump(mode="json"),
    }


def check_estimate(est: Estimate) -> None:
    """Refuse an estimate whose numbers are not finite and consistent, rather than print a wrong one: iteration
    time, job time, tokens/s and memory > 0, $ >= 0, 0 < MFU <= HFU <= 1, all finite (an overflow anywhere in the
    cost model — e.g. an integer FLOP count past int64 — shows up here as a negative, infinite or NaN figure).

    Raises:
        HetplanError: naming the first inconsistent figure.
    """
    figures = {
        "iteration_time_s": (est.iteration_time_s, est.iteration_time_s > 0),
        "job_time_s": (est.job_time_s, est.job_time_s > 0),
        "tokens_per_s": (est.tokens_per_s, est.tokens_per_s > 0),
        "memory_bytes_per_gpu": (est.memory_bytes_per_gpu.total, est.memory_bytes_per_gpu.total > 0),
        "usd_per_hour": (est.usd_per_hour, est.usd_per_hour >= 0),
        "job_usd": (est.job_usd, est.job_usd >= 0),
        "mfu": (est.mfu, 0 < est.mfu <= est.hfu * (1 + 1e-9)),
        "hfu": (est.hfu, 0 < est.hfu <= 1 + 1e-9),
    }
    for name, (value, ok) in figures.items():
        if not (math.isfinite(value) and ok):
            raise HetplanError(f"the estimate's {name} = {value!r} is not a finite, consistent figure (MFU {est.mfu!r},"
                               f" HFU {est.hfu!r}); refusing to report it", field="plan",
                               fix="the job is outside what the cost model handles; please report it with the input")
