"""Megatron-Core's per-module recomputation (``--recompute-modules layernorm moe_act mla_up_proj``) and fine-grained activation
offloading (``--offload-modules expert_fc1 moe_act``): memory, time, validation and export
(:func:`hetplan.estimate.memory.module_activation_bytes`)."""

import pytest
from hypothesis import given, settings, strategies as st
from pydantic import ValidationError

from hetplan.estimate import compute, memory
from hetplan.hardware.catalog import load_catalog
from hetplan.model.spec import load_model
from hetplan.plan import GPUPool, Job, Plan, Stage, balanced_split
from stage_kwargs import memory_of

M = load_model("qwen3-30b-a3b")  # every layer MoE: h 2048, top-8 of 128 experts of 768


def test_module_bytes_worked_example():
    """Per layer, 4096 tokens, TP 1: ``layernorm`` drops the two norm outputs (2 x 2·s·h), ``moe_act`` the
    activation output of every routed copy (k·s·2·f_e); offloading ``expert_fc1`` moves each routed copy's input
    (k·s·2·h), ``moe_act`` the first expert GEMM's gated output (k·s·2·2·f_e). Transformer Engine's FP8 inputs
    halve the linear inputs among them."""
    s, h, k, f = 4096, M.hidden_size, M.experts_per_token, M.expert_ffn_hidden_size
    assert (h, k, f) == (2048, 8, 768)
    both = (["layernorm", "moe_act"], ["expert_fc1", "moe_act"])
    disc, off = memory.module_activation_bytes(M, 1, s, 1, False, *both)
    assert float(disc) == 2 * 2 * s * h + k * s * 2 * f
    assert float(off) == k * s * 2 * h + k * s * 2 * 2 * f
    disc8, off8 = memory.module_activation_bytes(M, 1, s, 1, False, *both, fp8_inputs=True)
    assert float(disc8) == 2 * s * h + k * s * f
    assert float(off8) == k * s * h + k * s * 2 * 2 * f
    assert memory.module_activation_bytes(M, 1, s, 1, False) == (0.0, 0.0)


def _kw(**kw):
    base = dict(num_layers=12, has_embedding=False, has_head=False, single_stage=False, b=1, s=4096, t=1, dp=8,
                zero=1, recompute="none", sequence_parallel=False, in_flight=4, attention="flash")
    return {**base, **kw}


def test_stage_memory_drops_the_modules_bytes_and_holds_two_offloaded_layers():
    """Every stored layer loses the discarded and offloaded bytes, two layers' offloaded inputs are back on the
    GPU around the backward (:data:`hetplan.estimate.memory.OFFLOAD_LAYERS_ON_GPU`); under full recomputation
    (only the layer input stored) or where the whole MoE MLP is recomputed the MoE modules change nothing."""
    opts = dict(recompute_modules=["layernorm", "moe_act"], offload_modules=["expert_fc1", "moe_act"])
    disc, off = memory.module_activation_bytes(M, 1, 4096, 1, False, *opts.values())
    plain = memory_of(M, **_kw()).activations
    with_ = memory_of(M, **_kw(), **opts).activations
    assert float(plain - with_) == pytest.approx(4 * 12 * (disc + off) - memory.OFFLOAD_LAYERS_ON_GPU * off)
    full = [memory_of(M, **_kw(recompute="full"), **o).total for o in ({}, opts)]
    assert float(full[0]) == float(full[1])
    moe = [memory_of(M, **_kw(), moe_recompute=True, recompute_modules=["moe_act"],
                                     offload_modules=o).total for o in ([], ["expert_fc1"])]
    assert float(moe[0]) == float(memory_of(M, **_kw(), moe_recompute=True).total) == float(moe[1])
    with pytest.raises(Exception, match="job.offload_modules"):
        memory.module_activation_bytes(M, 1, 4096, 1, False, (), ["core_attn"])


