"""The real serving engine: a controller (scheduler + policies) driving TP x PP worker processes.

The controller lives in the caller's process; :meth:`Engine.submit` is thread-safe and returns a
``concurrent.futures.Future``. The workers (:mod:`hetplan.serve.worker`, one process per device, spawned) hold
every model's shard in host memory; the scheduler (:mod:`hetplan.serve.scheduler`, the same one the simulator
runs) decides swaps and batches, and the controller sends each action to every worker:

* ``Swap(load, evict)`` -> every worker swaps its own shard, out and in overlapped; the model becomes resident
  when all workers acknowledge (requests for it wait in its queue meanwhile);
* ``Execute(model, chunks, decode, preempted)`` -> one iteration: every worker prefills the joining requests
  into free KV-cache slots and runs one decode step over the others; the last stage returns one token per request.
  The controller appends it, and a request leaves the running batch (its future resolves, its slot is freed) at
  its stop token, at ``max_new_tokens``, or when its slot is full (continuous batching: requests join and leave
  between iterations).

Paged admission and preemption (``kv_cache_tokens``): the scheduler admits by KV blocks of a pool of
``kv_cache_tokens`` tokens and preempts by recompute as on a GPU (:mod:`hetplan.serve.scheduler`); the workers
still hold one whole slot of ``kv_cache_len`` tokens per running sequence (torch on CPU has no paged attention
kernel; the slots only back what the block accounting admits). A preempted request's slot is freed and its
tokens kept; when it resumes, its prompt and those tokens are prefilled again into a new slot. A token budget
per iteration (``max_batched_tokens``) bounds the prefill tokens that join; with ``chunked_prefill`` a prompt is
split over iterations, each chunk written after the tokens cached before it and attending over them
(:class:`hetplan.model.torch_transformer.CacheRows`), its first token coming with the last chunk.

Bounded queues: :meth:`submit` raises :class:`QueueFull` when the model's queue holds ``max_queue_len``
requests (the API answers 429). :meth:`shutdown` stops intake, drains queued work up to a timeout, then stops the
workers. Metrics are kept in a :class:`hetplan.serve.metrics.PromRegistry`.
"""

from __future__ import annotations

import itertools
import os
import multiprocessing as mp
import queue
import shutil
import tempfile
import threading
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Sequence

from hetplan.errors import HetplanError
from hetplan.serve.config import ModelEntry, ServeConfig
from hetplan.serve.metrics import PromRegistry
from hetplan.serve.policies import make_policy
from hetplan.serve.scheduler import Execute, Scheduler, Swap
from hetplan.serve.worker import WorkerArgs, worker_main
from hetplan.serve.workload import Request


class QueueFull(Exception):
    """The model's queue is at its bound (HTTP 429)."""


class EngineClosed(Exception):
    """The engine is shutting down or stopped (HTTP 503)."""


class WorkerFailed(RuntimeError):
    """A worker process raised or died."""


@dataclass
class Result:
    """Answer to one request: generated ``tokens`` (ending with the stop token when it was produced);
    ``latency_s`` from submit to the last token, ``ttft_s`` to the first token, ``tpot_s`` per token after the
    first (``None`` for one token), ``queue_s`` waiting before its prefill started, and the running ``batch_size``
    it joined."""

    id: int
    model: str
    tokens: list[int]
    latency_s: float
    queue_s: float
    batch_size: int
    ttft_s: float = 0.0
    tpot_s: float | None = None


@dataclass
class _Running:
    """Controller-side state of a running request: its KV-cache slot and the tokens generated so far."""

    slot: int
    joined_s: float
    batch_size: int
    tokens: list
    first_s: float | None = None


