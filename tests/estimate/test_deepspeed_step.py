"""DeepSpeed ZeRO-0 with fp16: the boundary reduction's bucket copies and FP16_Optimizer's passes
(:data:`hetplan.estimate.compute.DEEPSPEED_FP16_STEP_BYTES_PER_PARAMETER`, ``DEEPSPEED_GRAD_BUCKET_BYTES_PER_PARAMETER``)
against Megatron's fused Adam step, and the stacks and settings that do not run them."""

import numpy as np
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
    owned = params / 2  # ZeRO-1 steps the owned half; so does BF16_Optimizer (the default stack's bf16 at ZeRO-0)
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


def _zero1(stack, dtype="fp16", zero=1, dp=8):
    m, gpu = load_model("llama2-7b"), load_catalog().get("A100-SXM-80GB")
    return costs_of(m, gpu, LINK, s=4096, b=1, t=1, dp=dp, num_layers=8, has_embedding=False, has_head=False,
                    single_stage=False, in_flight=4, num_microbatches=8, zero=zero, recompute_code=0,
                    framework="deepspeed", dtype=dtype, attention="flash", stack=stack), gpu


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_deepspeed_zero1_of_2021_all_reduces_every_gradient(dtype):
    """Worked example, 8 Llama 2 7B layers (1.62 B parameters) on 8 A100 of one node: DeepSpeed 0.5-0.12's
    ZeRO-1 all-reduces the 16-bit gradients (stage 1 forces contiguous_gradients off: allreduce_bucket) and
    all-gathers the updated 16-bit weights, 3 x 7/8 x 3.2 GB through each GPU's link, where the release of 2024
    (contiguous gradients) reduce-scatters: 2 x 7/8 x 3.2 GB. Every parameter of the stage, owned or not, also
    pays the bucket copies and the overflow check, 22 B, at the HBM bandwidth (4.2 ms per 1 B/param here: 18 ms).
    bf16 under the 2021 release goes the same way (BF16_Optimizer arrived in 2022), reduced in bf16."""
    from hetplan.estimate.comm import dp_collective_time_s
    from hetplan.estimate.stage import DEEPSPEED_ZERO1_PASS_BYTES_PER_PARAMETER

    old, gpu = _zero1("megatron-deepspeed@2021", dtype)
    new, _ = _zero1("deepspeed@0.16", dtype)
    params = float(old.params_per_gpu)
    grad = 2 if dtype == "fp16" else 4  # the reduce-scatter path reduces bf16 in fp32 (grad_comm_bytes_per_parameter)
    allreduce = dp_collective_time_s(params * 2, "allreduce", 8, 1, LINK)
    gather = dp_collective_time_s(params * 2, "allgather", 8, 1, LINK)
    scatter = dp_collective_time_s(params * grad, "allgather", 8, 1, LINK)
    assert float(old.dp_exposed_s) == pytest.approx(allreduce + gather, rel=1e-9)
    assert float(new.dp_exposed_s) == pytest.approx(scatter + gather, rel=1e-9)
    if dtype == "fp16":
        assert float(old.dp_exposed_s) / float(new.dp_exposed_s) == pytest.approx(1.5, rel=0.05)
    assert DEEPSPEED_ZERO1_PASS_BYTES_PER_PARAMETER == 12 + 10
    extra = float(old.optimizer_s) - float(new.optimizer_s)
    assert extra == pytest.approx(params * 22 / gpu.hbm_bandwidth_bytes_per_s, rel=1e-9)
    assert extra * 1e3 == pytest.approx(17.5, abs=0.2)


@pytest.mark.parametrize("stack, zero", [("megatron-deepspeed@2022", 1), ("megatron-deepspeed@2021", 0),
                                         ("megatron-deepspeed@2021", 2)])
def test_zero1_allreduce_path_only_at_zero1_without_bf16_optimizer(stack, zero):
    """BF16_Optimizer (bf16 under the 2022 release) has its own fp32 all-reduce; ZeRO-0 all-reduces without the
    all-gather; ZeRO-2 partitions the gradients: none of them takes ZeRO-1's all-reduce path or its passes."""
    from hetplan.estimate.stage import deepspeed_zero1_allreduce
    from hetplan.hardware.stacks import resolve_stack

    dtype = "bf16" if stack.endswith("2022") else "fp16"
    c, _ = _zero1(stack, dtype, zero)
    spec = resolve_stack(stack)
    bf16_opt = dtype == "bf16" and spec.bf16_optimizer and zero <= 1
    assert not deepspeed_zero1_allreduce(spec, "deepspeed", zero, bf16_opt)
    assert deepspeed_zero1_allreduce(spec, "deepspeed", 1, False)  # the same release at ZeRO-1 with fp16
    assert not deepspeed_zero1_allreduce(spec, "megatron", 1, False)


