"""Hand a plan to a training framework: the launch arguments / config files Megatron-LM, DeepSpeed and torchtitan
accept, reproducing the plan exactly — or a :class:`~hetplan.errors.HetplanError` that says what the framework
cannot express and why. No torch.

Every export carries the plan's micro-batch size, global batch and so its gradient accumulation (micro-batches
per pipeline), the per-stage layer split, virtual stages, recomputation, the ZeRO / FSDP mode, the TP / PP / DP /
CP / EP degrees and the NCCL environment of the network. ``tests/runtime/test_export_roundtrip.py`` parses each
export back and compares it with the plan.

What each target can express:

* **Megatron-LM** (``pretrain_gpt.py`` arguments, Megatron-Core): one TP / CP / EP / DP degree on all stages (one
  device mesh, ranks ordered TP, CP, DP, PP as in ``megatron/core/parallel_state.py``) — stages may sit on
  different GPU types; uneven pipelines only as "first and/or last stage differ, the middle stages equal"
  (``--decoder-first-pipeline-num-layers`` / ``--decoder-last-pipeline-num-layers``, or, when the first / last
  stage holds one layer less for the embedding / loss, ``--account-for-embedding/loss-in-pipeline-split``; never
  both, which Megatron-Core refuses); ZeRO-1 =
  ``--use-distributed-optimizer`` (optimizer states and fp32 main weights sharded over DP); ZeRO-2 / ZeRO-3 =
  Megatron-FSDP (``--use-megatron-fsdp --data-parallel-sharding-strategy optim_grads`` /
  ``optim_grads_params``, flags of Megatron-Core's Megatron-FSDP README); full recomputation of the first k layers
  of every stage = ``--recompute-method block --recompute-num-layers k``; no GPipe (Megatron runs 1F1B).
* **DeepSpeed** (``ds_config.json`` + ``PipelineModule`` arguments): no tensor, context or expert parallelism in
  ``PipelineModule`` (use the Megatron export: Megatron-DeepSpeed takes the same arguments); per-stage layer
  counts through a ``PipelineModule`` subclass whose ``_partition_layers`` sets the plan's boundaries
  (``hetplan_pipeline.py``; DeepSpeed's ``partition_method`` offers only ``uniform``, ``parameters`` and
  ``type:regex``, Espresso patched the same method); pipeline parallelism with ZeRO-2 / ZeRO-3 is refused by
  DeepSpeed itself; no selective recomputation (with FlashAttention the plan's selective = none, so it exports).
* **torchtitan** (TOML job config of ``torchtitan/config/job_config.py``, late-2025 schema): any per-stage layer
  split and virtual stages through ``module_fqns_per_model_part``; one TP / DP / CP / EP degree on all stages;
  DDP for ZeRO-0 (``data_parallel_replicate_degree``), FSDP2 for ZeRO-3 (``data_parallel_shard_degree``), FSDP2
  without resharding after forward for ZeRO-2 (``fsdp_reshard_after_forward = "never"``: parameters stay
  gathered from forward to backward, gradients and optimizer states sharded) and for ZeRO-1, which torchtitan
  lacks (gradients then also sharded: less memory than planned, the same communication volume); Llama-family
  models only (Llama 3 flavors ``8B`` / ``70B`` / ``405B`` by name, any other Llama shape registered as a flavor
  by ``hetplan_torchtitan_model.py``, imported through ``[experimental] custom_import``); bf16 or fp32 parameters
  (no fp16 mixed precision) over fp32 sharded master weights (a plan with ``fsdp_param_dtype`` or
  ``cross_entropy = "bf16"``, NeMo AutoModel's, is refused); the job's ``torch_compile`` as ``[compile] enable`` with ``components = ["model",
  "loss"]`` (``CompileConfig``, torchtitan ``torchtitan/config/job_config.py``; eager: ``enable = false``); the
  job's ``async_tp`` as ``[parallelism] enable_async_tensor_parallel = true``.

FP8 plans (``dtype = "fp8"``, :mod:`hetplan.estimate.fp8`): Megatron-LM gets ``--bf16`` plus the FP8 recipe the
estimate assumed (``--fp8-format hybrid --fp8-recipe delayed --fp8-amax-history-len 1024 --fp8-amax-compute-algo
max --fp8-param-gather`` on Hopper, ``--fp8-format e4m3 --fp8-recipe mxfp8 --fp8-param-gather`` on Blackwell);
torchtitan the float8 converter (``[model] converters = ["float8"]``, ``[float8]`` with the FSDP2 float8
all-gather, the output head filtered out; the float8 casts are fused only under ``[compile] enable``, torchtitan
``docs/float8.md``, which the job's default ``torch_compile`` sets); DeepSpeed refuses (no FP8 in its config).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from hetplan.errors import HetplanError
from hetplan.hardware.stacks import default_stack
from hetplan.model.spec import ModelSpec
from hetplan.plan import Plan
from hetplan.plan_rules import check_plan, degree, embedding_loss_split, launch_violations

TARGETS = ("megatron", "deepspeed", "torchtitan")
#: the framework releases each target writes for, the default first (``hetplan export --framework-version``):
#: Megatron-LM's arguments of 2026-08-22 (:mod:`hetplan.runtime.argspec`), DeepSpeed 0.19's config, torchtitan
#: 0.3.x (``--module/--config`` + overrides) or 0.2.x (TOML job config, ``--job.config_file``).
VERSIONS: dict[str, tuple[str, ...]] = {"megatron": ("2026-08-22",), "deepspeed": ("0.19",),
                                        "torchtitan": ("0.3", "0.2")}


def release(target: str, version: str | None) -> str:
    """The release of ``target`` an export writes for: ``version`` (``0.3.0`` matches ``0.3``) or the default.

    Raises:
        HetplanError: a release the target's export does not write.
    """
    known = VERSIONS[target]
    if version is None or not version.strip():
        return known[0]
    v = version.strip().lstrip("v")
    for k in known:
        if v == k or v.startswith(k + "."):
            return k
    raise HetplanError(f"hetplan exports {target} for releases {', '.join(known)}, not {version!r}",
                       field="--framework-version", fix=f"use one of {', '.join(known)} (or leave it out)")
#: The framework family (``Job.framework``) each target launches; its default stack is what the export writes
#: (:func:`hetplan.hardware.stacks.default_stack`).
TARGET_FRAMEWORK = {"megatron": "megatron", "deepspeed": "deepspeed", "torchtitan": "fsdp"}
#: torchtitan's Llama 3 flavors (``torchtitan/models/llama3/__init__.py``, ``llama3_args``) by hetplan preset.
TORCHTITAN_FLAVORS = {"llama3-8b": "8B", "llama3-70b": "70B", "llama3-405b": "405B"}


@dataclass
class Export:
    """An export: ``files`` (name -> text) and ``notes`` (what was approximated, one sentence each)."""

    target: str
    files: dict[str, str]
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class _Mesh:
    """The one set of degrees a framework runs on all stages, and the one recomputation setting."""

    tp: int
    dp: int
    cp: int
    ep: int
    recompute: str
    recompute_layers: int | None  # layers per stage recomputed; None = all


def _mesh(plan: Plan, what: str) -> _Mesh:
    """The plan's degrees if every stage has the same ones (else the error says what differs and why no
    framework runs it)."""
    per = {(st.tp, st.dp, degree(plan, i, "cp"), degree(plan, i, "ep")) for i, st in enumerate(plan.stages)}
    if len(per) > 1:
        shown = ", ".join(f"stage {i}: TP {st.tp} DP {st.dp}" for i, st in enumerate(plan.stages))
        raise HetplanError(
            f"{what} builds one device mesh, so every pipeline stage has the same TP, DP, CP and EP degree; this "
            f"heterogeneous plan has {shown}. Megatron-LM, DeepSpeed, torchtitan and `hetplan run` all send "
            "activations between matching data-parallel replicas of one mesh, so none runs it",
            field="plan.stages[].tp/dp",
            fix="plan again with one TP and DP for all stages (hetplan plan --tp T --dp D, or --no-hetero); "
                "stages may still differ in GPU type and layer count")
    # (mode, layers recomputed when not all of the stage's, else None) per stage
    recs = {(st.recompute, None if st.recompute == "none" or st.recomputed_layers() == st.num_layers
             else st.recomputed_layers()) for st in plan.stages}
    if len({r[0] for r in recs}) > 1:
        raise HetplanError(f"{what} applies one activation-recomputation mode to all stages; the plan has "
                           f"{sorted({r[0] for r in recs})}", field="plan.stages[].recompute",
                           fix="use one recompute mode")
    if len(recs) > 1:
        raise HetplanError(f"{what} recomputes the same number of layers on every stage; the plan recomputes "
                           f"{[st.recomputed_layers() for st in plan.stages]}", field="plan.stages[].recompute_layers",
                           fix="recompute all layers, or the same number on every stage")
    mode, k = recs.pop()
    tp, dp, cp, ep = per.pop()
    return _Mesh(tp, dp, cp, ep, mode, k)


def _nodes(plan: Plan) -> tuple[int, int]:
    per_node = min(plan.pools[st.pool].gpus_per_node for st in plan.stages)
    n = sum(st.tp * degree(plan, i, "cp") * st.dp for i, st in enumerate(plan.stages))
    return (max(1, -(-n // per_node)), min(n, per_node))


def _virtual(plan: Plan, virtual_stages: int | None) -> int:
    return virtual_stages if virtual_stages is not None else plan.virtual_stages


def _interleaved_units(plan: Plan, spec: ModelSpec, v: int, what: str) -> tuple[int, int, int]:
    """``(e, l, c)`` of an interleaved plan: the embedding (``e`` = 1) and the loss (``l`` = 1) counted as a layer
    of the split (Megatron-Core ``--account-for-embedding/loss-in-pipeline-split``), and ``c`` units per model
    chunk: stage i holds ``v * c`` units, the first ``e`` and the last ``l`` fewer layers.

    Raises:
        HetplanError: the stages fit no such split.
    """
    layers, pp = [st.num_layers for st in plan.stages], plan.pp
    split = embedding_loss_split(layers, spec.num_layers, v)
    if split is not None:
        return split
    raise HetplanError(f"{what}'s interleaved schedule splits the layers (plus, optionally, the embedding and the "
                       f"loss) into {pp} x {v} equal chunks; this plan's stages hold {layers}",
                       field="plan.virtual_stages", fix="use a balanced split or virtual_stages = 1")


def megatron_layout(chunks: list[list[int]]) -> str:
    """Megatron-Core's ``--pipeline-model-parallel-layout`` for ``chunks[stage][virtual stage]`` decoder layers:
    one ``|``-separated segment per model chunk in model order (virtual stage 0 of every pipeline rank, then
    virtual stage 1, ...), ``t`` a decoder layer, ``E`` the embedding at the start of the first, ``L`` the loss at
    the end of the last; runs of equal segments written ``(t*k|)*n``
    (``megatron/core/transformer/pipeline_parallel_layer_layout.py``, ``parse_str_to_list``)."""
    pp, v = len(chunks), len(chunks[0])
    counts = [chunks[s][k] for k in range(v) for s in range(pp)]
    segs = [("t" if n == 1 else f"t*{n}" if n else "") for n in counts]
    segs[0], segs[-1] = "E" + segs[0], segs[-1] + "L"
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


def _pools_note(plan: Plan, nproc: int) -> str | None:
    """Which node ranks each stage's pool must supply, when stages sit on different GPU types (ranks are
    pipeline-outermost in all three frameworks, so stage i holds ranks [i*n, (i+1)*n) for n GPUs per stage)."""
    if len({plan.pools[st.pool].gpu for st in plan.stages}) < 2:
        return None
    parts, rank = [], 0
    for i, st in enumerate(plan.stages):
        size = st.tp * degree(plan, i, "cp") * st.dp
        parts.append(f"stage {i} on {plan.pools[st.pool].gpu}: node ranks {rank // nproc}-{(rank + size - 1) // nproc}")
        rank += size
    return "mixed GPU types: start the nodes so that " + "; ".join(parts)


def export_megatron(plan: Plan, spec: ModelSpec, virtual_stages: int | None = None) -> Export:
    """Megatron-LM ``pretrain_gpt.py`` arguments, as a torchrun launch script (see module doc).

    Raises:
        HetplanError: per-stage TP/DP/CP/EP/recompute differ, an uneven split beyond first/last stage, uneven
            stages with interleaving, selective recomputation of only some layers, GPipe.
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
        f"--train-iters {int(plan.job.iterations())}", f"--{'bf16' if plan.job.dtype == 'fp8' else plan.job.dtype}",
        "--lr 1e-4", "--optimizer adam", "--mock-data", "--tokenizer-type NullTokenizer",
        f"--vocab-size {spec.vocab_size}",
    ]
    if spec.head_dim * spec.num_attention_heads != spec.hidden_size:
        args.append(f"--kv-channels {spec.head_dim}")
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
            args.append("--overlap-moe-expert-parallel-comm")
    if spec.is_mla:
        args += ["--multi-latent-attention", f"--kv-lora-rank {spec.kv_lora_rank}",
                 f"--qk-head-dim {spec.head_dim - spec.qk_rope_head_dim}", f"--qk-pos-emb-head-dim {spec.qk_rope_head_dim}",
                 f"--v-head-dim {spec.v_head_dim}"] + ([f"--q-lora-rank {spec.q_lora_rank}"] if spec.q_lora_rank else [])
    v = _virtual(plan, virtual_stages) if pp > 1 else 1
    if v > 1 and plan.pipeline_chunks is not None and v == plan.virtual_stages:  # the plan's own chunks
        args.append(f"--pipeline-model-parallel-layout '{megatron_layout(plan.pipeline_chunks)}'")
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
        if len(set(mid)) > 1:  # any other split: Megatron-Core's layout string, one chunk per stage
            args.append(f"--pipeline-model-parallel-layout '{megatron_layout([[n] for n in layers])}'")
            notes.append("uneven middle stages via --pipeline-model-parallel-layout (Megatron-Core >= 0.14)")
        else:
            if not mid or layers[0] != mid[0]:
                args.append(f"--decoder-first-pipeline-num-layers {layers[0]}")
            if not mid or layers[-1] != mid[0]:
                args.append(f"--decoder-last-pipeline-num-layers {layers[-1]}")
            notes.append("uneven split via --decoder-first/last-pipeline-num-layers (Megatron-Core >= 0.10)")
    if plan.zero == 1:
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
    if plan.job.attention == "flash":  # the estimate assumed FlashAttention (hetplan.plan.Job.attention)
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
    modules = ((["moe"] if experts and plan.job.moe_recompute else []) + list(plan.job.recompute_modules)
               if m.recompute != "full" else [])
    if modules:
        if m.recompute != "selective":
            args.append("--recompute-granularity selective")
        args.append("--recompute-modules " + " ".join((["core_attn"] if m.recompute == "selective" else []) + modules))
    if plan.job.offload_modules:
        args += ["--fine-grained-activation-offloading", "--offload-modules " + " ".join(plan.job.offload_modules)]
    if spec.family in ("llama", "mistral") or (experts and spec.gated_mlp):
        args += ["--swiglu", "--normalization RMSNorm", "--position-embedding-type rope", "--disable-bias-linear"]
    elif spec.learned_positions == 0:
        args.append("--position-embedding-type rope")
    if spec.num_kv_heads != spec.num_attention_heads:
        args += ["--group-query-attention", f"--num-query-groups {spec.num_kv_heads}"]
    if not spec.tied_embeddings:
        args.append("--untie-embeddings-and-output-weights")
    if spec.dropout:
        args += ["--attention-dropout 0.1", "--hidden-dropout 0.1"]
    else:
        args += ["--attention-dropout 0.0", "--hidden-dropout 0.0"]
    nnodes, per_node = _nodes(plan)
    env = ["export CUDA_DEVICE_MAX_CONNECTIONS=1  # Megatron-LM: keeps TP/SP communication ordered before compute"]
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
    mixed = _pools_note(plan, per_node)
    if mixed:
        notes.append(mixed)
    return Export("megatron", {"megatron_launch.sh": script}, notes)


