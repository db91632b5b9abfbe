"""Discrete-event simulation of the serving engine: same scheduler and policies, modelled swap and execution times.

One event loop (vidur-style) over three event kinds — request arrival, swap finished, iteration finished — each
followed by :meth:`hetplan.serve.scheduler.Scheduler.step`. Swap durations come from a swap-cost function
(default: :class:`hetplan.serve.swap_model.SwapModel` over each worker's weight bytes, out and in overlapped; KV
caches are dropped, not moved), iteration durations from a :class:`hetplan.serve.exec_model.StepModel` per model.
An iteration gives one token to every request it decodes and to every request whose prefill it completes (the
first one; a request prefilled in chunks gets it from its last chunk, a preempted one resumes after its
re-prefill); a request finishes with its ``max_new_tokens``-th token (the simulator has no token values, so no
stop token). Paged KV, chunked prefill and preemption are the scheduler's (:mod:`hetplan.serve.scheduler`); a
chunk is costed as a prefill of its tokens plus its attention over the tokens cached before it (the step model's
``prefill_contexts``).
Events at the same time are processed completions first, then arrivals, in id order, so a run is deterministic.

This module does not import torch.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from hetplan.serve.exec_model import StepModel
from hetplan.serve.metrics import SLO, Record, makespan_s, summarize
from hetplan.serve.policies import Policy
from hetplan.serve.scheduler import Execute, Scheduler, Swap
from hetplan.serve.swap_model import SwapModel
from hetplan.serve.workload import Request


@dataclass
class SimModel:
    """A served model as the simulator sees it.

    Attributes:
        name: model name.
        worker_bytes: weight bytes of each worker (rank order); what a swap moves.
        step_model: iteration time model.
        kv_worker_bytes: KV-cache bytes each worker reserves while the model is resident (rank order; default 0).
        swap_in_s, swap_out_s: measured load / write-back times (s); ``None`` = from the swap model.
        kv_blocks: KV blocks of its pool (paged KV cache, :mod:`hetplan.serve.scheduler`); ``None``: whole slots.
        kv_window_spec: the model, where its engine keeps only the window's blocks on its sliding-window layers
            (:func:`hetplan.estimate.inference.kv_windowed`; the scheduler's ``kv_windows``); else ``None``.
    """

    name: str
    worker_bytes: list[int]
    step_model: StepModel
    kv_worker_bytes: list[int] | None = None
    swap_in_s: float | None = None
    swap_out_s: float | None = None
    kv_blocks: int | None = None
    kv_window_spec: Any = None

    @property
    def bytes(self) -> int:
        """Footprint per worker while resident: the largest weights + KV cache of a worker."""
        kv = self.kv_worker_bytes or [0] * len(self.worker_bytes)
        return max(w + k for w, k in zip(self.worker_bytes, kv))


@dataclass
class SimResult:
    """Per-request records plus swap counters; :meth:`report` summarises them."""

    records: list[Record]
    duration_s: float
    swaps: int
    bytes_swapped_in: int
    bytes_swapped_out: int
    batches: list[tuple[str, int]] = field(default_factory=list)  # (model, running batch size) per iteration
    end_s: float = 0.0
    preemptions: int = 0
    busy_s: float = 0.0  # time the workers spent executing iterations (s)
    prefill_busy_s: float = 0.0  # the part of busy_s spent on prefill chunks (s)
    aborted: bool = False  # stopped early by ``miss_limit``

    def report(self, slos: dict[str, SLO]) -> dict:
        out = summarize(self.records, slos, self.duration_s)
        out["swaps"] = self.swaps
        out["bytes_swapped_in"] = self.bytes_swapped_in
        out["bytes_swapped_out"] = self.bytes_swapped_out
        out["batches"] = len(self.batches)
        out["preemptions"] = self.preemptions
        out["busy_s"] = self.busy_s
        out["end_s"] = self.end_s
        out["prefill_busy_s"] = self.prefill_busy_s
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
             max_queue_len: int = 1024, preload: Sequence[str] = (), duration_s: float | None = None,
             batching: str = "continuous", block_tokens: int = 16, max_batched_tokens: int | None = None,
             chunked_prefill: bool = False, max_seq_tokens: int | None = None,
             miss_limit: tuple[dict[str, SLO], int] | None = None, kv_watermark: float = 0.0) -> SimResult:
    """Run the workload ``requests`` through the modelled cluster.

    Args:
        models: served models.
        requests: arrivals (any order; sorted by time here).
        capacity_bytes: weight memory per worker (bytes).
        policy: swap policy.
        swap_cost: swap time function (see :func:`swap_cost_fn`).
        max_batch_size, max_queue_len: scheduler bounds.
        batching: ``"continuous"`` or ``"static"`` (:mod:`hetplan.serve.scheduler`).
        block_tokens, max_batched_tokens, chunked_prefill, max_seq_tokens, kv_watermark: paged KV cache and chunked prefill
            (:class:`hetplan.serve.scheduler.Scheduler`); paging is on for the models with ``kv_blocks``.
        miss_limit: ``(slos, n)``: stop as soon as more than ``n`` requests finished outside their SLOs (or were
            refused); the result is then marked ``aborted`` (a capacity probe that has already failed).
        preload: models resident at time 0 (in order, while they fit).
        duration_s: workload length for goodput and throughput (default: the makespan, t = 0 to the last
            answer or arrival).

    Raises:
        HetplanError: a model does not fit a worker, or a request names an unknown model.
    """
    by_name = {m.name: m for m in models}
    swap_in_est = {m.name: swap_cost(m, []) for m in models}
    paged = all(m.kv_blocks is not None for m in models)
    sched = Scheduler({m.name: (m.bytes, swap_in_est[m.name], max(m.worker_bytes)) for m in models}, capacity_bytes,
                      policy,
                      max_batch_size=max_batch_size, max_queue_len=max_queue_len, batching=batching,
                      kv_blocks={m.name: int(m.kv_blocks or 0) for m in models} if paged else None,
                      block_tokens=block_tokens, max_batched_tokens=max_batched_tokens,
                      chunked_prefill=chunked_prefill, max_seq_tokens=max_seq_tokens, kv_watermark=kv_watermark,
                      kv_windows={m.name: m.kv_window_spec for m in models if m.kv_window_spec is not None})
    sched.preload(preload)
    reqs = sorted(requests, key=lambda r: (r.arrival_s, r.id))
    records = {r.id: Record(r.id, r.model, r.arrival_s, None, prompt_tokens=r.prompt_len) for r in reqs}
    # event: (time, kind order, seq, kind, payload); completions (0) before arrivals (1) at equal times
    events: list = []
    seq = 0
    for r in reqs:
        events.append((r.arrival_s, 1, seq, "arrival", r))
        seq += 1
    heapq.heapify(events)
    batches: list[tuple[str, int]] = []
    busy = pre = 0.0
    now = 0.0
    misses, aborted = 0, False
    while events and not aborted:
        now, _, _, kind, payload = heapq.heappop(events)
        if kind == "arrival":
            if not sched.submit(payload, now):
                records[payload.id].refused = True
                misses += 1
        elif kind == "swap":
            sched.swap_done(now)
        else:  # exec: every emitting request of the iteration got one token
            finished = []
            for r in payload.emitting:
                rec = records[r.id]
                rec.output_tokens += 1
                if rec.first_token_s is None:
                    rec.first_token_s = now
                if rec.output_tokens >= r.max_new_tokens:
                    rec.finish_s = now
                    finished.append(r)
                    if miss_limit is not None and not miss_limit[0].get(r.model, SLO()).met(rec):
                        misses += 1
            sched.exec_done(now, finished)
        if miss_limit is not None and misses > miss_limit[1]:
            aborted = True
            break
        for act in sched.step(now):
            seq += 1
            if isinstance(act, Swap):
                dt = swap_cost(by_name[act.load], [by_name[v] for v in act.evict])
                heapq.heappush(events, (now + dt, 0, seq, "swap", act))
            elif isinstance(act, Execute):
                decode = [sched.seqs[r.id].cached + 1 for r in act.decode]
                sm = by_name[act.model].step_model
                starts = [c.start for c in act.chunks] if any(c.start for c in act.chunks) else None
                dt = sm.step_time_s([c.tokens for c in act.chunks], decode, starts)
                batches.append((act.model, len(act.requests)))
                busy += dt
                # the prefill part of a mixed iteration: what its chunks alone would take (for energy)
                pre += (min(dt, sm.step_time_s([c.tokens for c in act.chunks], [], starts)) if act.decode else dt) \
                    if act.chunks else 0.0
                heapq.heappush(events, (now + dt, 0, seq, "exec", act))
    dur = duration_s if duration_s is not None else makespan_s(list(records.values()))
    return SimResult(list(records.values()), dur, sched.swaps, sched.bytes_swapped_in, sched.bytes_swapped_out,
                     batches, now, sched.preemptions, busy, pre, aborted)
