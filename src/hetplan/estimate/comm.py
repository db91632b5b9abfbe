"""Alpha–beta (latency–bandwidth) costs of collectives and point-to-point transfers.

Ring algorithms after Thakur, Rabenseifner & Gropp, "Optimization of Collective Communication Operations in
MPICH" (IJHPCA 2005), Sec. 4: with n ranks, message M bytes per rank and per-rank link bandwidth B,
all-reduce = 2(n-1)/n · M/B + 2(n-1)·α; all-gather and reduce-scatter (M = the full, gathered size) =
(n-1)/n · M/B + (n-1)·α. Hierarchical all-reduce across nodes (reduce-scatter inside the node, all-reduce of
the shard across nodes, all-gather inside the node) follows NCCL's tree/ring-of-rings practice
(Jeaugey, "Massively Scale Your Deep Learning Training with NCCL 2.4", NVIDIA blog 2019).

All functions broadcast over numpy arrays. Times in seconds, sizes in bytes, bandwidths in bytes/s
(unidirectional, per rank).
"""

from __future__ import annotations

import numpy as np

#: Per-message latency inside a node (s): NVLink/PCIe NCCL ring step, order of the NCCL-tests small-message
#: all-reduce latency on DGX A100 (~10 µs for 8 GPUs over 7 steps).
ALPHA_INTRA_NODE_S = 2e-6
#: Per-message latency between nodes (s): InfiniBand/RoCE NCCL step (~5-10 µs, NCCL-tests multi-node).
ALPHA_INTER_NODE_S = 8e-6
#: Fraction of the nominal link bandwidth that NCCL reaches for large messages (NCCL-tests "busbw" on
#: DGX A100: ~230 of 300 GB/s NVLink; ~ 90 % of InfiniBand line rate). One constant for v1.
LINK_EFFICIENCY = 0.8


def allreduce_time_s(message_bytes, n, bandwidth_bytes_per_s, alpha_s=ALPHA_INTRA_NODE_S):
    """Ring all-reduce of ``message_bytes`` over ``n`` ranks (0 when n == 1)."""
    n = np.asarray(n, dtype=float)
    steps = 2.0 * (n - 1.0)
    return np.where(n > 1, steps / n * message_bytes / (bandwidth_bytes_per_s * LINK_EFFICIENCY) + steps * alpha_s, 0.0)


def allgather_time_s(total_bytes, n, bandwidth_bytes_per_s, alpha_s=ALPHA_INTRA_NODE_S):
    """Ring all-gather (or reduce-scatter) whose gathered result is ``total_bytes`` per rank."""
    n = np.asarray(n, dtype=float)
    steps = n - 1.0
    return np.where(n > 1, steps / n * total_bytes / (bandwidth_bytes_per_s * LINK_EFFICIENCY) + steps * alpha_s, 0.0)


def p2p_time_s(message_bytes, bandwidth_bytes_per_s, alpha_s=ALPHA_INTER_NODE_S):
    """One point-to-point send/recv of ``message_bytes``."""
    return message_bytes / (bandwidth_bytes_per_s * LINK_EFFICIENCY) + alpha_s


def dp_collective_time_s(
    message_bytes,
    collective: str,
    dp,
    tp,
    gpus_per_node: int,
    intra_bandwidth_bytes_per_s: float,
    inter_bandwidth_bytes_per_s: float,
):
    """Time of one data-parallel collective of a ``message_bytes`` buffer per rank, placed Megatron-style.

    Placement: TP ranks are innermost (consecutive GPUs), then DP ranks, so ``k = min(dp, max(1, G // tp))``
    members of one DP group share a node and the group spans ``n = ceil(dp / k)`` nodes. Inside the node the
    collective runs on the intra-node link; across nodes on the shard ``M/k``, with all ``min(G, tp·dp)`` GPUs of
    the node driving their own groups through the node's NICs at once, so each gets
    ``B_node / min(G, tp·dp)``.

    Args:
        collective: ``"allreduce"`` or ``"allgather"`` (also used for reduce-scatter, same cost).
    """
    dp = np.asarray(dp, dtype=float)
    tp = np.asarray(tp, dtype=float)
    k = np.minimum(dp, np.maximum(1.0, np.floor(gpus_per_node / tp)))
    nodes = np.ceil(dp / k)
    sharing = np.minimum(gpus_per_node, tp * dp)
    inter_bw = inter_bandwidth_bytes_per_s / sharing
    if collective == "allreduce":
        # reduce-scatter + all-gather inside the node = one intra all-reduce; all-reduce of the shard across nodes.
        intra = allreduce_time_s(message_bytes, k, intra_bandwidth_bytes_per_s, ALPHA_INTRA_NODE_S)
        inter = allreduce_time_s(message_bytes / k, nodes, inter_bw, ALPHA_INTER_NODE_S)
    elif collective == "allgather":
        intra = allgather_time_s(message_bytes, k, intra_bandwidth_bytes_per_s, ALPHA_INTRA_NODE_S)
        inter = allgather_time_s(message_bytes / k, nodes, inter_bw, ALPHA_INTER_NODE_S)
    else:
        raise ValueError(f"unknown collective {collective!r}")
    return intra + inter
