"""From a framework's launch back to a plan: ``hetplan import`` reads what a user runs — a Megatron-LM launch
script or arguments file, a torchtitan 0.3 command line (``--module/--config`` + overrides) or 0.2 TOML job
config, a DeepSpeed JSON config with its launcher arguments — and returns the :class:`~hetplan.plan.Plan` it
runs, so that ``hetplan estimate`` prices the user's own run and ``hetplan plan --baseline`` compares it with the
search's best. The inverse of :mod:`hetplan.runtime.exporters`: ``export`` then ``import`` gives the plan back
(``tests/runtime/test_import.py``, a property test over plans).

How each framework's arguments become a plan (the framework's own semantics, cited where they matter):

* **Megatron-LM**: parsed with the recorded argument list of its release (:mod:`hetplan.runtime.argspec`); the
  world size is ``--nnodes x --nproc-per-node`` of the ``torchrun`` line (or ``gpus``), DP = world / (TP x CP x
  PP) (``megatron/core/parallel_state.py``); the layer split from ``--pipeline-model-parallel-layout``,
  ``--decoder-first/last-pipeline-num-layers``, ``--account-for-embedding/loss-in-pipeline-split`` or an equal
  split; ZeRO-1 = ``--use-distributed-optimizer``, ZeRO-2/3 = Megatron-FSDP's ``optim_grads`` /
  ``optim_grads_params``.
* **torchtitan 0.3**: ``--module``/``--config`` name a shipped model (or hetplan's generated job module), the
  ``--section.key`` overrides the degrees and batch; the shipped config's own degrees are not known without
  torchtitan, so every degree the plan needs must be on the command line (as hetplan's export writes it).
* **DeepSpeed**: ``ds_config.json`` (micro-batch, accumulation, ZeRO stage, dtype) with the launcher's
  ``--num_nodes``/``--num_gpus`` and ``--pipeline-parallel-size``; the split from ``pipeline_module.json`` or
  ``hetplan_pipeline.py`` when present, else DeepSpeed's ``uniform`` partition.

The model is the preset whose shapes the arguments give (hidden size, layers, heads, FFN width, experts), or
``model`` when given.
"""

from __future__ import annotations

import ast
import json
import math
import re
import shlex
import tomllib
from typing import Any

from pydantic import ValidationError

from hetplan.errors import HetplanError
from hetplan.hardware.stacks import resolve_stack
from hetplan.model.spec import ModelSpec, list_presets, load_model
from hetplan.plan import GPUPool, Job, Plan, Stage
from hetplan.plan_rules import TE_RECIPE_NAMES
from hetplan.runtime.argspec import megatron_argv, parse_megatron_args
from hetplan.runtime.exporters import TORCHTITAN_03_MODELS, balanced_split_ds
from hetplan.runtime.exporters.torchtitan import TORCHTITAN_RELEASE_STACKS


def _words(text: str) -> list[str]:
    """The shell words of a launch script, line continuations joined, comments dropped."""
    out: list[str] = []
    for line in text.replace("\\\n", " ").splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            out += shlex.split(line, comments=True)
    return out


def _opt(words: list[str], *names: str) -> str | None:
    for i, w in enumerate(words):
        for n in names:
            if w == n and i + 1 < len(words):
                return words[i + 1]
            if w.startswith(n + "="):
                return w.split("=", 1)[1]
    return None


def _world(words: list[str], gpus: int | None, nodes_flag: str, per_node_flags: tuple[str, ...]) -> tuple[int, int]:
    """(world size, GPUs per node) from the launcher's words, or ``gpus``."""
    nnodes, nproc = _opt(words, nodes_flag), _opt(words, *per_node_flags)
    if gpus is not None:
        if nnodes and nproc and nnodes.isdigit() and nproc.isdigit() and int(nnodes) * int(nproc) != gpus:
            # the launch starts nnodes x nproc ranks whatever --gpus says (a plan on --gpus was not the run)
            raise HetplanError(f"--gpus {gpus} contradicts the launch, which starts {nodes_flag} {nnodes} x "
                               f"{per_node_flags[0]} {nproc} = {int(nnodes) * int(nproc)} ranks", field="--gpus",
                               fix="drop --gpus (it is for launches that do not give their world size)")
        return gpus, int(nproc) if nproc and nproc.isdigit() else min(gpus, 8)
    if nnodes and nproc and nnodes.isdigit() and nproc.isdigit():
        if not int(nnodes) * int(nproc):  # it reached the schema as "dp: Input should be greater than 0"
            flag = nodes_flag if not int(nnodes) else per_node_flags[0]
            raise HetplanError(f"{flag} 0 starts no rank", field=flag, fix=f"give {flag} 1 or more")
        return int(nnodes) * int(nproc), int(nproc)
    raise HetplanError("the launch names no world size (torchrun --nnodes/--nproc-per-node, deepspeed "
                       "--num_nodes/--num_gpus)", field="--gpus", fix="give the job's GPU count with --gpus")


def launch_pool(gpu: str, world: int, per_host: int) -> GPUPool:
    """The pool a launch of ``world`` ranks, ``per_host`` per host, ran on: the GPU type's reference node where its
    hosts are that size (a GB200 / GB300 NVL72 rack: NVLink domain 72, trays of 4, :attr:`GPUPool.gpus_per_host`),
    so that 64 trays of 4 GB200 keep their 72-GPU NVLink domain and one NIC per GPU; else nodes of ``per_host``
    (a DGX launch of 8 per node, or fewer: the GPUs the launch uses of each server)."""
    pool = GPUPool(gpu=gpu, count=world)
    if pool.gpus_per_host is not None and pool.gpus_per_host == per_host:
        return pool
    return GPUPool(gpu=gpu, count=world, gpus_per_node=per_host, gpus_per_host=per_host)


def _refuse_world_split(world: int, users: bool, degrees: dict[str, int]) -> None:
    """Refuse a world size the launch's parallel degrees (``{flag: degree}``) do not divide (Megatron-LM's
    ``initialize_model_parallel`` raises on it), naming ``--gpus`` when the world size is the user's (``users``: the
    launch gives none) and else the first degree that does not divide it (a launch of 8 x 8 ranks at TP 3 said
    "--gpus: ..., give the launch's world size", though no --gpus was given and the world size was the launch's own).

    Raises:
        HetplanError: always."""
    product = math.prod(degrees.values())
    names = " x ".join(f"{flag} {d}" for flag, d in degrees.items() if d > 1)
    names += f" = {product}" if sum(d > 1 for d in degrees.values()) > 1 else ""
    if users:
        raise HetplanError(f"{world} GPUs is no multiple of {names}", field="--gpus", fix="give the launch's world size")
    flag = next((f for f, d in degrees.items() if world % d), next(f for f, d in reversed(degrees.items()) if d > 1))
    raise HetplanError(f"the launch starts {world} ranks, no multiple of {names}", field=flag,
                       fix=f"give degrees whose product divides the {world} ranks")


