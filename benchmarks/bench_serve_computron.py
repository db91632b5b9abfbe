"""Swap model vs Computron's published OPT-13B fp16 load times on A100 / PCIe 4.0 (Zou et al. 2023).

Run: ``python benchmarks/bench_serve_computron.py``. Prints per (TP, PP): bytes of the largest shard, the model's
load time, the published one, and the relative error; then the mean absolute and RMS errors.
"""

from __future__ import annotations

import math
from pathlib import Path

from hetplan.model.spec import load_model
from hetplan.estimate.inference import weight_bytes_per_worker
from hetplan.serve.swap_model import COMPUTRON_A100_PCIE4, COMPUTRON_OPT13B_LOAD_TIME_S


def main() -> None:
    path = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "serve" / "opt-13b.json"
    spec = load_model(path)
    sm = COMPUTRON_A100_PCIE4
    print(f"swap model: eta={sm.efficiency}, t0={sm.overhead_s} s, link {sm.link_bandwidth_bytes_per_s / 1e9:.0f} GB/s")
    print("| (TP, PP) | largest shard GB | model s | Computron s | error |")
    print("|---|---|---|---|---|")
    errs = []
    for (tp, pp), t_pub in COMPUTRON_OPT13B_LOAD_TIME_S.items():
        t = sm.load_time_s(spec, tp, pp, "fp16")
        e = (t - t_pub) / t_pub
        errs.append(e)
        print(f"| ({tp}, {pp}) | {max(weight_bytes_per_worker(spec, tp, pp, 'fp16')) / 1e9:.2f} | {t:.3f} | {t_pub:.3f} | {e:+.1%} |")
    print(f"mean |error| {sum(map(abs, errs)) / len(errs):.1%}, RMS {math.sqrt(sum(e * e for e in errs) / len(errs)):.1%}, "
          f"max |error| {max(map(abs, errs)):.1%}")


if __name__ == "__main__":
    main()
