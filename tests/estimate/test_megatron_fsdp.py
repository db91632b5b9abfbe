"""Megatron-FSDP (Megatron-Core at ZeRO-3, ``--use-custom-fsdp`` / ``--use-megatron-fsdp``): its gradient copy,
no copy around its collectives, the stack releases that have it, and the ModelZoo row it prices."""

from types import SimpleNamespace

import pytest

from hetplan.estimate.estimator import estimate
from hetplan.estimate.stage import fsdp2_copy_s, megatron_fsdp_grad_copy_s
from hetplan.plan import GPUPool, Job, Plan, Stage
from hetplan.plan_rules import violations


def test_megatron_fsdp_grad_copy_worked_example():
    """``main_grad.copy_(param.grad)``: the 2-byte gradient read and the fp32 main_grad written (6 B per parameter);
    bf16 main grads (``--grad-reduce-in-bf16``) 4 B."""
    gpu = SimpleNamespace(hbm_bandwidth_bytes_per_s=2e12)
    assert float(megatron_fsdp_grad_copy_s(1e9, gpu, 4)) == pytest.approx(6e9 / 2e12)  # 3 ms
    assert float(megatron_fsdp_grad_copy_s(1e9, gpu, 2)) == pytest.approx(4e9 / 2e12)  # 2 ms
    # FSDP2 moves that much in its copy-in alone, plus a read and write of every gathered element in each pass
    f2, b2 = fsdp2_copy_s(1e9, gpu, 2, 4)
    assert float(f2) == pytest.approx(2e-3) and float(b2) - float(megatron_fsdp_grad_copy_s(1e9, gpu, 4)) == \
        pytest.approx(2e-3)


def _plan(zero: int, stack: str | None = None, gbs: int = 64) -> Plan:
    return Plan(job=Job(model="llama2-7b", seq_len=4096, global_batch=gbs, framework="megatron", stack=stack),
                pools=[GPUPool(gpu="H100-SXM", count=32)],
                stages=[Stage(num_layers=32, tp=1, dp=32, recompute="full")], mbs=1, zero=zero)


def test_megatron_zero3_pays_the_grad_copy_and_no_copy_out():
    """The same Megatron-Core plan at ZeRO-1 and at ZeRO-2 / 3 (Megatron-FSDP): the forward is the same (the
    all-gather writes into the bucket the parameters view), the backward differs by the gradient copy of the
    stage's parameters exactly."""
    from hetplan.estimate import memory
    from hetplan.estimate.variability import slowest_gpu_factor
    from hetplan.hardware.catalog import load_catalog
    from hetplan.model.spec import load_model

    z1 = estimate(_plan(1)).stages[0]
    params = memory.stage_parameters(load_model("llama2-7b"), 32, True, True, True)
    h100 = load_catalog().get("H100-SXM")
    copy = float(megatron_fsdp_grad_copy_s(params, h100, 4))  # bf16: fp32 main grads
    slowest = float(slowest_gpu_factor(32, h100.speed_variability))  # the stage's 32 GPUs (estimate.variability)
    for zero in (2, 3):  # optim_grads and optim_grads_params both copy every micro-batch's gradient
        z = estimate(_plan(zero)).stages[0]
        assert z.forward_s == pytest.approx(z1.forward_s, rel=1e-12)
        assert z.backward_s - z1.backward_s == pytest.approx(copy * slowest, rel=1e-9)
    assert copy == pytest.approx(params * 6 / 3.35e12, rel=1e-6)  # 6.7 B parameters x 6 B at 3.35 TB/s: 12 ms


def test_megatron_fsdp_arrives_with_megatron_core_0_12():
    """ZeRO-3 under framework megatron is refused by a Megatron-LM release before custom FSDP (core_r0.9, in force
    2024-10 .. 2025-04) and accepted from core_r0.12 (2025-05) on."""
    from hetplan.model.spec import load_model

    spec = load_model("llama2-7b")
    old = [v for v in violations(_plan(3, stack="megatron-lm@2025-04"), spec) if v.field == "plan.zero"]
    assert old and "ZeRO-3" in str(old[0])
    assert not [v for v in violations(_plan(3, stack="megatron-lm@2025-05"), spec) if v.field == "plan.zero"]
    assert not [v for v in violations(_plan(1, stack="megatron-lm@2025-04"), spec) if v.field == "plan.zero"]


def test_modelzoo_megatron_fsdp_row_as_launched():
    """The Megatron MoE ModelZoo's Megatron-FSDP row (Qwen3-235B-A22B, 256 H100, 17.6 s per step): Megatron-Core at
    ZeRO-3 with its launch command's TP 1 (DP 256, two micro-batches of 4) and forced balance; predicted within
    10 % of the measured step (before: priced as FSDP2 at the table's TP 2, +31 %)."""
    from hetplan.calibration.modern.moe import moe_cases

    cases, _ = moe_cases()
    (row,) = [c for c in cases if c.key.startswith("moe_h100:modelzoo:2:")]
    job = row.plan.job
    assert (job.framework, row.plan.zero, job.moe_load_imbalance) == ("megatron", 3, 1.0)
    assert (row.info["tp"], row.info["dp"], row.plan.num_microbatches(0)) == (1, 256, 2)
    assert row.evaluate() == pytest.approx(row.measured, rel=0.10)


def test_megatron_fsdp_memory_holds_unsharded_gradient_buckets():
    """ZeRO-2/3 under Megatron-Core (Megatron-FSDP) hold, beyond their sharded fp32 gradients (4 B per parameter
    over DP 32), one layer's 16-bit gradient and two layers' fp32 main-gradient buckets (10 B per parameter of a
    layer): 2.0 GB for Llama 2 7B's 202 M-parameter layer."""
    from hetplan.estimate import memory
    from hetplan.model.spec import load_model

    spec = load_model("llama2-7b")
    params = memory.stage_parameters(spec, 32, True, True, True)
    layer = memory.layer_parameters_per_gpu(spec, 1, 1, 1)
    for zero in (2, 3):
        grads = estimate(_plan(zero)).stages[0].memory.gradients
        assert grads - 4 * params / 32 == pytest.approx(layer * (2 + 2 * 4), rel=1e-9)
    assert 1.9e9 < layer * 10 < 2.1e9
    assert estimate(_plan(1)).stages[0].memory.gradients == pytest.approx(4 * params, rel=1e-9)  # no buckets


def test_modelzoo_megatron_fsdp_row_exports_as_megatron_fsdp():
    """The row's plan exports to Megatron-LM with the flags of its launch command."""
    from hetplan.calibration.modern.moe import moe_cases
    from hetplan.runtime.exporters.megatron import export_megatron

    cases, _ = moe_cases()
    (row,) = [c for c in cases if c.key.startswith("moe_h100:modelzoo:2:")]
    text = " ".join(str(x) for x in vars(export_megatron(row.plan, row.model)).values())
    for flag in ("--use-megatron-fsdp", "--data-parallel-sharding-strategy optim_grads_params",
                 "--no-gradient-accumulation-fusion", "--expert-model-parallel-size 8",
                 "--tensor-model-parallel-size 1"):
        assert flag in text
