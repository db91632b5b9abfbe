"""Simulate a ``WORKLOAD.toml``, and plan capacity: the cheapest mix of GPU types, counts and TP x PP that meets
the SLOs.

:func:`hetplan.serve.replica.simulate_workload` builds the simulator's inputs from a workload file — requests
(Gamma/Zipf or a trace), weight and KV-cache bytes per worker (:mod:`hetplan.estimate.inference`), the
iteration-time model of the cost model on the catalog GPU (:class:`hetplan.serve.exec_model.EstimatedStepModel`)
and the swap model with the GPU's host link — and runs :func:`hetplan.serve.simulator.simulate`.

:func:`plan_capacity` is Mélange's formulation (Griggs et al. 2024, "Mélange: Cost Efficient Large Language Model
Serving by Exploiting GPU Heterogeneity", Sec. 5) with the simulator as its profiler:

1. for every model m and every replica configuration k = (GPU type, TP, PP) whose shards (weights + KV cache)
   fit ``memory_fraction`` of the GPU, the largest arrival rate r_mk one replica sustains while meeting the
   model's SLOs for ``target_attainment`` of its requests — a bisection on the rate, each point a simulation of
   the model's request shape and burstiness (CV) on that replica;
2. an integer program (``scipy.optimize.milp``, HiGHS): replicas x_mk ≥ 0 minimising Σ x_mk · TP·PP · price of
   the GPU, such that Σ_k x_mk · r_mk ≥ λ_m for every model and at most ``max_gpus`` GPUs of each type;
3. the simulator checks the answer: each model's requests are split over its replicas in proportion to r_mk
   (seeded) and every replica is simulated; a model below target gets its r_mk lowered by 10 % and the program is
   solved again (at most three times).

Besides dedicated replicas (Mélange's setting), ``capacity.share_gpus`` (default on) adds *shared groups*
(Computron's setting): a set of two or more models on one replica configuration, swapping their weights
(:func:`simulate_shared`, the cluster ``hetplan simulate`` runs), a binary column of the program that serves its
members' whole loads at the group's price; a group enters the program when every member fits alone and the
members' loads fit within their rate bounds there, and is simulated with the members' own requests when the
program chooses it (kept only if every member meets the target). Request-size buckets (Mélange's second
dimension) are not split: each model's requests share one shape.

This module does not import torch.
"""

from __future__ import annotations

import itertools

import numpy as np

from hetplan.errors import HetplanError, InfeasibleError
from hetplan.hardware.catalog import Catalog, GPUSpec, load_catalog
from hetplan.hardware.engines import EngineSpec, load_engines
from hetplan.serve.config import WorkloadFile
from hetplan.serve.policies import make_policy
from hetplan.serve.replica import (KVSettings, Stack, check_context, check_stack, energy_summary, kv_settings,
                                   max_running, scheduler_kwargs, serving_energy, sim_model, slos,
                                   step_model, workload_rates, workload_requests, workload_swap_model)
from hetplan.serve.simulator import SimResult, simulate, swap_cost_fn
from hetplan.serve.workload import ModelLoad, Request, generate, trace_window_s


#: Bisection steps of the largest sustainable rate of one replica (relative resolution 2^-6 of the bracket).
RATE_STEPS = 6
#: Requests simulated per rate probe.
PROBE_REQUESTS = 200


def _fits(spec, gpu: GPUSpec, tp: int, pp: int, wf: WorkloadFile, stack: Stack = Stack()) -> tuple[bool, str, float]:
    """``(fits, why not, how far)``: how far is the candidate's largest per-GPU footprint over the memory it may
    use (0 when it fits, inf where it cannot run at all), so that a refusal quotes the candidates nearest to
    fitting (DESIGN.md: "the smallest per-GPU footprint versus the largest GPU memory"), not the first two reasons
    in alphabetical order (the whole model on one GPU, twice, without naming the GPU)."""
    try:
        gpu.peak_flops_per_s(wf.cluster.dtype)
        check_stack(stack, gpu, wf.cluster.dtype, "capacity")
        cap = int(gpu.memory_bytes * wf.cluster.memory_fraction)
        m = sim_model("", spec, gpu, tp, pp, wf.cluster.dtype, wf, cap, 1, stack)
    except HetplanError as exc:
        return False, exc.message, float("inf")
    need = max(m.bytes, max(m.worker_bytes))
    if need > cap:
        return False, f"largest shard {need / 1e9:.2f} GB > {cap / 1e9:.2f} GB usable per GPU", need / cap
    block = kv_settings(wf, stack).block_tokens
    if m.kv_blocks is not None and m.kv_blocks * block < wf.scheduler.kv_cache_len:
        return False, (f"KV cache of {m.kv_blocks * block:,} tokens (what the weights leave) "
                       f"< one sequence of kv_cache_len = {wf.scheduler.kv_cache_len:,}"), 1.0
    return True, "", 0.0


