"""Validation of the per-stage cost model on measured heterogeneous pipelines: Espresso's DeepSpeed traces
(../shared/data/traces/espresso_hetero, ``motivation1_*`` runs on mixes of A30, A4000, A6000, RTX 3090, A10G, T4,
V100). For every stage: measured median forward / backward time per micro-batch and peak memory allocated, against
:func:`hetplan.estimate.estimator.estimate` of the same plan; then the error per GPU type.

Assumed shape of the traced model (from the trace data README and the memory the traces record: 18 bytes per
parameter after the trainer starts, 50.6 M parameters per layer): a Llama-style model, hidden 2048, 16 heads,
SwiGLU MLP 5504, vocabulary 32000, sequence 2000, micro-batch 8, 4 micro-batches, fp16, full recomputation,
DeepSpeed's pipeline layer list = embedding + L layers + norm + head (so L = last boundary - 3: 32 layers for the
A30/A4000/A6000/3090 runs, 24 for the AWS runs).

    python benchmarks/bench_hetero_traces.py [TRACE_DIR]     # the table of errors
    python benchmarks/bench_hetero_traces.py --fit           # compute_efficiency per traced GPU type
"""

from __future__ import annotations

import csv
import re
import statistics
import sys
from pathlib import Path

from hetplan.estimate.estimator import estimate
from hetplan.hardware.catalog import load_catalog
from hetplan.model.spec import ModelSpec
from hetplan.plan import GPUPool, Job, Plan, Stage

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = ROOT.parent / "shared" / "data" / "traces" / "espresso_hetero"
NAMES = {"A30": "A30", "A4000": "RTX-A4000", "A6000": "RTX-A6000", "3090": "RTX-3090", "A10G": "A10G", "T4": "T4",
         "V100": "V100-SXM-32GB"}
MBS, MICROBATCHES, SEQ = 8, 4, 2000
#: The traces hold ~2 s·b·h bytes per layer per micro-batch in flight plus one layer's full activations (e.g. 20.3 GiB
#: on stage 0 of 2A30_A4000 = 13.9 GiB of model states + 6.4 GiB), and backward ≈ 3x forward: DeepSpeed activation
#: checkpointing of every layer, i.e. full recomputation.
RECOMPUTE = "full"


def model(L: int) -> ModelSpec:
    return ModelSpec(name=f"llama-1.3b-L{L}", family="llama", num_layers=L, hidden_size=2048, num_attention_heads=16,
                     num_kv_heads=16, head_dim=128, ffn_hidden_size=5504, vocab_size=32000, max_seq_len=4096,
                     gated_mlp=True, norm="rmsnorm", linear_bias=False, learned_positions=0, tied_embeddings=False,
                     dropout=False)


def parse_gpus(run: str, p: int) -> list[str] | None:
    """``2A30_A4000`` -> [A30, A30, A4000]; None when the name does not give ``p`` GPUs."""
    out = []
    for tok in run.replace("motivation1_", "").split("_"):
        m = re.fullmatch(r"(\d?)(A30|A4000|A6000|3090|A10G|T4|V100)", tok) or re.fullmatch(r"(\d)1?(V100|T4)", tok)
        if m is None:
            continue
        out += [NAMES[m.group(2)]] * int(m.group(1) or 1)
    return out if len(out) == p else None


def measured(folder: Path) -> tuple[float, float, float]:
    """Median forward and backward seconds per micro-batch (first two micro-batches dropped: warm-up) and the
    peak ``max_mem`` (bytes)."""
    rows = list(csv.DictReader(open(folder / "operations_record.csv")))
    f = [float(r["duration"]) for r in rows if r["task"] == "ForwardPass"][2:]
    b = [float(r["duration"]) for r in rows if r["task"] == "BackwardPass"][2:]
    mem = max(float(r["max_mem"]) for r in rows)
    return statistics.median(f), statistics.median(b), mem


def runs(root: Path):
    """(run name, GPU types in stage order, stage boundaries, rank folders) of each complete traced run."""
    for run in sorted(root.glob("*/motivation1_*")):
        by_run: dict[str, list[Path]] = {}
        for d in run.iterdir():
            rank, rest = d.name.split("_", 1)
            by_run.setdefault(rest, []).append(d)
        for rest, folders in sorted(by_run.items()):
            folders.sort(key=lambda d: int(d.name.split("_")[0]))
            tail = rest.replace("_tmp", "").split("_")
            bounds = [int(x) for x in tail[-(len(folders) + 1):]]
            gpus = parse_gpus(run.name, len(folders))
            if gpus is None or not all(x.isdigit() for x in tail[-(len(folders) + 1):]):
                print(f"skipped {run.name} ({rest}): GPU types not readable from the name")
                continue
            yield run.name, gpus, bounds, folders


