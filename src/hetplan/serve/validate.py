"""Validation of the simulator against the real engine (same seeded workload), and of continuous against static
batching on the engine. Imports torch (through the engine).

:func:`compare_sim_engine`: start an engine, replay a seeded Gamma workload on it open-loop in real time, then
simulate the same requests with costs calibrated on that run — an iteration-time model fitted to the iterations
the engine measured (:meth:`hetplan.serve.exec_model.LinearStepModel.fit`), each simulated iteration scaled by a
ratio drawn from the measured/fitted ratios so the simulation keeps the variance of the real service times
(queueing delay grows with it: Pollaczek–Khinchine), and the median measured swap times with and without
eviction. The queueing, batching and swapping are the simulator's own. Percentiles of latency, TTFT and TPOT are
compared per model and overall.
"""

from __future__ import annotations

import statistics
import time
from typing import Sequence

import numpy as np

from hetplan.serve.config import ModelEntry
from hetplan.serve.engine import Engine, QueueFull
from hetplan.serve.exec_model import LinearStepModel, StepModel
from hetplan.serve.metrics import SLO, Record, makespan_s, percentiles, summarize
from hetplan.serve.policies import make_policy
from hetplan.serve.simulator import SimModel, SimResult, simulate
from hetplan.serve.workload import ModelLoad, Request, attach_prompts, generate

METRICS = ("latency", "ttft", "tpot")


def replay(engine: Engine, requests: Sequence[Request], timeout_s: float = 120.0) -> list[Record]:
    """Submit ``requests`` to ``engine`` at their arrival times (open loop, real time) and wait for all answers.

    Returns one :class:`Record` per request (latency, TTFT and tokens as measured by the engine from submit).
    """
    futs: list = []
    t0 = time.monotonic()
    for r in sorted(requests, key=lambda r: r.arrival_s):
        delay = t0 + r.arrival_s - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        try:
            futs.append((r, engine.submit(r.model, r.prompt, r.max_new_tokens, r.stop_token)))
        except QueueFull:
            futs.append((r, None))
    out = []
    deadline = time.monotonic() + timeout_s
    for r, f in futs:
        if f is None:
            out.append(Record(r.id, r.model, r.arrival_s, None, refused=True))
            continue
        res = f.result(timeout=max(1.0, deadline - time.monotonic()))
        out.append(Record(r.id, r.model, r.arrival_s, r.arrival_s + res.latency_s, False, r.arrival_s + res.ttft_s,
                          len(res.tokens)))
    return out


def seeded_requests(entries: Sequence[ModelEntry], rates_per_s: Sequence[float], *, cv: float, duration_s: float,
                    seed: int, prompt_len: int, new_tokens: tuple[int, int]) -> list[Request]:
    """Gamma arrivals per model; each request's ``max_new_tokens`` drawn uniformly from ``new_tokens`` (inclusive),
    seeded per request."""
    loads = [ModelLoad(m.name, r, cv) for m, r in zip(entries, rates_per_s)]
    reqs = generate(loads, duration_s, seed, prompt_len=prompt_len)
    for r in reqs:
        r.max_new_tokens = int(np.random.default_rng([seed, r.id, 1]).integers(new_tokens[0], new_tokens[1] + 1))
    return reqs


class ResampledStepModel(StepModel):
    """A fitted step model whose every iteration is scaled by a measured/fitted ratio drawn at random (seeded)."""

    def __init__(self, fit: StepModel, ratios: Sequence[float], seed):
        self.fit, self.ratios, self.rng = fit, list(ratios) or [1.0], np.random.default_rng(seed)

    def step_time_s(self, prefill_lens, decode_contexts, prefill_contexts=None) -> float:
        return self.fit.step_time_s(prefill_lens, decode_contexts) * self.ratios[int(self.rng.integers(len(self.ratios)))]