def _megatron_fp8_args(plan: Plan) -> list[str]:
    """Megatron-Core's FP8 arguments for the recipe the estimate assumed (:func:`hetplan.estimate.fp8.recipe`):
    NeMo / Megatron-Bridge's ``bf16_with_fp8_mixed`` on Hopper (``hybrid`` E4M3/E5M2, delayed scaling over a
    1,024-step amax history, max of the history, FP8 parameters), ``bf16_with_mxfp8_mixed`` on Blackwell.

    Raises:
        HetplanError: stages on GPU generations with different FP8 recipes (one ``--fp8-recipe`` per job).
    """
    from hetplan.estimate import fp8
    from hetplan.hardware.catalog import load_catalog

    catalog = load_catalog()
    recipes = {fp8.recipe(catalog.get(plan.pools[st.pool].gpu), "megatron") for st in plan.stages}
    if len(recipes) > 1:
        raise HetplanError(f"Megatron-LM runs one FP8 recipe per job; this plan's GPUs need {sorted(recipes)}",
                           field="plan.job.dtype", fix="plan with dtype bf16, or on one GPU generation")
    if recipes.pop() == "mxfp8":
        return ["--fp8-format e4m3", "--fp8-recipe mxfp8", "--fp8-param-gather"]
    return ["--fp8-format hybrid", "--fp8-recipe delayed", "--fp8-amax-history-len 1024",
            "--fp8-amax-compute-algo max", "--fp8-param-gather"]


