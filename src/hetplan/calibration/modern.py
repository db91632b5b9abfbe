"""Validation on modern training measurements (H100 / H200 / B200 / GB200, 2024-2026): ``hetplan validate`` sets
``dgxc_h100``, ``dgxc_gb200``, ``torchtitan``, ``llama3_405b``, ``megatron_lm_h100``, ``moe_h100`` and
``long_context_cp``.

The rows are the published measurements of ``validation_data/modern/`` (copied from the project's shared data;
every row names its source ``repo@commit:path`` or arXiv table, see the README there). Each row is mapped to a
full :class:`~hetplan.plan.Plan` with its published layout (TP / PP / DP / micro-batch / global batch / sequence /
recomputation / framework / dtype / GPU / node / CP / EP) and the model of the run (proxy runs with their own,
reduced, layer count), and predicted by :func:`hetplan.estimate.estimator.estimate`. Rows the estimator or the
plan schema cannot express are never dropped: they are counted and listed with the reason
(:class:`NotExpressible`). Features the estimator gains later (FP8, ``framework = "fsdp"``, CP, EP, MoE models,
GPU entries) are probed, not assumed, so the same mapping picks them up as they land.

Measured quantity per source (compared directly, never through MFU, whose convention differs between sources;
:data:`CONVENTIONS`): step time (DGX Cloud, NeMo AutoModel, Megatron MoE ModelZoo where given), tokens/s per GPU
(torchtitan) or TFLOP/s per GPU (Llama 3 paper, Megatron-LM README, NeMo long-sequence), converted with the model
FLOPs of :func:`hetplan.model.counts.model_flops_per_iteration` (no recomputation, the full s² attention product;
NeMo's formula and Megatron-LM's until 2025, and the one that gives the Llama 3 paper's 400 TFLOP/s at 6.7 s per
16M-token step; the Megatron MoE ModelZoo's rows count the causal half, ``causal_flops``, as Megatron-LM's
``num_floating_point_operations`` has since 2025). Memory per GPU (torchtitan: ``reserved_bytes.all.peak`` of
``torch.cuda.memory_stats``, its ``DeviceMemoryMonitor`` in ``torchtitan/metrics.py`` at 9dec370: the caching
allocator's reserved peak, not ``active_bytes``) is compared with the estimate's largest stage total less
:data:`hetplan.estimate.memory.CUDA_CONTEXT_BYTES` (the CUDA context, cuBLAS and NCCL memory outside the allocator,
which its reserved bytes leave out; :attr:`ModernCase.predicted_memory_bytes`).

Metrics per set: as :func:`hetplan.calibration.validation.metrics` (MAPE, max |error|, Kendall τ within one job:
same model, GPU type, GPU count, global batch and sequence), the held-out part (rows outside the seeded
calibration fraction :data:`CALIBRATION_FRACTION`), memory error, and the rows predicted not to fit.
"""

from __future__ import annotations

import csv
import math
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from importlib import resources

import numpy as np

from hetplan.calibration.validation import Case, _is_calibration, gpt_model, metrics
from hetplan.errors import HetplanError
from hetplan.estimate import memory
from hetplan.hardware.catalog import Catalog, GPUSpec, load_catalog
from hetplan.model import counts
from hetplan.model.spec import ModelSpec
from hetplan.plan import GPUPool, Job, Plan, Stage, balanced_split

SET_NAMES = ("dgxc_h100", "dgxc_gb200", "torchtitan", "llama3_405b", "megatron_lm_h100", "moe_h100",
             "long_context_cp")

#: Source file of each set (``validation_data/modern/``) and what is compared.
FILES = {
    "dgxc_h100": "dgxc_benchmarking_h100_gb200.csv",
    "dgxc_gb200": "dgxc_benchmarking_h100_gb200.csv",
    "torchtitan": "torchtitan_benchmarks.csv",
    "llama3_405b": "llama3_paper_table4_h100.csv",
    "megatron_lm_h100": "megatron_lm_weak_scaling_h100.csv",
    "moe_h100": ("nemo_automodel_h100_bf16.csv", "megatron_moe_modelzoo_qwen3.csv"),
    "long_context_cp": ("nemo_long_sequence_cp.csv", "torchtitan_benchmarks.csv", "llama3_paper_table4_h100.csv"),
}

#: What each set compares and the MFU convention its source states (printed by ``hetplan validate``).
CONVENTIONS = {
    "dgxc_h100": "step time; published MFU is vs the run dtype's dense peak (H100 989 bf16 / 1,979 fp8)",
    "dgxc_gb200": "step time; published MFU is vs the run dtype's dense peak (GB200 2,450 bf16 / 4,900 fp8)",
    "torchtitan": "tokens/s per GPU and memory (GiB); published MFU divides by the 700 W SXM's bf16 989 (float8 "
                  "rows too) although most rows ran on 500 W HBM2e H100s (not used)",
    "llama3_405b": "TFLOP/s per GPU, model FLOPs with the full s^2 attention (6.7 s per 16M-token step at 400); "
                   "MFU vs bf16 989",
    "megatron_lm_h100": "TFLOP/s per GPU as Megatron-LM counts (no recompute, full s^2); MFU vs bf16 989",
    "moe_h100": "step time (TFLOP/s per GPU where no step time is given, Megatron-LM's causal s^2/2 count); "
                "MFU vs bf16 989",
    "long_context_cp": "TFLOP/s per GPU (NeMo's FLOP formula: full s^2, no causal halving), tokens/s per GPU "
                       "(torchtitan), TFLOP/s (Llama 3); MFU not compared",
}

#: Done-when targets (issues 13 and 14), fractions; ``kendall_tau`` is a lower bound, the others upper bounds.
#: ``subset`` names the rows the target is stated for.
TARGETS = {
    "dgxc_h100": {"subset": "dense_cp1", "mape": 0.10, "kendall_tau": 0.8},
    "torchtitan": {"mape": 0.12, "memory_max_abs_error": 0.10},
    "llama3_405b": {"max_abs_error": 0.10},
    "megatron_lm_h100": {"max_abs_error": 0.10},
    "moe_h100": {"mape": 0.15},
    "long_context_cp": {"mape": 0.15},
}

#: Seeded fraction of every modern set used to fit GPU efficiencies (:mod:`hetplan.calibration.modern_fit`);
#: the same hash of the row key as the A100 split (:func:`hetplan.calibration.validation._is_calibration`).
CALIBRATION_FRACTION = 0.25

#: Node of the DGX/HGX H100, H200 and B200: 8 GPUs, 8 ConnectX-7 NICs of 400 Gb/s = 400 GB/s per node
#: (NVIDIA DGX H100 / B200 user guides). Used unless the pool model names nodes itself.
DGX_NODE_BYTES_PER_S = 400e9
#: GB200 NVL72: one NVLink domain of 72 GPUs; one 400 Gb/s ConnectX-7 per GPU (4 per compute tray;
#: NVIDIA GB200 NVL72 reference architecture): 72 x 50 GB/s leaves the domain.
NVL72_GPUS = 72
NVL72_NODE_BYTES_PER_S = NVL72_GPUS * 50e9


class NotExpressibleError(Exception):
    """A row that the estimator or the plan schema cannot express yet; the message is the reason."""


@dataclass
class NotExpressible:
    """A measured row left out of the metrics, with the reason."""

    set: str
    key: str
    reason: str


@dataclass
class ModernCase(Case):
    """A :class:`~hetplan.calibration.validation.Case` of a modern set.

    Attributes:
        quantity: ``iteration_time_s``, ``tokens_per_s_per_gpu`` or ``tflops_per_gpu`` (what ``measured`` is).
        gpu, dtype: catalog GPU type and compute dtype of the plan.
        measured_memory_bytes: peak memory per GPU the source reports (None if it gives none).
        predicted_memory_bytes, fits: the estimate's largest stage, as the allocator's reserved bytes that the
            sources report (its total less :data:`hetplan.estimate.memory.CUDA_CONTEXT_BYTES`), and whether every
            stage fits (with the context).
        notes: approximations the mapping had to make (e.g. ZeRO-3 for FSDP2 before ``framework = "fsdp"``).
        causal_flops: the source's TFLOP/s count the causal half of the attention scores
            (:func:`hetplan.model.counts.model_flops_per_iteration`), not the full ``s x s``.
    """

    quantity: str = "iteration_time_s"
    gpu: str = ""
    dtype: str = "bf16"
    measured_memory_bytes: float | None = None
    predicted_memory_bytes: float = math.nan
    fits: bool = True
    dense_cp1: bool = False
    notes: list[str] = field(default_factory=list)
    causal_flops: bool = False

    def evaluate(self, catalog: Catalog | None = None, comm_constants=None) -> float:
        """Estimate the plan with ``catalog`` (default: the package catalog) and ``comm_constants`` (default: the
        reviewed :class:`~hetplan.estimate.comm.CommConstants`); set ``predicted``, ``predicted_memory_bytes`` and
        ``fits``; return ``predicted``."""
        from hetplan.estimate.estimator import estimate

        est = estimate(self.plan, catalog=catalog, model=self.model, virtual_stages=self.virtual_stages,
                       comm_constants=comm_constants)
        self.predicted = quantity_of(est, self.quantity, self.plan, self.model, self.causal_flops)
        self.predicted_memory_bytes = max(s.memory.total for s in est.stages) - memory.CUDA_CONTEXT_BYTES
        self.fits = bool(est.fits)
        return self.predicted


