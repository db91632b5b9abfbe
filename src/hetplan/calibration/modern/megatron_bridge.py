"""Megatron-Bridge's performance summaries (``megatron_bridge_llama.csv``; set ``megatron_bridge``): NeMo's
25.11 and 26.02 containers pre-training Llama 3 8B / 70B and Llama 3.1 405B in FP8 on DGX-H100, DGX-B200,
DGX-GB200 and DGX-GB300, tokens/s per GPU (``NVIDIA-NeMo/Megatron-Bridge`` ``docs/performance-summary.md``)."""

from __future__ import annotations

from hetplan.calibration.modern.mapping import Layout, collect, row_case
from hetplan.calibration.modern.rows import cell_int, read_rows
from hetplan.calibration.modern.sets import FILES
from hetplan.hardware.catalog import Catalog, load_catalog

#: The stack each container ran, by its release month: both resolve to the newest NeMo release the stack registry
#: has (``nemo@2025-12`` / ``nemo@2026-02``; :mod:`hetplan.hardware.stacks`).
BRIDGE_STACK = {"25.11": "nemo@2025-12", "26.02": "nemo@2026-02"}


def bridge_layout(r: dict) -> Layout:
    """The layout of a Megatron-Bridge table row, as its recipe (``scripts/performance/configs/llama/
    llama3{,1}_workload_base_configs.py`` and ``llama3{,1}_llm_pretrain.py`` at the table's commit) launches it:
    the table's TP / PP / CP / VP, micro-batch and global batch; the distributed optimizer, sequence parallelism and
    TP-communication overlap (the recipes' ``comm_overlap.tp_comm_overlap`` with a userbuffers config per layout),
    bf16 gradient reduction (NeMo's recipes), no recomputation (no ``recompute_*`` field in these layouts' base
    configs); CUDA graphs where the base config captures them (``cuda_graph_impl = "local"``, the 8B rows); the
    FP8 recipe the table names: FP8-CS is Transformer Engine's ``Float8CurrentScaling``, FP8-MX its
    ``MXFP8BlockScaling``."""
    tp, pp, cp = cell_int(r, "tp", 1), cell_int(r, "pp", 1), cell_int(r, "cp", 1)
    release = r["framework"].rsplit(" ", 1)[-1].rstrip(")")
    recipe = "mxfp8" if "mx" in r["dtype"].lower() else "current"
    return Layout(tp=tp, pp=pp, dp=cell_int(r, "num_gpus") // (tp * pp * cp),
                  job=dict(seq_len=cell_int(r, "seq_len"), global_batch=cell_int(r, "global_batch"),
                           attention="flash", fp8_recipe=recipe, stack=BRIDGE_STACK[release]),
                  plan=dict(mbs=cell_int(r, "micro_batch", 1), cp=cp, virtual_stages=cell_int(r, "vp", 1),
                            sequence_parallel=True, grad_reduce_dtype="bf16", tp_comm_overlap=True,
                            cuda_graphs="CUDA graphs cuda_graph_impl local" in r["notes"]))


def megatron_bridge_cases(catalog: Catalog | None = None):
    """Megatron-Bridge's dense Llama FP8 rows (:func:`bridge_layout`), compared on step time (global batch x
    8,192 tokens over the published tokens/s per GPU x GPUs). Held out of every fit
    (:data:`hetplan.calibration.modern.sets.NOT_FITTED`): it checks the GPU constants fitted elsewhere, and is the
    only set with B200 and GB300 dense rows."""
    catalog = catalog or load_catalog()
    items = []
    for i, r in enumerate(read_rows(FILES["megatron_bridge"])):
        key = (f"megatron_bridge:{i}:{r['model']}:{r['gpu'].split()[0]}:n{r['num_gpus']}:{r['dtype'].split()[0]}:"
               f"tp{r['tp']}pp{r['pp']}cp{r['cp']}vp{r['vp'] or 1}")

        def make(r=r, key=key):
            return row_case("megatron_bridge", key, r, bridge_layout(r), "iteration_time_s",
                            float(r["iteration_time_s"]), catalog=catalog)

        items.append((key, make))
    return collect("megatron_bridge", items)
