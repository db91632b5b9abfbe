"""Espresso's measured heterogeneous DeepSpeed pipelines: the runs, their plans, and the pipeline event simulation
(:mod:`hetplan.estimate.schedule`) against them.

Espresso's DeepSpeed traces (:data:`ESPRESSO_TRACES`) record every instruction of
every iteration on every rank: ``ForwardPass``, ``BackwardPass``, ``SendActivation`` / ``RecvActivation``,
``SendGrad`` / ``RecvGrad``, ``ReduceTiedGrads``, ``ReduceGrads``, ``OptimizerStep`` with start and end times. This
module takes from one run, with no model of the GPUs at all:

* per stage, the median forward and backward of one micro-batch (first two micro-batches dropped: warm-up;
  :func:`hetplan.profile.importers.read_espresso_rank`, the one reader of these traces);
* per boundary, the transfer time: a blocking send lasts from its call to the end of the partner's matching
  receive, so a send whose partner had already posted that receive (the ``k``-th ``SendActivation`` of stage ``j``
  and the ``k``-th ``RecvActivation`` of stage ``j + 1``; the ``k``-th ``SendGrad`` of ``j + 1`` and ``RecvGrad``
  of ``j``) is the transfer alone: the median of those sends (:func:`transfer_s`). The shortest sends alone are
  the low tail of the transfers' own spread (0.185 s against a median 0.19-0.20 s on the juchiyun machines);
* per stage, the gradient reductions (``ReduceTiedGrads`` + ``ReduceGrads``, medians);
* the optimizer step: the shortest of the stages' median ``OptimizerStep``. The step starts with the global
  gradient-norm all-reduce over the pipeline (DeepSpeed's ``FP16_Optimizer`` clips by the global norm), so every
  other stage's step also holds its wait for the stage that finished its backward last;
* the measured iteration: the median time between consecutive ``OptimizerStep`` ends of rank 0 (first iteration
  dropped), which also holds the few tens of ms between iterations that no model here has.

The predicted iteration is ``max_i(end_i + reduce_i) + step``, ``end_i`` the stage's last backward in
:func:`hetplan.estimate.schedule.simulate` with the measured times, under one of the p2p models: asynchronous,
Megatron-LM's blocking calls, or DeepSpeed's ``TrainSchedule`` instructions (``blocking_p2p="deepspeed"``). What
is checked is the schedule and its p2p semantics, the part of the estimator that turns per-stage costs into an
iteration time; the per-stage costs themselves are checked by ``benchmarks/bench_hetero_traces.py``.

Run ``python benchmarks/bench_hetero_traces.py --schedule`` for the table (docs/estimator.md, Pipeline).

:func:`summary_rows` condenses the traces into the ``espresso_hetero`` set of ``hetplan validate`` (package data,
``python -m hetplan.calibration.traces > src/hetplan/calibration/validation_data/espresso_hetero.csv``): per run
its GPUs, stage boundaries, attention, measured transfer time and iteration time.
"""

from __future__ import annotations

import csv
import os
import re
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

from hetplan.estimate.schedule import simulate
from hetplan.profile.importers import read_espresso_rank

#: Espresso's measured heterogeneous DeepSpeed pipelines (per-rank ``operations_record.csv``: forward / backward
#: seconds per micro-batch and ``torch.cuda.max_memory_allocated`` bytes). Not package data: the fit reads them from
#: ``$HETPLAN_ESPRESSO_TRACES`` or, in a checkout, ``../shared/data/traces/espresso_hetero`` next to the repository.
ESPRESSO_TRACES = Path(os.environ.get("HETPLAN_ESPRESSO_TRACES",
                                      Path(__file__).resolve().parents[4] / "shared" / "data" / "traces" / "espresso_hetero"))
