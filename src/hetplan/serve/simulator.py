"""Discrete-event simulation of the serving engine: same scheduler and policies, modelled swap and execution times.

One event loop (vidur-style) over three event kinds — request arrival, swap finished, batch finished — each
followed by :meth:`hetplan.serve.scheduler.Scheduler.step`. Swap durations come from a swap-cost function
(default: :class:`hetplan.serve.swap_model.SwapModel` over each worker's shard bytes, out and in overlapped),
batch durations from an :class:`hetplan.serve.exec_model.ExecModel` per model. Events at the same time are
processed completions first, then arrivals, in id order, so a run is deterministic.

This module does not import torch.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Callable, Sequence

from hetplan.serve.exec_model import ExecModel
from hetplan.serve.metrics import Record, summarize
from hetplan.serve.policies import Policy
from hetplan.serve.scheduler import Execute, Scheduler, Swap
from hetplan.serve.swap_model import SwapModel
from hetplan.serve.workload import Request


@dataclass
class SimModel:
    """A served model as the simulator sees it.

    Attributes:
        name: model name.
        worker_bytes: shard bytes of each worker (rank order).
        exec_model: batch execution time model.
        swap_in_s, swap_out_s: measured load / write-back times (s); ``None`` = from the swap model.
    """

    name: str
    worker_bytes: list[int]
    exec_model: ExecModel
    swap_in_s: float | None = None
    swap_out_s: float | None = None

    @property
    def bytes(self) -> int:
        return max(self.worker_bytes)


@dataclass
class SimResult:
    """Per-request records plus swap counters; :meth:`report` summarises them."""

    records: list[Record]
    duration_s: float
    swaps: int
    bytes_swapped_in: int
    bytes_swapped_out: int
    batches: list[tuple[str, int]] = field(default_factory=list)
    end_s: float = 0.0

    def report(self, slo_s: dict[str, float]) -> dict:
        out = summarize(self.records, slo_s, self.duration_s)
        out["swaps"] = self.swaps
        out["bytes_swapped_in"] = self.bytes_swapped_in
        out["bytes_swapped_out"] = self.bytes_swapped_out
        out["batches"] = len(self.batches)
        out["mean_batch_size"] = (sum(b for _, b in self.batches) / len(self.batches)) if self.batches else 0.0
        return out


def swap_cost_fn(swap_model: SwapModel, write_back: bool = True) -> Callable[[SimModel, Sequence[SimModel]], float]:
    """Swap time (s) from the swap model: load bytes in, victims' bytes out (summed per worker), overlapped."""

    def cost(load: SimModel, evict: Sequence[SimModel]) -> float:
        t_in = load.swap_in_s if load.swap_in_s is not None else swap_model.transfer_time_s(load.worker_bytes)
        if not evict or not write_back:
            return t_in
        if all(v.swap_out_s is not None for v in evict):
            t_out = sum(v.swap_out_s for v in evict)
        else:
            out = [sum(v.worker_bytes[w] for v in evict) for w in range(len(load.worker_bytes))]
            t_out = swap_model.transfer_time_s(out)
        return max(t_in, t_out)

    return cost


def simulate(models: Sequence[SimModel], requests: Sequence[Request], *, capacity_bytes: int, policy: Policy,
             swap_cost: Callable[[SimModel, Sequence[SimModel]], float], max_batch_size: int = 8,
             max_queue_len: int = 1024, preload: Sequence[str] = (), duration_s: float | None = None) -> SimResult:
    """Run the workload ``requests`` through the modelled cluster.

    Args:
        models: served models.
        requests: arrivals (any order; sorted by time here).
        capacity_bytes: weight memory per worker (bytes).
        policy: swap policy.
        swap_cost: swap time function (see :func:`swap_cost_fn`).
        max_batch_size, max_queue_len: scheduler bounds.
        preload: models resident at time 0 (in order, while they fit).
        duration_s: workload length for goodput (default: last arrival).

    Raises:
        HetplanError: a model does not fit a worker, or a request names an unknown model.
    """
    by_name = {m.name: m for m in models}
    swap_in_est = {m.name: swap_cost(m, []) for m in models}
    sched = Scheduler({m.name: (m.bytes, swap_in_est[m.name]) for m in models}, capacity_bytes, policy,
                      max_batch_size=max_batch_size, max_queue_len=max_queue_len)
    sched.preload(preload)
    reqs = sorted(requests, key=lambda r: (r.arrival_s, r.id))
    records = {r.id: Record(r.id, r.model, r.arrival_s, None) for r in reqs}
    # event: (time, kind order, seq, kind, payload); completions (0) before arrivals (1) at equal times
    events: list = []
    seq = 0
    for r in reqs:
        events.append((r.arrival_s, 1, seq, "arrival", r))
        seq += 1
    heapq.heapify(events)
    batches: list[tuple[str, int]] = []
    now = 0.0
    while events:
        now, _, _, kind, payload = heapq.heappop(events)
        if kind == "arrival":
            if not sched.submit(payload, now):
                records[payload.id].refused = True
        elif kind == "swap":
            sched.swap_done(now)
        else:  # exec
            for r in payload.requests:
                records[r.id].finish_s = now
            sched.exec_done(now)
        for act in sched.step(now):
            seq += 1
            if isinstance(act, Swap):
                dt = swap_cost(by_name[act.load], [by_name[v] for v in act.evict])
                heapq.heappush(events, (now + dt, 0, seq, "swap", act))
            elif isinstance(act, Execute):
                b = len(act.requests)
                dt = by_name[act.model].exec_model.batch_time_s(b, max(r.prompt_len for r in act.requests),
                                                                 max(r.max_new_tokens for r in act.requests))
                batches.append((act.model, b))
                heapq.heappush(events, (now + dt, 0, seq, "exec", act))
    dur = duration_s if duration_s is not None else (reqs[-1].arrival_s if reqs else 0.0)
    return SimResult(list(records.values()), dur, sched.swaps, sched.bytes_swapped_in, sched.bytes_swapped_out,
                     batches, now)
