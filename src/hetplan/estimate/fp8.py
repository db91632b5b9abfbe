"""FP8 training (``dtype = "fp8"``): which GEMMs run in FP8, at what rate, what the casts cost, and what FP8
changes in memory — as NVIDIA Transformer Engine (Megatron-Core, NeMo) and torchao float8 (torchtitan) run it.

**Which GEMMs.** Only the linear layers: QKV (or MLA's projections), the attention output projection, the MLP's
two GEMMs, the routed and shared expert GEMMs. The FlashAttention core (cuDNN fused attention / FlashAttention in
bf16), norms, softmax, element-wise work, the MoE router (Megatron-Core ``TopKRouter``: a plain linear in fp32 /
bf16) and the output head (Megatron-Core's ``output_layer`` is not a Transformer Engine module; torchtitan's float8
converter skips ``output`` by default, ``filter_fqns``) stay in bf16 — Transformer Engine docs, "Using FP8 with
Transformer Engine" (``te.fp8_autocast`` covers TE modules only); torchtitan ``docs/float8.md``.

**Rate.** An FP8 GEMM runs at the GPU's dense FP8 peak (twice the bf16 peak on Hopper and Blackwell; datasheets)
times its own large-GEMM efficiency :attr:`GPUSpec.fp8_compute_efficiency` (fitted on the FP8 rows of the modern
sets, :mod:`hetplan.calibration.modern_fit`; a GPU without a fit takes the fraction of its bf16 peak that its bf16
GEMMs reach, ``compute_efficiency``) times the same shape factor as bf16 (:func:`hetplan.estimate.compute.gemm_efficiency`).
Operands are 1 byte (E4M3 forward, E5M2 gradients in the ``hybrid`` format; Micikevicius et al., "FP8 Formats for
Deep Learning", arXiv 2209.05433), the output bf16.

**Casts** (memory-bound passes, bytes / HBM bandwidth; :data:`CAST_BYTES_PER_ELEMENT` per recipe,
:func:`recipe`): in forward each FP8 GEMM's activation input is quantized, in backward each output gradient.
The weights are quantized once per iteration under Transformer Engine (the FP8 copies are cached across
micro-batches: Megatron-Core passes ``is_first_microbatch`` to TE modules), on the local shard before the FP8
all-gather under torchao's FSDP2 float8 all-gather (tensorwise: 1/dp of the weights; not charged), and on the
gathered bf16 weight in every micro-batch under the rowwise recipes (their layer casts, below).

* ``delayed`` (TE ``DelayedScaling``, Megatron-Core's default ``--fp8-recipe delayed``): the scale comes from the
  amax history of earlier iterations; the current amax is recorded by the cast kernel itself. TE's fused
  cast-transpose reads the bf16 tensor (2 B) and writes the FP8 tensor and its transpose (1 + 1 B): Hopper's FP8
  tensor cores take only the "TN" layout, so the backward GEMMs need the transposed copies
  (TE ``transformer_engine/common/transpose/cast_transpose.cu``; TE docs, FP8 primer). 4 B per element.
* ``current`` (TE ``Float8CurrentScaling``: Megatron-Core ``--fp8-recipe tensorwise``, TE >= 2.2,
  ``megatron/core/fp8_utils.py`` ``get_fp8_recipe``; Megatron-Bridge / NeMo's ``fp8_cs`` recipes, the "FP8-CS"
  of their performance tables; ``Job.fp8_recipe = "current"``): the scale comes from the tensor being cast, so
  TE's quantizer runs an amax kernel over it before the cast-transpose (``Float8CurrentScalingQuantizer``,
  ``transformer_engine/pytorch/csrc/quantizer.cpp``: ``nvte_compute_amax``, the optional amax all-reduce,
  ``nvte_compute_scale_from_amax``, then ``nvte_quantize``): one more 2-byte read, 6 B per element. The
  amax all-reduce of a sequence-parallel input (one fp32 per cast, latency only) is not charged.
* ``tensorwise`` (torchao float8's default dynamic tensor-wise scaling, ``framework = "fsdp"``): the scale needs
  the amax of the tensor being cast, a read (2 B) before the cast's read and 1-byte write: 5 B per element
  (torchao ``float8/float8_scaling_utils.py`` ``hp_tensor_to_float8_dynamic``: amax, then scale and cast). Beyond
  the forward input and backward output-gradient casts, torchao's backward (pytorch/ao@0afa4c1, June 2025,
  ``float8/float8_linear.py`` ``matmul_with_hp_or_float8_args``, ``float8/float8_ops.py`` ``preprocess_addmm``:
  ``torch._scaled_mm`` takes a row-major first and a column-major second operand) moves, per linear layer and
  micro-batch (:func:`tensorwise_cast_time_s`): the output gradient again, transposed, for the weight-gradient
  GEMM (one more 1-byte write, fused with its cast under torch.compile); the saved bf16 input recast for the
  weight-gradient GEMM (5 B per element, written column-major); and a column-major copy of the FP8 weight for
  the data-gradient GEMM (read + write, 2 B per weight element). With TP (sequence parallelism, torchtitan's
  ``Float8ColwiseParallel`` / ``Float8RowwiseParallel``) a column-parallel layer's input and a row-parallel
  layer's output gradient are cast on the sequence shard before their FP8 all-gather (1/t of the elements); the
  gathered FP8 tensor is what the backward then copies to the layout it needs (2 B per element, no recast).
  torchao before pytorch/ao@12396c6 (2025-01-13; the rows of December 2024 ran eab345c) saved the FP8 input instead
  (``manual_float8_matmul_with_args_in_float8``): a 2-byte transposed copy where the current code recasts (5 B);
  not distinguished.
* ``rowwise`` (torchao ``Float8LinearConfig.from_recipe_name("rowwise")``, ``torchao/float8/config.py``: input,
  weight and output gradient each scaled along an axis, E4M3, power-of-2 scales; torchtitan 0.3.0's only recipe
  by default, ``Float8LinearConverter.Config.recipe_name = "rowwise"``, what ``hetplan export --to torchtitan``
  writes; the stack field ``fp8_recipe``): every operand is quantised along each axis it is used in, each time
  from the high-precision tensor (``float8_linear.py`` ``matmul_with_hp_or_float8_args``: forward ``x`` along
  its rows and ``W`` along its rows; backward ``dY`` along its rows for the data gradient and along its columns
  for the weight gradient, ``W`` along its columns, the saved bf16 ``x`` along its columns). Bytes per element
  as torchao's own roofline counts them (``torchao/testing/training/roofline_utils.py``
  ``get_tensor_memory_traffic_ovhd_s``, not fused with the previous op): a cast along the rows reads bf16 and
  writes FP8 with the row's amax in the same pass (2 + 1 B); a cast along the columns first writes a transposed
  bf16 copy (a read and a write, 2 + 2 B; "can't fuse ... would require loading the entire tensor to shared
  memory") and casts that (2 + 1 B). Per GEMM and micro-batch (:data:`ROWWISE_CAST_BYTES`): input 3 B in
  forward and 7 B in backward (the backward recasts the saved bf16 input; torchao's roofline, which assumes one
  kernel writing both, counts 8 B in all); output gradient 8 B in backward (one read feeds the row cast and the
  transposed copy, then 3 B); weight 3 B in forward and 7 B in backward — on the whole unsharded weight every
  micro-batch, since nothing is gathered in FP8 (below). And the backward GEMMs' outputs are rescaled in a pass
  of their own: torchao runs a rowwise-scaled GEMM without fast accumulation (its data- and weight-gradient GEMMs,
  ``Float8LinearConfig.gemm_config_grad_input`` / ``gemm_config_grad_weight``, ``use_fast_accum=False``) as the
  tensor-wise cuBLAS kernel with unit scales followed by ``output *= post_inverse_scale``
  (``float8/float8_ops.py`` ``addmm_float8_unwrapped``: "The rowwise CUTLASS-based kernel is so slow without
  fast-accum that we'd rather use the tensorwise cuBLAS-based kernel and do the scaling manually afterwards";
  under torch.compile an extra Triton kernel per GEMM, pytorch/ao#2184): a bf16 read and write, 4 B per element
  of the data gradient ``M·K`` and of the weight gradient ``N·K`` (:data:`ROWWISE_RESCALE_BYTES`).
* ``rowwise_with_gw_hp`` (torchao's third recipe; torchtitan 0.3.0 ``recipe_name = "rowwise_with_gw_hp"``): the
  forward and the data-gradient GEMM as ``rowwise`` (the weight for the data gradient scaled tensor-wise from
  its row scales, no extra pass), the weight-gradient GEMM in bf16 on the high-precision ``x`` and ``dY``
  (``cast_config_input_for_grad_weight`` / ``cast_config_grad_output_for_grad_weight`` ``ScalingType.DISABLED``):
  input 3 B forward, output gradient 3 B backward, weight 3 + 3 B; the weight-gradient GEMM at the bf16 rate
  (:func:`hetplan.estimate.compute.wgrad_bf16_extra_s`).
* ``mxfp8`` (Blackwell, TE ``MXFP8BlockScaling``; OCP Microscaling Formats spec v1.0): one E8M0 scale per 32
  elements, computed inside the cast kernel; row-wise and column-wise quantized copies instead of a transpose:
  read 2 B, write 1 + 1 B, plus one scale byte per 32 elements of each: 4 + 2/32 B per element.
* ``mxfp8`` under ``fsdp`` (Blackwell, torchao ``MXFP8Linear``: torchtitan's ``MXFP8LinearConverter``,
  ``torchtitan/components/quantization/mx.py``, config ``llama3_8b_mxfp8``; torchao
  ``torchao/prototype/moe_training/mxfp8_linear.py`` ``mx_mm`` at pytorch/ao@36027d8, 2026-08): the autograd
  function saves the bf16 input and weight and quantizes each operand, every micro-batch, along the axis each GEMM
  reduces over — forward the input and the weight along their rows (``MXTensor.to_mx``, a Triton "dim0" kernel),
  backward the output gradient along its rows for the data gradient and along its columns for the weight
  gradient, the weight along its columns and the saved input along its columns (a CUDA "dim1" kernel that reads
  the bf16 tensor and writes the transposed FP8 data and its scales in one pass). Each cast reads 2 B and writes
  1 B plus one E8M0 scale per 32 elements; the GEMM applies the block scales itself (``torch._scaled_mm``, no
  rescale pass). Per GEMM and micro-batch (:data:`ROWWISE_CAST_BYTES` ``"mxfp8"``): input 3 + 1/32 B forward and
  backward, weight the same, output gradient 2 x (3 + 1/32) B in backward. No distributed communication carries
  MXFP8 ("All distributed communication for MXFP8 training is currently done in high precision", torchtitan
  ``components/quantization/mxfp8.md``; :func:`fp8_gathers`), and no scale needs an all-reduce under TP (a
  block of 32 lies inside a rank's shard).

**TP communication.** With sequence parallelism the all-gather before each column-parallel GEMM carries its
already quantized FP8 input, and in backward the all-gather before each row-parallel GEMM's data-gradient GEMM its
FP8 output gradient: 1 byte per element, while the reduce-scatters stay bf16 (TE ``gather_along_first_dim`` on
quantized tensors, ``transformer_engine/pytorch/distributed.py``; torchtitan ``docs/float8.md``: float8 all-gather
for TP by default with ``Float8Linear``). Each all-reduce-sized pair then moves 3/4 of its bf16 bytes
(:func:`hetplan.estimate.compute.layer_time_s`). Not under the ``rowwise`` recipes: torchtitan applies its
float8 TP plans only to tensorwise scaling — "for float8 with rowwise scaling, all distributed communication is
done in high precision" (torchtitan ``components/quantization/float8.md``, 0.3.0; before pytorch/torchtitan#3127
``models/llama3/infra/parallelize.py``: "For rowwise recipes, we use regular TP and all-gather happens in high
precision"), so the casts run on the gathered bf16 tensors (:func:`fp8_gathers`).

**Casts under per-op SAC** (:func:`op_sac_cast_time_s`). torchtitan's per-op selective activation checkpointing
(``_save_list`` in ``torchtitan/models/llama3/parallelize_llama.py`` at pytorch/torchtitan@820504e: ``aten.mm``
outputs but every second, SDPA, the reduce-scatters and ``aten.max``) keeps no cast output, so its backward runs
again the forward casts that the recomputation needs: under the tensor-wise TP plan every linear's saved input is
its FP8 DTensor, so all four; otherwise (a linear saves its bf16 input) those of the recomputed ``wk``, ``wo``,
``w3`` — the QKV, projection and gate/up inputs (and, rowwise, their weights). A tensor-wise cast re-runs without
its amax read (``aten.max`` is kept). Full recomputation re-runs the whole forward, casts included.

**Amax all-reduces of torchao's casts under TP** (:func:`tp_amax_allreduce_time_s`). torchtitan's float8 TP plan
(``Float8ColwiseParallel``, ``Float8RowwiseParallel``, ``PrepareFloat8ModuleInput``; torchao
``float8/float8_tensor_parallel.py`` at pytorch/ao@6243040, the commit of the June 2025 TP rows) casts DTensor
activations: the scale of a tensor-wise cast is ``torch.max(torch.abs(x))`` (``float8/float8_utils.py``
``tensor_to_amax``), which on a sharded DTensor is a partial maximum, so each cast waits for an all-reduce of one
fp32 over the TP group before it can scale (torchtitan ``docs/float8.md`` at 820504e, TP: "The overhead is
communicating ``max(abs)`` across ranks"; the traces of meta-pytorch/float8_experimental#326, "AR for input ->
AG -> ...", and of pytorch/torchtitan#1207, "there are all-reduces for syncing the scales (expected)" in the
tensorwise and rowwise TP forward). Per dense layer and micro-batch: in forward the two ``PrepareFloat8ModuleInput`` casts (attention
and MLP inputs, on the sequence shard) and the two row-parallel inputs (``attention.wo``, ``feed_forward.w2``);
in backward ``NoopFwToFloat8BwDynamic``'s cast of each column-parallel output gradient (``wq``, ``wk``, ``wv``,
``w1``, ``w3``: torchtitan's Llama keeps them separate modules) and of each row-parallel one (``wo``, ``w2``).
Each is latency-bound: an all-reduce of 4 bytes on the cost model's TP link
(:func:`hetplan.estimate.comm.group_collective_time_s`), on the critical path of the cast that needs it. A
recomputed forward runs its four again (full recomputation; per-op SAC, whose ``_save_list`` keeps ``aten.max``
but not the all-reduce, and whose backward re-runs the FP8 all-gathers these casts feed). The ``rowwise`` recipes
run plain TP on ``Float8Linear`` modules, whose casts see DTensors too: an axis-wise amax (``torch.amax`` along
the cast's axis, a linear reduction for DTensor: a partial maximum over a sharded axis, pytorch/pytorch#147578)
needs an all-reduce only where its axis is the one TP splits — a row-parallel layer's input and weight in
forward, a column-parallel layer's output gradient and weight in backward; the activations' carry one fp32 per
token. Not under Transformer Engine (its amax reduction is not charged, above).
The FSDP float8 all-gather's weight scales come from one all-reduce per step
(``precompute_float8_dynamic_scale_for_fsdp``, ``float8/fsdp_utils.py``): not charged.

**What else was checked** (docs/estimator.md, FP8): per linear layer, the casts and GEMMs above predict torchao's
own compiled forward + backward microbenchmark of Llama 3 70B's TP-8 shapes on H100 (pytorch/ao#2185, rowwise
recipe, ``M = 16384``: speed-ups 1.11 / 1.43 / 1.73 / 1.71 for QKV / projection / FC1 / FC2) at 1.08 / 1.10 /
1.50 / 1.40 — the per-linear model is not too fast. The end-to-end over-prediction of the TP-8 rowwise rows
(measured slower than bf16, pytorch/torchtitan#1207) is therefore outside the linear layers. That issue's trace
(Llama 3 8B, FSDP 2 x TP 2, per-op SAC) puts it in the backward — attention and MLP backward 7,320 µs tensorwise,
10,128 µs rowwise, "2 blocking all-gathers scheduled back to back" — where this model prices 7.8 and 8.9 ms per
layer (H100 SXM, local batch 1): about 1.2 ms a layer is missing from rowwise, and no source states its
mechanism, so it is not modelled.

**GEMM rate of rowwise.** ``torch._scaled_mm`` with one scale per row and per column runs a CUTLASS
rowwise-scaled kernel on sm90, tensor-wise scales cuBLAS. No torchao or PyTorch page publishes their GEMM
throughput side by side (torchao's roofline, ``roofline_utils.py`` ``get_individual_gemm_time_sympy``, prices
every float8 recipe at the same FP8 peak; its published end-to-end table, Llama 3 8B on 8 H100, bf16 6150 tok/s,
tensorwise with float8 all-gather 7689.5, rowwise with bf16 all-gather 6768, docs ``workflows/training.md``,
measures the whole step): the rowwise GEMMs take the tensor-wise FP8 rate (stated simplification).

**Memory.** Master weights, gradients and optimizer states stay as in bf16 (fp32 master weights and Adam states;
Megatron's fp32 main-gradient buffer; the gradient reduction dtype is unchanged). The 16-bit weights:

* ``megatron``: FP8 parameters, as NeMo / Megatron-Bridge's FP8 recipes run Megatron-Core
  (``bf16_with_fp8_mixed``: ``fp8="hybrid"``, ``fp8_recipe="delayed"``, ``fp8_amax_history_len=1024``,
  ``fp8_amax_compute_algo="max"``, ``fp8_param_gather=True``; what ``hetplan export --to megatron`` emits): the
  FP8 weight (1 B) and its cached transpose (1 B) take the place of the bf16 weight (2 B) — no extra bytes on
  Hopper, the MXFP8 scales (1 B per 32 elements of each copy) on Blackwell — and the distributed optimizer
  all-gathers the updated parameters in FP8, 1 byte per parameter (:func:`gathered_weight_bytes`).
* ``deepspeed`` (Transformer Engine modules without FP8 parameters): bf16 weights plus the FP8 weight and its
  transpose that TE caches across micro-batches, :data:`WEIGHT_COPY_BYTES` more per linear parameter
  (:func:`weight_copy_bytes`).
* ``fsdp`` (torchao): no cached copies (``Float8Linear`` casts per call); with torchtitan's
  ``enable_fsdp_float8_all_gather`` (tensorwise only) the all-gathered parameters are FP8: the unsharded units
  and the parameter all-gather take 1 byte per parameter. The ``rowwise`` recipes gather bf16 (2 bytes; the
  option left torchtitan with tensorwise in pytorch/torchtitan#3127).

Saved activations: Transformer Engine saves the linear layers' inputs for the weight-gradient GEMM in FP8, 1 byte
instead of 2 (TE ``Linear`` / ``LayerNormLinear`` / ``LayerNormMLP``; :func:`saved_activation_savings_bytes`);
torchao saves the high-precision inputs (``matmul_with_hp_or_float8_args``). The 1-byte all-gathers cover all of
a stage's parameters (the bf16 norms and embeddings are a small share; stated simplification).

All functions broadcast over numpy arrays. Seconds, bytes, elements.
"""

