"""Inference energy (hetplan.energy.inference): worked examples on the DVFS power model, per-GPU sums, bounds."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hetplan.energy.inference import busy_idle_power_w, inference_energy
from hetplan.errors import HetplanError
from hetplan.hardware.catalog import load_catalog
from hetplan.hardware.power import board_limited, get_power


def test_worked_example_a100_sxm():
    """1 s prefill + 2 s decode + 3 s idle on one A100-SXM: E = P_busy·3 s + 83.64 W·3 s, by hand."""
    idle = 83.64
    pw = board_limited(get_power("A100-SXM-80GB"), 400.0, idle)  # the catalog A100's 400 W default limit
    f = float(pw.effective_frequency_mhz(pw.max_frequency_mhz, idle))
    p_busy = float(pw.busy_power_w(f, idle))
    r = inference_energy("A100-SXM-80GB", prefill_busy_s=1.0, decode_busy_s=2.0, idle_s=3.0, num_requests=10,
                         output_tokens=1000)
    assert r.energy_source == "dvfs-model" and p_busy == pytest.approx(400.0)  # capped: GEMMs run at the limit
    assert r.energy_j == pytest.approx(3 * p_busy + 3 * idle, rel=1e-12)
    assert r.prefill_energy_j == pytest.approx(p_busy)
    assert r.energy_j_per_request == pytest.approx(r.energy_j / 10)
    assert r.energy_j_per_output_token == pytest.approx(r.energy_j / 1000)
    assert r.average_power_w_per_gpu == pytest.approx(r.energy_j / 6)


def test_per_gpu_times_sum_and_single_numbers_stand_for_every_gpu():
    per_gpu = inference_energy("H100-SXM", prefill_busy_s=[1.0, 2.0], decode_busy_s=[3.0, 4.0], idle_s=[0.5, 0.0])
    p_busy, p_idle, _ = busy_idle_power_w("H100-SXM")
    assert per_gpu.energy_j == pytest.approx(p_busy * 10 + p_idle * 0.5)
    same = inference_energy("H100-SXM", prefill_busy_s=1.0, decode_busy_s=1.0, idle_s=1.0, num_gpus=4)
    one = inference_energy("H100-SXM", prefill_busy_s=1.0, decode_busy_s=1.0, idle_s=1.0)
    assert same.energy_j == pytest.approx(4 * one.energy_j)
    assert one.energy_j_per_request is None and one.energy_j_per_output_token is None


def test_gpu_without_dvfs_model_is_charged_its_tdp():
    """A user catalog's GPU without a DVFS entry (every package GPU has one)."""
    from hetplan.hardware.catalog import Catalog

    base = load_catalog()
    cat = Catalog({**base.gpus, "T4-custom": base.get("T4").model_copy(update={"name": "T4-custom", "aliases": ()})},
                  base.date)
    r = inference_energy("T4-custom", prefill_busy_s=2.0, decode_busy_s=0.0, idle_s=1.0, catalog=cat)
    assert r.energy_source == "tdp"
    assert r.energy_j == pytest.approx(2 * cat.get("T4").tdp_w + cat.get("T4").idle_power_w)


@pytest.mark.parametrize("kwargs,field", [
    ({"prefill_busy_s": -1.0}, "prefill_busy_s"),
    ({"idle_s": math.inf}, "idle_s"),
    ({"decode_busy_s": [1.0, 2.0], "idle_s": [1.0, 2.0, 3.0]}, "idle_s"),
    ({"num_requests": -3}, "num_requests"),
    ({"num_gpus": 0}, "num_gpus"),
    ({"prefill_busy_s": []}, "prefill_busy_s"),
])
def test_bad_input_names_the_field(kwargs, field):
    args = {"prefill_busy_s": 1.0, "decode_busy_s": 1.0, "idle_s": 1.0, **kwargs}
    with pytest.raises(HetplanError) as err:
        inference_energy("A100-SXM-80GB", **args)
    assert err.value.field == field


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(["A100-SXM-80GB", "A40", "H100-SXM", "L4"]),
       st.floats(0, 1e4), st.floats(0, 1e4), st.floats(0, 1e4))
def test_average_power_between_idle_and_the_power_limit(gpu, pre, dec, idle):
    r = inference_energy(gpu, prefill_busy_s=pre, decode_busy_s=dec, idle_s=idle)
    if pre + dec + idle == 0:
        assert math.isnan(r.average_power_w_per_gpu)
        return
    tdp = load_catalog().get(gpu).tdp_w
    assert r.idle_power_w * (1 - 1e-9) <= r.average_power_w_per_gpu <= tdp * (1 + 1e-9)
