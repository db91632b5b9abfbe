"""Compute time of transformer layers, embedding and head on one GPU: a shape-aware roofline.

**GEMMs.** Every GEMM of a layer is costed on its own shape ``(M, N, K)`` (``M`` rows of the output, ``N``
columns, ``K`` the reduction):

    time = max( 2·M·N·K / (peak · eff(M, N, K)),  2·(M·K + K·N + M·N) / HBM bandwidth )
    eff(M, N, K) = e_max · φ(M) · φ(N) · ψ(K),   φ(x) = x / (x + x½),   ψ(K) = K / (K + K½)

— the roofline of Williams, Waterman & Patterson (CACM 2009) with a compute ceiling that falls for small
dimensions: a GEMM with a small dimension has few output tiles (wave quantisation, idle SMs) or a short
reduction (tile loads not amortised), so it runs far below peak. This is why FASOP measures an A100/A10 per-layer
time ratio of only 1.43 at micro-batch 1 while their peak ratio is 2.5. ``e_max`` is
:attr:`GPUSpec.compute_efficiency` (large GEMMs), ``x½`` is :attr:`GPUSpec.gemm_half_dim`; both are fitted per
GPU type (:mod:`hetplan.calibration.calibrate`, docs/estimator.md).

The reduction's ``K½`` (:func:`reduction_half_dim`) is the per-tile overhead of a tiled GEMM (CUTLASS / cuBLAS:
each thread block loops over ``K`` in its mainloop, then its epilogue converts and stores its ``bm x bn`` output
tile): the mainloop takes ``2·bm·bn·K / P`` and the 2-byte store ``2·bm·bn / B`` (P, B the SM's share of the
peak and of the HBM bandwidth), so the overhead equals ``P / B`` elements of ``K`` — the machine balance. On the
A100 (312 TFLOP/s, 2,039 GB/s: 153) the vTrain fit of ``x½`` (134) is that balance within 13 %. An H100 SXM runs
its tensor cores 3.2x faster on 1.6x the bandwidth (balance 295, 591 for FP8 at twice the rate): a short
reduction (the row-parallel GEMMs' ``h/t``, the layers of a small model) costs it relatively more. ``K½`` is
``x½`` times the GPU's balance over the A100's, so the A100 fits keep their values.

Per layer (tokens ``T = b·s``, TP degree ``t``, Megatron-LM's sharding, Shoeybi et al. 2019): QKV ``(T, (q+2g·d)/t, h)``,
attention scores ``b·a/t`` batched ``(s, s, d)``, attention over values ``b·a/t`` batched ``(s, d, s)``, output
projection ``(T, h, q/t)``, MLP ``(T, f/t, h)`` (``2f/t`` for SwiGLU's fused gate/up) and ``(T, h, f/t)``.

**Separate projections.** Those are Megatron's fused ``linear_qkv`` and ``linear_fc1``. A stack whose model code
runs one ``nn.Linear`` per projection (:attr:`hetplan.hardware.stacks.StackSpec.projections`: torchtitan's ``wq``,
``wk``, ``wv`` and ``w1``, ``w3``; Hugging Face's ``q_proj`` ... ``up_proj``) runs each as a GEMM of its own shape,
``(T, q/t, h)``, ``(T, g·d/t, h)`` twice, and ``(T, f/t, h)`` twice, through the same :func:`gemm_time_s`: each
reads the layer input again (its ``M·K`` operand bytes), each has its own shape efficiency (with GQA the key and
value GEMMs are narrow: Llama 3 8B's ``N = 1024``), and each is a kernel of its own (:func:`projection_kernels`;
under ``torch.compile`` the mm's stay extern kernels, Inductor does not merge them). Backward runs two GEMMs per
forward GEMM, as for the fused ones, and sums the input gradients the separate linears return for their shared
input (:func:`projection_grad_sum_bytes`).

**Element-wise work** (norms, softmax, dropout, GeLU, residual adds): memory-bound, ``ELEMENTWISE_PASSES``
passes over the activation bytes the layer produces (:func:`hetplan.model.counts.layer_activation_bytes`).

**Kernel overhead (host floor)**: each of the ``KERNELS_PER_LAYER_FORWARD`` kernels of a Megatron-LM layer costs
a fixed :attr:`GPUSpec.kernel_overhead_s` of host time (Python, framework and driver launch cost, plus ramp-up and
tail); a layer cannot run faster than the host launches it, which dominates small layers. It is a property of the
*machine* (CPU, driver, software stack), not of the model: the catalog value of a GPU type is that of the host it
was calibrated on (A100: a DGX A100, vTrain's data; A10G: AWS g5, the only host it comes in), and a pool on another
host overrides it with ``GPUPool.kernel_overhead_s`` (:func:`pool_gpu`). FASOP's AWS p4d A100 host, for example,
launches at 1.7x the DGX's cost per kernel (73.8 vs 44.3 µs; docs/estimator.md, Calibration).

**Backward** = 2x forward (two GEMMs per forward GEMM, Narayanan et al. SC'21 Sec. 5.1; the element-wise and
kernel terms doubled likewise). **Recomputation** adds one forward of the recomputed part to the backward pass
(full: the whole layer including its TP collectives; selective: the attention core, Korthikanti et al. 2023
Sec. 5).

**TP collectives** (Shoeybi et al. 2019 Sec. 3): two all-reduces of ``b·s·h`` activations per layer in forward
and two in backward; with sequence parallelism an all-gather plus a reduce-scatter each (Korthikanti et al.
Sec. 4.2.2: same volume); under FP8 with sequence parallelism the all-gathers carry the FP8 inputs of the
column-parallel GEMMs (forward) and the FP8 output gradients of the row-parallel ones (backward), 1 byte per
element (:mod:`hetplan.estimate.fp8`). Costed with :func:`hetplan.estimate.comm.group_collective_time_s`, so a TP group
that spans nodes pays the inter-node link. Not overlapped with compute (Megatron-LM does not).

All functions broadcast over numpy arrays (``b``, ``t`` and the recompute code may be arrays).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from hetplan.estimate import fp8
from hetplan.estimate.comm import group_collective_time_s, overlap_contention, overlapped_exposed_s
from hetplan.estimate.stagework import LayerTerms, Recompute
from hetplan.hardware.catalog import GPUSpec, default_attention_kernel
from hetplan.model import counts
from hetplan.model.spec import ModelSpec
from hetplan.estimate.arrays import Array

#: Passes over the produced activation bytes made by the element-wise kernels of a layer (write + read).
ELEMENTWISE_PASSES = 2.0
#: Kernels in one Megatron-LM GPT layer forward: 2 LayerNorms, 4 linear GEMMs, 2 batched attention GEMMs,
#: fused scale-mask-softmax, attention dropout, 2 bias-dropout-add, bias-GeLU, and ~5 layout copies
#: (QKV split/permute, context permute). Counted from Megatron-LM's ``ParallelTransformerLayer``.
KERNELS_PER_LAYER_FORWARD = 18
#: Kernels of the attention core (scores, softmax, dropout, context, copies): recomputed by selective recompute.
KERNELS_ATTENTION_CORE = 6
#: Kernels FlashAttention saves per layer forward: scores GEMM, scale-mask-softmax, dropout and context GEMM
#: become one fused kernel (Dao et al. 2022).
FLASH_FUSED_KERNELS = 3
#: Dtype size of GEMM operands (bytes).
OPERAND_BYTES = 2

#: :class:`~hetplan.estimate.stagework.Recompute` of each plan name.
RECOMPUTE_CODES = {r.name.lower(): r for r in Recompute}


def attention_kernel(job: Array, gpu: GPUSpec) -> str:
    """The fused attention kernel ``job`` runs on ``gpu``: ``job.attention_kernel`` if set, else what its stack
    runs on the GPU's architecture (``Job.stack_spec().kernel_on``, :mod:`hetplan.hardware.stacks`); ``job``
    None: Megatron's default stack."""
    chosen = getattr(job, "attention_kernel", None)
    if chosen is not None:
        return chosen
    if hasattr(job, "stack_spec"):
        return job.stack_spec().kernel_on(gpu.family_name)
    return default_attention_kernel(getattr(job, "framework", "megatron"), gpu.family_name)


def pool_gpu(catalog: Array, pool: Array, field: str = "gpu", job: Array = None) -> GPUSpec:
    """The :class:`GPUSpec` of ``pool``'s GPU type as it runs ``job``'s software on that pool's machines: the
    catalog entry, with ``attention_kernel`` set to the kernel the job runs there (:func:`attention_kernel`),
    the GEMM efficiencies times the job's stack's ``gemm_factor`` (:class:`hetplan.hardware.stacks.StackSpec`),
    ``kernel_overhead_s`` replaced by the pool's ``kernel_overhead_s`` (seconds per kernel) when the pool sets one
    (a host slower or faster at launching kernels than the one the catalog value was calibrated on), and
    ``attention_efficiency`` by the pool's (a measured attention rate of its software stack).

    Raises:
        HetplanError: unknown GPU type (the message names ``field``).
    """
    gpu = catalog.get(pool.gpu, field=field)
    update: dict = {"attention_kernel": attention_kernel(job, gpu)}
    factor = job.stack_spec().gemm_factor if hasattr(job, "stack_spec") else 1.0
    if factor != 1.0:  # the stack's residual GEMM efficiency (StackSpec.gemm_factor, fitted on its own rows)
        update["compute_efficiency"] = min(1.0, gpu.compute_efficiency * factor)
        if gpu.fp8_compute_efficiency is not None:
            update["fp8_compute_efficiency"] = min(1.0, gpu.fp8_compute_efficiency * factor)
    if getattr(pool, "kernel_overhead_s", None) is not None:
        update["kernel_overhead_s"] = float(pool.kernel_overhead_s)
    if getattr(pool, "attention_efficiency", None) is not None:
        update["attention_efficiency"] = tuple(pool.attention_efficiency)
    return gpu.model_copy(update=update)