from __future__ import annotations

import numpy as np

from hetplan.estimate.comm import group_collective_time_s
from hetplan.hardware.catalog import Architecture, GPUSpec
from hetplan.hardware.stacks import StackSpec
from hetplan.model import counts
from hetplan.model.spec import ModelSpec
from hetplan.estimate.arrays import Array

#: The job dtype of FP8 training (:attr:`hetplan.plan.Job.dtype`).
FP8 = "fp8"
#: Scaling recipes (module doc) and the bytes each moves per element it quantizes.
CAST_BYTES_PER_ELEMENT = {"delayed": 4.0, "current": 6.0, "tensorwise": 5.0, "mxfp8": 4.0 + 2.0 / 32.0}
#: torchao tensor-wise backward, bytes per element (module doc): the transposed output gradient fused with its cast
#: (a second 1-byte write); a separate transposed copy of an FP8 tensor (read + write).
TRANSPOSED_WRITE_BYTES = 1.0
TRANSPOSED_COPY_BYTES = 2.0
#: The torchao recipes that scale along an axis (module doc): their casts are :data:`ROWWISE_CAST_BYTES`, and no
#: FSDP or TP all-gather carries FP8 (:func:`fp8_gathers`).
ROWWISE = ("rowwise", "rowwise_with_gw_hp")
#: Bytes per element of each operand of a linear GEMM, ``(forward, backward)``, per micro-batch (module doc,
#: torchao ``roofline_utils.py``): the input ``M·K``, the output gradient ``M·N``, the weight ``N·K``.
#: ``"mxfp8"``: torchao's ``MXFP8Linear`` under ``fsdp`` (module doc), each cast 3 B plus a scale byte per 32.
MX_CAST_BYTES = 3.0 + 1.0 / 32.0
ROWWISE_CAST_BYTES = {
    "rowwise": {"input": (3.0, 7.0), "grad_output": (0.0, 8.0), "weight": (3.0, 7.0)},
    "rowwise_with_gw_hp": {"input": (3.0, 0.0), "grad_output": (0.0, 3.0), "weight": (3.0, 3.0)},
    "mxfp8": {"input": (MX_CAST_BYTES, MX_CAST_BYTES), "grad_output": (0.0, 2 * MX_CAST_BYTES),
              "weight": (MX_CAST_BYTES, MX_CAST_BYTES)},
}
#: Bytes per element of the two backward GEMMs' outputs (data gradient ``M·K``, weight gradient ``N·K``) that
#: torchao rescales after a cuBLAS tensor-wise GEMM (module doc): a bf16 read and write under ``rowwise``; none
#: under ``rowwise_with_gw_hp`` (its data-gradient weight is tensor-wise, its weight gradient a bf16 GEMM).
ROWWISE_RESCALE_BYTES = {"rowwise": 4.0, "rowwise_with_gw_hp": 0.0, "mxfp8": 0.0}
#: Bytes per FP8 GEMM input operand element (E4M3 / E5M2).
OPERAND_BYTES = 1
#: Transformer Engine's cached FP8 weight and its transpose (Hopper), bytes per linear parameter; MXFP8 adds a
#: one-byte scale per 32 elements to each of its two copies.
WEIGHT_COPY_BYTES = 2.0


