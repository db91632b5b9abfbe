"""Espresso's example (open_llama_3b_v2 on A30 / A6000 / A4000 / RTX 3090, least $ per iteration under a 100 s SLO):
our answer, Espresso's two answers re-estimated by our estimator, and the CPU time of the search (target <= 1 s;
Espresso's allocator took 44 s of CPU on it).

    python benchmarks/bench_hetero_espresso.py
"""

from __future__ import annotations

import itertools
import time
from pathlib import Path

from hetplan.estimate.estimator import estimate
from hetplan.hardware.catalog import load_catalog
from hetplan.jobfile import load_job_file
from hetplan.model.spec import load_model
from hetplan.plan import Inventory, Job, Plan, Stage
from hetplan.search.hetero import search_hetero, search_hetero_estimated
from hetplan.search.objective import Objective
from hetplan.search.pareto import pareto_frontier
from hetplan.search.space import Pins

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "espresso_open_llama_3b.toml"
#: Espresso's answers (its repository's allocator example): stage GPU types, layers, $ per iteration.
ESPRESSO = {
    "Espresso optimum (pruned by its own bound)": (["RTX-A6000", "RTX-A6000", "RTX-3090"], [11, 12, 3], 0.2019),
    "Espresso returned": (["RTX-A6000", "RTX-A6000", "RTX-A6000"], [9, 9, 8], 0.2218),
}


def load():
    d = load_job_file(EXAMPLE)
    job = Job(**{**d["job"], "model": str(ROOT / d["job"]["model"])})
    return job, Inventory(pools=d["inventory"]), d["objective"]["slo_iteration_s"], Pins(**d["pin"])


def best_recompute(job, inv, gpus, layers, cat, m):
    """Estimate a fixed stage list with the fastest per-stage recomputation that fits (None if none fits)."""
    pools = [next(i for i, p in enumerate(inv.pools) if p.gpu == g) for g in gpus]
    best = None
    for rcs in itertools.product(("none", "selective", "full"), repeat=len(gpus)):
        plan = Plan(job=job, pools=inv.pools, mbs=16, stages=[Stage(pool=k, num_layers=n, recompute=r)
                                                             for k, n, r in zip(pools, layers, rcs)])
        est = estimate(plan, cat, m)
        if est.fits and (best is None or est.iteration_time_s < best[1].iteration_time_s):
            best = (plan, est)
    if best is None:  # report the lightest-memory one to say by how much it misses
        plan = Plan(job=job, pools=inv.pools, mbs=16, stages=[Stage(pool=k, num_layers=n, recompute="full")
                                                             for k, n in zip(pools, layers)])
        return plan, estimate(plan, cat, m)
    return best


def main() -> None:
    job, inv, slo, pins = load()
    cat = load_catalog()
    m = load_model(job.model)
    obj = Objective(goal="cheapest", slo_iteration_s=slo)
    for label, p, walk in (("Espresso's space (pp only, 1 GPU per stage, mbs 16)", pins, None),
                           ("all of TP/DP/mbs", Pins(), 4000)):
        c0 = time.process_time()
        r = search_hetero(m, job, inv, cat, goal="cheapest", slo_iteration_s=slo, pins=p)
        cpu = time.process_time() - c0
        est = estimate(r.best.to_plan(job, inv), cat, m)
        print(f"[{label}] closed-form search, cheapest under {slo:.0f} s: {r.best.describe(inv)}")
        print(f"    closed form {r.best.iteration_time_s:.2f} s ${r.best.usd_per_iteration:.4f}; estimate "
              f"{est.iteration_time_s:.2f} s ${est.usd_per_iteration:.4f}/iteration; {cpu:.2f} s CPU "
              f"({r.allocations:,} allocations bounded, {r.allocations_solved:,} solved, {r.orders_solved:,} orders)")
        c0 = time.process_time()
        e = search_hetero_estimated(m, job, inv, cat, obj, pins=p, top_k=5, max_expansions=walk)
        cpu = time.process_time() - c0
        b = e.top[0]
        proof = ("exact over H" if e.complete else
                 f"walk stopped after {walk:,} expansions: no unestimated plan below ${e.open_bound / job.iterations():.4f}"
                 f"/iteration (best found within {max(0.0, b.estimate.job_usd / e.open_bound - 1):.1%})")
        print(f"    by estimate(): {b.candidate.describe(inv)}  {b.estimate.iteration_time_s:.2f} s "
              f"${b.estimate.usd_per_iteration:.4f}/iteration; {cpu:.2f} s CPU in all ({e.allocations_solved:,} "
              f"allocations solved, {e.plans_estimated:,} plans estimated; {proof})")
    c0 = time.process_time()
    fr = pareto_frontier(m, job, inv, cat, pins, slo_iteration_s=slo, max_expansions=None)
    print(f"[Espresso's space] Pareto frontier by estimate(): {len(fr.points)} plans "
          f"({sum(p.heterogeneous for p in fr.points)} heterogeneous) in {time.process_time() - c0:.2f} s CPU "
          f"({fr.result.allocations_solved:,} allocations solved, {fr.result.plans_estimated:,} plans estimated; "
          f"{'exact over H' if fr.result.complete else 'incomplete'})")
    for label, (gpus, layers, usd) in ESPRESSO.items():
        plan, est = best_recompute(job, inv, gpus, layers, cat, m)
        worst = max(est.stages, key=lambda s: s.memory.total / s.memory_capacity_bytes)
        print(f"{label}: {'+'.join(gpus)} layers {layers}: Espresso ${usd:.4f}; ours {est.iteration_time_s:.2f} s "
              f"${est.usd_per_iteration:.4f}, fits={est.fits} (fullest stage {worst.gpu} "
              f"{worst.memory.total / 2**30:.1f} of {worst.memory_capacity_bytes / 2**30:.1f} GiB, recompute "
              f"{[s.recompute for s in plan.stages]})")


if __name__ == "__main__":
    main()
