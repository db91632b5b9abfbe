"""The GPU catalog: one :class:`GPUSpec` per GPU type, read from ``data/gpus.toml``.

Conventions (also stated at the top of the data file):

* FLOP/s are **dense** (no 2:4 sparsity), tensor-core rates with FP32 accumulation.
* ``gpu_link_bandwidth_bytes_per_s`` is the **unidirectional** GPU-to-GPU bandwidth of one GPU, all its links
  summed (NVLink3 on A100: 600 GB/s bidirectional -> 300 GB/s here). GPUs without NVLink/Infinity Fabric talk
  over PCIe, so their value is the PCIe unidirectional rate.
* ``host_link_bandwidth_bytes_per_s`` is the unidirectional host<->GPU bandwidth (PCIe4 x16: 32 GB/s).
* Prices are on-demand $/GPU-hour with provider and date: they change, so they are data, never code.

A user TOML file with the same layout extends the catalog or overrides fields of an existing entry
(``load_catalog(user_file)``; the CLI takes ``--catalog FILE``).
"""

from __future__ import annotations

import difflib
import math
from functools import lru_cache
from importlib import resources
from pathlib import Path
from enum import Enum
from typing import Annotated, Any, Literal, Mapping

from pydantic import ConfigDict, Field, ValidationError, model_validator

from hetplan.errors import HetplanError
from hetplan.hardware.stacks import default_stack
from hetplan.inputs import UserInput, bounded, parse_toml, read_text, validation_message

GB = 1e9
TERA = 1e12
#: FlashAttention-2's throughput relative to a large dense GEMM on the same GPU, forward and backward: on A100
#: FA2 reaches 70 % (forward) and 60 % (backward) of the 312 TFLOP/s peak at head dim 128 and long sequences
#: (Dao 2023, "FlashAttention-2", arXiv 2307.08691, Sec. 4.1, Fig. 4-6: up to 73 % forward, 63 % backward),
#: where large bf16 GEMMs reach the fitted e_max 0.814 (hetplan.calibration.calibrate): 0.70 / 0.814 and
#: 0.60 / 0.814. Used for GPU types whose catalog entry gives no rate for the kernel that runs.
FLASH_TO_GEMM_RATIO = (0.86, 0.74)
#: The fused attention kernels whose rates the catalog carries (``attention_kernels``): ``fa2`` FlashAttention-2
#: (Dao 2023; the ``flash-attn`` package, PyTorch SDPA's flash backend), ``fa3`` FlashAttention-3 (Shah et al.
#: 2024; Hopper only), ``cudnn`` cuDNN's fused attention (Transformer Engine's ``FusedAttention``, PyTorch SDPA's
#: cuDNN backend), ``triton`` the Triton FlashAttention of 2023 that llm-foundry ran by default
#: (``llmfoundry/models/layers/flash_attn_triton.py`` on the pre-MLIR Triton compiler, ``attn_impl: triton``);
#: H100 carries its fitted rate, the A100 SXM parts the same fraction of FlashAttention-2's (``gpus.toml``
#: sources); a GPU without a ``triton`` rate charges it at FlashAttention-2's (an upper bound: the same tiling, a
#: compiler without Hopper's or Ampere's hand-tuned pipelining). Which one a job runs:
#: :func:`hetplan.estimate.compute.attention_kernel`.
ATTENTION_KERNELS = ("fa2", "fa3", "cudnn", "triton")
AttentionKernel = Literal["fa2", "fa3", "cudnn", "triton"]


def default_attention_kernel(framework: str, architecture: str) -> str:
    """The fused attention kernel ``framework``'s default stack runs under ``attention = "flash"`` on a GPU of
    ``architecture`` (:func:`hetplan.hardware.stacks.default_stack`, its ``attention_kernel`` with sources in
    ``data/stacks.toml``): cuDNN's fused attention on Hopper and Blackwell for Megatron-Core / Transformer Engine
    and for torchtitan's SDPA order since pytorch/torchtitan@6a3a9da, FlashAttention-2 otherwise and under
    DeepSpeed. Earlier releases (``Job.stack``) have their own."""
    return default_stack(framework).kernel_on(architecture)


_Fraction = Annotated[float, Field(gt=0, le=1)]


