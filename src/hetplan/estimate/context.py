"""Context parallelism (CP): one sequence split over ``cp`` GPUs, and the K/V exchange that attention needs.

**Split.** The sequence of ``s`` tokens is cut into ``2·cp`` equal chunks and rank ``i`` takes chunks ``i`` and
``2·cp - 1 - i``, so that under a causal mask every rank has the same attention work (Megatron-Core
``get_batch_on_this_cp_rank``; Llama 3 paper, Dubey et al. 2024, Sec. 3.3.2). Every layer then works on
``s / cp`` tokens per rank: linear layers, element-wise work and activations are divided by ``cp``; attention
scores each of the rank's ``s / cp`` queries against all ``s`` keys (the full product, no causal discount, as
the dense FLOP count does), i.e. ``cp`` blocks of ``(s/cp) x (s/cp)``.

**K/V exchange** (:data:`KV_EXCHANGES`):

* ``ring`` — Megatron-Core's ring attention (``TEDotProductAttention`` with ``cp_comm_type = "p2p"``; Liu et al.,
  "Ring Attention", ICLR 2024): ``cp - 1`` steps, each sending the rank's current K and V block
  (``2·b·(s/cp)·g·d`` elements per TP rank's ``g/t`` heads) to the next rank while attention runs on the block
  in hand; a step costs ``max(p2p, block attention)``, so only the part of the transfer longer than the block's
  attention is exposed. Backward circulates K, V and their gradients dK, dV (twice the bytes) behind the block's
  backward attention.
* ``allgather`` — Llama 3 (Sec. 3.3.2) and torchtitan (PyTorch ``context_parallel``, rotate method
  ``allgather``): K and V are all-gathered over the CP group before attention (not overlapped: with GQA's few
  K/V heads it is small), and dK, dV reduce-scattered in backward.

**Gradients** of every parameter are reduced over ``dp·cp`` ranks (each CP rank saw part of every sequence):
:attr:`hetplan.degrees.Degrees.dense_dp`. CP members sit ``t`` GPUs apart (Megatron-LM rank order TP, CP, DP).

All functions broadcast over numpy arrays. Seconds, bytes, bytes/s.
"""

from __future__ import annotations

import numpy as np

from hetplan.errors import HetplanError
from hetplan.estimate.comm import group_collective_time_s
from hetplan.estimate.stagework import Link
from hetplan.model import counts
from hetplan.model.spec import ModelSpec
from hetplan.estimate.arrays import Array

KV_EXCHANGES = ("ring", "allgather")
#: Bytes per K/V element exchanged (bf16).
KV_BYTES = 2


def check_kv_exchange(kind: str) -> str:
    """Return ``kind`` if it is one of :data:`KV_EXCHANGES`.

    Raises:
        HetplanError: unknown kind (field ``job.cp_kv_exchange``).
    """
    if kind not in KV_EXCHANGES:
        raise HetplanError(f"unknown K/V exchange {kind!r}", field="job.cp_kv_exchange",
                           fix="use 'ring' (Megatron-Core p2p) or 'allgather' (Llama 3 / torchtitan)")
    return kind


def local_seq_len(s: Array, cp: Array):
    """Tokens of one sequence on each CP rank, ``s / cp``."""
    return np.asarray(s, dtype=float) / np.asarray(cp, dtype=float)


def attention_blocks(cp: Array, load_balance: Array = True):
    """Causal attention work of the busiest CP rank in units of a causal ``(s/cp) x (s/cp)`` block (about half a
    block's work): its own diagonal block, computed causally, and half-blocks without a mask
    (:func:`hetplan.estimate.compute.layer_time_s`): ``cp`` with load balancing
    (every rank the same, module doc); without it, ``2·cp - 1``: rank ``cp - 1`` holds the last chunk and attends
    to its own block causally and to the ``cp - 1`` earlier blocks in full, ``2 - 1/cp`` times the balanced share,
    and every rank waits for it (PyTorch's ring attention without load balancing skips only the blocks of later
    ranks: ``_is_causal_behavior`` in ``torch/distributed/tensor/experimental/_attention.py``)."""
    cp = np.asarray(cp, dtype=float)
    return np.where(np.asarray(load_balance), cp, 2.0 * cp - 1.0)