#: Machine balance (dense 16-bit peak FLOP/s per HBM byte/s) of the GPU the shape constant ``gemm_half_dim`` was
#: fitted on: the A100-SXM-80GB (312 TFLOP/s, 2,039 GB/s; vTrain's rows, docs/estimator.md Calibration).
REFERENCE_BALANCE_FLOP_PER_BYTE = 312e12 / 2039e9


def reduction_half_dim(gpu: GPUSpec, dtype: str = "bf16"):
    """Reduction length ``K½`` (elements) at which a GEMM's per-tile overhead (the epilogue's store of its output
    tile against the mainloop over ``K``; module doc) halves its efficiency: ``gemm_half_dim`` scaled by the GPU's
    machine balance (``dtype`` dense peak / HBM bandwidth) over the reference machine's
    (:data:`REFERENCE_BALANCE_FLOP_PER_BYTE`): 134 on the A100-SXM-80GB, 259 on the H100 SXM in bf16 and 517 in
    FP8, 274 on GB200.

    Raises:
        HetplanError: the GPU lacks ``dtype``."""
    balance = gpu.peak_flops_per_s(dtype) / gpu.hbm_bandwidth_bytes_per_s
    return gpu.gemm_half_dim * balance / REFERENCE_BALANCE_FLOP_PER_BYTE


def gemm_efficiency(gpu: GPUSpec, M: Array, N: Array, K: Array, dtype: str = "bf16", row_tile: Array = None):
    """Fraction of the ``dtype`` dense peak a GEMM of shape (M, N, K) reaches: ``e_max · φ(M)·φ(N)·ψ(K)`` (module
    doc; ``K½`` of ψ: :func:`reduction_half_dim`); ``e_max`` of FP8 GEMMs: :func:`hetplan.estimate.fp8.gemm_ceiling`.
    ``row_tile``: the ``M`` rows are charged by tile quantisation, ``M / (⌈M / row_tile⌉ · row_tile)``, instead of
    φ(M) (:func:`gemm_time_s`)."""
    x0 = gpu.gemm_half_dim
    k0 = reduction_half_dim(gpu, dtype)
    rows = M / (M + x0) if row_tile is None else M / (np.ceil(M / row_tile) * row_tile)
    return fp8.gemm_ceiling(gpu, dtype) * rows * N / (N + x0) * K / (K + k0)


def gemm_time_s(gpu: GPUSpec, dtype: str, M: Array, N: Array, K: Array, batch: Array = 1, weight_bytes: Array = None,
                row_tile: Array = None):
    """Seconds for ``batch`` GEMMs of shape (M, N, K) on ``gpu`` (roofline with shape-dependent ceiling). FP8
    GEMMs (:mod:`hetplan.estimate.fp8`): the FP8 peak and ceiling, 1-byte inputs, bf16 output.
    ``weight_bytes``: bytes per element of the ``K x N`` operand when it is stored narrower than the GEMM's
    dtype (weight-only quantisation, W8A16 / W4A16: the kernel reads the narrow weights and widens them in
    registers; :mod:`hetplan.estimate.inference`); default: the operand size of ``dtype``. ``row_tile``: the GEMM
    is one of a serving engine's decode steps, whose ``M`` = the running batch (1 to a few hundred rows) is far
    below the training GEMMs that fitted φ; such skinny GEMMs run kernels that tile ``M`` at the tensor cores'
    MMA row count and spread ``N`` (and split ``K``) over the SMs, so the rows cost their padding to the tile
    (:func:`gemm_efficiency`), not φ(M) (weight-only kernels: Frantar et al. 2024, "MARLIN", Sec. 3-4: memory-bound
    up to batch 16-32).

    Raises:
        HetplanError: the GPU lacks ``dtype``.
    """
    flops = 2.0 * batch * M * N * K
    operand = fp8.OPERAND_BYTES if fp8.is_fp8(dtype) else OPERAND_BYTES
    weight = operand if weight_bytes is None else weight_bytes
    bytes_ = batch * (operand * M * K + weight * K * N + OPERAND_BYTES * M * N)
    return np.maximum(flops / (gpu.peak_flops_per_s(dtype) * gemm_efficiency(gpu, M, N, K, dtype, row_tile)),
                      bytes_ / gpu.hbm_bandwidth_bytes_per_s)


def wgrad_bf16_extra_s(gpu: GPUSpec, recipe_name: str, shapes: Array):
    """Seconds the weight-gradient GEMMs of one layer's linear ``shapes`` take beyond the FP8 rate in one
    micro-batch's backward: under ``rowwise_with_gw_hp`` they run in bf16 (:mod:`hetplan.estimate.fp8`),
    ``Σ n·(t_bf16 − t_fp8)`` of each ``(M, N, K, n)`` GEMM (:func:`gemm_time_s`: the weight gradient has the
    forward's FLOPs); 0 for every other recipe."""
    if recipe_name != "rowwise_with_gw_hp":
        return 0.0
    return sum(gemm_time_s(gpu, "bf16", M, N, K, n) - gemm_time_s(gpu, fp8.FP8, M, N, K, n) for M, N, K, n in shapes)


#: :attr:`hetplan.hardware.stacks.StackSpec.projections` of Megatron's layer: one QKV and one gate/up GEMM.
FUSED = "fused"


def separate_qkv(projections: str) -> bool:
    """Whether ``projections`` (:attr:`hetplan.hardware.stacks.StackSpec.projections`) runs Q, K and V as three
    GEMMs."""
    return projections == "separate"


def separate_gate_up(projections: str) -> bool:
    """Whether ``projections`` runs a gated MLP's gate and up projections as two GEMMs."""
    return projections in ("separate", "fused-qkv")


def attention_linear_shapes(m: ModelSpec, T: Array, t: Array, projections: str = FUSED):
    """``[(M, N, K), ...]`` of a layer's attention projections on one of ``t`` TP ranks for ``T`` tokens: fused QKV
    ``(T, (q+2g·d)/t, h)`` — or, where the stack runs them separately (``projections``, module doc), Q
    ``(T, q/t, h)``, K and V ``(T, g·d/t, h)`` — then the output ``(T, h, q/t)``."""
    h, q, kv = m.hidden_size, m.q_dim, m.kv_dim
    qkv = [(T, q / t, h), (T, kv / t, h), (T, kv / t, h)] if separate_qkv(projections) else [(T, (q + 2 * kv) / t, h)]
    return qkv + [(T, h, q / t)]


def mlp_linear_shapes(m: ModelSpec, T: Array, f: Array, t: Array, projections: str = FUSED):
    """``[(M, N, K), ...]`` of a TP-split MLP of inner size ``f`` on ``T`` tokens: ``(T, f/t, h)`` (``2f/t`` for
    SwiGLU's fused gate/up; twice ``(T, f/t, h)`` where the stack runs gate and up separately, ``projections``)
    and ``(T, h, f/t)``."""
    h = m.hidden_size
    if m.gated_mlp and separate_gate_up(projections):
        return [(T, f / t, h), (T, f / t, h), (T, h, f / t)]
    up = (2 if m.gated_mlp else 1) * f
    return [(T, up / t, h), (T, h, f / t)]


def projection_kernels(m: ModelSpec, projections: str = FUSED) -> int:
    """GEMM kernels one dense layer's forward launches beyond the four of Megatron's layer
    (:data:`KERNELS_PER_LAYER_FORWARD`) when the stack runs its projections separately (``projections``): K and V
    (not under MLA, whose projections are its own), and the up projection of a gated dense MLP (a MoE layer's
    experts are priced by :mod:`hetplan.estimate.moe`)."""
    qkv = 2 if separate_qkv(projections) and not m.is_mla else 0
    return qkv + (1 if m.gated_mlp and not m.is_moe and separate_gate_up(projections) else 0)


#: Bytes per element of the layer input to add one more linear's input gradient into the sum autograd returns for
#: an input several linears read (``torch/csrc/autograd/input_buffer.cpp`` ``InputBuffer::add``): eager, one add
#: kernel that reads the running sum and the new gradient and writes the sum (2 + 2 + 2 B, bf16); compiled, the
#: adds are point-wise nodes of the joint graph that Inductor fuses into the kernel consuming the sum (the norm's
#: backward), which reads one more 2-byte tensor per addend.
GRAD_SUM_BYTES_EAGER, GRAD_SUM_BYTES_COMPILED = 6.0, 2.0


def projection_grad_sum_bytes(m: ModelSpec, b: Array, s: Array, projections: str = FUSED, eager: bool = False):
    """Bytes one dense layer's backward moves summing the input gradients of its separate projections
    (``projections``): K and V add theirs to Q's, up to gate's (:func:`projection_kernels` addends), each over
    the ``b·s·h`` layer input — whole on every TP rank, the input the column-parallel GEMMs read after the
    sequence-parallel all-gather — at :data:`GRAD_SUM_BYTES_EAGER` (one add kernel each) or
    :data:`GRAD_SUM_BYTES_COMPILED` per element. 0 for fused projections (one GEMM writes the gradient)."""
    per = GRAD_SUM_BYTES_EAGER if eager else GRAD_SUM_BYTES_COMPILED
    return projection_kernels(m, projections) * per * b * s * m.hidden_size


def attention_gemm_times_s(m: ModelSpec, gpu: GPUSpec, dtype: str, b: Array, s: Array, t: Array,
                           projections: str = FUSED):
    """``(linear_s, core_s)``: forward time of a layer's attention projections (QKV fused or separate as
    ``projections`` says, :func:`attention_linear_shapes`; output) and of its two attention-core batched GEMMs, for
    one micro-batch of ``b`` sequences on one of ``t`` TP ranks. Under FP8 the projections run in FP8, the core in
    bf16 (:mod:`hetplan.estimate.fp8`)."""
    a, d = m.num_attention_heads, m.head_dim
    linear = sum(gemm_time_s(gpu, dtype, M, N, K) for M, N, K in attention_linear_shapes(m, b * s, t, projections))
    heads = b * a / t
    hp = fp8.high_precision(dtype)
    core = gemm_time_s(gpu, hp, s, s, d, heads) + gemm_time_s(gpu, hp, s, d, s, heads)
    return linear, core * core_alignment_factor(m, gpu, hp)