def _plan(gpu="H100-SXM", **job):
    L = M.num_layers
    return Plan(job=Job(model="qwen3-30b-a3b", seq_len=4096, global_batch=64, **job),
                pools=[GPUPool(gpu=gpu, count=16)], stages=[Stage(num_layers=k, tp=1, dp=8) for k in
                                                            balanced_split(L, 2)], mbs=1, zero=1, ep=8)


def test_time_charges_the_recomputed_ops_and_only_the_exposed_copies():
    """Recomputing ``layernorm`` and ``moe_act`` runs their element-wise work again in backward
    (``ELEMENTWISE_PASSES`` x the discarded bytes at HBM bandwidth); offloading adds nothing while the copies over
    the host link (H100: PCIe 5, GB200: C2C) fit behind the layer's compute."""
    from hetplan.estimate.estimator import estimate

    base = estimate(_plan())
    rec = estimate(_plan(recompute_modules=["layernorm", "moe_act"]))
    disc, _ = memory.module_activation_bytes(M, 1, 4096, 1, False, ["layernorm", "moe_act"])
    gpu_bw = load_catalog().get("H100-SXM").hbm_bandwidth_bytes_per_s
    for a, b in zip(base.stages, rec.stages):
        assert b.forward_s == a.forward_s
        assert b.backward_s - a.backward_s == pytest.approx(
            a.num_layers * compute.ELEMENTWISE_PASSES * float(disc) / gpu_bw, rel=0.01)
    off = estimate(_plan(gpu="GB200", offload_modules=["expert_fc1", "moe_act"]))
    plain = estimate(_plan(gpu="GB200"))
    assert [s.forward_s for s in off.stages] == [s.forward_s for s in plain.stages]
    assert all(o.memory.total < p.memory.total for o, p in zip(off.stages, plain.stages))


def test_module_options_are_megatron_core_options_and_are_exported():
    with pytest.raises(ValidationError, match="offload_modules"):
        Job(model="qwen3-30b-a3b", seq_len=4096, global_batch=64, framework="fsdp", offload_modules=["moe_act"])
    from hetplan.runtime.exporters import export_megatron

    plan = _plan(recompute_modules=["layernorm", "moe_act"], offload_modules=["expert_fc1", "moe_act"])
    plan = plan.model_copy(update={"stages": [s.model_copy(update={"recompute": "none"}) for s in plan.stages]})
    text = "\n".join(export_megatron(plan, M).files.values())
    for arg in ("--recompute-granularity selective", "--recompute-modules layernorm moe_act",
                "--fine-grained-activation-offloading", "--offload-modules expert_fc1 moe_act"):
        assert arg in text, arg


@settings(max_examples=30, deadline=None)
@given(b=st.integers(1, 4), layers=st.integers(1, 24), inflight=st.integers(1, 8), t=st.sampled_from([1, 2, 4]),
       rc=st.sampled_from(["none", "selective", "full"]), fp8=st.booleans(), moe_rc=st.booleans(),
       rec=st.sets(st.sampled_from([x for x in memory.RECOMPUTE_MODULES if x != "mla_up_proj"])),  # Qwen3: no MLA
       off=st.sets(st.sampled_from(memory.OFFLOAD_MODULES)))
def test_more_modules_never_raise_memory(b, layers, inflight, t, rc, fp8, moe_rc, rec, off):
    """Adding a recompute or offload module never raises a stage's memory (two layers' offloaded inputs on the
    GPU never exceed what the stage stored), whatever the recomputation, TP, FP8 and MoE-layer recomputation."""
    from hetplan.estimate import fp8 as fp8_mod

    kw = _kw(b=b, num_layers=layers, in_flight=inflight, t=t, sequence_parallel=t > 1, recompute=rc,
             moe_recompute=moe_rc, fp8_recipe=fp8_mod.recipe(load_catalog().get("H100-SXM"), "megatron") if fp8 else None)
    with_ = float(memory_of(M, **kw, recompute_modules=sorted(rec), offload_modules=sorted(off)).total)
    for smaller_rec, smaller_off in ((set(), off), (rec, set())):
        fewer = memory_of(M, **kw, recompute_modules=sorted(smaller_rec),
                                          offload_modules=sorted(smaller_off)).total
        assert with_ <= float(fewer) + 1e-6


