"""Alpha–beta (latency–bandwidth) costs of collectives and point-to-point transfers on a node topology.

**Algorithms** (n ranks, M bytes per rank, per-rank link bandwidth B, per-step latency α):

* ring all-reduce ``2(n-1)/n · M/B + 2(n-1)·α``; ring all-gather / reduce-scatter (M = the full, gathered
  size) ``(n-1)/n · M/B + (n-1)·α`` — Thakur, Rabenseifner & Gropp, "Optimization of Collective Communication
  Operations in MPICH" (IJHPCA 2005), Sec. 4; Patarasuk & Yuan (JPDC 2009) for the ring bandwidth optimum.
* tree all-reduce (NCCL's double binary tree, pipelined): ``2·M/B + 2·⌈log2 n⌉·α`` — Sanders, Speck & Träff
  (Parallel Computing 2009); NCCL 2.4 (Jeaugey, NVIDIA blog 2019). NCCL picks the faster; so do we
  (:func:`allreduce_time_s` with ``algorithm="auto"``).
* p2p ``M/B + α``.
* custom all-reduce (``algorithm="custom"``, :func:`custom_allreduce_time_s`): the serving engines' one-kernel
  all-reduce over NVLink peer memory (vLLM ``csrc/custom_all_reduce.cuh``, TensorRT-LLM's AllReduce plugin, SGLang's
  copies of both): *one-shot* — every rank reads the other ``n-1`` ranks' buffers and reduces them itself,
  ``(n-1)·M/B_c + α_c`` — for 2 ranks, for ``M`` < 512 KiB on up to 4 ranks and < 256 KiB on up to 8;
  *two-shot* — a reduce-scatter then an all-gather through peer memory, ``2(n-1)/n·M/B_c + 2·α_c`` — above;
  NCCL above :data:`CUSTOM_AR_MAX_BYTES` (vLLM ``custom_all_reduce.py`` ``max_size``) or past 8 ranks.

**Topology.** A group of n ranks whose members sit ``stride`` GPUs apart (Megatron-LM's rank order: TP
innermost, then DP, then PP) has ``k = min(n, max(1, G // stride))`` members per node of G GPUs and spans
``N = ceil(n / k)`` nodes. Inside one node the collective runs on the NVLink/PCIe link. Across nodes NCCL runs
flat rings (and, for all-reduce, trees) with one channel per NIC ("rail"): every ring crosses each node boundary
once, so each node's NICs carry the same volume a rank sends — ``2(n-1)/n·M`` for an all-reduce, ``(n-1)/n·M``
for an all-gather / reduce-scatter — while each rank sends that volume on NVLink too; the two links work in a
pipeline, so the time is the larger of the two, not their sum (NCCL's ring model: Jeaugey, "Massively Scale Your
Deep Learning Training with NCCL 2.4", NVIDIA blog 2019; NCCL ``src/graph/tuning.cc``: bus bandwidth = the
slowest link of the ring, latency = intra-node steps x intra latency + inter-node steps x network latency). The
group's share of the node's NICs is ``B_node · k / sharers``: all ``sharers`` GPUs of a node that run such
groups at the same time share the node's rails (with TP 8 inside a node, each DP ring gets one rail). Bus
bandwidth of a multi-node all-reduce, large messages: ``min(B_NVLink·0.77, B_node·0.9)`` — 180 GB/s on DGX A100
(8 x 200 Gb/s HDR) and 346 GB/s on DGX H100 (NVLink-bound; 8 x 400 Gb/s NDR give 360). Published operator
guides expect 400-450 GB/s for H100 + NDR and 250-300 GB/s for A100 + HDR (Saturn Cloud, "Validating Multi-Node
GPU Clusters with NCCL Tests", 2025) — above the rails' line rate, i.e. with in-network reduction (SHARP / NVLS,
which halves the traffic and which this model does not assume; docs/estimator.md, Nodes). Tree all-reduce
(NCCL's double binary tree across nodes, chain inside): the same bandwidth bound with ``2M`` and ``2·log2 N`` network latencies; the faster of ring and tree is taken, as NCCL's tuner does.

**Networks.** ``infiniband`` / ``roce`` / ``efa`` (RDMA) or ``ethernet`` (TCP sockets) between nodes: :data:`NETWORKS`,
:func:`network_terms`.

**Efficiency.** NCCL reaches a fraction of the nominal link rate for large messages: :data:`INTRA_LINK_EFFICIENCY`
(NCCL-tests all-reduce busbw ≈ 230 of 300 GB/s NVLink3 on DGX A100) and :data:`INTER_LINK_EFFICIENCY`
(≈ 90 % of InfiniBand line rate). Latencies :data:`ALPHA_INTRA_NODE_S`, :data:`ALPHA_INTER_NODE_S`. All of them are
``hardware/data/network.toml``'s; the collectives on a node topology (:func:`group_collective_time_s`,
:func:`dp_collective_time_s`, and the MoE all-to-all and CP exchange built on the same terms) read them from the
stage's :class:`hetplan.estimate.stagework.Link`, which the estimator fills from :class:`CommConstants`, so a
calibration's values reach them; the single-link formulas below take them as arguments (default: the file's).

All functions broadcast over numpy arrays. Times in seconds, sizes in bytes, bandwidths in bytes/s
(unidirectional, per rank).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from hetplan.hardware.network import load_network
from hetplan.estimate.arrays import Array

if TYPE_CHECKING:  # the Link module imports this one for its defaults
    from hetplan.estimate.stagework import Link

_NETWORK = load_network()
#: Per-step latency inside a node (s), fitted on vTrain calibration rows (hetplan.calibration.calibrate): 8.8 µs,
#: i.e. ~120 µs for an 8-GPU all-reduce of a small message — above NCCL-tests' bare ~20-30 µs because it also
#: absorbs the launch and the wait for the slowest TP rank in a host-bound training step. This and the constants
#: below are ``hardware/data/network.toml``'s (:func:`hetplan.hardware.network.load_network`, with sources).
ALPHA_INTRA_NODE_S = _NETWORK.alpha_intra_node_s
#: Per-step latency between nodes (s): InfiniBand/RoCE NCCL step (~5-10 µs, NCCL-tests multi-node).
ALPHA_INTER_NODE_S = _NETWORK.alpha_inter_node_s
#: Fraction of the nominal NVLink/PCIe bandwidth NCCL reaches for large messages (busbw / link rate).
INTRA_LINK_EFFICIENCY = _NETWORK.intra_link_efficiency
#: Fraction of the nominal NIC bandwidth NCCL reaches for large messages.
INTER_LINK_EFFICIENCY = _NETWORK.inter_link_efficiency
#: Backwards-compatible single efficiency (v1); used when a caller gives no efficiency.
LINK_EFFICIENCY = INTRA_LINK_EFFICIENCY
#: Inter-node networks (:attr:`hetplan.plan.GPUPool.network`): ``(per-step latency s, fraction of the line rate
#: NCCL reaches for large messages)``. ``infiniband`` and ``roce`` are RDMA: NCCL drives both through its IB verbs
#: transport (GPUDirect RDMA), with :data:`ALPHA_INTER_NODE_S` and :data:`INTER_LINK_EFFICIENCY`; ``efa`` (AWS Elastic
#: Fabric Adapter) is RDMA too, driven through the aws-ofi-nccl plugin with GPUDirect RDMA on p4d/p5 (AWS EC2 P4/P5
#: pages), given the same terms (no public NCCL-tests figure separates it). ``ethernet`` is
#: Ethernet without RDMA, NCCL's socket (TCP) transport: no more than 60 % of wire speed for large messages
#: (NVIDIA/nccl issue #209, nccl-tests all-reduce over 32 Gb/s TCP) and ≈ 40 µs per step (NVIDIA/nccl-tests issue
#: #82: 38–46 µs for an 8-byte broadcast between two hosts over TCP sockets, NCCL 2.9).
NETWORKS = {name: (n.alpha_s, n.efficiency) for name, n in _NETWORK.networks.items()}


#: Time a pipeline stage stands still at each p2p call of an interleaved schedule's extra model chunks (s). Each
#: of the ``v`` chunks of a micro-batch is its own forward / backward call of Megatron-Core's interleaved schedule
#: (``core/pipeline_parallel/schedules.py`` ``forward_backward_pipelining_with_interleaving``) with its own
#: send / receive (``p2p_communication.py``: ``batch_isend_irecv`` or, with ``overlap_p2p_comm``, separate
#: ``isend`` / ``irecv`` whose handles the next chunk waits on) and its own Python step; the GPU waits for the
#: host at each. Fitted by :func:`hetplan.calibration.modern_fit.fit_p2p_call` on the time ratio of GPT-3 175B
#: at VP 12 against VP 6 in the DGX Cloud benchmarks, bf16 and fp8 (2 of 5 jobs; held out: the other 3 and
#: torchtitan's 405B 1F1B-vs-interleaved pair, ratio error 4.07 % without the term, 3.96 % with it, all 7 ordered
#: as measured either way): 0.83 ms (0.98 ms before those GPT-3 runs paid the unfused loss and FlashAttention-2
#: their launches ran, when the held-out pairs went 7.8 -> 6.3 % and 1 -> 7 of 7 ordered), the order of the
#: ≈ 1.2 ms per blocking p2p call seen on vTrain's A100 pipelines (docs/estimator.md, Validation). The term is
#: needed beyond those pairs: without it `dgxc_gb200` is +8.6 % and `llama3_405b` +6.8 % signed (too fast).
P2P_CALL_S = _NETWORK.p2p_call_s
#: Thread blocks (CTAs, one per channel) an NCCL collective kernel occupies while it runs: 24 measured for an
#: ncclAllGather overlapping a GEMM on H100 (NVIDIA developer forum, "Compute-Communication Overlap Causes Severe
#: GEMM Performance Degradation because of Tail Effect", 2025, Nsight Systems trace); NCCL's default upper bound
#: is 32 (``NCCL_MAX_CTAS``, NCCL 2.17+ environment variables).
NCCL_CTAS = _NETWORK.nccl_ctas


@dataclass(frozen=True)
class CommConstants:
    """The communication constants the estimator takes as data (``estimate(..., comm_constants=)``;
    :mod:`hetplan.calibration.calibrate` fits some and passes its trial values, nothing is rewritten in place).
    Defaults: ``hardware/data/network.toml`` (:func:`hetplan.hardware.network.load_network`). The estimator
    builds every stage's :class:`~hetplan.estimate.stagework.Link` from them
    (:func:`hetplan.estimate.estimator.pool_link`), and the stage's collectives read the link: TP and DP
    collectives, the MoE all-to-all, the CP K/V exchange and the pipeline calls."""

    #: Per-step latency of a collective inside a node (s): :data:`ALPHA_INTRA_NODE_S`.
    alpha_intra_node_s: float = ALPHA_INTRA_NODE_S
    #: Stage time per p2p call of an extra model chunk (s): :data:`P2P_CALL_S`.
    p2p_call_s: float = P2P_CALL_S
    #: Per-step latency of a collective between nodes over RDMA (s): :data:`ALPHA_INTER_NODE_S`.
    alpha_inter_node_s: float = ALPHA_INTER_NODE_S
    #: Fractions of the nominal intra- / inter-node bandwidth NCCL reaches (:data:`INTRA_LINK_EFFICIENCY`, ...).
    intra_link_efficiency: float = INTRA_LINK_EFFICIENCY
    inter_link_efficiency: float = INTER_LINK_EFFICIENCY
    #: Thread blocks an NCCL kernel takes from overlapped compute (:data:`NCCL_CTAS`, :func:`overlap_contention`).
    nccl_ctas: int = NCCL_CTAS
    #: A trial factor on the TP collectives' efficiency, on top of the job's stack's ``tp_comm_factor`` (1: none;
    #: :func:`hetplan.calibration.stack_fit.fit_megatron_deepspeed` passes its trials here).
    tp_comm_factor: float = 1.0
    #: ``(network, per-step latency s, line-rate fraction)`` of each inter-node network (:data:`NETWORKS`).
    networks: tuple[tuple[str, float, float], ...] = tuple((k, a, e) for k, (a, e) in NETWORKS.items())

    def network_terms(self, network: str) -> tuple[float, float]:
        """``(bandwidth factor, per-step latency s)`` of ``network`` under these constants (:func:`network_terms`).

        Raises:
            KeyError: unknown network (the pool validator names the allowed ones first).
        """
        alpha, efficiency = {k: (a, e) for k, a, e in self.networks}[network]
        return efficiency / self.inter_link_efficiency, alpha




def overlap_contention(gpu: object, nccl_ctas: int) -> float:
    """Fraction ``ρ`` of ``gpu``'s SMs that a concurrently running NCCL kernel takes from compute:
    ``nccl_ctas / sm_count`` (the stage link's :data:`NCCL_CTAS`; 0 when the catalog gives no SM count). Compute overlapping a collective of ``c``
    seconds runs on the other SMs, so ``w`` seconds of compute overlapped with it take ``max(c, w + ρ·c)``: the
    collective is hidden but costs ``ρ·c`` (the forum trace above shows worse, a GEMM wave split in two)."""
    sms = getattr(gpu, "sm_count", None)
    return 0.0 if not sms else min(1.0, nccl_ctas / sms)


def overlapped_exposed_s(collective_s: Array, compute_s: Array, contention: Array = 0.0):
    """Exposed time of a collective of ``collective_s`` run concurrently with ``compute_s`` of compute it can hide
    behind (s, arrays broadcast): ``max(c - w, ρ·c)`` — what exceeds the compute, and at least the slowdown
    ``ρ·c`` of the compute from the SMs the communication kernel takes (:func:`overlap_contention`)."""
    c = np.asarray(collective_s, dtype=float)
    return np.maximum(c - compute_s, contention * c)


def network_terms(network: str) -> tuple[float, float]:
    """``(bandwidth factor, per-step latency s)`` of an inter-node network under ``network.toml``'s constants
    (:meth:`CommConstants.network_terms`; :data:`NETWORKS`): the factor scales the
    nominal NIC bandwidth to what NCCL reaches on it relative to RDMA (1 for InfiniBand / RoCE), so every cost that
    takes the inter-node bandwidth (and applies :data:`INTER_LINK_EFFICIENCY` or the p2p efficiency itself) sees
    the network's rate.

    Raises:
        KeyError: unknown network (the pool validator names the allowed ones first).
    """
    return CommConstants().network_terms(network)


#: Per-barrier latency of the custom all-reduce kernel (s) and the bandwidth one rank reaches reading its peers'
#: buffers (bytes/s): the intercept and slope of vLLM's kernel on 8 x H100 SXM as measured in sgl-project/sglang
#: pull request #2904 (unit test ``tests/test_trt_reduce.py``, "vllm" table, without CUDA graphs): TP 4 one-shot
#: 32 KiB 9.2 µs / 256 KiB 20.6 µs, two-shot 512 KiB 26.9 µs / 1 MiB 40.2 µs; TP 2 one-shot 256 KiB 12.9 µs / 1 MiB
#: 26.6 µs -> ~7.6 µs per barrier stage, ~58 GB/s per rank (the kernel runs at most 36 thread blocks: its
#: ``block_limit``, so it is issue-bound well below the NVLink rate). Without graphs these include the launch, so
#: inside a captured decode step they are an upper bound.
CUSTOM_AR_ALPHA_S = 7.6e-6
CUSTOM_AR_BANDWIDTH_BYTES_PER_S = 58e9
#: Largest message the custom all-reduce takes (bytes): vLLM ``CustomAllreduce(max_size=8192 * 1024)``; above it
#: (and past 8 ranks) the engines fall back to NCCL.
CUSTOM_AR_MAX_BYTES = 8 * 1024 * 1024


def custom_allreduce_time_s(message_bytes: Array, n: Array, bandwidth_bytes_per_s: Array, alpha_s: Array, *,
                            efficiency: Array):
    """The serving engines' custom all-reduce of ``message_bytes`` over ``n`` ranks of one NVLink domain (module
    doc): one-shot or two-shot by vLLM's size thresholds (``csrc/custom_all_reduce.cuh``: one-shot for 2 ranks,
    below 512 KiB up to 4 ranks, below 256 KiB up to 8), at :data:`CUSTOM_AR_BANDWIDTH_BYTES_PER_S` (or the link's
    rate if lower) and :data:`CUSTOM_AR_ALPHA_S` per barrier stage; NCCL's ring (``alpha_s``, ``efficiency``)
    above :data:`CUSTOM_AR_MAX_BYTES` or beyond 8 ranks. 0 when n == 1."""
    n = np.asarray(n, dtype=float)
    m = np.asarray(message_bytes, dtype=float)
    bw = np.minimum(CUSTOM_AR_BANDWIDTH_BYTES_PER_S, bandwidth_bytes_per_s * efficiency)
    one_shot = (n <= 2) | ((n <= 4) & (m < 512 * 1024)) | ((n <= 8) & (m < 256 * 1024))
    one = (n - 1.0) * m / bw + CUSTOM_AR_ALPHA_S
    two = 2.0 * (n - 1.0) / np.maximum(n, 1.0) * m / bw + 2.0 * CUSTOM_AR_ALPHA_S
    custom = np.where(one_shot, one, two)
    nccl = allreduce_time_s(m, n, bandwidth_bytes_per_s, alpha_s, efficiency=efficiency)
    return np.where(n > 1, np.where((m <= CUSTOM_AR_MAX_BYTES) & (n <= 8), custom, nccl), 0.0)


def allreduce_time_s(message_bytes: Array, n: Array, bandwidth_bytes_per_s: Array, alpha_s: Array, *,
                     efficiency: Array, algorithm: str = "ring"):
    """All-reduce of ``message_bytes`` over ``n`` ranks (0 when n == 1).

    Args:
        algorithm: ``"ring"``, ``"tree"``, ``"auto"`` (the faster of the two, as NCCL's tuner picks),
            ``"custom"`` (the serving engines' one-/two-shot kernel, :func:`custom_allreduce_time_s`, up to its
            size limit, as vLLM uses it) or ``"custom-auto"`` (the faster of the custom kernel and NCCL's ring, as
            TensorRT-LLM's ``AllReduceStrategy.AUTO`` chooses by message size).
    """
    if algorithm in ("custom", "custom-auto"):
        custom = custom_allreduce_time_s(message_bytes, n, bandwidth_bytes_per_s, alpha_s, efficiency=efficiency)
        if algorithm == "custom":
            return custom
        return np.minimum(custom, allreduce_time_s(message_bytes, n, bandwidth_bytes_per_s, alpha_s,
                                                   efficiency=efficiency))
    n = np.asarray(n, dtype=float)
    bw = bandwidth_bytes_per_s * efficiency
    ring = 2.0 * (n - 1.0) / np.maximum(n, 1.0) * message_bytes / bw + 2.0 * (n - 1.0) * alpha_s
    if algorithm == "ring":
        t = ring
    else:
        tree = 2.0 * message_bytes / bw + 2.0 * np.ceil(np.log2(np.maximum(n, 1.0))) * alpha_s
        t = tree if algorithm == "tree" else np.minimum(ring, tree)
    return np.where(n > 1, t, 0.0)


def allgather_time_s(total_bytes: Array, n: Array, bandwidth_bytes_per_s: Array, alpha_s: Array, *,
                     efficiency: Array):
    """Ring all-gather whose gathered result is ``total_bytes`` per rank (0 when n == 1)."""
    n = np.asarray(n, dtype=float)
    steps = n - 1.0
    return np.where(n > 1, steps / np.maximum(n, 1.0) * total_bytes / (bandwidth_bytes_per_s * efficiency)
                    + steps * alpha_s, 0.0)


def reduce_scatter_time_s(total_bytes: Array, n: Array, bandwidth_bytes_per_s: Array, alpha_s: Array, *,
                          efficiency: Array):
    """Ring reduce-scatter of a ``total_bytes`` input per rank: same cost as the all-gather of that size."""
    return allgather_time_s(total_bytes, n, bandwidth_bytes_per_s, alpha_s, efficiency=efficiency)


def p2p_time_s(message_bytes: Array, bandwidth_bytes_per_s: Array, alpha_s: Array, *, efficiency: Array):
    """One point-to-point send/recv of ``message_bytes``."""
    return message_bytes / (bandwidth_bytes_per_s * efficiency) + alpha_s


def group_collective_time_s(message_bytes: Array, collective: str, n: Array, stride: Array, link: Link,
                            nic_sharers: Array = None, algorithm: str = "ring"):
    """One collective of ``n`` ranks placed ``stride`` GPUs apart (module doc, "Topology").

    Args:
        message_bytes: per-rank buffer (all-reduce), or the gathered size (all-gather / reduce-scatter).
        collective: ``"allreduce"``, ``"allgather"`` or ``"reducescatter"``.
        link: the stage's :class:`hetplan.estimate.stagework.Link`: G GPUs per node, the intra-node bandwidth,
            the node's NIC bandwidth (all NICs together), the per-step latencies between and inside nodes and the
            fractions of each bandwidth NCCL reaches (``network.toml``, or a calibration's
            :class:`CommConstants`).
        nic_sharers: GPUs of a node that cross the network at the same time (default ``min(G, stride·n)``).
        algorithm: the all-reduce inside one node (:func:`allreduce_time_s`; ``"custom"``: a serving engine's).
    Raises:
        ValueError: unknown collective.
    """
    n = np.asarray(n, dtype=float)
    stride = np.asarray(stride, dtype=float)
    g = np.asarray(link.gpus_per_node, dtype=float)
    intra_bandwidth_bytes_per_s = link.intra_node_bandwidth_bytes_per_s
    intra_eff, inter_eff = link.intra_link_efficiency, link.inter_link_efficiency
    inter_alpha_s = link.inter_node_alpha_s
    k = np.minimum(n, np.maximum(1.0, np.floor(g / stride)))
    nodes = np.ceil(n / k)
    sharers = np.minimum(g, stride * n) if nic_sharers is None else np.asarray(nic_sharers, dtype=float)
    # NICs of the node that carry this group: its k members' share of the node's rails.
    group_nic = link.inter_node_bandwidth_bytes_per_s * k / np.maximum(sharers, 1.0) * inter_eff
    nvlink = intra_bandwidth_bytes_per_s * intra_eff
    multi = nodes > 1
    alpha_intra = link.intra_node_alpha_s
    if collective == "allreduce":
        single = allreduce_time_s(message_bytes, k, intra_bandwidth_bytes_per_s, alpha_intra,
                                  efficiency=intra_eff, algorithm=algorithm)
        volume = 2.0 * (n - 1.0) / np.maximum(n, 1.0) * message_bytes
        ring = (np.maximum(np.where(k > 1, volume / nvlink, 0.0), volume / group_nic)
                + 2.0 * (n - nodes) * alpha_intra + 2.0 * (nodes - 1.0) * inter_alpha_s)
        chain = np.where(k > 1, 2.0 * message_bytes / nvlink, 0.0)
        tree = (np.maximum(chain, 2.0 * message_bytes / group_nic) + 2.0 * (k - 1.0) * alpha_intra
                + 2.0 * np.ceil(np.log2(np.maximum(nodes, 1.0))) * inter_alpha_s)
        across = np.minimum(ring, tree)
    elif collective in ("allgather", "reducescatter"):
        single = allgather_time_s(message_bytes, k, intra_bandwidth_bytes_per_s, alpha_intra,
                                  efficiency=intra_eff)
        volume = (n - 1.0) / np.maximum(n, 1.0) * message_bytes
        across = (np.maximum(np.where(k > 1, volume / nvlink, 0.0), volume / group_nic)
                  + (n - nodes) * alpha_intra + (nodes - 1.0) * inter_alpha_s)
    else:
        raise ValueError(f"unknown collective {collective!r}")
    return np.where(multi, across, single)


def dp_collective_time_s(message_bytes: Array, collective: str, dp: Array, tp: Array, link: Link):
    """Time of one data-parallel collective of a ``message_bytes`` buffer per rank, placed Megatron-style
    (TP innermost, so DP peers are ``tp`` GPUs apart): :func:`group_collective_time_s` with ``stride = tp``; all
    ``min(G, tp·dp)`` GPUs of a node drive their own DP groups through the node's NICs at once.

    Args:
        collective: ``"allreduce"`` or ``"allgather"`` (also used for reduce-scatter, same cost).
    """
    return group_collective_time_s(message_bytes, collective, dp, tp, link)
