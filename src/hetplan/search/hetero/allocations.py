"""The search space as groups and bounded allocations, shared by the closed-form and the estimated search.

:func:`build_groups` makes one :class:`.Group` per (micro-batch, DP, ZeRO, CP, EP)
the pins allow, building the cost tables of all groups together per stage type;
:func:`bounded_allocations` bounds every allocation of every group
(:func:`.allocation_bounds`), shrinking the space (one TP degree per pool, then at
most two pools, then one) when it holds more allocations than the caller allows; :class:`PreparedSpace` carries
the result from one search to the other. :func:`solve_allocation` finds the least closed-form iteration time of
one allocation over its block orders and their layer partitions.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from hetplan.model.spec import ModelSpec
from hetplan.plan import Inventory, Job
from hetplan.search.hetero.bounds import TooMany, allocation_bounds
from hetplan.hardware.frameworks import job_framework
from hetplan.search.hetero.group import Group, block_orders, ep_fits, price_boundaries
from hetplan.search.hetero.tables import StageType, cost_tables, stage_types
from hetplan.search.space import (RECOMPUTE_NAMES, Pins, cp_degrees, divisors, ep_degrees, free_recompute_codes,
                                  fsdp_zero_stages, stack_allows)


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


def build_groups(m: ModelSpec, job: Job, inventory: Inventory, catalog, pins: Pins, max_stages: int,
            progress=None, per_stage_tp: bool = True) -> list[Group]:
    """One :class:`.Group` per (DP, micro-batch size, ZeRO, CP, EP) allowed by ``pins`` — and, without
    ``per_stage_tp``, per TP degree, every stage of a plan then taking the same TP (the one device mesh of
    Megatron-LM, DeepSpeed, torchtitan and ``hetplan run``: :func:`hetplan.runtime.exporters.common._mesh`): CP
    degrees as the homogeneous space's (:func:`hetplan.search.space.cp_degrees`, up to the largest pool), EP degrees the
    divisors of the expert count that divide ``tp·cp·dp`` of a stage type (MoE parallel folding, with every
    expert-TP degree dividing TP where the framework has expert-TP; ``dp·cp`` where the job's framework keeps EP
    inside DP; 1 for a dense model), each group holding the stage types whose ranks EP x expert-TP divides; ``progress(done, total, phase)`` as their cost tables are built."""
    types = stage_types(m, inventory, catalog, job.dtype, pins, job=job)
    # Under flash attention selective recomputation is the same plan as none (hetplan.plan.Job): not a choice,
    # except under fsdp (torchtitan's per-op SAC; hetplan.search.space.free_recompute_codes)
    stack = job.stack_spec()  # only the ZeRO stages and recomputation modes the job's stack offers
    free = [r for r in free_recompute_codes(m, job.attention, job.framework)
            if stack_allows(stack, recompute=RECOMPUTE_NAMES[r], attention=job.attention)]
    rcs = [RECOMPUTE_NAMES.index(pins.recompute)] if pins.recompute is not None else free
    # under fsdp: DDP (ZeRO-0) or FSDP2 (ZeRO-3) as torchtitan launches them in a pipeline, the plans of this search
    # (hetplan.search.space.fsdp_zero_stages; hetplan.estimate.memory.fsdp_shard_ranks)
    modes = fsdp_zero_stages(pp=2) if job.framework == "fsdp" else (0, 1)
    zeros = [z for z in modes if z == 0 or stack_allows(stack, zero=z)]
    zeros = zeros if pins.zero is None else [z for z in modes if z == pins.zero]
    cps = cp_degrees(job.seq_len, max(p.count for p in inventory.pools), stack) if pins.cp is None else [pins.cp]
    # EP folded over tp·cp·dp where the job's framework does it (a stage type whose tp·cp·d EP does not divide
    # is left out of that group), else within dp·cp (hardware/data/frameworks.toml ep_beyond_dp)
    fw = job_framework(job.framework)
    fold = max((st.tp for st in types), default=1) if fw is None or fw.ep_beyond_dp else 1
    # expert-TP (experts split over their own TP degree) where the framework has it, with EP > 1
    etps = divisors(fold) if m.is_moe and (fw is None or fw.expert_tp) else [1]
    shapes = [(b, d, z, c, e, t) for d in divisors(job.global_batch) if pins.dp is None or d == pins.dp
              for b in divisors(job.global_batch // d) if pins.mbs is None or b == pins.mbs
              for z in zeros if not (z >= 1 and d == 1)  # ZeRO-1 over one rank is ZeRO-0
              # the release's bf16 rules under a pipeline (stacks.toml pipeline_bf16_zero); one rank: no ZeRO
              if d == 1 or job.dtype != "bf16" or stack.allows_bf16(z, 2)
              for c in cps for e in ep_degrees(m, fold * d * c, pins.ep, stack) for t in (etps if e > 1 else [1])
              # torchtitan: no EP with DDP; torch DDP (stack ddp "reducer") on 1-D meshes only, not in a pipeline
              if not (job.framework == "fsdp" and z == 0 and d > 1 and (e > 1 or stack.ddp == "reducer"))]
    by_type: dict = {}  # the groups' tables, built together per (stage type, CP, EP, expert-TP) (cost_tables)
    for b, d, z, c, e, t in shapes:
        for k, st in enumerate(types):
            if st.tp * c * d <= inventory.pools[st.pool].count and ep_fits(st.tp, c, d, e, fold > 1, t):
                F = max(1, min(job.global_batch // (b * d), max_stages))
                by_type.setdefault((k, c, e, t), []).append((b, d, z, F))
    built: dict = {}  # (b, d, z, c, e, t) -> {(pool, tp): table}
    for i, ((k, c, e, t), group_shapes) in enumerate(by_type.items()):
        if progress is not None:
            progress(i, len(by_type), "cost tables (groups)")
        for (b, d, z, _), tb in zip(group_shapes, cost_tables(m, job, types[k], group_shapes, rcs, c, e, t)):
            built.setdefault((b, d, z, c, e, t), {})[(types[k].pool, types[k].tp)] = tb
    groups: list[Group] = []
    shared: dict = {}
    tp_sets = ([types] if per_stage_tp
               else [[st for st in types if st.tp == tp] for tp in sorted({st.tp for st in types})])
    for b, d, z, c, e, t in shapes:
        for subset in tp_sets:
            g = Group(m, job, inventory, subset, b, d, z, rcs, max_stages, c, e, shared,
                      built.get((b, d, z, c, e, t), {}), ep_fold=fold > 1, expert_tp=t)
            if g.types:
                groups.append(g)
    return groups


def bounded_allocations(groups, inventory, pins, max_stages, max_allocations, mixed_tp: bool = True,
                         progress=None, max_pools: int | None = None):
    """Bounds of every allocation of every group (:func:`.allocation_bounds`). The space first includes two TP
    degrees per pool; when it holds more than ``max_allocations`` allocations, one TP degree per pool, then plans
    restricted to two pools (then one). ``max_pools``: plans on at most this many pools (``None``: all; 1: the
    one-GPU-type plans of ``hetplan plan --no-hetero``). Returns ``(rows, (max_pools, mixed_tp), count)``, rows as
    ``(group index, options, option index per pool, $/h, T_LB, T_SIM)``; ``progress(done, total, phase)`` per
    group."""
    max_pools = len(inventory.pools) if max_pools is None else min(max_pools, len(inventory.pools))
    mixed = mixed_tp and pins.tp is None
    price_boundaries([(g, *pair) for g in groups for pair in g.same_tp_boundaries()])  # each group's c_min
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
        except TooMany:
            if mixed:
                mixed = False
                continue
            if max_pools <= 1:
                raise
            max_pools = 2 if max_pools > 2 else 1


def concat_rows(rows):
    """Flat arrays over all allocations: group index, row within the group, $/h, T_LB, T_SIM."""
    if not rows:
        z = np.zeros(0, dtype=np.int64)
        return z, z, np.zeros(0), np.zeros(0), np.zeros(0)
    return (np.concatenate([np.full(len(r[2]), r[0]) for r in rows]),
            np.concatenate([np.arange(len(r[2])) for r in rows]),
            np.concatenate([r[3] for r in rows]), np.concatenate([r[4] for r in rows]),
            np.concatenate([r[5] for r in rows]))


def allocation_blocks(rows, gi: int, li: int):
    """The (pool, (tp, stages)) blocks of allocation ``li`` of group row ``gi`` (a pool with two TP degrees gives
    two blocks; see :func:`.block_orders`)."""
    opts = rows[gi][1]
    sel = rows[gi][2][li]
    return [(k, sub) for k in range(len(opts)) for sub in opts[k][sel[k]]]


def _stages(order) -> list[StageType]:
    """The stage types of a block order, stage by stage."""
    return [st for st, n in order for _ in range(n)]


def solve_allocation(g: Group, blocks, upper_bound: float, lb_without_p2p: float):
    """Least closed-form iteration time over the block orders of one allocation and each order's partitions:
    ``(T, stage types in order, layers, recompute codes, orders tried)``; ``T`` is ``None`` when nothing fits
    or nothing beats ``upper_bound``. ``lb_without_p2p``: a closed-form lower bound less its p2p part (s)."""
    best = None
    tried = 0
    for seq in map(_stages, block_orders(g, blocks)):
        tried += 1
        bound = upper_bound if best is None else min(upper_bound, best[0])
        res = g.solve_order(seq, bound, lb_without_p2p)
        if res is not None:
            best = (res[0], seq, res[1], res[2])
    if best is None:
        return None, None, None, None, tried
    return (*best, tried)
