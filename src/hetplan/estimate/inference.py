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
* **KV-cache bytes** of one worker: ``2 · L_stage · tokens · kv_dim / t · dtype bytes`` (keys and values of its
  layers and its ``g/t`` key/value heads).
* **Weight bytes** of each worker: the training memory model's parameters of its stage
  (:func:`hetplan.estimate.memory.stage_parameters`) divided by ``t``, times the dtype size — the bytes a swap
  moves.

This module does not import torch.
"""

from __future__ import annotations

from typing import Sequence

from hetplan.errors import HetplanError
from hetplan.estimate.comm import ALPHA_INTRA_NODE_S, p2p_time_s
from hetplan.estimate.compute import embedding_time_s, gemm_time_s, layer_time_s
from hetplan.estimate.memory import stage_parameters
from hetplan.hardware.catalog import GPUSpec
from hetplan.model.spec import ModelSpec
from hetplan.plan import layer_ranges

#: Bytes per element of the serving dtypes.
DTYPE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2}


def dtype_bytes(dtype: str) -> int:
    """Bytes per element of ``dtype``.

    Raises:
        HetplanError: unknown dtype.
    """
    if dtype not in DTYPE_BYTES:
        raise HetplanError(f"unknown dtype {dtype!r}", field="dtype", fix=f"use one of {', '.join(DTYPE_BYTES)}")
    return DTYPE_BYTES[dtype]


def check_tp(m: ModelSpec, tp: int) -> None:
    """Heads, key/value heads and MLP width must split over ``tp`` ranks (Megatron-LM sharding).

    Raises:
        HetplanError: one of them is not divisible by ``tp``.
    """
    for what, n in (("num_attention_heads", m.num_attention_heads), ("num_kv_heads", m.num_kv_heads),
                    ("ffn_hidden_size", m.ffn_hidden_size)):
        if n % tp:
            raise HetplanError(f"{what} = {n} of model {m.name} is not divisible by TP = {tp}", field="tp",
                               fix=f"choose a TP degree that divides {n}")


def _stages(m: ModelSpec, pp: int) -> list[tuple[int, int]]:
    if pp > m.num_layers:
        raise HetplanError(f"PP = {pp} exceeds the {m.num_layers} layers of {m.name}", field="pp",
                           fix="use at most one pipeline stage per layer")
    return layer_ranges(m.num_layers, pp)


def weight_bytes_per_worker(m: ModelSpec, tp: int, pp: int, dtype: str = "fp16") -> list[int]:
    """Weight bytes of each worker in rank order (rank = pp_rank · TP + tp_rank): its stage's parameters as the
    training memory model counts them, divided over TP, times the dtype size.

    Raises:
        HetplanError: TP does not divide the model, PP exceeds the layers, unknown dtype.
    """
    check_tp(m, tp)
    nb = dtype_bytes(dtype)
    out = []
    for i, (a, b) in enumerate(_stages(m, pp)):
        params = float(stage_parameters(m, b - a, i == 0, i == pp - 1, pp == 1))
        out += [int(round(params / tp * nb))] * tp
    return out


def kv_cache_bytes_per_worker(m: ModelSpec, tokens: int, tp: int, pp: int, dtype: str = "fp16") -> list[int]:
    """KV-cache bytes of each worker (rank order) holding ``tokens`` cached tokens: keys and values of its stage's
    layers and its ``g/t`` key/value heads."""
    check_tp(m, tp)
    nb = dtype_bytes(dtype)
    return [2 * (b - a) * tokens * (m.kv_dim // tp) * nb for a, b in _stages(m, pp) for _ in range(tp)]


def _pipeline_p2p_s(m: ModelSpec, gpu: GPUSpec, tokens: int, pp: int, nb: int) -> float:
    if pp == 1:
        return 0.0
    return (pp - 1) * float(p2p_time_s(tokens * m.hidden_size * nb, gpu.gpu_link_bandwidth_bytes_per_s,
                                       ALPHA_INTRA_NODE_S))


def _forward_s(m: ModelSpec, gpu: GPUSpec, dtype: str, b: int, s: int, tp: int) -> float:
    """Embedding, L layers (with their TP all-reduces) and the last position's logits of one forward pass."""
    layer_fwd = float(layer_time_s(m, gpu, dtype, b, s, tp, 0, gpu.gpu_link_bandwidth_bytes_per_s)[0])
    emb = float(embedding_time_s(m, gpu, b, s, tp)[0])
    logits = float(gemm_time_s(gpu, dtype, b, m.padded_vocab_size() / tp, m.hidden_size))
    return m.num_layers * layer_fwd + emb + logits


def prefill_time_s(m: ModelSpec, gpu: GPUSpec, dtype: str, prompt_len: int, *, batch: int = 1, tp: int = 1,
                   pp: int = 1) -> float:
    """Seconds to prefill ``batch`` prompts of ``prompt_len`` tokens (module docstring)."""
    check_tp(m, tp)
    return _forward_s(m, gpu, dtype, batch, prompt_len, tp) + _pipeline_p2p_s(m, gpu, batch * prompt_len, pp,
                                                                               dtype_bytes(dtype))


def kv_read_time_s(m: ModelSpec, gpu: GPUSpec, dtype: str, kv_tokens: int, tp: int = 1) -> float:
    """Seconds one layer's decode attention takes over ``kv_tokens`` cached tokens on one of ``tp`` ranks: the
    larger of its FLOPs (scores and values, ``4 · n · q_dim / t``) at peak and its K/V reads from HBM."""
    flops = 4.0 * kv_tokens * m.q_dim / tp
    nbytes = 2.0 * kv_tokens * (m.kv_dim / tp) * dtype_bytes(dtype)
    return max(flops / (gpu.peak_flops_per_s(dtype) * gpu.compute_efficiency), nbytes / gpu.hbm_bandwidth_bytes_per_s)


def decode_step_time_s(m: ModelSpec, gpu: GPUSpec, dtype: str, batch: int, kv_tokens: int, *, tp: int = 1,
                       pp: int = 1) -> float:
    """Seconds for one decode step of ``batch`` sequences holding ``kv_tokens`` cached tokens in all."""
    if batch == 0:
        return 0.0
    check_tp(m, tp)
    return (_forward_s(m, gpu, dtype, batch, 1, tp) + m.num_layers * kv_read_time_s(m, gpu, dtype, kv_tokens, tp)
            + _pipeline_p2p_s(m, gpu, batch, pp, dtype_bytes(dtype)))


def step_time_s(m: ModelSpec, gpu: GPUSpec, dtype: str, prefill_lens: Sequence[int], decode_contexts: Sequence[int],
                *, tp: int = 1, pp: int = 1) -> float:
    """One engine iteration: one prefill pass over the joining requests' prompts (``prefill_lens``, right-padded
    to the longest, as the engine runs them) and one decode step over the running requests (``decode_contexts``:
    tokens each holds in the cache)."""
    t = prefill_time_s(m, gpu, dtype, max(prefill_lens), batch=len(prefill_lens), tp=tp, pp=pp) if prefill_lens else 0.0
    return t + decode_step_time_s(m, gpu, dtype, len(decode_contexts), int(sum(decode_contexts)), tp=tp, pp=pp)