def is_fp8(dtype: str) -> bool:
    """True for FP8 training."""
    return dtype == FP8


def high_precision(dtype: str) -> str:
    """The dtype of everything that is not an FP8 linear GEMM (attention core, head, router): bf16 under FP8
    training, else ``dtype`` itself."""
    return "bf16" if is_fp8(dtype) else dtype


def recipe(gpu: GPUSpec, framework: str, requested: str | None = None, stack: StackSpec | None = None) -> str:
    """The scaling recipe the framework runs on ``gpu``: under ``fsdp`` (torchao) the job's ``requested`` one
    (``tensorwise``, ``rowwise``, ``rowwise_with_gw_hp``, or ``mxfp8`` on Blackwell: torchao's ``MXFP8Linear``),
    else the stack's ``fp8_recipe`` on that GPU family (torchtitan 0.3.0: ``rowwise``; :meth:`hetplan.hardware.stacks.StackSpec.fp8_recipe_on`), else torchao's
    dynamic ``tensorwise`` (torchtitan's default float8 recipe before 0.3); under Transformer
    Engine (megatron, deepspeed) the job's ``requested`` one (:attr:`hetplan.plan.Job.fp8_recipe`: ``delayed``
    or ``current``), else ``mxfp8`` on Blackwell (NeMo's FP8 recipe on B200 / GB200) and ``delayed`` otherwise
    (Megatron-Core's default)."""
    if framework == "fsdp":
        return requested or (stack.fp8_recipe_on(gpu.architecture) if stack is not None else None) or "tensorwise"
    if requested is not None:
        return requested
    return "mxfp8" if gpu.family is Architecture.BLACKWELL else "delayed"


