"""Estimate a fully pinned :class:`~hetplan.plan.Plan`: iteration time with its breakdown, throughput, MFU,
memory per GPU per stage, money and job duration.

Definitions: tokens/s = global_batch · seq_len / iteration time; MFU = model FLOPs per iteration (no
recomputation, :func:`hetplan.model.counts.model_flops_per_iteration`) / (iteration time · Σ GPUs · dense peak)
(Chowdhery et al. 2022, PaLM, App. B); HFU adds the recomputed FLOPs. Money = Σ_pools GPUs · $/GPU-hour ·
time; job time = iterations · iteration time, iterations = train_tokens / (global_batch · seq_len).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any, Protocol

import numpy as np

from hetplan.degrees import Degrees
from hetplan.estimate.comm import CommConstants
from hetplan.estimate.compute import RECOMPUTE_CODES, op_sac_recomputed_weights, pool_gpu
from hetplan.estimate.iteration import assemble_iteration, boundary_time_s
from hetplan.estimate.options import TrainingOptions
from hetplan.estimate.schedule import simulate, simulate_many
from hetplan.estimate.memory import StageMemory
from hetplan.estimate.stage import StageCost, stage_costs
from hetplan.estimate.stagework import Link, StageHardware, StageWork
from hetplan.gcpause import paused_gc
from hetplan.hardware.catalog import Catalog, GPUSpec, load_catalog
from hetplan.model import counts
from hetplan.model.spec import ModelSpec, load_model
from hetplan.plan import GPUPool, Plan, Stage, boundary_is_intra_node
from hetplan.estimate.arrays import Array


class LayerTimeSource(Protocol):
    """Where measured layer times come from (the profile database implements it)."""

    def layer_time_s(self, gpu: str, model: ModelSpec, dtype: str, mbs: int, seq_len: int, tp: int) -> tuple[float,
                     float] | None:
        """Measured ``(forward_s, backward_s)`` of one transformer layer (TP communication included), or None."""


# The results are plain dataclasses, not pydantic models: the estimator computes every field itself, so there is
# nothing to validate, and building them is about a tenth of the cost (estimate_many builds one per stage).
@dataclass(slots=True)
class MemoryBreakdown:
    """Bytes per GPU. ``total``: the expected footprint (what ``nvidia-smi`` shows); ``required``: what the fit
    test compares with the GPU's memory; ``context``: the CUDA context in both
    (:class:`hetplan.estimate.memory.StageMemory`)."""

    weights: float
    gradients: float
    optimizer: float
    activations: float
    overhead: float
    total: float
    required: float = float("nan")
    context: float = 0.0


@dataclass(slots=True)
class StageEstimate:
    """One stage: its GPUs, layers, per-micro-batch times (s) and memory per GPU (bytes)."""

    gpu: str
    tp: int
    dp: int
    num_layers: int
    recompute: str
    forward_s: float
    backward_s: float
    tp_comm_s: float
    dp_exposed_s: float
    time_source: str
    memory: MemoryBreakdown
    memory_capacity_bytes: float
    fits: bool
    alltoall_s: float = 0.0  # MoE all-to-all within forward_s + backward_s (StageCost.alltoall_s)


@dataclass(slots=True)
class Estimate:
    """The estimator's answer for one plan (seconds, bytes, USD)."""

    iteration_time_s: float
    pipeline_time_s: float
    bubble_time_s: float
    bubble_fraction: float
    tp_comm_fraction: float
    p2p_time_s: float
    dp_exposed_time_s: float
    optimizer_time_s: float
    tokens_per_s: float
    mfu: float
    hfu: float
    memory_bytes_per_gpu: MemoryBreakdown
    fits: bool
    stages: list[StageEstimate]
    usd_per_hour: float
    usd_per_iteration: float
    iterations: float
    job_time_s: float
    job_usd: float
    virtual_stages: int = 1
    pipeline_model: str = "simulate"

    @property
    def fits_footprint(self) -> bool:
        """Whether every stage's expected footprint (``memory.total``, the allocator's cache included) fits its
        GPU: the searches' feasibility test, so that no plan they recommend is tight. ``fits`` is the fit test
        of a given plan, which errs towards fitting (:mod:`hetplan.estimate.memory`, "Does it fit")."""
        return all(s.memory.total <= s.memory_capacity_bytes for s in self.stages)