class Architecture(str, Enum):
    """GPU architecture family: the first word of a catalog entry's ``architecture`` (``"Hopper GH100"``), read
    once on load into :attr:`GPUSpec.family`. The cost model asks the family, never the text: the FP8 recipe
    (:func:`hetplan.estimate.fp8.recipe`), the grouped-GEMM ceiling (:func:`hetplan.estimate.moe`) and the
    attention kernel a stack runs (:meth:`hetplan.hardware.stacks.StackSpec.kernel_on`) depend on it."""

    VOLTA = "Volta"
    TURING = "Turing"
    AMPERE = "Ampere"
    ADA = "Ada"
    HOPPER = "Hopper"
    BLACKWELL = "Blackwell"
    CDNA3 = "CDNA3"

    @classmethod
    def of(cls, architecture: str) -> Architecture | None:
        """The family of an ``architecture`` text (None: a family the catalog does not know)."""
        words = architecture.split()
        try:
            return cls(words[0]) if words else None
        except ValueError:
            return None


#: Standard deviation of one board's sustained speed over the mean, every GPU type (dimensionless;
#: :mod:`hetplan.estimate.variability`): fitted by :func:`hetplan.calibration.modern_fit.fit_speed_variability` on
#: the seeded half of the weak-scaling series of the modern sets (24 series of the DGX Cloud H100 and GB200
#: recipes, 8 to 2,304 GPUs: how the error grows with the GPU count along each, the level cancelled), 0.027;
#: held-out (22 series) root-mean-square error about each series' mean 0.95 -> 0.70 %. Of the order of the 8 %
#: average variation between GPUs of one SKU that Sinha et al. (SC'22) measured on V100 and MI60 clusters.
SPEED_VARIABILITY = 0.027


