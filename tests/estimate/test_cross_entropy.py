"""The cross-entropy loss on the last stage (hetplan.estimate.compute.head_time_s, CROSS_ENTROPY): worked cases of
the bytes each loss moves over the logits, and Plan.cross_entropy = "fp32" (Megatron's unfused loss) reaching the
estimate and the Megatron-LM export."""

import pytest

from hetplan.calibration import modern
from hetplan.estimate import compute
from hetplan.estimate.estimator import estimate
from hetplan.estimate.variability import slowest_gpu_factor
from hetplan.hardware.catalog import load_catalog
from hetplan.runtime.exporters import export_megatron

GPU = load_catalog().get("H100-SXM")


def _row(params_b: str) -> dict:
    return next(r for r in modern.read_rows(modern.FILES["megatron_lm_h100"]) if r["params_b"] == params_b)


def test_unfused_megatron_loss_moves_38_and_14_bytes_per_logit():
    """GPT 1.7B of the Megatron-LM README (V 131,072, TP 1), 4 sequences of 4,096: 2.15e9 logits. Unfused:
    38 B forward, 14 B backward per logit over HBM, plus the kernels that sweep them; fused: 8 + 8."""
    m = modern.megatron_lm_model(_row("1.7"))
    b, s, t = 4, 4096, 1
    X = b * s * m.padded_vocab_size() / t
    gemm = compute.gemm_time_s(GPU, "bf16", b * s, m.padded_vocab_size() / t, m.hidden_size)
    bw, k = GPU.hbm_bandwidth_bytes_per_s, GPU.kernel_overhead_s
    f, bk = compute.head_time_s(m, GPU, "bf16", b, s, t, "megatron", "fp32")
    assert f == pytest.approx(gemm + 38 * X / bw + 6 * k, rel=1e-12)
    assert bk == pytest.approx(2 * gemm + 14 * X / bw + 3 * k, rel=1e-12)
    ff, fb = compute.head_time_s(m, GPU, "bf16", b, s, t, "megatron", None)
    assert ff == pytest.approx(gemm + 8 * X / bw + 4 * k, rel=1e-12)
    assert f - ff == pytest.approx(30 * X / bw + 2 * k, rel=1e-9)  # ~19 ms more per micro-batch on H100
    assert 0.015 < f - ff < 0.025


@pytest.mark.parametrize("framework,kind,fp32", [("fsdp", "fused", "eager_fp32"), ("deepspeed", "deepspeed", "deepspeed"),
                                                  ("megatron", "fused", "unfused")])
def test_only_megatron_runs_the_unfused_loss(framework, kind, fp32):
    """``cross_entropy = "fp32"`` is Megatron's unfused loss and FSDP's eager fp32 loss (its passes counted in
    hetplan.estimate.elementwise); DeepSpeed keeps its own, whatever the field says."""
    assert compute.cross_entropy_kind(framework, None) == kind
    assert compute.cross_entropy_kind(framework, "fp32") == fp32
    m = modern.megatron_lm_model(_row("7.1"))
    X = 2 * 2048 * m.padded_vocab_size() / 2
    gemm = compute.gemm_time_s(GPU, "bf16", 2 * 2048, m.padded_vocab_size() / 2, m.hidden_size)
    (fwd, bwd), (kf, kb) = compute.CROSS_ENTROPY[kind]
    f, b = compute.head_time_s(m, GPU, "bf16", 2, 2048, 2, framework, None)
    assert f - gemm == pytest.approx(fwd * X / GPU.hbm_bandwidth_bytes_per_s + kf * GPU.kernel_overhead_s)
    assert b - 2 * gemm == pytest.approx(bwd * X / GPU.hbm_bandwidth_bytes_per_s + kb * GPU.kernel_overhead_s)


def test_plan_flag_reaches_the_estimate_and_the_megatron_export():
    """The Megatron-LM README rows run the unfused loss (r0.8.0's default): the same plan with the fused loss is
    faster by the loss's extra passes on the last stage, and only the fused plan exports
    --cross-entropy-loss-fusion."""
    cases, _ = modern.megatron_lm_cases()
    c = next(x for x in cases if x.info["n"] == 48)
    assert c.plan.cross_entropy == "fp32"
    fused = c.plan.model_copy(update={"cross_entropy": None})
    slow, fast = estimate(c.plan, model=c.model), estimate(fused, model=c.model)
    m = c.model
    X = c.plan.mbs * c.plan.job.seq_len * m.padded_vocab_size()
    last = slow.stages[-1]  # its tp·dp GPUs compute at the pace of the slowest (hetplan.estimate.variability)
    extra = ((30 + 6) * X / GPU.hbm_bandwidth_bytes_per_s + GPU.kernel_overhead_s) * float(
        slowest_gpu_factor(last.tp * last.dp, GPU.speed_variability))
    assert slow.stages[-1].forward_s + slow.stages[-1].backward_s - fast.stages[-1].forward_s \
        - fast.stages[-1].backward_s == pytest.approx(extra, rel=1e-6)
    assert slow.iteration_time_s > fast.iteration_time_s
    assert "--cross-entropy-loss-fusion" not in export_megatron(c.plan, m).files["megatron_launch.sh"]
    assert "--cross-entropy-loss-fusion" in export_megatron(fused, m).files["megatron_launch.sh"]
