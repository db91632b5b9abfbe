"""The plan table shows each plan once (issue 17, item 4): under flash attention selective recomputation stores
and computes what ``none`` does (hetplan.plan.Job), so no search proposes it as a separate plan."""

from __future__ import annotations

from pathlib import Path

from hetplan.hardware.catalog import load_catalog
from hetplan.jobfile import load_job_file
from hetplan.model.spec import load_model
from hetplan.plan import Inventory, Job
from hetplan.search.objective import Objective
from hetplan.search.planner import search_plans
from hetplan.search.space import Pins, enumerate_space

ROOT = Path(__file__).resolve().parents[2]
CAT = load_catalog()


def _same_plan_key(plan) -> str:
    """The plan with selective written as none (the same plan under flash)."""
    stages = [s.model_copy(update={"recompute": "none" if s.recompute == "selective" else s.recompute})
              for s in plan.stages]
    return plan.model_copy(update={"stages": stages}).model_dump_json()


def test_no_duplicate_rows_selective_is_none_under_flash():
    d = load_job_file(ROOT / "examples" / "espresso_open_llama_3b.toml")  # flash; memory-tight: recomputation used
    job = Job(**{**d["job"], "model": str(ROOT / d["job"]["model"])})
    assert job.attention == "flash"
    inv = Inventory(pools=d["inventory"])
    m = load_model(job.model)
    # the spaces: homogeneous and heterogeneous offer selective only under standard attention (or when pinned)
    space = enumerate_space(m, job.global_batch, 8, 8, Pins(), attention="flash", seq_len=job.seq_len)
    assert set(space["recompute"].tolist()) == {0, 2}
    assert set(enumerate_space(m, job.global_batch, 8, 8, Pins(), attention="standard",
                               seq_len=job.seq_len)["recompute"].tolist()) == {0, 1, 2}
    # the ranking (homogeneous and heterogeneous plans): no two the same once selective is read as none
    res = search_plans(job, inv, Objective(**d["objective"]), Pins(**d["pin"]), top_k=8, catalog=CAT)
    keys = [_same_plan_key(rp.plan) for rp in res.plans]
    assert len(keys) == len(set(keys)) == 8
    assert all(s.recompute != "selective" for rp in res.plans for s in rp.plan.stages)
    assert any(s.recompute == "full" for rp in res.plans for s in rp.plan.stages)
