"""Exact agreement with the published Perseus frontiers and EnvPipe results (tests/fixtures/energy)."""

from __future__ import annotations

import csv

import numpy as np
import pytest

from hetplan.energy import baselines as B
from hetplan.energy.dag import build_pipeline_dag
from hetplan.energy.frontier import compute_frontier
from hetplan.energy.profile import load_stage_profile

from .energy_testutil import FIXTURES, IDLE_A40_W, IDLE_A100_W, profile_path

# envpipe_result.csv reports 10 iterations of a pipeline whose stages span 8 GPUs each (time x10, energy x80);
# inferred: its times are exactly 10x the all-max iteration time we replay from the same profile.
ENVPIPE_TIME_SCALE = 10.0
ENVPIPE_ENERGY_SCALE = 80.0


def read_reference(model: str, mb: int) -> dict[int, float]:
    with open(FIXTURES / "frontier_reference" / f"{model}_bf16_mb{mb}.csv") as fh:
        return {round(float(r["time"]) * 1000): float(r["energy"]) for r in csv.DictReader(fh)}


@pytest.mark.parametrize("model", ["gpt3-175b", "bloom"])
@pytest.mark.parametrize("mb", [12, 24])
def test_frontier_matches_reference(model, mb):
    ref = read_reference(model, mb)
    fr = compute_frontier(load_stage_profile(profile_path(model)), mb, IDLE_A100_W, 0.001)
    ours = dict(zip(fr.result.quant_time.tolist(), fr.energy_j.tolist()))
    # same iteration times: the reference starts one step after the all-slowest point, which we also report
    assert set(ref) <= set(ours)
    assert set(ours) - set(ref) == {max(ours)}
    err = max(abs(ours[t] - e) / e for t, e in ref.items())
    assert err < 0.005  # the requirement; in fact:
    assert err < 1e-6


def _envpipe_reference():
    with open(FIXTURES / "envpipe_result.csv") as fh:
        return {(r["model"], r["device"], int(r["num_microbatches"])): (float(r["iteration_time"]), float(r["energy"]))
                for r in csv.DictReader(fh)}


@pytest.mark.parametrize("model,device,mb", [
    ("gpt3-175b", "a100_sxm", 12), ("gpt3-175b", "a100_sxm", 24), ("bloom", "a100_sxm", 12),
    ("gpt3-175b", "a40", 12), ("bloom", "a40", 12),
])
def test_envpipe_matches_reference(model, device, mb):
    idle = IDLE_A100_W if device == "a100_sxm" else IDLE_A40_W
    prof = load_stage_profile(profile_path(model, device))
    dag = build_pipeline_dag(8, mb)
    ref_t, ref_e = _envpipe_reference()[(model, device, mb)]
    env = B.envpipe(prof, dag, idle)
    assert env.time_s * ENVPIPE_TIME_SCALE == pytest.approx(ref_t, rel=1e-3)
    assert env.energy_j * ENVPIPE_ENERGY_SCALE == pytest.approx(ref_e, rel=0.01)
    mx = B.all_max(prof, dag, idle)
    assert mx.time_s * ENVPIPE_TIME_SCALE == pytest.approx(ref_t, rel=1e-4)  # EnvPipe keeps all-max speed
    assert env.energy_j < mx.energy_j


def test_baselines_are_dominated_by_frontier(gpt_profile, gpt_frontier_12):
    fr = gpt_frontier_12
    dag = fr.dag
    zg = B.zeus_global(gpt_profile, dag, IDLE_A100_W)
    zs = B.zeus_per_stage(gpt_profile, dag, IDLE_A100_W)
    assert len(zg) == 38 and len(zs) == 38
    assert zg[0].time_s == pytest.approx(B.all_max(gpt_profile, dag, IDLE_A100_W).time_s)
    # at the all-max time Perseus (model) beats every baseline that is at least as fast
    t_max = zg[0].time_s
    i = fr.index_for_time(t_max)
    perseus = fr.energy_j[i] + 8 * IDLE_A100_W * (t_max - fr.time_s[i])
    env = B.envpipe(gpt_profile, dag, IDLE_A100_W)
    for b in [env] + [p for p in zg + zs if p.time_s <= t_max + 1e-9]:
        assert perseus < b.energy_j
    # monotone Zeus sweep: lower frequency, slower
    assert np.all(np.diff([p.time_s for p in zg]) > 0)
