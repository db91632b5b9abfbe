"""CPU time of ``hetplan capacity`` on the example (issue #25: at most 5 s of CPU).

Run: ``python benchmarks/bench_serve_capacity.py [--repeat 3] [--workload examples/serve/capacity.toml]``.
Prints, per run, the process CPU time (user + system, so other jobs on a shared machine do not count) and the
wall time of :func:`hetplan.serve.capacity.plan_capacity` over the example's five candidate GPU types, and the
mix it chose.
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
    args = ap.parse_args()

    from hetplan.serve import capacity
    from hetplan.serve.config import load_workload_config

    for i in range(args.repeat):
        capacity._STEP_MODELS.clear()  # every run from a cold memo, as a fresh `hetplan capacity` process
        wf = load_workload_config(args.workload)
        c0, w0 = time.process_time(), time.perf_counter()
        out = capacity.plan_capacity(wf)
        cpu, wall = time.process_time() - c0, time.perf_counter() - w0
        mix = ", ".join(f"{r['model']}: {r['replicas']} x {r['gpu']} TP{r['tp']}xPP{r['pp']}" for r in out["mix"])
        print(f"run {i}: {cpu:.2f} s CPU, {wall:.2f} s wall, {len(out['candidates'])} candidates, "
              f"{out['price_usd_per_hour']:.2f} $/h ({mix})")


if __name__ == "__main__":
    main()
