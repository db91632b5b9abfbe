"""Lower bounds of the iteration time of every GPU allocation of a group, valid for every stage order and layer
partition, on arrays over the allocations.

An *allocation* (of a :class:`.Group`) gives each pool ``k`` an option: unused, or
``s_k`` stages of one TP degree, or (mixed TP) the most stages of one degree plus the leftover GPUs as stages of a
smaller one (:meth:`.Group.pool_options`). :func:`allocation_bounds` enumerates them pool by
pool and bounds each (``T_LB`` for the closed form, ``T_SIM`` for the event-simulated schedule)::

    T_LB = L·min_i λ_i + t_emb + t_head + (m-1)·L / Σ_i (1/λ_i) + 2(p-1)·c_min

(``λ_i`` = forward+backward seconds per layer of stage ``i`` without recomputation; a stage with ``n`` layers
takes at least ``n·λ_i``, so the sum of stage times is at least ``L·min λ``, and the slowest stage at least the
fluid balance ``L / Σ 1/λ_i``; ``t_emb``, ``t_head`` the least embedding/head time of any GPU type; ``c_min``
the least p2p time of any boundary; exposed DP and optimizer time ≥ 0), and a memory bound: stage ``i`` can hold
at most ``nmax_i`` layers even in the most lenient position (one micro-batch in flight, no embedding or head,
any recomputation), so ``Σ nmax_i < L`` means nothing fits. :func:`.group.refined_bounds_s` tightens ``T_SIM`` for
allocations the estimated search visits.

Why not Espresso's bound: Espresso prunes a GPU allocation when a *per-GPU* lower bound of its cost exceeds the
incumbent, with the per-GPU bound computed from the fastest stage assignment of that GPU alone; on its own example
it cut a6000+a6000+3090 ($0.2019/iteration) and returned a6000×3 ($0.2218). Our bound never uses a figure of
one stage as if it held for another position or partition.
"""

from __future__ import annotations

import math

import numpy as np

from hetplan.plan import pools_fill_whole_hosts
from hetplan.search.hetero.group import Group
from hetplan.search.hetero.tables import MID
from hetplan.search.homogeneous import window_lower_bound_s
from hetplan.search.space import Pins


class TooMany(Exception):
    """More allocations than the caller allows."""


def allocation_bounds(group: Group, pins: Pins, max_pools: int = 64, max_rows: int = 10**8, return_sim: bool = False,
                      mixed_tp: bool = False):
    """All allocations of a group as arrays: option index per pool ``(N, K)``, stages ``p``, GPUs, $/h ``R``,
    iteration-time lower bound ``T_LB`` (s) — only those that may fit in memory, with at most ``max_pools`` pools;
    with ``mixed_tp`` a pool may hold two TP degrees (:meth:`.Group.pool_options`);
    with ``return_sim`` also ``T_SIM`` (s), a lower bound of :func:`hetplan.estimate.estimator.estimate`'s
    event-simulated iteration time for every order and partition (below).

    Raises:
        TooMany: more than ``max_rows`` allocations.

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

    plus :meth:`.Group.tail_lower_bound_s` (first stage's exposed DP, largest optimizer step).
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
            raise TooMany()
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
            raise TooMany()
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
    # what a launch can start: whole hosts, none holding two pools' GPUs
    ok &= pools_fill_whole_hosts(np.stack([cols[k]["gpus"][idx[:, k]] for k in range(K)], axis=-1),
                                 [pool.launch_gpus for pool in group.inventory.pools])
    idx, p = idx[ok], pcount[ok]
    per = {name: [cols[k][name][idx[:, k]] for k in range(K)]
           for name in ("p", "gpus", "rate", "inv", "lam", "cap", "lmax")}
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


def _option_columns(group: Group, k: int, sub_t: np.ndarray, sub_p: np.ndarray) -> dict:
    """Columns of pool ``k``'s options (:meth:`.Group.pool_options`: sub-blocks of TP degree ``sub_t`` and
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
