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


def test_plan_table_shows_context_parallelism_and_mixed_tp():
    """The table's TPxPPxDP cell and the "Stages of #1" line name CP when it is above 1, and a plan whose stages
    differ in TP shows their degrees in stage order (was: "Nonex2x2", and no CP anywhere)."""
    from hetplan.cli.output import layout_text as _layout
    from hetplan.cli.plan import _stages_line
    from hetplan.estimate.estimator import estimate
    from hetplan.plan import GPUPool, Plan, Stage
    from hetplan.report import plan_summary

    job = Job(model="llama2-7b", seq_len=16384, global_batch=64, dtype="bf16")
    pools = [GPUPool(gpu="A100-SXM-80GB", count=16), GPUPool(gpu="H100-SXM", count=16)]
    stages = [Stage(pool=0, num_layers=16, tp=2, dp=2), Stage(pool=1, num_layers=16, tp=1, dp=2)]
    plan = Plan(job=job, pools=pools, stages=stages, mbs=1, zero=1, sequence_parallel=True, cp=2)
    s = plan_summary(plan, estimate(plan, CAT, load_model(job.model)))
    assert _layout(s) == "2/1x2x2 cp2"
    assert _stages_line(s) == ("Stages of #1: [A100-SXM-80GB tp2xcp2xdp2: 16 layers], "
                               "[H100-SXM tp1xcp2xdp2: 16 layers]")
    flat = plan.model_copy(update={"cp": 1, "stages": [st.model_copy(update={"tp": 2}) for st in stages]})
    s1 = plan_summary(flat, estimate(flat, CAT, load_model(job.model)))
    assert _layout(s1) == "2x2x2"
    assert "cp" not in _stages_line(s1)


def test_stages_line_writes_a_run_of_equal_stages_once():
    """GPT-3 175B's 96 one-layer stages read as one bracket with its count, not 96 brackets."""
    from hetplan.cli.plan import _stages_line

    st = {"gpu": "A100-SXM-80GB", "tp": 8, "dp": 1, "num_layers": 1}
    s = {"plan": {"cp": 1}, "stages": [dict(st, num_layers=2)] + [st] * 94 + [dict(st, num_layers=2)]}
    assert _stages_line(s) == ("Stages of #1: [A100-SXM-80GB tp8xdp1: 2 layers], "
                               "[A100-SXM-80GB tp8xdp1: 1 layers] × 94, "
                               "[A100-SXM-80GB tp8xdp1: 2 layers]")
