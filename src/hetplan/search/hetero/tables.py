"""Stage types and their cost tables: what one stage of the heterogeneous space costs, wherever it sits.

A *stage type* is a pool of the inventory and a TP degree (:class:`StageType`). Its *cost table*
(:class:`CostTable`) holds, for one (micro-batch ``b``, DP ``d``, ZeRO, CP, EP), the forward+backward time per
micro-batch, exposed DP time, optimizer time and the lightest recomputation that fits in memory, on a grid over
(stage kind first/middle/last/single, micro-batches in flight, layers held, recomputation). The searches read
every per-stage figure from these tables and nothing else.

The figures come from :func:`hetplan.estimate.stage.stage_costs`, evaluated once per (GPU type, TP, ``b``, ``d``,
ZeRO, CP, EP) on arrays over the grid: the same function that :func:`hetplan.estimate.estimator.estimate`
applies to one plan, with the job's :class:`~hetplan.estimate.options.TrainingOptions` (``from_job``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from hetplan.degrees import Degrees
from hetplan.estimate.compute import pool_gpu
from hetplan.estimate.estimator import pool_link, pool_price_usd_per_hour
from hetplan.estimate.options import TrainingOptions
from hetplan.estimate.stage import stage_costs
from hetplan.estimate.stagework import Link, StageHardware, StageWork
from hetplan.hardware.catalog import GPUSpec
from hetplan.model.spec import ModelSpec
from hetplan.plan import Inventory, Job
from hetplan.search.space import Pins, tp_degrees

#: Stage kinds, the first axis of a :class:`CostTable`'s arrays.
FIRST, MID, LAST, SINGLE = 0, 1, 2, 3
INF = math.inf


@dataclass(frozen=True)
class StageType:
    """GPUs of one stage: pool index, TP degree, the GPU, its link and $ per GPU-hour."""

    pool: int
    tp: int
    gpu: GPUSpec
    link: Link
    price_usd_per_hour: float


@dataclass
class CostTable:
    """Costs of one stage type for one (b, d, zero), arrays over (kind FIRST/MID/LAST/SINGLE, in-flight 1..F,
    layers 0..L): ``a`` forward+backward s per micro-batch with the lightest recomputation that fits (``inf``:
    none fits), ``e`` exposed DP s, ``o`` optimizer s, ``rc`` the recomputation code; ``nmax`` (kind, in-flight)
    the most layers that fit; ``layer_s`` forward+backward s of one layer without recomputation; ``emb_s`` /
    ``head_s`` the embedding / head forward+backward s."""

    a: np.ndarray
    e: np.ndarray
    o: np.ndarray
    rc: np.ndarray
    nmax: np.ndarray
    layer_s: float
    emb_s: float
    head_s: float


def stage_types(m: ModelSpec, inventory: Inventory, catalog, dtype: str, pins: Pins, job=None) -> list[StageType]:
    """Every (pool, TP) of the inventory that supports ``dtype``, its GPU as it runs ``job``'s software
    (:func:`hetplan.estimate.compute.pool_gpu`)."""
    out = []
    for k, pool in enumerate(inventory.pools):
        gpu = pool_gpu(catalog, pool, field=f"inventory[{k}].gpu", job=job)
        if dtype not in gpu.dense_flops_per_s:
            continue
        for t in tp_degrees(m, pool.gpus_per_node, pool.count, None if job is None else job.stack_spec()):
            if pins.tp is None or t == pins.tp:
                out.append(StageType(k, t, gpu, pool_link(pool, gpu, job=job), pool_price_usd_per_hour(pool, gpu)))
    return out


_TABLES: dict = {}


#: Most elements per stage-type grid evaluated in one :func:`stage_costs` call (groups are batched up to it).
_BATCH_ELEMENTS = 400_000


def cost_table(m: ModelSpec, job: Job, st: StageType, b: int, d: int, zero: int, F: int, rcs: list[int],
               cp: int = 1, ep: int = 1, expert_tp: int = 1) -> CostTable:
    """Evaluate :func:`stage_costs` for ``st`` on the grid (kind, in-flight 1..F, layers 0..L, recompute), at
    context-parallel degree ``cp``, expert-parallel degree ``ep`` and expert-TP ``expert_tp``
    (:func:`cost_tables` of one shape)."""
    return cost_tables(m, job, st, [(b, d, zero, F)], rcs, cp, ep, expert_tp)[0]


def cost_tables(m: ModelSpec, job: Job, st: StageType, shapes: list[tuple[int, int, int, int]], rcs: list[int],
                cp: int = 1, ep: int = 1, expert_tp: int = 1) -> list[CostTable]:
    """:func:`cost_table` of ``st`` for each ``(b, d, zero, F)`` of ``shapes``, those not cached evaluated
    together: one :func:`stage_costs` call over a leading axis of shapes (at most :data:`_BATCH_ELEMENTS` grid
    elements a call; elementwise, so each table equals its own call's). The per-call overhead dominated
    (1,476 tables of the README example: 2.5 s one by one).

    Cached (by model, job, GPU, TP, link, b, d, ZeRO, F, recomputations, CP, EP, expert-TP; at most 4,096 tables), so sweeps
    over many inventories of the same GPU types reuse them."""
    # JSON text rather than the models: a str keeps its hash, a model hashes its fields again at every look-up
    common = (m.model_dump_json(), job.model_dump_json(), st.gpu.model_dump_json(), st.tp, st.link)
    keys = [common + (b, d, zero, F, tuple(rcs), cp, ep, expert_tp) for b, d, zero, F in shapes]
    todo = sorted({sh for sh, key in zip(shapes, keys) if key not in _TABLES}, key=lambda sh: sh[3])
    if len(_TABLES) + len(todo) > 4096:
        _TABLES.clear()
    per_shape = 2 * (m.num_layers + 1) * len(rcs)
    done: dict = {}
    while todo:
        n = 1
        while n < len(todo) and (n + 1) * todo[n][3] * per_shape <= _BATCH_ELEMENTS:
            n += 1
        batch, todo = todo[:n], todo[n:]
        done.update(zip(batch, _cost_tables(m, job, st, batch, rcs, cp, ep, expert_tp)))
    for sh, key in zip(shapes, keys):
        if sh in done:
            _TABLES[key] = done[sh]
    return [_TABLES[key] if key in _TABLES else done[sh] for sh, key in zip(shapes, keys)]


def _cost_tables(m: ModelSpec, job: Job, st: StageType, shapes: list[tuple[int, int, int, int]], rcs: list[int],
                 cp: int, ep: int, expert_tp: int = 1) -> list[CostTable]:
    """The tables of ``shapes``: one :func:`stage_costs` call over (shape, kind, in-flight, layers, recomputation)
    for the first and middle stages at 1..F micro-batches in flight, one for the last and single stages at one
    (under 1F1B the last stage runs each backward right after its forward); their rows repeat it for every
    in-flight count. Memory is the costly part of the grid, and it is the part that grows with in-flight."""
    L = m.num_layers
    G, F = len(shapes), max(sh[3] for sh in shapes)

    def col(values) -> np.ndarray:
        return np.array(values).reshape(G, 1, 1, 1, 1)

    b, d, zero = col([sh[0] for sh in shapes]), col([sh[1] for sh in shapes]), col([sh[2] for sh in shapes])
    mb = col([job.global_batch // (sh[0] * sh[1]) for sh in shapes])
    n = np.arange(L + 1).reshape(1, 1, 1, L + 1, 1)
    rc = np.array(rcs).reshape(1, 1, 1, 1, len(rcs))

    def tables(kinds: list[int], flights: int):
        """(a, e, o, rc, nmax) arrays (G, kinds, flights, L+1) and the raw fwd+bwd s (G, kinds, L+1)."""
        kind = np.array(kinds).reshape(1, -1, 1, 1, 1)
        work = StageWork(s=job.seq_len, b=b, num_layers=n, has_embedding=(kind == FIRST) | (kind == SINGLE),
                         has_head=(kind == LAST) | (kind == SINGLE), single_stage=kind == SINGLE,
                         in_flight=np.arange(1, flights + 1).reshape(1, 1, -1, 1, 1), num_microbatches=mb,
                         recompute=rc, zero=zero, sequence_parallel=st.tp > 1)
        c = stage_costs(m, StageHardware(st.gpu, st.link), Degrees.of(tp=st.tp, cp=cp, dp=d, zero=zero, ep=ep,
                                                                     expert_tp=expert_tp), work,
                        TrainingOptions.from_job(job))
        shape = (G, len(kinds), flights, L + 1, len(rcs))
        per = np.broadcast_to(c.forward_s + c.backward_s, shape)
        fits = np.broadcast_to(c.memory.total, shape) <= st.gpu.memory_bytes
        exposed = np.broadcast_to(c.dp_exposed_s, shape)
        # the lightest recomputation that fits (rcs go from light to heavy; the lightest when none fits)
        a, e, pick = per[..., 0], exposed[..., 0], np.zeros(shape[:-1], dtype=np.int64)
        for r in range(len(rcs) - 1, -1, -1):
            a, e = np.where(fits[..., r], per[..., r], a), np.where(fits[..., r], exposed[..., r], e)
            pick = np.where(fits[..., r], r, pick)
        anyfit = np.logical_or.reduce([fits[..., r] for r in range(len(rcs))])
        nmax = np.cumprod(anyfit[..., 1:], axis=-1).sum(axis=-1)
        out = (np.where(anyfit, a, INF), e, np.broadcast_to(c.optimizer_s, shape)[..., 0], np.asarray(rcs)[pick], nmax)
        return out, per[:, :, 0, :, 0]

    first_mid, raw = tables([FIRST, MID], F)
    last_single, raw_ls = tables([LAST, SINGLE], 1)
    full = []
    for x, y in zip(first_mid, last_single):
        both = np.empty((G, 4) + x.shape[2:], dtype=x.dtype)
        both[:, :2], both[:, 2:] = x, y  # y repeated over in-flight counts
        full.append(both)
    raw = np.concatenate([raw, raw_ls], axis=1)
    a, e, o, rc, nmax = full
    return [CostTable(
        a[g, :, :Fg].copy(), e[g, :, :Fg].copy(), o[g, :, :Fg].copy(), rc[g, :, :Fg].copy(), nmax[g, :, :Fg].copy(),
        layer_s=float(raw[g, MID, 1] - raw[g, MID, 0]), emb_s=float(raw[g, FIRST, 0] - raw[g, MID, 0]),
        head_s=float(raw[g, LAST, 0] - raw[g, MID, 0]),
    ) for g, (_, _, _, Fg) in enumerate(shapes)]


def stage_positions(p: int, mb: int):
    """Stage kind and in-flight count of each position of a p-stage pipeline."""
    if p == 1:
        return [SINGLE], [1]
    kinds = [FIRST] + [MID] * (p - 2) + [LAST]
    return kinds, [min(p - i, mb) for i in range(p)]
