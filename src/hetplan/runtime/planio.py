"""Read a plan JSON and decide whether (and how) the reference runtime can run it. No torch.

A plan file is the JSON form of :class:`hetplan.plan.Plan`. A relative ``job.model`` path (a ``config.json``) is
resolved against the plan file's folder, so a plan and its model config can travel together
(``examples/tiny-pp2-dp2.json`` + ``examples/tiny-model.json``).

The runtime's layout (:class:`Layout`): ranks are ordered pipeline-major, then data-parallel, then
tensor-parallel (``rank = (pp_rank * dp + dp_rank) * tp + tp_rank``, the ``("pp", "dp", "tp")`` device mesh of
torchtitan), so TP groups are consecutive ranks (inside a node) and pipeline stages are blocks of ``dp * tp`` ranks.
Expert parallelism (MoE) re-partitions the DP ranks: an EP group is ``ep`` consecutive DP replicas (with the same
pipeline and TP rank; the experts are not TP-sharded), and the ranks holding the same experts in the ``dp / ep``
EP groups form the expert-DP group that reduces their gradients (Megatron-Core's expert layout with expert-TP 1).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from hetplan.errors import HetplanError
from hetplan.inputs import parse_json, read_text, validation_message
from hetplan.jobfile import resolve_model_path
from hetplan.model.reference import unsupported_features
from hetplan.model.spec import ModelSpec, load_model
from hetplan.plan import ParallelLayout, Plan
from hetplan.plan_rules import PlanRuleError, check_plan

#: Pipeline schedules the runtime offers (the plan's ``schedule`` or the ``--schedule`` override).
SCHEDULES = ("1f1b", "gpipe", "interleaved")
#: Why ``hetplan run`` refuses CP > 1: what torch 2.13 lacks (checked on torch 2.13.0:
#: ``torch/distributed/tensor/experimental/_context_parallel/_attention.py`` maps only these three ops to ring
#: attention; on CPU SDPA dispatches to ``aten._scaled_dot_product_flash_attention_for_cpu``, which DTensor then
#: refuses: "does not have a sharding strategy registered").
CP_MISSING = ("torch 2.13's context_parallel (torch.distributed.tensor.experimental) swaps in ring attention only for "
              "the CUDA attention kernels (aten._scaled_dot_product_flash_attention, _efficient_attention, "
              "_cudnn_attention), not for CPU's aten._scaled_dot_product_flash_attention_for_cpu, so it cannot run "
              "on CPU / gloo; on GPUs the reference trainer does not wire it in yet")


def load_plan(path: str | Path, field: str = "PLAN") -> Plan:
    """Read and validate a plan JSON file; a relative ``job.model`` path is made relative to the plan's folder.
    ``field``: the argument or option that named the file (``hetplan plan --baseline``), for the errors.

    Raises:
        HetplanError: missing file, malformed JSON (with line and column), or a field that fails validation
            (named as ``plan.<dotted.path>``).
    """
    p = Path(path)
    raw = parse_json(read_text(p, field), str(p), field)
    if not isinstance(raw, dict):
        raise HetplanError(f"{p} must hold a JSON object (a plan)", field=field,
                           fix="write the plan as {\"job\": ..., \"pools\": ..., \"stages\": ..., \"mbs\": ...}")
    model = raw.get("job", {}).get("model") if isinstance(raw.get("job"), dict) else None
    if isinstance(model, str):
        raw["job"]["model"] = resolve_model_path(model, p)
    try:
        return Plan.model_validate(raw)
    except ValidationError as exc:
        raise validation_message(exc, "plan", Plan) from None


@dataclass(frozen=True)
class Layout:
    """How the runtime places a plan on ranks.

    Attributes:
        parallel: the plan's :class:`~hetplan.plan.ParallelLayout` (the same on every stage): the degrees
            ``pp``, ``dp``, ``tp`` and ``ep`` (divides ``dp``; module doc) are read from it.
        stage_layers: ``[start, end)`` layer range of each pipeline stage (the plan's uneven split).
        num_microbatches: micro-batches per pipeline per iteration (global_batch / (dp * mbs)).
        schedule: ``1f1b``, ``gpipe`` or ``interleaved``; virtual_stages: model chunks per rank (interleaved).
        chunk_layers: ``[start, end)`` of each model chunk in pipeline order (``pp * virtual_stages`` chunks;
            chunk ``k`` runs on pipeline rank ``k % pp``).
    """

    parallel: ParallelLayout
    stage_layers: tuple[tuple[int, int], ...]
    num_microbatches: int
    schedule: str
    virtual_stages: int
    chunk_layers: tuple[tuple[int, int], ...]

    @property
    def pp(self) -> int:
        return self.parallel.pp

    @property
    def dp(self) -> int:
        return self.parallel.dp

    @property
    def tp(self) -> int:
        return self.parallel.tp

    @property
    def ep(self) -> int:
        return self.parallel.ep

    @property
    def world_size(self) -> int:
        """pp * dp * tp ranks."""
        return self.parallel.world_size

    def coords(self, rank: int) -> tuple[int, int, int]:
        """``(pp_rank, dp_rank, tp_rank)`` of a global rank."""
        return rank // (self.dp * self.tp), (rank // self.tp) % self.dp, rank % self.tp

    def ep_groups(self) -> list[list[int]]:
        """The ranks of every EP group (module doc), in a fixed order (every rank creates every group)."""
        return [[(p * self.dp + g * self.ep + j) * self.tp + t for j in range(self.ep)]
                for p in range(self.pp) for t in range(self.tp) for g in range(self.dp // self.ep)]

    def expert_dp_groups(self) -> list[list[int]]:
        """The ranks of every expert-DP group: those holding the same experts, one per EP group."""
        return [[(p * self.dp + g * self.ep + j) * self.tp + t for g in range(self.dp // self.ep)]
                for p in range(self.pp) for t in range(self.tp) for j in range(self.ep)]


def layout(plan: Plan, spec: ModelSpec, *, schedule: str | None = None, virtual_stages: int = 2,
           max_world_size: int | None = None) -> Layout:
    """Check that the runtime can run ``plan`` and return its :class:`Layout`.

    Args:
        schedule: override of the plan's schedule (``1f1b``, ``gpipe``, ``interleaved``); without it a plan with
            ``virtual_stages`` > 1 runs interleaved with its own v and ``pipeline_chunks`` (what its estimate priced).
        virtual_stages: model chunks per pipeline rank for ``schedule = "interleaved"`` (>= 2; ignored otherwise).
        max_world_size: the most ranks allowed (e.g. GPUs available, or a CPU process cap).
    Raises:
        PlanRuleError: the plan breaks a rule of :mod:`hetplan.plan_rules` (TP not dividing heads, layers not
            adding up, ...).
        HetplanError: stages with different TP or DP degrees (the runtime needs one (dp, tp) for all stages),
            a stage too small to interleave, an unknown schedule, more ranks than ``max_world_size``; a model
            the reference transformer does not build (:func:`hetplan.model.reference.unsupported_features`); token
            dropping (``job.moe_capacity_factor``: its router is dropless); multi-token prediction
            (``job.mtp_layers``: it builds no MTP module); CP > 1 (see :data:`CP_MISSING`); EP not dividing DP or expert-TP > 1 (MoE parallel folding: rule
            ``framework-can-launch``). All refused before any process starts.
    """
    check_plan(plan, spec)
    missing = unsupported_features(spec)
    if missing:
        raise HetplanError(f"the reference trainer does not build {spec.name}: it has {', '.join(missing)}",
                           field="plan.job.model",
                           fix="run a dense or Mixtral / Qwen-MoE-shaped model, or export the plan: hetplan export "
                               "PLAN --to megatron (or torchtitan)")
    if spec.is_moe and plan.job.moe_capacity_factor is not None:
        raise HetplanError(f"the plan drops tokens at capacity factor {plan.job.moe_capacity_factor:g}; the reference "
                           "trainer's router is dropless (hetplan.model.torch_moe), so it would run another job",
                           field="plan.job.moe_capacity_factor",
                           fix="plan without moe_capacity_factor, or export it: hetplan export PLAN --to megatron")
    if plan.job.mtp_layers:
        raise HetplanError(f"the plan trains {plan.job.mtp_layers} multi-token-prediction module(s); the reference "
                           "trainer builds none (hetplan.model.torch_transformer), so it would run another job",
                           field="plan.job.mtp_layers",
                           fix="plan without mtp_layers, or export it: hetplan export PLAN --to megatron")
    if plan.cp > 1:
        raise HetplanError(f"context parallelism (CP {plan.cp}) does not run here: {CP_MISSING}", field="plan.cp",
                           fix="run the plan with cp = 1, or export it: hetplan export PLAN --to megatron (or "
                               "torchtitan)")
    # a plan priced as interleaved runs its own interleaving (its v and chunks) unless --schedule overrides it
    own = schedule is None and plan.pp > 1 and plan.virtual_stages > 1
    sched = "interleaved" if own else (schedule or plan.schedule).lower()
    if sched not in SCHEDULES:
        raise HetplanError(f"unknown schedule {sched!r}", field="--schedule", fix=f"use one of {', '.join(SCHEDULES)}")
    tps = {st.tp for st in plan.stages}
    dps = {st.dp for st in plan.stages}
    if len(tps) > 1 or len(dps) > 1:
        raise HetplanError(
            f"stages have different TP degrees {sorted(tps)} or DP degrees {sorted(dps)}; the runtime runs one "
            "(dp, tp) for all stages (torch.distributed.pipelining needs matching DP replicas across stages)",
            field="plan.stages[].tp/dp", fix="give every stage the same tp and dp (layer counts may differ)")
    par = plan.stage_layout(0)
    tp, dp, pp = par.tp, par.dp, par.pp
    if plan.ep > 1 and (dp % plan.ep or par.expert_tp > 1):
        # MoE parallel folding (EP over TP x DP, expert-TP) needs each TP rank to hold its own tokens (Megatron-Core
        # sequence parallelism before the dispatch); the reference transformer's TP ranks hold the same tokens, so
        # an EP group across them would dispatch each token tp times
        raise PlanRuleError("framework-can-launch", f"hetplan run keeps EP within DP: EP {plan.ep} x expert-TP "
                            f"{par.expert_tp} over DP {dp} is MoE parallel folding, which the reference trainer "
                            "does not run (its TP ranks hold the same tokens, so an EP group spanning them would "
                            "dispatch each token TP times; each EP group is EP consecutive DP replicas, experts "
                            "not TP-sharded)", field="plan.ep",
                            fix=f"run with expert_tp = 1 and an EP degree dividing dp = {dp} (and the "
                                f"{spec.num_experts} experts), or export the plan: hetplan export PLAN --to megatron")
    world = pp * dp * tp
    if max_world_size is not None and world > max_world_size:
        raise HetplanError(f"the plan needs {world} ranks (pp {pp} x dp {dp} x tp {tp}) but at most {max_world_size} "
                           "are allowed here", field="plan.stages",
                           fix="use fewer stages / smaller dp or tp, add nodes (--nnodes), or raise --max-procs")
    bounds, start = [], 0
    for st in plan.stages:
        bounds.append((start, start + st.num_layers))
        start += st.num_layers
    v = plan.virtual_stages if own else virtual_stages if sched == "interleaved" else 1
    sizes = plan.pipeline_chunks if own else None  # Megatron-Core's layout: a layer list per chunk
    if sched == "interleaved":
        if v < 2:
            raise HetplanError("the interleaved schedule needs at least 2 virtual stages per rank",
                               field="--virtual-stages", fix="pass --virtual-stages 2 (or more)")
        if pp < 2:
            raise HetplanError("the interleaved schedule needs pipeline parallelism", field="--schedule",
                               fix="use 1f1b or gpipe for a single-stage plan")
    small = [i for i, st in enumerate(plan.stages) if st.num_layers < v]
    if small and sizes is None:
        raise HetplanError(f"stages {small} hold fewer layers than the {v} virtual stages per rank",
                           field="plan.stages[].num_layers", fix="give each stage at least --virtual-stages layers")
    if sizes is not None and any(n == 0 for i, c in enumerate(sizes) for j, n in enumerate(c)
                                 if (i, j) not in ((0, 0), (pp - 1, v - 1))):
        raise HetplanError(f"pipeline_chunks {sizes} leave a model chunk inside the pipeline without layers; the "
                           "reference trainer builds an empty chunk only beside the embedding or the loss",
                           field="plan.pipeline_chunks", fix="give every inner chunk at least one layer")
    chunks: list[tuple[int, int] | None] = [None] * (pp * v)
    for i, (a, b) in enumerate(bounds):
        n = b - a
        q, r = divmod(n, v)
        s0 = a
        for j in range(v):
            size = sizes[i][j] if sizes is not None else q + (1 if j < r else 0)
            chunks[j * pp + i] = (s0, s0 + size)
            s0 += size
    # Chunks must cover layers in pipeline order; rebuild contiguously in chunk order with the per-chunk sizes.
    ordered, s0 = [], 0
    for c in chunks:
        size = c[1] - c[0]
        ordered.append((s0, s0 + size))
        s0 += size
    mb = plan.num_microbatches(0)
    if pp > 1 and sched == "interleaved" and mb % pp:
        raise HetplanError(f"the interleaved schedule needs the micro-batches per pipeline ({mb}) to be a multiple of "
                           f"pp = {pp}", field="plan.job.global_batch", fix="change global_batch or mbs")
    return Layout(parallel=par, stage_layers=tuple(bounds), num_microbatches=mb, schedule=sched, virtual_stages=v,
                  chunk_layers=tuple(ordered))


def dp_mode(plan: Plan, override: str | None = None) -> str:
    """How the reference trainer runs the plan's data parallelism: ``override`` (``--dp-mode``), else ``fsdp``
    (FSDP2, ZeRO-3) for a ZeRO-3 plan and ``ddp`` (replicated: ZeRO-0) for any other, ZeRO-1 / 2 included."""
    return override or ("fsdp" if plan.zero == 3 else "ddp")


def recomputes(plan: Plan) -> bool:
    """Whether ``plan`` recomputes activations (a stage's ``recompute``, or the job's Megatron-Core modules),
    which the reference trainer does not run."""
    return (any(st.recomputed_layers() for st in plan.stages) or bool(plan.job.recompute_modules)
            or plan.job.moe_recompute)


def as_run(plan: Plan, lay: Layout, dp_mode_override: str | None = None) -> Plan:
    """``plan`` as the reference trainer runs it on layout ``lay`` (what ``hetplan verify`` estimates and
    ``hetplan run`` checks host memory with): the layout's schedule and virtual stages (``--schedule`` /
    ``--virtual-stages`` override the plan's; in-flight micro-batches set the activations), ZeRO-0 where DP runs as
    DDP (:func:`dp_mode`: replicated, what ZeRO-1/2/3 would shard), no recomputation (it checkpoints nothing) and no
    sequence parallelism (its TP ranks hold the whole sequence)."""
    ran: dict = {"schedule": "gpipe" if lay.schedule == "gpipe" else "1f1b", "virtual_stages": lay.virtual_stages,
                 "sequence_parallel": False, "tp_comm_overlap": False}
    if lay.virtual_stages != plan.virtual_stages:  # the plan's own chunks are not the run's
        ran["pipeline_chunks"] = None
    if dp_mode(plan, dp_mode_override) == "ddp":
        ran |= {"zero": 0, "fsdp_shard": None}
    if recomputes(plan):
        ran |= {"stages": [st.model_copy(update={"recompute": "none", "recompute_layers": None}) for st in plan.stages],
                "job": plan.job.model_copy(update={"recompute_modules": [], "moe_recompute": False})}
    return plan.model_copy(deep=True, update=ran)


def run_differences(plan: Plan, tp: int, dp_mode_override: str | None = None) -> list[str]:
    """What the reference trainer runs unlike ``plan`` (:func:`as_run`), in words: ZeRO-1/2/3 as DDP, no
    recomputation, no sequence parallelism at ``tp`` > 1. ``hetplan run`` prints them; ``hetplan verify``
    estimates the plan as run and prints them too."""
    out = []
    if plan.zero and dp_mode(plan, dp_mode_override) == "ddp":
        out.append(f"the plan's ZeRO-{plan.zero} runs as DDP (replicated; --dp-mode fsdp shards)")
    if recomputes(plan):
        out.append("the reference trainer recomputes no activations (the plan's recomputation is not run)")
    if plan.sequence_parallel and tp > 1:
        out.append("the reference trainer's TP has no sequence parallelism")
    return out


def plan_model(plan: Plan) -> ModelSpec:
    """The plan's model spec (preset or config path).

    Raises:
        HetplanError: unknown model / bad config (from :func:`hetplan.model.spec.load_model`).
    """
    return load_model(plan.job.model)


def predicted_memory_bytes(mem, element_bytes: int) -> float:
    """Map an estimator :class:`MemoryBreakdown` (Megatron mixed precision: 2-byte weights, 4-byte gradients,
    12 bytes of Adam state per parameter, 2-byte activations, plus CUDA overhead) to what the runtime holds when it
    trains in one dtype of ``element_bytes`` with AdamW (weights, gradients and two Adam states of that size):
    weights x e/2 + gradients x e/4 + optimizer x 2e/12 + activations x e/2, no CUDA context or fragmentation."""
    e = element_bytes
    return mem.weights * e / 2 + mem.gradients * e / 4 + mem.optimizer * 2 * e / 12 + mem.activations * e / 2
