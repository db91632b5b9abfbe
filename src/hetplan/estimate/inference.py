"""Serving costs from the training cost model: prefill, decode steps, KV-cache bytes, weight bytes per worker.

One cost model (docs/serving.md, "One cost model"): every time here is assembled from the functions that cost a
training forward pass, so serving and training agree on the same shape.

* **Prefill** of ``b`` prompts of ``s`` tokens on TP ``t`` × PP ``p``: the forward pass of training —
  ``L · layer_time_s(b, s, t).forward`` (:func:`hetplan.estimate.compute.layer_time_s`: shape-aware GEMM roofline,
  element-wise passes, kernel launch floor, two TP all-reduces per layer from :mod:`hetplan.estimate.comm`) plus the
  embedding and the logits GEMM of the last token only (a server samples from the last position), plus ``p - 1``
  p2p sends of the ``b·s·h`` hidden states between stages. One request's pass goes through the stages one after
  another, so PP does not shorten it. Compute-bound for long prompts.
* **Decode step** over ``b`` running sequences holding ``n_kv`` cached tokens in all: the same forward with one
  new token per sequence (``layer_time_s(b, 1, t)``; its GEMMs have ``M = b`` rows, so they are memory-bound and
  read every weight once, the roofline's byte term), plus the attention over the cache, which reads the K and V of
  the ``n_kv`` cached tokens: ``max(4 · n_kv · q_dim / t FLOPs / peak, 2 · n_kv · kv_dim / t · bytes / HBM)`` per
  layer (Pope et al. 2023, "Efficiently Scaling Transformer Inference", Sec. 2: decode is bound by weight and KV
  loads). It is flat in the context length until the KV bytes rival the weights.
* **KV-cache bytes** of one worker: ``L_stage · tokens · (kv_dim + v_dim) / t · dtype bytes`` (keys and values of
  its layers and its ``g/t`` key/value heads); a multi-head latent attention model under an engine that caches the
  latent (``EngineSpec.mla_latent_cache``): ``L_stage · tokens · (kv_lora_rank + qk_rope_head_dim) · dtype bytes``,
  whole on every TP rank (:func:`kv_elements_per_token`).
* **Weight bytes** of each worker: the training memory model's parameters of its stage
  (:func:`hetplan.estimate.memory.stage_parameters`) divided by ``t``, times the dtype size — the bytes a swap
  moves.

**Engines** (:mod:`hetplan.hardware.engines`). With ``engine=None`` the costs above are those of the training
forward (standard attention, every kernel launched from the host). With an :class:`EngineSpec` the same functions
price what that serving engine runs (docs/serving.md, "The engine model"):

* *launches*: a decode step that replays a CUDA graph (vLLM, SGLang, TGI: batch padded to the next captured size
  of ``cuda_graph_batch_sizes``) or a compiled engine (TensorRT-LLM) pays one launch per step, not
  ``kernel_overhead_s`` per kernel: the layers run with the training estimator's CUDA-graph switch
  (:func:`hetplan.estimate.compute.layer_time_s` ``cuda_graphs=True``); eager engines, prefills of engines without
  prefill graphs and batches above the largest capture keep the per-kernel host floor;
* *decode GEMMs*: ``M`` = the running batch pays its padding to the tensor cores' MMA row tile
  (:func:`mma_row_tile`, ``compute.gemm_time_s(row_tile=)``) instead of the training fit's φ(M), fitted on
  ``M = b·s >= 2,048``: a small batch is memory-bound, and narrow weights shorten it;
* *memory-bound kernels* at ``EngineSpec.hbm_efficiency`` of the HBM peak (:func:`_engine_gpu`);
* *attention*: fused causal flash attention (``attention="flash"``) at the measured rate of the kernel the engine
  runs on that GPU generation (FlashAttention-2/-3, FlashInfer, TensorRT-LLM FMHA: ``EngineSpec.attention``);
  decode attention reads the paged K/V at the HBM bandwidth (above);
* *weights*: ``weights`` = bf16 / fp16 / fp8 / int8 / int4: the layers' weight bytes at that size (the embedding
  and the head stay 16-bit, as FP8/INT4 checkpoints keep them), their GEMMs on FP8 tensor cores where the engine
  runs W8A8 FP8 on that generation, else 16-bit GEMMs reading the narrow weights (weight-only, W8A16 / W4A16);
  unsupported combinations raise naming ``quantization``;
* *KV cache*: ``kv_dtype`` (fp8 halves the K/V bytes) and the engine's memory budget in blocks
  (:func:`kv_capacity_tokens`, :func:`max_num_seqs`);
* *TP all-reduces*: the release's algorithm (``EngineSpec.tp_allreduce``): NCCL's ring, or the one-/two-shot
  custom all-reduce over NVLink peer memory (:func:`hetplan.estimate.comm.custom_allreduce_time_s`);
* *decode K/V reads*: a GQA model's cache is read once per key/value head, or once per query head where the
  release's decode kernel does not share the group's loads (``EngineSpec.decode_kv_reads``);
* *per-step overhead*: ``EngineSpec.step_overhead_s`` of host time (scheduling, input preparation, sampling)
  once per engine step.

This module does not import torch.
"""

