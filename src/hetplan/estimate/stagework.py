"""What one pipeline stage computes and what it runs on: the inputs of :func:`hetplan.estimate.stage.stage_costs`
besides the model, the degrees (:class:`hetplan.degrees.Degrees`) and the options
(:class:`hetplan.estimate.options.TrainingOptions`).

* :class:`StageWork` — its layers, embedding / head, micro-batch and sequence, micro-batches per iteration and in
  flight, recomputation (:class:`Recompute`), ZeRO stage and sequence parallelism;
* :class:`StageHardware` — its GPU (:class:`hetplan.hardware.catalog.GPUSpec`) and the links it sees
  (:class:`Link`);
* :class:`LayerTerms` — how one transformer layer runs (its link, sequence parallelism, attention, the terms a
  MoE / CP / eager caller costs, the TP overlaps): the options of :func:`hetplan.estimate.compute.layer_time_s`.

Like :class:`~hetplan.degrees.Degrees`, the fields of :class:`StageWork` hold scalars (one stage of a plan) or
numpy arrays (thousands of configurations of a search), broadcasting against each other.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import IntEnum
from typing import Any

from hetplan.estimate.arrays import Array

from hetplan.hardware.catalog import GPUSpec
from hetplan.hardware.network import load_network

# The Link's defaults: hardware/data/network.toml's constants, read where estimate.comm reads them (comm takes Link
# in its signatures, so this module reads the data, not comm, and the two do not import each other).
_NET = load_network()
ALPHA_INTRA_NODE_S, ALPHA_INTER_NODE_S = _NET.alpha_intra_node_s, _NET.alpha_inter_node_s
INTRA_LINK_EFFICIENCY, INTER_LINK_EFFICIENCY = _NET.intra_link_efficiency, _NET.inter_link_efficiency
NCCL_CTAS, P2P_CALL_S = _NET.nccl_ctas, _NET.p2p_call_s


class Recompute(IntEnum):
    """Activation recomputation of a stage's layers (:attr:`hetplan.plan.Stage.recompute`): none, selective
    (the attention core, Korthikanti et al. 2023; torchtitan's per-op SAC under FSDP) or full (the whole layer
    again in backward). Integer-valued, so arrays of configurations hold them as 0 / 1 / 2."""

    NONE = 0
    SELECTIVE = 1
    FULL = 2

    @classmethod
    def of(cls, name: str) -> Recompute:
        """The member of a plan's name (``"none"`` | ``"selective"`` | ``"full"``)."""
        return cls[name.upper()]


@dataclass(frozen=True)
class Link:
    """Bandwidths a stage sees (bytes/s, unidirectional): inside its node and out of its node (whole NIC, as far
    as its network lets NCCL use it: :func:`hetplan.estimate.comm.network_terms`), and the per-step latencies
    between nodes and inside a node (s; the latter fitted, :class:`hetplan.estimate.comm.CommConstants`), the
    time a stage loses per pipeline p2p call of an extra model chunk (:data:`hetplan.estimate.comm.P2P_CALL_S`),
    the fractions of the intra- and inter-node bandwidth NCCL reaches for large messages, the latency of a
    pipeline p2p transfer inside a node (:func:`hetplan.estimate.stage.boundary_alpha_s`) and the thread blocks
    an NCCL kernel takes from overlapped compute (:func:`hetplan.estimate.comm.overlap_contention`), and the
    fraction of those efficiencies the stage's TP collectives reach (``tp_comm_factor``: the job's stack's residual,
    :attr:`hetplan.hardware.stacks.StackSpec.tp_comm_factor`, times a calibration's trial,
    :attr:`hetplan.estimate.comm.CommConstants.tp_comm_factor`; :meth:`tp_link`). Defaults:
    ``hardware/data/network.toml`` with its sources; :func:`hetplan.estimate.estimator.pool_link` fills every
    field from a :class:`~hetplan.estimate.comm.CommConstants`, so a calibration's values reach each
    collective."""

    gpus_per_node: int
    intra_node_bandwidth_bytes_per_s: float
    inter_node_bandwidth_bytes_per_s: float
    inter_node_alpha_s: float = ALPHA_INTER_NODE_S
    intra_node_alpha_s: float = ALPHA_INTRA_NODE_S
    p2p_call_s: float = P2P_CALL_S
    intra_link_efficiency: float = INTRA_LINK_EFFICIENCY
    inter_link_efficiency: float = INTER_LINK_EFFICIENCY
    p2p_alpha_s: float = ALPHA_INTER_NODE_S
    nccl_ctas: int = NCCL_CTAS
    tp_comm_factor: float = 1.0

    def tp_link(self) -> Link:
        """The link the TP collectives see: both efficiencies times ``tp_comm_factor`` (itself at 1)."""
        if self.tp_comm_factor == 1.0:
            return self
        return replace(self, intra_link_efficiency=self.intra_link_efficiency * self.tp_comm_factor,
                       inter_link_efficiency=self.inter_link_efficiency * self.tp_comm_factor, tp_comm_factor=1.0)

    @classmethod
    def one_node(cls, bandwidth_bytes_per_s: Array, intra_node_alpha_s: float = ALPHA_INTRA_NODE_S) -> Link:
        """A link whose node holds any group (:data:`ONE_NODE_GPUS` GPUs): every collective stays on the intra-node
        link of ``bandwidth_bytes_per_s`` (a single-node measurement, a serving replica)."""
        return cls(ONE_NODE_GPUS, bandwidth_bytes_per_s, bandwidth_bytes_per_s,
                   intra_node_alpha_s=intra_node_alpha_s)