def kv_block_bytes(m: ModelSpec, b: Array, s: Array, t: Array, cp: Array):
    """Bytes of the K and V of one rank's ``s/cp`` tokens on one TP rank: ``2·b·(s/cp)·(g·d_qk + g·d_v)/t``
    (for MLA, K and V after the up-projection: ``a`` heads)."""
    return KV_BYTES * np.asarray(b, dtype=float) * local_seq_len(s, cp) * (m.kv_dim + m.v_dim) / t


def layer_activation_bytes(m: ModelSpec, b: Array, s: Array, t: Array, cp: Array, sequence_parallel: Array = False,
                           recompute: Array = "none",
                           attention: str = "standard", moe_recompute: Array = False, expert_tp: Array = 1):
    """Activation bytes of one layer per GPU under CP: :func:`hetplan.model.counts.layer_activation_bytes` of
    the local ``s/cp`` tokens, with the stored attention scores of standard attention widened from
    ``(s/cp)²`` to ``(s/cp)·s`` per head (``cp`` blocks; FlashAttention stores none); ``moe_recompute`` and
    ``expert_tp`` as there."""
    s_loc = local_seq_len(s, cp)
    per_rank = counts.layer_activation_bytes(m, b, s_loc, t, sequence_parallel, recompute, attention, moe_recompute,
                                             expert_tp)
    if attention == "flash" or recompute in ("selective", "full"):
        return per_rank
    blocks = counts.layer_activation_bytes(m, b, s_loc, t, sequence_parallel, "selective", attention, moe_recompute,
                                           expert_tp)
    return np.where(np.asarray(cp) == 1, per_rank, blocks + (per_rank - blocks) * np.asarray(cp, dtype=float))


def kv_exchange_time_s(m: ModelSpec, b: Array, s: Array, t: Array, cp: Array, kind: str, block_forward_s: Array,
                       link: Link):
    """Exposed K/V exchange of one layer, ``(forward_s, backward_s)`` (module doc); 0 for ``cp = 1``.

    Args:
        block_forward_s: forward attention time of one ``(s/cp) x (s/cp)`` block (the ring overlaps a step's
            transfer with it; its backward is taken as 2x).
        link: the stage's :class:`hetplan.estimate.stagework.Link` (bandwidths, the fractions NCCL reaches,
            per-step latencies). The CP group is ``t`` GPUs apart, inside a node if ``t·cp <= G`` (NVLink), else
            each ring step crosses the node's NICs shared by its G GPUs.
    Raises:
        HetplanError: unknown ``kind``.
    """
    check_kv_exchange(kind)
    cp = np.asarray(cp, dtype=float)
    block = kv_block_bytes(m, b, s, t, cp)
    if kind == "allgather":
        gathered = block * cp
        one = group_collective_time_s(gathered, "allgather", cp, t, link, nic_sharers=link.gpus_per_node)
        fwd, bwd = one, one  # backward: reduce-scatter of dK, dV, same volume
    else:
        g = link.gpus_per_node
        inside = np.asarray(t) * cp <= g
        bw = np.where(inside, link.intra_node_bandwidth_bytes_per_s * link.intra_link_efficiency,
                      link.inter_node_bandwidth_bytes_per_s / g * link.inter_link_efficiency)
        alpha = np.where(inside, link.intra_node_alpha_s, link.inter_node_alpha_s)
        step = block / bw + alpha
        fwd = (cp - 1) * np.maximum(step - block_forward_s, 0.0)
        bwd = (cp - 1) * np.maximum(2 * step - 2 * block_forward_s, 0.0)
    return np.where(cp > 1, fwd, 0.0), np.where(cp > 1, bwd, 0.0)
