"""The computation DAG of one training iteration of a pipeline, built directly as arrays.

Nodes are *instructions*: the forward or backward of one micro-batch (of one model chunk, with interleaving) on
one stage. Edges are (i) the order in which a stage executes its instructions, and (ii) data dependencies between
stages: ``F(s, m, c) → F(s+1, m, c)`` (activations), ``B(s+1, m, c) → B(s, m, c)`` (gradients), and with ``v > 1``
model chunks (interleaved 1F1B) the wrap-arounds ``F(S-1, m, c) → F(0, m, c+1)`` and ``B(0, m, c+1) → B(S-1, m, c)``.
This is the DAG of Perseus (SOSP'24, §4.2, Figure 3) extended to virtual stages. Size: ``n = 2·S·M·v`` nodes;
building it is O(n) (no all-pairs dependency search).

The order of each stage is the estimator's (:func:`hetplan.estimate.schedule.stage_order`: GPipe, 1F1B —
PipeDream-Flush, the same order as DeepSpeed's ``TrainSchedule`` and the Perseus/Lowtime reference — and
Megatron-LM's interleaved 1F1B), so the energy planner and the time estimator run one schedule.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from hetplan.errors import HetplanError
from hetplan.estimate import schedule as _schedule

SCHEDULES = _schedule.SCHEDULES
FORWARD, BACKWARD = 0, 1
KIND_NAMES = ("forward", "backward")


def stage_order(schedule: str, num_stages: int, num_microbatches: int, stage: int,
                virtual_stages: int = 1) -> list[tuple[int, int, int]]:
    """The instructions of ``stage`` in execution order, as ``(kind, micro_batch, chunk)`` with kind 0=F, 1=B.

    Raises:
        HetplanError: unknown schedule, or interleaving with micro-batches not a multiple of the stages.
    """
    try:
        ops = _schedule.stage_order(schedule, num_stages, stage, num_microbatches, virtual_stages)
    except ValueError as exc:
        raise HetplanError(str(exc), field="schedule",
                           fix=f"use one of {', '.join(SCHEDULES)}; interleaved needs micro-batches = k x stages") from None
    return [(FORWARD if kind == "F" else BACKWARD, m, c) for kind, m, c in ops]


def instruction_name(kind: int, microbatch: int, chunk: int = 0, virtual_stages: int = 1) -> str:
    """``"forward:3"`` (``"forward:3:1"`` with model chunks): how plans and the plan server name an instruction."""
    name = f"{KIND_NAMES[kind]}:{microbatch}"
    return name if virtual_stages == 1 else f"{name}:{chunk}"


@dataclass(frozen=True)
class PipelineDAG:
    """Instruction DAG of one iteration.

    Attributes:
        num_stages, num_microbatches, schedule: the pipeline.
        stage: shape (n,), stage of each instruction. kind: shape (n,), 0 forward / 1 backward.
        microbatch: shape (n,). position: shape (n,), index in its stage's execution order.
        chunk: shape (n,), model chunk (0 without interleaving). virtual_stages: chunks per stage ``v``.
        src, dst: shape (E,), edges ``src[i] → dst[i]`` (instruction indices).
        stage_ops: per stage, the instruction indices in execution order.
        levels: instruction indices grouped by longest-path depth (a topological layering).
        entry: the instructions without predecessors; exit: those without successors.
    """

    num_stages: int
    num_microbatches: int
    schedule: str
    stage: np.ndarray
    kind: np.ndarray
    microbatch: np.ndarray
    position: np.ndarray
    src: np.ndarray
    dst: np.ndarray
    stage_ops: list[np.ndarray]
    levels: list[np.ndarray]
    entry: np.ndarray
    exit: np.ndarray
    chunk: np.ndarray | None = None
    virtual_stages: int = 1

    @property
    def num_ops(self) -> int:
        """Number of instructions ``n``."""
        return int(self.stage.size)

    @cached_property
    def _pred(self) -> np.ndarray:
        return _padded(self.dst, self.src, self.num_ops)

    @cached_property
    def _succ(self) -> np.ndarray:
        return _padded(self.src, self.dst, self.num_ops)

    @cached_property
    def topo_lists(self) -> tuple[list[tuple[int, tuple[int, ...]]], list[tuple[int, tuple[int, ...]]]]:
        """``(topological [(v, preds)], reverse topological [(v, succs)])`` as Python lists (cached)."""
        n = self.num_ops
        topo = np.concatenate(self.levels).tolist()
        pred, succ = self._pred, self._succ
        fwd = [(v, tuple(int(p) for p in pred[v] if p < n)) for v in topo]
        bwd = [(v, tuple(int(q) for q in succ[v] if q < n)) for v in reversed(topo)]
        return fwd, bwd

    @cached_property
    def topo_pairs(self) -> tuple[list[tuple[int, int, int]], list[tuple[int, int, int]]] | None:
        """:attr:`topo_lists` with exactly two predecessors / successors per instruction, missing ones given as
        the sentinel ``n`` (cached): ``([(v, p, q)], [(v, s, t)])``. Pipeline DAGs have at most two of each (the
        stage-order neighbour and the other stage's), and a fixed arity makes the recurrences ~40 % faster.
        None if some instruction has more."""
        n = self.num_ops
        pred, succ = self._pred, self._succ
        if pred.shape[1] > 2 or succ.shape[1] > 2:
            return None
        topo = np.concatenate(self.levels).tolist()
        p2 = np.full((n, 2), n, np.int64)
        p2[:, : pred.shape[1]] = pred
        s2 = np.full((n, 2), n, np.int64)
        s2[:, : succ.shape[1]] = succ
        pl, sl = p2.tolist(), s2.tolist()
        return [(v, *pl[v]) for v in topo], [(v, *sl[v]) for v in reversed(topo)]

    @property
    def narrow(self) -> bool:
        """True when topological layers are narrow (few stages): Python-list recurrences beat NumPy per layer
        (measured: up to ~25 instructions per layer with :attr:`topo_pairs`, ~12 without)."""
        return self.num_ops / max(len(self.levels), 1) < (24 if self.topo_pairs is not None else 12)

    def pred_matrix(self) -> np.ndarray:
        """shape (n, K): predecessors of each instruction, padded with ``n`` (a sentinel). Cached; do not modify."""
        return self._pred

    def succ_matrix(self) -> np.ndarray:
        """shape (n, K): successors of each instruction, padded with ``n`` (a sentinel). Cached; do not modify."""
        return self._succ


class CriticalPath:
    """Earliest finish and *tail* (longest path from an instruction's start to the end of the iteration) of every
    instruction, kept up to date while durations change.

    After a duration changes, an instruction's earliest finish can change only if a predecessor's did (or its
    own duration), and its tail only if a successor's did. So each update sweeps the topological layers forward
    from the changed instruction's layer, recomputing ``ef[v] = max(ef[preds]) + d[v]``, and stops at the
    first layer no change can reach (each changed instruction extends the sweep to its deepest successor's
    layer); tails the same way backward. Earliest finishes are those of a full pass bit for bit (the same
    operations); latest start = T − tail. Cost per update: at most one pass over the layers, O(n); in practice
    the layers a change reaches (EnvPipe on 16 × 64: ~40 % of the instructions per raise). Not used by the Phillips–Dessouky solver: each of
    its steps shortens the iteration, so its changes reach nearly every layer (measured: no gain).

    Args:
        dag: a DAG with :attr:`PipelineDAG.topo_pairs` (at most two predecessors and successors each).
        durations: shape (n,), seconds.

    Raises:
        ValueError: the DAG has no ``topo_pairs``.
    """

    def __init__(self, dag: PipelineDAG, durations: np.ndarray):
        if dag.topo_pairs is None:
            raise ValueError("CriticalPath needs at most two predecessors and successors per instruction")
        n, L = dag.num_ops, len(dag.levels)
        self.n = n
        self.d = np.asarray(durations).tolist()
        depth = np.full(n + 1, -1, np.int64)  # index n: the sentinel of a missing neighbour
        for i, idx in enumerate(dag.levels):
            depth[idx] = i
        rdepth = np.where(depth >= 0, L - 1 - depth, -1)  # layer counted from the end
        self.depth, self.rdepth = depth[:n].tolist(), rdepth[:n].tolist()
        # per layer (from the start for earliest finishes, from the end for tails): (instruction, neighbour,
        # neighbour); and the farthest layer a change at an instruction reaches next
        self.fwd: list[list[tuple[int, int, int]]] = [[] for _ in range(L)]
        self.bwd: list[list[tuple[int, int, int]]] = [[] for _ in range(L)]
        self.reach_f, self.reach_b = [0] * n, [0] * n
        for v, p, q in dag.topo_pairs[0]:
            self.fwd[self.depth[v]].append((v, p, q))
            self.reach_b[v] = int(max(rdepth[p], rdepth[q]))
        for v, p, q in dag.topo_pairs[1]:
            self.bwd[self.rdepth[v]].append((v, p, q))
            self.reach_f[v] = int(max(depth[p], depth[q]))
        self.ef = [0.0] * (n + 1)
        self.tail = [0.0] * (n + 1)
        self._sweep(self.fwd, self.reach_f, self.ef, 0, L - 1)
        self._sweep(self.bwd, self.reach_b, self.tail, 0, L - 1)

    def _sweep(self, layers: list[list[tuple[int, int, int]]], reach: list[int], x: list[float], k: int,
               horizon: int) -> None:
        d = self.d
        while k <= horizon:
            for v, p, q in layers[k]:
                a, b = x[p], x[q]
                y = (a if a > b else b) + d[v]
                if y != x[v]:
                    x[v] = y
                    r = reach[v]
                    if r > horizon:  # noqa: PLR1730 - faster than max() in this hot loop
                        horizon = r
            k += 1

    def set(self, v: int, duration: float) -> None:
        """Instruction ``v`` now takes ``duration`` (s)."""
        self.d[v] = duration
        self._sweep(self.fwd, self.reach_f, self.ef, self.depth[v], self.depth[v])
        self._sweep(self.bwd, self.reach_b, self.tail, self.rdepth[v], self.rdepth[v])

    def times(self) -> tuple[float, np.ndarray, np.ndarray]:
        """``(T, earliest_finish, latest_start)`` like a full critical-path pass; shapes (n,) (latest start =
        T − tail)."""
        T = max(self.ef)
        return T, np.fromiter(self.ef, float, self.n), T - np.fromiter(self.tail, float, self.n)


def _padded(keys: np.ndarray, vals: np.ndarray, n: int) -> np.ndarray:
    deg = np.bincount(keys, minlength=n)
    k = max(int(deg.max()) if deg.size else 0, 1)
    out = np.full((n, k), n, dtype=np.int64)
    order = np.argsort(keys, kind="stable")
    ks, vs = keys[order], vals[order]
    start = np.concatenate(([0], np.cumsum(deg)[:-1]))
    col = np.arange(ks.size) - start[ks]
    out[ks, col] = vs
    return out


def build_pipeline_dag(num_stages: int, num_microbatches: int, schedule: str = "1f1b",
                       virtual_stages: int = 1) -> PipelineDAG:
    """Build the instruction DAG of a pipeline iteration in O(S·M·v).

    Args:
        num_stages: pipeline stages S ≥ 1.
        num_microbatches: micro-batches per iteration M ≥ 1.
        schedule: ``"1f1b"``, ``"gpipe"`` or ``"interleaved"``.
        virtual_stages: model chunks per stage v ≥ 1 (interleaved 1F1B; needs M a multiple of S when v > 1).

    Raises:
        HetplanError: non-positive counts, unknown schedule, or an interleaving the schedule cannot run.
    """
    if int(num_stages) != num_stages or num_stages < 1:
        raise HetplanError(f"number of stages must be a positive integer, got {num_stages}", field="num_stages",
                           fix="profile at least one stage")
    if int(num_microbatches) != num_microbatches or num_microbatches < 1:
        raise HetplanError(f"number of micro-batches must be a positive integer, got {num_microbatches}",
                           field="num_microbatches", fix="use e.g. --num-microbatches 12")
    if int(virtual_stages) != virtual_stages or virtual_stages < 1:
        raise HetplanError(f"virtual stages must be a positive integer, got {virtual_stages}",
                           field="virtual_stages", fix="use 1 (no interleaving) or the model chunks per stage")
    S, M, V = int(num_stages), int(num_microbatches), int(virtual_stages)
    schedule = str(schedule).lower()
    if schedule not in SCHEDULES:
        raise HetplanError(f"unknown schedule {schedule!r}", field="schedule",
                           fix=f"use --schedule {', '.join(SCHEDULES)}")
    if V > 1 and schedule != "interleaved":
        raise HetplanError(f"{V} virtual stages need the interleaved schedule, not {schedule!r}",
                           field="schedule", fix="use --schedule interleaved or 1 virtual stage")
    n = 2 * S * M * V
    stage = np.empty(n, np.int64)
    kind = np.empty(n, np.int64)
    mb = np.empty(n, np.int64)
    chunk = np.empty(n, np.int64)
    pos = np.empty(n, np.int64)
    index = np.empty((S, 2, M, V), np.int64)
    stage_ops = []
    i = 0
    for s in range(S):
        order = stage_order(schedule, S, M, s, V)
        ids = np.arange(i, i + len(order))
        for p, (k, m, c) in enumerate(order):
            stage[i], kind[i], mb[i], chunk[i], pos[i] = s, k, m, c, p
            index[s, k, m, c] = i
            i += 1
        stage_ops.append(ids)
    src = [np.concatenate([ids[:-1] for ids in stage_ops])]
    dst = [np.concatenate([ids[1:] for ids in stage_ops])]
    if S > 1:
        src += [index[:-1, FORWARD].ravel(), index[1:, BACKWARD].ravel()]
        dst += [index[1:, FORWARD].ravel(), index[:-1, BACKWARD].ravel()]
    if V > 1:  # wrap-around between chunks, and the loss: last chunk's forward before its backward
        src += [index[-1, FORWARD, :, :-1].ravel(), index[0, BACKWARD, :, 1:].ravel(), index[-1, FORWARD, :, -1]]
        dst += [index[0, FORWARD, :, 1:].ravel(), index[-1, BACKWARD, :, :-1].ravel(), index[-1, BACKWARD, :, -1]]
    src_a = np.concatenate(src).astype(np.int64)
    dst_a = np.concatenate(dst).astype(np.int64)
    if V > 1:  # the loss edge may repeat a stage-order edge
        pairs = np.unique(np.stack([src_a, dst_a], axis=1), axis=0)
        src_a, dst_a = pairs[:, 0].copy(), pairs[:, 1].copy()
    # topological layering (Kahn by depth)
    indeg = np.bincount(dst_a, minlength=n)
    succ_order = np.argsort(src_a, kind="stable")
    succ_start = np.concatenate(([0], np.cumsum(np.bincount(src_a, minlength=n))))
    succ_list = dst_a[succ_order]
    levels = []
    frontier = np.nonzero(indeg == 0)[0]
    remaining = indeg.copy()
    seen = 0
    while frontier.size:
        levels.append(frontier)
        seen += frontier.size
        nxt = []
        for u in frontier:
            for v in succ_list[succ_start[u]:succ_start[u + 1]]:
                remaining[v] -= 1
                if remaining[v] == 0:
                    nxt.append(v)
        frontier = np.array(sorted(nxt), dtype=np.int64)
    if seen != n:  # pragma: no cover - the schedules above are acyclic by construction
        raise HetplanError("the pipeline schedule has a dependency cycle", field="schedule")
    outdeg = np.bincount(src_a, minlength=n)
    return PipelineDAG(S, M, schedule, stage, kind, mb, pos, src_a, dst_a, stage_ops, levels,
                       np.nonzero(indeg == 0)[0], np.nonzero(outdeg == 0)[0], chunk, V)
