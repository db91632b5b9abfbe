"""The Megatron-LM export (``pretrain_gpt.py`` arguments, Megatron-Core): see :mod:`hetplan.runtime.exporters`
for what it expresses."""

from __future__ import annotations


from hetplan.errors import HetplanError
from hetplan.model.spec import ModelSpec
from hetplan.plan import Plan
from hetplan.plan_rules import degree, embedding_loss_split
from hetplan.runtime.exporters.common import Export, _interleaved_units, _Mesh, _mesh, _nodes, _pools_note, _virtual


def megatron_layout(chunks: list[list[int]], mtp: int = 0) -> str:
    """Megatron-Core's ``--pipeline-model-parallel-layout`` for ``chunks[stage][virtual stage]`` decoder layers:
    one ``|``-separated segment per model chunk in model order (virtual stage 0 of every pipeline rank, then
    virtual stage 1, ...), ``t`` a decoder layer, ``E`` the embedding at the start of the first, the ``mtp``
    multi-token-prediction modules (``m``, priced on the last stage; Megatron-Core asserts 'Number of mtp layers in
    layout must match mtp_num_layers') and ``L`` the loss at the end of the last; runs of equal segments written
    ``(t*k|)*n`` (``megatron/core/transformer/pipeline_parallel_layer_layout.py``, ``parse_str_to_list``)."""
    pp, v = len(chunks), len(chunks[0])
    counts = [chunks[s][k] for k in range(v) for s in range(pp)]
    segs = [("t" if n == 1 else f"t*{n}" if n else "") for n in counts]
    segs[0], segs[-1] = "E" + segs[0], segs[-1] + "m" * mtp + "L"
    out, i = [], 0
    while i < len(segs):
        j = i
        while j + 1 < len(segs) and segs[j + 1] == segs[i]:
            j += 1
        run = j - i + 1
        out.append(f"({segs[i]}|)*{run}" if run > 2 and segs[i] else "|".join(segs[i:j + 1]) + "|")
        i = j + 1
    text = "".join(out)
    return text[:-1]


#: Dense families built as Llama's block (SwiGLU, RMSNorm, rotary, no linear biases; Qwen2 adds its QKV biases,
#: Qwen3 its Q/K norms, Phi-3 fuses Q/K/V and gate/up, which Megatron-LM's linear_qkv and linear_fc1 do too).
LLAMA_BLOCK_FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "phi3")


def _a2a_overlap_check(plan: Plan, m: _Mesh, v: int) -> None:
    """What Megatron-Core's ``TransformerConfig`` asserts for ``--overlap-moe-expert-parallel-comm``
    (``megatron/core/transformer/transformer_config.py``, NVIDIA/Megatron-LM d98e8a64): expert parallelism,
    interleaving when pipelined, no full recomputation and no recomputation of the MoE layer, at most one MTP
    layer.

    Raises:
        HetplanError: a plan with ``job.moe_a2a_overlap`` breaking one of them (the launch would stop there)."""
    why = ("EP > 1 ('only supported with expert model parallelism')" if m.ep == 1 else
           "interleaving when pipelined (virtual_pipeline_model_parallel_size must be specified when "
           "pipeline_model_parallel_size > 1)" if plan.pp > 1 and v == 1 else
           "no full recomputation" if m.recompute == "full" else
           "no recomputation of the MoE layer (moe in recompute_modules)" if plan.job.moe_recompute else
           "at most one MTP layer" if plan.job.mtp_layers > 1 else None)
    if why:
        raise HetplanError(f"Megatron-Core's overlap of the expert-parallel all-to-alls (the plan's moe_a2a_overlap) "
                           f"needs {why}; it refuses this launch", field="plan.job.moe_a2a_overlap",
                           fix="plan without moe_a2a_overlap, or with EP > 1, virtual stages under PP, selective or "
                               "no recomputation")