def main() -> None:
    root = Path(sys.argv[1]) if len(sys.argv) > 1 and not sys.argv[1].startswith("-") else DEFAULT
    cat = load_catalog()
    per_gpu: dict[str, list] = {}
    print(f"{'run':32s} {'stage':5s} {'GPU':14s} {'layers':>6s} {'fwd ms meas/ours':>18s} {'bwd ms meas/ours':>18s} "
          f"{'mem GiB meas/ours':>18s}")
    for name, gpus, bounds, folders in runs(root):
        L = bounds[-1] - 3
        m = model(L)
        kinds = sorted(set(gpus), key=gpus.index)
        pools = [GPUPool(gpu=g, count=gpus.count(g), gpus_per_node=8) for g in kinds]
        stages = []
        for i in range(len(gpus)):
            lo, hi = bounds[i], bounds[i + 1]
            n = len([k for k in range(lo, hi) if 1 <= k <= L])
            stages.append(Stage(pool=kinds.index(gpus[i]), num_layers=n, recompute=RECOMPUTE))
        plan = Plan(job=Job(model=m.name, seq_len=SEQ, global_batch=MBS * MICROBATCHES, dtype="fp16"), pools=pools,
                    stages=stages, mbs=MBS)
        est = estimate(plan, cat, m)
        for i, (folder, se) in enumerate(zip(folders, est.stages)):
            f, b, mem = measured(folder)
            mem_ours = se.memory.total - se.memory.overhead  # max_memory_allocated excludes context and fragmentation
            per_gpu.setdefault(se.gpu, []).append((se.forward_s / f - 1, se.backward_s / b - 1, mem_ours / mem - 1))
            print(f"{name:32s} {i:5d} {se.gpu:14s} {se.num_layers:6d} {f * 1e3:8.0f}/{se.forward_s * 1e3:<8.0f} "
                  f"{b * 1e3:8.0f}/{se.backward_s * 1e3:<8.0f} {mem / 2**30:8.1f}/{mem_ours / 2**30:<8.1f}")
    print("\nError per GPU type (ours / measured - 1): mean signed and mean absolute")
    print(f"{'GPU':14s} {'stages':>6s} {'fwd':>14s} {'bwd':>14s} {'memory':>14s}")
    for g, errs in sorted(per_gpu.items()):
        cols = []
        for k in range(3):
            v = [e[k] for e in errs]
            cols.append(f"{statistics.mean(v):+6.1%} {statistics.mean(abs(x) for x in v):6.1%}")
        print(f"{g:14s} {len(errs):6d} {cols[0]:>14s} {cols[1]:>14s} {cols[2]:>14s}")


if __name__ == "__main__" and "--fit" not in sys.argv:
    main()


def fit_efficiency() -> dict[str, float]:
    """Per GPU type: the ``compute_efficiency`` (bisection in [0.05, 1]) at which the mean forward-time error over its
    traced stages is zero (the other catalog figures unchanged). Used for the catalog values of the traced GPUs."""

    cat = load_catalog()
    stages = []
    for name, gpus, bounds, folders in runs(DEFAULT):
        L = bounds[-1] - 3
        for i, folder in enumerate(folders):
            n = len([k for k in range(bounds[i], bounds[i + 1]) if 1 <= k <= L])
            stages.append((gpus[i], L, i, len(folders), n, measured(folder)[0]))
    out = {}
    from hetplan.estimate.stage import stage_costs
    from hetplan.estimate.estimator import pool_link

    for g in sorted({s[0] for s in stages}):
        base = cat.get(g)

        def err(eff):
            spec = base.model_copy(update={"compute_efficiency": eff})
            link = pool_link(GPUPool(gpu=g, count=1), spec)
            e = []
            for gg, L, i, p, n, f in stages:
                if gg != g:
                    continue
                c = stage_costs(model(L), spec, link, "fp16", s=SEQ, b=MBS, t=1, dp=1, num_layers=n,
                                has_embedding=i == 0, has_head=i == p - 1, single_stage=p == 1,
                                in_flight=min(p - i, MICROBATCHES), num_microbatches=MICROBATCHES, zero=0,
                                recompute_code=2, sequence_parallel=False)
                e.append(float(c["forward_s"]) / f - 1)
            return statistics.mean(e)

        lo, hi = 0.05, 1.0
        if err(hi) > 0:
            out[g] = 1.0
            continue
        for _ in range(40):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if err(mid) > 0 else (lo, mid)
        out[g] = round((lo + hi) / 2, 3)
    return out


if __name__ == "__main__" and "--fit" in sys.argv:
    print("fitted compute_efficiency (forward time):", fit_efficiency())