DSV3 = load_model("deepseek-v3")  # MLA: 128 heads, q/k head 128 + 64 RoPE, v head 128, latents 1536 / 512


def _dsv3_plan(**job):
    return Plan(job=Job(model="deepseek-v3", seq_len=4096, global_batch=1024, **job),
                pools=[GPUPool(gpu="H100-SXM", count=1024)],
                stages=[Stage(num_layers=k, tp=2, dp=32) for k in balanced_split(DSV3.num_layers, 16)],
                mbs=1, zero=1, ep=64)


def test_mla_up_proj_drops_the_queries_keys_values_and_reruns_the_up_projections():
    """``--recompute-modules mla_up_proj`` (Megatron-Core ``multi_latent_attention.py``: ``CheckpointWithoutOutput``
    around ``qkv_up_proj_and_rope_apply``): per layer and micro-batch of 4,096 tokens at TP 2 the queries and keys
    (128 heads x 192) and values (128 x 128) are not stored, 2·4096·(24576 + 24576 + 16384)/2 bytes = 256 MiB;
    backward runs the query and key/value up-projections again (forward unchanged). A model without MLA is refused
    (Megatron-Core's TransformerConfig raises too); the launch writes the module and reads back."""
    from hetplan.estimate.estimator import estimate
    from hetplan.estimate.stage import mla_up_proj_time_s
    from hetplan.estimate.variability import slowest_gpu_factor
    from hetplan.errors import HetplanError
    from hetplan.runtime.exporters import export_megatron
    from hetplan.runtime.importers import import_files

    disc, _ = memory.module_activation_bytes(DSV3, 1, 4096, 2, True, ["mla_up_proj"])
    assert (DSV3.q_dim, DSV3.kv_dim, DSV3.v_dim) == (24576, 24576, 16384)
    assert float(disc) == 2 * 4096 * (24576 + 24576 + 16384) / 2 == 256 * 2**20
    base, rec = estimate(_dsv3_plan()), estimate(_dsv3_plan(recompute_modules=["mla_up_proj"]))
    gpu = load_catalog().get("H100-SXM")
    gemms = float(mla_up_proj_time_s(DSV3, gpu, "bf16", 1, 4096, 2))
    # q up (4096 x 12288 x 1536) and kv up (4096 x 16384 x 512) per TP rank: 2·4096·(12288·1536 + 16384·512) FLOPs
    assert gemms > 2 * 4096 * (12288 * 1536 + 16384 * 512) / gpu.peak_flops_per_s("bf16")
    for a, b in zip(base.stages, rec.stages):
        assert b.forward_s == a.forward_s
        assert b.backward_s - a.backward_s == pytest.approx(  # a stage's 64 GPUs wait for their slowest (+2.5 %)
            a.num_layers * (gemms + compute.ELEMENTWISE_PASSES * float(disc) / gpu.hbm_bandwidth_bytes_per_s)
            * float(slowest_gpu_factor(64, gpu.speed_variability)), rel=1e-3)
        assert b.memory.total < a.memory.total
    with pytest.raises(HetplanError, match="mla_up_proj") as err:
        memory.module_activation_bytes(M, 1, 4096, 1, False, ["mla_up_proj"])
    assert err.value.field == "job.recompute_modules"
    plan = _dsv3_plan(recompute_modules=["mla_up_proj"])
    ex = export_megatron(plan, DSV3)
    assert "--recompute-modules mla_up_proj" in "\n".join(ex.files.values())
    assert import_files(ex.files).job.recompute_modules == ["mla_up_proj"]  # Job refused the module before
