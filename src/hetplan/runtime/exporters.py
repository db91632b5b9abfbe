"""Hand a plan to a training framework: the launch arguments / config files Megatron-LM, DeepSpeed and torchtitan
accept. No torch.

What each target can express (else :class:`~hetplan.errors.HetplanError` says what and how to change the plan):

* **Megatron-LM** (``pretrain_gpt.py`` arguments; Megatron-Core >= 0.10): one TP and one DP degree for all stages;
  uneven pipelines only as "first and/or last stage differ, the middle stages equal"
  (``--decoder-first-pipeline-num-layers`` / ``--decoder-last-pipeline-num-layers``); ZeRO-1 as
  ``--use-distributed-optimizer``; ZeRO-2/3 not offered (use torchtitan's FSDP2); no GPipe (Megatron runs 1F1B).
* **DeepSpeed** (``ds_config.json`` + ``PipelineModule`` arguments): no tensor parallelism in ``PipelineModule``
  (use Megatron-DeepSpeed, i.e. the Megatron export); ``partition_method`` has no per-stage layer counts, so only
  the balanced split ``uniform`` gives (Espresso patched ``_partition_layers`` for uneven ones); pipeline
  parallelism with ZeRO-2/3 is not supported by DeepSpeed.
* **torchtitan** (TOML job config): uneven splits through ``pipeline_parallel_split_points`` (the first layer name
  of every stage after the first); one TP/DP degree for all stages; FSDP2 for ZeRO-3 (``data_parallel_shard_degree``)
  else DDP (``data_parallel_replicate_degree``); ZeRO-1/2 have no torchtitan equivalent (exported as FSDP with a
  note); schedules 1F1B, GPipe, Interleaved1F1B.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from hetplan.errors import HetplanError
from hetplan.model.spec import ModelSpec
from hetplan.plan import Plan
from hetplan.plan_rules import check_plan

TARGETS = ("megatron", "deepspeed", "torchtitan")


@dataclass
class Export:
    """An export: ``files`` (name -> text) and ``notes`` (what was approximated, one sentence each)."""

    target: str
    files: dict[str, str]
    notes: list[str] = field(default_factory=list)


def _uniform(plan: Plan, what: str) -> tuple[int, int]:
    layouts = {plan.stage_layout(i) for i in range(plan.pp)}
    tps, dps = {lay.tp for lay in layouts}, {lay.dp for lay in layouts}
    if len(layouts) > 1:
        raise HetplanError(f"{what} runs one TP and one DP degree on all stages; this plan has TP {sorted(tps)} "
                           f"and DP {sorted(dps)}", field="plan.stages[].tp/dp",
                           fix="give every stage the same tp and dp, or run it with `hetplan run`")
    recs = {st.recompute for st in plan.stages}
    if len(recs) > 1:
        raise HetplanError(f"{what} applies one activation-recomputation setting to all stages; the plan has "
                           f"{sorted(recs)}", field="plan.stages[].recompute", fix="use one recompute mode")
    return tps.pop(), dps.pop()


def _nodes(plan: Plan) -> tuple[int, int]:
    per_node = min(plan.pools[st.pool].gpus_per_node for st in plan.stages)
    n = plan.num_gpus
    return (max(1, -(-n // per_node)), min(n, per_node))


def export_megatron(plan: Plan, spec: ModelSpec, virtual_stages: int | None = None) -> Export:
    """Megatron-LM ``pretrain_gpt.py`` arguments, as a torchrun launch script (see module doc).

    Raises:
        HetplanError: per-stage TP/DP/recompute differ, an uneven split beyond first/last stage, ZeRO-2/3, GPipe.
    """
    tp, dp = _uniform(plan, "Megatron-LM")
    pp = plan.pp
    notes = []
    if plan.zero >= 2:
        raise HetplanError(f"Megatron-LM has no ZeRO-{plan.zero}", field="plan.zero",
                           fix="use zero 0 or 1 (distributed optimizer), or export --to torchtitan for FSDP")
    if plan.schedule == "gpipe" and pp > 1:
        raise HetplanError("Megatron-LM schedules pipelines with 1F1B only", field="plan.schedule",
                           fix="use schedule 1f1b (or export --to torchtitan / deepspeed)")
    layers = [st.num_layers for st in plan.stages]
    args = [
        f"--tensor-model-parallel-size {tp}", f"--pipeline-model-parallel-size {pp}",
        f"--num-layers {spec.num_layers}", f"--hidden-size {spec.hidden_size}",
        f"--num-attention-heads {spec.num_attention_heads}", f"--ffn-hidden-size {spec.ffn_hidden_size}",
        f"--seq-length {plan.job.seq_len}", f"--max-position-embeddings {max(spec.max_seq_len, plan.job.seq_len)}",
        f"--micro-batch-size {plan.mbs}", f"--global-batch-size {plan.job.global_batch}",
        f"--train-iters {int(plan.job.iterations())}", f"--{plan.job.dtype}",
        "--lr 1e-4", "--optimizer adam", "--mock-data", "--tokenizer-type NullTokenizer",
        f"--vocab-size {spec.vocab_size}",
    ]
    if pp > 1 and len(set(layers)) > 1:
        mid = layers[1:-1]
        if len(set(mid)) > 1:
            raise HetplanError(f"Megatron-LM can make only the first and last pipeline stages uneven; this plan's "
                               f"middle stages hold {mid} layers", field="plan.stages[].num_layers",
                               fix="make the middle stages equal, or export --to torchtitan (any split)")
        if mid:
            if layers[0] != mid[0]:
                args.append(f"--decoder-first-pipeline-num-layers {layers[0]}")
            if layers[-1] != mid[0]:
                args.append(f"--decoder-last-pipeline-num-layers {layers[-1]}")
        else:  # two stages
            args.append(f"--decoder-first-pipeline-num-layers {layers[0]}")
            args.append(f"--decoder-last-pipeline-num-layers {layers[1]}")
    if virtual_stages and virtual_stages > 1:
        if len(set(layers)) > 1 or layers[0] % virtual_stages:
            raise HetplanError("Megatron-LM's interleaved schedule needs equal stages divisible by the virtual stages",
                               field="--virtual-stages", fix="use a balanced split or no interleaving")
        args.append(f"--num-layers-per-virtual-pipeline-stage {layers[0] // virtual_stages}")
    if plan.zero == 1:
        args.append("--use-distributed-optimizer")
    if plan.sequence_parallel and tp > 1:
        args.append("--sequence-parallel")
    if plan.overlap_grad_reduce:
        args.append("--overlap-grad-reduce")
    if plan.job.attention == "flash":  # the estimate assumed FlashAttention (hetplan.plan.Job.attention)
        args.append("--use-flash-attn")
    rec = plan.stages[0].recompute
    if rec == "full":
        args += ["--recompute-granularity full", "--recompute-method uniform", "--recompute-num-layers 1"]
    elif rec == "selective":
        args.append("--recompute-granularity selective")
    if spec.family in ("llama", "mistral"):
        args += ["--swiglu", "--normalization RMSNorm", "--position-embedding-type rope", "--disable-bias-linear"]
        if spec.num_kv_heads != spec.num_attention_heads:
            args += ["--group-query-attention", f"--num-query-groups {spec.num_kv_heads}"]
    elif spec.learned_positions == 0:
        args.append("--position-embedding-type rope")
    if not spec.tied_embeddings:
        args.append("--untie-embeddings-and-output-weights")
    if spec.dropout:
        args += ["--attention-dropout 0.1", "--hidden-dropout 0.1"]
    else:
        args += ["--attention-dropout 0.0", "--hidden-dropout 0.0"]
    nnodes, per_node = _nodes(plan)
    script = "\n".join([
        "#!/usr/bin/env bash",
        (f"# Megatron-LM launch for plan: {pp} stages {layers} layers, TP {tp}, DP {dp}, mbs {plan.mbs}, "
         f"gbs {plan.job.global_batch}, model {spec.name}. Generated by hetplan export."),
        "# Run on every node; set NODE_RANK and MASTER_ADDR. Ranks: TP innermost, then DP, then PP (Megatron order).",
        f"torchrun --nnodes {nnodes} --nproc-per-node {per_node} --node-rank ${{NODE_RANK:-0}} \\",
        "  --master-addr ${MASTER_ADDR:-127.0.0.1} --master-port ${MASTER_PORT:-6000} \\",
        "  pretrain_gpt.py \\",
        "  " + " \\\n  ".join(args),
        "",
    ])
    if pp > 1 and len(set(layers)) > 1:
        notes.append("uneven split via --decoder-first/last-pipeline-num-layers (Megatron-Core >= 0.10)")
    if spec.family == "opt":
        notes.append("OPT's ReLU MLP and position offset are approximated by Megatron's GPT (GeLU) model")
    return Export("megatron", {"megatron_launch.sh": script}, notes)


def export_deepspeed(plan: Plan, spec: ModelSpec) -> Export:
    """DeepSpeed ``ds_config.json`` and the ``PipelineModule`` arguments (see module doc).

    Raises:
        HetplanError: TP > 1, an uneven split, per-stage DP differences, ZeRO-2/3 with pipeline parallelism.
    """
    tp, dp = _uniform(plan, "DeepSpeed")
    pp = plan.pp
    if tp > 1:
        raise HetplanError("DeepSpeed's PipelineModule has no tensor parallelism", field="plan.stages[].tp",
                           fix="use tp 1, or export --to megatron (Megatron-DeepSpeed takes the same arguments)")
    layers = [st.num_layers for st in plan.stages]
    if pp > 1 and plan.zero >= 2:
        raise HetplanError(f"DeepSpeed does not combine pipeline parallelism with ZeRO-{plan.zero}", field="plan.zero",
                           fix="use zero 0 or 1 with pp > 1")
    if pp > 1 and layers != balanced_split_ds(spec.num_layers, pp):
        bounds = [0]
        for n in layers:
            bounds.append(bounds[-1] + n)
        raise HetplanError(
            f"DeepSpeed's PipelineModule cannot take per-stage layer counts {layers} (partition_method is 'uniform', "
            f"'parameters' or 'type:regex'); stage boundaries would be {bounds}", field="plan.stages[].num_layers",
            fix=f"use the uniform split {balanced_split_ds(spec.num_layers, pp)}, override "
                "PipelineModule._partition_layers with these boundaries, or export --to torchtitan")
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
    if plan.stages[0].recompute != "none":
        cfg["activation_checkpointing"] = {"partition_activations": False, "contiguous_memory_optimization": False}
    pipe = {"num_stages": pp, "partition_method": "uniform", "activation_checkpoint_interval":
            1 if plan.stages[0].recompute == "full" else 0, "world_size": plan.num_gpus, "data_parallel_size": dp,
            "stage_layers": layers, "model": spec.name, "seq_len": plan.job.seq_len}
    notes = []
    if plan.stages[0].recompute == "selective":
        notes.append("DeepSpeed has no selective recomputation: exported as activation checkpointing disabled per layer")
    nnodes, per_node = _nodes(plan)
    launch = (f"deepspeed --num_nodes {nnodes} --num_gpus {per_node} train.py --deepspeed "
              f"--deepspeed_config ds_config.json --pipeline-parallel-size {pp}\n")
    return Export("deepspeed", {"ds_config.json": json.dumps(cfg, indent=2) + "\n",
                                "pipeline_module.json": json.dumps(pipe, indent=2) + "\n",
                                "launch.sh": launch}, notes)


def balanced_split_ds(num_layers: int, pp: int) -> list[int]:
    """DeepSpeed's ``uniform`` partition of ``num_layers`` layers (``ds_utils.partition_uniform``): the first
    ``num_layers % pp`` stages get one more layer."""
    q, r = divmod(num_layers, pp)
    return [q + (1 if i < r else 0) for i in range(pp)]


def export_torchtitan(plan: Plan, spec: ModelSpec, virtual_stages: int | None = None) -> Export:
    """A torchtitan TOML job config (see module doc).

    Raises:
        HetplanError: per-stage TP/DP/recompute differ.
    """
    tp, dp = _uniform(plan, "torchtitan")
    pp = plan.pp
    notes = []
    split, start = [], 0
    for st in plan.stages[:-1]:
        start += st.num_layers
        split.append(f"layers.{start}")
    sched = {"1f1b": "1F1B", "gpipe": "GPipe"}[plan.schedule]
    if virtual_stages and virtual_stages > 1:
        sched = "Interleaved1F1B"
        notes.append("interleaved: torchtitan splits each rank's layers into virtual stages itself")
    dp_key = "data_parallel_shard_degree" if plan.zero >= 1 else "data_parallel_replicate_degree"
    if plan.zero in (1, 2):
        notes.append(f"ZeRO-{plan.zero} has no torchtitan equivalent; exported as FSDP2 (ZeRO-3)")
    dtype = {"bf16": "bfloat16", "fp16": "float16"}[plan.job.dtype]
    ac = {"none": "none", "selective": "selective", "full": "full"}[plan.stages[0].recompute]
    flavor = "llama3" if spec.family in ("llama", "mistral") else "custom"
    if flavor == "custom":
        notes.append(f"torchtitan ships Llama-family models; register a {spec.family} model for {spec.name}")
    lines = [
        f"# torchtitan job config generated by hetplan export: {pp} stages {[st.num_layers for st in plan.stages]}",
        "[job]", 'description = "hetplan plan"', "",
        "[model]", f'name = "{flavor}"', f'flavor = "{spec.name}"',
        (f"# shapes: layers {spec.num_layers}, hidden {spec.hidden_size}, heads {spec.num_attention_heads}, "
         f"kv heads {spec.num_kv_heads}, ffn {spec.ffn_hidden_size}, vocab {spec.vocab_size}"), "",
        "[training]", f"local_batch_size = {plan.job.global_batch // dp}", f"seq_len = {plan.job.seq_len}",
        f"steps = {int(plan.job.iterations())}", f'mixed_precision_param = "{dtype}"', "",
        "[parallelism]", f"{dp_key} = {dp}", f"tensor_parallel_degree = {tp}",
        "enable_async_tensor_parallel = false", f"pipeline_parallel_degree = {pp}",
        f"pipeline_parallel_microbatch_size = {plan.mbs}", f'pipeline_parallel_schedule = "{sched}"',
        f"pipeline_parallel_split_points = {json.dumps(split)}", "",
        "[activation_checkpoint]", f'mode = "{ac}"', "",
    ]
    if plan.sequence_parallel and tp > 1:
        notes.append("torchtitan's TP always uses sequence parallelism")
    nnodes, per_node = _nodes(plan)
    launch = (f"torchrun --nnodes {nnodes} --nproc-per-node {per_node} -m torchtitan.train "
              f"--job.config_file torchtitan.toml\n")
    return Export("torchtitan", {"torchtitan.toml": "\n".join(lines), "launch.sh": launch}, notes)


def export(plan: Plan, spec: ModelSpec, target: str, virtual_stages: int | None = None) -> Export:
    """Export ``plan`` for ``target`` (``megatron``, ``deepspeed``, ``torchtitan``).

    Raises:
        HetplanError: unknown target, or the plan needs something the target cannot express (see module doc).
    """
    t = target.lower().strip()
    check_plan(plan, spec)
    if t == "megatron":
        out = export_megatron(plan, spec, virtual_stages)
    elif t == "deepspeed":
        out = export_deepspeed(plan, spec)
    elif t == "torchtitan":
        out = export_torchtitan(plan, spec, virtual_stages)
    else:
        raise HetplanError(f"unknown export target {target!r}", field="--to", fix=f"use one of {', '.join(TARGETS)}")
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
