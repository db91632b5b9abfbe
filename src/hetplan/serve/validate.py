"""Validation of the simulator against the real engine (same seeded workload) and of the swap model against
Computron's published load times. Imports torch (through the engine).

:func:`compare_sim_engine`: start an engine, profile it (:meth:`hetplan.serve.engine.Engine.profile`: swap and
batch times), replay a seeded Gamma workload on it open-loop in real time, simulate the same requests with the
profiled costs (:class:`hetplan.serve.exec_model.TableExecModel`, measured swap times), and compare the latency
percentiles per model and overall.
"""

from __future__ import annotations

import time
from typing import Sequence

import numpy as np

from hetplan.serve.config import ModelEntry
from hetplan.serve.engine import Engine, QueueFull
from hetplan.serve.exec_model import EmpiricalExecModel, TableExecModel
from hetplan.serve.metrics import Record, percentiles, summarize
from hetplan.serve.policies import make_policy
from hetplan.serve.simulator import SimModel, SimResult, simulate
from hetplan.serve.workload import ModelLoad, Request, attach_prompts, generate


def replay(engine: Engine, requests: Sequence[Request], timeout_s: float = 120.0) -> list[Record]:
    """Submit ``requests`` to ``engine`` at their arrival times (open loop, real time) and wait for all answers.

    Returns one :class:`Record` per request (latency measured by the engine from submit to answer).
    """
    futs: list = []
    t0 = time.monotonic()
    for r in sorted(requests, key=lambda r: r.arrival_s):
        delay = t0 + r.arrival_s - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        try:
            futs.append((r, engine.submit(r.model, r.prompt, r.max_new_tokens)))
        except QueueFull:
            futs.append((r, None))
    out = []
    deadline = time.monotonic() + timeout_s
    for r, f in futs:
        if f is None:
            out.append(Record(r.id, r.model, r.arrival_s, None, refused=True))
            continue
        res = f.result(timeout=max(1.0, deadline - time.monotonic()))
        out.append(Record(r.id, r.model, r.arrival_s, r.arrival_s + res.latency_s))
    return out


def simulate_profiled(profile: dict, requests: Sequence[Request], *, capacity_bytes: int, policy: str,
                      max_batch_size: int, max_queue_len: int, preload: Sequence[str] = (),
                      duration_s: float | None = None, sample_seed: int = 0) -> SimResult:
    """Simulate ``requests`` with the costs measured by :meth:`Engine.profile` (swap with eviction: the measured
    ``swap_pair_s`` of the loaded model; without: its ``swap_in_s``)."""
    models = []
    for i, (n, p) in enumerate(profile.items()):
        em = TableExecModel(p["exec_s"])
        if p.get("exec_samples_s"):
            em = EmpiricalExecModel(p["exec_samples_s"], em, seed=[sample_seed, i])
        models.append(SimModel(n, p["worker_bytes"], em, p["swap_in_s"], p["swap_out_s"]))

    def cost(load: SimModel, evict) -> float:
        p = profile[load.name]
        if not evict:
            return p["swap_in_s"]
        return max(p.get("swap_pair_s", p["swap_in_s"]), sum(profile[v.name]["swap_out_s"] for v in evict))

    return simulate(models, requests, capacity_bytes=capacity_bytes, policy=make_policy(policy), swap_cost=cost,
                    max_batch_size=max_batch_size, max_queue_len=max_queue_len, preload=preload, duration_s=duration_s)


