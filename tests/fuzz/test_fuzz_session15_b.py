"""Silently wrong numbers, session 15 (helper B): plans that exit 0 with numbers that contradict each other."""

from __future__ import annotations

import json

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from hetplan.estimate.estimator import estimate  # noqa: E402
from hetplan.plan import GPUPool, Job, Plan, Stage  # noqa: E402
from tests.fuzz.inproc import run_cli  # noqa: E402


def _fsdp_plan(model: str, layers: int, mbs: int, recompute: str, tp: int, seq: int = 4096) -> Plan:
    job = Job(model=model, seq_len=seq, global_batch=256, train_iterations=10, framework="fsdp")
    return Plan(job=job, pools=[GPUPool(gpu="H200", count=8)], mbs=mbs, zero=3, sequence_parallel=tp > 1,
                stages=[Stage(num_layers=layers, tp=tp, dp=8 // tp, recompute=recompute)])


@settings(max_examples=20, deadline=None)
@given(model=st.sampled_from([("gemma2-9b", 42), ("qwen3-8b", 36), ("llama3-8b", 32), ("gemma3-4b", 34)]),
       mbs=st.sampled_from([1, 4, 8]), recompute=st.sampled_from(["none", "selective", "full"]),
       tp=st.sampled_from([1, 2]))
def test_fsdp_memory_breakdown_has_no_negative_part(model, mbs, recompute, tp):
    """Under ``framework = "fsdp"`` the last stage's activations counted Megatron's output-layer term
    ``4sb(h + V)/t`` while torchtitan's loss peak replaced it, so the overhead came out negative by that much:
    gemma2-9b, seq 4096, mbs 8, 8 L40S, full recomputation printed "activations 45.9 + overhead -21.3 = 43.7 GiB".
    Every part is now >= 0 and none exceeds the total (the total is unchanged)."""
    name, layers = model
    e = estimate(_fsdp_plan(name, layers, mbs, recompute, tp))
    for st_ in e.stages:
        mem = st_.memory
        parts = (mem.weights, mem.gradients, mem.optimizer, mem.activations, mem.overhead)
        assert all(x >= 0 for x in parts), parts
        assert mem.activations <= mem.total
        assert sum(parts) == pytest.approx(mem.total, rel=1e-12)


def _plan_json(*args):
    r = run_cli("plan", *args, "--json", "--top", "1")
    assert r.code == 0, r.stderr
    return json.loads(r.stdout)["plans"][0]


@pytest.mark.parametrize("model, gpus", [("qwen3-32b", 32), ("llama3-70b", 64)])
def test_fsdp_search_offers_per_op_selective_checkpointing(model, gpus):
    """Under ``framework = "fsdp"`` selective recomputation is torchtitan's per-op SAC, priced with its own memory
    and time, but the searches left it out as "the same plan as none under flash" (true of Megatron-LM only): the
    unpinned fastest plan of qwen3-32b on 32 H100 took 34.38 s per iteration (full recomputation) while
    ``--recompute selective`` found 31.32 s. The top plan is now never slower than the pinned one."""
    job = ("--model", model, "--seq-len", "8192", "--global-batch", "256", "--tokens", "1e10", "--gpu", "H100-SXM",
           "--gpus", str(gpus), "--framework", "fsdp")
    free, pinned = _plan_json(*job), _plan_json(*job, "--recompute", "selective")
    assert free["iteration_time_s"] <= pinned["iteration_time_s"] * (1 + 1e-9)


def test_selective_on_an_fsdp_stack_without_it_is_refused():
    """llm-foundry 0.3 (no selective recomputation) accepted ``--recompute selective`` as "none under flash" and
    priced torchtitan's per-op SAC it cannot run (43.7 s and 15.6 GiB of activations against none's 39.7 s and
    37.1 GiB); now refused, naming the pin."""
    r = run_cli("plan", "--model", "llama3-8b", "--seq-len", "8192", "--global-batch", "256", "--tokens", "1e10",
                "--gpu", "H100-SXM", "--gpus", "8", "--stack", "llm-foundry@0.3", "--recompute", "selective", "--mbs",
                "1")
    assert r.code == 2 and not r.traceback
    assert "recompute" in r.stderr and "llm-foundry" in r.stderr


def test_an_fsdp_plan_with_selective_on_a_stack_without_it_breaks_the_stack_rule():
    """The plan rules dropped ``selective`` under flash for every framework; under fsdp it is a mode of its own."""
    from hetplan.model.spec import load_model
    from hetplan.plan_rules import violations

    job = Job(model="llama3-8b", seq_len=4096, global_batch=64, train_iterations=1, framework="fsdp",
              stack="llm-foundry@0.3")
    plan = Plan(job=job, pools=[GPUPool(gpu="H100-SXM", count=8)], mbs=1, zero=3,
                stages=[Stage(num_layers=32, dp=8, recompute="selective")])
    assert any(v.rule == "stack-has-option" and "recompute" in v.field for v in violations(plan, load_model("llama3-8b")))
    ok = plan.model_copy(update={"stages": [Stage(num_layers=32, dp=8, recompute="full")]})
    assert not violations(ok, load_model("llama3-8b"))
