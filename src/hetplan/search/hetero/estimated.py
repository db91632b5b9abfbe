"""The heterogeneous search by the estimator itself (:func:`search_hetero_estimated`).

The closed-form search (:mod:`~hetplan.search.hetero.closed_form`) ranks plans by the 1F1B closed form; this one
ranks them by :func:`hetplan.estimate.estimator.estimate` (the event-simulated schedule, every option), exact over
the candidate set ``H``: one plan per GPU allocation, the closed-form best of its block orders and partitions.
Allocations are visited best bound first and re-queued at ever tighter bounds of their own
(:func:`hetplan.search.objective.guarded_best_first`) until a plan is estimated; the walk stops when no bound
left can beat what has been estimated.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np

from hetplan.estimate.estimator import Estimate
from hetplan.model.spec import ModelSpec
from hetplan.plan import Inventory, Job, Plan
from hetplan.search.hetero.allocations import (PreparedSpace, allocation_blocks, bounded_allocations, build_groups,
                                               concat_rows, solve_allocation)
from hetplan.search.hetero.closed_form import HeteroCandidate, StageChoice, search_hetero
from hetplan.search.hetero.group import refined_bounds_s
from hetplan.search.hetero.tables import INF
from hetplan.search.space import Pins, stack_has


@dataclass
class EstimatedPlan:
    """A plan of the heterogeneous space evaluated by :func:`hetplan.estimate.estimator.estimate`: the search's
    candidate (closed-form figures), the :class:`Plan`, its estimate and the lower bound that admitted it (s)."""

    candidate: HeteroCandidate
    plan: Plan
    estimate: Estimate
    lower_bound_s: float

    @property
    def heterogeneous(self) -> bool:
        """True when the stages run on more than one GPU type (:func:`spans_gpu_types`; two pools of one type do
        not make a plan heterogeneous)."""
        return spans_gpu_types(self.estimate)


def spans_gpu_types(est: Estimate) -> bool:
    """Whether an estimated plan's stages run on more than one GPU type: what ``hetplan plan`` calls
    heterogeneous (its ranking, frontier table, JSON and plot)."""
    return len({se.gpu for se in est.stages}) > 1


@dataclass
class EstimatedResult:
    """Outcome of :func:`search_hetero_estimated`: the best plans by the objective on their estimates (``top``,
    best first; ``pareto``: empty), the frontier by estimates (``frontier``, ascending time), every plan estimated
    (``evaluated``) and counters: allocations bounded, allocations solved (closed-form partition of every block
    order), plans estimated, stage orders tried, CPU-independent wall time (s)."""

    top: list[EstimatedPlan]
    frontier: list[EstimatedPlan]
    evaluated: list[EstimatedPlan]
    allocations: int = 0
    allocations_solved: int = 0
    plans_estimated: int = 0
    orders_solved: int = 0
    search_time_s: float = 0.0
    #: ``inf`` when the walk completed (the result is exact over H); else the smallest lower bound not expanded
    #: (objective units: job s or job $; pareto: iteration s) — see :attr:`proven`.
    open_bound: float = math.inf
    stats: dict = field(default_factory=dict)

    @property
    def complete(self) -> bool:
        """True when every candidate of H that could matter was estimated (no expansion limit hit)."""
        return not math.isfinite(self.open_bound)


def search_hetero_estimated(
    m: ModelSpec,
    job: Job,
    inventory: Inventory,
    catalog,
    objective=None,
    pins: Pins | None = None,
    top_k: int = 5,
    pareto: bool = False,
    max_stages: int | None = None,
    max_allocations: int = 4_000_000,
    estimator=None,
    max_expansions: int | None = None,
    seed: bool = True,
    mixed_tp: bool = True,
    per_stage_tp: bool = True,
    progress=None,
    seed_solves: int | None = None,
    incumbents=(),
    max_pools: int | None = None,
) -> EstimatedResult:
    """The best heterogeneous plans (or the cost–time frontier) by :func:`hetplan.estimate.estimator.estimate`
    itself, exact over the candidate set ``H``: one plan per GPU allocation of the space (module doc), with the
    block order and layer partition that minimise the closed-form iteration time (:func:`.solve_allocation`, exact
    for that objective) and the lightest recomputation that fits each stage.

    Lower-bound-guarded re-estimation (:func:`hetplan.search.objective.guarded_best_first`, the loop of the
    homogeneous planner): allocations are visited in increasing order of the objective at ``T_SIM``
    (:func:`.allocation_bounds`), a bound on the estimate of *every* plan of the allocation; a visited allocation is
    re-queued at a tighter bound of its own (:meth:`.Group.refined_sim_bound_s`), when it comes up again at the
    least bound of its stage orders (:meth:`.Group.order_lower_bound_s`: each position's own costs, so memory, the
    embedding, the head and the integrality of layers count; on the README's ``llama2-7b-mixed-cloud`` it leaves 67
    of 3,167 allocations to solve, and the exact walk takes 13,086 expansions instead of 26,060); when it comes up a
    third time it is solved and its plan re-queued at the bound of its own stages
    (:func:`hetplan.search.homogeneous.stage_chain_lower_bound_s`); a plan reaching the head of the queue is
    estimated. Top k: the scan stops when the next bound is worse than the k-th best estimate. Pareto: an item is
    skipped when a frontier point (estimated) is at least as fast and as cheap as the item's bound ``(T, R·T)``;
    every item not skipped is expanded, so no plan of ``H`` left unestimated could dominate a frontier point.

    Args:
        objective: :class:`hetplan.search.objective.Objective` (goal, deadline/budget on the job, iteration SLO);
            for ``pareto`` its ``slo_iteration_s``, ``deadline_s`` (job s) and ``budget_usd`` (job $) act, as
            filters.
        top_k: how many plans to keep. pareto: compute the frontier instead.
        estimator: the function estimating one plan (default :func:`~hetplan.estimate.estimator.estimate`).
        max_expansions: stop the walk after this many expansions (allocation bounds refined, allocations solved,
            plans estimated); the result then says ``complete = False`` and ``open_bound`` (every plan of H not
            estimated is no better than that bound). ``None``: no limit (exact over H). A count, not a time: the
            answer is the same on any machine under any load.
        progress: ``progress(done, limit, phase)`` as the phases advance (a progress display): the cost tables
            (groups), the closed-form seeds (allocations solved), the walk (expansions).
        mixed_tp, per_stage_tp: as in :func:`.search_hetero`.
        seed: first run the closed-form search (:func:`.search_hetero`) and estimate its best plans (or frontier),
            so the cut starts from strong incumbents (they are plans of H).
        seed_solves: the seed search solves at most this many allocations (``None``: until exact); seeds only
            strengthen the cut, so a limit never changes what the walk proves.
        incumbents: ``(plan, estimate)`` pairs found elsewhere (the homogeneous exact top K) that the caller ranks
            together with this search's plans: they fill the top-k cut from the start, so the walk only proves
            what could enter the joint ranking; they are not returned, and a plan of H equal to one is not
            estimated again (top k only).
        max_pools: plans on at most this many pools (``None``: all; 1: one GPU type per plan).
    Raises:
        HetplanError: unknown GPU type in the inventory.
    """
    from hetplan.estimate.estimator import estimate
    from hetplan.search.objective import (BOUND_SLACK, Objective, TopK, estimate_keys, guarded_best_first,
                                          lower_bound_keys)

    t0 = time.perf_counter()
    estimator = estimator or estimate
    objective = objective or Objective()
    pins = pins or Pins()
    # one stage where the job's stack has no pipeline parallelism (stacks.toml parallel; space.stack_has)
    max_stages = min(max_stages or m.num_layers, m.num_layers) if stack_has(job.stack_spec(), "pp") else 1
    iterations = job.iterations()
    groups = build_groups(m, job, inventory, catalog, pins, max_stages, progress, per_stage_tp)
    rows, limits, n_alloc = bounded_allocations(groups, inventory, pins, max_stages, max_allocations, mixed_tp,
                                                 progress, max_pools)
    flat = concat_rows(rows)
    gid, loc, rate, t_lb, t_sim = flat
    prepared = PreparedSpace(groups, rows, limits, n_alloc, flat)
    cmins = [g.c_min() for g in groups]
    _, slo_it, budget_per_it = _closed_form_goal(objective, iterations)  # the deadline as an SLO per iteration
    slo = slo_it if slo_it is not None else INF
    budget_it = budget_per_it if budget_per_it is not None else INF
    evaluated: list[EstimatedPlan] = []
    seen: set = set()
    top = TopK(top_k)
    known: set[str] = set()
    for plan, est in ([] if pareto else incumbents):
        k2 = estimate_keys(objective, est)
        if k2 is not None:
            top.add(*k2, est.memory_bytes_per_gpu.total, -len(known) - 1, None)
        known.add(plan.model_dump_json())
    frontier: list[EstimatedPlan] = []
    count = {"orders": 0}
    solved: set[int] = set()  # allocations solved (rows): the seeds' and the walk's, each counted once

    def record(cand: HeteroCandidate, bound: float) -> None:
        """Estimate one plan of H (once) and file it."""
        key = (tuple(cand.stages), cand.mbs, cand.dp, cand.zero, cand.cp, cand.ep, cand.expert_tp)
        if key in seen:
            return
        seen.add(key)
        plan = cand.to_plan(job, inventory)
        if known and plan.model_dump_json() in known:
            return  # an incumbent: already ranked by the caller
        est = estimator(plan, catalog, m)
        ep = EstimatedPlan(cand, plan, est, bound)
        evaluated.append(ep)
        if pareto:
            if est.fits and est.iteration_time_s <= slo and est.usd_per_iteration <= budget_it:
                frontier[:] = _insert_estimated(frontier, ep)
        else:
            k2 = estimate_keys(objective, est)
            if k2 is not None:
                top.add(*k2, est.memory_bytes_per_gpu.total, len(evaluated), ep)

    # Incumbents: the closed-form optimum (or frontier) and runners-up, estimated. They are plans of H (each the
    # closed-form best of its allocation), so they only strengthen the cut; the walk below proves the rest.
    # With a full top k from the caller's incumbents the cut is known from the start: the closed-form seeds add
    # nothing the walk would not find, so they are skipped.
    if seed and not (not pareto and len(top.entries) >= top_k):
        if pareto:
            cf = search_hetero(m, job, inventory, catalog, goal="pareto", slo_iteration_s=slo_it,
                               budget_usd_per_iteration=budget_per_it, pins=pins,
                               max_stages=max_stages, max_allocations=max_allocations, prepared=prepared,
                               max_solves=seed_solves, progress=progress)
            seeds_cf = cf.frontier
        else:
            cf_goal, cf_slo, cf_budget = _closed_form_goal(objective, iterations)
            cf = search_hetero(m, job, inventory, catalog, goal=cf_goal, slo_iteration_s=cf_slo,
                               budget_usd_per_iteration=cf_budget, pins=pins, max_stages=max_stages,
                               max_allocations=max_allocations, keep_candidates=top_k + 3, prepared=prepared,
                               max_solves=seed_solves, progress=progress)
            seeds_cf = cf.candidates
        solved.update(cf.solved_rows)  # counted with the walk's: the frontier read "32 of 27 allocations solved"
        count["orders"] += cf.orders_solved
        for c in seeds_cf:
            record(c, 0.0)

    if pareto:
        keys = np.where((t_sim <= slo) & (rate * t_sim / 3600.0 <= budget_it), t_sim, INF)
    else:
        keys = lower_bound_keys(objective, t_sim, rate, np.ones(len(t_sim), dtype=bool), iterations)
    kind = np.zeros(len(keys), dtype=np.int8)  # 0: allocation at T_SIM, 1: refined, 2: bounded order by order
    walk = np.arange(len(keys))  # the allocations the walk starts from
    if not pareto and len(top.entries) >= top_k:
        # The cut is known: the walk can only expand allocations under it (TopK.cut stops at the first above; the
        # cut only tightens), and each is bounded now, on arrays, as the walk's first and second visits would
        # (refined bound, then the least bound of its stage orders where the refined one stays under the cut), so
        # the walk starts from them at those bounds.
        kth = top.entries[top_k - 1][0]
        walk = np.flatnonzero(keys * (1 - BOUND_SLACK) <= kth)
        near = walk[np.argsort(gid[walk], kind="stable")]  # by group
        blocks = {gi: [allocation_blocks(rows, gi, int(loc[j])) for j in js] for gi, js in _by_group(gid, near)}
        if blocks:
            width = max(len(b) for bs in blocks.values() for b in bs)
            refined = refined_bounds_s(m.num_layers, *(np.concatenate(x) for x in zip(
                *(groups[gi].refined_columns(bs, width) for gi, bs in blocks.items()))))
            keys[near] = lower_bound_keys(objective, np.maximum(t_sim[near], refined), rate[near],
                                          np.ones(len(near), dtype=bool), iterations)
            kind[near] = 1
        for gi, js in _by_group(gid, near):
            under = keys[js] * (1 - BOUND_SLACK) <= kth
            bound = groups[gi].least_order_bounds_s([b for b, u in zip(blocks[gi], under) if u])
            js = js[under]
            keys[js] = np.maximum(keys[js], lower_bound_keys(objective, bound, rate[js], np.ones(len(js), dtype=bool),
                                                             iterations))
            kind[js] = 2
    scan = walk[np.argsort(keys[walk], kind="stable")]  # (stable: ties in index order, as over all rows)
    scan = scan[np.isfinite(keys[scan])]

    def item_key(t_bound: float, usd_per_hour: float) -> float:
        if pareto:
            return t_bound
        return float(lower_bound_keys(objective, np.array([t_bound]), np.array([usd_per_hour]), np.array([True]),
                                      iterations)[0])

    def expand(lb, item):
        if item[0] == "allocation":  # first visit: a tighter bound of this allocation alone, re-queued
            j = item[1]
            g = groups[int(gid[j])]
            blocks = allocation_blocks(rows, int(gid[j]), int(loc[j]))
            bound = max(float(t_sim[j]), g.refined_sim_bound_s(blocks))
            return ((item_key(bound, float(rate[j])), ("refined", j)),)
        if item[0] == "refined":  # second visit: bounded order by order on the positions' own costs
            j = item[1]
            g = groups[int(gid[j])]
            blocks = allocation_blocks(rows, int(gid[j]), int(loc[j]))
            bound = float(g.least_order_bounds_s([blocks])[0])
            return ((item_key(bound, float(rate[j])), ("ordered", j)),) if math.isfinite(bound) else ()
        if item[0] == "ordered":
            j = item[1]
            g = groups[int(gid[j])]
            blocks = allocation_blocks(rows, int(gid[j]), int(loc[j]))
            solved.add(j)
            lbp = float(t_lb[j]) - 2 * (sum(s for _, (t, s) in blocks) - 1) * cmins[int(gid[j])]
            t, seq, ns, rcv, tried = solve_allocation(g, blocks, INF, lbp)
            count["orders"] += tried
            if t is None:
                return ()
            cand = HeteroCandidate(stages=[StageChoice(st.pool, st.tp, n, rc) for st, n, rc in zip(seq, ns, rcv)],
                                   mbs=g.b, dp=g.d, zero=g.zero, iteration_time_s=t, usd_per_hour=float(rate[j]),
                                   cp=g.cp, ep=g.ep, expert_tp=g.expert_tp)
            bound = g.lower_bound_s(seq, ns)
            return ((item_key(bound, cand.usd_per_hour), ("plan", cand, bound)),)
        record(item[1], item[2])
        return ()

    def cut(lb, item):
        if not pareto:
            return top.cut(lb)
        if not math.isfinite(lb):
            return "stop"
        r = rate[item[1]] if item[0] in ("allocation", "refined", "ordered") else item[1].usd_per_hour
        usd = r * lb / 3600.0
        if any(f.estimate.iteration_time_s <= lb and f.estimate.usd_per_iteration <= usd for f in frontier):
            return "skip"
        return None

    walk_progress = None if progress is None else (
        lambda k, _lb: progress(k, max_expansions, "heterogeneous walk (expansions)"))
    _, open_bound = guarded_best_first(((float(keys[j]), (("allocation", "refined", "ordered")[kind[j]], int(j)))
                                        for j in scan), expand, cut,
                                       limit=max_expansions, progress=walk_progress)
    return EstimatedResult(
        top=[e[-1] for e in top.best() if e[-1] is not None], frontier=frontier, evaluated=evaluated,
        allocations=n_alloc,
        allocations_solved=len(solved), plans_estimated=len(evaluated), orders_solved=count["orders"],
        search_time_s=time.perf_counter() - t0,
        open_bound=open_bound,
        stats={"max_pools_per_plan": limits[0], "mixed_tp": limits[1], "per_stage_tp": per_stage_tp,
               "restricted": (limits[0] < min(max_pools or len(inventory.pools), len(inventory.pools))
                              or (mixed_tp and pins.tp is None and not limits[1])),
               "groups": len(groups)},
    )


def _by_group(gid: np.ndarray, js: np.ndarray):
    """``(group index, its rows)`` of the rows ``js`` (sorted by group), group by group."""
    starts = np.flatnonzero(np.diff(gid[js], prepend=-1))
    for a, b in zip(starts, [*starts[1:], len(js)]):
        yield int(gid[js[a]]), js[a:b]


def _insert_estimated(frontier: list[EstimatedPlan], ep: EstimatedPlan) -> list[EstimatedPlan]:
    """``frontier`` (by estimates, ascending time) with ``ep`` added and the points it weakly dominates removed;
    unchanged when a point already weakly dominates ``ep``."""
    t, c = ep.estimate.iteration_time_s, ep.estimate.usd_per_iteration
    if any(f.estimate.iteration_time_s <= t and f.estimate.usd_per_iteration <= c for f in frontier):
        return frontier
    keep = [f for f in frontier if not (f.estimate.iteration_time_s >= t and f.estimate.usd_per_iteration >= c)]
    keep.append(ep)
    keep.sort(key=lambda f: (f.estimate.iteration_time_s, f.estimate.usd_per_iteration))
    return keep


def _closed_form_goal(objective, iterations: float):
    """The closed-form search's goal, iteration SLO and $-per-iteration budget for ``objective``: every constraint
    given, whatever the goal (:mod:`hetplan.search.objective`), the deadline as an SLO per iteration."""
    slo = objective.slo_iteration_s
    if objective.deadline_s is not None:
        slo = min(slo or INF, objective.deadline_s / iterations)
    budget = objective.budget_usd / iterations if objective.budget_usd is not None else None
    return ("cheapest" if objective.goal == "cheapest" else "fastest"), slo, budget
