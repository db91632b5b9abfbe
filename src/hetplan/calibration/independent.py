"""An independent H100 check: ``hetplan validate`` set ``independent_h100``; only llm-foundry's own residuals fitted.

Issue 13 is checked on "an independent set of published H100 measurements" that the project does not have. This
set is our own proxy of it: published H100 training throughput that is in none of the modern sets
(:mod:`hetplan.calibration.modern`, whose seeded fraction :mod:`hetplan.calibration.modern_fit` fits), with the
configuration fully stated, predicted by the same mapping (:func:`hetplan.calibration.modern.mapping.row_case`).
Its NeMo and fms-fsdp rows are held out: nothing in the package was chosen with them. A seeded half of the
llm-foundry rows (:data:`FOUNDRY_FIT_FRACTION`) fitted that stack's own residuals, and only those
(:mod:`hetplan.calibration.stack_fit`: the H100 rate of its Triton FlashAttention, which no source publishes, and
its ``gemm_factor``); the other half is held out.

Sources (``validation_data/independent/``; its README gives the commits), tokens/s per GPU compared directly:

* MosaicML llm-foundry's MPT training benchmarks on H100 80GB (``llm_foundry_h100.csv``, 77 rows): MPT 760M-70B,
  8-512 GPUs, PyTorch FSDP (FSDP1 under Composer) with ``FULL_SHARD`` or ``SHARD_GRAD_OP``, bf16 (``amp_bf16``)
  and FP8 (Transformer Engine ``te.Linear``, ``amp_fp8``), sequence 512-65,536, micro-batch, gradient accumulation,
  global batch and activation checkpointing per row. Its MFU counts ``6·N`` with ``N`` every parameter (embeddings
  and learned positions too) plus the full ``s²`` attention, ``12·L·h·s`` per token, against the run dtype's dense
  peak (989 bf16, 1,979 FP8 TFLOP/s): not used.
* NeMo 24.07's FP8 pre-training table on DGX-H100 (``nemo_24_07_h100_fp8.csv``, 7 rows): GPT-3 5B / 20B, Llama 2
  7B / 13B / 70B, Nemotron 8B / 22B with their TP / PP / CP / VP, micro-batch and global batch; the table's other
  models (GPT-3 175B, Nemotron 340B, Llama 3 8B / 70B) are in ``dgxc_h100`` and left out. Run as
  :func:`hetplan.calibration.modern.dgxc_cases` runs NeMo (:func:`nemo_layout`), with the model of the launcher
  config the row names (:func:`hetplan.calibration.modern.row_model`).
* IBM's fms-fsdp README (``fms_fsdp_h100.csv``, 4 rows; the PyTorch blog "Maximizing training throughput using
  PyTorch FSDP", 2024-03-13, gives the same table): Llama 2 7B / 13B / 34B / 70B on 96 H100 with 800 Gb/s per
  node, FSDP1 (HSDP for 7B), micro-batch 2 at 4,096 tokens, activation checkpointing per row (:func:`fms_layout`).

How an llm-foundry row is run (each from the source, :func:`foundry_layout`): the MPT model of the run's yaml
(:func:`mpt_model`); Composer's ``mixed_precision: DEFAULT`` = bf16 parameters in compute, fp32 gradient reduction
(``grad_reduce_dtype = "fp32"``) over fp32 sharded parameters (mosaicml/composer@v0.16.4
``composer/trainer/mosaic_fsdp_utils.py``); ``SHARD_GRAD_OP`` keeps the gathered parameters from
forward to backward (``reshard_after_forward = False``); activation checkpointing = full recomputation of every
block; llm-foundry's default loss ``fused_crossentropy`` (flash-attn's fused kernel: ``cross_entropy =
"compiled"``, one fused pass); eager PyTorch (no ``torch.compile``: MPT's block is LayerNorm, ``F.gelu``, biased
``addmm`` and the attention kernel, single kernels whose eager extra bytes are the residual re-read only,
:mod:`hetplan.estimate.elementwise`); the stack ``llm-foundry@0.3`` (:data:`FOUNDRY_STACK`) with its attention
kernel of 2023 (Triton FlashAttention unless the row ran flash-attn 2).

``llm_foundry_a100`` (:func:`run_a100`): llm-foundry's A100 80GB / 40GB tables (``llm_foundry_a100.csv``, 223 rows
of the README's May and October 2023 revisions), run the same way on 8-GPU nodes of 1,600 Gb/s
(:data:`A100_NODE_BYTES_PER_S`), each with the gradient reduction dtype of its Composer ``MP Mode``
(:func:`grad_reduce_dtype`). Every row is held out; the A100 Triton FlashAttention rate is the H100 fit's ratio
to FlashAttention-2 (``gpus.toml``), not fitted on these rows.
"""

