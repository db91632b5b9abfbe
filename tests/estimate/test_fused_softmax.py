"""When Megatron's fused scale-mask-softmax kernel takes the scores (``StackSpec.fused_softmax``,
:func:`hetplan.estimate.compute.fused_softmax_runs`) and what its PyTorch fallback costs: worked cases from the
code paths, the layouts of BLOOM's search whose speeds the bigscience fork's argument-order bug explains, and
vTrain's rows that the fallback moved."""

import statistics

import numpy as np
import pytest

from hetplan.calibration.modern.bigscience import bigscience_cases
from hetplan.calibration.validation import DEFAULT, gpt_model, vtrain_cases
from hetplan.estimate import compute
from hetplan.estimate.estimator import estimate
from hetplan.estimate.stagework import LayerTerms, Link
from hetplan.hardware.catalog import load_catalog
from hetplan.hardware.stacks import resolve_stack

A100 = load_catalog().get("A100-SXM-80GB")


def _runs(rule, heads, b, s, t, dtype="fp16"):
    m = gpt_model(2, heads * 64, heads, s)
    return bool(compute.fused_softmax_runs(rule, m, dtype, b, s, t))


def test_batch_per_block_of_the_cuda_kernel():
    """``get_batch_per_block`` for key lengths 16 ... 4096: warps of min(2^k, 32) threads, two rows per warp up
    to 128 elements, 128 threads per block."""
    keys = [16, 32, 64, 128, 256, 1024, 2048, 4096]
    assert list(compute.softmax_batch_per_block(keys)) == [16, 8, 8, 8, 4, 4, 4, 4]
    assert list(compute.softmax_batch_per_block([2, 8, 12, 14, 28])) == [128, 32, 16, 16, 8]


