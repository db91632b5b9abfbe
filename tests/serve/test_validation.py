"""Simulator against the real engine on CPU, same seeded workload.

Stated tolerance: overall p50, p90 and p99 latency of the simulation within 30 % of the engine's, and each
model's p50 within 40 % (CPU timing noise on a shared 2-core machine; measured errors in docs/serving.md are
mostly below 10 %)."""

import pytest

pytest.importorskip("torch")

from hetplan.serve.config import ModelEntry  # noqa: E402
from hetplan.serve.validate import compare_sim_engine  # noqa: E402

OVERALL_TOL, PER_MODEL_P50_TOL = 0.30, 0.40


def test_simulator_matches_engine_percentiles(fixtures):
    ents = [ModelEntry(name=f"m{i}", model=str(fixtures / "small-opt.json"), seed=i) for i in range(4)]
    out = compare_sim_engine(ents, tp=2, capacity_bytes=24_000_000, rates_per_s=[8.0, 4.0, 2.0, 2.0], cv=1.5,
                             duration_s=6.0, seed=0, repeats=2)
    eng, sim = out["engine"], out["sim"]
    print("engine", eng["all"], "sim", sim["all"], "swaps", out["engine_swaps"], out["sim_swaps"])
    assert out["requests"] > 50 and out["engine_swaps"] > 5
    for q in ("p50", "p90", "p99"):
        assert sim["all"][q] == pytest.approx(eng["all"][q], rel=OVERALL_TOL), q
    for name in ("m0", "m1", "m2", "m3"):
        assert sim[name]["p50"] == pytest.approx(eng[name]["p50"], rel=PER_MODEL_P50_TOL), name
    assert out["sim_swaps"] == pytest.approx(out["engine_swaps"], rel=0.3)
