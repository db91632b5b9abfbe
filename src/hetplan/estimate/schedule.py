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

**p2p.** By default (:data:`BLOCKING_P2P` ``False``) a p2p transfer delays its consumer by ``c`` but occupies
neither stage (asynchronous sends). **Blocking calls** (``blocking_p2p=True``; GPipe and 1F1B): Megatron-LM's 1F1B
(``core/pipeline_parallel/schedules.py``, ``forward_backward_pipelining_without_interleaving``) calls
``recv_forward`` / ``send_forward`` in the warm-up, ``send_forward_recv_backward`` after each steady-state forward
and ``send_backward_recv_forward`` after each backward, ``recv_backward`` / ``send_backward`` in the cool-down;
each call (``p2p_communication.py``) issues ``batch_isend_irecv`` and waits for it (then
``torch.cuda.synchronize()``), so the calling stage computes nothing until its transfers are done, and a
transfer cannot start before both neighbours have reached their matching calls. A call is therefore an
operation of the stage that ends ``c`` after the later of its own start and its partner's (the matching call
on the neighbouring stage; both directions of a batched pair travel at once, full duplex): in the steady state
every stage pays its boundaries' transfers once per micro-batch, not only those on the critical path. ``c`` is
the per-rank transfer of boundary ``j`` (``hetplan.estimate.stage.p2p_bytes``: ``b·s·h/t`` bytes per rank,
Megatron's scatter/gather, Narayanan et al. SC'21 Sec. 4.1; the receiver's NVLink all-gather of the pieces is
not charged). For equal stages, ``p ≥ 3`` and ``m ≥ 2`` this gives exactly
``(m + p - 1)·(f + b) + (2m + 2p - 5)·c`` (``p = 2``: ``(m + 1)·(f + b + c)``), against
``(m + p - 1)·(f + b) + 2(p - 1)·c`` of the closed form (tests).

Interleaved 1F1B with ``v > 1`` always uses the asynchronous model. Its Megatron calls batch transfers with both
neighbours at once (``send_forward_backward_recv_forward_backward``), which one partner per call cannot express;
with ``2v`` calls per micro-batch the omission is ``≈ 2v·c`` per micro-batch, < 1 % on the validation plans.