def _label(config: tuple[GPUSpec, int, int, Stack]) -> str:
    """``A100-SXM-80GB TP 2 x PP 1`` (and its stack where it names an engine): one candidate replica."""
    g, tp, pp, st = config
    return f"{g.name} TP {tp} x PP {pp}" + (f" {st.label}" if st.engine is not None else "")


def attains(report: dict, target: float) -> bool:
    """Whether one model's simulated ``report`` (:func:`hetplan.serve.metrics` entry) meets ``target`` attainment:
    a model that received no request (``slo_attainment`` None) has nothing to miss, so it does."""
    return report["slo_attainment"] is None or report["slo_attainment"] >= target


def _attainment(wf: WorkloadFile, entry, spec, gpu: GPUSpec, tp: int, pp: int, reqs: list[Request],
                duration_s: float, stack: Stack = Stack()) -> float:
    s, c = wf.scheduler, wf.cluster
    cap = int(gpu.memory_bytes * c.memory_fraction)
    m = sim_model(entry.name, spec, gpu, tp, pp, c.dtype, wf, cap, 1, stack)
    objectives = slos(wf)
    allowed = int((1.0 - wf.capacity.target_attainment) * len(reqs))  # more misses than this fail the probe
    res = simulate([m], reqs, capacity_bytes=cap, policy=make_policy(s.policy),
                   swap_cost=lambda load, evict: 0.0, preload=[entry.name], duration_s=duration_s,
                   miss_limit=(objectives, allowed), **scheduler_kwargs(wf, stack, gpu))
    if res.aborted:
        return 0.0
    return res.report(objectives)["models"][entry.name]["slo_attainment"]


def _mean_shape(wf: WorkloadFile, lengths: list[tuple[int, int]] | None) -> tuple[int, int]:
    """Mean (prompt, new tokens) of the probe requests, rounded, at least 1."""
    if lengths:
        means = (sum(p for p, _ in lengths) / len(lengths), sum(n for _, n in lengths) / len(lengths))
    else:
        means = wf.workload.mean_lengths()
    prompt, new = (max(1, round(x)) for x in means)
    return prompt, new


def rate_upper_bound(wf: WorkloadFile, spec, gpu: GPUSpec, tp: int, pp: int, stack: Stack = Stack(),
                     lengths: list[tuple[int, int]] | None = None) -> float:
    """The top of :func:`max_rate_per_s`'s bracket: 1.2 x the requests/s of full batches (``max_running``
    sequences of the mean shape, one prefill then decode steps) back to back. :func:`max_rate_per_s` never
    returns more (its bisection stays below the top), so a candidate whose bound cannot make the integer program
    cheaper need not be simulated (:func:`plan_capacity`). A few cost-model calls, no simulation."""
    step = step_model(spec, gpu, tp, pp, wf.cluster.dtype, stack)
    b = max_running(wf, stack, gpu)
    prompt, new = _mean_shape(wf, lengths)
    busy = step.step_time_s([prompt] * b, []) + sum(
        step.step_time_s([], [prompt + i] * b) for i in range(1, new))
    return 1.2 * b / busy


def max_rate_per_s(wf: WorkloadFile, entry, spec, gpu: GPUSpec, tp: int, pp: int, stack: Stack = Stack(),
                   lengths: list[tuple[int, int]] | None = None) -> float:
    """Largest arrival rate (requests/s) one replica sustains at ``target_attainment`` (0 when even a lone
    request misses its SLO): a geometric bisection below :func:`rate_upper_bound`; probe requests draw their
    lengths as the workload's do, or take ``lengths`` (``(prompt, new tokens)`` of the model's trace requests, in
    order, wrapping around)."""
    w = wf.workload
    cv = entry.cv or w.cv
    hi = rate_upper_bound(wf, spec, gpu, tp, pp, stack, lengths)
    target = wf.capacity.target_attainment

    def ok(rate: float) -> bool:
        dur = PROBE_REQUESTS / rate
        reqs = generate([ModelLoad(entry.name, rate, cv)], dur, w.seed, prompt_len=w.prompt_len,
                        max_new_tokens=w.max_new_tokens)
        if lengths:
            for i, r in enumerate(reqs):
                r.prompt_len, r.max_new_tokens = lengths[i % len(lengths)]
        else:
            w.assign_lengths(reqs)
        return bool(reqs) and _attainment(wf, entry, spec, gpu, tp, pp, reqs, dur, stack) >= target

    if not ok(hi / 2 ** RATE_STEPS):
        return 0.0
    lo = hi / 2 ** RATE_STEPS
    for _ in range(RATE_STEPS):
        mid = (lo * hi) ** 0.5  # geometric: the bracket spans two orders of magnitude
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return lo


