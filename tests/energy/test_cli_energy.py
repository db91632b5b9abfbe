"""``hetplan energy frontier`` end to end, and its errors (exit code 2, no traceback)."""

from __future__ import annotations

import csv
import json
import subprocess
import sys

import pytest

from hetplan.energy.frontier import FrequencyPlan

from .energy_testutil import FIXTURES, profile_path


def hetplan(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "hetplan.cli.main", *map(str, args)], capture_output=True, text=True, check=False,
                          cwd=cwd, timeout=300)


def test_frontier_command(tmp_path):
    out = tmp_path / "out"
    r = hetplan("energy", "frontier", profile_path("gpt3-175b"), "--num-microbatches", 12, "--idle-power-w", 83.64,
                "--unit-time-s", 0.001, "-o", out, "--json", "--straggler-slowdown", 1.2)
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    assert summary["points"] == 640 and summary["planner_time_s"] > 0
    assert 0.10 < summary["at_max_speed"]["saved_fraction"] < 0.25
    assert summary["energy_saved_at_max_speed_j"] == pytest.approx(summary["at_max_speed"]["saved_j"])
    assert summary["straggler"]["saved_j"] > summary["energy_saved_at_max_speed_j"]
    with open(out / "frontier.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert list(rows[0]) == ["time", "energy"] and len(rows) == 640
    with open(FIXTURES / "frontier_reference" / "gpt3-175b_bf16_mb12.csv") as fh:
        ref = list(csv.DictReader(fh))
    assert float(rows[1]["time"]) == float(ref[0]["time"])
    assert float(rows[1]["energy"]) == pytest.approx(float(ref[0]["energy"]), rel=1e-6)
    plans = sorted((out / "plans").glob("plan_*.json"))
    assert len(plans) == 640
    p = FrequencyPlan.from_json(plans[-1].read_text())
    assert len(p.frequencies_mhz) == 8 and all(len(x) == 24 for x in p.frequencies_mhz)
    assert p.instructions[7][:3] == ["forward:0", "backward:0", "forward:1"]
    assert (out / "summary.json").exists() and (out / "frontier.png").stat().st_size > 1000


def test_frontier_gpipe_small(tmp_path):
    r = hetplan("energy", "frontier", profile_path("bloom"), "-m", 2, "--idle-power-w", 83.64, "--schedule", "gpipe",
                "-o", tmp_path, "--no-plot", "--no-baselines", "--no-plans")
    assert r.returncode == 0, r.stderr
    assert "Pareto-optimal" in r.stdout


@pytest.mark.parametrize("args, needle", [
    (["--num-microbatches", "0"], "--num-microbatches"),
    (["--num-microbatches", "-3"], "--num-microbatches"),
    (["-m", "4", "--idle-power-w", "-5"], "--idle-power-w"),
    (["-m", "4", "--unit-time-s", "0"], "--unit-time-s"),
    (["-m", "4", "--schedule", "zigzag"], "unknown schedule"),
    (["-m", "4", "--straggler-slowdown", "0.5"], "straggler slowdown"),
])
def test_frontier_bad_options(tmp_path, args, needle):
    base = ["energy", "frontier", profile_path("gpt3-175b"), "--idle-power-w", "83.64", "-o", tmp_path / "o", "--no-plans"]
    if "--idle-power-w" in args:
        base = base[:3] + base[5:]
    r = hetplan(*base, *args)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert needle in r.stderr and "Traceback" not in r.stderr


def test_frontier_bad_profile(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("stage,instruction,frequency,time,energy\n0,forward,1410,abc,3\n")
    for path, needle in ((bad, "not a number"), (tmp_path / "missing.csv", "does not exist")):
        r = hetplan("energy", "frontier", path, "-m", 4, "--idle-power-w", 80, "-o", tmp_path / "o")
        assert r.returncode == 2 and needle in r.stderr and "Traceback" not in r.stderr
