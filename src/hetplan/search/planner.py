"""``hetplan plan``: from a job, an inventory and an objective to ranked, explained plans.

Search v1 is exhaustive over the homogeneous space of each pool (:mod:`hetplan.search.space`): every
configuration is evaluated with the vectorised cost model (:mod:`hetplan.search.homogeneous`), ranked by the
objective (:mod:`hetplan.search.objective`), and the top K are re-estimated one by one with
:func:`hetplan.estimate.estimator.estimate`, whose numbers are the ones reported.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
from pydantic import BaseModel

from hetplan.gcpause import paused_gc
from hetplan.errors import HetplanError, InfeasibleError
from hetplan.estimate.compute import pool_gpu
from hetplan.estimate.estimator import Estimate, estimate
from hetplan.hardware.catalog import Architecture, Catalog, load_catalog
from hetplan.model.spec import ModelSpec, load_model
from hetplan.plan import SPLITS, Inventory, Job, Plan, Stage, balanced_split, fills_whole_nodes, interleaved_chunks
from hetplan.plan_rules import embedding_loss_split, stack_dtype_violation
from hetplan.units import duration_text, usd_text
from hetplan.search.explain import explain_ranking
from hetplan.search.homogeneous import COMPONENTS, PoolResult, evaluate_pool
from hetplan.search.objective import (Objective, TopK, estimate_keys, guarded_best_first, lower_bound_keys,
                                      rank_keys)
from hetplan.search.space import RECOMPUTE_NAMES, Pins

GIB = 2**30
#: Expansions the heterogeneous search's guarded walk may make (after the closed-form search) before it stops and
#: reports the bound it has proven (:func:`hetplan.search.hetero.search_hetero_estimated`). A count, not a time,
#: so the answer never depends on the machine's speed or load; FASOP's GPT-2 XL case completes in 1,486.
HETERO_WALK_EXPANSIONS = 4000
#: Plans the homogeneous exact top-K may estimate (and each "best with another ..." search of the explanation)
#: before it stops and reports the bound it has proven (:func:`_exact_top_k`). A count, not a time. On a 10 Gb/s
#: network the closed form's bound was ~6x below estimate() and the scan estimated over 3,000 plans (now bounded
#: by the in-flight window, :func:`hetplan.search.homogeneous.window_lower_bound_s`, and by this budget).
HOMOGENEOUS_ESTIMATES = 400
#: Allocations the closed-form seed search (:func:`hetplan.search.hetero.search_hetero`) may solve: its plans only
#: seed the walk's incumbents, so stopping it early costs speed, never exactness (the walk proves the rest).
HETERO_SEED_SOLVES = 1000


class RankedPlan(BaseModel):
    """One plan of the ranking, with its estimate and, for runners-up, what held it back."""

    rank: int
    plan: Plan
    estimate: Estimate
    reason: str


class SearchResult(BaseModel):
    """The ranking and how it was obtained."""

    plans: list[RankedPlan]
    explanation: list[str]
    configurations_evaluated: int
    configurations_fitting_memory: int
    search_time_s: float
    #: Heterogeneous search counters (:mod:`hetplan.search.hetero`) when it ran: allocations, allocations_solved,
    #: orders_solved, search_time_s, best (description of its best plan).
    heterogeneous: dict | None = None
    #: The homogeneous exact top-K: plans estimated, ``complete`` (every plan that could enter the top K was
    #: estimated) or, when its budget (:data:`HOMOGENEOUS_ESTIMATES`) ran out, ``unestimated_lower_bound`` and
    #: ``proven_within`` (the best found is within this fraction of any plan left unestimated).
    homogeneous: dict | None = None


def check_job(job: Job, m: ModelSpec) -> None:
    """Reject a job the model cannot run.

    Raises:
        HetplanError: sequence longer than the model's position limit.
        PlanRuleError: ``recompute_modules`` naming MLA's up-projections on a model without MLA (rule
            ``mla-modules-need-mla``).
    """
    from hetplan.plan_rules import mla_module_violation

    if (bad := mla_module_violation(job.recompute_modules, m)) is not None:
        raise bad
    if job.seq_len > m.max_seq_len:
        raise HetplanError(
            f"seq_len {job.seq_len} is longer than {m.name} allows ({m.max_seq_len})",
            field="job.seq_len",
            fix=f"use seq_len <= {m.max_seq_len}, or a model config with a larger "
                f"{'max_seq_len' if m.family == 'mpt' else 'max_position_embeddings'}",
        )


def check_pins(pins: Pins, m: ModelSpec, job: Job | None = None) -> None:
    """Refuse a pinned degree the model or the job's stack cannot take, naming the plan rule it breaks (before the
    search says only that no configuration matches).

    Raises:
        PlanRuleError: ``--tp`` not dividing the heads, key/value heads or MLP width; ``--ep`` on a dense model or
            not dividing the experts; ``--tp`` / ``--pp`` / ``--cp`` / ``--ep`` > 1 or ``--virtual-stages`` > 1
            where ``job``'s stack lacks that dimension or interleaving (rule ``stack-has-option``).
        PlanRuleError: ``--cp`` whose 2 x CP does not divide ``job``'s sequence (rule ``cp-divides-sequence``).
        HetplanError: ``--zero`` (unless ``--dp 1``) or ``--recompute`` the stack does not offer; ``--pp`` above
            the model's layers (every stage holds one at least: :mod:`hetplan.search.space` enumerates PP up to L);
            ``--ep 1`` for an MoE job of torchao's MXFP8 (its grouped experts need expert parallelism).
    """
    from hetplan.plan_rules import (PlanRuleError, cp_sequence_violation, expert_degree_violation,
                                    tensor_degree_violations)

    if job is not None:
        stack = job.stack_spec()
        names = {"tp": "tensor parallelism", "pp": "pipeline parallelism", "cp": "context parallelism",
                 "ep": "expert parallelism", "vp": "interleaved 1F1B"}
        for dim, pin in (("tp", "tp"), ("pp", "pp"), ("cp", "cp"), ("ep", "ep"), ("vp", "virtual_stages")):
            value = getattr(pins, pin)
            if value is not None and value > 1 and not stack.has(dim):
                runs = "/".join(d.upper() for d in stack.parallel) + (" with interleaving" if stack.interleaved else "")
                raise PlanRuleError("stack-has-option", f"{Pins.flag(pin)} {value} asks for {names[dim]}, "
                                    f"which stack {stack.id} lacks (it runs {runs}: "
                                    f"{stack.sources.get('parallel' if dim != 'vp' else 'interleaved', '')})",
                                    field=f"pin.{pin}", fix=f"unpin {pin}, or pick a stack that has it "
                                                            "(hetplan catalog stacks)")
        # before the search: a pinned ZeRO-1 with DP > 1 possible kept only the DP = 1 rows (nemo@22.05 --zero 1
        # printed 768-stage ZeRO-1 plans), a pinned recomputation was priced though the stack lacks it
        _refuse_stack_modes(job, pins, zero=pins.dp != 1)
    if (pins.ep == 1 and m.is_moe and job is not None and job.framework == "fsdp" and job.dtype == "fp8"
            and job.fp8_recipe == "mxfp8"):  # the search keeps EP > 1 for it (hetplan.search.homogeneous)
        raise HetplanError("torchao's MXFP8 grouped experts need expert parallelism (its padded token dispatchers; "
                           "torchtitan components/quantization/mxfp8.md)", field="pin.ep",
                           fix="pin --ep 2 or more, or another --fp8-recipe")
    if pins.pp is not None and pins.pp > m.num_layers:  # said only "no configuration matches the pinned dimensions"
        raise HetplanError(f"PP {pins.pp} needs a layer on every stage; {m.name} has {m.num_layers} layers",
                           field="pin.pp", fix=f"pin pp at most {m.num_layers}")
    bad = [*tensor_degree_violations(m, pins.tp or 1, field="pin.tp"), expert_degree_violation(m, pins.ep or 1,
                                                                                                field="pin.ep")]
    if job is not None:  # a pinned CP the sequence does not split into 2 x CP chunks (the search said "fits on no
        # GPU" with a CP-less configuration's footprint)
        bad.append(cp_sequence_violation(job.seq_len, pins.cp or 1, field="pin.cp"))
    for err in bad:
        if err is not None:
            raise err


def _plan_from_row(job: Job, inventory: Inventory, m: ModelSpec, res: PoolResult, i: int) -> Plan:
    c = {k: int(v[i]) for k, v in res.config.items()}
    split = balanced_split(m.num_layers, c["pp"])
    v = c["virtual_stages"]
    chunks = None
    if v > 1 and (c.get("split", 0) == 1 or embedding_loss_split(split, m.num_layers, v) is None):
        # a layer list per chunk (Megatron-Core's layout string; hetplan.search.space._with_virtual_stages)
        chunks = interleaved_chunks(m.num_layers, c["pp"], v, SPLITS[c.get("split", 0)])
        assert chunks is not None  # the space enumerates only splits that exist
        split = [sum(ch) for ch in chunks]
    recompute = RECOMPUTE_NAMES[c["recompute"]]
    pool = inventory.pools[res.pool_index]
    return Plan(
        job=job,
        pools=[pool],
        pipeline_chunks=chunks,
        stages=[Stage(pool=0, num_layers=n, tp=c["tp"], dp=c["dp"], recompute=recompute) for n in split],
        mbs=c["mbs"],
        zero=c["zero"],
        sequence_parallel=c["tp"] > 1 and job.stack_spec().sequence_parallel,  # only where the stack has it
        virtual_stages=c["virtual_stages"],
        cp=c["cp"],
        ep=c["ep"],
        expert_tp=c.get("expert_tp", 1),
    )


def _refuse_pins_the_stack_lacks(job: Job, pins: Pins) -> None:
    """When no configuration matched: name a pinned ZeRO stage or recomputation the job's stack does not offer
    (the search enumerates only what it offers, :func:`hetplan.search.space.stack_allows`), rather than the
    generic tp*pp*dp advice (``--stack megatron-lm@2.5 --zero 3`` said to check tp*pp*dp).

    Raises:
        HetplanError: naming ``pin.zero`` or ``pin.recompute``."""
    _refuse_stack_modes(job, pins)
    _refuse_pinned_ep_layout(job, pins)


def _refuse_stack_modes(job: Job, pins: Pins, zero: bool = True) -> None:
    """A pinned ZeRO stage (when ``zero``) or recomputation that ``job``'s stack does not offer.

    Raises:
        HetplanError: naming ``pin.zero`` or ``pin.recompute`` and the stages or modes the stack offers."""
    from hetplan.search.space import stack_allows

    stack = job.stack_spec()
    if zero and pins.zero is not None and not stack_allows(stack, zero=pins.zero):
        raise HetplanError(f"ZeRO-{pins.zero} is pinned, but stack {stack.id} offers ZeRO "
                           f"{', '.join(map(str, stack.zero))} only", field="pin.zero",
                           fix="unpin zero, or pick a stack that has it (hetplan catalog stacks)")
    pps = [pins.pp] if pins.pp is not None else [1, 2]
    if (zero and pins.zero and job.dtype == "bf16"
            and not any(stack_allows(stack, zero=pins.zero, dtype="bf16", pp=pp) for pp in pps)):
        pp = pins.pp or 1
        raise HetplanError(f"ZeRO-{pins.zero} is pinned, but a bf16 run of stack {stack.id} cannot use it"
                           f"{' with a pipeline' if pp > 1 else ''} ({stack.sources.get(stack.bf16_rule(pp), '')})",
                           field="pin.zero", fix="unpin zero, use dtype fp16, or pick a later release "
                                                 "(hetplan catalog stacks NAME)")
    if pins.recompute is not None and not stack_allows(stack, recompute=pins.recompute, attention=job.attention):
        raise HetplanError(f"{pins.recompute} recomputation is pinned, but stack {stack.id} offers "
                           f"{', '.join(stack.recompute)} only", field="pin.recompute",
                           fix="unpin recompute, or pick a stack that has it (hetplan catalog stacks)")


def _refuse_pinned_zero_layout(pins: Pins) -> None:
    """When no configuration matched: a pinned ZeRO-2/3 with a pinned pipeline or with DP 1, which the space never
    pairs (:mod:`hetplan.search.space`: DeepSpeed's pipeline engine refuses ZeRO-2/3 and Megatron-LM shards only
    the optimizer under a pipeline, only FSDP2 stacks shard a pipeline's stages; with one data-parallel rank ZeRO
    shards nothing), rather than the generic
    tp*pp*dp advice (``--zero 3 --pp 2`` said to check that tp*pp*dp fits).

    Raises:
        HetplanError: naming ``pin.zero``."""
    if pins.zero not in (2, 3):
        return
    if pins.pp is not None and pins.pp > 1:
        raise HetplanError(f"ZeRO-{pins.zero} is pinned with PP {pins.pp}: ZeRO-2/3 shard the gradients across "
                           "data-parallel ranks, which this job's pipeline engine does not run (DeepSpeed's refuses "
                           "it; Megatron-LM shards only the optimizer, ZeRO-1, under a pipeline; PyTorch FSDP2 "
                           "stacks run it)", field="pin.zero",
                           fix="pin zero 0 or 1 with a pipeline, pp 1, or --framework fsdp (torchtitan's FSDP + PP)")
    if pins.dp == 1:
        raise HetplanError(f"ZeRO-{pins.zero} is pinned with DP 1: with one data-parallel rank ZeRO shards nothing",
                           field="pin.zero", fix="unpin zero (or pin 0), or pin dp above 1")


def _refuse_pinned_interleaving(job: Job, pins: Pins, m: ModelSpec) -> None:
    """When no configuration matched: pinned virtual stages the job's framework or the pinned pipeline cannot
    run, naming the rule — ``framework-can-launch`` (no interleaved schedule, ``frameworks.toml``) or
    ``virtual-stages`` (interleaving needs pp > 1 and at least v layers per stage).

    Raises:
        PlanRuleError: naming ``pin.virtual_stages``."""
    from hetplan.hardware.frameworks import job_framework
    from hetplan.plan_rules import PlanRuleError

    v = pins.virtual_stages or 1
    if v == 1:
        return
    fw = job_framework(job.framework)
    if fw is not None and not fw.interleaved:
        raise PlanRuleError("framework-can-launch", f"{fw.id} has no interleaved schedule "
                            f"({fw.sources.get('interleaved', '')}); {v} virtual stages are pinned",
                            field="pin.virtual_stages", fix="unpin virtual_stages, or --framework megatron")
    if pins.pp == 1:
        raise PlanRuleError("virtual-stages", f"interleaved 1F1B with {v} virtual stages needs pipeline "
                            "parallelism; pp = 1 is pinned", field="pin.virtual_stages",
                            fix="pin pp > 1, or unpin virtual_stages")
    if pins.pp is not None and m.num_layers // pins.pp < v:
        raise PlanRuleError("virtual-stages", f"{v} virtual stages per stage need at least {v} layers on each of "
                            f"the {pins.pp} stages; {m.name} has {m.num_layers} layers",
                            field="pin.virtual_stages",
                            fix=f"pin at most {max(1, m.num_layers // pins.pp)} virtual stages, or fewer stages")


def _refuse_pinned_ep_layout(job: Job, pins: Pins) -> None:
    """When no configuration matched: a pinned EP that the pinned DP (and TP, CP) cannot hold, naming the rule —
    ``framework-can-launch`` where the job's framework keeps EP inside DP x CP (``frameworks.toml``
    ``ep_beyond_dp``), else the expert layout's EP x expert-TP dividing TP x CP x DP
    (:class:`hetplan.degrees.ParallelLayout`).

    Raises:
        PlanRuleError: (rule ``framework-can-launch``) or HetplanError, naming ``pin.ep``."""
    from hetplan.hardware.frameworks import job_framework
    from hetplan.plan_rules import PlanRuleError

    ep, dp = pins.ep or 1, pins.dp
    if ep == 1 or dp is None:
        return
    fw = job_framework(job.framework)
    cp = f" x CP {pins.cp}" if pins.cp else " (x CP, searched)"
    if fw is not None and not fw.ep_beyond_dp and (dp * (pins.cp or 1)) % ep:
        raise PlanRuleError("framework-can-launch", f"{fw.id} keeps EP within DP x CP (no MoE parallel folding: "
                            f"{fw.sources.get('ep_beyond_dp', '')}); EP {ep} does not divide the pinned DP {dp}{cp}",
                            field="pin.ep", fix="pin an EP degree dividing DP x CP, or --framework megatron")
    if pins.tp is not None and (pins.tp * dp * (pins.cp or 1)) % ep:
        raise HetplanError(f"EP {ep} (x expert-TP) does not divide the pinned TP {pins.tp} x DP {dp}{cp}: the "
                           "expert layers re-partition a stage's TP x CP x DP ranks as EP x expert-TP x expert-DP "
                           "(MoE parallel folding, Megatron-Core parallel_state.py; hetplan.degrees.ParallelLayout)",
                           field="pin.ep", fix="pin an EP degree dividing TP x CP x DP, or unpin tp / dp")


def _refuse_unmatched_pins(job: Job, pins: Pins, m: ModelSpec, inventory: Inventory) -> None:
    """No plan matches the pins: the pin (or the inventory) that is why.

    Raises:
        HetplanError: always."""
    _refuse_pins_the_stack_lacks(job, pins)
    _refuse_pinned_zero_layout(pins)
    _refuse_pinned_interleaving(job, pins, m)
    if pins.num_gpus is not None and not any(fills_whole_nodes(pins.num_gpus, p.launch_gpus)
                                             for p in inventory.pools):
        per_host = max(p.launch_gpus for p in inventory.pools)
        raise HetplanError(f"{pins.num_gpus} GPUs span hosts of {per_host} GPUs without filling them: a launch "
                           "starts the same number of processes on every host (torchrun, the DeepSpeed "
                           "launcher)", field="pin.num_gpus",
                           fix=f"pin --use-gpus at most {per_host} or a multiple of {per_host}")
    _refuse_pins_no_pool_holds(pins, inventory)
    raise HetplanError(
        "no configuration matches the pinned dimensions and the inventory",
        field="pins",
        fix="check that tp*pp*dp fits the GPU count, tp divides the heads and is at most gpus_per_node, "
        "and global_batch is divisible by dp*mbs",
    )


def _refuse_pins_no_pool_holds(pins: Pins, inventory: Inventory) -> None:
    """When no configuration matched: pinned degrees that no pool has the GPUs for — their product ``TP x PP x
    CP x DP`` (a plan uses that many GPUs at least, :mod:`hetplan.search.space`) above the largest pool, not
    dividing a pinned ``--use-gpus``, or with no multiple within a pool that fills whole nodes
    (:func:`hetplan.plan.fills_whole_nodes`), or a TP degree above every pool's GPUs per node (TP stays inside a
    node: ``space.tp_degrees``).

    Raises:
        HetplanError: naming the pins and what the inventory has."""
    pinned = {k: v for k in ("tp", "pp", "cp", "dp") if (v := getattr(pins, k)) is not None}
    need = int(np.prod(list(pinned.values()))) if pinned else 1
    text = " x ".join(f"{k.upper()} {v}" for k, v in pinned.items())
    s_ = "" if len(pinned) > 1 else "s"
    largest = max(p.count for p in inventory.pools)
    total = sum(p.count for p in inventory.pools)
    if pins.num_gpus is not None and pins.num_gpus > total:  # these said "no configuration matches"
        raise HetplanError(f"--use-gpus {pins.num_gpus}: the inventory has {total} GPUs", field="pin.num_gpus",
                           fix=f"pin --use-gpus at most {total}, or add GPUs")
    if pins.num_gpus is not None and pins.num_gpus > largest:
        raise HetplanError(f"--use-gpus {pins.num_gpus}: a plan on one GPU type uses one pool, and the largest has "
                           f"{largest}", field="pin.num_gpus",
                           fix=f"pin --use-gpus at most {largest}, or let stages span pools (without --no-hetero)")
    if need > largest:
        raise HetplanError(f"the pinned {text} need{s_} at least {need} GPUs; the largest pool has {largest}",
                           field="pins", fix=f"pin degrees whose product is at most {largest}, or add GPUs")
    if pins.num_gpus is not None and pins.num_gpus % need:
        raise HetplanError(f"the pinned {text} use{s_} a multiple of {need} GPUs; --use-gpus {pins.num_gpus} is not one",
                           field="pin.num_gpus", fix=f"pin --use-gpus to a multiple of {need}, or unpin a degree")
    if pins.num_gpus is None and not any(fills_whole_nodes(n, p.launch_gpus) for p in inventory.pools
                                         for n in range(need, p.count + 1, need)):
        # --pp 31 on 64 GPUs of 8 per node: 31 or 62 GPUs, neither one node nor whole nodes (the generic advice
        # said to check that tp*pp*dp fits the GPU count, which it does)
        sizes = ", ".join(map(str, sorted({p.launch_gpus for p in inventory.pools})))
        raise HetplanError(f"the pinned {text} use{s_} a multiple of {need} GPUs, and none up to the pools' sizes fills "
                           f"whole hosts of {sizes} GPUs (a launch starts the same number of processes on every host)",
                           field="pins", fix="pin degrees whose product divides the host size or is a multiple of it")
    per_node = max(p.gpus_per_node for p in inventory.pools)
    if pins.tp is not None and pins.tp > per_node:
        raise HetplanError(f"TP {pins.tp} spans nodes: hetplan keeps TP inside a node (its all-reduces in every "
                           f"layer need NVLink), and the largest node here has {per_node} GPUs",
                           field="pin.tp", fix=f"pin TP at most {per_node}, and PP or DP across nodes")
    if pins.tp is not None and not any(p.gpus_per_node % pins.tp == 0 for p in inventory.pools):
        node_sizes = sorted({p.gpus_per_node for p in inventory.pools})
        fits = [t for t in (1, 2, 4, 8) if all(g % t == 0 for g in node_sizes)]
        raise HetplanError(f"TP {pins.tp} groups would straddle nodes: no node size here "
                           f"({', '.join(map(str, node_sizes))} "
                           f"GPUs) is a multiple of it, and hetplan keeps every TP group inside a node",
                           field="pin.tp", fix=f"pin a TP degree dividing the node size (e.g. {fits[-1]})")


@paused_gc()
def search_plans(
    job: Job,
    inventory: Inventory,
    objective: Objective | None = None,
    pins: Pins | None = None,
    top_k: int = 5,
    catalog: Catalog | None = None,
    heterogeneous: bool = True,
    progress=None,
    per_stage_tp: bool = False,
) -> SearchResult:
    """Search the plans of every pool and rank them (see module doc).

    Args:
        top_k: how many plans to return (best first).
        heterogeneous: with several pools, also search plans whose stages mix pools (:mod:`hetplan.search.hetero`)
            and rank them with the homogeneous ones.
        per_stage_tp: let the heterogeneous stages of different pools take different TP degrees (FASOP's and
            Espresso's space). Off by default: Megatron-LM, DeepSpeed, torchtitan and ``hetplan run`` build one
            device mesh, so ``hetplan export`` refuses such a plan; the default proposes only plans it launches.
        progress: ``progress(done, limit, phase)`` as each budgeted phase advances (a progress display; stderr in
            the CLI): the homogeneous exact top-K (estimates), the heterogeneous cost tables (groups), the
            closed-form seeds (allocations solved) and the walk (expansions). Every phase is bounded by a count,
            never by time, so the answer is the same on any machine under any load.
    Raises:
        HetplanError: bad job (sequence too long, no pool supporting the dtype, pins matching nothing).
        InfeasibleError: nothing fits in memory (says the smallest footprint found and the largest GPU memory),
            or nothing meets the deadline / budget (says the best achievable).
    """
    t0 = time.perf_counter()
    objective = objective or Objective()
    pins = pins or Pins()
    catalog = catalog or load_catalog()
    m = load_model(job.model)
    check_job(job, m)
    if (bad := stack_dtype_violation(job)) is not None:  # before the search: every plan would break it
        raise bad
    check_pins(pins, m, job)
    divisor = (pins.dp or 1) * (pins.mbs or 1)
    if job.global_batch % divisor:
        raise HetplanError(
            f"global_batch {job.global_batch} is not divisible by the pinned dp x mbs = {divisor}",
            field="job.global_batch",
            fix=f"use a global batch that is a multiple of {divisor}, or unpin dp/mbs",
        )
    results: list[PoolResult] = []
    skipped = []
    for i, pool in enumerate(inventory.pools):
        gpu = pool_gpu(catalog, pool, field=f"inventory[{i}].gpu", job=job)
        if job.dtype not in gpu.dense_flops_per_s:
            skipped.append(f"{gpu.name} skipped: no {job.dtype} support")
            continue
        if job.dtype == "fp8" and job.fp8_recipe == "mxfp8" and gpu.family is not Architecture.BLACKWELL:
            skipped.append(f"{gpu.name} skipped: no MXFP8 (Blackwell only)")
            continue
        results.append(evaluate_pool(m, job, pool, gpu, pins, pool_index=i))
    if not results and job.dtype == "fp8" and job.fp8_recipe == "mxfp8":
        raise HetplanError("no GPU in the inventory runs MXFP8 (block-scaled FP8 GEMMs are Blackwell's)",
                           field="job.fp8_recipe", fix="use another --fp8-recipe (or none), or Blackwell GPUs")
    if not results:
        raise HetplanError(
            f"no GPU in the inventory supports {job.dtype}", field="job.dtype",
            fix="use dtype = \"bf16\", or GPUs with FP8 tensor cores (Hopper, Ada, Blackwell)" if job.dtype == "fp8"
            else "use dtype = \"fp16\""
        )
    n_total = sum(r.configurations_evaluated for r in results)
    # stages on two pools (PP): the heterogeneous search holds plans no pool alone does (--use-gpus 32 on FASOP's
    # 4 A100 + 28 A10G, its own answer's GPU count, was refused as "no configuration matches")
    hetero_runs = heterogeneous and len(inventory.pools) > 1 and job.stack_spec().has("pp")
    if n_total == 0 and not hetero_runs:
        _refuse_unmatched_pins(job, pins, m, inventory)
    iterations = job.iterations()
    cat: dict[str, Any] = {
        "pool": np.concatenate([np.full(len(r), k) for k, r in enumerate(results)]),
        "row": np.concatenate([np.arange(len(r)) for r in results]),
        "iteration_time_s": np.concatenate([r.iteration_time_s for r in results]),
        "lower_bound_time_s": np.concatenate([r.lower_bound_time_s for r in results]),
        "usd_per_hour": np.concatenate([r.usd_per_hour for r in results]),
        "fits": np.concatenate([r.fits for r in results]),
        "memory_total": np.concatenate([r.memory["total"] for r in results]),
        "iterations": iterations,
    }
    job_time = cat["iteration_time_s"] * iterations
    job_usd = cat["usd_per_hour"] * job_time / 3600
    primary, _ = rank_keys(objective, job_time, job_usd, cat["fits"], iteration_time_s=cat["iteration_time_s"])
    n_fit = int(cat["fits"].sum())
    het = None
    ranked: list[RankedPlan] = []
    explanation: list[str] = []
    homo = {"estimated": 0, "complete": True}
    if np.isfinite(primary).any():  # some configuration fits and meets the deadline/budget on the closed form
        ranked, ranked_idx, walk = _exact_top_k(job, inventory, m, results, cat, objective, top_k, catalog,
                                                progress=progress)
        homo = _walk_summary(walk, objective, ranked)
    if hetero_runs:
        # the homogeneous top K fill the walk's cut: it only has to prove what could enter the joint ranking
        het = _hetero_candidates(job, inventory, m, objective, pins, catalog, top_k, progress,
                                 incumbents=[(rp.plan, rp.estimate) for rp in ranked], per_stage_tp=per_stage_tp)
    if ranked:
        def best_among(mask):
            found, idx, _ = _exact_top_k(job, inventory, m, results, cat, objective, 1, catalog, among=mask)
            return (int(idx[0]), found[0].estimate) if found else None

        def estimate_row(i):
            return estimate(_plan_from_row(job, inventory, m, results[cat["pool"][i]], int(cat["row"][i])),
                            catalog, m)

        explanation = explain_ranking(objective, results, cat, ranked, ranked_idx, skipped, best_among,
                                      estimate_row, seq_len=job.seq_len)
    if not homo["complete"]:
        gap = f"; the best found is within {homo['proven_within']:.1%} of it" if "proven_within" in homo else ""
        explanation.append(f"Homogeneous exact top-{top_k} stopped after {HOMOGENEOUS_ESTIMATES:,} estimates: no "
                           f"unestimated plan beats {homo['unestimated_lower_bound']:,.4g} ({_what(objective)}){gap}.")
    if het is not None:
        ranked, explanation = _merge_hetero(objective, ranked, explanation, het, top_k)
    if ranked and (scope := _stack_scope(job, m)) is not None:
        explanation.append(scope)
    if not ranked and n_total == 0:  # nor did the heterogeneous search find a plan of the pins
        _refuse_unmatched_pins(job, pins, m, inventory)
    if not ranked:
        _raise_infeasible(objective, results, cat, job_time, job_usd, lambda: _fastest_estimated(
            job, inventory, m, results, cat, catalog, het, pins, per_stage_tp), _stack_limits(job, m))
    return SearchResult(
        plans=ranked,
        explanation=explanation,
        configurations_evaluated=n_total + (het[1].orders_solved if het is not None else 0),
        configurations_fitting_memory=n_fit + (het[1].plans_estimated if het is not None else 0),
        search_time_s=time.perf_counter() - t0,
        heterogeneous=None if het is None else hetero_summary(het[1], inventory, objective,
                                                              ranked[0].estimate if ranked else None),
        homogeneous=homo,
    )


def _missing_dims(stack, m: ModelSpec) -> list[str]:
    """The parallel dimensions ``stack`` does not run (``stacks.toml`` ``parallel`` / ``interleaved``), of those
    that apply to ``m`` (EP only to a MoE model, interleaving only with a pipeline)."""
    return [name for dim, name in (("tp", "TP"), ("pp", "PP"), ("cp", "CP"), ("ep", "EP"), ("vp", "interleaving"))
            if not stack.has(dim) and (dim != "ep" or m.is_moe) and (dim != "vp" or stack.has("pp"))]


def _stack_scope(job: Job, m: ModelSpec) -> str | None:
    """The explanation's line on what the job's stack leaves out of every search (:func:`_missing_dims`); None
    when it runs every dimension that applies."""
    stack = job.stack_spec()
    if not (missing := _missing_dims(stack, m)):
        return None
    runs = "/".join(d.upper() for d in stack.parallel)
    return (f"Stack {stack.id} runs {runs}{' with interleaving' if stack.interleaved else ''}: no "
            f"{', '.join(missing)} searched (`hetplan catalog stacks {stack.id}`).")


def _stack_limits(job: Job, m: ModelSpec) -> str | None:
    """What the job's stack withholds from the search that could shrink a plan's memory: the dimensions it does
    not run (:func:`_missing_dims`), ZeRO stages it lacks, and for bf16 the ZeRO stages its release accepts
    (:meth:`hetplan.hardware.stacks.StackSpec.bf16_rule`); None when it withholds none of them. For the
    "fits on no GPU" error, which would otherwise blame the inventory alone."""
    stack = job.stack_spec()
    parts = [f"no {', '.join(missing)}"] if (missing := _missing_dims(stack, m)) else []
    if 3 not in stack.zero:
        parts.append(f"ZeRO {'/'.join(map(str, stack.zero))} only")  # FSDP stacks list 3
    if job.dtype == "bf16":  # the stages each rule in force allows, without and (where run) with a pipeline
        rules = {stack.bf16_rule(pp): tuple(z for z in stack.zero if stack.allows_bf16(z, pp))
                 for pp in ((1, 2) if stack.has("pp") else (1,))}
        for rule, stages in rules.items():
            if stages != tuple(stack.zero):
                where = " under a pipeline" if rule == "pipeline_bf16_zero" else (
                    "" if len(rules) == 1 else " without a pipeline")
                allowed = f"only at ZeRO {'/'.join(map(str, stages))}" if stages else "at no ZeRO stage"
                parts.append(f"bf16 {allowed}{where} ({rule})")
    return f"stack {stack.id} searched {'; '.join(parts)}" if parts else None


def _what(objective) -> str:
    return "job $" if objective.goal == "cheapest" else "job time"


def _walk_summary(walk: tuple[int, float], objective, ranked) -> dict:
    """``homogeneous`` of :class:`SearchResult` from a guarded walk's ``(expanded, open_bound)``."""
    expanded, open_bound = walk
    out: dict = {"estimated": expanded, "complete": not np.isfinite(open_bound)}
    if not out["complete"]:
        out["unestimated_lower_bound"] = float(open_bound)
        gap = _proven_within(objective, ranked[0].estimate, open_bound) if ranked else None
        if gap is not None:
            out["proven_within"] = gap
    return out


def _proven_within(objective, best_estimate, open_bound: float) -> float | None:
    """How far (a fraction, >= 0) the objective of ``best_estimate`` can be above the best plan left unestimated,
    whose objective is at least ``open_bound``; None when the estimate has no objective key or the bound is not
    positive."""
    k = estimate_keys(objective, best_estimate)
    if k is None or not open_bound > 0:
        return None
    return max(0.0, k[0] / open_bound - 1)


def _apart(a_s: float, b_s: float) -> tuple[str, str]:
    """Two durations as :func:`duration_text` writes them, or in seconds to 4 digits when those read the same
    ("the deadline of 0.9 s; the fastest plan takes 0.9 s")."""
    a, b = duration_text(a_s), duration_text(b_s)
    return (a, b) if a != b else (f"{a_s:.4g} s", f"{b_s:.4g} s")


def _fastest_estimated(job, inventory, m, results, cat, catalog, het, pins=None, per_stage_tp=False) -> float | None:
    """Job time (s) of the fastest plan that fits, by estimate() (the homogeneous exact search for ``fastest``,
    and, where the heterogeneous search ran, its fastest plan), for an infeasibility message; None when nothing
    fits. The plans that search estimated under a budget are not enough: on FASOP's inventory with $0.01 and a
    0.864 s deadline it said "no plan finishes by the deadline of 0.9 s; the fastest plan that fits takes 0.9 s"
    (0.945 s, four A100s), while a mixed plan takes 0.81 s — the deadline and the budget together were why."""
    fastest = Objective(goal="fastest")
    found, _, _ = _exact_top_k(job, inventory, m, results, cat, fastest, 1, catalog)
    times = [rp.estimate.job_time_s for rp in found]
    if het is not None:
        times += [ep.estimate.job_time_s for ep in het[1].evaluated if ep.estimate.fits]
        entries, _ = _hetero_candidates(job, inventory, m, fastest, pins or Pins(), catalog, 1,
                                        per_stage_tp=per_stage_tp)
        times += [est.job_time_s for *_, est, _desc in entries]
    return min(times, default=None)


def _hetero_candidates(job, inventory, m, objective, pins, catalog, top_k, progress=None, incumbents=(),
                       per_stage_tp=False):
    """The ``top_k`` best heterogeneous plans by :func:`estimate` itself
    (:func:`hetplan.search.hetero.search_hetero_estimated`: lower-bound-guarded re-estimation, exact over its
    candidate set when ``complete``, else with a proven bound). Returns ``(entries, EstimatedResult)``, entries as
    ``(key, secondary, memory, plan, estimate, description)``."""
    from hetplan.search.hetero import search_hetero_estimated

    res = search_hetero_estimated(m, job, inventory, catalog, objective, pins=pins, top_k=top_k,
                                  max_expansions=HETERO_WALK_EXPANSIONS, seed_solves=HETERO_SEED_SOLVES,
                                  progress=progress, incumbents=incumbents, per_stage_tp=per_stage_tp)
    entries = []
    for ep in res.top:
        keys = estimate_keys(objective, ep.estimate)
        assert keys is not None  # the top plans fit and meet the constraints
        entries.append((*keys, ep.estimate.memory_bytes_per_gpu.total, ep.plan, ep.estimate,
                        ep.candidate.describe(inventory)))
    return entries, res


def hetero_summary(res, inventory, objective, ranked_best=None) -> dict:
    """The ``heterogeneous`` entry of the search result: counters, whether the walk was complete and, if not, the
    proven bound (best possible objective of any plan left unestimated; job s or job $) and how far the ranking's
    best (``ranked_best``, an estimate; default the walk's own best) can be from it."""
    best = res.top[0] if res.top else None
    out = {"allocations": res.allocations, "allocations_solved": res.allocations_solved,
           "orders_solved": res.orders_solved, "plans_estimated": res.plans_estimated,
           "search_time_s": res.search_time_s, "complete": res.complete,
           "max_pools_per_plan": res.stats.get("max_pools_per_plan"), "mixed_tp": res.stats.get("mixed_tp"),
           "per_stage_tp": res.stats.get("per_stage_tp"),
           "best": best.candidate.describe(inventory) if best is not None else None}
    if not res.complete:
        out["unestimated_lower_bound"] = res.open_bound
        best_estimate = ranked_best if ranked_best is not None else best.estimate if best is not None else None
        if best_estimate is not None:
            out["proven_within"] = _proven_within(objective, best_estimate, res.open_bound)
    return out


def _merge_key(objective, est):
    key = estimate_keys(objective, est)
    return key[0] if key else None


def _kind(plan, est) -> str:
    """How the explanation names a plan of the heterogeneous search: ``heterogeneous`` (stages on different GPU
    types), ``single-pool`` or ``multi-pool`` (pools of one GPU type)."""
    from hetplan.search.hetero.estimated import spans_gpu_types

    if spans_gpu_types(est):
        return "heterogeneous"
    return "single-pool" if len({st.pool for st in plan.stages}) == 1 else "multi-pool"


def _merge_hetero(objective, ranked, explanation, het, top_k):
    """Rank homogeneous and heterogeneous plans together by the objective on their estimates."""
    entries, res = het
    iterations_key = (lambda e: e.job_usd) if objective.goal == "cheapest" else (lambda e: e.job_time_s)
    second_key = (lambda e: e.job_time_s) if objective.goal == "cheapest" else (lambda e: e.job_usd)
    homo_plans = {rp.plan.model_dump_json() for rp in ranked}
    allp = [(iterations_key(rp.estimate), second_key(rp.estimate), rp.estimate.memory_bytes_per_gpu.total, rp.plan,
             rp.estimate, rp.reason, False) for rp in ranked]
    # the heterogeneous search also returns plans on one pool (uneven layers, two TP degrees) and on pools of one
    # GPU type: not "heterogeneous", which is stages on different GPU types
    allp += [(k, s2, mem, plan, est, f"{_kind(plan, est)} {desc}", True)
             for k, s2, mem, plan, est, desc in entries if plan.model_dump_json() not in homo_plans]
    allp.sort(key=lambda x: x[:3])
    allp = allp[:top_k]
    out = []
    win = allp[0] if allp else None
    what = "job $" if objective.goal == "cheapest" else "job time"
    het_wins = win is not None and win[6]
    # The homogeneous reasons and explanation call the best homogeneous plan "#1"; when a plan of the heterogeneous
    # search wins, they are relabelled with the homogeneous plan's merged rank and put against the new #1. A winner
    # on one GPU type is homogeneous too: it beats the best *uniform* plan (one pool, one TP, even layers).
    ref = ranked[0] if ranked else None
    ref_rank = next((r for r, x in enumerate(allp, start=1) if ref is not None and x[4] is ref.estimate), None)
    kind = "homogeneous" if win is not None and win[6] and _kind(win[3], win[4]) == "heterogeneous" else "uniform"
    ref_name = f"the best {kind} plan"
    ref_label = f"#{ref_rank}" if ref_rank else ref_name
    for r, (k, s2, mem, plan, est, reason, is_het) in enumerate(allp, start=1):
        assert win is not None  # allp is not empty
        if r == 1 and is_het:
            reason = f"best {what}; {reason}"
        elif is_het:
            reason = f"{k / win[0] - 1:+.1%} {what} vs #1; {reason}"
        elif het_wins:
            assert ref is not None  # a homogeneous plan is ranked: ranked is not empty
            if est is ref.estimate:
                reason = f"{ref_name}; {reason.split('; ', 1)[1]}"
            else:
                reason = f"vs {ref_label}, {ref_name}: {reason.replace('#1', ref_label)}"
            reason = f"{k / win[0] - 1:+.1%} {what} vs #1; {reason}"
        out.append(RankedPlan(rank=r, plan=plan, estimate=est, reason=reason))
    lines = list(explanation)
    if het_wins and win is not None:
        head = f"#1 {win[5]}"
        if ref is not None:
            head += f": {1 - win[0] / iterations_key(ref.estimate):.1%} better {what} than {ref_name}" + (
                " (one pool, one TP, layers split evenly)" if kind == "uniform" else "")
            first = lines[0].removeprefix("#1 ").replace(f": best {what}; ", ": ", 1)
            # its rank, or where it is not ranked that it is not (it read "(the best homogeneous plan)")
            lines[0] = f"Best {kind} plan ({ref_label if ref_rank else f'not in the top {top_k}'}): {first}"
        lines.insert(0, head + ".")
    line = (f"Heterogeneous search: {res.allocations:,} GPU allocations bounded, {res.allocations_solved:,} solved "
            f"({res.orders_solved:,} stage orders), {res.plans_estimated:,} plans estimated in {res.search_time_s:.2f} s; ")
    if res.complete:
        line += "complete: exact by estimate() over each allocation's closed-form-optimal plan."
    else:
        k = _merge_key(objective, win[4]) if win is not None else None
        gap = f"; the best found is within {max(0.0, k / res.open_bound - 1):.1%} of it" if k else ""
        line += (f"walk stopped after {HETERO_WALK_EXPANSIONS:,} expansions: no unestimated plan beats "
                 f"{res.open_bound:,.4g} ({what}){gap}.")
    lines.append(line)
    return out, lines


def _exact_top_k(job, inventory, m, results, cat, objective, top_k, catalog, among=None, progress=None):
    """The ``top_k`` best configurations by :func:`estimate` itself, found exactly (``among``: a boolean mask over
    the rows of ``cat``, to search only those) within :data:`HOMOGENEOUS_ESTIMATES` estimates. Returns
    ``(ranked, row indices, (estimated, open_bound))``: ``open_bound`` is ``inf`` when the scan completed, else the
    smallest objective bound of a configuration left unestimated (the proven gap).

    The vectorised pass gives for each configuration a lower bound on its iteration time that no pipeline schedule
    can beat (:func:`hetplan.search.homogeneous.pipeline_lower_bound_s`) and the memory, which is exact. Because
    job time and job $ grow with the iteration time, the objective evaluated at the bound is a lower bound on the
    objective, and the deadline/budget test at the bound is optimistic. Configurations are therefore estimated in
    increasing order of their bound, and the scan stops as soon as the next bound is worse than the K-th best
    exact value found: every configuration left unseen is provably no better (a relative slack of 1e-6 covers
    floating-point rounding between the two computations).
    """
    lb_key = lower_bound_keys(objective, cat["lower_bound_time_s"], cat["usd_per_hour"], cat["fits"], job.iterations())
    if among is not None:
        lb_key = np.where(among, lb_key, np.inf)
    scan = np.argsort(lb_key, kind="stable")
    top = TopK(top_k)

    def expand(lb, idx):
        res = results[cat["pool"][idx]]
        plan = _plan_from_row(job, inventory, m, res, int(cat["row"][idx]))
        est = estimate(plan, catalog, m)
        keys = estimate_keys(objective, est)
        if keys is not None:
            top.add(*keys, est.memory_bytes_per_gpu.total, idx, plan, est)
        return ()

    seeds = _small_allocation_seeds(job, inventory, results, cat, objective, lb_key)
    for idx in seeds:
        expand(float(lb_key[idx]), idx)
    seeded = set(seeds)
    walk = guarded_best_first(((float(lb_key[i]), int(i)) for i in scan if int(i) not in seeded), expand, top.cut,
                              limit=max(HOMOGENEOUS_ESTIMATES - len(seeds), 0),
                              progress=None if progress is None else
                              lambda k, _lb: progress(k, HOMOGENEOUS_ESTIMATES, "exact top-K (estimates)"))
    found = top.best()
    ranked = [RankedPlan(rank=r, plan=f[4], estimate=f[5], reason="") for r, f in enumerate(found, start=1)]
    return ranked, [f[3] for f in found], (walk[0] + len(seeds), walk[1])


#: Node counts whose best configurations :func:`_small_allocation_seeds` estimates before the guarded walk, besides
#: every GPU count within one node.
SEED_NODE_COUNTS = (1, 2, 4)


def _small_allocation_seeds(job, inventory, results, cat, objective, lb_key) -> list[int]:
    """Rows of ``cat`` estimated before the guarded walk of :func:`_exact_top_k`: for every GPU count within one
    node and for :data:`SEED_NODE_COUNTS` whole nodes of each pool, the configuration with the best closed-form
    objective, and the best one without pipeline parallelism (pp = 1, no p2p transfer the closed form could
    misjudge). At most ~2 x (gpus_per_node + 3) rows per pool.

    Why: the walk takes configurations in increasing lower bound, and on a slow network (10 Gb/s Ethernet) the
    bound of a wide pipeline is several times below its estimate, so the first few hundred estimates are all wide
    pipelines (issue 27: 64 H100 at 60 s per iteration while one node of 8 runs Llama-2-7B in 41.5 s). Estimated
    first, the small allocations enter the top K, so a walk stopped by its budget never returns a plan worse than
    them, and their exact values raise the cut that ends the walk. Only rows the walk could take are seeded
    (finite bound, within ``among``), so exactness is unchanged: the walk still proves what it skips.
    """
    it_key = lower_bound_keys(objective, cat["iteration_time_s"], cat["usd_per_hour"], cat["fits"], job.iterations())
    ok = np.isfinite(lb_key) & np.isfinite(it_key)
    out: list[int] = []
    for k, res in enumerate(results):
        g = inventory.pools[res.pool_index].gpus_per_node
        counts = sorted({*range(1, g + 1), *(g * n for n in SEED_NODE_COUNTS)})
        rows = np.flatnonzero(ok & (cat["pool"] == k))
        local = cat["row"][rows]
        gpus, pp1 = res.num_gpus[local], res.config["pp"][local] == 1
        for n in counts:
            for mask in (gpus == n, (gpus == n) & pp1):
                if mask.any():
                    i = int(rows[np.argmin(np.where(mask, it_key[rows], np.inf))])
                    if i not in out:
                        out.append(i)
    return out


def _raise_infeasible(objective, results, cat, job_time, job_usd, fastest_estimated=None, stack_limits=None):
    if not cat["fits"].any():
        i = int(np.argmin(cat["memory_total"]))
        res = results[cat["pool"][i]]
        row = int(cat["row"][i])
        c = {k: int(v[row]) for k, v in res.config.items()}
        largest = max(r.gpu.memory_bytes for r in results)
        raise InfeasibleError(
            f"the model fits on no GPU of the inventory: the smallest per-GPU footprint found is "
            f"{cat['memory_total'][i] / GIB:.1f} GiB (on {res.gpu.name}, tp={c['tp']} pp={c['pp']} dp={c['dp']} "
            f"mbs={c['mbs']} zero={c['zero']} recompute={RECOMPUTE_NAMES[c['recompute']]}) but the largest GPU "
            f"memory available is {largest / GIB:.1f} GiB" + (f"; {stack_limits}" if stack_limits else ""),
            field="inventory",
            fix="add GPUs (more pipeline/tensor parallelism), GPUs with more memory, or shorten seq_len"
            + (", or pick a stack or release that runs more (`hetplan catalog stacks`, --stack)"
               if stack_limits else ""),
        )
    fits = cat["fits"]
    if objective.slo_iteration_s is not None:
        best = float(cat["iteration_time_s"][fits].min())
        if best > objective.slo_iteration_s:
            raise InfeasibleError(
                f"no plan meets the iteration-time SLO of {objective.slo_iteration_s:.3g} s; the fastest plan that fits "
                f"takes {best:.3g} s per iteration",
                field="objective.slo_iteration_s",
                fix="relax the SLO or add GPUs",
            )
    if objective.deadline_s is not None:
        # The closed form can be far below estimate() (slow networks), so the fastest plan is estimated.
        fastest = fastest_estimated() if fastest_estimated is not None else None
        fastest = float(job_time[fits].min()) if fastest is None else fastest
        if fastest > objective.deadline_s:
            raise InfeasibleError(
                f"no plan finishes by the deadline of {_apart(objective.deadline_s, fastest)[0]}; the fastest plan that "
                f"fits takes {_apart(objective.deadline_s, fastest)[1]}",
                field="objective.deadline_s",
                fix="extend the deadline, add GPUs, or train on fewer tokens",
            )
    best = float(job_usd[fits].min())
    if objective.budget_usd is not None and best > objective.budget_usd:
        raise InfeasibleError(
            f"no plan stays within the budget of ${usd_text(objective.budget_usd)}; the cheapest plan that fits "
            f"costs ${usd_text(best)}",
            field="objective.budget_usd",
            fix="raise the budget, use cheaper GPUs, or train on fewer tokens",
        )
    if objective.deadline_s is not None and objective.budget_usd is not None:  # each holds for some plan, not both
        raise InfeasibleError(
            f"no plan both finishes by the deadline of {duration_text(objective.deadline_s)} and stays within the "
            f"budget of ${usd_text(objective.budget_usd)}: the plans fast enough cost more, the cheap enough ones "
            "take longer", field="objective",
            fix="extend the deadline or raise the budget (goal = \"cheapest\" with the deadline alone gives the "
                "least $ that meets it)")
    raise InfeasibleError("no plan meets the objective's constraints", field="objective",
                          fix="relax the deadline, budget or SLO, or add GPUs")


__all__ = ["search_plans", "SearchResult", "RankedPlan", "Pins", "Objective", "COMPONENTS", "check_job"]