from __future__ import annotations

from typing import Sequence

from hetplan.errors import HetplanError, InfeasibleError
from hetplan.estimate.comm import p2p_time_s
from hetplan.estimate.compute import (attention_gemm_times_s, attention_linear_shapes, embedding_time_s, gemm_time_s,
                                      layer_time_s, mlp_linear_shapes)
from hetplan.estimate.memory import stage_parameters
from hetplan.estimate.stagework import LayerTerms, Link
from hetplan.hardware.catalog import GPUSpec
from hetplan.hardware.engines import WEIGHT_DTYPE_BYTES, EngineSpec
from hetplan.model.spec import ModelSpec
from hetplan.plan import layer_ranges

#: Bytes per element of the serving dtypes (activations; ``fp8`` only for the KV cache).
DTYPE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2, "fp8": 1}


def dtype_bytes(dtype: str) -> int:
    """Bytes per element of ``dtype``.

    Raises:
        HetplanError: unknown dtype.
    """
    if dtype not in DTYPE_BYTES:
        raise HetplanError(f"unknown dtype {dtype!r}", field="dtype", fix=f"use one of {', '.join(DTYPE_BYTES)}")
    return DTYPE_BYTES[dtype]


def check_tp(m: ModelSpec, tp: int, engine: EngineSpec | None = None) -> None:
    """Heads, key/value heads and MLP width must split over ``tp`` ranks (Megatron-LM sharding). Under a serving
    ``engine`` a TP degree that is a multiple of the key/value heads replicates them instead, one per rank (vLLM
    ``vllm/model_executor/layers/linear.py`` ``QKVParallelLinear``: ``num_kv_head_replicas = tp_size //
    total_num_kv_heads``, which SGLang's layers share; TensorRT-LLM ``max(num_kv_heads // tp, 1)``): an MQA model
    serves at any TP; hetplan's own engine (``engine=None``) splits them.

    Raises:
        HetplanError: one of them is not divisible by ``tp`` (and, under an engine, the key/value heads neither
            divide ``tp``).
    """
    g = m.num_kv_heads
    replicated = engine is not None and tp > g and tp % g == 0
    for what, n in (("num_attention_heads", m.num_attention_heads), ("num_kv_heads", g),
                    ("ffn_hidden_size", m.ffn_hidden_size)):
        if n % tp and not (what == "num_kv_heads" and replicated):
            raise HetplanError(f"{what} = {n} of model {m.name} is not divisible by TP = {tp}", field="tp",
                               fix=f"choose a TP degree that divides {n}" + (
                                   f" (or, for the key/value heads, a multiple of {g}: an engine replicates them)"
                                   if what == "num_kv_heads" and engine is not None else ""))