def test_deepspeed_zero1_overlap_by_release():
    """Without a pipeline DeepSpeed overlaps its gradient buckets with the backward (overlap_comm) at ZeRO-2, and
    at ZeRO-1 only from v0.13.0 (#4887); the releases before force it off at stage 1."""
    from hetplan.hardware.stacks import resolve_stack

    old, new = resolve_stack("deepspeed@0.5"), resolve_stack("deepspeed@0.16")
    assert (old.zero1_grad_reduce, new.zero1_grad_reduce) == ("allreduce", "reduce-scatter")
    # the change is v0.13.0's: its releases and months resolve to the 0.13 entry, the ones before to 0.5
    assert [resolve_stack(f"deepspeed@{v}").zero1_grad_reduce for v in ("0.12", "2023-12", "0.13", "0.14.4",
                                                                         "2024-06")] == [
        "allreduce", "allreduce", "reduce-scatter", "reduce-scatter", "reduce-scatter"]
    # BF16_Optimizer arrives in v0.6.2 (#1801), without ZeRO only; v0.5-v0.6.1 price bf16 without it
    assert [(resolve_stack(f"deepspeed@{v}").bf16_optimizer, resolve_stack(f"deepspeed@{v}").bf16_optimizer_zero)
            for v in ("0.6.1", "0.6.2", "2023-06", "0.16")] == [(False, (0, 1)), (True, (0,)), (True, (0,)),
                                                                 (True, (0,))]
    assert resolve_stack("megatron-deepspeed@2022").zero1_grad_reduce == "allreduce"  # carried over from 2021
    assert [old.overlaps_grad_reduce(1, z) for z in (0, 1, 2)] == [False, False, True]
    assert [new.overlaps_grad_reduce(1, z) for z in (0, 1, 2)] == [False, True, True]
    assert not any(s.overlaps_grad_reduce(2, 1) for s in (old, new))  # the pipeline engine reduces after the schedule


def test_deepspeed_016_sends_bf16_to_bf16_optimizer_at_zero0_only():
    """DeepSpeed v0.16's engine wraps a bf16 optimizer in BF16_Optimizer without ZeRO (fp32 gradient
    accumulation by default) and leaves bf16 ZeRO-1 to its ZeRO optimizer (bf16 accumulation): at ZeRO-0 the
    backward carries BF16_Optimizer's 18 B per parameter and the micro-batch count does not move it; at ZeRO-1
    autograd accumulates in bf16 (6 B per parameter after the first micro-batch). The 2022 branch keeps both
    stages on BF16_Optimizer."""
    from hetplan.estimate import memory
    from hetplan.estimate.options import TrainingOptions
    from hetplan.estimate.stage import AUTOGRAD_ACCUMULATE_PASSES, BF16_ACCUMULATE_BYTES_PER_PARAMETER

    new = TrainingOptions(framework="deepspeed", dtype="bf16", stack="deepspeed@0.16")
    old = TrainingOptions(framework="deepspeed", dtype="bf16", stack="megatron-deepspeed@2022")
    assert list(memory.bf16_optimizer_runs(new, np.array([0, 1, 2]))) == [True, False, False]
    assert list(memory.bf16_optimizer_runs(old, np.array([0, 1, 2]))) == [True, True, False]
    z0_one, params, bw = _backward("deepspeed", "bf16", 0, 1, stack="deepspeed@0.16")
    z0_eight, _, _ = _backward("deepspeed", "bf16", 0, 8, stack="deepspeed@0.16")
    z1_one, _, _ = _backward("deepspeed", "bf16", 1, 1, stack="deepspeed@0.16")
    z1_eight, _, _ = _backward("deepspeed", "bf16", 1, 8, stack="deepspeed@0.16")
    assert z0_eight == pytest.approx(z0_one, rel=1e-12)
    assert z0_one - z1_one == pytest.approx(params * BF16_ACCUMULATE_BYTES_PER_PARAMETER / bw, rel=1e-9)
    assert z1_eight - z1_one == pytest.approx(params * AUTOGRAD_ACCUMULATE_PASSES * 2 * 7 / 8 / bw, rel=1e-9)