#: Plan shape of every traced run: micro-batch 8 sequences, 4 micro-batches, sequence 2000 tokens, fp16, DeepSpeed
#: activation checkpointing of every layer (full recomputation): backward ~ 3x forward, and the memory the traces
#: record is states + 2·s·b·h per layer per micro-batch in flight + one layer's activations.
ESPRESSO_MBS, ESPRESSO_MICROBATCHES, ESPRESSO_SEQ, ESPRESSO_RECOMPUTE = 8, 4, 2000, "full"
#: Run-name tokens -> catalog names.
ESPRESSO_NAMES = {"A30": "A30", "A4000": "RTX-A4000", "A6000": "RTX-A6000", "3090": "RTX-3090", "A10G": "A10G",
                  "T4": "T4", "V100": "V100-SXM-32GB"}
#: GPU types whose ``compute_efficiency`` this fit sets (the A10G is fitted on FASOP's profiles, :func:`fit_fasop`;
#: the T4 / V100 traces are 4-6x slower than any fp16 tensor-core rate and are not used, docs/estimator.md).
ESPRESSO_FITTED = ("A30", "RTX-A4000", "RTX-A6000", "RTX-3090")
#: GPU types whose traced runs used unfused (standard) attention: their backward of one checkpointed layer needs
#: 3.9-4.1 GiB beyond the gradients, against 0.9-1.9 GiB on every other type, where a layer of standard attention
#: alone would store 1.9 GiB of s x s tensors (docs/estimator.md, Memory; benchmarks/bench_memory_traces.py).
ESPRESSO_STANDARD_ATTENTION_GPUS = frozenset({"A10G"})
#: Runs whose stages calibrate: the runs that calibrate the memory model's backward working set
#: (benchmarks/bench_memory_traces.py) plus ``motivation1_33090``, the only run with RTX 3090s (so the 3090 has no
#: held-out stage). Every other stage is held out: 5 A30, 5 A4000 and 2 A6000 stages of runs the fit never saw.
ESPRESSO_CALIBRATION_RUNS = frozenset({"motivation1_2A30_A4000", "motivation1_2A6000", "motivation1_4A4000",
                                       "motivation1_2A10G_1T4_test", "motivation1_3A10G", "motivation1_33090"})


def espresso_model(num_layers: int):
    """The traced model (from the traces: 50.6 M parameters per layer, 18 B per parameter after the trainer starts):
    Llama-style, h 2048, 16 heads of 128, SwiGLU MLP 5504, RMSNorm, vocabulary 32000, no biases, untied."""
    from hetplan.model.spec import ModelSpec

    return ModelSpec(name=f"llama-1.3b-L{num_layers}", family="llama", num_layers=num_layers, hidden_size=2048,
                     num_attention_heads=16, num_kv_heads=16, head_dim=128, ffn_hidden_size=5504, vocab_size=32000,
                     max_seq_len=4096, gated_mlp=True, norm="rmsnorm", linear_bias=False, learned_positions=0,
                     tied_embeddings=False, dropout=False)


def espresso_parse_gpus(run: str, p: int) -> list[str] | None:
    """``motivation1_2A30_A4000`` -> [A30, A30, RTX-A4000]; None when the name does not give ``p`` GPUs."""
    out = []
    for tok in run.replace("motivation1_", "").split("_"):
        m = re.fullmatch(r"(\d?)(A30|A4000|A6000|3090|A10G|T4|V100)", tok) or re.fullmatch(r"(\d)1?(V100|T4)", tok)
        if m is None:
            continue
        out += [ESPRESSO_NAMES[m.group(2)]] * int(m.group(1) or 1)
    return out if len(out) == p else None


def espresso_runs(root: Path | None = None, skipped: list | None = None):
    """Yield ``(run name, GPU types in stage order, stage boundaries, rank folders)`` of each complete
    ``motivation1_*`` run under ``root``; runs whose GPU types the name does not give (``motivation1_2A60000``,
    ranks missing) are appended to ``skipped``. DeepSpeed's pipeline layer list is embedding + L layers + norm +
    head, so L = last boundary - 3."""
    root = ESPRESSO_TRACES if root is None else Path(root)
    for run in sorted(root.glob("*/motivation1_*")):
        by_run: dict[str, list[Path]] = {}
        for d in run.iterdir():
            rest = d.name.split("_", 1)[1]
            by_run.setdefault(rest, []).append(d)
        for rest, folders in sorted(by_run.items()):
            folders.sort(key=lambda d: int(d.name.split("_")[0]))
            tail = rest.replace("_tmp", "").split("_")[-(len(folders) + 1):]
            gpus = espresso_parse_gpus(run.name, len(folders))
            if gpus is None or not all(x.isdigit() for x in tail):
                if skipped is not None:
                    skipped.append(f"{run.name} ({rest})")
                continue
            yield run.name, gpus, [int(x) for x in tail], folders


