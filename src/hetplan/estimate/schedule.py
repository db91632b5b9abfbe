"""Pipeline schedules as an event simulation: GPipe, 1F1B and interleaved 1F1B with virtual stages.

Each pipeline stage executes its forward (F) and backward (B) operations in the fixed order its schedule
prescribes; an operation starts when the stage is free and its input has arrived:

* F of micro-batch ``j``, model chunk ``c`` on stage ``i`` needs F(j, c) of stage ``i-1`` plus the p2p time of
  boundary ``i-1``; on stage 0 with ``c > 0`` it needs F(j, c-1) of the last stage plus the wrap-around p2p.
* B(j, c) on stage ``i`` needs B(j, c) of stage ``i+1`` plus the p2p time; on the last stage it needs F(j, c)
  (for the last chunk) or B(j, c+1) of stage 0 plus the wrap-around p2p.

Orders (Megatron-LM ``schedules.py``; Narayanan et al. SC'21 Sec. 2.2):

* **GPipe** (Huang et al. 2019): all m forwards, then all m backwards.
* **1F1B** (PipeDream-Flush, Narayanan et al. 2021): ``w_i = min(p - i - 1, m)`` warm-up forwards, then
  alternately one forward and one backward, then the remaining backwards.
* **Interleaved 1F1B**: each stage holds ``v`` model chunks of ``1/v`` of its layers; virtual micro-batch ``k``
  runs chunk ``(k // p) mod v`` (backward: ``v - 1 -`` that) of micro-batch ``(k // (p·v))·p + k mod p``;
  ``(p - i - 1)·2 + (v - 1)·p`` warm-up forwards (Megatron-LM ``forward_backward_pipelining_with_interleaving``).
  Requires ``m`` to be a multiple of ``p``.

A p2p transfer delays its consumer but does not occupy either stage (sends are asynchronous); Megatron-LM's
blocking batched send/recv is modelled by the dependency alone.

Closed forms the simulation reproduces exactly for equal stages and zero p2p time (tests check it): GPipe and
1F1B ``(m + p - 1)·(f + b)``; interleaved ``(m + (p - 1)/v)·(f + b)`` (SC'21 Sec. 2.2.2).

Cost: compiling a schedule (:func:`compile_schedule`, cached per ``(schedule, p, m, v)``) is O(p·m·v); evaluating
a plan is then O(p·m·v) float operations (:func:`simulate`), or O(2(m·v + p)) numpy steps for any number of plans
of one shape (:func:`simulate_many`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

SCHEDULES = ("gpipe", "1f1b", "interleaved")


@dataclass
class Op:
    """One scheduled operation: ``kind`` "F" or "B", on ``stage``, for ``microbatch`` and model ``chunk``."""

    stage: int
    kind: str
    microbatch: int
    chunk: int
    start_s: float
    end_s: float


@dataclass
class ScheduleResult:
    """Result of :func:`simulate`.

    Attributes:
        makespan_s: from the first forward to the last backward (s).
        stage_end_s: when each stage finished its last operation (s), shape (p,).
        stage_busy_s: compute time of each stage (s).
        ops: every operation with its times (when ``record``), else empty.
    """

    makespan_s: float
    stage_end_s: list[float]
    stage_busy_s: list[float]
    ops: list[Op] = field(default_factory=list)

    @property
    def bubble_s(self) -> list[float]:
        """Idle time of each stage within the makespan (s)."""
        return [self.makespan_s - b for b in self.stage_busy_s]


def stage_order(schedule: str, p: int, i: int, m: int, v: int = 1) -> list[tuple[str, int, int]]:
    """The ordered operations ``(kind, microbatch, chunk)`` of stage ``i`` of ``p`` for ``m`` micro-batches.

    Raises:
        ValueError: unknown schedule, or interleaving with ``m`` not a multiple of ``p``.
    """
    if schedule == "gpipe":
        return [("F", j, 0) for j in range(m)] + [("B", j, 0) for j in range(m)]
    if schedule == "1f1b" or (schedule == "interleaved" and v == 1):
        w = min(p - i - 1, m)
        ops = [("F", j, 0) for j in range(w)]
        for k in range(m - w):
            ops.append(("F", w + k, 0))
            ops.append(("B", k, 0))
        ops += [("B", j, 0) for j in range(m - w, m)]
        return ops
    if schedule != "interleaved":
        raise ValueError(f"unknown schedule {schedule!r}; use one of {', '.join(SCHEDULES)}")
    if m % p:
        raise ValueError(f"interleaved 1F1B needs the number of micro-batches ({m}) to be a multiple of pp ({p})")
    total = m * v

    def fwd(k):
        return ("F", (k // (p * v)) * p + k % p, (k // p) % v)

    def bwd(k):
        return ("B", (k // (p * v)) * p + k % p, v - 1 - (k // p) % v)

    w = min((p - i - 1) * 2 + (v - 1) * p, total)
    ops = [fwd(k) for k in range(w)]
    for k in range(total - w):
        ops.append(fwd(w + k))
        ops.append(bwd(k))
    ops += [bwd(k) for k in range(total - w, total)]
    return ops


@dataclass(frozen=True)
class Program:
    """A schedule compiled once per ``(schedule, p, m, v)``: every operation in a topological order with the
    indices its time depends on, so that evaluating a plan is one pass over flat lists (:func:`simulate`) or
    one numpy step per dependency level for many plans at once (:func:`simulate_many`).

    Operation ``k`` ends at ``max(end[prev[k]], end[dep[k]] + comm[comm_index[k]]) + dur[dur_index[k]]`` where
    ``end[-1]`` is 0 (no predecessor), ``comm`` is ``[c_0 .. c_{p-2}, wrap, 0]`` and ``dur`` is
    ``[f_0/v .. f_{p-1}/v, b_0/v .. b_{p-1}/v]`` (module doc for the dependencies).

    Attributes:
        ops: ``(stage, kind, microbatch, chunk)`` per operation, in topological order.
        prev, dep, comm_index, dur_index: per operation, as above (``-1``: none).
        levels: operation indices grouped by longest-path depth (operations of one level are independent).
        last: index of each stage's last operation.
    """

    ops: tuple
    prev: tuple
    dep: tuple
    comm_index: tuple
    dur_index: tuple
    levels: tuple
    last: tuple


@lru_cache(maxsize=512)
def compile_schedule(schedule: str, p: int, m: int, v: int = 1) -> Program:
    """Compile the operation order of ``schedule`` for ``p`` stages, ``m`` micro-batches and ``v`` chunks into a
    :class:`Program` (cached). Cost O(p·m·v).

    Raises:
        ValueError: unknown schedule, or interleaving with ``m`` not a multiple of ``p``.
    """
    v = int(v) if schedule == "interleaved" else 1
    orders = [stage_order(schedule, p, i, m, v) for i in range(p)]
    index: dict = {}
    ops, prev, dep, comm, dur, depth = [], [], [], [], [], []
    ptr = [0] * p
    last = [-1] * p
    no_comm, wrap = p, p - 1
    remaining = sum(len(o) for o in orders)
    while remaining:
        progressed = False
        for i in range(p):
            order = orders[i]
            while ptr[i] < len(order):
                kind, j, ch = order[ptr[i]]
                if kind == "F":
                    if i > 0:
                        d, c = index.get((i - 1, "F", j, ch), None), i - 1
                    elif ch > 0:
                        d, c = index.get((p - 1, "F", j, ch - 1), None), wrap
                    else:
                        d, c = -1, no_comm
                else:
                    if i < p - 1:
                        d, c = index.get((i + 1, "B", j, ch), None), i
                    elif ch < v - 1:
                        d, c = index.get((0, "B", j, ch + 1), None), wrap
                    else:
                        d, c = index.get((i, "F", j, ch), None), no_comm
                if d is None:
                    break
                k = len(ops)
                index[(i, kind, j, ch)] = k
                ops.append((i, kind, j, ch))
                prev.append(last[i])
                dep.append(d)
                comm.append(c)
                dur.append(i if kind == "F" else p + i)
                depth.append(1 + max(depth[last[i]] if last[i] >= 0 else 0, depth[d] if d >= 0 else 0))
                last[i] = k
                ptr[i] += 1
                remaining -= 1
                progressed = True
        if not progressed:  # pragma: no cover - valid schedules never deadlock
            raise RuntimeError(f"schedule {schedule} deadlocked (p={p}, m={m}, v={v})")
    depth_arr = np.array(depth)
    levels = tuple(np.flatnonzero(depth_arr == lv) for lv in range(1, int(depth_arr.max()) + 1))
    return Program(tuple(ops), tuple(prev), tuple(dep), tuple(comm), tuple(dur), levels, tuple(last))


def _check(p: int, backward_len: int, p2p_len: int) -> None:
    if backward_len != p or p2p_len != max(p - 1, 0):
        raise ValueError("forward_s and backward_s need one entry per stage, p2p_s one per boundary (p-1)")


def simulate(
    forward_s, backward_s, p2p_s, num_microbatches: int, schedule: str = "1f1b", virtual_stages: int = 1,
    *, wrap_p2p_s: float | None = None, record: bool = False,
) -> ScheduleResult:
    """Simulate one iteration's pipeline (module doc).

    Args:
        forward_s, backward_s: per stage, one micro-batch through the whole stage (all its chunks), length p.
        p2p_s: per boundary ``i -> i+1``, one transfer (activation forward or gradient backward), length p-1.
        num_microbatches: m. schedule: ``"gpipe"``, ``"1f1b"`` or ``"interleaved"``.
        virtual_stages: v (interleaved only); each chunk takes ``1/v`` of the stage's times.
        wrap_p2p_s: transfer from the last stage back to the first (interleaved); default ``max(p2p_s)``.
        record: keep every :class:`Op` (for timelines).
    Raises:
        ValueError: bad lengths, schedule or interleaving constraint.
    """
    p = len(forward_s)
    m = int(num_microbatches)
    _check(p, len(backward_s), len(p2p_s))
    v = int(virtual_stages) if schedule == "interleaved" else 1
    prog = compile_schedule(schedule, p, m, v)
    dur = [float(x) / v for x in forward_s] + [float(x) / v for x in backward_s]
    comm = [float(x) for x in p2p_s]
    comm += [(max(comm) if comm else 0.0) if wrap_p2p_s is None else float(wrap_p2p_s), 0.0]
    end = [0.0] * (len(prog.ops) + 1)  # end[-1] stays 0: "no predecessor"
    for k, (pr, d, c, u) in enumerate(zip(prog.prev, prog.dep, prog.comm_index, prog.dur_index)):
        t = end[pr]
        r = end[d] + comm[c]
        end[k] = (t if t > r else r) + dur[u]
    stage_end = [end[k] for k in prog.last]
    busy = [m * (dur[i] + dur[p + i]) * v for i in range(p)]
    ops = []
    if record:
        ops = [Op(i, kind, j, ch, end[k] - dur[u], end[k])
               for k, ((i, kind, j, ch), u) in enumerate(zip(prog.ops, prog.dur_index))]
    return ScheduleResult(makespan_s=max(stage_end), stage_end_s=stage_end, stage_busy_s=busy, ops=ops)


def simulate_many(
    forward_s, backward_s, p2p_s, num_microbatches: int, schedule: str = "1f1b", virtual_stages: int = 1,
    *, wrap_p2p_s=None,
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`simulate` for N plans of the same shape at once, one numpy step per dependency level.

    Args:
        forward_s, backward_s: shape (N, p) (s). p2p_s: shape (N, p-1) (s). wrap_p2p_s: shape (N,) or None
        (default: each plan's largest p2p). Other arguments as :func:`simulate`.
    Returns:
        ``(makespan_s, stage_end_s)`` of shapes (N,) and (N, p); equal to :func:`simulate` plan by plan.
    Raises:
        ValueError: bad shapes, schedule or interleaving constraint.
    """
    f = np.atleast_2d(np.asarray(forward_s, dtype=float))
    b = np.atleast_2d(np.asarray(backward_s, dtype=float))
    n, p = f.shape
    c = np.asarray(p2p_s, dtype=float).reshape(n, max(p - 1, 0))
    _check(p, b.shape[1], c.shape[1])
    v = int(virtual_stages) if schedule == "interleaved" else 1
    prog = compile_schedule(schedule, p, int(num_microbatches), v)
    if wrap_p2p_s is None:
        wrap = c.max(axis=1) if p > 1 else np.zeros(n)
    else:
        wrap = np.broadcast_to(np.asarray(wrap_p2p_s, dtype=float), (n,))
    comm = np.concatenate([c.T, wrap[None, :], np.zeros((1, n))])  # (p + 1, N)
    dur = np.concatenate([f.T, b.T]) / v  # (2p, N)
    prev, dep = np.asarray(prog.prev), np.asarray(prog.dep)
    ci, di = np.asarray(prog.comm_index), np.asarray(prog.dur_index)
    end = np.zeros((len(prog.ops) + 1, n))  # last row stays 0: "no predecessor"
    for lv in prog.levels:
        end[lv] = np.maximum(end[prev[lv]], end[dep[lv]] + comm[ci[lv]]) + dur[di[lv]]
    stage_end = end[list(prog.last)].T
    return stage_end.max(axis=1), stage_end


def closed_form_s(forward_s, backward_s, p2p_s, num_microbatches: int, virtual_stages: int = 1) -> float:
    """Closed form ``Σ(f_i+b_i)/v + 2Σc_j + (m - 1/v)·max_i(f_i+b_i)`` (v = 1: FASOP Eq. 4 / Narayanan et al.
    SC'21 Sec. 2.2; exact against :func:`simulate` for equal stages and zero p2p)."""
    per = [float(a) + float(b) for a, b in zip(forward_s, backward_s)]
    v = max(int(virtual_stages), 1)
    return sum(per) / v + 2 * sum(float(x) for x in p2p_s) + (num_microbatches - 1 / v) * max(per)
