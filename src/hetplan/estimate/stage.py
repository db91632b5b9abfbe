"""Costs of one pipeline stage: per-micro-batch forward/backward time, data-parallel and optimizer time, memory.

This is the one place where compute, communication and memory formulas are put together per stage. The plan
estimator calls it once per stage with scalars; the search calls it with arrays of thousands of configurations
at once (every argument but ``m``, ``gpu``, ``pool`` and ``dtype`` may be an array).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from hetplan.estimate import compute, context, elementwise, fp8, memory, moe, variability
from hetplan.degrees import Degrees
from hetplan.estimate.comm import dp_collective_time_s, group_collective_time_s, overlap_contention
from hetplan.estimate.options import TrainingOptions
from hetplan.estimate.stagework import LayerTerms, Link, Recompute, StageHardware, StageWork
from hetplan.hardware.catalog import GPUSpec
from hetplan.hardware.stacks import StackSpec
from hetplan.model import counts
from hetplan.model.spec import ModelSpec
from hetplan.estimate.arrays import Array


@dataclass(frozen=True, slots=True)
class StageCost:
    """Costs of one pipeline stage (:func:`stage_costs`): each field a float or an array over configurations.

    Attributes:
        forward_s, backward_s: one micro-batch through the stage (backward includes recomputation and TP
            collectives); tp_comm_s: the TP-collective part of both.
        dp_s: data-parallel gradient/parameter collectives per iteration; dp_exposed_s: the part not hidden.
        optimizer_s: the Adam step.
        memory: :func:`hetplan.estimate.memory.stage_memory_bytes` (bytes per GPU by component).
        params_per_gpu: parameters held per GPU before ZeRO sharding.
        alltoall_s: the MoE all-to-all (dispatch + combine) of one micro-batch through the stage that the
            forward and backward times include: exposed (after the 1F1B overlap where on), and again where the MoE
            layer is recomputed; a part of ``tp_comm_s`` (0 for a dense model).
    """

    forward_s: Any
    backward_s: Any
    tp_comm_s: Any
    dp_s: Any
    dp_exposed_s: Any
    optimizer_s: Any
    memory: memory.StageMemory
    params_per_gpu: Any
    alltoall_s: Any = 0.0


#: Gradient bucket of the overlapped data-parallel reduction (elements): Megatron-LM's DDP default
#: ``bucket_size = max(40e6, 1e6 * dp)`` parameters; the last bucket's reduction cannot hide behind backward.
BUCKET_PARAMETERS = 40e6


def grad_comm_bytes_per_parameter(dtype: str) -> int:
    """Bytes per gradient element in the data-parallel reduction: Megatron-LM reduces fp16 gradients in fp16
    (``accumulate_allreduce_grads_in_fp32`` off by default) and bf16 gradients in fp32 (forced on)."""
    return 2 if dtype == "fp16" else 4


def stage_costs(
    m: ModelSpec,
    hardware: StageHardware,
    degrees: Degrees,
    work: StageWork,
    options: TrainingOptions,
    measured_layer_time_s: tuple[float, float] | None = None,
) -> StageCost:
    """Costs of one stage (see module doc). Returns a :class:`StageCost` of arrays:

    * ``forward_s``, ``backward_s``: one micro-batch through the stage (backward includes recomputation and TP
      collectives); ``tp_comm_s`` the TP-collective part of both;
    * ``dp_s``: data-parallel gradient/parameter collectives per iteration; ``dp_exposed_s`` the part not hidden:
      without overlap all of it; with ``overlap_grad_reduce`` (bucketed, Megatron-LM/PyTorch DDP) what exceeds
      the backward pass of the last micro-batch, and at least the last bucket's reduction. ZeRO-3 (FSDP):
      :func:`zero3_exposed_s` (all-gathers and reduce-scatter every micro-batch, overlapped per pass; under
      ``framework = "fsdp"`` in a pipeline once per iteration: the first micro-batch's gathers and the
      reduce-scatter after the last backward, exposed). With tied
      embeddings and more than one stage, the first and last stages also all-reduce the embedding gradient
      between them (Megatron-LM ``_allreduce_embedding_grads``), exposed;
    * ``optimizer_s``: the Adam step;
    * ``memory``: the dict of :func:`hetplan.estimate.memory.stage_memory_bytes`;
    * ``params_per_gpu``: parameters held per GPU before ZeRO sharding.

    ``measured_layer_time_s``: optional measured ``(forward_s, backward_s)`` of one layer for this micro-batch
    and TP degree (TP communication included, no recomputation), e.g. from the profile database; it replaces
    the analytic layer time, recomputation still adds the analytic share of it.

    ``recompute_modules``, ``offload_modules``: Megatron-Core's per-module recomputation and activation offloading
    (:attr:`hetplan.plan.Job.recompute_modules`, :func:`hetplan.estimate.memory.module_activation_bytes`): the
    element-wise work again in backward, the host-link copies where they outlast the layer's compute.

    ``in_flight`` may be fractional (interleaved 1F1B holds chunks of 1/v of the stage). ``step_microbatches``:
    micro-batches per call of the pipeline schedule (:attr:`hetplan.plan.Plan.pipeline_step_microbatches`; None:
    ``num_microbatches``), which sizes PyTorch's pipeline buffers in the memory; ``pipeline_outputs``: which
    stages keep their outputs (:attr:`hetplan.plan.Plan.pipeline_outputs`).

    ``options.mtp_layers``: multi-token prediction on the stage that holds the head (:attr:`hetplan.plan.Job.mtp_layers`):
    per module one more layer (compute, communication, memory, gradients), in a pipeline the word-embedding copy
    and its lookup, the projection ``2h -> h`` (backward twice) and one more pass of the output head and loss.

    ``recompute_layers``: optional number of the stage's layers that use ``recompute`` (per-layer
    recomputation, Aceso EuroSys'24 Sec. 4.2); the other layers recompute nothing. Default (None): all layers.

    ``attention`` (``"standard"`` | ``"flash"``) and ``framework`` (``"megatron"`` | ``"deepspeed"`` |
    ``"fsdp"``): the job's :attr:`hetplan.plan.Job.attention` and :attr:`hetplan.plan.Job.framework` (scalars).
    ``framework="fsdp"`` (PyTorch FSDP2) shards parameters, gradients and optimizer states per unit at every ZeRO
    stage as torchtitan launches it: over HSDP's ``fsdp_shard`` or all DP ranks at ZeRO-1 to 3 (never resharding
    after forward at 1 / 2), over single ranks at ZeRO-0 (DDP: the whole states on every rank, each unit's
    gradient all-reduced across the replicas) (:func:`hetplan.estimate.memory.fsdp_shard_ranks`,
    :func:`hetplan.estimate.memory.fsdp_reshards`).

    ``fsdp_shard``: HSDP's shard-group size (parameters sharded within groups of that many DP ranks, replicated
    across ``dp / fsdp_shard`` of them; gradients all-reduced across the replicas after each reduce-scatter);
    None = the whole DP group (FSDP). ``reshard_after_forward``: FSDP frees each unit's gathered parameters after
    its forward and gathers them again for its backward (True, FSDP2's default), or keeps them (False: one gather
    per micro-batch, the unsharded parameters held through the backward). ``grad_reduce_dtype``: ``"fp32"`` or
    ``"bf16"``/``"fp16"`` for the gradient reduction (None: :func:`grad_comm_bytes_per_parameter`).
    ``fsdp_param_dtype``, ``cross_entropy``: FSDP's resident parameter dtype and loss
    (:attr:`hetplan.plan.Plan.fsdp_param_dtype`, :attr:`hetplan.plan.Plan.cross_entropy`, None: compiled with
    ``torch_compile``; memory); under ``fsdp`` an ``fp32`` loss costs the eager cross-entropy's bytes
    (:data:`hetplan.estimate.compute.CROSS_ENTROPY` ``eager_fp32``); for Megatron, ``cross_entropy = "fp32"`` is its
    unfused loss, which costs time (:func:`hetplan.estimate.compute.head_time_s`).

    ``cp``: context-parallel degree (:mod:`hetplan.estimate.context`): layers work on ``s/cp`` tokens, attention
    on ``cp`` blocks (``2·cp - 1`` on the busiest rank without ``cp_load_balance``), plus the exposed K/V exchange
    (``kv_exchange``: ``"ring"`` | ``"allgather"``); gradients
    reduced over ``dp·cp``. ``ep``, ``etp``: expert-parallel and expert-TP degrees (:mod:`hetplan.estimate.moe`):
    MoE and MLA GEMMs, the dispatch/combine all-to-all of the busiest rank (``moe_load_imbalance``), experts
    sharded over ``ep·etp`` and reduced over the expert data-parallel ranks; ``moe_options``: the all-to-all's dispatcher and
    routing, and MoE-layer recomputation (:class:`hetplan.estimate.moe.MoEOptions`: one more forward of the MoE
    MLPs and their all-to-alls in backward, on layers that do not recompute in full).

    ``virtual_stages``: v of interleaved 1F1B; each of the ``v - 1`` extra model chunks adds one p2p call per
    direction and micro-batch to a pipeline stage (:func:`pipeline_call_s`). ``tp_comm_overlap``: Megatron-Core's
    ``--tp-comm-overlap`` on dense layers (:func:`hetplan.estimate.compute.layer_time_s`). ``cuda_graphs``: the
    layers are replayed as CUDA graphs, without the per-kernel host floor (same function). ``torch_compile``
    (``framework = "fsdp"`` only): the blocks and the loss run under ``torch.compile`` (fused element-wise kernels,
    as the element-wise term assumes), or eagerly (False): the extra bytes and kernels of eager PyTorch's
    element-wise ops and float8 casts (:mod:`hetplan.estimate.elementwise`) and, unless ``cross_entropy`` says
    otherwise, the fp32 loss. Under ``fsdp`` TP is
    PyTorch's DTensor TP (torchtitan): its sequence-dim copies (``sequence_dim_copies`` of
    :func:`hetplan.estimate.compute.layer_time_s`) are charged around each sequence-parallel collective the layer
    runs. A MoE layer's MLP side runs them only where :func:`hetplan.estimate.moe.mlp_tp_collective_share` says
    (shared experts; experts split like a dense MLP: torchtitan at EP 1). ``async_tp`` (:attr:`hetplan.plan.Job.async_tp`, dense models):
    PyTorch's async TP in place of those copies and the exposed collectives (same function).

    ``hardware``: the GPU and its links (:class:`~hetplan.estimate.stagework.StageHardware`); ``degrees``: the
    stage's parallel degrees (:class:`~hetplan.degrees.Degrees`: ``t`` below is its ``tp``, ``etp`` its
    ``expert_tp``, as the framework launches it: :func:`hetplan.estimate.moe.launched_degrees`); ``work``: what the
    stage computes (:class:`~hetplan.estimate.stagework.StageWork`); ``options``: every job and plan option that
    changes the cost (:class:`~hetplan.estimate.options.TrainingOptions`). The names below are their fields.

    Units: seconds, bytes.
    """
    dtype, attention, framework = options.dtype, options.attention, options.framework
    degrees = moe.launched_degrees(degrees, framework)
    overlap_grad_reduce, fsdp_shard = options.overlap_grad_reduce, options.fsdp_shard
    reshard_after_forward, grad_reduce_dtype = options.reshard_after_forward, options.grad_reduce_dtype
    fsdp_param_dtype, cross_entropy = options.fsdp_param_dtype, options.cross_entropy
    moe_load_imbalance, moe_options = options.moe_load_imbalance, options.moe
    kv_exchange, cp_load_balance = options.cp_kv_exchange, options.cp_load_balance
    recompute_modules, offload_modules = options.recompute_modules, options.offload_modules
    pipeline_outputs, tp_comm_overlap = options.pipeline_outputs, options.tp_comm_overlap
    cuda_graphs, torch_compile, async_tp = options.cuda_graphs, options.torch_compile, options.async_tp
    gpu, link = hardware.gpu, hardware.link
    mtp: Any = 0
    if options.mtp_layers:  # multi-token prediction on the last stage: one more layer per module (Job.mtp_layers)
        mtp = np.where(np.asarray(work.has_head, dtype=bool), options.mtp_layers, 0)
        # ... and, in a pipeline, the embedding of the shifted tokens (Megatron-Core's GPTModel builds one on the
        # MTP stage, kept in sync like tied embeddings; a tied head's copy serves it already)
        embedding = np.asarray(work.has_embedding, dtype=bool) | ((mtp > 0) & (not m.tied_embeddings))
        work = replace(work, num_layers=work.num_layers + mtp, has_embedding=embedding)
    t, dp, cp, ep, etp = degrees.tp, degrees.dp, degrees.cp, degrees.ep, degrees.expert_tp
    virtual_stages = degrees.virtual_stages
    s, b, num_layers, has_embedding = work.s, work.b, work.num_layers, work.has_embedding
    has_head, single_stage, num_microbatches = work.has_head, work.single_stage, work.num_microbatches
    zero, recompute_code, recompute_layers = work.zero, work.recompute, work.recompute_layers
    rc = np.asarray(recompute_code)
    # what the stack can do: sequence parallelism, and reducing DP gradients during backward (hetplan.hardware.stacks)
    stack = options.stack_spec()
    sequence_parallel = np.asarray(work.sequence_parallel) & stack.sequence_parallel
    overlap_grad_reduce = overlap_grad_reduce & stack_overlaps_grad_reduce(stack, single_stage, zero)
    s, b = counts.as_float(s), counts.as_float(b)  # token and byte counts in float64 (int64 overflows)
    fp8_recipe = stage_fp8_recipe(gpu, options)
    terms = LayerTerms(link.tp_link(), sequence_parallel=sequence_parallel, attention=attention,
                       tp_comm_overlap=tp_comm_overlap and not m.is_moe, cuda_graphs=cuda_graphs,
                       op_sac=framework == "fsdp", sequence_dim_copies=framework == "fsdp",
                       mlp_tp_collectives=moe.mlp_tp_collective_share(m, ep, framework),
                       async_tp=async_tp and not m.is_moe, fp8_gathers=fp8.fp8_gathers(fp8_recipe, framework),
                       projections=stack.projections, fused_softmax=stack.fused_softmax,
                       eager_grad_sum=not (framework == "fsdp" and torch_compile))  # only fsdp stacks compile
    s_all, parallel_layer = s, m.is_moe or m.is_mla or np.any(np.asarray(cp) != 1)
    fp8_padding = moe.fp8_pads_experts(dtype, framework, moe_options.dispatcher)
    if parallel_layer:  # a rank's s/cp tokens; attention over cp blocks; MoE/MLA GEMMs
        s = context.local_seq_len(s_all, cp)
        if m.is_moe and moe_options.routing == "random":  # the multinomial spread of random top-k routing
            moe_load_imbalance = np.maximum(moe_load_imbalance, moe.routing_imbalance(m, b * s / t, ep))
        if m.is_moe:  # no rank takes more than routing can send it; token dropping caps (padding fixes) the rows
            moe_load_imbalance = moe.bounded_imbalance(m, moe_load_imbalance, ep)
            moe_load_imbalance = moe.capacity_imbalance(moe_load_imbalance, options.moe_capacity_factor,
                                                        options.moe_pad_to_capacity)
        linear, core = (moe.layer_gemm_times_s(m, gpu, dtype, b, s, t, ep, etp, moe_load_imbalance, framework,
                                               stack.projections)
                        if m.is_moe or m.is_mla else compute.layer_gemm_times_s(m, gpu, dtype, b, s, t,
                                                                                stack.projections))
        terms = replace(terms, gemm_times_s=(linear, core),
                        attention_blocks=context.attention_blocks(cp, cp_load_balance),
                        extra_kernels=moe.extra_kernels(m, ep, framework, moe_options.dispatcher),
                        extra_gpu_s=moe.permute_time_s(m, gpu, b, s, t, ep, etp, moe_load_imbalance, fp8_padding)
                        + moe.expert_bias_time_s(m, gpu, b, s, t, ep, etp, moe_load_imbalance, framework,
                                                 moe_options.dispatcher))
    eager = framework == "fsdp" and not torch_compile
    loss_kind = cross_entropy or ("compiled" if torch_compile else "fp32")
    eager_bytes = elementwise.eager_layer_bytes(m, b, s, t, sequence_parallel) if eager else 0.0
    if eager:  # eager PyTorch: unfused element-wise ops (and float8 casts) beyond the fused kernels
        casts = len(moe.linear_gemm_shapes(m, b, s, t, ep, moe_load_imbalance, etp)) if fp8.is_fp8(dtype) else 0
        terms = replace(terms, extra_elementwise_bytes=eager_bytes, extra_kernels=terms.extra_kernels
                        + elementwise.eager_layer_kernels(m) + casts * elementwise.EAGER_CAST_KERNELS)
    lf, lb, ltp = compute.layer_time_s(m, gpu, dtype, b, s, t, recompute_code, terms)
    af: Any = None
    ab: Any = None
    atp: Any = None
    if measured_layer_time_s is not None or recompute_layers is not None:
        af, ab, atp = compute.layer_time_s(m, gpu, dtype, b, s, t, 0, terms)
    layer_a2a: Any = 0.0  # the all-to-all the layer's forward + backward include (StageCost.alltoall_s)
    if parallel_layer:  # all-to-all and K/V exchange (communication, like the TP collectives)
        # experts split like a dense MLP take the tokens the MLP side's all-gather brings (compute.layer_time_s)
        routed_etp = np.where(moe.experts_split_like_mlp(framework, ep), 1, etp)
        a2a = (moe.moe_alltoall_time_s(m, b, s, t, ep, etp, link, imbalance=moe_load_imbalance, dispatch=moe_options,
                                       etp=routed_etp)
               if m.is_moe else 0.0)
        kv_f, kv_b = context.kv_exchange_time_s(m, b, s_all, t, cp, kv_exchange, core, link)
        rho_a2a = moe.alltoall_contention(gpu, moe_options.dispatcher, link.nccl_ctas)
        mlp_f = (moe.moe_mlp_time_s(m, gpu, dtype, b, s, t, ep, etp, moe_load_imbalance, framework)
                 if m.is_moe and moe_options.a2a_overlap else 0.0)
        alone = moe.unpaired_pass_share(work.in_flight, num_microbatches)  # warm-up / cool-down passes, exposed

        def exposed(f_s: Any, b_s: Any) -> Any:
            if not moe_options.a2a_overlap:
                return a2a
            return (1.0 - alone) * moe.exposed_alltoall_s(a2a, f_s, b_s, rho_a2a, mlp_f) + alone * a2a

        if af is not None:
            x = exposed(af, ab)
            af, ab, atp = af + x + kv_f, ab + x + kv_b, atp + 2 * x + kv_f + kv_b
        x = exposed(lf, lb)
        lf, lb, ltp = lf + x + kv_f, lb + x + kv_b, ltp + 2 * x + kv_f + kv_b
        layer_a2a = 2 * x
        if m.is_moe and moe_options.recompute:  # the MoE layer again in backward, unless the whole layer is
            again = (moe.moe_mlp_time_s(m, gpu, dtype, b, s, t, ep, etp, moe_load_imbalance, framework) + a2a
                     + moe.permute_time_s(m, gpu, b, s, t, ep, etp, moe_load_imbalance, fp8_padding)
                     + moe.expert_bias_time_s(m, gpu, b, s, t, ep, etp, moe_load_imbalance, framework,
                                              moe_options.dispatcher))
            rerun = np.where(rc == Recompute.FULL, 0.0, again)
            lb, ltp = lb + rerun, ltp + np.where(rc == Recompute.FULL, 0.0, a2a)
            layer_a2a = layer_a2a + np.where(rc == Recompute.FULL, 0.0, a2a)
    work = replace(work, fp8_recipe=fp8_recipe)
    if fp8_recipe is not None:  # FP8 quantization of the linear layers' inputs and output gradients
        # On Megatron's fused shapes whatever the stack's projections: the output-gradient and weight casts are
        # element-wise, so split linears cast the same bytes; the separate wq / wk / wv (w1 / w3) casts of one
        # shared input are identical ops that torch.compile's joint-graph CSE merges into one
        # (torch/_functorch/partitioners.py min_cut_rematerialization_partition: fx_graph_cse), and torchtitan's
        # float8 TP plan casts that input once (PrepareFloat8ModuleInput). Eager runs without TP cast it once per
        # Float8Linear (torchao float8_linear.py): not charged (docs/estimator.md, Separate projections).
        shapes = moe.linear_gemm_shapes(m, b, s, t, ep, moe_load_imbalance, etp)
        dense = not (m.is_moe or m.is_mla)  # QKV / FC1 column-parallel, projection / FC2 row-parallel
        cf, cb = fp8.layer_cast_time_s(gpu, fp8_recipe, shapes, t, sequence_parallel,
                                       (True, False, True, False) if dense else None, framework)
        # rowwise_with_gw_hp: bf16 weight gradients, one per GEMM the stack runs (its projections)
        cb = cb + compute.wgrad_bf16_extra_s(
            gpu, fp8_recipe, moe.linear_gemm_shapes(m, b, s, t, ep, moe_load_imbalance, etp, stack.projections))
        if eager:  # torchao's casts as separate ATen kernels
            xf, xb = elementwise.eager_cast_time_s(gpu, shapes)
            cf, cb = cf + xf, cb + xb
        sac_rerun: Any = 0.0
        if dense and framework == "fsdp":  # torchao tensor-wise casts of TP DTensors: amax all-reduces (fp8 doc)
            rf, rb, rs = fp8.tp_amax_allreduce_time_s(m, fp8_recipe, t, sequence_parallel, link.tp_link(), b * s)
            sac_cast = fp8.op_sac_cast_time_s(gpu, fp8_recipe, shapes, t, sequence_parallel, (True, False, True, False))
            cf, cb = cf + rf, cb + rb
            # per-op SAC runs them again, with the forward casts its recomputation needs (full: with cf)
            sac_rerun = np.where(rc == Recompute.SELECTIVE, rs + sac_cast, 0.0)
            ltp = ltp + rf + rb + np.where(rc == Recompute.SELECTIVE, rs, 0.0) + np.where(rc == Recompute.FULL, rf, 0.0)
            if atp is not None:
                atp = atp + rf + rb
        lf, lb = lf + cf, lb + cb + sac_rerun + np.where(rc == Recompute.FULL, cf, 0.0)
        if af is not None:
            af, ab = af + cf, ab + cb
    if gpu.attention_kernel in stack.attention_unpad and attention == "flash":  # flash-attn's bert_padding
        uf, ub = attention_unpad_s(m, gpu, b, s, t)
        lf, lb = lf + uf, lb + ub + np.where(rc == Recompute.FULL, uf, 0.0)
        if af is not None:
            af, ab = af + uf, ab + ub
    if recompute_modules or offload_modules:  # Megatron-Core's per-module recomputation and offloading
        redo, _ = memory.module_activation_bytes(m, b, s, t, sequence_parallel, recompute_modules,
                                                 moe_recompute=moe_options.recompute)
        _, moved = memory.module_activation_bytes(m, b, s, t, sequence_parallel, (), offload_modules,
                                                  fp8_recipe is not None, moe_options.recompute)
        # the discarded outputs' element-wise ops run again in backward (at the element-wise rate of
        # compute.layer_time_s); the offloaded inputs cross the host link out in forward and back in backward, on
        # their own streams behind the layer's compute (exposed only beyond it); none where a layer is
        # recomputed whole
        again = compute.ELEMENTWISE_PASSES * redo / gpu.hbm_bandwidth_bytes_per_s
        if "mla_up_proj" in recompute_modules:  # and MLA's up-projection GEMMs (memory.module_activation_bytes)
            again = again + mla_up_proj_time_s(m, gpu, dtype, b, s, t)
        copy = moved / gpu.host_link_bandwidth_bytes_per_s
        on = rc != Recompute.FULL
        lf, lb = lf + np.where(on, np.maximum(copy - lf, 0.0), 0.0), lb + np.where(on, again + np.maximum(copy - lb, 0.0), 0.0)
        if af is not None:
            af, ab = af + np.maximum(copy - af, 0.0), ab + again + np.maximum(copy - ab, 0.0)
    if measured_layer_time_s is not None:
        # Scale the analytic recomputation overhead by measured/analytic forward time.
        mf, mbk = measured_layer_time_s
        lf, lb = mf, mbk + (lb - ab) * (mf / af)
        ab = mbk
    ef, eb = compute.embedding_time_s(m, gpu, b, s, t)
    hf, hb = compute.head_time_s(m, gpu, dtype, b, s, t, framework, loss_kind if framework == "fsdp" else cross_entropy)
    if framework == "fsdp":  # PyTorch's selective checkpointing is torchtitan's per-op SAC
        lb = lb + np.where(rc == Recompute.SELECTIVE, moe.op_sac_recompute_s(
            m, gpu, dtype, b, s, t, sequence_parallel, attention, eager_bytes, stack.projections, ep, etp,
            moe_load_imbalance, framework), 0.0)
    if recompute_layers is None:
        layers_bwd, layers_tp = num_layers * lb, num_layers * ltp
    else:  # r layers recompute, the others do not (their backward is the plain one)
        r = np.minimum(recompute_layers, num_layers)
        layers_bwd = r * lb + (num_layers - r) * ab
        layers_tp = r * ltp + (num_layers - r) * atp
    calls = pipeline_call_s(single_stage, virtual_stages, link.p2p_call_s)
    fwd = num_layers * lf + np.where(has_embedding, ef, 0.0) + np.where(has_head, hf, 0.0) + calls
    bwd = layers_bwd + np.where(has_embedding, eb, 0.0) + np.where(has_head, hb, 0.0) + calls
    if options.mtp_layers:  # each MTP module's projection [hnorm(h); enorm(emb)] -> h and its pass of the shared head
        proj = compute.gemm_time_s(gpu, fp8.high_precision(dtype), b * s, m.hidden_size / t, 2 * m.hidden_size)
        fwd, bwd = fwd + mtp * (proj + hf), bwd + mtp * (2 * proj + hb)

    dense, expert = moe.parameters_per_gpu(memory.stage_parameters(m, num_layers, has_embedding, has_head, single_stage),
                                           moe.expert_parameters(m, num_layers), t, ep, etp)
    params = dense + expert
    # FSDP whatever the ZeRO stage, which sets its shard group (one rank at ZeRO-0) and its resharding (never at
    # ZeRO-1/2): memory.fsdp_shard_ranks, memory.fsdp_reshards
    shard_of = memory.fsdp_shard_ranks(zero, np.asarray(degrees.dense_dp), fsdp_shard)
    expert_shard_of = memory.fsdp_shard_ranks(zero, degrees.expert_dp, fsdp_shard)
    if framework == "fsdp":
        reshard_after_forward = memory.fsdp_reshards(zero, reshard_after_forward)
    # ... except ZeRO-0 on a stack whose DDP is torch DDP's Reducer (stack field ddp; ddp_reducer_exposed_s)
    reducer = memory.ddp_reducer_runs(options, zero, degrees.dense_dp)
    zero = np.where((framework == "fsdp") & ~reducer, 3, np.asarray(zero))
    dp_all, edp = np.asarray(degrees.dense_dp), degrees.expert_dp
    grad_per = (grad_comm_bytes_per_parameter(dtype) if grad_reduce_dtype is None
                else (4 if grad_reduce_dtype == "fp32" else 2))
    layer_weight_per = weight_per = fp8.gathered_weight_bytes(  # FP8 parameters / FSDP2 float8 all-gather
        dtype, framework, stack.optimizer_memory == "fsdp1", fp8_recipe)            # (fp8 doc)
    layers_params = np.asarray(num_layers, dtype=float) * memory.layer_parameters_per_gpu(m, t, ep, etp)
    if weight_per != 2:  # only the layers' linear weights gather in FP8; the embedding and output stay 16-bit
        weight_per = fp8.mixed_gathered_weight_bytes(weight_per, layers_params, params)
    root = fsdp_root_parameters(params, layers_params, framework)  # FSDP's root unit, exposed (its doc)

    def dp_collective(bytes_per_parameter: Array, collective: str, units: Array = 1.0, group: Array = None,
                      dense_params: Array = None, experts: bool = True):
        """Dense parameters (``dense_params``, default all of the stage's) over dp·cp ranks (or ``group``; t apart),
        experts (unless ``experts`` is False) over the expert-DP ranks (ep apart, folded)."""
        n = dp_all if group is None else group
        d = dense if dense_params is None else dense_params
        out = dp_collective_time_s(d * bytes_per_parameter / units, collective, n, t, link)
        if m.is_moe and experts:  # FSDP's per-unit collectives (``group``): over the experts' shard group
            eg = expert_shard_of if group is not None and framework == "fsdp" else edp
            out = out + dp_collective_time_s(expert * bytes_per_parameter / units, collective, eg,
                                             np.asarray(degrees.expert_ranks), link)
        return out * units

    grad_bytes = params * grad_per
    allreduce = dp_collective(grad_per, "allreduce")
    reduce_scatter = dp_collective(grad_per, "allgather")
    param_gather = dp_collective(weight_per, "allgather")
    # ZeRO-0: all-reduce grads. ZeRO-1/2: reduce-scatter grads + all-gather updated weights (distributed optimizer),
    # once per iteration. ZeRO-3 / FSDP: per micro-batch, per unit (zero3_exposed_s).
    z3 = zero >= 3
    # DeepSpeed's BF16_Optimizer (memory.bf16_optimizer_runs): ReduceGrads all-reduces its whole fp32 gradient
    # buffer (pipe/engine.py _bf16_reduce_grads -> buffered_allreduce_fallback), and the step all-gathers the
    # updated 16-bit partitions (bf16_optimizer.py step -> all_gather_dp_groups): all-reduce + all-gather.
    bf16_opt = memory.bf16_optimizer_runs(options, zero)
    grad_sync = np.where(zero == 0, allreduce, reduce_scatter + param_gather)
    # DeepSpeed's ZeRO-1 of 2021-23 (stack zero1_grad_reduce "allreduce") all-reduces every 16-bit gradient through
    # its non-contiguous bucket path (allreduce_bucket) before stepping its partition and all-gathering the weights
    # (in the gradients' own 16-bit dtype: communication_data_type defaults to it)
    ds_z1_allreduce = deepspeed_zero1_allreduce(stack, framework, zero, bf16_opt)
    grad_sync = np.where(bf16_opt, allreduce + param_gather, grad_sync)
    if np.any(ds_z1_allreduce):
        grad_sync = np.where(ds_z1_allreduce, dp_collective(2.0, "allreduce") + param_gather, grad_sync)
    bucket_share = np.minimum(1.0, np.maximum(BUCKET_PARAMETERS, 1e6 * np.asarray(dp)) / np.maximum(params, 1.0))
    rho = overlap_contention(gpu, link.nccl_ctas)  # share of the SMs the overlapped NCCL kernels take from compute
    # Megatron-Core's distributed optimizer with --overlap-param-gather: the all-gather of the updated parameters
    # hides behind the next iteration's first forward, not the backward (exposed_behind_s).
    # NeMo 22.05-22.09 (dp_overlap "single-stage"): apex's distributed Adam all-gathers the updated parameters
    # inside its step, after the local update (apex/contrib/optimizers/distributed_fused_adam.py step() at
    # NVIDIA/apex@6816ef64, 2022-10; overlap with the forward arrived in apex@c0a0b0f6, 2023-02): never hidden.
    distributed = (framework == "megatron") & (zero >= 1)
    gather_in_step = distributed & (stack.dp_overlap == "single-stage")
    gather_fwd = distributed & ~gather_in_step
    behind_bwd = np.where(distributed, reduce_scatter, grad_sync)
    grad_exposed = np.where(
        z3, 0.0, np.where(overlap_grad_reduce, exposed_behind_s(behind_bwd, bwd, bucket_share, rho)
                          + np.where(gather_fwd, exposed_behind_s(param_gather, fwd, bucket_share, rho), 0.0)
                          + np.where(gather_in_step, param_gather, 0.0),
                          grad_sync)
    )
    # FSDP gathers and reduce-scatters one layer (FSDP unit) at a time: L collectives per pass, each paying its
    # own latency steps (Zhao et al. VLDB 2023 Sec. 3.2, one FlatParameter per unit; FSDP2: one all-gather per
    # fully_shard module). HSDP: within shard groups of consecutive DP ranks, then an all-reduce of each shard
    # across the replicas (stride t·shard).
    units = np.maximum(np.asarray(num_layers, dtype=float), 1.0)
    shard = np.asarray(shard_of if framework == "fsdp" else dp_all, dtype=float)
    replicas = dp_all / shard

    def replica_allreduce(grad_bytes_per_unit: Array):
        """HSDP: one unit's sharded gradient all-reduced across the replicas."""
        return np.where(replicas > 1, group_collective_time_s(
            grad_bytes_per_unit / shard, "allreduce", replicas, t * shard, link), 0.0)

    has_root = np.any(root > 0)
    z3_gather = dp_collective(layer_weight_per if framework == "fsdp" else weight_per, "allgather", units, shard,
                              dense_params=dense - root)
    z3_reduce_scatter = (dp_collective(grad_per, "allgather", units, shard, dense_params=dense - root)
                         + replica_allreduce((params - root) * grad_per / units) * units)
    root_gather: Any = 0.0
    root_reduce_scatter: Any = 0.0
    head_s: Any = 0.0  # [norm, output] as their own unit (stack fsdp_units): its gather and reduce-scatter
    head_exposed: Any = 0.0  # the part of head_s its neighbouring layer's compute does not hide

    def unit_collectives(n_params: Array):
        """(all-gather in 16 bits, reduce-scatter + HSDP all-reduce) of one unit of ``n_params`` dense parameters."""
        g = dp_collective(2.0, "allgather", 1.0, shard, dense_params=n_params, experts=False)
        r = (dp_collective(grad_per, "allgather", 1.0, shard, dense_params=n_params, experts=False)
             + replica_allreduce(n_params * grad_per))
        return np.where(n_params > 0, g, 0.0), np.where(n_params > 0, r, 0.0)

    if has_root:
        head = np.zeros_like(root)
        if stack.fsdp_units == "embedding-output":  # fsdp_root_parameters: the embedding alone stays exposed
            embedding = np.where(has_embedding, counts.embedding_parameters(m) / np.asarray(t, dtype=float), 0.0)
            head = root - np.minimum(root, embedding)
        root_gather, root_reduce_scatter = unit_collectives(root - head)
        if stack.fsdp_units == "embedding-output":
            hg, hr = unit_collectives(head)
            head_s = hg + hr
            head_exposed = np.maximum(hg - lf, rho * hg) + np.maximum(hr - lb, rho * hr)
    # FSDP in a pipeline (torch.distributed.pipelining): every backward but the last runs without resharding or
    # gradient sync, so each unit is gathered once, for the first micro-batch, and its accumulated gradient is
    # reduce-scattered once, by the post-backward the schedule calls after the stage's last backward
    # (torch/distributed/pipelining/stage.py, backward_maybe_with_nosync): no backward left to hide it behind.
    # The memory side: hetplan.estimate.memory.FSDP_PIPELINE_GRAD_BYTES.
    pipelined_fsdp = (framework == "fsdp") & ~np.asarray(single_stage)
    # FSDP2's copies on the compute stream (fsdp2_copy_s): per micro-batch in the stage's forward / backward, once
    # per iteration (exposed) in a pipeline, where each unit is gathered and reduce-scattered once.
    fsdp2 = framework == "fsdp" and stack.optimizer_memory == "fsdp2"
    copy_f, copy_b = (fsdp2_copy_s(params, gpu, weight_per, grad_per, reshard_after_forward) if fsdp2
                      else (0.0, 0.0))
    if framework == "fsdp" and stack.optimizer_memory == "fsdp1":  # FSDP1's FlatParameter passes (fsdp1_passes_s)
        copy_f, copy_b = fsdp1_passes_s(params, gpu, weight_per, grad_per, shard, reshard_after_forward,
                                        4 if fsdp_param_dtype == "fp32" else 2)
    fwd = fwd + np.where(pipelined_fsdp | reducer, 0.0, copy_f)  # (torch DDP: no FSDP copies, its own below)
    bwd = bwd + np.where(pipelined_fsdp | reducer, 0.0, copy_b)
    if np.any(reducer):
        df, db = ddp_reducer_copies_s(params, gpu, num_microbatches)
        fwd, bwd = fwd + np.where(reducer, df, 0.0), bwd + np.where(reducer, db, 0.0)
    root_s = root_gather + root_reduce_scatter  # exposed, once per micro-batch (once per step in a pipeline)
    gather_exposed = np.where(
        z3, np.where(pipelined_fsdp,
                     zero3_exposed_s(z3_gather, 0.0, num_layers * lf, layers_bwd, num_layers, 1, True, False, rho)
                     + z3_reduce_scatter + copy_f + copy_b + root_s + head_s,
                     zero3_exposed_s(z3_gather, z3_reduce_scatter, num_layers * lf, layers_bwd, num_layers,
                                     num_microbatches, overlap_grad_reduce, reshard_after_forward, rho)
                     + num_microbatches * (root_s + head_exposed)), 0.0,
    )
    grad_exposed = np.where(bf16_opt, grad_sync, grad_exposed)  # reduced at the boundary, never overlapped
    if np.any(reducer):  # torch DDP: the fp32 gradients all-reduced in buckets behind every micro-batch's backward
        ddp_sync = dp_collective(float(memory.FSDP_GRAD_BYTES), "allreduce")
        grad_exposed = np.where(reducer, num_microbatches * ddp_reducer_exposed_s(
            ddp_sync, bwd, params, overlap_grad_reduce, rho), grad_exposed)
        grad_sync = np.where(reducer, num_microbatches * ddp_sync, grad_sync)
    dp_total = np.where(z3, np.where(pipelined_fsdp, z3_gather + z3_reduce_scatter + root_s + head_s,
                                     num_microbatches * (np.where(reshard_after_forward, 2, 1) * z3_gather
                                                         + z3_reduce_scatter + root_s + head_s)), grad_sync)
    # Embedding-gradient all-reduce between the first and the last stage (tied embeddings, pp > 1).
    emb_sync = np.where(
        (np.asarray(has_embedding) | np.asarray(has_head)) & ~np.asarray(single_stage) & m.tied_embeddings,
        compute_embedding_sync_s(m, dtype, t, link), 0.0,
    )

    if framework == "fsdp":  # each rank steps the shard it holds: of its HSDP shard group (one rank at ZeRO-0)
        owned = dense / shard_of + expert / expert_shard_of
    else:
        owned = dense / np.where((zero >= 1) | bf16_opt, dp_all, 1) + expert / np.where((zero >= 1) | bf16_opt, edp, 1)
    # BF16_Optimizer adds each micro-batch's 16-bit gradients into its fp32 buffer after that micro-batch's
    # backward, on the compute stream (pipe/engine.py _exec_backward_pass -> update_hp_grads)
    bwd = bwd + np.where(bf16_opt, bf16_accumulation_time_s(params, gpu), 0.0)
    # Without BF16_Optimizer, DeepSpeed's engine (ZeRO 0/1) leaves the sum over micro-batches to autograd's
    # in-place .grad accumulation, a kernel of its own after each backward but the first (autograd_accumulation_s)
    autograd_acc = ((framework == "deepspeed") & (stack.optimizer_memory == "deepspeed") & ~np.asarray(bf16_opt)
                    & (np.asarray(zero) <= 1))
    bwd = bwd + np.where(autograd_acc, autograd_accumulation_time_s(params, gpu, num_microbatches), 0.0)
    # A Megatron stack without weight-gradient accumulation fusion adds each micro-batch's 16-bit gradients into
    # the accumulator with a kernel of its own after the backward GEMMs (stack field wgrad_accumulation)
    separate = (framework == "megatron") & stack_separate_wgrad_accumulation(stack, single_stage)
    bwd = bwd + np.where(separate, separate_accumulation_time_s(params, gpu, grad_per), 0.0)
    # Megatron-FSDP (framework megatron, ZeRO-2/3): each micro-batch's 16-bit gradient copied into its main_grad
    # bucket (megatron_fsdp_grad_copy_s); no copy around its collectives, whose buffers the parameters view
    bwd = bwd + np.where((framework == "megatron") & (zero >= 2), megatron_fsdp_grad_copy_s(params, gpu, grad_per),
                         0.0)
    mem = memory.stage_memory_bytes(m, degrees, work, options)
    # DeepSpeed ZeRO-0 with fp16: the gradient bucket copies of its boundary reduction and FP16_Optimizer's passes,
    # more than a fused Adam step (compute doc); serial after the last backward, like the step
    ds_fp16 = framework == "deepspeed" and stack.optimizer_memory == "deepspeed" and dtype == "fp16"
    adam_bytes = (compute.ADAM_BYTES_PER_PARAMETER if "adam" in stack.fused  # else one kernel per op (compute doc)
                  else compute.UNFUSED_ADAMW_BYTES_PER_PARAMETER)
    step_bytes = np.where(ds_fp16 & (np.asarray(zero) == 0), compute.DEEPSPEED_FP16_STEP_BYTES_PER_PARAMETER
                          + compute.DEEPSPEED_GRAD_BUCKET_BYTES_PER_PARAMETER, adam_bytes)
    optimizer = compute.optimizer_step_time_s(owned, gpu, step_bytes)
    # ... and passes over every parameter of the stage, not only the owned partition (deepspeed_zero1_allreduce)
    optimizer = optimizer + np.where(ds_z1_allreduce, compute.optimizer_step_time_s(
        params, gpu, DEEPSPEED_ZERO1_PASS_BYTES_PER_PARAMETER), 0.0)
    if fp8_recipe is not None:  # Transformer Engine re-quantizes the weights once per iteration
        linear = np.asarray(num_layers, dtype=float) * memory.layer_parameters_per_gpu(m, t, ep, etp)
        optimizer = optimizer + fp8.weight_cast_time_s(linear, gpu, fp8_recipe, framework)
    # the stage's tp·cp·dp GPUs wait for the slowest of them at every collective (hetplan.estimate.variability)
    slowest = variability.slowest_gpu_factor(t * cp * dp, gpu.speed_variability)
    return StageCost(
        forward_s=fwd * slowest,
        backward_s=bwd * slowest,
        tp_comm_s=layers_tp,
        dp_s=dp_total + emb_sync,
        dp_exposed_s=grad_exposed + gather_exposed + emb_sync,
        optimizer_s=optimizer,
        memory=mem,
        params_per_gpu=params,
        alltoall_s=num_layers * np.asarray(layer_a2a, dtype=float) if m.is_moe else 0.0,
    )


#: Bytes per parameter that DeepSpeed's BF16_Optimizer moves after every micro-batch's backward
#: (``deepspeed/runtime/bf16_optimizer.py`` ``update_hp_grads``, one parameter at a time:
#: ``hp_grad.add_(lp.grad.to(fp32))``): the cast reads the 2-byte gradient and writes a 4-byte copy (6 B), the
#: in-place add reads the fp32 buffer and the copy and writes the buffer (12 B).
BF16_ACCUMULATE_BYTES_PER_PARAMETER = 18.0


def bf16_accumulation_time_s(params_per_gpu: Array, gpu: GPUSpec):
    """Time of BF16_Optimizer's fp32 gradient accumulation after one micro-batch's backward (s): memory-bound,
    :data:`BF16_ACCUMULATE_BYTES_PER_PARAMETER` per parameter of the stage at the GPU's memory bandwidth
    (:func:`hetplan.estimate.compute.optimizer_step_time_s`'s rate)."""
    return compute.optimizer_step_time_s(params_per_gpu, gpu, BF16_ACCUMULATE_BYTES_PER_PARAMETER)


#: Bytes per parameter of the stage, owned or not, that DeepSpeed's ZeRO-1 moves at the boundary where it
#: all-reduces (:func:`deepspeed_zero1_allreduce`): the bucket copies of ``allreduce_and_copy`` (flatten, 1/DP
#: scale, copy back: :data:`hetplan.estimate.compute.DEEPSPEED_GRAD_BUCKET_BYTES_PER_PARAMETER`, 12 B) and the
#: step's overflow check, which at stage 1 runs over every parameter's gradient (``has_overflow(partition_gradients
#: =False)`` -> ``has_overflow_serial``: ``float(x.float().sum())``, read 2 + fp32 copy 4 + its sum 4 = 10 B;
#: ``stage_1_and_2.py`` v0.6.0). The owned partition's passes (flatten, fp32 cast, norm, unscale, Adam, copy back)
#: stay in the fused step over the owned parameters.
DEEPSPEED_ZERO1_PASS_BYTES_PER_PARAMETER = compute.DEEPSPEED_GRAD_BUCKET_BYTES_PER_PARAMETER + 10.0


def deepspeed_zero1_allreduce(stack: StackSpec, framework: str, zero: Array, bf16_opt: Array) -> Array:
    """Whether a stage runs DeepSpeed's ZeRO-1 through its all-reduce path (:attr:`hetplan.hardware.stacks.
    StackSpec.zero1_grad_reduce` ``allreduce``: DeepSpeed #1246 to v0.13.0): ``framework = "deepspeed"`` with
    DeepSpeed's optimizer layout, ZeRO 1, not BF16_Optimizer. ``engine.py`` ``_configure_zero_optimizer`` turns
    ``contiguous_gradients`` off at stage 1, so ``stage_1_and_2.py`` ``reduce_ipg_grads`` takes
    ``buffered_reduce_fallback`` -> ``allreduce_and_copy`` -> ``allreduce_bucket``: ``dist.all_reduce`` of each
    flattened bucket of 16-bit gradients (twice a reduce-scatter's traffic), the step then updates the owned
    partition and all-gathers the 16-bit weights. Arrays broadcast over ``zero`` and ``bf16_opt``."""
    on = (framework == "deepspeed" and stack.optimizer_memory == "deepspeed"
          and stack.zero1_grad_reduce == "allreduce")
    return np.asarray(on) & (np.asarray(zero) == 1) & ~np.asarray(bf16_opt, dtype=bool)


#: Bytes per parameter of autograd's in-place gradient accumulation, in units of the gradient's element size:
#: ``AccumulateGrad`` runs ``variable_grad += new_grad`` when ``.grad`` already holds a tensor
#: (``torch/csrc/autograd/functions/accumulate_grad.h``, ``accumulateGrad``), which reads both and writes one.
AUTOGRAD_ACCUMULATE_PASSES = 3.0


def autograd_accumulation_time_s(params_per_gpu: Array, gpu: GPUSpec, num_microbatches: Array,
                                 grad_bytes: float = 2.0):
    """Time per micro-batch, averaged over the step, of autograd's ``.grad`` accumulation under DeepSpeed's engine
    without BF16_Optimizer at ZeRO 0 or 1 (s). Nothing in that path sums the micro-batches' gradients itself:
    the pipeline engine's ``_exec_backward_pass`` calls ``torch.autograd.backward`` (the last stage
    ``DeepSpeedEngine.backward``) and ZeRO-1 reduces only at the accumulation boundary
    (``stage_1_and_2.py`` ``reduce_ready_partitions_and_remove_grads``: ``partition_gradients or
    is_gradient_accumulation_boundary``; ``reduce_gradients`` from ``_exec_reduce_grads``), so every parameter's
    16-bit ``.grad`` is summed by autograd (microsoft/DeepSpeed v0.5.x-v0.6.x). The step frees the gradients
    (``zero_grad`` with ``set_grads_to_None``; ZeRO-1's ``free_grad_in_param_list``), so the first micro-batch's
    gradient is taken as it is and each later one is added in place: :data:`AUTOGRAD_ACCUMULATE_PASSES` x 2 B
    (the 16-bit ``.grad`` of an fp16 or bf16 model) per parameter of the stage at the GPU's memory bandwidth,
    ``(m - 1) / m`` of it per micro-batch of a step of ``m``; ``grad_bytes``: 4 for fp32 gradients (torch DDP
    under autocast, :func:`ddp_reducer_copies_s`). Arrays broadcast."""
    m = np.maximum(np.asarray(num_microbatches, dtype=float), 1.0)
    per = compute.optimizer_step_time_s(params_per_gpu, gpu, AUTOGRAD_ACCUMULATE_PASSES * grad_bytes)
    return per * (m - 1.0) / m


def separate_accumulation_time_s(params_per_gpu: Array, gpu: GPUSpec, accumulator_bytes: Array):
    """Time of one micro-batch's gradient accumulation where the weight-gradient GEMMs write a 16-bit gradient
    and a separate kernel adds it into the accumulator (s; ``wgrad_accumulation = "separate"``): Megatron-LM
    v2.x's DDP hook ``param.main_grad.add_(param.grad.data)`` (``megatron/model/distributed.py``, v2.0 / v2.5;
    autograd's in-place ``.grad`` accumulation under ``--DDP-impl torch``), NeMo 1.8-1.10's
    ``MainParamsOptimizerWrapper`` hook and apex distributed Adam's gradient copy at PP 1 (NeMo 1.11-1.12).
    Memory-bound: the 2-byte gradient read, the accumulator (``accumulator_bytes``: fp32 4 for bf16 and under
    ``--accumulate-allreduce-grads-in-fp32``, else 2, as :func:`grad_comm_bytes_per_parameter`) read and
    written, per parameter of the stage at the GPU's memory bandwidth. With fusion
    (``--gradient-accumulation-fusion``, NVIDIA/Megatron-LM@83b1e42f30; Transformer Engine) the GEMM
    accumulates in place and nothing is added."""
    return compute.optimizer_step_time_s(params_per_gpu, gpu, 2.0 + 2.0 * np.asarray(accumulator_bytes, dtype=float))


def megatron_fsdp_grad_copy_s(params_per_gpu: Array, gpu: GPUSpec, main_grad_bytes: Array):
    """Time of Megatron-FSDP's gradient hand-over after one micro-batch's backward (s; ``framework = "megatron"``
    at ZeRO-2 / 3, which ``hetplan export`` writes as ``--use-megatron-fsdp --data-parallel-sharding-strategy
    optim_grads`` / ``optim_grads_params`` with ``--no-gradient-accumulation-fusion``, as Megatron-Core's own
    custom-FSDP guide of May 2025 prescribes, ``docs/source/api-guide/custom_fsdp.md`` at NVIDIA/Megatron-LM
    1e057005). The weight-gradient GEMMs write a 16-bit ``param.grad``; the unit's post-backward hook copies it
    into the unit's ``main_grad`` bucket (``_grad_acc``: ``param.main_grad.copy_(param.grad)``, overwriting,
    since the sharded gradients are reduce-scattered every micro-batch; ``custom_fsdp/fully_sharded_data_parallel.py``
    at 1e057005, ``megatron_fsdp/megatron_fsdp.py`` of 2026-08), on the compute stream: a read of 2 bytes and a
    write of ``main_grad_bytes`` (fp32 4 under ``grad_reduce_in_fp32``, Megatron-LM's default for bf16) per
    parameter of the stage at the GPU's memory bandwidth. Nothing else is copied: the all-gather writes straight
    into the unit's contiguous parameter bucket, of which the parameters are views, and the reduce-scatter reads
    the ``main_grad`` bucket itself (``param_and_grad_buffer.py`` ``DataParallelBuffer``) — unlike FSDP2's
    per-parameter copy-out and copy-in (:func:`fsdp2_copy_s`, the ``docs/runtime_schedule.md`` of
    ``megatron/core/distributed/fsdp/src``: "FSDP2 issues more data copy than MFSDP")."""
    return compute.optimizer_step_time_s(params_per_gpu, gpu, 2.0 + np.asarray(main_grad_bytes, dtype=float))


def stack_separate_wgrad_accumulation(stack: StackSpec, single_stage: Any) -> Any:
    """:meth:`hetplan.hardware.stacks.StackSpec.separate_wgrad_accumulation` of each plan (``single_stage``
    scalar or array: PP 1 or more)."""
    table = np.array([stack.separate_wgrad_accumulation(pp) for pp in (2, 1)])
    return table[np.asarray(single_stage, dtype=int)]


def mla_up_proj_time_s(m: ModelSpec, gpu: GPUSpec, dtype: str, b: Array, s: Array, t: Array):
    """Seconds the backward of one MLA layer spends rebuilding its queries, keys and values under Megatron-Core's
    ``--recompute-modules mla_up_proj`` (:attr:`hetplan.plan.Job.recompute_modules`): the forward GEMMs inside
    ``qkv_up_proj_and_rope_apply`` run again — the query up-projection from the query latent (or the query
    projection from the hidden state where the model has no query latent) and the key/value up-projection from
    the KV latent, column-parallel over ``t`` (:func:`hetplan.estimate.moe.mla_gemms`), for one micro-batch of
    ``b`` sequences of ``s`` tokens (the element-wise RoPE and concatenation are the discarded bytes' passes,
    :func:`hetplan.estimate.memory.module_activation_bytes`). Under FP8 the GEMMs run at the FP8 rate
    (``CheckpointWithoutOutput(fp8=...)``); their input casts are not charged. Arrays broadcast."""
    linear, _ = moe.mla_gemms(m, b, s, t)
    n_q = 2 if m.q_lora_rank else 1
    return sum(compute.gemm_time_s(gpu, dtype, M, N, K, n) for M, N, K, n in (linear[n_q - 1], linear[-2]))


def stage_fp8_recipe(gpu: GPUSpec, options: TrainingOptions) -> str | None:
    """The FP8 scaling recipe of a stage's GEMMs (:func:`hetplan.estimate.fp8.recipe`), None unless FP8."""
    return (fp8.recipe(gpu, options.framework, options.fp8_recipe, options.stack_spec())
            if fp8.is_fp8(options.dtype) else None)


def stage_memory(m: ModelSpec, hardware: StageHardware, degrees: Degrees, work: StageWork,
                 options: TrainingOptions) -> memory.StageMemory:
    """The memory part of :func:`stage_costs` alone (what a search prunes by before it costs times):
    :func:`hetplan.estimate.memory.stage_memory_bytes` with the FP8 recipe of the stage's GPU, on the degrees the
    framework launches (:func:`hetplan.estimate.moe.launched_degrees`)."""
    degrees = moe.launched_degrees(degrees, options.framework)
    return memory.stage_memory_bytes(m, degrees, replace(work, fp8_recipe=stage_fp8_recipe(hardware.gpu, options)),
                                     options)


def stack_overlaps_grad_reduce(stack: StackSpec, single_stage: Any, zero: Any) -> Any:
    """Whether ``stack`` can overlap the data-parallel gradient reduction with the backward pass
    (:meth:`hetplan.hardware.stacks.StackSpec.overlaps_grad_reduce`, which depends on whether there is a pipeline
    and on the ZeRO stage), for arrays: its answer for each (pipeline or not, ZeRO 0-3), indexed."""
    table = np.array([[stack.overlaps_grad_reduce(pp, z) for z in range(4)] for pp in (2, 1)])
    return table[np.asarray(single_stage, dtype=int), np.asarray(zero, dtype=int)]


def exposed_behind_s(sync_s: Array, window_s: Array, bucket_share: Array, contention: Array):
    """Exposed time of a bucketed data-parallel collective of ``sync_s`` overlapped with ``window_s`` of compute:
    what exceeds the window, and at least its last bucket (``bucket_share`` of it, which starts when the window
    ends), plus the slowdown ``contention`` x the overlapped part of the compute it overlaps
    (:func:`hetplan.estimate.comm.overlap_contention`). The window: the last micro-batch's backward for the
    gradient reduction (Megatron-LM DDP reduces on the last micro-batch only); with Megatron-Core's distributed
    optimizer and ``--overlap-param-gather`` the first micro-batch's forward for the parameter all-gather
    (dispatched after the optimizer step, each bucket waited for by the forward pre-hook of its first layer:
    ``megatron/core/distributed/distributed_data_parallel.py``). Arrays broadcast."""
    return (np.maximum(sync_s - window_s, sync_s * bucket_share)
            + contention * np.minimum(sync_s * (1.0 - bucket_share), window_s))


def pipeline_call_s(single_stage: Array, virtual_stages: Array, call_s: Array):
    """Per-micro-batch time a pipeline stage loses to the p2p calls of its extra model chunks, per direction (s):
    ``(v - 1) · call_s`` (:data:`hetplan.estimate.comm.P2P_CALL_S`); 0 for a single stage or plain 1F1B, whose one
    call per micro-batch and direction the calibrated constants already hold (docs/estimator.md, Validation)."""
    v = np.asarray(virtual_stages, dtype=float)
    return np.where(single_stage, 0.0, np.maximum(v - 1.0, 0.0) * call_s)


#: torch DDP's gradient bucket under torchtitan (parameters): ``replicate(model, device_mesh=dp_mesh,
#: bucket_cap_mb=100)`` (pytorch/torchtitan ``torchtitan/models/llama3/infra/parallelize.py`` ``apply_ddp``, to
#: v0.2.2; DDP's own default is 25 MB) of fp32 gradients: 100 MB / 4 B.
DDP_BUCKET_PARAMETERS = 100e6 / 4
#: Bytes per parameter torch DDP's Reducer copies per micro-batch on the compute stream without
#: ``gradient_as_bucket_view`` (torchtitan leaves it False): each fp32 gradient into its bucket when its hook fires
#: (read 4 + write 4, ``reducer.cpp`` ``mark_variable_ready_dense``) and the reduced bucket back into ``.grad``
#: (4 + 4, ``finalize_bucket_dense``).
DDP_BUCKET_COPY_BYTES_PER_PARAMETER = 16.0
#: Bytes per parameter of autocast's weight casts per forward (torchtitan before 2026-03 runs DDP with fp32
#: parameters under ``torch.autocast(bfloat16)``, ``maybe_enable_amp`` in ``torchtitan/distributed/utils.py``):
#: each fp32 weight read (4 B) and its bf16 copy written (2 B) once per forward (the cast cache of the autocast
#: region), the copy kept for the backward GEMMs.
AUTOCAST_CAST_BYTES_PER_PARAMETER = 6.0


def ddp_reducer_exposed_s(allreduce_s: Array, backward_s: Array, params_per_gpu: Array, overlap: Array,
                          contention: Array):
    """Exposed time per micro-batch of torch DDP's gradient all-reduce (``torch.nn.parallel.DistributedDataParallel``
    through ``torch.distributed._composable.replicate``, torchtitan's DDP before pytorch/torchtitan#2458,
    2026-03-09): the Reducer all-reduces a bucket of :data:`DDP_BUCKET_PARAMETERS` fp32 gradients as soon as
    their hooks have fired, during the backward, on every micro-batch (torchtitan's accumulation loop calls no
    ``no_sync``, ``torchtitan/train.py`` ``train_step`` at v0.2.2) — :func:`exposed_behind_s` with that bucket's
    share; without ``overlap`` the whole ``allreduce_s``. Arrays broadcast."""
    share = np.minimum(1.0, DDP_BUCKET_PARAMETERS / np.maximum(params_per_gpu, 1.0))
    return np.where(overlap, exposed_behind_s(allreduce_s, backward_s, share, contention), allreduce_s)


def ddp_reducer_copies_s(params_per_gpu: Array, gpu: GPUSpec, num_microbatches: Array):
    """``(forward_s, backward_s)`` per micro-batch of what torch DDP under autocast adds on the compute stream:
    the weights' casts in forward (:data:`AUTOCAST_CAST_BYTES_PER_PARAMETER`); in backward the Reducer's bucket
    copies (:data:`DDP_BUCKET_COPY_BYTES_PER_PARAMETER`) and autograd's in-place fp32 ``.grad`` accumulation of
    the micro-batches after the first (:func:`autograd_accumulation_time_s`, 4-byte gradients). Memory-bound, at
    the GPU's HBM bandwidth. Arrays broadcast."""
    fwd = compute.optimizer_step_time_s(params_per_gpu, gpu, AUTOCAST_CAST_BYTES_PER_PARAMETER)
    bwd = (compute.optimizer_step_time_s(params_per_gpu, gpu, DDP_BUCKET_COPY_BYTES_PER_PARAMETER)
           + autograd_accumulation_time_s(params_per_gpu, gpu, num_microbatches, grad_bytes=4.0))
    return fwd, bwd


def zero3_exposed_s(gather_s: Array, reduce_scatter_s: Array, forward_s: Array, backward_s: Array, num_layers: Array,
                    num_microbatches: Array,
                    overlap: Array = True, reshard_after_forward: Array = True, contention: Array = 0.0):
    """Exposed ZeRO-3 / FSDP communication per iteration (s) of a stage, from the time of one all-gather of the
    stage's parameters (``gather_s``), one reduce-scatter of its gradients (``reduce_scatter_s``, with HSDP's
    replica all-reduce) and one micro-batch's forward and backward compute of its layers (s). Arrays broadcast.

    Per micro-batch FSDP (Zhao et al., "PyTorch FSDP", VLDB 2023, Sec. 3.3-3.4; PyTorch FSDP2 ``fully_shard``;
    ZeRO stage 3, Rajbhandari et al. SC'20 Sec. 5.3) all-gathers each unit's (layer's) parameters before its
    forward and, with ``reshard_after_forward``, again before its backward, and reduce-scatters each unit's
    gradients right after its backward: with gradient accumulation the gradients are sharded, so the
    reduce-scatter runs on every micro-batch — at a fixed global batch, more GPUs mean smaller micro-batches with
    the same collective volume each. Prefetching (one unit ahead, FSDP2's default) hides unit i+1's gather behind
    unit i's compute only: the overlap is bounded by *each unit's* compute. Per unit ``g = G/L``, ``r = R/L``,
    ``f = F/L``, ``b = B/L`` (L units), per micro-batch::

        exposed = g + (L-1)·max(g - f, 0)  +  r + (L-1)·max(g' + r - b, 0)

    Forward: the first unit's gather has nothing to hide behind. Backward: the next unit's gather (``g' = g``
    with resharding, else 0) and this unit's reduce-scatter share the network behind one unit's backward; the
    last reduce-scatter follows the last backward kernel; the last unit of the forward stays gathered (FSDP does
    not reshard the root). ``L = 1``: ``G + R``. Without ``overlap`` the reduce-scatter is not overlapped:
    ``... + (L-1)·max(g' - b, 0) + R``. A hidden collective of ``c`` s still slows the compute it overlaps by
    ``contention·c`` (the SMs the NCCL kernel takes, :func:`hetplan.estimate.comm.overlap_contention`): each
    ``max(c - w, 0)`` above is ``max(c - w, contention·c)``.
    """
    L = np.maximum(np.asarray(num_layers, dtype=float), 1.0)
    g, r = np.asarray(gather_s, dtype=float) / L, np.asarray(reduce_scatter_s, dtype=float) / L
    f, b = np.asarray(forward_s, dtype=float) / L, np.asarray(backward_s, dtype=float) / L
    gb = np.where(reshard_after_forward, g, 0.0)
    k = contention
    fwd_part = g + (L - 1.0) * np.maximum(g - f, k * g)
    bwd_part = np.where(overlap, r + (L - 1.0) * np.maximum(gb + r - b, k * (gb + r)),
                        (L - 1.0) * np.maximum(gb - b, k * gb) + L * r)
    return num_microbatches * (fwd_part + bwd_part)


def attention_unpad_s(m: ModelSpec, gpu: GPUSpec, b: Array, s: Array, t: Array):
    """``(forward_s, backward_s)`` of flash-attn's ``bert_padding`` around a varlen attention kernel, one layer and
    micro-batch of ``b·s`` tokens on one of ``t`` TP ranks (stacks whose ``attention_unpad`` lists the kernel:
    llm-foundry's ``flash_attn_fn``). Forward: ``index_first_axis`` gathers Q, K and V into unpadded tensors
    (``torch.gather``: read + write, 2 + 2 B per element) and ``pad_input`` writes a zero-filled padded output and
    scatters the kernel's output into it (``index_put``: 2 B zero fill, 2 + 2 B). Backward: ``pad_input``'s backward
    gathers the output gradient (2 + 2 B) and each ``index_first_axis`` backward zero-fills and scatters its
    gradient (2 + 2 + 2 B) (``flash_attn/bert_padding.py`` ``IndexFirstAxis``, ``IndexPutFirstAxis``). Memory-bound
    passes at the GPU's HBM bandwidth; with full recomputation the forward passes run again. Arrays broadcast."""
    tokens = np.asarray(b, dtype=float) * np.asarray(s, dtype=float) / np.asarray(t, dtype=float)
    qkv = m.q_dim + m.kv_dim + m.v_dim
    out = m.attn_out_dim
    hbm = gpu.hbm_bandwidth_bytes_per_s
    return (4.0 * qkv + 6.0 * out) * tokens / hbm, (4.0 * out + 6.0 * qkv) * tokens / hbm


def fsdp_root_parameters(params_per_gpu: Array, layers_params_per_gpu: Array, framework: str):
    """Parameters of a stage's FSDP root unit (``framework = "fsdp"``; 0 otherwise): those outside its
    transformer layers (``params_per_gpu - layers_params_per_gpu``) — the word embedding (and learned positions),
    the final norm and the output layer — which belong to the root module's own unit, not to the layers'
    (torchtitan ``parallelize_llama.py`` ``apply_fsdp``: ``fully_shard`` on each block, then on the whole model;
    Composer's FSDP1 ``auto_wrap_policy`` wraps MPT's blocks, and the root FlatParameter holds ``wte``, ``wpe``,
    ``norm_f``). The root is all-gathered in the root's pre-forward, before the first layer's forward is issued,
    so nothing hides it, and stays unsharded through the backward (FSDP1 ``_runtime_utils.py``
    ``_post_forward_reshard`` does not free the root after forward; FSDP2 keeps the root's too); its gradients
    are the last the backward produces (the embedding's), so their reduce-scatter is exposed as well. Per
    micro-batch :func:`stage_costs` charges one exposed 16-bit all-gather (float8 converts linear layers only,
    and the output layer is filtered) and one exposed reduce-scatter of the root; the layers' units, with only
    their own parameters, follow :func:`zero3_exposed_s`. Llama 3 8B's root (untied 128,256-token embedding and
    output, 1.05 B parameters) is 4.8 of its layers; MPT-7B's (tied 50,368 × 4,096 embedding, 2,048 learned
    positions) one. DeepSpeed's ZeRO-3 keeps evenly split units. Since pytorch/torchtitan#1094 (2025-07-28;
    stack field ``fsdp_units = "embedding-output"``, ``torchtitan@2025-10``) ``tok_embeddings`` and ``[norm,
    output]`` are units of their own and the root holds nothing: the embedding's gather and reduce-scatter stay
    exposed, the ``[norm, output]`` unit is gathered behind the last layer's forward, kept for the backward
    (``reshard_after_forward=False``) and reduce-scattered behind the last layer's backward, exposed only beyond
    them (:func:`stage_costs`). Arrays broadcast."""
    root = np.asarray(params_per_gpu, dtype=float) - layers_params_per_gpu
    root = np.where(root >= 1.0, root, 0.0)  # a middle stage's float remainder is no unit
    return root if framework == "fsdp" else np.zeros_like(root)


#: Bytes FSDP2 reads and writes per element of a unit's gathered parameters (copy-out) and of its unsharded
#: gradient (copy-in), beyond the collectives' own buffers (:func:`fsdp2_copy_s`).
FSDP2_GRAD_ELEMENT_BYTES = 2  # the unsharded gradient autograd produces, in the bf16 param_dtype


def fsdp2_copy_s(params_per_gpu: Array, gpu: GPUSpec, gathered_bytes: Array, reduce_bytes: Array,
                 reshard_after_forward: Array = True):
    """Time of FSDP2's copies on the compute stream per micro-batch, ``(forward_s, backward_s)``, for a stage
    holding ``params_per_gpu`` parameters (unsharded over DP) on ``gpu``.

    PyTorch FSDP2 (``torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py``) gathers a unit into one flat
    buffer and then copies it out into the per-parameter unsharded tensors (``foreach_all_gather_copy_out``:
    ``split_with_sizes_copy`` on the current stream after waiting for the all-gather): a read and a write of
    ``gathered_bytes`` per element (2 for bf16, 1 for torchao's float8 all-gather), for each all-gather
    (forward, and again in backward with ``reshard_after_forward``). Before each reduce-scatter it concatenates
    the unit's unsharded gradients, cast to the reduce dtype, into the reduce-scatter input
    (``foreach_reduce``: ``foreach_reduce_scatter_copy_in`` / ``_chunk_cat`` on the current stream, before
    ``reduce_scatter_stream.wait_stream(current_stream)``): a read of the bf16 gradient
    (:data:`FSDP2_GRAD_ELEMENT_BYTES`) and a write of ``reduce_bytes`` (4 for fp32 reduction) per element.
    Both are memory-bound copies at the GPU's HBM bandwidth on the compute stream, so they add to the stage's
    time rather than hide behind it. FSDP1 (llm-foundry, fms-fsdp, HF Accelerate) gathers straight into its
    FlatParameter, whose parameters are views, and moves other bytes (:func:`fsdp1_passes_s`).
    Arrays broadcast. Units: s."""
    hbm = gpu.hbm_bandwidth_bytes_per_s
    gather = 2.0 * np.asarray(gathered_bytes, dtype=float) * np.asarray(params_per_gpu, dtype=float) / hbm
    copy_in = (FSDP2_GRAD_ELEMENT_BYTES + np.asarray(reduce_bytes, dtype=float)) * np.asarray(
        params_per_gpu, dtype=float) / hbm
    return gather, np.where(reshard_after_forward, gather, 0.0) + copy_in


#: Bytes per element of the gradient FSDP1's autograd produces: the unsharded FlatParameter's dtype (bf16
#: ``param_dtype`` of the mixed-precision policies that gather in 16 bits).
FSDP1_GRAD_ELEMENT_BYTES = 2


def fsdp1_passes_s(params_per_gpu: Array, gpu: GPUSpec, gathered_bytes: Array, reduce_bytes: Array, shard: Array,
                   reshard_after_forward: Array = True, sharded_bytes: Array = 4):
    """Time of FSDP1's memory passes per micro-batch, ``(forward_s, backward_s)``, for a stage holding
    ``params_per_gpu`` parameters (unsharded over DP) on ``gpu``, sharded over ``shard`` ranks.

    PyTorch FSDP1 (``torch/distributed/fsdp``, the FlatParameter of every wrapped block; Composer / llm-foundry,
    fms-fsdp, HF Accelerate) gathers straight into the unsharded FlatParameter, whose original parameters are views
    of it (``_flat_param.py`` ``_use_unsharded_views``: ``flat_param.split(...)`` then ``.view``). Per element of
    the unsharded unit, it moves:

    * before each all-gather, the cast of the local shard from its ``sharded_bytes`` (fp32 master parameters) to
      the ``gathered_bytes`` low-precision shard (``_flat_param.py`` ``_use_low_precision_shard``, on the
      pre-unshard stream): ``(sharded + gathered) / shard`` bytes, in forward and again in backward with
      ``reshard_after_forward`` (none when the shard is already in the gathered dtype);
    * in backward, the gradient of the views reaches the FlatParameter through the backward of ``split``, which is
      a ``cat`` (``SplitWithSizesBackward``: read + write of :data:`FSDP1_GRAD_ELEMENT_BYTES` per element, on the
      compute stream);
    * then, on the post-backward stream (``_runtime_utils.py`` ``_post_backward_hook``), the cast of the unsharded
      gradient to the reduce dtype when it differs (``flat_param.grad.to(reduce_dtype)``: 2 + ``reduce_bytes``)
      and ``_reduce_grad``'s pre-division before the reduce-scatter (``_div_if_needed(padded_unsharded_grad,
      gradient_predivide_factor)``: read + write of ``reduce_bytes``; the factor is above 1 for every shard
      group of 2 or more, ``_init_utils.py`` ``_get_gradient_predivide_factor``).

    Each pass is a memory-bound kernel at the GPU's HBM bandwidth whose grid fills every SM: the post-backward
    stream's kernels start when the unit's backward ends and share the SMs with the next unit's backward kernels,
    so their time adds (the overlap that hides a collective holds for NCCL's few CTAs,
    :func:`hetplan.estimate.comm.overlap_contention`, not for full-grid kernels). FSDP2 moves other bytes
    (:func:`fsdp2_copy_s`). Arrays broadcast. Units: s."""
    hbm = gpu.hbm_bandwidth_bytes_per_s
    p = np.asarray(params_per_gpu, dtype=float)
    g, r = np.asarray(gathered_bytes, dtype=float), np.asarray(reduce_bytes, dtype=float)
    n = np.maximum(np.asarray(shard, dtype=float), 1.0)
    sb = np.asarray(sharded_bytes, dtype=float)
    cast_shard = np.where(sb != g, (sb + g) / n, 0.0) * p / hbm
    grad = FSDP1_GRAD_ELEMENT_BYTES
    cat = 2.0 * grad
    to_reduce = np.where(r != grad, grad + r, 0.0)
    predivide = np.where(n >= 2, 2.0 * r, 0.0)
    backward = (cat + to_reduce + predivide) * p / hbm
    return cast_shard, np.where(reshard_after_forward, cast_shard, 0.0) + backward


def compute_embedding_sync_s(m: ModelSpec, dtype: str, t: Array, link: Link):
    """All-reduce of the ``V·h/t`` word-embedding gradient between the first and last pipeline stage (2 ranks,
    taken across nodes, NIC shared by the node's GPUs)."""
    nbytes = m.padded_vocab_size() * m.hidden_size / np.asarray(t) * grad_comm_bytes_per_parameter(dtype)
    return group_collective_time_s(nbytes, "allreduce", 2, link.gpus_per_node, link, nic_sharers=link.gpus_per_node)


def p2p_bytes(m: ModelSpec, b: Array, s: Array, t: Array, sequence_parallel: Array):
    """Bytes one rank sends to the next stage per micro-batch: the ``b·s·h`` boundary activation in 2 bytes,
    split over TP ranks by Megatron's scatter/gather optimisation (Narayanan et al. SC'21 Sec. 4.1) or by
    sequence parallelism."""
    return b * s * m.hidden_size * 2 / t


def boundary_bandwidth_bytes_per_s(sender: Link, receiver: Link, sender_gpus: Array, intra_node: Array):
    """Per-rank bandwidth of a pipeline boundary: the intra-node link if both stages share a node, else the
    slower of the two nodes' NICs shared by the sender's GPUs in one node (``min(G, sender_gpus)`` of them)."""
    inter = np.minimum(sender.inter_node_bandwidth_bytes_per_s, receiver.inter_node_bandwidth_bytes_per_s)
    senders = np.minimum(sender.gpus_per_node, sender_gpus)
    return np.where(intra_node, sender.intra_node_bandwidth_bytes_per_s, inter / senders)


def boundary_alpha_s(sender: Link, receiver: Link, intra_node: Array):
    """Per-transfer latency of a pipeline boundary (s): the links' ``p2p_alpha_s`` inside a node
    (``network.toml``'s ``alpha_inter_node_s``, :func:`~hetplan.estimate.comm.p2p_time_s`'s default), else the
    slower of the two nodes' networks."""
    return np.where(intra_node, np.maximum(sender.p2p_alpha_s, receiver.p2p_alpha_s),
                    np.maximum(sender.inter_node_alpha_s, receiver.inter_node_alpha_s))
