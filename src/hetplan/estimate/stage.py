"""Costs of one pipeline stage: per-micro-batch forward/backward time, data-parallel and optimizer time, memory.

This is the one place where compute, communication and memory formulas are put together per stage. The plan
estimator calls it once per stage with scalars; the search calls it with arrays of thousands of configurations
at once (every argument but ``m``, ``gpu``, ``pool`` and ``dtype`` may be an array).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hetplan.estimate import compute, memory
from hetplan.estimate.comm import dp_collective_time_s, group_collective_time_s
from hetplan.hardware.catalog import GPUSpec
from hetplan.model.spec import ModelSpec


@dataclass(frozen=True)
class Link:
    """Bandwidths a stage sees (bytes/s, unidirectional): inside its node and out of its node (whole NIC)."""

    gpus_per_node: int
    intra_node_bandwidth_bytes_per_s: float
    inter_node_bandwidth_bytes_per_s: float


#: Gradient bucket of the overlapped data-parallel reduction (elements): Megatron-LM's DDP default
#: ``bucket_size = max(40e6, 1e6 * dp)`` parameters; the last bucket's reduction cannot hide behind backward.
BUCKET_PARAMETERS = 40e6


def grad_comm_bytes_per_parameter(dtype: str) -> int:
    """Bytes per gradient element in the data-parallel reduction: Megatron-LM reduces fp16 gradients in fp16
    (``accumulate_allreduce_grads_in_fp32`` off by default) and bf16 gradients in fp32 (forced on)."""
    return 2 if dtype == "fp16" else 4


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
    recompute_layers=None,
    attention="standard",
    framework="megatron",
):
    """Costs of one stage (see module doc). Returns a dict of arrays:

    * ``forward_s``, ``backward_s``: one micro-batch through the stage (backward includes recomputation and TP
      collectives); ``tp_comm_s`` the TP-collective part of both;
    * ``dp_s``: data-parallel gradient/parameter collectives per iteration; ``dp_exposed_s`` the part not hidden:
      without overlap all of it; with ``overlap_grad_reduce`` (bucketed, Megatron-LM/PyTorch DDP) what exceeds
      the backward pass of the last micro-batch, and at least the last bucket's reduction. For ZeRO-3 the per
      micro-batch parameter all-gathers are prefetched behind compute (FSDP prefetch): their excess over the
      micro-batch's compute is exposed, plus the first layer's gather, which nothing hides. With tied
      embeddings and more than one stage, the first and last stages also all-reduce the embedding gradient
      between them (Megatron-LM ``_allreduce_embedding_grads``), exposed;
    * ``optimizer_s``: the Adam step;
    * ``memory``: the dict of :func:`hetplan.estimate.memory.stage_memory_bytes`;
    * ``params_per_gpu``: parameters held per GPU before ZeRO sharding.

    ``measured_layer_time_s``: optional measured ``(forward_s, backward_s)`` of one layer for this micro-batch
    and TP degree (TP communication included, no recomputation), e.g. from the profile database; it replaces
    the analytic layer time, recomputation still adds the analytic share of it.

    ``in_flight`` may be fractional (interleaved 1F1B holds chunks of 1/v of the stage).

    ``recompute_layers``: optional number of the stage's layers that use ``recompute_code`` (per-layer
    recomputation, Aceso EuroSys'24 Sec. 4.2); the other layers recompute nothing. Default (None): all layers.

    ``attention`` (``"standard"`` | ``"flash"``) and ``framework`` (``"megatron"`` | ``"deepspeed"``): the job's
    :attr:`hetplan.plan.Job.attention` and :attr:`hetplan.plan.Job.framework` (scalars).

    Units: seconds, bytes.
    """
    tp_bw = link.intra_node_bandwidth_bytes_per_s
    tp_kw = dict(gpus_per_node=link.gpus_per_node, inter_node_bandwidth_bytes_per_s=link.inter_node_bandwidth_bytes_per_s,
                 sequence_parallel=sequence_parallel, attention=attention)
    lf, lb, ltp = compute.layer_time_s(m, gpu, dtype, b, s, t, recompute_code, tp_bw, **tp_kw)
    af = ab = atp = None
    if measured_layer_time_s is not None or recompute_layers is not None:
        af, ab, atp = compute.layer_time_s(m, gpu, dtype, b, s, t, 0, tp_bw, **tp_kw)
    if measured_layer_time_s is not None:
        # Scale the analytic recomputation overhead by measured/analytic forward time.
        mf, mbk = measured_layer_time_s
        lf, lb = mf, mbk + (lb - ab) * (mf / af)
        ab = mbk
    ef, eb = compute.embedding_time_s(m, gpu, b, s, t)
    hf, hb = compute.head_time_s(m, gpu, dtype, b, s, t)
    if recompute_layers is None:
        layers_bwd, layers_tp = num_layers * lb, num_layers * ltp
    else:  # r layers recompute, the others do not (their backward is the plain one)
        r = np.minimum(recompute_layers, num_layers)
        layers_bwd = r * lb + (num_layers - r) * ab
        layers_tp = r * ltp + (num_layers - r) * atp
    fwd = num_layers * lf + np.where(has_embedding, ef, 0.0) + np.where(has_head, hf, 0.0)
    bwd = layers_bwd + np.where(has_embedding, eb, 0.0) + np.where(has_head, hb, 0.0)

    params = memory.stage_parameters(m, num_layers, has_embedding, has_head, single_stage) / t
    zero = np.asarray(zero)
    dp_args = (dp, t, link.gpus_per_node, tp_bw, link.inter_node_bandwidth_bytes_per_s)
    grad_bytes = params * grad_comm_bytes_per_parameter(dtype)
    weight_bytes = params * memory.WEIGHT_BYTES
    allreduce = dp_collective_time_s(grad_bytes, "allreduce", *dp_args)
    reduce_scatter = dp_collective_time_s(grad_bytes, "allgather", *dp_args)
    param_gather = dp_collective_time_s(weight_bytes, "allgather", *dp_args)
    # ZeRO-0: all-reduce grads. ZeRO-1/2: reduce-scatter grads + all-gather updated weights (distributed optimizer).
    # ZeRO-3: reduce-scatter grads; weights all-gathered for forward and backward of every micro-batch.
    grad_sync = np.where(zero == 0, allreduce, reduce_scatter + np.where(zero < 3, param_gather, 0.0))
    gather_per_mb = np.where(zero >= 3, 2 * param_gather, 0.0)
    bucket_share = np.minimum(1.0, np.maximum(BUCKET_PARAMETERS, 1e6 * np.asarray(dp)) / np.maximum(params, 1.0))
    grad_exposed = np.where(
        overlap_grad_reduce, np.maximum(grad_sync - bwd, grad_sync * bucket_share), grad_sync
    )
    first_layer = gather_per_mb / np.maximum(num_layers, 1)
    gather_exposed = num_microbatches * (np.maximum(gather_per_mb - (fwd + bwd), 0.0) + first_layer)
    dp_total = grad_sync + num_microbatches * gather_per_mb
    # Embedding-gradient all-reduce between the first and the last stage (tied embeddings, pp > 1).
    emb_sync = np.where(
        (np.asarray(has_embedding) | np.asarray(has_head)) & ~np.asarray(single_stage) & m.tied_embeddings,
        compute_embedding_sync_s(m, dtype, t, link), 0.0,
    )

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
        recompute_layers=recompute_layers,
        attention=attention,
        framework=framework,
    )
    return {
        "forward_s": fwd,
        "tp_comm_s": layers_tp,
        "backward_s": bwd,
        "dp_s": dp_total + emb_sync,
        "dp_exposed_s": grad_exposed + gather_exposed + emb_sync,
        "optimizer_s": compute.optimizer_step_time_s(owned, gpu),
        "memory": mem,
        "params_per_gpu": params,
    }


def compute_embedding_sync_s(m: ModelSpec, dtype: str, t, link: Link):
    """All-reduce of the ``V·h/t`` word-embedding gradient between the first and last pipeline stage (2 ranks,
    taken across nodes, NIC shared by the node's GPUs)."""
    nbytes = m.padded_vocab_size() * m.hidden_size / np.asarray(t) * grad_comm_bytes_per_parameter(dtype)
    return group_collective_time_s(nbytes, "allreduce", 2, link.gpus_per_node, link.gpus_per_node,
                                   link.intra_node_bandwidth_bytes_per_s, link.inter_node_bandwidth_bytes_per_s,
                                   nic_sharers=link.gpus_per_node)


def p2p_bytes(m: ModelSpec, b, s, t, sequence_parallel):
    """Bytes one rank sends to the next stage per micro-batch: the ``b·s·h`` boundary activation in 2 bytes,
    split over TP ranks by Megatron's scatter/gather optimisation (Narayanan et al. SC'21 Sec. 4.1) or by
    sequence parallelism."""
    return b * s * m.hidden_size * 2 / t


def boundary_bandwidth_bytes_per_s(sender: Link, receiver: Link, sender_gpus, intra_node):
    """Per-rank bandwidth of a pipeline boundary: the intra-node link if both stages share a node, else the
    slower of the two nodes' NICs shared by the sender's GPUs in one node (``min(G, sender_gpus)`` of them)."""
    inter = np.minimum(sender.inter_node_bandwidth_bytes_per_s, receiver.inter_node_bandwidth_bytes_per_s)
    senders = np.minimum(sender.gpus_per_node, sender_gpus)
    return np.where(intra_node, sender.intra_node_bandwidth_bytes_per_s, inter / senders)
