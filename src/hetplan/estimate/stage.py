"""Costs of one pipeline stage: per-micro-batch forward/backward time, data-parallel and optimizer time, memory.

This is the one place where compute, communication and memory formulas are put together per stage. The plan
estimator calls it once per stage with scalars; the search calls it with arrays of thousands of configurations
at once (every argument but ``m``, ``gpu``, ``pool`` and ``dtype`` may be an array).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hetplan.estimate import compute, memory
from hetplan.estimate.comm import dp_collective_time_s
from hetplan.hardware.catalog import GPUSpec
from hetplan.model.spec import ModelSpec


@dataclass(frozen=True)
class Link:
    """Bandwidths a stage sees (bytes/s, unidirectional): inside its node and out of its node (whole NIC)."""

    gpus_per_node: int
    intra_node_bandwidth_bytes_per_s: float
    inter_node_bandwidth_bytes_per_s: float


def stage_costs(
    m: ModelSpec,
    gpu: GPUSpec,
    link: Link,
    dtype: str,
    *,
    s,
    b,
    t,
    dp,
    num_layers,
    has_embedding,
    has_head,
    single_stage,
    in_flight,
    num_microbatches,
    zero,
    recompute_code,
    sequence_parallel,
    overlap_grad_reduce=True,
    measured_layer_time_s=None,
):
    """Costs of one stage (see module doc). Returns a dict of arrays:

    * ``forward_s``, ``backward_s``: one micro-batch through the stage (backward includes recomputation and TP
      collectives); ``tp_comm_s`` the TP-collective part of both;
    * ``dp_s``: data-parallel gradient/parameter collectives per iteration; ``dp_exposed_s`` the part not hidden
      behind the backward pass of the last micro-batch (when ``overlap_grad_reduce``) — for ZeRO-3 the per
      micro-batch parameter all-gathers are prefetched behind compute and only their excess is exposed;
    * ``optimizer_s``: the Adam step;
    * ``memory``: the dict of :func:`hetplan.estimate.memory.stage_memory_bytes`;
    * ``params_per_gpu``: parameters held per GPU before ZeRO sharding.

    ``measured_layer_time_s``: optional measured ``(forward_s, backward_s)`` of one layer for this micro-batch
    and TP degree (TP communication included, no recomputation), e.g. from the profile database; it replaces
    the analytic layer time, recomputation still adds the analytic share of it.

    Units: seconds, bytes.
    """
    tp_bw = link.intra_node_bandwidth_bytes_per_s
    lf, lb, ltp = compute.layer_time_s(m, gpu, dtype, b, s, t, recompute_code, tp_bw)
    if measured_layer_time_s is not None:
        # Scale the analytic recomputation overhead by measured/analytic forward time.
        af, ab, _ = compute.layer_time_s(m, gpu, dtype, b, s, t, 0, tp_bw)
        mf, mbk = measured_layer_time_s
        lf, lb = mf, mbk + (lb - ab) * (mf / af)
    ef, eb = compute.embedding_time_s(m, gpu, b, s, t)
    hf, hb = compute.head_time_s(m, gpu, dtype, b, s, t)
    fwd = num_layers * lf + np.where(has_embedding, ef, 0.0) + np.where(has_head, hf, 0.0)
    bwd = num_layers * lb + np.where(has_embedding, eb, 0.0) + np.where(has_head, hb, 0.0)

    params = memory.stage_parameters(m, num_layers, has_embedding, has_head, single_stage) / t
    zero = np.asarray(zero)
    dp_args = (dp, t, link.gpus_per_node, tp_bw, link.inter_node_bandwidth_bytes_per_s)
    grad_bytes = params * memory.GRAD_BYTES
    weight_bytes = params * memory.WEIGHT_BYTES
    allreduce = dp_collective_time_s(grad_bytes, "allreduce", *dp_args)
    reduce_scatter = dp_collective_time_s(grad_bytes, "allgather", *dp_args)
    param_gather = dp_collective_time_s(weight_bytes, "allgather", *dp_args)
    # ZeRO-0: all-reduce grads. ZeRO-1/2: reduce-scatter grads + all-gather updated weights (distributed optimizer).
    # ZeRO-3: reduce-scatter grads; weights all-gathered for forward and backward of every micro-batch.
    grad_sync = np.where(zero == 0, allreduce, reduce_scatter + np.where(zero < 3, param_gather, 0.0))
    gather_per_mb = np.where(zero >= 3, 2 * param_gather, 0.0)
    window = np.where(overlap_grad_reduce, bwd, 0.0)
    grad_exposed = np.maximum(grad_sync - window, 0.0)
    gather_exposed = num_microbatches * np.maximum(gather_per_mb - (fwd + bwd), 0.0)
    dp_total = grad_sync + num_microbatches * gather_per_mb

    owned = params / np.where(zero >= 1, dp, 1)
    mem = memory.stage_memory_bytes(
        m,
        num_layers=num_layers,
        has_embedding=has_embedding,
        has_head=has_head,
        single_stage=single_stage,
        b=b,
        s=s,
        t=t,
        dp=dp,
        zero=zero,
        recompute=recompute_code,
        sequence_parallel=sequence_parallel,
        in_flight=in_flight,
    )
    return {
        "forward_s": fwd,
        "tp_comm_s": num_layers * ltp,
        "backward_s": bwd,
        "dp_s": dp_total,
        "dp_exposed_s": grad_exposed + gather_exposed,
        "optimizer_s": compute.optimizer_step_time_s(owned, gpu),
        "memory": mem,
        "params_per_gpu": params,
    }


def p2p_bytes(m: ModelSpec, b, s, t, sequence_parallel):
    """Bytes one rank sends to the next stage per micro-batch: the ``b·s·h`` boundary activation in 2 bytes,
    split over TP ranks by Megatron's scatter/gather optimisation (Narayanan et al. SC'21 Sec. 4.1) or by
    sequence parallelism."""
    return b * s * m.hidden_size * 2 / t


def boundary_bandwidth_bytes_per_s(sender: Link, receiver: Link, sender_gpus, intra_node):
    """Per-rank bandwidth of a pipeline boundary: the intra-node link if both stages share a node, else the
    slower of the two nodes' NICs shared by the sender's GPUs in one node (``min(G, sender_gpus)`` of them)."""
    inter = min(sender.inter_node_bandwidth_bytes_per_s, receiver.inter_node_bandwidth_bytes_per_s)
    senders = np.minimum(sender.gpus_per_node, sender_gpus)
    return np.where(intra_node, sender.intra_node_bandwidth_bytes_per_s, inter / senders)
