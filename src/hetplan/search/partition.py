"""Exact layer partitioning of a pipeline whose stages differ in speed and memory.

Given p stages in order and, for each stage i and each layer count n (0..L), the stage's per-micro-batch
forward+backward time ``a[i, n]``, its exposed data-parallel time ``e[i, n]`` and optimizer time ``o[i, n]``
(seconds, ``inf`` where the stage does not fit in memory), choose layers ``n_0 + ... + n_{p-1} = L`` with
``n_i >= 1`` minimising the estimator's closed-form iteration time
(:func:`hetplan.estimate.iteration.assemble_iteration`, which the brute-force reference of the tests calls)::

    T(n) = sum_i a[i, n_i] + P + (m - 1) * max_i a[i, n_i] + max_i e[i, n_i] + max_i o[i, n_i]

(``P`` = the p2p transfers, fixed by the stage order; ``m`` = micro-batches). The embedding (first stage), the
head (last stage) and the micro-batches in flight under 1F1B (memory) are already in ``a`` and in the memory
limit ``nmax``: the caller builds a row per stage *position*.

**Algorithm** (exact): depth-first branch and bound over ``n_0, n_1, ...``. At a node where stages ``< i`` hold
``u`` layers with partial sum ``S``, partial maxima ``M_a, M_e, M_o``, every completion satisfies

    T >= S + minsum[i][L-u] + P + (m-1) * max(M_a, minmax[i][L-u]) + max(M_e, eLB[i]) + max(M_o, oLB[i])

where ``minsum[i][j]`` (``minmax[i][j]``) is the least sum (least maximum) of ``a`` over the stages ``i..p-1``
holding ``j`` layers — each computed exactly by dynamic programming over (stage, layers) — and ``eLB[i]``
(``oLB[i]``) is the largest over stages ``k >= i`` of the least ``e[k, n]`` (``o[k, n]``) over its feasible
``n``. Each term bounds its counterpart from below for every completion, so the sum is a valid lower bound and a
node is cut only when no completion can be strictly better than the best plan found (or than the caller's
``upper_bound``). A node is also cut when an earlier node at the same (stage, layers placed) had a sum and maxima
all no larger (dominance): every completion of it is at least as good. Hence the optimum is never dropped. Children are tried in increasing bound order, which finds
a near-optimal plan on the first dive. Cost: ``O(p L^2)`` for the bounds; the search visits few nodes in
practice (FASOP, Hwang et al. HPDC'24, Sec. 4.3 and Espresso solve the same problem with a balanced-bottleneck
heuristic; Metis (ATC'24) with a DP that ignores the sum term — neither is exact for this objective).
"""

from __future__ import annotations

import math

import numpy as np

from hetplan.estimate.iteration import assemble_iteration

INF = math.inf


_GRIDS: dict[int, tuple] = {}


def _grid(L: int):
    """Index arrays over the (L+1, L+1) grid (n layers on this stage, j layers from here on): ``j - n`` clipped
    to 0..L (layers left for the stages after) and whether ``n <= j``."""
    if L not in _GRIDS:
        n = np.arange(L + 1)[:, None]
        j = np.arange(L + 1)[None, :]
        _GRIDS[L] = (np.clip(j - n, 0, L), (j - n) >= 0)
    return _GRIDS[L]


def _suffix_bounds(a: np.ndarray, nmax: np.ndarray, L: int):
    """``minsum`` and ``minmax`` arrays of shape (p+1, L+1) (see module doc); ``inf`` where infeasible."""
    p = a.shape[0]
    minsum = np.full((p + 1, L + 1), INF)
    minmax = np.full((p + 1, L + 1), INF)
    minsum[p, 0] = 0.0
    minmax[p, 0] = 0.0
    left, fits = _grid(L)
    for i in range(p - 1, -1, -1):
        top = int(min(nmax[i], L))
        if top < 1:
            continue
        lf = left[1 : top + 1]  # (top, L+1): layers left for stages after i when stage i holds 1..top
        ai = np.where(fits[1 : top + 1], a[i, 1 : top + 1][:, None], INF)
        minsum[i] = (ai + minsum[i + 1][lf]).min(axis=0)
        minmax[i] = np.maximum(ai, minmax[i + 1][lf]).min(axis=0)
    return minsum, minmax


