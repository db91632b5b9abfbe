"""Eager PyTorch's element-wise work: what a torchtitan Llama block costs beyond fused kernels when it runs without
``torch.compile`` (``Plan.torch_compile = False`` under ``framework = "fsdp"``).

The estimator's element-wise term (:data:`hetplan.estimate.compute.ELEMENTWISE_PASSES` passes over a layer's
activations, calibrated on Megatron-LM, whose norms, bias-GeLU and bias-dropout-add are fused kernels) stands for
*fused* element-wise kernels: one read of each input and one write of each output. Inductor (``torch.compile``)
fuses torchtitan's element-wise ops the same way. In eager mode every ATen op is its own kernel that reads its
inputs from and writes its output to HBM, often in fp32. This module counts those bytes per op from torchtitan's
model code — ``torchtitan/models/llama/model.py`` and ``torchtitan/models/norms.py`` at pytorch/torchtitan@9dec370
(December 2024, the eager rows of ``hetplan validate``'s ``torchtitan`` set; unchanged in ``models/llama3`` through
mid-2025) — and charges the bytes that eager moves *beyond* the fused kernel at the HBM bandwidth, plus one host
launch (:attr:`hetplan.hardware.catalog.GPUSpec.kernel_overhead_s`) per extra kernel. Forward, per element of the
tensor the op works on (``n`` below; 2-byte bf16 activations, 4-byte fp32):

====================  ==========================================================  =======  =====  =======  =====
op                    eager ATen kernels (bytes read + written per element)        eager B  fused  extra B  extra
                                                                                                    kernels
====================  ==========================================================  =======  =====  =======  =====
RMSNorm (``RMSNorm``  ``x.float()`` 2+4, ``pow(2)`` 4+4, ``mean(-1)`` 4, ``+eps``,  36       4      32       7
``_norm``, x2 per     ``rsqrt`` (per row), ``x * rsqrt`` 4+4, ``type_as`` 4+2,
layer; n = T·h)       ``* weight`` 2+2
rotary                per tensor: ``float()`` 2+4, complex multiply by             20       4      16       5
(``apply_rotary_emb``; ``freqs_cis`` 4+4, ``type_as`` 4+2 (views are free);
n = T·(q + kv))       fused: one kernel for Q and K
SwiGLU (n = T·f)      ``silu(w1 x)`` 2+2, ``* w3 x`` 2+2+2                         10       6      4        1
residual add before   eager: the ``ffn_norm`` re-reads ``h``; fused: the add and    2        0      2        1
``ffn_norm`` (n=T·h)  the norm are one kernel
====================  ==========================================================  =======  =====  =======  =====

(``T`` tokens, ``h`` hidden, ``q``/``kv`` query and key widths, ``f`` MLP width, all on one of ``t`` TP ranks:
the norms and residuals split over TP under sequence parallelism, which torchtitan's TP always uses.) Models with
LayerNorm (``nn.LayerNorm`` is one fused ATen kernel in eager), learned positions or a non-gated MLP
(``F.gelu`` is one kernel) have no extra bytes for those ops; Qwen3-style Q/K norms are two more RMSNorms on
``T·(q + kv)``, Gemma's post-attention and post-MLP norms (``post_norms``) two more on ``T·h``. The repeat of K
and V for grouped-query attention (``repeat_kv``), the SDPA kernel and the second residual add (at the block
boundary, where each compiled region ends) cost the same both ways.

**Backward** runs autograd's derivative of each op, which reads and writes about twice the forward's bytes (for
RMSNorm, counted op by op: 74 B per element) in twice the kernels: 2x forward, the estimator's convention for
element-wise work (:func:`hetplan.estimate.compute.layer_time_s`). Recomputation (full, or torchtitan's per-op SAC,
which recomputes every element-wise op) repeats the forward's.

**Loss.** torchtitan's ``cross_entropy_loss`` upcasts the logits, ``F.cross_entropy(pred.float(), labels)``:
forward ``float()`` 2+4, ``log_softmax`` about 4+4+4+4 (max, sum of exponentials, normalise-and-write), ``nll_loss``
(reads one logit per token): 22 B per logit against the fused term's 8 (:func:`hetplan.estimate.compute.head_time_s`);
backward ``nll_loss_backward`` writes a zeroed fp32 gradient 4, ``log_softmax_backward`` 4+4+4 (+4 for its row
sums), the ``float()`` backward 4+2: 22 B against 8, and 3 more kernels each way
(:data:`hetplan.estimate.compute.CROSS_ENTROPY` ``eager_fp32``).

**FP8 casts** (torchao float8 tensor-wise scaling, :mod:`hetplan.estimate.fp8`): eager
``hp_tensor_to_float8_dynamic`` (pytorch/ao@eab345c ``float8/float8_utils.py``, ``float8_tensor.py``) runs
``abs`` 2+2, ``max`` 2, ``to(float32)`` 2+4, ``* scale`` 4+4, ``clamp`` 4+4, ``to(float8)`` 4+1 = 33 B per element
and 6 kernels plus 4 on the scalar scale, against the fused cast's
:data:`hetplan.estimate.fp8.CAST_BYTES_PER_ELEMENT` ``["tensorwise"]`` = 5 B in two (amax, then cast).

All functions broadcast over numpy arrays (``b``, ``t``, ``sequence_parallel``). Bytes, seconds.
"""