def espresso_plan(gpus: list[str], bounds: list[int], attention: str = "flash", framework: str = "deepspeed"):
    """``(Plan, ModelSpec)`` of one traced run: one GPU per stage, the stage layers from the boundaries."""
    from hetplan.plan import GPUPool, Job, Plan, Stage

    L = bounds[-1] - 3
    m = espresso_model(L)
    kinds = sorted(set(gpus), key=gpus.index)
    pools = [GPUPool(gpu=g, count=gpus.count(g), gpus_per_node=8) for g in kinds]
    stages = [Stage(pool=kinds.index(g), num_layers=len([k for k in range(bounds[i], bounds[i + 1]) if 1 <= k <= L]),
                    recompute=ESPRESSO_RECOMPUTE) for i, g in enumerate(gpus)]
    job = Job(model=m.name, seq_len=ESPRESSO_SEQ, global_batch=ESPRESSO_MBS * ESPRESSO_MICROBATCHES, dtype="fp16",
              attention=attention, framework=framework)
    return Plan(job=job, pools=pools, stages=stages, mbs=ESPRESSO_MBS), m


def espresso_attention(gpu: str, attention: str = "auto") -> str:
    """The attention a traced stage on ``gpu`` is evaluated with: ``auto`` = what its run used
    (:data:`ESPRESSO_STANDARD_ATTENTION_GPUS` standard, the others flash); else ``attention`` for every stage."""
    if attention == "auto":
        return "standard" if gpu in ESPRESSO_STANDARD_ATTENTION_GPUS else "flash"
    return attention



#: p2p models compared: asynchronous, Megatron-LM's blocking calls, DeepSpeed's instructions.
P2P_MODELS: dict[str, bool | str] = {"async": False, "megatron": "megatron", "deepspeed": "deepspeed"}
#: Iterations dropped from the front of the period list (warm-up; micro-batches:
#: :data:`hetplan.profile.importers.ESPRESSO_WARMUP_MICROBATCHES`).
WARMUP_ITERATIONS = 1


def transfer_s(sender, receiver, send: str, recv: str) -> list[float]:
    """Durations (s) of ``sender``'s ``send`` instructions whose matching ``recv`` on ``receiver`` (the same
    ordinal) started first: the partner was waiting, so the send lasted the transfer alone (module doc)."""
    posted = [float(r["start_time"]) for r in receiver.records if r["task"] == recv]
    sends = [(float(r["start_time"]), float(r["duration"])) for r in sender.records if r["task"] == send]
    return [d for (start, d), p in zip(sends, posted) if p < start]


@dataclass
class TracedPipeline:
    """What one traced run measured (seconds; ``memory_bytes``: each rank's allocated peak, bytes); ``p2p_s`` has one
    entry per boundary."""

    run: str
    gpus: list[str]
    forward_s: list[float]
    backward_s: list[float]
    memory_bytes: list[float]
    p2p_s: list[float]
    reduce_s: list[float]
    step_s: float
    num_microbatches: int
    iteration_s: float


