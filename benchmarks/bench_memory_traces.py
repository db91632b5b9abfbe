"""Peak memory per stage against Espresso's DeepSpeed traces (``torch.cuda.max_memory_allocated`` per rank).

The traces (../shared/data/traces/espresso_hetero, ``motivation1_*`` runs; model and plan shape as in
``bench_hetero_traces.py``: Llama-style 32 or 24 layers, h 2048, seq 2000, micro-batch 8, 4 micro-batches, fp16,
DeepSpeed pipeline with full activation checkpointing) record allocated bytes only, so the prediction compared is
``weights + gradients + optimizer + activations + transient`` (:func:`hetplan.estimate.memory.stage_memory_bytes`
with ``framework="deepspeed"``), without the CUDA context and the fragmentation margin.

Attention: the traced backward of one checkpointed layer needs 0.9-1.9 GiB beyond the gradients on every GPU type
but the A10G (3.9-4.1 GiB): a layer of standard attention alone stores 1.9 GiB here (two s x s tensors of 0.95 GiB),
so the runs used a fused attention kernel (PyTorch SDPA, no s x s tensor stored) except on the A10G machines.
``--attention auto`` (default) evaluates that way; ``standard`` / ``flash`` evaluate every stage one way.

Calibration: the runs in :data:`CALIBRATION_RUNS` (14 stages); every other stage is held out.

    python benchmarks/bench_memory_traces.py [--attention auto|standard|flash] [--framework deepspeed|megatron]
                                             [--before]   # errors per GPU type (before: theoretical memory only)
    python benchmarks/bench_memory_traces.py --fit        # BACKWARD_WORKING_SET on the calibration runs
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_hetero_traces import DEFAULT, MBS, MICROBATCHES, SEQ, model, runs  # noqa: E402

from hetplan.estimate import memory  # noqa: E402
from hetplan.estimate.estimator import estimate_detailed  # noqa: E402
from hetplan.hardware.catalog import load_catalog  # noqa: E402
from hetplan.plan import GPUPool, Job, Plan, Stage  # noqa: E402
from hetplan.profile.importers import read_espresso_rank  # noqa: E402

#: Runs whose stages calibrate ``BACKWARD_WORKING_SET`` (every GPU type but the 3090 and V100 appears; the others
#: are held out, among them each GPU type again).
CALIBRATION_RUNS = {"motivation1_2A30_A4000", "motivation1_2A6000", "motivation1_4A4000", "motivation1_2A10G_1T4_test",
                    "motivation1_3A10G"}
#: GPU types whose traced runs used unfused (standard) attention (see module doc).
STANDARD_ATTENTION_GPUS = {"A10G"}


def stages(attention: str = "auto", before: bool = False, framework: str = "deepspeed"):
    """One dict per traced stage: run, GPU, calibration flag, measured and predicted allocated peak (bytes).

    ``before``: the estimator as it was (Megatron states + activations, no transient), for the 'before' column."""
    cat = load_catalog()
    out = []
    for name, gpus, bounds, folders in runs(DEFAULT):
        L = bounds[-1] - 3
        m = model(L)
        kinds = sorted(set(gpus), key=gpus.index)
        pools = [GPUPool(gpu=g, count=gpus.count(g), gpus_per_node=8) for g in kinds]
        st = []
        for i in range(len(gpus)):
            n = len([k for k in range(bounds[i], bounds[i + 1]) if 1 <= k <= L])
            st.append(Stage(pool=kinds.index(gpus[i]), num_layers=n, recompute="full"))
        costs = {}
        for att in ("standard", "flash"):
            job = Job(model=m.name, seq_len=SEQ, global_batch=MBS * MICROBATCHES, dtype="fp16",
                      attention="standard" if before else att, framework="megatron" if before else framework)
            costs[att] = estimate_detailed(Plan(job=job, pools=pools, stages=st, mbs=MBS), cat, m)[2]
        for i, folder in enumerate(folders):
            att = attention
            if attention == "auto":  # per GPU type (the attention kind does not change the other stages' memory)
                att = "standard" if gpus[i] in STANDARD_ATTENTION_GPUS else "flash"
            mem = costs[att][i].memory
            pred = float(mem.weights + mem.gradients + mem.optimizer + mem.activations)
            if not before:
                pred += float(mem.transient)
            out.append(dict(run=name, stage=i, gpu=gpus[i], calibration=name in CALIBRATION_RUNS, attention=att,
                            measured=read_espresso_rank(folder).peak_memory_bytes, predicted=pred))
    return out


def errors_by_gpu(rows, held_out_only=True):
    """{GPU: (n, mean signed error, mean absolute error)} of predicted/measured - 1."""
    per: dict[str, list[float]] = {}
    for r in rows:
        if held_out_only and r["calibration"]:
            continue
        per.setdefault(r["gpu"], []).append(r["predicted"] / r["measured"] - 1)
    return {g: (len(e), statistics.mean(e), statistics.mean(abs(x) for x in e)) for g, e in sorted(per.items())}


def fit(attention: str = "auto") -> float:
    """``BACKWARD_WORKING_SET`` (bisection in [0, 3]) at which the mean signed error over the calibration stages with
    fused attention is zero (the A10G stages, standard attention, check the s x s term instead)."""
    saved = memory.BACKWARD_WORKING_SET

    def err(c):
        memory.BACKWARD_WORKING_SET = c
        e = [r["predicted"] / r["measured"] - 1 for r in stages(attention)
             if r["calibration"] and (attention != "auto" or r["attention"] == "flash")]
        return statistics.mean(e)

    try:
        lo, hi = 0.0, 3.0
        for _ in range(30):
            mid = (lo + hi) / 2
            lo, hi = (lo, mid) if err(mid) > 0 else (mid, hi)
    finally:
        memory.BACKWARD_WORKING_SET = saved
    return round((lo + hi) / 2, 3)


def main() -> None:
    args = sys.argv[1:]
    attention = args[args.index("--attention") + 1] if "--attention" in args else "auto"
    if "--fit" in args:
        print(f"BACKWARD_WORKING_SET fitted on {sorted(CALIBRATION_RUNS)} ({attention} attention): {fit(attention)}")
        return
    framework = args[args.index("--framework") + 1] if "--framework" in args else "deepspeed"
    rows = stages(attention, before="--before" in args, framework=framework)
    print(f"{'run':30s} {'st':>2s} {'GPU':14s} {'measured GiB':>12s} {'ours GiB':>9s} {'error':>7s}")
    for r in rows:
        print(f"{r['run']:30s} {r['stage']:2d} {r['gpu']:14s} {r['measured'] / 2**30:12.2f} {r['predicted'] / 2**30:9.2f} "
              f"{r['predicted'] / r['measured'] - 1:+7.1%}{'  (calibration)' if r['calibration'] else ''}")
    for title, held in (("held-out stages", True), ("all stages", False)):
        print(f"\nAllocated peak, ours / measured - 1, {title}: GPU, n, mean signed, mean absolute")
        for g, (n, s, a) in errors_by_gpu(rows, held).items():
            print(f"  {g:14s} {n:3d} {s:+7.1%} {a:7.1%}")
        e = [abs(r["predicted"] / r["measured"] - 1) for r in rows if r["calibration"] != held or not held]
        print(f"  {'all':14s} {len(e):3d} {'':7s} {statistics.mean(e):7.1%}")


if __name__ == "__main__":
    main()
