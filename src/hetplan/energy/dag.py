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