#: Byte alignment below which the attention core's batched GEMMs run on CUDA cores. cuBLAS's tensor-core kernels
#: want every operand pointer, leading dimension and batch stride 16-byte aligned (cuBLAS documentation, "Tensor
#: Core Usage" restrictions: 128-bit accesses). Below 8 bytes (an odd head dimension, or twice an odd one) the
#: cores are charged the SIMT rate: BLOOM's d = 225 (2-byte aligned, below) runs at it, its 20 rows of 02-20 within
#: -6.4…+6.0 %. The six 4-byte-aligned rows of 02-17 (d = 150 and 450) are 5-13 % faster than that charge and
#: 15-24 % slower than no charge: a tensor-core kernel of narrower loads, whose rate no source gives, so they keep
#: the SIMT charge (docs/estimator.md, BigScience). At exactly 8 bytes the slowdown is a measured property of the
#: GPU (:attr:`hetplan.hardware.catalog.GPUSpec.core_align8_slowdown`).
SIMT_BELOW_BYTES = 8
#: Byte alignment of the batch pointers at and above which the core's GEMMs run at their full rate.
ALIGNED_BYTES = 16


def head_alignment_bytes(m: ModelSpec) -> int:
    """Alignment (bytes) of the attention core's batch pointers, ``d`` 2-byte elements apart: the largest power of
    two dividing ``2·d``, at most :data:`ALIGNED_BYTES` (d = 128: 16; d = 108: 8; d = 150: 4; d = 225: 2)."""
    pointer_bytes = int(m.head_dim) * OPERAND_BYTES
    return min(pointer_bytes & -pointer_bytes, ALIGNED_BYTES)


def core_alignment_factor(m: ModelSpec, gpu: GPUSpec, dtype: str) -> float:
    """Slowdown of the materialised attention core's two batched GEMMs (``baddbmm`` / ``bmm`` on Megatron's
    ``[s, b·a, d]`` layout, whose batches lie ``d`` elements apart) by the alignment of their batch pointers,
    ``2·d`` bytes:

    * below :data:`SIMT_BELOW_BYTES`: cuBLAS runs CUDA-core kernels at the GPU's fp32 FMA rate (fp32
      accumulation), ``peak(dtype) / peak(fp32)`` times slower at the same shape efficiency (A100: 312 / 19.5 =
      16). Measured by BLOOM's layout search: hidden 14,400 with 64 heads (d = 225) ran 221 s per step where
      hidden 13,824 (d = 216) ran 160 s in the same layout (bigscience chronicles-prequel.md, "tile and wave
      quantization"; 8.5 % more FLOPs);
    * exactly 8 bytes (d = 100, 108): the GPU's measured :attr:`~hetplan.hardware.catalog.GPUSpec.
      core_align8_slowdown` (A100: BLOOM's 128 heads of d = 108 ran 100-105 TFLOP/s per GPU where 64 and 96 heads
      of the same model ran 130-157 in the same layouts, chronicles-prequel.md "NHEADs comparison"; FASOP's GPT-2 XL,
      d = 100, held out); 1 where not measured;
    * 16 bytes and more: 1.

    1 also for GPUs without an fp32 rate."""
    aligned = head_alignment_bytes(m)
    if aligned == ALIGNED_BYTES or "fp32" not in gpu.dense_flops_per_s:
        return 1.0
    if aligned == SIMT_BELOW_BYTES:
        return gpu.core_align8_slowdown or 1.0
    return gpu.peak_flops_per_s(dtype) / gpu.peak_flops_per_s("fp32")


def mlp_gemm_time_s(m: ModelSpec, gpu: GPUSpec, dtype: str, tokens: Array, f: Array, t: Array,
                    projections: str = FUSED):
    """Forward time of a TP-split MLP of inner size ``f`` on ``tokens`` tokens (:func:`mlp_linear_shapes`)."""
    return sum(gemm_time_s(gpu, dtype, M, N, K) for M, N, K in mlp_linear_shapes(m, tokens, f, t, projections))


def layer_gemm_times_s(m: ModelSpec, gpu: GPUSpec, dtype: str, b: Array, s: Array, t: Array,
                       projections: str = FUSED):
    """``(linear_s, core_s)``: forward time of a layer's linear GEMMs (four fused, or each projection its own as
    ``projections`` says: :func:`attention_linear_shapes`, :func:`mlp_linear_shapes`) and of its two
    attention-core batched GEMMs, for one micro-batch of ``b`` sequences on one of ``t`` TP ranks (dense layers;
    MoE and MLA layers: :func:`hetplan.estimate.moe.layer_gemm_times_s`)."""
    linear, core = attention_gemm_times_s(m, gpu, dtype, b, s, t, projections)
    return linear + mlp_gemm_time_s(m, gpu, dtype, b * s, m.ffn_hidden_size, t, projections), core


#: Exponent of the smooth maximum between GPU work and host launch time (p-norm; large = hard max).
FLOOR_NORM = 4.0


def _softmax_floor(gpu_s: Array, host_s: Array):
    k = FLOOR_NORM
    return (gpu_s**k + host_s**k) ** (1.0 / k)


#: Query/key tile of the FlashAttention kernels (FlashAttention-2 and -3 use 128-row tiles at head dim 128;
#: Dao 2023 Sec. 3.1.1, Shah et al. 2024 Sec. 3): a causal kernel computes the tiles on and below the diagonal.
FLASH_TILE = 128


def causal_work_fraction(s: Array):
    """Fraction of the full ``s x s`` score work a causal FlashAttention kernel does: it skips the tiles above the
    diagonal and computes the ``n(n+1)/2`` others in full, ``n = s / FLASH_TILE`` (Dao 2023, FlashAttention-2,
    Sec. 3.1.1: "about half"; 1.7-1.8x faster than non-causal, where the fraction alone gives 1.88-1.97x at s = 2k-8k
    and times the kernel's causal efficiency η = 0.93 1.75-1.83x, :func:`flash_attention_time_s`).
    ``(s + B) / (2 s)``, B the tile; 1 for ``s <= B``."""
    s = np.asarray(s, dtype=float)
    return np.minimum(1.0, (s + FLASH_TILE) / (2.0 * s))


def window_work_fraction(s: Array, w: Array):
    """Fraction of the full ``s x s`` score work a causal sliding-window FlashAttention kernel does (window ``w``
    keys): each block of query rows scores only the key blocks from its first row minus ``w`` to its diagonal
    (``n_block_min`` from ``window_size_left``, Dao-AILab/flash-attention ``csrc/flash_attn/src/flash_fwd_kernel.h``;
    sliding-window local attention since FlashAttention v2.3): ``(w + B) / s`` of the keys, the first ``w`` rows
    fewer (``w² / (2s²)``), B the tile; never more than the causal kernel (:func:`causal_work_fraction`)."""
    s = np.asarray(s, dtype=float)
    w = np.minimum(s, np.asarray(w, dtype=float))
    return np.minimum(causal_work_fraction(s), (w + FLASH_TILE) / s - w * w / (2.0 * s * s))


def flash_attention_time_s(m: ModelSpec, gpu: GPUSpec, dtype: str, b: Array, s: Array, t: Array, causal: Array = True):
    """``(forward_s, backward_s)`` of the fused FlashAttention kernel of one layer, one micro-batch, one of ``t``
    TP ranks.

    Work: forward ``4·b·s²·q/t`` FLOPs (QKᵀ and PV), causal times :func:`causal_work_fraction` (the tiles the
    kernel computes, the diagonal ones whole) — on a model's sliding-window layers :func:`window_work_fraction`,
    averaged over the layers (the unmasked blocks of context parallelism keep the full product: not windowed);
    backward 2.5x the forward (five s x s matmuls: the recomputed QKᵀ, dV, dP, dQ, dK; Dao 2023 Sec. 3.1.2). Rate: the dense 16-bit peak (FlashAttention runs in bf16/fp16 also in
    FP8 training) times the efficiency of the kernel the job's software runs on this GPU
    (:meth:`hetplan.hardware.catalog.GPUSpec.flash_attention_efficiency`, :func:`pool_gpu`): its non-causal rate,
    causal times its ``attention_causal_efficiency`` η (masking the diagonal tiles, rows of unequal length), times
    the shape factor ``φ(s)`` of :func:`gemm_efficiency` (short sequences give few tiles per head:
    FlashAttention-3 on H100 reaches 72 % / 87 % / 97 % of its 16k rate at s = 512 / 1k / 2k, Shah et al. 2024
    Fig. 5; φ with x½ = 134 gives 79 / 88 / 94 %).

    The causal terms against Shah et al. 2024 Fig. 5 (H100 SXM5, bf16, head dim 128, causal; the figure counts
    half the s² FLOPs, so its rate is ``peak·e·η·φ(s) / (2·causal_work_fraction(s))`` here): with η = 0.91
    (cuDNN), 0.95 (FlashAttention-3), 0.93 (FlashAttention-2) the model gives 485 / 516 / 532 / 541, 540 / 574 /
    592 / 601 and 301 / 320 / 330 / 335 TFLOP/s at s = 2k / 4k / 8k / 16k against the measured 484 / 518 / 529 /
    539, 521 / 579 / 602 / 616 and 298 / 319 / 333 / 335 (within 4 %); at s = 512 / 1k it is 11-33 % / 3-14 %
    fast (the triangle's short rows cost more than φ says). Tile fraction and η are not a double count: the
    fraction is the work the kernel does, η its rate on that work relative to the unmasked kernel."""
    peak = gpu.peak_flops_per_s("fp16" if dtype == "fp16" else "bf16")
    shape = s / (s + gpu.gemm_half_dim)
    full = 4.0 * b * s * s * m.q_dim / t
    (cf, cb), (nf, nb) = gpu.flash_attention_efficiency(causal=True), gpu.flash_attention_efficiency()
    masked = causal_work_fraction(s)
    if m.sliding_window_layers:  # the mean over layers, as the layer time is (counts.attended_keys)
        share = m.sliding_window_layers / m.num_layers
        masked = (1.0 - share) * masked + share * window_work_fraction(s, m.sliding_window)
    work = full * np.where(causal, masked, 1.0)
    fwd_eff, bwd_eff = np.where(causal, cf, nf), np.where(causal, cb, nb)
    return work / (peak * fwd_eff * shape), 2.5 * work / (peak * bwd_eff * shape)