def _degrees_at_least_one(degrees: dict[str, int]) -> None:
    """Refuse a parallel degree below 1 (``{flag or key as the launch spells it: value}``): the frameworks refuse
    it, and a world size divided by it gave a ZeroDivisionError.

    Raises:
        HetplanError: naming the first such flag."""
    for name, value in degrees.items():
        if value < 1:
            raise HetplanError(f"{name} {value}: a parallel degree is 1 or more", field=name,
                               fix=f"give {name} 1 (no split) or more")


def match_model(shape: dict[str, int], model: str | None) -> ModelSpec:
    """The model: ``model`` when given (its shapes must agree), else the preset with exactly these shapes.

    Raises:
        HetplanError: no preset (or ``model`` disagrees) with the shapes.
    """
    def agrees(spec: ModelSpec) -> list[str]:
        return [f"{k} {v} (model: {getattr(spec, k)})" for k, v in shape.items()
                if v is not None and int(getattr(spec, k) or 0) != int(v)]

    if model:
        spec = load_model(model)
        bad = agrees(spec)
        if bad:
            raise HetplanError(f"the launch's shapes disagree with {spec.name}: {', '.join(bad)}", field="--model",
                               fix="name the model the launch trains")
        return spec
    for name in list_presets():
        spec = load_model(name)
        if not agrees(spec):
            return spec
    raise HetplanError(f"no preset model has the launch's shapes {shape}", field="--model",
                       fix="give --model NAME or a Hugging Face config.json path")


def parse_layout(text: str, pp: int, mtp: int = 0) -> list[list[int]]:
    """Decoder layers ``[stage][virtual stage]`` of a Megatron-Core ``--pipeline-model-parallel-layout``
    (``megatron/core/transformer/pipeline_parallel_layer_layout.py``: commas cosmetic, ``(...)*n`` and ``x*n``
    unrolled, ``|`` between model chunks in model order, chunk k on pipeline rank k % pp); the ``mtp`` modules of
    ``--mtp-num-layers`` as ``m`` in the last chunk (Megatron-Core asserts the layout holds them all).

    Raises:
        HetplanError: characters other than E, L, t, m, a chunk count that is no multiple of pp, or MTP modules
            other than ``mtp`` in the last chunk (priced on the last stage).
    """
    s = text.replace(",", "")
    s = re.sub(r"\(([^)]+)\)\*(\d+)", lambda m: m.group(1) * int(m.group(2)), s)
    s = re.sub(r"(.)\*(\d+)", lambda m: m.group(1) * int(m.group(2)), s)
    chunks = s.split("|")
    if set(s) - set("ELtm|") or len(chunks) % pp:
        raise HetplanError(f"--pipeline-model-parallel-layout {text!r}: hetplan reads E, L, t, m and |, in a "
                           f"multiple of pp = {pp} chunks", field="--pipeline-model-parallel-layout",
                           fix="give the layout of the decoder layers")
    if s.count("m") != mtp or chunks[-1].count("m") != mtp:
        raise HetplanError(f"--pipeline-model-parallel-layout {text!r} holds {s.count('m')} MTP module(s) ("
                           f"{chunks[-1].count('m')} in the last chunk); --mtp-num-layers is {mtp} and hetplan prices "
                           "them on the last stage", field="--pipeline-model-parallel-layout",
                           fix=f"put {mtp} m before the final L (Megatron-Core asserts the count)")
    v = len(chunks) // pp
    return [[chunks[k * pp + st].count("t") for k in range(v)] for st in range(pp)]


def _chunks_if_uneven(chunks: list[list[int]], L: int) -> list[list[int]] | None:
    """``chunks`` for :attr:`Plan.pipeline_chunks` when they are not what equal chunks (with the embedding / loss
    counted as a layer) give, else None."""
    from hetplan.plan_rules import embedding_loss_split

    pp, v = len(chunks), len(chunks[0])
    found = embedding_loss_split([sum(c) for c in chunks], L, v) if pp > 1 else None
    if v == 1 or found is None:
        return None if v == 1 else chunks
    e, loss, c = found
    flat = [c] * (pp * v)
    flat[0] -= e
    flat[-1] -= loss
    return None if [[flat[k * pp + i] for k in range(v)] for i in range(pp)] == chunks else chunks


def _megatron_kernel(backend: str | None, gpu: str) -> str | None:
    """The attention kernel (:attr:`hetplan.plan.Job.attention_kernel`) Megatron-Core's ``--attention-backend``
    names: ``fused`` = Transformer Engine's cuDNN fused attention; ``flash`` = TE's FlashAttention, flash-attn 3 on
    Hopper (where hetplan's export writes it for ``fa3``) and 2 elsewhere; otherwise None (the stack's default)."""
    if backend == "fused":
        return "cudnn"
    if backend != "flash":
        return None
    from hetplan.hardware.catalog import load_catalog

    try:
        hopper = load_catalog().get(gpu).architecture.startswith("Hopper")
    except HetplanError:
        hopper = False
    return "fa3" if hopper else "fa2"


