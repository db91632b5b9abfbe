"""Eager PyTorch vs torch.compile (framework = "fsdp", Job.torch_compile): the bytes and kernels of torchtitan's
unfused element-wise ops, worked on Llama 3 8B, where the stage charges them, the op-SAC recomputation of the TP
all-gathers, HFU's op-SAC FLOPs, and the plan field."""

import numpy as np
import pytest

from hetplan.estimate import compute, elementwise
from hetplan.estimate.estimator import estimate, hardware_flops_per_iteration
from hetplan.estimate.stagework import LayerTerms, Link
from hetplan.hardware.catalog import load_catalog
from hetplan.hardware.stacks import default_stack
from hetplan.model.spec import load_model
from hetplan.plan import GPUPool, Job, Plan, Stage
from stage_kwargs import costs_of

M = load_model("llama3-8b")  # h 4096, q 4096, kv 1024, f 14336, RMSNorm, rotary, SwiGLU
GPU = load_catalog().get("H100-SXM")
H, Q, KV, F = 4096, 4096, 1024, 14336


def test_eager_rmsnorm_bytes_worked_case():
    """torchtitan's RMSNorm on a (2, 8192, 4096) bf16 tensor: float() 2+4, pow 4+4, mean 4, x*rsqrt 4+4,
    type_as 4+2, *weight 2+2 = 36 B per element in 8 kernels, against 2+2 fused: 32 B more, 7 more kernels."""
    n = 2 * 8192 * H
    eager = (2 + 4) + (4 + 4) + 4 + (4 + 4) + (4 + 2) + (2 + 2)
    assert eager == 36 and elementwise.RMSNORM_EXTRA_BYTES == eager - 4
    gpt = load_model("gpt3-1.3b")  # LayerNorm (one ATen kernel), learned positions, GeLU: only the residual re-read
    assert float(elementwise.eager_layer_bytes(gpt, 2, 8192)) == pytest.approx(2 * 2 * 8192 * gpt.hidden_size)
    assert elementwise.eager_layer_kernels(gpt) == 1
    # Llama: two norms, rotary on Q and K, SwiGLU, the residual re-read
    want = 32 * 2 * n + 16 * 2 * 8192 * (Q + KV) + 4 * 2 * 8192 * F + 2 * n
    assert float(elementwise.eager_layer_bytes(M, 2, 8192)) == pytest.approx(want, rel=1e-12)
    assert elementwise.eager_layer_kernels(M) == 2 * 7 + 5 + 1 + 1


def test_tp_with_sequence_parallelism_splits_every_op():
    one = float(elementwise.eager_layer_bytes(M, 12, 8192, 1))
    assert float(elementwise.eager_layer_bytes(M, 12, 8192, 8, True)) == pytest.approx(one / 8, rel=1e-12)
    # without SP the norms and residuals run on the whole sequence on every rank
    assert float(elementwise.eager_layer_bytes(M, 12, 8192, 8, False)) > one / 8


def _stage(torch_compile, recompute_code, **kw):
    link = Link(gpus_per_node=8, intra_node_bandwidth_bytes_per_s=450e9, inter_node_bandwidth_bytes_per_s=400e9)
    args = dict(s=8192, b=2, t=1, dp=8, num_layers=32, has_embedding=False, has_head=False, single_stage=False,
                in_flight=1, num_microbatches=1, zero=3, recompute_code=recompute_code, sequence_parallel=False,
                )
    args.update(framework="fsdp", torch_compile=torch_compile)
    args.update(kw)
    return costs_of(M, GPU, link, **args)


