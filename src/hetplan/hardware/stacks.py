"""Software stacks as data: what each training framework release runs, read from ``data/stacks.toml``.

A *stack* is a framework and release (Megatron-LM 2.5, Megatron-Core 0.15, NeMo 24.07, DeepSpeed's pipeline
engine, torchtitan, llm-foundry, ...). What a step costs depends on it as much as on the GPU: the GEMM path
(Transformer Engine or cuBLAS through torch), the attention kernel on each GPU generation, which ops are fused,
whether sequence parallelism and TP-communication overlap exist, when data-parallel gradients are reduced, eager
launch or CUDA graphs or ``torch.compile``, how the optimizer lays out memory, the allocator. Each release is one
:class:`StackSpec`, every field with its source (release notes, launcher defaults, code paths) in the data file.

A release is in force from its ``released`` month until the next release of the same name, so
``NAME@YYYY-MM`` names the release a run of that month used (:func:`resolve_stack`). ``Job.stack`` takes
``NAME``, ``NAME@VERSION`` or ``NAME@YYYY-MM``; a job without one runs its framework's default stack
(:func:`default_stack`), which is what ``hetplan export`` writes for that framework: Megatron-LM's current
Megatron-Core for ``megatron``, DeepSpeed for ``deepspeed``, torchtitan for ``fsdp``.
"""

from __future__ import annotations

import difflib
import re
from functools import lru_cache
from importlib import resources
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from hetplan.errors import HetplanError
from hetplan.inputs import parse_toml, validation_message

#: The stacks' names as the projects spell themselves.
STACK_NAMES = ("megatron-lm", "nemo", "megatron-deepspeed", "deepspeed", "torchtitan", "llm-foundry",
               "hf-accelerate", "nemo-automodel", "fms-fsdp")
#: Other names users give the stacks (spaces and underscores read as hyphens, any case): Megatron-Core is the
#: library inside Megatron-LM's releases (NVIDIA/Megatron-LM ``megatron/core``); llm-foundry trains through
#: MosaicML Composer's ``Trainer``; Accelerate is what the Hugging Face Trainer runs FSDP and DeepSpeed through
#: (``transformers`` ``trainer.py``: ``Accelerator``).
STACK_ALIASES = {"megatron-core": "megatron-lm", "mcore": "megatron-lm", "megatron": "megatron-lm",
                 "composer": "llm-foundry", "mosaicml-composer": "llm-foundry", "accelerate": "hf-accelerate",
                 "hf-trainer": "hf-accelerate", "transformers": "hf-accelerate",
                 "huggingface-accelerate": "hf-accelerate", "automodel": "nemo-automodel"}
#: The stack each framework runs when a job names none: what ``hetplan export`` writes for it (Megatron-LM
#: ``pretrain_gpt.py`` arguments of current Megatron-Core, a DeepSpeed ``ds_config.json``, torchtitan 0.3.0's
#: ``--module/--config`` launch; :mod:`hetplan.runtime.exporters`). Its latest release.
FRAMEWORK_STACK = {"megatron": "megatron-lm", "deepspeed": "deepspeed", "fsdp": "torchtitan"}
#: The behaviour fields of a stack; each but ``framework`` (hetplan's own family, :class:`hetplan.plan.Job`) needs
#: a source in the data file.
FIELDS = ("framework", "gemm", "attention", "attention_kernel", "fused", "sequence_parallel", "tp_comm_overlap",
          "wgrad_accumulation", "dp_overlap", "launch", "zero", "recompute", "optimizer_memory", "allocator",
          "parallel", "interleaved", "projections")
#: The parallel dimensions a release may run (``StackSpec.parallel``): data, tensor, pipeline, context, expert.
PARALLEL_DIMS = ("dp", "tp", "pp", "cp", "ep")
ParallelDim = Literal["dp", "tp", "pp", "cp", "ep"]
#: Kernel names of ``attention_kernel`` (:data:`hetplan.hardware.catalog.ATTENTION_KERNELS`).
StackKernel = Literal["fa2", "fa3", "cudnn", "triton"]
FusedOp = Literal["norm", "rope", "cross-entropy", "adam", "softmax", "bias-act"]
#: FP8 scaling recipes a stack can run (:mod:`hetplan.estimate.fp8`): torchao float8's ``tensorwise``,
#: ``rowwise`` and ``rowwise_with_gw_hp``, and MXFP8.
StackFp8Recipe = Literal["tensorwise", "rowwise", "rowwise_with_gw_hp", "mxfp8"]
#: How a release's model code runs a dense layer's input projections (``StackSpec.projections``).
Projections = Literal["fused", "separate", "fused-qkv"]
_MONTH = re.compile(r"^(\d{4})-(\d{2})(?:-\d{2})?$")
#: A release label as the projects number them: an optional prefix, then dot-separated numbers (``22.09``,
#: ``core_r0.12``, ``0.3.0``).
_NUMBERED = re.compile(r"^([a-z_]*)(\d+(?:\.\d+)*)$")


