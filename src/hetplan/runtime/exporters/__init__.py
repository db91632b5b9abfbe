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
  DDP for ZeRO-0 (``data_parallel_replicate_degree``; priced as torchtitan 0.3.0 runs it, FSDP2 over one-rank
  shards: :func:`hetplan.estimate.memory.fsdp_shard_ranks`), FSDP2 for ZeRO-3 (``data_parallel_shard_degree``;
  HSDP's ``fsdp_shard`` as shard degree with ``dp / fsdp_shard`` replicas; ``fsdp_reshard_after_forward =
  "never"`` without ``reshard_after_forward``), FSDP2
  without resharding after forward for ZeRO-2 (``fsdp_reshard_after_forward = "never"``: parameters stay
  gathered from forward to backward, gradients and optimizer states sharded) and for ZeRO-1, which torchtitan
  lacks (gradients then also sharded: less memory than planned, the same communication volume); Llama-family
  models only (Llama 3 flavors ``8B`` / ``70B`` / ``405B`` by name, any other Llama shape registered as a flavor
  by ``hetplan_torchtitan_model.py``, imported through ``[experimental] custom_import``); bf16 or fp32 parameters
  (no fp16 mixed precision) over fp32 sharded master weights (a plan with ``fsdp_param_dtype`` or
  ``cross_entropy = "bf16"``, NeMo AutoModel's, is refused); the job's ``torch_compile`` as ``[compile] enable`` with ``components = ["model",
  "loss"]`` (``CompileConfig``, torchtitan ``torchtitan/config/job_config.py``; eager: ``enable = false``;
  ``["model"]`` for ``cross_entropy = "fp32"``, the loss left eager); the job's ``async_tp`` as ``[parallelism]
  enable_async_tensor_parallel = true``; a plan reducing gradients after the backward (``overlap_grad_reduce =
  false``) or in bf16 / fp16 (``grad_reduce_dtype``: torchtitan's ``mixed_precision_reduce`` is
  ``Literal["float32"]``, 0.2 and 0.3) is refused, and so are Transformer Engine's ``tp_comm_overlap``, attention other than ``flash`` (torchtitan runs SDPA's fused
  kernels), TP without sequence parallelism on 0.2 (always on there) and ZeRO-0 with CP (torchtitan's FSDP mesh
  is the shard degree x CP, so it shards over the CP ranks; HSDP's shard degree is written as ``fsdp_shard /
  cp``). Context parallelism's K/V exchange (``Job.cp_kv_exchange``): Megatron-LM ``--cp-comm-type all_gather``
  (else its p2p ring), torchtitan 0.2 ``context_parallel_rotate_method`` (``alltoall`` for the ring), 0.3 the
  all-gather only (PyTorch's); unbalanced CP (``cp_load_balance = false``) is refused by both (they always balance).
  Megatron-LM gets ``--grad-reduce-in-bf16`` for ``grad_reduce_dtype = "bf16"``.

FP8 plans (``dtype = "fp8"``, :mod:`hetplan.estimate.fp8`): Megatron-LM gets ``--bf16`` plus the FP8 recipe the
estimate assumed (``--fp8-format hybrid --fp8-recipe delayed --fp8-amax-history-len 1024 --fp8-amax-compute-algo
max --fp8-param-gather`` on Hopper, ``--fp8-format e4m3 --fp8-recipe mxfp8 --fp8-param-gather`` on Blackwell);
torchtitan the float8 converter (``[model] converters = ["float8"]``, ``[float8]`` with the FSDP2 float8
all-gather, the output head filtered out; the float8 casts are fused only under ``[compile] enable``, torchtitan
``docs/float8.md``, which the job's default ``torch_compile`` sets); DeepSpeed refuses (no FP8 in its config).
A recipe the plan names (``Job.fp8_recipe``, priced) that the target release does not run is refused (rule
``framework-can-launch``: a torchao recipe to Megatron-LM, Transformer Engine's to torchtitan); torchtitan 0.3.0's
lack of ``tensorwise`` is refused already by rule ``stack-has-option`` (stacks.toml ``fp8_recipes``).

The package: :mod:`.common` (targets, releases, :class:`Export`, the one device mesh and the other checks every
target needs), one module per target (:mod:`.megatron`, :mod:`.deepspeed`, :mod:`.torchtitan`), and :func:`export`
here, which applies what all targets share (the plan rules, the release's launch check, the stack and network notes)
and dispatches.
"""

from __future__ import annotations

from hetplan.errors import HetplanError
from hetplan.hardware.stacks import default_stack, resolve_stack
from hetplan.model.spec import ModelSpec
from hetplan.plan import Plan
from hetplan.plan_rules import check_plan, launch_violations
from hetplan.runtime.exporters.common import TARGET_FRAMEWORK, TARGETS, VERSIONS, Export, _mesh, release
from hetplan.runtime.exporters.deepspeed import balanced_split_ds, export_deepspeed
from hetplan.runtime.exporters.megatron import export_megatron, megatron_layout
from hetplan.runtime.exporters.torchtitan import (TORCHTITAN_03_MODELS, TORCHTITAN_FLAVORS, TORCHTITAN_RELEASE_STACKS,
                                                  export_torchtitan)

__all__ = ["TARGETS", "TARGET_FRAMEWORK", "TORCHTITAN_03_MODELS", "TORCHTITAN_FLAVORS", "VERSIONS", "Export",
           "balanced_split_ds", "export", "export_deepspeed", "export_megatron", "export_torchtitan",
           "launch_refusal", "megatron_layout", "release"]


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
    if virtual_stages is not None and plan.pp > 1 and virtual_stages != plan.virtual_stages:
        # an override of the plan's interleaving launches another schedule (bubble, memory) than the one priced
        out.notes.append(f"the plan was priced with {plan.virtual_stages} virtual stage(s) per rank; this launch "
                         f"interleaves {virtual_stages}: re-estimate the plan with virtual_stages = {virtual_stages} "
                         "to price what runs")
    # What each target writes is its framework's default stack (hetplan.hardware.stacks.FRAMEWORK_STACK); a plan
    # priced under another stack (Job.stack) was priced for software this export does not launch.
    written = (resolve_stack(TORCHTITAN_RELEASE_STACKS[release(t, version)]) if t == "torchtitan"
               else default_stack(TARGET_FRAMEWORK[t]))  # torchtitan: the release written (0.2: its TOML)
    priced = plan.job.stack_spec()
    if priced.id != written.id:
        out.notes.append(f"the plan was priced for stack {priced.id}; this export launches {written.id}, whose "
                         f"numbers differ: re-estimate with --stack {written.id} to price what runs")
    gpus = {pool.gpu for pool in plan.pools}
    if len(gpus) == 1:  # `hetplan import` reads it back: the launch itself names no GPU type
        _head_line(out, f"# hetplan gpu: {gpus.pop()}")
    if any(pool.network == "ethernet" for pool in plan.pools):
        # The estimate assumed NCCL's socket transport (hetplan.estimate.comm.NETWORKS); say so where NCCL reads it.
        _head_line(out, "export NCCL_IB_DISABLE=1  # nodes joined by Ethernet without RDMA (GPUPool.network): NCCL "
                        "sockets; set NCCL_SOCKET_IFNAME to the data-network interface")
        out.notes.append("Ethernet between nodes: launch with NCCL_IB_DISABLE=1 and NCCL_SOCKET_IFNAME set")
    return out


def launch_refusal(plan: Plan, spec: ModelSpec) -> dict | None:
    """What ``hetplan export`` answers for ``plan``'s own framework (its target in :data:`TARGET_FRAMEWORK`, the
    target's default release) when it cannot write the launch: ``{"target", "field", "message", "fix"}``, else
    None. The estimate prices the job's framework running the plan, so a refusal means the numbers describe a run
    that no export here launches (e.g. Gemma's post-norms under Megatron-LM's ``pretrain_gpt.py``)."""
    target = next(t for t, fw in TARGET_FRAMEWORK.items() if fw == plan.job.framework)
    try:
        export(plan, spec, target)
    except HetplanError as e:
        return {"target": target, "field": e.field, "message": e.message, "fix": e.fix}
    return None


def _head_line(out: Export, line: str) -> None:
    """Put ``line`` at the top of every launch script of ``out`` (after its ``#!`` line)."""
    for name, text in out.files.items():
        if name.endswith(".sh"):
            head, sep, rest = text.partition("\n") if text.startswith("#!") else ("", "", text)
            out.files[name] = f"{head}{sep}{line}\n{rest}"
