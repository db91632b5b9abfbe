"""MoE parallel folding in the search: EP may span TP x CP x DP (EP > DP), the expert layout re-partitioning the
attention ranks (Megatron-Core MoE parallel folding); pinned EP degrees the model cannot take name the plan rule;
the plan table shows EP and expert-TP."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from hetplan.cli.output import layout_text as _layout
from hetplan.errors import HetplanError
from hetplan.estimate.estimator import estimate
from hetplan.model.spec import load_model
from hetplan.plan import GPUPool, Inventory, Job, Plan, Stage
from hetplan.plan_rules import PlanRuleError
from hetplan.runtime import exporters, importers
from hetplan.search.planner import search_plans
from hetplan.search.space import Pins

ROOT = Path(__file__).parents[2]


def test_search_folds_ep_over_tp_and_dp():
    """Mixtral 8x7B on 16 H100 at TP 2: the 8 experts over EP 8 with DP only 4 exist in the space, and the best
    such plan costs what estimate() says of it."""
    job = Job(model="mixtral-8x7b", seq_len=4096, global_batch=64, train_iterations=10)
    res = search_plans(job, Inventory(pools=[GPUPool(gpu="H100-SXM", count=16)]), pins=Pins(tp=2, pp=2, ep=8),
                       top_k=1, heterogeneous=False)
    plan = res.plans[0].plan
    assert plan.ep == 8 and plan.stages[0].dp * plan.cp < 8 and plan.stages[0].tp == 2
    assert estimate(plan).iteration_time_s == res.plans[0].estimate.iteration_time_s


def test_nvidia_folded_layout_is_estimated_and_exported():
    """Qwen3-235B-A22B as the Megatron MoE model zoo runs it on 256 H100: TP 2, PP 8, EP 32 folded over TP x DP
    (DP 16 < EP 32), expert-TP 1: estimable, exported with its real flags, read back by import."""
    spec = load_model("qwen3-235b-a22b")
    layers = [12] * 7 + [10]
    job = Job(model="qwen3-235b-a22b", seq_len=4096, global_batch=1024, train_iterations=10)
    plan = Plan(job=job, pools=[GPUPool(gpu="H100-SXM", count=256)], mbs=1, zero=1, ep=32, expert_tp=1,
                sequence_parallel=True, stages=[Stage(num_layers=n, tp=2, dp=16, recompute="full") for n in layers])
    assert plan.stage_layout(0).expert_dp == 1 and estimate(plan).iteration_time_s > 0
    script = exporters.export(plan, spec, "megatron").files["megatron_launch.sh"]
    for flag in ("--expert-model-parallel-size 32", "--expert-tensor-parallel-size 1",
                 "--decoder-last-pipeline-num-layers 10", "--tensor-model-parallel-size 2"):
        assert flag in script
    back = importers.import_files({"run.sh": script})
    assert (back.ep, back.expert_tp, back.stages[0].dp, [s.num_layers for s in back.stages]) == (32, 1, 16, layers)


def test_plan_table_shows_ep_and_expert_tp():
    summary = {"tp": 2, "dp": 4, "pp": 2, "virtual_stages": 1, "stages": [],
               "plan": {"cp": 1, "ep": 8, "expert_tp": 2}}
    assert _layout(summary) == "2x2x4 ep8 etp2"
    assert _layout({**summary, "plan": {"cp": 2}}) == "2x2x4 cp2"


def test_pinned_ep_names_the_rule():
    base = [sys.executable, "-m", "hetplan.cli.main", "plan", "--gpu", "H100-SXM", "--gpus", "64", "--seq-len",
            "4096", "--global-batch", "512", "--tokens", "1e10"]
    r = subprocess.run(base + ["--model", "mixtral-8x7b", "--ep", "3"], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 2 and "rule ep-divides-experts" in r.stderr and "1, 2, 4, 8" in r.stderr
    r = subprocess.run(base + ["--model", "llama3-8b", "--ep", "2"], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 2 and "rule ep-needs-experts" in r.stderr
    r = subprocess.run(base + ["--model", "llama3-8b", "--tp", "3"], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 2 and "--tp" in r.stderr and "rule tp-divides-heads" in r.stderr


def test_deepseek_v3_pp8_vp4_layout_as_nvidia_runs_it():
    """DeepSeek-V3's 61 layers at PP 8 x VP 4 with Megatron-Core's layout string (the embedding with one layer, 30
    chunks of two, the loss alone in the last chunk): estimable, exported with that layout, imported back, and the
    torchtitan export's model parts follow the same chunks."""
    from hetplan.plan_rules import violations
    from hetplan.runtime.argspec import megatron_argv, parse_megatron_args

    spec = load_model("deepseek-v3")
    chunks = importers.parse_layout("Et|(tt|)*30,L", 8)
    job = Job(model="deepseek-v3", seq_len=4096, global_batch=8192, train_iterations=10, dtype="fp8")
    plan = Plan(job=job, pools=[GPUPool(gpu="H100-SXM", count=1024)], mbs=1, zero=1, ep=64, virtual_stages=4,
                sequence_parallel=True, pipeline_chunks=chunks,
                stages=[Stage(num_layers=sum(c), tp=2, dp=64, recompute="full") for c in chunks])
    assert violations(plan, spec) == []
    interleaved, plain = estimate(plan), estimate(plan.model_copy(update={"virtual_stages": 1,
                                                                          "pipeline_chunks": None}))
    assert interleaved.bubble_fraction < plain.bubble_fraction
    script = exporters.export(plan, spec, "megatron").files["megatron_launch.sh"]
    assert "--pipeline-model-parallel-layout 'Et|(t*2|)*30L'" in script
    args = parse_megatron_args(megatron_argv(script))
    assert "num_virtual_stages_per_pipeline_rank" not in args  # Megatron: the layout alone sets VP
    back = importers.import_files({"run.sh": script})
    assert back.pipeline_chunks == chunks and back.virtual_stages == 4 and back.ep == 64
    bad = plan.model_copy(update={"pipeline_chunks": [[2, 2, 2, 2]] * 8})
    assert [v.rule for v in violations(bad, spec)] == ["virtual-stages"]
    fsdp = plan.model_copy(update={"job": job.model_copy(update={"framework": "fsdp"}), "zero": 3})
    ex = exporters.export(fsdp, spec, "torchtitan")
    assert importers.import_files(ex.files).pipeline_chunks == chunks


