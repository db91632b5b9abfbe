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


def test_serving_rows_are_the_compute_bound_dense_rows():
    """Every kept row is a dense model whose measured batch reaches the roofline ridge (peak / HBM bandwidth:
    ~295 tokens on H100, ~292 on B200); power per GPU is the replica's power over its GPUs."""
    from hetplan.energy.validation import serving_rows

    rows = serving_rows()
    assert len(rows) == 38 and {r["gpu"] for r in rows} == {"H100-SXM", "B200"}
    for r in rows:
        assert r["avg_batch_size"] >= r["ridge_batch"]
        assert 280 < r["ridge_batch"] < 300
        assert 0 < r["measured_power_w"] <= {"H100-SXM": 700, "B200": 1000}[r["gpu"]]


def test_serving_fit_is_the_catalog_coefficient_and_held_out_models_are_unseen():
    """gpu_power.toml's P_dyn of H100-SXM and B200 is what fit_serving_power returns on the seeded half of the
    models; the held-out models were not in the fit."""
    from hetplan.energy.validation import fit_serving_power, serving_rows, serving_split
    from hetplan.hardware.power import get_power

    rows = serving_rows()
    cal = serving_split(rows)
    fit = fit_serving_power(rows, cal)
    for gpu in ("H100-SXM", "B200"):
        pw = get_power(gpu)
        assert pw.fitted and pw.dynamic_power_w == pytest.approx(fit[gpu]["dynamic_power_w"], abs=0.06)
        models = {r["model_id"] for r in rows if r["gpu"] == gpu}
        assert 0 < len(cal[gpu]) < len(models)
    assert serving_split(rows) == cal  # seeded
    assert fit["H100-SXM"]["busy_power_w"] < 700 and fit["B200"]["busy_power_w"] < 1000


def test_serving_held_out_power(result):
    """Held-out models (docs/energy.md): power per GPU MAPE 2.7 %, signed -0.2 %, median |error| 2.5 % (15 rows);
    the TDP-capped transfer had MAPE 7.9 %, signed +7.3 %."""
    s = result["serving"]
    held = s["power_held_out"]
    assert held["n"] == 15 and held["median_abs"] < 0.05 and abs(held["signed_median"]) < 0.03
    for gpu in ("H100-SXM", "B200"):
        assert s["per_gpu"][gpu]["held_out"]["median_abs"] < 0.05