def calibrate_from_logs(engine: Engine) -> dict:
    """Per model, from the engine's logs: the fitted :class:`LinearStepModel`, the measured/fitted ratio of every
    iteration, and the median swap time without and with eviction (s; ``None`` when the run had none)."""
    out = {}
    for name in engine.specs:
        steps = [(p, d, t) for m, p, d, t in engine.exec_log if m == name]
        fit = LinearStepModel.fit(steps) if steps else LinearStepModel()
        ratios = [t / fit.step_time_s(p, d) for p, d, t in steps if fit.step_time_s(p, d) > 0]
        solo = [t for m, ev, t in engine.swap_log if m == name and not ev]
        pair = [t for m, ev, t in engine.swap_log if m == name and ev]
        out[name] = {"step": fit, "ratios": ratios, "worker_bytes": engine.shard_bytes[name],
                     "kv_worker_bytes": engine.kv_bytes[name],
                     "swap_in_s": statistics.median(solo) if solo else None,
                     "swap_pair_s": statistics.median(pair) if pair else None}
    return out


def simulate_calibrated(costs: dict, requests: Sequence[Request], *, capacity_bytes: int, policy: str,
                        max_batch_size: int, max_queue_len: int, batching: str = "continuous",
                        duration_s: float | None = None, sample_seed: int = 0, kv_cache_tokens: int | None = None,
                        kv_block_tokens: int = 16, max_batched_tokens: int | None = None,
                        kv_cache_len: int | None = None, chunked_prefill: bool = False) -> SimResult:
    """Simulate ``requests`` with the costs of :func:`calibrate_from_logs` (and the engine's paged KV pool and token
    budget, when it had them)."""
    all_solo = [c["swap_in_s"] for c in costs.values() if c["swap_in_s"] is not None]
    all_pair = [c["swap_pair_s"] for c in costs.values() if c["swap_pair_s"] is not None]
    solo_default = statistics.median(all_solo) if all_solo else 0.0
    pair_default = statistics.median(all_pair) if all_pair else solo_default
    blocks = None if kv_cache_tokens is None else kv_cache_tokens // kv_block_tokens
    models = [SimModel(n, c["worker_bytes"], ResampledStepModel(c["step"], c["ratios"], [sample_seed, i]),
                       c["kv_worker_bytes"], kv_blocks=blocks) for i, (n, c) in enumerate(costs.items())]

    def cost(load: SimModel, evict) -> float:
        c = costs[load.name]
        if evict:
            return c["swap_pair_s"] if c["swap_pair_s"] is not None else pair_default
        return c["swap_in_s"] if c["swap_in_s"] is not None else solo_default

    return simulate(models, requests, capacity_bytes=capacity_bytes, policy=make_policy(policy), swap_cost=cost,
                    max_batch_size=max_batch_size, max_queue_len=max_queue_len, duration_s=duration_s,
                    batching=batching, block_tokens=kv_block_tokens, max_batched_tokens=max_batched_tokens,
                    chunked_prefill=chunked_prefill, max_seq_tokens=kv_cache_len)


def _pct(records: Sequence[Record], names: Sequence[str]) -> dict:
    """``{model | "all": {metric: {p50, p90, p99}}}`` (s)."""
    out = {}
    for n in list(names) + ["all"]:
        rs = [r for r in records if n == "all" or r.model == n]
        out[n] = {m: percentiles([v for v in (getattr(r, f"{m}_s") for r in rs) if v is not None]) for m in METRICS}
    return out


def _reset(eng: Engine) -> None:
    """Evict every resident model (engine idle) so a replay starts from the simulator's initial state."""
    with eng._lock:
        resident = eng.scheduler.resident()
    if resident:
        eng._sync_swap(None, resident)
    with eng._lock:
        for m in eng.scheduler.models.values():
            m.state = "offloaded"
            m.last_used_s = float("-inf")
            m.arrivals.clear()
        eng.scheduler.swaps = 0
        eng.scheduler.preemptions = 0
        eng._refresh_gauges()
        eng.exec_log.clear()
        eng.swap_log.clear()
    eng._t0 = time.monotonic()


