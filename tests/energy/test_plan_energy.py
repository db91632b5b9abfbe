"""Energy of whole plans (hetplan.energy.job) and ``hetplan plan --energy``."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hetplan.energy.job import J_PER_KWH, pareto3, plan_energy
from hetplan.energy.model import plan_stage_profile
from hetplan.estimate.estimator import estimate
from hetplan.plan import Plan


def _plan(gpu="A100-SXM-80GB", pp=2, dp=2, tokens=1e9):
    return Plan.model_validate(dict(
        job=dict(model="gpt3-1.3b", seq_len=2048, global_batch=32, train_tokens=tokens),
        pools=[dict(gpu=gpu, count=pp * dp)], stages=[dict(num_layers=24 // pp, dp=dp)] * pp, mbs=2))


def test_energy_per_iteration_worked():
    """E = Σ_s n_s·[M·(E_F + E_B) + P_idle·(T − M·(t_F + t_B))] at the top clock, by hand from the profile."""
    plan = _plan()
    est = estimate(plan)
    pp = plan_stage_profile(plan)
    M = plan.num_microbatches(0)
    want = 0.0
    for s in range(2):
        f, b = pp.profile.get(s, "forward"), pp.profile.get(s, "backward")
        want += 2 * (M * (f.energy_j[0] + b.energy_j[0]) + 83.64 * (est.iteration_time_s - M * (f.time_s[0] + b.time_s[0])))
    got = plan_energy(plan, est, usd_per_kwh=0.2)
    assert got["energy_j_per_iteration"] == pytest.approx(want, rel=1e-12)
    assert got["job_energy_kwh"] == pytest.approx(want * est.iterations / J_PER_KWH)
    assert got["energy_usd"] == pytest.approx(0.2 * got["job_energy_kwh"])
    # average power per GPU between idle and the power limit
    assert 83.64 < got["average_power_w"] / 4 < 476.2
    assert got["energy_source"] == "dvfs-model" and 0 <= got["perseus_saved_fraction"] < 0.5


def test_single_stage_has_no_pipeline_bloat():
    """pp = 1: every instruction is critical; what remains is the 1 % time tolerance's worth."""
    plan = _plan(pp=1, dp=4)
    got = plan_energy(plan, estimate(plan))
    assert got["perseus_saved_fraction"] < 0.05


def test_gpu_without_dvfs_model_is_charged_tdp():
    """A user catalog's GPU without a DVFS entry (every package GPU has one)."""
    from hetplan.hardware.catalog import Catalog, load_catalog

    base = load_catalog()
    cat = Catalog({**base.gpus, "A10G-custom": base.get("A10G").model_copy(update={"name": "A10G-custom",
                                                                                     "aliases": ()})}, base.date)
    plan = _plan(gpu="A10G-custom", pp=1, dp=4)
    got = plan_energy(plan, estimate(plan, catalog=cat), catalog=cat)
    assert got["energy_source"] == "tdp" and got["perseus_saved_fraction"] is None
    assert got["average_power_w"] / 4 <= 300.0 + 1e-9


@pytest.mark.parametrize("gpu", ["H100-SXM", "H200", "B200", "A100-PCIE-80GB", "L4", "L40S", "H100-PCIE", "GB200",
                                 "MI300X", "A10G", "RTX-4090", "H100-SXM-96GB-500W"])
def test_rented_gpus_have_a_power_model_under_tdp(gpu):
    """No TDP fallback for the GPUs people rent: a DVFS model (fitted on measured serving power for H100-SXM and
    B200, transferred for the rest), average power per GPU below the TDP, and a Perseus saving."""
    from hetplan.hardware.catalog import load_catalog

    plan = _plan(gpu=gpu)
    got = plan_energy(plan, estimate(plan))
    assert got["energy_source"] == ("dvfs-model" if gpu in ("H100-SXM", "B200") else "dvfs-physics")
    assert load_catalog().get(gpu).idle_power_w < got["average_power_w"] / 4 < load_catalog().get(gpu).tdp_w
    assert got["perseus_saved_fraction"] is not None and got["perseus_saved_fraction"] > 0


def test_bad_price():
    plan = _plan()
    from hetplan.errors import HetplanError

    with pytest.raises(HetplanError, match="--usd-per-kwh"):
        plan_energy(plan, estimate(plan), usd_per_kwh=float("nan"))


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(*[st.integers(0, 4)] * 3), min_size=1, max_size=12))
def test_pareto3_brute_force(points):
    keep = set(pareto3(points))
    for i, p in enumerate(points):
        dominated = any(all(q[k] <= p[k] for k in range(3)) and any(q[k] < p[k] for k in range(3)) for q in points)
        assert (i in keep) == (not dominated)