from __future__ import annotations

import csv
import math
from importlib import resources

from hetplan.calibration import modern
from hetplan.calibration.modern import Layout, ModernCase, NotExpressibleError
from hetplan.calibration.modern.mapping import catalog_gpu
from hetplan.calibration.validation import _is_calibration
from hetplan.hardware.catalog import Catalog, load_catalog
from hetplan.model.spec import ModelSpec, from_hf_config
from hetplan.plan import GPUPool

SET_NAME = "independent_h100"
FOUNDRY_FILE, NEMO_FILE, FMS_FILE = "llm_foundry_h100.csv", "nemo_24_07_h100_fp8.csv", "fms_fsdp_h100.csv"

#: What the set compares and the MFU convention its source states (printed by ``hetplan validate``).
CONVENTION = ("tokens/s per GPU; a seeded half of the llm-foundry rows fitted that stack's Triton attention rate "
              "and GEMM factor (stack_fit), the rest and every NeMo / fms-fsdp row held out; llm-foundry's MFU counts 6N with every "
              "parameter plus the full s^2 attention, vs the run dtype's dense peak (989 bf16 / 1,979 FP8); "
              "NeMo 24.07 gives model TFLOP/s (not used)")

#: llm-foundry's A100 80GB / 40GB tables (``llm_foundry_a100.csv``): ``hetplan validate --sets llm_foundry_a100``,
#: every row held out (nothing was fitted on them; the H100 fit of :mod:`hetplan.calibration.stack_fit` stays).
A100_SET_NAME, A100_FILE = "llm_foundry_a100", "llm_foundry_a100.csv"
A100_CONVENTION = ("tokens/s per GPU, every row held out (llm-foundry's stack residuals were fitted on H100 rows "
                   "only); the tables of May 2023 (MP mode PURE: bf16 gradient reduction) and October 2023 (DEFAULT: "
                   "fp32); llm-foundry's MFU counts 6N with every parameter plus the full s^2 attention vs 312 "
                   "TFLOP/s (not used)")
#: The A100 nodes of those tables: "A100 80GB / 40GB with 1600 Gbps node-node interconnect (RoCE)" (the tables'
#: headings since mosaicml/llm-foundry@ef350d9), 8 GPUs per node.
A100_NODE_BYTES_PER_S = 1600e9 / 8

#: The issue's aim for the independent set: median |error| at most 10 %, no row beyond 25 %.
TARGET = {"median_abs_error": 0.10, "max_abs_error": 0.25}

#: The stack of the llm-foundry rows (:mod:`hetplan.hardware.stacks`): Composer FSDP1, eager, Triton FlashAttention
#: by default (``submit_benchmarks.py``), its fitted residual GEMM factor (:mod:`hetplan.calibration.stack_fit`).
FOUNDRY_STACK = "llm-foundry@0.3"
#: Seeded fraction of the llm-foundry rows (hash of the row key) that fitted llm-foundry's residuals
#: (:mod:`hetplan.calibration.stack_fit`: the H100 Triton FlashAttention rate and the stack's ``gemm_factor``);
#: the other rows are held out. The NeMo and fms-fsdp rows fitted nothing.
FOUNDRY_FIT_FRACTION = 0.5

#: The attention kernel of these runs: the large-scale rows name theirs in ``sweep.py`` (``--attn_impl flash``:
#: flash-attn 2, ``Job.attention_kernel = "fa2"``; ``triton``: llm-foundry's Triton FlashAttention); the 8-GPU rows
#: ran ``submit_benchmarks.py``'s default ``attn_impl = triton``: the stack's default kernel (``triton``, its H100
#: rate fitted by :mod:`hetplan.calibration.stack_fit`).

#: FP8 rows: Transformer Engine's fused cast kernels (``te.Linear`` under ``te.fp8_autocast``). The estimator picks
#: the FP8 recipe by framework and charges eager torchao casts under an eager ``fsdp`` job, so these rows are run
#: with ``torch_compile`` on, which charges one fused cast kernel per tensor (their element-wise work, single
#: kernels in MPT, is the same either way).
FP8_NOTE = "Transformer Engine's fused FP8 casts charged as fused tensor-wise casts (torch_compile on)"