def eager_score_bytes(m: ModelSpec) -> tuple[int, int]:
    """``(forward, backward)`` bytes of memory traffic per attention score (one element of one head's s x s
    matrix) of the element-wise kernels of Hugging Face eager attention in bf16, op by op (read + write; the
    two batched GEMMs are costed as GEMMs, the broadcast causal mask is read from cache):

    * scale the scores: 2 + 2 forward, 2 + 2 backward (``GPT2Attention._attn`` divides by ``sqrt(d)``;
      ``BloomAttention`` folds the scale into ``alibi.baddbmm``, whose copy of the broadcast ALiBi bias into its
      output and read of it in the GEMM cost the same 4 forward and has no backward: 4 bytes too many there);
    * causal mask (``torch.where`` / ``masked_fill``): 2 + 2 each way;
    * softmax: 2 + 2 forward, 2 + 2 + 2 backward (reads output and gradient) in bf16; with ``softmax_fp32``
      (``F.softmax(..., dtype=torch.float32).to(bf16)``: PyTorch converts a bf16 input to fp32 first) 6 (upcast)
      + 8 (fp32 softmax) + 6 (cast back) forward and 6 + 12 + 6 backward;
    * dropout on the probabilities when the model has it (``attn_pdrop``): 2 + 2 + a 1-byte mask each way
      (``nn.Dropout(0.0)`` returns its input: no kernel).

    GPT-2 (dropout, bf16 softmax): 17 / 19; BLOOM (fp32 softmax, no dropout): 28 / 32. Megatron-LM's
    ``standard`` attention runs one fused scale-mask-softmax kernel instead (:func:`layer_time_s`)."""
    softmax = (20, 24) if m.softmax_fp32 else (4, 6)
    dropout = 5 if m.dropout else 0
    return 4 + 4 + softmax[0] + dropout, 4 + 4 + softmax[1] + dropout


#: Threads per block of Megatron's fused softmax kernels (``scaled_masked_softmax.h`` ``get_batch_per_block``:
#: ``constexpr int threads_per_block = 128``; Transformer Engine's copy of the kernels the same).
SOFTMAX_THREADS_PER_BLOCK = 128


def softmax_batch_per_block(keys: Array):
    """Rows of scores one CUDA block of Megatron's fused softmax handles, for ``keys`` elements per row:
    ``next_power_of_two = 2^ceil(log2 keys)``, a warp of ``min(next_power_of_two, 32)`` threads, 2 rows per warp
    up to 128 elements, 1 above, :data:`SOFTMAX_THREADS_PER_BLOCK` threads per block
    (``megatron/fused_kernels/scaled_masked_softmax.h`` ``get_batch_per_block``): 4 for 256 < keys <= 2048."""
    p = 2.0 ** np.ceil(np.log2(np.maximum(np.asarray(keys, dtype=float), 1.0)))
    warp = np.minimum(p, 32.0)
    return SOFTMAX_THREADS_PER_BLOCK / warp * np.where(p <= 128, 2.0, 1.0)


class SoftmaxRule(NamedTuple):
    """One release's ``is_kernel_available`` (:func:`fused_softmax_runs`): the kernel takes the scores when
    ``min_keys < s <= max_keys``, ``s % key_multiple == 0``, the attention batches ``b·a/t`` are a multiple of
    ``batch_multiple`` and of the kernel's batch per block (``per_block``: computed from the key length, from
    the heads per rank, or not checked), and the scores are 16-bit (fp16 only where ``fp16_only``; fp32 never;
    FP8 runs feed the softmax 16-bit scores); ``scaled``: its PyTorch
    fallback applies the query-key layer scale (:data:`SOFTMAX_FALLBACK_BYTES`)."""

    min_keys: int
    max_keys: int
    key_multiple: int
    batch_multiple: int
    per_block: str | None
    fp16_only: bool
    scaled: bool


#: The fused-softmax rules of the stacks (:attr:`hetplan.hardware.stacks.StackSpec.fused_softmax`), each from its
#: release's ``is_kernel_available`` (:func:`fused_softmax_runs`).
SOFTMAX_RULES = {
    "fp16-2048": SoftmaxRule(0, 2048, 1, 1, None, True, True),
    "megatron-2048": SoftmaxRule(16, 2048, 4, 4, None, False, True),
    "megatron-2048-heads": SoftmaxRule(16, 2048, 4, 4, "heads", False, True),
    "megatron-4096": SoftmaxRule(16, 4096, 4, 4, "keys", False, True),
    "te-16384": SoftmaxRule(16, 16383, 8, 4, "keys", False, False),  # sk < 16384
}


def fused_softmax_runs(rule: str, m: ModelSpec, dtype: str, b: Array, s: Array, t: Array):
    """Whether Megatron's ``FusedScaleMaskSoftmax`` runs its fused CUDA kernel on a causal layer's
    ``[b, a/t, s, s]`` scores under the stack's ``rule`` (:attr:`hetplan.hardware.stacks.StackSpec.fused_softmax`,
    :data:`SOFTMAX_RULES`), or falls back to PyTorch ops (:func:`softmax_fallback_work`). The checks of
    ``is_kernel_available``, with ``bn = b·a/t`` the attention batches:

    * ``any``: every shape (no fused softmax with constraints: flash or eager stacks, or none known);
    * ``fp16-2048``: fp16 input and ``s <= 2048`` (Megatron-LM v2.0, ``megatron/model/fused_softmax.py`` at
      be473a5b);
    * ``megatron-2048``: ``16 < s <= 2048``, ``s % 4 == 0``, ``bn % 4 == 0`` (Megatron-LM 2021-03 to 2022-01,
      ``custom_kernel_constraint`` of NVIDIA/Megatron-LM@0fa7175f);
    * ``megatron-2048-heads``: as ``megatron-2048``, and ``bn`` a multiple of the kernel's batch per block computed
      from the *heads per rank* instead of the key length (bigscience-workshop/Megatron-DeepSpeed from #151,
      2021-10-21, to #260, 2022-03-06: the static ``get_batch_per_block(b, np, sq, sk)`` is called as
      ``(sq, sk, b, np)`` and hands ``np`` to the C++ function as the key length): ``bn % batch_per_block(a/t)``,
      so 8 heads per rank need a micro-batch of 4, 14 of 8 (the chronicle of BLOOM's layout search,
      ``train/tr11-176B-ml/chronicles-prequel.md``, "NHEADs comparison");
    * ``megatron-4096``: ``16 < s <= 4096``, ``s % 4 == 0``, ``bn % 4 == 0`` and ``bn % batch_per_block(s) == 0``
      (NVIDIA/Megatron-LM@7a77abd9, 2022-01-12, to Megatron-Core's local spec today,
      ``megatron/core/fusions/fused_softmax.py``);
    * ``te-16384``: ``16 < s < 16384``, ``s % 8 == 0``, ``bn % 4 == 0`` and ``bn % batch_per_block(s) == 0``
      (Transformer Engine's unfused attention, ``transformer_engine/pytorch/attention/dot_product_attention/
      softmax.py`` ``FusedScaleMaskSoftmax.is_kernel_available``).

    Every rule but ``any`` also needs a 16-bit input (``input_in_float16``): fp32 runs fall back. Broadcasts over
    ``b``, ``s``, ``t``.

    Raises:
        ValueError: an unknown rule."""
    b, s, t = (np.asarray(x, dtype=float) for x in (b, s, t))
    shape = np.broadcast(b, s, t).shape
    if rule == "any":
        return np.ones(shape, dtype=bool)
    if rule not in SOFTMAX_RULES:
        raise ValueError(f"unknown fused-softmax rule {rule!r}")
    r = SOFTMAX_RULES[rule]
    heads = m.num_attention_heads / t
    bn = b * heads
    half = dtype == "fp16" if r.fp16_only else dtype != "fp32"
    ok = (half & (s > r.min_keys) & (s <= r.max_keys) & (np.mod(s, r.key_multiple) == 0)
          & (np.mod(bn, r.batch_multiple) == 0))
    if r.per_block is not None:
        ok = ok & (np.mod(bn, softmax_batch_per_block(heads if r.per_block == "heads" else s)) == 0)
    return np.broadcast_to(ok, shape)


#: ``(forward, backward)`` bytes per score that the PyTorch fallback of ``FusedScaleMaskSoftmax`` moves beyond
#: the fused kernel (``forward_torch_softmax``, 16-bit scores, ``softmax_in_fp32``): ``input.float()`` 2 + 4,
#: the scale ``input * scale`` 4 + 4 (Megatron-LM's query-key layer scaling, on by default before Megatron-Core:
#: ``--no-query-key-layer-scaling`` in ``megatron/arguments.py``), ``masked_fill_`` 4 + 4, ``torch.nn.Softmax``
#: 4 + 4, ``.half()`` / ``.bfloat16()`` 4 + 2 = 36 forward against the fused kernel's 2 + 2; backward the
#: autograd nodes in reverse, 6 + 12 + 8 + 8 + 6 = 40 against the fused backward's 2 + 2 + 2. Without the scale
#: (Transformer Engine's unfused attention scales in the score GEMM, ``SoftmaxRule.scaled`` false): 8 fewer each
#: way. Keyed by ``scaled``.
SOFTMAX_FALLBACK_BYTES = {True: (32.0, 34.0), False: (24.0, 26.0)}
#: Kernels the fallback launches beyond the fused one, per pass: upcast, scale, mask, downcast (3 unscaled).
SOFTMAX_FALLBACK_KERNELS = {True: 4, False: 3}


