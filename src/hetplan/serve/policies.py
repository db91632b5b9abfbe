"""Swap policies: which model to run, which to load next, and which resident models to evict.

A policy sees :class:`ModelState` views and chooses; the :class:`~hetplan.serve.scheduler.Scheduler` applies the
choice. The same policy objects drive the simulator and the real engine. Policies are registered by name in
:data:`POLICIES` (vidur-style registry).

* ``lru`` (Computron, Zou et al. 2023, Sec. 3.3): run the resident model whose oldest queued request came first
  (FCFS), load the non-resident model whose oldest request came first, evict the least recently used models.
* ``load_aware``: evict the models with the smallest expected cost of eviction
  ``(q_m + λ_m · T_m) · T_m`` — requests queued now plus those expected to arrive while it would be reloaded,
  times the reload time T_m (s) — ties broken by LRU; load the model with the most queued requests per second of
  load time (ties: oldest request), run the resident model with the longest queue (ties: oldest request).
  λ_m is the arrival rate over a sliding window (``rate_window_s``).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Sequence

from hetplan.errors import HetplanError


@dataclass
class ModelState:
    """What the scheduler knows about one model.

    Attributes:
        name: model name.
        bytes: memory footprint on each worker (bytes; the largest shard of the model).
        swap_in_s: estimated load time (s) (from the swap model or a measurement).
        state: ``"offloaded"`` | ``"loading"`` | ``"resident"``.
        queue: waiting requests (FIFO).
        running: requests in its running batch (they hold KV-cache slots).
        executing: an iteration of this model is running.
        last_used_s: last time it was loaded or started a batch (s).
        arrivals: recent arrival times (s), for the rate estimate.
        fresh: loaded and not yet run; the scheduler does not evict it (that would waste the swap).
    """

    name: str
    bytes: int
    swap_in_s: float = 0.0
    state: str = "offloaded"
    queue: deque = field(default_factory=deque)
    running: list = field(default_factory=list)
    executing: bool = False
    last_used_s: float = float("-inf")
    arrivals: deque = field(default_factory=deque)
    fresh: bool = False

    def head_arrival_s(self) -> float:
        """Arrival time of the oldest running or queued request (inf when there is none)."""
        times = [r.arrival_s for r in self.running] + ([self.queue[0].arrival_s] if self.queue else [])
        return min(times, default=float("inf"))

    def rate_per_s(self, now_s: float, window_s: float) -> float:
        """Arrivals per second over the last ``window_s`` seconds."""
        while self.arrivals and self.arrivals[0] < now_s - window_s:
            self.arrivals.popleft()
        return len(self.arrivals) / window_s


class Policy:
    """Base policy (LRU / FCFS, as Computron)."""

    name = "lru"

    def __init__(self, rate_window_s: float = 10.0):
        self.rate_window_s = rate_window_s

    def pick_execute(self, candidates: Sequence[ModelState], now_s: float) -> ModelState:
        """Resident model to run next (candidates are resident, idle, with queued or running requests)."""
        return min(candidates, key=lambda m: m.head_arrival_s())

    def pick_load(self, candidates: Sequence[ModelState], now_s: float) -> ModelState:
        """Offloaded model to load next (candidates have queued requests)."""
        return min(candidates, key=lambda m: m.head_arrival_s())

    def eviction_order(self, evictable: Sequence[ModelState], now_s: float) -> list[ModelState]:
        """Evictable resident models, first victim first."""
        return sorted(evictable, key=lambda m: m.last_used_s)

    def pick_victims(self, evictable: Sequence[ModelState], need_bytes: int, now_s: float) -> list[ModelState] | None:
        """Victims in eviction order until ``need_bytes`` are freed; ``None`` if they cannot free enough."""
        out, freed = [], 0
        for m in self.eviction_order(evictable, now_s):
            if freed >= need_bytes:
                break
            out.append(m)
            freed += m.bytes
        return out if freed >= need_bytes else None


class LoadAwarePolicy(Policy):
    """Queue-length / arrival-rate / swap-cost aware policy (see the module docstring)."""

    name = "load_aware"

    def pick_execute(self, candidates, now_s):
        return min(candidates, key=lambda m: (-len(m.queue) - len(m.running), m.head_arrival_s()))

    def pick_load(self, candidates, now_s):
        return min(candidates, key=lambda m: (-len(m.queue) / max(m.swap_in_s, 1e-6), m.head_arrival_s()))

    def eviction_order(self, evictable, now_s):
        def cost(m: ModelState) -> tuple[float, float]:
            t = m.swap_in_s
            return ((len(m.queue) + m.rate_per_s(now_s, self.rate_window_s) * t) * t, m.last_used_s)

        return sorted(evictable, key=cost)


POLICIES: dict[str, Callable[..., Policy]] = {"lru": Policy, "load_aware": LoadAwarePolicy}


def make_policy(name: str, **kwargs) -> Policy:
    """The policy registered as ``name``.

    Raises:
        HetplanError: unknown policy name.
    """
    try:
        return POLICIES[name](**kwargs)
    except KeyError:
        raise HetplanError(f"unknown policy {name!r}", field="scheduler.policy",
                           fix=f"use one of {', '.join(POLICIES)}") from None
