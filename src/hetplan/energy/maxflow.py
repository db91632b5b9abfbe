"""Minimum s–t cuts for the Phillips–Dessouky step.

:func:`min_cut_source_side` returns the *minimal* minimum cut (the set of nodes reachable from ``s`` in the
residual graph of a maximum flow). That set does not depend on which maximum flow is found, so any correct
max-flow algorithm gives the same cut, hence the same frontier.

Capacities are integers (the planner works in micro-joules). The fast path is SciPy's compiled Dinic
(``scipy.sparse.csgraph.maximum_flow``), which only takes int32; above that range, or when asked, a
pure-Python Dinic on Python integers is used (exact, slower).
"""

from __future__ import annotations

from collections import deque

import numpy as np
from scipy.sparse import csr_array
from scipy.sparse.csgraph import breadth_first_order, maximum_flow

INT32_MAX = 2**31 - 1


def min_cut_source_side(num_nodes: int, rows: np.ndarray, cols: np.ndarray, caps: np.ndarray,
                        source: int, sink: int, *, backend: str = "auto") -> tuple[int, np.ndarray]:
    """Maximum flow value and source side of the minimal minimum cut.

    Args:
        num_nodes: nodes are ``0..num_nodes-1``.
        rows, cols, caps: shape (E,) edges ``rows[i] → cols[i]`` with integer capacity ``caps[i] > 0``;
            no duplicate (row, col) pairs.
        source, sink: the terminals.
        backend: ``"scipy"``, ``"python"`` or ``"auto"`` (scipy when the capacities fit int32).

    Returns:
        ``(flow_value, in_source_side)`` with ``in_source_side`` shape (num_nodes,) bool.

    Source: max-flow/min-cut theorem (Ford & Fulkerson 1956); Dinic's algorithm (Dinic 1970).
    """
    caps = np.asarray(caps, dtype=np.int64)
    # int32 is enough when every capacity and the flow value (at most what leaves the source) fit in it
    out_of_source = int(caps[np.asarray(rows) == source].sum()) if caps.size else 0
    too_big = caps.size > 0 and (int(caps.max()) > INT32_MAX or out_of_source > INT32_MAX)
    if backend == "python" or (backend == "auto" and too_big):
        return _python_dinic(num_nodes, rows, cols, caps, source, sink)
    # relabel to the nodes that are used, add explicit reverse edges (capacity 0) so that SciPy's flow matrix
    # has exactly our sparsity structure, then read the residual graph off it without sparse arithmetic
    rows = np.asarray(rows, dtype=np.int64)
    cols = np.asarray(cols, dtype=np.int64)
    used = np.zeros(num_nodes, dtype=bool)
    used[rows] = True
    used[cols] = True
    used[source] = used[sink] = True
    ids = np.cumsum(used) - 1
    nodes = np.nonzero(used)[0]
    m = int(nodes.size)
    r, c = ids[rows], ids[cols]
    R = np.concatenate((r, c))
    C = np.concatenate((c, r))
    K = np.concatenate((caps, np.zeros_like(caps)))
    keys = R * m + C
    order = np.argsort(keys, kind="stable")
    keys, R, C, K = keys[order], R[order], C[order], K[order]
    if keys.size > 1 and (dup := keys[1:] == keys[:-1]).any():  # antiparallel input edges: merge
        first = np.concatenate(([True], ~dup))
        grp = np.cumsum(first) - 1
        K = np.bincount(grp, weights=K).astype(np.int64)
        R, C = R[first], C[first]
    indptr = np.zeros(m + 1, dtype=np.int32)
    np.cumsum(np.bincount(R, minlength=m), out=indptr[1:])
    g = csr_array((K.astype(np.int32), C.astype(np.int32), indptr), shape=(m, m))
    s, t = int(ids[source]), int(ids[sink])
    res = maximum_flow(g, s, t, method="dinic")
    fl = res.flow
    if fl.indices.size == C.size and np.array_equal(fl.indptr, indptr) and np.array_equal(fl.indices, C):
        resid = K - fl.data
    else:  # pragma: no cover - SciPy changed its output structure; fall back to sparse arithmetic
        coo = (g - fl).tocoo()
        R, C, resid = coo.row.astype(np.int64), coo.col.astype(np.int64), coo.data
    keep = resid > 0
    ind2 = np.zeros(m + 1, dtype=np.int32)
    np.cumsum(np.bincount(R[keep], minlength=m), out=ind2[1:])
    rg = csr_array((np.ones(int(keep.sum()), dtype=np.int8), C[keep].astype(np.int32), ind2), shape=(m, m))
    reach = breadth_first_order(rg, s, directed=True, return_predecessors=False)
    side = np.zeros(num_nodes, dtype=bool)
    side[nodes[reach]] = True
    return int(res.flow_value), side


