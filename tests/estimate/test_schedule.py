"""Pipeline schedule simulation vs closed forms (exact for equal stages), and basic properties."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from hetplan.estimate.pipeline import pipeline_time_s
from hetplan.estimate.schedule import simulate, stage_order


def closed_form_s(forward_s, backward_s, p2p_s, m, v=1):
    """The closed form of :func:`hetplan.estimate.pipeline.pipeline_time_s` for one pipeline given stage by stage."""
    p = len(forward_s)
    return float(pipeline_time_s(np.array(forward_s), np.array(backward_s), np.ones(p), sum(p2p_s), m,
                                 virtual_stages=v)[0])


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


def test_simulate_many_equals_simulate_with_blocking_p2p():
    import numpy as np

    from hetplan.estimate.schedule import simulate_many

    rng = np.random.default_rng(3)
    for schedule, p, m in [("gpipe", 3, 5), ("1f1b", 4, 7), ("1f1b", 5, 2), ("1f1b", 1, 3)]:
        f, b = rng.uniform(0.1, 2, (5, p)), rng.uniform(0.1, 4, (5, p))
        c = rng.uniform(0, 0.5, (5, p - 1))
        makespan, stage_end = simulate_many(f, b, c, m, schedule, blocking_p2p=True)
        for n in range(5):
            ref = simulate(f[n], b[n], c[n], m, schedule, blocking_p2p=True)
            assert makespan[n] == pytest.approx(ref.makespan_s, rel=1e-12)
            assert list(stage_end[n]) == pytest.approx(ref.stage_end_s, rel=1e-12)


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


def test_blocking_p2p_worked_case():
    """p = 2, f = 1, b = 2, c = 0.5, m = 4 by hand (Megatron-LM calls): stage 0 F0 [0,1], send_forward [1,1.5];
    F1 [1.5,2.5], send_forward_recv_backward waits for stage 1's send_backward_recv_forward, which starts after
    F0 [1.5,2.5] and B0 [2.5,4.5]: both end at 5; ... stage 1's last send_backward and stage 0's recv_backward
    end at 15.5, B3 [15.5,17.5]. The asynchronous model gives 17 (the consumer waits, the stages do not)."""
    assert simulate([1.0, 1.0], [2.0, 2.0], [0.5], 4, "1f1b", blocking_p2p=True).makespan_s == 17.5
    res = simulate([1.0, 1.0], [2.0, 2.0], [0.5], 4, "1f1b", record=True, blocking_p2p=True)
    stage0 = [(op.kind, op.microbatch, op.start_s, op.end_s) for op in res.ops if op.stage == 0]
    assert stage0 == [("F", 0, 0.0, 1.0), ("F", 1, 1.5, 2.5), ("B", 0, 5.0, 7.0), ("F", 2, 7.0, 8.0),
                      ("B", 1, 8.5, 10.5), ("F", 3, 10.5, 11.5), ("B", 2, 12.0, 14.0), ("B", 3, 15.5, 17.5)]


@pytest.mark.parametrize("p", [3, 4, 8, 9])
@pytest.mark.parametrize("m", [2, 3, 8, 33])
def test_blocking_p2p_equal_stages_every_stage_pays_its_transfers(p, m):
    """Equal stages with blocking calls: (m+p-1)(f+b) + (2m+2p-5)c exactly — the 2c of a middle stage's two
    calls per micro-batch lie on every stage's steady-state cycle, not only on the critical path."""
    f, b, c = 0.25, 0.5, 0.125
    res = simulate([f] * p, [b] * p, [c] * (p - 1), m, "1f1b", blocking_p2p=True)
    assert res.makespan_s == (m + p - 1) * (f + b) + (2 * m + 2 * p - 5) * c
    assert simulate([f] * 2, [b] * 2, [c], m, "1f1b", blocking_p2p=True).makespan_s == (m + 1) * (f + b + c)
    assert res.makespan_s > simulate([f] * p, [b] * p, [c] * (p - 1), m, "1f1b").makespan_s


@settings(max_examples=60, deadline=None)
@given(
    times=st.lists(st.tuples(st.floats(0.1, 5.0), st.floats(0.1, 10.0), st.floats(0.0, 2.0)), min_size=1,
                   max_size=6),
    m=st.integers(1, 12),
    schedule=st.sampled_from(["gpipe", "1f1b"]),
)
def test_blocking_p2p_never_beats_async_nor_the_search_bound(times, m, schedule):
    f = [x for x, _, _ in times]
    b = [y for _, y, _ in times]
    c = [z for _, _, z in times][:-1]
    blocking = simulate(f, b, c, m, schedule, blocking_p2p=True).makespan_s
    assert blocking >= simulate(f, b, c, m, schedule).makespan_s - 1e-9
    # the planner's bound (hetplan.search.homogeneous): Σ_{j<i}(f_j+b_j) + 2Σ_{j<i}c_j + m(f_i+b_i)
    for i in range(len(f)):
        bound = sum(f[:i]) + sum(b[:i]) + 2 * sum(c[:i]) + m * (f[i] + b[i])
        assert blocking >= bound - 1e-9