@pytest.mark.parametrize("recompute_code, again", [(0, 0), (1, 1), (2, 1)])
def test_stage_charges_the_bytes_forward_backward_and_recompute(recompute_code, again):
    """Forward +bytes/BW per layer; backward twice that, plus once more when the forward is recomputed (full) or
    its element-wise ops are (per-op SAC). The layers are GPU-bound here: the host floor's share is < 1e-3."""
    eager, fused = _stage(False, recompute_code), _stage(True, recompute_code)
    per_layer = float(elementwise.eager_layer_bytes(M, 2, 8192)) / GPU.hbm_bandwidth_bytes_per_s
    assert float(eager.forward_s - fused.forward_s) == pytest.approx(32 * per_layer, rel=1e-3)
    # and eager autograd sums the separate projections' input gradients in add kernels of its own (the default
    # fsdp stack, torchtitan 0.3.0: separate gate and up; compute.projection_grad_sum_bytes), backward only
    kind = default_stack("fsdp").projections
    grad_sum = float(compute.projection_grad_sum_bytes(M, 2, 8192, kind, eager=True)
                     - compute.projection_grad_sum_bytes(M, 2, 8192, kind)) / GPU.hbm_bandwidth_bytes_per_s
    assert grad_sum > 0
    assert float(eager.backward_s - fused.backward_s) == pytest.approx(32 * (per_layer * (2 + again) + grad_sum),
                                                                        rel=1e-3)


def test_megatron_ignores_compile_and_eager_loss_is_on_the_head_stage():
    assert float(_stage(False, 1, framework="megatron").forward_s) == float(_stage(True, 1, framework="megatron").forward_s)
    head_e, head_f = _stage(False, 0, has_head=True), _stage(True, 0, has_head=True)
    body = float(_stage(False, 0).forward_s - _stage(True, 0).forward_s)
    loss = float(head_e.forward_s - head_f.forward_s) - body
    logits = 2 * 8192 * M.padded_vocab_size()
    assert loss == pytest.approx(14 * logits / GPU.hbm_bandwidth_bytes_per_s + 3 * GPU.kernel_overhead_s, rel=1e-6)
    # the loss follows Plan.cross_entropy: torchtitan before 2025-04 compiled the blocks only (eager fp32 loss);
    # NeMo AutoModel's loss skips the upcast (bf16: no extra bytes)
    fp32 = _stage(True, 0, has_head=True, cross_entropy="fp32")
    assert float(fp32.forward_s - head_f.forward_s) == pytest.approx(loss, rel=1e-9)
    assert float(_stage(False, 0, has_head=True, cross_entropy="bf16").forward_s - head_e.forward_s) == (
        pytest.approx(-loss, rel=1e-9))


def test_eager_fp8_casts_are_33_bytes_per_element():
    shapes = [(16384.0, 6144.0, 4096.0, 1.0)]
    f, b = elementwise.eager_cast_time_s(GPU, shapes)
    assert f == pytest.approx(16384 * 4096 * (33 - 5) / GPU.hbm_bandwidth_bytes_per_s)  # beyond the fused 5 B
    assert b == pytest.approx(16384 * 6144 * (33 - 5) / GPU.hbm_bandwidth_bytes_per_s)


def test_op_sac_recomputes_the_two_tp_allgathers():
    """Per-op SAC saves the reduce-scatters, not the all-gathers: under TP + SP its backward runs the forward's two
    all-gathers again, one all-reduce's worth of ring steps."""
    link = Link(8, 450e9, 450e9)  # one node of 8 GPUs
    kw = dict(sequence_parallel=True, attention="flash")
    off = compute.layer_time_s(M, GPU, "bf16", 12, 8192, 8, 1, LayerTerms(link, op_sac=False, **kw))
    on = compute.layer_time_s(M, GPU, "bf16", 12, 8192, 8, 1, LayerTerms(link, op_sac=True, **kw))
    allreduce = compute.group_collective_time_s(12 * 8192 * H * 2, "allreduce", 8, 1, link)
    assert float(on[0]) == float(off[0])
    assert float(on[1] - off[1]) == pytest.approx(float(allreduce), rel=1e-9)
    assert float(on[2] - off[2]) == pytest.approx(float(allreduce), rel=1e-9)
    full = compute.layer_time_s(M, GPU, "bf16", 12, 8192, 8, 2, LayerTerms(link, op_sac=True, **kw))
    assert float(full[2]) == float(compute.layer_time_s(M, GPU, "bf16", 12, 8192, 8, 2, LayerTerms(link, **kw))[2])


