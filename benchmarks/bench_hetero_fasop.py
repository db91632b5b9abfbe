"""FASOP's GPT-2 XL cases (Hwang et al., HPDC'24): (1) 4 A100-40GB (one p4d node) + 28 A10G (7 g5 nodes), 4 GPUs per
node, fastest iteration — our answer and FASOP's answer re-estimated by our estimator; (2) FASOP's Pareto sweep:
0..8 p4d nodes x 0..8 g5 nodes of 8 GPUs (80 clusters), every GPU of a cluster used, the fastest plan of each and
the cost-time frontier over all. Prints CPU times (targets: the whole sweep <= 10 s on one core; FASOP took 5-72 s
per cluster and 1,025 s for the sweep).

    python benchmarks/bench_hetero_fasop.py
"""

from __future__ import annotations

import time
from pathlib import Path

from hetplan.estimate.estimator import estimate
from hetplan.hardware.catalog import load_catalog
from hetplan.jobfile import load_job_file
from hetplan.model.spec import load_model
from hetplan.plan import GPUPool, Inventory, Job, Plan, Stage
from hetplan.search.hetero import search_hetero, search_hetero_estimated
from hetplan.search.objective import Objective
from hetplan.search.space import Pins

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "fasop_gpt2xl.toml"
#: FASOP's best plan for 1 p4d + 7 g5 (main_logs/gpt2_heterogeneous.csv, first row): mbs 1, tp 1, dp 2, pp 16,
#: p4d first; its estimate 1.0596 s per iteration, $0.030978 per step. FASOP's partition counts the embedding and
#: the head as layers ([5, 4, 3, 3, 2, 3, ...] sums to 50 = 48 + 2); these are the transformer layers.
FASOP_LAYERS = [4, 4, 3, 3, 2, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 2]
#: FASOP's prices in the Pareto experiment ($ per node-hour, 8 GPUs per node): p4d.24xlarge, g5 (as in FASOP.py).
P4D_USD_PER_HOUR, G5_USD_PER_HOUR = 32.7726, 9.773


def sweep(m, job, cat, mixed: bool):
    """FASOP's 80 clusters, fastest plan of each by estimate(); prints the CPU time."""
    points = []
    c0 = time.process_time()
    n_alloc = 0
    gaps = []
    for a in range(9):
        for g in range(9):
            if a == 0 and g == 0:
                continue
            pools = []
            if a:
                pools.append(GPUPool(gpu="A100-SXM-40GB", count=8 * a, gpus_per_node=8,
                                     price_usd_per_hour=P4D_USD_PER_HOUR / 8, inter_node_bandwidth_bytes_per_s=50e9))
            if g:
                pools.append(GPUPool(gpu="A10G", count=8 * g, gpus_per_node=8, price_usd_per_hour=G5_USD_PER_HOUR / 8,
                                     inter_node_bandwidth_bytes_per_s=12.5e9))
            cl = Inventory(pools=pools)
            # Closed-form optimum and runners-up re-estimated; no further walk (max_expansions=0): the result
            # says how far from the optimum over H it is proven to be.
            res = search_hetero_estimated(m, job, cl, cat, Objective(goal="fastest"), pins=Pins(num_gpus=8 * (a + g)),
                                          top_k=1, max_expansions=0, mixed_tp=mixed)
            n_alloc += res.allocations
            if res.top:
                b = res.top[0]
                points.append((b.estimate.iteration_time_s, b.estimate.usd_per_iteration, a, g, b.candidate.describe(cl)))
                gaps.append(0.0 if res.complete else max(0.0, b.estimate.job_time_s / res.open_bound - 1))
    cpu = time.process_time() - c0
    print(f"Pareto sweep ({'two TP degrees per pool allowed' if mixed else 'one TP degree per pool'}): 80 clusters, "
          f"{n_alloc:,} GPU allocations bounded, {len(points)} with a plan that fits, {cpu:.2f} s CPU; figures by "
          f"estimate(); proven within {max(gaps):.0%} of each cluster's optimum over H (median "
          f"{sorted(gaps)[len(gaps) // 2]:.0%}; {sum(x == 0 for x in gaps)} clusters exact)")
    return points, n_alloc, gaps


def main() -> None:
    d = load_job_file(EXAMPLE)
    job = Job(**{**d["job"], "model": str(ROOT / d["job"]["model"])})
    inv = Inventory(pools=d["inventory"])
    cat = load_catalog()
    m = load_model(job.model)
    c0 = time.process_time()
    r = search_hetero(m, job, inv, cat, goal="fastest")
    cpu = time.process_time() - c0
    est = estimate(r.best.to_plan(job, inv), cat, m)
    print(f"4xA100 + 28xA10G, fastest: {r.best.describe(inv)}; estimate {est.iteration_time_s:.3f} s, "
          f"${est.usd_per_iteration:.5f}/iteration; search {cpu:.2f} s CPU ({r.allocations:,} allocations, "
          f"{r.allocations_solved:,} solved)")
    c0 = time.process_time()
    e = search_hetero_estimated(m, job, inv, cat, Objective(goal="fastest"), top_k=1)
    cpu = time.process_time() - c0
    b = e.top[0]
    print(f"  by estimate() (exact over H: {e.complete}): {b.candidate.describe(inv)}; {b.estimate.iteration_time_s:.3f} s, "
          f"${b.estimate.usd_per_iteration:.5f}/iteration; {cpu:.2f} s CPU ({e.allocations_solved:,} allocations "
          f"solved, {e.plans_estimated} plans estimated)")
    fasop = Plan(job=job, pools=inv.pools, mbs=1, stages=[Stage(pool=0 if i < 2 else 1, num_layers=n, tp=1, dp=2)
                                                       for i, n in enumerate(FASOP_LAYERS)])
    fe = estimate(fasop, cat, m)
    print(f"FASOP's plan (tp1 dp2 pp16, layers {FASOP_LAYERS}): FASOP 1.0596 s; ours {fe.iteration_time_s:.3f} s, "
          f"${fe.usd_per_iteration:.5f}/iteration, fits={fe.fits}")

    # The sweep: one TP degree per pool (FASOP's space has one TP degree for all stages), then ours.
    for mixed in (False, True):
        points, n_alloc, gaps = sweep(m, job, cat, mixed)

    front, best_c = [], float("inf")
    for t, c, a, g, desc in sorted(points):
        if c < best_c:
            front.append((t, c, a, g, desc))
            best_c = c
    print("frontier, two TP degrees per pool allowed (p4d nodes, g5 nodes, s/iteration, $/iteration, plan):")
    for t, c, a, g, desc in front:
        print(f"  {a} x p4d + {g} x g5: {t:.3f} s  ${c:.4f}  {desc}")


if __name__ == "__main__":
    main()
