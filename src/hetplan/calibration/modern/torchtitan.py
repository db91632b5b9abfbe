"""torchtitan's published benchmarks (``torchtitan_benchmarks.csv``; set ``torchtitan``, CP rows in
``long_context_cp``): PyTorch FSDP2 with TP, async TP, PP, CP and float8; tokens/s and memory per GPU. The facts
of the runs the table leaves out (compiled loss and model, local batch, PyTorch release) are in
``run_facts.toml`` ``[torchtitan]``."""

from __future__ import annotations

import re

from hetplan.calibration.modern.mapping import Layout, catalog_gpu, collect, row_case, row_fp8_recipe
from hetplan.calibration.modern.rows import NotExpressibleError, cell_float, cell_int, read_rows, run_facts
from hetplan.calibration.modern.sets import FILES
from hetplan.hardware.catalog import Catalog, GPUSpec, load_catalog

_FACTS = run_facts()["torchtitan"]

#: Sources (or framework cells) of rows whose loss is compiled with the model (``run_facts.toml``
#: ``[torchtitan.compiled_loss]``: torchtitan since bbb1b616e, 2025-04-02). Their loss follows
#: :attr:`hetplan.plan.Job.torch_compile` (``Plan.cross_entropy`` None); earlier commits ran it eager on fp32
#: logits.
TORCHTITAN_COMPILED_LOSS = tuple(_FACTS["compiled_loss"]["match"])

#: torchtitan sources whose rows ran ``torch.compile`` although their notes do not say so
#: (``[torchtitan.compiled_sources]``).
TORCHTITAN_COMPILED_SOURCES = tuple(_FACTS["compiled_sources"]["match"])

#: Local batch (sequences per rank and step) of MoE rows whose CSV value contradicts the run's first write-up, by
#: source (``[[torchtitan.local_batch]]``: the Llama 4 Scout MXFP8 runs on 256 GB200 ran local batch 1).
TORCHTITAN_LOCAL_BATCH = {f["source"]: f["local_batch"] for f in _FACTS["local_batch"]}

#: torchtitan sources whose runs used a PyTorch from before pytorch/pytorch#153383 (2025-05-13), where every
#: pipeline stage keeps its outputs for ``step()``'s return value (:attr:`hetplan.plan.Plan.pipeline_outputs`
#: ``"all"``; ``[torchtitan.torch_before_153383]``).
TORCHTITAN_TORCH_BEFORE_153383 = tuple(_FACTS["torch_before_153383"]["match"])


#: The torchtitan release each source's runs used, by source (``[[torchtitan.release]]``: the month of the commit
#: its write-up names, or the release whose changes the runs' upstream build already had): the rows run
#: ``Job.stack = "torchtitan@YYYY-MM"``, the release in force then (the optimizer: foreach AdamW before
#: pytorch/torchtitan#881 of 2025-02-24, fused after), or ``torchtitan@VERSION``.
TORCHTITAN_RELEASE = {f["match"]: f.get("release") or f["month"] for f in _FACTS["release"]}


def torchtitan_stack(source: str) -> str | None:
    """``torchtitan@YYYY-MM`` (or ``@VERSION``) of a row's source (:data:`TORCHTITAN_RELEASE`), None if the source
    is not listed."""
    release = next((v for k, v in TORCHTITAN_RELEASE.items() if k in source), None)
    return f"torchtitan@{release}" if release else None


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


#: Why the four "power limited" 8 x B200 rows of the MXFP8 page are not expressible. Their model is Llama 3 8B (the
#: same table in pytorch/ao ``docs/source/workflows/training.md``), but the power limit is not stated, and it
#: matters: at the same software, 8 H100 SXM run the model at 6,150 tokens/s (38 % MFU, same page), these B200 at
#: 8,307 (23 % of the 2,250 peak). Mapped to the 1,000 W B200 the bf16 row would read +106 % and the FP8 rows
#: +142-161 %.
POWER_LIMITED_B200 = ("B200 'power limited' to a limit the source does not state (Llama 3 8B per pytorch/ao's "
                      "training docs; 23 % MFU against 38 % on H100 at the same software)")