class GPUSpec(UserInput):
    """One GPU type. All fields SI; the data file uses GB, GB/s and TFLOP/s (converted on load).

    Attributes:
        name: canonical name, e.g. ``"A100-SXM-80GB"``.
        aliases: other accepted names (matched case-insensitively).
        vendor, architecture, form_factor: descriptive.
        family: the :class:`Architecture` family (read from ``architecture`` when not given; None: unknown,
            costed as a GPU of no later family).
        memory_bytes: device memory as reported by the driver's total (bytes).
        hbm_bandwidth_bytes_per_s: device memory bandwidth (bytes/s).
        dense_flops_per_s: peak dense tensor FLOP/s per dtype (``"bf16"``, ``"fp16"``, ``"fp8"``, ``"fp32"``).
        gpu_link, gpu_link_bandwidth_bytes_per_s: GPU-GPU interconnect inside a node and its unidirectional bandwidth.
        host_link, host_link_bandwidth_bytes_per_s: host interface and its unidirectional bandwidth.
        tdp_w: board power limit (W); idle_power_w: power when idle/blocked (W).
        price_usd_per_hour, price_provider, price_date, price_source: default on-demand price per GPU-hour.
        compute_efficiency: fraction of the dense peak that large transformer GEMMs reach on this GPU (calibration,
            see ``calibration_source``). It is the asymptote of the shape-dependent GEMM efficiency of
            :mod:`hetplan.estimate.compute`.
        fp8_compute_efficiency: fraction of the dense **FP8** peak that large FP8 GEMMs reach (the ``e_max`` of FP8
            linear layers, :mod:`hetplan.estimate.fp8`); fitted on FP8 measurements (``calibration_source``).
            None: not fitted, FP8 GEMMs take ``compute_efficiency`` (the same fraction of their own peak).
        calibrated: ``compute_efficiency`` was fitted to measurements of this GPU (or of the same silicon), as
            ``calibration_source`` says; False: a first guess, which ``hetplan plan`` / ``estimate`` mark.
        gemm_half_dim: GEMM dimension (elements) at which one dimension alone halves the GEMM efficiency:
            efficiency = compute_efficiency * prod over (M, N, K) of x / (x + gemm_half_dim) (docs/estimator.md).
            Default: the A100 fit on vTrain data (hetplan.calibration.calibrate).
        kernel_overhead_s: fixed time per GPU kernel (launch + ramp/tail), seconds. Default: the A100 fit.
        attention_kernels: ``{kernel: (forward, backward)}``: the fraction of the dense bf16/fp16 peak that each
            fused attention kernel (:data:`ATTENTION_KERNELS`) reaches on this GPU on long sequences without a
            mask (the non-causal figures; a causal kernel: ``attention_causal_efficiency``,
            :func:`hetplan.estimate.compute.flash_attention_time_s`). Measured per kernel and GPU generation
            (``sources``); a kernel not listed runs at :data:`FLASH_TO_GEMM_RATIO` of ``compute_efficiency``.
        attention_causal_efficiency: ``{kernel: η}``: the rate of the kernel under a causal mask, per FLOP of
            the tiles it computes, over its non-causal rate (``attention_kernels``) at the same sequence length:
            what masking the diagonal tiles and the unequal rows of the triangle cost. Measured per kernel
            (``sources``); a kernel not listed: 1 (no measurement). Not applied over ``attention_efficiency``.
        attention_kernel: the kernel the software on these machines runs (set per job and pool by
            :func:`hetplan.estimate.compute.pool_gpu`; None: the default framework's, Megatron-Core's, on this
            architecture, :func:`default_attention_kernel`).
        attention_efficiency: ``(forward, backward)`` for whatever kernel runs, overriding ``attention_kernels``
            (a user catalog's or a pool's measured figure). Default None.
        sm_count: streaming multiprocessors (None: unknown; NCCL's share of the GPU is then not charged).
        core_align8_slowdown: slowdown of the materialised attention core's batched GEMMs when the head dimension
            leaves their batch pointers exactly 8 bytes aligned (``2·d`` a multiple of 8, not of 16: d = 100, 108),
            over the aligned rate (:func:`hetplan.estimate.compute.core_alignment_factor`). Measured per GPU
            (``sources``, fitted by :func:`hetplan.calibration.modern_fit.fit_core_align8`); None: not measured on
            this GPU, not charged.
        speed_variability: standard deviation of the sustained speed of one board of this type over the mean
            (dimensionless): a stage of ``n`` GPUs runs at the pace of its slowest
            (:mod:`hetplan.estimate.variability`). Default :data:`SPEED_VARIABILITY`.
        sources: where each figure comes from.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    name: str
    aliases: tuple[str, ...] = ()
    vendor: str
    architecture: str
    family: Architecture | None = None
    form_factor: str
    memory_bytes: int = bounded(2**44, "from 1 GiB (T4, the smallest in the catalog, has 15) to 16 TiB (60x the "
                                "largest GPU memory, B300: 288 GB)", ge=2**30)
    hbm_bandwidth_bytes_per_s: float = bounded(1e14, "from 1 GB/s (the host memory `hetplan verify` measures for "
                                               "its CPU device copies faster; T4 has 320) to 100 TB/s (12x B200's 8 "
                                               "TB/s)", ge=1e9)
    dense_flops_per_s: Mapping[str, Annotated[float, bounded(1e17, "from 1 GFLOP/s (one CPU core's fp32 rate, the "
                                                             "host device of `hetplan verify`; T4's fp32 is 8.1 "
                                                             "TFLOP/s) to 100 PFLOP/s dense (20x B200's fp8 rate)",
                                                             ge=1e9, allow_inf_nan=False)]]
    gpu_link: str
    gpu_link_bandwidth_bytes_per_s: float = bounded(1e13, "10 TB/s is 5x NVLink 5's 1.8 TB/s", gt=0)
    host_link: str
    host_link_bandwidth_bytes_per_s: float = bounded(1e13, "10 TB/s is 40x PCIe 6 x16", gt=0)
    tdp_w: float = bounded(1e5, "100 kW is 50x any GPU's board power", gt=0)
    idle_power_w: float = bounded(1e5, "100 kW is 50x any GPU's board power", gt=0)
    price_usd_per_hour: float = bounded(1000.0, "no GPU rents for $1,000 an hour", ge=0)
    price_provider: str
    price_date: str
    price_source: str
    compute_efficiency: float = Field(gt=0, le=1)
    calibration_source: str
    fp8_compute_efficiency: float | None = Field(default=None, gt=0, le=1)
    calibrated: bool = False
    gemm_half_dim: float = bounded(1e6, "a half-efficiency GEMM dimension of a million elements is no tensor core",
                                   default=134.0, ge=0)
    kernel_overhead_s: float = bounded(0.01, "10 ms per kernel is 200x the calibrated hosts' 44-74 us",
                                       default=44.3e-6, ge=0)
    attention_kernels: Mapping[AttentionKernel, tuple[_Fraction, _Fraction]] = Field(default_factory=dict)
    attention_causal_efficiency: Mapping[AttentionKernel, _Fraction] = Field(default_factory=dict)
    attention_kernel: AttentionKernel | None = None
    attention_efficiency: tuple[_Fraction, _Fraction] | None = None
    sm_count: int | None = Field(default=None, gt=0)
    core_align8_slowdown: float | None = bounded(100.0, "100x is 6x the CUDA-core charge of a 2-byte-aligned head "
                                                 "(A100: 16x)", default=None, ge=1)
    speed_variability: float = bounded(0.2, "a spread of 20 % is twice the 8 % average variation Sinha et al. "
                                       "(SC'22) measured between GPUs of one SKU", default=SPEED_VARIABILITY, ge=0)
    sources: tuple[str, ...] = ()

    @model_validator(mode="before")
    @classmethod
    def _family(cls, data: Any) -> Any:
        """``family`` from the first word of ``architecture`` where not given."""
        if isinstance(data, dict) and data.get("family") is None and isinstance(data.get("architecture"), str):
            return {**data, "family": Architecture.of(data["architecture"])}
        return data

    @property
    def family_name(self) -> str:
        """The :attr:`family`'s name (``"Hopper"``), ``""`` for an unknown family."""
        return self.family.value if self.family is not None else ""

    def flash_attention_efficiency(self, causal: bool = False) -> tuple[float, float]:
        """``(forward, backward)`` efficiency of the fused attention kernel that runs (fraction of the dense peak,
        per FLOP of the tiles it computes): ``attention_efficiency`` if given, else the ``attention_kernels`` rate
        of ``attention_kernel`` (None: Megatron-Core's, :func:`default_attention_kernel`), else
        ``compute_efficiency`` x :data:`FLASH_TO_GEMM_RATIO`; ``causal``: the catalog rates times the kernel's
        ``attention_causal_efficiency``."""
        if self.attention_efficiency is not None:
            return self.attention_efficiency
        kernel = self.attention_kernel or default_attention_kernel("megatron", self.family_name)
        if kernel == "triton" and kernel not in self.attention_kernels:
            kernel = "fa2"  # no measured Triton rate on this GPU: FlashAttention-2's (ATTENTION_KERNELS)
        if kernel in self.attention_kernels:
            f, b = self.attention_kernels[kernel]
        else:
            f, b = (self.compute_efficiency * r for r in FLASH_TO_GEMM_RATIO)
        eta = self.attention_causal_efficiency.get(kernel, 1.0) if causal else 1.0
        return f * eta, b * eta

    def peak_flops_per_s(self, dtype: str) -> float:
        """Dense peak FLOP/s for ``dtype``.

        Raises:
            HetplanError: the GPU has no tensor-core rate for that dtype (e.g. bf16 on V100).
        """
        try:
            return self.dense_flops_per_s[dtype]
        except KeyError:
            have = ", ".join(sorted(self.dense_flops_per_s))
            raise HetplanError(
                f"GPU {self.name} has no {dtype} support (it supports {have})",
                field="job.dtype",
                fix=f"use one of: {have}",
            ) from None


