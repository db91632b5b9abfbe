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

Cost: O(p·m·v) operations, each O(1), plus O(p) per sweep over the stages (the simulation sweeps the stages
until every operation is placed; a sweep places at least one operation).
"""

from __future__ import annotations

from dataclasses import dataclass, field

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
    if len(backward_s) != p or len(p2p_s) != max(p - 1, 0):
        raise ValueError("forward_s and backward_s need one entry per stage, p2p_s one per boundary (p-1)")
    v = int(virtual_stages) if schedule == "interleaved" else 1
    f = [float(x) / v for x in forward_s]
    b = [float(x) / v for x in backward_s]
    c = [float(x) for x in p2p_s]
    wrap = (max(c) if c else 0.0) if wrap_p2p_s is None else float(wrap_p2p_s)
    orders = [stage_order(schedule, p, i, m, v) for i in range(p)]
    done_f: list[dict] = [dict() for _ in range(p)]  # (microbatch, chunk) -> end time
    done_b: list[dict] = [dict() for _ in range(p)]
    ptr = [0] * p
    free = [0.0] * p
    busy = [0.0] * p
    ops: list[Op] = []
    remaining = sum(len(o) for o in orders)
    while remaining:
        progressed = False
        for i in range(p):
            order = orders[i]
            while ptr[i] < len(order):
                kind, j, ch = order[ptr[i]]
                if kind == "F":
                    if i > 0:
                        dep = done_f[i - 1].get((j, ch))
                        ready = None if dep is None else dep + c[i - 1]
                    elif ch > 0:
                        dep = done_f[p - 1].get((j, ch - 1))
                        ready = None if dep is None else dep + wrap
                    else:
                        ready = 0.0
                    dur = f[i]
                else:
                    if i < p - 1:
                        dep = done_b[i + 1].get((j, ch))
                        ready = None if dep is None else dep + c[i]
                    elif ch < v - 1:
                        dep = done_b[0].get((j, ch + 1))
                        ready = None if dep is None else dep + wrap
                    else:
                        ready = done_f[i].get((j, ch))
                    dur = b[i]
                if ready is None:
                    break
                start = max(free[i], ready)
                end = start + dur
                (done_f if kind == "F" else done_b)[i][(j, ch)] = end
                free[i] = end
                busy[i] += dur
                if record:
                    ops.append(Op(i, kind, j, ch, start, end))
                ptr[i] += 1
                remaining -= 1
                progressed = True
        if not progressed:  # pragma: no cover - valid schedules never deadlock
            raise RuntimeError(f"schedule {schedule} deadlocked (p={p}, m={m}, v={v})")
    return ScheduleResult(makespan_s=max(free), stage_end_s=list(free), stage_busy_s=busy, ops=ops)


def closed_form_s(forward_s, backward_s, p2p_s, num_microbatches: int, virtual_stages: int = 1) -> float:
    """Closed form ``Σ(f_i+b_i)/v + 2Σc_j + (m - 1/v)·max_i(f_i+b_i)`` (v = 1: FASOP Eq. 4 / Narayanan et al.
    SC'21 Sec. 2.2; exact against :func:`simulate` for equal stages and zero p2p)."""
    per = [float(a) + float(b) for a, b in zip(forward_s, backward_s)]
    v = max(int(virtual_stages), 1)
    return sum(per) / v + 2 * sum(float(x) for x in p2p_s) + (num_microbatches - 1 / v) * max(per)