def solve_partition(a, e, o, nmax, L: int, m: int, p2p_s: float = 0.0, upper_bound: float = INF):
    """Least iteration time over layer partitions (see module doc).

    Args:
        a, e, o: arrays (p, L+1): per stage position and layer count, forward+backward time per micro-batch,
            exposed DP time and optimizer time (seconds). ``a`` must be nondecreasing in the layer count.
        nmax: (p,) the most layers each stage position can hold in memory (0 = none).
        L: layers to place; m: micro-batches per iteration; p2p_s: fixed p2p time of the order (seconds).
        upper_bound: only partitions strictly faster than this are of interest (seconds).
    Returns:
        ``(iteration_time_s, [n_0, ..., n_{p-1}])`` of an optimal partition, or ``None`` when no partition fits
        in memory or none is faster than ``upper_bound``.
    """
    a = np.asarray(a, dtype=float)
    p = a.shape[0]
    nmax = np.minimum(np.asarray(nmax, dtype=np.int64), L - (p - 1))
    if p > L or np.any(nmax < 1) or int(nmax.sum()) < L:
        return None
    minsum, minmax = _suffix_bounds(a, nmax, L)
    if not math.isfinite(minsum[0, L]):
        return None
    e = np.asarray(e, dtype=float)
    o = np.asarray(o, dtype=float)
    feasible = (np.arange(L + 1)[None, :] >= 1) & (np.arange(L + 1)[None, :] <= nmax[:, None])
    emin = np.where(feasible, e, INF).min(axis=1)
    omin = np.where(feasible, o, INF).min(axis=1)
    elb = np.maximum.accumulate(emin[::-1])[::-1].tolist() + [0.0]
    olb = np.maximum.accumulate(omin[::-1])[::-1].tolist() + [0.0]
    width = int(nmax.max()) + 1  # a stage holds at most nmax layers: only those columns are read
    al, el, ol = a[:, :width].tolist(), e[:, :width].tolist(), o[:, :width].tolist()
    ms, mm = minsum.tolist(), minmax.tolist()
    nm = nmax.tolist()
    k = m - 1
    best: list = [upper_bound, None]  # least time, its layers
    chosen = [0] * p
    labels: dict = {}

    def dive(i: int, u: int, S: float, Ma: float, Me: float, Mo: float) -> None:
        rest = L - u
        if i == p - 1:
            n = rest
            if n < 1 or n > nm[i]:
                return
            ai = al[i][n]
            t = S + ai + p2p_s + k * max(Ma, ai) + max(Me, el[i][n]) + max(Mo, ol[i][n])
            if t < best[0]:
                chosen[i] = n
                best[0] = t
                best[1] = list(chosen)
            return
        ms1, mm1, e1, o1 = ms[i + 1], mm[i + 1], elb[i + 1], olb[i + 1]
        row_a, row_e, row_o = al[i], el[i], ol[i]
        kids = []
        cut = best[0]
        # (conditional expressions instead of max(): this loop is the search's innermost)
        for n in range(1, min(nm[i], rest - (p - 1 - i)) + 1):
            r = rest - n
            sum_rest = ms1[r]
            if sum_rest == INF:
                continue
            ai, ei, oi, mr = row_a[n], row_e[n], row_o[n], mm1[r]
            ma = Ma if Ma > ai else ai
            me = Me if Me > ei else ei
            mo = Mo if Mo > oi else oi
            lb = (S + ai + sum_rest + p2p_s + k * (ma if ma > mr else mr) + (me if me > e1 else e1)
                  + (mo if mo > o1 else o1))
            if lb < cut:
                kids.append((lb, n, ma, me, mo))
        kids.sort()
        for lb, n, ma, me, mo in kids:
            if lb >= best[0]:
                break
            S1 = S + row_a[n]
            if i + 1 < p - 1:
                # Dominance: a partial partition reaching the same (stage, layers) with no smaller sum or maxima
                # cannot lead to a better plan than one already explored from there.
                seen = labels.setdefault((i + 1, u + n), [])
                if any(s0 <= S1 and a0 <= ma and e0 <= me and o0 <= mo for s0, a0, e0, o0 in seen):
                    continue
                seen.append((S1, ma, me, mo))
            chosen[i] = n
            dive(i + 1, u + n, S1, ma, me, mo)

    dive(0, 0, 0.0, 0.0, 0.0, 0.0)
    if best[1] is None:
        return None
    return best[0], best[1]


def brute_force_partition(a, e, o, nmax, L: int, m: int, p2p_s: float = 0.0):
    """Reference for tests: every composition of ``L`` into ``p`` parts >= 1, each timed by the estimator's
    assembly (:func:`hetplan.estimate.iteration.assemble_iteration`, closed form, ``a`` as the stage time); same
    return as :func:`solve_partition` (no upper bound). Exponential: small ``L`` and ``p`` only."""
    from itertools import combinations

    a = np.asarray(a, dtype=float)
    p = a.shape[0]
    best = None
    for cuts in combinations(range(1, L), p - 1):
        ns = [b - c for b, c in zip(list(cuts) + [L], [0] + list(cuts))]
        if any(n > nmax[i] for i, n in enumerate(ns)):
            continue
        pick = (np.arange(p), ns)
        t = float(assemble_iteration(a[pick], np.zeros(p), np.asarray(e)[pick], np.asarray(o)[pick], p2p_s / 2,
                                     m).iteration_s)
        if best is None or t < best[0]:
            best = (t, ns)
    return best
