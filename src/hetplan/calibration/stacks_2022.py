"""Validation set ``nemo_megatron_a100``: the 2021-22 stacks on hundreds to thousands of A100 (issue 29).

Rows (``validation_data/nemo_megatron_a100.csv``, every row with its source):

* NeMo Megatron 22.05 (NeMo 1.8.2) and 22.06 (NeMo 1.10): GPT-3 5B at TP 2 on 1-20 DGX A100 80GB nodes,
  tokens/s, from the launcher's README §7.1.2 at ``NVIDIA/NeMo-Framework-Launcher@90aa8f87`` and ``@3bac9805``;
  layout from ``conf/training/gpt3/5b.yaml`` of the same commit (TP 2, PP 1, micro-batch 2, global batch 1,440,
  no recomputation, no sequence parallelism, ``fused_adam``: ZeRO-0, bf16).
* NeMo Megatron 22.08 (NeMo 1.11): GPT-3 175B at TP 8 × PP 8 on 16 / 32 / 128 nodes (``@b54e402d``) and 22.09
  (NeMo 1.12): GPT-3 5B at TP 1 on 1-32 nodes and GPT-3 175B at TP 8 × PP 8 on 8-128 nodes (``@562d401d``),
  each with ``conf/training/gpt3/{5b,175b}.yaml`` of its commit (5B: micro-batch 2, global batch 2,048, no
  recomputation; 175B: micro-batch 2, global batch 2,048, selective recomputation, sequence parallelism; both
  ``distributed_fused_adam``: ZeRO-1). The 22.08 and 22.09 175B rows run the same configuration file and
  differ by 29-38 % at the same node count (22.08 faster); both are kept, each under its release.
* MT-NLG 530B (Smith et al. 2022, arXiv 2201.11990 §2.4): 105 layers, hidden 20,480, 128 heads on 280 / 350 /
  420 DGX A100 (TP 8 × PP 35, DP 8 / 10 / 12), global batch 1,920, iteration time 60.1 / 50.2 / 44.4 s;
  Megatron-DeepSpeed 2021: DeepSpeed's pipeline engine with ZeRO-powered data parallelism (§2), taken as
  ZeRO-1 (the pipeline engine refuses ZeRO-2); micro-batch 1 and full recomputation are not stated (Megatron's
  setting for its TP 8 × PP 35 530B run, SC'21 ``examples/sc21/run_table_1.sh``).
* Megatron-LM v2.0 (2021-01): GPT-3 175B on 1,024 A100 at TP 8 × PP 16 × DP 8, micro-batch 1, global batch
  1,536, fp16, full recomputation, "each iteration takes around 32 seconds" (138 TFLOP/s per GPU), from the
  README at ``NVIDIA/Megatron-LM@152aab30`` with ``examples/pretrain_gpt3_175B.sh`` of that commit, whose
  default ``--DDP-impl local`` reduces the gradients after backward (``overlap_grad_reduce`` 0 in the file;
  the other rows leave it to their stack).

Each row runs under the stack it names (``Job.stack``): what the stack does (sequence parallelism, gradient
overlap, ZeRO layout, unfused fp32 loss) is priced from ``hardware/data/stacks.toml``, never from the row. The
vocabulary is GPT-2's 50,257 padded as Megatron pads it (to a multiple of 128 × TP). Nodes are DGX A100 with
8 × 200 Gb/s HDR InfiniBand (Selene / DGX SuperPOD, :data:`~hetplan.calibration.validation.SELENE_INTER_NODE_BYTES_PER_S`).
The measured quantity is the iteration time (tokens/s rows: global batch × sequence / tokens/s).
"""

from __future__ import annotations

import csv

from hetplan.calibration.validation import (A100, SELENE_INTER_NODE_BYTES_PER_S, Case, _data, _time_predictor,
                                            gpt_model)
from hetplan.plan import GPUPool, Job, Plan, Stage, balanced_split

SET_NAME = "nemo_megatron_a100"
FILE = "nemo_megatron_a100.csv"


def row_plan(r: dict) -> tuple[Plan, object]:
    """The plan and model of one row of :data:`FILE` (its published layout, under the stack it names)."""
    L, h, a = int(r["num_layers"]), int(r["hidden_size"]), int(r["attention_heads"])
    s, V = int(r["seq_len"]), int(r["vocab_size"])
    tp, pp, dp, n = int(r["tp"]), int(r["pp"]), int(r["dp"]), int(r["num_gpus"])
    if tp * pp * dp != n:
        raise ValueError(f"{r['model']} on {n} GPUs: TP {tp} x PP {pp} x DP {dp} is not the GPU count")
    m = gpt_model(L, h, a, s, vocab=V).model_copy(update={"name": f"{r['model']}-V{V}"})
    pool = GPUPool(gpu=A100, count=n, gpus_per_node=8, inter_node_bandwidth_bytes_per_s=SELENE_INTER_NODE_BYTES_PER_S)
    stages = [Stage(pool=0, num_layers=k, tp=tp, dp=dp, recompute=r["recompute"]) for k in balanced_split(L, pp)]
    job = Job(model=m.name, seq_len=s, global_batch=int(r["global_batch"]), dtype=r["dtype"], attention="standard",
              framework=r["framework"], stack=r["stack"])
    plan = Plan(job=job, pools=[pool], stages=stages, mbs=int(r["mbs"]), zero=int(r["zero"]),
                sequence_parallel=r["sequence_parallel"] == "1", schedule="1f1b",
                overlap_grad_reduce=r["overlap_grad_reduce"] == "1")
    return plan, m


def measured_iteration_time_s(r: dict) -> float:
    """The row's iteration time: given, or global batch × sequence / tokens per second."""
    if r["iteration_time_s"]:
        return float(r["iteration_time_s"])
    return int(r["global_batch"]) * int(r["seq_len"]) / float(r["tokens_per_s"])


def cases() -> list[Case]:
    """The rows of :data:`FILE` as validation cases (iteration time; Kendall τ within one model and stack)."""
    out = []
    for i, r in enumerate(csv.DictReader(_data(FILE).splitlines())):
        plan, m = row_plan(r)
        tp, pp, dp = int(r["tp"]), int(r["pp"]), int(r["dp"])
        key = f"{SET_NAME}:{i}:{r['stack']}:{r['model']}:n{r['num_gpus']}:tp{tp}pp{pp}dp{dp}"
        out.append(Case(set=SET_NAME, key=key, group=f"{r['stack']}:{r['model']}",
                        measured=measured_iteration_time_s(r), predict=_time_predictor(plan, m),
                        info=dict(tp=tp, pp=pp, dp=dp, mbs=int(r["mbs"]), n=int(r["num_gpus"]), stack=r["stack"]),
                        plan=plan, model=m))
    return out