def _megatron_split(a: dict[str, Any], L: int, pp: int, mtp: int = 0) -> tuple[list[int], int]:
    """(layers per stage, virtual stages) of Megatron-LM's arguments."""
    if "pipeline_model_parallel_layout" in a:
        chunks = parse_layout(a["pipeline_model_parallel_layout"], pp, mtp)
        return [sum(c) for c in chunks], len(chunks[0])
    e = int("account_for_embedding_in_pipeline_split" in a)
    loss = int("account_for_loss_in_pipeline_split" in a)
    v = int(a.get("num_virtual_stages_per_pipeline_rank", 0)) or (
        L // (pp * a["num_layers_per_virtual_pipeline_stage"]) if "num_layers_per_virtual_pipeline_stage" in a else 1)
    if e or loss:
        c = (L + e + loss) // (pp * v)
        return ([v * c - e - loss] if pp == 1 else [v * c - e] + [v * c] * (pp - 2) + [v * c - loss]), v
    first, last = a.get("decoder_first_pipeline_num_layers"), a.get("decoder_last_pipeline_num_layers")
    given = [x for x in (first, last) if x is not None]
    mid = (L - sum(given)) // max(1, pp - len(given))
    layers = [mid] * pp
    if first is not None:
        layers[0] = first
    if last is not None:
        layers[-1] = last
    if sum(layers) != L:
        raise HetplanError(f"the split {layers} does not cover the {L} layers", field="--num-layers",
                           fix="give a layer count the pipeline divides, or --decoder-first/last-pipeline-num-layers")
    return layers, v


def import_megatron(text: str, *, model: str | None = None, gpu: str = "H100-SXM", gpus: int | None = None) -> Plan:
    """The plan a Megatron-LM launch script (or arguments file) runs (see module doc).

    Raises:
        HetplanError: arguments the release refuses, no world size, shapes of no known model, fp32 training, a
            script that trains no GPT-style decoder (``pretrain_bert.py``, ``pretrain_t5.py``, ``pretrain_mamba.py``).
    """
    script = next((w for w in _words(text) if re.search(r"pretrain_\w+\.py$", w)), None)
    if script is not None and not script.endswith("pretrain_gpt.py"):
        # pretrain_bert.py / pretrain_t5.py / pretrain_vlm.py ... were read as a GPT decoder and priced as one
        raise HetplanError(f"{script.rsplit('/', 1)[-1]} trains no GPT-style decoder, the model hetplan prices",
                           field="FILES", fix="import a launch of pretrain_gpt.py")
    a = parse_megatron_args(megatron_argv(text))
    missing = [o for o in ("num_layers", "hidden_size", "num_attention_heads", "seq_length", "global_batch_size")
               if o not in a]
    if missing:
        raise HetplanError(f"the launch does not set {', '.join('--' + o.replace('_', '-') for o in missing)}; "
                           "Megatron-LM needs them to build the model and the batch", field="--" +
                           missing[0].replace("_", "-"), fix="give them in the launch script")
    mtp = int(a.get("mtp_num_layers") or 0)  # DeepSeek-V3's multi-token prediction, priced (Job.mtp_layers)
    if not 0 <= mtp <= 8:
        raise HetplanError(f"--mtp-num-layers {mtp}: hetplan prices 0 to 8 prediction depths", field="--mtp-num-layers",
                           fix="give --mtp-num-layers between 0 and 8 (DeepSeek-V3 trains 1)")
    words = _words(text)
    world, per_node = _world(words, gpus, "--nnodes", ("--nproc-per-node", "--nproc_per_node"))
    tp, pp, cp = (int(a.get(k, 1)) for k in ("tensor_model_parallel_size", "pipeline_model_parallel_size",
                                              "context_parallel_size"))
    _degrees_at_least_one({"--tensor-model-parallel-size": tp, "--pipeline-model-parallel-size": pp,
                           "--context-parallel-size": cp})
    if world % (tp * pp * cp):
        _refuse_world_split(world, _opt(words, "--nnodes") is None, {
            "--tensor-model-parallel-size": tp, "--context-parallel-size": cp, "--pipeline-model-parallel-size": pp})
    dp = world // (tp * pp * cp)
    experts = a.get("num_experts")
    spec = match_model({"num_layers": a.get("num_layers"), "hidden_size": a.get("hidden_size"),
                        "num_attention_heads": a.get("num_attention_heads"), "vocab_size": a.get("vocab_size"),
                        "num_kv_heads": a.get("num_query_groups") if "group_query_attention" in a else None,
                        "ffn_hidden_size": a.get("ffn_hidden_size"), "num_experts": experts,
                        "expert_ffn_hidden_size": a.get("moe_ffn_hidden_size")}, model)
    layers, v = _megatron_split(a, spec.num_layers, pp, mtp)
    chunks = (_chunks_if_uneven(parse_layout(a["pipeline_model_parallel_layout"], pp, mtp), spec.num_layers)
              if "pipeline_model_parallel_layout" in a and pp > 1 else None)
    if "bf16" in a and "fp16" in a:  # megatron/training/arguments.py validate_args: "assert not args.bf16"
        raise HetplanError("the launch gives both --bf16 and --fp16; Megatron-LM refuses the pair", field="--bf16",
                           fix="keep one of --bf16 and --fp16")
    dtype = "fp8" if "fp8_format" in a else "bf16" if "bf16" in a else "fp16" if "fp16" in a else None
    if dtype is None:
        raise HetplanError("the launch trains in fp32 (no --bf16, --fp16 or --fp8-format); hetplan prices mixed "
                           "precision", field="--bf16", fix="add --bf16")
    zero = 1 if "use_distributed_optimizer" in a else 0
    if "use_megatron_fsdp" in a:
        zero = {"optim_grads": 2, "optim_grads_params": 3}.get(a.get("data_parallel_sharding_strategy", ""), 3)
    gran = a.get("recompute_granularity", "none")
    rec_layers = None
    if gran == "full":
        # Megatron-Core's TransformerConfig refuses full recomputation without both ('recompute_method must be
        # "block" or "uniform"', 'recompute_num_layers must be between ...': megatron/core/transformer/
        # transformer_config.py, NVIDIA/Megatron-LM d98e8a64); read as every layer or as block of 0 layers
        for flag, fix in (("recompute_method", "uniform (every layer) or block (the first k of a stage)"),
                          ("recompute_num_layers", "1 with --recompute-method uniform, or k with block")):
            if a.get(flag) is None:
                raise HetplanError(f"the launch gives --recompute-granularity full without --{flag.replace('_', '-')}"
                                   ", which Megatron-Core refuses", field="--" + flag.replace("_", "-"),
                                   fix=f"give --{flag.replace('_', '-')} {fix}")
    if gran == "full" and a.get("recompute_method") == "block":
        rec_layers = int(a["recompute_num_layers"])
    modules = [m for m in a.get("recompute_modules", []) if m != "core_attn"]
    moe_recompute = "moe" in modules
    if moe_recompute:
        modules.remove("moe")
    if gran == "selective" and "recompute_modules" in a and "core_attn" not in a["recompute_modules"]:
        gran = "none"  # only per-module recomputation was asked for
    attention = "flash" if "use_flash_attn" in a or a.get("attention_backend") in (None, "flash", "fused", "auto") \
        else "standard"
    kernel = _megatron_kernel(a.get("attention_backend"), gpu)
    dispatcher = a.get("moe_token_dispatcher_type", "alltoall")
    if dispatcher == "flex":
        dispatcher = a.get("moe_flex_dispatcher_backend", "deepep")
    # --fp8-recipe tensorwise is TE's Float8CurrentScaling (megatron/core/fp8_utils.py); delayed / mxfp8 are the
    # recipes the estimate picks by GPU generation when none is named
    # --fp8-recipe as hetplan names it (TE_RECIPE_NAMES: tensorwise = current scaling); none named: the GPU's default.
    # Was read as None but for tensorwise, so delayed scaling on Blackwell came back priced as MXFP8
    fp8_recipe = TE_RECIPE_NAMES.get(str(a.get("fp8_recipe"))) if dtype == "fp8" else None
    capacity = a.get("moe_expert_capacity_factor")
    capacity = float(capacity) if capacity is not None and float(capacity) >= 0 else None  # < 0: dropless
    if capacity is not None and not 0 < capacity <= 8:
        raise HetplanError(f"--moe-expert-capacity-factor {capacity:g} would drop every token" if capacity == 0 else
                           f"--moe-expert-capacity-factor {capacity:g} is beyond any expert's load (8x its share)",
                           field="--moe-expert-capacity-factor", fix="give a capacity factor in (0, 8], e.g. 1.0")
    if capacity is not None and dispatcher != "alltoall":
        raise HetplanError(f"the launch drops tokens (--moe-expert-capacity-factor {capacity:g}) under the "
                           f"{dispatcher} dispatcher; hetplan prices token dropping with the alltoall dispatcher "
                           "only", field="--moe-expert-capacity-factor",
                           fix="use --moe-token-dispatcher-type alltoall, or drop the capacity factor")
    # --cp-comm-type, one for all layers (or one per layer): Transformer Engine's p2p ring or all_gather
    # (transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py, NVIDIA/TransformerEngine
    # d0067d0d); Megatron's help spells it "allgather". Was ignored: every launch priced as the ring
    kinds = {str(k).replace("_", "").lower() for k in a.get("cp_comm_type") or ["p2p"]}
    exchange = {"p2p": "ring", "allgather": "allgather"}.get(kinds.pop()) if len(kinds) == 1 else None
    if cp > 1 and exchange is None:
        raise HetplanError(f"--cp-comm-type {' '.join(map(str, a['cp_comm_type']))}: hetplan prices context "
                           "parallelism's p2p ring or all_gather of K/V, one for every layer (not a2a, Ulysses)",
                           field="--cp-comm-type", fix="give --cp-comm-type p2p or all_gather")
    job = Job(model=model or spec.name, seq_len=int(a["seq_length"]), global_batch=int(a["global_batch_size"]),
              cp_kv_exchange=exchange if cp > 1 and exchange else "ring",
              train_iterations=int(a.get("train_iters", 1)), dtype=dtype, fp8_recipe=fp8_recipe, attention=attention,
              attention_kernel=kernel, framework="megatron",
              moe_dispatcher=dispatcher if dispatcher in ("alltoall", "deepep", "hybridep") else "alltoall",
              moe_a2a_overlap="overlap_moe_expert_parallel_comm" in a, moe_recompute=moe_recompute,
              moe_capacity_factor=capacity,
              moe_pad_to_capacity=capacity is not None and "moe_pad_expert_input_to_capacity" in a, mtp_layers=mtp,
              recompute_modules=modules, offload_modules=list(a.get("offload_modules", [])))
    stages = [Stage(num_layers=n, tp=tp, dp=dp, recompute=gran,
                    recompute_layers=rec_layers if gran == "full" else None) for n in layers]
    return Plan(job=job, pools=[launch_pool(gpu, world, per_node)], stages=stages,
                mbs=int(a.get("micro_batch_size", 1)), zero=zero, virtual_stages=v,
                sequence_parallel="sequence_parallel" in a, overlap_grad_reduce="overlap_grad_reduce" in a,
                tp_comm_overlap="tp_comm_overlap" in a,
                cuda_graphs="enable_cuda_graph" in a or a.get("cuda_graph_impl", "none") != "none",
                cross_entropy=None if "cross_entropy_loss_fusion" in a else "fp32", cp=cp,
                grad_reduce_dtype="bf16" if "grad_reduce_in_bf16" in a else None,
                ep=int(a.get("expert_model_parallel_size", 1)),
                # Megatron-LM's default expert-TP is the TP degree (megatron/training/arguments.py validate_args:
                # "if args.expert_tensor_parallel_size is None: ... = args.tensor_model_parallel_size", d98e8a64)
                expert_tp=int(a.get("expert_tensor_parallel_size", tp if experts else 1)),
                pipeline_chunks=chunks)


def _tt_parts(parts: list[list[str]], pp: int) -> tuple[list[int], int]:
    layers = [0] * pp
    for k, part in enumerate(parts):  # looped schedules: model part k on pipeline rank k % pp
        layers[k % pp] += sum(1 for fqn in part if fqn.startswith("layers."))
    return layers, len(parts) // pp


def _tt_chunks(parts: list[list[str]], pp: int, L: int) -> list[list[int]] | None:
    """:attr:`Plan.pipeline_chunks` of torchtitan's model parts (part k = chunk k // pp of rank k % pp) when
    they are not equal chunks."""
    v = len(parts) // pp
    if v <= 1:
        return None
    counts = [sum(1 for fqn in part if fqn.startswith("layers.")) for part in parts]
    return _chunks_if_uneven([[counts[k * pp + i] for k in range(v)] for i in range(pp)], L)


def _tt_shard(world: int, rep: int, tp: int, cp: int, pp: int, shard: int, prefix: str) -> int:
    """torchtitan's FSDP shard degree: ``shard``, or with -1 the ranks the other degrees leave over
    (``ParallelDims``: world = replicate x shard x CP x TP x PP, which it asserts).

    Raises:
        HetplanError: a degree below 1, or -1 where the other degrees do not divide the world size."""
    _degrees_at_least_one({f"{prefix}{key}": value for key, value in (
        ("tensor_parallel_degree", tp), ("context_parallel_degree", cp), ("pipeline_parallel_degree", pp),
        ("data_parallel_replicate_degree", rep))})
    rest = rep * tp * cp * pp
    if shard != -1:  # ParallelDims._validate asserts the product (torchtitan/distributed/parallel_dims.py); it
        # was read as a plan on fewer (or more) GPUs than the launch starts
        if shard < 1 or rest * shard != world:
            raise HetplanError(f"replicate x shard x CP x TP x PP = {rep} x {shard} x {cp} x {tp} x {pp} = "
                               f"{rest * shard} is not the launch's {world} ranks; torchtitan asserts they are equal",
                               field=f"{prefix}data_parallel_shard_degree",
                               fix=f"give degrees whose product is {world} (or data_parallel_shard_degree -1)")
        return shard
    if world % rest:
        raise HetplanError(f"{world} ranks are no multiple of replicate x TP x CP x PP = {rest}, so "
                           f"{prefix}data_parallel_shard_degree -1 has no value (torchtitan asserts the product)",
                           field=f"{prefix}data_parallel_shard_degree",
                           fix="give degrees whose product divides the world size")
    return world // rest


def _tt_sharding(replicate: int, shard: int, cp: int, reshard_policy: object) -> tuple[int, int | None, bool]:
    """``(zero, fsdp_shard, reshard_after_forward)`` of torchtitan's data-parallel degrees and
    ``fsdp_reshard_after_forward``: DDP (shard degree 1, no CP) is ZeRO-0; FSDP2 is ZeRO-3, ZeRO-2 when it never
    reshards after forward; HSDP (replicate degree above 1) shards over ``shard x cp`` ranks: torchtitan's FSDP
    mesh is the shard degree x CP (``torchtitan/distributed/parallel_dims.py``, pytorch/torchtitan b5bcd76c)
    (the inverse of the export's ``_tt_data_parallel``).

    Raises:
        HetplanError: HSDP shard groups (shard x CP ranks) that do not divide the DP degree (replicate x shard)."""
    reshard = reshard_policy != "never"
    group = shard * cp
    if group <= 1:
        return 0, None, reshard
    if replicate > 1 and (replicate * shard) % group:
        raise HetplanError(f"torchtitan shards over data_parallel_shard_degree {shard} x context_parallel_degree {cp} "
                           f"= {group} ranks, which does not divide the {replicate * shard} data-parallel ranks "
                           "(replicate x shard) hetplan prices HSDP over", field="data_parallel_replicate_degree",
                           fix="give a replicate degree that is a multiple of the CP degree")
    return (3 if reshard else 2), (group if replicate > 1 else None), reshard


def _tt_schedule(name: object, prefix: str) -> str:
    """hetplan's schedule of torchtitan's ``pipeline_parallel_schedule``: ``GPipe``, or 1F1B (``1F1B`` and, with
    virtual stages, ``Interleaved1F1B``; torchtitan's default 1F1B when not given).

    Raises:
        HetplanError: another of PyTorch's schedules (zero-bubble, looped BFS, DualPipeV ...): was priced as 1F1B."""
    if name in (None, "1F1B", "Interleaved1F1B"):
        return "1f1b"
    if name == "GPipe":
        return "gpipe"
    raise HetplanError(f"pipeline_parallel_schedule {name!r}: hetplan prices 1F1B, Interleaved1F1B and GPipe",
                       field=f"{prefix}pipeline_parallel_schedule", fix="give 1F1B, Interleaved1F1B or GPipe")


def _tt_fp32_reduce(dtype: object, prefix: str) -> None:
    """torchtitan's ``mixed_precision_reduce`` is ``Literal["float32"]`` (``torchtitan/config/configs.py`` of
    0.3.0, ``job_config.py`` of v0.2.2): a launch giving ``bfloat16`` does not start (it was priced with a bf16
    reduction).

    Raises:
        HetplanError: another dtype."""
    if dtype != "float32":
        raise HetplanError(f"mixed_precision_reduce {dtype!r}: torchtitan reduces gradients in float32 only and "
                           "refuses the launch", field=f"{prefix}mixed_precision_reduce",
                           fix='give "float32" (or leave it out)')


def _tt_cp_balanced(balancer: object, prefix: str) -> None:
    """torchtitan's ``context_parallel_load_balancer`` must be its default ``headtail`` (SDPA's causal load
    balancing, what the estimate prices: ``Job.cp_load_balance``); ``ptrr`` is FlexAttention's, and None
    (unbalanced) changes the CP attention cost: both were priced as balanced without a word.

    Raises:
        HetplanError: another balancer."""
    if balancer != "headtail":
        raise HetplanError(f"context_parallel_load_balancer {balancer!r}: hetplan prices torchtitan's SDPA with its "
                           "headtail load balancing", field=f"{prefix}context_parallel_load_balancer",
                           fix='give "headtail" (torchtitan\'s default) or leave it out')


def import_torchtitan(text: str, *, model: str | None = None, gpu: str = "H100-SXM", gpus: int | None = None,
                      job_module: str | None = None) -> Plan:
    """The plan a torchtitan 0.3 launch (``-m torchtitan.train --module M --config C`` + overrides) runs; with
    hetplan's generated ``hetplan_torchtitan_job.py`` as ``job_module`` its flavor names the model.

    Raises:
        HetplanError: no world size, a model neither shipped nor named, a value of the wrong type.
    """
    words = _words(text)
    world, per_node = _world(words, gpus, "--nnodes", ("--nproc-per-node", "--nproc_per_node"))
    start = words.index("torchtitan.train") + 1 if "torchtitan.train" in words else 0
    over: dict[str, str | bool] = {}
    ac = "none"
    argv = words[start:]
    i = 0
    while i < len(argv):
        w = argv[i]
        if w.startswith("activation-checkpoint:"):
            ac = w.split(":", 1)[1]
        elif w.startswith("--"):
            key = w[2:].replace("-", "_")
            nxt = argv[i + 1] if i + 1 < len(argv) else None
            if nxt is not None and not nxt.startswith("--") and not nxt.startswith("activation-checkpoint:"):
                vals = [nxt]
                while i + 2 < len(argv) and key.endswith("module_fqns_per_model_part") and \
                        not argv[i + 2].startswith("--") and not argv[i + 2].startswith("activation-"):
                    vals.append(argv[i + 2])
                    i += 1
                over[key] = " ".join(vals)
                i += 1
            else:
                section, _, name = key.rpartition(".")
                over[(section + "." if section else "") + name.removeprefix("no_")] = not name.startswith("no_")
        i += 1

    def num(key: str, default: int) -> int:
        v = over.get(key, default)
        try:
            return int(v)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            raise HetplanError(f"--{key} {v!r} is not an integer", field=f"--{key}", fix="give an integer") from None

    module, config = str(over.get("module", "")), str(over.get("config", ""))
    name = model
    if name is None:
        for preset, (mod, cfg, flavor) in TORCHTITAN_03_MODELS.items():
            if module == mod and config == cfg:
                name = preset
        if name is None and job_module:
            m = re.search(r"model_registry\('([^']+)'", job_module)
            flavor = m.group(1) if m else ""
            for preset, (mod, _, fl) in TORCHTITAN_03_MODELS.items():
                if fl == flavor and f"torchtitan.models.{mod} import" in job_module:
                    name = preset
            if name is None and flavor.startswith("hetplan-"):
                name = flavor.removeprefix("hetplan-")
    if name is None:
        raise HetplanError(f"--module {module} --config {config} is no torchtitan model hetplan knows",
                           field="--model", fix="give --model NAME (and the generated job module if any)")
    spec = load_model(name)
    p = "parallelism."
    tp, cp, ep, pp = num(p + "tensor_parallel_degree", 1), num(p + "context_parallel_degree", 1), \
        num(p + "expert_parallel_degree", 1), num(p + "pipeline_parallel_degree", 1)
    rep, shard = num(p + "data_parallel_replicate_degree", 1), num(p + "data_parallel_shard_degree", -1)
    shard = _tt_shard(world, rep, tp, cp, pp, shard, "--parallelism.")
    dp = rep * shard
    zero, fsdp_shard, reshard = _tt_sharding(rep, shard, cp, over.get(p + "fsdp_reshard_after_forward"))
    gbs, seq = num("training.global_batch_size", -1), num("training.seq_len", 0)
    local = num("training.local_batch_size", 0)
    unset = [k for k, v in (("training.seq_len", seq), ("training.local_batch_size", local)) if v <= 0]
    if unset:  # the config function's defaults need torchtitan itself
        raise HetplanError(f"the launch does not set --{unset[0]}; hetplan reads the command line only (the "
                           f"defaults of --config {config} live in torchtitan)", field=f"--{unset[0]}",
                           fix=f"add --{unset[0]} to the launch (hetplan export writes it)")
    if pp > 1:
        mbs = num(p + "pipeline_parallel_microbatch_size", 1)
        parts = [part.split(",") for part in str(over.get(p + "module_fqns_per_model_part", "")).split()]
        if parts:
            layers, v = _tt_parts(parts, pp)
            tt_chunks = _tt_chunks(parts, pp, spec.num_layers)
        else:
            q, r = divmod(spec.num_layers, pp)
            layers, v = [q + (i < r) for i in range(pp)], 1
    else:
        mbs, layers, v = local, [spec.num_layers], 1
    if pp <= 1 or not parts:
        tt_chunks = None
    if gbs == 0:  # torchtitan: -1 (the default) is local x DP; 0 fails its batch assertion
        raise HetplanError("--training.global_batch_size 0: no sequence per step", field="--training.global_batch_size",
                           fix="give the global batch, or -1 (local_batch_size x DP)")
    if gbs < 0:
        gbs = local * dp
    fp8 = "Float8LinearConverter" in (job_module or "") or config.endswith("float8") or config == "llama3_405b"
    # the converter's recipe_name (0.3.0: rowwise, its default, or rowwise_with_gw_hp)
    recipe = "rowwise_with_gw_hp" if fp8 and "recipe_name='rowwise_with_gw_hp'" in (job_module or "") else None
    compiled = bool(over.get("compile.enable", False))
    # the loss compiled with the blocks (components model,loss) or eager on fp32 logits (Plan.cross_entropy)
    loss = None if not compiled or "loss" in str(over.get("compile.components", "model,loss")).split(",") else "fp32"
    _tt_fp32_reduce(over.get("training.mixed_precision_reduce", "float32"), "--training.")
    rec = {"none": "none", "full": "full", "selective": "selective", "memory-budget": "selective"}.get(ac, "none")
    _tt_cp_balanced(over.get(p + "context_parallel_load_balancer", "headtail"), "--" + p)
    job = Job(model=name, seq_len=seq, global_batch=gbs, train_iterations=num("training.steps", 1),
              cp_kv_exchange="allgather" if cp > 1 else "ring",  # 0.3.0: PyTorch's all-gather (the export's doc)
              dtype="fp8" if fp8 else "bf16", fp8_recipe=recipe, attention="flash", framework="fsdp",
              torch_compile=compiled,
              async_tp=bool(over.get("compile.enable_async_tensor_parallel", False)))
    graphs = not over.get("training.disable_cuda_graphs", False)  # 0.3.0's TrainingConfig default: captured
    stack = resolve_stack(TORCHTITAN_RELEASE_STACKS["0.3"])
    if graphs and stack.launch != "cuda-graphs":  # was refused as "plan.cuda_graphs ... (rule stack-has-option)"
        raise HetplanError(f"the launch captures the forward and backward in CUDA graphs (torchtitan 0.3's default: "
                           f"training.disable_cuda_graphs = false, torchtitan/config/configs.py), which stack "
                           f"{stack.id} as hetplan prices it does not", field="--training.disable_cuda_graphs",
                           fix="add --training.disable_cuda_graphs (what hetplan export writes) to price the launch")
    return Plan(job=job, pools=[launch_pool(gpu, world, per_node)],
                stages=[Stage(num_layers=n, tp=tp, dp=dp, recompute=rec) for n in layers], mbs=mbs, zero=zero,
                virtual_stages=v, sequence_parallel=tp > 1 and bool(over.get(p + "enable_sequence_parallel", True)),
                cuda_graphs=graphs,
                schedule=_tt_schedule(over.get(p + "pipeline_parallel_schedule"), "--" + p),
                cp=cp, ep=ep, pipeline_chunks=tt_chunks, fsdp_shard=fsdp_shard, reshard_after_forward=reshard,
                cross_entropy=loss)


def import_torchtitan_toml(text: str, *, model: str | None = None, gpu: str = "H100-SXM", gpus: int | None = None,
                           launch: str = "") -> Plan:
    """The plan a torchtitan 0.2 TOML job config runs (``[model]``, ``[training]``, ``[parallelism]``,
    ``[activation_checkpoint]``); the world size from ``launch`` (torchrun) or ``gpus``."""
    try:
        cfg = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise HetplanError(f"the torchtitan TOML does not parse: {e}", field="config", fix="give a TOML file") from e
    par, tr = cfg.get("parallelism", {}), cfg.get("training", {})
    world, per_node = _world(_words(launch), gpus, "--nnodes", ("--nproc-per-node", "--nproc_per_node"))
    flavor = cfg.get("model", {}).get("flavor", "")
    name = model or {"8B": "llama3-8b", "70B": "llama3-70b", "405B": "llama3-405b"}.get(flavor) or (
        flavor.removeprefix("hetplan-") if flavor.startswith("hetplan-") else None)
    if name is None:
        raise HetplanError(f"torchtitan flavor {flavor!r} is no model hetplan knows", field="--model",
                           fix="give --model NAME")
    spec = load_model(name)
    tp, cp, ep, pp = (int(par.get(k, 1)) for k in ("tensor_parallel_degree", "context_parallel_degree",
                                                    "expert_parallel_degree", "pipeline_parallel_degree"))
    rep, shard = int(par.get("data_parallel_replicate_degree", 1)), int(par.get("data_parallel_shard_degree", -1))
    shard = _tt_shard(world, rep, tp, cp, pp, shard, "parallelism.")
    dp = rep * shard
    zero, fsdp_shard, reshard = _tt_sharding(rep, shard, cp, par.get("fsdp_reshard_after_forward"))
    if pp > 1:
        mbs = int(par.get("pipeline_parallel_microbatch_size", 1))
        layers, v = _tt_parts(par["module_fqns_per_model_part"], pp)
    else:
        mbs, layers, v = int(tr["local_batch_size"]), [spec.num_layers], 1
    comp = cfg.get("compile", {})
    fp8 = bool({"float8", "quantize.linear.float8"} & set(cfg.get("model", {}).get("converters", [])))
    float8 = cfg.get("quantize", {}).get("linear", {}).get("float8", cfg.get("float8", {}))
    # 0.2.x: recipe_name (rowwise, rowwise_with_gw_hp, tensorwise), or none: tensorwise (the float8 all-gather)
    recipe = str(float8.get("recipe_name") or "tensorwise") if fp8 else None
    if recipe not in (None, "tensorwise", "rowwise", "rowwise_with_gw_hp"):
        raise HetplanError(f"[quantize.linear.float8] recipe_name {recipe!r} is no torchao float8 recipe",
                           field="quantize.linear.float8.recipe_name",
                           fix="use tensorwise, rowwise or rowwise_with_gw_hp")
    _tt_cp_balanced(par.get("context_parallel_load_balancer", "headtail"), "parallelism.")
    rotate = par.get("context_parallel_rotate_method", "allgather")  # 0.2.x's default
    if rotate not in ("allgather", "alltoall"):
        raise HetplanError(f"context_parallel_rotate_method {rotate!r} is none of torchtitan's", field="parallelism."
                           "context_parallel_rotate_method", fix='give "allgather" or "alltoall"')
    job = Job(model=name, seq_len=int(tr["seq_len"]), global_batch=int(tr["global_batch_size"]),
              cp_kv_exchange="allgather" if cp > 1 and rotate == "allgather" else "ring",  # alltoall: the ring
              train_iterations=int(tr.get("steps", 1)), dtype="fp8" if fp8 else "bf16", fp8_recipe=recipe,
              attention="flash",
              framework="fsdp", torch_compile=bool(comp.get("enable", False)),
              stack=TORCHTITAN_RELEASE_STACKS["0.2"],  # the release that reads a TOML job config (0.2.x)
              async_tp=bool(par.get("enable_async_tensor_parallel", False)))
    rec = cfg.get("activation_checkpoint", {}).get("mode", "none")
    loss = None if not comp.get("enable", False) or "loss" in comp.get("components", ["model", "loss"]) else "fp32"
    _tt_fp32_reduce(tr.get("mixed_precision_reduce", "float32"), "training.")
    return Plan(job=job, pools=[launch_pool(gpu, world, per_node)],
                stages=[Stage(num_layers=n, tp=tp, dp=dp, recompute=rec) for n in layers], mbs=mbs, zero=zero,
                virtual_stages=v, sequence_parallel=tp > 1, cp=cp, ep=ep, fsdp_shard=fsdp_shard,
                reshard_after_forward=reshard, cross_entropy=loss,
                schedule=_tt_schedule(par.get("pipeline_parallel_schedule"), "parallelism."))


def _ds_count(cfg: dict, key: str) -> int | None:
    """A batch number of a DeepSpeed config: None when absent, else a whole number of 1 or more.

    Raises:
        HetplanError: naming ``key`` when it is ``"auto"`` (the Hugging Face Trainer fills it in), not a whole
            number, or below 1."""
    value = cfg.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        why = " (the Hugging Face Trainer fills it in)" if value == "auto" else ""
        raise HetplanError(f"{key} is {value!r}{why}; DeepSpeed needs a whole number of 1 or more", field=key,
                           fix=f"write the number the run uses for {key}")
    return value


def import_deepspeed(config: str, *, launch: str = "", pipeline: str | None = None, partition: str | None = None,
                     model: str | None = None, gpu: str = "H100-SXM", gpus: int | None = None,
                     seq_len: int | None = None) -> Plan:
    """The plan a DeepSpeed JSON config runs, with the launcher's arguments (``deepspeed --num_nodes N --num_gpus G
    train.py ... --pipeline-parallel-size P``), and hetplan's ``pipeline_module.json`` / ``hetplan_pipeline.py``
    when present (else DeepSpeed's ``uniform`` partition, ``ds_utils.partition_uniform``). The sequence length
    is the training script's, not the config's: from ``pipeline_module.json``, the launch's ``--seq-length``, or
    ``seq_len``.

    Raises:
        HetplanError: (among the launch's own errors) no sequence length anywhere, or ``seq_len`` contradicting
            the launch's."""
    try:
        cfg = json.loads(config)
    except json.JSONDecodeError as e:
        raise HetplanError(f"the DeepSpeed config does not parse: {e}", field="config", fix="give a JSON file") from e
    words = _words(launch)
    world, per_node = _world(words, gpus, "--num_nodes", ("--num_gpus",))
    pipe = json.loads(pipeline) if pipeline else {}
    pp = int(pipe.get("num_stages") or _opt(words, "--pipeline-parallel-size", "--pipeline_parallel_size") or 1)
    name = model or pipe.get("model")
    if not name:
        raise HetplanError("a DeepSpeed config does not name its model", field="--model", fix="give --model NAME")
    spec = load_model(name)
    if pp < 1 or world % pp:
        raise HetplanError(f"pipeline parallel size {pp} does not divide the {world} ranks", field="--pipeline-parallel-size",
                           fix="give a pipeline size of 1 or more that divides the world size")
    # DeepSpeed's runtime/config.py (_set_batch_related_parameters, _batch_assertion): a missing one of the three
    # batch numbers follows from the others; given, train_batch_size = micro-batch x accumulation x DP ranks
    dp = world // pp
    mbs = _ds_count(cfg, "train_micro_batch_size_per_gpu")
    if mbs is None:
        raise HetplanError("the DeepSpeed config does not set train_micro_batch_size_per_gpu", fix="give it",
                           field="train_micro_batch_size_per_gpu")
    gas = _ds_count(cfg, "gradient_accumulation_steps")
    gbs = _ds_count(cfg, "train_batch_size") or mbs * (gas or 1) * dp
    if gas is None and gbs % (mbs * dp) == 0:
        gas = gbs // (mbs * dp)
    if gbs != mbs * (gas or 0) * dp:
        raise HetplanError(f"train_batch_size {gbs} is not train_micro_batch_size_per_gpu {mbs} x "
                           f"gradient_accumulation_steps {gas if gas is not None else '(any)'} x data-parallel ranks "
                           f"{dp}; DeepSpeed refuses it", field="train_batch_size",
                           fix="make the three agree (or leave one of them out)")
    if partition:
        tree = ast.parse(partition)
        parts = next(ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign)
                     and getattr(n.targets[0], "id", "") == "PARTS")
        layers = [b - a for a, b in zip(parts, parts[1:])]
        layers[0] -= 1  # the embedding spec
        layers[-1] -= 1  # final norm + head
    else:
        layers = list(pipe.get("stage_layers") or balanced_split_ds(spec.num_layers, pp))
    rec = "full" if pipe.get("activation_checkpoint_interval") or "activation_checkpointing" in cfg else "none"
    if cfg.get("bf16", {}).get("enabled") and cfg.get("fp16", {}).get("enabled"):
        raise HetplanError("the DeepSpeed config enables both bf16 and fp16; DeepSpeed refuses the pair",
                           field="bf16", fix="enable one of bf16 and fp16")
    dtype = "bf16" if cfg.get("bf16", {}).get("enabled") else "fp16" if cfg.get("fp16", {}).get("enabled") else None
    if dtype is None:
        raise HetplanError("the DeepSpeed config trains in fp32; hetplan prices mixed precision", field="bf16",
                           fix='set "bf16": {"enabled": true}')
    zero_cfg = cfg.get("zero_optimization", {})
    launched = pipe.get("seq_len") or _opt(words, "--seq-length", "--seq_len")
    if launched is None and seq_len is None:
        raise HetplanError("the DeepSpeed launch does not give the sequence length (it lives in the training "
                           "script)", field="--seq-len", fix="give --seq-len, the tokens per sequence the script uses")
    if launched is not None and seq_len is not None and int(launched) != seq_len:
        raise HetplanError(f"--seq-len {seq_len} contradicts the launch's {launched}", field="--seq-len",
                           fix="leave --seq-len out, or correct the launch")
    job = Job(model=name, seq_len=int(launched if launched is not None else seq_len),
              global_batch=gbs, train_iterations=int(pipe.get("train_iterations") or 1), dtype=dtype,
              attention=pipe.get("attention", "flash"), attention_kernel=pipe.get("attention_kernel"),
              framework="deepspeed")
    return Plan(job=job, pools=[launch_pool(gpu, world, per_node)],
                stages=[Stage(num_layers=n, dp=dp, recompute=rec) for n in layers], mbs=mbs,
                zero=int(zero_cfg.get("stage", 0)), overlap_grad_reduce=bool(zero_cfg.get("overlap_comm", False)),
                grad_reduce_dtype=cfg.get("communication_data_type"))