def kv_heads_per_rank(m: ModelSpec, tp: int) -> int:
    """Key/value heads one of ``tp`` ranks holds: ``g / t``, or one, replicated, where ``t`` exceeds ``g``
    (:func:`check_tp`)."""
    return max(m.num_kv_heads // tp, 1)


def _stages(m: ModelSpec, pp: int) -> list[tuple[int, int]]:
    if pp > m.num_layers:
        raise HetplanError(f"PP = {pp} exceeds the {m.num_layers} layers of {m.name}", field="pp",
                           fix="use at most one pipeline stage per layer")
    return layer_ranges(m.num_layers, pp)


def weight_bytes_per_worker(m: ModelSpec, tp: int, pp: int, dtype: str = "fp16",
                            weights: str | None = None, engine: EngineSpec | None = None) -> list[int]:
    """Weight bytes of each worker in rank order (rank = pp_rank · TP + tp_rank): its stage's parameters as the
    training memory model counts them, divided over TP, times the dtype size; ``weights`` (fp8 / int8 / int4 ...,
    default ``dtype``): the layers' weights at that size, the embedding and head at ``dtype``'s. Key/value heads
    an ``engine`` replicates over TP (:func:`check_tp`) add their projections' share on each rank.

    Raises:
        HetplanError: TP does not divide the model, PP exceeds the layers, unknown dtype.
    """
    check_tp(m, tp, engine)
    nb = dtype_bytes(dtype)
    wb = _weight_bytes(weights or dtype)
    # per layer: the K and V projections of the rank's kv_heads_per_rank heads, beyond their 1/tp share
    replicated = m.hidden_size * (m.kv_dim + m.v_dim) * (kv_heads_per_rank(m, tp) / m.num_kv_heads - 1 / tp)
    out = []
    for i, (a, b) in enumerate(_stages(m, pp)):
        params = float(stage_parameters(m, b - a, i == 0, i == pp - 1, pp == 1))
        rest = float(stage_parameters(m, 0, i == 0, i == pp - 1, pp == 1))
        out += [int(round(((params - rest) * wb + rest * nb) / tp + (b - a) * replicated * wb))] * tp
    return out


def _weight_bytes(weights: str) -> float:
    if weights not in WEIGHT_DTYPE_BYTES:
        raise HetplanError(f"unknown weight dtype {weights!r}", field="quantization",
                           fix=f"use one of {', '.join(WEIGHT_DTYPE_BYTES)}")
    return WEIGHT_DTYPE_BYTES[weights]


def caches_latent(m: ModelSpec, engine: EngineSpec | None) -> bool:
    """Whether ``engine`` caches ``m``'s multi-head latent attention latent (``EngineSpec.mla_latent_cache`` and an
    MLA model); hetplan's own engine (``engine=None``) caches the up-projected keys and values."""
    return bool(m.is_mla and engine is not None and engine.mla_latent_cache)


def kv_elements_per_token(m: ModelSpec, tp: int, engine: EngineSpec | None = None) -> int:
    """Cache elements one TP rank holds per token and layer: the keys and values of its key/value heads
    (:func:`kv_heads_per_rank`), ``(kv_dim + v_dim) / t`` where ``t`` divides them; or, where ``engine`` caches
    MLA's latent (:func:`caches_latent`), the compressed latent and the shared rotary key, ``kv_lora_rank + qk_rope_head_dim``, the same on every TP rank (DeepSeek-V2,
    Liu et al. 2024, Sec. 2.1.2: 576 for DeepSeek-V2/V3 against 40,960 up-projected; vLLM
    ``vllm/v1/attention/backends/mla/common.py``, SGLang ``MLATokenToKVPool``, TensorRT-LLM's compressed KV)."""
    if caches_latent(m, engine):
        return m.kv_lora_rank + m.qk_rope_head_dim
    return (m.kv_dim + m.v_dim) // m.num_kv_heads * kv_heads_per_rank(m, tp)


def kv_cache_bytes_per_worker(m: ModelSpec, tokens: int, tp: int, pp: int, dtype: str = "fp16",
                              engine: EngineSpec | None = None) -> list[int]:
    """KV-cache bytes of each worker (rank order) holding ``tokens`` cached tokens: its stage's layers times
    :func:`kv_elements_per_token` under ``engine``."""
    check_tp(m, tp, engine)
    per_layer = tokens * kv_elements_per_token(m, tp, engine) * dtype_bytes(dtype)
    return [(b - a) * per_layer for a, b in _stages(m, pp) for _ in range(tp)]


def _pipeline_p2p_s(m: ModelSpec, gpu: GPUSpec, tokens: int, pp: int, nb: int) -> float:
    if pp == 1:
        return 0.0
    link = Link.one_node(gpu.gpu_link_bandwidth_bytes_per_s)  # the replica's stages share a node
    return (pp - 1) * float(p2p_time_s(tokens * m.hidden_size * nb, link.intra_node_bandwidth_bytes_per_s,
                                       link.intra_node_alpha_s, efficiency=link.intra_link_efficiency))


def _engine_gpu(gpu: GPUSpec, engine: EngineSpec) -> GPUSpec:
    """``gpu`` running ``engine``'s attention kernel (its measured rate class, :data:`KERNEL_RATE_CLASS`), its
    memory-bound kernels at ``engine.hbm_efficiency`` of the HBM peak bandwidth."""
    return gpu.model_copy(update={"attention_kernel": engine.attention_rate_kernel(gpu),
                                  "hbm_bandwidth_bytes_per_s": gpu.hbm_bandwidth_bytes_per_s * engine.hbm_efficiency})


def _forward_s(m: ModelSpec, gpu: GPUSpec, dtype: str, b: int, s: int, tp: int, engine: EngineSpec | None = None,
               weights: str | None = None, prefill: bool = True) -> float:
    """Embedding, L layers (with their TP all-reduces) and the last position's logits of one forward pass.

    ``engine`` None: the training forward (standard attention, per-kernel launches). Else the engine's path
    (module docstring): launches per its decode path, its attention kernel, ``weights`` at their size and GEMM
    dtype; a captured decode batch is padded to the captured size."""
    link = Link.one_node(gpu.gpu_link_bandwidth_bytes_per_s)
    if engine is None:
        layer_fwd = float(layer_time_s(m, gpu, dtype, b, s, tp, 0, LayerTerms(link))[0])
        emb = float(embedding_time_s(m, gpu, b, s, tp)[0])
        logits = float(gemm_time_s(gpu, dtype, b, m.padded_vocab_size() / tp, m.hidden_size))
        return m.num_layers * layer_fwd + emb + logits
    w = weights or dtype
    g = _engine_gpu(gpu, engine)
    gemm_dtype = engine.gemm_dtype(w, gpu)
    launches = engine.launches_per_kernel(b, prefill)
    if not prefill and not launches and engine.graph_batch_size(b) is not None:
        b = int(engine.graph_batch_size(b))  # the replayed graph runs the padded batch
    wb = _weight_bytes(w)
    tokens = b * s
    shapes = attention_linear_shapes(m, tokens, tp) + mlp_linear_shapes(m, tokens, m.ffn_hidden_size, tp)
    tile = None if prefill else mma_row_tile(gpu)
    linear = sum(float(gemm_time_s(g, gemm_dtype, M, N, K, weight_bytes=wb, row_tile=tile)) for M, N, K in shapes)
    core = float(attention_gemm_times_s(m, g, dtype, b, s, tp)[1])
    terms = LayerTerms(link, attention="flash", gemm_times_s=(linear, core), cuda_graphs=not launches,
                       tp_allreduce=tp_allreduce_algorithm(engine, gpu, tp))
    layer_fwd = float(layer_time_s(m, g, gemm_dtype, b, s, tp, 0, terms)[0])
    host = g if launches else g.model_copy(update={"kernel_overhead_s": 0.0})
    emb = float(embedding_time_s(m, host, b, s, tp)[0])
    logits = float(gemm_time_s(g, dtype, b, m.padded_vocab_size() / tp, m.hidden_size))
    graph_launch = 0.0 if launches else gpu.kernel_overhead_s  # one graph launch / engine enqueue per pass
    return m.num_layers * layer_fwd + emb + logits + graph_launch


#: The all-reduce algorithm of :func:`hetplan.estimate.comm.allreduce_time_s` each ``EngineSpec.tp_allreduce`` runs.
_TP_ALLREDUCE = {"nccl": "ring", "custom": "custom", "auto": "custom-auto"}


def tp_allreduce_algorithm(engine: EngineSpec, gpu: GPUSpec, tp: int) -> str:
    """The :func:`hetplan.estimate.comm.allreduce_time_s` algorithm of ``engine``'s TP all-reduce on ``gpu``: its
    ``tp_allreduce``, except that the custom kernel needs every pair of the TP ranks linked peer to peer — an
    NVLink (NVSwitch) or Infinity Fabric domain, or just 2 ranks — else NCCL's ring (vLLM
    ``custom_all_reduce.py``: "Custom allreduce is disabled because it's not supported on more than two
    PCIe-only GPUs")."""
    algorithm = _TP_ALLREDUCE[engine.tp_allreduce]
    link = gpu.gpu_link.lower()
    connected = link.startswith("nvlink") or link.startswith("infinity fabric")
    return algorithm if tp <= 2 or connected else "ring"


#: Rows of one tensor-core MMA tile by architecture family: ``mma.sync.m16n8k16`` (Volta to Ada: 16 rows) and
#: Hopper's / Blackwell's warpgroup ``wgmma.m64nNk16`` (64 rows) (NVIDIA PTX ISA, "Warp-level matrix multiply" and
#: "Asynchronous warpgroup level matrix multiply"); CDNA3's MFMA 16 x 16 tiles.
MMA_ROW_TILE = {"Volta": 16, "Turing": 16, "Ampere": 16, "Ada": 16, "Hopper": 64, "Blackwell": 64, "CDNA3": 16}


def mma_row_tile(gpu: GPUSpec) -> int:
    """Rows of the tensor-core tile a decode GEMM is padded to on ``gpu`` (:data:`MMA_ROW_TILE`; default 16)."""
    words = gpu.architecture.split()
    return MMA_ROW_TILE.get(words[0] if words else "", 16)


def _overhead_s(engine: EngineSpec | None) -> float:
    return engine.step_overhead_s if engine is not None else 0.0


def _prefill_gpu_s(m, gpu, dtype, prompt_len, batch, tp, pp, engine, weights) -> float:
    return (_forward_s(m, gpu, dtype, batch, prompt_len, tp, engine, weights, prefill=True)
            + _pipeline_p2p_s(m, gpu, batch * prompt_len, pp, dtype_bytes(dtype)))


def prefill_time_s(m: ModelSpec, gpu: GPUSpec, dtype: str, prompt_len: int, *, batch: int = 1, tp: int = 1,
                   pp: int = 1, engine: EngineSpec | None = None, weights: str | None = None) -> float:
    """Seconds to prefill ``batch`` prompts of ``prompt_len`` tokens (module docstring), with the engine's
    per-step overhead when ``engine`` is given."""
    check_tp(m, tp, engine)
    return _prefill_gpu_s(m, gpu, dtype, prompt_len, batch, tp, pp, engine, weights) + _overhead_s(engine)


def kv_read_time_s(m: ModelSpec, gpu: GPUSpec, dtype: str, kv_tokens: int, tp: int = 1,
                   kv_dtype: str | None = None, queries: int = 1, reads: float = 1.0,
                   engine: EngineSpec | None = None) -> float:
    """Seconds one layer's decode attention takes over ``kv_tokens`` cached tokens on one of ``tp`` ranks: the
    larger of its FLOPs (scores and values, ``4 · queries · n · q_dim / t``) at the ``dtype`` peak and its cache
    reads (:func:`kv_elements_per_token` under ``engine``, ``kv_dtype``, default ``dtype``) from HBM. ``queries``:
    query tokens per cached token read (1 for a decode step; a prefill chunk's length for its attention over the
    chunks before it, the K/V read once per query tile). ``reads``: times each cached byte is read
    (:meth:`EngineSpec.decode_kv_reads`: the query heads per key/value head for a decode kernel that does not
    share a GQA group's loads). A decode step over MLA's latent (:func:`caches_latent`) reads the latent once for
    all heads and attends in its space, the key and value up-projections absorbed: ``2 · (2·d_c + d_r)`` FLOPs per
    head and cached token (scores over ``d_c + d_r``, values over ``d_c``; vLLM ``mla/common.py``'s decode path);
    a prefill chunk up-projects it and attends as multi-head attention (the up-projection GEMM is not priced)."""
    latent = caches_latent(m, engine)
    if latent and queries == 1:
        flops = 2.0 * kv_tokens * (m.num_attention_heads / tp) * (2 * m.kv_lora_rank + m.qk_rope_head_dim)
    else:
        flops = 4.0 * queries * kv_tokens * m.q_dim / tp
    per_token = kv_elements_per_token(m, tp, engine) * (1.0 if latent else reads)
    nbytes = kv_tokens * per_token * dtype_bytes(kv_dtype or dtype)
    return max(flops / (gpu.peak_flops_per_s(dtype) * gpu.compute_efficiency), nbytes / gpu.hbm_bandwidth_bytes_per_s)


def window_tokens(m: ModelSpec, contexts: Sequence[float]) -> float:
    """Cached tokens a sliding-window layer of ``m`` attends to over sequences holding ``contexts`` tokens each:
    ``Σ min(c, w)``. Every engine's decode kernel reads only the window (FlashAttention's ``window_size`` in vLLM's
    FlashAttention backend, FlashInfer's ``window_left`` in SGLang, TensorRT-LLM's ``max_attention_window``, the
    sliding-window cache of transformers' ``HybridCache``); what the engines *allocate* for those layers differs
    and is not modelled (:func:`kv_cache_bytes_per_worker` keeps every token: an upper bound)."""
    w = m.sliding_window
    return float(sum(min(float(c), w) for c in contexts)) if m.sliding_window_layers else float(sum(contexts))


def window_read_s(m: ModelSpec, gpu: GPUSpec, dtype: str, tokens: float, *, tp: int = 1,
                  engine: EngineSpec | None = None, kv_dtype: str | None = None) -> float:
    """Seconds the sliding-window layers' decode attention spends over ``tokens`` cached tokens (all sequences;
    :func:`window_tokens`), 0 for a model without such layers; linear in ``tokens`` (:func:`kv_read_time_s`)."""
    if not m.sliding_window_layers:
        return 0.0
    g = gpu if engine is None else _engine_gpu(gpu, engine)
    reads = 1.0 if engine is None else engine.decode_kv_reads(m.num_attention_heads, m.num_kv_heads)
    return m.sliding_window_layers * kv_read_time_s(m, g, dtype, tokens, tp, kv_dtype, reads=reads, engine=engine)


def _kv_layers_s(m, g, dtype, kv_tokens, windowed, tp, kv_dtype, **kw) -> float:
    """The decode (or chunk) attention of every layer: the full layers over ``kv_tokens``, the sliding-window
    layers over ``windowed`` (:func:`window_tokens`)."""
    full = m.num_layers - m.sliding_window_layers
    return (full * kv_read_time_s(m, g, dtype, kv_tokens, tp, kv_dtype, **kw)
            + (m.sliding_window_layers * kv_read_time_s(m, g, dtype, windowed, tp, kv_dtype, **kw)
               if m.sliding_window_layers else 0.0))


def _decode_gpu_s(m, gpu, dtype, batch, kv_tokens, tp, pp, engine, weights, kv_dtype, windowed=None) -> float:
    """``windowed``: the tokens the window layers read (default: ``batch`` sequences of the mean context)."""
    if batch == 0:
        return 0.0
    g = gpu if engine is None else _engine_gpu(gpu, engine)
    reads = 1.0 if engine is None else engine.decode_kv_reads(m.num_attention_heads, m.num_kv_heads)
    if windowed is None:
        windowed = batch * min(kv_tokens / batch, m.sliding_window) if m.sliding_window_layers else kv_tokens
    return (_forward_s(m, gpu, dtype, batch, 1, tp, engine, weights, prefill=False)
            + _kv_layers_s(m, g, dtype, kv_tokens, windowed, tp, kv_dtype, reads=reads, engine=engine)
            + _pipeline_p2p_s(m, gpu, batch, pp, dtype_bytes(dtype)))


def decode_step_time_s(m: ModelSpec, gpu: GPUSpec, dtype: str, batch: int, kv_tokens: int, *, tp: int = 1,
                       pp: int = 1, engine: EngineSpec | None = None, weights: str | None = None,
                       kv_dtype: str | None = None) -> float:
    """Seconds for one decode step of ``batch`` sequences holding ``kv_tokens`` cached tokens in all (with the
    engine's per-step overhead when ``engine`` is given)."""
    if batch == 0:
        return 0.0
    check_tp(m, tp, engine)
    return _decode_gpu_s(m, gpu, dtype, batch, kv_tokens, tp, pp, engine, weights, kv_dtype) + _overhead_s(engine)


def chunk_context_time_s(m: ModelSpec, gpu: GPUSpec, dtype: str, chunk_lens: Sequence[int],
                         contexts: Sequence[int], *, tp: int = 1, engine: EngineSpec | None = None,
                         kv_dtype: str | None = None) -> float:
    """Seconds the prefill chunks ``chunk_lens`` spend attending to the tokens cached before them (``contexts``,
    one per chunk; chunked prefill, Agrawal et al. 2024, "Sarathi-Serve", Sec. 4): per layer and chunk,
    :func:`kv_read_time_s` over its context with the chunk's tokens as queries. A whole prompt (context 0)
    costs nothing here: its causal attention is in the prefill pass."""
    g = gpu if engine is None else _engine_gpu(gpu, engine)
    return sum(_kv_layers_s(m, g, dtype, int(p), window_tokens(m, [p]), tp, kv_dtype, queries=int(c), engine=engine)
               for c, p in zip(chunk_lens, contexts) if p > 0 and c > 0)


def step_time_s(m: ModelSpec, gpu: GPUSpec, dtype: str, prefill_lens: Sequence[int], decode_contexts: Sequence[int],
                *, tp: int = 1, pp: int = 1, engine: EngineSpec | None = None, weights: str | None = None,
                kv_dtype: str | None = None, prefill_contexts: Sequence[int] | None = None) -> float:
    """One engine iteration: one prefill pass over the joining requests' prompts or prompt chunks
    (``prefill_lens``, right-padded to the longest, as the engine runs them; ``prefill_contexts``: tokens already
    cached before each chunk, whose attention :func:`chunk_context_time_s` adds) and one decode step over the
    running requests (``decode_contexts``: tokens each holds in the cache); the engine's per-step overhead once."""
    if not prefill_lens and not decode_contexts:
        return 0.0
    check_tp(m, tp, engine)
    t = (_prefill_gpu_s(m, gpu, dtype, max(prefill_lens), len(prefill_lens), tp, pp, engine, weights)
         if prefill_lens else 0.0)
    if prefill_contexts:
        t += chunk_context_time_s(m, gpu, dtype, prefill_lens, prefill_contexts, tp=tp, engine=engine,
                                  kv_dtype=kv_dtype)
    return t + _decode_gpu_s(m, gpu, dtype, len(decode_contexts), int(sum(decode_contexts)), tp, pp, engine,
                             weights, kv_dtype, window_tokens(m, decode_contexts)) + _overhead_s(engine)


def activation_peak_bytes(m: ModelSpec, tp: int, tokens: int, seqs: int, dtype: str = "bf16") -> int:
    """Peak activation and workspace bytes of one worker during the engine's memory profile run: the largest live
    tensors of one layer's forward over ``tokens`` tokens — the residual stream and its normalised copy
    (``2·h``), the fused gate/up output and the activated MLP input (``3·f/t`` for SwiGLU, ``2·f/t`` otherwise) —
    at ``dtype``, plus the fp32 logits of ``seqs`` sequences over the rank's ``V/t`` vocabulary for sampling.
    vLLM sizes its KV cache after exactly such a run (``profile_run``: a dummy forward of
    ``max_num_batched_tokens`` tokens, then a dummy sampler run over ``max_num_seqs`` logits;
    ``vllm/v1/worker/gpu_model_runner.py``); SGLang and TensorRT-LLM reserve the same workspace before the pool."""
    mlp = (3 if m.gated_mlp else 2) * m.ffn_hidden_size / tp
    act = tokens * (2 * m.hidden_size + mlp) * dtype_bytes(dtype)
    logits = seqs * m.padded_vocab_size() / tp * 4
    return int(act + logits)


def kv_capacity_tokens(m: ModelSpec, gpu: GPUSpec, engine: EngineSpec, *, tp: int = 1, pp: int = 1,
                       dtype: str = "bf16", weights: str | None = None, kv_dtype: str | None = None,
                       gpu_memory_utilization: float | None = None, max_num_seqs: int | None = None,
                       max_num_batched_tokens: int | None = None) -> int:
    """Tokens of KV cache one replica (TP x PP workers) holds under ``engine``'s memory budget, whole blocks:

    * ``total`` budget (vLLM, SGLang): ``u · memory − weights − activations − non-torch memory`` per worker;
    * ``free`` budget (TensorRT-LLM): ``u · (memory − weights − activations − non-torch memory)``;

    ``u`` = ``gpu_memory_utilization`` (default the engine's), weights from :func:`weight_bytes_per_worker`,
    activations from :func:`activation_peak_bytes` (``max_num_batched_tokens`` tokens, ``max_num_seqs`` logits;
    defaults the engine's), non-torch memory ``EngineSpec.non_torch_memory_bytes``. The budget over the worker's
    K/V bytes per token (:func:`kv_cache_bytes_per_worker`), rounded down to ``kv_block_tokens``; the smallest
    worker's count is the replica's.

    Raises:
        HetplanError: the engine does not run on the GPU's generation (field ``engine``) or not ``weights`` there
            (field ``quantization``); ``gpu_memory_utilization`` outside (0, 1].
        InfeasibleError: the weights and workspace leave no room for one block (field ``gpu``).
    """
    check_tp(m, tp, engine)
    engine.attention_kernel(gpu)  # raises (field engine) where the release does not run on this GPU generation
    w = weights or dtype
    engine.check_weight_dtype(w, gpu)
    u = engine.gpu_memory_utilization if gpu_memory_utilization is None else gpu_memory_utilization
    if not 0 < u <= 1:
        raise HetplanError(f"gpu_memory_utilization = {u} is not a fraction of the GPU memory",
                           field="gpu_memory_utilization", fix="give a number in (0, 1], e.g. 0.9")
    seqs = engine.default_max_num_seqs(gpu) if max_num_seqs is None else max_num_seqs
    tokens = max_num_batched_tokens if max_num_batched_tokens is not None else (engine.max_num_batched_tokens or 2048)
    act = activation_peak_bytes(m, tp, tokens, seqs, dtype)
    per_token = kv_cache_bytes_per_worker(m, 1, tp, pp, kv_dtype or dtype, engine)
    best = None
    for wbytes, kv in zip(weight_bytes_per_worker(m, tp, pp, dtype, w, engine), per_token):
        used = wbytes + act + engine.non_torch_memory_bytes
        budget = (u * gpu.memory_bytes - used) if engine.memory_budget == "total" else u * (gpu.memory_bytes - used)
        n = int(budget // kv) if budget > 0 else 0
        best = n if best is None else min(best, n)
    block = max(1, engine.kv_block_tokens)
    n = (best or 0) // block * block
    if n <= 0:
        need = max(weight_bytes_per_worker(m, tp, pp, dtype, w, engine)) / 2**30
        raise InfeasibleError(
            f"{m.name} ({w} weights, {need:.1f} GiB per GPU at TP {tp} x PP {pp}) leaves no KV-cache room on "
            f"{gpu.name} ({gpu.memory_bytes / 2**30:.0f} GiB, {engine.label} budget {u:g})", field="gpu",
            fix="use more TP or PP, narrower weights (quantization), or a GPU with more memory")
    return n


def kv_windowed(m: ModelSpec, engine: EngineSpec | None) -> bool:
    """Whether ``engine`` keeps only the window's KV blocks for ``m``'s sliding-window layers
    (:attr:`~hetplan.hardware.engines.EngineSpec.window_kv_blocks` and a model with such layers)."""
    return bool(engine is not None and engine.window_kv_blocks and m.sliding_window_layers)


def kv_layer_blocks(m: ModelSpec, block_tokens: int, tokens: int, cached: int | None = None,
                    windowed: bool = False) -> int:
    """KV blocks x layers one sequence holds once its cache reaches ``tokens`` tokens, grown from ``cached``
    (default ``tokens - 1``: a decode step): ``L · ceil(tokens / B)`` for ``L`` layers and blocks of ``B`` tokens.
    ``windowed`` (:func:`kv_windowed`): a sliding-window layer (window ``w``) holds only the blocks from the one
    with token ``cached - w`` on, as vLLM V1's ``SlidingWindowManager`` frees the blocks outside the window before
    it allocates a step's new tokens (``remove_skipped_blocks``, then ``allocate_slots``; a chunk's tokens are
    allocated whole, the older ones freed at the next step). Layer-granular: vLLM packs layers into KV cache
    groups of equal size sharing one pool; a group's padding is not counted."""
    b = max(1, block_tokens)
    full = -(-tokens // b)
    if not windowed:
        return m.num_layers * full
    before = tokens - 1 if cached is None else cached
    kept = full - max(0, before - m.sliding_window) // b
    return (m.num_layers - m.sliding_window_layers) * full + m.sliding_window_layers * kept


def max_num_seqs(m: ModelSpec, gpu: GPUSpec, engine: EngineSpec, seq_tokens: int, **kw) -> int:
    """Sequences of ``seq_tokens`` tokens (prompt + output) that run at once under ``engine``: the KV blocks of
    :func:`kv_capacity_tokens` (``kw`` passed on) over the blocks one sequence holds at its end
    (:func:`kv_layer_blocks`: the window's only on a sliding-window layer where the engine frees the rest), capped by
    the engine's ``max_num_seqs`` on this GPU (or ``kw['max_num_seqs']``)."""
    if seq_tokens < 1:
        raise HetplanError(f"a sequence of {seq_tokens} tokens", field="seq_tokens",
                           fix="give the prompt plus output tokens of one sequence, at least 1")
    block = max(1, engine.kv_block_tokens)
    pool = kv_capacity_tokens(m, gpu, engine, **kw) // block * m.num_layers
    per_seq = kv_layer_blocks(m, block, seq_tokens, windowed=kv_windowed(m, engine))
    cap = kw.get("max_num_seqs") or engine.default_max_num_seqs(gpu)
    return max(0, min(cap, pool // per_seq))
