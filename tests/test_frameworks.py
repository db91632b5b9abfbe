"""Framework capabilities as data (hardware/data/frameworks.toml) and the plan rule that reads them."""

from __future__ import annotations

import pytest

from hetplan.errors import HetplanError
from hetplan.hardware.frameworks import FrameworkSpec, framework_for, load_frameworks
from hetplan.model.spec import load_model
from hetplan.plan import GPUPool, Job, Plan, Stage
from hetplan.plan_rules import launch_violations, split_kind
from hetplan.runtime import exporters


def test_every_capability_has_a_source_and_every_export_release_an_entry():
    fields = set(FrameworkSpec.model_fields) - {"name", "export", "job_framework", "sources"}
    for f in load_frameworks():
        assert fields <= set(f.sources), (f.id, fields - set(f.sources))
        assert all(len(text) > 20 for text in f.sources.values()), f.id
    for target, releases in exporters.VERSIONS.items():
        for r in releases:
            assert framework_for(target, r).export == target


def _plan(model, layers, *, tp=1, dp=4, ep=1, etp=1, zero=1, v=1, dtype="bf16", gpus=64, schedule="1f1b"):
    job = Job(model=model, seq_len=4096, global_batch=256, train_iterations=10, dtype=dtype)
    return Plan(job=job, pools=[GPUPool(gpu="H100-SXM", count=gpus)], mbs=1, zero=zero, ep=ep, expert_tp=etp,
                virtual_stages=v, schedule=schedule,
                stages=[Stage(num_layers=n, tp=tp, dp=dp) for n in layers])


def test_split_kinds():
    spec = load_model("llama2-7b")
    assert split_kind(_plan("llama2-7b", [16, 16]), spec) == "equal"
    assert split_kind(_plan("llama2-7b", [10, 11, 11]), spec) == "embedding-loss"  # 32 + embedding = 3 x 11
    assert split_kind(_plan("llama2-7b", [9, 7, 7, 9]), spec) == "first-last"
    assert split_kind(_plan("llama2-7b", [5, 9, 7, 11]), spec) == "any"


def test_what_each_framework_cannot_launch():
    mixtral = load_model("mixtral-8x7b")
    folded = _plan("mixtral-8x7b", [16, 16], tp=2, dp=4, ep=4, etp=2, zero=3)
    assert launch_violations(folded, mixtral, "megatron") == []
    (bad,) = launch_violations(folded, mixtral, "torchtitan")
    assert bad.rule == "framework-can-launch" and "expert-TP 2" in bad.message and "efsdp" in bad.message
    assert launch_violations(folded, mixtral, "torchtitan", "0.2") == []
    ds = launch_violations(_plan("llama2-7b", [16, 16], zero=2, dtype="fp8"), load_model("llama2-7b"), "deepspeed")
    assert [("ZeRO-2" in b.message, "FP8" in b.message) for b in ds] == [(True, False), (False, True)]
    gpipe = _plan("llama2-7b", [5, 9, 7, 11], schedule="gpipe")
    assert [b.field for b in launch_violations(gpipe, load_model("llama2-7b"), "megatron")] == ["plan.schedule"]
    with pytest.raises(HetplanError, match="rule framework-can-launch"):
        exporters.export(folded, mixtral, "torchtitan")