def test_plan_command_energy_json_and_pareto(tmp_path):
    png = tmp_path / "p.png"
    r = subprocess.run([sys.executable, "-m", "hetplan.cli.main", "plan", "--model", "gpt3-1.3b", "--seq-len", "2048",
                        "--global-batch", "32", "--tokens", "1e9", "--gpu", "A100-SXM-80GB", "--gpus", "8",
                        "--pp", "2", "--top", "2", "--energy", "--usd-per-kwh", "0.15", "--pareto", str(png), "--json"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    for p in d["plans"] + d["pareto"] + d["energy_pareto"]:
        assert p["energy_j_per_iteration"] > 0 and p["job_energy_kwh"] > 0
        assert p["job_usd"] == pytest.approx(p["gpu_usd"] + p["energy_usd"])
    front = d["energy_pareto"]
    pts = [(p["iteration_time_s"], p["job_usd"], p["job_energy_kwh"]) for p in d["plans"] + d["pareto"]]
    for p in front:  # no candidate beats a frontier plan in all three
        q = (p["iteration_time_s"], p["job_usd"], p["job_energy_kwh"])
        assert not any(all(a <= b for a, b in zip(x, q)) and any(a < b for a, b in zip(x, q)) for x in pts)
    assert (tmp_path / "p-energy.png").stat().st_size > 1000


def test_plan_command_usd_per_kwh_needs_energy():
    r = subprocess.run([sys.executable, "-m", "hetplan.cli.main", "plan", "--model", "gpt3-1.3b", "--seq-len", "2048",
                        "--global-batch", "32", "--tokens", "1e9", "--gpu", "A100-SXM-80GB", "--gpus", "8",
                        "--usd-per-kwh", "0.1"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "--usd-per-kwh" in r.stderr and "Traceback" not in r.stderr


def test_pipeline_over_1024_instructions_gets_its_saving():
    """4 stages x 160 micro-batches = 1,280 instructions: skipped silently before; now the unit is coarsened."""
    plan = Plan.model_validate(dict(
        job=dict(model="gpt3-1.3b", seq_len=2048, global_batch=160, train_tokens=1e9),
        pools=[dict(gpu="A100-SXM-80GB", count=4)], stages=[dict(num_layers=6)] * 4, mbs=1))
    assert 2 * 4 * plan.num_microbatches(0) > 1024
    got = plan_energy(plan, estimate(plan))
    assert got["perseus_saved_fraction"] is not None and 0 < got["perseus_saved_fraction"] < 0.5


@pytest.mark.parametrize("gpu", ["A40", "A100-SXM-80GB"])
def test_top_clock_profile_is_the_estimators_time_and_power_stays_under_tdp(gpu):
    """The estimator's compute efficiencies were calibrated on boards at their default power limit, so the
    profile's top clock IS the estimator's stage time (the A40's 1,740 MHz is power-capped: scaling by the cap
    again made `energy frontier` 23 % slower than `plan --energy` for one A40 plan); busy power ≤ TDP."""
    from hetplan.hardware.catalog import load_catalog

    plan = _plan(gpu=gpu)
    est = estimate(plan)
    pp = plan_stage_profile(plan)
    tdp = load_catalog().get(gpu).tdp_w
    for s, st in enumerate(est.stages):
        f, b = pp.profile.get(s, "forward"), pp.profile.get(s, "backward")
        assert f.time_s[0] == pytest.approx(st.forward_s, rel=1e-9)
        assert b.time_s[0] == pytest.approx(st.backward_s, rel=1e-9)
        assert max((f.energy_j / f.time_s).max(), (b.energy_j / b.time_s).max()) <= tdp * (1 + 1e-9)
    got = plan_energy(plan, est)
    assert got["average_power_w"] / plan.num_gpus <= tdp


def test_plan_energy_and_energy_frontier_agree(tmp_path):
    """`energy frontier PLAN.json` and `plan --energy` price the same all-max iteration: the frontier's pipeline
    plus idle power over what lies outside it (DP sync, optimizer) is plan_energy's joules per GPU of each stage,
    and its time is the estimator's (before: 76.1 s against 61.7 s for one A40 plan)."""
    plan = _plan(gpu="A40")
    p = tmp_path / "plan.json"
    p.write_text(plan.model_dump_json())
    r = subprocess.run([sys.executable, "-m", "hetplan.cli.main", "energy", "frontier", str(p), "-o",
                        str(tmp_path / "o"), "--json", "--no-baselines", "--no-plans"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout)
    est = estimate(plan)
    got = plan_energy(plan, est, frontier=False)
    assert s["plan_iteration_time_s"] == pytest.approx(est.iteration_time_s, rel=1e-12)
    assert 0 <= s["outside_pipeline_s"] < 0.2 * est.iteration_time_s
    assert s["plan_all_max_energy_j"] * plan.num_gpus / len(plan.stages) == pytest.approx(
        got["energy_j_per_iteration"], rel=1e-9)


def test_context_parallel_gpus_are_counted():
    """A CP 2 plan runs every stage on tp·cp·dp GPUs: all of them draw power (counting tp·dp halved the
    energy of Llama 3 8B's best H100 plan: 349 W per GPU instead of 697 W)."""
    plan = Plan.model_validate(dict(
        job=dict(model="gpt3-1.3b", seq_len=4096, global_batch=32, train_tokens=1e9),
        pools=[dict(gpu="H100-SXM", count=8)], stages=[dict(num_layers=24, dp=4)], mbs=2, cp=2))
    pp = plan_stage_profile(plan)
    assert sum(pp.gpus_per_stage) == plan.num_gpus == 8
    est = estimate(plan)
    got = plan_energy(plan, est)
    f, b = pp.profile.get(0, "forward"), pp.profile.get(0, "backward")
    M = plan.num_microbatches(0)
    busy = M * (f.time_s[0] + b.time_s[0])
    want = 8 * (M * (f.energy_j[0] + b.energy_j[0]) + 147.0 * (est.iteration_time_s - busy))
    assert got["energy_j_per_iteration"] == pytest.approx(want, rel=1e-12)