_DEFAULT_COMM = CommConstants()


def pool_link(pool: GPUPool, gpu: GPUSpec, comm_constants: CommConstants | None = None, job: Any = None) -> Link:
    """The :class:`Link` of a pool as ``job``'s software uses it (intra-node bandwidth defaults to the catalog's GPU
    link; the inter-node bandwidth and latency follow the pool's network,
    :meth:`hetplan.estimate.comm.CommConstants.network_terms`; the intra-node latency and the p2p call time too are
    ``comm_constants``' (default :class:`~hetplan.estimate.comm.CommConstants`, ``hardware/data/network.toml``)); the
    TP collectives' share of the NCCL efficiencies is the job's stack's ``tp_comm_factor``
    (:class:`hetplan.hardware.stacks.StackSpec`, fitted on its own rows; ``job`` None: 1) times the constants'."""
    intra = pool.intra_node_bandwidth_bytes_per_s or gpu.gpu_link_bandwidth_bytes_per_s
    cc = comm_constants or _DEFAULT_COMM
    factor, alpha = cc.network_terms(pool.network)
    tp_factor = (job.stack_spec().tp_comm_factor if hasattr(job, "stack_spec") else 1.0) * cc.tp_comm_factor
    return Link(pool.gpus_per_node, intra, pool.inter_node_bandwidth_bytes_per_s * factor, alpha, cc.alpha_intra_node_s,
                cc.p2p_call_s, cc.intra_link_efficiency, cc.inter_link_efficiency, cc.alpha_inter_node_s, cc.nccl_ctas,
                tp_factor)


def pool_price_usd_per_hour(pool: GPUPool, gpu: GPUSpec) -> float:
    """$ per GPU-hour of a pool: its own price or the catalog default."""
    return gpu.price_usd_per_hour if pool.price_usd_per_hour is None else pool.price_usd_per_hour


def hardware_flops_per_iteration(m: ModelSpec, s: Any, global_batch: Any, recompute_code: Array,
                                 num_layers_weight: Array = 1.0, *,
                                 flash: Array = False, all_layers_weight: Array = 1.0, op_sac: Array = False):
    """FLOPs executed per iteration including recomputation, for ``global_batch`` sequences: model FLOPs plus one
    extra forward of each recomputed layer (full) or of its attention core ``4·b·s²·q`` (selective), on the share
    ``num_layers_weight`` of the layers that recompute. With FlashAttention (``flash``) the backward pass
    recomputes the scores ``QKᵀ`` (``2·b·s²·q`` per layer; Dao et al. 2022 Sec. 3.1) on the share
    ``all_layers_weight`` of the layers, and selective recomputation adds nothing (nothing is stored to skip;
    Megatron-LM skips the core-attention checkpoint under flash). Under torchtitan's per-op SAC (``op_sac``, what
    selective means with ``framework = "fsdp"``) the recomputed part is every other matmul of a dense layer and a
    MoE layer's routed experts, ``2·b·s`` FLOPs per element of
    :func:`hetplan.estimate.compute.op_sac_recomputed_weights`. Arrays broadcast."""
    rc = np.asarray(recompute_code)
    flash = np.asarray(flash)
    global_batch, s = counts.as_float(global_batch), counts.as_float(s)
    layer_f = counts.layer_forward_flops(m, global_batch, s)
    core_f = 4 * global_batch * s * s * m.q_dim
    sac_weights = op_sac_recomputed_weights(m)
    selective = np.where(np.asarray(op_sac), 2 * global_batch * s * sac_weights, np.where(flash, 0.0, core_f))
    extra = np.where(rc == 2, layer_f, np.where(rc == 1, selective, 0.0)) * m.num_layers * num_layers_weight
    extra = extra + np.where(flash, core_f / 2, 0.0) * m.num_layers * all_layers_weight
    return counts.model_flops_per_iteration(m, global_batch, s) + extra


