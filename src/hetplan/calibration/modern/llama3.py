"""The Llama 3 paper's Llama 3 405B pre-training (``llama3_paper_table4_h100.csv``, arXiv 2407.21783 Table 4 and
Sec. 3.3.2; set ``llama3_405b``, the 128K CP row in ``long_context_cp``): TFLOP/s per GPU on 8,192 and 16,384
H100."""

from __future__ import annotations

from hetplan.calibration.modern.mapping import Layout, collect, row_case
from hetplan.calibration.modern.rows import cell_float, cell_int, read_rows, run_facts
from hetplan.calibration.modern.sets import FILES
from hetplan.hardware.catalog import Catalog, load_catalog


#: The attention kernel of Meta's stack for these runs (``run_facts.toml`` ``[llama3]``: FlashAttention-2, by the
#: release dates of the kernels a PyTorch stack had on H100 before the paper).
LLAMA3_ATTENTION_KERNEL: str = run_facts()["llama3"]["attention_kernel"]


def llama3_row_case(set_name: str, i: int, r: dict, catalog: Catalog):
    """Llama 3 405B (arXiv 2407.21783, Table 4 and Sec. 3.3.2): TP 8, PP 16, FSDP-style DP (optimizer states
    and gradients sharded, parameters kept after forward: ZeRO-2), no recomputation at 8K, micro-batch 1,
    interleaved pipeline with one layer per virtual stage (8 layers per stage; the paper gives neither micro-batch
    nor v), FlashAttention-2 (:data:`LLAMA3_ATTENTION_KERNEL`). TFLOP/s per GPU."""
    key = f"{set_name}:{i}:n{r['num_gpus']}:s{r['seq_len']}"

    def make():
        tp, pp, dp, cp = (cell_int(r, k, 1) for k in ("tp", "pp", "dp", "cp"))
        job = dict(seq_len=cell_int(r, "seq_len"), global_batch=cell_int(r, "global_batch"),
                   attention_kernel=LLAMA3_ATTENTION_KERNEL)
        if cp > 1:
            job["cp_kv_exchange"] = "allgather"
        lay = Layout(tp=tp, pp=pp, dp=dp, recompute="none", job=job,
                     plan=dict(mbs=1, zero=2, cp=cp, virtual_stages=8, sequence_parallel=True))
        return row_case(set_name, key, r, lay, "tflops_per_gpu", cell_float(r, "tflops_per_gpu"), catalog=catalog,
                     group="llama3-405b")

    return key, make


def llama3_cases(catalog: Catalog | None = None):
    """The Llama 3 paper's 8K-sequence rows (the 128K CP row: ``long_context_cp``)."""
    catalog = catalog or load_catalog()
    items = [llama3_row_case("llama3_405b", i, r, catalog) for i, r in enumerate(read_rows(FILES["llama3_405b"]))
             if cell_int(r, "cp", 1) == 1]
    return collect("llama3_405b", items)
