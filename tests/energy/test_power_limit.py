"""Power limits as the knob (hetplan.energy.power_limit) and ``hetplan energy power-limits``."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from hetplan.energy.job import plan_energy
from hetplan.energy.power_limit import power_limit_curve, rank_settings, zeus_choice
from hetplan.estimate.estimator import estimate
from hetplan.plan import Plan


def _plan(gpu="A40"):
    return Plan.model_validate(dict(
        job=dict(model="gpt3-1.3b", seq_len=2048, global_batch=32, train_tokens=1e9),
        pools=[dict(gpu=gpu, count=8, gpus_per_node=4)], stages=[dict(num_layers=12, dp=4)] * 2, mbs=2))


@pytest.mark.parametrize("gpu", ["A40", "A100-SXM-80GB", "H100-SXM"])
def test_curve_starts_at_the_plan_and_slows_as_the_limit_falls(gpu):
    """At the default limit the curve IS the plan (estimator time, plan_energy's joules); lower limits never run
    faster, and average power per GPU stays under the limit set."""
    plan = _plan(gpu)
    pts = power_limit_curve(plan, steps=8)
    est = estimate(plan)
    assert pts[0].share_of_tdp == 1.0
    assert pts[0].iteration_time_s == pytest.approx(est.iteration_time_s, rel=1e-12)
    assert pts[0].energy_j == pytest.approx(plan_energy(plan, est, frontier=False)["energy_j_per_iteration"], rel=1e-12)
    t = np.array([p.iteration_time_s for p in pts])
    assert np.all(np.diff(t) >= -1e-12) and t[-1] > t[0]
    for p in pts:
        assert p.average_power_w <= max(p.power_limit_w.values()) * (1 + 1e-9)
    # a lower limit saves energy somewhere (GEMM-bound work above the voltage knee costs f·V²)
    assert min(p.energy_j for p in pts) < pts[0].energy_j


def test_zeus_choice_ends_and_settings_per_rank():
    plan = _plan()
    pts = power_limit_curve(plan, steps=10)
    assert zeus_choice(pts, plan.num_gpus, 0.0) == 0  # time only: the highest limit
    assert zeus_choice(pts, plan.num_gpus, 1.0) == int(np.argmin([p.energy_j for p in pts]))
    ranks = rank_settings(plan, pts[3])
    assert [r["rank"] for r in ranks] == list(range(8)) and [r["stage"] for r in ranks] == [0] * 4 + [1] * 4
    assert [r["local_gpu"] for r in ranks] == [0, 1, 2, 3] * 2
    w = round(pts[3].power_limit_w["A40"])
    assert ranks[5]["nvidia_smi"] == f"nvidia-smi -i 1 -pl {w}" and "nvmlDeviceSetPowerManagementLimit" in ranks[5]["nvml"]


def test_command_json_settings_and_bad_eta(tmp_path):
    plan = tmp_path / "p.json"
    plan.write_text(_plan().model_dump_json())
    out = tmp_path / "s.json"
    r = subprocess.run([sys.executable, "-m", "hetplan.cli.main", "energy", "power-limits", str(plan), "--steps", "5",
                        "--json", "--settings", str(out)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert len(d["points"]) == 5 and len(d["ranks"]) == 8
    assert json.loads(out.read_text())["ranks"] == d["ranks"]
    r = subprocess.run([sys.executable, "-m", "hetplan.cli.main", "energy", "power-limits", str(plan), "--eta", "2"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "--eta" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("entry,field", [
    # a limit under what the lowest clock draws (even under the idle power): energy frontier printed a busy GPU
    # drawing less than an idle one (612 J where the catalog's model gives 2,714 J), exit 0
    ("frequencies_mhz = [1410, 1200, 1000, 855]\npower_limit_w = 50", "gpus.A100-SXM-80GB.power_limit_w"),
    # one clock that draws more than the TDP: power-limits said "give a limit in [506, 400] W"
    ("frequencies_mhz = [1410]", "gpus.A100-SXM-80GB.frequencies_mhz"),
])
def test_power_catalog_limit_below_its_lowest_clock_is_refused(tmp_path, entry, field):
    plan = tmp_path / "p.json"
    plan.write_text(_plan("A100-SXM-80GB").model_dump_json())
    cat = tmp_path / "power.toml"
    cat.write_text(f"[gpus.A100-SXM-80GB]\n{entry}\n")
    for cmd in (["power-limits", str(plan)], ["frontier", str(plan), "-o", str(tmp_path / "o"), "--no-baselines"]):
        r = subprocess.run([sys.executable, "-m", "hetplan.cli.main", "energy", *cmd, "--power-catalog", str(cat)],
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 2 and field in r.stderr and "fix:" in r.stderr and "Traceback" not in r.stderr, r.stderr