def softmax_fallback_work(rule: str, m: ModelSpec, dtype: str, b: Array, s: Array, t: Array):
    """``(forward_bytes, backward_bytes, kernels)`` a layer's attention adds where its stack's fused softmax does
    not take the shape (:func:`fused_softmax_runs` false): :data:`SOFTMAX_FALLBACK_BYTES` per score of the
    ``b·(a/t)·s²`` scores, and :data:`SOFTMAX_FALLBACK_KERNELS` more kernels per forward (the host floor of
    :func:`layer_time_s` doubles them in backward). Zero where the kernel runs, and for rule ``any``. Evidence:
    vTrain's single-node rows whose ``b·a/t`` is not a multiple of 4 (TP 8, 16 heads, micro-batch 1: 32 rows)
    were predicted 17-26 % fast against 0.1 % for the other 1,408 rows; BLOOM's layout search measured
    micro-batch 6 slower than 4 (123.6 vs 114.1 s) with 8 heads per rank (docs/estimator.md).

    Raises:
        ValueError: an unknown rule."""
    fallback = ~fused_softmax_runs(rule, m, dtype, b, s, t)
    scaled = rule == "any" or SOFTMAX_RULES[rule].scaled
    fwd, bwd = SOFTMAX_FALLBACK_BYTES[scaled]
    scores = np.asarray(b, dtype=float) * m.num_attention_heads / np.asarray(t, dtype=float) * np.asarray(s, dtype=float) ** 2
    return (np.where(fallback, fwd * scores, 0.0), np.where(fallback, bwd * scores, 0.0),
            np.where(fallback, float(SOFTMAX_FALLBACK_KERNELS[scaled]), 0.0))


def layer_time_s(m: ModelSpec, gpu: GPUSpec, dtype: str, b: Array, s: Array, t: Array, recompute_code: Array,
                 terms: LayerTerms):
    """Forward and backward time of one transformer layer for one micro-batch on one GPU of a TP group.

    Args:
        b: micro-batch size (sequences); s: sequence length; t: TP degree.
        recompute_code: 0 none, 1 selective, 2 full (array allowed; :class:`hetplan.estimate.stagework.Recompute`).
        terms: how the layer runs (:class:`hetplan.estimate.stagework.LayerTerms`): its link (the intra-node
            bandwidth of the TP collectives; where a TP group larger than a node crosses nodes, the node's NIC
            bandwidth shared by its GPUs; the per-step latencies of :func:`hetplan.estimate.comm.network_terms`),
            sequence parallelism, attention, the GEMM times / attention blocks / extra kernels, bytes and GPU
            work a MoE, CP or eager caller costs, and the options below.

    The options of ``terms``:
        tp_comm_overlap: Megatron-Core's ``--tp-comm-overlap`` (Transformer Engine userbuffers; with sequence
            parallelism, dense layers): each of the layer's four TP collectives per pass (all-gather before the QKV
            and FC1 GEMMs, reduce-scatter after the projection and FC2 GEMMs; in backward the same four around the
            dgrad GEMMs) is split into chunks pipelined with the GEMM it feeds or drains (TE
            ``transformer_engine/pytorch/module/base.py`` ``initialize_ub``, ``ring_exchange`` / ``pipeline``
            methods), so each is hidden up to what that GEMM's time allows (:func:`tp_overlap_exposed_s`).
        cuda_graphs: the layer runs as a captured CUDA graph (Megatron-Core ``--enable-cuda-graph`` /
            ``--cuda-graph-impl``, Transformer Engine ``make_graphed_callables``): one graph launch replays all its
            kernels, so the host launches none of them and the per-kernel host floor (``kernel_overhead_s`` per
            kernel, dense and MoE extra kernels alike) is not charged; the GPU work is unchanged.
        op_sac: selective recomputation (code 1) is torchtitan's per-op SAC (:func:`op_sac_recompute_s`, charged
            by :func:`hetplan.estimate.stage.stage_costs`): its policy saves the outputs of the matmuls it keeps, of
            SDPA and of the reduce-scatters, not of the all-gathers (``_save_list``,
            ``torchtitan/models/llama3/parallelize_llama.py`` at pytorch/torchtitan@820504e), so under sequence
            parallelism the backward runs the forward's two TP all-gathers again (their outputs are the inputs of
            the recomputed ``wk`` / ``w3`` and of every column-parallel weight gradient).
        sequence_dim_copies: the sequence-parallel collectives gather and scatter along the sequence dimension of a
            ``(b, s, h)`` activation, as PyTorch's DTensor ``Shard(1)`` does (torchtitan's TP): NCCL gathers and
            scatters along dimension 0, so ``torch.distributed._functional_collectives`` ``all_gather_tensor`` copies
            its output once more (``torch.cat(torch.chunk(res, group_size, dim=0), dim=gather_dim)``) and
            ``reduce_scatter_tensor`` its input (``torch.cat(torch.chunk(self, group_size, dim=scatter_dim))``):
            one read and one write of the whole ``b·s·h`` tensor per collective (2 + 2 B; 1 + 1 B for the FP8
            all-gathers), at the HBM bandwidth, for each of the four collectives of a pass, of full recomputation
            and of per-op SAC's two recomputed all-gathers. Not under ``tp_comm_overlap`` (fused collective
            matmuls take the layout themselves).
        mlp_tp_collectives: share of the model's layers whose MLP side runs sequence parallelism's all-gather and
            reduce-scatter (:func:`hetplan.estimate.moe.mlp_tp_collective_share`; 1 for a dense model): under SP a
            pass runs ``1 + share`` all-gather / reduce-scatter pairs (the attention's, the MLP's), and as many
            sequence-dim copies and per-op SAC gathers; without SP two all-reduces.
        async_tp: PyTorch's async TP (torchtitan ``enable_async_tensor_parallel``; with sequence parallelism, dense
            layers, not with ``tp_comm_overlap``): Inductor's micro-pipeline pass fuses the forward's four TP
            collectives and the backward's two all-gathers with their GEMMs (:func:`async_tp_exposed_s`,
            :func:`async_tp_extra_s`; the backward reduce-scatters stay NCCL's, with their copies); no
            sequence-dim copies for the fused ones.
        projections: how the stack's model code runs the projections
            (:attr:`hetplan.hardware.stacks.StackSpec.projections`, module doc): separate ones are GEMMs of their own
            shapes (:func:`layer_gemm_times_s`) and kernels of their own (:func:`projection_kernels`), also in the
            chunked GEMMs of async TP (:func:`async_tp_extra_s`); backward sums their input gradients
            (:func:`projection_grad_sum_bytes`; with ``eager_grad_sum`` in add kernels of their own).
        fused_softmax: the stack's rule for when Megatron's fused softmax kernel takes the scores (standard
            attention; :func:`fused_softmax_runs`); where it does not, the PyTorch fallback's bytes and kernels
            (:func:`softmax_fallback_work`) join the element-wise work, the host floor and selective recompute.
        tp_allreduce: algorithm of the TP all-reduces inside a node (:func:`hetplan.estimate.comm.allreduce_time_s`:
            ``"ring"``, NCCL as training runs it; ``"custom"``, a serving engine's one-/two-shot kernel).
    Returns:
        ``(forward_s, backward_s, tp_comm_s)``: forward and backward (backward includes recomputation and TP
        collectives), and the part of both that is TP communication.
    """
    link, attention, sequence_parallel = terms.link, terms.attention, terms.sequence_parallel
    attention_blocks, extra_gpu_s = terms.attention_blocks, terms.extra_gpu_s
    extra_kernels, extra_elementwise_bytes = terms.extra_kernels, terms.extra_elementwise_bytes
    tp_comm_overlap, cuda_graphs, op_sac = terms.tp_comm_overlap, terms.cuda_graphs, terms.op_sac
    async_tp, sequence_dim_copies = terms.async_tp, terms.sequence_dim_copies
    gemm_times_s = terms.gemm_times_s
    flash = counts.check_attention(attention) == "flash"
    projections = terms.projections
    linear, core_gemm = layer_gemm_times_s(m, gpu, dtype, b, s, t, projections) if gemm_times_s is None else gemm_times_s
    on_async = np.asarray(sequence_parallel) & (np.asarray(t) > 1) & bool(async_tp and not tp_comm_overlap)
    gemm_f, gemm_b, bytes_f, bytes_b, gather_bytes = (
        (np.where(on_async, x, 0.0) for x in async_tp_extra_s(m, gpu, dtype, b, s, t, terms.fp8_gathers, projections))
        if async_tp else (0.0,) * 5)
    act_sp = counts.layer_activation_bytes(m, b, s, t, sequence_parallel=True, recompute="none", attention=attention)
    act_nosp = counts.layer_activation_bytes(m, b, s, t, sequence_parallel=False, recompute="none", attention=attention)
    act = np.where(sequence_parallel, act_sp, act_nosp)
    elem = (ELEMENTWISE_PASSES * act + extra_elementwise_bytes) / gpu.hbm_bandwidth_bytes_per_s
    elem_bwd = 2 * elem
    if attention == "eager":  # the s x s element-wise work op by op (eager_score_bytes), not as stored bytes x passes
        lin = [counts.layer_activation_bytes(m, b, s, t, sequence_parallel=sp, recompute="selective") for sp in (True, False)]
        elem = (ELEMENTWISE_PASSES * np.where(sequence_parallel, *lin) + extra_elementwise_bytes) / gpu.hbm_bandwidth_bytes_per_s
        scores = m.num_attention_heads * s * counts.attended_keys(m, s) * b / t * attention_blocks
        score_fwd, score_bwd = eager_score_bytes(m)
        elem, elem_bwd = (elem + score_fwd * scores / gpu.hbm_bandwidth_bytes_per_s,
                          2 * elem + score_bwd * scores / gpu.hbm_bandwidth_bytes_per_s)
    softmax_f = softmax_b = softmax_kernels = 0.0
    if attention == "standard" and terms.fused_softmax != "any":  # the fused softmax's PyTorch fallback
        softmax_f, softmax_b, softmax_kernels = softmax_fallback_work(terms.fused_softmax, m, dtype, b, s, t)
        softmax_f = softmax_f * attention_blocks / gpu.hbm_bandwidth_bytes_per_s
        softmax_b = softmax_b * attention_blocks / gpu.hbm_bandwidth_bytes_per_s
        elem, elem_bwd = elem + softmax_f, elem_bwd + softmax_b
    kernel = 0.0 if cuda_graphs else gpu.kernel_overhead_s
    # a norm beyond the two of KERNELS_PER_LAYER_FORWARD (post_norms: Gemma's four) is one fused kernel more
    kernels = (KERNELS_PER_LAYER_FORWARD - (FLASH_FUSED_KERNELS if flash else 0) + extra_kernels + softmax_kernels
               + (counts.layer_norms(m) - 2)
               + projection_kernels(m, projections)
               + np.where(on_async, ASYNC_TP_KERNELS_PER_STEP * (np.asarray(t) - 1.0), 0.0))
    core_gemm = core_gemm * attention_blocks
    if flash:
        (cf, cb), (nf, nb) = (flash_attention_time_s(m, gpu, dtype, b, s, t, causal=c) for c in (True, False))
        unmasked = (np.asarray(attention_blocks, dtype=float) - 1.0) / 2.0
        core_fwd, core_bwd = cf + unmasked * nf, cb + unmasked * nb
    else:  # backward: two GEMMs per forward GEMM
        core_fwd, core_bwd = core_gemm, 2 * core_gemm
    # GPU work, unless the host cannot launch the layer's kernels that fast (launch-bound small layers); the
    # backward launches twice the forward's kernels.
    # Async TP: the fused GEMMs run in t chunks (forward, and the backward's data-gradient GEMMs) and the pass moves
    # the bytes of async_tp_extra_s.
    # Separate projections: backward sums their input gradients (eager: an add kernel per addend).
    grad_sum = projection_grad_sum_bytes(m, b, s, projections, terms.eager_grad_sum) / gpu.hbm_bandwidth_bytes_per_s
    grad_sum_kernels = projection_kernels(m, projections) if terms.eager_grad_sum else 0
    fwd_compute = _softmax_floor(linear + gemm_f + core_fwd + elem + bytes_f + extra_gpu_s, kernels * kernel)
    bwd_compute = _softmax_floor(2 * linear + gemm_b + elem_bwd + core_bwd + bytes_b + extra_gpu_s + grad_sum,
                                 (2 * kernels + grad_sum_kernels) * kernel)
    quad_bytes = (5 if m.dropout else 2) * m.num_attention_heads * s * s * b / t
    core_f = _softmax_floor(core_gemm + ELEMENTWISE_PASSES * quad_bytes / gpu.hbm_bandwidth_bytes_per_s + softmax_f,
                            (KERNELS_ATTENTION_CORE + softmax_kernels) * kernel)
    rc = np.asarray(recompute_code)
    # Full: one more forward of the layer; selective (standard attention): of the attention core. Megatron-LM
    # does not checkpoint the flash core (nothing to recompute).
    recompute_extra = np.where(rc == 2, fwd_compute, np.where(rc == 1, 0.0 if flash else core_f, 0.0))
    tp_msg = b * s * m.hidden_size * counts.BYTES_PER_ACTIVATION
    tp_one = group_collective_time_s(tp_msg, "allreduce", t, 1, link, algorithm=terms.tp_allreduce)
    reduce_scatter = tp_one / 2  # one reduce-scatter: half an all-reduce's ring steps
    fp8_gather = fp8.is_fp8(dtype) and terms.fp8_gathers  # not under torchao's rowwise recipes (fp8 doc)
    if fp8_gather:  # FP8 + SP: each all-gather half of an all-reduce moves FP8 (fp8 module doc)
        half = group_collective_time_s(tp_msg / 2, "allreduce", t, 1, link, algorithm=terms.tp_allreduce)
        tp_one = np.where(sequence_parallel, 0.5 * (tp_one + half), tp_one)
    # four collectives (two all-reduces' volume) per pass; under SP a MoE layer's MLP side may run none
    collectives = 1.0 + np.where(sequence_parallel, terms.mlp_tp_collectives, 1.0)
    tp_pass = collectives * tp_one
    tp_bwd_pass = tp_pass
    if tp_comm_overlap:
        f_ov, b_ov = tp_overlap_exposed_s(m, tp_one / 2, linear, t, overlap_contention(gpu, link.nccl_ctas))
        on = np.asarray(sequence_parallel) & (np.asarray(t) > 1)
        tp_pass, tp_bwd_pass = np.where(on, f_ov, tp_pass), np.where(on, b_ov, tp_bwd_pass)
    gather = tp_one / 2  # one all-gather: half an all-reduce's ring steps (FP8 + SP: of the FP8 input)
    if fp8_gather:
        gather = np.where(sequence_parallel, half / 2, gather)
    sac_on = (rc == 1) & op_sac & np.asarray(sequence_parallel) & (np.asarray(t) > 1)
    sac_gathers = np.where(sac_on, collectives * gather, 0.0)
    if async_tp:
        f_as, b_as, sac_as = async_tp_exposed_s(m, gather, reduce_scatter, linear, t)
        tp_pass, tp_bwd_pass = np.where(on_async, f_as, tp_pass), np.where(on_async, b_as, tp_bwd_pass)
        sac_gathers = np.where(on_async, np.where(sac_on, sac_as, 0.0), sac_gathers)
        bwd_compute = bwd_compute + np.where(sac_on, gather_bytes, 0.0)  # full recompute: in fwd_compute
    fwd = fwd_compute + tp_pass
    tp_bwd = tp_bwd_pass + np.where(rc == 2, tp_pass, 0.0) + sac_gathers
    if sequence_dim_copies:  # DTensor's chunk + cat around each sequence-parallel collective
        full = b * s * m.hidden_size / gpu.hbm_bandwidth_bytes_per_s
        gather_copy = (2.0 if fp8_gather else 4.0) * full
        on = np.asarray(sequence_parallel) & (np.asarray(t) > 1) & (not tp_comm_overlap) & ~on_async
        pass_copy = np.where(on, collectives * (gather_copy + 4.0 * full), 0.0)
        fwd = fwd + pass_copy
        bwd_compute = bwd_compute + pass_copy + np.where(rc == 2, pass_copy, 0.0) + np.where(
            on & (rc == 1) & op_sac, collectives * gather_copy, 0.0)
    bwd = bwd_compute + recompute_extra + tp_bwd
    return fwd, bwd, tp_pass + tp_bwd


