"""Frontier object: plans, picks, Pareto trimming, replay, summary."""

from __future__ import annotations

import numpy as np
import pytest

from hetplan.energy import baselines as B
from hetplan.energy.frontier import FrequencyPlan
from hetplan.energy.report import summarize
from hetplan.errors import HetplanError


def test_plans_meet_their_durations(gpt_frontier_12, gpt_profile):
    fr = gpt_frontier_12
    for i in (0, len(fr) // 2, len(fr) - 1):
        plan = fr.plan(i)
        d = fr.result.durations[i]
        for s, ids in enumerate(fr.dag.stage_ops):
            for pos, v in enumerate(ids):
                f = plan.frequencies_mhz[s][pos]
                kind = "forward" if fr.dag.kind[v] == 0 else "backward"
                o = fr.options[2 * s + fr.dag.kind[v]]
                q = o.quant_time[list(o.frequency_mhz).index(f)]
                # the slowest kept option that meets the assigned duration
                slower = o.quant_time[(o.quant_time > q) & (o.quant_time <= d[v])]
                assert q <= d[v] or q == o.min_quant
                assert slower.size == 0
                assert f in gpt_profile.get(s, kind).frequency_mhz
    again = FrequencyPlan.from_json(fr.plan(-1).to_json())
    assert again.frequencies_mhz == fr.plan(len(fr) - 1).frequencies_mhz
    with pytest.raises(HetplanError, match="does not exist"):
        fr.plan(len(fr))
    with pytest.raises(HetplanError, match="not a frequency plan"):
        FrequencyPlan.from_json("{]")


def test_pareto_and_pick(gpt_frontier_12):
    fr = gpt_frontier_12
    idx = fr.pareto_indices()
    t, e = fr.time_s[idx], fr.energy_j[idx]
    assert np.all(np.diff(t) < 0) and np.all(np.diff(e) > 0)  # slower is cheaper along the Pareto part
    assert idx.size == 370 and idx[0] == int(np.argmin(fr.energy_j))
    i = fr.index_for_time(3.0)
    assert fr.time_s[i] <= 3.0 and i in set(idx.tolist())
    # a loose deadline: idle power is paid until the deadline anyway, so the slowest point (least computation
    # energy) wins even though it is not on the Pareto part of the (time, energy) curve
    assert fr.index_for_time(10.0) == 0
    assert fr.index_for_time(fr.time_s[270]) == 270
    with pytest.raises(HetplanError, match="no plan finishes"):
        fr.index_for_time(1.0)


def test_replay_close_to_model(gpt_frontier_12):
    fr = gpt_frontier_12
    for i in (0, 300, len(fr) - 1):
        t, e = fr.simulate(i)
        assert 0 <= t - fr.time_s[i] < 0.03  # time is floored to 1 ms per instruction
        assert e == pytest.approx(fr.energy_j[i], rel=0.005)


def test_summary_savings(gpt_frontier_12, gpt_profile):
    s = summarize(gpt_frontier_12, straggler_slowdown=1.3, baselines=False)
    mx = B.all_max(gpt_profile, gpt_frontier_12.dag, 83.64)
    assert s["all_max"]["time_s"] == pytest.approx(mx.time_s)
    assert s["at_max_speed"]["time_s"] <= mx.time_s
    assert 0.15 < s["at_max_speed"]["saved_fraction"] < 0.18
    assert s["straggler"]["straggler_time_s"] == pytest.approx(1.3 * mx.time_s)
    assert s["straggler"]["saved_fraction"] > s["at_max_speed"]["saved_fraction"]
    with pytest.raises(HetplanError, match="straggler slowdown"):
        summarize(gpt_frontier_12, straggler_slowdown=0.9, baselines=False)


def test_unit_time_bounded_by_the_solver_work(gpt_profile):
    """A unit within 1/1000 of the shortest instruction still ran for hours (> 60 s killed) when another stage's
    instructions were 5,000x longer (a 1 ms forward next to 5 s ones): the solver takes one step per unit of the
    iteration's time range. Refused at once, naming the smallest unit within the bounds, which then runs."""
    import time

    from hetplan.energy.frontier import compute_frontier
    from hetplan.energy.profile import parse_stage_profile

    rows = gpt_profile.to_csv().splitlines()
    out = [rows[0]]
    for row in rows[1:]:
        s, inst, f, t, e = row.split(",")
        k = 1 / 50 if (s, inst) == ("0", "forward") else 100 if s == "7" else 1
        out.append(f"{s},{inst},{f},{float(t) * k!r},{float(e) * k!r}")
    skew = parse_stage_profile("\n".join(out) + "\n")
    t0 = time.process_time()
    with pytest.raises(HetplanError) as err:
        compute_frontier(skew, 4, 60.0, unit_time_s=1.1e-6)
    assert time.process_time() - t0 < 2 and err.value.field == "unit_time_s" and "--unit-time-s ≥" in err.value.fix
    finest = float(err.value.fix.split("≥ ")[1].split()[0])
    fr = compute_frontier(skew, 4, 60.0, unit_time_s=finest * 1.01, max_points=50)  # within the bounds: it runs
    assert len(fr.time_s) == 50
