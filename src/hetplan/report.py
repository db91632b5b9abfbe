"""Turning search results and estimates into JSON-ready dicts (the stable ``--json`` field names)."""

from __future__ import annotations

from dataclasses import asdict

from hetplan.estimate.estimator import Estimate
from hetplan.plan import Plan


def _uniform(values: list):
    return values[0] if len(set(values)) == 1 else None


def plan_summary(plan: Plan, est: Estimate, reason: str = "") -> dict:
    """One plan as the flat dict that ``hetplan plan --json`` prints (field names are a stable interface).

    ``gpu``, ``tp``, ``dp``, ``recompute`` are ``None`` when stages differ (heterogeneous plans); ``stages`` always
    lists each stage's GPU type, layers, TP and DP. Units: seconds, bytes, USD.
    """
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
        "stages": [
            {"gpu": se.gpu, "num_layers": se.num_layers, "tp": se.tp, "dp": se.dp, "recompute": se.recompute,
             "memory_bytes": se.memory.total, "time_source": se.time_source}
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