def quantity_of(est, quantity: str, plan: Plan, m: ModelSpec, causal_flops: bool = False) -> float:
    """The measured kind ``quantity`` of an :class:`~hetplan.estimate.estimator.Estimate` (TFLOP/s with the
    source's attention count, ``causal_flops``)."""
    n = plan.num_gpus
    if quantity == "iteration_time_s":
        return est.iteration_time_s
    if quantity == "tokens_per_s_per_gpu":
        return est.tokens_per_s / n
    if quantity == "tflops_per_gpu":
        flops = float(counts.model_flops_per_iteration(m, float(plan.job.global_batch), float(plan.job.seq_len),
                                                       causal=causal_flops))
        return flops / est.iteration_time_s / n / 1e12
    raise ValueError(f"unknown quantity {quantity!r}")


def _rows(name: str) -> list[dict]:
    text = resources.files("hetplan.calibration").joinpath("validation_data", "modern", name).read_text()
    return list(csv.DictReader(text.splitlines()))


def _int(r: dict, col: str, default: int | None = None) -> int | None:
    v = (r.get(col) or "").strip()
    if not v:
        return default
    try:
        return int(float(v))
    except ValueError:
        return default


def _float(r: dict, col: str) -> float | None:
    v = (r.get(col) or "").strip()
    try:
        x = float(v)
    except ValueError:
        return None
    return x if math.isfinite(x) and x > 0 else None


# ----------------------------------------------------------------------------------------------------------------
# GPUs, models, plans


def catalog_gpu(label: str, catalog: Catalog) -> str:
    """Catalog name of the GPU a row names.

    The 96 GB HBM2e H100 capped at 500 W of torchtitan's rows is its own catalog entry (found by its 500 W
    power limit), never the 700 W H100 SXM. Raises :class:`NotExpressibleError` when the catalog has no entry.
    """
    low = label.lower()
    if "h100" in low and ("500w" in low.replace(" ", "") or "hbm2e" in low):
        for g in catalog.gpus.values():
            if "H100" in g.name and g.tdp_w == 500:
                return g.name
        raise NotExpressibleError("the 500 W HBM2e H100 (96 GB) has no catalog entry yet")
    for key, name in (("gb300", "GB300"), ("gb200", "GB200"), ("h200", "H200"), ("b200", "B200"),
                      ("h100", "H100-SXM"), ("a100", "A100-SXM-80GB")):
        if key in low:
            try:
                return catalog.get(name).name
            except HetplanError:
                raise NotExpressibleError(f"GPU {name} has no catalog entry yet") from None
    raise NotExpressibleError(f"GPU {label!r} is not in the catalog")


def row_model(r: dict) -> ModelSpec:
    """The model of a row, with the run's own layer count (proxy runs keep their reduced count).

    Families by name: Llama 2/3 (SwiGLU, RMSNorm, rotary, untied, no bias or dropout; Llama 2 vocabulary 32,000),
    Nemotron-4 (squared-ReLU MLP of 4h, no gate, LayerNorm, rotary, untied, vocabulary 256,000: Nemotron-4 15B
    report, arXiv 2402.16819 Sec. 2), GPT-3 175B as NeMo runs it (Megatron GPT: GeLU 4h MLP, learned positions,
    tied embeddings, vocabulary 50,257 padded, dropout 0.1: NeMo-Framework-Launcher ``gpt3/175b.yaml``), and the
    Megatron-LM README's GPT family (vocabulary 131,072, 4h MLP). Raises :class:`NotExpressibleError` for MoE,
    hybrid (Mamba) and models whose shape the source does not give.
    """
    name = r["model"]
    low = name.lower()
    if _int(r, "num_experts", 0) or "moe" in low or "mixture" in low or "a22b" in low or "gpt-oss" in low:
        return moe_model(r)
    if "mamba" in low or "nemotron-h" in low:
        raise NotExpressibleError("hybrid Mamba-Transformer: no Mamba layers in the estimator")
    L, h, a = _int(r, "layers"), _int(r, "hidden"), _int(r, "heads")
    s = _int(r, "seq_len")
    if not (L and h and a and s):
        raise NotExpressibleError("the source does not give the model's shape (layers, hidden, heads)")
    g = _int(r, "kv_heads", a)
    f = _int(r, "ffn_hidden")
    V = _int(r, "vocab")
    tag = re.sub(r"[^a-z0-9.]+", "-", low).strip("-")
    if "llama" in low:
        return ModelSpec(name=f"{tag}-L{L}", family="llama", num_layers=L, hidden_size=h, num_attention_heads=a,
                         num_kv_heads=g, head_dim=h // a, ffn_hidden_size=f, vocab_size=V or 32000,
                         max_seq_len=max(s, 8192), gated_mlp=True, norm="rmsnorm", linear_bias=False,
                         learned_positions=0, tied_embeddings=False, dropout=False, source=r["arch_source"])
    if "nemotron-4" in low:
        return ModelSpec(name=f"{tag}-L{L}", family="gpt_neox", num_layers=L, hidden_size=h, num_attention_heads=a,
                         num_kv_heads=g, head_dim=h // a, ffn_hidden_size=f or 4 * h, vocab_size=V or 256000,
                         max_seq_len=s, gated_mlp=False, norm="layernorm", linear_bias=False, learned_positions=0,
                         tied_embeddings=False, dropout=False, source=r["arch_source"])
    if "gpt" in low:
        return gpt_model(L, h, a, s, vocab=V or 50257)
    raise NotExpressibleError(f"model {name!r} has no mapping to a model spec")


#: MoE models of the rows -> model presets (``hetplan catalog models``; shapes from each model's config.json).
MOE_PRESETS = {"deepseek-v3": "deepseek-v3", "deepseek v3": "deepseek-v3", "qwen3-235b-a22b": "qwen3-235b-a22b",
               "qwen3 moe 30b": "qwen3-30b-a3b", "gpt-oss 120b": "gpt-oss-120b", "llama 4 scout": "llama4-scout"}


#: MoE models without a preset, as ``config.json`` dictionaries (read by :func:`hetplan.model.spec.from_hf_config`).
#: Grok-1: xai-org/grok-1 ``run.py`` (emb 48 x 128, 48 query / 8 KV heads of 128, 64 layers, 8 experts top-2,
#: vocabulary 128 x 1024) and ``model.py`` ``ffn_size`` (8 x 6144 x 2/3 = 32,768; gated); one embedding table for
#: input and output (``InOutEmbed``). Llama 4 Maverick: meta-llama/Llama-4-Maverick-17B-128E ``config.json``
#: (text_config: 128 experts top-1 with a shared expert, MoE every second layer, dense MLP 16,384). GPT-OSS 20B:
#: openai/gpt-oss-20b ``config.json`` (the 120B's widths, 24 layers, 32 experts top-4; model card: 20.91B total,
#: 3.61B active without the input embedding).
MOE_CONFIGS = {
    "grok-1": {"model_type": "mixtral", "hidden_size": 6144, "intermediate_size": 32768, "num_attention_heads": 48,
               "num_key_value_heads": 8, "head_dim": 128, "num_hidden_layers": 64, "num_local_experts": 8,
               "num_experts_per_tok": 2, "vocab_size": 131072, "max_position_embeddings": 8192,
               "tie_word_embeddings": True, "source": "xai-org/grok-1 run.py, model.py"},
    "llama 4 maverick": {"model_type": "llama4", "tie_word_embeddings": False, "text_config": {
        "model_type": "llama4_text", "hidden_size": 5120, "intermediate_size": 8192, "intermediate_size_mlp": 16384,
        "num_attention_heads": 40, "num_key_value_heads": 8, "head_dim": 128, "num_hidden_layers": 48,
        "num_local_experts": 128, "num_experts_per_tok": 1, "interleave_moe_layer_step": 2, "use_qk_norm": True,
        "attention_bias": False, "vocab_size": 202048, "max_position_embeddings": 1048576,
        "tie_word_embeddings": False}, "source": "meta-llama/Llama-4-Maverick-17B-128E config.json"},
    "gpt-oss 20b": {"model_type": "gpt_oss", "hidden_act": "silu", "hidden_size": 2880, "intermediate_size": 2880,
                    "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64, "num_hidden_layers": 24,
                    "num_local_experts": 32, "num_experts_per_tok": 4, "sliding_window": 128,
                    "layer_types": ["sliding_attention", "full_attention"] * 12, "attention_bias": True,
                    "vocab_size": 201088, "max_position_embeddings": 131072, "tie_word_embeddings": False,
                    "source": "openai/gpt-oss-20b config.json"},
}