def estimate(
    plan: Plan,
    catalog: Catalog | None = None,
    model: ModelSpec | None = None,
    profiles: LayerTimeSource | None = None,
    *,
    virtual_stages: int | None = None,
    pipeline_model: str = "simulate",
    comm_constants: CommConstants | None = None,
) -> Estimate:
    """Estimate ``plan`` (see module doc).

    Args:
        catalog: GPU catalog (default: the package catalog).
        model: the model spec (default: ``load_model(plan.job.model)``).
        profiles: measured layer times; stages whose (GPU, shape) it knows use them (``time_source``
            ``"profiled"``), the others the analytic model (``"analytic"``).
        virtual_stages: v of interleaved 1F1B (default: ``plan.virtual_stages``);
            needs the 1F1B schedule and micro-batches a multiple of pp, else it falls back to v = 1.
        pipeline_model: ``"simulate"`` (event simulation, :mod:`hetplan.estimate.schedule`) or
            ``"closed_form"`` (:func:`hetplan.estimate.pipeline.pipeline_time_s`, what the search uses).
        comm_constants: fitted communication constants (default: the reviewed ones; a calibration passes its own).
    Raises:
        HetplanError: unknown GPU or model, a dtype the GPU lacks, layers that do not add up.
    """
    return _estimate_batch([plan], catalog, model, profiles, virtual_stages, pipeline_model, False,
                           comm_constants=comm_constants)[0][0]


def estimate_many(
    plans: list[Plan],
    catalog: Catalog | None = None,
    model: ModelSpec | None = None,
    profiles: LayerTimeSource | None = None,
    *,
    virtual_stages: int | None = None,
    pipeline_model: str = "simulate",
    comm_constants: CommConstants | None = None,
) -> list[Estimate]:
    """:func:`estimate` of every plan in ``plans`` (same arguments, applied to each), in order.

    The same formulas run once over all stages of all plans: stage costs in one vectorised
    :func:`~hetplan.estimate.stage.stage_costs` call per (model, GPU, link) group, p2p in one call, and the
    pipeline simulation once per group of plans with one ``(schedule, p, m, v)``
    (:func:`~hetplan.estimate.schedule.simulate_many`). Equal to ``[estimate(p) for p in plans]`` up to float
    rounding (tests check 1e-12); much faster for many plans (benchmarks/bench_estimate.py).

    Cost: O(Σ stages) vectorised work, plus per shape group O(2(m·v + p)) numpy steps, plus O(stages) Python
    work per plan to read it and build the result objects.

    Raises:
        HetplanError: as :func:`estimate`, for the first plan that has the problem.
    """
    return [r[0] for r in _estimate_batch(plans, catalog, model, profiles, virtual_stages, pipeline_model, False,
                                          comm_constants=comm_constants)]


def effective_virtual_stages(plan: Plan, virtual_stages: int | None = None) -> int:
    """v used for ``plan``: the argument, else ``plan.virtual_stages``; 1 unless the
    schedule is 1F1B, pp > 1 and every stage's micro-batch count is a multiple of pp (Megatron-LM's condition)."""
    v = virtual_stages if virtual_stages is not None else plan.virtual_stages
    p = plan.pp
    if v <= 1 or p == 1 or plan.schedule == "gpipe":
        return 1
    if any(plan.num_microbatches(i) % p for i in range(p)):
        return 1
    return int(v)


def in_flight_microbatches(schedule: str, p: Array, i: Array, m: Array, v: Array = 1) -> Array:
    """Micro-batches of stage ``i``'s full activations held at its peak: GPipe ``m``; 1F1B ``min(p - i, m)``;
    interleaved ``min((p - i - 1)·2 + (v - 1)·p + 1, m·v) / v`` chunks of ``1/v`` (Megatron-LM's warm-up count;
    ``p + (p-1)/v`` on the first stage, its ``interleaved_schedule_memory_penalty``). Arrays broadcast."""
    if schedule == "gpipe":
        return np.asarray(m, dtype=float)
    v = np.asarray(v)
    interleaved = np.minimum((p - i - 1) * 2 + (v - 1) * p + 1, m * v) / np.maximum(v, 1)
    return np.where(v <= 1, np.minimum(p - i, m), interleaved).astype(float)


