"""Compute time of transformer layers, embedding and head on one GPU (roofline with a calibrated efficiency).

A layer's forward time is the GEMM time ``FLOPs / (t · peak · efficiency)`` plus the time of its memory-bound
element-wise work (norms, softmax, activation function, dropout, residual adds), taken as two passes (one write,
one read) over the activation bytes the layer produces, at HBM bandwidth — the roofline model of Williams,
Waterman & Patterson (CACM 2009) applied per operator class. Backward is 2x forward (two GEMMs per forward GEMM:
Narayanan et al. SC'21 Sec. 5.1). Recomputation adds one forward of the recomputed part to the backward pass
(full: the whole layer; selective: the attention core, Korthikanti et al. 2023 Sec. 5).

Tensor-parallel collectives (Megatron-LM, Shoeybi et al. 2019 Sec. 3): two all-reduces of ``b·s·h`` activations
per layer in forward and two in backward (with sequence parallelism an all-gather plus a reduce-scatter of the same
total volume, Korthikanti et al. Sec. 4.2.2); not overlapped with compute.

All functions broadcast over numpy arrays (b, t, recompute-as-array are allowed where noted).
"""

from __future__ import annotations

import numpy as np

from hetplan.estimate.comm import allreduce_time_s
from hetplan.hardware.catalog import GPUSpec
from hetplan.model import counts
from hetplan.model.spec import ModelSpec

#: Passes over the produced activation bytes made by the element-wise kernels of a layer (write + read).
ELEMENTWISE_PASSES = 2.0

RECOMPUTE_CODES = {"none": 0, "selective": 1, "full": 2}


def _effective_flops(gpu: GPUSpec, dtype: str) -> float:
    return gpu.peak_flops_per_s(dtype) * gpu.compute_efficiency


def layer_time_s(m: ModelSpec, gpu: GPUSpec, dtype: str, b, s, t, recompute_code, tp_bandwidth_bytes_per_s):
    """Forward and backward time of one transformer layer for one micro-batch on one GPU of a TP group.

    Args:
        b: micro-batch size (sequences); s: sequence length; t: TP degree.
        recompute_code: 0 none, 1 selective, 2 full (array allowed); see ``RECOMPUTE_CODES``.
        tp_bandwidth_bytes_per_s: unidirectional bandwidth of the TP group's link.
    Returns:
        ``(forward_s, backward_s, tp_comm_s)``: forward and backward (including recomputation and TP
        collectives), and the part of both that is TP communication.
    """
    eff = _effective_flops(gpu, dtype)
    gemm_f = counts.layer_forward_flops(m, b, s) / t / eff
    act = counts.layer_activation_bytes(m, b, s, t, sequence_parallel=True, recompute="none")
    elem_f = ELEMENTWISE_PASSES * act / gpu.hbm_bandwidth_bytes_per_s
    fwd_compute = gemm_f + elem_f
    core_flops = 4 * b * s * s * m.q_dim / t  # QK^T and attention-over-values
    core_bytes = (5 if m.dropout else 2) * m.num_attention_heads * s * s * b / t
    core_f = core_flops / eff + ELEMENTWISE_PASSES * core_bytes / gpu.hbm_bandwidth_bytes_per_s
    rc = np.asarray(recompute_code)
    recompute_extra = np.where(rc == 2, fwd_compute, np.where(rc == 1, core_f, 0.0))
    tp_msg = b * s * m.hidden_size * 2
    tp_one = allreduce_time_s(tp_msg, t, tp_bandwidth_bytes_per_s)
    fwd = fwd_compute + 2 * tp_one
    tp_bwd = 2 * tp_one + np.where(rc == 2, 2 * tp_one, 0.0)
    bwd = 2 * fwd_compute + recompute_extra + tp_bwd
    return fwd, bwd, 2 * tp_one + tp_bwd


def embedding_time_s(m: ModelSpec, gpu: GPUSpec, b, s, t):
    """Forward and backward time of the input embedding: a gather, memory-bound (writes ``b·s·h`` activations)."""
    out = b * s * m.hidden_size * 2 / t
    fwd = ELEMENTWISE_PASSES * out / gpu.hbm_bandwidth_bytes_per_s
    return fwd, 2 * fwd


def head_time_s(m: ModelSpec, gpu: GPUSpec, dtype: str, b, s, t):
    """Forward and backward time of the output head (logits GEMM, vocab-parallel) and the cross-entropy loss.

    The loss touches the ``b·s·V/t`` logits in fp32 (4 bytes) a few times: we count two passes.
    """
    eff = _effective_flops(gpu, dtype)
    gemm = counts.head_forward_flops(m, b, s) / t / eff
    loss = ELEMENTWISE_PASSES * 4 * b * s * m.padded_vocab_size() / t / gpu.hbm_bandwidth_bytes_per_s
    return gemm + loss, 2 * gemm + loss


def optimizer_step_time_s(params_per_gpu, gpu: GPUSpec):
    """Adam step over the parameters this GPU owns: memory-bound, 30 bytes moved per parameter (read fp32 grad,
    master, m, v = 16 B; write master, m, v = 12 B; write the bf16 weight = 2 B)."""
    return params_per_gpu * 30.0 / gpu.hbm_bandwidth_bytes_per_s
