"""Does it fit, on every validation row with a plan (issue 29): the rows whose expected footprint is within 5 % of
their GPU's memory or above it, and whether the fit test refuses them (:mod:`hetplan.estimate.memory`, "Does it
fit"), plus BLOOM's six layouts measured out of memory (:func:`hetplan.calibration.modern.bigscience.oom_check`).
A row that ran and is refused is a false "does not fit".

    python benchmarks/bench_memory_fit.py          # the near-limit rows, worst first; exit 1 on a false refusal
"""

from __future__ import annotations

import sys

from hetplan.calibration import independent, modern
from hetplan.calibration import validation as v
from hetplan.calibration.modern import bigscience
from hetplan.estimate.estimator import estimate
from hetplan.hardware.catalog import load_catalog

GIB = 2**30


def rows() -> list[dict]:
    """One dict per validation row with a plan: set, key, footprint, required and capacity of its fullest stage
    (GiB), fits; and the measured-OOM rows (``ran`` False)."""
    cat = load_catalog()
    cases = v.all_cases(v.SET_NAMES) + modern.run_modern(modern.SET_NAMES)[1] + independent.run_independent()[1]
    cases += independent.run_a100()[1]
    out = []
    for c in cases:
        if c.plan is None:
            continue
        est = estimate(c.plan, catalog=cat, model=c.model, virtual_stages=c.virtual_stages)
        s = max(est.stages, key=lambda s: s.memory.total / s.memory_capacity_bytes)
        out.append(dict(set=c.set, key=c.key, total=s.memory.total / GIB, required=s.memory.required / GIB,
                        capacity=s.memory_capacity_bytes / GIB, fits=bool(est.fits), ran=True))
    for r in bigscience.oom_check(cat):
        out.append(dict(set="bigscience_a100 (OOM)", key=r["key"], total=r["max_stage_gib"], required=float("nan"),
                        capacity=80.0, fits=r["fits"], ran=False))
    return out


def main() -> int:
    all_rows = rows()
    near = sorted((r for r in all_rows if r["total"] >= 0.95 * r["capacity"] or not r["fits"]),
                  key=lambda r: -r["total"] / r["capacity"])
    print(f"{len(all_rows)} rows; {len(near)} within 5 % of their GPU or refused (GiB: footprint, required, GPU)")
    for r in near:
        verdict = ("fits" if r["total"] <= r["capacity"] else "tight") if r["fits"] else "REFUSED"
        print(f"  {r['key'][:60]:60s} {r['total']:6.1f} {r['required']:6.1f} {r['capacity']:6.1f} {verdict:8s}"
              f"{'' if r['ran'] else ' (measured OOM)'}")
    false = [r["key"] for r in all_rows if r["ran"] and not r["fits"]]
    print(f"false 'does not fit': {len(false)}{': ' + ', '.join(false) if false else ''}")
    return 1 if false else 0


if __name__ == "__main__":
    sys.exit(main())