from __future__ import annotations

import numpy as np

from hetplan.estimate import fp8
from hetplan.hardware.catalog import GPUSpec
from hetplan.model import counts
from hetplan.model.spec import ModelSpec
from hetplan.estimate.arrays import Array

#: Extra bytes per element (eager minus fused) and extra kernels of each op of the module doc's table.
RMSNORM_EXTRA_BYTES, RMSNORM_EXTRA_KERNELS = 32.0, 7
ROTARY_EXTRA_BYTES, ROTARY_EXTRA_KERNELS = 16.0, 5
SWIGLU_EXTRA_BYTES, SWIGLU_EXTRA_KERNELS = 4.0, 1
RESIDUAL_EXTRA_BYTES, RESIDUAL_EXTRA_KERNELS = 2.0, 1
#: Bytes per element and kernels of one eager torchao tensor-wise float8 cast (module doc).
EAGER_CAST_BYTES_PER_ELEMENT = 33.0
EAGER_CAST_KERNELS = 10


def _mlp_width(m: ModelSpec) -> float:
    """Gated-MLP width a token passes through in one layer, mean over the model's layers (MoE layers: its
    ``k`` routed experts and the shared experts)."""
    if not m.is_moe:
        return float(m.ffn_hidden_size)
    moe = m.experts_per_token * m.expert_ffn_hidden_size + m.shared_expert_ffn_hidden_size
    dense = m.num_layers - m.num_moe_layers
    return (dense * m.ffn_hidden_size + m.num_moe_layers * moe) / m.num_layers


def eager_layer_bytes(m: ModelSpec, b: Array, s: Array, t: Array = 1, sequence_parallel: Array = False):
    """Bytes one layer's forward moves in eager PyTorch beyond fused kernels, on one of ``t`` TP ranks for a
    micro-batch of ``b`` sequences of ``s`` tokens (module doc's table)."""
    T = np.asarray(b, dtype=float) * np.asarray(s, dtype=float)
    t = np.asarray(t, dtype=float)
    n_h = T * m.hidden_size / np.where(sequence_parallel, t, 1.0)
    n_qk = T * (m.q_dim + m.kv_dim) / t
    out = RESIDUAL_EXTRA_BYTES * n_h
    if m.norm == "rmsnorm":
        out = out + RMSNORM_EXTRA_BYTES * (counts.layer_norms(m) * n_h + (n_qk if m.qk_norm else 0.0))
    if m.learned_positions == 0:
        out = out + ROTARY_EXTRA_BYTES * n_qk
    if m.gated_mlp:
        out = out + SWIGLU_EXTRA_BYTES * T * _mlp_width(m) / t
    return out


def eager_layer_kernels(m: ModelSpec) -> int:
    """Kernels one layer's forward launches in eager PyTorch beyond fused kernels (module doc's table)."""
    norms = (counts.layer_norms(m) + (2 if m.qk_norm else 0)) if m.norm == "rmsnorm" else 0
    return (RESIDUAL_EXTRA_KERNELS + norms * RMSNORM_EXTRA_KERNELS
            + (ROTARY_EXTRA_KERNELS if m.learned_positions == 0 else 0)
            + (SWIGLU_EXTRA_KERNELS if m.gated_mlp else 0))


def eager_cast_time_s(gpu: GPUSpec, shapes: Array):
    """``(forward_s, backward_s)`` that eager torchao float8 casts add to the fused tensor-wise casts of
    :func:`hetplan.estimate.fp8.layer_cast_time_s` for one layer's linear GEMMs ``shapes``
    (``[(M, N, K, batch), ...]``): the inputs ``M·K`` in forward, the output gradients ``M·N`` in backward, at
    :data:`EAGER_CAST_BYTES_PER_ELEMENT` minus the fused recipe's bytes (module doc)."""
    per = (EAGER_CAST_BYTES_PER_ELEMENT - fp8.CAST_BYTES_PER_ELEMENT["tensorwise"]) / gpu.hbm_bandwidth_bytes_per_s
    return sum(M * K * n for M, N, K, n in shapes) * per, sum(M * N * n for M, N, K, n in shapes) * per