def _numbered(version: str) -> tuple[str, int, tuple[int, ...]] | None:
    """``(prefix, digits of the first number, numbers)`` of a numbered label, None for any other."""
    m = _NUMBERED.match(version.lower())
    if m is None:
        return None
    parts = m.group(2).split(".")
    return m.group(1), len(parts[0]), tuple(int(x) for x in parts)


def _release_before(releases: list, version: str):
    """The listed release a numbered ``version`` that is not listed falls under: the highest listed label of the
    same numbering (prefix and digits of the first number) not above it, the numbers compared as versions are
    (missing ones 0), None if there is none (``nemo@22.11`` -> ``22.09``; ``megatron-lm@core_r0.13.1`` ->
    ``core_r0.12``; ``deepspeed@0.9`` -> ``0.6.2``, ``deepspeed@0.6.1`` -> ``0.6.0``; ``nemo@21.12``, before the first:
    None)."""
    want = _numbered(version)
    if want is None:
        return None

    def padded(numbers: tuple[int, ...]) -> tuple[int, ...]:
        return numbers + (0,) * (8 - len(numbers))

    below = [(padded(n[2]), r) for r in releases if (n := _numbered(r.version)) is not None
             and n[:2] == want[:2] and padded(n[2]) <= padded(want[2])]
    return max(below, key=lambda x: x[0])[1] if below else None


def _beyond(releases: list, version: str) -> bool:
    """Whether a numbered ``version`` is a newer major or minor release than the latest listed, numbered alike
    (``megatron-lm@core_r0.16`` past ``core_r0.15``, ``deepspeed@0.17``): the catalog cannot know what it changed.
    A patch of the latest listed minor release (``deepspeed@0.16.3``, ``torchtitan@0.3.1``) is that release."""
    want, last = _numbered(version), _numbered(releases[-1].version)
    return want is not None and last is not None and want[:2] == last[:2] and want[2][:2] > last[2][:2]


def _series_end(releases: list, version: str):
    """The last listed release of the numbering a ``version`` shares (prefix and digits of the first number) when a
    later listed release is numbered otherwise and ``version`` is a newer major or minor release than it, else None:
    that numbering ended there (Megatron-LM's tags ``v2.0`` … ``v3.0.2`` gave way to ``23.04`` and ``core_r0.x``),
    so ``megatron-lm@4.0`` names no release, where it resolved to ``3.0`` of 2022."""
    want = _numbered(version)
    if want is None:
        return None
    same = [r for r in releases if (n := _numbered(r.version)) is not None and n[:2] == want[:2]]
    if not same or same[-1] is releases[-1]:
        return None
    last = _numbered(same[-1].version)
    return same[-1] if want[2][:2] > last[2][:2] else None


_YY_MM = re.compile(r"^(\d{2})\.(\d{2})$")

#: Numbered releases of stacks whose catalog entries are months, with the month of the tagged commit: a
#: ``NAME@VERSION`` of one resolves as that month. torchtitan: ``git tag`` of pytorch/torchtitan, ``v0.1.0``
#: 2025-06-17, ``v0.2.0`` 2025-10-17, ``v0.2.1`` 2025-12-26, ``v0.2.2`` 2026-02-20 (``git log -1 --format=%ad``).
TAG_MONTHS = {"torchtitan": {"0.1.0": "2025-06", "0.2.0": "2025-10", "0.2.1": "2025-12", "0.2.2": "2026-02"}}