#: The catalog file's fields in convenient units: the :class:`GPUSpec` field each fills, the factor to SI and the
#: SI unit.
_FILE_UNITS = {
    "memory_gib": ("memory_bytes", 2**30, "bytes"),
    "hbm_bandwidth_gb_per_s": ("hbm_bandwidth_bytes_per_s", GB, "bytes/s"),
    "gpu_link_bandwidth_gb_per_s": ("gpu_link_bandwidth_bytes_per_s", GB, "bytes/s"),
    "host_link_bandwidth_gb_per_s": ("host_link_bandwidth_bytes_per_s", GB, "bytes/s"),
    "dense_tflops": ("dense_flops_per_s", TERA, "FLOP/s"),
}


def _in_file_units(err: HetplanError, name: str, raw: Mapping) -> HetplanError:
    """``err`` about GPU ``name``'s entry named by the field the file gave (``memory_gib = 0`` was refused as
    ``gpus.X.memory_bytes``, a field no file has), saying that its numbers are in SI units."""
    prefix = f"gpus.{name}."
    rest = (err.field or "").removeprefix(prefix)
    for key, (si_key, factor, unit) in _FILE_UNITS.items():
        if key in raw and (rest == si_key or rest.startswith(si_key + ".")):
            scale = "2^30" if factor == 2**30 else f"{factor:.0e}"
            return HetplanError(f"{err.message} [in {unit}: the file's {key} x {scale}]",
                                field=prefix + key + rest[len(si_key):], fix=err.fix)
    return err