def gemm_ceiling(gpu: GPUSpec, dtype: str) -> float:
    """Large-GEMM efficiency ``e_max`` (fraction of the ``dtype`` peak): ``fp8_compute_efficiency`` for FP8 where the
    catalog has one, else ``compute_efficiency`` (module doc)."""
    if is_fp8(dtype) and gpu.fp8_compute_efficiency is not None:
        return gpu.fp8_compute_efficiency
    return gpu.compute_efficiency


def layer_cast_time_s(gpu: GPUSpec, recipe_name: str, shapes: Array, t: Array = 1, sequence_parallel: Array = False,
                      column_parallel: Array = None, framework: str = "megatron"):
    """``(forward_s, backward_s)`` of the FP8 quantization of one layer, one micro-batch: the inputs ``M·K`` of its
    linear GEMMs ``shapes`` (``[(M, N, K, batch), ...]``, :func:`hetplan.estimate.moe.linear_gemm_shapes`) in
    forward, their output gradients ``M·N`` in backward, :data:`CAST_BYTES_PER_ELEMENT` each, at the HBM bandwidth
    (module doc); torchao's ``tensorwise``: :func:`tensorwise_cast_time_s` (``t``, ``sequence_parallel``,
    ``column_parallel``); torchao's axis-wise recipes (:func:`torchao_axiswise`): :func:`rowwise_cast_time_s`."""
    if recipe_name == "tensorwise":
        return tensorwise_cast_time_s(gpu, shapes, t, sequence_parallel, column_parallel)
    if torchao_axiswise(recipe_name, framework):
        return rowwise_cast_time_s(gpu, recipe_name, shapes)
    per = CAST_BYTES_PER_ELEMENT[recipe_name] / gpu.hbm_bandwidth_bytes_per_s
    fwd = sum(M * K * n for M, N, K, n in shapes)
    bwd = sum(M * N * n for M, N, K, n in shapes)
    return fwd * per, bwd * per