def test_estimate_reports_the_alltoall_inside_the_stage_times(tmp_path):
    """StageEstimate.alltoall_s: zero for a dense model and without EP, positive with EP, a part of the TP/comm
    time the stage already includes; `hetplan estimate` prints it."""
    job = Job(model="mixtral-8x7b", seq_len=4096, global_batch=64, train_iterations=10)
    plan = Plan(job=job, pools=[GPUPool(gpu="H100-SXM", count=16)], mbs=1, zero=3, ep=8,
                stages=[Stage(num_layers=32, tp=2, dp=8)], sequence_parallel=True)
    (se,) = estimate(plan).stages
    assert 0 < se.alltoall_s <= se.tp_comm_s < se.forward_s + se.backward_s
    assert estimate(plan.model_copy(update={"ep": 1})).stages[0].alltoall_s == 0
    dense = Plan(job=Job(model="llama3-8b", seq_len=4096, global_batch=64, train_iterations=10),
                 pools=[GPUPool(gpu="H100-SXM", count=8)], mbs=1, stages=[Stage(num_layers=32, dp=8)])
    assert estimate(dense).stages[0].alltoall_s == 0
    path = tmp_path / "p.json"
    path.write_text(plan.model_dump_json())
    r = subprocess.run([sys.executable, "-m", "hetplan.cli.main", "estimate", str(path)], capture_output=True,
                       text=True, cwd=ROOT, env={**__import__("os").environ, "COLUMNS": "200"})
    assert r.returncode == 0 and f"stage 0 {se.alltoall_s * 1e3:.1f} ms" in r.stdout