def test_hfu_counts_op_sac_matmuls():
    """HFU under per-op SAC: model FLOPs + the flash score recompute + wk, wo, w3 again (2 FLOPs per weight and
    token)."""
    gbs, s = 16.0, 8192.0
    base = hardware_flops_per_iteration(M, s, gbs, 1, flash=True)
    sac = hardware_flops_per_iteration(M, s, gbs, 1, flash=True, op_sac=True)
    assert float(sac - base) == pytest.approx(2 * gbs * s * (H * KV + Q * H + H * F) * M.num_layers, rel=1e-12)
    assert float(hardware_flops_per_iteration(M, s, gbs, 0, flash=True, op_sac=True)) == float(
        hardware_flops_per_iteration(M, s, gbs, 0, flash=True))


def _plan(**job):
    return Plan(job=Job(model="llama3-8b", seq_len=8192, global_batch=16, framework="fsdp", **job),
                pools=[GPUPool(gpu="H100-SXM", count=8)], stages=[Stage(num_layers=32, dp=8, recompute="selective")],
                mbs=2, zero=3)


def test_eager_plan_is_slower_and_hfu_above_mfu():
    eager, fused = estimate(_plan(torch_compile=False)), estimate(_plan())
    assert 1.05 < eager.iteration_time_s / fused.iteration_time_s < 1.3
    assert fused.hfu > fused.mfu * 1.1  # wk, wo, w3 recomputed: +37 % of the linear FLOPs' forward third
    assert eager.hfu == pytest.approx(fused.hfu * fused.iteration_time_s / eager.iteration_time_s, rel=1e-9)


def test_eager_is_refused_outside_fsdp():
    with pytest.raises(ValueError, match="torch_compile = false applies to framework 'fsdp'"):
        Job(model="llama3-8b", seq_len=8192, global_batch=16, torch_compile=False)
    assert np.isfinite(estimate(_plan(torch_compile=False)).mfu)


def test_dtensor_sequence_dim_copies():
    """DTensor's Shard(1) collectives copy the whole b·s·h activation once each (chunk + cat): 4 collectives of
    4 B per element per pass; per-op SAC adds its two recomputed all-gathers' copies; none with tp_comm_overlap
    or without TP."""
    link = Link(8, 450e9, 450e9)  # one node of 8 GPUs
    b, s, t = 12, 8192, 8

    def layer(dtype, t, rc, **terms):
        return compute.layer_time_s(M, GPU, dtype, b, s, t, rc,
                                    LayerTerms(link, sequence_parallel=True, attention="flash", **terms))

    full = b * s * H / GPU.hbm_bandwidth_bytes_per_s
    for rc, bwd_copies in ((0, 4 * 4), (1, 4 * 4 + 2 * 4), (2, 2 * 4 * 4)):
        off = layer("bf16", t, rc, op_sac=True)
        on = layer("bf16", t, rc, op_sac=True, sequence_dim_copies=True)
        assert float(on[0] - off[0]) == pytest.approx(4 * 4 * full, rel=1e-9)
        assert float(on[1] - off[1]) == pytest.approx(bwd_copies * full, rel=1e-9)
        assert float(on[2]) == float(off[2])  # memory traffic, not communication
    fp8 = [layer("fp8", t, 0, sequence_dim_copies=x)[0] for x in (0, 1)]
    assert float(fp8[1] - fp8[0]) == pytest.approx((2 * 2 + 2 * 4) * full, rel=1e-9)  # FP8 all-gathers: 1 + 1 B
    fused = [layer("bf16", t, 0, tp_comm_overlap=True, sequence_dim_copies=x)[0] for x in (0, 1)]
    assert float(fused[1]) == float(fused[0])
    tp1 = [layer("bf16", 1, 0, sequence_dim_copies=x)[0] for x in (0, 1)]
    assert float(tp1[1]) == float(tp1[0])