def _rows(name: str) -> list[dict]:
    text = resources.files("hetplan.calibration").joinpath("validation_data", "independent", name).read_text()
    return list(csv.DictReader(text.splitlines()))


def mpt_model(r: dict) -> ModelSpec:
    """The MPT of a row, read by the ``mpt`` loader (:func:`hetplan.model.spec.from_hf_config`) from the shapes of
    its llm-foundry ``scripts/train/yamls/pretrain/mpt-*.yaml`` and the ``MPTConfig`` defaults at v0.3.0: GPT-style
    blocks with a 4h GeLU MLP, LayerNorm (``low_precision_layernorm``), biases on every linear (``no_bias =
    False``), learned positions (``learned_pos_emb = True``, no ALiBi) of the row's sequence length, tied input /
    output embeddings, no dropout (``*_pdrop = 0``), vocabulary 50,368 — the ``mpt-*`` presets at 2,048 tokens.
    The README's ``NumParams`` equals ``12·L·h² + 9·L·h + (4·L + 2)·h + V·h + s·h`` on every row (checked when
    the CSV was made)."""
    cfg = {"model_type": "mpt", "d_model": int(r["hidden"]), "n_heads": int(r["heads"]),
           "n_layers": int(r["layers"]), "expansion_ratio": 4, "max_seq_len": int(r["seq_len"]),
           "vocab_size": int(r["vocab"]), "source": r["arch_source"]}
    return from_hf_config(cfg, f"{r['model'].lower()}-s{r['seq_len']}")


def grad_reduce_dtype(r: dict) -> str:
    """The gradient reduction dtype of a row's Composer ``fsdp_config.mixed_precision`` (the table's ``MP Mode``,
    in ``notes``): ``DEFAULT`` reduces in fp32, ``PURE`` in the compute dtype (bf16): ``param_dtype`` /
    ``reduce_dtype`` / ``buffer_dtype`` of ``get_mixed_precision`` (mosaicml/composer@v0.13.4
    ``composer/trainer/mosaic_fsdp.py``, the release llm-foundry's May-2023 benchmarks pinned; the same in
    v0.16.4 ``composer/trainer/mosaic_fsdp_utils.py``)."""
    return "bf16" if "MP mode PURE" in r["notes"] else "fp32"


def foundry_layout(r: dict) -> Layout:
    """The layout of a row: pure data parallelism over every GPU (FSDP, no TP / PP), its micro-batch and global
    batch (``micro-batch × gradient accumulation × GPUs``), full recomputation where activation checkpointing is on,
    the gradient reduction dtype of its ``MP Mode`` (:func:`grad_reduce_dtype`) and the FSDP settings of the
    module doc."""
    n, mbs, gbs = int(r["num_gpus"]), int(r["micro_batch"]), int(r["global_batch"])
    fp8 = r["dtype"].startswith("fp8")
    kernel = {} if "triton" in r["attention"].lower() else {"attention_kernel": "fa2"}
    return Layout(tp=1, pp=1, dp=n, recompute=r["recompute"],
                  job=dict(seq_len=int(r["seq_len"]), global_batch=gbs, stack=FOUNDRY_STACK, torch_compile=fp8,
                           **kernel),
                  plan=dict(mbs=mbs, zero=3, grad_reduce_dtype=grad_reduce_dtype(r), fsdp_param_dtype="fp32",
                            cross_entropy="compiled"))


def nemo_layout(r: dict) -> Layout:
    """The layout of a NeMo 24.07 row: its TP / PP / CP / VP, micro-batch and global batch, DP = GPUs /
    (TP·PP·CP); Megatron-Core as the NeMo-Framework-Launcher configs of the rows' models set it (``arch_source``):
    Apex ``distributed_fused_adam`` (ZeRO-1) with bf16 gradient reduction (its ``grad_sync_dtype`` default, the
    bf16 O2 parameters), sequence parallelism with TP, ``ub_tp_comm_overlap`` (TP communication overlapped),
    no activation checkpointing, Transformer Engine's fused attention and FP8 linears."""
    tp, pp, cp, n = (int(r[k]) for k in ("tp", "pp", "cp", "num_gpus"))
    return Layout(tp=tp, pp=pp, dp=n // (tp * pp * cp),
                  job=dict(seq_len=int(r["seq_len"]), global_batch=int(r["global_batch"])),
                  plan=dict(mbs=int(r["micro_batch"]), zero=1, cp=cp, virtual_stages=int(r["vp"]),
                            sequence_parallel=True, grad_reduce_dtype="bf16", tp_comm_overlap=True))


