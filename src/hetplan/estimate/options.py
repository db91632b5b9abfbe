"""Every option of a job and plan that changes a cost, in one frozen, hashable object built once.

:class:`TrainingOptions` is what the cost model (:func:`hetplan.estimate.stage.stage_costs`), the estimator and
every search take: built from a :class:`~hetplan.plan.Plan` (:meth:`TrainingOptions.from_plan`, what
``estimate()`` prices) or from a :class:`~hetplan.plan.Job` alone (:meth:`TrainingOptions.from_job`: the plan-level
options at the :class:`~hetplan.plan.Plan` defaults, which is what the plans a search proposes carry), so a search
cannot price a configuration with fewer options than ``estimate()`` prices its plan.

Each field has the name of the :class:`~hetplan.plan.Job` or :class:`~hetplan.plan.Plan` field it comes from,
and its meaning is documented there. Every other field of ``Job`` and ``Plan`` is listed in :data:`STRUCTURAL`
(what the degrees, the stage's work or the pipeline shape carry) or :data:`COST_NEUTRAL` (changes no cost), with
the reason; ``tests/estimate/test_options.py`` fails on a field in none of the three.

Adding a cost option: docs/adding-options.md.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from functools import lru_cache
from typing import TYPE_CHECKING

from hetplan.estimate.moe import DEFAULT_LOAD_IMBALANCE, MoEOptions
from hetplan.hardware.stacks import StackSpec, default_stack, resolve_stack

if TYPE_CHECKING:
    from hetplan.plan import Job, Plan

#: Fields of Job / Plan that are not options because another object of the cost model carries them.
STRUCTURAL: dict[str, str] = {
    "model": "the ModelSpec the cost functions take",
    "seq_len": "the stage's work (tokens per sequence)",
    "global_batch": "the stage's work (micro-batches per iteration)",
    "pools": "the stage's hardware (GPU spec, node, links, price)",
    "stages": "the stage's degrees (tp, dp) and work (layers, recomputation)",
    "mbs": "the stage's work (micro-batch size)",
    "zero": "ParallelLayout.zero_stage (dp_shard vs dp_replicate of Degrees)",
    "sequence_parallel": "ParallelLayout.sequence_parallel",
    "schedule": "the pipeline shape (in-flight micro-batches, simulation)",
    "virtual_stages": "Degrees.virtual_stages",
    "cp": "Degrees.cp",
    "ep": "Degrees.ep",
    "expert_tp": "Degrees.expert_tp",
}

#: Fields of Job / Plan that change no per-iteration cost.
COST_NEUTRAL: dict[str, str] = {
    "train_tokens": "the job length: iterations, not the cost of one",
    "train_iterations": "the job length: iterations, not the cost of one",
    "optimizer": "one value (adam), priced by the memory and optimizer-step terms",
    "pipeline_chunks": "layers per interleaved chunk (Megatron's layout string): the schedule prices each chunk at "
                       "1/v of its stage, so only the stage totals (stages[].num_layers) cost",
}


@dataclass(frozen=True, slots=True)
class TrainingOptions:
    """Every job and plan option that changes a cost (module doc); fields as in :class:`~hetplan.plan.Job`
    (first group) and :class:`~hetplan.plan.Plan` (second group). Frozen and hashable: the estimator groups
    stages by ``(hardware, options)``."""

    # Job
    dtype: str = "bf16"
    fp8_recipe: str | None = None
    attention: str = "flash"
    attention_kernel: str | None = None
    framework: str = "megatron"
    torch_compile: bool = True
    async_tp: bool = False
    moe_load_imbalance: float = DEFAULT_LOAD_IMBALANCE
    moe_dispatcher: str = "alltoall"
    moe_routing: str = "random"
    moe_recompute: bool = False
    moe_a2a_overlap: bool = False
    moe_capacity_factor: float | None = None
    moe_pad_to_capacity: bool = False
    mtp_layers: int = 0
    recompute_modules: tuple[str, ...] = ()
    offload_modules: tuple[str, ...] = ()
    cp_kv_exchange: str = "ring"
    cp_load_balance: bool = True
    stack: str | None = None
    # Plan
    overlap_grad_reduce: bool = True
    tp_comm_overlap: bool = False
    cuda_graphs: bool = False
    fsdp_shard: int | None = None
    reshard_after_forward: bool = True
    grad_reduce_dtype: str | None = None
    fsdp_param_dtype: str = "fp32"
    cross_entropy: str | None = None
    pipeline_step_microbatches: int | None = None
    pipeline_outputs: str = "last"

    @classmethod
    def from_job(cls, job: Job) -> TrainingOptions:
        """The options of ``job`` with every plan-level option at its :class:`~hetplan.plan.Plan` default."""
        return _build(job, None)

    @classmethod
    def from_plan(cls, plan: Plan) -> TrainingOptions:
        """The options of ``plan`` and its job."""
        return _build(plan.job, plan)

    @property
    def moe(self) -> MoEOptions:
        """The MoE layer's options (:class:`hetplan.estimate.moe.MoEOptions`)."""
        return _moe(self.moe_dispatcher, self.moe_routing, self.moe_recompute, self.moe_a2a_overlap)

    def stack_spec(self) -> StackSpec:
        """The software stack that runs the job (:meth:`hetplan.plan.Job.stack_spec`)."""
        return _stack(self.stack, self.framework)

    @property
    def fsdp(self) -> bool:
        """PyTorch FSDP2 (``framework = "fsdp"``): sharded at ZeRO-1 to 3, replicated (DDP) at ZeRO-0
        (:func:`hetplan.estimate.memory.fsdp_shard_ranks`)."""
        return self.framework == "fsdp"


JOB_FIELDS = ("dtype", "fp8_recipe", "attention", "attention_kernel", "framework", "torch_compile", "async_tp",
              "moe_load_imbalance", "moe_dispatcher", "moe_routing", "moe_recompute", "moe_a2a_overlap",
              "moe_capacity_factor", "moe_pad_to_capacity", "mtp_layers", "recompute_modules", "offload_modules",
              "cp_kv_exchange", "cp_load_balance", "stack")
PLAN_FIELDS = tuple(f.name for f in fields(TrainingOptions) if f.name not in JOB_FIELDS)


@lru_cache(maxsize=64)
def _stack(stack: str | None, framework: str) -> StackSpec:
    return resolve_stack(stack) if stack else default_stack(framework)


@lru_cache(maxsize=64)
def _moe(dispatcher: str, routing: str, recompute: bool, a2a_overlap: bool) -> MoEOptions:
    return MoEOptions(dispatcher, routing, recompute, a2a_overlap)


def _value(x: object) -> object:
    return tuple(x) if isinstance(x, list) else x


def _build(job: Job, plan: Plan | None) -> TrainingOptions:
    from hetplan.plan import Plan

    kw = {k: _value(getattr(job, k)) for k in JOB_FIELDS}
    if plan is None:
        kw.update({k: Plan.model_fields[k].default for k in PLAN_FIELDS})
    else:
        kw.update({k: getattr(plan, k) for k in PLAN_FIELDS})
    if kw["cross_entropy"] is None and kw["framework"] == "megatron" and "cross-entropy" not in job.stack_spec().fused:
        # a Megatron stack without the fused loss (before Megatron-Core 0.9 / NeMo 25.04) runs Megatron-LM's
        # vocab-parallel cross-entropy on an fp32 copy of the logits (StackSpec.fused; Plan.cross_entropy)
        kw["cross_entropy"] = "fp32"
    return TrainingOptions(**kw)  # type: ignore[arg-type]
