"""What one pipeline stage computes and what it runs on: the inputs of :func:`hetplan.estimate.stage.stage_costs`
besides the model, the degrees (:class:`hetplan.degrees.Degrees`) and the options
(:class:`hetplan.estimate.options.TrainingOptions`).

* :class:`StageWork` — its layers, embedding / head, micro-batch and sequence, micro-batches per iteration and in
  flight, recomputation (:class:`Recompute`), ZeRO stage and sequence parallelism;
* :class:`StageHardware` — its GPU (:class:`hetplan.hardware.catalog.GPUSpec`) and the links it sees
  (:class:`Link`).

Like :class:`~hetplan.degrees.Degrees`, the fields of :class:`StageWork` hold scalars (one stage of a plan) or
numpy arrays (thousands of configurations of a search), broadcasting against each other.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import Any

from hetplan.estimate.comm import ALPHA_INTER_NODE_S, ALPHA_INTRA_NODE_S, P2P_CALL_S
from hetplan.hardware.catalog import GPUSpec


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
    between nodes and inside a node (s; the latter fitted, :class:`hetplan.estimate.comm.CommConstants`), and the
    time a stage loses per pipeline p2p call of an extra model chunk (:data:`hetplan.estimate.comm.P2P_CALL_S`)."""

    gpus_per_node: int
    intra_node_bandwidth_bytes_per_s: float
    inter_node_bandwidth_bytes_per_s: float
    inter_node_alpha_s: float = ALPHA_INTER_NODE_S
    intra_node_alpha_s: float = ALPHA_INTRA_NODE_S
    p2p_call_s: float = P2P_CALL_S


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
        zero: ZeRO stage 0-3 over the data-parallel ranks (3 whatever it says under ``framework = "fsdp"``).
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