def tensorwise_cast_time_s(gpu: GPUSpec, shapes: Array, t: Array = 1, sequence_parallel: Array = False,
                           column_parallel: Array = None):
    """``(forward_s, backward_s)``: torchao float8 tensor-wise scaling of one layer's linear GEMMs ``shapes``
    (``[(M, N, K, batch), ...]``) for one micro-batch, compiled (module doc, Casts). Per GEMM, bytes per element of
    its input ``M·K``, output gradient ``M·N`` and weight ``N·K`` (:data:`CAST_BYTES_PER_ELEMENT` ``c`` = 5):

    * forward: the input cast, ``c·M·K`` (``c·M·K/t`` for a column-parallel GEMM under TP: cast on the shard
      before the FP8 all-gather);
    * backward: the output-gradient cast with its transposed second write, ``(c + 1)·M·N`` (a row-parallel GEMM
      under TP: ``c·M·N/t`` before the all-gather, then a 2-byte transposed copy of the gathered FP8 tensor); the
      input for the weight-gradient GEMM, recast from the saved bf16 input ``c·M·K`` (column-parallel under TP: a
      2-byte copy of the gathered FP8 input); the FP8 weight's column-major copy ``2·N·K``.

    ``column_parallel``: one flag per GEMM, True for a column-parallel one (QKV, FC1), False for a row-parallel
    one (output projection, FC2) — their FP8 all-gathers exist with TP > 1 and ``sequence_parallel`` (as
    torchtitan runs TP); None: no such all-gathers (MoE / MLA layers: every cast on the whole tensor). Seconds;
    arrays broadcast."""
    c, w, cp = CAST_BYTES_PER_ELEMENT["tensorwise"], TRANSPOSED_WRITE_BYTES, TRANSPOSED_COPY_BYTES
    tp = (np.asarray(t, dtype=float) > 1) & np.asarray(sequence_parallel, dtype=bool)
    fwd = bwd = 0.0
    for i, (M, N, K, n) in enumerate(shapes):
        col = column_parallel is not None and column_parallel[i]
        row = column_parallel is not None and not column_parallel[i]
        mk, mn, nk = M * K * n, M * N * n, N * K * n
        fwd = fwd + np.where(tp & col, c * mk / t, c * mk)
        grad = np.where(tp & row, c * mn / t + cp * mn, (c + w) * mn)
        wgrad_input = np.where(tp & col, cp * mk, c * mk)
        bwd = bwd + grad + wgrad_input + cp * nk
    return fwd / gpu.hbm_bandwidth_bytes_per_s, bwd / gpu.hbm_bandwidth_bytes_per_s


