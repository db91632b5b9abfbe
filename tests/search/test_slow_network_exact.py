"""Issue 27, item 2: on 10 Gb/s Ethernet the exact top-K must not return 64 GPUs at 60 s per iteration while one
node of 8 runs the job in 41.5 s. The 1F1B cycle bound (:func:`hetplan.search.homogeneous.
one_f_one_b_cycle_lower_bound_s`) and the interleaved window bound make the walk complete; the small allocations
are estimated first (:func:`hetplan.search.planner._small_allocation_seeds`), so even a walk stopped by its budget
returns nothing worse than them; the budget's "stopped after" line goes to stderr, also under -q."""

from __future__ import annotations

import numpy as np
import pytest

from hetplan.estimate.compute import pool_gpu
from hetplan.estimate.estimator import estimate
from hetplan.hardware.catalog import load_catalog
from hetplan.model.spec import load_model
from hetplan.plan import GPUPool, Inventory, Job
from hetplan.search import planner
from hetplan.search.homogeneous import evaluate_pool, one_f_one_b_cycle_lower_bound_s
from hetplan.search.objective import Objective
from hetplan.search.space import Pins
from tests.fuzz.inproc import run_cli

CAT = load_catalog()
JOB = Job(model="llama2-7b", seq_len=4096, global_batch=1024, train_tokens=1e12)
POOL = GPUPool(gpu="H100-SXM", count=64, network="ethernet", inter_node_bandwidth_bytes_per_s=10e9 / 8)


def _one_node_best_s() -> float:
    """Brute force: every configuration on exactly one node (8 GPUs), by estimate()."""
    m = load_model(JOB.model)
    pool = POOL.model_copy(update={"count": 8})
    res = evaluate_pool(m, JOB, pool, pool_gpu(CAT, pool), Pins(num_gpus=8))
    inv = Inventory(pools=[pool])
    return min(estimate(planner._plan_from_row(JOB, inv, m, res, int(i)), CAT, m).iteration_time_s
               for i in np.flatnonzero(res.fits))


def test_cycle_bound_worked_example():
    # 32 stages of a = 20 ms, 512 micro-batches, 105 ms between nodes: (512-32)/2 = 240 cycles of 2 (a + c)
    assert one_f_one_b_cycle_lower_bound_s(0.02, 0.105, 32, 512) == pytest.approx(240 * 2 * 0.125)
    assert one_f_one_b_cycle_lower_bound_s(0.02, 0.105, 1, 512) == 0.0  # no boundary, no cycle
    assert one_f_one_b_cycle_lower_bound_s(0.02, 0.105, 32, 16) == 0.0  # all warm-up


def test_slow_network_answer_is_exact_and_no_worse_than_one_node():
    res = planner.search_plans(JOB, Inventory(pools=[POOL]), Objective(goal="fastest"), top_k=5, catalog=CAT)
    assert res.homogeneous["complete"], res.homogeneous
    assert res.plans[0].estimate.iteration_time_s <= _one_node_best_s() * (1 + 1e-9)


def test_budget_stopped_search_still_no_worse_than_small_allocations(monkeypatch):
    monkeypatch.setattr(planner, "HOMOGENEOUS_ESTIMATES", 30)
    res = planner.search_plans(JOB, Inventory(pools=[POOL]), Objective(goal="fastest"), top_k=5, catalog=CAT)
    assert res.homogeneous["estimated"] <= 30
    assert res.plans[0].estimate.iteration_time_s <= _one_node_best_s() * (1 + 1e-9)
    assert not res.homogeneous["complete"]
    r = run_cli("plan", "--model", "llama2-7b", "--seq-len", "4096", "--global-batch", "1024", "--tokens", "1e12",
                "--gpu", "H100-SXM", "--gpus", "64", "--network", "ethernet", "--inter-node-gbit", "10", "-q")
    assert r.code == 0 and "stopped after 30 estimates" in r.stderr and "stopped after" not in r.stdout


def test_bounds_below_estimate_on_the_issue_pool():
    m = load_model(JOB.model)
    res = evaluate_pool(m, JOB, POOL, pool_gpu(CAT, POOL), Pins())
    inv = Inventory(pools=[POOL])
    rng = np.random.default_rng(27)
    for v in (1, 2):
        deep = np.flatnonzero((res.config["pp"] >= 4) & (res.config["virtual_stages"] == v) & res.fits)
        for i in rng.choice(deep, 20, replace=False):
            e = estimate(planner._plan_from_row(JOB, inv, m, res, int(i)), CAT, m)
            assert res.lower_bound_time_s[i] <= e.iteration_time_s * (1 + 1e-9), {
                k: int(x[i]) for k, x in res.config.items()}