def _spec_from_toml(name: str, raw: Mapping) -> GPUSpec:
    if not isinstance(raw, Mapping):
        raise HetplanError(f"must be a table, got {raw!r:.40}", field=f"gpus.{name}", fix=f"write [gpus.{name}] with its fields")
    data = dict(raw)
    if "attention_kernel" in data:
        raise HetplanError("the attention kernel is chosen per job, not per GPU type", field=f"gpus.{name}.attention_kernel",
                           fix="set job.attention_kernel, or give the kernel's rates as attention_kernels = "
                               "{ fa2 = [fwd, bwd] }")
    for key in ("memory_gib", "hbm_bandwidth_gb_per_s", "gpu_link_bandwidth_gb_per_s", "host_link_bandwidth_gb_per_s"):
        if key in data and (isinstance(data[key], bool) or not isinstance(data[key], (int, float))
                            or not math.isfinite(data[key])):
            raise HetplanError(f"must be a finite number, got {data[key]!r:.40}", field=f"gpus.{name}.{key}",
                               fix="give a finite positive number")
    if not isinstance(data.get("dense_tflops", {}), Mapping) or any(
            isinstance(v, bool) or not isinstance(v, (int, float)) for v in data.get("dense_tflops", {}).values()):
        raise HetplanError("must be a table of dtype = TFLOP/s numbers", field=f"gpus.{name}.dense_tflops",
                           fix='write e.g. dense_tflops = { bf16 = 989, fp16 = 989 }')
    for key, (si_key, factor, _) in _FILE_UNITS.items():
        if key in data and key != "dense_tflops":
            value = data.pop(key)
            si = value * factor  # 1e300 GiB overflows to inf, which int() cannot take: the bound below says so
            data[si_key] = int(si) if si_key == "memory_bytes" and math.isfinite(si) else si
    if "dense_tflops" in data:
        data["dense_flops_per_s"] = {k: v * TERA for k, v in data.pop("dense_tflops").items()}
    data["name"] = name
    for key in ("aliases", "sources"):
        if key in data and isinstance(data[key], list):
            data[key] = tuple(data[key])
    return GPUSpec.model_validate(data)


class Catalog:
    """All known GPU types, looked up case-insensitively by name or alias."""

    def __init__(self, gpus: Mapping[str, GPUSpec], date: str):
        self.gpus = dict(gpus)
        self.date = date
        self._index: dict[str, str] = {}
        for spec in self.gpus.values():
            for key in (spec.name, *spec.aliases):
                self._index[_norm(key)] = spec.name

    def get(self, name: str, field: str = "gpu") -> GPUSpec:
        """The GPU called ``name`` (or one of its aliases).

        Raises:
            HetplanError: unknown name; the message suggests the nearest known names.
        """
        return self.gpus[_canonical(self._index, name, field, "GPU type", "gpus")]

    def names(self) -> list[str]:
        """Canonical names, in catalog order."""
        return list(self.gpus)


#: Vendor words ``nvidia-smi`` and ``rocm-smi`` put before a product name (``NVIDIA H100 80GB HBM3``,
#: ``Tesla V100-SXM2-32GB``, ``AMD Instinct MI300X``): a name is also looked up without them.
VENDOR_PREFIXES = ("nvidia-", "tesla-", "amd-")


def _canonical(index: Mapping[str, str], name: str, field: str, kind: str, listing: str) -> str:
    """The canonical name that ``name`` (any case, an alias, with or without a vendor word of
    :data:`VENDOR_PREFIXES`) stands for in ``index`` (normalised key -> name).

    Raises:
        HetplanError: unknown name; the message suggests the nearest known names, else `hetplan catalog LISTING`.
    """
    key = _norm(name)
    for k in (key, *(key.removeprefix(v) for v in VENDOR_PREFIXES if key.startswith(v))):
        if k in index:
            return index[k]
    # the names it begins (A100 -> A100-PCIe-40GB, A100-SXM-80GB ...), else the nearest spellings ("A100" was
    # answered with A10, H100-SXM, V100-SXM-32GB and no A100)
    close = [k for k in index if key and k.startswith(key)] or difflib.get_close_matches(key, list(index), n=3,
                                                                                        cutoff=0.4)
    suggestions = sorted({index[c] for c in close})[:8]
    hint = f"did you mean {', '.join(suggestions)}?" if suggestions else f"run `hetplan catalog {listing}` for the list"
    raise HetplanError(f"unknown {kind} {name!r}", field=field, fix=hint)