def moe_model(r: dict) -> ModelSpec:
    """The preset of a MoE row (:data:`MOE_PRESETS`, else :data:`MOE_CONFIGS`) with the run's layer count;
    :class:`NotExpressibleError` when the model has no preset or the estimator has no MoE layers yet."""
    from hetplan.model.spec import from_hf_config, load_model

    low = r["model"].lower()
    preset = next((v for k, v in MOE_PRESETS.items() if k in low), None)
    config = next((k for k in MOE_CONFIGS if k in low), None)
    if preset is None and config is None:
        raise NotExpressibleError(f"MoE model {r['model']!r} has no model preset")
    try:
        m = load_model(preset) if preset else from_hf_config(MOE_CONFIGS[config], config.replace(" ", "-"))
    except HetplanError:
        raise NotExpressibleError("MoE model: the estimator has no mixture-of-experts layers yet") from None
    L = _int(r, "layers")
    return m if not L or L == m.num_layers else m.model_copy(update={"num_layers": L, "name": f"{m.name}-L{L}"})


def _probe_job(**kw) -> Job:
    """A :class:`Job` with ``kw``, or :class:`NotExpressibleError` naming the field the schema rejects."""
    try:
        return Job(**kw)
    except ValueError as exc:
        bad = [k for k in ("dtype", "framework", "attention") if k in str(exc)]
        raise NotExpressibleError(f"the plan schema rejects {', '.join(f'{k} = {kw.get(k)!r}' for k in bad) or kw}"
                                  ) from None


def _dtype(r: dict) -> str:
    """``fp8`` (Transformer Engine's delayed / MXFP8 recipes, torchao's tensor-wise float8) or ``bf16``.

    Raises:
        NotExpressibleError: torchao's row-wise float8 recipe (per-row scales, its own slower kernels: not modelled).
    """
    d = r["dtype"].lower()
    if "rowwise" in d:
        raise NotExpressibleError("float8 row-wise scaling (torchao 'rowwise' recipe): its per-row scales and kernels "
                                  "are not modelled (tensor-wise, delayed and MXFP8 are)")
    return "fp8" if ("fp8" in d or "float8" in d) else "bf16"


@dataclass
class Layout:
    """The published layout of a row (degrees, batch, recomputation, framework). ``kv_exchange``: CP's K/V
    exchange, ``ring`` (Megatron-Core / NeMo: p2p overlapped with attention) or ``allgather`` (Llama 3,
    torchtitan's default ``context_parallel_rotate_method``); ``balanced_routing``: the benchmark forced balanced
    expert routing (NeMo AutoModel's fake balanced gate, the ModelZoo's forced-balance rows); ``dispatcher``,
    ``routing``: the all-to-all's dispatcher and the router's routing; ``etp``: expert-TP (the notes' ``ETP=``);
    ``attention_kernel``: the fused attention kernel of the run's software where it is not its framework's
    default (:attr:`hetplan.plan.Job.attention_kernel`) (:class:`hetplan.estimate.moe.MoEOptions`);
    ``grad_reduce_dtype``: the recipe's gradient buffer / reduction dtype (None: the framework default);
    ``tp_comm_overlap``: the recipe pipelines the TP collectives with the GEMMs (Megatron-Core
    ``--tp-comm-overlap``); ``cuda_graphs``: the run replays its layers as CUDA graphs (the row's notes say so);
    ``a2a_overlap``: the 1F1B all-to-all overlap (the notes' "EP a2a overlap", :attr:`hetplan.plan.Job.moe_a2a_overlap`);
    ``torch_compile``: the run compiled its blocks (:attr:`hetplan.plan.Job.torch_compile`; ``fsdp`` only);
    ``fsdp_param_dtype``, ``cross_entropy``: FSDP's resident parameter dtype and loss;
    ``pipeline_step_microbatches``, ``pipeline_outputs``: micro-batches per call of the pipeline schedule and the
    stages that keep their outputs (:class:`hetplan.plan.Plan`)."""

    tp: int
    pp: int
    dp: int
    cp: int = 1
    ep: int = 1
    etp: int = 1
    vp: int = 1
    mbs: int = 1
    gbs: int = 1
    seq: int = 1
    recompute: str = "none"
    recompute_fraction: float = 1.0
    framework: str = "megatron"
    zero: int = 1
    sequence_parallel: bool = False
    kv_exchange: str = "ring"
    cp_load_balance: bool = True
    balanced_routing: bool = False
    dispatcher: str = "alltoall"
    routing: str = "random"
    moe_recompute: bool = False
    recompute_modules: tuple[str, ...] = ()
    offload_modules: tuple[str, ...] = ()
    attention_kernel: str | None = None
    attention: str = "flash"
    grad_reduce_dtype: str | None = None
    tp_comm_overlap: bool = False
    cuda_graphs: bool = False
    a2a_overlap: bool = False
    torch_compile: bool = True
    fsdp_param_dtype: str = "fp32"
    cross_entropy: str | None = None
    pipeline_step_microbatches: int | None = None
    pipeline_outputs: str = "last"


def build_plan(r: dict, m: ModelSpec, lay: Layout, gpu: str, dtype: str, notes: list[str]) -> Plan:
    """The :class:`Plan` of a row: ``pp`` stages of ``tp x dp`` GPUs (balanced split of the run's layers),
    FlashAttention (every source ran it), one pool of the nodes of :func:`node_pool`. Raises :class:`NotExpressibleError` for CP / EP > 1 until the plan carries them."""
    degrees = {k: v for k, v in (("cp", lay.cp), ("ep", lay.ep), ("expert_tp", lay.etp)) if v > 1}
    for k, v in degrees.items():
        if k not in Plan.model_fields:
            what = "context" if k == "cp" else "expert"
            raise NotExpressibleError(f"{k.upper()} {v}: the plan schema has no {what}-parallel degree yet")
    if lay.pp > m.num_layers:
        raise NotExpressibleError(f"PP {lay.pp} exceeds the {m.num_layers} layers")
    if lay.gbs % (lay.dp * lay.mbs):
        raise NotExpressibleError(f"global batch {lay.gbs} is not a multiple of DP {lay.dp} x micro-batch {lay.mbs}")
    framework, zero = lay.framework, lay.zero
    if framework == "fsdp" and "fsdp" not in str(Job.model_fields["framework"].annotation):
        framework, zero = "megatron", 3
        notes.append("FSDP2 as ZeRO-3 (framework = 'fsdp' not in the estimator yet)")
    extra = {}
    if lay.cp > 1 and "cp_kv_exchange" in Job.model_fields:
        extra.update(cp_kv_exchange=lay.kv_exchange, cp_load_balance=lay.cp_load_balance)
    if lay.balanced_routing and "moe_load_imbalance" in Job.model_fields:
        extra["moe_load_imbalance"] = 1.0
    if not lay.torch_compile:
        extra["torch_compile"] = False
    if lay.attention_kernel is not None:
        extra["attention_kernel"] = lay.attention_kernel
    if lay.ep > 1:
        extra.update(moe_dispatcher=lay.dispatcher, moe_routing=lay.routing, moe_recompute=lay.moe_recompute,
                     moe_a2a_overlap=lay.a2a_overlap)
    if lay.recompute_modules or lay.offload_modules:
        extra.update(recompute_modules=list(lay.recompute_modules), offload_modules=list(lay.offload_modules))
    job = _probe_job(model=m.name, seq_len=lay.seq, global_batch=lay.gbs, dtype=dtype, attention=lay.attention,
                     framework=framework, **extra)
    pool = node_pool(gpu, lay.tp * lay.pp * lay.dp * lay.cp)
    stages = []
    for k in balanced_split(m.num_layers, lay.pp):
        rl = None if lay.recompute_fraction >= 1 else round(k * lay.recompute_fraction)
        stages.append(Stage(pool=0, num_layers=k, tp=lay.tp, dp=lay.dp, recompute=lay.recompute, recompute_layers=rl))
    try:
        return Plan(job=job, pools=[pool], stages=stages, mbs=lay.mbs, zero=zero,
                    sequence_parallel=lay.sequence_parallel and lay.tp > 1, schedule="1f1b",
                    virtual_stages=lay.vp, overlap_grad_reduce=True, grad_reduce_dtype=lay.grad_reduce_dtype,
                    tp_comm_overlap=lay.tp_comm_overlap, cuda_graphs=lay.cuda_graphs,
                    fsdp_param_dtype=lay.fsdp_param_dtype, cross_entropy=lay.cross_entropy,
                    pipeline_step_microbatches=lay.pipeline_step_microbatches,
                    pipeline_outputs=lay.pipeline_outputs, **degrees)
    except ValueError as exc:
        raise NotExpressibleError(f"plan rejected: {str(exc).splitlines()[-1]}") from None