def rowwise_cast_bytes(recipe_name: str, shapes: Array) -> tuple[Array, Array]:
    """``(forward_bytes, backward_bytes)`` the ``rowwise`` / ``rowwise_with_gw_hp`` casts of one layer's linear
    GEMMs ``shapes`` (``[(M, N, K, batch), ...]``, local to a rank) move in one micro-batch:
    :data:`ROWWISE_CAST_BYTES` per element of each GEMM's input ``M·K``, output gradient ``M·N`` and weight
    ``N·K``, plus :data:`ROWWISE_RESCALE_BYTES` per element of the backward GEMMs' outputs ``M·K`` and ``N·K``
    (module doc); ``mxfp8``: torchao's ``MXFP8Linear`` the same way. Under TP the operands are the gathered bf16
    tensors (no FP8 all-gather), so the shapes are the GEMMs' own."""
    per, rescale = ROWWISE_CAST_BYTES[recipe_name], ROWWISE_RESCALE_BYTES[recipe_name]
    fwd = bwd = 0.0
    for M, N, K, n in shapes:
        for name, elements in (("input", M * K * n), ("grad_output", M * N * n), ("weight", N * K * n)):
            f, b = per[name]
            fwd, bwd = fwd + f * elements, bwd + b * elements
        bwd = bwd + rescale * (M * K + N * K) * n
    return fwd, bwd


def rowwise_cast_time_s(gpu: GPUSpec, recipe_name: str, shapes: Array):
    """``(forward_s, backward_s)``: :func:`rowwise_cast_bytes` at the HBM bandwidth."""
    fwd, bwd = rowwise_cast_bytes(recipe_name, shapes)
    return fwd / gpu.hbm_bandwidth_bytes_per_s, bwd / gpu.hbm_bandwidth_bytes_per_s


#: Tensor-wise casts of DTensor activations per dense layer and micro-batch under torchtitan's float8 TP plan,
#: each waiting for an amax all-reduce (module doc): forward (the attention and MLP inputs, the inputs of ``wo``
#: and ``w2``); backward (the output gradients of ``wq``, ``wk``, ``wv``, ``wo``, ``w1``, ``w2``, and ``w3`` of a
#: gated MLP); the forward's again under per-op SAC.
TP_AMAX_ALLREDUCES_FORWARD = 4
TP_AMAX_ALLREDUCES_BACKWARD_GATED = 7
#: Bytes per element of a tensor-wise cast's amax pass: the bf16 read before the cast (module doc).
AMAX_READ_BYTES = 2.0
#: Bytes of one amax: one fp32 (a tensor-wise scale; an axis-wise scale has one per row or column).
AMAX_BYTES = 4.0


