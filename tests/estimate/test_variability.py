"""A stage runs at the pace of its slowest GPU (hetplan.estimate.variability): the expected maximum of n normal
variables against tables and brute force, the factor on a stage's compute, and its fit on the weak-scaling series
(held-out series)."""

import math

import numpy as np
import pytest

from hetplan.calibration import modern, modern_fit
from hetplan.calibration.validation import gpt_model, megatron_plan
from hetplan.estimate.estimator import estimate, estimate_detailed
from hetplan.estimate.variability import REFERENCE_GPUS, expected_max_normal, slowest_gpu_factor
from hetplan.hardware.catalog import SPEED_VARIABILITY, Catalog, load_catalog


def test_expected_maximum_of_normals_matches_tables_and_sampling():
    # closed forms (n = 1, 2, 3) and Harter's tables ("Expected values of normal order statistics", Biometrika
    # 1961): n = 8 -> 1.42360, n = 100 -> 2.50759
    got = expected_max_normal(np.array([1, 2, 3, 8, 100]))
    assert got == pytest.approx([0.0, 1 / math.sqrt(math.pi), 1.5 / math.sqrt(math.pi), 1.42360, 2.50759],
                                abs=1e-5)
    rng = np.random.default_rng(0)
    sampled = rng.standard_normal((20_000, 512)).max(axis=1).mean()
    assert float(expected_max_normal(512)) == pytest.approx(sampled, abs=0.01)
    assert np.all(np.diff(expected_max_normal(np.arange(1, 5000))) > 0)  # more GPUs, a slower slowest


def test_factor_charges_only_beyond_one_node():
    n = np.array([1, 4, REFERENCE_GPUS, 16, 2048])
    f = slowest_gpu_factor(n, 0.027)
    assert list(f[:3]) == [1.0, 1.0, 1.0]
    gap = float(expected_max_normal(2048) - expected_max_normal(REFERENCE_GPUS))
    assert f[4] == pytest.approx(1 + 0.027 * gap) and gap == pytest.approx(2.018, abs=1e-3)
    assert 1.0 < f[3] < f[4]
    assert np.all(slowest_gpu_factor(n, 0.0) == 1.0)


def _catalog(sigma: float) -> Catalog:
    c = load_catalog()
    return Catalog({k: g.model_copy(update={"speed_variability": sigma}) for k, g in c.gpus.items()}, c.date)


def test_a_stage_of_many_gpus_computes_at_the_pace_of_the_slowest():
    m = gpt_model(24, 2048, 16, 1024)
    small = megatron_plan(m, gpu="A100-SXM-80GB", tp=8, pp=2, dp=1, mbs=1, gbs=64, recompute="none", seq=1024,
                         inter_node_bandwidth_bytes_per_s=100e9)
    big = megatron_plan(m, gpu="A100-SXM-80GB", tp=8, pp=2, dp=64, mbs=1, gbs=64 * 64, recompute="none",
                        seq=1024, inter_node_bandwidth_bytes_per_s=100e9)
    for plan, n in ((small, 8), (big, 512)):
        _, _, on, _ = estimate_detailed(plan, catalog=_catalog(SPEED_VARIABILITY), model=m)
        _, _, off, _ = estimate_detailed(plan, catalog=_catalog(0.0), model=m)
        for a, b in zip(on, off):  # per stage: compute scaled, the exposed DP collectives not
            assert a.forward_s == pytest.approx(b.forward_s * float(slowest_gpu_factor(n, SPEED_VARIABILITY)))
            assert a.backward_s == pytest.approx(b.backward_s * float(slowest_gpu_factor(n, SPEED_VARIABILITY)))
            assert a.dp_exposed_s == pytest.approx(b.dp_exposed_s)
    slow = estimate(big, catalog=_catalog(SPEED_VARIABILITY), model=m).iteration_time_s
    assert slow > estimate(big, catalog=_catalog(0.0), model=m).iteration_time_s


def test_fit_on_weak_scaling_series_predicts_the_held_out_series():
    cases = [c for cs, _ in modern.load_sets(modern.SET_NAMES).values() for c in cs]
    series = modern_fit.weak_scaling_series(cases)
    for cs in series.values():  # one configuration on more and more GPUs, the batch per replica fixed
        assert len(cs) >= 3 and all(a.info["n"] < b.info["n"] for a, b in zip(cs, cs[1:]))
        assert len({(c.info["tp"], c.info["pp"], c.info["gbs"] / c.info["dp"]) for c in cs}) == 1
    fit = modern_fit.fit_speed_variability(cases)
    assert fit is not None and len(fit.series_calibration) >= 20 and len(fit.series_held_out) >= 20
    assert not set(fit.series_calibration) & set(fit.series_held_out)
    assert fit.value == pytest.approx(SPEED_VARIABILITY, abs=2e-3)  # the catalog value is this fit
    assert fit.held_out_after < 0.8 * fit.held_out_before
