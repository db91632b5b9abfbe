"""Estimate a fully pinned :class:`~hetplan.plan.Plan`: iteration time with its breakdown, throughput, MFU,
memory per GPU per stage, money and job duration.

Definitions: tokens/s = global_batch · seq_len / iteration time; MFU = model FLOPs per iteration (no
recomputation, :func:`hetplan.model.counts.model_flops_per_iteration`) / (iteration time · Σ GPUs · dense peak)
(Chowdhery et al. 2022, PaLM, App. B); HFU adds the recomputed FLOPs. Money = Σ_pools GPUs · $/GPU-hour ·
time; job time = iterations · iteration time, iterations = train_tokens / (global_batch · seq_len).
"""

from __future__ import annotations

import numpy as np
from typing import Protocol

from pydantic import BaseModel

from hetplan.estimate.pipeline import pipeline_time_s
from hetplan.estimate.schedule import simulate
from hetplan.estimate.stage import Link, boundary_bandwidth_bytes_per_s, p2p_bytes, stage_costs
from hetplan.estimate.comm import p2p_time_s
from hetplan.estimate.compute import RECOMPUTE_CODES, pool_gpu
from hetplan.estimate.reshard import boundary_transfer_time_s
from hetplan.hardware.catalog import Catalog, GPUSpec, load_catalog
from hetplan.model import counts
from hetplan.model.spec import ModelSpec, load_model
from hetplan.plan import GPUPool, Plan, boundary_is_intra_node


class LayerTimeSource(Protocol):
    """Where measured layer times come from (the profile database implements it)."""

    def layer_time_s(self, gpu: str, model: ModelSpec, dtype: str, mbs: int, seq_len: int, tp: int) -> tuple[float, float] | None:
        """Measured ``(forward_s, backward_s)`` of one transformer layer (TP communication included), or None."""


class MemoryBreakdown(BaseModel):
    """Bytes per GPU."""

    weights: float
    gradients: float
    optimizer: float
    activations: float
    overhead: float
    total: float


class StageEstimate(BaseModel):
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


class Estimate(BaseModel):
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


def pool_link(pool: GPUPool, gpu: GPUSpec) -> Link:
    """The :class:`Link` of a pool (intra-node bandwidth defaults to the catalog's GPU link)."""
    intra = pool.intra_node_bandwidth_bytes_per_s or gpu.gpu_link_bandwidth_bytes_per_s
    return Link(pool.gpus_per_node, intra, pool.inter_node_bandwidth_bytes_per_s)


def pool_price_usd_per_hour(pool: GPUPool, gpu: GPUSpec) -> float:
    """$ per GPU-hour of a pool: its own price or the catalog default."""
    return gpu.price_usd_per_hour if pool.price_usd_per_hour is None else pool.price_usd_per_hour


def hardware_flops_per_iteration(m: ModelSpec, s: int, global_batch, recompute_code, num_layers_weight=1.0):
    """FLOPs executed per iteration including recomputation: model FLOPs plus one extra forward of each layer
    (full) or of the attention core (selective), times ``global_batch`` sequences."""
    rc = np.asarray(recompute_code)
    layer_f = counts.layer_forward_flops(m, global_batch, s)
    core_f = 4 * global_batch * s * s * m.q_dim
    extra = np.where(rc == 2, layer_f, np.where(rc == 1, core_f, 0.0)) * m.num_layers * num_layers_weight
    return counts.model_flops_per_iteration(m, global_batch, s) + extra