def node_pool(gpu: str, n: int) -> GPUPool:
    """``n`` GPUs of type ``gpu`` in the nodes the sources ran on: the GPU type's reference node where the pool
    model has one (DGX H100 / H200 / B200, GB200 NVL72); otherwise 8 GPUs per node with 8 NICs of 400 Gb/s
    (:data:`DGX_NODE_BYTES_PER_S`; Meta's Grand Teton hosts of the 500 W H100 have one 400 Gb/s RoCE NIC per GPU,
    Llama 3 paper Sec. 3.3.1), or the NVL72 domain for GB200 (:data:`NVL72_NODE_BYTES_PER_S`)."""
    if "node" in GPUPool.model_fields:
        pool = GPUPool(gpu=gpu, count=n)
        if getattr(pool, "node", None) is not None:
            return pool
    nvl72 = gpu.startswith("GB")
    return GPUPool(gpu=gpu, count=n, gpus_per_node=NVL72_GPUS if nvl72 else 8,
                   inter_node_bandwidth_bytes_per_s=NVL72_NODE_BYTES_PER_S if nvl72 else DGX_NODE_BYTES_PER_S)


def _check_gpus(r: dict, lay: Layout) -> None:
    n = _int(r, "num_gpus")
    if n != lay.tp * lay.pp * lay.dp * lay.cp:
        raise NotExpressibleError(f"TP {lay.tp} x PP {lay.pp} x DP {lay.dp} x CP {lay.cp} != {n} GPUs as published")


def _case(set_name: str, key: str, r: dict, lay: Layout, quantity: str, measured: float, *, catalog: Catalog,
          group: str | None = None, memory_gib: float | None = None, causal_flops: bool = False,
          model: ModelSpec | None = None) -> ModernCase:
    m = model or row_model(r)
    gpu = catalog_gpu(r["gpu"], catalog)
    dtype = _dtype(r)
    notes: list[str] = []
    _check_gpus(r, lay)
    plan = build_plan(r, m, lay, gpu, dtype, notes)
    c = ModernCase(set=set_name, key=key, group=group or f"{r['model']}|{gpu}|n{r['num_gpus']}|g{lay.gbs}|s{lay.seq}",
                   measured=measured, predict=lambda: math.nan, is_calibration=_is_calibration(key, CALIBRATION_FRACTION),
                   info=dict(model=r["model"], gpu=gpu, n=int(r["num_gpus"]), tp=lay.tp, pp=lay.pp, dp=lay.dp,
                             cp=lay.cp, ep=lay.ep, vp=lay.vp, mbs=lay.mbs, gbs=lay.gbs, seq=lay.seq, dtype=dtype,
                             recompute=lay.recompute),
                   plan=plan, model=m, virtual_stages=lay.vp, quantity=quantity, gpu=gpu, dtype=dtype,
                   measured_memory_bytes=None if memory_gib is None else memory_gib * 2**30,
                   dense_cp1=lay.cp == 1 and lay.ep == 1, notes=notes, causal_flops=causal_flops)
    c.predict = c.evaluate
    return c


def _collect(set_name: str, items: Iterable[tuple[str, callable]]) -> tuple[list[ModernCase], list[NotExpressible]]:
    cases, skipped = [], []
    for key, make in items:
        try:
            cases.append(make())
        except NotExpressibleError as exc:
            skipped.append(NotExpressible(set_name, key, str(exc)))
    return cases, skipped


# ----------------------------------------------------------------------------------------------------------------
# Sources


def _is_jax(r: dict) -> bool:
    return "jax" in r["framework"].lower()


#: CP degree that a DGX Cloud release's launch script sets where its table gives none, by (row source, dtype): the
#: Nemotron-4 340B recipe of releases v24.11.1-v25.03 runs bf16 with ``CP=2`` (``nemotron/configure.sh`` at
#: 1b9bb6b3: ``if [[ $DTYPE = bf16 ]]; then CP=2``), so its DP is GPUs / 128, not / 64 (the README's "GA=16"
#: header is shared with the FP8 table; v25.04 dropped the 128-GPU scale and runs CP 1).
DGXC_LAUNCH_CP = {("NVIDIA/dgxc-benchmarking@1b9bb6b3cfea881fc4997ac111e695e52ae901aa:nemotron/README_340b.md",
                   "bf16"): 2}


#: DGX Cloud recipes whose launch script captures CUDA graphs on a GPU type, by (row source, GPU label start):
#: ``grok1/launch.sh`` at 60d6fd33 sets ``CUDA_GRAPH=true`` for ``gb200`` and ``b200`` (false for ``h100``) and
#: passes ``--cuda_graphs``.
DGXC_CUDA_GRAPHS = {("NVIDIA/dgxc-benchmarking@60d6fd33ba9554a12b2f0f1f7f62ffd51f220e3d:grok1/README.md", "GB200")}


#: DGX Cloud recipes whose launch script recomputes the core attention (``--recompute_modules core_attn``), by
#: (row source, GPU label start): ``deepseek_v3/pretraining/launch.sh`` at 60d6fd33, ``RM='core_attn'`` on gb200
#: (``mla_up_proj`` on h100). Megatron's selective recomputation of the attention core (``recompute = "selective"``).
DGXC_CORE_ATTN_RECOMPUTE = {
    ("NVIDIA/dgxc-benchmarking@60d6fd33ba9554a12b2f0f1f7f62ffd51f220e3d:deepseek_v3/pretraining/README.md", "GB200")}


def unfused_mla_on_blackwell(m: ModelSpec, gpu: GPUSpec) -> bool:
    """Whether Transformer Engine runs the attention of ``m`` on ``gpu`` unfused (``attention = "standard"``):
    MLA's query/key head dimension differs from its value head dimension (DeepSeek-V3: 192 vs 128), which rules
    out FlashAttention ("does not support MLA"), and on Blackwell Transformer Engine v2.1-v2.4 (2025-03 to
    2025-06) also rule out cuDNN's fused attention for head dimensions above 128 (``nvte_get_fused_attn_backend``,
    "special conditions for blackwell": ``!(sm_arch_ >= 100 && (head_dim_qk > 128 || head_dim_v > 128))``,
    ``transformer_engine/common/fused_attn/fused_attn.cpp``; gone in v2.5). The DGX Cloud GB200 rows ran the NeMo
    25.04 containers of that window. That leaves ``UnfusedDotProductAttention``: the two batched GEMMs over all ``s x s`` scores and the
    softmax between them, which the GB200 recipe recomputes (:data:`DGXC_CORE_ATTN_RECOMPUTE`; without it the
    scores would take 274 GiB on a 173 GiB GPU). Hopper keeps cuDNN (head dimensions up to 256)."""
    return m.is_mla and m.head_dim != (m.v_head_dim or m.head_dim) and gpu.architecture.startswith("Blackwell")