def export_megatron(plan: Plan, spec: ModelSpec, virtual_stages: int | None = None) -> Export:
    """Megatron-LM ``pretrain_gpt.py`` arguments, as a torchrun launch script (see module doc).

    Raises:
        HetplanError: per-stage TP/DP/CP/EP/recompute differ, an uneven split beyond first/last stage, uneven
            stages with interleaving, selective recomputation of only some layers, GPipe, an ALiBi model, post-norms
            (Gemma).
    """
    m = _mesh(plan, "Megatron-LM")
    pp = plan.pp
    notes = []
    layers = [st.num_layers for st in plan.stages]
    args = [
        f"--tensor-model-parallel-size {m.tp}", f"--pipeline-model-parallel-size {pp}",
        f"--context-parallel-size {m.cp}",
        f"--num-layers {spec.num_layers}", f"--hidden-size {spec.hidden_size}",
        f"--num-attention-heads {spec.num_attention_heads}", f"--ffn-hidden-size {spec.ffn_hidden_size}",
        f"--seq-length {plan.job.seq_len}", f"--max-position-embeddings {max(spec.max_seq_len, plan.job.seq_len)}",
        f"--micro-batch-size {plan.mbs}", f"--global-batch-size {plan.job.global_batch}",
        f"--train-iters {plan.job.launch_iterations()}", f"--{'bf16' if plan.job.dtype == 'fp8' else plan.job.dtype}",
        "--lr 1e-4", "--optimizer adam", "--mock-data", "--tokenizer-type NullTokenizer",
        f"--vocab-size {spec.vocab_size}",
    ]
    if spec.head_dim * spec.num_attention_heads != spec.hidden_size:
        args.append(f"--kv-channels {spec.head_dim}")
    if m.cp > 1:  # the K/V exchange the estimate priced (hetplan.plan.Job.cp_kv_exchange); Megatron's default is p2p
        if not plan.job.cp_load_balance:  # priced on contiguous chunks: the last CP rank attends to every block
            raise HetplanError("Megatron-LM always splits a sequence into 2 x CP chunks so that every CP rank has the "
                               "same causal attention (get_batch_on_this_cp_rank, megatron/core/utils.py); the plan "
                               "was priced with contiguous chunks", field="plan.job.cp_load_balance",
                               fix="plan with cp_load_balance = true")
        if plan.job.cp_kv_exchange == "allgather":  # Transformer Engine's name (its context_parallel.py)
            args.append("--cp-comm-type all_gather")
    experts = int(getattr(spec, "num_experts", 0) or 0)
    if experts:
        etp = {degree(plan, i, "expert_tp") for i in range(pp)}
        if len(etp) > 1:
            raise HetplanError(f"Megatron-LM runs one expert-TP degree on all stages; the plan has {sorted(etp)}",
                               field="plan.stages[].expert_tp", fix="use one expert-TP degree")
        args += [f"--num-experts {experts}", f"--moe-router-topk {spec.experts_per_token}",
                 f"--moe-ffn-hidden-size {spec.expert_ffn_hidden_size}",
                 f"--expert-model-parallel-size {m.ep}", f"--expert-tensor-parallel-size {etp.pop()}"]
        if getattr(spec, "shared_expert_ffn_hidden_size", 0):
            args.append(f"--moe-shared-expert-intermediate-size {spec.shared_expert_ffn_hidden_size}")
        if spec.num_moe_layers < spec.num_layers:  # dense layers among them (DeepSeek's first k, Llama 4's step)
            pattern = ",".join("1" if spec.is_moe_layer(i) else "0" for i in range(spec.num_layers))
            args.append(f"--moe-layer-freq '[{pattern}]'")
        dispatcher = plan.job.moe_dispatcher  # Megatron-Core's flex dispatcher runs DeepEP / HybridEP
        args += ["--moe-grouped-gemm", "--moe-token-dispatcher-type "
                 + ("alltoall" if dispatcher == "alltoall" else f"flex --moe-flex-dispatcher-backend {dispatcher}")]
        if plan.job.moe_a2a_overlap:  # the 1F1B all-to-all overlap (combined_1f1b)
            _a2a_overlap_check(plan, m, _virtual(plan, virtual_stages) if pp > 1 else 1)
            args.append("--overlap-moe-expert-parallel-comm")
        if plan.job.moe_capacity_factor is not None:  # token dropping (and padding to capacity)
            args.append(f"--moe-expert-capacity-factor {plan.job.moe_capacity_factor:g}")
            if plan.job.moe_pad_to_capacity:
                args.append("--moe-pad-expert-input-to-capacity")
    if spec.is_mla:
        args += ["--multi-latent-attention", f"--kv-lora-rank {spec.kv_lora_rank}",
                 f"--qk-head-dim {spec.head_dim - spec.qk_rope_head_dim}", f"--qk-pos-emb-head-dim {spec.qk_rope_head_dim}",
                 f"--v-head-dim {spec.v_head_dim}"] + ([f"--q-lora-rank {spec.q_lora_rank}"] if spec.q_lora_rank else [])
    v = _virtual(plan, virtual_stages) if pp > 1 else 1
    if v > 1 and plan.pipeline_chunks is not None and v == plan.virtual_stages:  # the plan's own chunks
        args.append(f"--pipeline-model-parallel-layout '{megatron_layout(plan.pipeline_chunks, plan.job.mtp_layers)}'")
        notes.append("interleaved chunks via --pipeline-model-parallel-layout (Megatron-Core >= 0.14)")
    elif v > 1:  # chunks of c units; the embedding / loss may count as a unit (Llama 3's uneven interleaved stages)
        e, loss, c = _interleaved_units(plan, spec, v, "Megatron-LM")
        args += (["--account-for-embedding-in-pipeline-split"] if e else []) + (
            ["--account-for-loss-in-pipeline-split"] if loss else [])
        args.append(f"--num-virtual-stages-per-pipeline-rank {v}" if e or loss
                    else f"--num-layers-per-virtual-pipeline-stage {c}")
    elif pp > 1 and len(set(layers)) > 1 and embedding_loss_split(layers, spec.num_layers, 1):
        # Llama 3's stages: the embedding / loss counted as a layer of an even split. Megatron-Core refuses these
        # flags together with --decoder-first/last-pipeline-num-layers ("Does not support standalone embedding
        # stage and standalone loss stage with uneven pp", transformer_block.get_num_layers_to_build).
        e, loss, _ = embedding_loss_split(layers, spec.num_layers, 1)
        args += (["--account-for-embedding-in-pipeline-split"] if e else []) + (
            ["--account-for-loss-in-pipeline-split"] if loss else [])
    elif pp > 1 and len(set(layers)) > 1:
        mid = layers[1:-1]
        # any other split, or a stage without layers (Megatron-Core's TransformerConfig: "num_layers_in_last_pipeline
        # _stage must be larger than 0", likewise the first): Megatron-Core's layout string, one chunk per stage
        if len(set(mid)) > 1 or 0 in layers:
            args.append(f"--pipeline-model-parallel-layout '{megatron_layout([[n] for n in layers], plan.job.mtp_layers)}'")
            notes.append("uneven middle stages via --pipeline-model-parallel-layout (Megatron-Core >= 0.14)")
        else:
            if not mid or layers[0] != mid[0]:
                args.append(f"--decoder-first-pipeline-num-layers {layers[0]}")
            if not mid or layers[-1] != mid[0]:
                args.append(f"--decoder-last-pipeline-num-layers {layers[-1]}")
            notes.append("uneven split via --decoder-first/last-pipeline-num-layers (Megatron-Core >= 0.10)")
    fp8_zero0 = plan.job.dtype == "fp8" and plan.zero == 0
    if fp8_zero0 and m.dp * m.cp > 1:
        # the estimate prices FP8 parameters (hetplan.estimate.fp8: --fp8-param-gather, no bf16 weight copy); Megatron
        # allows them only with the distributed optimizer or FSDP ('--fp8-param-gather only supported with
        # distributed optimizer, torch fsdp2, megatron fsdp', megatron/training/arguments.py, NVIDIA/Megatron-LM
        # d98e8a64)
        raise HetplanError("Megatron-LM keeps FP8 parameters (--fp8-param-gather, as the estimate priced) only with "
                           "its distributed optimizer or FSDP; this FP8 plan has ZeRO-0 over "
                           f"{m.dp * m.cp} data-parallel ranks", field="plan.zero",
                           fix="plan with zero 1 (the distributed optimizer), or dtype bf16")
    if plan.zero == 1 or fp8_zero0:  # one DP rank: the distributed optimizer is ZeRO-0 (nothing to shard)
        args.append("--use-distributed-optimizer")
    elif plan.zero >= 2:
        strategy = {2: "optim_grads", 3: "optim_grads_params"}[plan.zero]
        args += ["--use-megatron-fsdp", f"--data-parallel-sharding-strategy {strategy}",
                 "--no-gradient-accumulation-fusion", "--use-distributed-optimizer", "--ckpt-format fsdp_dtensor"]
        notes.append(f"ZeRO-{plan.zero} runs as Megatron-FSDP (sharding strategy {strategy}); Megatron's "
                     "distributed optimizer alone is ZeRO-1")
    if plan.sequence_parallel and m.tp > 1:
        args.append("--sequence-parallel")
    if plan.job.dtype == "fp8":
        args += _megatron_fp8_args(plan)
    if plan.overlap_grad_reduce:
        args.append("--overlap-grad-reduce")
    if plan.grad_reduce_dtype == "bf16":  # priced (Plan.grad_reduce_dtype); Megatron's default reduces in fp32
        args.append("--grad-reduce-in-bf16")
    if plan.job.mtp_layers and spec.learned_positions:  # megatron/training/arguments.py asserts rope / none
        raise HetplanError(f"Megatron-LM trains multi-token prediction with rotary or no position embeddings only; "
                           f"{spec.name} learns absolute positions", field="plan.job.mtp_layers",
                           fix="plan with mtp_layers = 0 for this model")
    if plan.job.mtp_layers:  # priced on the last stage (hetplan.plan.Job.mtp_layers)
        args.append(f"--mtp-num-layers {plan.job.mtp_layers}")
    elif spec.mtp_layers:  # the model has MTP modules the job does not train: neither priced nor launched
        notes.append(f"{spec.name}'s {spec.mtp_layers} multi-token-prediction layer(s) are not trained (no "
                     "--mtp-num-layers): the estimate prices the main model; set the job's mtp_layers = "
                     f"{spec.mtp_layers} to price and launch them")
    if plan.tp_comm_overlap and m.tp > 1:  # priced by the estimate (hetplan.plan.Plan.tp_comm_overlap); at TP 1
        # nothing to overlap, and Megatron-LM turns sequence parallelism off there and then asserts it for
        # --tp-comm-overlap (megatron/training/arguments.py, NVIDIA/Megatron-LM d98e8a64): not written
        args.append("--tp-comm-overlap")
    if plan.cuda_graphs and (m.recompute == "full" or (m.recompute == "selective" and spec.dropout)):
        # Megatron-Core's TransformerConfig: "full recompute is only supported with full iteration CUDA graph";
        # "attention dropout is not supported with graphed attention recomputation" (the core_attn module of
        # selective recomputation inside per-layer graphs): megatron/core/transformer/transformer_config.py,
        # NVIDIA/Megatron-LM d98e8a64
        raise HetplanError("Megatron-Core's per-layer CUDA graphs refuse " + (
            "full recomputation" if m.recompute == "full" else
            f"selective recomputation of the attention core with dropout ({spec.name} has dropout)"),
            field="plan.cuda_graphs", fix="plan with cuda_graphs = false, or without that recomputation")
    if plan.cuda_graphs:  # per-layer graphs (frameworks.toml cuda_graphs; --enable-cuda-graph is deprecated)
        args.append("--cuda-graph-impl local")
        if experts:
            # a dropless MoE layer's experts have data-dependent shapes: Megatron-Core captures the "moe" scope for
            # drop-and-pad layers only (megatron/core/transformer/enums.py CudaGraphScope), so the graphs cover
            # attention, the dense MLPs and the router / token preprocessing: partial CUDA graphs
            dense = spec.num_moe_layers < spec.num_layers
            # TransformerConfig (megatron/core/transformer/transformer_config.py, NVIDIA/Megatron-LM d98e8a64): the
            # whole MoE layer ("moe") with drop-and-pad only; the router with preprocess (which the local impl
            # always adds to it) not under token dropping without padding (its device-to-host copies)
            dropping = plan.job.moe_capacity_factor is not None
            # (and not the whole MoE layer with fine-grained activation offloading inside it: asserted too)
            moe = ("moe" if dropping and plan.job.moe_pad_to_capacity and not plan.job.offload_modules else
                   "" if dropping and plan.job.moe_dispatcher == "alltoall" else "moe_router moe_preprocess")
            args.append("--cuda-graph-modules " + " ".join(x for x in ("attn", "mlp" if dense else "", moe) if x))
            if moe != "moe":
                notes.append("CUDA graphs capture attention, dense MLPs" + (" and the MoE router / preprocessing"
                             if moe else "") + "; the experts run eagerly (" + ("dropless routing" if not dropping
                             else "token dropping without padding") + "), while the estimate prices every kernel of "
                             "the layer as captured")
    if plan.job.attention == "flash" and plan.job.attention_kernel is not None:
        # the kernel the estimate priced (issue 27: the export dropped it), as Megatron-Core's AttnBackend
        # (megatron/core/transformer/enums.py): "flash" = Transformer Engine's FlashAttention (flash-attn 2, or 3
        # where installed on Hopper), "fused" = TE's cuDNN fused attention
        args.append("--attention-backend " + ("fused" if plan.job.attention_kernel == "cudnn" else "flash"))
    elif plan.job.attention == "flash":  # the estimate assumed FlashAttention (hetplan.plan.Job.attention)
        args.append("--use-flash-attn")
    else:  # s x s scores stored: Megatron-Core's unfused attention (its default backend, auto, fuses)
        args.append("--attention-backend unfused")
    if plan.cross_entropy != "fp32":  # the estimate charged the fused loss (hetplan.plan.Plan.cross_entropy)
        args.append("--cross-entropy-loss-fusion")
    if m.recompute == "full":
        if m.recompute_layers is None:  # every layer checkpointed on its own
            args += ["--recompute-granularity full", "--recompute-method uniform", "--recompute-num-layers 1"]
        else:  # the first k layers of every stage (megatron/core/transformer/transformer_block.py, "block")
            args += ["--recompute-granularity full", "--recompute-method block",
                     f"--recompute-num-layers {m.recompute_layers}"]
    elif m.recompute == "selective":
        if m.recompute_layers is not None:
            raise HetplanError("Megatron-LM's selective recomputation applies to every layer",
                               field="plan.stages[].recompute_layers",
                               fix="recompute all layers selectively, or use full recomputation of k layers")
        args.append("--recompute-granularity selective")
    # per-module recomputation (the MoE layer checkpointed on its own, output-discarding element-wise modules);
    # under full recomputation the whole layer is recomputed instead
    asked = (["moe"] if experts and plan.job.moe_recompute else []) + list(plan.job.recompute_modules)
    if asked and m.recompute == "full" and m.recompute_layers is not None:
        # Megatron-LM's --recompute-granularity is one: full of the first k layers (block) leaves the others without
        # the per-module recomputation the estimate priced for them
        raise HetplanError(f"Megatron-LM recomputes either whole layers (here the first {m.recompute_layers} of each "
                           f"stage) or modules ({', '.join(asked)}), not both; the plan was priced with both",
                           field="plan.job.recompute_modules", fix="recompute all layers, or drop the modules "
                           "(recompute_modules / moe_recompute)")
    modules = asked if m.recompute != "full" else []
    if modules and "--fp8-recipe delayed" in args and {"moe_act", "layernorm"} & set(modules):
        # TransformerConfig: "Delayed scaling does not support moe_act and layernorm recompute for fp8"
        # (megatron/core/transformer/transformer_config.py, NVIDIA/Megatron-LM d98e8a64)
        raise HetplanError("Megatron-Core refuses recomputing moe_act / layernorm under FP8 delayed scaling (the "
                           "recipe this plan's GPUs run)", field="plan.job.recompute_modules",
                           fix='plan with fp8_recipe = "current", or without moe_act / layernorm in recompute_modules')
    if modules:
        if m.recompute != "selective":
            args.append("--recompute-granularity selective")
        args.append("--recompute-modules " + " ".join((["core_attn"] if m.recompute == "selective" else []) + modules))
    if plan.job.offload_modules and "moe" in modules:  # both act inside the MoE layer
        raise HetplanError("Megatron-Core refuses offloading activations inside a MoE layer it recomputes whole "
                           "('Cannot offload ... while recomputing the entire MoE layer', megatron/core/transformer/"
                           "transformer_config.py)", field="plan.job.offload_modules",
                           fix="plan without offload_modules, or with moe_recompute = false")
    if plan.job.offload_modules:
        args += ["--fine-grained-activation-offloading", "--offload-modules " + " ".join(plan.job.offload_modules)]
    if spec.alibi:  # a launch with rotary or learned positions would train another model
        raise HetplanError(f"Megatron-LM has no ALiBi position embedding (--position-embedding-type: learned_absolute, "
                           f"rope, yarn, mrope, relative, none); {spec.name} uses ALiBi", field="--to",
                           fix="hetplan has no Megatron-DeepSpeed exporter (BLOOM trained with its "
                               "--position-embedding-type alibi): pin --tp 1 and export --to deepspeed, or plan a "
                               "model with rotary or learned positions")
    if spec.post_norms:  # a launch without them would train another model
        raise HetplanError(f"{spec.name} normalises the attention and MLP outputs too (Gemma's post-attention / "
                           "post-MLP norms), which pretrain_gpt.py's GPT layer has no argument for", field="--to",
                           fix="export --to deepspeed, or plan a model with two norms per layer")
    if spec.family in LLAMA_BLOCK_FAMILIES or (experts and spec.gated_mlp):
        args += ["--swiglu", "--normalization RMSNorm", "--position-embedding-type rope", "--disable-bias-linear"]
    elif spec.learned_positions == 0:
        args.append("--position-embedding-type rope")
    if spec.qkv_bias:  # Qwen2's Q, K, V biases (TransformerConfig.add_qkv_bias; the output projection has none)
        args.append("--add-qkv-bias")
    if spec.qk_norm:  # Qwen3's per-head Q/K norms (TransformerConfig.qk_layernorm, of the model's --normalization)
        args.append("--qk-layernorm")
    if spec.num_kv_heads != spec.num_attention_heads:
        args += ["--group-query-attention", f"--num-query-groups {spec.num_kv_heads}"]
    if not spec.tied_embeddings:
        args.append("--untie-embeddings-and-output-weights")
    if spec.dropout:
        args += ["--attention-dropout 0.1", "--hidden-dropout 0.1"]
    else:
        args += ["--attention-dropout 0.0", "--hidden-dropout 0.0"]
    nnodes, per_node = _nodes(plan)
    env = (["unset CUDA_DEVICE_MAX_CONNECTIONS  # Megatron-FSDP asserts it is unset or > 1 "
            "(megatron/training/arguments.py)"] if plan.zero >= 2 else
           ["export CUDA_DEVICE_MAX_CONNECTIONS=1  # Megatron-LM: keeps TP/SP communication ordered before compute"])
    if plan.job.offload_modules:  # megatron/training/arguments.py asserts it under Transformer Engine >= 2.10
        env.append("export NVTE_CPU_OFFLOAD_V1=1  # fine-grained activation offloading: activations only, no weights")
    script = "\n".join([
        "#!/usr/bin/env bash",
        (f"# Megatron-LM launch for plan: {pp} stages {layers} layers, TP {m.tp}, CP {m.cp}, DP {m.dp}, "
         f"mbs {plan.mbs}, gbs {plan.job.global_batch} ({plan.num_microbatches(0)} micro-batches), model {spec.name}. "
         "Generated by hetplan export."),
        "# Run on every node; set NODE_RANK and MASTER_ADDR. Ranks: TP innermost, then CP, DP, PP (Megatron order).",
        f"# hetplan model: {plan.job.model}",
        *env,
        f"torchrun --nnodes {nnodes} --nproc-per-node {per_node} --node-rank ${{NODE_RANK:-0}} \\",
        "  --master-addr ${MASTER_ADDR:-127.0.0.1} --master-port ${MASTER_PORT:-6000} \\",
        "  pretrain_gpt.py \\",
        "  " + " \\\n  ".join(args),
        "",
    ])
    if spec.family == "opt":
        notes.append("OPT's ReLU MLP and position offset are approximated by Megatron's GPT (GeLU) model")
    if spec.sliding_window_layers and spec.sliding_window < plan.job.seq_len:
        # Megatron-LM has --window-size / --window-attn-skip-freq, but the spec keeps how many layers have a window,
        # not which, and HF and TE count the window's edge differently: the launch attends every key
        notes.append(f"{spec.name}'s {spec.sliding_window}-token window on {spec.sliding_window_layers} of "
                     f"{spec.num_layers} layers is not written (no --window-size): Megatron-LM attends all "
                     f"{plan.job.seq_len} keys there, which costs more than hetplan priced")
    mixed = _pools_note(plan, per_node)
    if mixed:
        notes.append(mixed)
    return Export("megatron", {"megatron_launch.sh": script}, notes)