#: How torchtitan's async-TP rows (the notes' "async TP": ``enable_async_tensor_parallel``) are mapped: as vanilla
#: TP. PyTorch's async TP as the estimator models it (:attr:`hetplan.plan.Job.async_tp`,
#: :func:`hetplan.estimate.compute.async_tp_exposed_s`) predicts 1.11-1.23x over the vanilla twins where the runs
#: measured 1.05-1.16x (``tests/calibration/test_modern.py``); with it the set goes from 8.9 to 10.6 % (and
#: ``long_context_cp`` from 5.6 to 6.1 %), so the rows keep vanilla TP until the missing cost is found, and say so.
ASYNC_TP_NOTE = "async TP mapped as vanilla TP (Job.async_tp predicts more speedup than these runs measured)"


def _torchtitan_async_tp(r: dict) -> bool:
    """Whether a torchtitan row ran async TP (its notes say "async TP"; TP > 1)."""
    return cell_int(r, "tp", 1) > 1 and bool(re.search(r"async ?tp", r["notes"].lower()))


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
        tp, pp, dp, cp = (cell_int(r, k, 1) for k in ("tp", "pp", "dp", "cp"))
        seq = cell_int(r, "seq_len")
        local = cell_int(r, "micro_batch")
        m_local = re.search(r"[Ll]ocal batch(?: size)? (\d+)", r["notes"])
        local = local or (int(m_local.group(1)) if m_local else None)
        gbs = cell_int(r, "global_batch") or (local * dp if local else None)
        fixed = next((v for src, v in TORCHTITAN_LOCAL_BATCH.items() if src in r["source"]), None)
        if fixed is not None and "moe" in r["model"].lower():
            gbs = fixed * dp
        if gbs is None:
            raise NotExpressibleError("global batch not given")
        mbs = max(gbs // dp // pp, 1) if pp > 1 else (gbs // dp)
        vp = 2 if "interleaved" in r["notes"].lower() else 1
        rc, frac = _torchtitan_recompute(r["recompute"])
        job = dict(seq_len=seq, global_batch=gbs, framework="fsdp", torch_compile=_torchtitan_compiled(r),
                   attention_kernel=_torchtitan_attention_kernel(catalog.get(catalog_gpu(r["gpu"], catalog))))
        if (stack := torchtitan_stack(r["source"])) is not None:
            job["stack"] = stack
        if (recipe := row_fp8_recipe(r)) is not None:  # torchao's rowwise where the row names it
            job["fp8_recipe"] = recipe
        if cp > 1:
            job.update(cp_kv_exchange="allgather", cp_load_balance=False)
        lay = Layout(tp=tp, pp=pp, dp=dp, recompute=rc, recompute_fraction=frac, job=job, plan=dict(
            mbs=mbs, zero=3, cp=cp, ep=cell_int(r, "ep", 1), virtual_stages=vp, sequence_parallel=True,
            cross_entropy=None if any(c in r["framework"] + r["source"] for c in TORCHTITAN_COMPILED_LOSS) else "fp32",
            pipeline_outputs="all" if any(x in r["source"] for x in TORCHTITAN_TORCH_BEFORE_153383) else "last"))
        tps = cell_float(r, "tokens_per_s_per_gpu")
        if tps is None:
            raise NotExpressibleError("no tokens/s published")
        c = row_case(set_name, key, r, lay, "tokens_per_s_per_gpu", tps, catalog=catalog,
                  memory_gib=cell_float(r, "memory_gb_per_gpu"))
        if _torchtitan_async_tp(r):
            c.notes.append(ASYNC_TP_NOTE)
        return c

    return key, make


def torchtitan_cases(catalog: Catalog | None = None):
    """torchtitan's published benchmarks without context parallelism (CP rows: ``long_context_cp``)."""
    catalog = catalog or load_catalog()
    items = [torchtitan_row_case("torchtitan", i, r, catalog) for i, r in enumerate(read_rows(FILES["torchtitan"]))
             if cell_int(r, "cp", 1) == 1]
    return collect("torchtitan", items)


