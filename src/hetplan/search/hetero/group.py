"""One group of the heterogeneous space: the plans sharing (micro-batch, DP, ZeRO, CP, EP).

Within a group every stage of TP degree ``t`` uses ``t·cp·d`` GPUs, so a plan is a sequence of stage types
(:class:`.StageType`) and a layer count per stage. :class:`Group` holds the stage types' cost tables, prices the
boundaries between stages as the estimator does (:func:`hetplan.estimate.iteration.boundary_time_s`: a p2p send
when both stages lay the micro-batch out alike, else a resharding transfer), bounds the iteration time of one stage
order from below on each position's own cost row (and of one allocation, :func:`refined_bounds_s`), and solves an
order's layer partition exactly (:func:`hetplan.search.partition.solve_partition`). A stage order keeps a pool's
stages contiguous: it is a list of blocks ``(stage type, stages)`` (:func:`block_orders` lists the orders of one
allocation).
"""

from __future__ import annotations

import itertools
from dataclasses import fields
from typing import Any

import numpy as np

from hetplan.estimate.iteration import boundary_time_s
from hetplan.estimate.stage import Link
from hetplan.plan import boundary_is_intra_node
from hetplan.search.hetero.tables import FIRST, INF, MID, SINGLE, StageType, cost_table, stage_positions
from hetplan.search.homogeneous import window_lower_bound_s
from hetplan.search.partition import solve_partition


class Group:
    """Everything for one (b, d, zero, cp, ep, expert_tp): stage types' tables and the p2p cache. A stage of TP degree t
    uses ``t·cp·d`` GPUs (``width = cp·d`` per TP rank); ``ep_fold``: EP spans ``t·cp·d`` (MoE parallel
    folding), else ``cp·d`` — the stage types whose ranks EP does not divide are left out (:func:`ep_fits`). ``shared``: a dict the groups of one search share, so
    that groups differing only in ZeRO or EP share their boundary and stage-order transfer times (they depend on
    ``(b, d, cp)`` only). ``tables``: the stage types' cost tables by ``(pool, tp)`` when the caller built them
    (:func:`.cost_tables`), else built here."""

    def __init__(self, m, job, inventory, types, b, d, zero, rcs, max_stages, cp=1, ep=1, shared: dict | None = None,
                 tables: dict | None = None, ep_fold: bool = False, expert_tp: int = 1):
        self.m, self.job, self.inventory, self.b, self.d, self.zero = m, job, inventory, b, d, zero
        self.cp, self.ep, self.expert_tp, self.width = cp, ep, expert_tp, cp * d
        self.mb = job.global_batch // (b * d)
        self.F = max(1, min(self.mb, max_stages))
        self.types = [st for st in types if st.tp * self.width <= inventory.pools[st.pool].count
                      and ep_fits(st.tp, cp, d, ep, ep_fold, expert_tp)]
        self.tables = {(st.pool, st.tp): tables[(st.pool, st.tp)] if tables is not None
                       else cost_table(m, job, st, b, d, zero, self.F, rcs, cp, ep, expert_tp) for st in self.types}
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
        ``cp·d`` and the same stage types."""
        key = ("options", self.width, L, mixed_tp, tuple(self.by_key))  # EP may leave some stage types out
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
        ``(S(M) + t_emb + t_head + c_part) / (1 - r^p)`` (see :func:`.allocation_bounds`) drops to ``m·M``, where
        ``S(M)`` is the least sum of stage times when no stage exceeds ``M`` (one layer per stage, the other layers
        poured into the types of least ``λ`` first, at most ``M/λ`` layers per stage and the memory capacity).
        Every split has a bottleneck ``M_s`` with sum ``>= S(M_s)``, and its chain is at least
        ``max(m·M_s, fill chain at M_s) >= m·M*`` (``m·M`` grows and ``S(M)`` shrinks with ``M``). The fill chain
        also counts 1F1B's in-flight window, ``ceil(m/p)·(S(M) + t_emb + t_head + 2(p-1)·c_min)``
        (:func:`hetplan.search.homogeneous.window_lower_bound_s`). Found by bisection, keeping the lower end; plus
        :meth:`tail_lower_bound_s`."""
        return refined_bounds_s(self.m.num_layers, *self.refined_columns(allocations))

    def refined_columns(self, allocations, width: int | None = None):
        """The inputs of :func:`.refined_bounds_s` for ``allocations`` of this group: per allocation and block,
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
        kinds, flights = stage_positions(p, m_)
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
        block orders (:func:`block_orders`; ``inf`` when none fits), the orders of as many stages bounded
        together."""
        orders = [(i, order) for i, blocks in enumerate(allocations) for order in block_orders(self, blocks)]
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
            price_boundaries([(self, *pair) for pair in pairs])
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
        kinds, flights = stage_positions(p, self.mb)
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
        kinds, flights = stage_positions(p, self.mb)
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


def ep_fits(tp: int, cp: int, d: int, ep: int, fold: bool, expert_tp: int = 1) -> bool:
    """Whether EP ``ep`` with expert-TP ``expert_tp`` lays out on a stage of ``tp·cp·d`` GPUs: with MoE parallel
    folding (``fold``) ``ep·expert_tp`` divides ``tp·cp·d`` and ``expert_tp`` divides ``tp``
    (:class:`hetplan.degrees.ParallelLayout`), else ``ep`` divides ``cp·d`` with expert-TP 1."""
    if fold:
        return tp % expert_tp == 0 and (tp * cp * d) % (ep * expert_tp) == 0
    return expert_tp == 1 and (cp * d) % ep == 0


def price_boundaries(items) -> None:
    """Cache :meth:`Group.p2p` of ``items`` ``(group, s1, s2, intra)`` (s1, s2 of equal TP degree; groups of
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
        # a Link of arrays (one element per boundary): the cost functions are elementwise
        arrays: dict[str, Any] = {f.name: column(lambda *it: getattr(it[side].link, f.name)) for f in fields(Link)}
        return Link(**arrays)

    layout = (column(lambda g, s1, s2, i: s1.tp), column(lambda g, s1, s2, i: g.cp), column(lambda g, s1, s2, i: g.d),
              column(lambda g, s1, s2, i: g.b))
    g0 = work[0][0]
    out = boundary_time_s(g0.m, g0.job.seq_len, layout, layout, links(1), links(2),
                          column(lambda g, s1, s2, intra: intra))
    for (g, s1, s2, intra), v in zip(work, np.broadcast_to(out, (len(work),))):
        g._p2p[(s1.pool, s1.tp, s2.pool, s2.tp, intra)] = float(v)


def _pool_options(group: Group, L: int, mixed_tp: bool = False):
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


def block_orders(g: Group, blocks):
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


def _blocks_of(seq: list[StageType]) -> list:
    """The block order of a stage order: runs of one stage type."""
    return [(run[0], len(run)) for run in (list(r) for _, r in itertools.groupby(seq, key=lambda st: (st.pool, st.tp)))]


def refined_bounds_s(L: int, cols: np.ndarray, m_: np.ndarray, c_min: np.ndarray, tail: np.ndarray) -> np.ndarray:
    """:meth:`.Group.refined_sim_bounds_s` of allocations of any groups, on arrays (:meth:`.Group.refined_columns`,
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
