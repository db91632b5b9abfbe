"""The swap scheduler: a clock-free state machine shared by the simulator and the real engine.

Cluster model (Computron, Zou et al. 2023, Sec. 3): every model is partitioned TP x PP over the same workers;
each worker has ``capacity_bytes`` for weights, so *residency is limited by bytes*, not by a count of models.
At most one iteration executes at a time (the workers run one model's step after another) and at most one swap
is in flight; a swap evicts victims and loads one model, the two directions overlapped; execution of a resident
model overlaps a swap of others (separate copy streams). A model's footprint is its weights plus its KV cache
(``max_batch_size`` slots reserved when it is loaded). Victims are resident models that are neither executing,
nor holding running sequences (their KV cache is live), nor *fresh* (loaded for queued requests that have not
run yet): evicting those would waste the swap and can thrash when one model runs while two others compete for
the remaining memory. An evicted model therefore has no live sequence, and its KV cache is dropped, not copied
to the host: it holds nothing a later request could reuse.

**Continuous (iteration-level) batching** (Orca, Yu et al. OSDI'22, Sec. 3.1): an :class:`Execute` is one
iteration of one model — a prefill for each request that *joins* now and one decode step for the requests already
running; requests join between iterations while the running batch has free slots (``max_batch_size``) and leave
when they finish, reported by the owner to :meth:`Scheduler.exec_done`. ``batching = "static"`` admits requests
only into an empty batch, which then runs until its longest request ends (the baseline).

The owner (simulator or engine) calls :meth:`Scheduler.submit` on arrivals, :meth:`swap_done` and
:meth:`exec_done` on completions, and after each of these :meth:`step`, which returns the actions to start now:
:class:`Swap` and :class:`Execute`. Requests of a model being loaded wait in its queue; queued requests of one
model join the running batch in arrival order.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from hetplan.errors import HetplanError
from hetplan.serve.policies import ModelState, Policy
from hetplan.serve.workload import Request


@dataclass
class Swap:
    """Load ``load`` and evict ``evict`` (names), out and in overlapped."""

    load: str
    evict: list[str]


@dataclass
class Execute:
    """One iteration of model ``model``: prefill ``joined`` and decode one token for the others of ``requests``
    (the whole running batch, joined ones included)."""

    model: str
    requests: list[Request]
    joined: list[Request] = field(default_factory=list)


BATCHING = ("continuous", "static")


class Scheduler:
    """Residency, queues and batching (see the module docstring).

    Args:
        models: model name -> (bytes per worker, estimated load time s).
        capacity_bytes: weight memory of each worker (bytes).
        policy: a :class:`~hetplan.serve.policies.Policy`.
        max_batch_size: largest running batch per model (requests; KV-cache slots).
        max_queue_len: per-model queue bound; :meth:`submit` refuses beyond it.
        batching: ``"continuous"`` or ``"static"`` (module docstring).

    Raises:
        HetplanError: a model larger than the capacity, or bad sizes.
    """

    def __init__(self, models: dict[str, tuple[int, float]], capacity_bytes: int, policy: Policy, *,
                 max_batch_size: int = 8, max_queue_len: int = 1024, batching: str = "continuous"):
        if batching not in BATCHING:
            raise HetplanError(f"unknown batching {batching!r}", field="scheduler.batching",
                               fix=f"use one of {', '.join(BATCHING)}")
        if max_batch_size < 1:
            raise HetplanError("max_batch_size must be >= 1", field="scheduler.max_batch_size", fix="give 1 or more")
        if max_queue_len < 1:
            raise HetplanError("max_queue_len must be >= 1", field="scheduler.max_queue_len", fix="give 1 or more")
        for name, (b, _) in models.items():
            if b > capacity_bytes:
                raise HetplanError(
                    f"model {name} needs {b / 1e9:.3f} GB per worker but a worker has {capacity_bytes / 1e9:.3f} GB",
                    field=f"models.{name}", fix="raise the memory per worker or use more TP x PP workers")
        self.models = {n: ModelState(n, b, t) for n, (b, t) in models.items()}
        self.capacity_bytes = capacity_bytes
        self.policy = policy
        self.max_batch_size = max_batch_size
        self.max_queue_len = max_queue_len
        self.batching = batching
        self.swapping: Swap | None = None
        self.executing: Execute | None = None
        self.swaps = 0
        self.bytes_swapped_in = 0
        self.bytes_swapped_out = 0

    # -- queries ----------------------------------------------------------------------------------------------
    def used_bytes(self) -> int:
        """Bytes per worker held by resident and loading models."""
        return sum(m.bytes for m in self.models.values() if m.state in ("resident", "loading"))

    def resident(self) -> list[str]:
        """Names of resident models."""
        return [n for n, m in self.models.items() if m.state == "resident"]

    def queue_lengths(self) -> dict[str, int]:
        """Queued requests per model."""
        return {n: len(m.queue) for n, m in self.models.items()}

    def idle(self) -> bool:
        """Nothing queued, running or swapping."""
        return self.swapping is None and self.executing is None and not any(
            m.queue or m.running for m in self.models.values())

    # -- events -----------------------------------------------------------------------------------------------
    def submit(self, req: Request, now_s: float) -> bool:
        """Queue ``req``; ``False`` (refused) when the model's queue is full.

        Raises:
            HetplanError: unknown model.
        """
        m = self.models.get(req.model)
        if m is None:
            raise HetplanError(f"unknown model {req.model!r}", field="model", fix=f"use one of {', '.join(self.models)}")
        m.arrivals.append(now_s)
        if len(m.queue) >= self.max_queue_len:
            return False
        m.queue.append(req)
        return True

    def preload(self, names: Sequence[str]) -> None:
        """Mark ``names`` resident at start (in order, while they fit)."""
        for n in names:
            m = self.models[n]
            if self.used_bytes() + m.bytes <= self.capacity_bytes:
                m.state = "resident"

    def swap_done(self, now_s: float) -> None:
        """The swap in flight has finished: its model is resident."""
        assert self.swapping is not None
        m = self.models[self.swapping.load]
        m.state = "resident"
        m.last_used_s = now_s
        m.fresh = bool(m.queue)
        self.swapping = None

    def exec_done(self, now_s: float, finished: Sequence[Request] = ()) -> None:
        """The iteration in flight has finished; ``finished`` requests leave the running batch."""
        assert self.executing is not None
        m = self.models[self.executing.model]
        done = {r.id for r in finished}
        m.running = [r for r in m.running if r.id not in done]
        m.executing = False
        self.executing = None

    def step(self, now_s: float) -> list[Swap | Execute]:
        """Actions to start now (at most one execution and one swap in flight)."""
        actions: list[Swap | Execute] = []
        if self.executing is None:
            ready = [m for m in self.models.values() if m.state == "resident" and (m.queue or m.running)]
            if ready:
                m = self.policy.pick_execute(ready, now_s)
                room = self.max_batch_size - len(m.running)
                if self.batching == "static" and m.running:
                    room = 0
                joined = [m.queue.popleft() for _ in range(min(room, len(m.queue)))]
                m.running.extend(joined)
                m.executing, m.last_used_s, m.fresh = True, now_s, False
                self.executing = Execute(m.name, list(m.running), joined)
                actions.append(self.executing)
        if self.swapping is None:
            waiting = [m for m in self.models.values() if m.state == "offloaded" and m.queue]
            if waiting:
                m = self.policy.pick_load(waiting, now_s)
                need = self.used_bytes() + m.bytes - self.capacity_bytes
                victims: list[ModelState] | None = []
                if need > 0:
                    evictable = [v for v in self.models.values()
                                 if v.state == "resident" and not v.executing and not v.fresh and not v.running]
                    victims = self.policy.pick_victims(evictable, need, now_s)
                if victims is not None:
                    for v in victims:
                        v.state = "offloaded"
                        self.bytes_swapped_out += v.bytes
                    m.state = "loading"
                    self.swaps += 1
                    self.bytes_swapped_in += m.bytes
                    self.swapping = Swap(m.name, [v.name for v in victims])
                    actions.append(self.swapping)
        return actions