def _norm(name: str) -> str:
    return name.strip().lower().replace("_", "-").replace(" ", "-")


def _merge(base: dict, override: Mapping) -> dict:
    out = dict(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = _merge(dict(out[key]), value)
        else:
            out[key] = value
    return out


def _overlay(raw: dict, user: Mapping, section: str, flag: str) -> None:
    """Merge the user file's ``[section.NAME]`` tables into ``raw`` in place: a NAME equal to a shipped entry up to
    case and punctuation (:func:`_norm`) overrides that entry's fields (:func:`_merge`), another NAME adds an entry.

    Raises:
        HetplanError: ``[section]`` is not a table of tables (field ``flag``), or one entry is not a table; a section
            other than ``[section]`` and ``[meta]`` (a typo such as ``[gpu.H100-SXM]`` for ``[gpus.H100-SXM]`` was
            ignored without a word, and the plans priced the shipped entry).
    """
    unknown = [key for key in user if key not in (section, "meta")]
    if unknown:
        raise HetplanError(f"unknown section [{unknown[0]}]", field=f"{flag}:{unknown[0]}",
                           fix=f"write each entry as [{section}.NAME] (and the file's date under [meta])")
    tables = user.get(section, {})
    if not isinstance(tables, dict):
        raise HetplanError(f"[{section}] must be a table of tables, got {tables!r:.40}", field=flag,
                           fix=f"write one [{section}.NAME] table per entry")
    for name, entry in tables.items():
        if not isinstance(entry, dict):
            raise HetplanError(f"must be a table, got {entry!r:.40}", field=f"{section}.{name}",
                               fix=f"write [{section}.{name}] with its fields")
        existing = next((k for k in raw if _norm(k) == _norm(name)), None)
        raw[existing or name] = _merge(raw[existing], entry) if existing is not None else entry


@lru_cache(maxsize=8)
def _load(user_text: str | None, user_file: str | None) -> Catalog:
    """The catalog extended by the TOML ``user_text`` read from ``user_file`` (cached on the text, so an edited
    file is read anew)."""
    text = resources.files("hetplan.hardware").joinpath("data/gpus.toml").read_text()
    data = parse_toml(text, "gpus.toml")
    gpus_raw: dict = dict(data["gpus"])
    if user_text is not None:
        user = parse_toml(user_text, user_file, "--catalog")
        _overlay(gpus_raw, user, "gpus", "--catalog")
    gpus = {}
    for name, raw in gpus_raw.items():
        try:
            gpus[name] = _spec_from_toml(name, raw)
        except ValidationError as exc:
            raise _in_file_units(validation_message(exc, f"gpus.{name}", GPUSpec), name, raw) from None
    return Catalog(gpus, str(data.get("meta", {}).get("date", "unknown")))


def load_catalog(user_file: str | Path | None = None) -> Catalog:
    """The package catalog, extended/overridden by ``user_file`` (TOML, same layout) if given.

    Raises:
        HetplanError: the user file is missing, malformed or has a bad field.
    """
    if user_file is None:
        return _load(None, None)
    return _load(read_text(user_file, "--catalog"), str(user_file))


def get_gpu(name: str, user_file: str | Path | None = None) -> GPUSpec:
    """Shortcut for ``load_catalog(user_file).get(name)``."""
    return load_catalog(user_file).get(name)


# ---------------------------------------------------------------------------------------------------------------
# Nodes: one server (or NVLink domain) of GPUs, read from data/nodes.toml.

#: Networks a node's NICs may run (:data:`hetplan.estimate.comm.NETWORKS` gives their NCCL terms).
NETWORK_KINDS = ("infiniband", "roce", "efa", "ethernet")


class NodeSpec(UserInput):
    """One node preset. All fields SI; the data file uses Gb/s per NIC and GB/s (converted on load).

    Attributes:
        name, aliases: preset name (e.g. ``"dgx-h100"``) and other accepted names (case-insensitive).
        gpu: catalog GPU type the node holds.
        gpus_per_node: GPUs that share one NVLink/NVSwitch domain and the node's NICs (72 for GB200 NVL72).
        gpus_per_host: GPUs of one host, the unit a launch starts processes on (``torchrun --nproc-per-node``), where
            it is smaller than the NVLink domain (a GB200 / GB300 NVL72 compute tray: 4); None: ``gpus_per_node``.
        nics, nic_bandwidth_bytes_per_s: NICs used for GPU collectives and the unidirectional rate of each.
        network: ``infiniband`` / ``roce`` / ``efa`` (RDMA with GPUDirect) or ``ethernet`` (no RDMA).
        gpu_link_bandwidth_bytes_per_s: unidirectional GPU-GPU bandwidth inside the node (None: the GPU's link).
        reference_for: GPU types whose pools use this node when they name none.
        date, sources: when the node shipped and where the figures come from.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    aliases: tuple[str, ...] = ()
    gpu: str
    gpus_per_node: int = Field(gt=0)
    gpus_per_host: int | None = Field(default=None, gt=0)
    nics: int = Field(gt=0)
    nic_bandwidth_bytes_per_s: float = Field(gt=0)
    network: str
    gpu_link_bandwidth_bytes_per_s: float | None = Field(default=None, gt=0)
    reference_for: tuple[str, ...] = ()
    date: str
    sources: tuple[str, ...] = ()

    @property
    def inter_node_bandwidth_bytes_per_s(self) -> float:
        """All NICs together, unidirectional (bytes/s): ``nics x nic rate``."""
        return self.nics * self.nic_bandwidth_bytes_per_s


class NodeCatalog:
    """All node presets, looked up case-insensitively by name or alias; and each GPU type's reference node."""

    def __init__(self, nodes: Mapping[str, NodeSpec], date: str):
        self.nodes = dict(nodes)
        self.date = date
        self._index = {_norm(k): n.name for n in self.nodes.values() for k in (n.name, *n.aliases)}
        self._reference = {_norm(g): n.name for n in self.nodes.values() for g in n.reference_for}

    def get(self, name: str, field: str = "node") -> NodeSpec:
        """The node called ``name`` (or an alias).

        Raises:
            HetplanError: unknown name; the message suggests the nearest known names.
        """
        return self.nodes[_canonical(self._index, name, field, "node", "nodes")]

    def reference(self, gpu: GPUSpec) -> NodeSpec | None:
        """The reference node of GPU type ``gpu`` (by its name or an alias), or None if it has none."""
        for key in (gpu.name, *gpu.aliases):
            if _norm(key) in self._reference:
                return self.nodes[self._reference[_norm(key)]]
        return None


def _node_from_toml(name: str, raw: Mapping) -> NodeSpec:
    data = dict(raw)
    if "nic_gbit_per_s" in data:
        data["nic_bandwidth_bytes_per_s"] = data.pop("nic_gbit_per_s") * GB / 8
    if "gpu_link_bandwidth_gb_per_s" in data:
        data["gpu_link_bandwidth_bytes_per_s"] = data.pop("gpu_link_bandwidth_gb_per_s") * GB
    for key in ("aliases", "sources", "reference_for"):
        if key in data:
            data[key] = tuple(data[key])
    data["name"] = name
    return NodeSpec(**data)


@lru_cache(maxsize=8)
def _load_nodes(user_file: str | None) -> NodeCatalog:
    data = parse_toml(resources.files("hetplan.hardware").joinpath("data/nodes.toml").read_text(), "nodes.toml")
    raw: dict = dict(data["nodes"])
    if user_file is not None:
        user = parse_toml(read_text(user_file, "--nodes"), user_file, "--nodes")
        _overlay(raw, user, "nodes", "--nodes")
    nodes = {}
    for name, entry in raw.items():
        try:
            nodes[name] = _node_from_toml(name, entry)
        except ValidationError as exc:
            raise validation_message(exc, f"nodes.{name}", NodeSpec) from None
        if nodes[name].network not in NETWORK_KINDS:
            raise HetplanError(f"unknown network {nodes[name].network!r}", field=f"nodes.{name}.network",
                               fix=f"use one of {', '.join(NETWORK_KINDS)}")
    return NodeCatalog(nodes, str(data.get("meta", {}).get("date", "unknown")))


def load_nodes(user_file: str | Path | None = None) -> NodeCatalog:
    """The package node presets, extended/overridden by ``user_file`` (TOML, same layout) if given.

    Raises:
        HetplanError: the user file is missing, malformed or has a bad field.
    """
    return _load_nodes(None if user_file is None else str(user_file))
