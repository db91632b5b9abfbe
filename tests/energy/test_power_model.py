"""Model-derived stage profiles (estimator x DVFS power model) against Perseus' measured profiles.

Protocol (hetplan.energy.calibrate): Perseus' setup is Hugging Face models in eager PyTorch (attention="eager":
GPT-2's and BLOOM's unfused attention, BLOOM's fp32 softmax) and one GPU's TP shard without TP collectives; the
catalog's power coefficients (hardware/data/gpu_power.toml) were fitted on GPT-3 175B; BLOOM 176B is held out.
Measured on the held-out model (docs/energy.md has every clock):

| GPU | time MAPE | energy MAPE | worst clock time / energy | frontier gap, same T | same slowdown |
| A100-SXM | 1.3 % | 3.7 % | 2.5 % / 5.3 % | 3.9 % | 4.7 % |
| A40 | 4.8 % | 3.8 % | 9.7 % / 7.2 % | 4.4 % | 3.8 % |

The issue's targets — 10 % time and 15 % energy at every clock (mean over the clock's 16 instructions), a 5 %
frontier gap at every iteration time — hold on both GPUs; the asserts hold the bounds reached, a little above.
(Flash attention, the plan default, gave 11.1 % / 7.3 % at the same T: the held-out BLOOM was ~5 % too fast.)
"""

from __future__ import annotations

import numpy as np
import pytest

from hetplan.energy.calibrate import PERSEUS_GPUS, fit_power, frontier_gap, held_out, perseus_plan
from hetplan.energy.model import plan_stage_profile, stage_times_at_clocks
from hetplan.energy.profile import load_stage_profile
from hetplan.errors import HetplanError
from hetplan.estimate.estimator import estimate
from hetplan.hardware.catalog import load_catalog
from hetplan.hardware.power import get_power
from hetplan.model.spec import load_model

from .energy_testutil import profile_path

# time_scale of each fit (measured / estimated time at the top clock), printed by fit_power and in the toml source
TIME_SCALE = {"A100-SXM-80GB": 0.7964, "A40": 0.4881}


def _fit_of_catalog(gpu):
    from hetplan.energy.calibrate import FitResult

    return FitResult(get_power(gpu), TIME_SCALE[gpu], float("nan"), float("nan"))


@pytest.mark.parametrize("device,time_mape,energy_mape,time_clock,energy_clock", [
    ("a100_sxm", 0.02, 0.045, 0.035, 0.065),
    ("a40", 0.06, 0.045, 0.10, 0.085),
])
def test_held_out_bloom_profile(device, time_mape, energy_mape, time_clock, energy_clock):
    gpu = PERSEUS_GPUS[device]
    measured = load_stage_profile(profile_path("bloom", device))
    err = held_out(measured, perseus_plan("bloom", gpu), _fit_of_catalog(gpu))
    assert err["time_mape"] < time_mape and err["energy_mape"] < energy_mape
    assert err["time_max_per_clock"] < time_clock and err["energy_max_per_clock"] < energy_clock
    # the per-clock targets (10 % time, 15 % energy) hold on both GPUs
    assert err["time_max_per_clock"] < 0.10 and err["energy_max_per_clock"] < 0.15


def test_fit_reproduces_catalog_coefficients():
    """The A100 entry of gpu_power.toml is what fit_power returns on GPT-3 (the data is the fit's output)."""
    gpu = "A100-SXM-80GB"
    fit = fit_power(load_stage_profile(profile_path("gpt3-175b")), perseus_plan("gpt3-175b", gpu), gpu)
    cat = get_power(gpu)
    assert fit.time_scale == pytest.approx(TIME_SCALE[gpu], rel=0.01)
    for field in ("power_limit_w", "dynamic_power_w", "voltage_floor", "voltage_knee_mhz"):
        assert getattr(fit.power, field) == pytest.approx(getattr(cat, field), rel=0.02), field
    assert fit.time_mape < 0.035 and fit.energy_mape < 0.03


@pytest.mark.parametrize("device,same_time,same_slowdown", [("a100_sxm", 0.045, 0.05), ("a40", 0.05, 0.045)])
def test_frontier_from_model_profile(device, same_time, same_slowdown):
    """Both frontiers (8 x 12, 1F1B) computed; at every iteration time of the measured frontier inside the
    derived one's range, the least energy each offers within it differs by < 5 % (A100 4.3 %, A40 4.3 %)."""
    gpu = PERSEUS_GPUS[device]
    measured = load_stage_profile(profile_path("bloom", device))
    derived = plan_stage_profile(perseus_plan("bloom", gpu), time_scale=TIME_SCALE[gpu], tp_collectives=False,
                                 power_limit_w="model", time_reference="top").profile
    idle = load_catalog().get(gpu).idle_power_w
    same_t = frontier_gap(measured, derived, idle, 12)
    # the common range is most of the frontier (A100: 575 of 641 points; 587 before the reduction's K½ followed the
    # machine balance, which falls with the SM clock: hetplan.estimate.compute.reduction_half_dim)
    assert same_t["times_compared"] > 0.85 * same_t["measured_points"]
    assert same_t["max_rel_energy_diff"] < same_time <= 0.05
    # the fastest plans agree within 3 % in time
    assert same_t["derived_fastest_s"] == pytest.approx(same_t["measured_fastest_s"], rel=0.03)
    rel = frontier_gap(measured, derived, idle, 12, relative=True)
    assert rel["max_rel_energy_diff"] < same_slowdown