#: GPUs per node of :meth:`Link.one_node`: more than any group holds, so no group crosses a node.
ONE_NODE_GPUS = 1 << 30


@dataclass(frozen=True, eq=False)
class StageHardware:
    """The GPU a stage runs on (as its job's software runs there: :func:`hetplan.estimate.compute.pool_gpu`) and
    the links it sees. Compared and hashed by identity: the estimator makes one per distinct pool."""

    gpu: GPUSpec
    link: Link


@dataclass(frozen=True)
class StageWork:
    """What one pipeline stage computes per iteration (module doc); each field a scalar or an array.

    Attributes:
        s: tokens per sequence (the job's ``seq_len``); b: sequences per micro-batch of one replica (``mbs``).
        num_layers: transformer layers of the stage; has_embedding, has_head: it holds the input embedding /
            the final norm, output layer and loss; single_stage: the only stage (no pipeline).
        in_flight: micro-batches whose activations the stage holds at its peak (fractional under interleaving:
            chunks of ``1/v`` of the stage; :func:`hetplan.estimate.estimator.in_flight_microbatches`).
        num_microbatches: micro-batches per iteration (per pipeline; None for memory alone: no pipeline buffers);
            step_microbatches: per call of the pipeline schedule (:attr:`hetplan.plan.Plan.pipeline_step_microbatches`;
            None: all in one call).
        recompute: :class:`Recompute` (or its integer codes); recompute_layers: how many of the stage's layers
            use it (None: all; the others recompute nothing).
        zero: ZeRO stage 0-3 over the data-parallel ranks (under ``framework = "fsdp"``: 0 = DDP, FSDP2 on one-rank
            shards; 1 / 2 = FSDP2 never resharding after forward; 3 = FSDP2: :func:`hetplan.estimate.memory.fsdp_shard_ranks`).
        sequence_parallel: Megatron sequence parallelism in the TP group (effective only with ``tp > 1`` and a
            stack that has it).
        fp8_recipe: the FP8 scaling recipe of the stage's GEMMs (:func:`hetplan.estimate.fp8.recipe`), None
            unless FP8; :func:`hetplan.estimate.stage.stage_costs` sets it from the GPU and the options.
    """

    s: Any
    b: Any
    num_layers: Any
    has_embedding: Any
    has_head: Any
    single_stage: Any
    in_flight: Any
    num_microbatches: Any = None
    recompute: Any = Recompute.NONE
    zero: Any = 0
    sequence_parallel: Any = False
    recompute_layers: Any = None
    step_microbatches: Any = None
    fp8_recipe: str | None = None


