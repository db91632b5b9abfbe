"""Pipeline schedule simulation vs closed forms (exact for equal stages), and basic properties."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from hetplan.estimate.pipeline import pipeline_time_s
from hetplan.estimate.schedule import closed_form_s, simulate, stage_order


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p,m", [(1, 1), (1, 5), (2, 1), (2, 7), (4, 4), (4, 16), (8, 3), (8, 64)])
def test_equal_stages_match_closed_form_exactly(schedule, p, m):
    f, b = 0.25, 0.5  # binary fractions: exact float arithmetic
    res = simulate([f] * p, [b] * p, [0.0] * (p - 1), m, schedule)
    assert res.makespan_s == (m + p - 1) * (f + b)
    assert res.makespan_s == closed_form_s([f] * p, [b] * p, [0.0] * (p - 1), m)
    t, bottleneck, bubble = pipeline_time_s(np.full(p, f), np.full(p, b), np.ones(p), 0.0, m)
    assert float(t) == res.makespan_s
    assert float(bubble) == (p - 1) * (f + b)


@pytest.mark.parametrize("p,v,m", [(2, 2, 2), (2, 2, 8), (4, 2, 8), (4, 3, 12), (8, 2, 16), (8, 4, 64)])
def test_interleaved_equal_stages_match_closed_form_exactly(p, v, m):
    f, b = 0.25 * v, 0.5 * v  # per-chunk times 0.25 / 0.5
    res = simulate([f] * p, [b] * p, [0.0] * (p - 1), m, "interleaved", v)
    expected = (m + (p - 1) / v) * (f + b)  # Narayanan et al. SC'21 Sec. 2.2.2: bubble (p-1)/v
    assert res.makespan_s == pytest.approx(expected, rel=1e-12)
    assert closed_form_s([f] * p, [b] * p, [0.0] * (p - 1), m, v) == pytest.approx(expected, rel=1e-12)
    t, _, _ = pipeline_time_s(np.full(p, f), np.full(p, b), np.ones(p), 0.0, m, virtual_stages=v)
    assert float(t) == pytest.approx(expected, rel=1e-12)


def test_interleaving_shrinks_the_bubble():
    p, m = 8, 16
    plain = simulate([1.0] * p, [2.0] * p, [0.01] * (p - 1), m, "1f1b").makespan_s
    inter = simulate([1.0] * p, [2.0] * p, [0.01] * (p - 1), m, "interleaved", 4).makespan_s
    assert inter < plain


def test_interleaving_needs_multiple_of_pp():
    with pytest.raises(ValueError, match="multiple"):
        simulate([1.0] * 4, [2.0] * 4, [0.0] * 3, 6, "interleaved", 2)


def test_orders_contain_every_op_once():
    for schedule, v in (("gpipe", 1), ("1f1b", 1), ("interleaved", 3)):
        p, m = 4, 8
        for i in range(p):
            ops = stage_order(schedule, p, i, m, v)
            assert sorted(ops) == sorted({(k, j, c) for k in "FB" for j in range(m) for c in range(v)})


@settings(max_examples=60, deadline=None)
@given(
    times=st.lists(st.tuples(st.floats(0.1, 5.0), st.floats(0.1, 10.0)), min_size=1, max_size=6),
    m=st.integers(1, 12),
    c=st.floats(0.0, 1.0),
    schedule=st.sampled_from(["gpipe", "1f1b"]),
)
def test_simulation_bounds(times, m, c, schedule):
    f = [x for x, _ in times]
    b = [y for _, y in times]
    p = len(times)
    res = simulate(f, b, [c] * (p - 1), m, schedule)
    # never faster than the busiest stage or one micro-batch's critical path
    assert res.makespan_s >= m * max(x + y for x, y in times) - 1e-9
    assert res.makespan_s >= sum(f) + sum(b) + 2 * c * (p - 1) - 1e-9
    # more p2p time never helps
    assert simulate(f, b, [c + 0.5] * (p - 1), m, schedule).makespan_s >= res.makespan_s - 1e-9


def test_one_f_one_b_can_differ_from_closed_form():
    """Documented differences (docs/estimator.md): a slow first stage overlaps the others' fill and drain (the
    simulation is shorter); p2p time on the 1F1B steady-state cycle makes it longer; a slow last stage agrees."""
    m = 4
    assert simulate([2.0, 1.0, 1.0], [4.0, 2.0, 2.0], [0.0, 0.0], m, "1f1b").makespan_s == 26.0
    assert closed_form_s([2.0, 1.0, 1.0], [4.0, 2.0, 2.0], [0.0, 0.0], m) == 30.0
    assert simulate([1.0, 1.0], [2.0, 2.0], [0.5], m, "1f1b").makespan_s == 17.0
    assert closed_form_s([1.0, 1.0], [2.0, 2.0], [0.5], m) == 16.0
    assert simulate([1.0, 1.0, 2.0], [2.0, 2.0, 4.0], [0.0, 0.0], m, "1f1b").makespan_s == 30.0


def test_simulate_many_equals_simulate_plan_by_plan():
    """The level-vectorised evaluation gives exactly the per-plan simulation, on random stage/p2p times."""
    import numpy as np

    from hetplan.estimate.schedule import simulate_many

    rng = np.random.default_rng(7)
    for schedule, p, m, v in [("gpipe", 3, 5, 1), ("1f1b", 4, 7, 1), ("1f1b", 1, 3, 1), ("interleaved", 4, 8, 3)]:
        f, b = rng.uniform(0.1, 2, (6, p)), rng.uniform(0.1, 4, (6, p))
        c = rng.uniform(0, 0.5, (6, p - 1))
        makespan, stage_end = simulate_many(f, b, c, m, schedule, v)
        for n in range(6):
            ref = simulate(f[n], b[n], c[n], m, schedule, v)
            assert makespan[n] == ref.makespan_s
            assert list(stage_end[n]) == ref.stage_end_s
