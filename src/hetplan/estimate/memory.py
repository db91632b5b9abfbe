"""Memory per GPU of one pipeline stage: weights, gradients, optimizer states, activations, overhead.

Model states follow Megatron-LM's mixed-precision Adam (Narayanan et al. SC'21; Megatron-LM
``theoretical_memory_usage.py``): 2-byte weights, 4-byte fp32 gradient accumulation buffer, 12 bytes of optimizer
state (fp32 master weights, momentum, variance) = 18 bytes per parameter. ZeRO (Rajbhandari et al. SC'20, Sec. 5)
shards over the stage's DP group: stage 1 the optimizer states, stage 2 also the gradients, stage 3 also the
weights (plus a gathered-layer prefetch buffer of two layers, or the stage's one).

The gradient buffer's dtype is the gradient-reduction dtype (``grad_reduce_dtype``): Megatron-Core's DDP
allocates one contiguous grad buffer per stage in fp32 when ``grad_reduce_in_fp32`` (Megatron-LM sets
``accumulate_allreduce_grads_in_fp32`` for bf16 unless ``--grad-reduce-in-bf16``: ``megatron/training/
arguments.py``), else in the parameter dtype (``megatron/core/distributed/param_and_grad_buffer.py``). NeMo's
performance recipes (``nemo/collections/llm/recipes/*`` ``pretrain_performance_optimizations``: ``plugins.
grad_reduce_in_fp32 = False``), which the DGX Cloud benchmarks run, keep 2-byte gradients. The optimizer then
needs an fp32 copy of its shard of the gradients for the step (``DistributedOptimizer._copy_model_grads_to_main_grads``
sets ``shard_main_param.grad = shard_model_grad.float()``; ``zero_grad`` frees it again before the next forward):
4 more bytes per owned parameter during the optimizer step only, when the activations are freed — a transient
of the step phase (below), where Megatron-LM's ``docs/source/api-guide/dist_optimizer.md`` table counts it
statically (18 → 6 + 12/d bytes per parameter with fp32 grads, 20 → 4 + 16/d with 16-bit grads).

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

Attention: with ``attention="flash"`` (FlashAttention, Dao et al. 2022) no s x s tensor is stored
(:func:`hetplan.model.counts.layer_activation_bytes`), so selective recomputation holds what ``none`` holds.

**Overhead** (the ``overhead`` component; the components above stay Megatron-LM's "theoretical" memory):

* the CUDA context (:func:`context_bytes`: :data:`CUDA_CONTEXT_BYTES` with eager module loading,
  :data:`CUDA_CONTEXT_LAZY_BYTES` with lazy loading, measured in pytorch/pytorch PR 86509), outside PyTorch's
  allocator, plus the stack's measured residual (:attr:`hetplan.hardware.stacks.StackSpec.memory_residual_gib`:
  what ``nvidia-smi`` showed above this footprint on the stack's own runs, e.g. NCCL buffers; 0 unless measured);
* ``transient``: working memory the theoretical formulas omit but ``torch.cuda.max_memory_allocated`` sees, the
  larger of two phases:

  - forward/backward: the gradients of the layer being back-propagated, :data:`BACKWARD_WORKING_SET` x one
    layer's activations without recomputation and without their s x s part (fitted on Espresso's DeepSpeed
    traces), plus with standard attention the gradient of the s x s softmax output (``2·a·s²·b/t``); on the last stage the
    16-bit logits next to their fp32 copy, :data:`LOGITS_COPY_BYTES` per logit; with ``framework="deepspeed"``
    also the 16-bit ``.grad`` that DeepSpeed's FP16_Optimizer keeps next to its fp32 master
    (:data:`DEEPSPEED_GRAD_BYTES` per gradient element held);
  - the last stage under Megatron-LM: its output is the loss, so the output-layer term (logits, saved softmax)
    and the 16-bit logits exist only around the loss and are freed before any layer's backward; the peak is the
    larger of that loss phase and the layer-backward phase (recomputed layer + working set), not their sum, and
    ``transient`` is negative where the theoretical components add the two (DeepSpeed's pipeline engine keeps its
    16-bit output logits through the backward: the sum);
  - optimizer step under Megatron with 16-bit gradients: the fp32 copy of the owned gradient shard (above);
  - optimizer step, ``framework="deepspeed"``: the 16-bit grads plus the fp32 copies the step makes
    (``p.grad.to(fp32)`` per parameter, then flattened: :data:`DEEPSPEED_STEP_BYTES` per owned parameter;
    DeepSpeed ``runtime/fp16/fused_optimizer.py`` ``FP16_Optimizer.step``), while activations are freed.
    Under ZeRO-1/2 (``runtime/zero/stage_1_and_2.py``) the model states are 16-bit weights and 16-bit ``.grad``
    (partitioned under ZeRO-2), fp32 master weights and Adam moments of the owned partition only
    (``single_partition_of_fp32_groups``), no fp32 gradient buffer; the step adds one fp32 copy of the owned
    gradient partition (4 B per owned parameter). Under DeepSpeed's BF16_Optimizer (bf16 on a stack with
    ``bf16_optimizer``, :func:`bf16_optimizer_runs`) the gradients are the 16-bit ``.grad`` plus an fp32 buffer of
    every parameter of the stage (:data:`BF16_OPTIMIZER_GRAD_BYTES`, not partitioned), the fp32 master weights
    and moments those of the owned partition, and the step copies nothing.
    Megatron-LM's optimizer uses its fp32 main-gradient buffer (the 4-byte gradients above) directly;

* :data:`ALLOCATOR_MARGIN` of the allocated bytes: what the caching allocator holds beyond the allocated peak
  (reserved minus allocated).

**Does it fit** (``required``, what the estimator compares with the GPU's memory as ``nvidia-smi`` reports its
total, :attr:`hetplan.hardware.catalog.GPUSpec.memory_bytes`; the searches propose only plans whose footprint
``total`` fits, so what they propose fits by this test too): the allocated peak less
:data:`FIT_TOLERANCE` (the largest over-prediction of the allocated peak on held-out traced stages), plus the
context and the stack's residual. The allocator's cache is not a need (it is released and the allocation retried
before an out-of-memory error), so the margin is reported (``total``, :func:`fit_warning`), never a refusal: the
fit test errs towards fitting, so that no plan a published run used is refused (GPT-3 5B at TP 1, micro-batch 2,
no recomputation under NeMo 22.09 on A100 80GB: 79.4 GiB allocated, ran), while the measured out-of-memory
layouts of BLOOM's search under Megatron-DeepSpeed stay refused through that stack's measured residual.

Measured on 37 stages of Espresso's DeepSpeed traces (``benchmarks/bench_memory_traces.py``): allocated peak
16.0 % low before, 1.8 % mean absolute error after on the 22 held-out stages (per GPU type: docs/estimator.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from hetplan.errors import HetplanError
from hetplan.estimate import context, fp8, moe
from hetplan.model import counts
from hetplan.model.spec import ModelSpec
from hetplan.plan_rules import mla_module_violation
from hetplan.estimate.arrays import Array

if TYPE_CHECKING:
    from hetplan.degrees import Degrees
    from hetplan.estimate.options import TrainingOptions
    from hetplan.estimate.stagework import StageWork

WEIGHT_BYTES = 2
GRAD_BYTES = 4
OPTIMIZER_BYTES = 12
#: Bytes per gradient element of a 16-bit gradient buffer, and of the fp32 copy of the owned gradient shard the
#: optimizer step needs with it (module doc).
GRAD16_BYTES, MAIN_GRAD_COPY_BYTES = 2, 4
#: Megatron-FSDP (``framework = "megatron"`` at ZeRO-2 / 3, ``optim_grads`` / ``optim_grads_params``) in backward,
#: bytes per parameter of one layer: the unit's
#: 16-bit ``param.grad`` the weight-gradient GEMMs write (freed once copied) and two units' unsharded main-gradient
#: buckets in the reduce dtype (fp32 4 B; 2 B with bf16 reduction) — the unit being filled and the one being
#: reduce-scattered ("the currently used main_grad buffer does not exceed the scope of two FSDP Unit Modules, i.e.,
#: the buffer limit imposed by double-buffer allocator", ``_grad_acc`` in
#: ``megatron/core/distributed/custom_fsdp/fully_sharded_data_parallel.py`` at NVIDIA/Megatron-LM 1e057005).
MEGATRON_FSDP_MAIN_GRAD_UNITS = 2
#: CUDA context of a PyTorch process (bytes; outside the caching allocator, inside nvidia-smi's figure) with eager
#: module loading: 666,632,192 B, and with ``CUDA_MODULE_LOADING=LAZY`` 287,047,680 B, both measured after
#: ``torch.cuda.init()`` in pytorch/pytorch PR 86509, which made LAZY PyTorch's default from 1.13 (2022-10) on CUDA
#: >= 11.7 (lazy loading: CUDA 11.7 release notes; the CUDA C++ Programming Guide, "Lazy Loading"). A stack released
#: before 2022-11 (:data:`LAZY_LOADING_FROM`) gets the eager figure, a later one the lazy one (:func:`context_bytes`).
#: cuBLAS's workspace is allocated through PyTorch's caching allocator (``CublasHandlePool.cpp``), so it is in the
#: allocated bytes, not here. NCCL's buffers (``NCCL_BUFFSIZE`` 4 MiB for the Simple protocol plus the LL/LL128
#: buffers, per channel and peer, per communicator: NVIDIA/nccl issues 864, 986) are not modelled per
#: communicator: their size depends on the NCCL release, channel count and algorithms (0.3 to 1.6 GB per
#: communicator in those issues), so the fit test leaves them out (it errs towards fitting) and a stack whose
#: runs measured them carries them in :attr:`hetplan.hardware.stacks.StackSpec.memory_residual_gib`.
CUDA_CONTEXT_BYTES = 666_632_192
CUDA_CONTEXT_LAZY_BYTES = 287_047_680
#: First month of stacks that load CUDA modules lazily (PyTorch 1.13, released 2022-10-28, sets
#: ``CUDA_MODULE_LOADING=LAZY`` when unset: PR 86509).
LAZY_LOADING_FROM = "2022-11"
#: What the caching allocator holds beyond the allocated peak, as a fraction of it: the reported footprint
#: (``total``, what ``nvidia-smi`` / ``torch.cuda.max_memory_reserved`` show) adds it, the fit test does not
#: (``required``): PyTorch's allocator, when ``cudaMalloc`` fails, frees every cached block it holds and retries
#: (``c10/cuda/CUDACachingAllocator.cpp``, ``release_cached_blocks`` before raising OOM), so cached memory is not
#: a need; what it cannot return is the unused tail of a segment that holds a live block (blocks rounded to 512 B,
#: segments of 2 MiB / 20 MiB or the request rounded to 2 MiB, large blocks split). A stated assumption, checked
#: (not fitted) on torchtitan's published reserved peaks: measured reserved over predicted allocated 1.01-1.27,
#: median 1.08, on its 14 rows with memory (docs/estimator.md, Memory); 0.05 is kept, so the reported footprint
#: errs low rather than high.
ALLOCATOR_MARGIN = 0.05
#: The fit test's allowance for the estimate's own error: a stage is refused only when the allocated peak less
#: this fraction, plus what lies outside the allocator, exceeds the GPU's memory. 0.046 is the largest
#: over-prediction of the allocated peak on the held-out stages of Espresso's ``torch.cuda.max_memory_allocated``
#: traces (``benchmarks/bench_memory_traces.py``: +4.6 % on a T4 stage; 22 held-out stages, mean |error| 1.8 %).
#: Between ``required`` and ``total`` a plan fits with a warning (:func:`fit_warning`), never a refusal: a plan
#: that a published run used must not be refused for a margin.
FIT_TOLERANCE = 0.046
#: Backward working set, as a fraction of one layer's activations without recomputation and without the s x s
#: tensors: the activation gradients of the layer being back-propagated. Fitted on the calibration runs of Espresso's DeepSpeed traces
#: (``python benchmarks/bench_memory_traces.py --fit``).
BACKWARD_WORKING_SET = 1.72
#: Bytes per logit of the 16-bit logits tensor that exists next to the fp32 logits of the loss (last stage).
#: Measured: last stages exceed the others' residual by ~2·s·b·V bytes on the traces.
LOGITS_COPY_BYTES = 2
#: DeepSpeed FP16_Optimizer: the 16-bit ``.grad`` kept per gradient element (measured on the traces: +2.0-2.2 B per
#: parameter from the first backward on).
DEEPSPEED_GRAD_BYTES = 2
#: DeepSpeed FP16_Optimizer.step: fp32 copy of each gradient plus their flattened concatenation, 4 + 4 B per owned
#: parameter (measured: the step raises the peak by 8.00 B per parameter on every traced stage it dominates).
DEEPSPEED_STEP_BYTES = 8
#: DeepSpeed's BF16_Optimizer (``deepspeed/runtime/bf16_optimizer.py``): ``fp32_groups_gradients_flat``, an fp32
#: gradient of every parameter of the stage, not partitioned over DP (the 16-bit ``.grad`` of each micro-batch is
#: added to it; BigScience: "the additional memory usage is 4bytes x params and it's not sharded across gpus",
#: tr11-176B-ml/chronicles-prequel.md, Rebalancing layers). Its fp32 master weights and Adam moments are those of
#: the owned partition (``fp32_groups_flat_partition``: ZeRO-1's 12/dp); the step reads them through views of
#: this buffer, no copy.
BF16_OPTIMIZER_GRAD_BYTES = 4
FRAMEWORKS = ("megatron", "deepspeed", "fsdp")
#: Bytes per logit at the peak of a PyTorch cross-entropy (``framework = "fsdp"``), by
#: :attr:`hetplan.plan.Plan.cross_entropy` — against Megatron's fused vocab-parallel loss (the ``head`` term and
#: the 16-bit logits, 4 + 2):
#:
#: * ``fp32``: eager on fp32-cast logits (torchtitan's ``cross_entropy_loss``: ``F.cross_entropy(pred.float(),
#:   ...)``; the train loop deletes ``pred`` before the backward): in its backward the saved fp32 log-softmax
#:   output, the fp32 gradient nll_loss hands it and the fp32 input gradient log_softmax writes, 4 + 4 + 4;
#: * ``bf16``: the same ops on the bf16 logits (NeMo AutoModel's ``MaskedCrossEntropy(fp32_upcast=False)``), 2 + 2 + 2;
#: * ``compiled``: ``torch.compile`` of that function (torchtitan ``build_cross_entropy_loss`` since 2025-04,
#:   ``compile = true``): Inductor fuses the upcast, log-softmax and nll into reductions, its min-cut partitioner
#:   saves the bf16 input and the per-row log-sum-exp rather than fp32 tensors, and the backward writes the bf16
#:   input gradient in one fused kernel: 2 + 2.
CROSS_ENTROPY_BYTES_PER_LOGIT = {"fp32": 12, "bf16": 6, "compiled": 4}
#: The eager fp32 loss under TP, where torchtitan runs it vocab-parallel (``loss_parallel`` on whenever TP is, its
#: default): DTensor's handlers (``torch/distributed/tensor/parallel/loss.py``) compute the backward as
#: ``(grad_input + torch.exp(x)) * grad_output`` on the saved fp32 log-softmax ``x``, with ``grad_input`` a zeroed
#: fp32 tensor: ``x``, ``grad_input``, ``exp(x)`` and their sum, 4 + 4 + 4 + 4 bytes per local logit at once.
LOSS_PARALLEL_BYTES_PER_LOGIT = 16
#: Bytes per logit the caching allocator keeps reserved, beyond the allocated peak, around an eager fp32 loss whose
#: 16-bit logits are deleted before the backward (torchtitan's train step: ``del pred; loss.backward()``). The
#: forward lays out the logits (2 B), their fp32 copy (4 B) and the log-softmax output (4 B) one after the other;
#: freeing the copy and then the logits leaves a 6-byte hole before the saved output. In the backward the
#: allocator's best fit (``c10/cuda/CUDACachingAllocator.cpp`` ``get_free_block``: the smallest cached block that
#: fits, split) puts the 4-byte fp32 gradient nll_loss writes into that hole, and the 2 bytes left cannot take the
#: 4-byte gradient log-softmax writes next, which extends the segment: reserved peaks 2 bytes per logit above the
#: allocated one (with ``expandable_segments``, torchtitan's launch setting, as without: the free block is inside
#: the segment either way). Single-stage only: in a pipeline the schedule keeps the logits for ``step()``'s return
#: value (``output_chunks``, :func:`pipeline_buffer_bytes`), so they leave no hole.
LOGITS_HOLE_BYTES = 2
#: FSDP2 with mixed precision keeps the sharded parameters in fp32 (they are the master weights), fp32 sharded
#: gradients and Adam's two fp32 moments: 4 + 4 + 8 bytes per parameter, sharded (PyTorch ``fully_shard`` with
#: ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)``, torchtitan's default), against Megatron's
#: 2 + 4 + 12. With bf16 resident parameters (:attr:`hetplan.plan.Plan.fsdp_param_dtype`; NeMo AutoModel's default
#: ``torch_dtype="auto"`` = bf16 in ``NeMoAutoModelForCausalLM.from_config``) the sharded gradients are bf16 and
#: ``torch.optim.Adam`` creates its moments like the parameter (``torch.zeros_like``): 2 + 2 + 4 (AutoModel
#: ``docs/guides/mixed-precision-training.mdx``, "torch AdamW with bf16 model storage").
FSDP_WEIGHT_BYTES, FSDP_GRAD_BYTES, FSDP_OPTIMIZER_BYTES = 4, 4, 8
FSDP_STATE_BYTES = {"fp32": (FSDP_WEIGHT_BYTES, FSDP_GRAD_BYTES, FSDP_OPTIMIZER_BYTES), "bf16": (2, 2, 4)}


def fsdp_shard_ranks(zero: Array, group: Array, fsdp_shard: int | None):
    """Ranks FSDP (``framework = "fsdp"``) shards a parameter over, out of its data-parallel ``group`` (dp·cp for
    dense parameters, the expert-DP ranks for experts): HSDP's ``fsdp_shard`` (:attr:`hetplan.plan.Plan.fsdp_shard`),
    else the whole group; 1 at ZeRO-0, which torchtitan launches as ``data_parallel_replicate_degree = dp`` with
    ``data_parallel_shard_degree = 1`` (``hetplan export``). torchtitan 0.3.0 runs that as FSDP2 on the
    ``["dp_replicate", "fsdp"]`` mesh with a shard degree of 1 (``torchtitan/models/llama3/parallelize.py``:
    "Always run apply_fsdp_to_decoder -- with shard_degree=1 it is a no-op for the all-gather"; per-module
    replicate since pytorch/torchtitan#2458, 2026-03-09): HSDP whose shard groups are single ranks, so every rank
    holds the whole fp32 parameters, gradients and AdamW moments (:data:`FSDP_STATE_BYTES` unsharded) and each
    unit's gradient is all-reduced across the ``dp`` replicas (HSDP's replica all-reduce,
    :func:`hetplan.estimate.stage.stage_costs`). Arrays broadcast."""
    shard = group if fsdp_shard is None else np.minimum(fsdp_shard, group)
    return np.where(np.asarray(zero) == 0, 1, shard)


#: Bytes per parameter torch DDP holds under torchtitan before 2026-03 (stack field ``ddp = "reducer"``,
#: :func:`ddp_reducer_runs`): fp32 parameters under ``torch.autocast`` with their bf16 casts kept from the forward
#: to the backward GEMMs (4 + 2), the fp32 ``.grad`` and the Reducer's bucket of the same size (no
#: ``gradient_as_bucket_view``: 4 + 4), AdamW's two fp32 moments (8).
DDP_REDUCER_STATE_BYTES = (FSDP_WEIGHT_BYTES + WEIGHT_BYTES, 2 * FSDP_GRAD_BYTES, FSDP_OPTIMIZER_BYTES)


def ddp_reducer_runs(options: "TrainingOptions", zero: Array, dp: Array):
    """Whether a stage under ``options`` at ZeRO stage ``zero`` runs torch DDP's Reducer: ``framework = "fsdp"``
    at ZeRO-0 on a stack whose DDP is ``replicate()`` (stacks.toml ``ddp = "reducer"``: torchtitan before
    pytorch/torchtitan#2458, 2026-03-09, ``apply_ddp`` with ``bucket_cap_mb=100``) rather than FSDP2 over one-rank
    shards (:func:`fsdp_shard_ranks`), over ``dp`` > 1 data-parallel ranks (dp·cp; one rank has no DDP wrapper).
    Arrays broadcast."""
    on = options.framework == "fsdp" and options.stack_spec().ddp == "reducer"
    return np.asarray(on) & (np.asarray(zero) == 0) & (np.asarray(dp) > 1)


def fsdp_reshards(zero: Array, reshard_after_forward: Array):
    """Whether FSDP (``framework = "fsdp"``) frees each unit's gathered parameters after its forward:
    :attr:`hetplan.plan.Plan.reshard_after_forward`, except at ZeRO-1 / 2, which torchtitan launches as
    ``fsdp_reshard_after_forward = "never"`` (parameters gathered once per micro-batch and kept through the
    backward; gradients and optimizer states sharded: ZeRO-2; torchtitan has no ZeRO-1, ``hetplan export``).
    Arrays broadcast."""
    z = np.asarray(zero)
    return np.asarray(reshard_after_forward) & ~((z == 1) | (z == 2))


#: FSDP units whose parameters are unsharded at once at the peak: the one computing and the one prefetched
#: (FSDP2 prefetches one unit ahead in forward and backward).
FSDP_UNITS_IN_FLIGHT = 2
#: Bytes per parameter of the unsharded gradient an FSDP2 stage of a pipeline accumulates over its micro-batches,
#: by gradient-reduction dtype: PyTorch's pipeline schedules run every backward but the last with
#: ``set_requires_gradient_sync(False)`` and ``set_reshard_after_backward(False)``
#: (``torch/distributed/pipelining/stage.py``, ``backward_maybe_with_nosync``), so each unit keeps its unsharded
#: parameters and its unsharded gradient until the last micro-batch; FSDP2 upcasts that gradient to the reduce
#: dtype to accumulate it (``FSDPParam.to_accumulated_grad_if_needed``: ``unsharded_grad.to(reduce_dtype)``), fp32
#: under torchtitan's default ``mixed_precision_reduce = "float32"``, or keeps the bf16 ``.grad``.
FSDP_PIPELINE_GRAD_BYTES = {None: 4, "fp32": 4, "bf16": 2, "fp16": 2}


def pipeline_buffer_bytes(m: ModelSpec, b: Array, s_local: Array, t: Array, sequence_parallel: Array,
                          has_embedding: Array, has_head: Array, single_stage: Array,
                          in_flight: Array, num_microbatches: Array, virtual_stages: Array = 1,
                          outputs: Array = "last"):
    """Bytes a stage of PyTorch's pipeline schedules (``framework = "fsdp"``, pp > 1) holds beyond the layers'
    activations (``torch/distributed/pipelining/stage.py``); 0 on a single stage. ``num_microbatches``: those of
    one ``step()`` call.

    * **Receive buffers**: ``_prepare_forward_infra`` allocates one activation buffer per micro-batch on every
      stage that receives (all but the pipeline's first), ``_prepare_backward_infra`` one gradient buffer per
      micro-batch on every stage that sends (all but the last); both live as long as the schedule. Each is the
      stage's output, ``2·s·b·h`` bytes of this GPU's tokens (split over TP ranks with sequence parallelism, as
      torchtitan's blocks hand it on). The in-flight micro-batches' activation buffers are their first layer's
      saved input, already in the activations, so only the others count. ``virtual_stages`` local stages each
      have their own.
    * **Outputs kept for** ``step()``'s **return value**: ``forward_one_chunk`` appends every micro-batch's output
      to ``output_chunks``, freed when the next call starts (``clear_runtime_states``): on the last stage the
      16-bit logits, ``2·s·b·V/t`` per micro-batch, all of the call's by its last backward (the loss phase's own
      buffers come on top); with ``outputs = "all"`` (PyTorch before pytorch/pytorch#153383, 2025-05) every other
      stage its ``2·s·b·h`` outputs too, all of them by its last forward, while its in-flight activations are
      still held.

    ``s_local``: tokens of a sequence on this GPU (``s/cp``). Bytes; arrays broadcast."""
    b, s_local = counts.as_float(b), counts.as_float(s_local)
    m_mb, v = np.asarray(num_microbatches, dtype=float), np.asarray(virtual_stages, dtype=float)
    io = 2 * s_local * b * m.hidden_size / np.where(np.asarray(sequence_parallel), t, 1)
    receive = np.maximum((v - np.asarray(has_embedding)) * m_mb - np.asarray(in_flight) * v, 0.0)
    send = (v - np.asarray(has_head)) * m_mb
    kept = np.where(has_head, m_mb * 2 * s_local * b * m.padded_vocab_size() / t, 0.0)
    if outputs == "all":  # the other local stages' outputs too
        kept = kept + send * io
    return np.where(np.asarray(single_stage), 0.0, (receive + send) * io + kept)


#: Layers whose offloaded inputs are on the GPU at once under fine-grained activation offloading: the one being
#: back-propagated (reloaded before its backward) and the next one, prefetched (Megatron-Core's
#: ``ChunkOffloadHandler`` reloads a layer's groups on the H2D stream ahead of its backward and keeps the last
#: group on the GPU; stated assumption: two layers).
OFFLOAD_LAYERS_ON_GPU = 2
RECOMPUTE_MODULES = ("layernorm", "moe_act", "mla_up_proj")
OFFLOAD_MODULES = ("expert_fc1", "moe_act")


def module_activation_bytes(m: ModelSpec, b: Array, s_local: Array, t: Array, sequence_parallel: Array,
                            recompute_modules: Array = (),
                            offload_modules: Array = (), fp8_inputs: Array = False, moe_recompute: Array = False):
    """``(discarded, offloaded)`` bytes of one layer's saved activations, per GPU and micro-batch (the mean over
    the model's layers), under Megatron-Core's per-module options:

    * ``--recompute-modules`` (:attr:`hetplan.plan.Job.recompute_modules`), output-discarding checkpointing
      (``megatron/core/transformer/transformer_config.py``, ``recompute_modules``): ``layernorm`` drops the
      outputs of ``input_layernorm`` and ``pre_mlp_layernorm`` (the attention and MLP inputs, ``2·s·b·h`` each,
      split over TP with sequence parallelism) and recomputes them in backward; ``moe_act`` drops the expert
      activation function's output (the second expert GEMM's input, ``2·f_e`` per routed copy of a token, split
      over TP) on MoE layers; ``mla_up_proj`` (multi-latent attention only) drops the queries, keys and values
      that MLA's up-projections and RoPE build from the saved latents, ``2·(q + k + v)`` per token split over TP
      (``megatron/core/transformer/multi_latent_attention.py``: ``CheckpointWithoutOutput`` around
      ``qkv_up_proj_and_rope_apply``, its outputs discarded once the core attention has run and rebuilt before
      its backward);
    * ``--fine-grained-activation-offloading --offload-modules`` (:attr:`hetplan.plan.Job.offload_modules`;
      Megatron-LM ``docs/user-guide/features/fine_grained_activation_offloading.md``: each module's *input* goes
      to host memory after its forward and comes back before its backward): ``expert_fc1`` the routed copies
      entering the first expert GEMM (``2·h`` each), ``moe_act`` the first expert GEMM's output (``2·2·f_e``
      gated, ``2·f_e`` not).

    The tensors are those :func:`hetplan.model.counts.layer_activation_bytes` counts; with ``fp8_inputs``
    (Transformer Engine saves FP8 copies of linear inputs, :func:`hetplan.estimate.fp8.saved_activation_savings_bytes`)
    the linear inputs among them count one byte per element. ``moe_recompute`` (:attr:`hetplan.plan.Job.
    moe_recompute`: the whole MoE MLP recomputed, which stores its input only): the MoE modules (``moe_act``,
    ``expert_fc1``) have nothing left to discard or offload. ``s_local``: tokens of a sequence on this GPU.
    Bytes; arrays broadcast. Raises :class:`HetplanError` for a module this model does not know."""
    for name, given, known in (("job.recompute_modules", recompute_modules, RECOMPUTE_MODULES),
                               ("job.offload_modules", offload_modules, OFFLOAD_MODULES)):
        if set(given) - set(known):
            raise HetplanError(f"unknown module(s) {sorted(set(given) - set(known))}", field=name,
                               fix=f"use any of {list(known)}")
    if (bad_mla := mla_module_violation(recompute_modules, m)) is not None:  # rule mla-modules-need-mla
        raise bad_mla
    if moe_recompute:
        recompute_modules = [x for x in recompute_modules if x not in ("moe_act", "expert_fc1")]
        offload_modules = [x for x in offload_modules if x not in ("moe_act", "expert_fc1")]
    b, s_local = counts.as_float(b), counts.as_float(s_local)
    t = np.asarray(t, dtype=float)
    tokens, h = s_local * b, m.hidden_size
    linear_in = 1 if fp8_inputs else 2  # bytes per element of a saved linear input
    moe_share = m.num_moe_layers / m.num_layers if m.is_moe else 0.0
    routed = m.experts_per_token * tokens / t if m.is_moe else 0.0  # routed copies per GPU (TP-split, as counted)
    f_e = m.expert_ffn_hidden_size if m.is_moe else 0
    discarded = 0.0
    if "layernorm" in recompute_modules:
        discarded = discarded + 2 * linear_in * tokens * h / np.where(np.asarray(sequence_parallel), t, 1.0)
    if "moe_act" in recompute_modules:
        discarded = discarded + moe_share * routed * linear_in * f_e
    if "mla_up_proj" in recompute_modules:
        discarded = discarded + 2 * tokens * (m.q_dim + m.kv_dim + m.v_dim) / t
    offloaded = 0.0
    if "expert_fc1" in offload_modules:
        offloaded = offloaded + moe_share * routed * linear_in * h
    if "moe_act" in offload_modules:
        offloaded = offloaded + moe_share * routed * 2 * (2 if m.gated_mlp else 1) * f_e
    return discarded, offloaded


def sdpa_kv_bytes(m: ModelSpec, b: Array, s_local: Array, t: Array, expanded: Array = False):
    """Bytes of the K and V one attention call takes, per GPU (``s_local`` tokens, heads split over TP): the
    grouped ``2·s·b·(g·d_qk + g·d_v)/t``, or with ``expanded`` the query heads' ``2·s·b·(a·d_qk + a·d_v)/t``:
    torchtitan's Llama repeats the K/V heads to every query head before calling SDPA
    (``torchtitan/models/llama/model.py`` at 9dec370, ``repeat_kv``), and SDPA saves its inputs for backward.
    Bytes; arrays broadcast."""
    b, s_local = counts.as_float(b), counts.as_float(s_local)
    width = (m.q_dim + m.attn_out_dim) if expanded else (m.kv_dim + m.v_dim)
    return 2 * s_local * b * width / np.asarray(t, dtype=float)


def dtensor_gathered_input_bytes(m: ModelSpec, b: Array, s_local: Array, t: Array, sequence_parallel: Array):
    """Extra bytes one layer without checkpointing saves under PyTorch's tensor parallelism with sequence
    parallelism (``framework = "fsdp"``), against Megatron's: torchtitan's layer plan
    (``torchtitan/parallelisms/parallelize_llama.py``, ``apply_tp``) hands the sequence-sharded norm outputs to
    ``attention`` and ``feed_forward`` through ``PrepareModuleInput(Shard(1) -> Replicate())``, an all-gather
    (``torch/distributed/tensor/parallel/style.py``), and the column-parallel ``wq``/``wk``/``wv`` and ``w1``/``w3``
    matmuls save that replicated input for their weight gradients: two ``2·s·b·h`` tensors of the whole sequence
    on every TP rank, where Megatron-LM saves the ``1/t`` shards and all-gathers them again in backward
    (Korthikanti et al. 2023 Sec. 4.2.2, :func:`hetplan.model.counts.layer_activation_bytes`). Bytes; 0 without
    sequence parallelism or at t = 1."""
    b, s_local = counts.as_float(b), counts.as_float(s_local)
    t = np.asarray(t, dtype=float)
    return np.where(np.asarray(sequence_parallel), 2 * 2 * s_local * b * m.hidden_size * (1 - 1 / t), 0.0)


def op_sac_activation_bytes(m: ModelSpec, b: Array, s: Array, t: Array, sequence_parallel: Array = False,
                            attention: str = "flash", imbalance: Array = 1.0):
    """Bytes one layer (mean over the model's layers) keeps under torchtitan's per-op selective checkpointing
    (:func:`hetplan.estimate.moe.op_sac_recompute_s`): the block's input (the checkpoint's argument, ``2sbh``,
    split over TP ranks with sequence parallelism), the outputs of the odd-numbered matmuls
    (:func:`hetplan.estimate.compute.op_sac_matmuls`: ``wq``, ``wv``, ``w1``, ``w2`` of a Llama block) and of
    attention (``2sbq`` and the fp32 log-sum-exp), each split over the TP ranks. A row-parallel output (``wo``,
    ``w2``) is counted after its reduce-scatter, which is on the save list: the torchtitan rows that run SAC under
    TP use torch.compile / async TP, where the matmul and its reduce-scatter are one fused op and the full partial
    sum is never an op output (an assumption: eager TP would save the ``2sbh`` partial sum of ``w2`` too).
    MoE and MLA layers: half their matmuls' outputs (every other one, of unequal widths), none of the routed
    experts' grouped GEMM outputs (recomputed), and the outputs of the dispatch and combine all-to-alls, each
    ``2·k·sbh/t`` (``imbalance`` x on the dispatch side) of the rank's routed copies.
    ``s``: this GPU's tokens. Bytes; arrays broadcast."""
    from hetplan.estimate.compute import op_sac_matmuls

    b, s = counts.as_float(b), counts.as_float(s)
    t = np.asarray(t, dtype=float)
    h, sb = m.hidden_size, s * b
    attn = 2 * sb * m.q_dim / t + counts.FLASH_LSE_BYTES * m.num_attention_heads * sb / t
    scatter = np.where(t > 1, 2 * sb * h / t, 0.0)  # wo's reduce-scatter output (w2's is counted above)
    block_input = 2 * sb * h / np.where(np.asarray(sequence_parallel), t, 1.0)
    if not (m.is_moe or m.is_mla):
        saved = sum(2 * sb * width / t for k, (_, width) in enumerate(op_sac_matmuls(m)) if k % 2 == 0)
        return block_input + saved + attn + scatter
    attn_mm = 0.5 * sum(2 * sb * width / t for _, width in counts.attention_linears(m))
    f = m.ffn_hidden_size
    dense_mm = 0.5 * 2 * sb * ((2 if m.gated_mlp else 1) * f + h) / t
    n_moe = m.num_moe_layers
    mlp = (m.num_layers - n_moe) * dense_mm / m.num_layers
    if n_moe:
        f_s = m.shared_expert_ffn_hidden_size
        router_shared = 0.5 * 2 * sb * (m.num_experts + ((2 if m.gated_mlp else 1) * f_s + h if f_s else 0)) / t
        a2a = 2 * m.experts_per_token * sb * h / t * (np.asarray(imbalance, dtype=float) + 1.0)
        mlp = mlp + n_moe * (router_shared + a2a) / m.num_layers
    return block_input + attn_mm + mlp + attn + scatter


def stage_parameters(m: ModelSpec, num_layers: Array, has_embedding: Array, has_head: Array, single_stage: Array):
    """Parameters held by one pipeline stage (before TP/ZeRO sharding).

    With tied embeddings and more than one stage, the last stage keeps its own copy of the embedding matrix for
    the head (Megatron-LM's ``word_embeddings`` on the last stage), so it is counted on both.
    """
    p: Any = num_layers * counts.layer_parameters(m)
    p = p + np.where(has_embedding, counts.embedding_parameters(m), 0)
    head: Any = counts.head_parameters(m)
    if m.tied_embeddings:
        head = np.where(single_stage, head, head + m.vocab_size * m.hidden_size)
    return p + np.where(has_head, head, 0)


def layer_parameters_per_gpu(m: ModelSpec, t: Array, ep: Array = 1, etp: Array = 1):
    """Parameters of one layer (mean over the model's layers) on one GPU: the non-expert part split over TP, the
    routed experts over EP x expert-TP."""
    return counts.layer_parameters(m) / t - counts.layer_expert_parameters(m) * (1 / t - 1 / (np.asarray(ep) * etp))


@dataclass(frozen=True, slots=True)
class StageMemory:
    """Peak memory per GPU of one stage by component (bytes; floats or arrays): :func:`stage_memory_bytes`.
    ``transient`` is the allocated working memory included in ``overhead``; ``total`` the expected footprint
    (what ``nvidia-smi`` shows), ``required`` what the fit test compares with the GPU's memory, ``context`` the
    CUDA context in both (:func:`context_bytes`)."""

    weights: Any
    gradients: Any
    optimizer: Any
    activations: Any
    overhead: Any
    total: Any
    transient: Any
    required: Any
    context: Any


def context_bytes(released: str) -> int:
    """The CUDA context (bytes) of a stack released in month ``released`` (``YYYY-MM``): eager module loading
    before :data:`LAZY_LOADING_FROM`, lazy from then on (:data:`CUDA_CONTEXT_BYTES`)."""
    return CUDA_CONTEXT_LAZY_BYTES if released >= LAZY_LOADING_FROM else CUDA_CONTEXT_BYTES


def fit_warning(required: float, total: float, capacity: float) -> str | None:
    """The warning of a stage that fits (``required`` <= ``capacity``) but whose expected footprint ``total`` does
    not: within the estimate's error (:data:`FIT_TOLERANCE`) or the allocator's cache (:data:`ALLOCATOR_MARGIN`).
    None when the footprint fits too, or when the stage does not fit at all (a refusal, not a warning)."""
    if required > capacity or total <= capacity:
        return None
    return (f"tight: expected {total / 2**30:.1f} GiB of {capacity / 2**30:.1f} GiB, needs at least "
            f"{required / 2**30:.1f} GiB; fragmentation may run it out of memory "
            "(PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True helps)")


def bf16_optimizer_runs(options: TrainingOptions, zero: Array) -> Array:
    """Whether DeepSpeed's BF16_Optimizer holds the job's optimizer state (:attr:`hetplan.hardware.stacks.
    StackSpec.bf16_optimizer`: its stack sends bf16 runs of the pipeline engine there): ``framework =
    "deepspeed"``, bf16, ZeRO 0 or 1 (it partitions the fp32 state over DP itself, "its own zero stage 1
    equivalent" under ds_config stage 0; ZeRO-2/3 run their own optimizers). Arrays broadcast over ``zero``."""
    spec = options.stack_spec()
    on = options.framework == "deepspeed" and options.dtype == "bf16" and spec.bf16_optimizer
    return np.asarray(on) & np.isin(np.asarray(zero), spec.bf16_optimizer_zero)


def stage_memory_bytes(m: ModelSpec, degrees: Degrees, work: StageWork, options: TrainingOptions) -> StageMemory:
    """Peak memory per GPU of one stage (:class:`StageMemory`, bytes):
    ``weights``, ``gradients``, ``optimizer``, ``activations``, ``overhead``, ``total``, and ``transient`` (the
    allocated working memory included in ``overhead``; see the module doc). The degrees, the stage's work and the
    options are :class:`~hetplan.degrees.Degrees`, :class:`~hetplan.estimate.stagework.StageWork` and
    :class:`~hetplan.estimate.options.TrainingOptions`; the names below are their fields.

    ``weights + gradients + optimizer + activations`` is Megatron-LM's theoretical memory; ``states + activations
    + transient`` (the allocated peak) is what ``torch.cuda.max_memory_allocated`` reports; ``total`` adds the
    CUDA context, the stack's measured residual and the allocator's cache (the footprint ``nvidia-smi`` shows);
    ``required`` (the fit test) is the allocated peak less :data:`FIT_TOLERANCE` plus the context and residual.

    Args (fields):
        recompute: ``"none"`` | ``"selective"`` | ``"full"``, or :class:`~hetplan.estimate.stagework.Recompute`
            codes.
        in_flight: micro-batches whose activations the stage holds at its peak.
        recompute_layers: how many layers use ``recompute`` (the others keep all activations); default all.
        attention: ``"standard"`` | ``"flash"`` (:attr:`hetplan.plan.Job.attention`).
        framework: ``"megatron"`` | ``"deepspeed"`` | ``"fsdp"`` (:attr:`hetplan.plan.Job.framework`). FSDP
            (FSDP2 at every ZeRO stage, over one-rank shards at ZeRO-0: :func:`fsdp_shard_ranks`; never resharding
            after forward at ZeRO-1 / 2: :func:`fsdp_reshards`): sharded fp32 parameters, gradients and Adam moments
            (:data:`FSDP_WEIGHT_BYTES` ...) over the shard group (``fsdp_shard``, default ``dp``), plus the
            16-bit unsharded parameters of :data:`FSDP_UNITS_IN_FLIGHT` units (of all the stage's units when
            ``reshard_after_forward`` is False: they are kept from forward to backward) and, in the backward,
            one unit's unsharded 16-bit gradient and its fp32 reduce-scatter input. A stage of a pipeline
            (``single_stage`` False) holds all its units unsharded with their accumulated unsharded gradients
            (:data:`FSDP_PIPELINE_GRAD_BYTES`). The last stage's loss phase: :data:`CROSS_ENTROPY_BYTES_PER_LOGIT`
            (:data:`LOSS_PARALLEL_BYTES_PER_LOGIT` for the eager fp32 loss under TP) and the output layer's input.
        cp: context-parallel degree: each GPU holds ``s / cp`` tokens of every sequence
            (:func:`hetplan.estimate.context.layer_activation_bytes`); ZeRO shards over ``dp·cp``.
        ep: expert-parallel degree: routed experts split over ``ep`` (expert-TP 1), ZeRO shards them over the
            expert data-parallel ranks (:attr:`hetplan.degrees.Degrees.expert_dp`).
        etp: expert-TP degree: each expert's matrices split over ``etp`` more ranks (experts over ``ep·etp``).
        moe_recompute: MoE layers recompute their MLP (``--recompute-modules moe``) and store only its input;
            ignored where the stage recomputes in full (Megatron-Core checkpoints the MoE layer only under
            selective granularity).
        grad_reduce_dtype: ``"bf16"`` / ``"fp16"``: Megatron's gradient buffer holds 16-bit gradients and the
            optimizer an fp32 copy of its shard (module doc); None / ``"fp32"``: the fp32 buffer. FSDP keeps its
            own sharded fp32 gradients either way.
        fp8_recipe: None, or the FP8 scaling recipe of an FP8 job (:func:`hetplan.estimate.fp8.recipe`): the FP8
            weights' extra bytes (in ``weights``; :func:`hetplan.estimate.fp8.weight_copy_bytes`), the linear inputs
            Transformer Engine saves in FP8 (in ``activations``); under torchao (``fsdp``) the unsharded units
            gathered in FP8 (:mod:`hetplan.estimate.fp8`).
        fsdp_param_dtype: FSDP's resident parameter dtype, ``"fp32"`` | ``"bf16"`` (:data:`FSDP_STATE_BYTES`).
        cross_entropy: FSDP's loss, ``"fp32"`` | ``"bf16"`` | ``"compiled"`` (:data:`CROSS_ENTROPY_BYTES_PER_LOGIT`;
            None: ``compiled`` under ``torch_compile``, else ``fp32``).
        num_microbatches (``step_microbatches`` where set), virtual_stages: micro-batches per iteration and local stages of an interleaved schedule;
            under ``fsdp`` with pp > 1 they size PyTorch's pipeline buffers (:func:`pipeline_buffer_bytes`, in
            ``activations``; ``pipeline_outputs``: which stages keep their outputs); None: no such buffers. Under ``fsdp`` a layer without checkpointing (and the layer
            recomputed under full checkpointing) also holds :func:`dtensor_gathered_input_bytes`.
        recompute_modules, offload_modules: Megatron-Core's per-module recomputation and activation offloading
            (:func:`module_activation_bytes`): their bytes leave every layer that is not recomputed whole; the
            offloaded ones of :data:`OFFLOAD_LAYERS_ON_GPU` layers stay on the GPU.
        cp_kv_exchange: ``"allgather"``: the layer being back-propagated also holds the all-gathered K/V of the
            ``cp`` ranks (:func:`sdpa_kv_bytes`, widened to the query heads under ``fsdp``); ``"ring"``: one
            block in flight, not counted.
    Raises:
        HetplanError: unknown ``attention`` or ``framework``.
    """
    attention, framework = options.attention, options.framework
    num_layers, has_embedding, has_head = work.num_layers, work.has_embedding, work.has_head
    single_stage, b, s, in_flight = work.single_stage, work.b, work.s, work.in_flight
    zero, recompute, recompute_layers, fp8_recipe = work.zero, work.recompute, work.recompute_layers, work.fp8_recipe
    num_microbatches = work.num_microbatches if work.step_microbatches is None else work.step_microbatches
    t, dp, cp, ep, etp = degrees.tp, degrees.dp, degrees.cp, degrees.ep, degrees.expert_tp
    virtual_stages = degrees.virtual_stages
    fsdp_shard, reshard_after_forward = options.fsdp_shard, options.reshard_after_forward
    moe_recompute, grad_reduce_dtype = options.moe_recompute, options.grad_reduce_dtype
    fsdp_param_dtype, pipeline_outputs = options.fsdp_param_dtype, options.pipeline_outputs
    cross_entropy = options.cross_entropy or ("compiled" if options.torch_compile else "fp32")
    recompute_modules, offload_modules = options.recompute_modules, options.offload_modules
    cp_kv_exchange = options.cp_kv_exchange
    counts.check_attention(attention)
    s, b = counts.as_float(s), counts.as_float(b)
    if framework not in FRAMEWORKS:
        raise HetplanError(f"unknown framework {framework!r}", field="job.framework",
                           fix="use 'megatron', 'deepspeed' or 'fsdp'")
    # sequence parallelism where the stack has it (hetplan.hardware.stacks)
    spec = options.stack_spec()
    sequence_parallel = np.asarray(work.sequence_parallel) & spec.sequence_parallel
    dense, expert = moe.parameters_per_gpu(stage_parameters(m, num_layers, has_embedding, has_head, single_stage),
                                           moe.expert_parameters(m, num_layers), t, ep, etp)
    layer_params = layer_parameters_per_gpu(m, t, ep, etp)
    dp_all, edp = np.asarray(degrees.dense_dp), degrees.expert_dp

    def split(per_parameter: Array, dense_shard: Array, expert_shard: Array) -> Array:
        """Bytes: the dense parameters over dp·cp, the experts over expert-DP."""
        return dense * per_parameter / dense_shard + expert * per_parameter / expert_shard

    # gathered units at once: the computing and the prefetched one, no more than the stage has
    in_flight_units = np.minimum(num_layers, FSDP_UNITS_IN_FLIGHT)
    if framework == "fsdp":
        shard, eshard = fsdp_shard_ranks(zero, dp_all, fsdp_shard), fsdp_shard_ranks(zero, edp, fsdp_shard)
        units = np.where(fsdp_reshards(zero, reshard_after_forward), in_flight_units, num_layers)
        gathered = WEIGHT_BYTES if fp8_recipe is None else fp8.gathered_weight_bytes(
            fp8.FP8, framework, spec.optimizer_memory == "fsdp1", fp8_recipe)
        # In a pipeline (more than one stage) every unit of the stage stays unsharded from its first micro-batch
        # to its last, with its accumulated unsharded gradient (FSDP_PIPELINE_GRAD_BYTES); the embedding and
        # head are the root unit's, gathered in 16 bits (float8 converts linear layers only).
        pipelined = ~np.asarray(single_stage)
        units = np.where(pipelined, num_layers, units)
        outer = np.where(pipelined, dense + expert - np.asarray(num_layers) * layer_params, 0.0)
        w_bytes, g_bytes, o_bytes = FSDP_STATE_BYTES[fsdp_param_dtype]
        weights = split(w_bytes, shard, eshard) + units * layer_params * gathered + outer * WEIGHT_BYTES
        # one unit's unsharded 16-bit gradient and its fp32 copy for the reduce-scatter (backward only); in a
        # pipeline the sharded gradients appear only after the last micro-batch's backward, as each unit's
        # accumulated gradient is reduce-scattered and freed, so the accumulated ones stand for both
        sharded_grads = np.where(pipelined, (dense + expert) * FSDP_PIPELINE_GRAD_BYTES[grad_reduce_dtype],
                                 split(g_bytes, shard, eshard))
        grads = sharded_grads + layer_params * (WEIGHT_BYTES + 4)
        optim = split(o_bytes, shard, eshard)
        reducer = ddp_reducer_runs(options, zero, dp_all)  # torch DDP (DDP_REDUCER_STATE_BYTES), no FSDP units
        if np.any(reducer):
            rw, rg, ro = DDP_REDUCER_STATE_BYTES
            weights = np.where(reducer, split(rw, 1, 1), weights)
            grads = np.where(reducer, split(rg, 1, 1), grads)
            optim = np.where(reducer, split(ro, 1, 1), optim)
    else:
        zero = np.asarray(zero)

        def level(k: Array, n: Array):
            return np.where(zero >= k, n, 1)

        grad16 = framework == "megatron" and grad_reduce_dtype in ("bf16", "fp16")
        weights = split(WEIGHT_BYTES, level(3, dp_all), level(3, edp))
        weights = weights + np.where(zero >= 3, in_flight_units * layer_params * WEIGHT_BYTES, 0)
        if fp8_recipe is not None:  # the FP8 weights' extra bytes (of the gathered layers under ZeRO-3)
            weights = weights + fp8.weight_copy_bytes(np.where(zero >= 3, in_flight_units, num_layers) * layer_params,
                                                      fp8_recipe, framework)
        # DeepSpeed ZeRO-1/2 (deepspeed/runtime/zero/stage_1_and_2.py): the 16-bit .grad (partitioned as it is
        # reduced under ZeRO-2) and fp32 master weights only for the owned partition
        # (single_partition_of_fp32_groups, in OPTIMIZER_BYTES); no fp32 gradient buffer of the whole model.
        ds_zero = (framework == "deepspeed") & (zero >= 1)
        bf16_opt = bf16_optimizer_runs(options, zero)
        grads = split(np.where(ds_zero | grad16, GRAD16_BYTES, GRAD_BYTES), level(2, dp_all), level(2, edp))
        # Megatron-FSDP (ZeRO-2/3): one unit's 16-bit gradient and two units' unsharded main-gradient buckets
        megatron_fsdp = (framework == "megatron") & (zero >= 2)
        grads = grads + np.where(megatron_fsdp, layer_params * (GRAD16_BYTES + np.minimum(
            num_layers, MEGATRON_FSDP_MAIN_GRAD_UNITS) * np.where(grad16, GRAD16_BYTES, GRAD_BYTES)), 0.0)
        # BF16_Optimizer: the 16-bit .grad of the last micro-batch plus the whole fp32 accumulation buffer
        grads = np.where(bf16_opt, split(GRAD16_BYTES + BF16_OPTIMIZER_GRAD_BYTES, 1, 1), grads)
        optim = split(OPTIMIZER_BYTES, np.where(bf16_opt, dp_all, level(1, dp_all)),
                      np.where(bf16_opt, edp, level(1, edp)))

    rc = np.asarray({"none": 0, "selective": 1, "full": 2}[recompute] if isinstance(recompute, str) else recompute)
    sp = np.asarray(sequence_parallel)

    s_all = s  # the whole sequence (``s`` becomes this GPU's share below)

    def act(mode: str, kind: str = attention):
        moe_recompute_here = np.asarray(moe_recompute) & (rc != 2)
        out = np.where(
            sp,
            context.layer_activation_bytes(m, b, s_all, t, cp, sequence_parallel=True, recompute=mode, attention=kind,
                                           moe_recompute=moe_recompute_here, expert_tp=etp),
            context.layer_activation_bytes(m, b, s_all, t, cp, sequence_parallel=False, recompute=mode, attention=kind,
                                           moe_recompute=moe_recompute_here, expert_tp=etp),
        )
        return out

    selective = act("selective")
    if framework == "fsdp":  # PyTorch's selective checkpointing is torchtitan's per-op SAC
        selective = op_sac_activation_bytes(m, b, context.local_seq_len(s_all, cp), t, sp, attention,
                                            options.moe_load_imbalance)
    # FP8 under Transformer Engine: linear inputs saved in FP8 (full recomputation saves only the bf16 layer input)
    saved = 0.0 if fp8_recipe is None else fp8.saved_activation_savings_bytes(m, b, context.local_seq_len(s, cp), t,
                                                                               sp, framework)
    # a layer without checkpointing (or recomputed) saves, under PyTorch's TP, its all-gathered inputs whole
    s_loc = context.local_seq_len(s_all, cp)
    full = act("none")
    if framework == "fsdp":  # PyTorch's TP saves whole inputs; torchtitan's SDPA gets K/V widened to the query heads
        full = full + dtensor_gathered_input_bytes(m, b, s_loc, t, sp)
        if not m.is_mla:
            full = full + sdpa_kv_bytes(m, b, s_loc, t, expanded=True) - sdpa_kv_bytes(m, b, s_loc, t)
    # Megatron-Core's per-module recomputation and offloading, in layers that are not recomputed whole (the MoE
    # modules not where the whole MoE MLP is recomputed: module_activation_bytes)
    discarded, offloaded = module_activation_bytes(
        m, b, context.local_seq_len(s_all, cp), t, sp, recompute_modules, offload_modules,
        fp8_recipe is not None and framework != "fsdp", moe_recompute)
    kept = full - saved - discarded - offloaded  # a layer without full recomputation
    per_layer = np.where(rc == 2, act("full"), np.where(rc == 1, selective - saved - discarded - offloaded, kept))
    if recompute_layers is None:
        activations = in_flight * num_layers * per_layer
        recomputed = np.where(rc == 2, full, 0.0)  # the layer being recomputed
        stored = np.where(rc == 2, 0, num_layers)  # layers with per-module options in effect
    else:  # r layers recomputed, the rest keep all their activations
        r = np.minimum(recompute_layers, num_layers)
        activations = in_flight * (r * per_layer + (num_layers - r) * kept)
        recomputed = np.where((rc == 2) & (r > 0), full, 0.0)
        stored = np.where(rc == 2, num_layers - r, num_layers)
    # offloaded inputs back on the GPU around the layer being back-propagated (OFFLOAD_LAYERS_ON_GPU)
    activations = activations + recomputed + np.minimum(stored, OFFLOAD_LAYERS_ON_GPU) * offloaded
    s = context.local_seq_len(s, cp) if np.any(np.asarray(cp) != 1) else s  # tokens on this GPU
    sbh = s * b * m.hidden_size
    emb = in_flight * (8 * s * b + sbh) / np.where(sp, t, 1)  # sequence-parallel: split like the layers
    activations = activations + np.where(has_embedding, emb, 0)
    # The output layer's theoretical term (Korthikanti et al. 2023, Sec. 4.1: its input and the logits with their
    # fp32 softmax, ``4sb(h + V)/t``), Megatron-LM's and DeepSpeed's loss. torchtitan's loss (framework fsdp) has
    # its own peak, the ``loss`` phase below, and keeps nothing of it in the activations: counting the term there
    # too put it in the activations and took it back in a negative overhead (the total was right, the breakdown
    # printed activations above the total).
    head = np.where(np.asarray(has_head) & (framework != "fsdp"),
                    4 * s * b * (m.hidden_size + m.padded_vocab_size()) / t, 0)
    activations = activations + head
    if framework == "fsdp" and num_microbatches is not None:
        activations = activations + pipeline_buffer_bytes(m, b, s, t, sp, has_embedding, has_head, single_stage,
                                                          in_flight, num_microbatches, virtual_stages,
                                                          pipeline_outputs)
    states = weights + grads + optim
    tensors = states + activations
    # Transient working memory (allocated, not in the theoretical formulas): max over the two phases.
    logits = np.where(has_head, LOGITS_COPY_BYTES * s * b * m.padded_vocab_size() / t, 0.0)
    # Backward working set: activation gradients of one layer, without its s x s part (as FlashAttention stores
    # it), plus with standard attention the gradient of the s x s softmax output (one 2-byte tensor; the fused
    # softmax backward of Megatron-LM writes the input gradient in place).
    scores_grad = 0.0 if attention == "flash" else 2 * m.num_attention_heads * s * s_all * b / t
    backward = BACKWARD_WORKING_SET * act("none", "flash") + scores_grad
    if cp_kv_exchange == "allgather":
        # all-gather CP: the layer's attention (in backward, and in its recomputation) holds the K/V of all cp
        # ranks at once (PyTorch's context_parallel, ``_AllGatherRotater``: one all-gather, its buffer kept for
        # the whole ring; Llama 3 Sec. 3.3.2)
        kv_all = sdpa_kv_bytes(m, b, s_loc, t, expanded=framework == "fsdp" and not m.is_mla)
        backward = backward + np.where(np.asarray(cp) > 1, np.asarray(cp, dtype=float) * kv_all, 0.0)
    if framework == "deepspeed":
        # DeepSpeed's pipeline engine keeps the last stage's 16-bit logits (its output buffer) through the
        # backward pass: the sum, as measured on the traces; plus the 16-bit grads; or the optimizer step.
        # ZeRO-1/2: the 16-bit grads are ``grads`` already, and the step makes one fp32 copy of the owned
        # gradient partition (stage_1_and_2.py ``single_grad_partition``): 4 B per owned parameter.
        # BF16_Optimizer: its gradients are ``grads`` already and its step works on views of them (no copy).
        bf16_opt = bf16_optimizer_runs(options, zero)
        zero_12 = (np.asarray(zero) >= 1) | bf16_opt
        grad16_bytes = np.where(zero_12, 0.0, DEEPSPEED_GRAD_BYTES * grads / GRAD_BYTES)
        train = backward + logits + grad16_bytes
        step_bytes = np.where(bf16_opt, 0.0, np.where(zero_12, MAIN_GRAD_COPY_BYTES, DEEPSPEED_STEP_BYTES))
        step = grad16_bytes + step_bytes * optim / OPTIMIZER_BYTES - activations  # activations freed
        transient = np.maximum(train, step)
    else:
        # Megatron-LM's last stage outputs the loss: the logits and the cross-entropy's saved fp32 softmax (the
        # theoretical output-layer term, ``head``) exist only around the loss and are freed by its backward,
        # before any layer's backward (and, with full recomputation, before a layer is recomputed). So the
        # peak is the larger of the loss phase (``head`` + 16-bit logits) and the layer-backward phase
        # (recomputed layer + working set), not their sum; transient is the excess over the theoretical
        # components, negative where they add buffers that never coexist.
        loss = head + logits
        if framework == "fsdp":
            per_logit = np.where((np.asarray(t) > 1) & (cross_entropy == "fp32"), LOSS_PARALLEL_BYTES_PER_LOGIT,
                                 CROSS_ENTROPY_BYTES_PER_LOGIT[cross_entropy])
            per_logit = per_logit + np.where(np.asarray(single_stage) & (cross_entropy == "fp32"), LOGITS_HOLE_BYTES, 0)
            # plus the output layer's saved input, the whole sequence on every TP rank (torchtitan's ``output`` is
            # ``ColwiseParallel(input_layouts=Shard(1))``: it all-gathers the sequence-parallel norm output). A
            # chunked loss (StackSpec.loss_chunks: torchtitan's ChunkedLossWrapper) holds one chunk's logits at a
            # time, and the float32 accumulator of the hidden states' gradient (GradAccumulator) the whole time.
            chunks = spec.loss_chunks
            accumulator = 4 * sbh if chunks > 1 else 0.0
            loss = (per_logit * s * b * m.padded_vocab_size() / t / chunks + 2 * sbh + accumulator) * np.asarray(
                has_head)
        transient = np.maximum(loss, recomputed + backward) - head - recomputed
        if framework == "megatron" and grad_reduce_dtype in ("bf16", "fp16"):
            # optimizer step: the fp32 copy of the owned 16-bit gradient shard, while the activations are freed
            step = MAIN_GRAD_COPY_BYTES * optim / OPTIMIZER_BYTES - activations
            transient = np.maximum(transient, step)
    allocated = tensors + transient
    ctx = context_bytes(spec.released)
    # outside the allocator: the CUDA context and what the stack's own runs measured above the footprint
    outside = ctx + spec.memory_residual_gib * 2**30
    overhead = outside + transient + ALLOCATOR_MARGIN * allocated
    required = (1 - FIT_TOLERANCE) * allocated + outside
    return StageMemory(weights=weights, gradients=grads, optimizer=optim, activations=activations,
                       overhead=overhead, total=tensors + overhead, transient=transient, required=required,
                       context=np.broadcast_to(float(ctx), np.shape(required)) if np.ndim(required) else float(ctx))
