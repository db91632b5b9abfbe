"""ZeRO-3 / FSDP communication: per-micro-batch gathers and reduce-scatter, overlapped pass by pass."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from hetplan.estimate.estimator import estimate
from hetplan.estimate.stage import zero3_exposed_s
from hetplan.calibration.validation import gpt_model, megatron_plan


def test_zero3_exposed_worked_cases():
    # G = 1, R = 2, F = 2, B = 4, L = 4: both passes hide their collectives; the first layer's gather (0.25) and
    # the last layer's reduce-scatter (0.5) remain, per micro-batch.
    assert zero3_exposed_s(1.0, 2.0, 2.0, 4.0, 4, 2) == 2 * (0.25 + 0.5)
    # B = 2: the backward's 3 of 4 gathers and reduce-scatters (2.25) exceed the backward pass by 0.25.
    assert zero3_exposed_s(1.0, 2.0, 2.0, 2.0, 4, 2) == 2 * (0.25 + 0.25 + 0.5)
    # one layer: nothing to overlap with
    assert zero3_exposed_s(1.0, 2.0, 5.0, 9.0, 1, 3) == 3 * (1.0 + 2.0)
    # without overlap the reduce-scatter is entirely exposed
    assert zero3_exposed_s(1.0, 2.0, 2.0, 4.0, 4, 2, overlap=False) == 2 * (0.25 + 2.0)


@settings(max_examples=80, deadline=None)
@given(g=st.floats(0, 5), r=st.floats(0, 5), f=st.floats(0.01, 5), b=st.floats(0.01, 10), layers=st.integers(1, 96),
       m=st.integers(1, 16), dg=st.floats(0, 2), dc=st.floats(0, 2))
def test_zero3_exposed_properties(g, r, f, b, layers, m, dg, dc):
    e = float(zero3_exposed_s(g, r, f, b, layers, m))
    assert e >= m * (g + r) / layers - 1e-9  # the first gather and the last reduce-scatter are never hidden
    assert e <= m * (2 * g + r) + 1e-9
    assert float(zero3_exposed_s(g + dg, r + dc, f, b, layers, m)) >= e - 1e-9  # more communication never helps
    assert float(zero3_exposed_s(g, r, f + dg, b + dc, layers, m)) <= e + 1e-9  # more compute hides more
    assert float(zero3_exposed_s(g, r, f, b, layers, m, overlap=False)) >= e - 1e-9


def _zero3_plan(gbs, dp=32):
    m = gpt_model(24, 4096, 32, 2048)
    plan = megatron_plan(m, gpu="A100-SXM-80GB", tp=8, pp=1, dp=dp, mbs=1, gbs=gbs, recompute="full", seq=2048,
                         inter_node_bandwidth_bytes_per_s=100e9, dtype="bf16", overlap_grad_reduce=True)
    return m, plan.model_copy(update={"zero": 3})


def test_zero3_reduce_scatters_every_micro_batch():
    """Sharded gradients cannot be accumulated locally: 4 micro-batches pay 4 reduce-scatters and 8 gathers,
    so the ZeRO-3 communication per iteration grows linearly with the micro-batches (ZeRO-1 does not)."""
    m, one = _zero3_plan(gbs=32)
    _, four = _zero3_plan(gbs=128)
    e1, e4 = estimate(one, model=m), estimate(four, model=m)
    assert e4.dp_exposed_time_s == pytest.approx(4 * e1.dp_exposed_time_s, rel=1e-9)
    z1 = estimate(four.model_copy(update={"zero": 1}), model=m)
    assert z1.dp_exposed_time_s < e4.dp_exposed_time_s
    assert np.isfinite(e4.iteration_time_s) and e4.iteration_time_s > 4 * 0.9 * e1.iteration_time_s