def _python_dinic(n: int, rows, cols, caps, s: int, t: int) -> tuple[int, np.ndarray]:
    head: list[list[int]] = [[] for _ in range(n)]
    to: list[int] = []
    cap: list[int] = []
    for u, v, c in zip(rows.tolist(), cols.tolist(), caps.tolist()):
        head[u].append(len(to)); to.append(v); cap.append(int(c))
        head[v].append(len(to)); to.append(u); cap.append(0)
    flow = 0
    while True:
        level = [-1] * n
        level[s] = 0
        q = deque([s])
        while q:
            u = q.popleft()
            for e in head[u]:
                if cap[e] > 0 and level[to[e]] < 0:
                    level[to[e]] = level[u] + 1
                    q.append(to[e])
        if level[t] < 0:
            break
        it = [0] * n

        def augment(it=it, level=level) -> int:
            """One augmenting path of the level graph, walked iteratively (a path can be longer than Python's
            recursion limit: 1,000 micro-batches on one stage hit it, found by tests/fuzz); its flow, or 0."""
            path: list[int] = []
            u = s
            while u != t:
                while it[u] < len(head[u]) and not (cap[head[u][it[u]]] > 0
                                                    and level[to[head[u][it[u]]]] == level[u] + 1):
                    it[u] += 1
                if it[u] < len(head[u]):
                    path.append(head[u][it[u]])
                    u = to[path[-1]]
                elif not path:
                    return 0
                else:  # dead end: back to the tail of the last edge, which tries its next edge
                    u = to[path.pop() ^ 1]
                    it[u] += 1
            f = min(cap[e] for e in path)
            for e in path:
                cap[e] -= f
                cap[e ^ 1] += f
            return f

        while True:
            f = augment()
            if not f:
                break
            flow += f
    side = np.zeros(n, dtype=bool)
    side[s] = True
    q = deque([s])
    while q:
        u = q.popleft()
        for e in head[u]:
            if cap[e] > 0 and not side[to[e]]:
                side[to[e]] = True
                q.append(to[e])
    return flow, side