def _from_git_tag(version: str) -> str:
    """A release as its project's git tag spells it, in the catalog's spelling: DeepSpeed's and torchtitan's
    ``v0.9.2`` is ``0.9.2``; Megatron-LM's tag ``core_v0.12.1`` names the release of branch ``core_r0.12.0``
    (``git tag`` / ``git branch -r`` of NVIDIA/Megatron-LM), ``core_r0.12.1`` here. Other labels unchanged."""
    return re.sub(r"^(core_)?v(?=\d)", lambda m: "core_r" if m.group(1) else "", version.strip(), flags=re.I)


def _month_label(releases: tuple | list, version: str) -> str | None:
    """``YYYY-MM`` of a ``YY.MM`` label of a stack whose ``YY.MM`` labels name months (each listed one released
    in the month it names: NeMo's containers, ``megatron-lm@23.04``, Megatron-LM's main of 2023-04), else None.
    Such a label resolves as that month: ``megatron-lm@24.01`` is the release in force in 2024-01 (``core_r0.4``),
    not the ``23.04`` that a comparison of numbers would give."""
    m = _YY_MM.match(version)
    listed = [(r, n) for r in releases if (n := _YY_MM.match(r.version))]
    if m is None or not listed:
        return None
    if all(r.released == f"20{n.group(1)}-{n.group(2)}" for r, n in listed):
        return f"20{m.group(1)}-{m.group(2)}"
    return None


