"""Silently wrong numbers, session 15 (helper B): plans that exit 0 with numbers that contradict each other."""

from __future__ import annotations

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from hetplan.estimate.estimator import estimate  # noqa: E402
from hetplan.plan import GPUPool, Job, Plan, Stage  # noqa: E402


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