def dgxc_cases(set_name: str = "dgxc_h100", catalog: Catalog | None = None):
    """NVIDIA DGX Cloud benchmarking recipes (NeMo / Megatron-Core): measured step time.

    Layout as published (TP, PP, CP, VP, EP, micro-batch, global batch); DP = GPUs / (TP·PP·CP). Megatron-Core as
    NeMo's recipes run it: distributed optimizer (ZeRO-1), sequence parallelism with TP, gradient reduction
    overlapped, gradients reduced and buffered in bf16 (the performance recipes' ``plugins.grad_reduce_in_fp32 =
    False``, NeMo ``nemo/collections/llm/recipes/*``), TP communication overlapped (their
    ``MegatronCommOverlapCallback(tp_comm_overlap=True)`` with a userbuffers config per model), FlashAttention (cuDNN / TE fused attention), no
    recomputation (the recipes' default for these rows; not restated in the tables), CUDA graphs where the launch
    script captures them (:data:`DGXC_CUDA_GRAPHS`), MLA unfused on Blackwell (:func:`unfused_mla_on_blackwell`) with
    the core-attention recomputation its recipe sets (:data:`DGXC_CORE_ATTN_RECOMPUTE`). JAX rows (MaxText, Paxml) are not expressible (XLA's sharding and fusion
    are another runtime); LoRA rows neither (frozen base weights: no estimator support); Nemotron-H (Mamba layers)
    and the MoE models until the estimator has them. ``set_name``: ``dgxc_h100`` (H100 rows) or ``dgxc_gb200``.
    """
    catalog = catalog or load_catalog()
    want = "gb200" if set_name == "dgxc_gb200" else "h100"
    rows = _rows(FILES["dgxc_h100"])
    published_vp: dict[tuple, Counter] = {}
    for r in rows:
        if r["vp"]:
            published_vp.setdefault((r["model"], r["gpu"], r["tp"], r["pp"]), Counter())[int(r["vp"])] += 1
    items = []
    for i, r in enumerate(rows):
        if want not in r["gpu"].lower():
            continue
        key = f"{set_name}:{i}:{r['model']}:n{r['num_gpus']}:{r['dtype']}:tp{r['tp']}pp{r['pp']}cp{r['cp'] or 1}vp{r['vp'] or 1}"

        def make(r=r, key=key):
            if _is_jax(r):
                raise NotExpressibleError("JAX (MaxText / Paxml): XLA's sharding and fusion are not modelled")
            if "lora" in r["model"].lower():
                raise NotExpressibleError("LoRA fine-tuning: frozen base weights and adapters are not modelled")
            tp, pp, cp = _int(r, "tp", 1), _int(r, "pp", 1), _int(r, "cp", 1)
            cp = DGXC_LAUNCH_CP.get((r["source"], r["dtype"]), cp) if not r["cp"] else cp
            vp, note = _int(r, "vp", 1), None
            siblings = published_vp.get((r["model"], r["gpu"], r["tp"], r["pp"]))
            if not r["vp"] and pp > 1 and siblings:
                vp = siblings.most_common(1)[0][0]
                note = f"VP not stated; {vp} as the other releases of this layout publish"
            unfused = unfused_mla_on_blackwell(row_model(r), catalog.get(catalog_gpu(r["gpu"], catalog)))
            core_attn = (r["source"], r["gpu"][:5]) in DGXC_CORE_ATTN_RECOMPUTE
            lay = Layout(tp=tp, pp=pp, dp=_int(r, "num_gpus") // (tp * pp * cp), cp=cp, ep=_int(r, "ep", 1),
                         etp=_expert_tp(r),
                         vp=vp, mbs=_int(r, "micro_batch", 1), gbs=_int(r, "global_batch"),
                         seq=_int(r, "seq_len"), sequence_parallel=True, zero=1, grad_reduce_dtype="bf16",
                         tp_comm_overlap=True, cuda_graphs=(r["source"], r["gpu"][:5]) in DGXC_CUDA_GRAPHS,
                         attention="standard" if unfused else "flash",
                         recompute="selective" if core_attn else "none")
            t = _float(r, "iteration_time_s")
            if t is None:
                raise NotExpressibleError("no step time published")
            c = _case(set_name, key, r, lay, "iteration_time_s", t, catalog=catalog)
            c.notes += [note] if note else []
            return c

        items.append((key, make))
    return _collect(set_name, items)


def _torchtitan_recompute(label: str) -> tuple[str, float]:
    """torchtitan's activation checkpointing: ``selective`` op-level SAC (what the row says 'selective' or
    'per-op SAC') saves the matmul outputs, i.e. Megatron's selective; ``selective layer`` checkpoints every
    second layer (``selective_ac_option = "2"``); ``full`` all layers. A row that ran the ``llama3_8b.toml``
    default ran its ``[activation_checkpoint]`` ``mode = "selective"``, ``selective_ac_option = "op"``
    (pytorch/torchtitan ``torchtitan/models/llama3/train_configs/llama3_8b.toml`` at e7c0cae, the H200 rows'
    commit; the same at 9dec370)."""
    low = label.lower()
    if "full" in low:
        return "full", 1.0
    if "layer" in low:
        return "full", 0.5
    if "selective" in low or "sac" in low or "llama3_8b.toml default" in low:
        return "selective", 1.0
    return "none", 1.0


#: torchtitan commits (or sources) of rows whose loss is compiled with the model: ``build_cross_entropy_loss``
#: compiles it under ``training.compile`` since bbb1b616e (2025-04-02), an ancestor of e7c0cae and 820504e; the
#: MXFP8 page's runs (torchtitan 6fc499f, 2025-08) are later still. Their loss follows
#: :attr:`hetplan.plan.Job.torch_compile` (``Plan.cross_entropy`` None). Earlier commits compiled the transformer
#: blocks only (``apply_compile`` at 9dec370): their loss ran eager on fp32 logits.
TORCHTITAN_COMPILED_LOSS = ("e7c0cae", "820504e", "quantization/mxfp8.md")

#: torchtitan sources whose rows ran ``torch.compile`` although their notes do not say so: the Trainy H200
#: benchmark's command line passes ``--training.compile``; the Llama 4 Scout MXFP8 runs list "``torch.compile``
#: enabled" (``torchtitan/components/quantization/mxfp8.md``).
TORCHTITAN_COMPILED_SOURCES = ("llama3-8b_h200_202506_trainy-whitefiber.md", "quantization/mxfp8.md")


def _torchtitan_compiled(r: dict) -> bool:
    """Whether a torchtitan row ran ``torch.compile``: its notes say "torch.compile" or "compile=true" (the
    405B rows' toml), or its source is one of :data:`TORCHTITAN_COMPILED_SOURCES`; otherwise eager, the default of
    torchtitan's train configs of the time (``[training] compile = false`` in ``llama3_8b.toml`` /
    ``llama3_70b.toml`` at pytorch/torchtitan@3faaa1a and @9dec370: the A100 rows and Table 1's "FSDP" rows)."""
    notes = r["notes"].lower()
    return ("torch.compile" in notes or "compile=true" in notes
            or any(src in r["source"] for src in TORCHTITAN_COMPILED_SOURCES))


def _torchtitan_attention_kernel(gpu: GPUSpec) -> str:
    """The SDPA backend torchtitan ran on ``gpu`` at the rows' commits (all before pytorch/torchtitan@6a3a9da,
    2025-10-09, which puts cuDNN first everywhere): cuDNN first on sm100 (Blackwell) since 3b85aa3 (2025-05-14),
    otherwise PyTorch's flash backend, FlashAttention-2 (:data:`hetplan.hardware.catalog.DEFAULT_ATTENTION_KERNEL`)."""
    return "cudnn" if gpu.architecture.startswith("Blackwell") else "fa2"


#: Local batch (sequences per rank and step) of torchtitan rows whose CSV value contradicts the run's first
#: write-up, by source: the Llama 4 Scout MXFP8 runs on 256 GB200 (``quantization/mxfp8.md``, 2025-12: "Local batch
#: size: 10") were first published with "Local batch size: 1" and otherwise the same configuration and tokens/s
#: (pytorch/ao@2f903f81a ``torchao/prototype/moe_training/README.md``, 2025-11-07, same author). 1 is the value that
#: ran: without activation checkpointing 10 x 8,192 tokens per GPU keep about 700 GiB of activations on a 186 GB GPU,
#: 1 x 8,192 about 75 GiB.
TORCHTITAN_LOCAL_BATCH = {"quantization/mxfp8.md": 1}


