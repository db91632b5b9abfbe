"""Model-derived stage profiles (estimator x DVFS power model) against Perseus' measured profiles.

Protocol (hetplan.energy.calibrate): the catalog's power coefficients (hardware/data/gpu_power.toml) were fitted
on GPT-3 175B; BLOOM 176B is held out. Measured on the held-out model (numbers in docs/energy.md):

| GPU | time MAPE | energy MAPE | worst clock time / energy | frontier gap, same T | same slowdown |
| A100-SXM | 3.6 % | 1.8 % | 5.7 % / 3.9 % | 11.1 % | 2.4 % |
| A40 | 5.8 % | 4.7 % | 11.2 % / 8.5 % | 7.3 % | 4.4 % |

The issue's targets are 10 % time / 15 % energy per clock and a 5 % frontier gap at every iteration time. Met:
the per-clock energy bound on both GPUs, the per-clock time bound on A100, the 5 % gap at the same slowdown on
both. Not met: the A40's worst clock time (11.2 %) and the frontier gap at the same absolute iteration time (the
estimator predicts BLOOM ~5 % faster relative to GPT-3 than measured, which shifts the whole frontier in
time). The asserts below hold what we reach.
"""

from __future__ import annotations

import numpy as np
import pytest

from hetplan.energy.calibrate import PERSEUS_GPUS, fit_power, frontier_gap, held_out, perseus_plan
from hetplan.energy.model import plan_stage_profile
from hetplan.energy.profile import load_stage_profile
from hetplan.errors import HetplanError
from hetplan.hardware.catalog import load_catalog
from hetplan.hardware.power import get_power

from .energy_testutil import profile_path

# time_scale of each fit (measured / estimated time at the top clock), printed by fit_power and in the toml source
TIME_SCALE = {"A100-SXM-80GB": 0.8406, "A40": 0.5201}


def _fit_of_catalog(gpu):
    from hetplan.energy.calibrate import FitResult

    return FitResult(get_power(gpu), TIME_SCALE[gpu], float("nan"), float("nan"))


@pytest.mark.parametrize("device,time_mape,energy_mape,time_clock,energy_clock", [
    ("a100_sxm", 0.045, 0.025, 0.07, 0.05),
    ("a40", 0.07, 0.055, 0.13, 0.10),
])
def test_held_out_bloom_profile(device, time_mape, energy_mape, time_clock, energy_clock):
    gpu = PERSEUS_GPUS[device]
    measured = load_stage_profile(profile_path("bloom", device))
    err = held_out(measured, perseus_plan("bloom", gpu), _fit_of_catalog(gpu))
    assert err["time_mape"] < time_mape and err["energy_mape"] < energy_mape
    assert err["time_max_per_clock"] < time_clock and err["energy_max_per_clock"] < energy_clock
    # the per-clock energy target (15 %) holds on both GPUs
    assert err["energy_max_per_clock"] < 0.15


def test_fit_reproduces_catalog_coefficients():
    """The A100 entry of gpu_power.toml is what fit_power returns on GPT-3 (the data is the fit's output)."""
    gpu = "A100-SXM-80GB"
    fit = fit_power(load_stage_profile(profile_path("gpt3-175b")), perseus_plan("gpt3-175b", gpu), gpu)
    cat = get_power(gpu)
    assert fit.time_scale == pytest.approx(TIME_SCALE[gpu], rel=0.01)
    for field in ("power_limit_w", "dynamic_power_w", "voltage_floor", "voltage_knee_mhz"):
        assert getattr(fit.power, field) == pytest.approx(getattr(cat, field), rel=0.02), field
    assert fit.time_mape < 0.045 and fit.energy_mape < 0.035


def test_frontier_from_model_profile_a100():
    gpu = "A100-SXM-80GB"
    measured = load_stage_profile(profile_path("bloom"))
    derived = plan_stage_profile(perseus_plan("bloom", gpu), time_scale=TIME_SCALE[gpu]).profile
    idle = load_catalog().get(gpu).idle_power_w
    rel = frontier_gap(measured, derived, idle, 12, relative=True)
    assert rel["times_compared"] == rel["measured_points"]
    assert rel["max_rel_energy_diff"] < 0.05  # the 5 %, at the same slowdown from the fastest plan (2.4 %)
    same_t = frontier_gap(measured, derived, idle, 12)
    assert same_t["max_rel_energy_diff"] < 0.12  # 11.1 %: the held-out time error shifts the frontier


def test_power_model_physics():
    """Busy power rises with the clock, quadratically faster above the knee; the A40 is capped near its 300 W."""
    a40, a100 = get_power("A40"), get_power("A100-SXM-80GB")
    cat = load_catalog()
    f = np.array(a40.frequencies_mhz, float)
    p = a40.busy_power_w(f, cat.get("A40").idle_power_w)
    assert np.all(np.diff(p) < 0)  # descending clocks, descending power
    cap = a40.cap_frequency_mhz(cat.get("A40").idle_power_w)
    assert 1250 < cap < 1500  # measured: the top ~20 clocks of the A40 profiles run at one speed (fit: 1296 MHz)
    assert a40.busy_power_w(cap, cat.get("A40").idle_power_w) == pytest.approx(a40.power_limit_w, rel=1e-6)
    assert a100.cap_frequency_mhz(cat.get("A100-SXM-80GB").idle_power_w) > 1300
    # below the knee power per MHz is constant (voltage at its floor)
    lo = np.array([900.0, 1000.0])
    dyn = a100.busy_power_w(lo, 83.64) - 83.64
    assert dyn[0] / 900 == pytest.approx(dyn[1] / 1000)


def test_derived_profile_scales_only_compute():
    """Time at a lower clock grows by less than the clock ratio (memory-bound work does not scale) but by more
    than nothing; at the cap and above, time stays constant."""
    gpu = "A100-SXM-80GB"
    prof = plan_stage_profile(perseus_plan("gpt3-175b", gpu)).profile.get(3, "forward")
    f, t = prof.frequency_mhz.astype(float), prof.time_s
    ratio = t[-1] / t[0]
    assert 1.0 < ratio < f[0] / f[-1]
    assert np.all(np.diff(t) >= -1e-15)


def test_gpu_without_power_model_is_a_clear_error():
    with pytest.raises(HetplanError, match="no DVFS/power model for GPU T4"):
        get_power("T4")
