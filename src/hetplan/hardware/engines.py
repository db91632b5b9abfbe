"""Serving engines as data: one :class:`EngineSpec` per engine release, read from ``data/engines.toml``.

An *engine* (vLLM, SGLang, TensorRT-LLM, Hugging Face eager, TGI) is a serving stack: what it does on a GPU
decides what a prefill or a decode step costs as much as the GPU does. Each release records, with a source per
field (the ``sources`` table of the data file):

* **decode path** — ``cuda_graphs`` (the decode step replays a captured CUDA graph for the batch sizes in
  ``cuda_graph_batch_sizes``: one graph launch per step, larger batches run eagerly), ``compiled`` (a compiled
  engine, TensorRT-LLM: one enqueue per step for any batch) or ``eager`` (PyTorch launches every kernel from
  Python); ``prefill_graphs``: whether prefill/mixed batches are launched without per-kernel host cost too;
* **attention kernel** per GPU generation (architecture family of :mod:`hetplan.hardware.catalog`): paged
  FlashAttention-2/-3, FlashInfer, TensorRT-LLM's context FMHA / XQA, xFormers, PyTorch SDPA. The cost model
  prices each at the measured rate of the catalog kernel of its class (:data:`KERNEL_RATE_CLASS`);
* **TP all-reduce** (``tp_allreduce``: NCCL, the engines' custom one-/two-shot kernel, or the faster of the two)
  and whether the decode attention kernel shares a GQA group's K/V loads (``gqa_decode_kv_shared``);
* **per-step overhead** (``step_overhead_s``): host time of scheduling, input preparation and sampling per
  engine step that the GPU waits for;
* **KV cache**: block size in tokens (``kv_block_tokens``; 0 = no paging), the memory budget rule
  (``memory_budget``: ``total`` — a fraction ``gpu_memory_utilization`` of the device memory holds weights,
  activations and KV, vLLM / SGLang; ``free`` — a fraction of the memory left after the engine is loaded,
  TensorRT-LLM), the default ``max_num_seqs`` and the chunked-prefill token budget, and whether a multi-head
  latent attention model (DeepSeek-V2/V3) caches its compressed latent rather than its up-projected keys and values
  (``mla_latent_cache``);
* **weight dtypes** per GPU generation (``weight_dtypes``) and where FP8 weights run on FP8 tensor cores
  (``fp8_compute``; elsewhere FP8 is weight-only, W8A16, as vLLM's FP8 Marlin kernel on Ampere). INT8 and INT4
  are weight-only (W8A16 / W4A16): fewer bytes read, 16-bit GEMMs.

A name is ``ENGINE`` (its newest release) or ``ENGINE@VERSION`` (the newest release whose version starts with
VERSION, e.g. ``vllm@0.6``). Unknown engines, releases or a weight dtype the engine does not run on a GPU raise
:class:`hetplan.errors.HetplanError` naming the field and the fix (the CLI exits 2).

This module does not import torch.
"""

from __future__ import annotations

import re
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Literal, Mapping

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from hetplan.errors import HetplanError
from hetplan.hardware.catalog import Architecture, GPUSpec, _canonical, _norm, _overlay
from hetplan.inputs import parse_toml, read_text, validation_message

#: Weight dtypes an engine may run, and bytes per weight element (INT4: two per byte; group scales are < 2 % of
#: the bytes at group size 128 and are not counted).
WEIGHT_DTYPE_BYTES: Mapping[str, float] = {"fp32": 4.0, "fp16": 2.0, "bf16": 2.0, "fp8": 1.0, "int8": 1.0,
                                           "int4": 0.5}