#: The GPU type of a launch that names none (no ``--gpu``, no ``# hetplan gpu:`` line).
DEFAULT_GPU = "H100-SXM"


def hetplan_line(files: dict[str, str], key: str) -> str | None:
    """The value of the first ``# hetplan KEY: VALUE`` line of the launch files (hetplan's exports write ``model``
    and, for a plan on one GPU type, ``gpu``), else None."""
    pattern = re.compile(rf"^# hetplan {re.escape(key)}: (.+)$", re.M)
    return next((m.group(1).strip() for t in files.values() for m in [pattern.search(t)] if m), None)


def import_files(files: dict[str, str], *, model: str | None = None, gpu: str = DEFAULT_GPU,
                 gpus: int | None = None, seq_len: int | None = None) -> Plan:
    """The plan of a set of launch files (name -> text), whichever framework wrote them (see module doc); the
    model named by a ``# hetplan model: NAME`` line (hetplan's exports write one) when ``model`` is not given.

    Raises:
        HetplanError: no file of a known framework.
    """
    try:
        return _import_files(dict(files), model=model, gpu=gpu, gpus=gpus, seq_len=seq_len)
    except HetplanError:
        raise
    except ValidationError as e:  # a value the plan schema refuses (e.g. a zero batch in a hand-written launch)
        err = e.errors()[0]
        # a whole-plan rule (batch divisibility) has no location: the field is then the launch files; a plan
        # field the launch set is named as the launch spells it (LAUNCH_NAMES)
        where = ".".join(str(x) for x in err["loc"]) or "FILES"
        where = LAUNCH_NAMES.get((_launch_kind(dict(files)) or ("",))[0], {}).get(where, where)
        # the field is named once, and without pydantic's "Value error, " (it read "FILES: the launch gives a plan
        # the schema refuses: FILES: Value error, global_batch 1000 is not divisible ...")
        raise HetplanError(f"the launch gives a plan the schema refuses: {err['msg'].removeprefix('Value error, ')}",
                           field=where, fix="correct that value in the launch") from None
    except (KeyError, ValueError, TypeError, SyntaxError, StopIteration, ZeroDivisionError, IndexError,
            AttributeError, OverflowError) as e:  # OverflowError: int(inf), e.g. gradient_accumulation_steps = inf
        raise HetplanError(f"the launch files cannot be read as a plan: {type(e).__name__} {e}", field="FILES",
                           fix="give the launch as the framework reads it (hetplan export shows the form)") from None


