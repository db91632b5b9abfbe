"""CPU time of ``hetplan capacity`` on the example (issue #25: at most 5 s of CPU).

Run: ``python benchmarks/bench_serve_capacity.py [--repeat 3] [--workload examples/serve/capacity.toml]
[--max-gpus N] [--exhaustive]``. Prints, per run, the process CPU time (user + system, so other jobs on a shared
machine do not count) and the wall time of :func:`hetplan.serve.capacity.plan_capacity` over the example's
candidate GPU types, the candidates whose rate was searched by simulation, and the mix it chose.

Measured 2026-11-28 (2 cores shared with seven other jobs), ``--exhaustive`` (every candidate simulated, the
search before the rate-bound pruning) -> default (pruned; the same price):

* ``--workload examples/serve/capacity-engines.toml --max-gpus 4`` (48 candidates: H100-SXM, L40S x TP x PP <= 4
  x vLLM, SGLang x 16-bit, FP8): 103.4 s -> 2.0 s CPU, 48 -> 1 rate searched, 1.86 $/h both (1 x L40S at the price then,
  SGLang 0.5, FP8). The profile of the exhaustive run: 190 of 194 s in 336 rate probes (7 per candidate) of
  200 requests each, 1.7 M simulated iterations, half of the time pricing them in ``estimate/inference.py``.
* ``examples/serve/capacity.toml --no-share`` (3 OPT-13B, 150 candidates): 2.7 s -> 0.1-0.4 s CPU, 129 -> 3 rate
  searches, the same price (7.74 $/h at the catalog prices before 2026-05-07; 7.42 $/h, 3 x A100-SXM-80GB, since).
* With shared groups (the default): 0.3-0.6 s CPU, 4.95 $/h (the three models sharing 2 x A100-SXM-80GB TP 2;
  11 of 172 candidate groups simulated, no dedicated rate search).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "serve" / "capacity.toml"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--workload", default=str(EXAMPLE))
    ap.add_argument("--max-gpus", type=int, default=None, help="override capacity.max_gpus")
    ap.add_argument("--exhaustive", action="store_true", help="simulate every candidate (the search before pruning)")
    ap.add_argument("--no-share", action="store_true", help="dedicated replicas only (no shared groups)")
    args = ap.parse_args()

    from hetplan.serve import capacity, replica
    from hetplan.serve.config import load_workload_config

    for i in range(args.repeat):
        replica._STEP_MODELS.clear()  # every run from a cold memo, as a fresh `hetplan capacity` process
        wf = load_workload_config(args.workload)
        if args.max_gpus:
            wf.capacity.max_gpus = args.max_gpus
        c0, w0 = time.process_time(), time.perf_counter()
        out = capacity.plan_capacity(wf, exhaustive=args.exhaustive, share=not args.no_share)
        cpu, wall = time.process_time() - c0, time.perf_counter() - w0
        mix = ", ".join([f"{r['model']}: {r['replicas']} x {r['gpu']} TP{r['tp']}xPP{r['pp']}" for r in out["mix"]]
                        + [f"{'+'.join(r['models'])} sharing {r['gpu']} TP{r['tp']}xPP{r['pp']}" for r in out["shared"]])
        searched = sum(c["rate_per_s"] is not None and c["rate_bound_per_s"] > 0 for c in out["candidates"])
        print(f"run {i}: {cpu:.2f} s CPU, {wall:.2f} s wall, {len(out['candidates'])} candidates "
              f"({searched} rate-searched), "
              f"{out['price_usd_per_hour']:.2f} $/h ({mix})")


if __name__ == "__main__":
    main()
