"""estimate(): event simulation vs closed form, interleaving, timeline."""

import pytest

from hetplan.estimate.estimator import estimate, estimate_detailed
from hetplan.estimate.timeline import draw_timeline, timeline_data
from hetplan.estimate.validation import gpt_model, megatron_plan


def _plan(pp=4, gbs=32, mbs=1, tp=2, dp=1):
    m = gpt_model(24, 2048, 16, 1024)
    return m, megatron_plan(m, gpu="A100-SXM-80GB", tp=tp, pp=pp, dp=dp, mbs=mbs, gbs=gbs, recompute="full",
                            seq=1024, inter_node_bandwidth_bytes_per_s=100e9)


def test_closed_form_and_simulation_agree_closely_for_balanced_plans():
    m, plan = _plan()
    sim = estimate(plan, model=m)
    closed = estimate(plan, model=m, pipeline_model="closed_form")
    assert sim.pipeline_model == "simulate" and closed.pipeline_model == "closed_form"
    assert sim.iteration_time_s == pytest.approx(closed.iteration_time_s, rel=0.03)


def test_single_stage_is_exactly_the_closed_form():
    m, plan = _plan(pp=1, tp=8)
    sim = estimate(plan, model=m)
    closed = estimate(plan, model=m, pipeline_model="closed_form")
    assert sim.iteration_time_s == pytest.approx(closed.iteration_time_s, rel=1e-12)


def test_interleaving_is_faster_and_falls_back_when_not_divisible():
    m, plan = _plan(pp=4, gbs=16)
    plain = estimate(plan, model=m)
    inter = estimate(plan, model=m, virtual_stages=2)
    assert inter.virtual_stages == 2 and inter.iteration_time_s < plain.iteration_time_s
    assert inter.memory_bytes_per_gpu.activations > plain.memory_bytes_per_gpu.activations
    m, odd = _plan(pp=4, gbs=6)
    assert estimate(odd, model=m, virtual_stages=2).virtual_stages == 1


def test_unknown_pipeline_model_is_an_error():
    from hetplan.errors import HetplanError

    m, plan = _plan()
    with pytest.raises(HetplanError):
        estimate(plan, model=m, pipeline_model="magic")


def test_timeline(tmp_path):
    m, plan = _plan(pp=4, gbs=8)
    est, bars = timeline_data(plan, model=m, virtual_stages=2)
    kinds = {b[1] for b in bars}
    assert {"F", "B", "OPT"} <= kinds
    assert sum(1 for b in bars if b[1] == "F") == 4 * 8 * 2
    assert max(b[5] for b in bars) == pytest.approx(est.iteration_time_s)
    out = draw_timeline(plan, tmp_path / "t.png", model=m)
    assert out.stat().st_size > 1000
    _, sim, _, _ = estimate_detailed(plan, model=m, record=True)
    assert len(sim.ops) == 2 * 4 * 8