class StaticNetwork:
    """A flow network whose edge set is fixed and whose capacities change from call to call.

    The CSR structure (with explicit reverse edges) is built once; each :meth:`min_cut` only writes the
    capacities. Edges of capacity 0 are allowed (they carry no flow and are not residual).

    *Warm start.* Each call starts from the previous call's maximum flow instead of from zero: flow above a new
    capacity is first cancelled along flow-carrying paths source → edge → sink (:meth:`_cancel`), which keeps
    the flow feasible; SciPy's Dinic then runs on the residual network of that flow (forward residual
    ``cap − f``, reverse ``f``) and only adds what is missing. Any feasible starting flow gives a maximum
    flow, and the minimal minimum cut does not depend on which maximum flow is found, so the cut is the
    same as from zero. Between two Phillips–Dessouky steps few capacities change, so the residual flow is
    small: 16 × 64's 2,672 steps took 16 s in cold Dinic calls and take ~2.5 s warm. Cancelling needs the
    flow to have no cycles, so it is used when the network minus its terminals is acyclic and no edge enters
    the source or leaves the sink (true of the solver's network: its edges follow the instruction DAG);
    otherwise each call starts from zero. Cost of a cancellation: one path per edge whose flow is cut back
    (each path is at most the network's depth long, usually two or three edges, because every instruction
    node has its own edge to a terminal and those are tried first).

    Args:
        num_nodes: nodes ``0..num_nodes-1``.
        rows, cols: shape (E,), the edges; no duplicates, no antiparallel pairs.
        source, sink: terminals.
    """

    def __init__(self, num_nodes: int, rows: np.ndarray, cols: np.ndarray, source: int, sink: int):
        rows = np.asarray(rows, np.int64)
        cols = np.asarray(cols, np.int64)
        self.n, self.E, self.s, self.t = int(num_nodes), int(rows.size), int(source), int(sink)
        self.rows, self.cols = rows, cols
        R = np.concatenate((rows, cols))
        C = np.concatenate((cols, rows))
        keys = R * self.n + C
        order = np.argsort(keys, kind="stable")
        if keys.size > 1 and (keys[order][1:] == keys[order][:-1]).any():
            raise ValueError("StaticNetwork needs edges without duplicates or antiparallel pairs")
        self.R, self.C = R[order], C[order]
        self.indices = self.C.astype(np.int32)
        self.indptr = np.zeros(self.n + 1, np.int32)
        np.cumsum(np.bincount(self.R, minlength=self.n), out=self.indptr[1:])
        inv = np.empty_like(order)
        inv[order] = np.arange(order.size)
        self.pos, self.rpos = inv[: self.E], inv[self.E:]  # where edge i and its reverse sit in the CSR data
        self.from_source = np.nonzero(rows == self.s)[0]
        self.flow = np.zeros(self.E, np.int64)  # the last maximum flow, where the next call starts
        rl, cl = rows.tolist(), cols.tolist()
        ins: list[list[int]] = [[] for _ in range(self.n)]
        outs: list[list[int]] = [[] for _ in range(self.n)]
        for e, (u, v) in enumerate(zip(rl, cl)):
            ins[v].append(e)
            outs[u].append(e)
        self.warm = not ins[self.s] and not outs[self.t] and _acyclic(outs, cl, [len(x) for x in ins])
        # terminal edges first: flow paths back to the source and on to the sink are then short
        self._ins = [sorted(x, key=lambda e: rl[e] != self.s) for x in ins]
        self._outs = [sorted(x, key=lambda e: cl[e] != self.t) for x in outs]
        self._rl, self._cl = rl, cl
        # each node's own edge to the sink and from the source, if it has one (local repair in _cancel)
        self._to_t, self._from_s = [-1] * self.n, [-1] * self.n
        for e, (u, v) in enumerate(zip(rl, cl)):
            if v == self.t:
                self._to_t[u] = e
            if u == self.s:
                self._from_s[v] = e

    def min_cut(self, caps: np.ndarray, backend: str = "scipy") -> tuple[int, np.ndarray]:
        """``(max flow value, source side of the minimal minimum cut)`` for capacities ``caps`` (shape (E,), ≥ 0).

        ``backend="python"``, or a capacity above int32, uses the exact pure-Python Dinic (from zero).
        """
        caps = np.asarray(caps, np.int64)
        if backend == "python" or (caps.size and int(caps.max()) > INT32_MAX):
            keep = caps > 0
            return _python_dinic(self.n, self.rows[keep], self.cols[keep], caps[keep], self.s, self.t)
        f = self.flow if self.warm else np.zeros(self.E, np.int64)
        over = np.nonzero(f > caps)[0]
        if over.size:
            f = f.copy()
            rest = []
            for e in over.tolist():  # local repair first (see _cancel), on a few array entries
                x = int(f[e] - caps[e])
                a, b = self._to_t[self._rl[e]], self._from_s[self._cl[e]]
                if a >= 0 and b >= 0:
                    y = min(x, int(caps[a] - f[a]), int(caps[b] - f[b]))
                    if y > 0:
                        f[e] -= y
                        f[a] += y
                        f[b] += y
                        x -= y
                if x > 0:
                    rest.append(e)
            if rest:  # what is left: along flow-carrying paths, on Python lists
                fl, cl = f.tolist(), caps.tolist()
                for e in rest:
                    self._cancel(fl, e, fl[e] - cl[e])
                f = np.array(fl, np.int64)
        data = np.empty(self.R.size, np.int32)
        data[self.pos] = caps - f
        data[self.rpos] = f
        g = csr_array((data, self.indices, self.indptr), shape=(self.n, self.n))
        fl_ = maximum_flow(g, self.s, self.t, method="dinic").flow
        if not (fl_.indices.size == self.indices.size and np.array_equal(fl_.indices, self.indices)):
            raise RuntimeError("scipy.sparse.csgraph.maximum_flow changed the network's structure")  # pragma: no cover
        f = f + fl_.data[self.pos]  # SciPy's flow is skew-symmetric: the net push along each edge
        self.flow = f
        data[self.pos] = caps - f
        data[self.rpos] = f
        keep = data > 0  # residual edges
        R, C = self.R[keep], self.indices[keep]
        ind = np.zeros(self.n + 1, np.int32)
        np.cumsum(np.bincount(R, minlength=self.n), out=ind[1:])
        rg = csr_array((np.ones(R.size, np.int8), C, ind), shape=(self.n, self.n))
        reach = breadth_first_order(rg, self.s, directed=True, return_predecessors=False)
        side = np.zeros(self.n, dtype=bool)
        side[reach] = True
        return int(f[self.from_source].sum()), side

    def _cancel(self, f: list[int], e: int, x: int) -> None:
        """Take ``x`` units of flow off edge ``e`` and off a flow-carrying path source → ``e`` → sink (repeated
        until ``x`` is gone): the flow stays conserved and within every capacity it was within. (:meth:`min_cut`
        first repairs locally what it can: the excess at ``e``'s tail leaves through the tail's own edge to the
        sink, the deficit at its head is fed through the head's own edge from the source, within their new
        capacities — O(1), every instruction node of the solver's network has both; terminal edges close no
        cycle, so the flow stays acyclic.)"""
        rl, cl, s, t = self._rl, self._cl, self.s, self.t
        while x > 0:
            path = [e]
            u = rl[e]
            while u != s:  # a node with outgoing flow has incoming flow; no cycles, so this reaches s
                a = next(a for a in self._ins[u] if f[a] > 0)
                path.append(a)
                u = rl[a]
            v = cl[e]
            while v != t:
                a = next(a for a in self._outs[v] if f[a] > 0)
                path.append(a)
                v = cl[a]
            d = min(x, min(f[a] for a in path))
            for a in path:
                f[a] -= d
            x -= d


def _acyclic(outs: list[list[int]], heads: list[int], indeg: list[int]) -> bool:
    """True if the graph (out-edge lists, edge heads, in-degrees) has no directed cycle (Kahn's algorithm)."""
    indeg = list(indeg)
    todo = [v for v, k in enumerate(indeg) if k == 0]
    seen = 0
    while todo:
        u = todo.pop()
        seen += 1
        for e in outs[u]:
            w = heads[e]
            indeg[w] -= 1
            if indeg[w] == 0:
                todo.append(w)
    return seen == len(indeg)
