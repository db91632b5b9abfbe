"""Pausing Python's cyclic garbage collector around the planner's hot loops.

The searches and the batched estimator allocate many small containers (dicts, tuples, dataclasses) and free
them by reference counting, but every 700 net allocations CPython's collector walks the youngest generation,
and every so often all tracked objects (numpy, pydantic, rich and the rest of a CLI process: about a million).
Those walks find nothing to free in this code, which builds no reference cycles, yet took about a third of
``hetplan plan`` of the README example (1.1 s of 2.9 s; ``benchmarks/bench_readme_example.py``). CPython
documents the switch: ``gc.disable()`` — "Disable automatic garbage collection" (Python docs, ``gc`` module);
reference counting still frees everything acyclic, and a cycle made meanwhile waits for the next collection.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def paused_gc() -> Iterator[None]:
    """Disable the cyclic garbage collector for the block (or, as ``@paused_gc()``, the function) and restore its
    previous state after, also when the block raises."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
