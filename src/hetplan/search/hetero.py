"""Heterogeneous GPU allocation and stage placement: which GPUs, how many, in which stage order, with which layers.

**Space.** A plan uses one micro-batch size ``b``, one data-parallel degree ``d`` for every stage (the 1F1B closed
form of :func:`hetplan.estimate.pipeline.pipeline_time_s` counts the micro-batches of the first stage; with
different DP degrees per stage the stages would not process the same micro-batches), a ZeRO stage 0 or 1
(the pipeline engines of Megatron-LM and DeepSpeed support no more), one context-parallel degree ``cp`` and one
expert-parallel degree ``ep`` (the homogeneous space's degrees, :func:`hetplan.search.space.cp_degrees` and
:func:`hetplan.search.space.ep_degrees`). From each pool ``k`` it takes ``s_k >= 0`` stages of ``tp_k x cp x d``
GPUs each (TP differs between pools, is the same within one pool; a power of two dividing
the heads, at most the pool's GPUs per node, ``s_k tp_k d <= count_k``). The stages of one pool form one
contiguous block of the pipeline, and the blocks come in any order (``K!`` orders for ``K`` pools used): stages
of a pool take consecutive GPUs (nodes), so consecutive stages of one pool may share a node and talk over the
intra-node link (:func:`hetplan.plan.boundary_is_intra_node`); a boundary between pools uses the slower of the
two nodes' NICs. Each stage holds ``n_i >= 1`` layers (the first also the embedding, the last the head); its
recomputation is the lightest that fits in memory at its position (stage ``i`` of ``p`` holds
``min(p - i, m)`` micro-batches in flight under 1F1B). Homogeneous plans (one pool) are in the space.

Choosing the lightest recomputation that fits is exact: a heavier one adds ``Δ`` to the stage's backward, which
adds at least ``Δ`` to the iteration (the sum term) and can lower the exposed DP time by at most ``Δ``.

**Search** (exact over this space). Every allocation (``b, d``, ZeRO, ``(tp_k, s_k)`` per pool) gets a lower bound
on its iteration time valid for every stage order and layer partition (see :func:`allocation_bounds`)::

    T_LB = L·min_i λ_i + t_emb + t_head + (m-1)·L / Σ_i (1/λ_i) + 2(p-1)·c_min

(``λ_i`` = forward+backward seconds per layer of stage ``i`` without recomputation; a stage with ``n`` layers
takes at least ``n·λ_i``, so the sum of stage times is at least ``L·min λ``, and the slowest stage at least the
fluid balance ``L / Σ 1/λ_i``; ``t_emb``, ``t_head`` the least embedding/head time of any GPU type; ``c_min``
the least p2p time of any boundary; exposed DP and optimizer time ≥ 0), and a memory bound: stage ``i`` can hold
at most ``nmax_i`` layers even in the most lenient position (one micro-batch in flight, no embedding or head,
any recomputation), so ``Σ nmax_i < L`` means nothing fits. Allocations are visited in increasing bound order of
the goal; each one's cost is ``R·T`` with ``R`` its $/h, so

* ``cheapest`` (``T <= SLO``): skip when ``T_LB > SLO`` or ``R·T_LB >= best $``; stop at the first allocation
  whose ``R·T_LB >= best $`` (the rest are sorted after it);
* ``fastest`` (``$ <= budget`` optional): skip when ``R·T_LB > budget``; stop when ``T_LB >= best T``;
* ``pareto``: skip when some frontier point ``(T_f, C_f)`` has ``T_f <= T_LB`` and ``C_f <= R·T_LB`` (then every
  plan of the allocation is weakly dominated).

A surviving allocation's orders are each solved exactly by :func:`hetplan.search.partition.solve_partition`,
with the incumbent as an upper bound. Every cut compares a *lower* bound with a value already achieved, so no cut
removes a plan better than the one returned; the tests compare with exhaustive enumeration of the same space.

Why not Espresso's bound: Espresso prunes a GPU allocation when a *per-GPU* lower bound of its cost exceeds the
incumbent, with the per-GPU bound computed from the fastest stage assignment of that GPU alone; on its own example
it cut a6000+a6000+3090 ($0.2019/iteration) and returned a6000×3 ($0.2218). Our bound never uses a figure of
one stage as if it held for another position or partition.

Per-stage costs come from :func:`hetplan.estimate.stage.stage_costs`, evaluated once per (GPU type, TP, ``b``,
``d``, ZeRO, CP, EP) on arrays over (stage kind, micro-batches in flight, layers, recomputation), and boundaries
from :func:`hetplan.estimate.iteration.boundary_time_s`: the same functions that
:func:`hetplan.estimate.estimator.estimate` applies to one plan.
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass, field, fields
from typing import NamedTuple

import numpy as np

from hetplan.estimate.compute import pool_gpu
from hetplan.estimate.estimator import job_stage_options, pool_link, pool_price_usd_per_hour
from hetplan.estimate.iteration import boundary_time_s
from hetplan.estimate.stage import Link, stage_costs
from hetplan.hardware.catalog import GPUSpec
from hetplan.model.spec import ModelSpec
from hetplan.plan import Inventory, Job, Plan, Stage, boundary_is_intra_node
from hetplan.search.homogeneous import window_lower_bound_s
from hetplan.search.partition import solve_partition
from hetplan.search.space import RECOMPUTE_NAMES, Pins, cp_degrees, divisors, ep_degrees, tp_degrees

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


class StageChoice(NamedTuple):
    """One stage of a :class:`HeteroCandidate`: its pool (index into the inventory), TP degree, layers and
    recomputation code (:data:`hetplan.estimate.compute.RECOMPUTE_CODES`)."""

    pool: int
    tp: int
    num_layers: int
    recompute_code: int


class PreparedSpace(NamedTuple):
    """The bounded GPU allocations of one search space, computed once and shared by the closed-form search and
    the estimate()-exact walk: the groups (micro-batch, DP, ZeRO), each group's allocation rows, ``(max pools
    per plan, mixed TP)``, the number of allocations, and the rows concatenated ``(group, row, $/hour, T_LB,
    T_SIM)``."""

    groups: list
    rows: list
    max_pools: tuple
    allocations: int
    flat: tuple


@dataclass
class HeteroCandidate:
    """One plan found by the search: its stages in order (:class:`StageChoice`), plus ``mbs``, ``dp``, ``zero``;
    its iteration time (s, the estimator's formula) and $ per hour."""

    stages: list[StageChoice]
    mbs: int
    dp: int
    zero: int
    iteration_time_s: float
    usd_per_hour: float
    cp: int = 1
    ep: int = 1

    @property
    def usd_per_iteration(self) -> float:
        """$ of one iteration: $/hour of the allocation x iteration time / 3600."""
        return self.usd_per_hour * self.iteration_time_s / 3600.0

    @property
    def num_gpus(self) -> int:
        """GPUs used: Σ over stages of tp x cp x dp."""
        return sum(t * self.cp * self.dp for _, t, _, _ in self.stages)

    @property
    def pools_used(self) -> set[int]:
        """Indices of the inventory pools the stages run on."""
        return {k for k, _, _, _ in self.stages}

    def to_plan(self, job: Job, inventory: Inventory) -> Plan:
        """The :class:`Plan` (pools reduced to those used, in order of first use)."""
        order: list[int] = []
        for k, _, _, _ in self.stages:
            if k not in order:
                order.append(k)
        return Plan(
            job=job,
            pools=[inventory.pools[k] for k in order],
            stages=[Stage(pool=order.index(k), num_layers=n, tp=t, dp=self.dp, recompute=RECOMPUTE_NAMES[rc])
                    for k, t, n, rc in self.stages],
            mbs=self.mbs,
            zero=self.zero,
            sequence_parallel=any(t > 1 for _, t, _, _ in self.stages),
            cp=self.cp,
            ep=self.ep,
        )

    def describe(self, inventory: Inventory) -> str:
        """``RTX-A6000(tp1)x2 + RTX-3090(tp1) dp1 mbs16: layers [11, 12, 3]``."""
        blocks: list[list] = []
        for k, t, _, _ in self.stages:
            if blocks and blocks[-1][0] == (k, t):
                blocks[-1][1] += 1
            else:
                blocks.append([(k, t), 1])
        parts = [f"{inventory.pools[k].gpu}(tp{t})" + (f"x{c}" if c > 1 else "") for (k, t), c in blocks]
        extra = (f" cp{self.cp}" if self.cp > 1 else "") + (f" ep{self.ep}" if self.ep > 1 else "")
        return (" + ".join(parts) + f" dp{self.dp}{extra} mbs{self.mbs} zero{self.zero}: layers "
                f"{[n for _, _, n, _ in self.stages]}")


@dataclass
class HeteroResult:
    """Outcome of :func:`search_hetero`: the best plan (or ``None``), every plan evaluated exactly, the Pareto
    frontier (``pareto`` goal; ascending time), and counters."""

    best: HeteroCandidate | None
    candidates: list[HeteroCandidate]
    frontier: list[HeteroCandidate]
    allocations: int = 0
    allocations_fitting: int = 0
    allocations_solved: int = 0
    orders_solved: int = 0
    search_time_s: float = 0.0
    stats: dict = field(default_factory=dict)


def stage_types(m: ModelSpec, inventory: Inventory, catalog, dtype: str, pins: Pins, job=None) -> list[StageType]:
    """Every (pool, TP) of the inventory that supports ``dtype``, its GPU as it runs ``job``'s software
    (:func:`hetplan.estimate.compute.pool_gpu`)."""
    out = []
    for k, pool in enumerate(inventory.pools):
        gpu = pool_gpu(catalog, pool, field=f"inventory[{k}].gpu", job=job)
        if dtype not in gpu.dense_flops_per_s:
            continue
        for t in tp_degrees(m, pool.gpus_per_node, pool.count):
            if pins.tp is None or t == pins.tp:
                out.append(StageType(k, t, gpu, pool_link(pool, gpu), pool_price_usd_per_hour(pool, gpu)))
    return out


_TABLES: dict = {}

#: Most elements per stage-type grid evaluated in one :func:`stage_costs` call (groups are batched up to it).
_BATCH_ELEMENTS = 400_000


def cost_table(m: ModelSpec, job: Job, st: StageType, b: int, d: int, zero: int, F: int, rcs: list[int],
               cp: int = 1, ep: int = 1) -> CostTable:
    """Evaluate :func:`stage_costs` for ``st`` on the grid (kind, in-flight 1..F, layers 0..L, recompute), at
    context-parallel degree ``cp`` and expert-parallel degree ``ep`` (:func:`cost_tables` of one shape)."""
    return cost_tables(m, job, st, [(b, d, zero, F)], rcs, cp, ep)[0]


def cost_tables(m: ModelSpec, job: Job, st: StageType, shapes: list[tuple[int, int, int, int]], rcs: list[int],
                cp: int = 1, ep: int = 1) -> list[CostTable]:
    """:func:`cost_table` of ``st`` for each ``(b, d, zero, F)`` of ``shapes``, those not cached evaluated
    together: one :func:`stage_costs` call over a leading axis of shapes (at most :data:`_BATCH_ELEMENTS` grid
    elements a call; elementwise, so each table equals its own call's). The per-call overhead dominated
    (1,476 tables of the README example: 2.5 s one by one).

    Cached (by model, job, GPU, TP, link, b, d, ZeRO, F, recomputations, CP, EP; at most 4,096 tables), so sweeps
    over many inventories of the same GPU types reuse them."""
    # JSON text rather than the models: a str keeps its hash, a model hashes its fields again at every look-up
    common = (m.model_dump_json(), job.model_dump_json(), st.gpu.model_dump_json(), st.tp, st.link)
    keys = [common + (b, d, zero, F, tuple(rcs), cp, ep) for b, d, zero, F in shapes]
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
        done.update(zip(batch, _cost_tables(m, job, st, batch, rcs, cp, ep)))
    for sh, key in zip(shapes, keys):
        if sh in done:
            _TABLES[key] = done[sh]
    return [_TABLES[key] if key in _TABLES else done[sh] for sh, key in zip(shapes, keys)]


def _cost_tables(m: ModelSpec, job: Job, st: StageType, shapes: list[tuple[int, int, int, int]], rcs: list[int],
                 cp: int, ep: int) -> list[CostTable]:
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
        c = stage_costs(
            m, st.gpu, st.link, job.dtype, s=job.seq_len, b=b, t=st.tp, dp=d, num_layers=n,
            has_embedding=(kind == FIRST) | (kind == SINGLE), has_head=(kind == LAST) | (kind == SINGLE),
            single_stage=kind == SINGLE, in_flight=np.arange(1, flights + 1).reshape(1, 1, -1, 1, 1),
            num_microbatches=mb, zero=zero, recompute_code=rc, sequence_parallel=st.tp > 1, cp=cp, ep=ep,
            **job_stage_options(job),
        )
        shape = (G, len(kinds), flights, L + 1, len(rcs))
        per = np.broadcast_to(c.forward_s + c.backward_s, shape)
        fits = np.broadcast_to(c.memory["total"], shape) <= st.gpu.memory_bytes
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
    return [CostTable(
        *(x[g, :, :Fg].copy() for x in full), layer_s=float(raw[g, MID, 1] - raw[g, MID, 0]),
        emb_s=float(raw[g, FIRST, 0] - raw[g, MID, 0]), head_s=float(raw[g, LAST, 0] - raw[g, MID, 0]),
    ) for g, (_, _, _, Fg) in enumerate(shapes)]


def _positions(p: int, mb: int):
    """Stage kind and in-flight count of each position of a p-stage pipeline."""
    if p == 1:
        return [SINGLE], [1]
    kinds = [FIRST] + [MID] * (p - 2) + [LAST]
    return kinds, [min(p - i, mb) for i in range(p)]


class _Group:
    """Everything for one (b, d, zero, cp, ep): stage types' tables and the p2p cache. A stage of TP degree t
    uses ``t·cp·d`` GPUs (``width = cp·d`` per TP rank). ``shared``: a dict the groups of one search share, so
    that groups differing only in ZeRO or EP share their boundary and stage-order transfer times (they depend on
    ``(b, d, cp)`` only). ``tables``: the stage types' cost tables by ``(pool, tp)`` when the caller built them
    (:func:`cost_tables`), else built here."""

    def __init__(self, m, job, inventory, types, b, d, zero, rcs, max_stages, cp=1, ep=1, shared: dict | None = None,
                 tables: dict | None = None):
        self.m, self.job, self.inventory, self.b, self.d, self.zero = m, job, inventory, b, d, zero
        self.cp, self.ep, self.width = cp, ep, cp * d
        self.mb = job.global_batch // (b * d)
        self.F = max(1, min(self.mb, max_stages))
        self.types = [st for st in types if st.tp * self.width <= inventory.pools[st.pool].count]
        self.tables = {(st.pool, st.tp): tables[(st.pool, st.tp)] if tables is not None
                       else cost_table(m, job, st, b, d, zero, self.F, rcs, cp, ep) for st in self.types}
        self.by_key = {(st.pool, st.tp): st for st in self.types}
        self.gpus_per_node = [pool.gpus_per_node for pool in inventory.pools]
        shared = {} if shared is None else shared
        self._shared = shared
        self._boundaries: dict = shared.setdefault((b, d, cp), {"p2p": {}, "orders": {}})
        self._p2p: dict = self._boundaries["p2p"]
        self._orders: dict = self._boundaries["orders"]

    def pool_options(self, L: int, mixed_tp: bool):
        """:func:`_pool_options` of this group and, per pool, its options' sub-blocks as arrays ``(TP degree,
        stages)`` of shape ``(options, 2)`` (an empty slot: TP 1, no stages); shared by the groups of one width
        ``cp·d`` (their stage types are the same)."""
        key = ("options", self.width, L, mixed_tp)
        if key not in self._shared:
            opts = _pool_options(self, L, mixed_tp)
            subs = []
            for ol in opts:
                sub_t, sub_p = np.ones((len(ol), 2), dtype=np.int64), np.zeros((len(ol), 2))
                for i, option in enumerate(ol):
                    for j, (t, n) in enumerate(option):
                        sub_t[i, j], sub_p[i, j] = t, n
                subs.append((sub_t, sub_p))
            self._shared[key] = (opts, subs)
        return self._shared[key]

    def p2p(self, s1: StageType, s2: StageType, intra: bool) -> float:
        """One-way transfer time of one micro-batch across a boundary (s), as the estimator prices it
        (:func:`hetplan.estimate.iteration.boundary_time_s`: a p2p send when both stages lay the micro-batch out
        alike, else a resharding transfer)."""
        key = (s1.pool, s1.tp, s2.pool, s2.tp, intra)
        if key not in self._p2p:
            self._p2p[key] = boundary_time_s(self.m, self.job.seq_len, (s1.tp, self.cp, self.d, self.b),
                                             (s2.tp, self.cp, self.d, self.b), s1.link, s2.link, intra)
        return self._p2p[key]

    def tail_lower_bound_s(self, p: np.ndarray) -> np.ndarray:
        """Lower bound (s) on ``e_0 + max_i o_i`` of :func:`hetplan.search.homogeneous.stage_chain_lower_bound_s`
        for pipelines of ``p`` stages (array) of this group, whatever the types, order and partition: the first
        stage's exposed DP time is at least the least of any type at any layer count and in-flight count, and
        some stage holds at least ``ceil(L/p)`` layers, whose optimizer step takes at least the least middle-stage
        time of any type for that many layers (the optimizer time grows with the parameters held)."""
        L = self.m.num_layers
        if not hasattr(self, "_tail"):
            e_first = min(float(np.min(t.e[FIRST, :, 1:])) for t in self.tables.values())
            e_single = min(float(t.e[SINGLE, 0, L]) for t in self.tables.values())  # one micro-batch in flight
            o_mid = np.min(np.stack([t.o[MID, 0, :] for t in self.tables.values()]), axis=0)
            o_single = min(float(t.o[SINGLE, 0, L]) for t in self.tables.values())
            self._tail = (max(e_first, 0.0), max(e_single, 0.0), np.minimum.accumulate(o_mid[::-1])[::-1], o_single)
        e_first, e_single, o_mid, o_single = self._tail
        p = np.asarray(p)
        most = -(-L // np.maximum(p, 1))
        return np.where(p > 1, e_first + o_mid[np.clip(most, 0, L)], e_single + o_single)

    def refined_sim_bound_s(self, blocks) -> float:
        """:meth:`refined_sim_bounds_s` of one allocation (blocks ``(pool, (tp, stages))``)."""
        return float(self.refined_sim_bounds_s([blocks])[0])

    def refined_sim_bounds_s(self, allocations) -> np.ndarray:
        """A tighter ``T_SIM`` (s) for each allocation (a list of blocks ``(pool, (tp, stages))``), on arrays:
        ``m·M*`` with ``M*`` the least bottleneck time ``M`` at which the pipeline's fill chain
        ``(S(M) + t_emb + t_head + c_part) / (1 - r^p)`` (see :func:`allocation_bounds`) drops to ``m·M``, where
        ``S(M)`` is the least sum of stage times when no stage exceeds ``M`` (one layer per stage, the other layers
        poured into the types of least ``λ`` first, at most ``M/λ`` layers per stage and the memory capacity).
        Every split has a bottleneck ``M_s`` with sum ``>= S(M_s)``, and its chain is at least
        ``max(m·M_s, fill chain at M_s) >= m·M*`` (``m·M`` grows and ``S(M)`` shrinks with ``M``). The fill chain
        also counts 1F1B's in-flight window, ``ceil(m/p)·(S(M) + t_emb + t_head + 2(p-1)·c_min)``
        (:func:`hetplan.search.homogeneous.window_lower_bound_s`). Found by bisection, keeping the lower end; plus
        :meth:`tail_lower_bound_s`."""
        return _refined_bounds_s(self.m.num_layers, *self.refined_columns(allocations))

    def refined_columns(self, allocations, width: int | None = None):
        """The inputs of :func:`_refined_bounds_s` for ``allocations`` of this group: per allocation and block,
        sorted by λ, ``(λ, stages, room beyond one layer per stage, embedding s, head s)`` (allocations, ``width``
        blocks (default: the most of any allocation), 5), and per allocation the group's micro-batches, ``c_min``
        and :meth:`tail_lower_bound_s`."""
        width = width or max(len(blocks) for blocks in allocations)
        cols = np.zeros((len(allocations), width, 5))
        cols[:, :, 0], cols[:, :, 3], cols[:, :, 4] = 1.0, np.inf, np.inf  # padding: no stages, adds nothing
        for i, blocks in enumerate(allocations):
            for j, (k, (t, n)) in enumerate(sorted(blocks, key=lambda kb: self.tables[(kb[0], kb[1][0])].layer_s)):
                tb = self.tables[(k, t)]
                cols[i, j] = (tb.layer_s, n, n * max(int(tb.nmax[MID, 0]) - 1, 0), tb.emb_s, tb.head_s)
        n_alloc = len(allocations)
        tail = self.tail_lower_bound_s(cols[:, :, 1].sum(axis=1).astype(np.int64))
        return cols, np.full(n_alloc, self.mb), np.full(n_alloc, self.c_min()), tail

    def order_p2p_s(self, order) -> float:
        """One-way transfer time of one micro-batch over every boundary of a block order ``[(stage type, stages),
        ...]`` (s; a pool's stages contiguous), cached by order: each pool's own boundaries (cached by pool and its
        blocks: stages of different pools never share a node, so they do not depend on the other pools), plus one
        inter-node boundary between consecutive pools."""
        key = tuple((st.pool, st.tp, n) for st, n in order)
        if key in self._orders:
            return self._orders[key]
        runs: list[tuple[int, list]] = []  # (pool, its blocks) in order
        for st, n in order:
            if runs and runs[-1][0] == st.pool:
                runs[-1][1].append((st, n))
            else:
                runs.append((st.pool, [(st, n)]))
        total = 0.0
        for pool, blocks in runs:
            own = (pool, tuple((st.tp, n) for st, n in blocks))
            if own not in self._orders:
                seq = [st for st, n in blocks for _ in range(n)]
                intra = self.intra_node(seq)
                self._orders[own] = sum(self.p2p(seq[j], seq[j + 1], intra[j]) for j in range(len(seq) - 1))
            total += self._orders[own]
        self._orders[key] = total + sum(self.p2p(a[-1][0], b[0][0], False) for (_, a), (_, b) in zip(runs, runs[1:]))
        return self._orders[key]

    def order_lower_bound_s(self, seq: list[StageType]) -> float:
        """:meth:`order_lower_bounds_s` of one stage order (a pool's stages contiguous)."""
        return float(self.order_lower_bounds_s([_blocks_of(seq)])[0])

    def order_lower_bounds_s(self, orders) -> np.ndarray:
        """Lower bound (s) on :func:`hetplan.estimate.estimator.estimate`'s iteration time of every layer partition
        of each block order of ``orders`` (``[(stage type, stages), ...]``, as many stages each; arrays over them),
        on each position's own cost row ``a_i(n)`` (its embedding or head, its micro-batches in flight and the
        lightest recomputation that fits, so memory counts): the pipeline lasts at least ``m·M*``, with ``M*`` the
        least bottleneck time at which the stages can hold ``L`` layers (the L-th smallest ``a_i(n)``, ``n >= 1``,
        and at least every ``a_i(1)``), and at least the in-flight window
        (:func:`hetplan.search.homogeneous.window_lower_bound_s`) over the least sum of stage times (every
        ``a_i(1)`` plus the ``L - p`` smallest increments ``a_i(n) - a_i(n-1)``, which bound any stage's own) and
        the order's own transfers; then stage 0's least exposed DP time and the largest least optimizer step.
        ``inf`` when no partition fits."""
        p, L, m_ = sum(n for _, n in orders[0]), self.m.num_layers, self.mb
        if p > L:
            return np.full(len(orders), INF)
        kinds, flights = _positions(p, m_)
        kind, fl = np.array(kinds), np.array(flights) - 1
        index, a_all, e_least, o_least = self._stacked()
        tid = np.array([[index[(st.pool, st.tp)] for st, n in order for _ in range(n)] for order in orders])
        a = a_all[tid, kind, fl]  # (orders, p, L+1): each position's row
        tail = np.maximum(e_least[tid[:, 0], kind[0], fl[0]], 0.0) + o_least[tid, kind, fl].max(axis=1)
        held = a[:, :, 1:]
        fits = np.isfinite(held)  # a prefix of each row (a grows with n)
        ok = fits[:, :, 0].all(axis=1) & (fits.sum(axis=(1, 2)) >= L)
        flat = held.reshape(len(orders), -1)
        bottleneck = np.maximum(held[:, :, 0].max(axis=1), np.partition(flat, L - 1, axis=1)[:, L - 1])
        least_sum = held[:, :, 0].sum(axis=1)
        if L > p:
            with np.errstate(invalid="ignore"):  # inf - inf where neither n nor n-1 fits
                steps = np.where(fits[:, :, 1:], a[:, :, 2:] - a[:, :, 1:-1], INF).reshape(len(orders), -1)
            least_sum = least_sum + np.sort(np.partition(steps, L - p - 1, axis=1)[:, :L - p], axis=1).sum(axis=1)
        c = np.array([self.order_p2p_s(order) for order in orders])
        pipe = np.maximum(m_ * bottleneck, window_lower_bound_s(least_sum, c, p, m_))
        return np.where(ok, pipe + tail, INF)

    def least_order_bounds_s(self, allocations) -> np.ndarray:
        """For each allocation (blocks ``(pool, (tp, stages))``), the least :meth:`order_lower_bounds_s` of its
        block orders (:func:`_block_orders`; ``inf`` when none fits), the orders of as many stages bounded
        together."""
        orders = [(i, order) for i, blocks in enumerate(allocations) for order in _block_orders(self, blocks)]
        out = np.full(len(allocations), INF)
        by_p: dict[int, list] = {}
        for i, order in orders:
            by_p.setdefault(sum(n for _, n in order), []).append((i, order))
        for same in by_p.values():
            np.minimum.at(out, [i for i, _ in same], self.order_lower_bounds_s([order for _, order in same]))
        return out

    def _stacked(self):
        """The stage types' tables stacked (cached): index by ``(pool, tp)``, ``a`` (types, kind, in-flight,
        layers), and per (types, kind, in-flight) the least exposed DP and optimizer times (s) over the layer
        counts that fit (``inf`` where none does)."""
        if not hasattr(self, "_stack"):
            tabs = list(self.tables.values())
            a = np.stack([tb.a for tb in tabs])
            fits = np.isfinite(a[..., 1:])
            self._stack = ({key: i for i, key in enumerate(self.tables)}, a,
                           np.where(fits, np.stack([tb.e[..., 1:] for tb in tabs]), INF).min(axis=-1),
                           np.where(fits, np.stack([tb.o[..., 1:] for tb in tabs]), INF).min(axis=-1))
        return self._stack

    def c_min(self) -> float:
        """A lower bound on the one-way time of any boundary between two stage types (s); 0 when the group has no
        stage type (no boundary: any bound holds)."""
        if "c_min" not in self._boundaries:  # shared: the types and boundaries depend on (b, d, cp) only
            # Exact over pairs of equal TP; a resharding boundary (different TP) is bounded by 0.
            pairs = self.same_tp_boundaries()
            _price_boundaries([(self, *pair) for pair in pairs])
            same = [self.p2p(*pair) for pair in pairs]
            cross = any(a.tp != b.tp for a in self.types for b in self.types)
            self._boundaries["c_min"] = min(same + ([0.0] if cross else []), default=0.0)
        return self._boundaries["c_min"]

    def same_tp_boundaries(self) -> list[tuple[StageType, StageType, bool]]:
        """Every boundary ``(s1, s2, intra-node)`` between two stage types of equal TP degree."""
        return [(a, b, intra) for a in self.types for b in self.types if a.tp == b.tp for intra in (False, True)]

    def intra_node(self, seq: list[StageType]) -> list[bool]:
        """:func:`hetplan.plan.boundary_is_intra_node` of a stage order (stages of ``tp·cp·d`` GPUs each)."""
        return boundary_is_intra_node([st.tp * self.width for st in seq], [st.pool for st in seq], self.gpus_per_node)

    def lower_bound_s(self, seq: list[StageType], ns: list[int]) -> float:
        """Lower bound (s) on :func:`hetplan.estimate.estimator.estimate`'s iteration time of the plan with stage
        types ``seq`` holding ``ns`` layers (each with its lightest fitting recomputation), by
        :func:`hetplan.search.homogeneous.stage_chain_lower_bound_s` and
        :func:`~hetplan.search.homogeneous.window_lower_bound_s` (1F1B's in-flight window, plus stage 0's exposed DP
        and the largest optimizer step) on the estimator's own stage costs."""
        from hetplan.search.homogeneous import stage_chain_lower_bound_s

        p = len(seq)
        kinds, flights = _positions(p, self.mb)
        tabs = [self.tables[(st.pool, st.tp)] for st in seq]
        a = [t.a[k, f - 1, n] for t, k, f, n in zip(tabs, kinds, flights, ns)]
        e = [t.e[k, f - 1, n] for t, k, f, n in zip(tabs, kinds, flights, ns)]
        o = [t.o[k, f - 1, n] for t, k, f, n in zip(tabs, kinds, flights, ns)]
        intra = self.intra_node(seq)
        c = [self.p2p(seq[j], seq[j + 1], intra[j]) for j in range(p - 1)]
        window = float(window_lower_bound_s(sum(a), sum(c), p, self.mb)) + e[0] + max(o)
        return max(stage_chain_lower_bound_s(a, c, self.mb, e, o), window)

    def solve_order(self, seq: list[StageType], upper_bound: float, lb_without_p2p: float = 0.0):
        """Exact partition of one stage order; ``(T, layers, rc codes)`` or ``None`` (nothing fits, or nothing
        beats ``upper_bound``). ``lb_without_p2p``: a lower bound of the iteration time less its p2p part (s)."""
        p = len(seq)
        L = self.m.num_layers
        kinds, flights = _positions(p, self.mb)
        tabs = [self.tables[(st.pool, st.tp)] for st in seq]
        nmax = [int(t.nmax[k, f - 1]) for t, k, f in zip(tabs, kinds, flights)]
        if min(nmax) < 1 or sum(nmax) < L:
            return None
        intra = self.intra_node(seq)
        p2p = 2.0 * sum(self.p2p(seq[j], seq[j + 1], intra[j]) for j in range(p - 1))
        if lb_without_p2p + p2p >= upper_bound:
            return None
        a = np.array([t.a[k, f - 1] for t, k, f in zip(tabs, kinds, flights)])
        e = np.array([t.e[k, f - 1] for t, k, f in zip(tabs, kinds, flights)])
        o = np.array([t.o[k, f - 1] for t, k, f in zip(tabs, kinds, flights)])
        res = solve_partition(a, e, o, np.array(nmax), L, self.mb, p2p, upper_bound)
        if res is None:
            return None
        t, ns = res
        rcs = [int(tb.rc[k, f - 1, n]) for tb, k, f, n in zip(tabs, kinds, flights, ns)]
        return t, ns, rcs


def _price_boundaries(items) -> None:
    """Cache :meth:`_Group.p2p` of ``items`` ``(group, s1, s2, intra)`` (s1, s2 of equal TP degree; groups of
    one search) in one :func:`~hetplan.estimate.iteration.boundary_time_s` call over arrays (elementwise, so each
    value equals its own call's)."""
    todo = {}
    for g, s1, s2, intra in items:
        if (s1.pool, s1.tp, s2.pool, s2.tp, intra) not in g._p2p:
            todo[(id(g._p2p), s1.pool, s1.tp, s2.pool, s2.tp, intra)] = (g, s1, s2, intra)
    if not todo:
        return
    work = list(todo.values())

    def column(get) -> np.ndarray:
        return np.array([get(*item) for item in work])

    def links(side: int) -> Link:
        return Link(**{f.name: column(lambda *it: getattr(it[side].link, f.name)) for f in fields(Link)})

    layout = (column(lambda g, s1, s2, i: s1.tp), column(lambda g, s1, s2, i: g.cp), column(lambda g, s1, s2, i: g.d),
              column(lambda g, s1, s2, i: g.b))
    g0 = work[0][0]
    out = boundary_time_s(g0.m, g0.job.seq_len, layout, layout, links(1), links(2),
                          column(lambda g, s1, s2, intra: intra))
    for (g, s1, s2, intra), v in zip(work, np.broadcast_to(out, (len(work),))):
        g._p2p[(s1.pool, s1.tp, s2.pool, s2.tp, intra)] = float(v)


def _refined_bounds_s(L: int, cols: np.ndarray, m_: np.ndarray, c_min: np.ndarray, tail: np.ndarray) -> np.ndarray:
    """:meth:`_Group.refined_sim_bounds_s` of allocations of any groups, on arrays (:meth:`_Group.refined_columns`,
    concatenated: one bisection for all)."""
    lam, s, cap = cols[:, :, 0], cols[:, :, 1], cols[:, :, 2]
    used = s > 0
    p = s.sum(axis=1)
    fixed = cols[:, :, 3].min(axis=1) + cols[:, :, 4].min(axis=1)
    r = 1.0 - 1.0 / m_
    fill = 1.0 - r ** p
    c_part = 2 * c_min * ((p - 1) - np.where(m_ > 1, r * (1 - r ** (p - 1)) / np.where(m_ > 1, 1 - r, 1.0), 0.0))
    rounds = np.ceil(m_ / np.minimum(p, m_))  # 1F1B's in-flight window (window_lower_bound_s)
    base = (lam * s).sum(axis=1)

    def chain(M: np.ndarray) -> np.ndarray:
        total, left = base.copy(), L - p
        for j in range(cols.shape[1]):
            take = np.minimum(np.minimum(left, cap[:, j]), s[:, j] * np.maximum(M / lam[:, j] - 1.0, 0.0))
            total += take * lam[:, j]
            left -= take
        out = np.maximum((total + fixed + c_part) / fill, rounds * (total + fixed + 2 * (p - 1) * c_min))
        return np.where(left > 1e-9, np.inf, out)

    lam_min = np.where(used, lam, np.inf).min(axis=1)
    lo = np.maximum.reduce([np.where(used, lam, 0.0).max(axis=1), -(-L // p) * lam_min, L / (s / lam).sum(axis=1)])
    hi = np.where(m_ * lo < chain(lo), np.maximum(lo, np.where(used, lam * (1 + cap / np.maximum(s, 1)), 0.0)
                                                  .max(axis=1)), lo)
    while np.any(short := m_ * hi < chain(hi)):  # the capacity suffices (allocation_bounds), so this ends
        hi = np.where(short, 2 * hi, hi)
    for _ in range(40):
        mid = 0.5 * (lo + hi)
        below = m_ * mid < chain(mid)
        lo, hi = np.where(below, mid, lo), np.where(below, hi, mid)
    return m_ * lo + tail


def _pool_options(group: _Group, L: int, mixed_tp: bool = False):
    """Per pool: list of options, each a tuple of ``(tp, stages)`` sub-blocks (``()`` = pool unused).

    Without ``mixed_tp`` one TP degree per pool: ``((tp, s),)``. With it also two degrees ``tp_a > tp_b``,
    ``((tp_a, s_a), (tp_b, s_b))``, where ``s_a`` is the most ``tp_a`` stages the pool holds and the ``tp_b``
    stages take exactly the GPUs left over (``s_b·tp_b·d`` = the rest, fewer than one ``tp_a`` stage): e.g. 3 A10G
    as one TP-2 stage and one TP-1 stage. This is the case where a second degree adds GPUs no single-degree plan
    can use (measured by brute force in ``benchmarks/bench_hetero_space.py``)."""
    out = []
    for k, pool in enumerate(group.inventory.pools):
        opts: list[tuple] = [()]
        tps = sorted(st.tp for st in group.types if st.pool == k)
        for ta in tps:
            for sa in range(1, min(L, pool.count // (ta * group.width)) + 1):
                opts.append(((ta, sa),))
                if not mixed_tp:
                    continue
                left = pool.count // group.width - sa * ta  # GPUs per replica (and CP rank) left in the pool
                if left >= ta:
                    continue
                for tb in tps:
                    if tb < ta and left % tb == 0 and 0 < left // tb <= L - sa:
                        opts.append(((ta, sa), (tb, left // tb)))
        out.append(opts)
    return out


class _TooMany(Exception):
    """More allocations than the caller allows."""


def allocation_bounds(group: _Group, pins: Pins, max_pools: int = 64, max_rows: int = 10**8, return_sim: bool = False,
                      mixed_tp: bool = False):
    """All allocations of a group as arrays: option index per pool ``(N, K)``, stages ``p``, GPUs, $/h ``R``,
    iteration-time lower bound ``T_LB`` (s) — only those that may fit in memory, with at most ``max_pools`` pools;
    with ``mixed_tp`` a pool may hold two TP degrees (:func:`_pool_options`);
    with ``return_sim`` also ``T_SIM`` (s), a lower bound of :func:`hetplan.estimate.estimator.estimate`'s
    event-simulated iteration time for every order and partition (below).

    Raises:
        _TooMany: more than ``max_rows`` allocations.

    ``T_LB = S + t_emb + t_head + (m-1)·B + 2(p-1)·c_min``, valid for every order and partition:

    * every stage holds at least one layer and at most ``nmax`` (its most lenient memory position), so the sum of
      stage times is at least ``S`` = one layer on each stage plus the other ``L - p`` layers poured into the
      stages of least per-layer time ``λ`` first, up to their capacity (a fractional-knapsack minimum, which
      bounds the integer one from below);
    * the slowest stage takes at least ``B = max(max_i λ_i, L / Σ_i 1/λ_i)`` (it holds ≥ 1 layer; and if every
      stage took less than the fluid balance the layers would not add up to ``L``);
    * ``t_emb`` / ``t_head`` / ``c_min``: the least embedding, head and p2p times of any stage type.

    ``T_LB`` bounds the closed form only: the simulated schedule can be shorter (a slow first stage overlaps the
    others' fill and drain). ``T_SIM`` bounds the chain ``X = max_i [P_i + m·a_i]`` of
    :func:`hetplan.search.homogeneous.stage_chain_lower_bound_s` (``P_i`` = Σ_{j<i} (a_j + 2c_j)), hence every
    schedule; it is the largest of

    * ``m·max(B, ceil(L/p)·λ_min)`` — the bottleneck stage's own work (some stage holds ``ceil(L/p)`` layers);
    * ``S + t_emb + t_head + 2(p-1)·c_min + (m-1)·(λ_min + t_head)`` — the chain through the last stage, which
      holds at least one layer and the head;
    * ``(S + t_emb + t_head + 2·c_min·Σ_{k=1}^{p-1}(1 - r^k)) / (1 - r^p)`` with ``r = 1 - 1/m`` — the fill of the
      pipeline: from ``P_i + m a_i <= X``, ``X - P_{i+1} >= r (X - P_i) - 2c_i``, so
      ``Σ a_i <= X (1 - r^p) - 2 Σ_i c_i (1 - r^{p-1-i})``; the sum of stage times is at least
      ``S + t_emb + t_head`` (for equal stages ``p/(1 - r^p)`` stage times against the closed form's ``p + m - 1``);
    * ``ceil(m/p)·(S + t_emb + t_head + 2(p-1)·c_min)`` — 1F1B's in-flight window
      (:func:`hetplan.search.homogeneous.window_lower_bound_s`): at most ``p`` micro-batches in flight, each round
      trip crossing every stage and boundary twice (binding when transfers are slow against the compute);

    plus :meth:`_Group.tail_lower_bound_s` (first stage's exposed DP, largest optimizer step).
    """
    L = group.m.num_layers
    opts, subs = group.pool_options(L, mixed_tp)
    K = len(opts)
    if not group.types:  # no stage type fits the group's width: no allocation
        none = np.zeros(0)
        return (opts, np.zeros((0, K), dtype=np.int64), none.astype(np.int64), none.astype(np.int64), none, none) + (
            (none,) if return_sim else ())
    cols = [_option_columns(group, k, sub_t, sub_p) for k, (sub_t, sub_p) in enumerate(subs)]
    # Cross product pool by pool, dropping partial allocations with more than L stages or max_pools pools and
    # options whose stage cannot hold one layer (both only grow as pools are added).
    # Count first (a histogram over (stages, pools used)) where the options could make more than max_rows, so that
    # an oversized space costs nothing to reject.
    valids = [np.flatnonzero(c["cap"] >= 0) for c in cols]
    if math.prod(len(v) for v in valids) > max_rows:
        hist = np.zeros((L + 1, K + 1), dtype=np.int64)
        hist[0, 0] = 1
        shift = np.subtract.outer(np.arange(L + 1), np.arange(L + 1))  # stages added: row minus column
        for k in range(K):
            per_p = np.bincount(cols[k]["p"][valids[k]], minlength=L + 1)  # options by stage count
            adds = np.where(shift >= 1, per_p[np.clip(shift, 0, L)], 0)  # options of shift >= 1 stages
            hist = per_p[0] * hist + np.pad(adds @ hist[:, :-1], ((0, 0), (1, 0)))
        if int(hist[:, : max_pools + 1].sum()) > max_rows:
            raise _TooMany()
    # Built option by option: the parents that take an option of pk >= 1 stages are a prefix of those under
    # max_pools pools sorted by stages; every parent takes the empty option. Then sorted back to the order of
    # the codes (by pool 0's option, then pool 1's, ...).
    code = np.zeros(1, dtype=np.int64)
    pcount = np.zeros(1, dtype=np.int64)
    used = np.zeros(1, dtype=np.int64)
    for k, valid in enumerate(valids):
        pk = cols[k]["p"][valid]
        empty, some = valid[pk == 0], valid[pk > 0]
        open_ = np.flatnonzero(used < max_pools)
        open_ = open_[np.argsort(pcount[open_], kind="stable")]
        n = np.searchsorted(pcount[open_], L - pk[pk > 0], side="right")
        if len(empty) * len(code) + int(n.sum()) > max_rows:
            raise _TooMany()
        par = np.concatenate([np.tile(np.arange(len(code)), len(empty)),
                              open_[np.arange(n.sum()) - np.repeat(np.cumsum(n) - n, n)]])
        child = np.concatenate([np.repeat(empty, len(code)), np.repeat(some, n)])
        code = code[par] * len(opts[k]) + child
        pcount, used = pcount[par] + cols[k]["p"][child], used[par] + (cols[k]["p"][child] > 0)
    code = np.sort(code)
    idx = np.empty((len(code), K), dtype=np.int64)
    for k in range(K - 1, -1, -1):
        code, idx[:, k] = np.divmod(code, len(opts[k]))
    # Per allocation, each pool's column (1-D gathers; sums taken pool by pool)
    pcount = sum(cols[k]["p"][idx[:, k]] for k in range(K))
    capsum = sum(cols[k]["cap"][idx[:, k]] for k in range(K))
    ok = (pcount >= 1) & (capsum >= L - pcount)
    if pins.pp is not None:
        ok &= pcount == pins.pp
    if pins.num_gpus is not None:
        ok &= sum(cols[k]["gpus"][idx[:, k]] for k in range(K)) == pins.num_gpus
    idx, p = idx[ok], pcount[ok]
    per = {name: [cols[k][name][idx[:, k]] for k in range(K)] for name in ("p", "gpus", "rate", "inv", "lam", "cap", "lmax")}
    lam, cap = per["lam"], per["cap"]
    # Fractional pour of the L - p layers beyond one per stage into the types of least λ first: a pool's share is
    # what is left after the pools of smaller λ (ties: lower pool index first) took their capacity.
    pour = 0.0
    for j in range(K):
        before = sum(np.where(lam[i] < lam[j] if i > j else lam[i] <= lam[j], cap[i], 0)
                     for i in range(K) if i != j)
        pour = pour + np.clip((L - p) - before, 0, cap[j]) * lam[j]
    s_lb = sum(np.where(c > 0, c * lm, 0.0) for c, lm in zip(per["p"], lam)) + pour
    b_lb = np.maximum(np.maximum.reduce(per["lmax"]), L / sum(per["inv"]))
    emb = min(tb.emb_s for tb in group.tables.values())
    head = min(tb.head_s for tb in group.tables.values())
    # functions of the stage count p, tabulated over 0..L
    c_min = group.c_min()
    m_ = group.mb
    r = 1.0 - 1.0 / m_
    ps = np.arange(L + 1)
    p2p_tab = 2 * (ps - 1) * c_min
    fill_tab = 1.0 - r ** ps
    c_part_tab = 2 * c_min * ((ps - 1) - (r * (1 - r ** (ps - 1)) / (1 - r) if m_ > 1 else 0.0))
    s_fixed = s_lb + emb + head
    t_lb = s_fixed + (m_ - 1) * b_lb + p2p_tab[p]
    # Bound of the chain (hetplan.search.homogeneous.stage_chain_lower_bound_s), valid for every schedule the
    # estimator simulates: the bottleneck stage alone does m·B of work; the chain through the last stage is the
    # sum of all stages plus (m-1) times the last stage (>= one layer of some type plus the least head).
    lam_min = np.minimum.reduce(lam)
    # Integrality: some stage holds at least ceil(L/p) layers, at no less than the allocation's least λ each.
    b_int = np.maximum(b_lb, (-(-L // np.maximum(ps, 1)))[p] * lam_min)
    t_sim = np.maximum.reduce([
        m_ * b_int,
        s_fixed + p2p_tab[p] + np.where(p > 1, (m_ - 1) * (lam_min + head), 0),
        (s_fixed + c_part_tab[p]) / fill_tab[p],
        window_lower_bound_s(s_fixed, ((ps - 1) * c_min)[p], p, m_),
    ]) + group.tail_lower_bound_s(ps)[p]
    rate = sum(per["rate"])
    if return_sim:
        return opts, idx, p, sum(per["gpus"]).astype(np.int64), rate, t_lb, t_sim
    return opts, idx, p, sum(per["gpus"]).astype(np.int64), rate, t_lb


def _option_columns(group: _Group, k: int, sub_t: np.ndarray, sub_p: np.ndarray) -> dict:
    """Columns of pool ``k``'s options (:meth:`_Group.pool_options`: sub-blocks of TP degree ``sub_t`` and
    ``sub_p`` stages, arrays ``(options, 2)``) for :func:`allocation_bounds`: stages ``p``, ``gpus``, $/h
    ``rate``, ``inv`` = Σ stages/λ, ``lam`` the least λ (``1e30`` when unused), ``cap`` the layers its stages hold
    beyond one each (``-1`` when a stage cannot hold one layer), ``lmax`` the largest λ (0 when unused). An option
    of two TP degrees counts as one type of its least λ and total capacity (a lower bound of the pour over its
    sub-blocks)."""
    own = {t: tb for (kk, t), tb in group.tables.items() if kk == k}
    size = int(sub_t.max()) + 1
    lam_of, room_of = np.full(size, 1e30), np.zeros(size, dtype=np.int64)
    for t, tb in own.items():
        lam_of[t], room_of[t] = tb.layer_s, int(tb.nmax[MID, 0]) - 1
    price = group.by_key[(k, next(iter(own)))].price_usd_per_hour if own else 0.0
    lam, room = lam_of[sub_t], room_of[sub_t]
    used = sub_p > 0
    g = (sub_t * group.width * sub_p).sum(axis=1)
    return {
        "p": sub_p.sum(axis=1).astype(np.int64), "gpus": g, "rate": g * price,
        "inv": np.where(used, sub_p / lam, 0.0).sum(axis=1), "lam": np.where(used, lam, 1e30).min(axis=1),
        "cap": np.where((used & (room < 0)).any(axis=1), -1, np.where(used, sub_p * room, 0).sum(axis=1)).astype(float),
        "lmax": np.where(used, lam, 0.0).max(axis=1),
    }


def _groups(m: ModelSpec, job: Job, inventory: Inventory, catalog, pins: Pins, max_stages: int,
            progress=None) -> list[_Group]:
    """One :class:`_Group` per (DP, micro-batch size, ZeRO, CP, EP) allowed by ``pins``: CP degrees as the
    homogeneous space's (:func:`hetplan.search.space.cp_degrees`, up to the largest pool), EP degrees the
    divisors of the expert count that divide ``dp·cp`` (1 for a dense model); ``progress(done, total, phase)``
    as their cost tables are built."""
    types = stage_types(m, inventory, catalog, job.dtype, pins, job=job)
    # Under flash attention selective recomputation is the same plan as none (hetplan.plan.Job): not a choice.
    free = [0, 2] if job.attention == "flash" else [0, 1, 2]
    rcs = [RECOMPUTE_NAMES.index(pins.recompute)] if pins.recompute is not None else free
    zeros = [0, 1] if pins.zero is None else [z for z in (0, 1) if z == pins.zero]
    cps = cp_degrees(job.seq_len, max(p.count for p in inventory.pools)) if pins.cp is None else [pins.cp]
    shapes = [(b, d, z, c, e) for d in divisors(job.global_batch) if pins.dp is None or d == pins.dp
              for b in divisors(job.global_batch // d) if pins.mbs is None or b == pins.mbs
              for z in zeros if not (z == 1 and d == 1)  # ZeRO-1 over one rank is ZeRO-0
              for c in cps for e in ep_degrees(m, d * c, pins.ep)]
    by_type: dict = {}  # the groups' tables, built together per (stage type, CP, EP) (cost_tables)
    for b, d, z, c, e in shapes:
        for k, st in enumerate(types):
            if st.tp * c * d <= inventory.pools[st.pool].count:
                F = max(1, min(job.global_batch // (b * d), max_stages))
                by_type.setdefault((k, c, e), []).append((b, d, z, F))
    built: dict = {}  # (b, d, z, c, e) -> {(pool, tp): table}
    for i, ((k, c, e), group_shapes) in enumerate(by_type.items()):
        if progress is not None:
            progress(i, len(by_type), "cost tables (groups)")
        for (b, d, z, _), tb in zip(group_shapes, cost_tables(m, job, types[k], group_shapes, rcs, c, e)):
            built.setdefault((b, d, z, c, e), {})[(types[k].pool, types[k].tp)] = tb
    groups: list[_Group] = []
    shared: dict = {}
    for b, d, z, c, e in shapes:
        g = _Group(m, job, inventory, types, b, d, z, rcs, max_stages, c, e, shared, built.get((b, d, z, c, e), {}))
        if g.types:
            groups.append(g)
    return groups


def _bounded_allocations(groups, inventory, pins, max_stages, max_allocations, mixed_tp: bool = True,
                         progress=None):
    """Bounds of every allocation of every group (:func:`allocation_bounds`). The space first includes two TP
    degrees per pool; when it holds more than ``max_allocations`` allocations, one TP degree per pool, then plans
    restricted to two pools (then one). Returns ``(rows, (max_pools, mixed_tp), count)``, rows as
    ``(group index, options, option index per pool, $/h, T_LB, T_SIM)``; ``progress(done, total, phase)`` per
    group."""
    max_pools = len(inventory.pools)
    mixed = mixed_tp and pins.tp is None
    _price_boundaries([(g, *pair) for g in groups for pair in g.same_tp_boundaries()])  # each group's c_min
    while True:
        rows = []
        n_alloc = 0
        try:
            for gi, g in enumerate(groups):
                if progress is not None:
                    progress(gi, len(groups), "allocation bounds (groups)")
                opts, idx, p, gpus, rate, t_lb, t_sim = allocation_bounds(
                    g, pins, max_pools, max_allocations - n_alloc, return_sim=True, mixed_tp=mixed)
                keep = p <= max_stages
                n_alloc += int(keep.sum())
                rows.append((gi, opts, idx[keep], rate[keep], t_lb[keep], t_sim[keep]))
            return rows, (max_pools, mixed), n_alloc
        except _TooMany:
            if mixed:
                mixed = False
                continue
            if max_pools <= 1:
                raise
            max_pools = 2 if max_pools > 2 else 1


def _concat_rows(rows):
    """Flat arrays over all allocations: group index, row within the group, $/h, T_LB, T_SIM."""
    if not rows:
        z = np.zeros(0, dtype=np.int64)
        return z, z, np.zeros(0), np.zeros(0), np.zeros(0)
    return (np.concatenate([np.full(len(r[2]), r[0]) for r in rows]),
            np.concatenate([np.arange(len(r[2])) for r in rows]),
            np.concatenate([r[3] for r in rows]), np.concatenate([r[4] for r in rows]),
            np.concatenate([r[5] for r in rows]))


def _allocation_blocks(rows, gi: int, li: int):
    """The (pool, (tp, stages)) blocks of allocation ``li`` of group row ``gi`` (a pool with two TP degrees gives
    two blocks; see :func:`_block_orders`)."""
    opts = rows[gi][1]
    sel = rows[gi][2][li]
    return [(k, sub) for k in range(len(opts)) for sub in opts[k][sel[k]]]


def _block_orders(g: _Group, blocks):
    """Block orders of an allocation, each a list ``[(stage type, stages), ...]``: its pools' blocks in every
    order, and inside a pool with two TP degrees both orders of its two sub-blocks (a pool's stages stay
    contiguous)."""
    by_pool: dict[int, list] = {}
    for k, ts in blocks:
        by_pool.setdefault(k, []).append(ts)
    pools = list(by_pool.items())
    for perm in itertools.permutations(pools):
        for inner in itertools.product(*(itertools.permutations(subs) for _, subs in perm)):
            yield [(g.by_key[(k, t)], s) for (k, _), subs in zip(perm, inner) for t, s in subs]


def _stages(order) -> list[StageType]:
    """The stage types of a block order, stage by stage."""
    return [st for st, n in order for _ in range(n)]


def _blocks_of(seq: list[StageType]) -> list:
    """The block order of a stage order: runs of one stage type."""
    return [(run[0], len(run)) for run in (list(r) for _, r in itertools.groupby(seq, key=lambda st: (st.pool, st.tp)))]


def _solve_allocation(g: _Group, blocks, upper_bound: float, lb_without_p2p: float):
    """Least closed-form iteration time over the block orders of one allocation and each order's partitions:
    ``(T, stage types in order, layers, recompute codes, orders tried)``; ``T`` is ``None`` when nothing fits
    or nothing beats ``upper_bound``. ``lb_without_p2p``: a closed-form lower bound less its p2p part (s)."""
    best = None
    tried = 0
    for seq in map(_stages, _block_orders(g, blocks)):
        tried += 1
        bound = upper_bound if best is None else min(upper_bound, best[0])
        res = g.solve_order(seq, bound, lb_without_p2p)
        if res is not None:
            best = (res[0], seq, res[1], res[2])
    if best is None:
        return None, None, None, None, tried
    return (*best, tried)


def _frontier_dominates(frontier: list[HeteroCandidate], t: float, cost_per_s: float) -> float:
    """Least iteration time from which a plan with $/s rate ``cost_per_s`` is weakly dominated by the frontier."""
    best = INF
    for f in frontier:
        best = min(best, max(f.iteration_time_s, f.usd_per_iteration / cost_per_s if cost_per_s > 0 else INF))
    return best


def _insert_frontier(frontier: list[HeteroCandidate], c: HeteroCandidate) -> list[HeteroCandidate]:
    keep = [f for f in frontier if not (f.iteration_time_s >= c.iteration_time_s and f.usd_per_iteration >= c.usd_per_iteration)]
    keep.append(c)
    keep.sort(key=lambda f: (f.iteration_time_s, f.usd_per_iteration))
    return keep


def search_hetero(
    m: ModelSpec,
    job: Job,
    inventory: Inventory,
    catalog,
    goal: str = "fastest",
    slo_iteration_s: float | None = None,
    budget_usd_per_iteration: float | None = None,
    pins: Pins | None = None,
    prune: bool = True,
    max_stages: int | None = None,
    keep_candidates: int = 0,
    max_allocations: int = 4_000_000,
    mixed_tp: bool = True,
    prepared: PreparedSpace | None = None,
    max_solves: int | None = None,
    progress=None,
) -> HeteroResult:
    """Exact search of the heterogeneous space (module doc) for ``goal``.

    Args:
        goal: ``"cheapest"`` (least $ per iteration, iteration time ≤ ``slo_iteration_s`` if given),
            ``"fastest"`` (least iteration time, $ per iteration ≤ ``budget_usd_per_iteration`` if given),
            or ``"pareto"`` (the whole time–$ frontier, constraints applied as filters).
        pins: fixed TP (all stages), DP, micro-batch size, ZeRO, recomputation, PP, number of GPUs.
        prune: ``False`` visits every allocation and every stage order with no allocation or order lower bound (the
            slow exhaustive reference); each order's partition is still solved exactly by
            :func:`~hetplan.search.partition.solve_partition` (checked against brute force in the tests), given the
            incumbent as its upper bound (for ``pareto``: only the SLO/budget).
        max_stages: cap on the pipeline depth (default: the number of layers).
        keep_candidates: keep up to this many exactly evaluated plans besides the best (0 = all found).
        mixed_tp: allow a second TP degree on a pool's leftover GPUs (:func:`_pool_options`).
        max_allocations: when the space holds more GPU allocations than this, first one TP degree per pool, then
            plans are restricted to at most two pools (then one), and ``HeteroResult.stats["max_pools_per_plan"]`` says so: the result is exact
            over the restricted space only.
        prepared: the space's bounded allocations when the caller has them already (:class:`PreparedSpace`).
        max_solves: solve at most this many allocations (``None``: no limit); a search cut short says so in
            ``stats["cut_short"]`` and is exact no more (the estimated search uses it only for its seeds).
        progress: ``progress(solved, max_solves, phase)`` before each allocation solved.
    Returns:
        :class:`HeteroResult`; ``best`` is ``None`` when nothing fits or meets the constraint.
    Raises:
        HetplanError: unknown GPU in the inventory.
    """
    t0 = time.perf_counter()
    pins = pins or Pins()
    max_stages = min(max_stages or m.num_layers, m.num_layers)
    if prepared is None:
        groups = _groups(m, job, inventory, catalog, pins, max_stages)
        rows, max_pools, n_alloc = _bounded_allocations(groups, inventory, pins, max_stages, max_allocations,
                                                        mixed_tp)
        gid, loc, rate, t_lb, _ = _concat_rows(rows)
    else:
        groups, rows, max_pools, n_alloc = prepared.groups, prepared.rows, prepared.max_pools, prepared.allocations
        gid, loc, rate, t_lb, _ = prepared.flat
    cost_lb = rate * t_lb / 3600.0
    if goal == "cheapest":
        ok = t_lb <= (slo_iteration_s if slo_iteration_s is not None else INF)
        order = np.argsort(cost_lb, kind="stable")
    else:
        ok = cost_lb <= (budget_usd_per_iteration if budget_usd_per_iteration is not None else INF)
        if goal == "pareto" and slo_iteration_s is not None:
            ok &= t_lb <= slo_iteration_s
        order = np.argsort(t_lb, kind="stable")
    if prune:
        order = order[ok[order]]
    cmins = [g.c_min() for g in groups]
    best: HeteroCandidate | None = None
    frontier: list[HeteroCandidate] = []
    found: list[HeteroCandidate] = []
    solved = orders = 0
    slo = slo_iteration_s if slo_iteration_s is not None else INF
    budget = budget_usd_per_iteration if budget_usd_per_iteration is not None else INF
    cut_short = False
    for j in order:
        if max_solves is not None and solved >= max_solves:
            cut_short = True
            break
        R = float(rate[j])
        rs = R / 3600.0
        if goal == "cheapest":
            if prune and best is not None and cost_lb[j] >= best.usd_per_iteration:
                break
            ub = min(np.nextafter(slo, INF), best.usd_per_iteration / rs if best is not None else INF)
        elif goal == "fastest":
            if prune and best is not None and t_lb[j] >= best.iteration_time_s:
                break
            ub = min(np.nextafter(budget / rs, INF), best.iteration_time_s if best is not None else INF)
        else:
            ub = min(np.nextafter(slo, INF), np.nextafter(budget / rs, INF))
            if frontier:
                ub = min(ub, _frontier_dominates(frontier, 0.0, rs))
            if prune and t_lb[j] >= ub:
                continue
        if not prune and goal == "pareto":
            ub = min(np.nextafter(slo, INF), np.nextafter(budget / rs, INF))
        g = groups[int(gid[j])]
        blocks = _allocation_blocks(rows, int(gid[j]), int(loc[j]))
        if progress is not None:
            progress(solved, max_solves, "closed-form seeds (solves)")
        solved += 1
        lbp = float(t_lb[j]) - 2 * (sum(s for _, (t, s) in blocks) - 1) * cmins[int(gid[j])] if prune else 0.0
        t, seq, ns, rcv, tried = _solve_allocation(g, blocks, ub, lbp)
        orders += tried
        if t is None:
            continue
        cand = HeteroCandidate(
            stages=[StageChoice(st.pool, st.tp, n, rc) for st, n, rc in zip(seq, ns, rcv)],
            mbs=g.b, dp=g.d, zero=g.zero, iteration_time_s=t, usd_per_hour=R, cp=g.cp, ep=g.ep,
        )
        found.append(cand)
        if goal == "cheapest":
            if best is None or cand.usd_per_iteration < best.usd_per_iteration:
                best = cand
        elif goal == "fastest":
            if best is None or cand.iteration_time_s < best.iteration_time_s:
                best = cand
        else:
            frontier = _insert_frontier(frontier, cand)
    if goal == "pareto":
        if not prune:
            frontier = []
            for c in sorted(found, key=lambda c: (c.iteration_time_s, c.usd_per_iteration)):
                frontier = _insert_frontier(frontier, c)
        best = frontier[0] if frontier else None
    if goal == "cheapest":
        found.sort(key=lambda c: (c.usd_per_iteration, c.iteration_time_s))
    else:
        found.sort(key=lambda c: (c.iteration_time_s, c.usd_per_iteration))
    if not prune and found and goal != "pareto":
        best = found[0]
    if keep_candidates:
        found = found[:keep_candidates]
    return HeteroResult(
        best=best, candidates=found, frontier=frontier, allocations=n_alloc,
        allocations_fitting=n_alloc, allocations_solved=solved, orders_solved=orders,
        search_time_s=time.perf_counter() - t0,
        stats={"max_pools_per_plan": max_pools[0], "mixed_tp": max_pools[1],
               "restricted": max_pools[0] < len(inventory.pools) or (mixed_tp and pins.tp is None and not max_pools[1]),
               "groups": len(groups), "cut_short": cut_short},
    )


@dataclass
class EstimatedPlan:
    """A plan of the heterogeneous space evaluated by :func:`hetplan.estimate.estimator.estimate`: the search's
    candidate (closed-form figures), the :class:`Plan`, its estimate and the lower bound that admitted it (s)."""

    candidate: HeteroCandidate
    plan: Plan
    estimate: object
    lower_bound_s: float

    @property
    def heterogeneous(self) -> bool:
        """True when the stages use more than one pool."""
        return len(self.candidate.pools_used) > 1


@dataclass
class EstimatedResult:
    """Outcome of :func:`search_hetero_estimated`: the best plans by the objective on their estimates (``top``,
    best first; ``pareto``: empty), the frontier by estimates (``frontier``, ascending time), every plan estimated
    (``evaluated``) and counters: allocations bounded, allocations solved (closed-form partition of every block
    order), plans estimated, stage orders tried, CPU-independent wall time (s)."""

    top: list[EstimatedPlan]
    frontier: list[EstimatedPlan]
    evaluated: list[EstimatedPlan]
    allocations: int = 0
    allocations_solved: int = 0
    plans_estimated: int = 0
    orders_solved: int = 0
    search_time_s: float = 0.0
    #: ``inf`` when the walk completed (the result is exact over H); else the smallest lower bound not expanded
    #: (objective units: job s or job $; pareto: iteration s) — see :attr:`proven`.
    open_bound: float = math.inf
    stats: dict = field(default_factory=dict)

    @property
    def complete(self) -> bool:
        """True when every candidate of H that could matter was estimated (no expansion limit hit)."""
        return not math.isfinite(self.open_bound)


def search_hetero_estimated(
    m: ModelSpec,
    job: Job,
    inventory: Inventory,
    catalog,
    objective=None,
    pins: Pins | None = None,
    top_k: int = 5,
    pareto: bool = False,
    max_stages: int | None = None,
    max_allocations: int = 4_000_000,
    estimator=None,
    max_expansions: int | None = None,
    seed: bool = True,
    mixed_tp: bool = True,
    progress=None,
    seed_solves: int | None = None,
    incumbents=(),
) -> EstimatedResult:
    """The best heterogeneous plans (or the cost–time frontier) by :func:`hetplan.estimate.estimator.estimate`
    itself, exact over the candidate set ``H``: one plan per GPU allocation of the space (module doc), with the
    block order and layer partition that minimise the closed-form iteration time (:func:`_solve_allocation`, exact
    for that objective) and the lightest recomputation that fits each stage.

    Lower-bound-guarded re-estimation (:func:`hetplan.search.objective.guarded_best_first`, the loop of the
    homogeneous planner): allocations are visited in increasing order of the objective at ``T_SIM``
    (:func:`allocation_bounds`), a bound on the estimate of *every* plan of the allocation; a visited allocation is
    re-queued at a tighter bound of its own (:meth:`_Group.refined_sim_bound_s`), when it comes up again at the
    least bound of its stage orders (:meth:`_Group.order_lower_bound_s`: each position's own costs, so memory, the
    embedding, the head and the integrality of layers count; on the README's ``llama2-7b-mixed-cloud`` it leaves 67
    of 3,167 allocations to solve, and the exact walk takes 13,086 expansions instead of 26,060); when it comes up a
    third time it is solved and its plan re-queued at the bound of its own stages
    (:func:`hetplan.search.homogeneous.stage_chain_lower_bound_s`); a plan reaching the head of the queue is
    estimated. Top k: the scan stops when the next bound is worse than the k-th best estimate. Pareto: an item is
    skipped when a frontier point (estimated) is at least as fast and as cheap as the item's bound ``(T, R·T)``;
    every item not skipped is expanded, so no plan of ``H`` left unestimated could dominate a frontier point.

    Args:
        objective: :class:`hetplan.search.objective.Objective` (goal, deadline/budget on the job, iteration SLO);
            for ``pareto`` only its ``slo_iteration_s`` and ``budget_usd`` (job $) act, as filters.
        top_k: how many plans to keep. pareto: compute the frontier instead.
        estimator: the function estimating one plan (default :func:`~hetplan.estimate.estimator.estimate`).
        max_expansions: stop the walk after this many expansions (allocation bounds refined, allocations solved,
            plans estimated); the result then says ``complete = False`` and ``open_bound`` (every plan of H not
            estimated is no better than that bound). ``None``: no limit (exact over H). A count, not a time: the
            answer is the same on any machine under any load.
        progress: ``progress(done, limit, phase)`` as the phases advance (a progress display): the cost tables
            (groups), the closed-form seeds (allocations solved), the walk (expansions).
        mixed_tp: as in :func:`search_hetero`.
        seed: first run the closed-form search (:func:`search_hetero`) and estimate its best plans (or frontier),
            so the cut starts from strong incumbents (they are plans of H).
        seed_solves: the seed search solves at most this many allocations (``None``: until exact); seeds only
            strengthen the cut, so a limit never changes what the walk proves.
        incumbents: ``(plan, estimate)`` pairs found elsewhere (the homogeneous exact top K) that the caller ranks
            together with this search's plans: they fill the top-k cut from the start, so the walk only proves
            what could enter the joint ranking; they are not returned, and a plan of H equal to one is not
            estimated again (top k only).
    Raises:
        HetplanError: unknown GPU type in the inventory.
    """
    from hetplan.estimate.estimator import estimate
    from hetplan.search.objective import (BOUND_SLACK, Objective, TopK, estimate_keys, guarded_best_first,
                                          lower_bound_keys)

    t0 = time.perf_counter()
    estimator = estimator or estimate
    objective = objective or Objective()
    pins = pins or Pins()
    max_stages = min(max_stages or m.num_layers, m.num_layers)
    iterations = job.iterations()
    groups = _groups(m, job, inventory, catalog, pins, max_stages, progress)
    rows, max_pools, n_alloc = _bounded_allocations(groups, inventory, pins, max_stages, max_allocations, mixed_tp,
                                                    progress)
    flat = _concat_rows(rows)
    gid, loc, rate, t_lb, t_sim = flat
    prepared = PreparedSpace(groups, rows, max_pools, n_alloc, flat)
    cmins = [g.c_min() for g in groups]
    slo = objective.slo_iteration_s if objective.slo_iteration_s is not None else INF
    budget_it = objective.budget_usd / iterations if objective.budget_usd is not None else INF
    evaluated: list[EstimatedPlan] = []
    seen: set = set()
    top = TopK(top_k)
    known = set()
    for plan, est in ([] if pareto else incumbents):
        k2 = estimate_keys(objective, est)
        if k2 is not None:
            top.add(*k2, est.memory_bytes_per_gpu.total, -len(known) - 1, None)
        known.add(plan.model_dump_json())
    frontier: list[EstimatedPlan] = []
    count = {"solved": 0, "orders": 0}

    def record(cand: HeteroCandidate, bound: float) -> None:
        """Estimate one plan of H (once) and file it."""
        key = (tuple(cand.stages), cand.mbs, cand.dp, cand.zero, cand.cp, cand.ep)
        if key in seen:
            return
        seen.add(key)
        plan = cand.to_plan(job, inventory)
        if known and plan.model_dump_json() in known:
            return  # an incumbent: already ranked by the caller
        est = estimator(plan, catalog, m)
        ep = EstimatedPlan(cand, plan, est, bound)
        evaluated.append(ep)
        if pareto:
            if est.fits and est.iteration_time_s <= slo and est.usd_per_iteration <= budget_it:
                frontier[:] = _insert_estimated(frontier, ep)
        else:
            k2 = estimate_keys(objective, est)
            if k2 is not None:
                top.add(*k2, est.memory_bytes_per_gpu.total, len(evaluated), ep)

    # Incumbents: the closed-form optimum (or frontier) and runners-up, estimated. They are plans of H (each the
    # closed-form best of its allocation), so they only strengthen the cut; the walk below proves the rest.
    # With a full top k from the caller's incumbents the cut is known from the start: the closed-form seeds add
    # nothing the walk would not find, so they are skipped.
    if seed and not (not pareto and len(top.entries) >= top_k):
        if pareto:
            cf = search_hetero(m, job, inventory, catalog, goal="pareto", slo_iteration_s=objective.slo_iteration_s,
                               budget_usd_per_iteration=None if budget_it == INF else budget_it, pins=pins,
                               max_stages=max_stages, max_allocations=max_allocations, prepared=prepared,
                               max_solves=seed_solves, progress=progress)
            seeds_cf = cf.frontier
        else:
            cf_goal, cf_slo, cf_budget = _closed_form_goal(objective, iterations)
            cf = search_hetero(m, job, inventory, catalog, goal=cf_goal, slo_iteration_s=cf_slo,
                               budget_usd_per_iteration=cf_budget, pins=pins, max_stages=max_stages,
                               max_allocations=max_allocations, keep_candidates=top_k + 3, prepared=prepared,
                               max_solves=seed_solves, progress=progress)
            seeds_cf = cf.candidates
        count["solved"] += cf.allocations_solved
        count["orders"] += cf.orders_solved
        for c in seeds_cf:
            record(c, 0.0)

    if pareto:
        keys = np.where((t_sim <= slo) & (rate * t_sim / 3600.0 <= budget_it), t_sim, INF)
    else:
        keys = lower_bound_keys(objective, t_sim, rate, np.ones(len(t_sim), dtype=bool), iterations)
    kind = np.zeros(len(keys), dtype=np.int8)  # 0: allocation at T_SIM, 1: refined, 2: bounded order by order
    walk = np.arange(len(keys))  # the allocations the walk starts from
    if not pareto and len(top.entries) >= top_k:
        # The cut is known: the walk can only expand allocations under it (TopK.cut stops at the first above; the
        # cut only tightens), and each is bounded now, on arrays, as the walk's first and second visits would
        # (refined bound, then the least bound of its stage orders where the refined one stays under the cut), so
        # the walk starts from them at those bounds.
        kth = top.entries[top_k - 1][0]
        walk = np.flatnonzero(keys * (1 - BOUND_SLACK) <= kth)
        near = walk[np.argsort(gid[walk], kind="stable")]  # by group
        blocks = {gi: [_allocation_blocks(rows, gi, int(loc[j])) for j in js] for gi, js in _by_group(gid, near)}
        if blocks:
            width = max(len(b) for bs in blocks.values() for b in bs)
            refined = _refined_bounds_s(m.num_layers, *(np.concatenate(x) for x in zip(
                *(groups[gi].refined_columns(bs, width) for gi, bs in blocks.items()))))
            keys[near] = lower_bound_keys(objective, np.maximum(t_sim[near], refined), rate[near],
                                          np.ones(len(near), dtype=bool), iterations)
            kind[near] = 1
        for gi, js in _by_group(gid, near):
            under = keys[js] * (1 - BOUND_SLACK) <= kth
            bound = groups[gi].least_order_bounds_s([b for b, u in zip(blocks[gi], under) if u])
            js = js[under]
            keys[js] = np.maximum(keys[js], lower_bound_keys(objective, bound, rate[js], np.ones(len(js), dtype=bool),
                                                             iterations))
            kind[js] = 2
    scan = walk[np.argsort(keys[walk], kind="stable")]  # (stable: ties in index order, as over all rows)
    scan = scan[np.isfinite(keys[scan])]

    def item_key(t_bound: float, usd_per_hour: float) -> float:
        if pareto:
            return t_bound
        return float(lower_bound_keys(objective, np.array([t_bound]), np.array([usd_per_hour]), np.array([True]),
                                      iterations)[0])

    def expand(lb, item):
        if item[0] == "allocation":  # first visit: a tighter bound of this allocation alone, re-queued
            j = item[1]
            g = groups[int(gid[j])]
            blocks = _allocation_blocks(rows, int(gid[j]), int(loc[j]))
            bound = max(float(t_sim[j]), g.refined_sim_bound_s(blocks))
            return ((item_key(bound, float(rate[j])), ("refined", j)),)
        if item[0] == "refined":  # second visit: bounded order by order on the positions' own costs
            j = item[1]
            g = groups[int(gid[j])]
            blocks = _allocation_blocks(rows, int(gid[j]), int(loc[j]))
            bound = float(g.least_order_bounds_s([blocks])[0])
            return ((item_key(bound, float(rate[j])), ("ordered", j)),) if math.isfinite(bound) else ()
        if item[0] == "ordered":
            j = item[1]
            g = groups[int(gid[j])]
            blocks = _allocation_blocks(rows, int(gid[j]), int(loc[j]))
            count["solved"] += 1
            lbp = float(t_lb[j]) - 2 * (sum(s for _, (t, s) in blocks) - 1) * cmins[int(gid[j])]
            t, seq, ns, rcv, tried = _solve_allocation(g, blocks, INF, lbp)
            count["orders"] += tried
            if t is None:
                return ()
            cand = HeteroCandidate(stages=[StageChoice(st.pool, st.tp, n, rc) for st, n, rc in zip(seq, ns, rcv)],
                                   mbs=g.b, dp=g.d, zero=g.zero, iteration_time_s=t, usd_per_hour=float(rate[j]),
                                   cp=g.cp, ep=g.ep)
            bound = g.lower_bound_s(seq, ns)
            return ((item_key(bound, cand.usd_per_hour), ("plan", cand, bound)),)
        record(item[1], item[2])
        return ()

    def cut(lb, item):
        if not pareto:
            return top.cut(lb)
        if not math.isfinite(lb):
            return "stop"
        r = rate[item[1]] if item[0] in ("allocation", "refined", "ordered") else item[1].usd_per_hour
        usd = r * lb / 3600.0
        if any(f.estimate.iteration_time_s <= lb and f.estimate.usd_per_iteration <= usd for f in frontier):
            return "skip"
        return None

    walk_progress = None if progress is None else (
        lambda k, _lb: progress(k, max_expansions, "heterogeneous walk (expansions)"))
    _, open_bound = guarded_best_first(((float(keys[j]), (("allocation", "refined", "ordered")[kind[j]], int(j)))
                                        for j in scan), expand, cut,
                                       limit=max_expansions, progress=walk_progress)
    return EstimatedResult(
        top=[e[-1] for e in top.best() if e[-1] is not None], frontier=frontier, evaluated=evaluated,
        allocations=n_alloc,
        allocations_solved=count["solved"], plans_estimated=len(evaluated), orders_solved=count["orders"],
        search_time_s=time.perf_counter() - t0,
        open_bound=open_bound,
        stats={"max_pools_per_plan": max_pools[0], "mixed_tp": max_pools[1],
               "restricted": max_pools[0] < len(inventory.pools) or (mixed_tp and pins.tp is None and not max_pools[1]),
               "groups": len(groups)},
    )


def _by_group(gid: np.ndarray, js: np.ndarray):
    """``(group index, its rows)`` of the rows ``js`` (sorted by group), group by group."""
    starts = np.flatnonzero(np.diff(gid[js], prepend=-1))
    for a, b in zip(starts, [*starts[1:], len(js)]):
        yield int(gid[js[a]]), js[a:b]


def _insert_estimated(frontier: list[EstimatedPlan], ep: EstimatedPlan) -> list[EstimatedPlan]:
    """``frontier`` (by estimates, ascending time) with ``ep`` added and the points it weakly dominates removed;
    unchanged when a point already weakly dominates ``ep``."""
    t, c = ep.estimate.iteration_time_s, ep.estimate.usd_per_iteration
    if any(f.estimate.iteration_time_s <= t and f.estimate.usd_per_iteration <= c for f in frontier):
        return frontier
    keep = [f for f in frontier if not (f.estimate.iteration_time_s >= t and f.estimate.usd_per_iteration >= c)]
    keep.append(ep)
    keep.sort(key=lambda f: (f.estimate.iteration_time_s, f.estimate.usd_per_iteration))
    return keep


def _closed_form_goal(objective, iterations: float):
    """The closed-form search's goal, iteration SLO and $-per-iteration budget for ``objective``."""
    slo = objective.slo_iteration_s
    if objective.goal == "cheapest":
        if objective.deadline_s is not None:
            slo = min(slo or INF, objective.deadline_s / iterations)
        return "cheapest", slo, None
    budget = objective.budget_usd / iterations if objective.goal == "budget" else None
    return "fastest", None, budget