class StackSpec(BaseModel):
    """One release of a software stack (fields: the data file's header; all with sources).

    Attributes:
        name, version: the stack (:data:`STACK_NAMES`) and its release label; ``released``: ``YYYY-MM``.
        framework: hetplan's framework family whose memory and pipeline terms apply (``Job.framework``).
        gemm: ``transformer-engine`` or ``cublas`` (torch's matmul).
        attention: ``standard`` | ``eager`` | ``flash`` (``Job.attention``).
        attention_kernel: the fused kernel under flash by GPU family, ``default`` for the others.
        fused: the ops that run as fused kernels.
        sequence_parallel, tp_comm_overlap: available or not.
        wgrad_accumulation: how a micro-batch's weight gradients reach the accumulator: ``fused`` (the
            weight-gradient GEMM accumulates into it), ``separate`` (the GEMM writes a 16-bit gradient that a
            separate kernel adds in), ``fused-with-pipeline`` (fused only in a pipeline, PP > 1);
            :meth:`separate_wgrad_accumulation`.
        dp_overlap: ``bucketed`` | ``none`` | ``ddp-only`` | ``after-last-microbatch`` | ``single-stage``.
        launch: ``eager`` | ``cuda-graphs`` | ``compiled``.
        zero: ZeRO stages it runs (under ``fsdp``: its sharding modes, 0 = DDP replication, 3 = full sharding).
        recompute: the activation-recomputation modes it offers (the searches enumerate only these).
        parallel: the parallel dimensions its launcher runs (:data:`PARALLEL_DIMS`; ``dp`` always): ``tp``, ``pp``,
            ``cp`` (context parallelism), ``ep`` (expert parallelism). Every search enumerates only these and
            rule ``stack-has-option`` refuses a plan using another (:meth:`has`).
        interleaved: it runs interleaved 1F1B with virtual stages (Narayanan et al. SC'21 Sec. 2.2.2).
        optimizer_memory: ``megatron`` | ``deepspeed`` | ``fsdp1`` | ``fsdp2``.
        projections: how the release's model code runs a dense layer's input projections, each a GEMM of its
            own shape (:func:`hetplan.estimate.compute.attention_linear_shapes`,
            :func:`hetplan.estimate.compute.mlp_linear_shapes`): ``fused`` (one QKV GEMM and one gate/up GEMM:
            Megatron's ``query_key_value`` / ``linear_qkv`` and ``linear_fc1``, MPT's ``Wqkv``), ``separate``
            (``wq``, ``wk``, ``wv`` and ``w1``, ``w3``: torchtitan's Llama before 2026-06, Hugging Face's
            ``q_proj`` ... ``up_proj``) or ``fused-qkv`` (one QKV GEMM, separate gate and up: torchtitan since
            pytorch/torchtitan#3714); :func:`hetplan.estimate.compute.separate_qkv`,
            :func:`hetplan.estimate.compute.separate_gate_up`.
        allocator: ``caching`` | ``expandable-segments``.
        bf16_optimizer: bf16 runs use DeepSpeed's ``BF16_Optimizer`` (``deepspeed/runtime/bf16_optimizer.py``; the
            pipeline engine's only bf16 path in 2022): every micro-batch's 16-bit gradients are accumulated into
            an fp32 gradient buffer of the whole model, which ``ReduceGrads`` all-reduces in fp32; fp32 master
            weights and Adam moments of the owned partition (its own ZeRO-1), the updated 16-bit weights
            all-gathered after the step. False unless its source says so.
        bf16_optimizer_zero: the ds_config ZeRO stages whose bf16 runs go to BF16_Optimizer (the 2022 branch:
            0 and 1, hetplan's ZeRO-1 standing for its own partitioning under stage 0; DeepSpeed v0.16: 0 only,
            ZeRO-1 accumulating in bf16 through its own optimizer).
        attention_unpad: the fused attention kernels the stack calls through flash-attn's ``bert_padding``: the
            Q, K, V gathered into unpadded (token, head, dim) tensors before the varlen kernel and its output
            scattered back into the padded batch (:func:`hetplan.estimate.stage.attention_unpad_s`); empty for most.
        fsdp_units: under FSDP, where the embedding, final norm and output layer sit: ``model`` (the root module's
            unit, :func:`hetplan.estimate.stage.fsdp_root_parameters`) or ``embedding-output`` (units of their own).
        zero1_grad_reduce: how DeepSpeed's ZeRO-1 (without BF16_Optimizer) reduces the 16-bit gradients at the
            accumulation boundary: ``allreduce`` (DeepSpeed #1246, 2021-07 to #4887, v0.13.0, 2024-01: stage 1
            forces ``contiguous_gradients`` and ``overlap_comm`` off, so ``reduce_ipg_grads`` takes
            ``buffered_reduce_fallback`` -> ``allreduce_bucket``: every rank all-reduces every gradient, then
            steps its partition and all-gathers the weights; never overlapped with the backward) or
            ``reduce-scatter`` (each rank receives only its partition's sums; the default).
        bf16_zero: the ZeRO stages a bf16 run may use with more than one data-parallel rank (DeepSpeed's config
            checks: none before v0.5.5, ZeRO-2 only in v0.5.5-0.5.x, ZeRO 1-3 in v0.6.0-0.6.1); every stage
            unless its source says otherwise. ``pipeline_bf16_zero``: the same under a pipeline (PP > 1), where the
            pipeline engine's gradient reduction has its own rule (v0.6.2-0.9.1: ZeRO-0 only); None: as
            ``bf16_zero``. :meth:`allows_bf16`.
        fp8: FP8 training available (an FP8 GEMM path: Transformer Engine, torchao float8); false for the
            releases before one (their source says which code path runs instead), refused by plan rule
            ``stack-has-option`` and before the search.
        fp8_recipe: under ``fsdp``, the FP8 scaling recipe an FP8 run of this release uses (torchao float8) by
            GPU family, ``default`` for the others (:meth:`fp8_recipe_on`); empty: the framework's
            default (:func:`hetplan.estimate.fp8.recipe`, torchao's ``tensorwise``).
        fp8_recipes: under ``fsdp``, the torchao float8 recipes the release can run (a ``Job.fp8_recipe`` outside
            them is refused by plan rule ``stack-has-option``); empty: every recipe.
        ddp: under ``fsdp``, how ZeRO-0 (DDP) runs: ``sharded`` (FSDP on one-rank shards: FSDP2 on a replicate-only
            mesh, torchtitan 0.3.0; FSDP1 ``NO_SHARD``; :func:`hetplan.estimate.memory.fsdp_shard_ranks`) or
            ``reducer`` (torch DDP's Reducer through ``replicate()``, 1-D meshes only: torchtitan before 2026-03;
            :func:`hetplan.estimate.memory.ddp_reducer_runs`).
        fused_softmax: under standard attention, which score shapes the release's fused scale-mask-softmax kernel
            takes (Megatron's ``FusedScaleMaskSoftmax.is_kernel_available``; the rules and their code paths:
            :func:`hetplan.estimate.compute.fused_softmax_runs`); the others fall back to PyTorch ops
            (:func:`hetplan.estimate.compute.softmax_fallback_work`). ``any``: no constraint (flash and eager
            stacks, whose attention has no such kernel).
        gemm_factor: the stack's residual GEMM efficiency, a factor on the GPU's fitted ``compute_efficiency`` /
            ``fp8_compute_efficiency``: 1 unless the stack's own public rows identify it (fitted on a seeded
            fraction of them, the rest held out: :mod:`hetplan.calibration.stack_fit`; its source says so).
        tp_comm_factor: the stack's residual efficiency of its TP collectives, a factor on the fraction of the link
            bandwidth NCCL reaches for them (:meth:`hetplan.estimate.stagework.Link.tp_link`: the layers' TP
            all-reduces, all-gathers and reduce-scatters; DP, MoE, CP and pipeline transfers keep theirs): 1 unless
            the stack's own public rows identify it (fitted on a seeded fraction of them, the rest held out:
            :func:`hetplan.calibration.stack_fit.fit_megatron_deepspeed`; its source says so).
        memory_residual_gib: what ``nvidia-smi`` showed per GPU above the estimate's footprint
            (:attr:`hetplan.estimate.memory.StageMemory.total`) on the stack's own public runs, GiB: memory outside
            the model (NCCL communicators' buffers, the allocator's cache) that the stack's runs measured; fitted on
            a seeded fraction of them, the rest held out (:mod:`hetplan.calibration.memory_fit`); counted in the
            footprint and in the fit test. 0 unless measured.
        loss_chunks: under ``fsdp``, the pieces of the sequence the loss runs the output layer and the
            cross-entropy on one after the other, each back-propagated before the next (torchtitan's
            ``ChunkedLossWrapper``): only one piece's logits exist at a time (:mod:`hetplan.estimate.memory`). 1
            (the whole sequence at once) unless the release's configs chunk it.
        sources: one source per field (``gemm_factor``, ``tp_comm_factor``, ``memory_residual_gib`` and
            ``loss_chunks`` only when not default) and for ``released``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    version: str
    released: str = Field(pattern=r"^\d{4}-(0[1-9]|1[0-2])$")
    framework: Literal["megatron", "deepspeed", "fsdp"]
    gemm: Literal["transformer-engine", "cublas"]
    attention: Literal["standard", "eager", "flash"]
    attention_kernel: dict[str, StackKernel]
    fused: tuple[FusedOp, ...]
    sequence_parallel: bool
    tp_comm_overlap: bool
    wgrad_accumulation: Literal["fused", "separate", "fused-with-pipeline"]
    dp_overlap: Literal["bucketed", "none", "ddp-only", "after-last-microbatch", "single-stage"]
    launch: Literal["eager", "cuda-graphs", "compiled"]
    zero: tuple[Literal[0, 1, 2, 3], ...]
    recompute: tuple[Literal["none", "selective", "full"], ...]
    optimizer_memory: Literal["megatron", "deepspeed", "fsdp1", "fsdp2"]
    allocator: Literal["caching", "expandable-segments"]
    parallel: tuple[ParallelDim, ...] = Field(min_length=1)
    interleaved: bool
    projections: Projections
    bf16_optimizer: bool = False
    bf16_optimizer_zero: tuple[Literal[0, 1], ...] = (0, 1)
    attention_unpad: tuple[StackKernel, ...] = ()
    fsdp_units: Literal["model", "embedding-output"] = "model"
    zero1_grad_reduce: Literal["reduce-scatter", "allreduce"] = "reduce-scatter"
    bf16_zero: tuple[Literal[0, 1, 2, 3], ...] = (0, 1, 2, 3)
    pipeline_bf16_zero: tuple[Literal[0, 1, 2, 3], ...] | None = None
    fp8: bool = True
    fp8_recipe: dict[str, StackFp8Recipe] = Field(default_factory=dict)
    fp8_recipes: tuple[StackFp8Recipe, ...] = ()
    ddp: Literal["sharded", "reducer"] = "sharded"
    fused_softmax: Literal["any", "fp16-2048", "megatron-2048", "megatron-2048-heads", "megatron-4096",
                           "te-16384"] = "any"
    gemm_factor: float = Field(default=1.0, gt=0.3, le=1.5)
    tp_comm_factor: float = Field(default=1.0, gt=0.1, le=1.5)
    memory_residual_gib: float = Field(default=0.0, ge=0.0, le=64.0)
    loss_chunks: int = Field(default=1, ge=1, le=64)
    sources: dict[str, str]

    @property
    def id(self) -> str:
        """``name@version``: what ``Job.stack`` holds once resolved."""
        return f"{self.name}@{self.version}"

    def has(self, dim: str) -> bool:
        """Whether this release runs parallel dimension ``dim`` (``dp`` / ``tp`` / ``pp`` / ``cp`` / ``ep``, or
        ``vp``: interleaved 1F1B's virtual stages)."""
        return self.interleaved if dim == "vp" else dim in self.parallel

    def bf16_rule(self, pp: int = 1) -> str:
        """The field whose ZeRO stages a bf16 run with ``pp`` pipeline stages may use: ``pipeline_bf16_zero``
        under a pipeline where the release sets it, else ``bf16_zero`` (its source says why)."""
        return "pipeline_bf16_zero" if pp > 1 and self.pipeline_bf16_zero is not None else "bf16_zero"

    def allows_bf16(self, zero: int, pp: int = 1) -> bool:
        """Whether a bf16 run of this release may use ZeRO stage ``zero`` with ``pp`` pipeline stages
        (:meth:`bf16_rule`; one data-parallel rank is ZeRO-free and always allowed by the caller)."""
        return zero in getattr(self, self.bf16_rule(pp))

    def kernel_on(self, architecture: str) -> str:
        """The fused attention kernel (``fa2`` / ``fa3`` / ``cudnn`` / ``triton``) this release runs under flash on
        a GPU of ``architecture`` (its first word is the family)."""
        family = architecture.split()[0] if architecture.split() else ""
        return self.attention_kernel.get(family, self.attention_kernel.get("default", "fa2"))

    def fp8_recipe_on(self, architecture: str) -> str | None:
        """The FP8 scaling recipe this release runs on a GPU of ``architecture`` (``fp8_recipe``; its first word
        is the family), None where the data gives none."""
        family = architecture.split()[0] if architecture.split() else ""
        return self.fp8_recipe.get(family, self.fp8_recipe.get("default"))

    def separate_wgrad_accumulation(self, pp: int) -> bool:
        """Whether a plan with ``pp`` stages adds each micro-batch's 16-bit weight gradients into the
        accumulator with a kernel of its own (``wgrad_accumulation``: ``separate``, or ``fused-with-pipeline``
        without a pipeline)."""
        return self.wgrad_accumulation == "separate" or (self.wgrad_accumulation == "fused-with-pipeline" and pp == 1)

    def overlaps_grad_reduce(self, pp: int, zero: int) -> bool:
        """Whether this release can overlap the data-parallel gradient reduction with the backward pass of a
        plan with ``pp`` stages and ZeRO stage ``zero`` (``dp_overlap``): always under ``bucketed``, never under
        ``none``; under ``single-stage`` (NeMo 22.05-22.09) only without a pipeline; under ``ddp-only`` (Megatron-LM
        before Megatron-Core 0.4) only ZeRO-0 through torch DDP's buckets
        (``--DDP-impl torch``), the distributed optimizer reduce-scattering after backward; under ``after-last-microbatch`` (DeepSpeed) only ZeRO-1/2 without a pipeline, whose
        ``overlap_comm`` buckets reduce during backward (ZeRO-2 only where ``zero1_grad_reduce`` is ``allreduce``:
        those releases force ``overlap_comm`` off at stage 1) — the pipeline engine's ``ReduceGrads`` instruction
        follows the schedule's last micro-batch (``deepspeed/runtime/pipe/schedule.py`` ``TrainSchedule``) and
        ZeRO-0 all-reduces at the accumulation boundary (``deepspeed/runtime/engine.py``)."""
        if self.dp_overlap == "bucketed":
            return True
        if self.dp_overlap == "single-stage":  # NeMo 22.05-22.09: only without a pipeline
            return pp == 1
        if self.dp_overlap == "ddp-only":
            return zero == 0
        overlapping = (2,) if self.zero1_grad_reduce == "allreduce" else (1, 2)  # ZeRO-1 forces overlap_comm off
        return self.dp_overlap == "after-last-microbatch" and pp == 1 and zero in overlapping


class StackCatalog(BaseModel):
    """Every release in the data file, in file order (each name's releases oldest first)."""

    model_config = ConfigDict(frozen=True)

    date: str
    stacks: tuple[StackSpec, ...]

    def releases(self, name: str) -> tuple[StackSpec, ...]:
        """The releases of ``name``, oldest first."""
        return tuple(s for s in self.stacks if s.name == name)


def _merge(raw: list, origin: str) -> tuple[StackSpec, ...]:
    """Each ``[[stack]]`` table with the fields and sources it does not give carried over from the previous
    release of its name."""
    last: dict[str, dict] = {}
    out = []
    for i, entry in enumerate(raw):
        where = f"{origin}: stack[{i}]"
        if not isinstance(entry, dict) or "name" not in entry:
            raise HetplanError("a [[stack]] table without a name", field=where, fix="give name = \"...\"")
        prev = last.get(entry["name"], {})
        merged = {k: v for k, v in prev.items() if k not in ("version", "released", "sources")}
        merged.update({k: v for k, v in entry.items() if k != "sources"})
        sources = dict(prev.get("sources", {}))
        sources.pop("released", None)
        sources.update(entry.get("sources", {}))
        merged["sources"] = sources
        optional = (("gemm_factor",) if merged.get("gemm_factor", 1.0) != 1.0 else ()) + (
            ("tp_comm_factor",) if merged.get("tp_comm_factor", 1.0) != 1.0 else ()) + (
            ("memory_residual_gib",) if merged.get("memory_residual_gib", 0.0) != 0.0 else ()) + (
            ("bf16_optimizer",) if merged.get("bf16_optimizer") else ()) + (
            ("bf16_optimizer_zero",) if tuple(merged.get("bf16_optimizer_zero", (0, 1))) != (0, 1) else ()) + (
            ("attention_unpad",) if merged.get("attention_unpad") else ()) + (
            ("fsdp_units",) if merged.get("fsdp_units", "model") != "model" else ()) + (
            ("zero1_grad_reduce",) if merged.get("zero1_grad_reduce", "reduce-scatter") != "reduce-scatter" else ()) + (
            ("fp8_recipe",) if merged.get("fp8_recipe") else ()) + (
            ("fused_softmax",) if merged.get("fused_softmax", "any") != "any" else ()) + (
            ("fp8",) if "fp8" in entry or not merged.get("fp8", True) else ())
        missing = [f for f in FIELDS[1:] + ("released",) + optional if f not in sources]
        if missing:
            raise HetplanError(f"{entry['name']} {entry.get('version')}: no source for {', '.join(missing)}",
                               field=where, fix="add a line per field to [stack.sources]")
        try:
            spec = StackSpec.model_validate(merged)
        except ValidationError as exc:
            raise validation_message(exc, where, StackSpec) from None
        if "dp" not in spec.parallel or (spec.interleaved and "pp" not in spec.parallel):
            raise HetplanError(f"{spec.id}: parallel {list(spec.parallel)} with interleaved = {spec.interleaved}",
                               field=f"{where}.parallel",
                               fix="list \"dp\" (every stack runs data parallelism), and \"pp\" where interleaved")
        if prev and spec.released < prev["released"]:
            raise HetplanError(f"{spec.id} released {spec.released}, before the previous release "
                               f"{prev['version']} ({prev['released']})", field=where,
                               fix="list each stack's releases oldest first")
        last[spec.name] = spec.model_dump()
        out.append(spec)
    return tuple(out)


@lru_cache(maxsize=1)
def load_stacks() -> StackCatalog:
    """The package's stack catalog (``hetplan/hardware/data/stacks.toml``), validated."""
    text = resources.files("hetplan.hardware").joinpath("data", "stacks.toml").read_text()
    data = parse_toml(text, "stacks.toml")
    return StackCatalog(date=str(data.get("date", "?")), stacks=_merge(data.get("stack", []), "stacks.toml"))


@lru_cache(maxsize=8)
def default_stack(framework: str) -> StackSpec:
    """The stack ``framework`` runs when the job names none (:data:`FRAMEWORK_STACK`, its latest release)."""
    return load_stacks().releases(FRAMEWORK_STACK[framework])[-1]


def _naming_fix(name: str, releases: list, tags=()) -> str:
    """How to name a release of stack ``name``: the listed ``releases`` (and release ``tags``) and a month."""
    known = ", ".join([*(r.version for r in releases), *tags])
    return (f"write {name}@VERSION with a VERSION it lists ({known}), e.g. {name}@{releases[-1].version}, or "
            f"{name}@YYYY-MM for the release in force that month")


@lru_cache(maxsize=256)
def resolve_stack(text: str, field: str = "job.stack") -> StackSpec:
    """The release ``text`` names: ``NAME`` (the latest), ``NAME@VERSION`` (that release; a numbered release the
    catalog does not list resolves to the listed one it follows, as a month does: ``nemo@22.11`` is
    ``nemo@22.09``; a ``YY.MM`` label of a stack whose such labels are months is that month,
    :func:`_month_label`) or ``NAME@YYYY-MM`` (the release in force that month: the latest released then).

    Raises:
        HetplanError: unknown name or version, an empty version after ``@``, a month before the stack's first
            release or after the catalog's date, or a release newer than the latest listed (:func:`_beyond`).
    """
    cat = load_stacks()
    name, at, version = str(text).strip().partition("@")
    name = re.sub(r"[\s_]+", "-", name.strip().lower())
    if name in ("megatron-core", "mcore") and re.match(r"^v?0(\.\d+)+$", version.strip()):  # PyPI megatron-core 0.12.0
        version = "core_r" + version.strip().lstrip("vV")
    name = STACK_ALIASES.get(name, name)
    releases = cat.releases(name)
    if not releases:
        close = [n for n in STACK_NAMES if name and n.startswith(name)][:1] or difflib.get_close_matches(
            name, STACK_NAMES, n=1)
        raise HetplanError(f"unknown stack {name!r}" + (f" (did you mean {close[0]!r}?)" if close else ""),
                           field=field, fix=f"use one of {', '.join(STACK_NAMES)} (hetplan catalog stacks), "
                                            "optionally @VERSION or @YYYY-MM")
    version = version.strip()
    if at and not version:  # 'megatron-lm@' (a version left out) priced the latest release without a word
        raise HetplanError(f"{text!r} names no release after '@'", field=field,
                           fix=_naming_fix(name, releases) + f", or {name} alone for its latest release")
    if not version:
        return releases[-1]
    version = _from_git_tag(version)
    for r in releases:
        if r.version.lower() == version.lower():
            return r
    tagged = TAG_MONTHS.get(name, {})
    version = tagged.get(version, tagged.get(f"{version}.0", version))  # torchtitan@0.2 is v0.2.0
    month = _MONTH.match(version)
    when = f"{month.group(1)}-{month.group(2)}" if month else _month_label(releases, version)
    if when is None:
        listed = _release_before(releases, version)
        if listed is not None and _beyond(releases, version):
            raise HetplanError(f"{name}@{version} is newer than the catalog's latest {name} release, "
                               f"{releases[-1].version} ({releases[-1].released}); hetplan does not know what it "
                               "changed", field=field,
                               fix=f"write {name} (or @{releases[-1].version}) to price the latest release it "
                                   "knows, or calibrate on your runs (hetplan calibrate)")
        if (end := _series_end(releases, version)) is not None:
            later = releases[releases.index(end) + 1]
            raise HetplanError(f"{name} has no release {version!r}: after {end.version} ({end.released}) its "
                               f"releases are numbered like {later.version}", field=field,
                               fix=_naming_fix(name, releases))
        if listed is not None:  # a release between two listed ones: the one in force, as a month resolves
            return listed
        raise HetplanError(f"{name} has no release {version!r}", field=field, fix=_naming_fix(name, releases, tagged))
    if not 1 <= int(when[5:]) <= 12:
        raise HetplanError(f"{version!r} is not a month", field=field,
                           fix="write the date as YYYY-MM" if month else _naming_fix(name, releases))
    if when > cat.date:  # a month the catalog has not seen: a release of it would resolve silently to an older one
        raise HetplanError(f"{when} is after the stack catalog's date ({cat.date}): it cannot say which {name} "
                           "release ran then", field=field,
                           fix=f"write {name} for the latest release it knows ({releases[-1].version}), or a month "
                               f"up to {cat.date}")
    in_force = [r for r in releases if r.released <= when]
    if not in_force:
        raise HetplanError(f"{name} had no release by {when} (its first, {releases[0].version}, is of "
                           f"{releases[0].released})", field=field,
                           fix=f"use a month from {releases[0].released} on, or another stack")
    return in_force[-1]
