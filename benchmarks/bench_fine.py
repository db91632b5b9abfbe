"""Benchmark of the fine-grained (Aceso-style) search on Aceso's own cases, with Aceso's V100 profiles.

Run:  python benchmarks/bench_fine.py            (all cases, ~10 s; --enumerate adds the optimality check, --trace the traces)
      python benchmarks/bench_fine.py --quick    (the 1.3B case and the 1,024-layer case only)

Cases (Liu et al., EuroSys'24; microsoft/SuperScaler branch Aceso, scripts/aceso_gpt_search.sh and README):
* GPT-3 1.3B, 4 x V100-32GB in one node, global batch 512, memory limit 12,000 MB ("small" artifact experiment):
  Aceso predicted 58.76 s, measured 59.01 s per iteration; 8.68 samples/s vs Megatron-LM 6.98, Alpa 7.46;
  search 99.31 s.
* GPT-3 1.3B / 6.7B / 13B on 4 / 16 (2x8) / 32 (4x8) V100-32GB, global batch 1024, 28,000 MB (paper's large runs,
  results/ref/perf_model_time_large_gpt.csv): measured 100.28 / 85.82 / 86.57 s, predicted 101.18 / 87.32 /
  84.61 s; search budget 200 s each (search_cost_large_gpt.csv).
* "scale-layer" GPT with 1,024 layers (hidden 512) on 8 V100, global batch 1024: Aceso 2.23 samples/s
  (Megatron-LM 2.21), search 246 s (e2e_thpt_scale_scale-layer.csv, search_cost_scale_scale-layer.csv).

Profiles: the 1.3B cases use shared/data's miniset (copied to tests/fixtures/aceso), the others Aceso's
profiled-time-eurosys files (tests/fixtures/aceso/eurosys), imported with hetplan.profile.importers.import_aceso.
Inter-node bandwidth: 100 Gb/s per node (assumption; Aceso measured 5.4 GB/s point-to-point between nodes).
Times printed are hetplan's estimates (event-simulated 1F1B); "search s" is wall-clock for the uniform search plus
the fine search; "evals" the fine search's work counter (deterministic).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from hetplan.hardware.catalog import load_catalog
from hetplan.model.spec import load_model
from hetplan.plan import GPUPool, Inventory, Job
from hetplan.profile.db import ProfileDB
from hetplan.profile.importers import import_aceso
from hetplan.search.fine import fine_search, with_gpu_memory
from hetplan.search.space import Pins

ROOT = Path(__file__).resolve().parents[1]
FIX = ROOT / "tests" / "fixtures" / "aceso"
V100 = "V100-SXM-32GB"

CASES = [
    # name, model, aceso label, profile dir, GPUs, GPUs/node, global batch, memory MB, Aceso measured s, predicted s
    ("GPT-3 1.3B small", FIX / "gpt_1_3B_aceso.json", "gpt_1_3B", FIX, 4, 4, 512, 12000, 59.01, 58.76, 99.31),
    ("GPT-3 1.3B", FIX / "gpt_1_3B_aceso.json", "gpt_1_3B", FIX, 4, 4, 1024, 28000, 100.28, 101.18, 200.0),
    ("GPT-3 6.7B", "gpt3-6.7b", "gpt_6_7B", FIX / "eurosys", 16, 8, 1024, 28000, 85.82, 87.32, 201.0),
    ("GPT-3 13B", "gpt3-13b", "gpt_13B", FIX / "eurosys", 32, 8, 1024, 28000, 86.57, 84.61, 201.0),
    ("GPT 1,024 layers", FIX / "gpt_scale_layer_1024.json", "gpt_scale-layer", FIX / "eurosys", 8, 8, 1024, 28000,
     1024 / 2.23, None, 246.05),
]


def run_case(name, model, label, prof_dir, gpus, per_node, gbs, mem_mb, measured, predicted, aceso_search_s,
             pins=None, quiet=False):
    """Run one case; returns a dict of the numbers printed."""
    m = load_model(model)
    db = ProfileDB()
    import_aceso(db, prof_dir, models={label: (m, 2048)})
    job = Job(model=str(model), seq_len=2048, global_batch=gbs, dtype="fp16")
    pool = GPUPool(gpu=V100, count=gpus, gpus_per_node=per_node, inter_node_bandwidth_bytes_per_s=12.5e9)
    cat = with_gpu_memory(load_catalog(), V100, mem_mb * 2**20)
    t0 = time.perf_counter()
    r = fine_search(job, Inventory(pools=[pool]), pins=pins, catalog=cat, model=m, profiles=db)
    wall = time.perf_counter() - t0
    out = dict(name=name, uniform_s=r.start_estimate.iteration_time_s, fine_s=r.estimate.iteration_time_s,
               evals=r.evaluations, search_s=wall, measured=measured, predicted=predicted, aceso_search_s=aceso_search_s,
               samples_per_s=gbs / r.estimate.iteration_time_s, plan=_plan_text(r.plan), start=_plan_text(r.start_plan),
               result=r)
    return out


def _plan_text(plan) -> str:
    parts = []
    for st in plan.stages:
        rc = st.recompute if st.recompute == "none" else f"{st.recompute}x{st.recomputed_layers()}"
        parts.append(f"{st.num_layers}L tp{st.tp}dp{st.dp} mbs{st.mbs or plan.mbs} {rc}")
    return f"zero{plan.zero} [" + " | ".join(parts) + "]"


def enumerable_check(seed: int, count: int, tmp: Path, layers=(4, 5, 6), hidden=(1024, 2048, 4096), gpus=(6, 8),
                     batches=(16, 32, 64), memory_gib=(6, 8, 12, 16)) -> tuple[int, int, int, float]:
    """Random small jobs whose whole fine-grained space is enumerated with the search's cost model.

    Returns ``(instances, uniform not optimal, fine search optimal, worst gap)``; jobs where nothing fits are
    skipped."""
    import json
    import random

    from hetplan.errors import HetplanError
    from hetplan.search.fine import FineSearch, enumerate_states
    from hetplan.search.fine_cost import FineCostModel

    base = json.loads((FIX / "gpt_1_3B_aceso.json").read_text())
    rng = random.Random(seed)
    n = nonuniform = optimal = 0
    worst = 0.0
    for _ in range(count):
        L, h, gpu = rng.choice(layers), rng.choice(hidden), rng.choice([V100, "A100-SXM-80GB"])
        N, gbs, mem = rng.choice(gpus), rng.choice(batches), rng.choice(memory_gib)
        path = tmp / f"m_{L}_{h}.json"
        path.write_text(json.dumps(dict(base, num_hidden_layers=L, hidden_size=h, ffn_hidden_size=4 * h,
                                        num_attention_heads=h // 64)))
        m = load_model(path)
        job = Job(model=str(path), seq_len=2048, global_batch=gbs, dtype="fp16")
        pool = GPUPool(gpu=gpu, count=N)
        cat = with_gpu_memory(load_catalog(), gpu, mem * 2**30)
        try:
            r = fine_search(job, Inventory(pools=[pool]), catalog=cat, model=m)
        except HetplanError:
            continue
        cm = FineCostModel(m, job, pool, cat.get(gpu), max_stages=N)
        best = min(cm.cost(st).key for st in enumerate_states(FineSearch(cm), r.start_plan.num_gpus, 2_000_000))
        gap = r.estimate.iteration_time_s / best[1] - 1
        n += 1
        nonuniform += r.start_estimate.iteration_time_s / best[1] - 1 > 1e-9
        optimal += gap <= 1e-9
        worst = max(worst, gap)
    return n, nonuniform, optimal, worst


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="only the 1.3B small case and the 1,024-layer case")
    ap.add_argument("--trace", action="store_true", help="print the search trace of each case")
    ap.add_argument("--enumerate", action="store_true",
                    help="also check optimality on 52 random 6-8-GPU jobs whose whole space is enumerated (~1-2 min)")
    args = ap.parse_args(argv)
    if args.enumerate:
        import tempfile

        with tempfile.TemporaryDirectory() as d:
            tot = [0, 0, 0, 0.0]
            for seed, count in ((3, 12), (11, 40)):
                n, nu, opt, worst = enumerable_check(seed, count, Path(d))
                tot = [tot[0] + n, tot[1] + nu, tot[2] + opt, max(tot[3], worst)]
        print(f"enumerable 6-8-GPU jobs: {tot[0]} instances, uniform not optimal on {tot[1]}, fine search optimal on "
              f"{tot[2]} ({tot[2] / max(tot[0], 1):.0%}), worst gap {tot[3]:.2e}")
    cases = [CASES[0], CASES[4]] if args.quick else CASES
    print(f"{'case':18} {'uniform s':>10} {'fine s':>9} {'Aceso pred':>10} {'Aceso meas':>10} {'samples/s':>9} "
          f"{'evals':>6} {'search s':>9} {'Aceso search s':>14}")
    rows = []
    for case in cases:
        row = run_case(*case)
        rows.append(row)
        pred = f"{row['predicted']:.2f}" if row["predicted"] else "-"
        print(f"{row['name']:18} {row['uniform_s']:10.2f} {row['fine_s']:9.2f} {pred:>10} {row['measured']:10.2f} "
              f"{row['samples_per_s']:9.2f} {row['evals']:6d} {row['search_s']:9.2f} {row['aceso_search_s']:14.1f}")
        print(f"{'':18}   uniform: {row['start']}")
        print(f"{'':18}   fine:    {row['plan']}")
        if args.trace:
            for line in row["result"].explanation():
                print(f"{'':20}{line}")
    # Aceso's own plan shape for the small case (4 stages x 1 GPU, micro-batch 1) under our cost model.
    row = run_case(*CASES[0], pins=Pins(pp=4, tp=1, dp=1, mbs=1))
    print(f"Aceso's plan shape (4 stages x 1 GPU, mbs 1) on the 1.3B small case, best partition/recompute found: "
          f"{row['fine_s']:.2f} s/iteration ({512 / row['fine_s']:.2f} samples/s): {row['plan']}")
    small = rows[0]
    big = next((r for r in rows if r["name"].startswith("GPT 1,024")), None)
    print(f"speed: 1.3B Aceso case {small['search_s']:.2f} s (target <= 1 s; Aceso 99.31 s)"
          + (f"; 1,024-layer GPT on 8 GPUs {big['search_s']:.2f} s (target <= 10 s; Aceso 246 s)" if big else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
