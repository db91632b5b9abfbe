"""Heterogeneous search at scale: Llama-2 70B (80 layers) on 4 GPU types x 64 GPUs each, the least $ per iteration
under an iteration-time SLO; CPU time of the search, and the optimum checked against the exhaustive run (every
allocation and every stage order solved, no allocation bound).

    python benchmarks/bench_hetero_70b.py [--no-check]
"""

from __future__ import annotations

import sys
import time

from hetplan.hardware.catalog import load_catalog
from hetplan.model.spec import load_model
from hetplan.plan import GPUPool, Inventory, Job
from hetplan.search.hetero import search_hetero, search_hetero_estimated
from hetplan.search.objective import Objective
from hetplan.search.space import Pins

INVENTORY = Inventory(pools=[
    GPUPool(gpu="H100-SXM", count=64, gpus_per_node=8, inter_node_bandwidth_bytes_per_s=400e9),
    GPUPool(gpu="A100-SXM-80GB", count=64, gpus_per_node=8, inter_node_bandwidth_bytes_per_s=200e9),
    GPUPool(gpu="A100-SXM-40GB", count=64, gpus_per_node=8, inter_node_bandwidth_bytes_per_s=50e9),
    GPUPool(gpu="L40S", count=64, gpus_per_node=8, inter_node_bandwidth_bytes_per_s=25e9),
])
JOB = Job(model="llama2-70b", seq_len=4096, global_batch=128, train_iterations=1, dtype="bf16")
SLO_S = 60.0
PINS = Pins(mbs=1)


def main() -> None:
    m = load_model(JOB.model)
    cat = load_catalog()
    c0 = time.process_time()
    r = search_hetero(m, JOB, INVENTORY, cat, goal="cheapest", slo_iteration_s=SLO_S, pins=PINS)
    cpu = time.process_time() - c0
    print(f"llama2-70b on 4 types x 64 GPUs, cheapest with iteration <= {SLO_S} s, mbs 1: {cpu:.2f} s CPU "
          f"({r.allocations:,} allocations bounded, {r.allocations_solved:,} solved, {r.orders_solved:,} orders; "
          f"pools per plan <= {r.stats['max_pools_per_plan']})")
    if r.best is None:
        print("  nothing fits")
        return
    print(f"  best: {r.best.describe(INVENTORY)}  {r.best.iteration_time_s:.2f} s  ${r.best.usd_per_iteration:.4f}/iteration")
    c0 = time.process_time()
    e = search_hetero_estimated(m, JOB, INVENTORY, cat, Objective(goal="cheapest", slo_iteration_s=SLO_S), pins=PINS,
                                top_k=3, max_expansions=4000)
    cpu_e = time.process_time() - c0
    b = e.top[0]
    proof = "exact over H" if e.complete else (
        f"walk stopped after 2 s: within {max(0.0, b.estimate.job_usd / e.open_bound - 1):.1%} of the optimum over H")
    print(f"  by estimate(): {b.candidate.describe(INVENTORY)}  {b.estimate.iteration_time_s:.2f} s  "
          f"${b.estimate.usd_per_iteration:.4f}/iteration; {cpu_e:.2f} s CPU in all ({e.allocations_solved:,} allocations "
          f"solved, {e.plans_estimated} plans estimated; {proof})")
    if "--no-check" in sys.argv:
        return
    c0 = time.process_time()
    ex = search_hetero(m, JOB, INVENTORY, cat, goal="cheapest", slo_iteration_s=SLO_S, pins=PINS, prune=False)
    cpu_ex = time.process_time() - c0
    same = abs(ex.best.usd_per_iteration - r.best.usd_per_iteration) <= 1e-9 * r.best.usd_per_iteration
    print(f"exhaustive: {cpu_ex:.2f} s CPU ({ex.allocations_solved:,} allocations, {ex.orders_solved:,} orders solved): "
          f"${ex.best.usd_per_iteration:.4f}/iteration -> {'SAME optimum' if same else 'DIFFERENT'}")


if __name__ == "__main__":
    main()