#: Chunks of Transformer Engine's pipelined GEMM + reduce-scatter overlap (``PipelineOverlapCfg(num_splits=4)``
#: of the forward projection and FC2 GEMMs in NeMo's userbuffers configurations,
#: ``nemo/collections/llm/recipes/tp_overlap_configs/userbuffers.py``).
TP_OVERLAP_RS_SPLITS = 4


def tp_overlap_shares(m: ModelSpec) -> tuple[float, float, float, float]:
    """Shares of a dense layer's linear GEMM time that the QKV, projection, FC1 and FC2 GEMMs take (by their
    weight elements, which set their FLOPs at one token count)."""
    h, f = m.hidden_size, m.ffn_hidden_size
    w = (h * (m.q_dim + m.kv_dim + m.v_dim), m.attn_out_dim * h, h * f * (2 if m.gated_mlp else 1), f * h)
    total = float(sum(w))
    return w[0] / total, w[1] / total, w[2] / total, w[3] / total


def tp_overlap_exposed_s(m: ModelSpec, c: Array, linear_s: Array, t: Array, contention: Array):
    """``(forward_s, backward_s)``: exposed TP communication of one dense layer under ``--tp-comm-overlap``, each
    of its four collectives (``c`` seconds each: an all-gather or reduce-scatter of the ``b·s·h`` activation)
    hidden behind the GEMM it is paired with, as NeMo's userbuffers configurations pair them (Transformer Engine
    ``module/base.py`` ``initialize_ub``):

    * all-gathers before the QKV / FC1 GEMMs (forward) and of the output gradient before the projection / FC2
      dgrad GEMMs (backward): *ring exchange* on the copy engines, the GEMM split into ``t`` chunks, the local
      chunk first: exposed ``max(0, c - g·(t-1)/t)``;
    * reduce-scatters after the projection / FC2 GEMMs (forward): *pipelined* in :data:`TP_OVERLAP_RS_SPLITS`
      chunks on a few SMs: the last chunk's reduce-scatter follows the GEMM, the others hide behind the next
      chunk, and the GEMM runs on the other SMs: exposed ``max(c/n + ρ·c, c - g·(n-1)/n)``;
    * reduce-scatters of the QKV / FC1 input gradients (backward): *bulk* overlap with the wgrad GEMM of the same
      size: exposed ``max(c - g, ρ·c)``.

    ``g`` = ``linear_s`` × the GEMM's share (:func:`tp_overlap_shares`), ``ρ`` = ``contention``
    (:func:`hetplan.estimate.comm.overlap_contention`). Arrays broadcast."""
    qkv, proj, fc1, fc2 = (linear_s * share for share in tp_overlap_shares(m))
    t = np.asarray(t, dtype=float)
    n = TP_OVERLAP_RS_SPLITS

    def ring(g: Array):
        return np.maximum(0.0, c - g * (t - 1.0) / np.maximum(t, 1.0))

    def pipelined(g: Array):
        return np.maximum(c / n + contention * c, c - g * (n - 1.0) / n)

    def bulk(g: Array):
        return overlapped_exposed_s(c, g, contention)

    return ring(qkv) + ring(fc1) + pipelined(proj) + pipelined(fc2), ring(proj) + ring(fc2) + bulk(qkv) + bulk(fc1)


#: Kernels an async-TP fused collective matmul launches per step beyond the one GEMM of the unfused layer: one GEMM
#: chunk and one peer copy per remote shard (``_pipelined_all_gather_and_consume`` /
#: ``_pipelined_produce_and_all2all``, ``torch/distributed/_symmetric_memory/__init__.py``); four fused
#: collectives per pass: ``4 · 2 · (t - 1)`` kernels more per layer forward.
ASYNC_TP_KERNELS_PER_STEP = 8.0