def estimate(
    plan: Plan,
    catalog: Catalog | None = None,
    model: ModelSpec | None = None,
    profiles: LayerTimeSource | None = None,
    *,
    virtual_stages: int | None = None,
    pipeline_model: str = "simulate",
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
    Raises:
        HetplanError: unknown GPU or model, a dtype the GPU lacks, layers that do not add up.
    """
    return estimate_detailed(plan, catalog, model, profiles, virtual_stages=virtual_stages,
                             pipeline_model=pipeline_model)[0]


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


def in_flight_microbatches(schedule: str, p: int, i: int, m: int, v: int = 1) -> float:
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
):
    """:func:`estimate` plus what a timeline needs: ``(Estimate, ScheduleResult | None, per-stage cost dicts,
    per-boundary p2p times)``. ``record`` keeps every scheduled operation."""
    from hetplan.errors import HetplanError

    catalog = catalog or load_catalog()
    m = model or load_model(plan.job.model)
    job = plan.job
    if sum(st.num_layers for st in plan.stages) != m.num_layers:
        raise HetplanError(
            f"stages hold {sum(st.num_layers for st in plan.stages)} layers but {m.name} has {m.num_layers}",
            field="plan.stages[].num_layers",
            fix=f"make the stages' num_layers add up to {m.num_layers}",
        )
    p = plan.pp
    v = effective_virtual_stages(plan, virtual_stages)
    if pipeline_model not in ("simulate", "closed_form"):
        raise HetplanError(f"unknown pipeline model {pipeline_model!r}", field="pipeline_model",
                           fix="use simulate or closed_form")
    gpus = [pool_gpu(catalog, plan.pools[st.pool], field=f"plan.pools[{st.pool}].gpu") for st in plan.stages]
    links = [pool_link(plan.pools[st.pool], g) for st, g in zip(plan.stages, gpus)]
    costs: list = [None] * p
    sources = ["analytic"] * p
    stage_kw = []
    for i, st in enumerate(plan.stages):
        b = plan.stage_mbs(i)  # per-replica micro-batch (a stage may set its own, hetplan.plan.Stage.mbs)
        mb = plan.num_microbatches(i)
        stage_kw.append(dict(
            s=job.seq_len, b=b, t=st.tp, dp=st.dp, num_layers=st.num_layers,
            has_embedding=i == 0, has_head=i == p - 1, single_stage=p == 1,
            in_flight=in_flight_microbatches(plan.schedule, p, i, mb, v),
            num_microbatches=mb, zero=plan.zero, recompute_code=RECOMPUTE_CODES[st.recompute],
            sequence_parallel=plan.sequence_parallel and st.tp > 1,
        ))
    # Stages of one pool without measured times or per-layer recompute: one vectorised stage_costs call (same
    # formulas, element by element; it keeps estimate() fast for deep pipelines).
    batched: dict[int, list[int]] = {}
    for i, st in enumerate(plan.stages):
        if profiles is None and st.recompute_layers is None:
            batched.setdefault(st.pool, []).append(i)
    for idx in batched.values():
        if len(idx) < 2:
            continue
        arr = {k: np.array([stage_kw[i][k] for i in idx]) for k in stage_kw[idx[0]]}
        c = stage_costs(m, gpus[idx[0]], links[idx[0]], job.dtype, overlap_grad_reduce=plan.overlap_grad_reduce, **arr)
        for j, i in enumerate(idx):
            costs[i] = {k: ({kk: vv[j] for kk, vv in x.items()} if isinstance(x, dict) else np.asarray(x)[j])
                        for k, x in c.items()}
    for i, (st, gpu, link) in enumerate(zip(plan.stages, gpus, links)):
        if costs[i] is not None:
            continue
        kw = stage_kw[i]
        measured = profiles.layer_time_s(gpu.name, m, job.dtype, kw["b"], job.seq_len, st.tp) if profiles else None
        sources[i] = "analytic" if measured is None else "profiled"
        costs[i] = stage_costs(
            m, gpu, link, job.dtype, overlap_grad_reduce=plan.overlap_grad_reduce, measured_layer_time_s=measured,
            recompute_layers=st.recompute_layers, **kw,
        )
    # p2p across each boundary, over the intra-node link or the (slower) node NICs shared by the sending GPUs.
    intra = boundary_is_intra_node(
        [st.tp * st.dp for st in plan.stages], [st.pool for st in plan.stages], [pl.gpus_per_node for pl in plan.pools]
    )
    p2p = []
    for i in range(p - 1):
        a, nxt = plan.stages[i], plan.stages[i + 1]
        bw = boundary_bandwidth_bytes_per_s(links[i], links[i + 1], a.tp * a.dp, intra[i])
        sender, receiver = (a.tp, a.dp, plan.stage_mbs(i)), (nxt.tp, nxt.dp, plan.stage_mbs(i + 1))
        if sender == receiver:
            msg = p2p_bytes(m, plan.mbs if a.mbs is None else a.mbs, job.seq_len, max(a.tp, nxt.tp), plan.sequence_parallel)
            p2p.append(float(p2p_time_s(msg, bw)))
        else:  # stages lay the micro-batch out differently: resharding (hetplan.estimate.reshard)
            nl = links[i + 1]
            p2p.append(boundary_transfer_time_s(
                m, job.seq_len, sender, receiver, float(bw), gpus_per_node=nl.gpus_per_node,
                intra_node_bandwidth_bytes_per_s=nl.intra_node_bandwidth_bytes_per_s,
                inter_node_bandwidth_bytes_per_s=nl.inter_node_bandwidth_bytes_per_s))
    p2p_total = sum(p2p)
    fwd = np.array([c["forward_s"] for c in costs], dtype=float)
    bwd = np.array([c["backward_s"] for c in costs], dtype=float)
    mb0 = plan.num_microbatches(0)
    dp_each = [float(c["dp_exposed_s"]) for c in costs]
    dp_exposed = max(dp_each)
    optimizer = max(float(c["optimizer_s"]) for c in costs)
    sim = None
    if pipeline_model == "simulate":
        schedule = "interleaved" if v > 1 else plan.schedule
        sim = simulate(fwd, bwd, p2p, mb0, schedule, v, record=record)
        t_pipe = sim.makespan_s
        bottleneck = float(np.max(fwd + bwd))
        bubble = max(0.0, t_pipe - mb0 * bottleneck - 2 * p2p_total)
        # Each stage reduces its gradients after its own last backward; the optimizer step (grad-norm
        # all-reduce across stages) waits for all.
        after = max(end + d for end, d in zip(sim.stage_end_s, dp_each))
        dp_exposed = after - t_pipe
        iteration = after + optimizer
    else:
        t_pipe, bottleneck, bubble = pipeline_time_s(fwd, bwd, np.ones(p), p2p_total, mb0, virtual_stages=v)
        bubble = max(0.0, float(bubble) - 2 * p2p_total)  # reported apart from the p2p transfers
        iteration = float(t_pipe) + dp_exposed + optimizer

    stages_out = []
    for st, gpu, c, source in zip(plan.stages, gpus, costs, sources):
        mem = MemoryBreakdown(**{k: float(x) for k, x in c["memory"].items()})
        stages_out.append(
            StageEstimate(
                gpu=gpu.name, tp=st.tp, dp=st.dp, num_layers=st.num_layers, recompute=st.recompute,
                forward_s=float(c["forward_s"]), backward_s=float(c["backward_s"]), tp_comm_s=float(c["tp_comm_s"]),
                dp_exposed_s=float(c["dp_exposed_s"]), time_source=source, memory=mem, memory_capacity_bytes=gpu.memory_bytes,
                fits=mem.total <= gpu.memory_bytes,
            )
        )
    peak = max(stages_out, key=lambda se: se.memory.total / se.memory_capacity_bytes).memory
    tokens = job.global_batch * job.seq_len
    peak_flops = sum(st.tp * st.dp * g.peak_flops_per_s(job.dtype) for st, g in zip(plan.stages, gpus))
    model_flops = float(counts.model_flops_per_iteration(m, job.global_batch, job.seq_len))
    # HFU: recompute FLOPs are per stage; weight each stage's share of layers.
    hw_flops = model_flops + sum(
        float(hardware_flops_per_iteration(m, job.seq_len, job.global_batch, RECOMPUTE_CODES[st.recompute],
                                           st.recomputed_layers() / m.num_layers)) - model_flops
        for st in plan.stages
    )
    usd_per_hour = sum(
        st.tp * st.dp * pool_price_usd_per_hour(plan.pools[st.pool], g) for st, g in zip(plan.stages, gpus)
    )
    iterations = job.iterations()
    tp_comm = sum(float(c["tp_comm_s"]) for c in costs) * mb0
    est = Estimate(
        iteration_time_s=iteration,
        pipeline_time_s=float(t_pipe),
        bubble_time_s=float(bubble),
        bubble_fraction=float(bubble) / iteration,
        tp_comm_fraction=min(1.0, tp_comm / p / iteration),
        p2p_time_s=2 * p2p_total,
        dp_exposed_time_s=dp_exposed,
        optimizer_time_s=optimizer,
        tokens_per_s=tokens / iteration,
        mfu=model_flops / (iteration * peak_flops),
        hfu=hw_flops / (iteration * peak_flops),
        memory_bytes_per_gpu=peak,
        fits=all(se.fits for se in stages_out),
        stages=stages_out,
        usd_per_hour=usd_per_hour,
        usd_per_iteration=usd_per_hour * iteration / 3600,
        iterations=iterations,
        job_time_s=iterations * iteration,
        job_usd=usd_per_hour * iterations * iteration / 3600,
        virtual_stages=v,
        pipeline_model=pipeline_model,
    )
    return est, sim, costs, p2p