def export_deepspeed(plan: Plan, spec: ModelSpec) -> Export:
    """DeepSpeed ``ds_config.json``, the ``PipelineModule`` arguments and, for an uneven split, a
    ``PipelineModule`` subclass that takes the plan's boundaries (see module doc).

    Raises:
        HetplanError: TP, CP or EP > 1, per-stage DP differences, ZeRO-2/3 with pipeline parallelism, selective
            or partial recomputation, interleaving.
    """
    m = _mesh(plan, "DeepSpeed")
    pp = plan.pp
    notes = []
    rec = m.recompute
    if rec == "selective":
        if plan.job.attention != "flash":
            raise HetplanError("DeepSpeed has no selective recomputation", field="plan.stages[].recompute",
                               fix="use recompute none or full, or export --to megatron / torchtitan")
        rec = "none"
        notes.append("selective recomputation under FlashAttention stores what none does: exported as none")
    if rec == "full" and m.recompute_layers is not None:
        raise HetplanError("DeepSpeed checkpoints every layer of a stage or none", field="plan.stages[].recompute_layers",
                           fix="recompute all layers, or export --to megatron (recompute-method block)")
    layers = [st.num_layers for st in plan.stages]
    nmb = plan.num_microbatches(0)
    cfg = {
        "train_batch_size": plan.job.global_batch,
        "train_micro_batch_size_per_gpu": plan.mbs,
        "gradient_accumulation_steps": nmb,
        "bf16": {"enabled": plan.job.dtype == "bf16"},
        "fp16": {"enabled": plan.job.dtype == "fp16"},
        "zero_optimization": {"stage": plan.zero, "overlap_comm": plan.overlap_grad_reduce},
        "optimizer": {"type": "Adam", "params": {"lr": 1e-4}},
        "steps_per_print": 1,
    }
    if rec == "full":
        cfg["activation_checkpointing"] = {"partition_activations": False, "contiguous_memory_optimization": False}
    # PipelineModule layer specs: [embedding, layer 0 .. layer L-1, final norm + head]; stage i's boundaries
    parts = [0, layers[0] + 1]
    for n in layers[1:]:
        parts.append(parts[-1] + n)
    parts[-1] += 1
    uneven = pp > 1 and layers != balanced_split_ds(spec.num_layers, pp)
    pipe = {"num_stages": pp, "partition_method": "hetplan" if uneven else "uniform",
            "activation_checkpoint_interval": 1 if rec == "full" else 0, "world_size": plan.num_gpus,
            "data_parallel_size": m.dp, "stage_layers": layers, "parts": parts, "model": spec.name,
            "seq_len": plan.job.seq_len}
    nnodes, per_node = _nodes(plan)
    launch = (f"deepspeed --num_nodes {nnodes} --num_gpus {per_node} train.py --deepspeed "
              f"--deepspeed_config ds_config.json --pipeline-parallel-size {pp}\n")
    files = {"ds_config.json": json.dumps(cfg, indent=2) + "\n",
             "pipeline_module.json": json.dumps(pipe, indent=2) + "\n", "launch.sh": launch}
    if uneven:
        files["hetplan_pipeline.py"] = _DS_PARTITION.format(parts=parts, layers=layers)
        notes.append(f"uneven split {layers}: build the model with hetplan_pipeline.HetplanPipelineModule "
                     f"(layer-spec boundaries {parts}, embedding and head included)")
    mixed = _pools_note(plan, per_node)
    if mixed:
        notes.append(mixed)
    return Export("deepspeed", files, notes)