def async_tp_exposed_s(m: ModelSpec, all_gather_s: Array, reduce_scatter_s: Array, linear_s: Array, t: Array):
    """``(forward_s, backward_s, op_sac_s)``: exposed TP communication of one dense layer under PyTorch's async TP.
    Inductor's ``micro_pipeline_tp`` pass (``torch/_inductor/fx_passes/micro_pipeline_tp.py``) rewrites an
    all-gather whose result feeds matmuls as their left operand into ``fused_all_gather_matmul``, and a
    reduce-scatter whose input is one matmul's output (its only user) into ``fused_matmul_reduce_scatter``
    (``torch/distributed/_symmetric_memory/__init__.py``):

    * fused all-gather (forward: the QKV and FC1 inputs, one fused op for ``wq`` / ``wk`` / ``wv`` and one for
      ``w1`` / ``w3``; backward: the output gradients before the projection / FC2 data-gradient GEMMs): each
      rank's shard is published in symmetric memory; the GEMM runs on the local shard first, then on each peer's
      shard as a copy-engine pull brings it over NVLink (two streams alternate, so pulls and GEMM chunks
      pipeline): exposed ``max(0, c - g·(t-1)/t)``;
    * fused reduce-scatter (forward: the projection and FC2 outputs): the GEMM produces each peer's chunk in turn
      into a symmetric buffer the peer pulls while the next chunk is computed, its own chunk last: the same
      pipeline and exposure; the reduction of the ``t`` partials is HBM work (:func:`async_tp_extra_s`);
    * the backward reduce-scatters of the QKV and FC1 input gradients stay NCCL collectives, exposed in full: their
      input is the sum of two or three matmuls (``wq``, ``wk``, ``wv``; ``w1``, ``w3``), not one matmul, so the
      pattern does not match (their DTensor copies: :func:`async_tp_extra_s`).

    ``c``: ``all_gather_s`` / ``reduce_scatter_s`` of one ``b·s·h`` activation (the pulls move what a ring moves);
    ``g``: the paired GEMM's share of ``linear_s`` (:func:`tp_overlap_shares`; a data-gradient GEMM has its forward
    GEMM's FLOPs). Copy engines take no SMs from the GEMMs. ``op_sac_s``: per-op SAC's two recomputed all-gathers,
    fused with the recomputed ``wk`` / ``w3`` GEMMs (:func:`op_sac_matmuls`). Arrays broadcast."""
    qkv, proj, fc1, fc2 = (linear_s * share for share in tp_overlap_shares(m))
    t = np.asarray(t, dtype=float)

    def fused(c: Array, g: Array):
        return np.maximum(0.0, c - g * (t - 1.0) / np.maximum(t, 1.0))

    ag, rs = all_gather_s, reduce_scatter_s
    w = [x for x, _ in op_sac_matmuls(m)]
    wk, w3 = w[1] / sum(w), (w[5] / sum(w) if m.gated_mlp else 0.0)
    sac = fused(ag, linear_s * wk) + fused(ag, linear_s * w3)
    return (fused(ag, qkv) + fused(ag, fc1) + fused(rs, proj) + fused(rs, fc2),
            fused(ag, proj) + fused(ag, fc2) + 2 * rs, sac)


def async_tp_extra_s(m: ModelSpec, gpu: GPUSpec, dtype: str, b: Array, s: Array, t: Array,
                     fp8_gathers: bool = True, projections: str = FUSED):
    """``(gemm_fwd_s, gemm_bwd_s, bytes_fwd_s, bytes_bwd_s, gather_bytes_s)``: what async TP adds to a dense
    layer's passes beyond the exposed collectives (:func:`async_tp_exposed_s`;
    ``torch/distributed/_symmetric_memory/__init__.py``):

    * GEMM chunks: a fused GEMM runs as ``t`` chunks of ``T/t`` rows (``T = b·s``) instead of one of ``T`` rows
      (:func:`gemm_time_s` of each chunk), every projection GEMM in forward (``wq``, ``wk``, ``wv`` and ``w1``,
      ``w3`` each chunked where the stack runs them separately, ``projections``), the projection / FC2
      data-gradient GEMMs in backward (:func:`attention_linear_shapes`, :func:`mlp_linear_shapes`);
    * bytes, at the HBM bandwidth: per fused all-gather, the copy of the local shard into the symmetric buffer
      before the first GEMM chunk (read + write of ``b·s·h/t`` elements, 1 byte each under FP8 with
      ``fp8_gathers``, 2 under torchao's rowwise recipes); per fused
      reduce-scatter, the fp32-accumulating sum of the ``t`` received bf16 partials (``reduce_partials``: reads
      ``b·s·h``, writes ``b·s·h/t`` elements); per unfused backward reduce-scatter, DTensor's sequence-dim copy of
      its input (4 B per element, as :func:`layer_time_s`'s ``sequence_dim_copies``);
    * ``gather_bytes_s``: one fused all-gather's shard copy (per-op SAC's recomputed all-gathers).

    Seconds; arrays broadcast."""
    T = b * s
    t = np.asarray(t, dtype=float)
    attn = attention_linear_shapes(m, T, t, projections)  # QKV (fused or not), then the output projection
    mlp = mlp_linear_shapes(m, T, m.ffn_hidden_size, t, projections)  # FC1 (gate/up fused or not), then FC2

    def chunked(shapes: list) -> list:
        return [t * gemm_time_s(gpu, dtype, M / t, N, K) - gemm_time_s(gpu, dtype, M, N, K) for M, N, K in shapes]

    c_attn, c_mlp = chunked(attn), chunked(mlp)
    n = T * m.hidden_size
    hbm = gpu.hbm_bandwidth_bytes_per_s
    shard = (fp8.OPERAND_BYTES if fp8.is_fp8(dtype) and fp8_gathers else OPERAND_BYTES) * 2.0 * n / t / hbm
    reduce = OPERAND_BYTES * (n + n / t) / hbm
    rs_copy = 2.0 * OPERAND_BYTES * n / hbm
    return (sum(c_attn) + sum(c_mlp), c_attn[-1] + c_mlp[-1], 2 * shard + 2 * reduce, 2 * shard + 2 * rs_copy, shard)


def op_sac_matmuls(m: ModelSpec) -> tuple[tuple[int, int], ...]:
    """``(weight elements, output width)`` of a dense layer's matmuls in the order PyTorch runs them (torchtitan's
    Llama block: ``wq``, ``wk``, ``wv``, ``wo``, then ``w1``, ``w3`` (gated MLP only), ``w2``): the order per-op
    selective checkpointing counts them in (:func:`op_sac_recompute_s`)."""
    h, f = m.hidden_size, m.ffn_hidden_size
    mlp = ((h * f, f), (h * f, f), (f * h, h)) if m.gated_mlp else ((h * f, f), (f * h, h))
    return ((h * m.q_dim, m.q_dim), (h * m.kv_dim, m.kv_dim), (h * m.v_dim, m.v_dim), (m.attn_out_dim * h, h)) + mlp


def op_sac_recomputed_weights(m: ModelSpec) -> float:
    """Weight elements per token whose matmuls per-op SAC runs again, mean over the model's layers
    (:func:`hetplan.estimate.moe.op_sac_recompute_s`): a dense layer's even-numbered matmuls
    (:func:`op_sac_matmuls`); a MoE / MLA layer half its matmuls' weights and every routed expert a token visits
    (``k`` of them, all of their grouped GEMMs). ``2·b·s`` FLOPs each
    (:func:`hetplan.estimate.estimator.hardware_flops_per_iteration`)."""
    if not (m.is_moe or m.is_mla):
        return float(sum(w for w, _ in op_sac_matmuls(m)[1::2]))
    h, up = m.hidden_size, 2 if m.gated_mlp else 1
    attn = 0.5 * sum(i * o for i, o in counts.attention_linears(m))
    dense = 0.5 * (up + 1) * h * m.ffn_hidden_size
    f_s, n_moe = m.shared_expert_ffn_hidden_size, m.num_moe_layers
    moe_layer = 0.5 * (h * m.num_experts + (up + 1) * h * f_s) + m.experts_per_token * (up + 1) * h * \
        m.expert_ffn_hidden_size
    return attn + ((m.num_layers - n_moe) * dense + n_moe * moe_layer) / m.num_layers


def op_sac_recompute_s(m: ModelSpec, gpu: GPUSpec, dtype: str, b: Array, s: Array, t: Array,
                       sequence_parallel: Array = False,
                       attention: str = "flash", extra_elementwise_bytes: Array = 0.0, projections: str = FUSED):
    """Backward recomputation of one dense layer under torchtitan's per-op selective activation checkpointing
    (``torchtitan/distributed/activation_checkpoint.py``: the outputs of attention, of every other matmul counting
    from the first, of the all-to-alls and reduce-scatters are saved; everything else is recomputed from the
    block's input): the even-numbered matmuls (:func:`op_sac_matmuls`: ``wk``, ``wo`` and ``w3`` of a Llama block)
    as their share of the layer's linear GEMM time, plus every element-wise kernel of the forward
    (:func:`op_sac_elementwise_s`). MoE and MLA layers: :func:`hetplan.estimate.moe.op_sac_recompute_s`.
    ``projections``: the stack's (:func:`layer_gemm_times_s`). Seconds; arrays broadcast."""
    linear, _ = layer_gemm_times_s(m, gpu, dtype, b, s, t, projections)
    w = [x for x, _ in op_sac_matmuls(m)]
    return linear * sum(w[1::2]) / sum(w) + op_sac_elementwise_s(m, gpu, b, s, t, sequence_parallel, attention,
                                                                  extra_elementwise_bytes)


