"""Simulator vs real engine on CPU, same seeded workload (4 OPT-shaped models, 2 fit per worker, TP = 2).

Run: ``python benchmarks/bench_serve_validate.py [--seeds 0 1 2] [--duration 8]``. For each seed prints, overall
and per model, the engine's and the simulator's p50/p90/p99 of end-to-end latency, TTFT and TPOT (ms) and the
simulator's relative errors; the simulator is calibrated on the iterations and swaps measured in the run
(:mod:`hetplan.serve.validate`).
"""

from __future__ import annotations

import argparse
from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "serve"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--duration", type=float, default=8.0)
    ap.add_argument("--rates", default="8,4,2,2")
    ap.add_argument("--per-model", action="store_true", help="also print each model's rows")
    args = ap.parse_args()

    from hetplan.serve.config import ModelEntry
    from hetplan.serve.validate import compare_sim_engine

    ents = [ModelEntry(name=f"m{i}", model=str(FIXTURES / "small-opt.json"), seed=i) for i in range(4)]
    rates = [float(x) for x in args.rates.split(",")]
    print("| seed | requests | swaps eng/sim | model | metric | engine p50/p90/p99 ms | sim p50/p90/p99 ms | sim error |")
    print("|---|---|---|---|---|---|---|---|")
    for seed in args.seeds:
        out = compare_sim_engine(ents, tp=2, capacity_bytes=24_000_000, rates_per_s=rates, cv=1.5,
                                 duration_s=args.duration, seed=seed)
        for name in ["all"] + ([e.name for e in ents] if args.per_model else []):
            for metric in ("latency", "ttft", "tpot"):
                e, s = out["engine"][name][metric], out["sim"][name][metric]
                qs = ("p50", "p90", "p99")
                fmt = lambda d: "/".join(f"{d[q] * 1e3:.1f}" for q in qs)  # noqa: E731
                err = "/".join(f"{(s[q] - e[q]) / e[q]:+.0%}" for q in qs)
                print(f"| {seed} | {out['requests']} | {out['engine_swaps']}/{out['sim_swaps']} | {name} | {metric} | "
                      f"{fmt(e)} | {fmt(s)} | {err} |", flush=True)


if __name__ == "__main__":
    main()
