"""One engine worker process: holds its shard of every model in host memory and swaps it to/from the device.

One process per device (rank = pp_rank · TP + tp_rank), on ``torch.distributed`` (NCCL on GPU, Gloo on CPU; the
same code path). Each worker runs two threads:

* the **exec thread** (main) runs iterations: one *prefill* pass over the prompts of the requests joining the
  batch (right-padded to the longest), then one *decode* step over the running requests (embedding / layers / head of its pipeline stage with its TP slice,
  :class:`hetplan.model.torch_transformer.TransformerStage` through ``torch.func.functional_call`` on the device
  copy of the weights; all-reduces over its TP group; hidden states to the next stage by p2p send/recv). Each pass
  reads and writes the model's :class:`~hetplan.model.torch_transformer.KVCache` on this device (this stage's
  layers, this rank's key/value heads; one slot per running request, chosen by the controller). The controller
  sends every worker the tokens to feed, so no token travels back between stages; the last stage returns the
  greedy next token of each request;
* the **swap thread** evicts and loads shards: swap-out (device -> host write-back) and swap-in (host -> device)
  run in two threads at once, tensor by tensor; a tensor is allocated only when the bytes already freed leave room
  for it, so the worker never holds more than its ``capacity_bytes``. A loaded model also gets its KV cache
  (``kv_slots`` x ``kv_len`` tokens, counted in the same budget); an evicted model's cache is freed, not copied
  (the scheduler evicts only models without running requests, so it holds nothing reusable). On GPU the host
  copies are pinned and each direction has its own CUDA stream.

The worker ends itself when its parent process dies (even by SIGKILL): a watchdog thread waits on the parent's
process sentinel (a pipe end that closes when the parent exits) and then exits at once, so no worker outlives
``hetplan serve``.

Memory statistics: on GPU ``torch.cuda.memory_allocated``; on CPU the bytes of live device tensors counted by
``weakref.finalize`` callbacks, which fire only when torch actually releases the tensor.
"""

from __future__ import annotations

import os
import threading
import time
import traceback
import weakref
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.func import functional_call

from hetplan.model.spec import load_model
from hetplan.model.torch_transformer import CacheRows, KVCache, Partition, TransformerStage
from hetplan.plan import layer_ranges
from hetplan.profile.torchparts import exit_rank

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


@dataclass
class WorkerArgs:
    """Everything a worker needs (picklable)."""

    rank: int
    tp: int
    pp: int
    rendezvous_file: str  # torch.distributed FileStore path (absent until rank 0 creates it)
    models: list  # list of (name, model_path_or_preset, seed, num_layers_override | None)
    device: str  # "cpu" | "cuda"
    dtype: str
    capacity_bytes: int
    write_back: bool = True
    threads: int = 1
    kv_slots: int = 8
    kv_len: int = 256


class _Budget:
    """Bytes of weight memory still free on this worker (condition variable)."""

    def __init__(self, free: int):
        self.free = free
        self.cv = threading.Condition()

    def take(self, n: int) -> None:
        with self.cv:
            while self.free < n:
                if not self.cv.wait(timeout=30):
                    raise RuntimeError("swap-in waited 30 s for memory that swap-out never freed")
            self.free -= n

    def give(self, n: int) -> None:
        with self.cv:
            self.free += n
            self.cv.notify_all()