def compare_sim_engine(entries: Sequence[ModelEntry], *, tp: int = 2, pp: int = 1, capacity_bytes: int,
                       rates_per_s: Sequence[float], cv: float = 1.5, duration_s: float = 8.0, seed: int = 0,
                       prompt_len: int = 8, max_new_tokens: int = 2, policy: str = "lru", max_batch_size: int = 4,
                       max_queue_len: int = 1000, repeats: int = 3, sim_replicas: int = 15) -> dict:
    """Run the same seeded workload on the engine and in the simulator; percentiles (s) of both.

    Returns:
        ``{"engine": {model: {p50, p90, p99}}, "sim": {...}, "profile": ..., "engine_report": ...,
        "sim_report": ..., "requests": n}`` (model ``"all"`` included).
    """
    loads = [ModelLoad(m.name, r, cv) for m, r in zip(entries, rates_per_s)]
    reqs = generate(loads, duration_s, seed, prompt_len=prompt_len, max_new_tokens=max_new_tokens)
    batch_sizes = sorted({1, 2, max(1, max_batch_size // 2), max_batch_size})
    with Engine(entries, tp=tp, pp=pp, capacity_bytes=capacity_bytes, policy=policy,
                max_batch_size=max_batch_size, max_queue_len=max_queue_len) as eng:
        attach_prompts(reqs, eng.vocab_sizes, seed)
        prof = eng.profile(batch_sizes, prompt_len, max_new_tokens, repeats=repeats)
        # warm-up: one request per model (first-touch allocation), then reset to all offloaded
        for m in entries:
            eng.generate(m.name, [1] * prompt_len, max_new_tokens)
        _reset(eng)
        eng.exec_log.clear()
        eng.swap_log.clear()
        recs = replay(eng, reqs)
        eng_swaps = eng.scheduler.swaps
        observed = calibrate_from_logs(prof, eng.exec_log, eng.swap_log)
    sim_profiled = simulate_profiled(prof, [Request(r.id, r.model, r.arrival_s, r.prompt_len, r.max_new_tokens) for r in reqs],
                                     capacity_bytes=capacity_bytes, policy=policy, max_batch_size=max_batch_size,
                                     max_queue_len=max_queue_len, duration_s=duration_s)
    plain = [Request(r.id, r.model, r.arrival_s, r.prompt_len, r.max_new_tokens) for r in reqs]
    sims = [simulate_profiled(observed, plain, capacity_bytes=capacity_bytes, policy=policy,
                              max_batch_size=max_batch_size, max_queue_len=max_queue_len, duration_s=duration_s,
                              sample_seed=k) for k in range(sim_replicas)]
    sim = sims[0]
    names = [m.name for m in entries]

    def pct(records) -> dict:
        out = {n: percentiles([r.latency_s for r in records if r.model == n and r.latency_s is not None]) for n in names}
        out["all"] = percentiles([r.latency_s for r in records if r.latency_s is not None])
        return out

    def median_pct(results) -> dict:
        per = [pct(r.records) for r in results]
        return {n: {q: float(np.median([p[n][q] for p in per])) for q in per[0][n]} for n in per[0]}

    slo = {n: 1.0 for n in names}
    return {"engine": pct(recs), "sim": median_pct(sims), "sim_profiled": pct(sim_profiled.records),
            "profile": prof, "observed_costs": observed, "requests": len(reqs),
            "engine_swaps": eng_swaps, "sim_swaps": sim.swaps,
            "engine_report": summarize(recs, slo, duration_s), "sim_report": sim.report(slo)}


def calibrate_from_logs(profile: dict, exec_log, swap_log) -> dict:
    """Costs observed during a run: per model, the batch times per batch size (sampled by the simulator) and the
    median swap time with and without eviction (falling back to ``profile`` for what the run did not show). A shared, noisy CPU
    machine makes a separate profiling pass unrepresentative of the run; this calibrates the simulator's cost
    models on the run while its queueing, batching and swapping decisions stay its own."""
    import statistics

    out = {}
    for name, p in profile.items():
        q = dict(p)
        by_b: dict[int, list[float]] = {}
        for m, b, t in exec_log:
            if m == name:
                by_b.setdefault(b, []).append(t)
        if by_b:
            q["exec_s"] = {**p["exec_s"], **{b: statistics.median(v) for b, v in by_b.items()}}
            q["exec_samples_s"] = by_b
        solo = [t for m, ev, t in swap_log if m == name and not ev]
        pair = [t for m, ev, t in swap_log if m == name and ev]
        if solo:
            q["swap_in_s"] = statistics.median(solo)
        if pair:
            q["swap_pair_s"] = statistics.median(pair)
        out[name] = q
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
        eng._refresh_gauges()
    eng._t0 = time.monotonic()