#: The attention kernel whose measured rate (``GPUSpec.attention_kernels``) prices each engine kernel: FlashInfer,
#: TensorRT-LLM's context FMHA and XQA, xFormers' cutlass kernel, Triton and FlexAttention kernels and PyTorch
#: SDPA's flash backend are tiled fused kernels of the FlashAttention-2 kind (one pass over K/V per query tile,
#: online softmax; Dao 2023; FlashInfer: Ye et al. 2025, arXiv 2501.01005, Sec. 3); FlashAttention-3 has its
#: own Hopper rate (Shah et al. 2024).
KERNEL_RATE_CLASS: Mapping[str, str] = {
    "fa2": "fa2", "fa3": "fa3", "cudnn": "cudnn", "flashinfer": "fa2", "trtllm-fmha": "fa2", "xqa": "fa2",
    "xformers": "fa2", "triton": "fa2", "flex": "fa2", "sdpa": "fa2"}
DecodePath = Literal["cuda_graphs", "compiled", "eager"]
_FIELDS_WITH_SOURCES = ("decode_path", "prefill_graphs", "cuda_graph_batch_sizes", "attention", "kv_block_tokens",
                        "memory_budget", "gpu_memory_utilization", "max_num_seqs", "chunked_prefill",
                        "max_num_batched_tokens", "non_torch_memory_gib", "step_overhead_s", "hbm_efficiency", "weight_dtypes",
                        "fp8_compute", "gqa_decode_kv_shared", "tp_allreduce", "kv_watermark",
                        "window_kv_blocks", "mla_latent_cache")


def gpu_family(gpu: GPUSpec) -> str:
    """The architecture family of ``gpu`` (first word of ``GPUSpec.architecture``: Ampere, Hopper, ...)."""
    words = gpu.architecture.split()
    return words[0] if words else ""


def parse_batch_sizes(text: str, field: str = "cuda_graph_batch_sizes") -> tuple[int, ...]:
    """``"1,2,4,8-256/8"`` -> ``(1, 2, 4, 8, 16, ..., 256)``: comma-separated sizes and ``a-b/s`` ranges.

    Raises:
        HetplanError: a malformed item or a size below 1.
    """
    out: set[int] = set()
    for item in (x.strip() for x in text.split(",") if x.strip()):
        m = re.fullmatch(r"(\d+)(?:-(\d+)/(\d+))?", item)
        if not m or int(m.group(1)) < 1 or (m.group(2) and (int(m.group(3)) < 1 or int(m.group(2)) < int(m.group(1)))):
            raise HetplanError(f"bad batch-size item {item!r}", field=field,
                               fix='write sizes and ranges like "1,2,4,8-256/8" (from 8 to 256 in steps of 8)')
        a = int(m.group(1))
        out.update(range(a, int(m.group(2)) + 1, int(m.group(3))) if m.group(2) else (a,))
    return tuple(sorted(out))