class Worker:
    def __init__(self, a: WorkerArgs, cmd_q, swap_q, result_q):
        self.a, self.cmd_q, self.swap_q, self.result_q = a, cmd_q, swap_q, result_q
        self.rank = a.rank
        self.tp_rank, self.pp_rank = a.rank % a.tp, a.rank // a.tp
        self.device = torch.device(f"cuda:{torch.cuda.current_device()}" if a.device == "cuda" else "cpu")
        self.dtype = DTYPES[a.dtype]
        self.stages: dict[str, TransformerStage] = {}
        self.host: dict[str, dict[str, torch.Tensor]] = {}
        self.resident: dict[str, dict[str, torch.Tensor]] = {}
        self.caches: dict[str, KVCache] = {}
        self.budget = _Budget(a.capacity_bytes)
        self._live = 0
        self._live_lock = threading.Lock()
        self.tp_group = None

    # -- setup ------------------------------------------------------------------------------------------------
    def setup(self) -> None:
        a = self.a
        backend = "nccl" if a.device == "cuda" else "gloo"
        dist.init_process_group(backend, init_method=f"file://{a.rendezvous_file}", rank=a.rank,
                                world_size=a.tp * a.pp)
        for s in range(a.pp):  # every rank creates every group, in the same order
            g = dist.new_group(list(range(s * a.tp, (s + 1) * a.tp))) if a.tp > 1 else None
            if s == self.pp_rank:
                self.tp_group = g
        for name, path, seed, layers in a.models:
            spec = load_model(path)
            if layers is not None:
                spec = spec.model_copy(update={"num_layers": int(layers)})
            lo, hi = layer_ranges(spec.num_layers, a.pp)[self.pp_rank]
            part = Partition(lo, hi, self.pp_rank == 0, self.pp_rank == a.pp - 1, self.tp_rank, a.tp, self.tp_group)
            stage = TransformerStage(spec, part, seed=seed, dtype=self.dtype).eval()
            params = {n: p.detach() for n, p in stage.named_parameters()}
            if a.device == "cuda":
                params = {n: p.pin_memory() for n, p in params.items()}
            stage.to("meta")  # the module keeps only its structure; weights live in self.host / self.resident
            self.stages[name], self.host[name] = stage, params

    def shard_bytes(self, name: str) -> int:
        """Weight bytes of this worker's shard of ``name``."""
        return sum(t.numel() * t.element_size() for t in self.host[name].values())

    def kv_bytes(self, name: str) -> int:
        """Bytes of ``name``'s KV cache on this worker (``kv_slots`` x ``kv_len`` tokens)."""
        st, a = self.stages[name], self.a
        return 2 * len(st.layers) * a.kv_slots * (st.spec.num_kv_heads // a.tp) * a.kv_len * st.spec.head_dim * \
            torch.empty((), dtype=self.dtype).element_size()

    # -- memory -----------------------------------------------------------------------------------------------
    def _track(self, t: torch.Tensor) -> None:
        n = t.numel() * t.element_size()
        with self._live_lock:
            self._live += n

        def _freed(n=n):
            with self._live_lock:
                self._live -= n

        weakref.finalize(t, _freed)

    def memory_stats(self) -> dict:
        out = {"rank": self.rank, "resident": sorted(self.resident), "live_device_bytes": self._live,
               "budget_free_bytes": self.budget.free}
        if self.device.type == "cuda":
            out["cuda_memory_allocated_bytes"] = torch.cuda.memory_allocated(self.device)
        return out

    # -- swapping ---------------------------------------------------------------------------------------------
    def _swap_out(self, name: str, times: dict) -> None:
        t0 = time.perf_counter()
        dev = self.resident.pop(name)
        stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        nbytes = 0
        cache = self.caches.pop(name, None)
        if cache is not None:  # dropped, not copied: no running request is left in it
            n = cache.nbytes()
            del cache
            self.budget.give(n)
        with torch.cuda.stream(stream) if stream is not None else _nullctx():
            for key in list(dev):
                t = dev.pop(key)
                n = t.numel() * t.element_size()
                if self.a.write_back:
                    self.host[name][key].copy_(t, non_blocking=stream is not None)
                    if stream is not None:
                        stream.synchronize()
                del t
                nbytes += n
                self.budget.give(n)
        times["out_s"] = times.get("out_s", 0.0) + time.perf_counter() - t0
        times["out_bytes"] = times.get("out_bytes", 0) + nbytes

    def _swap_in(self, name: str, times: dict) -> None:
        t0 = time.perf_counter()
        stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        dev: dict[str, torch.Tensor] = {}
        nbytes = 0
        with torch.cuda.stream(stream) if stream is not None else _nullctx():
            for key, h in self.host[name].items():
                n = h.numel() * h.element_size()
                self.budget.take(n)
                t = torch.empty_like(h, device=self.device)
                t.copy_(h, non_blocking=stream is not None)
                self._track(t)
                dev[key] = t
                nbytes += n
        if stream is not None:
            stream.synchronize()
        kv = self.kv_bytes(name)
        self.budget.take(kv)
        cache = KVCache(self.stages[name], self.a.kv_slots, self.a.kv_len, device=self.device, dtype=self.dtype)
        self._track(cache.k)
        self._track(cache.v)
        self.caches[name] = cache
        self.resident[name] = dev
        times["in_s"] = time.perf_counter() - t0
        times["in_bytes"] = nbytes

    def swap(self, swap_id: int, load: str | None, evict: list[str]) -> None:
        times: dict = {}
        t0 = time.perf_counter()
        outs = [threading.Thread(target=self._swap_out, args=(v, times)) for v in evict if v in self.resident]
        for th in outs:
            th.start()
        if load is not None and load not in self.resident:
            self._swap_in(load, times)
        for th in outs:
            th.join()
        times["wall_s"] = time.perf_counter() - t0
        self.result_q.put(("swap_done", self.rank, swap_id, times, self.memory_stats()))

    def swap_loop(self) -> None:
        while True:
            msg = self.swap_q.get()
            if msg[0] == "stop":
                return
            try:
                if msg[0] == "swap":
                    self.swap(*msg[1:])
                elif msg[0] == "stats":
                    self.result_q.put(("stats", self.rank, msg[1], self.memory_stats()))
            except Exception:  # report and keep the process alive for shutdown
                self.result_q.put(("error", self.rank, traceback.format_exc()))

    # -- execution --------------------------------------------------------------------------------------------
    def _pass(self, name: str, tokens: list[list[int]], rows: CacheRows) -> torch.Tensor | None:
        """One forward pass of this stage: tokens on the first stage (else hidden states from the previous
        stage), output sent on to the next stage; returns the logits on the last stage."""
        a = self.a
        first, last = self.pp_rank == 0, self.pp_rank == a.pp - 1
        b, s = len(tokens), len(tokens[0])
        if first:
            x = torch.tensor(tokens, dtype=torch.long, device=self.device)
        else:
            x = torch.empty(b, s, self.stages[name].spec.hidden_size, dtype=self.dtype, device=self.device)
            dist.recv(x, src=self.rank - a.tp)
        y = functional_call(self.stages[name], self.resident[name], (x,), {"rows": rows})
        if not last:
            dist.send(y.contiguous(), dst=self.rank + a.tp)
            return None
        return y

    @torch.inference_mode()
    def step(self, step_id: int, name: str, joins: list[tuple],
             decodes: list[tuple[int, int, int]]) -> None:
        """One iteration of model ``name``: one prefill pass over ``joins`` = ``(slot, tokens[, start])`` (a whole
        prompt from position 0, or a chunk after ``start`` cached tokens: chunked prefill), then one decode step
        over ``decodes`` = ``(slot, last token, cached tokens)``; the last stage's TP rank 0 reports the next token
        of each (joins first; a chunk that does not end its prompt reports one too, which the controller drops)."""
        cache = self.caches[name]
        out: list[int] = []
        if joins:  # one prefill pass, rows right-padded: a row's tokens never attend to its padding (causal),
            # and the padding's K/V beyond the row are overwritten (next chunk, decode) before any mask admits them
            s = max(len(j[1]) for j in joins)
            slots = torch.tensor([j[0] for j in joins], device=self.device)
            last = torch.tensor([len(j[1]) - 1 for j in joins], device=self.device)
            start = torch.tensor([j[2] if len(j) > 2 else 0 for j in joins], dtype=torch.long, device=self.device)
            rows = CacheRows(cache, slots, start, last)
            y = self._pass(name, [list(j[1]) + [0] * (s - len(j[1])) for j in joins], rows)
            if y is not None:  # logits of each row's last token only
                out += y[:, 0].argmax(-1).tolist()
        if decodes:
            slots = torch.tensor([d[0] for d in decodes], device=self.device)
            start = torch.tensor([d[2] for d in decodes], device=self.device)
            y = self._pass(name, [[d[1]] for d in decodes], CacheRows(cache, slots, start))
            if y is not None:
                out += y[:, 0].argmax(-1).tolist()
        if self.pp_rank == self.a.pp - 1 and self.tp_rank == 0:
            self.result_q.put(("exec_done", self.rank, step_id, out))

    def exec_loop(self) -> None:
        while True:
            msg = self.cmd_q.get()
            if msg[0] == "stop":
                return
            try:
                if msg[0] == "step":
                    self.step(*msg[1:])
            except Exception:
                self.result_q.put(("error", self.rank, traceback.format_exc()))


class _nullctx:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _exit_with_parent() -> None:
    """Exit this process as soon as its parent dies (the parent's sentinel becomes ready when it exits)."""
    import multiprocessing as mp
    from multiprocessing.connection import wait

    parent = mp.parent_process()
    if parent is None:
        return

    def watch() -> None:
        wait([parent.sentinel])
        os._exit(1)

    threading.Thread(target=watch, daemon=True, name="hetplan-serve-parent-watch").start()


def worker_main(a: WorkerArgs, cmd_q, swap_q, result_q) -> None:
    """Process entry point: set up, report ``ready``, then serve step and swap commands until ``stop``; then end
    the process with :func:`hetplan.profile.torchparts.exit_rank` (gloo's threads would abort a normal
    interpreter shutdown)."""
    _exit_with_parent()
    try:
        torch.set_num_threads(a.threads)
        if a.device == "cuda":
            torch.cuda.set_device(a.rank % torch.cuda.device_count())
        w = Worker(a, cmd_q, swap_q, result_q)
        w.setup()
        result_q.put(("ready", a.rank, {n: (w.shard_bytes(n), w.kv_bytes(n)) for n in w.host}, os.getpid()))
    except Exception:
        result_q.put(("error", a.rank, traceback.format_exc()))
        return
    swapper = threading.Thread(target=w.swap_loop, daemon=True)
    swapper.start()
    w.exec_loop()
    swapper.join(timeout=10)
    try:
        dist.destroy_process_group()
    except Exception:
        pass
    result_q.close()
    result_q.join_thread()  # every result reaches the engine before the process ends
    exit_rank(0)
