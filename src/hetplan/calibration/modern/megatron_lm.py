"""The Megatron-LM README's weak scaling (r0.8.0, ``megatron_lm_weak_scaling_h100.csv``; set
``megatron_lm_h100``): GPT 1.7B to 462B on 48 to 6,144 H100, TFLOP/s per GPU."""

from __future__ import annotations

from hetplan.calibration.modern.mapping import Layout, collect, row_case
from hetplan.calibration.modern.models import row_model
from hetplan.calibration.modern.rows import NotExpressibleError, cell_float, cell_int, read_rows
from hetplan.calibration.modern.sets import FILES
from hetplan.hardware.catalog import Catalog, load_catalog
from hetplan.model.spec import ModelSpec


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
    tp, pp, dp = cell_int(r, "tp", 1), cell_int(r, "pp", 1), cell_int(r, "dp", 1)
    gbs = cell_int(r, "global_batch")
    return Layout(tp=tp, pp=pp, dp=dp, job=dict(seq_len=cell_int(r, "seq_len"), global_batch=gbs),
                  plan=dict(mbs=1 if pp > 1 else gbs // dp, zero=1, sequence_parallel=True, tp_comm_overlap=True,
                            cross_entropy="fp32"))


def megatron_lm_cases(catalog: Catalog | None = None):
    """Megatron-LM README weak scaling (r0.8.0) on H100: TFLOP/s per GPU, the README's GPT family with untied
    embeddings (:func:`megatron_lm_model`) in the layout of :func:`megatron_lm_layout`. Rows without a layout are
    not expressible."""
    catalog = catalog or load_catalog()
    items = []
    for i, r in enumerate(read_rows(FILES["megatron_lm_h100"])):
        key = f"megatron_lm_h100:{i}:{r['model'][:20]}:n{r['num_gpus']}"

        def make(r=r, key=key):
            if not r["tp"]:
                raise NotExpressibleError("the source gives no TP / PP / DP for this row")
            return row_case("megatron_lm_h100", key, r, megatron_lm_layout(r), "tflops_per_gpu",
                         cell_float(r, "tflops_per_gpu"), catalog=catalog, group="weak-scaling",
                         model=megatron_lm_model(r))

        items.append((key, make))
    return collect("megatron_lm_h100", items)