def read_pipeline(run: str, gpus: list[str], folders: list[Path]) -> TracedPipeline:
    """The measurements of one run (module doc) from its rank folders, in stage order.

    Raises:
        ValueError: a rank without enough iterations or instructions to measure.
    """
    read = [read_espresso_rank(f) for f in folders]
    ranks = [r for r in read if r is not None]
    if len(ranks) < len(read):
        raise ValueError(f"{run}: a rank without forward or backward passes after warm-up")
    p2p = []
    for j in range(len(ranks) - 1):
        waited = (transfer_s(ranks[j], ranks[j + 1], "SendActivation", "RecvActivation")
                  + transfer_s(ranks[j + 1], ranks[j], "SendGrad", "RecvGrad"))
        if not waited:
            raise ValueError(f"{run}: no send at boundary {j} found its partner waiting")
        p2p.append(statistics.median(waited))
    ends = [float(r["end_time"]) for r in ranks[0].records if r["task"] == "OptimizerStep"]
    periods = [b - a for a, b in zip(ends, ends[1:])][WARMUP_ITERATIONS:]
    if not periods:
        raise ValueError(f"{run}: fewer than {WARMUP_ITERATIONS + 2} iterations traced")
    return TracedPipeline(
        run=run, gpus=gpus,
        forward_s=[r.forward_s for r in ranks],
        backward_s=[r.backward_s for r in ranks],
        memory_bytes=[r.peak_memory_bytes for r in ranks],
        p2p_s=p2p,
        reduce_s=[sum(statistics.median(r.durations(t)) for t in ("ReduceTiedGrads", "ReduceGrads")) for r in ranks],
        step_s=min(statistics.median(r.durations("OptimizerStep")[WARMUP_ITERATIONS:]) for r in ranks),
        num_microbatches=ESPRESSO_MICROBATCHES,
        iteration_s=statistics.median(periods),
    )


def predicted_iteration_s(tp: TracedPipeline, p2p_model: str) -> float:
    """``max_i(end_i + reduce_i) + step`` with ``end_i`` from the 1F1B simulation under ``p2p_model`` (a key of
    :data:`P2P_MODELS`)."""
    sim = simulate(tp.forward_s, tp.backward_s, tp.p2p_s, tp.num_microbatches, "1f1b",
                   blocking_p2p=P2P_MODELS[p2p_model])
    return max(e + r for e, r in zip(sim.stage_end_s, tp.reduce_s)) + tp.step_s


def schedule_errors(root: Path | None = None) -> list[dict]:
    """One row per traced run: ``run``, ``p``, ``measured_s`` and, per p2p model, ``ours / measured - 1``.

    Raises:
        FileNotFoundError: no traces under ``root`` (default :data:`ESPRESSO_TRACES`).
    """
    rows = []
    for run, gpus, _, folders in espresso_runs(root):
        tp = read_pipeline(run, gpus, folders)
        rows.append({"run": run, "p": len(gpus), "measured_s": tp.iteration_s,
                     **{k: predicted_iteration_s(tp, k) / tp.iteration_s - 1 for k in P2P_MODELS}})
    if not rows:
        raise FileNotFoundError(f"no motivation1_* runs under {root}")
    return rows


#: Columns of :func:`summary_rows` (the ``espresso_hetero`` validation CSV).
SUMMARY_COLUMNS = ("run", "gpus", "bounds", "attention", "transfer_s", "iteration_s", "calibration")


def summary_rows(root: Path | None = None) -> list[dict]:
    """One row per traced run whose stages share one attention kind: ``gpus`` (stage order, ``+``-joined),
    ``bounds`` (DeepSpeed layer-list boundaries, ``-``-joined), ``attention`` (what the run used,
    :func:`espresso_attention`), ``transfer_s`` (median over the boundaries of the
    measured transfer time), ``iteration_s`` (measured) and ``calibration`` (a run whose stages fitted GPU
    efficiencies, :data:`ESPRESSO_CALIBRATION_RUNS`)."""
    rows = []
    for run, gpus, bounds, folders in espresso_runs(root):
        kinds = {espresso_attention(g) for g in gpus}
        if len(kinds) != 1:
            continue
        tp = read_pipeline(run, gpus, folders)
        rows.append({"run": run, "gpus": "+".join(gpus), "bounds": "-".join(map(str, bounds)),
                     "attention": kinds.pop(), "transfer_s": f"{statistics.median(tp.p2p_s):.6f}",
                     "iteration_s": f"{tp.iteration_s:.6f}", "calibration": int(run in ESPRESSO_CALIBRATION_RUNS)})
    return rows


def main() -> int:
    """Write :func:`summary_rows` as CSV to standard output."""
    w = csv.DictWriter(sys.stdout, fieldnames=SUMMARY_COLUMNS, lineterminator="\n")
    w.writeheader()
    w.writerows(summary_rows())
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
