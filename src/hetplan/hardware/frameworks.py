"""Training frameworks as launch targets, as data: ``data/frameworks.toml`` says, per release that ``hetplan
export`` writes for, which pipeline splits, schedules, ZeRO modes, parallel dimensions and combinations (EP
folding, expert-TP), FP8 recipes per GPU generation and attention backends it runs, each with its source.

:func:`hetplan.plan_rules.launch_violations` checks a plan against its framework's entry (rule
``framework-can-launch``); ``hetplan export`` refuses what the target cannot launch through it.
"""

from __future__ import annotations

import tomllib
from functools import lru_cache
from importlib import resources

from pydantic import BaseModel, ConfigDict


class FrameworkSpec(BaseModel):
    """One framework release (see ``frameworks.toml`` for each field's meaning; ``sources`` maps field -> source)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    release: str
    export: str
    job_framework: str
    splits: tuple[str, ...]
    interleaved: bool
    schedules: tuple[str, ...]
    extra_schedules: tuple[str, ...]
    zero: tuple[int, ...]
    zero_with_pp: tuple[int, ...]
    tp: bool
    cp: bool
    ep: bool
    expert_tp: bool
    ep_beyond_dp: bool
    moe_capacity: bool
    fp8: dict[str, tuple[str, ...]]
    attention: tuple[str, ...]
    cuda_graphs: tuple[str, ...]
    cuda_graphs_with: tuple[str, ...]
    sources: dict[str, str]

    @property
    def id(self) -> str:
        return f"{self.name} {self.release}"

    def fp8_recipes(self, architecture: str) -> tuple[str, ...]:
        """The FP8 recipes on a GPU of ``architecture`` (its first word, lower case, picks the generation)."""
        return self.fp8.get(architecture.split()[0].lower() if architecture else "", ())


@lru_cache(maxsize=1)
def load_frameworks() -> tuple[FrameworkSpec, ...]:
    """Every framework release of ``data/frameworks.toml``."""
    raw = tomllib.loads((resources.files("hetplan.hardware") / "data" / "frameworks.toml").read_text())
    return tuple(FrameworkSpec(**f) for f in raw["framework"])


def job_framework(job_framework: str) -> FrameworkSpec | None:
    """The release whose launch ``hetplan export`` writes by default for plans of ``Job.framework`` =
    ``job_framework`` (the first entry of ``frameworks.toml`` naming it), None when none does: what the searches
    may propose for such a job (expert-TP, EP folding, interleaving)."""
    return next((f for f in load_frameworks() if f.job_framework == job_framework), None)


def framework_for(export: str, release: str | None = None) -> FrameworkSpec:
    """The entry of export target ``export`` (``megatron``, ``torchtitan``, ``deepspeed``) at ``release`` (default:
    its first, the release the export writes by default).

    Raises:
        KeyError: no such target or release.
    """
    for f in load_frameworks():
        if f.export == export and (release is None or f.release == release):
            return f
    raise KeyError(f"{export} {release}")