def _megatron_fp8_args(plan: Plan) -> list[str]:
    """Megatron-Core's FP8 arguments for the recipe the estimate assumed (:func:`hetplan.estimate.fp8.recipe`):
    NeMo / Megatron-Bridge's ``bf16_with_fp8_mixed`` on Hopper (``hybrid`` E4M3/E5M2, delayed scaling over a
    1,024-step amax history, max of the history, FP8 parameters), ``bf16_with_mxfp8_mixed`` on Blackwell;
    ``Job.fp8_recipe = "current"``: ``--fp8-recipe tensorwise`` (TE ``Float8CurrentScaling``,
    ``megatron/core/fp8_utils.py``).

    Raises:
        HetplanError: stages on GPU generations with different FP8 recipes (one ``--fp8-recipe`` per job).
    """
    from hetplan.estimate import fp8
    from hetplan.hardware.catalog import load_catalog

    catalog = load_catalog()
    recipes = {fp8.recipe(catalog.get(plan.pools[st.pool].gpu), "megatron", plan.job.fp8_recipe) for st in plan.stages}
    if len(recipes) > 1:
        raise HetplanError(f"Megatron-LM runs one FP8 recipe per job; this plan's GPUs need {sorted(recipes)}",
                           field="plan.job.dtype", fix="plan with dtype bf16, or on one GPU generation")
    name = recipes.pop()
    if name == "mxfp8":
        return ["--fp8-format e4m3", "--fp8-recipe mxfp8", "--fp8-param-gather"]
    if name == "current":  # Megatron-Core's Fp8Recipe.tensorwise is TE's Float8CurrentScaling
        return ["--fp8-format hybrid", "--fp8-recipe tensorwise", "--fp8-param-gather"]
    return ["--fp8-format hybrid", "--fp8-recipe delayed", "--fp8-amax-history-len 1024",
            "--fp8-amax-compute-algo max", "--fp8-param-gather"]
