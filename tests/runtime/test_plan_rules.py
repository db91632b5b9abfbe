"""The one plan validator (hetplan.plan_rules): each broken case of issue 18 refused by every command, naming the rule."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from hetplan.model.spec import load_model
from hetplan.plan import GPUPool, Job, Plan, Stage
from hetplan.plan_rules import RULES, PlanRuleError, check_plan, violations

ROOT = Path(__file__).parents[2]


def _llama(stages, count=64, gpn=8, **plan):
    """llama2-7b (32 layers, 32 heads, 32 KV heads, ffn 11008) on one A100 pool."""
    job = Job(model="llama2-7b", seq_len=4096, global_batch=512, train_iterations=10)
    return Plan(job=job, pools=[GPUPool(gpu="A100-SXM-80GB", count=count, gpus_per_node=gpn)],
                stages=[Stage(**s) for s in stages], mbs=1, **plan)


#: The three broken plans of issue 18, with the rule each breaks.
BROKEN = {
    "tp64-on-32-heads": ([{"num_layers": 32, "tp": 64, "dp": 1}], "tp-divides-heads"),
    "dp128-on-64-gpus": ([{"num_layers": 32, "tp": 1, "dp": 128}], "pool-gpu-count"),
    "31-of-32-layers": ([{"num_layers": 16, "tp": 8, "dp": 2}, {"num_layers": 15, "tp": 8, "dp": 2}],
                        "layers-cover-model"),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_broken_plan_names_its_rule(case):
    stages, rule = BROKEN[case]
    plan = _llama(stages, count=128 if case == "tp64-on-32-heads" else 64)
    spec = load_model("llama2-7b")
    with pytest.raises(PlanRuleError) as e:
        check_plan(plan, spec)
    assert e.value.rule == rule and f"(rule {rule})" in e.value.render() and e.value.fix


def test_messages_give_the_numbers():
    spec = load_model("llama2-7b")
    msgs = {e.rule: e.message for e in violations(_llama(BROKEN["dp128-on-64-gpus"][0]), spec)}
    assert msgs == {"pool-gpu-count": "the stages on pool 0 (A100-SXM-80GB) use 128 GPUs (sum of tp x cp x dp) but "
                                      "the pool has 64 (rule pool-gpu-count)"}
    tp64 = violations(_llama(BROKEN["tp64-on-32-heads"][0], count=128), spec)
    # 64 divides neither the 32 heads nor the 32 KV heads; it divides ffn 11008 (= 64 x 172) and spans 8 whole nodes
    assert [e.rule for e in tp64] == ["tp-divides-heads", "tp-divides-kv-heads"]
    assert "TP 64 does not divide the 32 attention heads of llama2-7b" in tp64[0].message
    with pytest.raises(PlanRuleError, match="also broken: tp-divides-kv-heads"):
        check_plan(_llama(BROKEN["tp64-on-32-heads"][0], count=128), spec)


def test_valid_plans_pass_and_rules_are_listed():
    spec = load_model("llama2-7b")
    assert violations(_llama([{"num_layers": 16, "tp": 8, "dp": 4}] * 2), spec) == []
    # TP across whole nodes is allowed (slow, but a placement launchers make)
    assert violations(_llama([{"num_layers": 32, "tp": 16, "dp": 1}], count=16), spec) == []
    assert len(set(RULES)) == len(RULES) == 18


def test_tp_groups_straddling_nodes():
    spec = load_model("llama2-7b")
    # stage 0 takes 3 GPUs (tp 1 x dp 3); stage 1's TP-2 groups then start at GPUs 3, 5, 7: 7-8 crosses the node
    plan = _llama([{"num_layers": 16, "tp": 1, "dp": 4}, {"num_layers": 16, "tp": 2, "dp": 2}], count=16)
    assert violations(plan, spec) == []
    job = plan.job.model_copy(update={"global_batch": 24})
    bad = plan.model_copy(update={"job": job, "stages": [Stage(num_layers=16, tp=1, dp=3),
                                                         Stage(num_layers=16, tp=2, dp=3)]})
    assert [e.rule for e in violations(bad, spec)] == ["tp-within-node"]


def test_virtual_stages_need_megatron_conditions():
    spec = load_model("llama2-7b")
    ok = _llama([{"num_layers": 16, "tp": 8, "dp": 1}] * 2, count=16, virtual_stages=4)
    assert violations(ok, spec) == []
    for update, why in (({"virtual_stages": 3}, "divisible by 3"), ({"schedule": "gpipe"}, "needs the 1f1b"),
                        ({"stages": [Stage(num_layers=32, tp=8)]}, "pipeline parallelism")):
        (e,) = violations(ok.model_copy(update=update), spec)
        assert e.rule == "virtual-stages" and why in e.message


def _with(plan, **degrees):
    """``plan`` with CP/EP degrees set on its stages (the stage schema gains these fields with CP/EP planning)."""
    return plan.model_copy(update={"stages": [st.model_copy(update=degrees) for st in plan.stages]})


def test_cp_and_ep_rules_when_stages_carry_them():
    """CP/EP degrees are read from the stage when it has them, else from Plan.stage_layout (1 today)."""
    spec = load_model("llama2-7b")
    plan = _llama([{"num_layers": 32, "tp": 8, "dp": 2}], count=64)
    assert violations(_with(plan, cp=4), spec) == []  # 4096 % 8 == 0; 8 x 4 x 2 = 64 GPUs
    odd = _with(plan.model_copy(update={"job": plan.job.model_copy(update={"seq_len": 4000})}), cp=3)
    assert "cp-divides-sequence" in [e.rule for e in violations(odd, spec)]
    assert [e.rule for e in violations(_with(plan, cp=8), spec)] == ["pool-gpu-count"]
    assert [e.rule for e in violations(_with(plan, ep=2), spec)] == ["ep-needs-experts"]
    moe = spec.model_copy(update={"num_experts": 6})
    assert [e.rule for e in violations(_with(plan, ep=4), moe)] == ["ep-divides-experts"]
    assert violations(_with(plan, ep=2), moe) == []


def test_seq_len_rule():
    spec = load_model("llama2-7b")
    long = _llama([{"num_layers": 32, "tp": 8, "dp": 8}])
    long = long.model_copy(update={"job": long.job.model_copy(update={"seq_len": 8192})})
    assert [e.rule for e in violations(long, spec)] == ["seq-len"]


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "hetplan.cli.main", *args], capture_output=True, text=True, cwd=ROOT)


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_every_command_refuses_with_exit_2(tmp_path, case):
    """estimate, export (each target) and run refuse the broken plan before doing anything, naming the rule."""
    stages, rule = BROKEN[case]
    plan = _llama(stages, count=128 if case == "tp64-on-32-heads" else 64)
    path = tmp_path / "plan.json"
    path.write_text(plan.model_dump_json(indent=1))
    runs = [("estimate", str(path)), ("export", str(path), "--to", "megatron"),
            ("export", str(path), "--to", "torchtitan"), ("run", str(path), "--max-procs", "512")]
    for args in runs:
        r = _cli(*args)
        assert r.returncode == 2, (args, r.stdout[-500:], r.stderr[-2000:])
        assert f"rule {rule}" in " ".join(r.stderr.split()) and "Traceback" not in r.stderr, (args, r.stderr)


def test_search_results_pass_the_validator():
    """What the planner proposes (here a 2-pool job with heterogeneous plans) is never refused."""
    from hetplan.plan import Inventory
    from hetplan.search.planner import search_plans

    job = Job(model="gpt3-1.3b", seq_len=2048, global_batch=64, train_iterations=10)
    inv = Inventory(pools=[GPUPool(gpu="A100-SXM-40GB", count=8, gpus_per_node=4),
                           GPUPool(gpu="V100-SXM-32GB", count=8, gpus_per_node=4)])
    res = search_plans(job, inv, top_k=20)
    spec = load_model("gpt3-1.3b")
    assert res.plans
    for rp in res.plans:
        assert violations(rp.plan, spec) == [], rp.plan.stages


def test_mla_up_proj_needs_multi_latent_attention():
    """Rule ``mla-modules-need-mla``: Megatron-Core's ``--recompute-modules mla_up_proj`` on a model without MLA
    (its TransformerConfig raises) is refused on a plan and, before the search, on a job."""
    from hetplan.plan import GPUPool, Inventory, Job
    from hetplan.search.planner import search_plans

    spec = load_model("llama2-7b")
    plan = _llama([{"num_layers": 16, "tp": 8, "dp": 4}] * 2)
    plan = plan.model_copy(update={"job": plan.job.model_copy(update={"recompute_modules": ["mla_up_proj"]})})
    assert [e.rule for e in violations(plan, spec)] == ["mla-modules-need-mla"]
    with pytest.raises(PlanRuleError, match="has no MLA") as err:
        search_plans(Job(model="llama2-7b", seq_len=4096, global_batch=64, recompute_modules=["mla_up_proj"]),
                     Inventory(pools=[GPUPool(gpu="H100-SXM", count=8)]))
    assert err.value.rule == "mla-modules-need-mla" and err.value.field == "job.recompute_modules"
