"""The pipeline event simulation (:mod:`hetplan.estimate.schedule`) against measured heterogeneous pipelines.

Espresso's DeepSpeed traces (:data:`hetplan.estimate.calibrate.ESPRESSO_TRACES`) record every instruction of
every iteration on every rank: ``ForwardPass``, ``BackwardPass``, ``SendActivation`` / ``RecvActivation``,
``SendGrad`` / ``RecvGrad``, ``ReduceTiedGrads``, ``ReduceGrads``, ``OptimizerStep`` with start and end times. This
module takes from one run, with no model of the GPUs at all:

* per stage, the median forward and backward of one micro-batch (first two micro-batches dropped: warm-up);
* per boundary, the transfer time: a blocking send lasts from its call to the partner's matching receive, so the
  median of the five shortest ``SendActivation`` (sender) and of the five shortest ``SendGrad`` (receiver), the
  smaller of the two, is the transfer alone;
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
``python -m hetplan.estimate.pipeline_traces > src/hetplan/estimate/validation_data/espresso_hetero.csv``): per run
its GPUs, stage boundaries, attention, measured transfer time and iteration time.
"""

from __future__ import annotations

import csv
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

from hetplan.estimate.calibrate import (ESPRESSO_CALIBRATION_RUNS, ESPRESSO_MICROBATCHES, espresso_attention,
                                        espresso_runs)
from hetplan.estimate.schedule import simulate

#: p2p models compared: asynchronous, Megatron-LM's blocking calls, DeepSpeed's instructions.
P2P_MODELS = {"async": False, "megatron": "megatron", "deepspeed": "deepspeed"}
#: Micro-batches dropped from the front of each stage's forward / backward list, and iterations from the front of
#: the period list (warm-up: the first forward takes ~3x the others on every trace).
WARMUP_MICROBATCHES = 2
WARMUP_ITERATIONS = 1
#: How many of the shortest sends per boundary give its transfer time.
SHORTEST_SENDS = 5


@dataclass
class TracedPipeline:
    """What one traced run measured (seconds); ``p2p_s`` has one entry per boundary."""

    run: str
    gpus: list[str]
    forward_s: list[float]
    backward_s: list[float]
    p2p_s: list[float]
    reduce_s: list[float]
    step_s: float
    num_microbatches: int
    iteration_s: float


def _records(folder: Path) -> list[dict]:
    with open(folder / "operations_record.csv", newline="") as fh:
        return list(csv.DictReader(fh))


def _durations(records: list[dict], task: str) -> list[float]:
    return [float(r["duration"]) for r in records if r["task"] == task]


def read_pipeline(run: str, gpus: list[str], folders: list[Path]) -> TracedPipeline:
    """The measurements of one run (module doc) from its rank folders, in stage order.

    Raises:
        ValueError: a rank without enough iterations or instructions to measure.
    """
    recs = [_records(f) for f in folders]
    short = lambda xs: statistics.median(sorted(xs)[:SHORTEST_SENDS])  # noqa: E731
    p2p = [min(short(_durations(recs[j], "SendActivation")), short(_durations(recs[j + 1], "SendGrad")))
           for j in range(len(recs) - 1)]
    ends = [float(r["end_time"]) for r in recs[0] if r["task"] == "OptimizerStep"]
    periods = [b - a for a, b in zip(ends, ends[1:])][WARMUP_ITERATIONS:]
    if not periods:
        raise ValueError(f"{run}: fewer than {WARMUP_ITERATIONS + 2} iterations traced")
    return TracedPipeline(
        run=run, gpus=gpus,
        forward_s=[statistics.median(_durations(r, "ForwardPass")[WARMUP_MICROBATCHES:]) for r in recs],
        backward_s=[statistics.median(_durations(r, "BackwardPass")[WARMUP_MICROBATCHES:]) for r in recs],
        p2p_s=p2p,
        reduce_s=[sum(statistics.median(_durations(r, t)) for t in ("ReduceTiedGrads", "ReduceGrads")) for r in recs],
        step_s=min(statistics.median(_durations(r, "OptimizerStep")[WARMUP_ITERATIONS:]) for r in recs),
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
        FileNotFoundError: no traces under ``root`` (default :data:`~hetplan.estimate.calibrate.ESPRESSO_TRACES`).
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
    :func:`~hetplan.estimate.calibrate.espresso_attention`), ``transfer_s`` (median over the boundaries of the
    measured transfer time), ``iteration_s`` (measured) and ``calibration`` (a run whose stages fitted GPU
    efficiencies, :data:`~hetplan.estimate.calibrate.ESPRESSO_CALIBRATION_RUNS`)."""
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
