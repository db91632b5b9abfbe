"""BigScience's A100 runs of Megatron-DeepSpeed with DeepSpeed's pipeline engine (``bigscience_a100.csv``; set
``bigscience_a100``): the 3-D layout search of the BLOOM 176B training (February 2022) and its production step,
on up to 48 nodes of Jean Zay (8 A100 80GB per node).

What the rows are (the CSV's README entry): the seconds per iteration and the peak GPU memory of
``train/tr11-176B-ml/chronicles-prequel.md`` (tables "Best TFLOPs", "Choosing the fastest 3D Topology", "tile and
wave quantization", "48 node contenders", "Final round comparison", "NHEADs comparison", "GBS Variations",
"Another round of NHEADS", "Batchsize Warmup", "Re-do", "Rebalancing layers") and the production iteration of
``chronicles.md``. Every row's TFLOP/s follows from its step time by SC'21's Eq. 3 with its model
(:func:`check_tflops`; the tables before 02-21 by 0.964 of it, the formula BigScience used until
Megatron-DeepSpeed PR 251), which fixes the layer counts the tables leave to their "Size" column.

How a row is priced (:func:`bigscience_layout`): the BLOOM architecture (:func:`bigscience_model`), full
activation checkpointing (``--checkpoint-activations`` in every tr11 launch script), Megatron's fused
softmax on materialised scores (no flash kernel in 2022), DeepSpeed's pipeline engine (``framework =
"deepspeed"``) under the stack in force in February 2022 (:data:`STACK`), ZeRO-1, DeepSpeed's layer partition
(:func:`deepspeed_partition`), one pool of Jean Zay nodes (:data:`JEAN_ZAY_NODE_BYTES_PER_S`).

Memory: the tables' ``Mem`` is what ``nvidia-smi`` showed on the first (or last) node, the GPUs with the word
embedding ("was quickly getting the memory snapshot with ... nvidia-smi"): the CUDA context included, so it is
compared with the estimate's largest stage total (:attr:`ModernCase.memory_includes_context`). Rows measured
"OOM" have no step time; :func:`oom_check` says whether the estimate refuses them too.

``CUDA_LAUNCH_BLOCKING=1`` (the ``cuda_launch_blocking`` column): every kernel launch waits for the kernel to
finish, so the host's launch latency is no longer hidden behind the previous kernel and no two CUDA streams run
at once. DeepSpeed's pipeline engine already issues each instruction after the previous one finished (blocking
p2p, the gradient reduction after the last micro-batch: :mod:`hetplan.estimate.schedule`), and at these layer
widths (h ≥ 12,288) a kernel runs milliseconds against microseconds of launch latency; the chronicle measured
no slowdown at 160 GPUs (84.44 vs 84.59 TFLOP/s) and 6 % at 80 (91.04 vs 97.20). No row is excluded for it; it is
kept as a column. The tables from 02-20 on ran with it: the section before them found 320 GPUs "always hangs"
without it and adopted it "for a time being"; the production script keeps it ("do not remove").
"""

from __future__ import annotations

import math

from hetplan.calibration.modern.mapping import Layout, ModernCase, build_plan, collect, row_case
from hetplan.calibration.modern.rows import NotExpressibleError, cell_float, cell_int, read_rows
from hetplan.calibration.modern.sets import FILES
from hetplan.hardware.catalog import Catalog, load_catalog
from hetplan.model.spec import ModelSpec, from_hf_config
from hetplan.plan import GPUPool

SET = "bigscience_a100"

#: The stack of every row: bigscience-workshop/Megatron-DeepSpeed with DeepSpeed's pipeline engine as of
#: February 2022 (tr11-176B-ml/README.md, "Software"; :mod:`hetplan.hardware.stacks`).
STACK = "megatron-deepspeed@2022-02"

#: Jean Zay's A100 nodes (``gpu_p5``): 8 A100 80GB, "4 OmniPath links" per node (tr11-176B-ml/README.md,
#: "Hardware"), each Intel Omni-Path Architecture 100 Gb/s: 4 x 12.5 GB/s = 50 GB/s per node.
JEAN_ZAY_NODE_BYTES_PER_S = 4 * 100e9 / 8
JEAN_ZAY_GPUS_PER_NODE = 8

#: Megatron's vocabulary padding: to a multiple of ``--make-vocab-size-divisible-by`` (128) x TP
#: (``megatron/tokenizer/tokenizer.py`` ``_vocab_size_with_padding``).
VOCAB_DIVISIBLE_BY = 128


