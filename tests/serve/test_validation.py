"""Simulator against the real engine on CPU, same seeded workload; continuous against static batching.

Stated tolerance (simulator vs engine): overall p50 of latency, TTFT and TPOT within 40 %; p90 and p99 at most
60 % above the engine's (from above only: other jobs on the machine stretch the engine's tail, never the
simulator's, so the verdict does not depend on the load), except TPOT's p99: over the ~30 requests of the run it is
the one slowest request's, decided by whether a recompute preemption happened to hit one (simulator 0.10-0.12 s in
every run; the engine 0.04-0.15 s across seeded repeats on this machine), so TPOT's tail is checked at p90; swap
counts within 40 %. The simulator's iteration and
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
    # paged admission, recompute preemption and chunked prefill on, in both: a pool of 64 tokens (4 blocks of 16,
    # one longest sequence) for 4 sequences of up to 20 tokens, and 10 tokens per iteration (8-token prompts are
    # split when decodes take part of it)
    out = compare_sim_engine(ents, tp=2, capacity_bytes=24_000_000, rates_per_s=[3.0, 1.5, 1.0, 1.0], cv=1.5,
                             duration_s=6.0, seed=0, kv_cache_tokens=64, kv_block_tokens=16, max_batched_tokens=10,
                             chunked_prefill=True)
    eng, sim = out["engine"]["all"], out["sim"]["all"]
    print("engine", eng, "sim", sim, "swaps", out["engine_swaps"], out["sim_swaps"], "preemptions",
          out["engine_preemptions"], out["sim_preemptions"])
    assert out["requests"] > 25 and out["engine_swaps"] > 3
    for metric in ("latency", "ttft", "tpot"):
        assert sim[metric]["p50"] == pytest.approx(eng[metric]["p50"], rel=P50_TOL), metric
        for q in ("p90", "p99") if metric != "tpot" else ("p90",):
            assert sim[metric][q] <= (1 + TAIL_TOL) * eng[metric][q], (metric, q)
    assert out["sim_swaps"] == pytest.approx(out["engine_swaps"], rel=0.4)


def test_continuous_batching_beats_static(fixtures):
    """One model, 100 requests at once: every tenth a long answer (60 tokens), the others 4 tokens. With static
    batching each batch of 4 runs until its longest request ends (10 batches hold a long one: about
    10 x 60 + 15 x 4 = 660 iterations); with continuous batching short requests join and leave around the long
    ones (about (10 x 60 + 90 x 4) / 4 = 240 iterations), whatever one iteration costs on the machine. Asserted:
    the iteration counts, and mean latency and median TTFT, which follow them; the p99 (about the makespan in a
    burst) moves with other jobs' load (measured 2.81 vs 1.16 s, and once 2.20 vs 2.39 s under a load spike).
    Until issue #25 the requests came every 10 ms; once an iteration of the toy OPT took ~1-2 ms on this machine
    the batch was rarely busy and both tails were alike (0.06-0.35 s, on main too)."""
    ent = ModelEntry(name="m", model=str(fixtures / "tiny-opt.json"), seed=0)
    reqs = [Request(i, "m", 0.0, 8, 60 if i % 10 == 5 else 4) for i in range(100)]
    out = compare_batching(ent, reqs, max_batch_size=4, kv_cache_len=80)
    st, co = out["static"]["all"], out["continuous"]["all"]
    print("static", st["mean_latency_s"], st["p99_latency_s"], out["static"]["iterations"], "continuous",
          co["mean_latency_s"], co["p99_latency_s"], out["continuous"]["iterations"])
    assert st["completed"] == co["completed"] == len(reqs)
    # rates over the makespan: over the last arrival (0 s in a burst) every throughput read 0
    for mode in ("static", "continuous"):
        a = out[mode]["all"]
        assert out[mode]["duration_s"] > 0 and a["throughput_per_s"] == pytest.approx(len(reqs) / out[mode]["duration_s"])
    assert 600 <= out["static"]["iterations"] <= 700 and out["continuous"]["iterations"] < 0.5 * 600
    assert co["mean_latency_s"] < 0.75 * st["mean_latency_s"]
    assert co["p50_ttft_s"] < st["p50_ttft_s"]
