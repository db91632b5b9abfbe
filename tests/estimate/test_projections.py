"""Separate vs fused projection GEMMs as a property of the stack (``StackSpec.projections``): the GEMM shapes
and kernels each stack's model code runs, worked on a Llama 3 8B layer, and fused stacks left as they were."""

import dataclasses

import pytest

from hetplan.calibration.validation import gpt_model, megatron_plan
from hetplan.estimate import compute, options
from hetplan.estimate.estimator import estimate
from hetplan.estimate.stagework import LayerTerms, Link
from hetplan.hardware.catalog import load_catalog
from hetplan.hardware.stacks import load_stacks, resolve_stack
from hetplan.model.spec import load_model
from hetplan.plan import Job

M = load_model("llama3-8b")  # h 4096, q 4096, 8 KV heads of 128 (kv 1024), f 14336, gated
GPU = load_catalog().get("H100-SXM")


def _by_hand_s(Mr: float, N: float, K: float) -> float:
    """One bf16 GEMM by the module doc's roofline, written out: 2MNK / (peak · e_max φ(M) φ(N) ψ(K)) against
    the bytes 2(MK + KN + MN) / bandwidth."""
    x0 = GPU.gemm_half_dim
    k0 = GPU.gemm_half_dim * (GPU.peak_flops_per_s("bf16") / GPU.hbm_bandwidth_bytes_per_s) / (312e12 / 2039e9)
    eff = GPU.compute_efficiency * Mr / (Mr + x0) * N / (N + x0) * K / (K + k0)
    return max(2 * Mr * N * K / (GPU.peak_flops_per_s("bf16") * eff),
               2 * (Mr * K + K * N + Mr * N) / GPU.hbm_bandwidth_bytes_per_s)


@pytest.mark.parametrize("t", [1, 8])
def test_llama3_8b_layer_separate_vs_fused_by_hand(t):
    """T = 8192 tokens on one of t TP ranks. Fused (Megatron): QKV (T, 6144/t, 4096), output (T, 4096, 4096/t),
    gate+up (T, 28672/t, 4096), down (T, 4096, 14336/t). Separate (torchtitan's wq, wk, wv, wo, w1, w3, w2): Q
    (T, 4096/t, 4096), K and V (T, 1024/t, 4096) each, gate and up (T, 14336/t, 4096) each. The narrow K / V
    GEMMs and the halved gate / up widths run at a lower shape efficiency, so separate is slower, the more so
    under TP (t = 8: K and V are 128 columns wide)."""
    T, h, q, kv, f = 8192.0, 4096, 4096, 1024, 14336
    out, down = _by_hand_s(T, h, q / t), _by_hand_s(T, h, f / t)
    fused = _by_hand_s(T, (q + 2 * kv) / t, h) + out + _by_hand_s(T, 2 * f / t, h) + down
    separate = (_by_hand_s(T, q / t, h) + 2 * _by_hand_s(T, kv / t, h) + out + 2 * _by_hand_s(T, f / t, h) + down)
    got_fused = float(compute.layer_gemm_times_s(M, GPU, "bf16", 1, 8192, t)[0])
    got_sep = float(compute.layer_gemm_times_s(M, GPU, "bf16", 1, 8192, t, "separate")[0])
    assert got_fused == pytest.approx(fused, rel=1e-9)
    assert got_sep == pytest.approx(separate, rel=1e-9)
    # t = 1: +0.8 % of the layer's linear GEMM time; t = 8: +5.5 %
    assert 0.005 < separate / fused - 1 < 0.01 if t == 1 else 0.04 < separate / fused - 1 < 0.07
    # the attention core is the same either way
    assert float(compute.layer_gemm_times_s(M, GPU, "bf16", 1, 8192, t, "separate")[1]) == pytest.approx(
        float(compute.layer_gemm_times_s(M, GPU, "bf16", 1, 8192, t)[1]), rel=1e-12)


def test_shapes_and_kernels_per_projection_kind():
    T, t = 4096.0, 2
    assert compute.attention_linear_shapes(M, T, t) == [(T, 3072.0, 4096), (T, 4096, 2048.0)]
    assert compute.attention_linear_shapes(M, T, t, "separate") == [
        (T, 2048.0, 4096), (T, 512.0, 4096), (T, 512.0, 4096), (T, 4096, 2048.0)]
    assert compute.attention_linear_shapes(M, T, t, "fused-qkv") == compute.attention_linear_shapes(M, T, t)
    assert compute.mlp_linear_shapes(M, T, 14336, t) == [(T, 14336.0, 4096), (T, 4096, 7168.0)]
    for kind in ("separate", "fused-qkv"):
        assert compute.mlp_linear_shapes(M, T, 14336, t, kind) == [
            (T, 7168.0, 4096), (T, 7168.0, 4096), (T, 4096, 7168.0)]
    assert [compute.projection_kernels(M, k) for k in ("fused", "separate", "fused-qkv")] == [0, 3, 1]
    gpt = gpt_model(2, 1024, 16, 1024)  # GeLU MLP: nothing to split in it
    assert compute.mlp_linear_shapes(gpt, T, 4096, 1, "separate") == compute.mlp_linear_shapes(gpt, T, 4096, 1)
    assert compute.projection_kernels(gpt, "separate") == 2