def test_power_model_physics():
    """Busy power rises with the clock, quadratically faster above the knee; the A40 is capped near its 300 W."""
    a40, a100 = get_power("A40"), get_power("A100-SXM-80GB")
    cat = load_catalog()
    f = np.array(a40.frequencies_mhz, float)
    p = a40.busy_power_w(f, cat.get("A40").idle_power_w)
    assert np.all(np.diff(p) < 0)  # descending clocks, descending power
    cap = a40.cap_frequency_mhz(cat.get("A40").idle_power_w)
    assert 1250 < cap < 1500  # measured: the top ~20 clocks of the A40 profiles run at one speed (fit: 1307 MHz)
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


def test_every_catalog_gpu_has_a_power_model():
    """Energy for every GPU the planner can choose: each catalog entry has a DVFS model (fitted or transferred,
    its source says which), under the board's limit."""
    cat = load_catalog()
    for name in cat.names():
        p = get_power(name)
        assert p.power_limit_w == pytest.approx(cat.get(name).tdp_w) or p.fitted, name


def test_gpu_without_power_model_is_a_clear_error():
    """A user catalog's GPU without a DVFS entry."""
    from hetplan.hardware.catalog import Catalog

    with pytest.raises(HetplanError, match="no DVFS/power model for GPU T4-custom"):
        get_power("T4-custom")
    base = load_catalog()
    cat = Catalog({**base.gpus, "T4-custom": base.get("A100-SXM-80GB").model_copy(
        update={"name": "T4-custom", "aliases": ()})}, base.date)
    # from a plan, the error names the pool field that chose the GPU
    plan = perseus_plan("gpt3-175b", "A100-SXM-80GB")
    pool = plan.stages[0].pool
    pools = list(plan.pools)
    pools[pool] = pools[pool].model_copy(update={"gpu": "T4-custom"})
    plan = plan.model_copy(update={"pools": pools})
    with pytest.raises(HetplanError) as e:
        plan_stage_profile(plan, catalog=cat)
    assert e.value.field == f"plan.pools.{pool}.gpu"


def test_without_tp_collectives():
    """``tp_collectives=False`` takes the estimator's TP collectives out, half from each direction (no
    recomputation), and refuses plans where forward and backward run different collectives."""
    gpu = "A100-SXM-80GB"
    plan = perseus_plan("gpt3-175b", gpu)
    cat, m = load_catalog(), load_model("gpt3-175b")
    fw, bw = stage_times_at_clocks(plan, cat, m, gpu, [1410.0], 1410.0)
    fn, bn = stage_times_at_clocks(plan, cat, m, gpu, [1410.0], 1410.0, tp_collectives=False)
    tp = estimate(plan, cat, m).stages[3].tp_comm_s
    assert tp > 0 and fw[0, 3] - fn[0, 3] == pytest.approx(tp / 2) and bw[0, 3] - bn[0, 3] == pytest.approx(tp / 2)
    full = plan.model_copy(update={"stages": [st.model_copy(update={"recompute": "full"}) for st in plan.stages]})
    with pytest.raises(HetplanError, match="without recomputation"):
        stage_times_at_clocks(full, cat, m, gpu, [1410.0], 1410.0, tp_collectives=False)


def _models():
    from hetplan.hardware.power import _load

    return sorted(p.gpu for p in _load(None).values())


@pytest.mark.parametrize("gpu", _models())
def test_every_model_is_bounded_by_idle_and_tdp_at_every_clock(gpu):
    """idle ≤ P_busy(f_eff) ≤ limit ≤ TDP at every supported clock, under the default limit and any limit a
    board takes (hypothesis draws the limit and a clock between the table's ends)."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from hetplan.hardware.power import board_limited

    spec = load_catalog().get(gpu)
    pw = get_power(gpu)

    floor = float(pw.busy_power_w(min(pw.frequencies_mhz), spec.idle_power_w))  # the board's minimum limit
    assert spec.idle_power_w < floor < spec.tdp_w

    @settings(max_examples=30, deadline=None)
    @given(st.one_of(st.none(), st.floats(floor, spec.tdp_w)),
           st.floats(min(pw.frequencies_mhz), pw.max_frequency_mhz))
    def check(limit, clock):
        board = board_limited(pw, spec.tdp_w, spec.idle_power_w, limit)
        assert board.power_limit_w <= spec.tdp_w * (1 + 1e-9)
        f = np.array(list(board.frequencies_mhz) + [clock])
        p = board.busy_power_w(board.effective_frequency_mhz(f, spec.idle_power_w), spec.idle_power_w)
        assert np.all(p >= spec.idle_power_w) and np.all(p <= board.power_limit_w * (1 + 1e-6))
        assert np.all(np.diff(p[:-1]) <= 1e-9)  # descending clocks never draw more

    check()


def test_board_limit_outside_idle_and_tdp_is_refused():
    from hetplan.hardware.power import board_limited

    pw = get_power("H100-SXM")
    for bad in (800.0, 150.0, float("nan"), "max"):  # 150 W: under what its lowest clock draws
        with pytest.raises(HetplanError) as e:
            board_limited(pw, 700.0, 147.0, bad)
        assert e.value.field == "power_limit_w"
