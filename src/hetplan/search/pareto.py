"""The cost–time Pareto frontier of training plans (FASOP, Hwang et al. HPDC'24, Sec. 5.3 / Fig. 9), its table
and its plot.

The frontier is found exactly by :func:`hetplan.search.hetero.search_hetero` with ``goal="pareto"`` over the
heterogeneous space, which contains the homogeneous plans (one pool) too; a plan is on it when no other plan is
both at least as fast and at least as cheap per iteration. The points are then re-estimated with
:func:`hetplan.estimate.estimator.estimate` (the reported numbers). Units: seconds per iteration, USD per
iteration, USD per hour.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from hetplan.estimate.estimator import Estimate, estimate
from hetplan.plan import Inventory, Job, Plan
from hetplan.search.hetero import HeteroCandidate, HeteroResult, search_hetero
from hetplan.search.space import Pins


@dataclass
class FrontierPoint:
    """One frontier plan: the plan, its estimate, whether it mixes pools, and its description."""

    plan: Plan
    estimate: Estimate
    heterogeneous: bool
    description: str
    candidate: HeteroCandidate


@dataclass
class Frontier:
    """The frontier (ascending iteration time), every plan evaluated on the way (for the plot) and the search."""

    points: list[FrontierPoint]
    evaluated: list[HeteroCandidate]
    result: HeteroResult


def pareto_frontier(m, job: Job, inventory: Inventory, catalog, pins: Pins | None = None,
                    slo_iteration_s: float | None = None, budget_usd_per_iteration: float | None = None) -> Frontier:
    """Exact cost–time frontier of ``job`` on ``inventory`` (see module doc).

    Args:
        slo_iteration_s, budget_usd_per_iteration: optional limits applied to the frontier (s, USD).
    Raises:
        HetplanError: unknown GPU type.
    """
    res = search_hetero(m, job, inventory, catalog, goal="pareto", slo_iteration_s=slo_iteration_s,
                        budget_usd_per_iteration=budget_usd_per_iteration, pins=pins)
    pts = []
    for c in res.frontier:
        plan = c.to_plan(job, inventory)
        pts.append(FrontierPoint(plan, estimate(plan, catalog, m), len(c.pools_used) > 1, c.describe(inventory), c))
    return Frontier(points=pts, evaluated=res.candidates, result=res)


def explain_frontier(points: list[FrontierPoint]) -> list[str]:
    """For each point after the cheapest (in :func:`by_search_cost` order): what the extra $ buys —
    ``+x% $/iteration buys y% less time`` than the next cheaper point, by the search's closed-form figures."""
    out = []
    for prev, cur in zip(by_search_cost(points), by_search_cost(points)[1:]):
        pc, cc = prev.candidate, cur.candidate
        dc = cc.usd_per_iteration / pc.usd_per_iteration - 1
        dt = 1 - cc.iteration_time_s / pc.iteration_time_s
        out.append(f"{cur.description}: {dc:+.1%} $/iteration buys {dt:.1%} less time than {prev.description}")
    return out


def by_search_cost(points: list[FrontierPoint]) -> list[FrontierPoint]:
    """Points in increasing $ per iteration as the search computed it (closed-form pipeline time), the order in
    which the frontier is monotone; the re-estimated numbers (event-simulated schedule) may differ by a little."""
    return sorted(points, key=lambda p: (p.candidate.usd_per_iteration, p.candidate.iteration_time_s))


def plot_frontier(frontier: Frontier, path: str | Path, title: str = "") -> None:
    """Scatter of every evaluated plan and the frontier, homogeneous plans as circles, heterogeneous as triangles;
    cost per iteration vs iteration time, all by the search's closed-form pipeline time (the one the frontier is
    exact for; the table reports the re-estimated figures). Writes a PNG (matplotlib, Agg)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for het, marker, label in ((False, "o", "homogeneous"), (True, "^", "heterogeneous")):
        ev = [c for c in frontier.evaluated if (len(c.pools_used) > 1) == het]
        if ev:
            ax.scatter([c.iteration_time_s for c in ev], [c.usd_per_iteration for c in ev], s=10, marker=marker,
                       alpha=0.3, color="tab:gray", label=f"{label} (evaluated)")
        fp = [p for p in frontier.points if p.heterogeneous == het]
        if fp:
            ax.scatter([p.candidate.iteration_time_s for p in fp], [p.candidate.usd_per_iteration for p in fp], s=36,
                       marker=marker, color="tab:red" if het else "tab:blue", label=f"{label} on the frontier", zorder=3)
    pts = sorted(frontier.points, key=lambda p: p.candidate.iteration_time_s)
    if pts:
        ax.step([p.candidate.iteration_time_s for p in pts], [p.candidate.usd_per_iteration for p in pts], where="post",
                color="k", lw=0.8, label="frontier")
    ax.set_xlabel("iteration time (s)")
    ax.set_ylabel("cost per iteration (USD)")
    if title:
        ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