@dataclass(frozen=True, eq=False)
class LayerTerms:
    """How one transformer layer runs: the terms of :func:`hetplan.estimate.compute.layer_time_s` besides the
    model, GPU, dtype, shape and recomputation. Fields hold scalars or arrays (a search), like :class:`StageWork`.

    Attributes:
        link: the links the TP group sees (:class:`Link`: intra-node bandwidth, the node's NIC bandwidth and
            GPUs per node where a group larger than a node crosses nodes, the per-step latencies;
            :meth:`Link.one_node` keeps every group in one node).
        sequence_parallel: with SP the element-wise work is also split over the TP ranks.
        attention: ``"flash"`` (FlashAttention, causal: one fused kernel for the core,
            :func:`hetplan.estimate.compute.flash_attention_time_s`; no element-wise passes over s x s scores;
            selective recompute = none) or ``"standard"`` (two batched GEMMs over the full s x s scores plus the
            element-wise passes over them) or ``"eager"`` (as standard, with the s x s element-wise work of
            :func:`hetplan.estimate.compute.eager_score_bytes`).
        gemm_times_s: ``(linear_s, core_s)`` of the layer's forward GEMMs when the caller costs them (MoE, MLA
            and CP layers: :func:`hetplan.estimate.moe.layer_gemm_times_s`, :mod:`hetplan.estimate.context`);
            default :func:`hetplan.estimate.compute.layer_gemm_times_s`.
        attention_blocks: ``(s x s)`` attention blocks per rank: ``cp`` under context parallelism, where ``s``
            is a rank's ``s / cp`` tokens and its queries attend all ``cp`` blocks of keys
            (:mod:`hetplan.estimate.context`). Flash: one block is the causal diagonal one, the other
            ``attention_blocks - 1`` are halves of blocks without a mask (a ring step computes half a block of
            full tiles), at the non-causal rate.
        extra_kernels: kernels the layer's forward launches beyond
            :data:`hetplan.estimate.compute.KERNELS_PER_LAYER_FORWARD` (MoE layers:
            :func:`hetplan.estimate.moe.extra_kernels`; eager PyTorch:
            :func:`hetplan.estimate.elementwise.eager_layer_kernels`); they count in the host floor.
        extra_elementwise_bytes: bytes the layer's forward moves beyond the fused element-wise kernels (eager
            PyTorch: :func:`hetplan.estimate.elementwise.eager_layer_bytes`), charged like the element-wise
            term: at the HBM bandwidth, twice in backward, again in full recomputation.
        extra_gpu_s: memory-bound GPU work of the forward beyond the GEMMs and the element-wise term, costed by
            the caller (a MoE layer's token permutation, :func:`hetplan.estimate.moe.permute_time_s`); backward
            runs the same again once (the inverse kernels on the gradients), full recomputation once more.
        fp8_gathers: under FP8, whether the sequence-parallel all-gathers carry the FP8 operands (False for
            torchao's rowwise recipes, which gather bf16: :func:`hetplan.estimate.fp8.fp8_gathers`).
        projections: how the stack's model code runs the projections
            (:attr:`hetplan.hardware.stacks.StackSpec.projections`): ``fused`` (Megatron's QKV and gate/up GEMMs),
            ``separate`` or ``fused-qkv``; the dense GEMM shapes and kernels of
            :func:`hetplan.estimate.compute.layer_time_s`.
        fused_softmax: when the stack's fused softmax kernel takes a standard attention's scores
            (:attr:`hetplan.hardware.stacks.StackSpec.fused_softmax`, :func:`hetplan.estimate.compute.fused_softmax_runs`);
            ``"any"``: always.
        eager_grad_sum: autograd sums the separate projections' input gradients in add kernels of their own
            (eager PyTorch), not inside the fused kernel that consumes the sum (``torch.compile``):
            :func:`hetplan.estimate.compute.projection_grad_sum_bytes`.
        mlp_tp_collectives: share of the model's layers whose MLP side runs sequence parallelism's TP all-gather
            and reduce-scatter (:func:`hetplan.estimate.moe.mlp_tp_collective_share`: 1 for a dense model; a MoE
            layer's routed experts mostly take their rank's sequence shard through the dispatcher instead).
        tp_comm_overlap, cuda_graphs, op_sac, sequence_dim_copies, async_tp, tp_allreduce: Megatron-Core's
            ``--tp-comm-overlap``, captured CUDA graphs, torchtitan's per-op SAC as the selective recompute,
            DTensor's sequence-dimension copies, PyTorch's async TP, and the algorithm of the TP all-reduces
            inside a node (``"ring"``; ``"custom"``: a serving engine's one-/two-shot kernel); each costed as
            :func:`hetplan.estimate.compute.layer_time_s` says, with its source.
    """

    link: Link
    sequence_parallel: Array = False
    attention: str = "standard"
    gemm_times_s: tuple[Array, Array] | None = None
    attention_blocks: Array = 1
    extra_kernels: Array = 0.0
    extra_elementwise_bytes: Array = 0.0
    extra_gpu_s: Array = 0.0
    mlp_tp_collectives: Array = 1.0
    tp_comm_overlap: bool = False
    cuda_graphs: bool = False
    op_sac: bool = False
    sequence_dim_copies: bool = False
    async_tp: bool = False
    tp_allreduce: str = "ring"
    fp8_gathers: bool = True
    projections: str = "fused"
    eager_grad_sum: bool = False
    fused_softmax: str = "any"
