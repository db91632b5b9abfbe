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