def estimate_detailed(
    plan: Plan,
    catalog: Catalog | None = None,
    model: ModelSpec | None = None,
    profiles: LayerTimeSource | None = None,
    *,
    virtual_stages: int | None = None,
    pipeline_model: str = "simulate",
    record: bool = False,
    comm_constants: CommConstants | None = None,
):
    """:func:`estimate` plus what a timeline needs: ``(Estimate, ScheduleResult | None, per-stage
    :class:`~hetplan.estimate.stage.StageCost`, per-boundary p2p times)``. ``record`` keeps every scheduled
    operation."""
    return _estimate_batch([plan], catalog, model, profiles, virtual_stages, pipeline_model, record, detailed=True,
                           comm_constants=comm_constants)[0]


_MEMORY_FIELDS = tuple(MemoryBreakdown.__dataclass_fields__)
_MEMORY_COMPONENTS = tuple(f.name for f in fields(StageMemory))
_COST_FIELDS = tuple(f for f in StageCost.__dataclass_fields__ if f != "memory")

def p2p_model(framework: str) -> str | bool:
    """The p2p semantics the simulation uses for a job's framework: DeepSpeed's pipeline engine runs every
    transfer as its own blocking instruction (``"deepspeed"``, :mod:`hetplan.estimate.schedule`): on Espresso's
    12 traced DeepSpeed pipelines it reproduces the measured iteration within 5 % (MAPE 3.2 %), the asynchronous
    model only within 19 % (MAPE 9.8 %) (:mod:`hetplan.calibration.traces`). Megatron-LM: asynchronous
    (``False``), as its blocking calls change no validation figure by more than 0.4 pt (docs/estimator.md)."""
    return "deepspeed" if framework == "deepspeed" else False


#: Plans of one pipeline shape from which :func:`simulate_many` beats one :func:`simulate` per plan.
_SIMULATE_MANY_MIN_PLANS = 16

#: The per-stage numbers the estimator gathers into columns: the fields of Degrees and of StageWork it fills.
_DEGREE_COLUMNS = tuple(f.name for f in fields(Degrees))
_WORK_COLUMNS = ("zero", "sequence_parallel", "s", "b", "num_layers", "has_embedding", "has_head", "single_stage",
                 "num_microbatches", "recompute", "step_microbatches")
_ROW_COLUMNS = (*_DEGREE_COLUMNS, *_WORK_COLUMNS)


_FIELDS = {cls: tuple(f.name for f in fields(cls)) for cls in (Degrees, StageWork)}


def _take(obj: Any, index: Any, scalar: bool = False) -> Any:
    """``obj`` (Degrees or StageWork of columns) at rows ``index``; ``scalar``: one row, as Python scalars."""
    values = {}
    for name in _FIELDS[type(obj)]:
        x = getattr(obj, name)
        values[name] = (x[index].item() if scalar else x[index]) if isinstance(x, np.ndarray) else x
    return type(obj)(**values)