def compare_sim_engine(entries: Sequence[ModelEntry], *, tp: int = 2, pp: int = 1, capacity_bytes: int,
                       rates_per_s: Sequence[float], cv: float = 1.5, duration_s: float = 8.0, seed: int = 0,
                       prompt_len: int = 8, new_tokens: tuple[int, int] = (2, 12), policy: str = "lru",
                       max_batch_size: int = 4, kv_cache_len: int = 64, max_queue_len: int = 1000,
                       sim_replicas: int = 15, kv_cache_tokens: int | None = None, kv_block_tokens: int = 16,
                       max_batched_tokens: int | None = None, chunked_prefill: bool = False) -> dict:
    """Run the same seeded workload on the engine and in the simulator (module docstring).

    Returns:
        ``{"engine": {model: {metric: {p50, p90, p99}}}, "sim": {...} (medians over ``sim_replicas`` sampling
        seeds), "requests": n, "engine_swaps", "sim_swaps", "engine_preemptions", "sim_preemptions",
        "engine_report", "sim_report", "costs"}``; models include ``"all"``, metrics are ``latency``, ``ttft`` and
        ``tpot`` (s). With ``kv_cache_tokens`` both run paged admission and recompute preemption over that pool,
        with ``max_batched_tokens`` both bound each iteration, with ``chunked_prefill`` both split prompts to fit it.
    """
    paging = dict(kv_cache_tokens=kv_cache_tokens, kv_block_tokens=kv_block_tokens,
                  max_batched_tokens=max_batched_tokens, chunked_prefill=chunked_prefill)
    reqs = seeded_requests(entries, rates_per_s, cv=cv, duration_s=duration_s, seed=seed, prompt_len=prompt_len,
                           new_tokens=new_tokens)
    with Engine(entries, tp=tp, pp=pp, capacity_bytes=capacity_bytes, policy=policy, max_batch_size=max_batch_size,
                max_queue_len=max_queue_len, kv_cache_len=kv_cache_len, **paging) as eng:
        attach_prompts(reqs, eng.vocab_sizes, seed)
        for m in entries:  # warm-up: first-touch allocation of every model
            eng.generate(m.name, [1] * prompt_len, 2)
        _reset(eng)
        recs = replay(eng, reqs)
        eng_swaps, eng_pre = eng.scheduler.swaps, eng.scheduler.preemptions
        costs = calibrate_from_logs(eng)
    plain = [Request(r.id, r.model, r.arrival_s, r.prompt_len, r.max_new_tokens) for r in reqs]
    sims = [simulate_calibrated(costs, plain, capacity_bytes=capacity_bytes, policy=policy,
                                max_batch_size=max_batch_size, max_queue_len=max_queue_len, duration_s=duration_s,
                                sample_seed=k, kv_cache_len=kv_cache_len, **paging) for k in range(sim_replicas)]
    names = [m.name for m in entries]
    per = [_pct(s.records, names) for s in sims]
    sim = {n: {m: {q: float(np.median([p[n][m][q] for p in per])) for q in per[0][n][m]} for m in METRICS}
           for n in per[0]}
    slo = {n: SLO(latency_s=1.0) for n in names}
    return {"engine": _pct(recs, names), "sim": sim, "requests": len(reqs), "engine_swaps": eng_swaps,
            "sim_swaps": int(np.median([s.swaps for s in sims])), "costs": costs, "engine_preemptions": eng_pre,
            "sim_preemptions": int(np.median([s.preemptions for s in sims])),
            "engine_report": summarize(recs, slo, duration_s), "sim_report": sims[0].report(slo)}


def compare_batching(entry: ModelEntry, requests: Sequence[Request], *, max_batch_size: int = 4,
                     kv_cache_len: int = 64, seed: int = 0) -> dict:
    """Replay the same requests on one engine (one worker, the model resident) with static and then continuous
    batching; ``{"static": report, "continuous": report}`` (:func:`hetplan.serve.metrics.summarize`, plus the
    ``iterations`` run and their mean ``iteration_s``)."""
    out = {}
    with Engine([entry], capacity_bytes=1 << 40, max_batch_size=max_batch_size, kv_cache_len=kv_cache_len,
                preload=[entry.name], max_queue_len=100_000) as eng:
        attach_prompts(requests, eng.vocab_sizes, seed)
        eng.generate(entry.name, [1, 2], 2)  # warm-up
        for mode in ("static", "continuous"):
            eng.scheduler.batching = mode
            eng.exec_log.clear()
            eng._t0 = time.monotonic()
            records = replay(eng, requests)  # rates over the makespan: over the last arrival, a burst's was 0 s
            out[mode] = summarize(records, {entry.name: SLO()}, makespan_s(records))
            out[mode]["iterations"] = len(eng.exec_log)
            out[mode]["iteration_s"] = float(np.mean([e[-1] for e in eng.exec_log]))
    return out
