"""Validation of the per-stage cost model on measured heterogeneous pipelines: Espresso's DeepSpeed traces
(../shared/data/traces/espresso_hetero, ``motivation1_*`` runs on mixes of A30, A4000, A6000, RTX 3090, A10G, T4,
V100). For every stage: measured median forward / backward time per micro-batch and peak memory allocated, against
:func:`hetplan.estimate.estimator.estimate` of the same plan; then the error per GPU type, on the calibration runs
and on the held-out ones (:data:`hetplan.calibration.traces.ESPRESSO_CALIBRATION_RUNS`).

Assumed shape of the traced model (from the trace data README and the memory the traces record: 18 bytes per
parameter after the trainer starts, 50.6 M parameters per layer): a Llama-style model, hidden 2048, 16 heads,
SwiGLU MLP 5504, vocabulary 32000, sequence 2000, micro-batch 8, 4 micro-batches, fp16, full recomputation,
DeepSpeed's pipeline layer list = embedding + L layers + norm + head (so L = last boundary - 3: 32 layers for the
A30/A4000/A6000/3090 runs, 24 for the AWS runs). Each stage is evaluated with the attention its run used (fused
``flash`` except on the A10G machines, read from the traced memory: docs/estimator.md, Memory) and
``framework="deepspeed"``; ``--attention standard|flash`` evaluates every stage one way.

The reading and the fit live in :mod:`hetplan.calibration.calibrate` (``python -m hetplan.calibration.calibrate``
reproduces the catalog values); this script prints them.

    python benchmarks/bench_hetero_traces.py [TRACE_DIR] [--attention auto|standard|flash]   # the table of errors
    python benchmarks/bench_hetero_traces.py --fit    # compute_efficiency per traced GPU type, standard vs fused
    python benchmarks/bench_hetero_traces.py --schedule   # iteration time from the measured stage times through the
                                                          # schedule simulation, per p2p model
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

from hetplan.calibration import calibrate, traces as espresso
from hetplan.hardware.catalog import load_catalog

DEFAULT = espresso.ESPRESSO_TRACES
NAMES = espresso.ESPRESSO_NAMES
MBS, MICROBATCHES, SEQ = espresso.ESPRESSO_MBS, espresso.ESPRESSO_MICROBATCHES, espresso.ESPRESSO_SEQ
RECOMPUTE = espresso.ESPRESSO_RECOMPUTE
model = espresso.espresso_model
parse_gpus = espresso.espresso_parse_gpus


def runs(root: Path):
    """(run name, GPU types in stage order, stage boundaries, rank folders) of each complete traced run; prints the
    runs that cannot be read."""
    skipped: list[str] = []
    yield from espresso.espresso_runs(root, skipped)
    for s in skipped:
        print(f"skipped {s}: GPU types not readable from the name")


def main() -> None:
    args = sys.argv[1:]
    attention = args[args.index("--attention") + 1] if "--attention" in args else "auto"
    pos = [a for i, a in enumerate(args) if not a.startswith("-") and (i == 0 or args[i - 1] != "--attention")]
    traces = calibrate.EspressoTraces(Path(pos[0]) if pos else None)
    pred = traces.predict(load_catalog(), attention)
    print(f"{'run':30s} {'st':>2s} {'GPU':14s} {'attention':9s} {'fwd ms meas/ours':>18s} {'bwd ms meas/ours':>18s} "
          f"{'mem GiB meas/ours':>18s}")
    for st, pr in zip(traces.stages, pred):
        att = espresso.espresso_attention(st["gpu"], attention)
        print(f"{st['run']:30s} {st['stage']:2d} {st['gpu']:14s} {att:9s} "
              f"{st['forward_s'] * 1e3:8.0f}/{pr['forward_s'] * 1e3:<8.0f} "
              f"{st['backward_s'] * 1e3:8.0f}/{pr['backward_s'] * 1e3:<8.0f} "
              f"{st['memory_bytes'] / 2**30:8.1f}/{pr['memory_bytes'] / 2**30:<8.1f}"
              f"{'  (calibration)' if st['calibration'] else ''}")
    for s in traces.skipped:
        print(f"skipped {s}: GPU types not readable from the name")
    print("\nError per GPU type (ours / measured - 1): mean signed and mean absolute; memory = allocated peak")
    print(f"{'GPU':14s} {'part':11s} {'stages':>6s} {'fwd':>14s} {'bwd':>14s} {'memory':>14s}")
    for g, parts in traces.errors(pred).items():
        for part in ("calibration", "held_out"):
            if part in parts:
                e = parts[part]
                cols = [f"{e[k + '_mean']:+6.1%} {e[k + '_mape']:6.1%}" for k in ("forward", "backward", "memory")]
                print(f"{g:14s} {part:11s} {e['n']:6d} {cols[0]:>14s} {cols[1]:>14s} {cols[2]:>14s}")
    all_f = [abs(pr["forward_s"] / st["forward_s"] - 1) for st, pr in zip(traces.stages, pred)
             if st["gpu"] in espresso.ESPRESSO_FITTED and not st["calibration"]]
    print(f"\nheld-out stages of {', '.join(espresso.ESPRESSO_FITTED)}: n {len(all_f)}, forward MAPE "
          f"{statistics.mean(all_f):.1%}")


def fit_efficiency() -> dict:
    """The catalog's ``compute_efficiency`` per fitted GPU type (:func:`hetplan.calibration.calibrate.fit_espresso`)."""
    return calibrate.fit_espresso()


def schedule() -> None:
    """The iteration time of every traced run from its measured stage and transfer times through the schedule
    simulation, under each p2p model (:mod:`hetplan.calibration.traces`)."""
    from hetplan.calibration.traces import P2P_MODELS, schedule_errors

    pos = [a for a in sys.argv[1:] if not a.startswith("-")]
    rows = schedule_errors(Path(pos[0]) if pos else None)
    print(f"{'run':30s} {'p':>2s} {'measured s':>10s} " + " ".join(f"{k:>10s}" for k in P2P_MODELS))
    for r in rows:
        print(f"{r['run']:30s} {r['p']:2d} {r['measured_s']:10.2f} " + " ".join(f"{r[k]:+10.1%}" for k in P2P_MODELS))
    print(f"{'MAPE':30s} {'':2s} {'':10s} " + " ".join(f"{statistics.mean(abs(r[k]) for r in rows):10.1%}"
                                                     for k in P2P_MODELS))


if __name__ == "__main__":
    if "--fit" in sys.argv:
        json.dump(fit_efficiency(), sys.stdout, indent=2)
        print()
    elif "--schedule" in sys.argv:
        schedule()
    else:
        main()
