"""Megatron-Core's --tp-comm-overlap (hetplan.estimate.compute.tp_overlap_exposed_s): worked cases of the three
overlap kinds, bounds, and the plan flag reaching estimate()."""

import numpy as np
import pytest

from hetplan.calibration.validation import gpt_model, megatron_plan
from hetplan.estimate import compute
from hetplan.estimate.comm import NCCL_CTAS, overlap_contention
from hetplan.estimate.estimator import estimate
from hetplan.hardware.catalog import load_catalog

M = gpt_model(4, 4096, 32, 2048)  # GPT: QKV 3h², proj h², FC1 4h², FC2 4h²


def test_shares_follow_the_weight_shapes():
    assert compute.tp_overlap_shares(M) == pytest.approx((3 / 12, 1 / 12, 4 / 12, 4 / 12))


def test_worked_case():
    """c = 1, linear = 12 (GEMMs 3, 1, 4, 4), t = 4, rho = 0.2, n = 4 splits:
    forward: ring QKV max(0, 1 - 3·3/4) = 0, ring FC1 0, pipelined proj max(0.25 + 0.2, 1 - 0.75) = 0.45,
    pipelined FC2 max(0.45, 1 - 3) = 0.45 -> 0.9; backward: ring proj max(0, 1 - 0.75) = 0.25, ring FC2 0,
    bulk QKV max(1 - 3, 0.2) = 0.2, bulk FC1 0.2 -> 0.65."""
    f, b = compute.tp_overlap_exposed_s(M, 1.0, 12.0, 4, 0.2)
    assert (float(f), float(b)) == pytest.approx((0.9, 0.65))


@pytest.mark.parametrize("c", [1e-4, 1e-3, 1e-2, 1e-1])
def test_overlap_never_costs_more_than_the_exposed_collectives(c):
    for linear in (1e-4, 1e-2, 1.0):
        f, b = compute.tp_overlap_exposed_s(M, c, linear, 8, 0.18)
        assert 0 < f <= 4 * c + 1e-15 and 0 < b <= 4 * c + 1e-15
    # no compute to hide behind: every collective exposed
    f, b = compute.tp_overlap_exposed_s(M, c, 0.0, 8, 0.18)
    assert float(f) == pytest.approx(4 * c) and float(b) == pytest.approx(4 * c)


def test_plan_flag_reaches_the_estimate_and_needs_sequence_parallelism():
    gpu = load_catalog().get("H100-SXM")
    assert 0 < overlap_contention(gpu, NCCL_CTAS) < 0.3
    plan = megatron_plan(M, gpu="H100-SXM", tp=8, pp=1, dp=1, mbs=1, gbs=8, recompute="none", seq=2048,
                         inter_node_bandwidth_bytes_per_s=400e9)
    plan = plan.model_copy(update={"sequence_parallel": True})
    off = estimate(plan, model=M)
    on = estimate(plan.model_copy(update={"tp_comm_overlap": True}), model=M)
    assert on.iteration_time_s < off.iteration_time_s
    assert on.tp_comm_fraction < off.tp_comm_fraction
    no_sp = plan.model_copy(update={"sequence_parallel": False})
    assert estimate(no_sp.model_copy(update={"tp_comm_overlap": True}), model=M).iteration_time_s == \
        estimate(no_sp, model=M).iteration_time_s
    assert np.isfinite(on.mfu)


def test_parameter_gather_hides_behind_the_forward_window():
    """exposed_behind_s worked case: sync 10, window 4, last bucket 0.1, rho 0.2 -> max(6, 1) + 0.2·min(9, 4) = 6.8;
    a window longer than the sync leaves the last bucket plus the contention: 1 + 0.2·9 = 2.8."""
    from hetplan.estimate.stage import exposed_behind_s

    assert float(exposed_behind_s(10.0, 4.0, 0.1, 0.2)) == pytest.approx(6.8)
    assert float(exposed_behind_s(10.0, 40.0, 0.1, 0.2)) == pytest.approx(2.8)
    # Megatron ZeRO-1 with overlap: gradients behind the backward, parameters behind the forward -> less exposed
    # than DeepSpeed's ZeRO-1, whose parameter gather waits with the gradients behind the backward
    plan = megatron_plan(M, gpu="H100-SXM", tp=1, pp=1, dp=64, mbs=1, gbs=64, recompute="none", seq=2048,
                         inter_node_bandwidth_bytes_per_s=100e9).model_copy(update={"zero": 1, "overlap_grad_reduce": True})
    meg = estimate(plan, model=M)
    ds = estimate(plan.model_copy(update={"job": plan.job.model_copy(update={"framework": "deepspeed"})}), model=M)
    assert meg.dp_exposed_time_s < ds.dp_exposed_time_s