def _estimate_batch(plans: list[Plan], catalog: Catalog | None, model: ModelSpec | None,
                    profiles: LayerTimeSource | None, virtual_stages: int | None, pipeline_model: str, record: bool,
                    detailed: bool = False, comm_constants: CommConstants | None = None) -> list[tuple]:
    """The estimator for a list of plans (module doc; :func:`estimate_many`). Returns one
    ``(Estimate, ScheduleResult | None, costs | None, p2p)`` per plan (costs only when ``detailed``)."""
    from hetplan.errors import HetplanError

    if pipeline_model not in ("simulate", "closed_form"):
        raise HetplanError(f"unknown pipeline model {pipeline_model!r}", field="pipeline_model",
                           fix="use simulate or closed_form")
    catalog = catalog or load_catalog()
    models: dict[str, ModelSpec] = {}
    by_model: dict[int, list[int]] = {}
    specs = []
    for k, plan in enumerate(plans):
        m = model or models.get(plan.job.model) or models.setdefault(plan.job.model, load_model(plan.job.model))
        if sum(st.num_layers for st in plan.stages) != m.num_layers:
            raise HetplanError(
                f"stages hold {sum(st.num_layers for st in plan.stages)} layers but {m.name} has {m.num_layers}",
                field="plan.stages[].num_layers",
                fix=f"make the stages' num_layers add up to {m.num_layers}",
            )
        specs.append(m)
        by_model.setdefault(id(m), []).append(k)
    out: list = [None] * len(plans)
    # The batch allocates a few dicts per stage and frees none of them, which would trigger the cyclic garbage
    # collector over and over (about a quarter of the time); it creates no cycles (hetplan.gcpause).
    with paused_gc():
        for idx in by_model.values():
            for k, r in zip(idx, _estimate_one_model([plans[k] for k in idx], specs[idx[0]], catalog, profiles,
                                                     virtual_stages, pipeline_model, record, detailed,
                                                     comm_constants)):
                out[k] = r
    return out