def test_layer_time_charges_the_separate_gemms_and_their_kernels():
    terms = LayerTerms(Link.one_node(300e9), attention="flash")
    fused_f, fused_b, _ = compute.layer_time_s(M, GPU, "bf16", 1, 8192, 1, 0, terms)
    sep_f, sep_b, _ = compute.layer_time_s(M, GPU, "bf16", 1, 8192, 1, 0,
                                           dataclasses.replace(terms, projections="separate"))
    lin_f = float(compute.layer_gemm_times_s(M, GPU, "bf16", 1, 8192, 1)[0])
    lin_s = float(compute.layer_gemm_times_s(M, GPU, "bf16", 1, 8192, 1, "separate")[0])
    # GPU-bound layer: forward moves by the GEMM difference, backward (two GEMMs per forward GEMM) by twice it
    # plus the sum of the separate linears' input gradients: Q + K + V and gate + up, three addends over the
    # 8192 x 4096 input, 2 B each compiled (read in the norm backward's fused kernel), 6 B eager (an add kernel)
    addends = 3 * 8192 * 4096 / GPU.hbm_bandwidth_bytes_per_s
    assert float(sep_f - fused_f) == pytest.approx(lin_s - lin_f, rel=0.02)
    assert float(sep_b - fused_b) == pytest.approx(2 * (lin_s - lin_f) + 2 * addends, rel=0.02)
    eager_b = compute.layer_time_s(M, GPU, "bf16", 1, 8192, 1, 0,
                                   dataclasses.replace(terms, projections="separate", eager_grad_sum=True))[1]
    assert float(eager_b - sep_b) == pytest.approx(4 * addends, rel=0.02)
    # fused projections: one GEMM writes the input gradient, nothing to sum
    assert compute.projection_grad_sum_bytes(M, 1, 8192, "fused", eager=True) == 0
    # a launch-bound layer pays the three more kernels
    tiny = gpt_model(2, 256, 4, 128)
    f0 = compute.layer_time_s(tiny, GPU, "bf16", 1, 128, 1, 0, terms)[0]
    f1 = compute.layer_time_s(tiny, GPU, "bf16", 1, 128, 1, 0, dataclasses.replace(terms, projections="separate"))[0]
    assert float(f1) > float(f0) + 1.5 * GPU.kernel_overhead_s


def test_async_tp_chunks_every_projection_gemm():
    """Async TP runs each fused GEMM in t chunks: forward all projection GEMMs (each of wq, wk, wv, w1, w3 when
    separate), backward the output-projection and FC2 data-gradient GEMMs only."""
    b, s, t = 1, 8192, 8
    T = b * s

    def extra(M_, N, K):
        return t * compute.gemm_time_s(GPU, "bf16", M_ / t, N, K) - compute.gemm_time_s(GPU, "bf16", M_, N, K)

    for kind in ("fused", "separate"):
        shapes = compute.attention_linear_shapes(M, T, t, kind) + compute.mlp_linear_shapes(M, T, 14336, t, kind)
        fwd, bwd, *_ = compute.async_tp_extra_s(M, GPU, "bf16", b, s, t, projections=kind)
        assert float(fwd) == pytest.approx(sum(float(extra(*x)) for x in shapes), rel=1e-12)
        assert float(bwd) == pytest.approx(float(extra(T, 4096, 4096 / t) + extra(T, 4096, 14336 / t)), rel=1e-12)


def test_each_stack_runs_what_its_model_code_runs():
    cat = load_stacks()
    want = {"megatron-lm": {"fused"}, "nemo": {"fused"}, "megatron-deepspeed": {"fused"},
            "llm-foundry": {"fused"}, "hf-accelerate": {"separate"}, "nemo-automodel": {"separate"},
            "fms-fsdp": {"separate"}, "deepspeed": {"separate"}}
    for name, kinds in want.items():
        assert {r.projections for r in cat.releases(name)} == kinds, name
    titan = {r.version: r.projections for r in cat.releases("torchtitan")}
    assert titan.pop("0.3.0") == "fused-qkv"  # pytorch/torchtitan#3714: fused QKV by default since 2026-06
    assert set(titan.values()) == {"separate"}
    for r in cat.stacks:  # a source naming the model code of that release
        assert any(w in r.sources["projections"] for w in (".py", "transformers")), r.id
    p = {name: resolve_stack(name).projections for name in ("torchtitan@2025-10", "torchtitan", "llm-foundry")}
    assert compute.separate_qkv(p["torchtitan@2025-10"]) and compute.separate_gate_up(p["torchtitan"])
    assert not compute.separate_qkv(p["torchtitan"]) and not compute.separate_gate_up(p["llm-foundry"])


def _plan(stack):
    """Llama 3 8B on 8 H100 at TP 8 (the narrow K / V GEMMs) under ``stack``, as tests/test_stacks.py builds plans."""
    plan = megatron_plan(M, gpu="H100-SXM", tp=8, pp=1, dp=1, mbs=1, gbs=4, recompute="none", seq=8192,
                         inter_node_bandwidth_bytes_per_s=50e9, sequence_parallel=True, dtype="bf16")
    job = {k: v for k, v in plan.job.model_dump().items() if k not in ("framework", "attention")} | {"stack": stack}
    return plan.model_copy(update=dict(job=Job.model_validate(job)))


def test_fused_stacks_price_the_fused_layer_and_the_field_is_what_moves(monkeypatch):
    """A fused stack's estimate is that of Megatron's fused layer; swapping the field (fused <-> separate) moves
    every stack's estimate the way the GEMM shapes say, so the fused stacks' numbers come from the field."""
    stacks = ("megatron-lm", "nemo@24.07", "torchtitan@2025-10")  # releases that run TP
    base = {st: estimate(_plan(st), model=M).iteration_time_s for st in stacks}
    real = options._stack

    def swapped(stack, framework):
        spec = real(stack, framework)
        return spec.model_copy(update={"projections": "separate" if spec.projections == "fused" else "fused"})

    monkeypatch.setattr(options, "_stack", swapped)
    for st, before in base.items():
        after = estimate(_plan(st), model=M).iteration_time_s
        assert (after < before) if st.startswith("torchtitan") else (after > before), st