#: Why the four "power limited" 8 x B200 rows of the MXFP8 page are not expressible. Their model is Llama 3 8B (the
#: same table in pytorch/ao ``docs/source/workflows/training.md``), but the power limit is not stated, and it
#: matters: at the same software, 8 H100 SXM run the model at 6,150 tokens/s (38 % MFU, same page), these B200 at
#: 8,307 (23 % of the 2,250 peak). Mapped to the 1,000 W B200 the bf16 row would read +106 % and the FP8 rows
#: +142-161 %.
POWER_LIMITED_B200 = ("B200 'power limited' to a limit the source does not state (Llama 3 8B per pytorch/ao's "
                      "training docs; 23 % MFU against 38 % on H100 at the same software)")


#: torchtitan sources whose runs used a PyTorch from before pytorch/pytorch#153383 (2025-05-13), where every
#: pipeline stage keeps its outputs for ``step()``'s return value (:attr:`hetplan.plan.Plan.pipeline_outputs`
#: ``"all"``): the December 2024 benchmark's "Versions and Dates" table names torch 1963fc8 of 2024-12-23.
TORCHTITAN_TORCH_BEFORE_153383 = ("llama3_h100_202412_torchtitan.md",)


#: How torchtitan's async-TP rows (the notes' "async TP": ``enable_async_tensor_parallel``) are mapped: as vanilla
#: TP. PyTorch's async TP as the estimator models it (:attr:`hetplan.plan.Job.async_tp`,
#: :func:`hetplan.estimate.compute.async_tp_exposed_s`) predicts 1.11-1.23x over the vanilla twins where the runs
#: measured 1.05-1.16x (``tests/calibration/test_modern.py``); with it the set goes from 8.9 to 10.6 % (and
#: ``long_context_cp`` from 5.6 to 6.1 %), so the rows keep vanilla TP until the missing cost is found, and say so.
ASYNC_TP_NOTE = "async TP mapped as vanilla TP (Job.async_tp predicts more speedup than these runs measured)"


def _torchtitan_async_tp(r: dict) -> bool:
    """Whether a torchtitan row ran async TP (its notes say "async TP"; TP > 1)."""
    return _int(r, "tp", 1) > 1 and bool(re.search(r"async ?tp", r["notes"].lower()))


