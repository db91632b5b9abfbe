"""DeepSpeed ZeRO-0 with fp16: the boundary reduction's bucket copies and FP16_Optimizer's passes
(:data:`hetplan.estimate.compute.DEEPSPEED_FP16_STEP_BYTES_PER_PARAMETER`, ``DEEPSPEED_GRAD_BUCKET_BYTES_PER_PARAMETER``)
against Megatron's fused Adam step, and the stacks and settings that do not run them."""

import pytest

from hetplan.estimate import compute
from hetplan.estimate.stagework import Link
from hetplan.hardware.catalog import load_catalog
from hetplan.model.spec import load_model
from stage_kwargs import costs_of

LINK = Link(gpus_per_node=8, intra_node_bandwidth_bytes_per_s=600e9, inter_node_bandwidth_bytes_per_s=25e9)


def _step(framework, dtype, zero, dp=1):
    m, gpu = load_model("llama2-7b"), load_catalog().get("A100-SXM-80GB")
    c = costs_of(m, gpu, LINK, s=4096, b=1, t=1, dp=dp, num_layers=8, has_embedding=False, has_head=False,
                 single_stage=False, in_flight=4, num_microbatches=8, zero=zero, recompute_code=0,
                 framework=framework, dtype=dtype, attention="flash")
    return float(c.optimizer_s), float(c.params_per_gpu), gpu.hbm_bandwidth_bytes_per_s


def test_deepspeed_fp16_zero0_step_moves_82_bytes_per_parameter():
    """Worked example: 8 Llama 2 7B layers on an A100, DP 1: DeepSpeed's step is 70 B (FP16_Optimizer: overflow
    check 10, fp32 flat gradient 14, norm 4, unscale 8, fused Adam 28, copy back 6) + 12 B (the gradient bucket's
    flatten, 1/DP scale and copy back, also at DP 1) per parameter at the HBM bandwidth, 82/30 of Megatron's."""
    ds, params, bw = _step("deepspeed", "fp16", 0)
    mg, params_mg, _ = _step("megatron", "fp16", 0)
    assert params == params_mg == pytest.approx(8 * 202.4e6, rel=0.01)
    assert ds == pytest.approx(params * 82 / bw, rel=1e-12)
    assert mg == pytest.approx(params * 30 / bw, rel=1e-12)
    assert compute.DEEPSPEED_FP16_STEP_BYTES_PER_PARAMETER == 10 + 14 + 4 + 8 + 28 + 6


@pytest.mark.parametrize("dtype, zero", [("bf16", 0), ("fp16", 1)])
def test_other_deepspeed_optimizers_keep_the_fused_step(dtype, zero):
    """BF16_Optimizer (bf16) and ZeRO-1/2's partitioned step are other code paths: they keep 30 B per owned
    parameter."""
    t, params, bw = _step("deepspeed", dtype, zero, dp=2)
    owned = params / (2 if zero else 1)  # ZeRO-1 steps the owned half
    assert t == pytest.approx(owned * compute.ADAM_BYTES_PER_PARAMETER / bw, rel=1e-12)


def _backward(framework, dtype, zero, num_microbatches, stack=None):
    m, gpu = load_model("llama2-7b"), load_catalog().get("A100-SXM-80GB")
    kw = {} if stack is None else {"stack": stack}
    c = costs_of(m, gpu, LINK, s=4096, b=1, t=1, dp=2, num_layers=8, has_embedding=False, has_head=False,
                 single_stage=False, in_flight=4, num_microbatches=num_microbatches, zero=zero, recompute_code=0,
                 framework=framework, dtype=dtype, attention="flash", **kw)
    return float(c.backward_s), float(c.params_per_gpu), gpu.hbm_bandwidth_bytes_per_s


@pytest.mark.parametrize("dtype, zero", [("fp16", 0), ("fp16", 1)])
def test_deepspeed_autograd_accumulation_worked_example(dtype, zero):
    """Worked example: 8 Llama 2 7B layers (1.62 B parameters) on an A100 under DeepSpeed's engine without
    BF16_Optimizer: autograd adds each micro-batch's 16-bit gradient into ``.grad`` in place (read both, write
    one: 3 x 2 B) after every backward but the first. At 8 micro-batches a step moves 7 x 6 B = 42 B per
    parameter, charged 42/8 B per micro-batch: 4.2 ms per backward at the A100 80GB's 2.04 TB/s; one
    micro-batch (nothing accumulated) costs nothing."""
    from hetplan.estimate.stage import AUTOGRAD_ACCUMULATE_PASSES

    element = 2
    one, params, bw = _backward("deepspeed", dtype, zero, 1)
    eight, _, _ = _backward("deepspeed", dtype, zero, 8)
    assert params == pytest.approx(8 * 202.4e6, rel=0.01)
    assert AUTOGRAD_ACCUMULATE_PASSES * element * 7 / 8 == 5.25
    assert eight - one == pytest.approx(params * AUTOGRAD_ACCUMULATE_PASSES * element * 7 / 8 / bw, rel=1e-9)
    assert (eight - one) * 1e3 == pytest.approx(4.17, abs=0.01)


@pytest.mark.parametrize("framework, dtype, zero", [("megatron", "fp16", 1), ("deepspeed", "fp16", 2),
                                                    ("deepspeed", "fp16", 3)])
def test_autograd_accumulation_only_under_deepspeeds_zero0_and_1(framework, dtype, zero):
    """Megatron's stacks accumulate by their own term (``wgrad_accumulation``), ZeRO-2 and ZeRO-3 partition the
    gradients after every micro-batch (other code paths): the number of micro-batches does not move their
    backward."""
    one, _, _ = _backward(framework, dtype, zero, 1)
    eight, _, _ = _backward(framework, dtype, zero, 8)
    assert eight == pytest.approx(one, rel=1e-12)


def test_bf16_optimizer_replaces_autograd_accumulation():
    """Under a stack whose bf16 runs go to BF16_Optimizer (``megatron-deepspeed@2022``), bf16 backward carries
    its 18 B per parameter per micro-batch (``update_hp_grads``) and no autograd accumulation: the number of
    micro-batches does not move it; under the 2021 release (ZeRO-1's optimizer) autograd accumulates."""
    from hetplan.estimate.stage import AUTOGRAD_ACCUMULATE_PASSES

    one, params, bw = _backward("deepspeed", "bf16", 1, 1, stack="megatron-deepspeed@2022")
    eight, _, _ = _backward("deepspeed", "bf16", 1, 8, stack="megatron-deepspeed@2022")
    assert eight == pytest.approx(one, rel=1e-12)
    one, _, _ = _backward("deepspeed", "bf16", 1, 1, stack="megatron-deepspeed@2021")
    eight, _, _ = _backward("deepspeed", "bf16", 1, 8, stack="megatron-deepspeed@2021")
    assert eight - one == pytest.approx(params * AUTOGRAD_ACCUMULATE_PASSES * 2 * 7 / 8 / bw, rel=1e-9)