def tp_amax_allreduce_time_s(m: ModelSpec, recipe_name: str | None, t: Array, sequence_parallel: Array, link,
                             tokens: Array = 1.0):
    """``(forward_s, backward_s, op_sac_s)`` of the amax all-reduces of one dense layer's torchao casts of
    TP-sharded DTensors, one micro-batch of ``tokens`` (``b·s``) on a rank (module doc), each
    :func:`hetplan.estimate.comm.group_collective_time_s` over the ``t`` ranks on ``link``; ``op_sac_s``: what
    per-op SAC's recomputation runs again (full recomputation: the forward's). 0 unless ``t > 1`` and
    ``sequence_parallel`` (torchtitan's TP) and the recipe is torchao's:

    * ``tensorwise`` (torchtitan's float8 TP plan): :data:`TP_AMAX_ALLREDUCES_FORWARD` and
      :data:`TP_AMAX_ALLREDUCES_BACKWARD_GATED` (one fewer without a gated MLP) all-reduces of
      :data:`AMAX_BYTES`; the forward's four again under per-op SAC.
    * ``rowwise`` (plain TP: ``ColwiseParallel`` / ``RowwiseParallel`` on ``Float8Linear``): an axis-wise amax
      reduces over a sharded dimension only where the cast's axis is the one TP splits (``float8_linear.py``
      ``matmul_with_hp_or_float8_args`` at pytorch/ao@6243040): in forward a row-parallel layer's input
      (``[tokens, in/t]`` along ``in``: ``tokens`` fp32) and weight (``[in/t, out]`` along ``in``: ``h`` fp32),
      for ``wo`` and ``w2``; in backward a column-parallel layer's output gradient (``[tokens, out/t]`` along
      ``out``) and its weight for the data gradient (along ``out``: ``h`` fp32), for ``wq``, ``wk``, ``wv``,
      ``w1``, ``w3``; per-op SAC recomputes ``wo`` (its two).
    * ``rowwise_with_gw_hp``: the forward and the column-parallel output gradients as ``rowwise``; the weights
      for the data gradient scaled tensor-wise (one fp32 each, all seven sharded); no weight-gradient casts.

    Seconds; arrays broadcast."""
    on = (np.asarray(t) > 1) & np.asarray(sequence_parallel, dtype=bool)
    t_ = np.maximum(t, 1)

    def ar(nbytes):
        return np.where(on, group_collective_time_s(nbytes, "allreduce", t_, 1, link), 0.0)

    col = 5 if m.gated_mlp else 4  # wq, wk, wv, w1 (and w3)
    if recipe_name == "tensorwise":
        one = ar(AMAX_BYTES)
        return (TP_AMAX_ALLREDUCES_FORWARD * one, (TP_AMAX_ALLREDUCES_BACKWARD_GATED - 5 + col) * one,
                TP_AMAX_ALLREDUCES_FORWARD * one)
    if recipe_name in ROWWISE:
        act, weight = ar(AMAX_BYTES * np.asarray(tokens, dtype=float)), ar(AMAX_BYTES * m.hidden_size)
        fwd = 2 * (act + weight)
        if recipe_name == "rowwise":
            bwd = col * (act + weight)
        else:
            bwd = col * act + (col + 2) * ar(AMAX_BYTES)
        return fwd, bwd, act + weight
    zero = 0.0 * np.asarray(on, dtype=float)
    return zero, zero, zero


def op_sac_cast_time_s(gpu: GPUSpec, recipe_name: str, shapes: Array, t: Array = 1, sequence_parallel: Array = False,
                       column_parallel: Array = None):
    """Seconds of the forward FP8 casts of one dense layer (one micro-batch) that torchtitan's per-op selective
    activation checkpointing runs again in backward (module doc, Casts under per-op SAC): its policy saves the
    outputs of every other matmul, of SDPA, of the reduce-scatters and of ``aten.max``, not the casts'. Under
    torchao's tensor-wise TP plan (``column_parallel`` flags given, ``t > 1``, ``sequence_parallel``) every
    linear's input arrives as an FP8 DTensor that its autograd function saves, so all the forward casts
    (:func:`layer_cast_time_s`) run again; otherwise a linear saves its bf16 input and recasts it in backward,
    and only the recomputed matmuls (``wk``, ``wo``, ``w3`` of a Llama block: their inputs are the QKV, output
    projection and gate/up inputs) need their forward casts — all of ``shapes`` but the last (``w2``, whose output
    is kept). A tensor-wise cast re-runs without its amax read (``aten.max`` is kept: 3 of its 5 B per element);
    the rowwise casts' ``aten.amax`` is not in the list (their whole 3 B). ``shapes``:
    :func:`hetplan.estimate.moe.linear_gemm_shapes` of a dense layer."""
    shapes = list(shapes)
    full = layer_cast_time_s(gpu, recipe_name, shapes, t, sequence_parallel, column_parallel, "fsdp")[0]
    last_flag = None if column_parallel is None else (column_parallel[-1],)
    last = layer_cast_time_s(gpu, recipe_name, shapes[-1:], t, sequence_parallel, last_flag, "fsdp")[0]
    fp8_inputs = ((recipe_name == "tensorwise") & (column_parallel is not None) & (np.asarray(t) > 1)
                  & np.asarray(sequence_parallel, dtype=bool))
    kept_amax = (CAST_BYTES_PER_ELEMENT["tensorwise"] - AMAX_READ_BYTES) / CAST_BYTES_PER_ELEMENT["tensorwise"]
    return np.where(fp8_inputs, full, full - last) * (kept_amax if recipe_name == "tensorwise" else 1.0)


def torchao_axiswise(recipe_name: str | None, framework: str = "megatron") -> bool:
    """Whether ``recipe_name`` is one of torchao's axis-wise recipes (module doc): ``rowwise``,
    ``rowwise_with_gw_hp``, and ``mxfp8`` under ``framework = "fsdp"`` (``MXFP8Linear``; Transformer Engine's
    MXFP8 elsewhere): their casts are :data:`ROWWISE_CAST_BYTES`, and all their communication is in high
    precision."""
    return recipe_name in ROWWISE or (recipe_name == "mxfp8" and framework == "fsdp")


def fp8_gathers(recipe_name: str | None, framework: str = "megatron") -> bool:
    """Whether the TP and FSDP all-gathers of an FP8 run carry FP8 (module doc): every recipe but torchao's
    axis-wise ones (:func:`torchao_axiswise`), whose communication is all in high precision."""
    return not torchao_axiswise(recipe_name, framework)


