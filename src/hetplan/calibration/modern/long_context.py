"""Long context with context parallelism (set ``long_context_cp``): NeMo's long-sequence performance page
(``nemo_long_sequence_cp.csv``: Llama 2 7B on H100, Llama 3 8B on B200, FP8, 4K to 1M tokens; TFLOP/s per GPU),
torchtitan's CP rows (:mod:`~hetplan.calibration.modern.torchtitan`) and the Llama 3 paper's 128K row
(:mod:`~hetplan.calibration.modern.llama3`)."""

from __future__ import annotations

from hetplan.calibration.modern.llama3 import llama3_row_case
from hetplan.calibration.modern.mapping import Layout, collect, row_case
from hetplan.calibration.modern.rows import NotExpressibleError, cell_float, cell_int, read_rows
from hetplan.calibration.modern.sets import FILES
from hetplan.calibration.modern.torchtitan import torchtitan_row_case
from hetplan.hardware.catalog import Catalog, load_catalog


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
    for i, r in enumerate(read_rows(nemo)):
        key = f"long_context_cp:nemo:{i}:{r['gpu'][:5]}:n{r['num_gpus']}:s{r['seq_len']}:cp{r['cp'] or '-'}"

        def make(r=r, key=key):
            if not r["tp"]:
                raise NotExpressibleError("'without CP' row: the source gives no TP / PP / DP")
            tflops = cell_float(r, "tflops_per_gpu")
            if tflops is None:
                raise NotExpressibleError(f"TFLOP/s {r['tflops_per_gpu']!r} is not a measurement")
            tp, pp, dp, cp = (cell_int(r, k, 1) for k in ("tp", "pp", "dp", "cp"))
            lay = Layout(tp=tp, pp=pp, dp=dp,
                         job=dict(seq_len=cell_int(r, "seq_len"), global_batch=cell_int(r, "global_batch"),
                                  attention_kernel=_nemo_attention_kernel(r)),
                         plan=dict(mbs=1, zero=1, cp=cp, sequence_parallel=True))
            return row_case("long_context_cp", key, r, lay, "tflops_per_gpu", tflops, catalog=catalog)

        items.append((key, make))
    items += [torchtitan_row_case("long_context_cp", i, r, catalog) for i, r in enumerate(read_rows(titan))
              if cell_int(r, "cp", 1) > 1]
    items += [llama3_row_case("long_context_cp", i, r, catalog) for i, r in enumerate(read_rows(llama))
              if cell_int(r, "cp", 1) > 1]
    return collect("long_context_cp", items)
