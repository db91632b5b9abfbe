"""Simulator against the real engine on CPU, same seeded workload; continuous against static batching.

Stated tolerance (simulator vs engine): overall p50 of latency, TTFT and TPOT within 40 %; p90 and p99 at most
60 % above the engine's (from above only: other jobs on the machine stretch the engine's tail, never the
simulator's, so the verdict does not depend on the load); swap counts within 40 %. The simulator's iteration and
swap costs are calibrated on the run (hetplan.serve.validate); the queueing, batching and swapping are its own.
Measured errors: docs/serving.md ("Simulator vs the real engine")."""

import pytest

pytest.importorskip("torch")

from hetplan.serve.config import ModelEntry  # noqa: E402
from hetplan.serve.validate import compare_batching, compare_sim_engine  # noqa: E402
from hetplan.serve.workload import Request  # noqa: E402

P50_TOL, TAIL_TOL = 0.40, 0.60


def test_simulator_matches_engine_percentiles(fixtures):
    ents = [ModelEntry(name=f"m{i}", model=str(fixtures / "small-opt.json"), seed=i) for i in range(4)]
    # paged admission and recompute preemption on, in both: a pool of 64 tokens (4 blocks of 16, one longest
    # sequence) for 4 sequences of up to 20 tokens, and a budget of 64 tokens per iteration
    out = compare_sim_engine(ents, tp=2, capacity_bytes=24_000_000, rates_per_s=[3.0, 1.5, 1.0, 1.0], cv=1.5,
                             duration_s=6.0, seed=0, kv_cache_tokens=64, kv_block_tokens=16, max_batched_tokens=64)
    eng, sim = out["engine"]["all"], out["sim"]["all"]
    print("engine", eng, "sim", sim, "swaps", out["engine_swaps"], out["sim_swaps"], "preemptions",
          out["engine_preemptions"], out["sim_preemptions"])
    assert out["requests"] > 25 and out["engine_swaps"] > 3
    for metric in ("latency", "ttft", "tpot"):
        assert sim[metric]["p50"] == pytest.approx(eng[metric]["p50"], rel=P50_TOL), metric
        for q in ("p90", "p99"):
            assert sim[metric][q] <= (1 + TAIL_TOL) * eng[metric][q], (metric, q)
    assert out["sim_swaps"] == pytest.approx(out["engine_swaps"], rel=0.4)


def test_continuous_batching_beats_static_on_p99(fixtures):
    """One model, 100 requests every 10 ms: every tenth a long answer (60 tokens), the others 4 tokens, so the
    offered load keeps the batch busy. With static batching the requests behind a long one wait for it; with
    continuous batching they join and leave around it. The toy OPT is small enough that an iteration costs about
    the same whatever its rows (as decode on a GPU); on a model whose CPU cost grows with the rows (small-opt) the
    two are close (docs/serving.md). Measured on an idle 2-core machine: p99 latency 1.93 s static, 0.68 s
    continuous (at the former 30 ms spacing with two long answers the p99 was the long answers' own latency,
    0.13 vs 0.14 s, and the comparison measured nothing)."""
    ent = ModelEntry(name="m", model=str(fixtures / "tiny-opt.json"), seed=0)
    reqs = [Request(i, "m", 0.01 * i, 8, 60 if i % 10 == 5 else 4) for i in range(100)]
    out = compare_batching(ent, reqs, max_batch_size=4, kv_cache_len=80)
    st, co = out["static"]["all"], out["continuous"]["all"]
    print("static", st["p99_latency_s"], "continuous", co["p99_latency_s"])
    assert st["completed"] == co["completed"] == len(reqs)
    assert co["p99_latency_s"] < 0.75 * st["p99_latency_s"]  # measured 0.35-0.49 of static
    assert co["p50_ttft_s"] < st["p50_ttft_s"]