#: The stack of the fms-fsdp rows (:mod:`hetplan.hardware.stacks`): FSDP1 FlatParameters, which price no FSDP2
#: copy-in / copy-out (:func:`hetplan.estimate.stage.fsdp2_copy_s`).
FMS_STACK = "fms-fsdp"

#: Network of the fms-fsdp H100 cluster: "96 H100 GPUs with 800 Gbps" per node (the README's column header).
FMS_NODE_BYTES_PER_S = 800e9 / 8


def fms_layout(r: dict) -> Layout:
    """The layout of an fms-fsdp row (``main_training.py`` and ``fms_fsdp/config/training.py`` at 0bdc59d): FSDP1
    over all 96 GPUs (``FULL_SHARD``; the 7B row's ``HYBRID_SHARD`` shards within each 8-GPU node, set by
    :func:`_fms_case`), micro-batch 2 of 4,096 tokens and no gradient accumulation, the ``bfSixteen`` policy (bf16
    parameters in compute and bf16 gradient reduction over fp32 shards, fp32 AdamW), ``torch.nn.CrossEntropyLoss``
    on the bf16 logits (``cross_entropy = "bf16"``), the ``fms-fsdp`` stack (:data:`FMS_STACK`), eager PyTorch with SDPA's FlashAttention-2 (charged at
    ``Job.attention_kernel = "fa2"``), full recomputation of every block under "Full AC".

    Raises:
        NotExpressibleError: "Selective AC" (the 13B row): it checkpoints every k-th block, and k is not published.
    """
    ac = r["recompute"].lower()
    if "selective" in ac:
        raise NotExpressibleError("fms-fsdp 'Selective AC' checkpoints every k-th block; k is not published")
    n = int(r["num_gpus"])
    return Layout(tp=1, pp=1, dp=n, recompute="full" if "full" in ac else "none",
                  job=dict(seq_len=int(r["seq_len"]), global_batch=int(r["global_batch"]), framework="fsdp",
                           torch_compile=False, attention_kernel="fa2", stack=FMS_STACK),
                  plan=dict(mbs=int(r["micro_batch"]), zero=3, grad_reduce_dtype="bf16", fsdp_param_dtype="fp32",
                            cross_entropy="bf16"))


def _held_out_case(key: str, r: dict, lay: Layout, catalog: Catalog, group: str, **kw) -> ModernCase:
    """Row ``r``'s case on its tokens/s per GPU, held out: never fitted (module doc)."""
    c = modern.row_case(SET_NAME, key, r, lay, "tokens_per_s_per_gpu", float(r["tokens_per_s_per_gpu"]),
                     catalog=catalog, group=group, **kw)
    c.is_calibration = False
    return c


def _fms_case(i: int, r: dict, catalog: Catalog):
    key = f"{SET_NAME}:fms:{i}:{r['model'].split(' (')[0]}:n{r['num_gpus']}:{r['zero_or_fsdp'].split()[-1]}"

    def make() -> ModernCase:
        c = _held_out_case(key, r, fms_layout(r), catalog, "fms-fsdp")
        pool = c.plan.pools[0].model_dump(exclude_unset=True) | {
            "gpus_per_node": 8, "inter_node_bandwidth_bytes_per_s": FMS_NODE_BYTES_PER_S}
        update = {"pools": [pool]} | ({"fsdp_shard": 8} if "HSDP" in r["zero_or_fsdp"] else {})
        c.plan = type(c.plan).model_validate(c.plan.model_dump(exclude_unset=True) | update)
        return c

    return key, make


def _nemo_case(i: int, r: dict, catalog: Catalog):
    key = f"{SET_NAME}:nemo:{i}:{r['model'].split(' (')[0]}:n{r['num_gpus']}:s{r['seq_len']}"

    def make() -> ModernCase:
        return _held_out_case(key, r, nemo_layout(r), catalog, "nemo-24.07")

    return key, make


