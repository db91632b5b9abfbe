"""The compute_efficiency of the Espresso-traced GPUs (A30, RTX A4000, RTX A6000, RTX 3090) against Espresso's
measured DeepSpeed pipelines (``hetplan.calibration.calibrate.fit_espresso``).

Fixture: tests/fixtures/profile/espresso/motivation1_2A30_A4000 (a calibration run: its two A30 stages are all the
A30 calibration stages, so the A30 fit on the fixture alone is the catalog value). The whole trace set
(../shared/data/traces/espresso_hetero) is used where present, skipped otherwise (not package data).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from hetplan.calibration import calibrate, traces
from hetplan.hardware.catalog import load_catalog

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "profile"
CAT = load_catalog()
HAVE_TRACES = traces.ESPRESSO_TRACES.is_dir() and any(traces.ESPRESSO_TRACES.glob("*/motivation1_*"))


@pytest.fixture(scope="module")
def fixture_traces():
    return calibrate.EspressoTraces(FIXTURES)


def test_reads_the_fixture_run(fixture_traces):
    st = fixture_traces.stages
    assert [s["gpu"] for s in st] == ["A30", "A30", "RTX-A4000"]
    assert all(s["calibration"] for s in st)
    # Measured medians (operations_record.csv): ~0.37 s forward, ~1.14 s backward on the 14-layer A30 stages.
    assert st[0]["forward_s"] == pytest.approx(0.370, abs=0.005)
    assert st[0]["backward_s"] == pytest.approx(1.138, abs=0.01)


def test_a30_fit_on_its_calibration_stages_is_the_catalog_value(fixture_traces):
    fit = calibrate.fit_espresso_efficiency(fixture_traces, "auto", gpus=("A30",))["A30"]
    assert fit["n_calibration"] == 2
    assert fit["catalog"] == pytest.approx(CAT.get("A30").compute_efficiency, abs=0.002)


def test_standard_attention_needs_a_higher_efficiency(fixture_traces):
    """Standard attention charges element-wise passes over the s x s scores that the traced (fused) runs did not
    make; a fit under that assumption absorbs them into a higher efficiency (0.66 vs 0.60 on the A30)."""
    flash = calibrate.fit_espresso_efficiency(fixture_traces, "flash", gpus=("A30",))["A30"]["fitted"]
    standard = calibrate.fit_espresso_efficiency(fixture_traces, "standard", gpus=("A30",))["A30"]["fitted"]
    assert standard > flash + 0.03


def test_catalog_predicts_the_fixture_stages_within_5_and_6_percent(fixture_traces):
    """Forward within 5 % (fitted on the calibration runs); backward, not fitted, within 6 %: forward + recomputed
    forward + backward + FlashAttention's recomputed QK^T. Since the deepspeed stack runs CoLLiE's separate q / k /
    v and gate / up GEMMs (their input gradients summed by autograd) the RTX A4000 stage's backward is 5.3 % slow
    (under 5 % with one fused GEMM each)."""
    pred = fixture_traces.predict(CAT)
    for s, p in zip(fixture_traces.stages, pred):
        assert abs(p["backward_s"] / s["backward_s"] - 1) < 0.06, s
        assert abs(p["forward_s"] / s["forward_s"] - 1) < 0.05, s


def test_missing_traces_are_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="HETPLAN_ESPRESSO_TRACES"):
        calibrate.EspressoTraces(tmp_path)


@pytest.mark.skipif(not HAVE_TRACES, reason="Espresso's traces (../shared/data/traces/espresso_hetero) not present")
def test_full_fit_reproduces_the_catalog_and_holds_out():
    res = calibrate.fit_espresso()
    fit = res["auto"]["compute_efficiency"]
    for g in traces.ESPRESSO_FITTED:
        assert fit[g]["catalog"] == pytest.approx(CAT.get(g).compute_efficiency, abs=0.002), g
    # With FlashAttention costed as the causal kernel it is, the RTX 3090 fits below its rated peak (with the full
    # s x s work charged it needed 1.10, above the bound of 1).
    assert not fit["RTX-3090"]["capped"] and 0.8 < fit["RTX-3090"]["fitted"] < 1.0
    err = res["auto"]["errors"]
    for g in ("A30", "RTX-A4000", "RTX-A6000"):
        held = err[g]["held_out"]
        assert held["n"] >= 2
        assert abs(held["forward_mean"]) < 0.03 and held["forward_mape"] < 0.07, g
        assert abs(held["backward_mean"]) < 0.05, g
    assert "RTX-3090" not in {g for g in err if "held_out" in err[g]}  # its only run calibrates