def _configs(gpus: list[GPUSpec], max_gpus: int, stacks: list[Stack]) -> list[tuple[GPUSpec, int, int, Stack]]:
    sizes = [n for n in (1, 2, 4, 8, 16, 32) if n <= max_gpus]
    return [(g, tp, n // tp, st) for g in gpus for n in sizes for tp in sizes if n % tp == 0 for st in stacks]


def candidate_stacks(wf: WorkloadFile, engines: list[str] | None = None) -> list[Stack]:
    """The engine x weight-dtype pairs a capacity search chooses among: ``engines`` (``--export``'s engine),
    else ``capacity.engines``, else ``cluster.engine`` (else none: the training cost model), times
    ``capacity.quantizations`` (``"none"``: unquantized), else ``cluster.quantization``.

    Raises:
        HetplanError: an unknown engine or release (field ``capacity.engines``); quantized weights without an engine
            (``capacity.quantizations``: a serving engine's kernels price them; every candidate was refused for it,
            and the search then said to allow more GPUs).
    """
    c, cap = wf.cluster, wf.capacity
    cat = load_engines()
    names = engines or cap.engines or ([c.engine] if c.engine else [])
    field = "--export" if engines else "capacity.engines"
    specs: list[EngineSpec | None] = [cat.get(n, field=field) for n in names] or [None]
    quants = [None if q == "none" else q for q in cap.quantizations] or [c.quantization]
    narrow = [q for q in quants if q is not None]
    if not names and narrow:
        where = "capacity.quantizations" if cap.quantizations else "cluster.quantization"
        raise HetplanError(f"{narrow[0]} weights are priced by a serving engine's kernels, and no engine is named",
                           field=where, fix='set capacity.engines (e.g. ["vllm"]) or cluster.engine, or drop '
                                            f'{narrow[0]} from {where}')
    return [Stack(e, q) for e in specs for q in quants]


def _solve(rates: np.ndarray, prices: np.ndarray, loads: np.ndarray, gpu_of: list[str], gpus_per: np.ndarray,
           max_gpus: int, groups: list[tuple[list[int], float, str, int]] | None = None):
    """Integer program of the module docstring; ``rates`` is models x configs. ``groups``: shared replica groups
    ``(member models, price, GPU type, GPUs)``, each used at most once and then serving its members' whole load
    (``y_j`` binary: Σ_k x_mk r_mk + λ_m Σ_{j ∋ m} y_j >= λ_m), a model in one chosen group at most. Returns replicas (models x configs), or ``None``;
    with ``groups`` the pair (replicas, groups used)."""
    from scipy.optimize import Bounds, LinearConstraint, milp

    groups = groups or []
    n_m, n_k = rates.shape
    n_g = len(groups)
    cost = np.concatenate([np.tile(prices, n_m), [g[1] for g in groups]])
    cover = np.zeros((n_m, n_m * n_k + n_g))
    for m in range(n_m):
        cover[m, m * n_k:(m + 1) * n_k] = rates[m]
    for j, (members, _, _, _) in enumerate(groups):
        for m in members:
            cover[m, n_m * n_k + j] = loads[m]
    types = sorted(set(gpu_of) | {g[2] for g in groups})
    limit = np.zeros((len(types), n_m * n_k + n_g))
    for i, t in enumerate(types):
        limit[i, :n_m * n_k] = np.tile([gpus_per[k] if gpu_of[k] == t else 0 for k in range(n_k)], n_m)
        limit[i, n_m * n_k:] = [g[3] if g[2] == t else 0 for g in groups]
    cons = [LinearConstraint(cover, lb=loads, ub=np.inf), LinearConstraint(limit, lb=0, ub=max_gpus)]
    if n_g:  # a model is in one group at most (its requests go to one group; the group was simulated with all)
        member = np.zeros((n_m, n_m * n_k + n_g))
        for j, (members, _, _, _) in enumerate(groups):
            member[members, n_m * n_k + j] = 1
        cons.append(LinearConstraint(member, lb=0, ub=1))
    ub = np.concatenate([np.where(rates.reshape(-1) > 0, max_gpus, 0), np.ones(n_g)])
    res = milp(cost, constraints=cons, integrality=np.ones(n_m * n_k + n_g), bounds=Bounds(0, ub))
    if res.x is None:
        return None
    x = np.rint(res.x).astype(int)
    replicas = x[:n_m * n_k].reshape(n_m, n_k)
    return (replicas, [j for j in range(n_g) if x[n_m * n_k + j]]) if n_g else replicas


#: Most models whose subsets (of two or more) are tried as shared replica groups: 2^6 - 7 = 57 sets.
MAX_SHARED_MODELS = 6


def _shared_fits(wf: WorkloadFile, spec, n_models: int, cfg) -> bool:
    """A model's weights and KV pool (``max_batch_size`` x ``kv_cache_len`` when ``n_models`` share the workers,
    :func:`kv_pool_tokens`) fit one worker's ``memory_fraction`` on its own (the least a swapping group needs)."""
    g, tp, pp, st = cfg
    cap = int(g.memory_bytes * wf.cluster.memory_fraction)
    try:
        m = sim_model("", spec, g, tp, pp, wf.cluster.dtype, wf, cap, n_models, st)
    except HetplanError:
        return False
    return max(m.bytes, max(m.worker_bytes)) <= cap


def _shared_summary(wf: WorkloadFile, names: list[str], res: SimResult, gpu: str, tp: int, pp: int,
                    duration_s: float) -> dict[str, dict]:
    """Per member of a shared group, :func:`_check`'s summary: attainment, percentiles and its share of the
    group's energy (by output tokens; the group's GPUs counted once, on the first member)."""
    from hetplan.serve.metrics import percentiles

    e = serving_energy(res, gpu, tp, pp, max(duration_s, res.end_s))
    rep = res.report(slos(wf))["models"]
    out = {}
    for i, n in enumerate(names):
        recs = [r for r in res.records if r.model == n]
        tok = sum(r.output_tokens for r in recs)
        part = {"energy_j": e["energy_j"] * tok / max(e["output_tokens"], 1), "requests": rep[n]["completed"],
                "output_tokens": tok, "num_gpus": e["num_gpus"] if i == 0 else 0, "energy_source": e["energy_source"]}
        out[n] = {"slo_attainment": rep[n]["slo_attainment"], "requests": rep[n]["requests"],
                  "energy": energy_summary([part]), "shared_with": [x for x in names if x != n],
                  **{f"{q}_{mt}_s": v for mt in ("latency", "ttft", "tpot")
                     for q, v in percentiles([getattr(r, f"{mt}_s") for r in recs
                                              if getattr(r, f"{mt}_s") is not None]).items()}}
    return out


def simulate_shared(wf: WorkloadFile, entries, specs, members: list[int], cfg, reqs: list[Request],
                    duration_s: float, early_stop: bool = True) -> SimResult:
    """Simulate the members' requests on one replica group ``cfg`` = (GPU, TP, PP, stack) they share by swapping
    (Computron's setting, :func:`simulate_workload`'s cluster): each resident model holds its weights and a KV
    pool, swaps priced by :class:`~hetplan.serve.swap_model.SwapModel` with the GPU's host link and ``[swap]``.
    ``early_stop``: stop once more requests missed than ``target_attainment`` allows over all members (then some
    member is below it: Σ_m (1 − t)·N_m = (1 − t)·N)."""
    g, tp, pp, st = cfg
    s, c = wf.scheduler, wf.cluster
    cap = int(g.memory_bytes * c.memory_fraction)
    names = [entries[m].name for m in members]
    models = [sim_model(entries[m].name, specs[m], g, tp, pp, c.dtype, wf, cap, len(members), st) for m in members]
    swap = workload_swap_model(wf, g)
    share = [Request(r.id, r.model, r.arrival_s, r.prompt_len, r.max_new_tokens) for r in reqs if r.model in names]
    objectives = slos(wf)
    allowed = int((1.0 - wf.capacity.target_attainment) * len(share))
    return simulate(models, share, capacity_bytes=cap, policy=make_policy(s.policy, rate_window_s=s.rate_window_s),
                    swap_cost=swap_cost_fn(swap, s.write_back), preload=[p for p in s.preload if p in names],
                    duration_s=duration_s, miss_limit=(objectives, allowed) if early_stop else None,
                    **scheduler_kwargs(wf, st, g))


def _check(wf: WorkloadFile, entries, specs, configs, replicas: np.ndarray, rates: np.ndarray,
           reqs: list[Request], duration_s: float) -> dict[str, dict]:
    """Simulate every replica of the mix with its share of its model's requests; per-model attainment and
    percentiles (s)."""
    from hetplan.serve.metrics import percentiles

    out = {}
    for m, (entry, spec) in enumerate(zip(entries, specs)):
        mine = [r for r in reqs if r.model == entry.name]
        slots = [(k, j) for k in range(len(configs)) for j in range(replicas[m, k])]
        if not slots:  # served by a shared group (simulated when it was chosen)
            continue
        weights = np.array([rates[m, k] for k, _ in slots])
        rng = np.random.default_rng([wf.workload.seed, m, 7])
        pick = rng.choice(len(slots), size=len(mine), p=weights / weights.sum()) if mine else []
        ok = total = 0
        recs = []
        energy = []
        for i, (k, _) in enumerate(slots):
            share = [Request(r.id, r.model, r.arrival_s, r.prompt_len, r.max_new_tokens)
                     for r, p in zip(mine, pick) if p == i]
            g, tp, pp, st = configs[k]
            if not share:  # a replica that drew no request still runs (and idles) for the whole workload
                energy.append(serving_energy(None, g.name, tp, pp, duration_s))
                continue
            s, c = wf.scheduler, wf.cluster
            cap = int(g.memory_bytes * c.memory_fraction)
            res = simulate([sim_model(entry.name, spec, g, tp, pp, c.dtype, wf, cap, 1, st)], share,
                           capacity_bytes=cap, policy=make_policy(s.policy),
                           swap_cost=lambda load, evict: 0.0, preload=[entry.name], duration_s=duration_s,
                           **scheduler_kwargs(wf, st, g))
            rep = res.report(slos(wf))["models"][entry.name]
            energy.append(serving_energy(res, g.name, tp, pp, max(duration_s, res.end_s)))
            ok += rep["slo_attainment"] * rep["requests"] if rep["requests"] else 0.0
            total += rep["requests"]
            recs += res.records
        out[entry.name] = {"slo_attainment": ok / total if total else None, "requests": total,
                           "energy": energy_summary(energy),
                           **{f"{q}_{mt}_s": v for mt in ("latency", "ttft", "tpot")
                              for q, v in percentiles([getattr(r, f"{mt}_s") for r in recs
                                                       if getattr(r, f"{mt}_s") is not None]).items()}}
    return out


def _kv_row(kv: KVSettings) -> dict:
    return {"kv_block_tokens": kv.block_tokens, "max_batched_tokens": kv.max_batched_tokens,
            "chunked_prefill": kv.chunked_prefill}


def candidate_gpus(wf: WorkloadFile, gpus: list[str] | None, catalog: Catalog,
                   prices: dict[str, float] | None = None) -> list[tuple[GPUSpec, float, str]]:
    """The GPU types a capacity search considers, each with its price per GPU-hour and where the price comes
    from: ``gpus`` (``--gpus``), else ``capacity.gpus``, else ``cluster.gpu`` — the workload's own types; with none
    of them it refuses rather than search the whole catalog. Prices: ``prices`` (``--price``), else
    ``capacity.prices``, else the catalog's; a GPU priced $0/h (the catalog's entry for a GPU nobody rents) is
    refused, never chosen for free.

    Raises:
        HetplanError: no candidate named, an unknown GPU, a price override for a GPU not among the candidates, an
            unpriced candidate, or a ``cluster.memory_bytes`` (one size for every type).
    """
    if wf.cluster.memory_bytes is not None:  # each candidate's memory is its own; the override was ignored
        raise HetplanError(f"cluster.memory_bytes = {wf.cluster.memory_bytes} fixes one memory size per worker, but "
                           "capacity sizes every candidate GPU type by its own memory (times "
                           "cluster.memory_fraction)", field="cluster.memory_bytes",
                           fix="remove cluster.memory_bytes; lower cluster.memory_fraction to leave memory free")
    names = gpus or wf.capacity.gpus or ([wf.cluster.gpu] if wf.cluster.gpu else [])
    field = "--gpus" if gpus else "capacity.gpus"
    if not names:
        raise HetplanError(f"no candidate GPU types: the workload names none (capacity.gpus, cluster.gpu), and "
                           f"searching all {len(catalog.names())} catalog types costs minutes of simulation",
                           field="capacity.gpus", fix="give --gpus A100-SXM-80GB,L4 or capacity.gpus = [...] "
                                                      "(`hetplan catalog gpus` lists the types and prices)")
    specs = list({g.name: g for g in (catalog.get(n, field=field) for n in names)}.values())
    given = {}
    for where, table in (("capacity.prices", wf.capacity.prices), ("--price", prices or {})):
        for name, usd in table.items():
            given[catalog.get(name, field=where).name] = (float(usd), where)
    extra = sorted(set(given) - {g.name for g in specs})
    if extra:
        raise HetplanError(f"a price is given for {', '.join(extra)}, which is not a candidate GPU type",
                           field=given[extra[0]][1], fix=f"add {extra[0]} to the candidates or drop its price")
    out = []
    for g in specs:
        usd, where = given.get(g.name, (g.price_usd_per_hour, f"catalog ({g.price_provider}, {g.price_date})"))
        if usd <= 0:
            raise HetplanError(f"{g.name} has no price ({usd:g} $/h in the catalog: nobody rents it), so a search "
                               "would choose it for free", field="--price",
                               fix=f"give --price {g.name}=USD_PER_GPU_HOUR or drop {g.name} from the candidates")
        out.append((g, usd, where))
    return out


def plan_capacity(wf: WorkloadFile, gpus: list[str] | None = None, *, catalog: str | None = None,
                  prices: dict[str, float] | None = None, progress=None, engines: list[str] | None = None,
                  exhaustive: bool | None = None, share: bool | None = None) -> dict:
    """The cheapest mix of GPU types, counts and TP x PP per model that meets the SLOs (module docstring).

    Only the candidates the integer program could use are simulated: each candidate's rate is first bounded
    from the cost model (:func:`rate_upper_bound`), the program is solved with the bounds standing in for the
    rates not simulated yet, and the candidates its optimum uses are simulated until it uses simulated ones only
    — the optimum over every candidate's simulated rate (the exhaustive search's answer; tested equal), found
    with a fraction of the simulations. ``exhaustive`` (default ``capacity.exhaustive``) simulates them all.

    Args:
        gpus: candidate GPU types (default: :func:`candidate_gpus`).
        catalog: a user GPU catalog file (TOML) extending or overriding the package's.
        prices: ``{GPU type: USD per GPU-hour}`` overrides.
        progress: ``progress(done, total, what)`` called for each replica configuration's fit and rate bound,
            then for each rate search (``total`` grows by one with each).
        engines: serving engines to choose among (default: :func:`candidate_stacks`).

    Returns:
        ``{"mix": [{model, gpu, tp, pp, engine, weights, kv_block_tokens, max_batched_tokens, chunked_prefill,
        max_num_seqs,
        replicas, gpus, rate_per_s (one replica), price_usd_per_hour}],
        "price_usd_per_hour", "gpus_by_type", "simulated": {model: {slo_attainment, p50/p90/p99 of latency,
        ttft, tpot}}, "load_per_s": {model: λ}, "target_attainment", "candidates": [{..., rate_per_s (None:
        not simulated), rate_bound_per_s, reason}], "rounds",
        "prices": {GPU: {usd_per_gpu_hour, source}}}``.

    Raises:
        InfeasibleError: a model fits no candidate, no replica meets its SLO even unloaded, or the GPU limits
            cannot carry the load.
        HetplanError: unknown GPU or model, bad workload.
    """
    cands_gpu = candidate_gpus(wf, gpus, load_catalog(catalog), prices)
    gpu_specs = [g for g, _, _ in cands_gpu]
    usd = {g.name: p for g, p, _ in cands_gpu}
    if wf.workload.offline:
        raise HetplanError("capacity plans for a request rate; an offline batch (all at t = 0) has none",
                           field="workload.offline", fix="give duration_s and rates, or a trace, for capacity")
    entries = list(wf.models)
    specs = [m.spec() for m in entries]
    reqs = workload_requests(wf)
    check_context(wf, {e.name: sp for e, sp in zip(entries, specs)}, reqs)
    # λ_m: the declared rates (the requests drawn from them sample them: 9 in 10 s at 1/s read 0.9/s), or a
    # trace's over the span of its arrivals
    if wf.workload.trace:
        duration = trace_window_s(reqs)
        if duration <= 0:
            raise HetplanError(f"the {len(reqs)} request(s) of trace {wf.workload.trace} all arrive at one instant, "
                               "so it has no arrival rate to plan capacity for", field="workload.trace",
                               fix="give the requests their arrival times (capacity plans for a rate), or simulate "
                                   "an offline batch with `hetplan simulate` (workload.offline = true)")
        loads = np.array([sum(r.model == e.name for r in reqs) / duration for e in entries])
    else:
        duration = wf.workload.duration_s
        declared = workload_rates(wf)
        loads = np.array([declared[e.name] for e in entries])
    max_gpus = wf.capacity.max_gpus
    exhaustive = wf.capacity.exhaustive if exhaustive is None else exhaustive
    share = wf.capacity.share_gpus if share is None else share
    stacks = candidate_stacks(wf, engines)
    configs = _configs(gpu_specs, max_gpus, stacks)
    n_m, n_k = len(entries), len(configs)
    rates, bound = np.zeros((n_m, n_k)), np.zeros((n_m, n_k))
    simulated = np.zeros((n_m, n_k), dtype=bool)
    why: dict[tuple[int, int], str] = {}
    memo: dict = {}
    done, total = 0, n_m * n_k
    own = {e.name: [(r.prompt_len, r.max_new_tokens) for r in reqs if r.model == e.name] if wf.workload.trace
           else None for e in entries}
    short = np.zeros(n_k)  # per candidate of the model at hand: how far it is from fitting (_fits)
    # 1. which replicas fit, and an upper bound of each one's rate (cost model only, no simulation)
    for m, (entry, spec) in enumerate(zip(entries, specs)):
        for k, (g, tp, pp, st) in enumerate(configs):
            done += 1
            if progress is not None:
                progress(done, total, f"{entry.name} on {g.name} TP {tp} x PP {pp} {st.label}: fits?")
            fits, why[m, k], short[k] = _fits(spec, g, tp, pp, wf, st)
            if fits:
                bound[m, k] = rate_upper_bound(wf, spec, g, tp, pp, st, own[entry.name])
        if not bound[m].any():
            nearest = [f"{_label(configs[k])}: {why[m, k]}" for k in map(int, np.argsort(short, kind="stable")[:2])]
            raise InfeasibleError(f"model {entry.name}: no candidate replica up to {max_gpus} GPUs works; the "
                                  f"nearest: {'; '.join(nearest)}", field="capacity.gpus",
                                  fix="allow more GPUs or larger GPU types, or relax the SLOs")

    def simulate_rate(m: int, k: int) -> None:
        nonlocal done, total
        entry, spec = entries[m], specs[m]
        g, tp, pp, st = configs[k]
        done, total = done + 1, total + 1
        if progress is not None:
            progress(done, total, f"{entry.name} on {g.name} TP {tp} x PP {pp} {st.label}: rate")
        # models of the same shape, burstiness and SLOs share their answer
        key = (spec, entry.cv, slos(wf)[entry.name], k, entry.name if wf.workload.trace else "")
        if key not in memo:
            memo[key] = max_rate_per_s(wf, entry, spec, g, tp, pp, st, own[entry.name])
        rates[m, k] = memo[key]
        simulated[m, k] = True
        why[m, k] = "meets the SLO up to this rate" if rates[m, k] > 0 else "misses the SLO even unloaded"

    cost = np.array([usd[g.name] * tp * pp for g, tp, pp, _ in configs])
    gpus_per = np.array([tp * pp for _, tp, pp, _ in configs])
    gpu_of = [g.name for g, _, _, _ in configs]
    if exhaustive:
        for m, k in zip(*np.nonzero(bound)):
            simulate_rate(int(m), int(k))

    # shared replica groups (Computron): two or more models on one replica group, swapping; a set S on
    # configuration k is a candidate when every member fits on its own and the members' loads fit within their
    # rate bounds there (Σ λ_m / bound_mk <= 1: a group serves each model at most as fast as a dedicated
    # replica); it is simulated when the program chooses it, as the dedicated candidates are
    groups: list[tuple[list[int], int]] = []
    if share and 2 <= n_m <= MAX_SHARED_MODELS:
        fits_memo: dict[tuple[int, int, int], bool] = {}
        for size in range(2, n_m + 1):
            for members in itertools.combinations(range(n_m), size):
                for k in range(n_k):
                    if not all(bound[m, k] > 0 for m in members) or sum(
                            loads[m] / bound[m, k] for m in members) > 1.0:
                        continue
                    for m in members:
                        if (m, k, size) not in fits_memo:
                            fits_memo[m, k, size] = _shared_fits(wf, specs[m], size, configs[k])
                    if all(fits_memo[m, k, size] for m in members):
                        groups.append((list(members), k))
    group_ok: dict[int, bool] = {}
    group_res: dict[int, SimResult] = {}

    def simulate_group(j: int) -> None:
        nonlocal done, total
        members, k = groups[j]
        g, tp, pp, st = configs[k]
        done, total = done + 1, total + 1
        if progress is not None:
            progress(done, total, f"{'+'.join(entries[m].name for m in members)} sharing {g.name} TP {tp} x PP "
                                  f"{pp} {st.label}")
        res = simulate_shared(wf, entries, specs, members, configs[k], reqs, duration)
        rep = res.report(slos(wf))["models"]
        group_ok[j] = not res.aborted and all(
            attains(rep[entries[m].name], wf.capacity.target_attainment) for m in members)
        group_res[j] = res

    def solve(derate: np.ndarray):
        """2. the integer program, simulating lazily: unsimulated candidates enter at their rate bound (a
        relaxation: every mix that covers the loads at the simulated rates covers them at the bounds too), shared
        groups not simulated yet as if they met the SLOs; an optimum that uses only simulated candidates is then
        the optimum over the simulated rates of all, as the exhaustive search finds it; else the candidates it
        used are simulated and it is solved again."""
        while True:
            live = [j for j in range(len(groups)) if group_ok.get(j, True)]
            cols = [(groups[j][0], float(cost[groups[j][1]]), gpu_of[groups[j][1]], int(gpus_per[groups[j][1]]))
                    for j in live]
            sol = _solve(np.where(simulated, rates, bound) * derate[:, None], cost, loads, gpu_of, gpus_per, max_gpus,
                         cols)
            x, used = (sol if cols else (sol, [])) if sol is not None else (None, [])
            used = [live[i] for i in used]
            todo = list(zip(*np.nonzero(((x > 0) if x is not None else bound > 0) & ~simulated & (bound > 0))))
            todo_g = [j for j in used if j not in group_ok]
            if not todo and not todo_g:
                return x, used
            for m, k in todo:
                simulate_rate(int(m), int(k))
            for j in todo_g:
                simulate_group(j)
            for m in range(n_m):  # the exhaustive search's refusal: a model no simulated candidate serves
                if simulated[m][bound[m] > 0].all() and not rates[m].any():
                    reasons = sorted({why[m, k] for k in range(n_k) if simulated[m, k]})  # those that fit
                    raise InfeasibleError(f"model {entries[m].name}: no candidate replica up to {max_gpus} GPUs "
                                          f"works ({'; '.join(reasons[:2])})", field="capacity.gpus",
                                          fix="allow more GPUs or larger GPU types, or relax the SLOs")

    derate = np.ones(n_m)
    for rounds in range(1, 4):
        replicas, used = solve(derate)
        if replicas is None:
            raise InfeasibleError(f"the load ({', '.join(f'{e.name} {x:.2f}/s' for e, x in zip(entries, loads))}) "
                                  f"needs more than {max_gpus} GPUs of each candidate type",
                                  field="capacity.max_gpus", fix="allow more GPUs per type or more GPU types")
        sim = _check(wf, entries, specs, configs, replicas, rates, reqs, duration)
        low = [m for m, e in enumerate(entries)
               if e.name in sim and not attains(sim[e.name], wf.capacity.target_attainment)]
        if not low:
            break
        derate[low] *= 0.9
    shared_rows = []
    for j in used:
        members, k = groups[j]
        g, tp, pp, st = configs[k]
        res = simulate_shared(wf, entries, specs, members, configs[k], reqs, duration, early_stop=False)
        sim.update(_shared_summary(wf, [entries[m].name for m in members], res, g.name, tp, pp, duration))
        shared_rows.append({"models": [entries[m].name for m in members], "gpu": g.name, "tp": tp, "pp": pp,
                            "engine": st.engine.label if st.engine else None, "weights": st.weights,
                            **_kv_row(kv_settings(wf, st)), "max_num_seqs": max_running(wf, st, g),
                            "gpus": int(gpus_per[k]), "price_usd_per_hour": float(cost[k]), "swaps": res.swaps,
                            "footprint_bytes": {entries[m].name: sim_model(
                                entries[m].name, specs[m], g, tp, pp, wf.cluster.dtype, wf,
                                int(g.memory_bytes * wf.cluster.memory_fraction), len(members), st).bytes
                                for m in members}, "gpu_memory_bytes": g.memory_bytes})
    cands = []
    for m, entry in enumerate(entries):
        for k, (g, tp, pp, st) in enumerate(configs):
            c = {"model": entry.name, "gpu": g.name, "tp": tp, "pp": pp, "stack": st.label,
                 "rate_per_s": float(rates[m, k]) if simulated[m, k] or not bound[m, k] else None,
                 "rate_bound_per_s": float(bound[m, k]), "price_usd_per_hour": float(cost[k]),
                 "reason": why[m, k] if simulated[m, k] or not bound[m, k] else
                 "not simulated: even at its rate bound it cannot make the mix cheaper"}
            cands.append(c)
    mix = [{"model": e.name, "gpu": configs[k][0].name, "tp": configs[k][1], "pp": configs[k][2],
            "engine": configs[k][3].engine.label if configs[k][3].engine else None,
            "weights": configs[k][3].weights, **_kv_row(kv_settings(wf, configs[k][3])),
            "max_num_seqs": max_running(wf, configs[k][3], configs[k][0]),
            "replicas": int(replicas[m, k]), "gpus": int(replicas[m, k] * gpus_per[k]),
            "rate_per_s": float(rates[m, k]), "price_usd_per_hour": float(replicas[m, k] * cost[k])}
           for m, e in enumerate(entries) for k in range(len(configs)) if replicas[m, k] > 0]
    by_type: dict[str, int] = {}
    for row in mix + shared_rows:
        by_type[row["gpu"]] = by_type.get(row["gpu"], 0) + row["gpus"]
    return {"mix": mix, "shared": shared_rows,
            "shared_candidates": {"considered": len(groups), "simulated": len(group_ok),
                                  "meeting_slos": sum(group_ok.values())},
            "price_usd_per_hour": float(sum(r["price_usd_per_hour"] for r in mix + shared_rows)),
            "gpus_by_type": by_type, "simulated": sim, "load_per_s": dict(zip([e.name for e in entries], loads.tolist())),
            "target_attainment": wf.capacity.target_attainment, "candidates": cands, "rounds": rounds,
            "prices": {g.name: {"usd_per_gpu_hour": p, "source": src} for g, p, src in cands_gpu},
            "energy": energy_summary([v["energy"] for v in sim.values()]),
            "meets_target": not low}
