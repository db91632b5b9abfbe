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
    g = csr_array((caps.astype(np.int32), (rows.astype(np.int32), cols.astype(np.int32))),
                  shape=(num_nodes, num_nodes))
    res = maximum_flow(g, source, sink, method="dinic")
    resid = (g - res.flow).tocsr()
    resid.data[resid.data < 0] = 0
    resid.eliminate_zeros()
    reach = breadth_first_order(resid, source, directed=True, return_predecessors=False)
    side = np.zeros(num_nodes, dtype=bool)
    side[reach] = True
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

        def dfs(u: int, f: int) -> int:
            if u == t:
                return f
            while it[u] < len(head[u]):
                e = head[u][it[u]]
                v = to[e]
                if cap[e] > 0 and level[v] == level[u] + 1:
                    got = dfs(v, min(f, cap[e]))
                    if got:
                        cap[e] -= got
                        cap[e ^ 1] += got
                        return got
                it[u] += 1
            return 0

        while True:
            f = dfs(s, 1 << 62)
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