def torchtitan_row_case(set_name: str, i: int, r: dict, catalog: Catalog):
    """One torchtitan row: FSDP2 (``framework = "fsdp"``), TP with sequence parallelism, PP (1F1B or
    interleaved; the local batch split into PP-degree micro-batches, the default of the rows' torchtitan 9dec370:
    ``experimental.pipeline_parallel_microbatches`` unset = ``pipeline_parallel_degree``, ``pipelining_utils.py``;
    every FSDP unit of a stage unsharded through the step, :data:`hetplan.estimate.memory.FSDP_PIPELINE_GRAD_BYTES`),
    the loss compiled where the commit does (:data:`TORCHTITAN_COMPILED_LOSS`), FlashAttention (SDPA), float8 as
    ``dtype = "fp8"``; tokens/s per GPU and memory. CP rows: K/V
    all-gathered (``context_parallel_rotate_method`` default) and no causal load balancing
    (``cp_load_balance = False``: the rows' PyTorch of December 2024 ran ring attention over contiguous chunks;
    inferred from the rows themselves — with balancing the six CP rows are 26-81 % too fast, growing with CP as
    ``2 - 1/cp`` does, without it within 12 %)."""
    key = f"{set_name}:{i}:{r['model']}:{r['gpu'][:12]}:n{r['num_gpus']}:s{r['seq_len']}:{r['dtype'][:16]}:{r['notes'][:40]}"

    def make():
        if "not stated" in r["model"] and "power limited" in r["gpu"].lower():
            raise NotExpressibleError(POWER_LIMITED_B200)
        if "not stated" in r["model"]:
            raise NotExpressibleError("the source does not name the model")
        tp, pp, dp, cp = (_int(r, k, 1) for k in ("tp", "pp", "dp", "cp"))
        seq = _int(r, "seq_len")
        local = _int(r, "micro_batch")
        m_local = re.search(r"[Ll]ocal batch(?: size)? (\d+)", r["notes"])
        local = local or (int(m_local.group(1)) if m_local else None)
        gbs = _int(r, "global_batch") or (local * dp if local else None)
        fixed = next((v for src, v in TORCHTITAN_LOCAL_BATCH.items() if src in r["source"]), None)
        if fixed is not None and "moe" in r["model"].lower():
            gbs = fixed * dp
        if gbs is None:
            raise NotExpressibleError("global batch not given")
        mbs = max(gbs // dp // pp, 1) if pp > 1 else (gbs // dp)
        vp = 2 if "interleaved" in r["notes"].lower() else 1
        rc, frac = _torchtitan_recompute(r["recompute"])
        lay = Layout(tp=tp, pp=pp, dp=dp, cp=cp, vp=vp, mbs=mbs, gbs=gbs, seq=seq, recompute=rc,
                     recompute_fraction=frac, framework="fsdp", zero=3, sequence_parallel=True,
                     kv_exchange="allgather", cp_load_balance=False, torch_compile=_torchtitan_compiled(r),
                     ep=_int(r, "ep", 1),
                     attention_kernel=_torchtitan_attention_kernel(catalog.get(catalog_gpu(r["gpu"], catalog))),
                     cross_entropy=None if any(c in r["framework"] + r["source"] for c in TORCHTITAN_COMPILED_LOSS)
                     else "fp32",
                     pipeline_outputs="all" if any(x in r["source"] for x in TORCHTITAN_TORCH_BEFORE_153383)
                     else "last")
        tps = _float(r, "tokens_per_s_per_gpu")
        if tps is None:
            raise NotExpressibleError("no tokens/s published")
        c = _case(set_name, key, r, lay, "tokens_per_s_per_gpu", tps, catalog=catalog,
                  memory_gib=_float(r, "memory_gb_per_gpu"))
        if _torchtitan_async_tp(r):
            c.notes.append(ASYNC_TP_NOTE)
        return c

    return key, make


def torchtitan_cases(catalog: Catalog | None = None):
    """torchtitan's published benchmarks without context parallelism (CP rows: ``long_context_cp``)."""
    catalog = catalog or load_catalog()
    items = [torchtitan_row_case("torchtitan", i, r, catalog) for i, r in enumerate(_rows(FILES["torchtitan"]))
             if _int(r, "cp", 1) == 1]
    return _collect("torchtitan", items)


def llama3_row_case(set_name: str, i: int, r: dict, catalog: Catalog):
    """Llama 3 405B (arXiv 2407.21783, Table 4 and Sec. 3.3.2): TP 8, PP 16, FSDP-style DP (optimizer states
    and gradients sharded, parameters kept after forward: ZeRO-2), no recomputation at 8K, micro-batch 1,
    interleaved pipeline with one layer per virtual stage (8 layers per stage; the paper gives neither micro-batch
    nor v). TFLOP/s per GPU."""
    key = f"{set_name}:{i}:n{r['num_gpus']}:s{r['seq_len']}"

    def make():
        tp, pp, dp, cp = (_int(r, k, 1) for k in ("tp", "pp", "dp", "cp"))
        lay = Layout(tp=tp, pp=pp, dp=dp, cp=cp, vp=8, mbs=1, gbs=_int(r, "global_batch"), seq=_int(r, "seq_len"),
                     recompute="none", zero=2, sequence_parallel=True, kv_exchange="allgather")
        return _case(set_name, key, r, lay, "tflops_per_gpu", _float(r, "tflops_per_gpu"), catalog=catalog,
                     group="llama3-405b")

    return key, make


def llama3_cases(catalog: Catalog | None = None):
    """The Llama 3 paper's 8K-sequence rows (the 128K CP row: ``long_context_cp``)."""
    catalog = catalog or load_catalog()
    items = [llama3_row_case("llama3_405b", i, r, catalog) for i, r in enumerate(_rows(FILES["llama3_405b"]))
             if _int(r, "cp", 1) == 1]
    return _collect("llama3_405b", items)


def megatron_lm_model(r: dict) -> ModelSpec:
    """The GPT of a Megatron-LM README row (:func:`row_model`) with untied input and output embeddings
    (``--untie-embeddings-and-output-weights``): the table's parameter counts include both ``V x h`` tables
    (1.7B = 12·L·h² + 2·V·h at L 24, h 2048, V 131,072; with one table it would be 1.5B; likewise every row)."""
    m = row_model(r)
    return m.model_copy(update={"tied_embeddings": False, "name": f"{m.name}-untied"})


def megatron_lm_layout(r: dict) -> Layout:
    """The layout of a Megatron-LM README row: its TP / PP / DP and global batch; sequence parallelism, the
    distributed optimizer (ZeRO-1) and ``--tp-comm-overlap`` as the README states; fp32 gradient reduction (r0.8.0
    forces it for bf16: ``megatron/training/arguments.py``); the unfused cross-entropy loss (r0.8.0's default; the
    README lists the fusions it turned on, ``--cross-entropy-loss-fusion`` is not one); no interleaving or
    recomputation (not stated).

    Micro-batch (not stated): 1 with a pipeline (PP > 1 needs micro-batches to fill it); without one (PP 1) the DP
    rank's whole share, ``global batch / DP`` sequences in one micro-batch. At PP 1 nothing splits a rank's four
    sequences, and Megatron's overlapped gradient reduce-scatter and parameter all-gather hide only behind the last
    micro-batch's backward and the first one's forward (:func:`hetplan.estimate.stage.exposed_behind_s`): at
    micro-batch 1 the 32B row (TP 8: one 400 Gb/s rail per DP ring) would expose most of its 0.35 s fp32
    reduce-scatter and 0.18 s all-gather, 1.15 s per iteration predicted against the 0.89 s measured."""
    tp, pp, dp = _int(r, "tp", 1), _int(r, "pp", 1), _int(r, "dp", 1)
    gbs = _int(r, "global_batch")
    return Layout(tp=tp, pp=pp, dp=dp, mbs=1 if pp > 1 else gbs // dp, gbs=gbs, seq=_int(r, "seq_len"),
                  sequence_parallel=True, zero=1, tp_comm_overlap=True, cross_entropy="fp32")


def megatron_lm_cases(catalog: Catalog | None = None):
    """Megatron-LM README weak scaling (r0.8.0) on H100: TFLOP/s per GPU, the README's GPT family with untied
    embeddings (:func:`megatron_lm_model`) in the layout of :func:`megatron_lm_layout`. Rows without a layout are
    not expressible."""
    catalog = catalog or load_catalog()
    items = []
    for i, r in enumerate(_rows(FILES["megatron_lm_h100"])):
        key = f"megatron_lm_h100:{i}:{r['model'][:20]}:n{r['num_gpus']}"

        def make(r=r, key=key):
            if not r["tp"]:
                raise NotExpressibleError("the source gives no TP / PP / DP for this row")
            return _case("megatron_lm_h100", key, r, megatron_lm_layout(r), "tflops_per_gpu",
                         _float(r, "tflops_per_gpu"), catalog=catalog, group="weak-scaling",
                         model=megatron_lm_model(r))

        items.append((key, make))
    return _collect("megatron_lm_h100", items)


#: Expert-parallel degree of NeMo AutoModel rows whose table leaves it out, from the benchmark's recipe (the rows
#: name DeepEP, which only runs with EP): ``examples/llm_benchmark/gpt_oss/gptoss_120b_te_deepep.yaml`` and
#: ``gptoss_20b_te_deepep.yaml`` (NVIDIA-NeMo/Automodel@36044ad3d) set ``ep_size: 64`` and ``8``.
AUTOMODEL_EP = {"GPT-OSS 120B": 64, "GPT-OSS 20B": 8}


#: NeMo AutoModel's FSDP2 as its benchmark recipes run it (NVIDIA-NeMo/Automodel ``examples/llm_benchmark/*.yaml``
#: at 36044ad3d): no ``model.torch_dtype``, so bf16 resident parameters (``from_config``'s ``"auto"``) with
#: ``torch.optim.Adam`` (bf16 moments); ``loss_fn: MaskedCrossEntropy`` with ``fp32_upcast: false``. (Its pipeline
#: stages keep their units unsharded, ``FSDP2Config.reshard_after_forward`` None, which the memory of any FSDP
#: pipeline stage already holds: :data:`hetplan.estimate.memory.FSDP_PIPELINE_GRAD_BYTES`.)
AUTOMODEL_FSDP = {"fsdp_param_dtype": "bf16", "cross_entropy": "bf16"}

#: Micro-batches per call of NeMo AutoModel's pipeline schedule (:attr:`hetplan.plan.Plan.
#: pipeline_step_microbatches`): its recipes' ``local_batch_size / pp_microbatch_size``, the iteration's other
#: micro-batches run as further calls with gradient accumulation (NVIDIA-NeMo/Automodel@36044ad3d
#: ``examples/llm_benchmark/deepseek/deepseek_v3_te_deepep*.yaml``: 4 / 1; ``kimi/kimi_k2_te_deepep.yaml``: 8 / 1).
AUTOMODEL_PP_STEP = {"DeepSeek V3 671B": 4, "Kimi K2": 8}


#: The Megatron MoE ModelZoo's GB200 MXFP8 commands (yanring/Megatron-MoE-ModelZoo@e865051
#: ``best_practice/qwen3/readme.md``, "Command (MXFP8)" and "(MXFP8, 128k long context)"): both run
#: ``--recompute-granularity selective --recompute-modules moe_act layernorm``; the 4K-token one (the row whose
#: notes say "activation offloading required") also ``--fine-grained-activation-offloading --offload-modules
#: expert_fc1 moe_act``.
MODELZOO_MXFP8_RECOMPUTE_MODULES = ("moe_act", "layernorm")
MODELZOO_OFFLOAD_MODULES = ("expert_fc1", "moe_act")


def _recompute_modules(r: dict) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Megatron-Core's per-module recomputation and offloading of a ModelZoo row, ``(recompute_modules,
    offload_modules)``: the table's recompute column names ``norm`` / ``layernorm`` and ``act`` / ``moe_act``
    (``moe``, the whole MoE layer, is :func:`_moe_recompute`; ``shared_expert`` is not modelled); the GB200 MXFP8
    rows carry them in their commands (:data:`MODELZOO_MXFP8_RECOMPUTE_MODULES`, :data:`MODELZOO_OFFLOAD_MODULES`)."""
    low = r["recompute"].lower()
    modules = tuple(x for x, words in (("layernorm", ("norm",)), ("moe_act", ("act",)))
                    if any(re.search(rf"\b(?:layer)?{w}\b|\bmoe_{w}\b", low) for w in words))
    notes = r["notes"].lower()
    if r["dtype"].lower() == "mxfp8" and "selective recompute" in notes:
        modules = MODELZOO_MXFP8_RECOMPUTE_MODULES
    offload = MODELZOO_OFFLOAD_MODULES if "activation offloading" in notes else ()
    return modules, offload


def _moe_recompute(label: str) -> tuple[str, bool]:
    """Recomputation of a MoE row, ``(stage recompute, MoE-layer recompute)``: NeMo AutoModel's
    ``activation_checkpointing: true`` checkpoints every transformer block (full); Megatron's ``full``;
    Megatron's per-module selective recomputation recomputes the MoE layer where its modules name ``moe``
    (``--recompute-modules moe``), and otherwise cheap element-wise work only (``layernorm``, ``moe_act``: none)."""
    low = label.lower()
    if "full" in low or "activation_checkpointing: true" in low:
        return "full", False
    return "none", bool(re.search(r"\bmoe\b", low))


def _expert_tp(r: dict) -> int:
    """Expert-TP of a row: the ``ETP=n`` its notes carry (DGX Cloud, ModelZoo), else 1."""
    found = re.search(r"\bETP=(\d+)", r.get("notes", ""))
    return int(found.group(1)) if found else 1


def _dispatcher(r: dict) -> str:
    """``hybridep`` or ``deepep`` where the row names it (Megatron-Core's flex dispatcher; NeMo AutoModel's
    ``dispatcher: deepep`` / ``hybridep``), else Megatron-Core's default ``alltoall``."""
    text = (r.get("attention", "") + " " + r.get("framework", "")).lower()
    return "hybridep" if "hybridep" in text else "deepep" if "deepep" in text else "alltoall"