def _row_case(i: int, r: dict, catalog: Catalog, set_name: str = SET_NAME):
    """Row ``i`` of an llm-foundry table as a case of ``set_name``: in ``independent_h100`` a seeded half fitted
    the stack's residuals (:data:`FOUNDRY_FIT_FRACTION`); every ``llm_foundry_a100`` row is held out."""
    key = f"{set_name}:{i}:{r['model']}:n{r['num_gpus']}:s{r['seq_len']}:{r['dtype'].split()[0]}:mbs{r['micro_batch']}"
    if set_name == A100_SET_NAME:  # two README revisions measured some configurations twice (MP mode PURE / DEFAULT)
        key += f":{grad_reduce_dtype(r)}-reduce"

    def make() -> ModernCase:
        lay = foundry_layout(r)
        pool = None
        if set_name == A100_SET_NAME:
            gpu = catalog_gpu(r["gpu"], catalog)
            pool = GPUPool(gpu=gpu, count=int(r["num_gpus"]), gpus_per_node=8,
                           inter_node_bandwidth_bytes_per_s=A100_NODE_BYTES_PER_S)
        c = modern.row_case(set_name, key, r, lay, "tokens_per_s_per_gpu", float(r["tokens_per_s_per_gpu"]),
                            catalog=catalog, group=f"{r['model']}|{r['gpu']}|{r['dtype'].split()[0]}",
                            model=mpt_model(r), pool=pool)
        if "SHARD_GRAD_OP" in r["zero_or_fsdp"]:
            c.plan = c.plan.model_copy(update={"reshard_after_forward": False})
        elif "FULL_SHARD" not in r["zero_or_fsdp"]:
            raise NotExpressibleError(f"FSDP sharding strategy {r['zero_or_fsdp']!r} is not mapped")
        c.is_calibration = set_name == SET_NAME and _is_calibration(key, FOUNDRY_FIT_FRACTION)
        if lay.job["torch_compile"]:
            c.notes.append(FP8_NOTE)
        return c

    return key, make


def independent_cases(catalog: Catalog | None = None) -> tuple[list[ModernCase], list[modern.NotExpressible]]:
    """The set's cases (plans built, nothing predicted) and the rows it cannot express, with the reason."""
    catalog = catalog or load_catalog()
    items = [_row_case(i, r, catalog) for i, r in enumerate(_rows(FOUNDRY_FILE))]
    items += [_nemo_case(i, r, catalog) for i, r in enumerate(_rows(NEMO_FILE))]
    items += [_fms_case(i, r, catalog) for i, r in enumerate(_rows(FMS_FILE))]
    return modern.collect(SET_NAME, items)


def a100_cases(catalog: Catalog | None = None) -> tuple[list[ModernCase], list[modern.NotExpressible]]:
    """The ``llm_foundry_a100`` cases (plans built, nothing predicted) and the rows it cannot express."""
    catalog = catalog or load_catalog()
    return modern.collect(A100_SET_NAME, [_row_case(i, r, catalog, A100_SET_NAME) for i, r in enumerate(_rows(A100_FILE))])


def run_a100(catalog: Catalog | None = None) -> tuple[dict, list[ModernCase]]:
    """Predict every ``llm_foundry_a100`` row; ``({A100_SET_NAME: metrics}, cases)``: the modern sets' metrics,
    the per-row errors (``rows``, worst first) and the metrics by GPU (``per_gpu``), by model (``per_model``) and
    by sequence length (``per_seq_len``)."""
    catalog = catalog or load_catalog()
    cases, skipped = a100_cases(catalog)
    for c in cases:
        c.evaluate(catalog)
    res = modern.set_metrics(A100_SET_NAME, cases, skipped, convention=A100_CONVENTION, target=TARGET)
    res["rows"] = row_errors(cases)
    res["per_gpu"] = modern.per_info(cases, lambda c: c.gpu)
    res["per_model"] = modern.per_info(cases, "model")
    res["per_seq_len"] = modern.per_info(cases, "seq")
    return {A100_SET_NAME: res}, cases


def row_errors(cases: list[ModernCase]) -> list[dict]:
    """Per row, worst first: key, measured and predicted tokens/s per GPU, error (predicted / measured − 1)."""
    rows = [{"key": c.key, "measured": c.measured, "predicted": c.predicted, "error": c.predicted / c.measured - 1,
             "fits": c.fits} for c in cases]
    return sorted(rows, key=lambda x: -abs(x["error"]) if math.isfinite(x["error"]) else -math.inf)


def run_independent(catalog: Catalog | None = None) -> tuple[dict, list[ModernCase]]:
    """Predict every expressible row; return ``({SET_NAME: metrics}, cases)``: the modern sets' metrics
    (:func:`hetplan.calibration.modern.set_metrics`) with this set's convention and target, plus ``rows``
    (:func:`row_errors`)."""
    cases, skipped = independent_cases(catalog)
    for c in cases:
        c.evaluate(catalog)
    res = modern.set_metrics(SET_NAME, cases, skipped, convention=CONVENTION, target=TARGET)
    res["rows"] = row_errors(cases)
    return {SET_NAME: res}, cases
