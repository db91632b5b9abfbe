"""The heterogeneous walk's budget counts expansions, never time (issue 18, "A deterministic search"): the answer
and whether it is complete do not depend on the machine's speed or load."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from hetplan.hardware.catalog import load_catalog
from hetplan.jobfile import load_job_file
from hetplan.model.spec import load_model
from hetplan.plan import Inventory, Job
from hetplan.search import planner
from hetplan.search.hetero import search_hetero_estimated
from hetplan.search.objective import Objective, guarded_best_first
from hetplan.search.planner import search_plans

ROOT = Path(__file__).resolve().parents[2]
CAT = load_catalog()


def _fasop():
    d = load_job_file(ROOT / "examples" / "fasop_gpt2xl.toml")
    job = Job(**{**d["job"], "model": str(ROOT / d["job"]["model"])})
    return job, Inventory(pools=d["inventory"]), Objective(**d["objective"])


def _burn_cpu(seconds: float) -> None:
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


def test_the_budget_counts_expansions_not_time():
    # A walk whose every expansion takes 20 ms of CPU still makes exactly `limit` expansions and reports the first
    # bound it did not expand.
    seeds = ((float(i), i) for i in range(100))
    seen = []
    done, open_bound = guarded_best_first(seeds, lambda lb, i: seen.append(i) or _burn_cpu(0.02) or (), lambda lb, i: None,
                                          limit=30)
    assert (done, open_bound, seen) == (30, 30.0, list(range(30)))


def test_fasop_gpt2xl_same_answer_and_complete_under_load():
    """`hetplan plan examples/fasop_gpt2xl.toml` returned a 1.000 s plan in 1 of 9 runs (and never said complete)
    when its walk stopped after 2 s of CPU: here it runs while another process burns a CPU and each expansion is
    slowed by 2 ms, and gives the answer of the unlimited walk, complete."""
    job, inv, obj = _fasop()
    m = load_model(job.model)
    exact = search_hetero_estimated(m, job, inv, CAT, obj, top_k=5, max_expansions=None)
    assert exact.complete
    burner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        res = search_plans(job, inv, obj, top_k=5, catalog=CAT, progress=lambda k, limit, phase: _burn_cpu(0.002))
    finally:
        burner.kill()
        burner.wait()
    assert res.heterogeneous["complete"] and "proven_within" not in res.heterogeneous
    assert res.heterogeneous["plans_estimated"] == exact.plans_estimated
    best = exact.top[0]
    assert res.plans[0].plan == best.plan
    assert res.plans[0].estimate.iteration_time_s == best.estimate.iteration_time_s
    assert any("complete: exact by estimate()" in line for line in res.explanation)


def test_a_walk_cut_by_its_budget_gives_the_proven_gap(monkeypatch):
    """Where the budget runs out the result says so and gives the gap it has proven."""
    job, inv, obj = _fasop()
    monkeypatch.setattr(planner, "HETERO_WALK_EXPANSIONS", 50)
    res = search_plans(job, inv, obj, top_k=1, catalog=CAT)
    assert res.heterogeneous["complete"] is False
    assert 0.0 <= res.heterogeneous["proven_within"] < 1.0
    assert any("walk stopped after 50 expansions" in line for line in res.explanation)