def _estimate_one_model(plans: list[Plan], m: ModelSpec, catalog: Catalog, profiles: LayerTimeSource | None,
                        virtual_stages: int | None, pipeline_model: str, record: bool, detailed: bool,
                        comm_constants: CommConstants | None) -> list[tuple]:
    """:func:`_estimate_batch` for plans of one model ``m``."""
    # One row per stage of every plan; plan k's rows are start[k] .. start[k] + p_k - 1.
    rows: list[tuple] = []  # per stage: the _ROW_COLUMNS, read as columns below
    hardware: list[StageHardware] = []
    options: list[TrainingOptions] = []
    st_rows: list[Stage] = []
    price_rows: list[float] = []
    peak_rows: list[float] = []
    group_rows: list[int] = []
    gbs: list[int] = []
    recompute_layers: list[int | None] = []
    recomputed: list[int] = []
    stage_gpus: list[int] = []
    in_flight_inputs: list[tuple] = []
    group_ids: dict[tuple, int] = {}  # (hardware, options, DP overlap) -> id
    start, vs, m0s, calls = [], [], [], []
    resolved: dict[tuple, GPUSpec] = {}  # pool_gpu of equal pools under equal attention-kernel choices, made once
    on_link: dict[tuple, StageHardware] = {}  # one StageHardware per (GPU spec, link)
    for plan in plans:
        job, p = plan.job, plan.pp
        v = effective_virtual_stages(plan, virtual_stages)
        start.append(len(st_rows))
        vs.append(v)
        m0s.append(plan.num_microbatches(0))
        calls.append(plan.pipeline_calls(0))
        on_pool = {}  # pool index -> (StageHardware, $/GPU-hour, stage_costs group, peak FLOP/s)
        gpipe = plan.schedule == "gpipe" and plan.pp > 1  # one stage: no schedule, each micro-batch's backward
        # follows its forward (Megatron-LM forward_backward_no_pipelining, torchtitan without PP)
        opts = TrainingOptions.from_plan(plan)
        stack = opts.stack_spec()
        layouts: dict = {}  # (tp, dp) -> (layout, its _DEGREE_COLUMNS values, GPUs of the stage), once per layout
        for i, st in enumerate(plan.stages):
            if st.pool not in on_pool:
                pool = plan.pools[st.pool]
                key = (pool.gpu, pool.kernel_overhead_s, pool.attention_efficiency, opts.attention_kernel, stack.id)
                gpu = resolved.get(key)
                if gpu is None:
                    gpu = resolved[key] = pool_gpu(catalog, pool, field=f"plan.pools[{st.pool}].gpu", job=opts)
                link = pool_link(pool, gpu, comm_constants, job=opts)
                hw = on_link.setdefault((id(gpu), link), StageHardware(gpu, link))
                # one group per (hardware, options); plans whose stack overlaps the DP reduction and those whose
                # does not apart, as numpy's vector loops round the last bit by position (same numbers per row)
                group = group_ids.setdefault((hw, opts, stack.overlaps_grad_reduce(plan.pp, plan.zero)),
                                             len(group_ids))
                on_pool[st.pool] = (hw, pool_price_usd_per_hour(pool, gpu), group, gpu.peak_flops_per_s(job.dtype))
            hw, price, group, peak = on_pool[st.pool]
            known = layouts.get((st.tp, st.dp))
            if known is None:
                lay = plan.stage_layout(i)
                deg = lay.degrees  # every degree of the stage's layout; v as the schedule runs it
                known = layouts[st.tp, st.dp] = (
                    lay, tuple(v if k == "virtual_stages" else getattr(deg, k) for k in _DEGREE_COLUMNS)
                    + (lay.zero_stage, lay.sequence_parallel_active), deg.gpus_per_stage, deg.dp)
            lay, dvals, n_gpus, dp = known
            b = st.mbs or plan.mbs
            mb = job.global_batch // (dp * b)
            step_mb = min(mb, plan.pipeline_step_microbatches or mb)  # one call of the schedule holds at most these
            rows.append(dvals + (job.seq_len, b, st.num_layers, i == 0, i == p - 1, p == 1, mb,
                                 RECOMPUTE_CODES[st.recompute], step_mb))
            stage_gpus.append(n_gpus)
            in_flight_inputs.append((gpipe, p, i, step_mb, v))
            hardware.append(hw)
            options.append(opts)
            price_rows.append(price)
            peak_rows.append(peak)
            group_rows.append(group if st.recompute_layers is None else -1)  # -1: costed alone (per-layer recompute)
            recompute_layers.append(st.recompute_layers)
            recomputed.append(st.recomputed_layers())
            st_rows.append(st)
            gbs.append(job.global_batch)
    n = len(st_rows)
    gpus = [hw.gpu for hw in hardware]
    flash = [o.attention == "flash" for o in options]
    cols = {k: np.asarray(x) for k, x in zip(_ROW_COLUMNS, zip(*rows))}
    gp, pp_, ii, mbs_, vv = (np.array(c) for c in zip(*in_flight_inputs))
    in_flight = np.where(gp, in_flight_microbatches("gpipe", pp_, ii, mbs_, vv),
                         in_flight_microbatches("1f1b", pp_, ii, mbs_, vv))
    degrees = Degrees(**{k: cols[k] for k in _DEGREE_COLUMNS})
    cols["dp"] = degrees.dp
    work_columns: dict[str, Any] = {k: cols[k] for k in _WORK_COLUMNS}
    work = StageWork(in_flight=in_flight, **work_columns)

    # Stage costs: one vectorised call per (hardware, options) group of rows without measured times or per-layer
    # recompute; those rows one by one.
    measured: list[tuple[float, float] | None] = [None] * n
    if profiles is not None:
        for r in range(n):
            measured[r] = profiles.layer_time_s(gpus[r].name, m, options[r].dtype, int(cols["b"][r]),
                                                int(cols["s"][r]), int(cols["tp"][r]))
    groups: dict = {}  # group id -> rows; ("row", r) for a row costed alone
    for r, (gid, ms) in enumerate(zip(group_rows, measured)):
        groups.setdefault(gid if gid >= 0 and ms is None else ("row", r), []).append(r)
    res: dict[str, np.ndarray] = {}
    mem: dict[str, np.ndarray] = {}
    for key, g in groups.items():
        r0 = g[0]
        alone = isinstance(key, tuple)
        sel = r0 if alone else np.array(g)
        w = _take(work, sel, alone)
        if alone:
            w = replace(w, recompute_layers=recompute_layers[r0])
        c = stage_costs(m, hardware[r0], _take(degrees, sel, alone), w, options[r0], measured[r0])
        for name in _COST_FIELDS:
            res.setdefault(name, np.zeros(n))[sel] = getattr(c, name)
        for name in _MEMORY_COMPONENTS:
            mem.setdefault(name, np.zeros(n))[sel] = getattr(c.memory, name)
    fwd, bwd = res["forward_s"], res["backward_s"]

    # p2p across each boundary (hetplan.estimate.iteration.boundary_time_s): the intra-node link or the (slower)
    # node NICs shared by the sending GPUs; boundaries between stages that lay the micro-batch out differently
    # reshard.
    intra = []
    for plan, s0 in zip(plans, start):
        intra += boundary_is_intra_node(stage_gpus[s0:s0 + plan.pp], [st.pool for st in plan.stages],
                                        [pl.gpus_per_node for pl in plan.pools])
    send = np.flatnonzero(~cols["has_head"])  # every stage but a plan's last sends to the next row
    recv = send + 1
    p2p = np.zeros(len(send))
    if len(send):
        # every field of each row's Link (a calibration's constants included), one array per field
        link_cols: dict[str, Any] = {f.name: np.array([getattr(hw.link, f.name) for hw in hardware])
                                     for f in fields(Link)}
        shape_cols = [cols[k] for k in ("tp", "cp", "dp", "b")]
        p2p = np.asarray(boundary_time_s(m, cols["s"][send], [c[send] for c in shape_cols],
                                         [c[recv] for c in shape_cols],
                                         Link(**{k: c[send] for k, c in link_cols.items()}),
                                         Link(**{k: c[recv] for k, c in link_cols.items()}),
                                         np.array(intra)), dtype=np.float64)
    p2p_start = np.concatenate([[0], np.cumsum([plan.pp - 1 for plan in plans])]).astype(int)
    capacity = np.array([g.memory_bytes for g in gpus])

    # Pipeline time per plan: simulation (grouped by shape) or the closed form; the iteration assembled from it
    # (hetplan.estimate.iteration.assemble_iteration), one call per shape.
    per_plan = {k: np.zeros(len(plans)) for k in ("t", "bubble", "p2p", "dp", "opt", "it")}
    peak_row = np.zeros(len(plans), dtype=int)
    fits_all = np.zeros(len(plans), dtype=bool)
    sims: list = [None] * len(plans)
    shapes: dict[tuple, list[int]] = {}
    for j, plan in enumerate(plans):
        sched = "interleaved" if vs[j] > 1 else plan.schedule
        m_call = -(-m0s[j] // calls[j])  # micro-batches per call of the schedule
        shapes.setdefault((sched, plan.pp, m_call, vs[j], p2p_model(plan.job.framework)), []).append(j)
    starts = np.array(start)
    for (sched, p, m0, v, mode), ks in shapes.items():  # noqa: B007 (p, v: the shape's)
        ridx = starts[ks][:, None] + np.arange(p)
        cidx = p2p_start[ks][:, None] + np.arange(p - 1)
        simulated = None
        if pipeline_model == "simulate":
            if len(ks) >= _SIMULATE_MANY_MIN_PLANS and not record:
                simulated = simulate_many(fwd[ridx], bwd[ridx], p2p[cidx], m0, sched, v, blocking_p2p=mode)
            else:
                for j, rr, cc in zip(ks, ridx, cidx):
                    sims[j] = simulate(fwd[rr], bwd[rr], p2p[cc], m0, sched, v, record=record, blocking_p2p=mode)
                simulated = (np.array([sims[j].makespan_s for j in ks]), np.array([sims[j].stage_end_s for j in ks]))
        shape_it = assemble_iteration(fwd[ridx], bwd[ridx], res["dp_exposed_s"][ridx], res["optimizer_s"][ridx],
                                p2p[cidx].sum(axis=1), m0, virtual_stages=v, simulated=simulated,
                                memory_bytes=mem["required"][ridx], capacity_bytes=capacity[ridx],
                                calls=np.array(calls)[ks])
        for name, x in (("t", shape_it.pipeline_s), ("bubble", shape_it.bubble_s), ("p2p", shape_it.p2p_s),
                        ("dp", shape_it.dp_exposed_s), ("opt", shape_it.optimizer_s), ("it", shape_it.iteration_s)):
            per_plan[name][ks] = x
        peak_row[ks] = shape_it.peak_stage
        fits_all[ks] = shape_it.fits

    # Per-plan reductions over each plan's rows (what the report adds: FLOPs, $, TP share).
    gbs_rows = np.array(gbs)
    ngpu = degrees.gpus_per_stage
    peak_flops = np.add.reduceat(ngpu * np.array(peak_rows), starts)
    usd_per_hour = np.add.reduceat(ngpu * np.array(price_rows), starts)
    model_rows = counts.model_flops_per_iteration(m, gbs_rows, cols["s"])
    recompute_flops = np.add.reduceat(hardware_flops_per_iteration(
        m, cols["s"], gbs_rows, cols["recompute"], np.array(recomputed) / m.num_layers,
        flash=np.array(flash), all_layers_weight=cols["num_layers"] / m.num_layers,
        op_sac=np.array([o.framework == "fsdp" for o in options]),
    ) - model_rows, starts)
    model_flops = model_rows[starts]
    tp_comm = np.add.reduceat(res["tp_comm_s"], starts) * np.array(m0s)
    fits = mem["required"] <= capacity  # the fit test (hetplan.estimate.memory, "Does it fit")
    mem_rows = list(map(MemoryBreakdown, *(mem[k].tolist() for k in _MEMORY_FIELDS)))
    stage_objects = [
        StageEstimate(g.name, st.tp, st.dp, st.num_layers, st.recompute, f, bk, tc, de,
                      "analytic" if ms is None else "profiled", mr, cap, ft, a2a)
        for g, st, f, bk, tc, de, ms, mr, cap, ft, a2a in zip(
            gpus, st_rows, *(res[k].tolist() for k in ("forward_s", "backward_s", "tp_comm_s", "dp_exposed_s")),
            measured, mem_rows, capacity.tolist(), fits.tolist(), res["alltoall_s"].tolist())
    ]
    tokens = [plan.job.global_batch * plan.job.seq_len for plan in plans]
    values: dict[str, list[float]] = {k: np.asarray(x, dtype=np.float64).tolist() for k, x in dict(
        per_plan, mf=model_flops, hf=model_flops + recompute_flops, pf=peak_flops, usd=usd_per_hour,
        tp=tp_comm).items()}
    out = []
    for k, plan in enumerate(plans):
        p, s0 = plan.pp, start[k]
        stages_out = stage_objects[s0:s0 + p]
        peak_memory = stages_out[peak_row[k]].memory
        it, usd, pf, iterations = values["it"][k], values["usd"][k], values["pf"][k], plan.job.iterations()
        est = Estimate(
            iteration_time_s=it,
            pipeline_time_s=values["t"][k],
            bubble_time_s=values["bubble"][k],
            bubble_fraction=values["bubble"][k] / it,
            tp_comm_fraction=min(1.0, values["tp"][k] / p / it),
            p2p_time_s=values["p2p"][k],
            dp_exposed_time_s=values["dp"][k],
            optimizer_time_s=values["opt"][k],
            tokens_per_s=tokens[k] / it,
            mfu=values["mf"][k] / (it * pf),
            hfu=values["hf"][k] / (it * pf),
            memory_bytes_per_gpu=peak_memory,
            fits=bool(fits_all[k]),
            stages=stages_out,
            usd_per_hour=usd,
            usd_per_iteration=usd * it / 3600,
            iterations=iterations,
            job_time_s=iterations * it,
            job_usd=usd * iterations * it / 3600,
            virtual_stages=vs[k],
            pipeline_model=pipeline_model,
        )
        costs = None
        if detailed:
            costs = [StageCost(**{key: res[key][r] for key in _COST_FIELDS},
                               memory=StageMemory(**{key: mem[key][r] for key in mem}))
                     for r in range(s0, s0 + p)]
        out.append((est, sims[k], costs, p2p[p2p_start[k]:p2p_start[k + 1]].tolist()))
    return out
