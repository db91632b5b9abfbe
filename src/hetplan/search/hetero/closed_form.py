"""The closed-form heterogeneous search (:func:`search_hetero`), exact over the space of
:mod:`hetplan.search.hetero` for the closed-form iteration time.

Every allocation (``b, d``, ZeRO, ``(tp_k, s_k)`` per pool) gets a lower bound ``T_LB`` on its iteration time
valid for every stage order and layer partition (:func:`.allocation_bounds`).
Allocations are visited in increasing bound order of the goal; each one's cost is ``R·T`` with ``R`` its $/h, so

* ``cheapest`` (``T <= SLO``): skip when ``T_LB > SLO`` or ``R·T_LB >= best $``; stop at the first allocation
  whose ``R·T_LB >= best $`` (the rest are sorted after it);
* ``fastest`` (``$ <= budget`` optional): skip when ``R·T_LB > budget``; stop when ``T_LB >= best T``;
* ``pareto``: skip when some frontier point ``(T_f, C_f)`` has ``T_f <= T_LB`` and ``C_f <= R·T_LB`` (then every
  plan of the allocation is weakly dominated).

A surviving allocation's orders are each solved exactly by :func:`hetplan.search.partition.solve_partition`,
with the incumbent as an upper bound. Every cut compares a *lower* bound with a value already achieved, so no cut
removes a plan better than the one returned; the tests compare with exhaustive enumeration of the same space.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from hetplan.model.spec import ModelSpec
from hetplan.plan import Inventory, Job, Plan, Stage
from hetplan.search.hetero.allocations import (PreparedSpace, allocation_blocks, bounded_allocations, build_groups,
                                               concat_rows, solve_allocation)
from hetplan.search.hetero.tables import INF
from hetplan.search.space import Pins, RECOMPUTE_NAMES, stack_has


class StageChoice(NamedTuple):
    """One stage of a :class:`HeteroCandidate`: its pool (index into the inventory), TP degree, layers and
    recomputation code (:data:`hetplan.estimate.compute.RECOMPUTE_CODES`)."""

    pool: int
    tp: int
    num_layers: int
    recompute_code: int


@dataclass
class HeteroCandidate:
    """One plan found by the search: its stages in order (:class:`StageChoice`), plus ``mbs``, ``dp``, ``zero``;
    its iteration time (s, the estimator's formula) and $ per hour."""

    stages: list[StageChoice]
    mbs: int
    dp: int
    zero: int
    iteration_time_s: float
    usd_per_hour: float
    cp: int = 1
    ep: int = 1
    expert_tp: int = 1

    @property
    def usd_per_iteration(self) -> float:
        """$ of one iteration: $/hour of the allocation x iteration time / 3600."""
        return self.usd_per_hour * self.iteration_time_s / 3600.0

    @property
    def num_gpus(self) -> int:
        """GPUs used: Σ over stages of tp x cp x dp."""
        return sum(t * self.cp * self.dp for _, t, _, _ in self.stages)

    @property
    def pools_used(self) -> set[int]:
        """Indices of the inventory pools the stages run on."""
        return {k for k, _, _, _ in self.stages}

    def to_plan(self, job: Job, inventory: Inventory) -> Plan:
        """The :class:`Plan` (pools reduced to those used, in order of first use)."""
        order: list[int] = []
        for k, _, _, _ in self.stages:
            if k not in order:
                order.append(k)
        return Plan(
            job=job,
            pools=[inventory.pools[k] for k in order],
            stages=[Stage(pool=order.index(k), num_layers=n, tp=t, dp=self.dp, recompute=RECOMPUTE_NAMES[rc])
                    for k, t, n, rc in self.stages],
            mbs=self.mbs,
            zero=self.zero,
            sequence_parallel=any(t > 1 for _, t, _, _ in self.stages) and job.stack_spec().sequence_parallel,
            cp=self.cp,
            ep=self.ep,
            expert_tp=self.expert_tp,
        )

    def describe(self, inventory: Inventory) -> str:
        """``RTX-A6000(tp1)x2 + RTX-3090(tp1) dp1 mbs16: layers [11, 12, 3]``."""
        blocks: list[list] = []
        for k, t, _, _ in self.stages:
            if blocks and blocks[-1][0] == (k, t):
                blocks[-1][1] += 1
            else:
                blocks.append([(k, t), 1])
        parts = [f"{inventory.pools[k].gpu}(tp{t})" + (f"x{c}" if c > 1 else "") for (k, t), c in blocks]
        extra = (f" cp{self.cp}" if self.cp > 1 else "") + (f" ep{self.ep}" if self.ep > 1 else "") + \
            (f" etp{self.expert_tp}" if self.expert_tp > 1 else "")
        return (" + ".join(parts) + f" dp{self.dp}{extra} mbs{self.mbs} zero{self.zero}: layers "
                f"{[n for _, _, n, _ in self.stages]}")


@dataclass
class HeteroResult:
    """Outcome of :func:`search_hetero`: the best plan (or ``None``), every plan evaluated exactly, the Pareto
    frontier (``pareto`` goal; ascending time), counters, and the allocations solved (``solved_rows``: their
    indices in the concatenated rows, :func:`.concat_rows`)."""

    best: HeteroCandidate | None
    candidates: list[HeteroCandidate]
    frontier: list[HeteroCandidate]
    allocations: int = 0
    allocations_fitting: int = 0
    allocations_solved: int = 0
    orders_solved: int = 0
    search_time_s: float = 0.0
    stats: dict = field(default_factory=dict)
    solved_rows: list[int] = field(default_factory=list)


def _frontier_dominates(frontier: list[HeteroCandidate], t: float, cost_per_s: float) -> float:
    """Least iteration time from which a plan with $/s rate ``cost_per_s`` is weakly dominated by the frontier."""
    best = INF
    for f in frontier:
        best = min(best, max(f.iteration_time_s, f.usd_per_iteration / cost_per_s if cost_per_s > 0 else INF))
    return best


def _insert_frontier(frontier: list[HeteroCandidate], c: HeteroCandidate) -> list[HeteroCandidate]:
    """``frontier`` (ascending time) with ``c`` added and the points it weakly dominates removed."""
    keep = [f for f in frontier
            if not (f.iteration_time_s >= c.iteration_time_s and f.usd_per_iteration >= c.usd_per_iteration)]
    keep.append(c)
    keep.sort(key=lambda f: (f.iteration_time_s, f.usd_per_iteration))
    return keep


def search_hetero(
    m: ModelSpec,
    job: Job,
    inventory: Inventory,
    catalog,
    goal: str = "fastest",
    slo_iteration_s: float | None = None,
    budget_usd_per_iteration: float | None = None,
    pins: Pins | None = None,
    prune: bool = True,
    max_stages: int | None = None,
    keep_candidates: int = 0,
    max_allocations: int = 4_000_000,
    mixed_tp: bool = True,
    per_stage_tp: bool = True,
    prepared: PreparedSpace | None = None,
    max_solves: int | None = None,
    progress=None,
) -> HeteroResult:
    """Exact search of the heterogeneous space (module doc) for ``goal``.

    Args:
        goal: ``"cheapest"`` (least $ per iteration, iteration time ≤ ``slo_iteration_s`` if given),
            ``"fastest"`` (least iteration time, $ per iteration ≤ ``budget_usd_per_iteration`` if given),
            or ``"pareto"`` (the whole time–$ frontier, constraints applied as filters).
        pins: fixed TP (all stages), DP, micro-batch size, ZeRO, recomputation, PP, number of GPUs.
        prune: ``False`` visits every allocation and every stage order with no allocation or order lower bound (the
            slow exhaustive reference); each order's partition is still solved exactly by
            :func:`~hetplan.search.partition.solve_partition` (checked against brute force in the tests), given the
            incumbent as its upper bound (for ``pareto``: only the SLO/budget).
        max_stages: cap on the pipeline depth (default: the number of layers).
        keep_candidates: keep up to this many exactly evaluated plans besides the best (0 = all found).
        mixed_tp: allow a second TP degree on a pool's leftover GPUs
            (:meth:`.Group.pool_options`).
        per_stage_tp: stages of different pools may take different TP degrees (the space of FASOP and Espresso);
            ``False``: one TP for every stage, the plans Megatron-LM, DeepSpeed, torchtitan and ``hetplan run``
            launch (:func:`.build_groups`).
        max_allocations: when the space holds more GPU allocations than this, first one TP degree per pool, then
            plans are restricted to at most two pools (then one), and ``HeteroResult.stats["max_pools_per_plan"]``
            says so: the result is exact over the restricted space only.
        prepared: the space's bounded allocations when the caller has them already
            (:class:`.PreparedSpace`).
        max_solves: solve at most this many allocations (``None``: no limit); a search cut short says so in
            ``stats["cut_short"]`` and is exact no more (the estimated search uses it only for its seeds).
        progress: ``progress(solved, max_solves, phase)`` before each allocation solved.
    Returns:
        :class:`HeteroResult`; ``best`` is ``None`` when nothing fits or meets the constraint.
    Raises:
        HetplanError: unknown GPU in the inventory.
    """
    t0 = time.perf_counter()
    pins = pins or Pins()
    # one stage where the job's stack has no pipeline parallelism (stacks.toml parallel; space.stack_has)
    max_stages = min(max_stages or m.num_layers, m.num_layers) if stack_has(job.stack_spec(), "pp") else 1
    if prepared is None:
        groups = build_groups(m, job, inventory, catalog, pins, max_stages, per_stage_tp=per_stage_tp)
        rows, max_pools, n_alloc = bounded_allocations(groups, inventory, pins, max_stages, max_allocations,
                                                        mixed_tp)
        gid, loc, rate, t_lb, _ = concat_rows(rows)
    else:
        groups, rows, max_pools, n_alloc = prepared.groups, prepared.rows, prepared.max_pools, prepared.allocations
        gid, loc, rate, t_lb, _ = prepared.flat
    cost_lb = rate * t_lb / 3600.0
    if goal == "cheapest":
        ok = t_lb <= (slo_iteration_s if slo_iteration_s is not None else INF)
        order = np.argsort(cost_lb, kind="stable")
    else:
        ok = cost_lb <= (budget_usd_per_iteration if budget_usd_per_iteration is not None else INF)
        if goal == "pareto" and slo_iteration_s is not None:
            ok &= t_lb <= slo_iteration_s
        order = np.argsort(t_lb, kind="stable")
    if prune:
        order = order[ok[order]]
    cmins = [g.c_min() for g in groups]
    best: HeteroCandidate | None = None
    frontier: list[HeteroCandidate] = []
    found: list[HeteroCandidate] = []
    solved = orders = 0
    solved_rows: list[int] = []
    slo = slo_iteration_s if slo_iteration_s is not None else INF
    budget = budget_usd_per_iteration if budget_usd_per_iteration is not None else INF
    cut_short = False
    for j in order:
        if max_solves is not None and solved >= max_solves:
            cut_short = True
            break
        R = float(rate[j])
        rs = R / 3600.0
        if goal == "cheapest":
            if prune and best is not None and cost_lb[j] >= best.usd_per_iteration:
                break
            ub = min(np.nextafter(slo, INF), best.usd_per_iteration / rs if best is not None else INF)
        elif goal == "fastest":
            if prune and best is not None and t_lb[j] >= best.iteration_time_s:
                break
            ub = min(np.nextafter(budget / rs, INF), best.iteration_time_s if best is not None else INF)
        else:
            ub = min(np.nextafter(slo, INF), np.nextafter(budget / rs, INF))
            if frontier:
                ub = min(ub, _frontier_dominates(frontier, 0.0, rs))
            if prune and t_lb[j] >= ub:
                continue
        if not prune and goal == "pareto":
            ub = min(np.nextafter(slo, INF), np.nextafter(budget / rs, INF))
        g = groups[int(gid[j])]
        blocks = allocation_blocks(rows, int(gid[j]), int(loc[j]))
        if progress is not None:
            progress(solved, max_solves, "closed-form seeds (solves)")
        solved += 1
        solved_rows.append(int(j))
        lbp = float(t_lb[j]) - 2 * (sum(s for _, (t, s) in blocks) - 1) * cmins[int(gid[j])] if prune else 0.0
        t, seq, ns, rcv, tried = solve_allocation(g, blocks, ub, lbp)
        orders += tried
        if t is None:
            continue
        cand = HeteroCandidate(
            stages=[StageChoice(st.pool, st.tp, n, rc) for st, n, rc in zip(seq, ns, rcv)],
            mbs=g.b, dp=g.d, zero=g.zero, iteration_time_s=t, usd_per_hour=R, cp=g.cp, ep=g.ep,
            expert_tp=g.expert_tp,
        )
        found.append(cand)
        if goal == "cheapest":
            if best is None or cand.usd_per_iteration < best.usd_per_iteration:
                best = cand
        elif goal == "fastest":
            if best is None or cand.iteration_time_s < best.iteration_time_s:
                best = cand
        else:
            frontier = _insert_frontier(frontier, cand)
    if goal == "pareto":
        if not prune:
            frontier = []
            for c in sorted(found, key=lambda c: (c.iteration_time_s, c.usd_per_iteration)):
                frontier = _insert_frontier(frontier, c)
        best = frontier[0] if frontier else None
    if goal == "cheapest":
        found.sort(key=lambda c: (c.usd_per_iteration, c.iteration_time_s))
    else:
        found.sort(key=lambda c: (c.iteration_time_s, c.usd_per_iteration))
    if not prune and found and goal != "pareto":
        best = found[0]
    if keep_candidates:
        found = found[:keep_candidates]
    return HeteroResult(
        best=best, candidates=found, frontier=frontier, allocations=n_alloc,
        allocations_fitting=n_alloc, allocations_solved=solved, orders_solved=orders,
        search_time_s=time.perf_counter() - t0,
        stats={"max_pools_per_plan": max_pools[0], "mixed_tp": max_pools[1],
               "restricted": max_pools[0] < len(inventory.pools) or (mixed_tp and pins.tp is None and not max_pools[1]),
               "groups": len(groups), "cut_short": cut_short},
        solved_rows=solved_rows,
    )
