"""The searches propose only the parallel dimensions and schedules the job's stack runs (``stacks.toml``
``parallel`` / ``interleaved``): the uniform space row by row, the best plan of each stack, the fine and the
heterogeneous search, the pinned-dimension errors and rule ``stack-has-option`` (issue #29 item 1, #28 item 1)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hetplan.hardware.stacks import load_stacks, resolve_stack
from hetplan.model.spec import load_model
from hetplan.plan import GPUPool, Inventory, Job, Plan, Stage
from hetplan.plan_rules import PlanRuleError, check_plan, violations
from hetplan.search.planner import search_plans
from hetplan.search.space import Pins, enumerate_space

STACKS = [s.id for s in load_stacks().stacks]
DIMS = ("tp", "pp", "cp", "ep")


def _uses(cfg: dict, i: int) -> set[str]:
    """The dimensions (and ``vp``: interleaving) row ``i`` of an enumerated space uses beyond DP."""
    return {d for d in DIMS if cfg[d][i] > 1} | ({"vp"} if cfg["virtual_stages"][i] > 1 else set())


@settings(max_examples=40, deadline=None)
@given(stack=st.sampled_from(STACKS), model=st.sampled_from(["mixtral-8x7b", "llama2-7b"]),
       gpus=st.sampled_from([8, 16, 32]), seq=st.sampled_from([4096, 16384]))
def test_every_row_of_the_uniform_space_is_one_the_stack_runs(stack, model, gpus, seq):
    """Property: no enumerated row uses a dimension or interleaving its stack lacks, and each dimension the stack
    runs (and the space allows at this size) does appear: the filter removes exactly what the stack lacks."""
    spec, s = load_model(model), resolve_stack(stack)
    cfg = enumerate_space(spec, 64, gpus, 8, Pins(), "flash", seq, stack=s, interleave=True, uneven=False)
    used = set().union(*(_uses(cfg, i) for i in range(len(cfg["tp"]))))
    lacks = {d for d in (*DIMS, "vp") if not s.has(d)}
    assert not used & lacks, (stack, used & lacks)
    assert all(int(z) in s.zero for z, d in zip(cfg["zero"], cfg["dp"]) if d > 1)  # llm-foundry: ZeRO-3 only
    assert {"tp", "pp"} & set(s.parallel) <= used
    if "ep" in s.parallel and spec.is_moe:
        assert "ep" in used
    if "cp" in s.parallel and seq >= 16384:
        assert "cp" in used


@pytest.mark.parametrize("stack", sorted({s.name for s in load_stacks().stacks}) + [
    "megatron-lm@2.0", "nemo@22.05", "torchtitan@2024-04", "torchtitan@2024-06"])
def test_best_plan_of_each_stack_passes_stack_has_option(stack):
    """The searched best plan of a small MoE job under each stack (its latest release, and the releases that
    lack interleaving or PP) breaks no rule, in particular not ``stack-has-option``."""
    job = Job(model="mixtral-8x7b", seq_len=4096, global_batch=64, train_iterations=10, stack=stack)
    res = search_plans(job, Inventory(pools=[GPUPool(gpu="H100-SXM", count=16)]), top_k=3, heterogeneous=False)
    spec = load_model("mixtral-8x7b")
    for rp in res.plans:
        assert not [e.rule for e in violations(rp.plan, spec)], (stack, rp.plan.pp, rp.plan.ep)


def test_llm_foundry_proposes_fsdp_only_plans():
    """Worked example: llm-foundry 0.3 (Composer FSDP1, ``fsdp_config`` only) on 64 H100 proposes only TP = PP =
    CP = EP = 1 without interleaving; the same job under torchtitan (TP, PP, CP) still searches TP."""
    inv = Inventory(pools=[GPUPool(gpu="H100-SXM", count=64)])
    job = Job(model="llama2-7b", seq_len=4096, global_batch=1024, train_iterations=10, stack="llm-foundry@0.3")
    res = search_plans(job, inv, top_k=5, heterogeneous=False)
    assert len(res.plans) == 5
    assert "Stack llm-foundry@0.3 runs DP: no TP, PP, CP searched" in " ".join(res.explanation)
    for rp in res.plans:
        p = rp.plan
        assert (p.pp, p.cp, p.ep, p.virtual_stages, {s.tp for s in p.stages}) == (1, 1, 1, 1, {1})
        assert p.stages[0].dp == 64 and p.zero == 3
    titan = search_plans(job.model_copy(update={"stack": "torchtitan@2025-10"}), inv, pins=Pins(tp=2), top_k=1,
                         heterogeneous=False)
    assert titan.plans[0].plan.stages[0].tp == 2
    assert not any(line.startswith("Stack ") for line in titan.explanation)  # it runs every dense dimension


def _plan(stack: str, **kw) -> tuple:
    spec = load_model("llama2-7b")
    tp, pp, v = kw.pop("tp", 1), kw.pop("pp", 1), kw.pop("virtual_stages", 1)
    job = Job(model="llama2-7b", seq_len=4096, global_batch=64, stack=stack)
    stages = [Stage(num_layers=32 // pp, tp=tp, dp=8 // (tp * pp)) for _ in range(pp)]
    return spec, Plan(job=job, pools=[GPUPool(gpu="H100-SXM", count=8)], stages=stages, mbs=1, zero=kw.pop("zero", 3),
                      virtual_stages=v, **kw)


def test_rule_refuses_a_dimension_the_stack_lacks():
    spec, plan = _plan("llm-foundry@0.3", tp=2)
    with pytest.raises(PlanRuleError, match="tensor parallelism, which stack llm-foundry@0.3 lacks") as exc:
        check_plan(plan, spec)
    assert exc.value.rule == "stack-has-option" and exc.value.field == "plan.stages[].tp"
    spec, plan = _plan("deepspeed", tp=2, zero=1)
    with pytest.raises(PlanRuleError, match="tensor parallelism, which stack deepspeed@0.16 lacks"):
        check_plan(plan, spec)
    spec, plan = _plan("torchtitan@2024-04", pp=2)
    with pytest.raises(PlanRuleError, match="pipeline parallelism") as exc:
        check_plan(plan, spec)
    assert exc.value.field == "plan.stages"
    spec, plan = _plan("megatron-lm@2.0", pp=2, zero=0, virtual_stages=2)
    with pytest.raises(PlanRuleError, match="interleaved 1F1B, which stack megatron-lm@2.0 lacks"):
        check_plan(plan, spec)
    for ok, zero in (("megatron-lm@2.5", 0), ("torchtitan@2024-06", 3)):  # the release that brought it runs it
        spec, plan = _plan(ok, pp=2, zero=zero, virtual_stages=2)  # (torchtitan's DDP of 2024: 1-D meshes only)
        check_plan(plan, spec)


def test_fine_and_hetero_searches_keep_to_the_stack():
    """The fine search never splits a stage under a stack without PP; a two-pool inventory under such a stack gets
    no heterogeneous plan (stages on two pools are a pipeline), only its pools' FSDP plans."""
    from hetplan.search.fine import FineSearch, FineStage, FineState
    from hetplan.search.fine_cost import FineCostModel

    job = Job(model="llama2-7b", seq_len=4096, global_batch=64, train_iterations=10, stack="llm-foundry@0.3")
    inv = Inventory(pools=[GPUPool(gpu="H100-SXM", count=8), GPUPool(gpu="A100-SXM-80GB", count=8)])
    from hetplan.hardware.catalog import load_catalog

    cm = FineCostModel(load_model("llama2-7b"), job, inv.pools[0], load_catalog().get("H100-SXM"))
    search = FineSearch(cm)
    assert search.tps == [1] and search.cps == [1] and not search.interleave
    assert not search.valid(FineState((FineStage(16, 1, 4), FineStage(16, 1, 4)), 4, 0, 1, 1))
    res = search_plans(job, inv, top_k=3)
    assert res.heterogeneous is None
    assert all(len({s.pool for s in rp.plan.stages}) == 1 and rp.plan.pp == 1 for rp in res.plans)


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "hetplan.cli.main", *map(str, args)], capture_output=True,
                          text=True, timeout=120)