class EngineSpec(BaseModel):
    """One release of a serving engine (module docstring; every field's source in ``sources``).

    Attributes:
        name: engine name (``vllm``, ``sglang``, ``tensorrt-llm``, ``hf-eager``, ``tgi``); version: its release.
        display, repository, released: descriptive (release date ``YYYY-MM-DD``).
        decode_path: ``cuda_graphs`` | ``compiled`` | ``eager``.
        prefill_graphs: prefill / mixed steps run without per-kernel host launches (piecewise graphs, compiled).
        cuda_graph_batch_sizes: decode batch sizes captured as CUDA graphs (ascending; empty unless cuda_graphs).
        attention: ``{architecture family: kernel}``; a family not listed is not supported by the release.
        kv_block_tokens: tokens per KV-cache block (paged attention); 0: contiguous per-sequence cache.
        memory_budget: ``total`` or ``free`` (module docstring); gpu_memory_utilization: its fraction.
        max_num_seqs: default cap on running sequences; max_num_seqs_small_gpu: the cap on GPUs below 70 GiB and
            A100 where the release picks a smaller default (None: the same).
        chunked_prefill, max_num_batched_tokens: chunked prefill on by default, and the token budget per step.
        non_torch_memory_bytes: per-GPU memory outside the engine's tensors (CUDA context, cuBLAS, NCCL).
        step_overhead_s: host time per engine step the GPU waits for (scheduling, input preparation, sampling).
        hbm_efficiency: fraction of the HBM peak bandwidth the engine's memory-bound kernels (decode GEMMs
            streaming the weights, paged attention reading the KV cache) reach.
        weight_dtypes: ``{dtype: families}`` where the release runs weights of that dtype.
        fp8_compute: families where FP8 weights run FP8 GEMMs (W8A8); elsewhere FP8 is weight-only.
        gqa_decode_kv_shared: the decode attention kernel reads each key/value head's cached K/V once for all the
            query heads of its group (FlashAttention / FlashInfer / XQA tile the group's queries together); False:
            one thread block per *query* head reads its group's K/V again (TensorRT-LLM's masked MHA kernel before
            XQA), so a GQA model's decode reads ``num_attention_heads / num_kv_heads`` times the K/V bytes
            (:meth:`decode_kv_reads`).
        tp_allreduce: the all-reduce the release runs between the TP ranks of a layer: ``nccl`` (NCCL's ring /
            tree) or ``custom`` (a one-shot / two-shot all-reduce over NVLink peer memory inside the step, vLLM's
            ``custom_all_reduce``; :func:`hetplan.estimate.comm.allreduce_time_s` ``algorithm="custom"``) or
            ``auto`` (the faster of the custom kernel and NCCL by message size, TensorRT-LLM's AUTO strategy).
        kv_watermark: fraction of the KV blocks kept free when a sequence is admitted (vLLM V0's block manager:
            1 %, so a running batch's next decode blocks are not taken by a new prompt); 0: admitted while the free
            blocks cover it.
        window_kv_blocks: a sliding-window layer holds KV blocks only for the tokens of its window, in the pool
            the full-attention layers share (vLLM V1's hybrid KV cache manager; blocks outside the window are freed
            at the next step, :func:`hetplan.estimate.inference.kv_layer_blocks`); False: every layer holds every
            cached token (the window is applied by the attention kernel only), or the engine splits its memory
            among per-window pools in proportions not modelled — an upper bound on the KV memory either way.
        mla_latent_cache: for a multi-head latent attention model (:attr:`hetplan.model.spec.ModelSpec.is_mla`),
            the cache holds each token's compressed latent and rotary key, ``kv_lora_rank + qk_rope_head_dim``
            elements per layer, whole on every TP rank, and decode attends in the latent space (the key and value
            up-projections absorbed into the query and output; DeepSeek-V2, Sec. 2.1.2); False: the up-projected
            keys and values of every head are cached, as for multi-head attention
            (:func:`hetplan.estimate.inference.kv_elements_per_token`).
        sources: ``{field: source}``.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    name: str
    version: str
    display: str
    repository: str
    released: str = Field(pattern=r"^\d{4}-\d{2}-\d{2}$")
    decode_path: DecodePath
    prefill_graphs: bool
    cuda_graph_batch_sizes: tuple[int, ...] = ()
    attention: Mapping[str, str]
    kv_block_tokens: int = Field(ge=0, le=1 << 16)
    memory_budget: Literal["total", "free"]
    gpu_memory_utilization: float = Field(gt=0, le=1)
    max_num_seqs: int = Field(ge=1, le=1 << 20)
    max_num_seqs_small_gpu: int | None = Field(default=None, ge=1, le=1 << 20)
    chunked_prefill: bool
    max_num_batched_tokens: int = Field(ge=0, le=1 << 24)
    non_torch_memory_bytes: int = Field(ge=0, le=1 << 40)
    step_overhead_s: float = Field(ge=0, le=1.0)
    hbm_efficiency: float = Field(default=1.0, gt=0, le=1)
    weight_dtypes: Mapping[str, tuple[str, ...]]
    fp8_compute: tuple[str, ...] = ()
    gqa_decode_kv_shared: bool = True
    tp_allreduce: Literal["nccl", "custom", "auto"] = "nccl"
    kv_watermark: float = Field(default=0.0, ge=0, lt=1)
    window_kv_blocks: bool = False
    mla_latent_cache: bool = False
    sources: Mapping[str, str]

    @property
    def label(self) -> str:
        """``name@version``."""
        return f"{self.name}@{self.version}"

    def attention_kernel(self, gpu: GPUSpec) -> str:
        """The attention kernel this release runs on ``gpu``.

        Raises:
            HetplanError: the release does not run on the GPU's architecture family.
        """
        family = gpu_family(gpu)
        if family not in self.attention:
            have = ", ".join(self.attention)
            raise HetplanError(f"{self.label} does not run on {gpu.name} ({gpu.architecture})", field="engine",
                               fix=f"choose a GPU of a generation it supports ({have}) or another engine")
        return self.attention[family]

    def attention_rate_kernel(self, gpu: GPUSpec) -> str:
        """The catalog kernel whose measured rate prices :meth:`attention_kernel` (:data:`KERNEL_RATE_CLASS`)."""
        return KERNEL_RATE_CLASS[self.attention_kernel(gpu)]

    def check_weight_dtype(self, dtype: str, gpu: GPUSpec) -> None:
        """Raise unless this release runs ``dtype`` weights on ``gpu``.

        Raises:
            HetplanError: unknown dtype, or one the release does not run on the GPU's generation (e.g. FP8 on
                Volta), field ``quantization``.
        """
        if dtype not in WEIGHT_DTYPE_BYTES:
            raise HetplanError(f"unknown weight dtype {dtype!r}", field="quantization",
                               fix=f"use one of {', '.join(WEIGHT_DTYPE_BYTES)}")
        family = gpu_family(gpu)
        if family not in self.weight_dtypes.get(dtype, ()):
            ok = sorted(d for d, fams in self.weight_dtypes.items() if family in fams)
            where = ", ".join(self.weight_dtypes.get(dtype, ()))
            raise HetplanError(
                f"{self.label} does not run {dtype} weights on {gpu.name} ({gpu.architecture})",
                field="quantization",
                fix=((f"use one of {', '.join(ok)} on this GPU" if ok else "use another engine on this GPU")
                     + (f", or a GPU of a generation that runs {dtype} ({where})" if where
                        else f", or an engine that runs {dtype}")))

    def gemm_dtype(self, dtype: str, gpu: GPUSpec) -> str:
        """The dtype the linear GEMMs of ``dtype`` weights run in on ``gpu``: ``fp8`` where FP8 weights run FP8
        GEMMs (``fp8_compute``), else the GPU's 16-bit type (bf16 where it has it, else fp16) for the weight-only
        FP8 / INT8 / INT4 paths, else ``dtype`` itself.

        Raises:
            HetplanError: as :meth:`check_weight_dtype`.
        """
        self.check_weight_dtype(dtype, gpu)
        if dtype == "fp8" and gpu_family(gpu) in self.fp8_compute:
            return "fp8"
        if dtype in ("fp8", "int8", "int4"):
            return "bf16" if "bf16" in gpu.dense_flops_per_s else "fp16"
        return dtype

    def decode_kv_reads(self, num_attention_heads: int, num_kv_heads: int) -> float:
        """Times a decode step reads each cached K/V byte from HBM: 1 where the kernel shares a key/value head's
        loads among its query heads (``gqa_decode_kv_shared``), else the query heads per key/value head."""
        return 1.0 if self.gqa_decode_kv_shared else num_attention_heads / max(1, num_kv_heads)

    def graph_batch_size(self, batch: int) -> int | None:
        """The captured batch size a decode step of ``batch`` sequences replays (the smallest captured size
        ``>= batch``, the batch padded to it), or None when it runs without a graph: no capture list (compiled or
        eager path) or a batch above the largest captured size."""
        for size in self.cuda_graph_batch_sizes:
            if size >= batch:
                return size
        return None

    def launches_per_kernel(self, batch: int, prefill: bool) -> bool:
        """Whether a step pays the host's per-kernel launch cost (``GPUSpec.kernel_overhead_s`` per kernel):
        eager engines always; CUDA-graph engines on prefill steps without ``prefill_graphs`` and on decode batches
        above the largest captured size; compiled engines never."""
        if self.decode_path == "compiled":
            return False
        if self.decode_path == "eager":
            return True
        if prefill:
            return not self.prefill_graphs
        return self.graph_batch_size(batch) is None

    def default_max_num_seqs(self, gpu: GPUSpec) -> int:
        """``max_num_seqs`` on ``gpu``: ``max_num_seqs_small_gpu`` on GPUs below 70 GiB and on A100s where the
        release sets one (vLLM V1), else ``max_num_seqs``."""
        small = gpu.memory_bytes < 70 * 2**30 or "a100" in gpu.name.lower()
        return self.max_num_seqs_small_gpu if small and self.max_num_seqs_small_gpu else self.max_num_seqs


class EngineCatalog:
    """All releases of all engines; :meth:`get` resolves ``ENGINE[@VERSION]``."""

    def __init__(self, releases: Mapping[str, list[EngineSpec]], aliases: Mapping[str, str], date: str):
        self.releases = {k: sorted(v, key=lambda e: _version_key(e.version)) for k, v in releases.items()}
        self.date = date
        self._index = {_norm(k): k for k in self.releases}
        self._index.update({_norm(a): k for a, k in aliases.items()})

    def names(self) -> list[str]:
        """Engine names, in data order."""
        return list(self.releases)

    def all(self) -> list[EngineSpec]:
        """Every release of every engine."""
        return [e for rs in self.releases.values() for e in rs]

    def get(self, name: str, field: str = "engine") -> EngineSpec:
        """The release ``name`` stands for: ``ENGINE`` (newest release) or ``ENGINE@VERSION`` (newest release whose
        version is VERSION or starts with ``VERSION.``).

        Raises:
            HetplanError: unknown engine or release (the message lists the known ones).
        """
        engine, _, version = name.partition("@")
        key = _canonical(self._index, engine, field, "serving engine", "engines")
        releases = self.releases[key]
        if not version:
            return releases[-1]
        match = [e for e in releases if e.version == version or e.version.startswith(version + ".")
                 or version.startswith(e.version + ".")]
        if not match:
            raise HetplanError(f"unknown release {version!r} of engine {key}", field=field,
                               fix=f"use one of {', '.join(f'{key}@{e.version}' for e in releases)}")
        return match[-1]


def _version_key(v: str) -> tuple:
    # (0, number) before (1, text): a release named by text sorts after the numbered ones, never int < str
    return tuple((0, int(x), "") if x.isdigit() else (1, 0, x) for x in re.split(r"[.]", v))


def _release_from_toml(name: str, engine: Mapping, raw: Mapping, where: str) -> EngineSpec:
    """One release of a user's or the package's engines file as an :class:`EngineSpec`.

    Raises:
        HetplanError: naming ``where``: a field of the wrong type (fuzz: a list as attention kernel, text as
            ``non_torch_memory_gib``, a number as weight dtypes were tracebacks)."""
    try:
        return _release(name, engine, raw, where)
    except HetplanError:  # already names its field (HetplanError is a ValueError)
        raise
    except (TypeError, ValueError, OverflowError) as exc:  # OverflowError: int(inf GiB)
        raise HetplanError(f"a field has the wrong type or value ({exc})", field=where,
                           fix="compare the release with hetplan/hardware/data/engines.toml "
                           "(`hetplan catalog engines NAME`)") from None


def _release(name: str, engine: Mapping, raw: Mapping, where: str) -> EngineSpec:
    if not isinstance(raw, Mapping):
        raise HetplanError(f"must be a table, got {raw!r:.40}", field=where, fix="write [[engines.NAME.releases]] tables")
    data = dict(raw)
    sources = dict(data.get("sources", {}))
    missing = [f for f in _FIELDS_WITH_SOURCES if f in data and f not in sources]
    if missing:
        raise HetplanError(f"fields without a source: {', '.join(missing)}", field=f"{where}.sources",
                           fix="give each field a source (repository + file, docs page or release notes)")
    data["sources"] = sources
    data["name"] = name
    for key in ("display", "repository"):
        data.setdefault(key, engine.get(key, name))
    data["cuda_graph_batch_sizes"] = parse_batch_sizes(str(data.get("cuda_graph_batch_sizes", "")),
                                                       f"{where}.cuda_graph_batch_sizes")
    if "non_torch_memory_gib" in data:
        data["non_torch_memory_bytes"] = int(float(data.pop("non_torch_memory_gib")) * 2**30)
    if isinstance(data.get("weight_dtypes"), Mapping):
        bad = [d for d in data["weight_dtypes"] if d not in WEIGHT_DTYPE_BYTES]
        if bad:
            raise HetplanError(f"unknown weight dtype {bad[0]!r}", field=f"{where}.weight_dtypes",
                               fix=f"use dtypes among {', '.join(WEIGHT_DTYPE_BYTES)}")
        families = {a.value for a in Architecture}
        for dtype, fams in data["weight_dtypes"].items():
            if not isinstance(fams, list) or not all(f in families for f in fams):
                raise HetplanError(f"weight_dtypes.{dtype} = {fams!r:.40} is not a list of GPU generations",
                                   field=f"{where}.weight_dtypes",
                                   fix=f"list generations among {', '.join(sorted(families))}")
        data["weight_dtypes"] = {k: tuple(v) for k, v in data["weight_dtypes"].items()}
    if isinstance(data.get("attention"), Mapping):
        bad = [k for k in data["attention"].values() if k not in KERNEL_RATE_CLASS]
        if bad:
            raise HetplanError(f"unknown attention kernel {bad[0]!r}", field=f"{where}.attention",
                               fix=f"use kernels among {', '.join(KERNEL_RATE_CLASS)}")
    if isinstance(data.get("fp8_compute"), list):
        data["fp8_compute"] = tuple(data["fp8_compute"])
    try:
        return EngineSpec.model_validate(data)
    except ValidationError as exc:
        raise validation_message(exc, where, EngineSpec) from None


@lru_cache(maxsize=8)
def _load(user_text: str | None, user_file: str | None) -> EngineCatalog:
    text = resources.files("hetplan.hardware").joinpath("data/engines.toml").read_text()
    data = parse_toml(text, "engines.toml")
    engines_raw: dict = dict(data["engines"])
    if user_text is not None:
        user = parse_toml(user_text, user_file, "--engines")
        _overlay(engines_raw, user, "engines", "--engines")
    releases: dict[str, list[EngineSpec]] = {}
    aliases: dict[str, str] = {}
    for name, engine in engines_raw.items():
        rel = engine.get("releases", []) if isinstance(engine, Mapping) else None
        if not isinstance(rel, list) or not rel:
            raise HetplanError("an engine needs at least one release", field=f"engines.{name}.releases",
                               fix=f"add a [[engines.{name}.releases]] table")
        releases[name] = [_release_from_toml(name, engine, r, f"engines.{name}.releases[{i}]") for i, r in enumerate(rel)]
        names = engine.get("aliases", [])
        if not isinstance(names, list) or not all(isinstance(a, str) for a in names):
            raise HetplanError(f"aliases must be a list of names, got {names!r:.40}", field=f"engines.{name}.aliases",
                               fix='write e.g. aliases = ["vllm-openai"]')
        aliases.update({a: name for a in names})
    return EngineCatalog(releases, aliases, str(data.get("meta", {}).get("date", "unknown")))


def load_engines(user_file: str | Path | None = None) -> EngineCatalog:
    """The package's engine data, extended by ``user_file`` (TOML, same layout: a new ``[engines.NAME]`` adds an
    engine; an existing name's ``releases`` list replaces the shipped one).

    Raises:
        HetplanError: the user file is missing, malformed or has a bad field.
    """
    if user_file is None:
        return _load(None, None)
    return _load(read_text(user_file, "--engines"), str(user_file))


def get_engine(name: str, user_file: str | Path | None = None) -> EngineSpec:
    """Shortcut for ``load_engines(user_file).get(name)``."""
    return load_engines(user_file).get(name)
