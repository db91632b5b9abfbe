"""The cost–time Pareto frontier of training plans (FASOP, Hwang et al. HPDC'24, Sec. 5.3 / Fig. 9), its table
and its plot — all by :func:`hetplan.estimate.estimator.estimate`'s figures.

The frontier is computed by :func:`hetplan.search.hetero.search_hetero_estimated` with ``pareto=True`` over the
candidate set ``H`` of the heterogeneous space (each GPU allocation's closed-form-optimal plan; one-pool
allocations are the homogeneous plans): a plan is on it when no other estimated plan is both at least as fast and
at least as cheap per iteration, and every plan of ``H`` left unestimated has a lower bound ``(T, R·T)`` (no
schedule beats it) that a frontier point already dominates — unless the walk hit its expansion limit, in which
case the points faster than :attr:`Frontier.proven_below_s` are still exact. Plans the caller found elsewhere
(``incumbents``: the ranking, whose space holds plans H does not) join it where no point dominates them. Units:
seconds per iteration, USD per iteration, USD per hour.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from hetplan.estimate.estimator import Estimate
from hetplan.plan import Inventory, Job, Plan
from hetplan.search.hetero import EstimatedPlan, EstimatedResult, HeteroCandidate, search_hetero_estimated
from hetplan.search.objective import Objective, estimate_keys
from hetplan.search.space import Pins

#: Expansions the frontier walk may make after the closed-form frontier (then points faster than the first
#: unvisited bound are exact). A count, not a time: the frontier does not depend on the machine or its load.
PARETO_WALK_EXPANSIONS = 4000
#: Allocations the closed-form frontier that seeds the walk may solve (seeds only strengthen the walk's cut).
PARETO_SEED_SOLVES = 1000


@dataclass
class FrontierPoint:
    """One frontier plan: the plan, its estimate, whether it mixes pools, its description, and its candidate of
    H (``None``: a plan given to :func:`pareto_frontier` as an incumbent)."""

    plan: Plan
    estimate: Estimate
    heterogeneous: bool
    description: str
    candidate: HeteroCandidate | None


@dataclass
class Frontier:
    """The frontier (ascending estimated iteration time), every plan estimated on the way (for the plot), the
    search, and ``proven_below_s``: frontier points faster than this (s per iteration) are exact over H
    (``inf``: all of them)."""

    points: list[FrontierPoint]
    evaluated: list[EstimatedPlan]
    result: EstimatedResult
    proven_below_s: float = math.inf


def pareto_frontier(m, job: Job, inventory: Inventory, catalog, pins: Pins | None = None,
                    slo_iteration_s: float | None = None, budget_usd_per_iteration: float | None = None,
                    max_expansions: int | None = PARETO_WALK_EXPANSIONS, progress=None,
                    per_stage_tp: bool = False, deadline_s: float | None = None,
                    heterogeneous: bool = True, incumbents=()) -> Frontier:
    """Cost–time frontier of ``job`` on ``inventory`` by estimates (see module doc).

    Args:
        per_stage_tp, heterogeneous: as in :func:`hetplan.search.planner.search_plans` (off: one TP for every
            stage; only plans on one GPU type).
        slo_iteration_s, budget_usd_per_iteration, deadline_s: optional limits applied to the frontier (s per
            iteration, USD per iteration, s for the job), as the ranking applies them.
        max_expansions: expansion limit of the guarded walk (``None``: none; then every point is exact over H).
        incumbents: ``(plan, estimate, description)`` of plans found elsewhere — the ranking of
            :func:`hetplan.search.planner.search_plans`, whose space H does not hold (interleaved 1F1B, ZeRO-2/3,
            recomputation heavier than the lightest that fits): each that meets the limits joins the frontier
            unless a point weakly dominates it, and removes the points it dominates (an interleaved plan in the
            ranking was faster and cheaper than the frontier's fastest point).
        progress: ``progress(done, limit, phase)`` as the search's phases advance (cost tables, closed-form
            seeds, the walk).
    Raises:
        HetplanError: unknown GPU type.
    """
    budget = None if budget_usd_per_iteration is None else budget_usd_per_iteration * job.iterations()
    obj = Objective(slo_iteration_s=slo_iteration_s, budget_usd=budget, deadline_s=deadline_s)
    res = search_hetero_estimated(m, job, inventory, catalog, obj, pins=pins, pareto=True,
                                  max_expansions=max_expansions, progress=progress, seed_solves=PARETO_SEED_SOLVES,
                                  per_stage_tp=per_stage_tp, max_pools=None if heterogeneous else 1)
    pts = [FrontierPoint(ep.plan, ep.estimate, ep.heterogeneous, ep.candidate.describe(inventory), ep.candidate)
           for ep in res.frontier]
    for plan, est, description in incumbents:
        t, c = est.iteration_time_s, est.usd_per_iteration  # estimate_keys: None when it breaks memory or a limit
        if estimate_keys(obj, est) is None or any(p.estimate.iteration_time_s <= t and p.estimate.usd_per_iteration <= c for p in pts):
            continue
        pts = [p for p in pts if not (p.estimate.iteration_time_s >= t and p.estimate.usd_per_iteration >= c)]
        pts.append(FrontierPoint(plan, est, len({st.pool for st in plan.stages}) > 1, description, None))
    pts.sort(key=lambda p: (p.estimate.iteration_time_s, p.estimate.usd_per_iteration))
    return Frontier(points=pts, evaluated=res.evaluated, result=res, proven_below_s=res.open_bound)


def buys(prev: FrontierPoint, cur: FrontierPoint) -> str:
    """``+x% $/iteration buys y% less time`` (``cur`` against the next cheaper point ``prev``; estimates)."""
    dc = cur.estimate.usd_per_iteration / prev.estimate.usd_per_iteration - 1
    dt = 1 - cur.estimate.iteration_time_s / prev.estimate.iteration_time_s
    return f"{dc:+.1%} $/iteration buys {dt:.1%} less time"


def by_cost(points: list[FrontierPoint]) -> list[FrontierPoint]:
    """Points in increasing estimated $ per iteration (then time): along the frontier, decreasing time."""
    return sorted(points, key=lambda p: (p.estimate.usd_per_iteration, p.estimate.iteration_time_s))


def plot_frontier(frontier: Frontier, path: str | Path, title: str = "") -> None:
    """Scatter of every estimated plan and the frontier, plans on one GPU type as circles, heterogeneous ones (on
    several types, :func:`hetplan.search.hetero.estimated.spans_gpu_types`) as triangles; cost per iteration vs
    iteration time, by :func:`~hetplan.estimate.estimator.estimate` — the same figures as the table. The suffix
    of ``path`` picks the format (matplotlib, Agg)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    on = {id(p.plan) for p in frontier.points}
    for het, marker, label in ((False, "o", "one GPU type"), (True, "^", "heterogeneous")):
        ev = [e for e in frontier.evaluated if e.heterogeneous == het and id(e.plan) not in on and e.estimate.fits]
        if ev:
            ax.scatter([e.estimate.iteration_time_s for e in ev], [e.estimate.usd_per_iteration for e in ev], s=10,
                       marker=marker, alpha=0.4, color="tab:gray", label=f"{label} (estimated)")
        fp = [p for p in frontier.points if p.heterogeneous == het]
        if fp:
            ax.scatter([p.estimate.iteration_time_s for p in fp], [p.estimate.usd_per_iteration for p in fp], s=36,
                       marker=marker, color="tab:red" if het else "tab:blue", label=f"{label} on the frontier", zorder=3)
    pts = sorted(frontier.points, key=lambda p: p.estimate.iteration_time_s)
    if pts:
        ax.step([p.estimate.iteration_time_s for p in pts], [p.estimate.usd_per_iteration for p in pts], where="post",
                color="k", lw=0.8, label="frontier")
        for i, p in enumerate(by_cost(frontier.points), start=1):
            ax.annotate(str(i), (p.estimate.iteration_time_s, p.estimate.usd_per_iteration), fontsize=7,
                        xytext=(3, 3), textcoords="offset points")
    ax.set_xlabel("iteration time (s, estimate)")
    ax.set_ylabel("cost per iteration (USD, estimate)")
    if title:
        ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