_DS_PARTITION = '''"""DeepSpeed PipelineModule with hetplan's per-stage layer counts {layers} (generated by hetplan export).

DeepSpeed's partition_method offers uniform, parameters and type:regex; this subclass sets the boundaries of the
layer specs [embedding, transformer layers..., final norm + head] itself, as DeepSpeed's own
PipelineModule._partition_layers does after computing them (deepspeed/runtime/pipe/module.py).
"""

from deepspeed.pipe import PipelineModule

PARTS = {parts}


class HetplanPipelineModule(PipelineModule):
    def _partition_layers(self, method="uniform"):
        stage_id = self._topo.get_coord(self.global_rank).pipe
        self.parts = list(PARTS)
        self._set_bounds(start=self.parts[stage_id], stop=self.parts[stage_id + 1])
'''


def balanced_split_ds(num_layers: int, pp: int) -> list[int]:
    """DeepSpeed's ``uniform`` partition of ``num_layers`` layers (``ds_utils.partition_uniform``): the first
    ``num_layers % pp`` stages get one more layer."""
    q, r = divmod(num_layers, pp)
    return [q + (1 if i < r else 0) for i in range(pp)]


def _torchtitan_parts(plan: Plan, spec: ModelSpec, v: int, head: str = "output") -> list[list[str]]:
    """``module_fqns_per_model_part``: the plan's stages (or, interleaved, pp x v chunks in model order — chunk k
    runs on pipeline rank k % pp — of equal units, the embedding and the loss counting as one where the plan's
    split does, :func:`_interleaved_units`), the embedding with the first part, the final norm and head with the
    last."""
    if v > 1 and plan.pipeline_chunks is not None and v == plan.virtual_stages:  # model part k on rank k % pp
        counts = [plan.pipeline_chunks[k % plan.pp][k // plan.pp] for k in range(plan.pp * v)]
    elif v > 1:
        e, loss, c = _interleaved_units(plan, spec, v, "torchtitan")
        counts = [c] * (plan.pp * v)
        counts[0] -= e
        counts[-1] -= loss
    else:
        counts = [st.num_layers for st in plan.stages]
    parts, start = [], 0
    for n in counts:
        parts.append([f"layers.{i}" for i in range(start, start + n)])
        start += n
    parts[0].insert(0, "tok_embeddings")
    parts[-1] += ["norm", head]  # the output head: "output" before 0.3, "lm_head" in 0.3
    return parts


_TT_MODEL = '''"""Registers torchtitan flavor {flavor!r} with hetplan's model shapes (generated by hetplan export).

torchtitan's FeedForward width is multiple_of * ceil(int(ffn_dim_multiplier * int(8 * dim / 3)) / multiple_of);
with multiple_of = {ffn} and this multiplier it is exactly {ffn}.
"""

from torchtitan.models.llama3 import TransformerModelArgs, llama3_args

llama3_args[{flavor!r}] = TransformerModelArgs(
    dim={dim}, n_layers={layers}, n_heads={heads}, n_kv_heads={kv}, vocab_size={vocab},
    multiple_of={ffn}, ffn_dim_multiplier={mult!r}, max_seq_len={seq},
)
'''


def export_torchtitan(plan: Plan, spec: ModelSpec, virtual_stages: int | None = None,
                      version: str | None = None) -> Export:
    """torchtitan's launch for ``version`` (:data:`VERSIONS`): 0.3.x's ``--module/--config`` with overrides
    (:func:`export_torchtitan_03`), or 0.2.x's TOML job config (see module doc) plus a flavor-registering module
    for Llama shapes that torchtitan does not ship.

    Raises:
        HetplanError: per-stage TP/DP/CP/EP/recompute differ, a model that is not Llama-shaped, fp16, partial
            recomputation, bf16 resident parameters or loss (``Plan.fsdp_param_dtype``, ``Plan.cross_entropy``).
    """
    version = release("torchtitan", version)
    m = _mesh(plan, "torchtitan")
    pp = plan.pp
    notes = []
    shipped = version == "0.3" and spec.name in TORCHTITAN_03_MODELS
    if not shipped and not (spec.gated_mlp and spec.norm == "rmsnorm" and not spec.linear_bias
                            and spec.learned_positions == 0):
        raise HetplanError(f"torchtitan {version} trains Llama-shaped models (SwiGLU, RMSNorm, rotary, no biases) "
                           f"and, from 0.3, the models it ships ({', '.join(TORCHTITAN_03_MODELS)}); {spec.name} is "
                           f"{spec.family}", field="--to", fix="export --to megatron or deepspeed")
    _torchtitan_common_checks(plan, m)
    if version == "0.3":
        return export_torchtitan_03(plan, spec, m, v=_virtual(plan, virtual_stages) if pp > 1 else 1)
    if int(getattr(spec, "num_experts", 0) or 0):
        raise HetplanError(f"{spec.name} is a mixture of experts; torchtitan 0.2's TOML export covers dense Llama "
                           "shapes only", field="--framework-version", fix="export with --framework-version 0.3")
    v = _virtual(plan, virtual_stages)
    v = v if pp > 1 else 1
    sched = {"1f1b": "Interleaved1F1B" if v > 1 else "1F1B", "gpipe": "GPipe"}[plan.schedule]
    if plan.zero == 0:
        dp_lines = [f"data_parallel_replicate_degree = {m.dp}", "data_parallel_shard_degree = 1"]
    else:
        reshard = "default" if plan.zero == 3 else "never"
        dp_lines = ["data_parallel_replicate_degree = 1", f"data_parallel_shard_degree = {m.dp}",
                    f'fsdp_reshard_after_forward = "{reshard}"']
        if plan.zero == 1:
            notes.append("ZeRO-1 has no torchtitan mode: exported as FSDP2 without resharding after forward "
                         "(ZeRO-2: gradients sharded too, less memory than planned, same communication volume)")
    files = {}
    flavor = TORCHTITAN_FLAVORS.get(spec.name)
    extra = []
    if flavor is None:
        flavor = f"hetplan-{spec.name}"
        base = int(2 * 4 * spec.hidden_size / 3)
        files["hetplan_torchtitan_model.py"] = _TT_MODEL.format(
            flavor=flavor, dim=spec.hidden_size, layers=spec.num_layers, heads=spec.num_attention_heads,
            kv=spec.num_kv_heads, vocab=spec.vocab_size, ffn=spec.ffn_hidden_size,
            mult=spec.ffn_hidden_size / base, seq=max(spec.max_seq_len, plan.job.seq_len))
        extra = ["[experimental]", 'custom_import = "hetplan_torchtitan_model"', ""]
        notes.append(f"{spec.name} is registered as torchtitan flavor {flavor!r} by hetplan_torchtitan_model.py "
                     "(put it on PYTHONPATH), with torchtitan's default rotary base 10000")
    if spec.tied_embeddings:
        notes.append(f"torchtitan's Llama unties the output head: {spec.vocab_size * spec.hidden_size:,} more "
                     "parameters than the plan's tied embedding")
    # torchtitan: micro-batches per step = local_batch_size / pipeline_parallel_microbatch_size with PP; without PP
    # each step is one micro-batch and global_batch_size / (local_batch_size * dp) steps are accumulated.
    local = plan.job.global_batch // m.dp if pp > 1 else plan.mbs
    lines = [
        f"# torchtitan job config generated by hetplan export: {pp} stages {[st.num_layers for st in plan.stages]}, "
        f"mbs {plan.mbs}, {plan.num_microbatches(0)} micro-batches",
        "[job]", 'description = "hetplan plan"', "",
        "[model]", 'name = "llama3"', f'flavor = "{flavor}"',
        *(['converters = ["quantize.linear.float8"]'] if plan.job.dtype == "fp8" else []), "",
        "[training]", f"local_batch_size = {local}", f"global_batch_size = {plan.job.global_batch}",
        f"seq_len = {plan.job.seq_len}", f"steps = {int(plan.job.iterations())}",
        'mixed_precision_param = "bfloat16"', "",
        "[parallelism]", *dp_lines, f"tensor_parallel_degree = {m.tp}",
        f"context_parallel_degree = {m.cp}", f"expert_parallel_degree = {m.ep}",
        f"pipeline_parallel_degree = {pp}",
        *(["enable_async_tensor_parallel = true"] if plan.job.async_tp else []),
    ]
    if pp > 1:
        lines += [f"pipeline_parallel_microbatch_size = {plan.mbs}", f'pipeline_parallel_schedule = "{sched}"',
                  f"module_fqns_per_model_part = {json.dumps(_torchtitan_parts(plan, spec, v))}"]
    if plan.job.dtype == "fp8":  # torchao float8 as the estimate assumed it (hetplan.estimate.fp8): tensor-wise
        # dynamic scaling, FP8 all-gather of the FSDP2 parameters; the output head stays bf16
        # (torchtitan 0.2.x: converter "quantize.linear.float8", config/job_config.py Quantize.linear.float8)
        lines += ["", "[quantize.linear.float8]", "enable_fsdp_float8_all_gather = true",
                  "precompute_float8_dynamic_scale_for_fsdp = true", 'filter_fqns = ["output"]']
    # torch.compile of the blocks and the loss, or eager (hetplan.estimate.elementwise)
    lines += ["", "[compile]", *(['enable = true', 'components = ["model", "loss"]'] if plan.job.torch_compile
                                 else ["enable = false"])]
    ac = {"none": ["mode = \"none\""], "full": ["mode = \"full\""],
          "selective": ["mode = \"selective\"", "selective_ac_option = \"op\""]}[m.recompute]
    lines += ["", "[activation_checkpoint]", *ac, "", *extra]
    if plan.sequence_parallel and m.tp > 1:
        notes.append("torchtitan's TP always uses sequence parallelism")
    nnodes, per_node = _nodes(plan)
    files["torchtitan.toml"] = "\n".join(lines)
    files["launch.sh"] = (f"# torchtitan {version}.x (reads a TOML job config)\n"
                          f"torchrun --nnodes {nnodes} --nproc-per-node {per_node} -m torchtitan.train "
                          f"--job.config_file torchtitan.toml\n")
    mixed = _pools_note(plan, per_node)
    if mixed:
        notes.append(mixed)
    return Export("torchtitan", files, notes)


def _torchtitan_common_checks(plan: Plan, m: _Mesh) -> None:
    """What no torchtitan release runs: fp16 parameters, NeMo AutoModel's bf16 master weights / loss, the first k
    layers of a stage checkpointed."""
    if plan.job.dtype == "fp16":
        raise HetplanError("torchtitan's mixed precision keeps bfloat16 or float32 parameters, not float16",
                           field="plan.job.dtype", fix="plan with dtype bf16, or export --to megatron / deepspeed")
    if plan.fsdp_param_dtype == "bf16" or plan.cross_entropy == "bf16":
        raise HetplanError("torchtitan keeps fp32 sharded parameters (master weights) and runs its loss on fp32 logits "
                           "or compiled; the plan's bf16 parameters or loss are NeMo AutoModel's and need less memory",
                           field="plan.fsdp_param_dtype", fix='plan with fsdp_param_dtype = "fp32" and cross_entropy '
                           'unset, or run the plan with NeMo AutoModel')
    if m.recompute_layers is not None:
        raise HetplanError("torchtitan's activation checkpointing covers every layer (or every n-th), not the first k "
                           "of a stage", field="plan.stages[].recompute_layers",
                           fix="recompute all layers, or export --to megatron (recompute-method block)")


#: torchtitan 0.3.0's shipped models by hetplan preset: (``--module``, ``--config`` function or None, flavor of the
#: module's ``model_registry``) — ``torchtitan/models/*/config_registry.py`` and ``*/__init__.py`` of the 0.3.0
#: wheel. A flavor without a config function is built by the generated module on the config of a sibling.
TORCHTITAN_03_MODELS: dict[str, tuple[str, str | None, str]] = {
    "llama3-8b": ("llama3", "llama3_8b", "8B"), "llama3-70b": ("llama3", "llama3_70b", "70B"),
    "llama3-405b": ("llama3", "llama3_405b", "405B"), "qwen3-30b-a3b": ("qwen3", "qwen3_30b_a3b", "30B-A3B"),
    "qwen3-235b-a22b": ("qwen3", None, "235B-A22B"), "deepseek-v3": ("deepseek_v3", "deepseek_v3_671b", "671B"),
    "gpt-oss-120b": ("gpt_oss", "gpt_oss_120b", "120b"),
}
#: the config function a module's other flavors start from (its training/parallelism defaults are overridden)
_TT03_BASE = {"llama3": "llama3_8b", "qwen3": "qwen3_30b_a3b", "deepseek_v3": "deepseek_v3_671b",
              "gpt_oss": "gpt_oss_120b"}
#: converters the shipped config functions already set (llama3_405b trains with torchao float8)
_TT03_SHIPPED_FP8 = {"llama3_405b"}

_TT03_JOB = '''"""torchtitan {version}.x job for a hetplan plan (generated by hetplan export): {what}.

Run as ``--module hetplan_torchtitan_job --config hetplan_job`` with this file on PYTHONPATH; the command line
overrides the training and parallelism sections (torchtitan/config/manager.py: CLI > config function).
"""

from torchtitan.models.common.config_utils import decoder_vocab_size
from torchtitan.models.{module} import model_registry
from torchtitan.models.{module}.config_registry import {base}
{imports}{shape}

def hetplan_job():
    config = {base}()
    config.model_spec = model_registry({flavor!r}, converters={converters})
    config.loss.loss_fn.global_vocab_size = decoder_vocab_size(config.model_spec)
    return config
'''

#: a Mixtral-class MoE (SwiGLU experts, top-k softmax routing, no shared experts) in torchtitan 0.3.0's Qwen3
#: MoE block (``torchtitan/models/qwen3/__init__.py``: ``_build_qwen3_moe_layers``, as its ``_30b_a3b`` does)
_TT03_MOE_SHAPE = '''
import torchtitan.models.qwen3 as _q


def _hetplan_shape(attn_backend, moe_comm_backend="standard"):
    return _q.Qwen3Model.Config(
        vocab_size={vocab}, dim={dim}, norm=_q._qwen3_norm({dim}),
        tok_embeddings=_q.Embedding.Config(num_embeddings={vocab}, embedding_dim={dim}, param_init=_q._EMBEDDING_INIT),
        lm_head=_q.Linear.Config(in_features={dim}, out_features={vocab}, param_init=_q._LINEAR_INIT),
        layers=_q._build_qwen3_moe_layers(
            fuse_qkv=True, n_layers={layers}, dim={dim}, n_heads={heads}, n_kv_heads={kv}, head_dim={hd},
            moe_hidden_dim={ffn}, num_experts={experts}, top_k={topk}, attn_backend=attn_backend,
            rope=_q.CosSinRoPE.Config(dim={hd}, max_seq_len={seq}, theta={theta}), moe_comm_backend=moe_comm_backend),
    )


_q.qwen3_configs[{flavor!r}] = _hetplan_shape
'''

#: a Llama shape torchtitan does not ship, in torchtitan 0.3.0's Llama 3 block (``torchtitan/models/llama3/
#: __init__.py``: ``_build_llama3_layers``, as its ``_8b`` does), torchtitan's default rotary base 10000
_TT03_DENSE_SHAPE = '''
import torchtitan.models.llama3 as _l


def _hetplan_shape(attn_backend, tp_gemm_backend="default"):
    return _l.Llama3Model.Config(
        dim={dim}, vocab_size={vocab},
        tok_embeddings=_l.Embedding.Config(num_embeddings={vocab}, embedding_dim={dim}, param_init=_l._EMBEDDING_INIT),
        norm=_l.RMSNorm.Config(normalized_shape={dim}, param_init=_l._NORM_INIT),
        lm_head=_l.Linear.Config(in_features={dim}, out_features={vocab}, param_init=_l._output_linear_init({dim})),
        layers=_l._build_llama3_layers(
            fuse_qkv=True, n_layers={layers}, dim={dim}, n_heads={heads}, n_kv_heads={kv}, hidden_dim={ffn},
            rope=_l.ComplexRoPE.Config(dim={hd}, max_seq_len={seq}), attn_backend=attn_backend,
            tp_gemm_backend=tp_gemm_backend),
    )


_l.llama3_configs[{flavor!r}] = _hetplan_shape
'''


def export_torchtitan_03(plan: Plan, spec: ModelSpec, m: _Mesh, v: int) -> Export:
    """torchtitan 0.3.x: ``torchrun -m torchtitan.train --module M --config C`` plus ``--section.key`` overrides
    and the activation checkpointing subcommand (``activation-checkpoint:none|selective|full``), the form its
    ``ConfigManager.parse_args`` reads (``torchtitan/config/manager.py``, 0.3.0). The model is a shipped config
    (:data:`TORCHTITAN_03_MODELS`) or, when the plan needs other converters (FP8) or a shape torchtitan does not
    ship (a Mixtral-class MoE), a generated ``hetplan_torchtitan_job.py`` whose ``hetplan_job()`` builds it.

    What 0.3.0 runs (``torchtitan/distributed/parallel_dims.py``): experts sharded over EP inside the
    FSDP x CP x TP ranks (``efsdp = dp_shard * cp * tp / ep``), never tensor-parallel (expert-TP 1).

    Raises:
        HetplanError: expert-TP > 1; EP with DDP (ZeRO-0); a model it neither ships nor can build.
    """
    pp, notes = plan.pp, []
    experts = int(getattr(spec, "num_experts", 0) or 0)
    if m.ep > 1 and plan.zero == 0:
        raise HetplanError("torchtitan 0.3 folds EP into the FSDP shard ranks; a ZeRO-0 (DDP) plan has none",
                           field="plan.zero", fix="plan with zero 3 (FSDP), or export --to megatron")
    shipped = TORCHTITAN_03_MODELS.get(spec.name)
    fp8 = plan.job.dtype == "fp8"
    shape = imports = ""
    if shipped is not None:
        module, config, flavor = shipped
    elif experts and not spec.is_mla and not getattr(spec, "shared_expert_ffn_hidden_size", 0) and \
            spec.num_moe_layers == spec.num_layers:
        module, config, flavor = "qwen3", None, f"hetplan-{spec.name}"
        shape = _TT03_MOE_SHAPE.format(
            vocab=spec.vocab_size, dim=spec.hidden_size, layers=spec.num_layers, heads=spec.num_attention_heads,
            kv=spec.num_kv_heads, hd=spec.head_dim, ffn=spec.expert_ffn_hidden_size, experts=experts,
            topk=spec.experts_per_token, seq=max(spec.max_seq_len, plan.job.seq_len),
            theta=1e6, flavor=flavor)  # Mixtral's rotary base (config.json rope_theta); no cost depends on it
        notes.append(f"{spec.name} runs as torchtitan's Qwen3 MoE block with its shapes (flavor {flavor!r} in "
                     "hetplan_torchtitan_job.py): Qwen3's q/k RMSNorm adds 2 x head_dim parameters per layer")
    elif not experts:  # a Llama shape (checked by export_torchtitan)
        module, config, flavor = "llama3", None, f"hetplan-{spec.name}"
        shape = _TT03_DENSE_SHAPE.format(
            vocab=spec.vocab_size, dim=spec.hidden_size, layers=spec.num_layers, heads=spec.num_attention_heads,
            kv=spec.num_kv_heads, hd=spec.head_dim, ffn=spec.ffn_hidden_size,
            seq=max(spec.max_seq_len, plan.job.seq_len), flavor=flavor)
        notes.append(f"{spec.name} is built as torchtitan Llama 3 flavor {flavor!r} by hetplan_torchtitan_job.py, "
                     "with torchtitan's default rotary base 10000")
    else:
        raise HetplanError(f"torchtitan 0.3 runs the models it ships ({', '.join(TORCHTITAN_03_MODELS)}), Llama "
                           f"shapes and Mixtral-class MoEs; {spec.name} has shared experts, MLA or dense layers "
                           "among its MoE layers", field="--to", fix="export --to megatron")
    compiled = plan.job.torch_compile
    converters = "None"
    if fp8:  # torchao float8 (rowwise in 0.3.0's Float8LinearConverter), output head and router gate kept bf16
        imports = "from torchtitan.components.quantization import Float8GroupedExpertsConverter, " \
                  "Float8LinearConverter\n" if experts else \
                  "from torchtitan.components.quantization import Float8LinearConverter\n"
        items = [f"Float8LinearConverter.Config(filter_fqns={['lm_head', 'router.gate'] if experts else ['lm_head']}"
                 f", model_compile_enabled={compiled})"]
        if experts:
            items.append(f"Float8GroupedExpertsConverter.Config(model_compile_enabled={compiled})")
        converters = "[" + ", ".join(items) + "]"
        notes.append("torchtitan 0.3.0's Float8LinearConverter scales rowwise (its only recipes: rowwise, "
                     "rowwise_with_gw_hp); the estimate priced tensorwise dynamic scaling (hetplan.estimate.fp8)")
    files = {}
    generated = config is None or fp8 != (config in _TT03_SHIPPED_FP8) or bool(shape)
    if generated:
        base = config or _TT03_BASE[module]
        what = f"{spec.name} as {module} flavor {flavor!r}" + (" with float8 converters" if fp8 else "")
        files["hetplan_torchtitan_job.py"] = _TT03_JOB.format(
            version="0.3", what=what, module=module, base=base, imports=imports, shape=shape, flavor=flavor,
            converters=converters)
        head = ["--module hetplan_torchtitan_job", "--config hetplan_job"]
        notes.append("put hetplan_torchtitan_job.py on PYTHONPATH (it builds the model torchtitan runs)")
    else:
        head = [f"--module {module}", f"--config {config}"]
    local = plan.job.global_batch // m.dp if pp > 1 else plan.mbs
    if plan.zero == 0:
        dp = [f"--parallelism.data_parallel_replicate_degree {m.dp}", "--parallelism.data_parallel_shard_degree 1"]
    else:
        dp = ["--parallelism.data_parallel_replicate_degree 1", f"--parallelism.data_parallel_shard_degree {m.dp}",
              "--parallelism.fsdp_reshard_after_forward " + ("default" if plan.zero == 3 else "never")]
        if plan.zero == 1:
            notes.append("ZeRO-1 has no torchtitan mode: exported as FSDP2 without resharding after forward "
                         "(ZeRO-2: gradients sharded too, less memory than planned, same communication volume)")
    args = head + [
        f"--training.local_batch_size {local}", f"--training.global_batch_size {plan.job.global_batch}",
        f"--training.seq_len {plan.job.seq_len}", f"--training.steps {int(plan.job.iterations())}",
        "--training.mixed_precision_param bfloat16",
        # CUDA graphs of the step only where the plan prices them (hetplan.plan.Plan.cuda_graphs)
        "--training." + ("no-" if plan.cuda_graphs else "") + "disable_cuda_graphs", *dp,
        f"--parallelism.tensor_parallel_degree {m.tp}",
        "--parallelism." + ("" if plan.sequence_parallel or m.tp == 1 else "no-") + "enable_sequence_parallel",
        f"--parallelism.context_parallel_degree {m.cp}", f"--parallelism.expert_parallel_degree {m.ep}",
        f"--parallelism.pipeline_parallel_degree {pp}",
    ]
    if pp > 1:
        sched = {"1f1b": "Interleaved1F1B" if v > 1 else "1F1B", "gpipe": "GPipe"}[plan.schedule]
        parts = _torchtitan_parts(plan, spec, v, head="lm_head")
        args += [f"--parallelism.pipeline_parallel_microbatch_size {plan.mbs}",
                 f"--parallelism.pipeline_parallel_schedule {sched}",
                 "--parallelism.module_fqns_per_model_part " + " ".join(",".join(p) for p in parts)]
    args += ["--compile." + ("" if compiled else "no-") + "enable"]
    if compiled:
        args.append("--compile.components model,loss")
    args.append("--compile." + ("" if plan.job.async_tp else "no-") + "enable_async_tensor_parallel")
    args.append("activation-checkpoint:" + m.recompute)
    nnodes, per_node = _nodes(plan)
    files["launch.sh"] = "\n".join([
        "#!/usr/bin/env bash",
        f"# torchtitan 0.3.x launch for plan: {pp} stages {[st.num_layers for st in plan.stages]}, mbs {plan.mbs}, "
        f"{plan.num_microbatches(0)} micro-batches, model {spec.name}. Generated by hetplan export.",
        f"# hetplan model: {plan.job.model}",
        f"torchrun --nnodes {nnodes} --nproc-per-node {per_node} --node-rank ${{NODE_RANK:-0}} \\",
        "  --master-addr ${MASTER_ADDR:-127.0.0.1} --master-port ${MASTER_PORT:-29500} \\",
        "  -m torchtitan.train \\",
        "  " + " \\\n  ".join(args), ""])
    mixed = _pools_note(plan, per_node)
    if mixed:
        notes.append(mixed)
    return Export("torchtitan", files, notes)


def export(plan: Plan, spec: ModelSpec, target: str, virtual_stages: int | None = None,
           version: str | None = None) -> Export:
    """Export ``plan`` for ``target`` (``megatron``, ``deepspeed``, ``torchtitan``).

    Raises:
        HetplanError: unknown target, or the plan needs something the target cannot express (see module doc),
            among them several calls of the pipeline schedule per iteration
            (:attr:`~hetplan.plan.Plan.pipeline_step_microbatches`, NeMo AutoModel's) for any target and
            :attr:`~hetplan.plan.Job.recompute_modules` / ``offload_modules`` (Megatron-Core's) for DeepSpeed and
            torchtitan.
    """
    t = target.lower().strip()
    check_plan(plan, spec)
    if t in VERSIONS:
        version = release(t, version)
        _mesh(plan, {"megatron": "Megatron-LM", "deepspeed": "DeepSpeed", "torchtitan": "torchtitan"}[t])  # first
        bad = launch_violations(plan, spec, t, version, virtual_stages)
        if bad:  # what the target's release cannot launch (hardware/data/frameworks.toml, rule framework-can-launch)
            first = bad[0]
            if len(bad) > 1:
                first = type(first)(first.rule, first.message.rsplit(" (rule ", 1)[0] + "; also: " + "; ".join(
                    b.message.split(" (", 1)[0] for b in bad[1:]), field=first.field, fix=first.fix)
            raise first
    if plan.pipeline_calls() > 1:
        raise HetplanError(f"the plan splits each iteration into {plan.pipeline_calls()} calls of the pipeline "
                           "schedule (NeMo AutoModel); the exports run all its micro-batches in one call",
                           field="plan.pipeline_step_microbatches",
                           fix="remove pipeline_step_microbatches (or set it >= the micro-batches per iteration)")
    if t in ("deepspeed", "torchtitan") and (plan.job.recompute_modules or plan.job.offload_modules):
        raise HetplanError(f"{t} has no per-module recomputation or activation offloading (Megatron-Core options)",
                           field="plan.job.recompute_modules" if plan.job.recompute_modules
                           else "plan.job.offload_modules", fix="export --to megatron, or remove them")
    if t == "megatron":
        out = export_megatron(plan, spec, virtual_stages)
    elif t == "deepspeed":
        out = export_deepspeed(plan, spec)
    elif t == "torchtitan":
        out = export_torchtitan(plan, spec, virtual_stages, version)
    else:
        raise HetplanError(f"unknown export target {target!r}", field="--to", fix=f"use one of {', '.join(TARGETS)}")
    # What each target writes is its framework's default stack (hetplan.hardware.stacks.FRAMEWORK_STACK); a plan
    # priced under another stack (Job.stack) was priced for software this export does not launch.
    written = default_stack(TARGET_FRAMEWORK[t])
    priced = plan.job.stack_spec()
    if priced.id != written.id:
        out.notes.append(f"the plan was priced for stack {priced.id}; this export launches {written.id}, whose "
                         f"numbers differ: re-estimate with --stack {written.name} to price what runs")
    if any(pool.network == "ethernet" for pool in plan.pools):
        # The estimate assumed NCCL's socket transport (hetplan.estimate.comm.NETWORKS); say so where NCCL reads it.
        env = ("export NCCL_IB_DISABLE=1  # nodes joined by Ethernet without RDMA (GPUPool.network): NCCL sockets; "
               "set NCCL_SOCKET_IFNAME to the data-network interface")
        for name, text in out.files.items():
            if name.endswith(".sh"):
                head, sep, rest = text.partition("\n") if text.startswith("#!") else ("", "", text)
                out.files[name] = f"{head}{sep}{env}\n{rest}"
        out.notes.append("Ethernet between nodes: launch with NCCL_IB_DISABLE=1 and NCCL_SOCKET_IFNAME set")
    return out
