"""torchtitan's per-op selective activation checkpointing (framework = "fsdp", recompute = "selective"): the bytes
it keeps and the work it recomputes, worked on a Llama block, and the eager loss peak."""

import pytest

from hetplan.estimate import compute, memory
from hetplan.hardware.catalog import load_catalog
from hetplan.model.spec import load_model
from stage_kwargs import memory_of

M = load_model("llama3-8b")  # h 4096, 32 heads, 8 KV heads of 128, f 14336, gated


def test_matmul_order_is_torchtitans():
    h, f, kv = 4096, 14336, 1024
    assert compute.op_sac_matmuls(M) == ((h * h, h), (h * kv, kv), (h * kv, kv), (h * h, h), (h * f, f),
                                         (h * f, f), (f * h, h))


def test_saved_bytes_worked_case():
    """TP 1: block input 2sbh + wq 2sbh + wv 2sb·kv + w1 2sbf + w2 2sbh + SDPA output 2sbh + lse 4·a·s·b."""
    b, s, h, f, kv, a = 2, 8192, 4096, 14336, 1024, 32
    sb = b * s
    want = 2 * sb * (h + h + kv + f + h + h) + 4 * a * sb
    assert float(memory.op_sac_activation_bytes(M, b, s, 1)) == pytest.approx(want, rel=1e-12)
    none = float(compute.counts.layer_activation_bytes(M, b, s, 1, recompute="none", attention="flash"))
    assert 0.4 < want / none < 0.5  # about half of what the block keeps without checkpointing
    # TP 8 with sequence parallelism: everything split, plus wo's reduce-scatter output
    tp = float(memory.op_sac_activation_bytes(M, b, s, 8, sequence_parallel=True))
    assert tp == pytest.approx((want + 2 * sb * h) / 8, rel=1e-12)


def test_recompute_is_the_even_matmuls_plus_the_elementwise_work():
    gpu = load_catalog().get("H100-SXM")
    b, s = 2, 8192
    linear, _ = compute.layer_gemm_times_s(M, gpu, "bf16", b, s, 1)
    w = [x for x, _ in compute.op_sac_matmuls(M)]
    extra = float(compute.op_sac_recompute_s(M, gpu, "bf16", b, s, 1))
    gemms = float(linear) * (w[1] + w[3] + w[5]) / sum(w)
    assert gemms < extra < gemms * 1.5  # wk, wo, w3 plus the element-wise kernels
    assert gemms / float(linear) == pytest.approx((1024 + 4096 + 14336) / (4096 + 2048 + 4096 + 3 * 14336), rel=1e-9)


def test_fsdp_selective_keeps_op_sac_bytes_and_megatron_keeps_its_own():
    kw = dict(num_layers=4, has_embedding=False, has_head=False, single_stage=False, b=2, s=8192, t=1, dp=8, zero=3,
              recompute="selective", sequence_parallel=False, in_flight=1, attention="flash")
    fsdp = memory_of(M, framework="fsdp", **kw)
    meg = memory_of(M, framework="megatron", **kw)
    assert float(fsdp.activations) == pytest.approx(4 * float(memory.op_sac_activation_bytes(M, 2, 8192, 1)))
    assert float(fsdp.activations) < 0.5 * float(meg.activations)


def test_eager_loss_peak_on_the_last_stage():
    """torchtitan's fp32 cross-entropy: 12 bytes per logit at its peak, against Megatron's fused 4 + 2 (a release
    before the chunked loss of 0.3.0, which holds one chunk's logits: tests/estimate/test_memory.py)."""
    kw = dict(num_layers=1, has_embedding=False, has_head=True, single_stage=False, b=2, s=8192, t=1, dp=8, zero=3,
              recompute="full", sequence_parallel=False, in_flight=1, attention="flash", framework="fsdp",
              stack="torchtitan@2025-10")
    mem = memory_of(M, **kw)
    logits = 2 * 8192 * M.padded_vocab_size()
    head = 4 * 2 * 8192 * (M.hidden_size + M.padded_vocab_size())
    recomputed = float(compute.counts.layer_activation_bytes(M, 2, 8192, 1, recompute="none", attention="flash"))
    recomputed += float(memory.sdpa_kv_bytes(M, 2, 8192, 1, expanded=True) - memory.sdpa_kv_bytes(M, 2, 8192, 1))
    assert float(mem.transient) >= memory.CROSS_ENTROPY_BYTES_PER_LOGIT["fp32"] * logits - head - recomputed - 1