#: Plan fields as each kind of launch (:func:`_launch_kind`) spells them, for the errors of values it set.
LAUNCH_NAMES = {
    "megatron": {"mbs": "--micro-batch-size", "seq_len": "--seq-length", "global_batch": "--global-batch-size",
                 "cp": "--context-parallel-size", "ep": "--expert-model-parallel-size",
                 "expert_tp": "--expert-tensor-parallel-size"},
    "torchtitan": {"mbs": "--training.local_batch_size", "seq_len": "--training.seq_len",
                   "global_batch": "--training.global_batch_size", "cp": "--parallelism.context_parallel_degree",
                   "ep": "--parallelism.expert_parallel_degree"},
    "deepspeed": {"mbs": "train_micro_batch_size_per_gpu", "global_batch": "train_batch_size"},
}
#: the TOML's keys are the command line's without the dashes
LAUNCH_NAMES["torchtitan-toml"] = {k: v.removeprefix("--") for k, v in LAUNCH_NAMES["torchtitan"].items()}


def _launch_kind(by: dict[str, str]) -> tuple[str, str] | None:
    """Which framework's launch the files are, with the text that says so (:func:`_import_files` reads it):
    ``deepspeed`` (its JSON config), ``torchtitan-toml`` (the TOML), ``torchtitan`` (its command line),
    ``megatron`` (the script or arguments file); None when none is."""
    tests = (("deepspeed", lambda n, t: n.endswith(".json") and "train_micro_batch_size_per_gpu" in t),
             ("torchtitan-toml", lambda n, t: n.endswith(".toml")),
             ("torchtitan", lambda n, t: "torchtitan.train" in t or re.search(r"(^|\s)--module[\s=]", t)),
             ("megatron", lambda n, t: "--num-layers" in t or "--tensor-model-parallel-size" in t))
    return next(((kind, t) for kind, test in tests for n, t in by.items() if test(n, t)), None)


