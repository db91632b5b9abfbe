"""Benchmark of the README's main example, ``hetplan plan examples/llama2-7b-mixed-cloud.toml`` (issue 17, item 5:
target <= 2 s wall, exact or with its proven gap).

Run: ``python benchmarks/bench_readme_example.py``. Prints the command's wall time (best of 3, a fresh process
each, CLI imports included), then one in-process search with the CPU time of each phase (from the search's own
progress callback: a phase lasts until the next one starts; the last one also holds the explanation's searches)
and whether the heterogeneous walk completed. Measured on the shared 2-core machine under load: 13.5 s wall, CPU
homogeneous 0.2 s, cost tables 2.5 s, allocation bounds 1.6 s, walk + explanation 1.5 s; walk complete. After the
cost tables were batched per stage type and the groups' boundary times shared and priced on arrays (same
results): cost tables 0.63 s, allocation bounds 1.06 s, walk + explanation 0.97 s CPU; the command 3.4-3.5 s user
CPU (was 5.6-6.3 s), 3.4 s wall best of 3 under load; still above the 2 s target.

Then (issue 17; same output: ``--json`` identical but for the search times, against the previous search code on
the same estimator): the last and single stages' memory grid at one micro-batch in flight only; the allocation
cross product built option by option (33 M candidate rows -> 1.1 M) with per-pool 1-D columns and no per-row
argsort; with the cut known from the start, the refined and stage-order bounds of every allocation under it on
arrays before the walk, which starts from those alone. Measured in the same minutes under load (CPU s, before ->
after): cost tables 0.70-0.76 -> 0.49-0.55; allocation bounds (now with the pre-walk bounds) 1.02-1.04 -> 0.53;
walk + explanation 0.46-0.48 -> 0.06; the command 2.82-2.85 -> 1.61-1.66 s user + 0.26-0.32 s sys
(``PYTHONDONTWRITEBYTECODE=1``, so every hetplan module is compiled at each start: about 0.08 s more than with
``.pyc`` files). The machine was never idle; the same command took 2.55 s user idle this morning, 2.82 under
this load, so about 1.5 s user + 0.25 s sys idle.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "llama2-7b-mixed-cloud.toml"


def main() -> None:
    from hetplan.cli.plan import _priced
    from hetplan.hardware.catalog import load_catalog
    from hetplan.jobfile import load_job_file
    from hetplan.plan import Inventory, Job
    from hetplan.search.objective import Objective
    from hetplan.search.planner import search_plans

    walls = []
    for _ in range(3):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "hetplan.cli.main", "plan", str(EXAMPLE), "--quiet"], check=True,
                       capture_output=True, env=dict(os.environ, COLUMNS="120"))
        walls.append(time.perf_counter() - t0)
    d = load_job_file(EXAMPLE)
    cat = load_catalog()
    inv = Inventory(pools=d["inventory"])
    inv = inv.model_copy(update={"pools": _priced(inv.pools, cat, "catalog", None)[0]})
    marks: list[tuple[str, float]] = [("homogeneous pools", time.process_time())]

    def progress(done, limit, phase):
        if phase != marks[-1][0]:
            marks.append((phase, time.process_time()))

    res = search_plans(Job(**d["job"]), inv, Objective(**d["objective"]), top_k=5, catalog=cat, progress=progress)
    marks.append(("end", time.process_time()))
    print(f"hetplan plan {EXAMPLE.name}: {min(walls):.2f} s wall (best of 3; target <= 2 s:",
          "PASS)" if min(walls) <= 2 else "FAIL)")
    for (phase, t), (_, t_next) in zip(marks, marks[1:]):
        print(f"  {phase:34s} {t_next - t:6.2f} s CPU")
    het = res.heterogeneous
    print(f"heterogeneous walk complete: {het['complete']} ({het['allocations_solved']} allocations solved); "
          f"homogeneous top K complete: {res.homogeneous['complete']}")


if __name__ == "__main__":
    main()
