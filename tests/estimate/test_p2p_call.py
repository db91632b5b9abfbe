"""The per-call cost of an interleaved pipeline's extra model chunks (hetplan.estimate.comm.P2P_CALL_S): a worked
case on the stage times, the VP ordering it restores, and its fit (held-out contrast jobs)."""

import pytest

from hetplan.calibration import modern_fit
from hetplan.calibration.validation import gpt_model, megatron_plan
from hetplan.estimate.comm import P2P_CALL_S, CommConstants
from hetplan.estimate.estimator import estimate, estimate_detailed


def _plan(pp, gbs=64, v=1):
    m = gpt_model(24, 2048, 16, 1024)
    plan = megatron_plan(m, gpu="A100-SXM-80GB", tp=2, pp=pp, dp=1, mbs=1, gbs=gbs, recompute="none", seq=1024,
                         inter_node_bandwidth_bytes_per_s=100e9)
    return m, plan.model_copy(update={"virtual_stages": v})


def test_each_extra_chunk_adds_one_call_per_direction_and_micro_batch():
    m, plan = _plan(pp=4, v=3)
    off = CommConstants(p2p_call_s=0.0)
    _, _, with_calls, _ = estimate_detailed(plan, model=m)
    _, _, without, _ = estimate_detailed(plan, model=m, comm_constants=off)
    for a, b in zip(with_calls, without):
        assert a.forward_s - b.forward_s == pytest.approx(2 * P2P_CALL_S, rel=1e-9)  # (v - 1) calls
        assert a.backward_s - b.backward_s == pytest.approx(2 * P2P_CALL_S, rel=1e-9)
    # plain 1F1B and a single stage: no extra chunk, nothing added
    for pp, v in ((4, 1), (1, 1)):
        m, p = _plan(pp=pp, v=v)
        assert estimate(p, model=m).iteration_time_s == estimate(p, model=m, comm_constants=off).iteration_time_s


def test_more_virtual_stages_can_be_slower_once_calls_cost():
    """Twice the chunks halve the bubble but double the calls: with short chunks and many micro-batches the calls
    win (GPT-3 175B at VP 12 was measured 7 % slower than at VP 6)."""
    m, p6 = _plan(pp=4, gbs=256, v=3)
    _, p12 = _plan(pp=4, gbs=256, v=6)
    off = CommConstants(p2p_call_s=0.0)
    assert estimate(p12, model=m, comm_constants=off).iteration_time_s < estimate(p6, model=m,
                                                                                 comm_constants=off).iteration_time_s
    slow = CommConstants(p2p_call_s=5e-3)
    assert estimate(p12, model=m, comm_constants=slow).iteration_time_s > estimate(p6, model=m,
                                                                                  comm_constants=slow).iteration_time_s


def test_fit_on_vp_contrast_jobs_predicts_the_held_out_jobs():
    fit = modern_fit.fit_p2p_call(modern_fit.fit_cases(["dgxc_h100"]))
    assert fit is not None and fit.jobs_calibration and fit.jobs_held_out
    assert not set(fit.jobs_calibration) & set(fit.jobs_held_out)
    assert fit.p2p_call_s == pytest.approx(P2P_CALL_S, abs=5e-5)  # the catalog value is this fit
    # held out: three GPT-3 jobs (with torchtitan's 405B 1F1B-vs-interleaved pair when its set is loaded): the
    # ratios no worse with the term, every pair ordered as measured (4.43 -> 4.31 % on the GPT-3 jobs)
    assert fit.held_out_after["ratio_mape"] < fit.held_out_before["ratio_mape"]
    assert fit.held_out_after["ordered"] == 1.0