def _import_files(by: dict[str, str], *, model: str | None, gpu: str, gpus: int | None,
                  seq_len: int | None = None) -> Plan:
    if model is None:
        model = hetplan_line(by, "model")
    kind, text = _launch_kind(by) or (None, "")
    launch = next((t for n, t in by.items() if n.endswith(".sh")), "")
    if kind == "deepspeed":
        return import_deepspeed(text, launch=launch, pipeline=by.get("pipeline_module.json"),
                                partition=by.get("hetplan_pipeline.py"), model=model, gpu=gpu, gpus=gpus,
                                seq_len=seq_len)
    if kind == "torchtitan-toml":
        return import_torchtitan_toml(text, model=model, gpu=gpu, gpus=gpus, launch=launch)
    if kind == "torchtitan":
        return import_torchtitan(text, model=model, gpu=gpu, gpus=gpus, job_module=by.get("hetplan_torchtitan_job.py"))
    if kind == "megatron":
        return import_megatron(text, model=model, gpu=gpu, gpus=gpus)
    raise HetplanError(f"found no Megatron-LM, torchtitan or DeepSpeed launch in {', '.join(by)}", field="FILES",
                       fix="give a Megatron-LM launch script or arguments file, a torchtitan launch or TOML, or a "
                           "DeepSpeed JSON config (with its launch script)")
