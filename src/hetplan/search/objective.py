"""Objectives and constraints of the plan search.

* ``fastest``: minimise the job's wall-clock time (iteration time x iterations); ties broken by $ for the job.
* ``cheapest``: minimise $ for the job subject to job time ≤ ``deadline_s`` (no deadline: cheapest overall).
* ``budget``: minimise job time subject to $ for the job ≤ ``budget_usd``.
* ``slo_iteration_s`` (any goal): iteration time ≤ this SLO, e.g. ``cheapest`` with an SLO is Espresso's problem
  (Espresso: least $ per iteration subject to an iteration-time SLO).

Every configuration must fit in GPU memory. :func:`rank_keys` returns one sort key per configuration (smaller is
better, ``inf`` when a constraint fails), so the ranking is a single ``argsort``.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator


class Objective(BaseModel):
    """What to optimise: ``goal`` plus its constraint (seconds, USD)."""

    model_config = ConfigDict(extra="forbid")

    goal: Literal["fastest", "cheapest", "budget"] = "fastest"
    deadline_s: float | None = Field(default=None, gt=0)
    budget_usd: float | None = Field(default=None, gt=0)
    slo_iteration_s: float | None = Field(default=None, gt=0)

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
    if objective.goal == "fastest":
        primary, secondary = job_time_s, job_usd
    elif objective.goal == "cheapest":
        if objective.deadline_s is not None:
            ok &= job_time_s <= objective.deadline_s
        primary, secondary = job_usd, job_time_s
    else:
        ok &= job_usd <= objective.budget_usd
        primary, secondary = job_time_s, job_usd
    return np.where(ok, primary, np.inf), secondary