@pytest.mark.parametrize("heads,b,fused_bug", [
    (64, 4, True), (64, 2, False), (64, 6, False), (64, 8, True),  # 8 heads per rank: b % 4
    (112, 4, False), (112, 8, True),  # 14 per rank: b % 8
    (96, 4, True), (128, 4, True), (256, 4, True),  # 12, 16, 32 per rank
])
def test_bigscience_argument_order_bug_at_tp8(heads, b, fused_bug):
    """BLOOM's layout search (bigscience fork between #151 and #260, TP 8, s 2048): with the heads per rank handed
    to the kernel as the key length, 8 heads per rank need micro-batches of 4 (32-row blocks), 14 need 8; every
    one of these is fused under Megatron-LM's own check (b·a/t % 4 == 0)."""
    assert _runs("megatron-2048-heads", heads, b, 2048, 8) is fused_bug
    assert _runs("megatron-4096", heads, b, 2048, 8) is ((b * heads // 8) % 4 == 0)


def test_rules_limits():
    """Key-length limits and dtypes: Megatron-LM 2021 up to 2,048 keys, 2022 on up to 4,096, Transformer Engine
    below 16,384 and keys a multiple of 8; v2.0 only in fp16; no fused kernel for fp32 scores; ``any`` always."""
    assert _runs("megatron-2048", 16, 1, 2048, 1) and not _runs("megatron-2048", 16, 1, 4096, 1)
    assert _runs("megatron-4096", 16, 1, 4096, 1) and not _runs("megatron-4096", 16, 1, 8192, 1)
    assert _runs("te-16384", 16, 1, 8192, 1) and not _runs("te-16384", 16, 1, 16384, 1)
    assert not _runs("te-16384", 16, 1, 2044, 1)  # 2044 % 8 != 0
    assert not _runs("megatron-2048", 16, 1, 2048, 8)  # 2 heads per rank, b 1: 2 % 4
    assert _runs("fp16-2048", 16, 1, 2048, 8) and not _runs("fp16-2048", 16, 1, 2048, 8, dtype="bf16")
    assert not _runs("megatron-4096", 16, 4, 2048, 1, dtype="fp32")
    assert _runs("any", 3, 1, 100_000, 3, dtype="fp32")
    with pytest.raises(ValueError):
        _runs("megatron-9999", 16, 1, 2048, 1)


def test_rules_broadcast_over_search_arrays():
    m = gpt_model(2, 4096, 64, 2048)
    b, t = np.array([1, 2, 4, 8]), np.array([8, 8, 8, 8])
    assert list(compute.fused_softmax_runs("megatron-2048-heads", m, "fp16", b, 2048, t)) == [False, False, True, True]


def test_fallback_work_by_hand():
    """The fallback's extra bytes per score (36 − 4 forward, 40 − 6 backward with the query-key scale; 8 fewer
    each under Transformer Engine) times ``b·(a/t)·s²`` scores, and 4 (3) more kernels; nothing where fused."""
    m = gpt_model(2, 1024, 16, 1024)
    f, b_, k = compute.softmax_fallback_work("megatron-4096", m, "fp16", 1, 1024, 8)
    scores = 1 * 16 / 8 * 1024**2
    assert (float(f), float(b_), float(k)) == (32 * scores, 34 * scores, 4.0)
    f, b_, k = compute.softmax_fallback_work("te-16384", m, "fp16", 1, 1024, 8)
    assert (float(f), float(b_), float(k)) == (24 * scores, 26 * scores, 3.0)
    assert [float(x) for x in compute.softmax_fallback_work("megatron-4096", m, "fp16", 2, 1024, 8)] == [0, 0, 0]


def test_layer_pays_the_fallback_only_where_the_kernel_refuses():
    """A standard-attention layer is slower under a rule that refuses its shape by exactly the fallback's bytes at
    the HBM bandwidth and its kernels at the host floor (forward), and unchanged where the kernel runs; flash
    attention never pays it."""
    m = gpt_model(2, 14336, 112, 2048)
    link = Link.one_node(A100.gpu_link_bandwidth_bytes_per_s)

    def fwd(rule, b, attention="standard"):
        return float(compute.layer_time_s(m, A100, "fp16", b, 2048, 8, 0,
                                          LayerTerms(link, attention=attention, fused_softmax=rule))[0])

    assert fwd("megatron-2048-heads", 8) == fwd("any", 8)
    slower = fwd("megatron-2048-heads", 4) - fwd("any", 4)
    extra = 32 * 4 * 14 * 2048**2 / A100.hbm_bandwidth_bytes_per_s
    assert extra * 0.8 < slower < extra * 1.2  # the smooth host floor bends the sum a little
    assert fwd("megatron-2048-heads", 4, "flash") == fwd("any", 4, "flash")


def test_stack_releases_carry_their_rule():
    """The bigscience fork's bug lasts from its 2022 release to the sync of 2022-03-06; ``@2022-03`` resolves to
    the fixed release; flash stacks keep ``any``."""
    assert resolve_stack("megatron-deepspeed@2022-02").fused_softmax == "megatron-2048-heads"
    assert resolve_stack("megatron-deepspeed@2022-03").fused_softmax == "megatron-4096"
    assert resolve_stack("megatron-lm@2.5").fused_softmax == "megatron-2048"
    assert resolve_stack("torchtitan").fused_softmax == "any"


def test_bloom_micro_batch_6_slower_than_4():
    """BLOOM's "GBS Variations" (48 nodes, TP 8 x PP 6 x DP 8, 64 heads, h 14,336): micro-batch 6 (fallback under
    the fork's rule) measured 123.57 s for GBS 2,016 against 114.11 s at micro-batch 4 for GBS 2,048, per sample
    +10 %. The estimate under the release that ran orders them the same way (per sample, +7 % or more), 4-5 points
    of it the fallback: under the fixed release (both fused) only the bubble of fewer micro-batches remains."""
    cases = {c.key.split(":", 2)[2]: c for c in bigscience_cases()[0] if c.key.split(":")[2] == "gbs-variations"}
    mb4, mb6 = cases["gbs-variations:L72h14336a64:tp8pp6dp8mb4g2048:fp16"], cases[
        "gbs-variations:L72h14336a64:tp8pp6dp8mb6g2016:fp16"]
    assert mb6.measured / 2016 > 1.08 * mb4.measured / 2048

    def per_sample(case, stack):
        plan = case.plan.model_copy(update={"job": case.plan.job.model_copy(update={"stack": stack})})
        return estimate(plan, model=case.model).iteration_time_s / plan.job.global_batch

    bug, fixed = "megatron-deepspeed@2022-02", "megatron-deepspeed@2022-03"
    ratio_bug, ratio_fixed = (per_sample(mb6, x) / per_sample(mb4, x) for x in (bug, fixed))
    assert ratio_bug > 1.07
    assert ratio_bug - ratio_fixed > 0.04  # the rest: micro-batch 6's longer pipeline bubble (42 vs 64 per pipe)


def test_vtrain_rows_the_fallback_explains():
    """vTrain's single-node rows whose ``b·a/t`` is not a multiple of 4 (TP 8, 16 heads, micro-batch 1; 32 rows)
    were predicted 17-26 % fast (median +21.8 %) when every shape was taken as fused; with the fallback their
    signed median is within 10 %, and the other rows do not move (median within ±1 %)."""
    fallback, fused = [], []
    for c in vtrain_cases("single"):
        np_ = c.model.num_attention_heads // c.plan.stages[0].tp
        error = c.measured / c.predict(DEFAULT) - 1
        (fallback if (c.plan.mbs * np_) % 4 else fused).append(error)
    assert len(fallback) == 32
    assert 0.0 < statistics.median(fallback) < 0.10
    assert abs(statistics.median(fused)) < 0.01