def test_expert_tp_is_a_search_dimension_where_the_framework_runs_it():
    """Megatron-Core splits experts over --expert-tensor-parallel-size (any divisor of TP with EP x expert-TP
    dividing TP x CP x DP); torchtitan 0.3 never does (frameworks.toml): the space has expert-TP > 1 only for the
    former, and a searched plan with it costs what estimate() says."""
    from hetplan.search.space import enumerate_space

    m = load_model("mixtral-8x7b")
    space = enumerate_space(m, 64, 16, 8, Pins(), "flash", seq_len=4096)
    ok = (space["tp"] % space["expert_tp"] == 0) & ((space["tp"] * space["dp"] * space["cp"])
                                                     % (space["ep"] * space["expert_tp"]) == 0)
    assert ok.all() and set(space["expert_tp"]) == {1, 2, 4, 8}
    assert set(enumerate_space(m, 64, 16, 8, Pins(), "flash", seq_len=4096, expert_tp=False)["expert_tp"]) == {1}
    job = Job(model="mixtral-8x7b", seq_len=4096, global_batch=64, train_iterations=10)
    res = search_plans(job, Inventory(pools=[GPUPool(gpu="H100-SXM", count=32)]), pins=Pins(tp=4, ep=8, pp=2, virtual_stages=1),
                       top_k=20, heterogeneous=False)
    etp = [rp for rp in res.plans if rp.plan.expert_tp > 1]
    assert etp and all(estimate(rp.plan).iteration_time_s == rp.estimate.iteration_time_s for rp in etp)
    fsdp = search_plans(job.model_copy(update={"framework": "fsdp"}), Inventory(pools=[GPUPool(gpu="H100-SXM",
                        count=32)]), pins=Pins(tp=4, ep=8, pp=2, virtual_stages=1), top_k=20, heterogeneous=False)
    assert all(rp.plan.expert_tp == 1 for rp in fsdp.plans)


def test_hetero_search_folds_ep_over_tp_and_dp():
    """Mixtral 8x7B on 16 H100 + 16 A100 with EP 8 and DP 2 pinned: only folding (EP over TP x DP, expert-TP 1)
    makes that a layout; the heterogeneous search finds plans with it (stages of TP 4 and 8, 8 and 16 ranks),
    each priced as estimate() prices it, and with expert-TP where the framework has it. DeepSpeed's stack runs no
    EP (stacks.toml parallel): the pin is refused by stack-has-option."""
    job = Job(model="mixtral-8x7b", seq_len=4096, global_batch=64, train_iterations=10)
    inv = Inventory(pools=[GPUPool(gpu="H100-SXM", count=16), GPUPool(gpu="A100-SXM-80GB", count=16)])
    res = search_plans(job, inv, pins=Pins(ep=8, dp=2), top_k=3, heterogeneous=True)
    assert res.plans and any(len({st.pool for st in rp.plan.stages}) > 1 for rp in res.plans)
    for rp in res.plans:
        assert rp.plan.ep == 8 and all(st.dp * rp.plan.cp < 8 for st in rp.plan.stages)
        assert estimate(rp.plan).iteration_time_s == rp.estimate.iteration_time_s
    # expert-TP too (Megatron-Core --expert-tensor-parallel-size; frameworks.toml): EP 4 x expert-TP 2 over TP 4
    # x DP 2, on both GPU types, each priced as estimate() prices it
    res = search_plans(job, inv, pins=Pins(ep=4, dp=2, tp=4), top_k=40, heterogeneous=True)
    etp = [rp for rp in res.plans if rp.plan.expert_tp > 1 and len({st.pool for st in rp.plan.stages}) > 1]
    assert etp and all(estimate(rp.plan).iteration_time_s == rp.estimate.iteration_time_s for rp in etp)
    fsdp = search_plans(job.model_copy(update={"framework": "fsdp"}), inv, pins=Pins(ep=4, dp=2, tp=4), top_k=40,
                        heterogeneous=True)
    assert fsdp.plans and all(rp.plan.expert_tp == 1 for rp in fsdp.plans)  # torchtitan 0.3: no expert-TP
    deepspeed = job.model_copy(update={"framework": "deepspeed"})  # its stack has no EP at all (stacks.toml)
    with pytest.raises(PlanRuleError, match="expert parallelism, which stack deepspeed@0.16 lacks") as e:
        search_plans(deepspeed, inv, pins=Pins(ep=8, dp=2), top_k=3, heterogeneous=True)
    assert e.value.rule == "stack-has-option" and e.value.field == "pin.ep"
    with pytest.raises(HetplanError, match="EP 8 .* does not divide the pinned TP 2 x DP 2"):
        search_plans(job, inv, pins=Pins(ep=8, dp=2, tp=2, cp=1), top_k=3, heterogeneous=True)
