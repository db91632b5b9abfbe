"""Option filtering, quantization and the exponential energy model."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hetplan.energy.options import _fit_exponential, build_options, pareto_mask
from hetplan.energy.profile import InstructionProfile
from hetplan.errors import HetplanError


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 20), st.integers(1, 20)), min_size=1, max_size=12))
def test_pareto_mask_brute_force(points):
    t = np.array([p[0] for p in points], float)
    e = np.array([p[1] for p in points], float)
    mask = pareto_mask(t, e)
    for i in range(len(points)):
        dominated = any(t[j] < t[i] and e[j] < e[i] for j in range(len(points)))
        assert mask[i] == (not dominated)


def _prof(times, energies, freqs=None):
    freqs = freqs or list(range(2000, 2000 - 10 * len(times), -10))
    return InstructionProfile(0, "forward", np.array(freqs), np.array(times, float), np.array(energies, float))


def test_quantize_dedupe_effective_energy():
    # 0.0505 and 0.0509 share quantum 50: keep the larger energy (the slower one)
    p = _prof([0.0505, 0.0509, 0.0615, 0.0805, 0.0755], [30.0, 29.0, 25.0, 24.0, 26.0])
    o = build_options(p, 0.001, 100.0)
    assert o.quant_time.tolist() == [80, 61, 50]  # 75.5 ms (26 J) is dominated by 61.5 ms (25 J)
    assert o.energy_j.tolist() == [24.0, 25.0, 30.0]
    # time is floored like the reference planner: 0.061 s is 60.99.. quanta -> 60
    assert build_options(_prof([0.061, 0.07], [3.0, 2.0]), 0.001, 0.0).quant_time.tolist() == [70, 60]
    np.testing.assert_allclose(o.effective_energy_j, [24 - 8.0, 25 - 6.1, 30 - 5.0])
    assert o.frequency_for(100) == o.frequency_mhz[0]
    assert o.frequency_for(60) == o.frequency_mhz[2]  # slowest option that meets 60 quanta
    assert o.frequency_for(10) == o.frequency_mhz[2]  # faster than anything: the fastest option


def test_fit_matches_data_and_is_convex(gpt_profile):
    for s in (0, 7):
        for inst in ("forward", "backward"):
            o = build_options(gpt_profile.get(s, inst), 0.001, 83.64)
            a, b, _ = o.coefficients
            assert a >= 0 and b < 0
            resid = o.model_energy_j(o.quant_time) - o.effective_energy_j
            assert np.sqrt(np.mean(resid**2)) < 0.5  # J, on values of 12..40 J


def test_fit_recovers_exponential():
    q = np.arange(40, 70, 3)
    y = 900.0 * np.exp(-0.11 * q) + 7.0
    a, b, c = _fit_exponential(q, y)
    np.testing.assert_allclose(a * np.exp(b * q) + c, y, rtol=1e-7)
    assert _fit_exponential(np.array([5]), np.array([3.0]))[0] == 0.0


def test_bad_unit_and_power():
    p = _prof([0.05, 0.06], [3.0, 2.0])
    with pytest.raises(HetplanError, match="unit time"):
        build_options(p, 0.0, 80)
    with pytest.raises(HetplanError, match="idle power"):
        build_options(p, 0.001, -1)
    with pytest.raises(HetplanError, match="less than one unit time"):
        build_options(p, 1.0, 80)