MIXTRAL = load_model("mixtral-8x7b")  # 32 MoE layers, h 4096, 8 experts top-2 of f 14336, no shared expert


def test_moe_layer_recomputes_its_routed_experts_and_half_its_matmuls():
    """A MoE layer under per-op SAC: ``aten._grouped_mm`` is on no save list, so backward runs the routed experts'
    two grouped GEMMs again, and the token permutation; of the other matmuls (attention, router) every other one,
    taken as half their time; the all-to-alls are saved (no communication again). Before, 0 was charged."""
    from hetplan.estimate import moe

    gpu = load_catalog().get("H100-SXM")
    b, s, ep = 1, 4096, 8
    router, up, down = moe.moe_mlp_gemm_times_s(MIXTRAL, gpu, "bf16", b, s, 1, ep, framework="fsdp")
    attn, _ = compute.attention_gemm_times_s(MIXTRAL, gpu, "bf16", b, s, 1)
    act = compute.counts.layer_activation_bytes(MIXTRAL, b, s, 1, recompute="none", attention="flash")
    elem = compute.ELEMENTWISE_PASSES * act / gpu.hbm_bandwidth_bytes_per_s
    want = 0.5 * (attn + router) + up + down + moe.permute_time_s(MIXTRAL, gpu, b, s, 1, ep) + elem
    got = moe.op_sac_recompute_s(MIXTRAL, gpu, "bf16", b, s, 1, ep=ep, framework="fsdp")
    assert float(got) == pytest.approx(float(want), rel=1e-12)
    assert float(up + down) > 0.5 * float(got)  # the experts are most of it


def test_moe_layer_keeps_its_all_to_all_outputs_not_its_expert_activations():
    """Saved: block input, half the attention and router matmul outputs, SDPA output + lse, and the dispatch and
    combine all-to-all outputs (2·k·sbh each; the dispatch side times the load imbalance)."""
    b, s, h, k, a = 1, 4096, 4096, 2, 32
    sb = b * s
    attn_mm = 0.5 * 2 * sb * (4096 + 1024 + 1024 + 4096)
    router = 0.5 * 2 * sb * 8
    a2a = 2 * k * sb * h * (1.25 + 1.0)
    want = 2 * sb * h + attn_mm + router + a2a + 2 * sb * 4096 + 4 * a * sb
    got = float(memory.op_sac_activation_bytes(MIXTRAL, b, s, 1, imbalance=1.25))
    assert got == pytest.approx(want, rel=1e-12)
    none = float(compute.counts.layer_activation_bytes(MIXTRAL, b, s, 1, recompute="none", attention="flash"))
    assert got < 0.5 * none


def test_moe_plan_with_op_sac_sits_between_none_and_full():
    """Mixtral 8x7B on 8 H100 under FSDP2 with EP 8: per-op SAC costs time (its experts run again) and saves
    memory, both between no checkpointing and full; HFU counts the recomputed experts' FLOPs."""
    from hetplan.estimate.estimator import estimate
    from hetplan.plan import GPUPool, Job, Plan, Stage

    def run(rc):
        job = Job(model="mixtral-8x7b", seq_len=4096, global_batch=64, framework="fsdp")
        plan = Plan(job=job, pools=[GPUPool(gpu="H100-SXM", count=8)], mbs=1, zero=3, ep=8,
                    stages=[Stage(pool=0, num_layers=32, tp=1, dp=8, recompute=rc)])
        return estimate(plan, model=MIXTRAL)

    none, sac, full = (run(rc) for rc in ("none", "selective", "full"))
    assert none.iteration_time_s < sac.iteration_time_s < full.iteration_time_s
    assert full.memory_bytes_per_gpu.activations < sac.memory_bytes_per_gpu.activations \
        < none.memory_bytes_per_gpu.activations
    assert sac.mfu < sac.hfu <= 1 and sac.hfu / sac.mfu > 1.2  # the routed experts' forward FLOPs again
