"""Objectives and constraints of the plan search.

* ``fastest``: minimise the job's wall-clock time (iteration time x iterations); ties broken by $ for the job.
* ``cheapest``: minimise $ for the job subject to job time ≤ ``deadline_s`` (no deadline: cheapest overall).
* ``budget``: minimise job time subject to $ for the job ≤ ``budget_usd``.
* ``slo_iteration_s`` (any goal): iteration time ≤ this SLO, e.g. ``cheapest`` with an SLO is Espresso's problem
  (Espresso: least $ per iteration subject to an iteration-time SLO).

A constraint given holds whatever the goal: ``fastest`` with a deadline finds nothing when even the fastest plan
misses it (the search then says the best achievable), ``cheapest`` with a budget nothing above it. Before, a
deadline under ``fastest`` or ``budget`` and a budget under ``cheapest`` were ignored without a word.

Every configuration must fit in GPU memory. :func:`rank_keys` returns one sort key per configuration (smaller is
better, ``inf`` when a constraint fails), so the ranking is a single ``argsort``.
"""

from __future__ import annotations

import math
from typing import Callable, Literal

import numpy as np
from pydantic import ConfigDict, model_validator

from hetplan.inputs import UserInput, bounded


class Objective(UserInput):
    """What to optimise: ``goal`` plus its constraints (seconds, USD); a boolean where a number belongs is refused
    (:class:`hetplan.inputs.UserInput`: ``budget_usd = true`` was a $1 budget)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    goal: Literal["fastest", "cheapest", "budget"] = "fastest"
    deadline_s: float | None = bounded(3.2e9, "a deadline past 100 years is no deadline", default=None, gt=0)
    budget_usd: float | None = bounded(1e12, "a trillion dollars is more than any training budget", default=None, gt=0)
    slo_iteration_s: float | None = bounded(1e6, "an iteration longer than 11 days is no SLO", default=None, gt=0)

    @model_validator(mode="after")
    def _check(self) -> "Objective":
        if self.goal == "budget" and self.budget_usd is None:
            raise ValueError("goal 'budget' needs budget_usd (the most $ the job may cost)")
        return self


def rank_keys(objective: Objective, job_time_s: np.ndarray, job_usd: np.ndarray, fits: np.ndarray,
              iteration_time_s: np.ndarray | None = None):
    """Primary and secondary sort keys (arrays); ``inf`` primary key = violates memory or the constraint.

    ``iteration_time_s`` (s, same shape) is needed for the ``slo_iteration_s`` constraint; without it the SLO is
    not applied.
    """
    ok = np.array(fits, dtype=bool, copy=True)
    if objective.slo_iteration_s is not None and iteration_time_s is not None:
        ok &= np.asarray(iteration_time_s) <= objective.slo_iteration_s
    if objective.deadline_s is not None:  # every constraint given holds, whatever the goal (module doc)
        ok &= job_time_s <= objective.deadline_s
    if objective.budget_usd is not None:
        ok &= job_usd <= objective.budget_usd
    if objective.goal == "cheapest":
        primary, secondary = job_usd, job_time_s
    else:
        primary, secondary = job_time_s, job_usd
    return np.where(ok, primary, np.inf), secondary


def lower_bound_keys(objective: Objective, lb_iteration_s, usd_per_hour, fits, iterations: float) -> np.ndarray:
    """:func:`rank_keys` evaluated at a lower bound of the iteration time (s): a lower bound of the primary key
    (job time and job $ grow with the iteration time at a fixed $/h) and an optimistic constraint test, so an
    ``inf`` here means the constraint fails for every iteration time at or above the bound."""
    lb = np.asarray(lb_iteration_s, dtype=float)
    lb_time = lb * iterations
    key, _ = rank_keys(objective, lb_time, np.asarray(usd_per_hour) * lb_time / 3600, fits, iteration_time_s=lb)
    return key


def estimate_keys(objective: Objective, est) -> tuple[float, float] | None:
    """``(primary, secondary)`` sort keys of one :class:`~hetplan.estimate.estimator.Estimate`, or ``None`` when
    it breaks memory or a constraint."""
    key, second = rank_keys(objective, np.array([est.job_time_s]), np.array([est.job_usd]), np.array([est.fits]),
                            iteration_time_s=np.array([est.iteration_time_s]))
    return (float(key[0]), float(second[0])) if np.isfinite(key[0]) else None


# --- Lower-bound-guarded exact evaluation (one loop for the homogeneous and the heterogeneous searches) ----------

#: Relative slack between a lower bound and an exact value compared with it (floating-point rounding between the
#: two computations); a bound is "worse" than a value only when ``bound * (1 - BOUND_SLACK) > value``.
BOUND_SLACK = 1e-6


def guarded_best_first(seeds, expand, cut, limit: int | None = None,
                       progress: Callable[[int, float], None] | None = None) -> tuple[int, float]:
    """Visit items in increasing lower bound, expanding each, until ``cut`` says nothing left can matter.

    The searches use it to re-estimate candidates with :func:`hetplan.estimate.estimator.estimate` only where a
    lower bound on the objective (one no pipeline schedule can beat) leaves room for them.

    Args:
        seeds: iterable of ``(lower_bound, item)`` in nondecreasing ``lower_bound`` (e.g. a sorted array walk).
        expand: ``expand(lower_bound, item)`` evaluates the item (recording whatever it found) and returns its
            children as ``(lower_bound, item)`` pairs (possibly none); a child's bound is raised to its parent's.
        cut: ``cut(lower_bound, item)`` returns ``"stop"`` (no item with this bound or more can matter: end),
            ``"skip"`` (this item cannot matter) or ``None`` (expand it).
        limit: expand at most this many items (``None``: no limit). The budget counts expansions, never time, so
            the answer does not depend on the machine's speed or load.
        progress: called as ``progress(expanded, lower_bound)`` before each expansion (e.g. a progress bar).
    Returns:
        ``(expanded, open_bound)``: how many items were expanded, and the smallest bound of an item neither
        expanded nor cut when a limit ended the walk (``inf`` when the walk ended by itself or by ``cut``).

    Exactness: items are taken smallest bound first from the merged seed stream and child heap, so when ``cut``
    stops at bound ``x``, every item not visited has a bound ``>= x``; when a limit ends the walk, every item
    not visited has a bound ``>= open_bound``, which is what the caller can still prove (an optimality gap).
    """
    import heapq

    heap: list = []
    it = iter(seeds)
    nxt = next(it, None)
    tick = 0
    expanded = 0
    while heap or nxt is not None:
        if heap and (nxt is None or heap[0][0] <= nxt[0]):
            lb, _, item = heapq.heappop(heap)
        else:
            assert nxt is not None
            lb, item = nxt
            nxt = next(it, None)
        verdict = cut(lb, item)
        if verdict == "stop":
            break
        if verdict == "skip":
            continue
        if limit is not None and expanded >= limit:
            return expanded, lb
        if progress is not None:
            progress(expanded, lb)
        expanded += 1
        for clb, child in expand(lb, item):
            tick += 1
            heapq.heappush(heap, (max(lb, clb), tick, child))
    return expanded, math.inf


class TopK:
    """The ``k`` best exactly evaluated entries by ``(primary, secondary, memory)`` (smaller is better) and the
    matching cut for :func:`guarded_best_first`: stop once a lower bound of the primary key is worse than the
    k-th best exact primary key (entries with an infinite primary key — a violated constraint — are dropped)."""

    def __init__(self, k: int):
        self.k = k
        self.entries: list[tuple] = []

    def add(self, primary: float, secondary: float, memory: float, *payload) -> None:
        """Record one exactly evaluated entry."""
        if np.isfinite(primary):
            self.entries.append((primary, secondary, memory, *payload))
            self.entries.sort(key=lambda x: x[:3])

    def cut(self, lower_bound: float, item=None) -> str | None:
        """``"stop"`` when no entry with this primary lower bound can enter the top k (or the bound is infinite)."""
        if not np.isfinite(lower_bound):
            return "stop"
        if len(self.entries) >= self.k and lower_bound * (1 - BOUND_SLACK) > self.entries[self.k - 1][0]:
            return "stop"
        return None

    def best(self) -> list[tuple]:
        """The top k entries, best first."""
        return self.entries[: self.k]
