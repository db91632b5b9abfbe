"""Iteration time–energy frontier by the Phillips–Dessouky time–cost tradeoff algorithm.

Perseus (Chung et al., SOSP'24, §4.3–4.4) computes the whole frontier of (iteration time, iteration energy)
by repeatedly shortening the pipeline's critical path by one time quantum at the least energy increase
(Phillips & Dessouky, "Solving the project time/cost tradeoff problem using the minimal cut concept",
Management Science 24(4), 1977). Start: every instruction at its slowest kept option. Each step:

1. critical-path analysis in the DAG (earliest/latest start and finish; O(n) by topological layers);
   the *critical DAG* keeps zero-slack instructions and tight dependencies;
2. give each critical instruction ``v`` at duration ``d`` flow bounds from its energy model ``c``:
   ``lb = c(d) - c(d+1)`` (energy saved by slowing it one quantum), ``ub = c(d-1) - c(d)`` (energy spent
   by speeding it up; ``+1e-6`` slack when both moves are possible); at the fastest option ``ub = ∞``, at
   the slowest ``lb = 0``; dependencies are ``[0, ∞)``. Values are floored to 1e-6 J, like the reference;
3. find the minimum s–t cut whose value is ``Σ_forward ub − Σ_backward lb``; instructions crossing the cut
   forward are sped up by one quantum and those crossing backward are slowed down by one;
4. stop when the cut needs an impossible move (a dependency or a fastest instruction forward, a slowest
   one backward), when no finite cut exists, or when the energy change is below 1e-6 J.

Our min cut (the speed): the lower bounds are folded into unary terminal edges — the cut value
``ub·[u∈S,v∉S] − lb·[u∉S,v∈S]`` equals ``(ub−lb)·[u∈S,v∉S] + lb·(x_u − x_v)`` — so a SINGLE integer max flow
(SciPy's compiled Dinic) replaces the two flows of the lower-bounded formulation, and it starts from the previous
step's flow (:class:`~hetplan.energy.maxflow.StaticNetwork`). The minimal minimum cut is unique, so the result
is the same cut. Capacities are integers in µJ, exact: infinite edges get int32's maximum, which a maximum
flow below it proves uncrossed (else the exact Python flow decides). Per step: O(n) critical-path analysis and
array work, plus the max flow of what changed since the previous step (worst case Dinic's O(V²E)).

Energy of a point (Perseus §4.1): ``Σ_v c_v(d_v) + S · P_idle · T · u`` — effective computation energy of
every instruction plus idle (blocking) power on all ``S`` GPUs for the whole iteration.
"""

from __future__ import annotations

import time as _time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from hetplan.energy.dag import PipelineDAG
from hetplan.energy.maxflow import INT32_MAX, StaticNetwork
from hetplan.energy.options import OperationOptions

FP_ERROR = 1e-6  # J; capacity granularity of the reference planner


@dataclass
class SolverResult:
    """Every point the solver visited, slowest first.

    Attributes:
        quant_time: shape (p,), iteration time of each point in quanta.
        energy_j: shape (p,), iteration energy (model) in J.
        durations: shape (p, n), duration of each instruction (quanta) at each point.
        stop_reason: why the solver stopped.
        planner_time_s: CPU time spent in the solver (s).
    """

    quant_time: np.ndarray
    energy_j: np.ndarray
    durations: np.ndarray
    stop_reason: str
    planner_time_s: float
    iterations: int = 0
    cut_sizes: list[int] = field(default_factory=list)