def _moe_row_case(i: int, r: dict, src: str, catalog: Catalog):
    key = f"moe_h100:{src}:{i}:{r['model'][:24]}:n{r['num_gpus']}:s{r['seq_len']}:tp{r['tp']}ep{r['ep']}"

    def make():
        if "lora" in r["model"].lower():
            raise NotExpressibleError("LoRA fine-tuning: frozen base weights and adapters are not modelled")
        tp, pp, cp = (_int(r, k, 1) for k in ("tp", "pp", "cp"))
        ep = _int(r, "ep") or AUTOMODEL_EP.get(r["model"], 1)
        recompute, moe_recompute = _moe_recompute(r["recompute"])
        modules, offload = _recompute_modules(r) if src == "modelzoo" else ((), ())
        n = _int(r, "num_gpus")
        fsdp = "fsdp" in r["zero_or_fsdp"].lower()
        mbs = _int(r, "micro_batch", 1)
        gbs = _int(r, "global_batch")
        lay = Layout(tp=tp, pp=pp, dp=n // (tp * pp * cp), cp=cp, ep=ep, etp=_expert_tp(r), vp=_int(r, "vp", 1),
                     mbs=mbs, gbs=gbs,
                     seq=_int(r, "seq_len"), framework="fsdp" if fsdp else "megatron", zero=3 if fsdp else 1,
                     sequence_parallel=True, recompute=recompute, moe_recompute=moe_recompute,
                     recompute_modules=modules, offload_modules=offload,
                     balanced_routing=src == "automodel" or "forced" in r["notes"].lower(),
                     dispatcher=_dispatcher(r), routing="contiguous" if src == "automodel" else "random",
                     cuda_graphs="cuda graph" in r["notes"].lower(), a2a_overlap="a2a overlap" in r["notes"].lower(),
                     # Megatron-FSDP (ModelZoo) runs Megatron-Core's loss: the plan's default, not torchtitan's fp32
                     pipeline_step_microbatches=AUTOMODEL_PP_STEP.get(r["model"]) if src == "automodel" else None,
                     **(AUTOMODEL_FSDP if src == "automodel" else {"cross_entropy": None}))
        t = _float(r, "iteration_time_s")
        if t is not None:
            return _case("moe_h100", key, r, lay, "iteration_time_s", t, catalog=catalog)
        return _case("moe_h100", key, r, lay, "tflops_per_gpu", _float(r, "tflops_per_gpu"), catalog=catalog,
                     causal_flops=src == "modelzoo")

    return key, make


def moe_cases(catalog: Catalog | None = None):
    """NeMo AutoModel (FSDP2 + EP; step time) and the Megatron MoE ModelZoo (Qwen3; step time or TFLOP/s)."""
    catalog = catalog or load_catalog()
    auto, zoo = FILES["moe_h100"]
    items = [_moe_row_case(i, r, "automodel", catalog) for i, r in enumerate(_rows(auto))]
    items += [_moe_row_case(i, r, "modelzoo", catalog) for i, r in enumerate(_rows(zoo))]
    return _collect("moe_h100", items)


def _nemo_attention_kernel(r: dict) -> str | None:
    """``fa2`` for NeMo 24.03's H100 long-sequence rows, else None (Transformer Engine's default, cuDNN on Hopper).
    Those rows ran FlashAttention-2: at cuDNN's rates they are 14-66 % too fast, growing with the sequence, at
    FlashAttention-2's within 5 % at 4K-1M tokens (inferred from the rows: the source does not name the attention
    backend; Transformer Engine of early 2024 ran ``flash-attn`` where it could, its cuDNN preference on Hopper
    came later)."""
    return "fa2" if "24.03" in r["framework"] and "h100" in r["gpu"].lower() else None


def long_context_cases(catalog: Catalog | None = None):
    """NeMo long-sequence rows with their published layout (TFLOP/s; the 'without CP' rows give no layout),
    torchtitan's CP rows (tokens/s, memory) and Llama 3's 128K row (TFLOP/s)."""
    catalog = catalog or load_catalog()
    nemo, titan, llama = FILES["long_context_cp"]
    items = []
    for i, r in enumerate(_rows(nemo)):
        key = f"long_context_cp:nemo:{i}:{r['gpu'][:5]}:n{r['num_gpus']}:s{r['seq_len']}:cp{r['cp'] or '-'}"

        def make(r=r, key=key):
            if not r["tp"]:
                raise NotExpressibleError("'without CP' row: the source gives no TP / PP / DP")
            tflops = _float(r, "tflops_per_gpu")
            if tflops is None:
                raise NotExpressibleError(f"TFLOP/s {r['tflops_per_gpu']!r} is not a measurement")
            tp, pp, dp, cp = (_int(r, k, 1) for k in ("tp", "pp", "dp", "cp"))
            lay = Layout(tp=tp, pp=pp, dp=dp, cp=cp, mbs=1, gbs=_int(r, "global_batch"), seq=_int(r, "seq_len"),
                         sequence_parallel=True, zero=1, attention_kernel=_nemo_attention_kernel(r))
            return _case("long_context_cp", key, r, lay, "tflops_per_gpu", tflops, catalog=catalog)

        items.append((key, make))
    items += [torchtitan_row_case("long_context_cp", i, r, catalog) for i, r in enumerate(_rows(titan))
              if _int(r, "cp", 1) > 1]
    items += [llama3_row_case("long_context_cp", i, r, catalog) for i, r in enumerate(_rows(llama))
              if _int(r, "cp", 1) > 1]
    return _collect("long_context_cp", items)


LOADERS = {
    "dgxc_h100": lambda catalog=None: dgxc_cases("dgxc_h100", catalog),
    "dgxc_gb200": lambda catalog=None: dgxc_cases("dgxc_gb200", catalog),
    "torchtitan": torchtitan_cases,
    "llama3_405b": llama3_cases,
    "megatron_lm_h100": megatron_lm_cases,
    "moe_h100": moe_cases,
    "long_context_cp": long_context_cases,
}


# ----------------------------------------------------------------------------------------------------------------
# Metrics


def memory_metrics(cases: list[ModernCase]) -> dict:
    """Memory error over the cases that report memory: n, MAPE, max |error| (fractions)."""
    cs = [c for c in cases if c.measured_memory_bytes]
    if not cs:
        return {"n": 0, "mape": math.nan, "max_abs_error": math.nan}
    err = np.array([c.predicted_memory_bytes / c.measured_memory_bytes - 1 for c in cs])
    return {"n": len(cs), "mape": float(np.mean(np.abs(err))), "max_abs_error": float(np.max(np.abs(err)))}


def set_metrics(name: str, cases: list[ModernCase], skipped: list[NotExpressible], convention: str | None = None,
                target: dict | None = None) -> dict:
    """Metrics of one modern set (module doc) plus its convention, target and the rows it cannot express
    (``convention`` / ``target``: a set outside :data:`CONVENTIONS` / :data:`TARGETS`)."""
    res = metrics(cases)
    res["median_abs_error"] = float(np.median([abs(c.predicted / c.measured - 1) for c in cases])) if cases else math.nan
    res["measured"] = sorted({c.quantity for c in cases})
    res["convention"] = convention or CONVENTIONS[name]
    cal = [c for c in cases if c.is_calibration]
    res["calibration"] = metrics(cal)
    res["held_out"] = metrics([c for c in cases if not c.is_calibration])
    if any(c.measured_memory_bytes for c in cases):
        res["memory"] = memory_metrics(cases)
    res["per_dtype"] = {d: metrics([c for c in cases if c.dtype == d]) for d in sorted({c.dtype for c in cases})}
    if name == "dgxc_h100":
        dense = [c for c in cases if c.dense_cp1]
        res["dense_cp1"] = metrics(dense)
        res["dense_cp1_per_dtype"] = {d: metrics([c for c in dense if c.dtype == d]) for d in sorted({c.dtype for c in dense})}
    res["per_gpu_dtype"] = {f"{g}:{d}": metrics([c for c in cases if (c.gpu, c.dtype) == (g, d)])
                            for g, d in sorted({(c.gpu, c.dtype) for c in cases})}
    res["does_not_fit"] = [c.key for c in cases if not c.fits]
    res["approximations"] = dict(Counter(n for c in cases for n in c.notes).most_common())
    res["not_expressible"] = {"n": len(skipped), "rows": [{"key": s.key, "reason": s.reason} for s in skipped]}
    res["target"] = target if target is not None else TARGETS.get(name, {})
    return res


def load_sets(names: Iterable[str] = SET_NAMES, catalog: Catalog | None = None):
    """``{name: (cases, not_expressible)}`` of the modern sets (plans built, nothing predicted yet)."""
    return {n: LOADERS[n](catalog) for n in names}


def run_modern(names: Iterable[str] = SET_NAMES, catalog: Catalog | None = None) -> tuple[dict, list[ModernCase]]:
    """Predict every expressible row of the sets ``names`` with ``catalog`` (default: the package catalog);
    return ``({name: set_metrics}, cases)``."""
    out, every = {}, []
    for name, (cases, skipped) in load_sets(names, catalog).items():
        for c in cases:
            c.evaluate(catalog)
        out[name] = set_metrics(name, cases, skipped)
        every += cases
    return out, every