def op_sac_elementwise_s(m: ModelSpec, gpu: GPUSpec, b: Array, s: Array, t: Array, sequence_parallel: Array = False,
                         attention: str = "flash", extra_elementwise_bytes: Array = 0.0):
    """Every element-wise kernel of one layer's forward again (norms, rotary, activation; in eager PyTorch with
    their ``extra_elementwise_bytes``, :mod:`hetplan.estimate.elementwise`): what per-op SAC recomputes besides
    matmuls. Seconds; arrays broadcast."""
    act = np.where(sequence_parallel,
                   counts.layer_activation_bytes(m, b, s, t, True, recompute="none", attention=attention),
                   counts.layer_activation_bytes(m, b, s, t, False, recompute="none", attention=attention))
    return (ELEMENTWISE_PASSES * act + extra_elementwise_bytes) / gpu.hbm_bandwidth_bytes_per_s


def embedding_time_s(m: ModelSpec, gpu: GPUSpec, b: Array, s: Array, t: Array):
    """Forward and backward time of the input embedding: a gather, memory-bound (writes ``b·s·h`` activations),
    plus position add and dropout (3 kernels); backward scatters the gradient into the ``V x h/t`` table."""
    out = b * s * m.hidden_size * 2
    fwd = ELEMENTWISE_PASSES * out / gpu.hbm_bandwidth_bytes_per_s + 3 * gpu.kernel_overhead_s
    return fwd, 2 * fwd


#: The cross-entropy loss over a rank's ``b·s·V/t`` logits: bytes per logit moved (forward, backward) and the
#: kernels that sweep the logits (forward, backward); the loss's other kernels touch ``b·s`` elements and queue
#: behind these.
#:
#: * ``unfused``: Megatron's vocab-parallel loss without ``--cross-entropy-loss-fusion`` (Megatron-LM's default:
#:   ``megatron/core/tensor_parallel/cross_entropy.py``; :attr:`hetplan.plan.Plan.cross_entropy` ``fp32``).
#:   Forward 38: the fp32 copy of the 16-bit logits (read 2, write 4), max (read 4), in-place subtract of the max
#:   (8), in-place exp (8), sum (4), in-place divide into the softmax kept for backward (8); 6 kernels. Backward 14:
#:   the in-place multiply by the loss gradient (8) and the cast of the fp32 gradient back to the logits' dtype
#:   (6); with the target update, 3 kernels.
#: * ``fused``: a fused loss (Megatron-Core ``--cross-entropy-loss-fusion``, on in NeMo's recipes; a compiled
#:   PyTorch loss): 8 + 8 B in 4 + 4 kernels, the charge the A100 and H100 fits were made with (Transformer
#:   Engine's kernel reads the 16-bit logits twice and writes their gradient in place, 6 B, then rescales it, 4 B;
#:   Megatron-Core's own jit-fused loss keeps the fp32 copy, 22 + 14 B).
#: * ``eager_fp32``: torchtitan's eager ``F.cross_entropy(pred.float(), labels)`` (``framework = "fsdp"``,
#:   ``cross_entropy = "fp32"``): 22 + 22 B in 7 + 7 kernels, counted op by op in :mod:`hetplan.estimate.elementwise`.
#: * ``deepspeed``: PyTorch's cross-entropy on the pipeline's 16-bit output (the traced Espresso runs, fp16):
#:   forward 8 (log-softmax: three reads and a write of 2 bytes), backward 10 (zero-filled gradient, then the
#:   log-softmax backward's three reads and a write).
CROSS_ENTROPY = {"unfused": ((38.0, 14.0), (6, 3)), "fused": ((8.0, 8.0), (4, 4)), "deepspeed": ((8.0, 10.0), (2, 3)),
                 "eager_fp32": ((22.0, 22.0), (7, 7))}


def cross_entropy_kind(framework: str, cross_entropy: str | None = None) -> str:
    """The :data:`CROSS_ENTROPY` entry of a job: ``deepspeed`` for DeepSpeed; with
    :attr:`hetplan.plan.Plan.cross_entropy` ``fp32``, ``unfused`` for Megatron and ``eager_fp32`` for ``fsdp``
    (whose ``None`` the caller resolves from ``torch_compile``); else ``fused``."""
    if framework == "deepspeed":
        return "deepspeed"
    if framework == "fsdp" and cross_entropy == "fp32":
        return "eager_fp32"
    return "unfused" if framework == "megatron" and cross_entropy == "fp32" else "fused"


def head_time_s(m: ModelSpec, gpu: GPUSpec, dtype: str, b: Array, s: Array, t: Array, framework: str = "megatron",
                cross_entropy: str | None = None):
    """Forward and backward time of the output head (logits GEMM ``(b·s, V/t, h)``, vocab-parallel) and the
    cross-entropy loss over the ``b·s·V/t`` logits, memory-bound (:data:`CROSS_ENTROPY` of
    :func:`cross_entropy_kind`). Under FP8 the head stays bf16 (:mod:`hetplan.estimate.fp8`)."""
    V = m.padded_vocab_size()
    gemm = gemm_time_s(gpu, fp8.high_precision(dtype), b * s, V / t, m.hidden_size)  # the head stays bf16 (fp8 doc)
    logits = b * s * V / t
    (fwd_bytes, bwd_bytes), (fwd_kernels, bwd_kernels) = CROSS_ENTROPY[cross_entropy_kind(framework, cross_entropy)]
    loss_f = fwd_bytes * logits / gpu.hbm_bandwidth_bytes_per_s + fwd_kernels * gpu.kernel_overhead_s
    loss_b = bwd_bytes * logits / gpu.hbm_bandwidth_bytes_per_s + bwd_kernels * gpu.kernel_overhead_s
    return gemm + loss_f, 2 * gemm + loss_b


#: Bytes moved per parameter by the mixed-precision Adam step: read fp32 grad, master, m, v (16 B); write
#: master, m, v (12 B); write the 2-byte weight (2 B) — Megatron-LM's fused Adam (multi-tensor apply).
ADAM_BYTES_PER_PARAMETER = 30.0


#: Bytes moved per parameter by an AdamW step that runs one kernel per tensor operation, for stacks whose ``fused``
#: lacks ``adam``: Composer's ``DecoupledAdamW`` (llm-foundry's ``optimizer: decoupled_adamw``;
#: ``composer/optim/decoupled_weight_decay.py`` ``DecoupledAdamW.adamw``, a Python loop over the parameters), on fp32
#: tensors: ``exp_avg.mul_`` (4 + 4) ``.add_(grad)`` (4 + 4 + 4), ``exp_avg_sq.mul_`` (4 + 4)
#: ``.addcmul_(grad, grad)`` (4 + 4 + 4), ``exp_avg_sq.sqrt()`` (4 + 4), ``/ sqrt(bias_correction2)`` (4 + 4),
#: ``.add_(eps)`` (4 + 4), ``param.addcdiv_(exp_avg, denom)`` (4 + 4 + 4 + 4): 80 B, against the fused step's 30
#: (:data:`ADAM_BYTES_PER_PARAMETER`). Its weight-decay ``param.mul_`` runs only with ``weight_decay != 0`` (0 in
#: llm-foundry's MPT pretraining YAMLs) and is not charged; nor is the gradient clipping any stack runs.
#: PyTorch's default ``torch.optim.AdamW`` (``foreach``, ``torch/optim/adamw.py`` ``_multi_tensor_adamw``; fms-fsdp)
#: moves the same 80 B: the weight decay ``_foreach_mul_`` (4 + 4), ``_foreach_lerp_`` of the first moment
#: (4 + 4 + 4) in place of ``mul_`` + ``add_``, then the same second-moment, square-root, division, ``eps`` and
#: ``addcdiv_`` passes.
UNFUSED_ADAMW_BYTES_PER_PARAMETER = 80.0


#: Bytes moved per parameter by DeepSpeed's ``FP16_Optimizer.step`` (ZeRO-0 with fp16,
#: ``deepspeed/runtime/fp16/fused_optimizer.py``), pass by pass: the overflow check
#: (``CheckOverflow.has_overflow_serial`` → ``_has_inf_or_nan``: ``float(x.float().sum())`` on each fp16 gradient,
#: read 2 + fp32 copy 4 + its sum 4 = 10 B); the fp32 flat gradient (``p.grad.to(fp32)``, 2 + 4, then
#: ``_flatten_dense_tensors``, 4 + 4 = 14 B); the global norm of the flat gradient (``get_flattened_grad_norm``,
#: 4 B); ``unscale_and_clip_grads`` (``grad.mul_``, 4 + 4 = 8 B); the fused Adam on the fp32 master weights
#: (read master, gradient, m, v, write master, m, v: 28 B); the copy of the updated master weights into the fp16
#: ones (``p.data.copy_``, 4 + 2 = 6 B). 70 B. The overflow check's host synchronisation per parameter tensor is
#: not charged.
DEEPSPEED_FP16_STEP_BYTES_PER_PARAMETER = 70.0
#: Bytes moved per parameter by DeepSpeed's gradient reduction of ZeRO-0 at the accumulation boundary beyond the
#: all-reduce itself (``DeepSpeedEngine.allreduce_gradients`` → ``buffered_allreduce_fallback`` →
#: ``allreduce_bucket``, ``deepspeed/runtime/engine.py``; the pipeline engine's ``ReduceGrads`` calls the same):
#: the fp16 gradients flattened into a bucket (read 2 + write 2), scaled by 1/DP in place (2 + 2), copied back
#: into each ``.grad`` (2 + 2): 12 B, at every DP degree, DP 1 included.
DEEPSPEED_GRAD_BUCKET_BYTES_PER_PARAMETER = 12.0


def optimizer_step_time_s(params_per_gpu: Array, gpu: GPUSpec, bytes_per_parameter: Array = ADAM_BYTES_PER_PARAMETER):
    """Adam step over the parameters this GPU owns: memory-bound, ``bytes_per_parameter`` per parameter
    (:data:`ADAM_BYTES_PER_PARAMETER`, Megatron's fused step; DeepSpeed's ZeRO-0 fp16 step
    :data:`DEEPSPEED_FP16_STEP_BYTES_PER_PARAMETER`)."""
    return params_per_gpu * bytes_per_parameter / gpu.hbm_bandwidth_bytes_per_s