def test_pinned_dimension_the_stack_lacks_exits_2_naming_the_rule():
    base = ("plan", "--model", "llama2-7b", "--seq-len", "4096", "--global-batch", "1024", "--gpu", "H100-SXM",
            "--gpus", "64")
    r = _cli(*base, "--tp", "2", "--stack", "llm-foundry@0.3")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "error: --tp:" in r.stderr and "rule stack-has-option" in r.stderr and "llm-foundry@0.3" in r.stderr
    r = _cli(*base, "--virtual-stages", "2", "--stack", "megatron-lm@2.0")
    assert r.returncode == 2 and "error: --virtual-stages:" in r.stderr and "rule stack-has-option" in r.stderr
    r = _cli("catalog", "stacks", "llm-foundry")
    assert r.returncode == 0 and "parallel: dp" in r.stdout and "tp_config" in r.stdout


def test_pinned_zero_or_recompute_the_stack_lacks_is_refused_before_the_search():
    """``--stack nemo@22.05 --zero 1`` printed ZeRO-1 plans at DP = 1 only (the one place ZeRO-1 is allowed)
    instead of saying the stack has no ZeRO-1; ``--dp 1`` keeps the harmless what-if."""
    from hetplan.errors import HetplanError
    from hetplan.search.planner import check_pins

    m = load_model("llama2-7b")
    job = Job(model="llama2-7b", seq_len=4096, global_batch=1024, train_iterations=10, stack="nemo@22.05")
    with pytest.raises(HetplanError) as err:
        check_pins(Pins(zero=1), m, job)
    assert err.value.field == "pin.zero" and "nemo@22.05" in str(err.value) and "ZeRO 0 only" in str(err.value)
    check_pins(Pins(zero=1, dp=1), m, job)
    check_pins(Pins(zero=0), m, job)
    old = Job(model="llama2-7b", seq_len=4096, global_batch=1024, train_iterations=10, stack="megatron-lm@2.0")
    with pytest.raises(HetplanError) as err:
        check_pins(Pins(recompute="selective"), m, old.model_copy(update={"attention": "standard"}))
    assert err.value.field == "pin.recompute" and "none, full only" in str(err.value)
    check_pins(Pins(recompute="full"), m, old)