class PhillipsDessoukySolver:
    """Frontier solver on a :class:`PipelineDAG` whose instructions use per-(stage, kind) options.

    Args:
        dag: the instruction DAG.
        options: ``options[2*stage + kind]`` for every stage and kind (0 forward, 1 backward).
        idle_power_w: blocking power of each GPU (W).
        maxflow_backend: ``"auto"``, ``"scipy"`` or ``"python"`` (see :mod:`hetplan.energy.maxflow`).
    """

    def __init__(self, dag: PipelineDAG, options: list[OperationOptions], idle_power_w: float,
                 maxflow_backend: str = "auto"):
        self.dag = dag
        self.options = options
        self.idle_power_w = float(idle_power_w)
        self.unit_time_s = options[0].unit_time_s
        self.backend = maxflow_backend
        n = dag.num_ops
        self.n = n
        self.spec = (2 * dag.stage + dag.kind).astype(np.int64)
        self.qmin = np.array([o.min_quant for o in options], np.int64)[self.spec]
        self.qmax = np.array([o.max_quant for o in options], np.int64)[self.spec]
        width = max(o.max_quant - o.min_quant for o in options) + 1
        ns = len(options)
        self.base = np.array([o.min_quant for o in options], np.int64)
        cost = np.zeros((ns, width))
        lb_raw = np.zeros((ns, width))
        ub_raw = np.zeros((ns, width))
        lb_i = np.zeros((ns, width), np.int64)
        ub_i = np.zeros((ns, width), np.int64)
        ub_inf = np.zeros((ns, width), bool)
        for k, o in enumerate(options):
            lo, hi = o.min_quant, o.max_quant
            for j, d in enumerate(range(lo, hi + 1)):
                c = float(o.model_energy_j(d))
                cost[k, j] = c
                down = abs(c - float(o.model_energy_j(d + 1)))  # saved by slowing down
                up = abs(float(o.model_energy_j(d - 1)) - c)  # spent by speeding up
                if lo == hi:
                    lb, ub, inf = 0.0, 0.0, True
                elif d == lo:
                    lb, ub, inf = down, 0.0, True
                elif d == hi:
                    lb, ub, inf = 0.0, up, False
                else:
                    lb, ub, inf = down, up + FP_ERROR, False
                lb_raw[k, j], ub_raw[k, j] = down, up
                lb_i[k, j] = int(lb // FP_ERROR)
                ub_i[k, j] = int(ub // FP_ERROR)
                ub_inf[k, j] = inf
        self._cost, self._lb_raw, self._ub_raw = cost, lb_raw, ub_raw
        self._lb_i, self._ub_i, self._ub_inf = lb_i, ub_i, ub_inf
        self.pred = dag.pred_matrix()
        self.succ = dag.succ_matrix()
        self.levels = dag.levels
        self.rlevels = list(reversed(dag.levels))
        topo = np.concatenate(dag.levels).tolist()
        self._topo_preds = [(v, tuple(int(p) for p in self.pred[v] if p < n)) for v in topo]
        self._rtopo_succs = [(v, tuple(int(q) for q in self.succ[v] if q < n)) for v in reversed(topo)]
        # NumPy per topological layer wins when layers are wide (many stages); Python lists otherwise
        self._py_sched = dag.narrow
        self.node_in = 2 + 2 * np.arange(n)
        self.node_out = self.node_in + 1
        self.num_nodes = 2 * n + 2
        # the full network once: op edges, unary edges to t and from s, dependencies, entries, exits
        ar = np.arange(n)
        ne, nx = dag.entry.size, dag.exit.size
        E = dag.src.size
        self._blk = np.cumsum([0, n, n, n, E, ne, nx])
        rows = np.concatenate([self.node_in, self.node_in, np.zeros(n, np.int64), self.node_out[dag.src],
                               np.zeros(ne, np.int64), self.node_out[dag.exit]])
        cols = np.concatenate([self.node_out, np.ones(n, np.int64), self.node_out, self.node_in[dag.dst],
                               self.node_in[dag.entry], np.ones(nx, np.int64)])
        del ar
        self.net = StaticNetwork(self.num_nodes, rows, cols, 0, 1)

    # -- critical path -------------------------------------------------------------------------------
    def schedule(self, d: np.ndarray) -> tuple[int, np.ndarray, np.ndarray]:
        """Earliest finish and latest start of every instruction for durations ``d`` (quanta).

        Returns:
            ``(T, EF, LS)``: iteration time, shape (n,) earliest finish, shape (n,) latest start.
        """
        if self._py_sched:
            return self._schedule_lists(d)
        n = self.n
        ef = np.zeros(n + 1, np.int64)
        pred = self.pred
        for idx in self.levels:
            ef[idx] = ef[pred[idx]].max(axis=1) + d[idx]
        T = int(ef[:n].max())
        ls = np.full(n + 1, T, np.int64)
        succ = self.succ
        for idx in self.rlevels:
            ls[idx] = ls[succ[idx]].min(axis=1) - d[idx]
        return T, ef[:n], ls[:n]

    def _schedule_lists(self, d: np.ndarray) -> tuple[int, np.ndarray, np.ndarray]:
        # the same recurrences on Python lists: faster than one NumPy call per layer when layers are narrow
        dl = d.tolist()
        pairs = self.dag.topo_pairs
        if pairs is not None:  # two predecessors / successors each, sentinel n (PipelineDAG.topo_pairs)
            ef = [0] * (self.n + 1)
            for v, p, q in pairs[0]:
                a, b = ef[p], ef[q]
                ef[v] = (a if a > b else b) + dl[v]
            T = max(ef)
            ls = [T] * (self.n + 1)
            for v, p, q in pairs[1]:
                a, b = ls[p], ls[q]
                ls[v] = (a if a < b else b) - dl[v]
            return T, np.fromiter(ef, np.int64, self.n), np.fromiter(ls, np.int64, self.n)
        ef = [0] * self.n
        for v, ps in self._topo_preds:
            m = 0
            for p in ps:
                x = ef[p]
                if x > m:  # noqa: PLR1730 - faster than max() in this hot loop
                    m = x
            ef[v] = m + dl[v]
        T = max(ef)
        ls = [0] * self.n
        for v, ss in self._rtopo_succs:
            m = T
            for q in ss:
                x = ls[q]
                if x < m:  # noqa: PLR1730
                    m = x
            ls[v] = m - dl[v]
        return T, np.array(ef, np.int64), np.array(ls, np.int64)

    def energy_j(self, d: np.ndarray, T: int) -> float:
        """Model iteration energy (J) of durations ``d`` at iteration time ``T`` (quanta)."""
        comp = float(self._cost[self.spec, d - self.base[self.spec]].sum())
        return comp + self.dag.num_stages * self.idle_power_w * T * self.unit_time_s

    def _capacities(self, ops: np.ndarray, lb: np.ndarray, fin: np.ndarray, inf: np.ndarray, emask: np.ndarray,
                    ls: np.ndarray, ef: np.ndarray, T: int, big: int) -> np.ndarray:
        """Capacities of the network's edges (order of ``self.net``) for one step, ``big`` for the infinite ones."""
        dag, b = self.dag, self._blk
        caps = np.zeros(int(b[-1]), np.int64)
        caps[b[0] + ops] = np.where(inf, big, fin)
        caps[b[1] + ops] = lb
        caps[b[2] + ops] = lb
        caps[b[3]:b[4]][emask] = big
        caps[b[4]:b[5]][ls[dag.entry] == 0] = big
        caps[b[5]:b[6]][ef[dag.exit] == T] = big
        return caps

    def _infinite_path(self, big: np.ndarray) -> bool:
        """True if the edges ``big`` (infinite capacity) alone connect the source to the sink: then every cut is
        infinite and the frontier ends (found by one BFS instead of the exact Python flow: 1.5 s of the GPT-3
        175B plan's frontier)."""
        from scipy.sparse import csr_array
        from scipy.sparse.csgraph import breadth_first_order

        r, c = self.net.rows[big], self.net.cols[big]
        g = csr_array((np.ones(r.size, np.int8), (r, c)), shape=(self.num_nodes, self.num_nodes))
        return bool(np.isin(1, breadth_first_order(g, 0, directed=True, return_predecessors=False)))

    # -- one Phillips–Dessouky step ------------------------------------------------------------------
    def _step(self, d: np.ndarray, T: int, ef: np.ndarray, ls: np.ndarray) -> str | None:
        dag = self.dag
        lf = ls + d
        crit = ef == lf
        ops = np.nonzero(crit)[0]
        col = d[ops] - self.base[self.spec[ops]]
        sp = self.spec[ops]
        lb = self._lb_i[sp, col]
        ub = self._ub_i[sp, col]
        inf = self._ub_inf[sp, col]
        emask = (ef[dag.src] == ls[dag.dst]) & crit[dag.src] & crit[dag.dst]
        esrc, edst = dag.src[emask], dag.dst[emask]
        entries = dag.entry[ls[dag.entry] == 0]
        exits = dag.exit[ef[dag.exit] == T]
        # capacities in micro-joules (the reference planner's 1e-6 J granularity); "infinite" edges get int32's
        # maximum, SciPy's limit. If the minimal minimum cut crosses no such edge it is the minimal minimum cut
        # with true infinities (every cut crossing one costs more than it; it is contained in every other
        # minimum cut). The flow VALUE says nothing here: it includes Σ lb of the folded lower bounds, which
        # passes int32 on pipelines of a few thousand instructions (testing it sent 107 of the GPT-3 175B
        # plan's first 2,000 steps to the Python flow: 93 % of the time). Only if the cut crosses an infinite
        # edge (no finite cut, or one of ≥ 2,147 J) the exact Python flow decides, with an infinity above
        # every finite cut.
        fin = np.where(inf, 0, ub - lb)
        caps = self._capacities(ops, lb, fin, inf, emask, ls, ef, T, INT32_MAX)
        crosses_big = True
        if self.backend != "python":
            flow, side = self.net.min_cut(caps)
            big_edges = caps == INT32_MAX
            crosses_big = bool((side[self.net.rows[big_edges]] & ~side[self.net.cols[big_edges]]).any())
        if crosses_big and self._infinite_path(caps == INT32_MAX):
            return "no finite cut: critical instructions at their fastest and dependencies span the iteration"
        if crosses_big:
            big = int(fin.sum()) + 2 * int(lb.sum()) + 1
            flow, side = self.net.min_cut(self._capacities(ops, lb, fin, inf, emask, ls, ef, T, big), backend="python")
        if flow - int(lb.sum()) < 0:
            return "no feasible flow (a cut with negative energy change)"
        in_s = side[self.node_in[ops]]
        out_s = side[self.node_out[ops]]
        fwd = ops[in_s & ~out_s]
        bwd = ops[~in_s & out_s]
        if (side[self.node_out[esrc]] & ~side[self.node_in[edst]]).any() or (~side[self.node_in[entries]]).any() \
                or side[self.node_out[exits]].any():
            return "the minimum cut crosses a dependency: no faster schedule"
        if fwd.size == 0:
            return "no instruction to speed up"
        if (d[fwd] <= self.qmin[fwd]).any():
            return "a critical instruction is already at its fastest option"
        if (d[bwd] >= self.qmax[bwd]).any():
            return "a cut instruction cannot be slowed down further"
        fcol = d[fwd] - self.base[self.spec[fwd]]
        bcol = d[bwd] - self.base[self.spec[bwd]]
        change = float(self._ub_raw[self.spec[fwd], fcol].sum()) - float(self._lb_raw[self.spec[bwd], bcol].sum())
        if abs(change) < FP_ERROR:
            return "energy change below 1e-6 J"
        d[fwd] -= 1
        d[bwd] += 1
        self._last_cut = int(fwd.size + bwd.size)
        return None

    def run(self, max_points: int | None = None, progress: Callable[[float], None] | None = None) -> SolverResult:
        """Trace the frontier from all-slowest to the fastest reachable iteration time.

        Args:
            max_points: stop after this many points (None: until the algorithm stops).
            progress: called after each step with the share of the way done, ``(T_0 − T) / (T_0 − T_fast)`` where
                ``T_fast`` is the all-fastest iteration time (a bound: the solver stops at or before it), and
                with 1.0 at the end.

        Returns:
            :class:`SolverResult`; point 0 is the all-slowest start, the others follow the reference planner's
            sequence (one quantum faster each).
        """
        t0 = _time.process_time()
        d = self.qmax.copy()
        T, ef, ls = self.schedule(d)
        times = [T]
        energies = [self.energy_j(d, T)]
        durs = [d.astype(np.int32).copy()]
        cuts: list[int] = []
        reason = "max_points reached"
        it = 0
        span = max(T - self.schedule(self.qmin.copy())[0], 1) if progress is not None else 1
        T0 = T
        while max_points is None or len(times) < max_points:
            stop = self._step(d, T, ef, ls)
            if stop is not None:
                reason = stop
                break
            it += 1
            T, ef, ls = self.schedule(d)
            times.append(T)
            energies.append(self.energy_j(d, T))
            durs.append(d.astype(np.int32).copy())
            cuts.append(self._last_cut)
            if progress is not None:
                progress(min((T0 - T) / span, 1.0))
        if progress is not None:
            progress(1.0)
        return SolverResult(np.array(times, np.int64), np.array(energies), np.stack(durs), reason,
                            _time.process_time() - t0, it, cuts)