def padded_vocab(tokens: int, tp: int) -> int:
    """Megatron's padded vocabulary of a ``tokens``-entry tokenizer at TP ``tp`` (250,680 -> 250,880 at TP 2-8;
    the production run's ``--pad-vocab-size-to 250880`` gives the same)."""
    step = VOCAB_DIVISIBLE_BY * tp
    return -(-tokens // step) * step


def bigscience_config(r: dict) -> dict:
    """The Hugging Face ``config.json`` of a row's model as ``BloomConfig`` spells it (``model_type = "bloom"``:
    ``n_layer``, ``hidden_size``, ``n_head``, ``vocab_size``; ``transformers`` ``configuration_bloom.py``), from
    its table's NLAYERS / NHIDDEN / NHEADS, the tokenizer's 250,680 entries padded as Megatron pads them at the
    row's TP (:func:`padded_vocab`), and the launch scripts' ``--seq-length`` and dropouts (Megatron's 0.1)."""
    L, h, a = cell_int(r, "layers"), cell_int(r, "hidden"), cell_int(r, "heads")
    if not (L and h and a):
        raise NotExpressibleError("the source gives no layer count for this row")
    return {"model_type": "bloom", "n_layer": L, "hidden_size": h, "n_head": a,
            "vocab_size": padded_vocab(cell_int(r, "tokenizer_vocab"), cell_int(r, "tp")),
            "seq_length": cell_int(r, "seq_len"), "hidden_dropout": 0.1, "attention_dropout": 0.1}


def bigscience_model(r: dict) -> ModelSpec:
    """The model of a row: its :func:`bigscience_config` read as any BLOOM ``config.json`` is
    (:func:`hetplan.model.spec.from_hf_config`, ``model_type = "bloom"``: Megatron's GPT block with a 4h GeLU MLP,
    LayerNorm, biases and dropout, ALiBi instead of learned positions (``--position-embedding-type alibi``), tied
    input and output embeddings; the embedding LayerNorm of ``--embed-layernorm``, 2h parameters and one
    element-wise pass, left out)."""
    c = bigscience_config(r)
    m = from_hf_config(c, f"bloom-L{c['n_layer']}-h{c['hidden_size']}-a{c['n_head']}")
    return m.model_copy(update={"source": "bigscience-workshop/bigscience train/tr11-176B-ml (NLAYERS/NHIDDEN/NHEADS "
                                          "per table)"})


def deepspeed_partition(num_layers: int, pp: int, embedding_units: bool) -> list[int]:
    """Transformer layers per stage as DeepSpeed's ``PipelineModule`` partitions them
    (``partition_method="type:transformer"``, or with ``|embedding`` the two tied embeddings counted as layers:
    ``--pp-partition-method``): ``deepspeed/runtime/utils.py`` ``partition_balanced`` finds the smallest
    bottleneck (``ceil(units / pp)`` for units of weight 1) and fills the stages greedily up to it, so the last
    stage takes the remainder (78 layers on 12 stages: eleven of 7 and one of 1, as the chronicle's "Re-do"
    states; 70 layers plus two embeddings on 12: 5, 6 x 10, 5, as the 176B README states)."""
    units = ["e"] * embedding_units + ["l"] * num_layers + ["e"] * embedding_units
    cap = math.ceil(len(units) / pp)
    out, i = [], 0
    for _ in range(pp):
        part = units[i:i + cap]
        out.append(part.count("l"))
        i += cap
    if sum(out) != num_layers or min(out) < 1:
        raise NotExpressibleError(f"DeepSpeed's partition of {num_layers} layers over {pp} stages leaves a stage "
                                  "without a transformer layer")
    return out


def bigscience_layout(r: dict, m: ModelSpec) -> Layout:
    """The layout of a row: TP / PP / DP, micro-batch and global batch as published; ZeRO-1 (the launch
    scripts' ``ZERO_STAGE=1``; from 02-28 BF16_Optimizer's own ZeRO-1 partitioning under ``ZERO_STAGE=0``);
    full recomputation; the pipeline engine (``framework = "deepspeed"``) under :data:`STACK`; standard
    attention; DeepSpeed's layer partition (:func:`deepspeed_partition`)."""
    tp, pp, dp = cell_int(r, "tp"), cell_int(r, "pp"), cell_int(r, "dp")
    emb = r["partition"].strip() == "transformer-embedding"
    return Layout(tp=tp, pp=pp, dp=dp,
                  job=dict(seq_len=cell_int(r, "seq_len"), global_batch=cell_int(r, "global_batch"),
                           framework="deepspeed", attention="standard", stack=STACK),
                  plan=dict(mbs=cell_int(r, "micro_batch"), zero=cell_int(r, "zero", 1), overlap_grad_reduce=False),
                  recompute="full", stage_layers=deepspeed_partition(m.num_layers, pp, emb))


def jean_zay_pool(gpu: str, n: int) -> GPUPool:
    """``n`` A100 80GB in Jean Zay nodes (:data:`JEAN_ZAY_NODE_BYTES_PER_S`)."""
    return GPUPool(gpu=gpu, count=n, gpus_per_node=JEAN_ZAY_GPUS_PER_NODE,
                   inter_node_bandwidth_bytes_per_s=JEAN_ZAY_NODE_BYTES_PER_S)


def sc21_tflops(r: dict) -> float:
    """TFLOP/s per GPU of a row by SC'21 Eq. 3 (with the recomputation forward) and its padded vocabulary."""
    from hetplan.calibration.validation import sc21_flops_per_iteration

    m = bigscience_model(r)
    f = sc21_flops_per_iteration(cell_int(r, "global_batch"), cell_int(r, "seq_len"), m.num_layers, m.hidden_size,
                                 m.vocab_size)
    return f / cell_float(r, "iteration_time_s") / cell_int(r, "num_gpus") / 1e12


def _row(r: dict) -> dict:
    return r | {"gpu": "A100 80GB", "model": f"BLOOM-arch L{r['layers']} h{r['hidden']} a{r['heads']}",
                "dtype": r["dtype"]}


def bigscience_cases(catalog: Catalog | None = None):
    """The rows with a step time, as cases (iteration time, memory where measured); rows measured "OOM" are
    left to :func:`oom_check` and listed as not expressible with that reason."""
    catalog = catalog or load_catalog()
    items = []
    for i, r in enumerate(read_rows(FILES[SET])):
        key = (f"{SET}:{i}:{r['section']}:L{r['layers']}h{r['hidden']}a{r['heads']}:tp{r['tp']}pp{r['pp']}"
               f"dp{r['dp']}mb{r['micro_batch']}g{r['global_batch']}:{r['dtype']}")

        def make(r=r, key=key):
            t = cell_float(r, "iteration_time_s")
            if t is None:
                raise NotExpressibleError("measured OOM: no step time (oom_check)")
            m = bigscience_model(r)
            lay = bigscience_layout(r, m)
            mem = cell_float(r, "memory_gb_per_gpu")
            c = row_case(SET, key, _row(r), lay, "iteration_time_s", t, catalog=catalog,
                         group=f"{m.name}|n{r['num_gpus']}|g{r['global_batch']}|{r['dtype']}",
                         memory_gib=mem, model=m, dtype=r["dtype"],
                         pool=jean_zay_pool(catalog.get("A100-SXM-80GB").name, lay.num_gpus))
            c.memory_includes_context = True
            c.info["cuda_launch_blocking"] = r["cuda_launch_blocking"]
            c.info["heads"] = m.num_attention_heads
            c.info["hidden"] = m.hidden_size
            return c

        items.append((key, make))
    return collect(SET, items)


def oom_check(catalog: Catalog | None = None) -> list[dict]:
    """The rows measured "OOM": ``{key, fits, max_stage_gib}`` from the estimate of each (a correct refusal
    has ``fits`` False)."""
    from hetplan.estimate.estimator import estimate

    catalog = catalog or load_catalog()
    out = []
    for i, r in enumerate(read_rows(FILES[SET])):
        if r["memory_gb_per_gpu"].strip().upper() != "OOM":
            continue
        m = bigscience_model(r)
        lay = bigscience_layout(r, m)
        plan = build_plan(m, lay, catalog.get("A100-SXM-80GB").name, r["dtype"],
                          pool=jean_zay_pool(catalog.get("A100-SXM-80GB").name, lay.num_gpus))
        est = estimate(plan, catalog=catalog, model=m)
        out.append({"key": f"{SET}:{i}:{r['section']}:tp{lay.tp}pp{lay.pp}dp{lay.dp}mb{lay.mbs}",
                    "fits": bool(est.fits), "max_stage_gib": max(s.memory.total for s in est.stages) / 2**30})
    return out


__all__ = ["JEAN_ZAY_NODE_BYTES_PER_S", "SET", "STACK", "ModernCase", "bigscience_cases", "bigscience_config",
           "bigscience_layout", "bigscience_model", "deepspeed_partition", "jean_zay_pool", "oom_check", "padded_vocab", "sc21_tflops"]
