"""Parallel degrees: how the GPUs of one pipeline stage are laid out, in one place.

Two objects, one set of names:

* :class:`Degrees` — a frozen dataclass of the degrees (tp, cp, ep, expert_tp, dp as ``dp_shard × dp_replicate``,
  pp, virtual stages). Each field holds an ``int`` (one plan's stage) or a numpy array (thousands of
  configurations of a vectorised search, broadcasting like every cost function); the group sizes derived from
  them — GPUs of a stage ``tp·cp·dp``, the dense gradient-reduction group ``dp·cp``, the expert-parallel ranks
  ``ep·expert_tp`` and the expert data-parallel degree — are derived here and nowhere else.
* :class:`ParallelLayout` — the validated, plan-side form (pydantic, ints only) with sequence parallelism and the
  ZeRO stage, read by the exporters and the runtime (:meth:`hetplan.plan.Plan.stage_layout`); its
  :attr:`~ParallelLayout.degrees` is the :class:`Degrees` the cost model takes.

Expert layout (MoE parallel folding, Megatron-Core ``megatron/core/parallel_state.py``,
``initialize_model_parallel``): the expert layers re-partition the same ``tp·cp·dp`` ranks of a stage as
``ep × expert_tp × expert_dp``, so ``expert_dp = tp·cp·dp / (ep·expert_tp)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator


@dataclass(frozen=True)
class Degrees:
    """The parallel degrees of a pipeline stage (module doc). Every field is an ``int`` or a numpy array
    (configurations of a search); the properties broadcast.

    Attributes:
        tp: tensor-parallel degree (Megatron-LM ``--tensor-model-parallel-size``).
        cp: context-parallel degree: each sequence split over ``cp`` ranks (``--context-parallel-size``).
        dp_shard: data-parallel ranks over which weights / gradients / optimizer states are sharded (ZeRO,
            FSDP; 1 without ZeRO).
        dp_replicate: data-parallel replicas of those shards (plain DP when ``dp_shard == 1``; HSDP's replicas).
        ep: expert-parallel degree: the routed experts of an MoE layer split over ``ep`` ranks.
        expert_tp: tensor-parallel degree inside an expert (``--expert-tensor-parallel-size``).
        pp: pipeline-parallel degree (stages).
        virtual_stages: model chunks per stage (interleaved 1F1B, Narayanan et al. SC'21 Sec. 2.2.2).
    """

    tp: Any = 1
    cp: Any = 1
    dp_shard: Any = 1
    dp_replicate: Any = 1
    ep: Any = 1
    expert_tp: Any = 1
    pp: Any = 1
    virtual_stages: Any = 1

    @classmethod
    def of(cls, *, dp: Any, zero: Any = 0, **degrees: Any) -> Degrees:
        """The degrees with ``dp`` data-parallel ranks sharded where ``zero >= 1`` (``dp_shard = dp``) and
        replicated where ``zero == 0`` (``dp_replicate = dp``); arrays broadcast. ``degrees``: the other fields."""
        shard: tuple[Any, Any]
        if np.ndim(dp) == 0 and np.ndim(zero) == 0:
            shard = (dp, 1) if zero else (1, dp)
        else:
            sharded = np.asarray(zero) >= 1
            shard = (np.where(sharded, dp, 1), np.where(sharded, 1, dp))
        return cls(dp_shard=shard[0], dp_replicate=shard[1], **degrees)

    @property
    def dp(self) -> Any:
        """Data-parallel degree: ``dp_shard · dp_replicate``."""
        return self.dp_shard * self.dp_replicate

    @property
    def gpus_per_stage(self) -> Any:
        """GPUs of one pipeline stage: ``tp · cp · dp``."""
        return self.tp * self.cp * self.dp

    @property
    def world_size(self) -> Any:
        """GPUs of the whole job: ``gpus_per_stage · pp``."""
        return self.gpus_per_stage * self.pp

    @property
    def dense_dp(self) -> Any:
        """Ranks holding the same dense (non-expert) weight shard, over which its gradients are reduced:
        ``dp · cp`` (context-parallel ranks hold full weights and reduce with DP; Megatron-LM's
        ``data_parallel_group_with_context_parallel``)."""
        return self.dp * self.cp

    @property
    def expert_ranks(self) -> Any:
        """Ranks one expert layer is split over: ``ep · expert_tp``."""
        return self.ep * self.expert_tp

    @property
    def expert_dp(self) -> Any:
        """Data-parallel degree of the expert weights (module doc): ``tp·cp·dp / (ep·expert_tp)``, the ranks
        that hold the same experts and reduce their gradients (a float or float array: the cost formulas divide
        by it; ``ep·expert_tp`` divides ``tp·cp·dp`` in a valid layout, :class:`ParallelLayout`)."""
        return (np.asarray(self.tp) * np.asarray(self.cp) * np.asarray(self.dp)
                / (np.asarray(self.ep) * np.asarray(self.expert_tp)))

    def with_(self, **changes: Any) -> Degrees:
        """A copy with ``changes`` (e.g. the rows of a search kept: ``d.with_(tp=d.tp[keep], ...)``)."""
        from dataclasses import replace

        return replace(self, **changes)

    def select(self, index: Any) -> Degrees:
        """The configurations ``index`` of array fields (scalar fields kept)."""
        return Degrees(**{k: (v[index] if np.ndim(v) else v) for k, v in self.__dict__.items()})


class ParallelLayout(BaseModel):
    """How one pipeline stage's GPUs are laid out, validated (as torchtitan's ``ParallelDims``,
    ``torchtitan/distributed/parallel_dims.py``): the fields of :class:`Degrees` as ints, plus sequence
    parallelism and the ZeRO stage. The exporters and the runtime read it (:meth:`hetplan.plan.Plan.stage_layout`);
    the cost model reads :attr:`degrees`.

    Attributes:
        tp, cp, ep, expert_tp, dp_shard, dp_replicate, pp, virtual_stages: as :class:`Degrees`.
        sequence_parallel: Megatron sequence parallelism inside the TP group (acts only when ``tp > 1``).
        zero_stage: ZeRO stage 0-3 over the ``dp_shard`` group (1 = Megatron-LM's distributed optimizer,
            3 = FSDP).

    Raises (on construction, pydantic ``ValidationError`` naming the rule):
        a degree below 1; ``dp_shard > 1`` without ZeRO (nothing would be sharded); ``ep * expert_tp`` not
        dividing ``tp * cp * dp`` (module doc, expert layout).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    tp: int = Field(default=1, ge=1)
    cp: int = Field(default=1, ge=1)
    ep: int = Field(default=1, ge=1)
    expert_tp: int = Field(default=1, ge=1)
    dp_shard: int = Field(default=1, ge=1)
    dp_replicate: int = Field(default=1, ge=1)
    pp: int = Field(default=1, ge=1)
    virtual_stages: int = Field(default=1, ge=1)
    sequence_parallel: bool = False
    zero_stage: int = Field(default=0, ge=0, le=3)

    @model_validator(mode="after")
    def _check(self) -> ParallelLayout:
        if self.zero_stage == 0 and self.dp_shard > 1:
            raise ValueError(f"dp_shard = {self.dp_shard} needs zero_stage >= 1 (without ZeRO / FSDP nothing is "
                             "sharded): use dp_replicate for plain data parallelism")
        d = self.degrees
        if d.gpus_per_stage % d.expert_ranks:
            raise ValueError(f"ep * expert_tp = {self.ep} * {self.expert_tp} must divide tp * cp * dp = "
                             f"{d.gpus_per_stage} (the expert layout re-partitions the same ranks)")
        return self

    @classmethod
    def of(cls, *, dp: int, zero_stage: int = 0, **degrees: Any) -> ParallelLayout:
        """The layout with ``dp`` data-parallel ranks sharded (``zero_stage >= 1``: ``dp_shard = dp``) or
        replicated (``zero_stage == 0``: ``dp_replicate = dp``); ``degrees``: the other fields."""
        shard = {"dp_shard": dp} if zero_stage else {"dp_replicate": dp}
        return cls(zero_stage=zero_stage, **shard, **degrees)

    @cached_property
    def degrees(self) -> Degrees:
        """The :class:`Degrees` of this layout (ints; made once, the layout is frozen)."""
        return Degrees(tp=self.tp, cp=self.cp, dp_shard=self.dp_shard, dp_replicate=self.dp_replicate, ep=self.ep,
                       expert_tp=self.expert_tp, pp=self.pp, virtual_stages=self.virtual_stages)

    @property
    def dp(self) -> int:
        """Data-parallel degree (:attr:`Degrees.dp`)."""
        return int(self.degrees.dp)

    @property
    def gpus_per_stage(self) -> int:
        """GPUs of one pipeline stage (:attr:`Degrees.gpus_per_stage`)."""
        return int(self.degrees.gpus_per_stage)

    @property
    def world_size(self) -> int:
        """GPUs of the whole job (:attr:`Degrees.world_size`)."""
        return int(self.degrees.world_size)

    @property
    def expert_dp(self) -> int:
        """Data-parallel degree of the expert weights (:attr:`Degrees.expert_dp`)."""
        return int(self.degrees.expert_dp)

    @property
    def sequence_parallel_active(self) -> bool:
        """Sequence parallelism takes effect: asked for and ``tp > 1``."""
        return self.sequence_parallel and self.tp > 1