**DeepSpeed's pipeline engine** (``blocking_p2p="deepspeed"``, 1F1B): DeepSpeed's ``TrainSchedule``
(``deepspeed/runtime/pipe/schedule.py``) runs ``2(m + p - 1)`` steps; stage ``i`` does the forward of micro-batch
``j`` at step ``2j + i`` and its backward at step ``2j + 2p - 1 - i`` (the same per-stage order as Megatron-LM's
1F1B). Each transfer is its own blocking instruction (``PipelineEngine._exec_send_activations`` /
``_exec_recv_activations`` / ``_exec_send_grads`` / ``_exec_recv_grads`` -> ``runtime/pipe/p2p.py`` ``send`` /
``recv``: ``dist.send`` / ``dist.recv``, historically ``dist.broadcast`` in a 2-rank group), issued at the start
of a step: a forward step calls ``SendGrad`` (of the previous step's backward) then ``RecvActivation``; a backward
step ``RecvGrad`` then ``SendActivation`` (of the previous step's forward — so an activation leaves only once the
stage has received the gradient it needs next). Each instruction is one rendezvous of the two neighbours that
ends ``c`` after the later of their starts, as above. The engine splits the activation and its gradient over the
tensor-parallel ranks by default (``pipe_partitioned`` / ``grad_partitioned``, ``runtime/config.py``;
``PartitionedTensor`` over ``grid.get_slice_parallel_group()``), so ``c`` is the same ``b·s·h/t`` per rank.
For GPipe it falls back to the Megatron-LM calls; interleaving (``v > 1``) stays asynchronous. Worked case
p = 2, f = 1, b = 2, c = 0.5, m = 2: 11 (Megatron-LM's calls 10.5, asynchronous 10; tests).

Closed forms the simulation reproduces exactly for equal stages and zero p2p time (tests check it): GPipe and
1F1B ``(m + p - 1)·(f + b)``; interleaved ``(m + (p - 1)/v)·(f + b)`` (SC'21 Sec. 2.2.2). Blocking calls only
add constraints, so the blocking simulation is never shorter than the asynchronous one, and the search's lower
bound ``Σ_{j<i}(f_j+b_j)/v + 2i·c + m·(f_i+b_i)`` (``hetplan.search.homogeneous``) stays valid.

Cost: compiling a schedule (:func:`compile_schedule`, cached per ``(schedule, p, m, v, blocking)``) is O(p·m·v)
(blocking calls roughly double the operations); evaluating
a plan is then O(p·m·v) float operations (:func:`simulate`), or O(2(m·v + p)) numpy steps for any number of plans
of one shape (:func:`simulate_many`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property, lru_cache

import numpy as np
from hetplan.estimate.arrays import Array

SCHEDULES = ("gpipe", "1f1b", "interleaved")

#: Default p2p model (module doc): ``False`` — a transfer only delays its consumer (asynchronous); ``True`` —
#: Megatron-LM's blocking send/recv calls occupy both stages (GPipe and 1F1B). Off by default: on the validation
#: sets it changes MAPE by < 0.4 points and τ by < 0.01 (docs/estimator.md), and the search's fast 1F1B
#: recurrence (``hetplan.search.fine_cost.simulate_1f1b``) reproduces the asynchronous model exactly.
BLOCKING_P2P = False

#: Values of ``blocking_p2p`` (module doc): ``False`` asynchronous, ``True`` / ``"megatron"`` Megatron-LM's
#: blocking calls, ``"deepspeed"`` DeepSpeed's pipeline engine (``TrainSchedule``, one blocking call per transfer).
P2P_MODES = (False, True, "megatron", "deepspeed")


def p2p_mode(blocking_p2p: Array) -> str | bool:
    """Normalise a ``blocking_p2p`` value: ``False`` (asynchronous), ``"megatron"`` or ``"deepspeed"``.

    Raises:
        ValueError: any other value.
    """
    if isinstance(blocking_p2p, str):
        if blocking_p2p in ("megatron", "deepspeed"):
            return blocking_p2p
    elif blocking_p2p is None or isinstance(blocking_p2p, (bool, int, np.bool_)):
        return "megatron" if blocking_p2p else False
    raise ValueError(f"blocking_p2p={blocking_p2p!r}: use False, True / 'megatron' or 'deepspeed'")


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

    def fwd(k: Array):
        return ("F", (k // (p * v)) * p + k % p, (k // p) % v)

    def bwd(k: Array):
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
    ``[f_0/v .. f_{p-1}/v, b_0/v .. b_{p-1}/v, c_0 .. c_{p-2}, wrap]`` (module doc for the dependencies). A
    blocking p2p call is an operation ``(stage, "P", -1, boundary)`` whose ``dep`` is its partner call's
    predecessor, with no ``comm`` and the boundary's transfer time as duration.

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

    @cached_property
    def by_level(self) -> tuple:
        """The operations renumbered level by level, for :func:`simulate_many`: ``(order, ranges, inputs, last)``
        where ``order`` lists the original indices in the new order, level ``l`` is the index range
        ``ranges[l]``, ``inputs[l]`` the new indices of its operations' ``prev`` followed by their ``dep``
        (``-1`` stays "none": the zero row after the last) and ``last`` each stage's last operation."""
        order = np.concatenate(self.levels)
        new = np.empty(len(order) + 1, dtype=int)
        new[order] = np.arange(len(order))
        new[-1] = -1
        bounds = np.cumsum([0] + [len(lv) for lv in self.levels])
        prev, dep = new[np.asarray(self.prev)[order]], new[np.asarray(self.dep)[order]]
        per_level = [(a, b) for a, b in zip(bounds[:-1], bounds[1:])]
        return (order, per_level, [np.concatenate([prev[a:b], dep[a:b]]) for a, b in per_level], new[list(self.last)])


def blocking_applies(schedule: str, v: int = 1, blocking_p2p: bool | str = BLOCKING_P2P) -> bool:
    """Whether :func:`compile_schedule` models p2p as blocking rendezvous operations for this schedule: GPipe and
    1F1B (and interleaving with ``v = 1``); interleaved 1F1B with ``v > 1`` keeps the asynchronous model."""
    return bool(p2p_mode(blocking_p2p)) and (schedule in ("gpipe", "1f1b") or (schedule == "interleaved" and int(v) <= 1))


def stage_program_blocking(schedule: str, p: int, i: int, m: int) -> list[tuple]:
    """Stage ``i``'s operations with Megatron-LM's blocking p2p calls, for GPipe or 1F1B.

    Compute operations are ``("F", j, 0)`` / ``("B", j, 0)``; a p2p call is ``("P", keys)`` where ``keys`` are
    the transfers it completes: ``("a", boundary, j)`` (activation of micro-batch ``j`` from stage ``boundary``
    to ``boundary + 1``) or ``("g", boundary, j)`` (its gradient back). 1F1B follows Megatron-LM
    ``forward_backward_pipelining_without_interleaving`` (``core/pipeline_parallel/schedules.py``): warm-up
    ``recv_forward, F, send_forward``; then ``recv_forward``; steady state ``F, send_forward_recv_backward, B,
    send_backward_recv_forward`` (the last one ``send_backward``); cool-down ``recv_backward, B, send_backward``.
    Calls on the first stage's receive side or the last stage's send side are no-ops (omitted). GPipe:
    ``recv_forward, F, send_forward`` per micro-batch, then ``recv_backward, B, send_backward``.
    """
    first, last = i == 0, i == p - 1

    def rf(j: Array):
        return [] if first else [("a", i - 1, j)]

    def sf(j: Array):
        return [] if last else [("a", i, j)]

    def rb(j: Array):
        return [] if last else [("g", i, j)]

    def sb(j: Array):
        return [] if first else [("g", i - 1, j)]

    ops: list[tuple] = []

    def comm(keys: Array):
        if keys:
            ops.append(("P", tuple(keys)))

    if schedule == "gpipe":
        for j in range(m):
            comm(rf(j)); ops.append(("F", j, 0)); comm(sf(j))  # noqa: E702
        for j in range(m):
            comm(rb(j)); ops.append(("B", j, 0)); comm(sb(j))  # noqa: E702
        return ops
    w = min(p - i - 1, m)
    r = m - w
    for j in range(w):
        comm(rf(j)); ops.append(("F", j, 0)); comm(sf(j))  # noqa: E702
    if r > 0:
        comm(rf(w))
    for k in range(r):
        ops.append(("F", w + k, 0))
        comm(sf(w + k) + rb(k))
        ops.append(("B", k, 0))
        comm(sb(k) if k == r - 1 else sb(k) + rf(w + k + 1))
    for j in range(r, m):
        comm(rb(j)); ops.append(("B", j, 0)); comm(sb(j))  # noqa: E702
    return ops


def stage_program_deepspeed(p: int, i: int, m: int) -> list[tuple]:
    """Stage ``i``'s operations in DeepSpeed's pipeline engine for 1F1B (``TrainSchedule.steps``,
    ``deepspeed/runtime/pipe/schedule.py``), in the format of :func:`stage_program_blocking` but one transfer per
    call. Step ``t`` of ``2(m + p - 1)``: forward of micro-batch ``j`` when ``t = 2j + i``, backward of ``j`` when
    ``t = 2j + 2p - 1 - i`` (``_step_to_micro_batch``); a forward step issues ``SendGrad`` of the previous step's
    micro-batch (to stage ``i-1``) then ``RecvActivation``, a backward step ``RecvGrad`` then ``SendActivation`` of
    the previous step's micro-batch (to stage ``i+1``), each only for valid micro-batches and existing
    neighbours, then the step's compute. (The engine's ``ReduceTiedGrads`` / ``ReduceGrads`` / ``OptimizerStep``
    after the last step are the estimator's DP and optimizer terms.)"""
    def valid(j: Array):
        return 0 <= j < m

    ops: list[tuple] = []
    prev = -1
    for t in range(2 * (m + p - 1)):
        forward = (t - i) % 2 == 0
        j = (t - i) // 2 if forward else (t - 2 * p + 1 + i) // 2
        if forward:
            if i > 0 and valid(prev):
                ops.append(("P", (("g", i - 1, prev),)))
            if i > 0 and valid(j):
                ops.append(("P", (("a", i - 1, j),)))
        else:
            if i < p - 1 and valid(j):
                ops.append(("P", (("g", i, j),)))
            if i < p - 1 and valid(prev):
                ops.append(("P", (("a", i, prev),)))
        if valid(j):
            ops.append(("F" if forward else "B", j, 0))
        prev = j
    return ops


def _compile_blocking(schedule: str, p: int, m: int, mode: str = "megatron") -> Program:
    """:func:`compile_schedule` with blocking p2p (module doc). A p2p call and its partner call on the neighbouring
    stage (the one holding the same transfers) both end at ``max(start, partner's start) + c``: in the
    :class:`Program` it is an operation whose ``dep`` is the partner's previous operation and whose duration is
    the boundary's transfer time (``dur_index`` ``2p + boundary``)."""
    if mode == "deepspeed" and schedule == "1f1b":
        programs = [stage_program_deepspeed(p, i, m) for i in range(p)]
    else:
        programs = [stage_program_blocking(schedule, p, i, m) for i in range(p)]
    where: dict = {}  # transfer key -> list of (stage, position)
    for i, prog in enumerate(programs):
        for pos, op in enumerate(prog):
            if op[0] == "P":
                for key in op[1]:
                    where.setdefault(key, []).append((i, pos))
    partner: dict = {}
    for i, prog in enumerate(programs):
        for pos, op in enumerate(prog):
            if op[0] != "P":
                continue
            others = {sp for key in op[1] for sp in where[key] if sp != (i, pos)}
            if len(others) != 1:  # pragma: no cover - Megatron's calls pair up one to one
                raise RuntimeError(f"p2p call {op} of stage {i} has partners {sorted(others)}")
            partner[(i, pos)] = others.pop()

    def resolve(i: Array, pos: Array, op: Array, index: Array):
        if op[0] != "P":
            kind, j, ch = op
            return -1, p, (i if kind == "F" else p + i), (kind, j, ch), (i, pos)
        pi, ppos = partner[(i, pos)]
        d = index.get((pi, ppos - 1)) if ppos > 0 else -1
        if d is None:  # the partner's previous operation is not placed yet
            return None
        boundary = min(pi, i)
        return d, p, 2 * p + boundary, ("P", -1, boundary), (i, pos)

    return _assemble(programs, resolve, f"schedule {schedule} with blocking p2p (p={p}, m={m})")


def _assemble(programs: list[list], resolve: Array, what: str) -> Program:
    """The :class:`Program` of per-stage operation lists: each stage's operations are placed in their order, an
    operation once ``resolve(stage, position, op, index)`` finds what it waits for — it returns ``None`` (not yet)
    or ``(dep, comm_index, dur_index, entry, key)``, where ``index`` maps the keys of placed operations to their
    indices. Sweeping the stages until all are placed gives a topological order.

    Raises:
        RuntimeError: the operations wait on each other in a cycle (``what`` names the schedule).
    """
    p = len(programs)
    index: dict = {}
    ops: list = []
    prev: list = []
    dep: list = []
    comm: list = []
    dur: list = []
    depth: list = []
    ptr = [0] * p
    last = [-1] * p
    remaining = sum(len(o) for o in programs)
    while remaining:
        progressed = False
        for i in range(p):
            prog = programs[i]
            while ptr[i] < len(prog):
                found = resolve(i, ptr[i], prog[ptr[i]], index)
                if found is None:
                    break
                d, c, u, entry, key = found
                k = len(ops)
                index[key] = k
                ops.append((i,) + entry)
                prev.append(last[i])
                dep.append(d)
                comm.append(c)
                dur.append(u)
                depth.append(1 + max(depth[last[i]] if last[i] >= 0 else 0, depth[d] if d >= 0 else 0))
                last[i] = k
                ptr[i] += 1
                remaining -= 1
                progressed = True
        if not progressed:  # pragma: no cover - valid schedules never deadlock
            raise RuntimeError(f"{what} deadlocked")
    return Program(tuple(ops), tuple(prev), tuple(dep), tuple(comm), tuple(dur), _levels(depth), tuple(last))


def _levels(depth: list[int]) -> tuple:
    """Operation indices grouped by depth 1, 2, ... (ascending indices within a level); O(n log n)."""
    d = np.asarray(depth)
    order = np.argsort(d, kind="stable")
    bounds = np.searchsorted(d[order], np.arange(1, int(d.max()) + 2))
    return tuple(order[bounds[k]:bounds[k + 1]] for k in range(len(bounds) - 1))


def compile_schedule(schedule: str, p: int, m: int, v: int = 1, blocking_p2p: bool | str = BLOCKING_P2P) -> Program:
    """Compile the operation order of ``schedule`` for ``p`` stages, ``m`` micro-batches and ``v`` chunks into a
    :class:`Program` (cached). Cost O(p·m·v). ``blocking_p2p``: p2p calls are operations of the stages
    (:func:`blocking_applies`, module doc); otherwise a transfer only delays its consumer.

    Raises:
        ValueError: unknown schedule or ``blocking_p2p`` value, or interleaving with ``m`` not a multiple of ``p``.
    """
    return _compile_schedule(schedule, int(p), int(m), int(v), p2p_mode(blocking_p2p))


@lru_cache(maxsize=512)
def _compile_schedule(schedule: str, p: int, m: int, v: int, mode: str) -> Program:
    v = int(v) if schedule == "interleaved" else 1
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r}; use one of {', '.join(SCHEDULES)}")
    if blocking_applies(schedule, v, mode):
        return _compile_blocking("gpipe" if schedule == "gpipe" else "1f1b", p, int(m), mode)
    orders = [stage_order(schedule, p, i, m, v) for i in range(p)]
    no_comm, wrap = p, p - 1

    def resolve(i: Array, pos: Array, op: Array, index: Array):
        kind, j, ch = op
        if kind == "F":
            if i > 0:
                d, c = index.get((i - 1, "F", j, ch)), i - 1
            elif ch > 0:
                d, c = index.get((p - 1, "F", j, ch - 1)), wrap
            else:
                d, c = -1, no_comm
        elif i < p - 1:
            d, c = index.get((i + 1, "B", j, ch)), i
        elif ch < v - 1:
            d, c = index.get((0, "B", j, ch + 1)), wrap
        else:
            d, c = index.get((i, "F", j, ch)), no_comm
        if d is None:
            return None
        return d, c, (i if kind == "F" else p + i), (kind, j, ch), (i, kind, j, ch)

    return _assemble(orders, resolve, f"schedule {schedule} (p={p}, m={m}, v={v})")


def _check(p: int, backward_len: int, p2p_len: int) -> None:
    if backward_len != p or p2p_len != max(p - 1, 0):
        raise ValueError("forward_s and backward_s need one entry per stage, p2p_s one per boundary (p-1)")


def simulate(
    forward_s: Array, backward_s: Array, p2p_s: Array, num_microbatches: int, schedule: str = "1f1b",
    virtual_stages: int = 1,
    *, wrap_p2p_s: float | None = None, record: bool = False, blocking_p2p: bool | str = BLOCKING_P2P,
) -> ScheduleResult:
    """Simulate one iteration's pipeline (module doc).

    Args:
        forward_s, backward_s: per stage, one micro-batch through the whole stage (all its chunks), length p.
        p2p_s: per boundary ``i -> i+1``, one transfer (activation forward or gradient backward), length p-1.
        num_microbatches: m. schedule: ``"gpipe"``, ``"1f1b"`` or ``"interleaved"``.
        virtual_stages: v (interleaved only); each chunk takes ``1/v`` of the stage's times.
        wrap_p2p_s: transfer from the last stage back to the first (interleaved); default ``max(p2p_s)``.
        record: keep every compute :class:`Op` (for timelines).
        blocking_p2p: ``False`` asynchronous transfers (default), ``True`` / ``"megatron"`` Megatron-LM's
            blocking calls, ``"deepspeed"`` DeepSpeed's pipeline engine (module doc).
    Raises:
        ValueError: bad lengths, schedule, ``blocking_p2p`` value or interleaving constraint.
    """
    p = len(forward_s)
    m = int(num_microbatches)
    _check(p, len(backward_s), len(p2p_s))
    v = int(virtual_stages) if schedule == "interleaved" else 1
    prog = compile_schedule(schedule, p, m, v, blocking_p2p)
    dur = [float(x) / v for x in forward_s] + [float(x) / v for x in backward_s]
    comm = [float(x) for x in p2p_s]
    comm += [(max(comm) if comm else 0.0) if wrap_p2p_s is None else float(wrap_p2p_s), 0.0]
    dur += comm[:p]  # durations of blocking p2p calls: boundary j at 2p + j
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
               for k, ((i, kind, j, ch), u) in enumerate(zip(prog.ops, prog.dur_index)) if kind != "P"]
    return ScheduleResult(makespan_s=max(stage_end), stage_end_s=stage_end, stage_busy_s=busy, ops=ops)


def simulate_many(
    forward_s: Array, backward_s: Array, p2p_s: Array, num_microbatches: int, schedule: str = "1f1b",
    virtual_stages: int = 1,
    *, wrap_p2p_s: Array = None, blocking_p2p: bool | str = BLOCKING_P2P,
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
    prog = compile_schedule(schedule, p, int(num_microbatches), v, blocking_p2p)
    if wrap_p2p_s is None:
        wrap = c.max(axis=1) if p > 1 else np.zeros(n)
    else:
        wrap = np.broadcast_to(np.asarray(wrap_p2p_s, dtype=float), (n,))
    comm = np.concatenate([c.T, wrap[None, :], np.zeros((1, n))])  # (p + 1, N)
    dur = np.concatenate([f.T / v, b.T / v, comm[:p]])  # (3p, N): blocking p2p calls of boundary j at 2p + j
    order, ranges, inputs, last = prog.by_level
    wait = comm[np.asarray(prog.comm_index)[order]]  # (ops, N), operations in level order
    took = dur[np.asarray(prog.dur_index)[order]]
    end = np.zeros((len(order) + 1, n))  # last row stays 0: "no predecessor"
    for (a, b), idx in zip(ranges, inputs):
        x = end[idx]  # predecessors' ends, then dependencies' ends
        k = b - a
        dep_ready = np.add(x[k:], wait[a:b], out=x[k:])
        np.add(np.maximum(x[:k], dep_ready, out=x[:k]), took[a:b], out=end[a:b])
    stage_end = end[last].T
    return stage_end.max(axis=1), stage_end