def test_deepspeed_p2p_worked_case():
    """DeepSpeed's TrainSchedule by hand, p = 2, f = 1, b = 2, c = 0.5, m = 2. Stage 0: F0 [0,1]; step 1 sends
    activation 0 (stage 1 waits in RecvActivation from 0): [1,1.5]; F1 [1.5,2.5]; step 3 RecvGrad 0 waits for
    stage 1's SendGrad, issued at stage 1's step 3 after F0 [1.5,2.5] and B0 [2.5,4.5]: [4.5,5]; then
    SendActivation 1 [5,5.5] (stage 1's RecvActivation 1); B0 [5.5,7.5]; RecvGrad 1 waits for stage 1's
    F1 [5.5,6.5], B1 [6.5,8.5]: [8.5,9]; B1 [9,11]. Megatron-LM's batched calls give 10.5, asynchronous 10."""
    f, b, c = [1.0, 1.0], [2.0, 2.0], [0.5]
    res = simulate(f, b, c, 2, "1f1b", record=True, blocking_p2p="deepspeed")
    assert res.makespan_s == 11.0
    stage0 = [(op.kind, op.microbatch, op.start_s, op.end_s) for op in res.ops if op.stage == 0]
    assert stage0 == [("F", 0, 0.0, 1.0), ("F", 1, 1.5, 2.5), ("B", 0, 5.5, 7.5), ("B", 1, 9.0, 11.0)]
    assert simulate(f, b, c, 2, "1f1b", blocking_p2p=True).makespan_s == 10.5
    assert simulate(f, b, c, 2, "1f1b").makespan_s == 10.0


@pytest.mark.parametrize("p", [3, 4, 5, 8, 9])
@pytest.mark.parametrize("m", [2, 3, 8, 33])
@pytest.mark.parametrize("c", [0.125, 0.0625])
def test_deepspeed_p2p_equal_stages(p, m, c):
    """Equal stages (c ≤ f/2): (m+p-1)(f+b) + (4m+2p-8)c exactly — a middle stage makes four separate calls
    per micro-batch (SendGrad, RecvActivation, RecvGrad, SendActivation), about twice Megatron-LM's
    (2m+2p-5)c with its two batched pairs."""
    f, b = 0.25, 0.5
    ds = simulate([f] * p, [b] * p, [c] * (p - 1), m, "1f1b", blocking_p2p="deepspeed").makespan_s
    assert ds == (m + p - 1) * (f + b) + (4 * m + 2 * p - 8) * c
    assert ds > simulate([f] * p, [b] * p, [c] * (p - 1), m, "1f1b", blocking_p2p="megatron").makespan_s


@pytest.mark.parametrize("p,m", [(1, 3), (2, 1), (3, 5), (4, 2), (8, 20)])
def test_deepspeed_program_keeps_the_1f1b_compute_order(p, m):
    """DeepSpeed's step mapping (forward of j at step 2j+i, backward at 2j+2p-1-i) gives each stage the same
    compute order as Megatron-LM's 1F1B; only the p2p calls differ, and each transfer has exactly two calls."""
    from collections import Counter

    from hetplan.estimate.schedule import stage_program_deepspeed

    calls = Counter()
    for i in range(p):
        prog = stage_program_deepspeed(p, i, m)
        assert [op for op in prog if op[0] != "P"] == stage_order("1f1b", p, i, m)
        calls.update(key for op in prog if op[0] == "P" for key in op[1])
    assert len(calls) == 2 * m * (p - 1) and set(calls.values()) <= {2}


def test_simulate_many_equals_simulate_with_deepspeed_p2p():
    from hetplan.estimate.schedule import simulate_many

    rng = np.random.default_rng(5)
    for p, m in [(2, 3), (4, 7), (5, 2), (1, 3)]:
        f, b = rng.uniform(0.1, 2, (4, p)), rng.uniform(0.1, 4, (4, p))
        c = rng.uniform(0, 0.5, (4, p - 1))
        makespan, stage_end = simulate_many(f, b, c, m, "1f1b", blocking_p2p="deepspeed")
        for n in range(4):
            ref = simulate(f[n], b[n], c[n], m, "1f1b", blocking_p2p="deepspeed")
            assert makespan[n] == pytest.approx(ref.makespan_s, rel=1e-12)
            assert list(stage_end[n]) == pytest.approx(ref.stage_end_s, rel=1e-12)


def test_unknown_blocking_p2p_value_is_rejected():
    with pytest.raises(ValueError, match="blocking_p2p"):
        simulate([1.0, 1.0], [2.0, 2.0], [0.5], 2, "1f1b", blocking_p2p="nccl")


@settings(max_examples=60, deadline=None)
@given(
    times=st.lists(st.tuples(st.floats(0.1, 5.0), st.floats(0.1, 10.0), st.floats(0.0, 2.0)), min_size=1,
                   max_size=6),
    m=st.integers(1, 12),
)
def test_deepspeed_p2p_never_beats_async_nor_the_search_bound(times, m):
    f = [x for x, _, _ in times]
    b = [y for _, y, _ in times]
    c = [z for _, _, z in times][:-1]
    ds = simulate(f, b, c, m, "1f1b", blocking_p2p="deepspeed").makespan_s
    assert ds >= simulate(f, b, c, m, "1f1b").makespan_s - 1e-9
    for i in range(len(f)):
        bound = sum(f[:i]) + sum(b[:i]) + 2 * sum(c[:i]) + m * (f[i] + b[i])
        assert ds >= bound - 1e-9
