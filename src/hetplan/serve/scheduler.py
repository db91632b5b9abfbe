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

**Paged KV cache** (vLLM's PagedAttention, Kwon et al. SOSP'23, Sec. 4.2-4.5): with ``kv_blocks`` a model's KV
cache is a pool of blocks of ``block_tokens`` tokens (reserved whole while the model is resident: its bytes are
part of the footprint); a sequence holds ``ceil(cached tokens / block_tokens)`` blocks and takes one more when a
decode step crosses a block boundary. A queued request joins while the running batch has fewer than
``max_batch_size`` sequences (vLLM's ``max_num_seqs``) *and* the pool has the blocks of its prefill; so the
memory budget, not a guessed slot count, decides how many sequences run. When a decode step finds no free block,
the most recently joined running sequence is **preempted by recompute** (vLLM's default ``preemption_mode``,
Sec. 4.5): its blocks are freed and it goes back to the head of the queue, to be prefilled again over its prompt
and the tokens it had generated (which it keeps). No new request joins in an iteration that preempted one (vLLM
V0's scheduler does the same). With ``kv_watermark`` w a sequence joins only while ``free blocks - its blocks >=
int(w · pool blocks)`` (vLLM V0's block manager, ``watermark`` = 0.01: vllm/core/block_manager_v1.py
``can_allocate``), so a new prompt does not take the blocks the running batch's next decodes need; decode growth
is not held back. Without ``kv_blocks`` every sequence reserves a whole slot (``max_batch_size``
slots of the longest sequence), the engine's CPU layout. With ``kv_windows`` (an engine that keeps only the
window's blocks on a model's sliding-window layers, vLLM V1's hybrid KV cache manager) the pool is counted in
blocks x layers and a sequence holds :func:`hetplan.estimate.inference.kv_layer_blocks`: the full layers' blocks
of every cached token, the window layers' of the window alone, the older ones freed at the sequence's next step.

**Chunked prefill** (Agrawal et al., "Sarathi-Serve", OSDI'24, Sec. 4; vLLM ``--enable-chunked-prefill``): an
iteration processes at most ``max_batched_tokens`` tokens: one per decoding sequence first, the rest of the budget
to prefills, in running then arrival order; with ``chunked_prefill`` a prompt longer than what is left is split
over iterations (a partly prefilled sequence emits its first token in the iteration that prefills its last
chunk), without it a prompt joins only whole (one longer than the whole budget only into an iteration with no
other prefill). Decodes are never starved by long prompts.

The owner (simulator or engine) calls :meth:`Scheduler.submit` on arrivals, :meth:`swap_done` and
:meth:`exec_done` on completions, and after each of these :meth:`step`, which returns the actions to start now:
:class:`Swap` and :class:`Execute`. Requests of a model being loaded wait in its queue; queued requests of one
model join the running batch in arrival order.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Sequence

from hetplan.errors import HetplanError
from hetplan.estimate.inference import kv_layer_blocks
from hetplan.serve.policies import ModelState, Policy
from hetplan.serve.workload import Request

if TYPE_CHECKING:
    from hetplan.model.spec import ModelSpec


@dataclass
class Swap:
    """Load ``load`` and evict ``evict`` (names), out and in overlapped."""

    load: str
    evict: list[str]


@dataclass
class Chunk:
    """Prefill work of one request in an iteration: ``tokens`` positions after the ``start`` already cached;
    ``last``: it completes the prefill (the iteration then emits the request's next token)."""

    request: Request
    start: int
    tokens: int
    last: bool = True


@dataclass
class Execute:
    """One iteration of model ``model``: the prefill ``chunks`` (of joining, resuming or partly prefilled
    requests) and one decode step for ``decode``; ``preempted`` requests lost their KV cache before it (back in
    the queue).

    ``requests`` are all requests of the iteration (chunks first), ``joined`` those with a prefill chunk, and
    ``emitting`` those that get a token from it (decodes and last chunks)."""

    model: str
    chunks: list[Chunk] = field(default_factory=list)
    decode: list[Request] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)

    @property
    def joined(self) -> list[Request]:
        return [c.request for c in self.chunks]

    @property
    def requests(self) -> list[Request]:
        return self.joined + list(self.decode)

    @property
    def emitting(self) -> list[Request]:
        return [c.request for c in self.chunks if c.last] + list(self.decode)


@dataclass
class _Seq:
    """Scheduler-side state of a sequence holding KV cache: tokens to prefill (``target``: prompt, plus the tokens
    generated before a preemption), tokens cached, tokens generated, blocks held."""

    target: int
    cached: int = 0
    generated: int = 0
    blocks: int = 0


BATCHING = ("continuous", "static")


class Scheduler:
    """Residency, queues and batching (see the module docstring).

    Args:
        models: model name -> (bytes per worker, estimated load time s[, bytes a swap moves: the weights; default
            the bytes per worker]).
        capacity_bytes: weight memory of each worker (bytes).
        policy: a :class:`~hetplan.serve.policies.Policy`.
        max_batch_size: largest running batch per model (requests; KV-cache slots).
        max_queue_len: per-model queue bound; :meth:`submit` refuses beyond it.
        batching: ``"continuous"`` or ``"static"`` (module docstring).
        kv_blocks: model name -> KV blocks of its pool (paged KV cache); ``None``: whole slots.
        block_tokens: tokens per KV block (vLLM's ``--block-size``, 16 by default on CUDA).
        max_batched_tokens: tokens one iteration processes at most (``None``: no bound).
        chunked_prefill: split prompts over iterations to fit ``max_batched_tokens``.
        max_seq_tokens: the longest sequence a request may reach (prompt + new tokens); every pool must hold one.
        kv_watermark: fraction of each pool kept free when a sequence joins (module docstring; 0: none).
        kv_windows: model name -> its :class:`~hetplan.model.spec.ModelSpec`, for the models whose sliding-window
            layers hold only the window's blocks (module docstring); their pools are given in blocks as the others'.

    Raises:
        HetplanError: a model larger than the capacity, a KV pool smaller than one longest sequence, or bad sizes.
    """

    def __init__(self, models: dict[str, tuple[int, float]] | dict[str, tuple[int, float, int]], capacity_bytes: int,
                 policy: Policy, *,
                 max_batch_size: int = 8, max_queue_len: int = 1024, batching: str = "continuous",
                 kv_blocks: dict[str, int] | None = None, block_tokens: int = 16,
                 max_batched_tokens: int | None = None, chunked_prefill: bool = False,
                 max_seq_tokens: int | None = None, kv_watermark: float = 0.0,
                 kv_windows: dict[str, ModelSpec] | None = None):
        if batching not in BATCHING:
            raise HetplanError(f"unknown batching {batching!r}", field="scheduler.batching",
                               fix=f"use one of {', '.join(BATCHING)}")
        if max_batch_size < 1:
            raise HetplanError("max_batch_size must be >= 1", field="scheduler.max_batch_size", fix="give 1 or more")
        if max_queue_len < 1:
            raise HetplanError("max_queue_len must be >= 1", field="scheduler.max_queue_len", fix="give 1 or more")
        for name, (b, *_) in models.items():
            if b > capacity_bytes:
                raise HetplanError(
                    f"model {name} needs {b / 1e9:.3f} GB per worker but a worker has {capacity_bytes / 1e9:.3f} GB",
                    field=f"models.{name}", fix="raise the memory per worker or use more TP x PP workers")
        if block_tokens < 1 or (max_batched_tokens is not None and max_batched_tokens < 1):
            raise HetplanError("block_tokens and max_batched_tokens must be >= 1", field="scheduler.kv_block_tokens",
                               fix="give 1 or more")
        if not 0.0 <= kv_watermark < 1.0:
            raise HetplanError(f"kv_watermark = {kv_watermark} is not a fraction of the pool", field="kv_watermark",
                               fix="give 0 <= kv_watermark < 1 (vLLM V0: 0.01)")
        self.block_tokens = block_tokens
        self.kv_windows = dict(kv_windows or {})
        if kv_blocks is not None:  # a windowed model's pool in blocks x layers
            kv_blocks = {n: nb * self._layers(n) for n, nb in kv_blocks.items()}
        self.watermark_blocks = {n: int(kv_watermark * nb) for n, nb in (kv_blocks or {}).items()}
        if kv_blocks is not None and max_seq_tokens is not None:
            for name, nb in kv_blocks.items():
                if nb - self.watermark_blocks[name] < self._blocks(name, max_seq_tokens, 0):
                    layers = self._layers(name)
                    raise HetplanError(
                        f"the KV cache of model {name} holds {nb // layers:,} blocks of {block_tokens} tokens "
                        f"({nb // layers * block_tokens:,} tokens; {self.watermark_blocks[name] // layers:,} kept "
                        f"free at admission), fewer than one longest sequence of {max_seq_tokens:,} tokens",
                        field="scheduler.kv_cache_len",
                        fix="lower kv_cache_len (max_model_len), give the model more memory or more TP x PP workers")
        if (max_batched_tokens is not None and not chunked_prefill and max_seq_tokens is not None
                and max_batched_tokens < max_seq_tokens):  # vLLM refuses this too (SchedulerConfig._verify_args)
            raise HetplanError(f"max_batched_tokens = {max_batched_tokens:,} is below the longest sequence "
                               f"({max_seq_tokens:,} tokens), which then could never be prefilled (a preempted one "
                               "is prefilled again over its prompt and its tokens)", field="scheduler.max_batched_tokens",
                               fix="raise max_batched_tokens to kv_cache_len or more, or turn chunked_prefill on")
        self.kv_blocks = dict(kv_blocks) if kv_blocks is not None else None
        self.free_blocks = dict(self.kv_blocks or {})
        self.max_batched_tokens = max_batched_tokens
        self.chunked_prefill = chunked_prefill
        self.seqs: dict[int, _Seq] = {}
        self.preemptions = 0
        self.models = {n: ModelState(n, v[0], v[1]) for n, v in models.items()}
        # what a swap moves: the weights (a third item) when given, else the whole footprint
        self.moved_bytes = {n: (v[2] if len(v) > 2 else v[0]) for n, v in models.items()}
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
        """The iteration in flight has finished: its chunks are cached, its emitting requests got one token each;
        ``finished`` requests leave the running batch and free their KV cache."""
        act = self.executing
        assert act is not None
        m = self.models[act.model]
        for c in act.chunks:
            seq = self.seqs[c.request.id]
            seq.cached += c.tokens
            seq.generated += c.last
        for r in act.decode:
            seq = self.seqs[r.id]
            seq.cached += 1
            seq.generated += 1
        done = {r.id for r in finished}
        for rid in done:
            self._free(act.model, rid)
        m.running = [r for r in m.running if r.id not in done]
        m.executing = False
        self.executing = None

    # -- KV blocks ----------------------------------------------------------------------------------------------
    def _layers(self, model: str) -> int:
        """Layers per pool unit of ``model``: its layer count where the pool is counted in blocks x layers."""
        return self.kv_windows[model].num_layers if model in self.kv_windows else 1

    def _blocks(self, model: str, tokens: int, cached: int) -> int:
        """Pool units a sequence of ``model`` holds at ``tokens`` cached tokens, grown from ``cached``."""
        if model not in self.kv_windows:
            return -(-tokens // self.block_tokens)
        return kv_layer_blocks(self.kv_windows[model], self.block_tokens, tokens, cached, windowed=True)

    def _grow(self, model: str, seq: _Seq, tokens: int) -> bool:
        """Give ``seq`` the blocks for ``tokens`` cached positions (a windowed model's sequence also returns the
        blocks that left its window); False (nothing taken) when the pool lacks them."""
        if self.kv_blocks is None:
            return True
        extra = self._blocks(model, tokens, seq.cached) - seq.blocks
        if extra > self.free_blocks[model]:
            return False
        self.free_blocks[model] -= extra
        seq.blocks += extra
        return True

    def _free(self, model: str, rid: int) -> None:
        seq = self.seqs.pop(rid, None)
        if seq is not None and self.kv_blocks is not None:
            self.free_blocks[model] += seq.blocks

    def _preempt(self, m: ModelState, r: Request) -> None:
        """Recompute preemption: free ``r``'s blocks, back to the head of the queue keeping its generated tokens."""
        seq = self.seqs[r.id]
        if self.kv_blocks is not None:
            self.free_blocks[m.name] += seq.blocks
        seq.blocks, seq.cached, seq.target = 0, 0, r.prompt_len + seq.generated
        m.running = [x for x in m.running if x.id != r.id]
        m.queue.appendleft(r)
        self.preemptions += 1

    def _plan(self, m: ModelState) -> Execute:
        """The next iteration of ``m`` (module docstring: decodes, preemptions, chunks, joins)."""
        act = Execute(m.name)
        budget = self.max_batched_tokens if self.max_batched_tokens is not None else float("inf")
        # 1. decodes, oldest first; a decode that needs a block the pool lacks preempts the newest sequence
        gone: set[int] = set()
        for r in list(m.running):
            seq = self.seqs[r.id]
            if r.id in gone or seq.cached < seq.target:
                continue
            while not self._grow(m.name, seq, seq.cached + 1):
                victim = m.running[-1]
                self._preempt(m, victim)
                act.preempted.append(victim)
                gone.add(victim.id)
                if victim is r:
                    break
            if r.id not in gone and budget >= 1:
                act.decode.append(r)
                budget -= 1
        # 2. partly prefilled sequences continue; 3. queued ones join (none after a preemption, none into a
        # static batch that is running)
        for r in m.running:
            seq = self.seqs[r.id]
            if seq.cached < seq.target and budget >= 1:
                budget -= self._chunk(m, act, r, budget)
        if not (act.preempted or (self.batching == "static" and m.running)):
            self._join(m, act, budget)
        if not act.requests and (m.running or act.preempted):
            # nothing could run: partly prefilled sequences hold the whole pool (free the newest), or every
            # sequence was preempted (now the queue may join); each retry frees blocks or admits a request
            if m.running:
                victim = m.running[-1]
                self._preempt(m, victim)
                act.preempted.append(victim)
            nxt = self._plan(m)
            nxt.preempted = act.preempted + nxt.preempted
            return nxt
        return act

    def _join(self, m: ModelState, act: Execute, budget: float) -> None:
        while m.queue and len(m.running) < self.max_batch_size and budget > 0:
            r = m.queue[0]
            seq = self.seqs.get(r.id) or _Seq(r.prompt_len)
            n = seq.target if not self.chunked_prefill else int(min(seq.target, budget))
            if n > budget and act.chunks:  # a whole prompt beyond what is left waits for an iteration of its own
                return
            if (self.kv_blocks is not None
                    and self._blocks(m.name, n, seq.cached) - seq.blocks
                    > self.free_blocks[m.name] - self.watermark_blocks[m.name]):
                return  # the watermark (module docstring)
            if not self._grow(m.name, seq, n):
                return
            self.seqs[r.id] = seq
            m.queue.popleft()
            m.running.append(r)
            act.chunks.append(Chunk(r, 0, n, n == seq.target))
            budget -= n

    def _chunk(self, m: ModelState, act: Execute, r: Request, budget: float) -> int:
        """Schedule the next chunk of partly prefilled ``r``; the tokens it takes (0 when its blocks do not fit)."""
        seq = self.seqs[r.id]
        n = seq.target - seq.cached if budget == float("inf") else min(seq.target - seq.cached, int(budget))
        if n >= 1 and self._grow(m.name, seq, seq.cached + n):
            act.chunks.append(Chunk(r, seq.cached, n, seq.cached + n == seq.target))
            return n
        return 0

    def step(self, now_s: float) -> list[Swap | Execute]:
        """Actions to start now (at most one execution and one swap in flight)."""
        actions: list[Swap | Execute] = []
        if self.executing is None:
            ready = [m for m in self.models.values() if m.state == "resident" and (m.queue or m.running)]
            if ready:
                m = self.policy.pick_execute(ready, now_s)
                act = self._plan(m)
                if act.requests:
                    m.executing, m.last_used_s, m.fresh = True, now_s, False
                    self.executing = act
                    actions.append(act)
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
                        self.bytes_swapped_out += self.moved_bytes[v.name]
                    m.state = "loading"
                    self.swaps += 1
                    self.bytes_swapped_in += self.moved_bytes[m.name]
                    self.swapping = Swap(m.name, [v.name for v in victims])
                    actions.append(self.swapping)
        return actions
