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
* ``ep-needs-experts`` / ``ep-divides-experts`` (EP > 1): the model has experts and EP divides their number.
  That EP x expert-TP divides TP x CP x DP is checked by :class:`hetplan.plan.ParallelLayout` itself.
* ``moe-modules-need-experts``: ``job.recompute_modules = ["moe_act"]`` and ``job.offload_modules`` (``expert_fc1``,
  ``moe_act``) name modules of MoE layers: the model has experts. On a dense model the estimate would drop them
  without a word, and Megatron-Core refuses ``moe_act`` recomputation without ``--moe-grouped-gemm``
  (``megatron/core/transformer/transformer_config.py``).
* ``stack-has-option``: ``plan.tp_comm_overlap`` and ``plan.cuda_graphs`` exist in the job's stack
  (:meth:`hetplan.plan.Job.stack_spec`, ``hetplan catalog stacks``): Megatron-LM before Megatron-Core 0.4 has no
  ``--tp-comm-overlap`` and before 0.9 no ``--enable-cuda-graph``; priced anyway they would be numbers of a run
  that stack cannot make.

CP and EP degrees are read from the stage when it has them, else from its :meth:`Plan.stage_layout`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hetplan.errors import HetplanError

if TYPE_CHECKING:  # pragma: no cover
    from hetplan.model.spec import ModelSpec
    from hetplan.plan import Plan

#: Every rule's name, in the order they are checked.
RULES = ("layers-cover-model", "tp-divides-heads", "tp-divides-kv-heads", "tp-divides-ffn", "pool-gpu-count",
         "tp-within-node", "virtual-stages", "seq-len", "cp-divides-sequence", "ep-needs-experts",
         "ep-divides-experts", "moe-modules-need-experts", "stack-has-option")


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


def violations(plan: "Plan", spec: "ModelSpec") -> list[PlanRuleError]:
    """Every rule ``plan`` breaks for model ``spec`` (empty when the plan is valid), in :data:`RULES` order."""
    out: list[PlanRuleError] = []
    name = spec.name
    total = sum(st.num_layers for st in plan.stages)
    if total != spec.num_layers:
        out.append(PlanRuleError(
            "layers-cover-model", f"the stages hold {total} layers but {name} has {spec.num_layers}",
            field="plan.stages[].num_layers", fix=f"make the stages' num_layers add up to {spec.num_layers}"))
    for rule, what, n in (("tp-divides-heads", "attention heads", spec.num_attention_heads),
                          ("tp-divides-kv-heads", "key/value heads", spec.num_kv_heads),
                          ("tp-divides-ffn", "MLP width (ffn_hidden_size)", spec.ffn_hidden_size)):
        bad = [i for i, st in enumerate(plan.stages) if n % st.tp]
        if bad:
            tp = plan.stages[bad[0]].tp
            ok = max(d for d in (1, 2, 4, 8) if n % d == 0)
            out.append(PlanRuleError(
                rule, f"TP {tp} does not divide the {n} {what} of {name} (stage {bad[0]})",
                field=f"plan.stages[{bad[0]}].tp", fix=f"use a TP degree that divides {n}, e.g. {ok}"))
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
        # the first / last stage may hold one layer less: its embedding / loss counts as a layer of the split
        # (Megatron-Core account_for_embedding_in_pipeline_split / account_for_loss_in_pipeline_split; Llama 3)
        elif any((st.num_layers + (i in (0, pp - 1) and st.num_layers % v != 0)) % v
                 for i, st in enumerate(plan.stages)):
            why = f"needs each stage's layers {[st.num_layers for st in plan.stages]} divisible by {v}"
        if why:
            out.append(PlanRuleError("virtual-stages", f"interleaved 1F1B with {v} virtual stages {why}",
                                     field="plan.virtual_stages", fix="set virtual_stages = 1 or change the plan"))
    if plan.job.seq_len > spec.max_seq_len:
        out.append(PlanRuleError(
            "seq-len", f"seq_len {plan.job.seq_len} is longer than {name} allows ({spec.max_seq_len})",
            field="plan.job.seq_len", fix=f"use seq_len <= {spec.max_seq_len}"))
    experts = int(getattr(spec, "num_experts", 0) or 0)
    for i, st in enumerate(plan.stages):
        cp, ep = degree(plan, i, "cp"), degree(plan, i, "ep")
        if cp > 1 and plan.job.seq_len % (2 * cp):
            out.append(PlanRuleError(
                "cp-divides-sequence", f"CP {cp} needs seq_len divisible by 2 x CP = {2 * cp}; it is "
                f"{plan.job.seq_len} (stage {i})", field=f"plan.stages[{i}].cp",
                fix="choose a CP degree whose 2 x CP divides seq_len"))
        bad_ep = expert_degree_violation(spec, ep, field=f"plan.stages[{i}].ep", where=f" (stage {i})")
        if bad_ep is not None:
            out.append(bad_ep)
    moe_modules = {"recompute_modules": [x for x in plan.job.recompute_modules if x == "moe_act"],
                   "offload_modules": list(plan.job.offload_modules)}
    for key, modules in moe_modules.items():
        if modules and not experts:
            out.append(PlanRuleError("moe-modules-need-experts", f"{key} {sorted(set(modules))} act on MoE layers; "
                                     f"{name} has no experts", field=f"plan.job.{key}",
                                     fix=f"remove {', '.join(sorted(set(modules)))} from {key} for a dense model"))
    stack = plan.job.stack_spec()
    lacks = [(f, what) for f, what, has in (
        ("tp_comm_overlap", "TP-communication overlap", stack.tp_comm_overlap),
        ("cuda_graphs", "CUDA graphs", stack.launch == "cuda-graphs")) if getattr(plan, f) and not has]
    for f, what in lacks:
        out.append(PlanRuleError("stack-has-option", f"{f} = true, but stack {stack.id} has no {what}",
                                 field=f"plan.{f}", fix=f"set {f} = false, or pick a stack that has it "
                                                        "(hetplan catalog stacks)"))
    return out


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
