"""The energy set of ``hetplan validate`` (hetplan.energy.validation) on Perseus' measured stage profiles."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from hetplan.energy.validation import energy_rows, run_energy


@pytest.fixture(scope="module")
def result():
    return run_energy()["energy"]


def test_rows_are_every_measured_row_and_bloom_is_held_out():
    rows = energy_rows()
    # 8 stages x 2 instructions x (38 A100 + 60 A40 clocks) x 2 models
    assert len(rows) == 16 * (38 + 60) * 2
    assert {r["model"] for r in rows if r["held_out"]} == {"bloom"}
    for r in rows[:50]:
        assert r["measured_power_w"] == pytest.approx(r["measured_energy_j"] / r["measured_time_s"])


def test_held_out_errors_within_the_issue_targets(result):
    """Measured on the held-out BLOOM rows (docs/energy.md): energy MAPE 3.7 %, signed +2.2 %; power median
    |error| 4.1 %. The issue's targets: power within 10 % median, energy within 15 % where time is within 10 %."""
    held, power = result["held_out"], result["power_held_out"]
    assert held["n"] == 1568 and held["mape"] < 0.05 and abs(held["signed_median"]) < 0.04
    assert power["median_abs"] < 0.10 and result["held_out_where_time_within_10pct"]["median_abs"] < 0.15
    assert result["met"]
    # the time scale is fitted on the GPT-3 rows only, and close to the joint fit's (gpu_power.toml sources)
    assert result["per_gpu"]["A100-SXM-80GB"]["time_scale"] == pytest.approx(0.796, rel=0.02)
    assert result["per_gpu"]["A40"]["time_scale"] == pytest.approx(0.488, rel=0.02)


def test_validate_command_runs_the_energy_set():
    r = subprocess.run([sys.executable, "-m", "hetplan.cli.main", "validate", "--sets", "energy", "--json"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    sets = json.loads(r.stdout)["sets"]
    assert list(sets) == ["energy"] and sets["energy"]["n"] == 3136
