"""Memory per GPU of one pipeline stage: weights, gradients, optimizer states, activations, overhead.

Model states follow Megatron-LM's mixed-precision Adam (Narayanan et al. SC'21; Megatron-LM
``theoretical_memory_usage.py``): 2-byte weights, 4-byte fp32 gradient accumulation buffer, 12 bytes of optimizer
state (fp32 master weights, momentum, variance) = 18 bytes per parameter. ZeRO (Rajbhandari et al. SC'20, Sec. 5)
shards over the stage's DP group: stage 1 the optimizer states, stage 2 also the gradients, stage 3 also the
weights (plus a gathered-layer prefetch buffer of two layers).

Activations per layer from :func:`hetplan.model.counts.layer_activation_bytes` (Korthikanti et al. 2023) times the
micro-batches in flight: under 1F1B stage i of p holds ``min(p - i, m)`` (Narayanan et al. SC'21 Sec. 2.2.1); under
GPipe all m. Full recomputation also needs one layer's full activations while it is recomputed. The first stage
keeps the token ids (8 bytes each) and the embedding dropout mask per micro-batch in flight (split over TP
ranks with sequence parallelism, as Megatron-LM's theoretical memory divides all activations by TP); the last stage the
logits and loss buffers ``4·s·b·(h + V)/t`` (Megatron-LM theoretical memory, output layer term).

Under interleaved 1F1B with v virtual stages the estimator passes ``in_flight`` =
``((p - i - 1)·2 + (v - 1)·p + 1) / v`` (Megatron-LM's warm-up count in chunks of 1/v of the stage), i.e.
``p·(1 + (p-1)/(p·v))`` on the first stage: Megatron-LM's ``interleaved_schedule_memory_penalty``. With SP +
selective recompute this reproduces Megatron-LM's theoretical memory exactly for a GPT without biases and learned
positions (tests/estimate/test_memory.py).

Overhead: a fixed :data:`CUDA_CONTEXT_BYTES` (CUDA context, cuBLAS workspace, NCCL buffers) plus
:data:`ALLOCATOR_MARGIN` of everything else for allocator fragmentation.
"""

from __future__ import annotations

import numpy as np

from hetplan.model import counts
from hetplan.model.spec import ModelSpec

WEIGHT_BYTES = 2
GRAD_BYTES = 4
OPTIMIZER_BYTES = 12
#: CUDA context + cuBLAS workspace + NCCL communicator buffers (bytes). PyTorch's CUDA context alone is
#: ~0.3-0.5 GiB on A100/H100; NCCL allocates a few hundred MiB per communicator. Stated assumption.
CUDA_CONTEXT_BYTES = 1.0 * 2**30
#: Caching-allocator fragmentation margin, as a fraction of the tensor bytes. Stated assumption.
ALLOCATOR_MARGIN = 0.05


def stage_parameters(m: ModelSpec, num_layers, has_embedding, has_head, single_stage):
    """Parameters held by one pipeline stage (before TP/ZeRO sharding).

    With tied embeddings and more than one stage, the last stage keeps its own copy of the embedding matrix for
    the head (Megatron-LM's ``word_embeddings`` on the last stage), so it is counted on both.
    """
    p = num_layers * counts.layer_parameters(m)
    p = p + np.where(has_embedding, counts.embedding_parameters(m), 0)
    head = counts.head_parameters(m)
    if m.tied_embeddings:
        head = np.where(single_stage, head, head + m.vocab_size * m.hidden_size)
    return p + np.where(has_head, head, 0)


def stage_memory_bytes(
    m: ModelSpec,
    *,
    num_layers,
    has_embedding,
    has_head,
    single_stage,
    b,
    s,
    t,
    dp,
    zero,
    recompute: str | np.ndarray,
    sequence_parallel,
    in_flight,
    recompute_layers=None,
):
    """Peak memory per GPU of one stage, as a dict of arrays (bytes):
    ``weights``, ``gradients``, ``optimizer``, ``activations``, ``overhead``, ``total``.

    Args:
        recompute: ``"none"`` | ``"selective"`` | ``"full"``, or an integer array of codes 0/1/2.
        in_flight: micro-batches whose activations the stage holds at its peak.
        recompute_layers: how many layers use ``recompute`` (the others keep all activations); default all.
    """
    params = stage_parameters(m, num_layers, has_embedding, has_head, single_stage) / t
    zero = np.asarray(zero)
    weights = params * WEIGHT_BYTES / np.where(zero >= 3, dp, 1)
    weights = weights + np.where(zero >= 3, 2 * counts.layer_parameters(m) / t * WEIGHT_BYTES, 0)
    grads = params * GRAD_BYTES / np.where(zero >= 2, dp, 1)
    optim = params * OPTIMIZER_BYTES / np.where(zero >= 1, dp, 1)

    rc = np.asarray({"none": 0, "selective": 1, "full": 2}[recompute] if isinstance(recompute, str) else recompute)
    sp = np.asarray(sequence_parallel)

    def act(mode):
        return np.where(
            sp,
            counts.layer_activation_bytes(m, b, s, t, sequence_parallel=True, recompute=mode),
            counts.layer_activation_bytes(m, b, s, t, sequence_parallel=False, recompute=mode),
        )

    per_layer = np.where(rc == 2, act("full"), np.where(rc == 1, act("selective"), act("none")))
    if recompute_layers is None:
        activations = in_flight * num_layers * per_layer
        activations = activations + np.where(rc == 2, act("none"), 0)  # the layer being recomputed
    else:  # r layers recomputed, the rest keep all their activations
        r = np.minimum(recompute_layers, num_layers)
        activations = in_flight * (r * per_layer + (num_layers - r) * act("none"))
        activations = activations + np.where((rc == 2) & (r > 0), act("none"), 0)
    sbh = s * b * m.hidden_size
    emb = in_flight * (8 * s * b + sbh) / np.where(sp, t, 1)  # sequence-parallel: split like the layers
    activations = activations + np.where(has_embedding, emb, 0)
    activations = activations + np.where(has_head, 4 * s * b * (m.hidden_size + m.padded_vocab_size()) / t, 0)
    tensors = weights + grads + optim + activations
    overhead = CUDA_CONTEXT_BYTES + ALLOCATOR_MARGIN * tensors
    return {
        "weights": weights,
        "gradients": grads,
        "optimizer": optim,
        "activations": activations,
        "overhead": overhead,
        "total": tensors + overhead,
    }