def weight_cast_time_s(linear_parameters: Array, gpu: GPUSpec, recipe_name: str, framework: str):
    """Quantization of the weights once per iteration under Transformer Engine (module doc); 0 under torchao
    (``fsdp``: tensorwise casts the shard before the all-gather, rowwise the gathered weight in each micro-batch's
    layer casts, :func:`rowwise_cast_bytes`)."""
    if framework == "fsdp":
        return 0.0 * np.asarray(linear_parameters, dtype=float)
    return np.asarray(linear_parameters, dtype=float) * CAST_BYTES_PER_ELEMENT[recipe_name] / gpu.hbm_bandwidth_bytes_per_s


def weight_copy_bytes(linear_parameters: Array, recipe_name: str, framework: str):
    """Bytes the FP8 weights add to the bf16 weights' (module doc, Memory): the MXFP8 scales under ``megatron``
    (FP8 parameters replace the bf16 ones), :data:`WEIGHT_COPY_BYTES` (+ MXFP8 scales) per linear parameter under
    ``deepspeed`` (TE's cached copies), 0 under ``fsdp``."""
    scales = 2.0 / 32.0 if recipe_name == "mxfp8" else 0.0
    per = {"fsdp": 0.0, "megatron": scales}.get(framework, WEIGHT_COPY_BYTES + scales)
    return np.asarray(linear_parameters, dtype=float) * per


def gathered_weight_bytes(dtype: str, framework: str, fsdp1: bool = False, recipe_name: str | None = None) -> int:
    """Bytes per parameter of the data-parallel parameter all-gathers (distributed optimizer, FSDP): 1 under FP8
    with FP8 parameters (``megatron``, ``fp8_param_gather``) or torchao's float8 all-gather (``fsdp``, tensorwise),
    else 2 — the ``rowwise`` recipes (``recipe_name``) gather bf16 (module doc).
    ``fsdp1``: an FSDP1 stack (``optimizer_memory = "fsdp1"``) gathers its FlatParameters in the mixed-precision
    ``param_dtype`` (2 B): torchao's float8 all-gather is an FSDP2 extension (``fsdp_pre_all_gather`` /
    ``fsdp_post_all_gather`` of ``torch.distributed.fsdp`` ``fully_shard``), and Transformer Engine's ``te.Linear``
    under FSDP1 (llm-foundry's ``amp_fp8``) casts its gathered bf16 weight itself."""
    return OPERAND_BYTES if (is_fp8(dtype) and framework in ("megatron", "fsdp") and not fsdp1
                             and fp8_gathers(recipe_name, framework)) else 2


def mixed_gathered_weight_bytes(fp8_bytes: Array, linear_parameters: Array, parameters: Array):
    """Mean bytes per parameter of a stage's data-parallel parameter all-gather when only its layers' linear
    weights (``linear_parameters`` of its ``parameters`` per GPU) gather in FP8 (``fp8_bytes`` each) and the rest
    in bf16 (2 B): the word embedding and the output layer. torchao converts only ``nn.Linear`` modules to
    ``Float8Linear`` (``torchao/float8/float8_linear_utils.py`` ``convert_to_float8_training``; an ``nn.Embedding``
    is not one) and torchtitan leaves the output layer out (``filter_fqns = ["output"]``, what ``hetplan export``
    writes); Megatron-Core's ``--fp8-param-gather`` makes Transformer Engine modules' weights FP8
    (``fp8_model_init``), while its ``VocabParallelEmbedding`` and its ``output_layer`` (a
    ``tensor_parallel.ColumnParallelLinear``) stay bf16. Arrays broadcast."""
    p = np.maximum(np.asarray(parameters, dtype=float), 1.0)
    lin = np.minimum(np.asarray(linear_parameters, dtype=float), p)
    return (fp8_bytes * lin + 2.0 * (p - lin)) / p


def saved_activation_savings_bytes(m: ModelSpec, b: Array, s: Array, t: Array, sequence_parallel: Array,
                                   framework: str):
    """Bytes of one layer's saved activations (per GPU, one micro-batch) that Transformer Engine keeps in FP8
    instead of bf16 — one byte per element of the linear-layer inputs among the tensors that
    :func:`hetplan.model.counts.layer_activation_bytes` counts: the attention and MLP inputs after the norms
    (``sbh`` each, split over TP with sequence parallelism), the output projection's input (``sb·q_out``) and the
    second MLP GEMM's input (``sbf``; MoE layers: each routed copy's input ``h`` and ``f_e``, the shared experts'
    ``f_s``) split over TP. 0 under torchao (``fsdp``), which saves the bf16 inputs. Without recomputation
    (full recomputation saves only the layer input, in bf16)."""
    if framework == "fsdp":
        return 0.0 * np.asarray(b, dtype=float)
    b, s = counts.as_float(b), counts.as_float(s)
    sb = s * b
    replicated = 2.0 * sb * m.hidden_size
    mlp = sb * m.ffn_hidden_size
    if m.is_moe:  # mean over the dense and the MoE layers
        routed = m.experts_per_token * sb * (m.hidden_size + m.expert_ffn_hidden_size)
        moe_mlp = routed + sb * m.shared_expert_ffn_hidden_size
        mlp = (mlp * (m.num_layers - m.num_moe_layers) + moe_mlp * m.num_moe_layers) / m.num_layers
    split = sb * m.attn_out_dim + mlp
    return np.where(sequence_parallel, (replicated + split) / t, replicated + split / t)
