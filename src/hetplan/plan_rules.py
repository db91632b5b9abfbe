"""The one plan validator: the rules every plan must satisfy before it is estimated, exported or run.

``hetplan plan`` (on what the search returns), ``estimate``, ``export``, ``run`` and ``verify`` all call
:func:`check_plan`; a plan that breaks a rule is refused with a :class:`PlanRuleError` naming the rule (exit 2 in
the CLI). The schema (:class:`hetplan.plan.Plan`) checks what one plan alone decides (pool indices, batch
divisibility, per-stage micro-batch sizes); the rules here need the model's shapes too.

Rules (name: what must hold, and why):

* ``layers-cover-model``: the stages' ``num_layers`` add up to the model's layers — every layer placed exactly once.
* ``tp-divides-heads`` / ``tp-divides-kv-heads`` / ``tp-divides-ffn``: TP divides the attention heads, the
  key/value heads and the MLP width: Megatron-LM's column/row-parallel linears split those dimensions evenly
  (``megatron/core/tensor_parallel/layers.py``: ``divide(output_size, world_size)``; GQA needs
  ``num_query_groups % tp == 0``); torchtitan's and our DTensor TP shard the same dimensions.
* ``pool-gpu-count``: the stages on a pool use at most the pool's GPUs (sum of tp x cp x dp) — a plan on 128
  GPUs of a 64-GPU pool would be priced and run on GPUs that do not exist.
* ``tp-within-node``: no TP group straddles two nodes. Stages take consecutive GPUs of their pool (as in
  :func:`hetplan.plan.boundary_is_intra_node`) and a TP group consecutive GPUs of its stage; a group either lies
  inside one node or spans whole nodes (TP across nodes is slow but possible; half a node plus half of another is
  a placement no launcher makes).
* ``virtual-stages``: interleaved 1F1B (``virtual_stages`` > 1) needs pp > 1, the 1F1B schedule, a micro-batch
  count that is a multiple of pp and layers per stage divisible by the virtual stages, the first and last stage
  counting their embedding / loss as one layer (Llama 3's uneven stages) (Megatron-LM's conditions,
  Narayanan et al. SC'21 Sec. 2.2.2; the estimator would otherwise silently fall back to plain 1F1B).
* ``seq-len``: the sequence fits the model's position encoding (``max_position_embeddings``).
* ``cp-divides-sequence`` (CP > 1): the sequence splits into 2 x CP equal chunks (Megatron-Core's load-balanced
  context parallelism gives each CP rank chunks i and 2·CP-1-i).
* ``ep-needs-experts`` / ``ep-divides-experts`` (EP > 1): the model has experts and EP divides their number;
  likewise an expert-TP degree above 1 needs experts to split.
  That EP x expert-TP divides TP x CP x DP is checked by :class:`hetplan.plan.ParallelLayout` itself.
* ``moe-modules-need-experts``: ``job.recompute_modules = ["moe_act"]`` and ``job.offload_modules`` (``expert_fc1``,
  ``moe_act``) name modules of MoE layers: the model has experts. On a dense model the estimate would drop them
  without a word, and Megatron-Core refuses ``moe_act`` recomputation without ``--moe-grouped-gemm``
  (``megatron/core/transformer/transformer_config.py``).
* ``mla-modules-need-mla``: ``job.recompute_modules = ["mla_up_proj"]`` recomputes multi-latent attention's
  up-projections: the model has MLA (Megatron-Core's ``TransformerConfig`` raises "mla_up_proj in
  recompute_modules is only supported with multi_latent_attention").
* ``stack-has-option``: ``job.dtype = "bf16"`` (stacks.toml ``bf16_zero``, ``pipeline_bf16_zero``: the ZeRO
  stages a bf16 run may use), ``job.dtype = "fp8"`` (stacks.toml ``fp8``) and its ``job.fp8_recipe`` (``fp8_recipes``:
  torchtitan 0.3.0 removed torchao's ``tensorwise``), ``plan.tp_comm_overlap``, ``plan.cuda_graphs``, the ZeRO stage (with DP > 1; under FSDP
  stacks the sharding mode the launch names: llm-foundry runs FULL_SHARD only) and each stage's recomputation exist in the job's stack (:meth:`hetplan.plan.Job.stack_spec`,
  ``hetplan catalog stacks``): Megatron-LM 2.5 has no distributed optimizer and no selective recomputation,
  before Megatron-Core 0.4 no ``--tp-comm-overlap``, before 0.9 no ``--enable-cuda-graph``; priced anyway they
  would be numbers of a run that stack cannot make. Likewise the parallel dimensions (TP, PP, CP, EP > 1) and
  interleaved 1F1B (virtual stages > 1) the stack's launcher runs (``parallel``, ``interleaved`` in
  ``hardware/data/stacks.toml``): llm-foundry 0.3 runs FSDP only, DeepSpeed's engine no TP, torchtitan of 2024-04
  no PP. The searches enumerate only what the stack offers.

* ``moe-modules-need-experts`` also covers ``job.moe_recompute`` (Megatron-Core ``--recompute-modules moe``: the
  MoE layers' MLP), ``job.moe_capacity_factor`` (token dropping) and, set away from their defaults,
  ``job.moe_load_imbalance``, ``moe_dispatcher``, ``moe_routing`` and ``moe_a2a_overlap``, which a dense model does
  not have (the estimate ignored them without a word).
* ``attention-kernel-on-gpu``: a fused attention kernel the job names (``job.attention_kernel``) runs on the plan's
  GPUs: FlashAttention-3 is written for Hopper (Shah et al. 2024, Sec. 1; Dao-AILab/flash-attention ``hopper/``:
  sm90 only), cuDNN's fused flash attention needs NVIDIA sm80 or later (cuDNN ``Fused Flash Attention`` support
  matrix: Ampere, Ada, Hopper, Blackwell), FlashAttention-2 needs Ampere or later on NVIDIA (flash-attn README:
  "Ampere, Ada, or Hopper GPUs"; Turing/Volta unsupported) or AMD CDNA (its ROCm backend). Elsewhere the
  estimate would price a kernel that cannot run (FA3 on A100 came out faster than the default).
* ``pipeline-step-microbatches``: a call of the pipeline schedule (``plan.pipeline_step_microbatches``, NeMo
  AutoModel's ``pp_microbatch_size`` split) holds at most the iteration's micro-batches (more is a typo, not a
  setting: remove it to run them all in one call), and under interleaving a multiple of pp (each call is an
  interleaved schedule of its own: Megatron-LM's and PyTorch's ``ScheduleInterleaved1F1B`` need a micro-batch
  count divisible by pp; the estimate's schedule raised on 2 or 3 at PP 4).
* ``dtype-on-gpu``: every pool's GPU type has a tensor-core rate for ``job.dtype`` (FP8 needs Hopper, Ada,
  Blackwell or CDNA3; BF16 needs Ampere or later; ``fp8_recipe = "mxfp8"`` Blackwell): the export would
  otherwise write FP8 flags for an A100 plan that ``estimate`` refuses. GPU types the package catalog does not
  know (a user's ``--catalog``) are left to the estimator.
* ``framework-can-launch`` (``hetplan export``, checked against the target; :func:`launch_violations`): the
  framework release the export writes for runs the plan's layer split, interleaving, schedule, ZeRO mode (with
  PP), TP / CP / EP / expert-TP degrees, EP beyond DP x CP, token dropping (``job.moe_capacity_factor``), FP8 on
  the plan's GPUs (and the FP8 recipe the plan
  names, ``job.fp8_recipe``, which was priced: a torchao recipe exported to Megatron-LM, or Transformer Engine's
  to torchtitan, would launch another one; :func:`launched_fp8_recipe`) and CUDA graphs (with PP /
  EP), as ``hardware/data/frameworks.toml`` records them with their sources.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hetplan.errors import HetplanError

if TYPE_CHECKING:  # pragma: no cover
    from hetplan.model.spec import ModelSpec
    from hetplan.plan import Job, Plan

#: Every rule's name, in the order they are checked.
RULES = ("layers-cover-model", "tp-divides-heads", "tp-divides-kv-heads", "tp-divides-ffn", "pool-gpu-count",
         "tp-within-node", "virtual-stages", "seq-len", "cp-divides-sequence", "ep-needs-experts",
         "ep-divides-experts", "moe-modules-need-experts", "mla-modules-need-mla", "stack-has-option",
         "pipeline-step-microbatches", "attention-kernel-on-gpu", "dtype-on-gpu", "framework-can-launch")

#: Architecture families (first word of ``GPUSpec.architecture``) each fused attention kernel runs on (module doc,
#: rule ``attention-kernel-on-gpu``).
KERNEL_ARCHITECTURES = {"fa3": ("Hopper",), "cudnn": ("Ampere", "Ada", "Hopper", "Blackwell"),
                        "fa2": ("Ampere", "Ada", "Hopper", "Blackwell", "CDNA3")}


#: Job settings of how tokens reach experts (rule ``moe-modules-need-experts`` away from their defaults).
MOE_SETTINGS = ("moe_load_imbalance", "moe_dispatcher", "moe_routing", "moe_a2a_overlap")


class PlanRuleError(HetplanError):
    """A plan breaks a rule of :mod:`hetplan.plan_rules`.

    Attributes:
        rule: the rule's name (one of :data:`RULES`).
    """

    def __init__(self, rule: str, message: str, *, field: str, fix: str):
        self.rule = rule
        super().__init__(f"{message} (rule {rule})", field=field, fix=fix)


def degree(plan: "Plan", stage: int, name: str) -> int:
    """The ``name`` degree (``"cp"``, ``"ep"``, ``"expert_tp"``) of stage ``stage``: the stage's own field when it
    has one, else its :class:`~hetplan.plan.ParallelLayout` (:meth:`Plan.stage_layout`)."""
    own = getattr(plan.stages[stage], name, None)
    return int(own) if own is not None else int(getattr(plan.stage_layout(stage), name))


def tensor_degree_violations(spec: "ModelSpec", tp: int, *, field: str, where: str = "") -> list[PlanRuleError]:
    """``tp-divides-heads`` / ``tp-divides-kv-heads`` / ``tp-divides-ffn`` for a TP degree ``tp`` of model ``spec``
    (a plan's stage, or ``hetplan plan --tp``), in that order."""
    out = []
    for rule, what, n in (("tp-divides-heads", "attention heads", spec.num_attention_heads),
                          ("tp-divides-kv-heads", "key/value heads", spec.num_kv_heads),
                          ("tp-divides-ffn", "MLP width (ffn_hidden_size)", spec.ffn_hidden_size)):
        if n % tp:
            ok = max(d for d in (1, 2, 4, 8) if n % d == 0)
            out.append(PlanRuleError(rule, f"TP {tp} does not divide the {n} {what} of {spec.name}{where}",
                                     field=field, fix=f"use a TP degree that divides {n}, e.g. {ok}"))
    return out


def expert_degree_violation(spec: "ModelSpec", ep: int, *, field: str, where: str = "") -> PlanRuleError | None:
    """``ep-needs-experts`` / ``ep-divides-experts`` for an EP degree ``ep`` of model ``spec`` (a plan's stage, or
    ``hetplan plan --ep``), else None."""
    experts = int(getattr(spec, "num_experts", 0) or 0)
    if ep > 1 and not experts:
        return PlanRuleError("ep-needs-experts", f"EP {ep} on {spec.name}, which has no experts{where}", field=field,
                             fix="use ep = 1 for a dense model")
    if ep > 1 and experts % ep:
        ok = ", ".join(str(d) for d in range(1, experts + 1) if experts % d == 0)
        return PlanRuleError("ep-divides-experts", f"EP {ep} does not divide the {experts} experts of {spec.name}"
                             f"{where}: each EP rank holds experts / EP whole experts", field=field,
                             fix=f"use an EP degree that divides {experts} ({ok})")
    return None


def cp_sequence_violation(seq_len: int, cp: int, *, field: str, where: str = "") -> PlanRuleError | None:
    """``cp-divides-sequence`` for a CP degree ``cp`` at ``seq_len`` tokens (a plan's stage, or ``hetplan plan
    --cp``), else None."""
    if cp > 1 and seq_len % (2 * cp):
        return PlanRuleError("cp-divides-sequence", f"CP {cp} needs seq_len divisible by 2 x CP = {2 * cp}; it is "
                             f"{seq_len}{where}", field=field, fix="choose a CP degree whose 2 x CP divides seq_len")
    return None


def expert_tp_violation(spec: "ModelSpec", expert_tp: int, *, field: str) -> PlanRuleError | None:
    """``ep-needs-experts`` for an expert-TP degree above 1 on a model without experts (its expert layers do not
    exist, so the degree would be dropped without a word), else None."""
    if expert_tp > 1 and not int(getattr(spec, "num_experts", 0) or 0):
        return PlanRuleError("ep-needs-experts", f"expert_tp {expert_tp} splits expert layers; {spec.name} has no "
                             "experts", field=field, fix="use expert_tp = 1 for a dense model")
    return None


def violations(plan: "Plan", spec: "ModelSpec") -> list[PlanRuleError]:
    """Every rule ``plan`` breaks for model ``spec`` (empty when the plan is valid), in :data:`RULES` order."""
    out: list[PlanRuleError] = []
    name = spec.name
    total = sum(st.num_layers for st in plan.stages)
    if total != spec.num_layers:
        out.append(PlanRuleError(
            "layers-cover-model", f"the stages hold {total} layers but {name} has {spec.num_layers}",
            field="plan.stages[].num_layers", fix=f"make the stages' num_layers add up to {spec.num_layers}"))
    by_rule: dict[str, PlanRuleError] = {}
    for i, st in enumerate(plan.stages):
        for err in tensor_degree_violations(spec, st.tp, field=f"plan.stages[{i}].tp", where=f" (stage {i})"):
            by_rule.setdefault(err.rule, err)
    out += sorted(by_rule.values(), key=lambda e: RULES.index(e.rule))
    used: dict[int, int] = {}
    for i, st in enumerate(plan.stages):
        used[st.pool] = used.get(st.pool, 0) + st.tp * degree(plan, i, "cp") * st.dp
    for p, n in sorted(used.items()):
        pool = plan.pools[p]
        if n > pool.count:
            out.append(PlanRuleError(
                "pool-gpu-count", f"the stages on pool {p} ({pool.gpu}) use {n} GPUs (sum of tp x cp x dp) but the "
                f"pool has {pool.count}", field=f"plan.pools[{p}].count",
                fix=f"use at most {pool.count} GPUs of that pool (smaller dp or tp), or add GPUs to the pool"))
    start: dict[int, int] = {}
    for i, st in enumerate(plan.stages):
        g = plan.pools[st.pool].gpus_per_node
        first = start.get(st.pool, 0)
        size = st.tp * degree(plan, i, "cp") * st.dp
        start[st.pool] = first + size
        groups = range(first, first + size, st.tp)
        if st.tp <= g:
            straddles = any(a // g != (a + st.tp - 1) // g for a in groups)
        else:
            straddles = st.tp % g != 0 or any(a % g for a in groups)
        if straddles:
            out.append(PlanRuleError(
                "tp-within-node", f"stage {i}'s TP groups of {st.tp} GPUs straddle nodes of {g} GPUs (the stage "
                f"starts at GPU {first} of pool {st.pool})", field=f"plan.stages[{i}].tp",
                fix=f"use a TP degree dividing {g} (or a multiple of it), and stage sizes that keep TP groups aligned"))
    v, pp = plan.virtual_stages, plan.pp
    if v > 1:
        why = None
        if pp == 1:
            why = "needs pipeline parallelism (pp > 1)"
        elif plan.schedule != "1f1b":
            why = f"needs the 1f1b schedule, not {plan.schedule}"
        elif any(plan.num_microbatches(i) % pp for i in range(pp)):
            why = f"needs a micro-batch count that is a multiple of pp = {pp} (it is {plan.num_microbatches(0)})"
        elif plan.pipeline_chunks is not None:  # the chunks as given (Megatron-Core's layout string)
            chunks = plan.pipeline_chunks
            if len(chunks) != pp or any(len(c) != v for c in chunks) or \
                    [sum(c) for c in chunks] != [st.num_layers for st in plan.stages]:
                why = (f"needs pipeline_chunks of {pp} stages x {v} chunks adding up to the stages' layers "
                       f"{[st.num_layers for st in plan.stages]}; it is {chunks}")
        # the first / last stage may hold one layer less: its embedding / loss counts as a layer of the split
        # (Megatron-Core account_for_embedding_in_pipeline_split / account_for_loss_in_pipeline_split; Llama 3)
        elif any((st.num_layers + (i in (0, pp - 1) and st.num_layers % v != 0)) % v
                 for i, st in enumerate(plan.stages)):
            why = (f"needs each stage's layers {[st.num_layers for st in plan.stages]} divisible by {v}, or the "
                   "layers of each chunk given as pipeline_chunks")
        if why:
            out.append(PlanRuleError("virtual-stages", f"interleaved 1F1B with {v} virtual stages {why}",
                                     field="plan.virtual_stages", fix="set virtual_stages = 1 or change the plan"))
    elif plan.pipeline_chunks is not None:
        out.append(PlanRuleError("virtual-stages", "pipeline_chunks are the layers of interleaved 1F1B's virtual "
                                 "stages; this plan has virtual_stages = 1", field="plan.pipeline_chunks",
                                 fix="remove pipeline_chunks, or set virtual_stages"))
    if plan.job.seq_len > spec.max_seq_len:
        out.append(PlanRuleError(
            "seq-len", f"seq_len {plan.job.seq_len} is longer than {name} allows ({spec.max_seq_len})",
            field="plan.job.seq_len", fix=f"use seq_len <= {spec.max_seq_len}"))
    experts = int(getattr(spec, "num_experts", 0) or 0)
    for i, st in enumerate(plan.stages):
        cp, ep = degree(plan, i, "cp"), degree(plan, i, "ep")
        bad_cp = cp_sequence_violation(plan.job.seq_len, cp, field=f"plan.stages[{i}].cp", where=f" (stage {i})")
        if bad_cp is not None:
            out.append(bad_cp)
        bad_ep = expert_degree_violation(spec, ep, field=f"plan.stages[{i}].ep", where=f" (stage {i})")
        if bad_ep is not None:
            out.append(bad_ep)
    if (bad_etp := expert_tp_violation(spec, plan.expert_tp, field="plan.expert_tp")) is not None:
        out.append(bad_etp)
    job_fields = type(plan.job).model_fields
    moe_modules = {"recompute_modules": [x for x in plan.job.recompute_modules if x == "moe_act"],
                   "offload_modules": list(plan.job.offload_modules),
                   "moe_recompute": ["moe"] if plan.job.moe_recompute else [],
                   "moe_capacity_factor": ["capacity"] if plan.job.moe_capacity_factor is not None else [],
                   # how tokens reach experts: set away from its default on a dense model it was ignored unsaid
                   **{key: [key] for key in MOE_SETTINGS if getattr(plan.job, key) != job_fields[key].default}}
    for key, modules in moe_modules.items():
        if modules and not experts:
            fix = {"moe_recompute": "set moe_recompute = false for a dense model",
                   "moe_capacity_factor": "remove moe_capacity_factor (and moe_pad_to_capacity) for a dense model",
                   **{k: f"remove {k} for a dense model (it acts on MoE layers only)" for k in MOE_SETTINGS}}
            what = (f"{key} = {plan.job.moe_capacity_factor:g} (token dropping) acts" if key == "moe_capacity_factor"
                    else f"{key} = {getattr(plan.job, key)!r} acts" if key in MOE_SETTINGS
                    else f"{key} {sorted(set(modules))} act")
            out.append(PlanRuleError("moe-modules-need-experts", f"{what} on MoE layers; "
                                     f"{name} has no experts", field=f"plan.job.{key}",
                                     fix=fix.get(key, f"remove {', '.join(sorted(set(modules)))} from {key} for a "
                                                      "dense model")))
    if (bad_mla := mla_module_violation(plan.job.recompute_modules, spec, "plan.job")) is not None:
        out.append(bad_mla)
    stack = plan.job.stack_spec()
    lacks = [(f, what) for f, what, has in (
        ("tp_comm_overlap", "TP-communication overlap", stack.tp_comm_overlap),
        ("cuda_graphs", "CUDA graphs", stack.launch == "cuda-graphs")) if getattr(plan, f) and not has]
    used = {"tp": max(st.tp for st in plan.stages), "pp": plan.pp,
            "cp": max(degree(plan, i, "cp") for i in range(plan.pp)),
            "ep": max(degree(plan, i, "ep") for i in range(plan.pp))}
    lacks += [(field, f"{what} ({dim.upper()} {used[dim]}; it runs {'/'.join(d.upper() for d in stack.parallel)})")
              for dim, field, what in (("tp", "stages[].tp", "tensor parallelism"),
                                       ("pp", "stages", "pipeline parallelism"),
                                       ("cp", "cp", "context parallelism"), ("ep", "ep", "expert parallelism"))
              if used[dim] > 1 and not stack.has(dim)]
    if plan.pp > 1 and plan.virtual_stages > 1 and not stack.has("vp"):
        lacks.append(("virtual_stages", f"interleaved 1F1B ({plan.virtual_stages} virtual stages)"))
    if (plan.zero not in stack.zero
            and any(st.dp * degree(plan, i, "cp") > 1 for i, st in enumerate(plan.stages))):
        lacks.append(("zero", f"ZeRO-{plan.zero} (it runs {', '.join(map(str, stack.zero))})"))
    if (plan.job.framework == "fsdp" and stack.ddp == "reducer" and plan.zero == 0
            and any(st.dp > 1 for st in plan.stages) and max(used.values()) > 1):
        lacks.append(("zero", f"DDP with {', '.join(d.upper() for d, n in used.items() if n > 1)} > 1 "
                              f"(its DDP runs on 1-D meshes only: {stack.sources.get('ddp', '')})"))
    from hetplan.plan import selective_is_none

    modes = {st.recompute for st in plan.stages} - set(stack.recompute)
    if selective_is_none(plan.job.attention, plan.job.framework):
        modes.discard("selective")  # the same plan as none under flash (hetplan.plan.Job), except under fsdp
    if modes:
        lacks.append(("stages[].recompute", f"{'/'.join(sorted(modes))} recomputation"))
    if (plan.job.dtype == "bf16" and any(st.dp * degree(plan, i, "cp") > 1 for i, st in enumerate(plan.stages))
            and not stack.allows_bf16(plan.zero, plan.pp)):
        rule = stack.sources.get(stack.bf16_rule(plan.pp), "")
        lacks.append(("zero", f"ZeRO-{plan.zero} in bf16{' with a pipeline' if plan.pp > 1 else ''} ({rule})"))
    fp8 = stack_dtype_violation(plan.job, field="plan.job.dtype")
    if fp8 is not None:
        out.append(fp8)
    for f, what in lacks:
        out.append(PlanRuleError("stack-has-option", f"plan.{f} asks for {what.split(' (')[0]}, which stack "
                                 f"{stack.id} lacks" + (f" ({what.split(' (', 1)[1]}" if " (" in what else ""),
                                 field=f"plan.{f}", fix="change the plan, or pick a stack that has it "
                                                        "(hetplan catalog stacks)"))
    step = plan.pipeline_step_microbatches
    if step is not None and plan.pp > 1:
        m = plan.num_microbatches(0)
        if step > m:
            out.append(PlanRuleError(
                "pipeline-step-microbatches", f"pipeline_step_microbatches {step:,} is more than the {m} "
                f"micro-batches of an iteration", field="plan.pipeline_step_microbatches",
                fix=f"remove it (all {m} run in one call) or use at most {m}"))
        elif v > 1 and step % pp:
            out.append(PlanRuleError(
                "pipeline-step-microbatches", f"interleaved 1F1B runs each call of {step} micro-batches as its own "
                f"schedule, which needs a multiple of pp = {pp}", field="plan.pipeline_step_microbatches",
                fix=f"use a multiple of {pp}, or virtual_stages = 1"))
    out.extend(_gpu_violations(plan))
    return out


def stack_dtype_violation(job: "Job", field: str = "job.dtype") -> PlanRuleError | None:
    """Rule ``stack-has-option`` for the job's dtype: ``fp8`` on a stack without an FP8 GEMM path (stacks.toml
    ``fp8``, whose source names the code path that runs instead), or ``bf16`` on a release without bf16
    (``bf16_zero`` empty: DeepSpeed before v0.5.5), else None. ``field`` names the dtype where the caller holds it
    (``job.dtype`` before the search, ``plan.job.dtype`` in :func:`check_plan`)."""
    stack = job.stack_spec()
    if job.dtype == "bf16" and not stack.bf16_zero:
        return PlanRuleError("stack-has-option", f"dtype bf16 asks for bf16 training, which stack {stack.id} lacks "
                             f"({stack.sources.get('bf16_zero', '')})", field=field,
                             fix="use dtype fp16, or pick a later release (hetplan catalog stacks NAME)")
    if job.dtype == "fp8" and stack.fp8 and job.fp8_recipe is not None and stack.fp8_recipes \
            and job.fp8_recipe not in stack.fp8_recipes:
        return PlanRuleError("stack-has-option", f"fp8_recipe {job.fp8_recipe} asks for a recipe stack {stack.id} "
                             f"lacks: it runs {', '.join(stack.fp8_recipes)} ({stack.sources.get('fp8_recipes', '')})",
                             field=field.rsplit(".", 1)[0] + ".fp8_recipe",
                             fix=f"use fp8_recipe {' or '.join(stack.fp8_recipes)} (or none: the stack's default), "
                                 "or pick a release that has it (hetplan catalog stacks torchtitan)")
    if job.dtype != "fp8" or stack.fp8:
        return None
    return PlanRuleError("stack-has-option", f"dtype fp8 asks for FP8 training, which stack {stack.id} lacks "
                         f"({stack.sources.get('fp8', '')})", field=field,
                         fix="use dtype bf16, or pick a stack with FP8 (hetplan catalog stacks NAME)")


def _gpu_violations(plan: "Plan") -> list[PlanRuleError]:
    """Rules ``attention-kernel-on-gpu`` and ``dtype-on-gpu`` (module doc), for the GPU types the package catalog
    knows."""
    from hetplan.hardware.catalog import load_catalog

    out: list[PlanRuleError] = []
    catalog = load_catalog()
    kernel, dtype = plan.job.attention_kernel, plan.job.dtype
    for p, pool in enumerate(plan.pools):
        try:
            gpu = catalog.get(pool.gpu)
        except HetplanError:
            continue
        family = (gpu.architecture.split() or [""])[0]
        if kernel is not None and plan.job.attention == "flash" and family not in KERNEL_ARCHITECTURES[kernel]:
            ok = [k for k, fams in KERNEL_ARCHITECTURES.items() if family in fams]
            out.append(PlanRuleError(
                "attention-kernel-on-gpu", f"attention_kernel {kernel} does not run on {gpu.name} ({gpu.architecture})",
                field="plan.job.attention_kernel",
                fix=f"use attention_kernel {' or '.join(ok)}, or leave it unset" if ok
                else "leave attention_kernel unset, or use attention = 'standard'"))
        if dtype not in gpu.dense_flops_per_s:
            have = [d for d in ("bf16", "fp16", "fp8") if d in gpu.dense_flops_per_s]
            out.append(PlanRuleError(
                "dtype-on-gpu", f"{gpu.name} (pool {p}) has no {dtype} tensor cores", field="plan.job.dtype",
                fix=f"use dtype {' or '.join(have)}, or GPUs with {dtype}"))
        elif dtype == "fp8" and plan.job.fp8_recipe == "mxfp8" and family != "Blackwell":
            out.append(PlanRuleError(
                "dtype-on-gpu", f"{gpu.name} (pool {p}, {family}) has no MXFP8 tensor cores: block-scaled FP8 "
                "GEMMs are Blackwell's (sm100)", field="plan.job.fp8_recipe",
                fix="use another fp8_recipe (or none: the stack's default), or Blackwell GPUs"))
    return out


def embedding_loss_split(layers: list[int], num_layers: int, v: int) -> tuple[int, int, int] | None:
    """``(e, l, c)`` when the stages hold ``v * c`` units each with the embedding (``e`` = 1) and / or the loss
    (``l`` = 1) counted as a unit of the first / last stage, the first ``e`` and the last ``l`` fewer layers
    (Megatron-Core ``--account-for-embedding/loss-in-pipeline-split``); None when ``layers`` is no such split."""
    pp = len(layers)
    for e, loss in ((0, 0), (1, 1), (1, 0), (0, 1)):
        units = num_layers + e + loss
        c = units // (pp * v)
        if units % (pp * v) == 0 and layers == [v * c - e] + [v * c] * (pp - 2) + [v * c - loss]:
            return e, loss, c
    return None


def split_kind(plan: "Plan", spec: "ModelSpec", v: int | None = None) -> str:
    """How the plan splits its layers over the pipeline (``frameworks.toml`` ``splits``): ``equal``,
    ``embedding-loss`` (an equal split of the layers plus the embedding / loss), ``first-last`` (only the first /
    last stage differ; without interleaving) or ``any``."""
    layers, v = [st.num_layers for st in plan.stages], v or plan.virtual_stages
    if plan.pipeline_chunks is not None and v > 1 and len({n for c in plan.pipeline_chunks for n in c}) > 1:
        return "any"
    found = embedding_loss_split(layers, spec.num_layers, v) if len(layers) > 1 else (0, 0, 0)
    if found is not None:
        return "equal" if found[:2] == (0, 0) else "embedding-loss"
    if v == 1 and len(set(layers[1:-1])) <= 1:
        return "first-last"
    return "any"


def launch_violations(plan: "Plan", spec: "ModelSpec", export: str, release: str | None = None,
                      virtual_stages: int | None = None) -> list[PlanRuleError]:
    """Rule ``framework-can-launch``: what of ``plan`` the framework release behind export target ``export``
    cannot run, from its entry in ``hardware/data/frameworks.toml`` (the source of each capability is there):
    the layer split, interleaving, the schedule, ZeRO (with pipeline parallelism), TP / CP / EP / expert-TP, EP
    beyond DP x CP, token dropping, FP8 on the plan's GPU generation, CUDA graphs (with PP / EP)."""
    from hetplan.hardware.frameworks import framework_for

    fw = framework_for(export, release)
    out: list[PlanRuleError] = []

    def bad(what: str, field: str, fix: str, source: str) -> None:
        out.append(PlanRuleError("framework-can-launch", f"{fw.id} {what} ({fw.sources.get(source, '')})",
                                 field=field, fix=fix))

    pp = plan.pp
    v = (virtual_stages if virtual_stages is not None else plan.virtual_stages) if pp > 1 else 1
    if pp > 1 and v > 1 and not fw.interleaved:
        bad("has no interleaved schedule", "plan.virtual_stages", "use virtual_stages = 1", "interleaved")
    kind = split_kind(plan, spec, v) if pp > 1 else "equal"
    if kind not in fw.splits and "any" not in fw.splits:
        bad(f"expresses the layer splits {', '.join(fw.splits)}; this plan's {[st.num_layers for st in plan.stages]}"
            f" is {kind}", "plan.stages[].num_layers", "use a split it expresses", "splits")
    if pp > 1 and plan.schedule not in fw.schedules:
        bad(f"schedules pipelines with {', '.join(fw.schedules)} only, not {plan.schedule}", "plan.schedule",
            f"use schedule {fw.schedules[0]}", "schedules")
    if plan.zero not in fw.zero or (pp > 1 and plan.zero not in fw.zero_with_pp):
        bad(f"refuses pipeline parallelism with ZeRO-{plan.zero}" if pp > 1 and plan.zero in fw.zero
            else f"has no ZeRO-{plan.zero}", "plan.zero",
            f"use zero {max(fw.zero_with_pp if pp > 1 else fw.zero)} or less", "zero_with_pp" if pp > 1 else "zero")
    dims = [("tensor", max(st.tp for st in plan.stages), fw.tp, "tp"),
            ("context", max(degree(plan, i, "cp") for i in range(pp)), fw.cp, "cp"),
            ("expert", max(degree(plan, i, "ep") for i in range(pp)), fw.ep, "ep")]
    lacking = [(what, n, key) for what, n, has, key in dims if n > 1 and not has]
    if lacking:
        bad("has no " + ", ".join(f"{what} parallelism (plan: {n})" for what, n, _ in lacking),
            f"plan.stages[].{lacking[0][2]}", "export --to megatron (Megatron-DeepSpeed takes the same arguments)",
            lacking[0][2])
    # without an expert-TP degree the experts follow TP at EP 1 (hetplan.estimate.moe.launched_degrees), so an
    # expert-TP equal to the stage's TP there is the same launch
    etp = max((degree(plan, i, "expert_tp") for i in range(pp)
               if not (degree(plan, i, "ep") == 1 and degree(plan, i, "expert_tp") == plan.stages[i].tp)), default=1)
    if etp > 1 and fw.ep and not fw.expert_tp:
        bad(f"has no expert-TP degree (experts split over TP only at EP 1, as TP); the plan has expert-TP {etp}",
            "plan.expert_tp", "plan with expert_tp = 1", "expert_tp")
    for i, st in enumerate(plan.stages):
        ep, cp = degree(plan, i, "ep"), degree(plan, i, "cp")
        if fw.ep and ep > st.dp * cp and not fw.ep_beyond_dp:
            bad(f"needs EP within DP x CP; stage {i} has EP {ep} over DP {st.dp} x CP {cp}", "plan.ep",
                "use an EP degree dividing DP x CP", "ep_beyond_dp")
            break
    if plan.job.moe_capacity_factor is not None and spec.is_moe and not fw.moe_capacity:
        bad(f"routes dropless; the plan drops tokens at capacity factor {plan.job.moe_capacity_factor:g}",
            "plan.job.moe_capacity_factor", "plan without moe_capacity_factor, or export --to megatron",
            "moe_capacity")
    if plan.cuda_graphs:
        ep_max = max(degree(plan, i, "ep") for i in range(pp))
        without = [what for what, key, on in (("pipeline parallelism", "pp", pp > 1),
                                              ("expert parallelism", "ep", ep_max > 1))
                   if on and key not in fw.cuda_graphs_with]
        if not fw.cuda_graphs:
            bad("captures no CUDA graphs", "plan.cuda_graphs", "set cuda_graphs = false", "cuda_graphs")
        elif without:
            bad(f"captures no CUDA graphs with {' or '.join(without)}", "plan.cuda_graphs",
                "set cuda_graphs = false, or export --to megatron", "cuda_graphs_with")
    if plan.job.dtype == "fp8":
        from hetplan.hardware.catalog import load_catalog

        cat = load_catalog()
        archs = sorted({cat.get(plan.pools[st.pool].gpu).architecture for st in plan.stages})
        if not all(fw.fp8_recipes(a) for a in archs):
            bad(f"has no FP8 training on {', '.join(archs)}", "plan.job.dtype", "plan with dtype bf16", "fp8")
        else:
            asked = plan.job.fp8_recipe  # a recipe the plan names was priced; the export must write that one
            runs = {a: [launched_fp8_recipe(r, fw.job_framework) for r in fw.fp8_recipes(a)] for a in archs}
            if asked is not None and not all(asked in r for r in runs.values()):
                listed = dict.fromkeys(x for r in runs.values() for x in r if x)
                bad(f"runs the FP8 recipes {', '.join(listed)} (hetplan's names); "
                    f"the plan was priced with {asked}", "plan.job.fp8_recipe",
                    "plan again without --fp8-recipe (or with one the target runs), or export to the framework "
                    "whose recipe it is", "fp8")
    return out


#: Transformer Engine's recipe names as Megatron-LM's ``--fp8-recipe`` spells them -> hetplan's
#: (:attr:`hetplan.plan.Job.fp8_recipe`): ``tensorwise`` is TE's ``Float8CurrentScaling`` (``current``).
TE_RECIPE_NAMES = {"delayed": "delayed", "tensorwise": "current", "mxfp8": "mxfp8"}


def launched_fp8_recipe(name: str, job_framework: str) -> str | None:
    """hetplan's name (:attr:`hetplan.plan.Job.fp8_recipe`) of FP8 recipe ``name`` as a framework release lists
    it (``frameworks.toml`` ``fp8``): Transformer Engine's under ``megatron`` / ``deepspeed``
    (:data:`TE_RECIPE_NAMES`; None for one hetplan does not price, e.g. ``blockwise``), torchao's under ``fsdp``
    (the same names)."""
    return name if job_framework == "fsdp" else TE_RECIPE_NAMES.get(name)


def mla_module_violation(recompute_modules, spec: "ModelSpec", where: str = "job") -> PlanRuleError | None:
    """Rule ``mla-modules-need-mla`` (module doc) for a job's ``recompute_modules`` on ``spec``: the error, or
    None. ``where``: the prefix of the field it names (``job`` in a job file, ``plan.job`` in a plan)."""
    if "mla_up_proj" in recompute_modules and not spec.is_mla:
        return PlanRuleError("mla-modules-need-mla", f"recompute_modules ['mla_up_proj'] recomputes multi-latent "
                             f"attention's up-projections; {spec.name} has no MLA", field=f"{where}.recompute_modules",
                             fix="remove mla_up_proj (it is for MLA models: DeepSeek-V2 / V3)")
    return None


def check_plan(plan: "Plan", spec: "ModelSpec") -> None:
    """Refuse a plan that breaks any rule (see module doc).

    Raises:
        PlanRuleError: the first rule broken; its message also names the others broken.
    """
    bad = violations(plan, spec)
    if not bad:
        return
    first = bad[0]
    if len(bad) > 1:
        others = ", ".join(dict.fromkeys(e.rule for e in bad[1:]))
        raise PlanRuleError(first.rule, f"{first.message.rsplit(' (rule ', 1)[0]}; also broken: {others}",
                            field=first.field, fix=first.fix)
    raise first