class Engine:
    """Computron-style engine over ``tp`` x ``pp`` worker processes.

    Args:
        models: served models (:class:`hetplan.serve.config.ModelEntry`).
        tp, pp: tensor- and pipeline-parallel degrees (``tp * pp`` worker processes).
        device: ``"cpu"`` or ``"cuda"``.
        dtype: ``"fp32"`` | ``"fp16"`` | ``"bf16"``.
        capacity_bytes: weight memory per worker (bytes).
        policy: ``"lru"`` | ``"load_aware"``.
        max_batch_size, max_queue_len, write_back: scheduler settings (``max_batch_size`` is also the number of
            KV-cache slots of a model).
        preload: models swapped in at start (while they fit).
        kv_cache_len: tokens (prompt + generated) one KV-cache slot holds.
        batching: ``"continuous"`` or ``"static"`` (:mod:`hetplan.serve.scheduler`).
        kv_cache_tokens: the paged KV pool of each model (tokens; module docstring); ``None``: whole slots.
        kv_block_tokens: tokens per KV block of that pool.
        max_batched_tokens: tokens one iteration processes at most (prefill tokens + one per decode).
        chunked_prefill: split prompts over iterations to fit ``max_batched_tokens`` (module docstring).

    Raises:
        HetplanError: bad settings (unknown policy, model does not fit a worker, ...).
    """

    def __init__(self, models: Sequence[ModelEntry], *, tp: int = 1, pp: int = 1, device: str = "cpu",
                 dtype: str = "fp32", capacity_bytes: int, policy: str = "lru", max_batch_size: int = 8,
                 max_queue_len: int = 256, write_back: bool = True, preload: Sequence[str] = (),
                 rate_window_s: float = 10.0, threads_per_worker: int = 1, kv_cache_len: int = 256,
                 batching: str = "continuous", kv_cache_tokens: int | None = None, kv_block_tokens: int = 16,
                 max_batched_tokens: int | None = None, chunked_prefill: bool = False):
        self.entries = list(models)
        self.tp, self.pp, self.world = tp, pp, tp * pp
        self.device, self.dtype = device, dtype
        self.capacity_bytes = capacity_bytes
        self.policy = make_policy(policy, rate_window_s=rate_window_s)
        self.max_batch_size, self.max_queue_len = max_batch_size, max_queue_len
        self.write_back = write_back
        self.preload = list(preload)
        self.threads_per_worker = threads_per_worker
        self.kv_cache_len, self.batching = kv_cache_len, batching
        self.kv_cache_tokens, self.kv_block_tokens = kv_cache_tokens, kv_block_tokens
        self.max_batched_tokens, self.chunked_prefill = max_batched_tokens, chunked_prefill
        self._preempted: dict[int, _Running] = {}
        self.specs = {m.name: m.spec() for m in self.entries}
        from hetplan.estimate.inference import kv_cache_bytes_per_worker, weight_bytes_per_worker
        from hetplan.serve.scheduler import BATCHING

        if batching not in BATCHING:
            raise HetplanError(f"unknown batching {batching!r}", field="scheduler.batching",
                               fix=f"use one of {', '.join(BATCHING)}")
        for name, s in self.specs.items():
            # fail early, in this process: shapes that do not split, or that cannot fit even by the cost model's
            # count (the torch shards only add vocabulary padding and TP-replicated norms to it)
            kv = kv_cache_bytes_per_worker(s, max_batch_size * kv_cache_len, tp, pp, dtype)
            need = max(w + k for w, k in zip(weight_bytes_per_worker(s, tp, pp, dtype), kv))
            if need > capacity_bytes:
                raise HetplanError(
                    f"model {name} needs {need:,} bytes per worker (weights + KV cache) but a worker has "
                    f"{capacity_bytes:,}", field=f"models.{name}",
                    fix="raise cluster.memory_bytes, lower scheduler.kv_cache_len or max_batch_size, "
                        "or use more TP x PP workers")
        self.vocab_sizes = {n: s.vocab_size for n, s in self.specs.items()}
        self.metrics = PromRegistry()
        self._describe_metrics()
        self._lock = threading.RLock()
        self._ids = itertools.count()
        self._swap_ids = itertools.count(1)
        self._pending: dict[int, tuple[Future, Request, float]] = {}
        self._batches: dict[int, tuple[Execute, float, tuple]] = {}
        self._running: dict[int, _Running] = {}
        self._free_slots: dict[str, list[int]] = {}
        self._swap_acks: dict[int, list] = {}
        self._swap_started: dict[int, tuple[Swap, float]] = {}
        self._sync: dict[tuple[str, int], tuple[threading.Event, list]] = {}
        self._stats_waiters: dict[int, tuple[threading.Event, list]] = {}
        self._closing = False
        self._stopped = False
        self._error: str | None = None
        self.shard_bytes: dict[str, list[int]] = {}
        self.kv_bytes: dict[str, list[int]] = {}
        self.scheduler: Scheduler | None = None
        #: (model, prompt lengths prefilled, contexts decoded, wall s) of every iteration and (loaded model,
        #: victims, wall s) of every swap, as seen by the controller (bounded to the last 100,000 entries); used to
        #: calibrate the simulator.
        self.exec_log: deque = deque(maxlen=100_000)
        self.swap_log: deque = deque(maxlen=100_000)
        self._t0 = time.monotonic()

    @classmethod
    def from_config(cls, cfg: ServeConfig, **overrides) -> "Engine":
        """An engine for a ``SERVE.toml`` (see :mod:`hetplan.serve.config`)."""
        c, s = cfg.cluster, cfg.scheduler
        kw = dict(tp=c.tp, pp=c.pp, device=c.device, dtype=c.dtype, capacity_bytes=c.capacity_bytes(),
                  policy=s.policy, max_batch_size=s.max_batch_size, max_queue_len=s.max_queue_len,
                  write_back=s.write_back, preload=s.preload, rate_window_s=s.rate_window_s,
                  kv_cache_len=s.kv_cache_len, batching=s.batching,
                  kv_cache_tokens=s.kv_cache_tokens if s.paged_kv else None,
                  kv_block_tokens=s.kv_block_tokens or 16, max_batched_tokens=s.max_batched_tokens,
                  chunked_prefill=bool(s.chunked_prefill))
        if c.engine or c.quantization:
            which = "cluster.engine" if c.engine else "cluster.quantization"
            raise HetplanError(f"{which} prices the simulator's costs; hetplan serve runs its own torch engine at "
                               "cluster.dtype", field=which,
                               fix=f"drop {which} from SERVE.toml (or launch the engine itself: hetplan capacity "
                                   "--export vllm)")
        kw.update(overrides)
        return cls(cfg.models, **kw)

    def now_s(self) -> float:
        """Engine clock (s since construction, monotonic)."""
        return time.monotonic() - self._t0

    # -- lifecycle --------------------------------------------------------------------------------------------
    def start(self, timeout_s: float = 180.0) -> "Engine":
        """Spawn the workers, build their shards, and preload models.

        Raises:
            WorkerFailed: a worker failed to start (its traceback in the message) or timed out.
        """
        if self.device == "cuda":
            import torch

            if not torch.cuda.is_available():
                raise HetplanError("cluster.device is cuda but torch sees no GPU", field="cluster.device", fix="use device = \"cpu\"")
        ctx = mp.get_context("spawn")
        self._result_q = ctx.Queue()
        self._cmd_qs = [ctx.Queue() for _ in range(self.world)]
        self._swap_qs = [ctx.Queue() for _ in range(self.world)]
        # Rendezvous over a file, not a TCP port picked in advance (another process could take the port before
        # rank 0 binds it): torch.distributed's FileStore, removed again by shutdown().
        self._rendezvous_dir = tempfile.mkdtemp(prefix="hetplan-serve-")
        store = os.path.join(self._rendezvous_dir, "store")
        models = [(m.name, m.model, m.seed, m.num_layers) for m in self.entries]
        self._procs = []
        for r in range(self.world):
            a = WorkerArgs(r, self.tp, self.pp, store, models, self.device, self.dtype, self.capacity_bytes,
                           self.write_back, self.threads_per_worker, self.max_batch_size, self.kv_cache_len)
            p = ctx.Process(target=worker_main, args=(a, self._cmd_qs[r], self._swap_qs[r], self._result_q),
                            daemon=True, name=f"hetplan-serve-worker-{r}")
            p.start()
            self._procs.append(p)
        ready: dict[int, dict] = {}
        deadline = time.monotonic() + timeout_s
        while len(ready) < self.world:
            try:
                msg = self._result_q.get(timeout=max(0.1, min(1.0, deadline - time.monotonic())))
            except queue.Empty:
                if time.monotonic() > deadline or any(not p.is_alive() for p in self._procs):
                    self._kill()
                    raise WorkerFailed("workers did not start in time or died during start") from None
                continue
            if msg[0] == "error":
                self._kill()
                raise WorkerFailed(f"worker {msg[1]} failed to start:\n{msg[2]}")
            if msg[0] == "ready":
                ready[msg[1]] = msg[2]
        for name in self.specs:
            self.shard_bytes[name] = [ready[r][name][0] for r in range(self.world)]
            self.kv_bytes[name] = [ready[r][name][1] for r in range(self.world)]
            self._free_slots[name] = list(range(self.max_batch_size))
        est_bw = 5e9  # initial guess of copy bandwidth for swap-time estimates, replaced by measurements
        try:
            self.scheduler = Scheduler({n: (self.footprint_bytes(n), max(b) / est_bw) for n, b in self.shard_bytes.items()},
                                       self.capacity_bytes, self.policy, max_batch_size=self.max_batch_size,
                                       max_queue_len=self.max_queue_len, batching=self.batching,
                                       kv_blocks=(None if self.kv_cache_tokens is None else
                                                  {n: self.kv_cache_tokens // self.kv_block_tokens
                                                   for n in self.specs}),
                                       block_tokens=self.kv_block_tokens, max_batched_tokens=self.max_batched_tokens,
                                       chunked_prefill=self.chunked_prefill, max_seq_tokens=self.kv_cache_len)
        except HetplanError:
            self.shutdown(0)
            raise
        self._reader = threading.Thread(target=self._read_loop, daemon=True, name="hetplan-serve-reader")
        self._reader.start()
        self._load_preloaded()
        return self

    def footprint_bytes(self, name: str) -> int:
        """Device bytes per worker while ``name`` is resident: the largest weights + KV cache of a worker."""
        return max(w + k for w, k in zip(self.shard_bytes[name], self.kv_bytes[name]))

    def shutdown(self, drain_timeout_s: float = 10.0) -> None:
        """Stop intake, let queued and running work finish (up to ``drain_timeout_s``), stop the workers; requests
        still pending then fail with :class:`EngineClosed`."""
        if self._stopped:
            return
        self._closing = True
        deadline = time.monotonic() + drain_timeout_s
        while time.monotonic() < deadline and self._error is None:
            with self._lock:
                if self.scheduler is None or (self.scheduler.idle() and not self._pending):
                    break
            time.sleep(0.01)
        self._stopped = True
        for q in getattr(self, "_cmd_qs", []) + getattr(self, "_swap_qs", []):
            q.put(("stop",))
        for p in getattr(self, "_procs", []):
            p.join(timeout=10)
        self._kill()
        if getattr(self, "_reader", None) is not None and self._reader is not threading.current_thread():
            self._reader.join(timeout=5)
        for q in getattr(self, "_cmd_qs", []) + getattr(self, "_swap_qs", []) + [getattr(self, "_result_q", None)]:
            if q is not None:
                q.close()
                q.join_thread()
        # Drop the queues: their semaphores (3 named POSIX semaphores each) are unlinked when they are garbage
        # collected or at interpreter exit; `hetplan serve` ends by re-raising uvicorn's captured SIGTERM, which
        # kills the process before its exit handlers run, and the resource tracker warned of leaked semaphores.
        self._cmd_qs, self._swap_qs, self._result_q = [], [], None
        if getattr(self, "_rendezvous_dir", None) is not None:
            shutil.rmtree(self._rendezvous_dir, ignore_errors=True)
        with self._lock:
            for fut, _, _ in self._pending.values():
                if not fut.done():
                    fut.set_exception(EngineClosed("engine shut down before the request finished"))
            self._pending.clear()

    def _kill(self) -> None:
        for p in getattr(self, "_procs", []):
            if p.is_alive():
                p.terminate()
                p.join(timeout=5)

    def __enter__(self) -> "Engine":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.shutdown()

    # -- requests ---------------------------------------------------------------------------------------------
    def submit(self, model: str, prompt: Sequence[int], max_new_tokens: int = 1, stop_token: int | None = None) -> Future:
        """Queue a request; the future resolves to a :class:`Result`. Generation is greedy and ends at
        ``stop_token`` (included in the answer) or after ``max_new_tokens`` tokens.

        Raises:
            HetplanError: unknown model, empty prompt, token id outside the vocabulary, or prompt + new tokens
                beyond the model's positions or the KV-cache slot (``kv_cache_len``).
            QueueFull: the model's queue is full.
            EngineClosed: the engine is shutting down.
            WorkerFailed: a worker has failed.
        """
        if self._error is not None:
            raise WorkerFailed(self._error)
        if self._closing or self.scheduler is None:
            raise EngineClosed("engine is not accepting requests")
        if model not in self.specs:
            raise HetplanError(f"unknown model {model!r}", field="model", fix=f"use one of {', '.join(self.specs)}")
        spec = self.specs[model]
        prompt = [int(t) for t in prompt]
        if not prompt or min(prompt) < 0 or max(prompt) >= spec.vocab_size:
            raise HetplanError(f"prompt must be a non-empty list of token ids in [0, {spec.vocab_size})",
                               field="prompt", fix="send token ids within the model's vocabulary")
        limit = min(spec.max_seq_len, self.kv_cache_len)
        if max_new_tokens < 1 or len(prompt) + max_new_tokens > limit:
            raise HetplanError(f"prompt ({len(prompt)} tokens) + max_new_tokens ({max_new_tokens}) must be within "
                               f"{limit} tokens (the model's positions and the KV-cache slot)",
                               field="max_new_tokens", fix="send a shorter prompt or fewer new tokens")
        if stop_token is not None and not 0 <= stop_token < spec.vocab_size:
            raise HetplanError(f"stop_token {stop_token} outside [0, {spec.vocab_size})", field="stop_token",
                               fix="give a token id within the model's vocabulary")
        fut: Future = Future()
        with self._lock:
            now = self.now_s()
            req = Request(next(self._ids), model, now, len(prompt), max_new_tokens, prompt, stop_token)
            if not self.scheduler.submit(req, now):
                self.metrics.inc("hetplan_serve_requests_total", model=model, status="refused")
                raise QueueFull(f"queue of model {model} is full ({self.max_queue_len} requests)")
            self._pending[req.id] = (fut, req, now)
            self._step_locked(now)
        return fut

    def generate(self, model: str, prompt: Sequence[int], max_new_tokens: int = 1, timeout_s: float = 60.0,
                 stop_token: int | None = None) -> Result:
        """Blocking :meth:`submit`."""
        return self.submit(model, prompt, max_new_tokens, stop_token).result(timeout=timeout_s)

    # -- dispatch ---------------------------------------------------------------------------------------------
    def _step_locked(self, now: float) -> None:
        for act in self.scheduler.step(now):
            if isinstance(act, Swap):
                sid = next(self._swap_ids)
                self._swap_acks[sid] = []
                self._swap_started[sid] = (act, time.monotonic())
                for q in self._swap_qs:
                    q.put(("swap", sid, act.load, list(act.evict)))
            else:
                sid = next(self._swap_ids)
                for r in act.preempted:  # recompute preemption: the slot is freed, the tokens kept
                    run = self._running.pop(r.id)
                    self._free_slots[act.model].append(run.slot)
                    self._preempted[r.id] = run
                for c in act.chunks:
                    r = c.request
                    if c.start:  # a later chunk of a prompt: its slot is held since the first chunk
                        continue
                    slot = self._free_slots[act.model].pop(0)
                    back = self._preempted.pop(r.id, None)
                    if back is not None:
                        back.slot = slot
                        self._running[r.id] = back
                    else:
                        self._running[r.id] = _Running(slot, now, len(act.requests), [])
                # a chunk covers positions start .. start + tokens of the prompt and the tokens generated before a
                # preemption (recomputed with it)
                joins = [(self._running[c.request.id].slot,
                          (c.request.prompt + self._running[c.request.id].tokens)[c.start:c.start + c.tokens], c.start)
                         for c in act.chunks]
                decodes = [(self._running[r.id].slot, self._running[r.id].tokens[-1],
                            r.prompt_len + len(self._running[r.id].tokens) - 1) for r in act.decode]
                shape = (tuple(len(j[1]) for j in joins), tuple(d[2] + 1 for d in decodes))
                self._batches[sid] = (act, now, shape)
                for q in self._cmd_qs:
                    q.put(("step", sid, act.model, joins, decodes))
                self.metrics.inc("hetplan_serve_iterations_total", model=act.model)
                self.metrics.observe("hetplan_serve_batch_size", len(act.requests), model=act.model)
        self._refresh_gauges()

    def _refresh_gauges(self) -> None:
        if self.scheduler is None:
            return
        for n, m in self.scheduler.models.items():
            self.metrics.set("hetplan_serve_queue_length", len(m.queue), model=n)
            self.metrics.set("hetplan_serve_model_resident", 1 if m.state == "resident" else 0, model=n)
        self.metrics.set("hetplan_serve_used_bytes", self.scheduler.used_bytes())

    def _read_loop(self) -> None:
        while not self._stopped:
            try:
                msg = self._result_q.get(timeout=0.2)
            except queue.Empty:
                if not self._stopped and any(not p.is_alive() for p in self._procs):
                    self._fail("a worker process died")
                    return
                continue
            except (EOFError, OSError, ValueError):
                return
            kind = msg[0]
            if kind == "error":
                self._fail(f"worker {msg[1]}:\n{msg[2]}")
                return
            if kind == "stats":
                ev, out = self._stats_waiters.get(msg[2], (None, None))
                if ev is not None:
                    out.append(msg[3])
                    if len(out) == self.world:
                        ev.set()
            elif kind == "swap_done":
                self._on_swap_done(msg[2], msg[3])
            elif kind == "exec_done":
                self._on_exec_done(msg[2], msg[3])

    def _fail(self, text: str) -> None:
        self._error = text
        with self._lock:
            for fut, _, _ in self._pending.values():
                if not fut.done():
                    fut.set_exception(WorkerFailed(text))
            self._pending.clear()
            for ev, _ in list(self._sync.values()):
                ev.set()

    def _on_swap_done(self, sid: int, times: dict) -> None:
        with self._lock:
            if ("swap", sid) in self._sync:
                ev, out = self._sync[("swap", sid)]
                out.append(times)
                if len(out) == self.world:
                    ev.set()
                return
            acks = self._swap_acks[sid]
            acks.append(times)
            if len(acks) < self.world:
                return
            act, t_start = self._swap_started.pop(sid)
            del self._swap_acks[sid]
            wall = time.monotonic() - t_start
            self.swap_log.append((act.load, tuple(act.evict), wall))
            bytes_in = sum(a.get("in_bytes", 0) for a in acks)
            bytes_out = sum(a.get("out_bytes", 0) for a in acks)
            m = self.metrics
            m.inc("hetplan_serve_swaps_total")
            m.inc("hetplan_serve_swap_bytes_total", bytes_in, direction="in")
            m.inc("hetplan_serve_swap_bytes_total", bytes_out, direction="out")
            m.observe("hetplan_serve_swap_seconds", wall)
            if wall > 0:
                m.set("hetplan_serve_swap_bandwidth_bytes_per_s", bytes_in / wall)
            st = self.scheduler.models[act.load]
            st.swap_in_s = 0.5 * st.swap_in_s + 0.5 * wall if st.swap_in_s else wall
            now = self.now_s()
            self.scheduler.swap_done(now)
            self._step_locked(now)

    def _on_exec_done(self, sid: int, tokens: list[int]) -> None:
        with self._lock:
            act, t_start, shape = self._batches.pop(sid)
            now = self.now_s()
            self.exec_log.append((act.model, *shape, now - t_start))
            # the workers' answer order: prefill rows, then decodes; a chunk that does not end its prompt emits none
            emits = [c.last for c in act.chunks] + [True] * len(act.decode)
            finished = []
            for req, tok, emit in zip(act.requests, tokens, emits):
                if not emit:
                    continue
                run = self._running[req.id]
                run.tokens.append(int(tok))
                if run.first_s is None:
                    run.first_s = now
                if (tok == req.stop_token or len(run.tokens) >= req.max_new_tokens
                        or req.prompt_len + len(run.tokens) >= self.kv_cache_len):
                    finished.append(req)
                    self._finish(req, run, now)
            self.scheduler.exec_done(now, finished)
            self._step_locked(now)

    def _finish(self, req: Request, run: _Running, now: float) -> None:
        del self._running[req.id]
        self._free_slots[req.model].append(run.slot)
        entry = self._pending.pop(req.id, None)
        if entry is None:  # already failed by a shutdown that timed out
            return
        fut, _, t_sub = entry
        lat, ttft = now - t_sub, run.first_s - t_sub
        tpot = (now - run.first_s) / (len(run.tokens) - 1) if len(run.tokens) > 1 else None
        m = self.metrics
        m.inc("hetplan_serve_requests_total", model=req.model, status="ok")
        m.observe("hetplan_serve_request_latency_seconds", lat, model=req.model)
        m.observe("hetplan_serve_ttft_seconds", ttft, model=req.model)
        if tpot is not None:
            m.observe("hetplan_serve_tpot_seconds", tpot, model=req.model)
        if not fut.done():
            fut.set_result(Result(req.id, req.model, run.tokens, lat, run.joined_s - t_sub, run.batch_size, ttft, tpot))

    # -- synchronous helpers (engine idle) --------------------------------------------------------------------
    def _sync_call(self, key: tuple[str, int], send, timeout_s: float) -> list:
        ev, out = threading.Event(), []
        with self._lock:
            self._sync[key] = (ev, out)
        send()
        if not ev.wait(timeout_s) or self._error:
            raise WorkerFailed(self._error or f"{key[0]} timed out after {timeout_s} s")
        with self._lock:
            del self._sync[key]
        return out

    def _sync_swap(self, load: str | None, evict: list[str], timeout_s: float = 120.0) -> tuple[float, list]:
        sid = -next(self._swap_ids)
        t0 = time.monotonic()

        def send():
            for q in self._swap_qs:
                q.put(("swap", sid, load, evict))

        out = self._sync_call(("swap", sid), send, timeout_s)
        return time.monotonic() - t0, out

    def memory_stats(self, timeout_s: float = 30.0) -> list[dict]:
        """Each worker's memory statistics (rank order): resident models, ``live_device_bytes`` (bytes of live
        device weight tensors, counted by finalizers), ``cuda_memory_allocated_bytes`` on GPU."""
        key = next(self._swap_ids)
        ev, out = threading.Event(), []
        self._stats_waiters[key] = (ev, out)
        for q in self._swap_qs:
            q.put(("stats", key))
        if not ev.wait(timeout_s):
            raise WorkerFailed("memory statistics timed out")
        del self._stats_waiters[key]
        return sorted(out, key=lambda d: d["rank"])

    def _load_preloaded(self) -> None:
        """Swap in the ``preload`` models that fit, in order, and refresh the gauges."""
        for name in self.preload:
            st = self.scheduler.models[name]
            if self.scheduler.used_bytes() + st.bytes <= self.capacity_bytes:
                self._sync_swap(name, [])
                st.state = "resident"
        self._refresh_gauges()

    def _describe_metrics(self) -> None:
        d = self.metrics.describe
        d("hetplan_serve_requests_total", "counter", "Requests by model and status (ok, refused)")
        d("hetplan_serve_swaps_total", "counter", "Swaps performed (each loads one model, evicting victims)")
        d("hetplan_serve_swap_bytes_total", "counter", "Bytes moved by swaps, summed over workers, by direction")
        d("hetplan_serve_swap_seconds", "histogram", "Wall time of a swap (s)")
        d("hetplan_serve_swap_bandwidth_bytes_per_s", "gauge", "Aggregate swap-in bandwidth of the last swap (bytes/s)")
        d("hetplan_serve_queue_length", "gauge", "Queued requests per model")
        d("hetplan_serve_model_resident", "gauge", "1 when the model is resident on the workers")
        d("hetplan_serve_used_bytes", "gauge", "Weight bytes per worker held by resident and loading models")
        d("hetplan_serve_request_latency_seconds", "histogram", "Request latency from submit to last token (s)")
        d("hetplan_serve_ttft_seconds", "histogram", "Time to first token, from submit (s)")
        d("hetplan_serve_tpot_seconds", "histogram", "Time per output token after the first (s)",
          buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5))
        d("hetplan_serve_iterations_total", "counter", "Iterations (prefills of joining requests + a decode step) per model")
        d("hetplan_serve_batch_size", "histogram", "Running requests per iteration", buckets=(1, 2, 4, 8, 16, 32, 64, 128))
