"""Energy planner benchmark: hetplan vs Perseus' planner (PyPI ``lowtime`` 0.3.0, Rust core) side by side.

    python benchmarks/bench_energy.py              # 8x12 and 8x24 for GPT-3 175B and BLOOM, then 16x64
    python benchmarks/bench_energy.py --no-lowtime # hetplan only
    python benchmarks/bench_energy.py --cases gpt3-175b:12
    python benchmarks/bench_energy.py --cases --no-big --no-command   # the scale targets only (below)

For each case both planners get the same stage profile (A100-SXM, idle power 83.64 W, unit time 1 ms, 1F1B);
the script prints CPU time of each, the speed-up, the largest relative energy difference between the two
frontiers at equal iteration times, and the difference to the published ``frontier_reference`` when present.
``lowtime`` is an optional benchmark dependency (``pip install lowtime==0.3.0``; it brings networkx/attrs).
The 16-stage profile for 16x64 repeats the 8-stage one: stages 0..14 use the middle stages' rows
(stage k -> k mod 7), stage 15 the last stage's.

Then the whole ``hetplan energy frontier`` command (a fresh process: imports, profile, frontier, summary with
baselines, plans.json, no plot) for 8x12, 8x24 and 16x64 from the CSV, and 8x12 from a plan JSON alone
(model-derived profile): wall seconds, and CPU seconds of the command with the child process it forks for the
baselines (they run beside the solver, so on two idle cores the wall time is about the parent's share;
``--no-command`` skips this part).
"""

from __future__ import annotations

import argparse
import csv
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from hetplan.energy.frontier import compute_frontier
from hetplan.energy.profile import load_stage_profile, parse_stage_profile

FIXTURES = ROOT / "tests" / "fixtures" / "energy"
SHARED = ROOT.parent / "shared" / "data" / "energy"
IDLE_W = 83.64
UNIT_S = 0.001


def profile_file(model: str) -> Path:
    return FIXTURES / f"{model}+a100_sxm_bf16.csv"


def reference(model: str, mb: int) -> dict[int, float] | None:
    for base in (FIXTURES / "frontier_reference", SHARED / "frontier_reference" / "a100_sxm"):
        f = base / f"{model}_bf16_mb{mb}.csv"
        if f.exists():
            with open(f) as fh:
                return {round(float(r["time"]) / UNIT_S): float(r["energy"]) for r in csv.DictReader(fh)}
    return None


def run_lowtime(path: Path, num_stages: int, mb: int) -> tuple[dict[int, float], float]:
    """Perseus' planner through lowtime's public API; returns ({quant_time: energy}, CPU seconds)."""
    import networkx as nx
    from lowtime.cost_model import ExponentialModel
    from lowtime.graph_utils import add_sink_node, add_source_node
    from lowtime.operation import (
        CandidateExecutionOptions,
        ExecutionOption,
        OperationSpec,
    )
    from lowtime.perseus.instruction import Backward, Forward
    from lowtime.perseus.schedule import Synchronous1F1B
    from lowtime.solver import PhillipsDessouky

    with open(path) as fh:
        rows = list(csv.DictReader(fh))
    t0 = time.process_time()
    specs: dict[int, dict] = {s: {} for s in range(num_stages)}
    for cls in (Forward, Backward):
        for s in range(num_stages):
            opts = [ExecutionOption[int](real_time=float(r["time"]), unit_time=UNIT_S, cost=float(r["energy"]),
                                         knob=int(r["frequency"]))
                    for r in rows if int(r["stage"]) == s and r["instruction"] == cls.__name__.lower()]
            cand = CandidateExecutionOptions[int](options=opts)
            for o in cand.options:  # effective energy: minus idle power over the quantized time
                o.cost -= IDLE_W * o.quant_time * o.unit_time
            specs[s][cls] = OperationSpec[int](options=cand, cost_model=ExponentialModel(cand))
    dag = nx.DiGraph()
    node, where = 2, {}
    for s in range(num_stages):
        ids = []
        for inst in Synchronous1F1B(num_stages=num_stages, num_micro_batches=mb, stage_id=s, operation_spec_map=specs[s]):
            dag.add_node(node, op=inst)
            ids.append(node)
            where[(type(inst).__name__, s, inst.micro_batch_id)] = node
            node += 1
        dag.add_edges_from(zip(ids, ids[1:]))
    for s in range(num_stages - 1):
        for m in range(mb):
            dag.add_edge(where[("Forward", s, m)], where[("Forward", s + 1, m)])
            dag.add_edge(where[("Backward", s + 1, m)], where[("Backward", s, m)])
    add_source_node(dag, 0)
    add_sink_node(dag, 1)
    dag.graph["source_node"], dag.graph["sink_node"] = 0, 1
    out = {}
    for r in PhillipsDessouky(dag).run():
        out[r.quant_time] = r.cost + num_stages * IDLE_W * r.real_time
    return out, time.process_time() - t0


def max_rel_diff(a: dict[int, float], b: dict[int, float]) -> tuple[float, int]:
    common = set(a) & set(b)
    if not common:
        return float("nan"), 0
    return max(abs(a[t] - b[t]) / b[t] for t in common), len(common)


def sixteen_stage_profile(model: str):
    src = load_stage_profile(profile_file(model))
    lines = ["stage,instruction,frequency,time,energy"]
    for s in range(16):
        base = 7 if s == 15 else s % 7
        for inst in ("forward", "backward"):
            p = src.get(base, inst)
            lines += [f"{s},{inst},{int(f)},{float(t)!r},{float(e)!r}" for f, t, e in zip(p.frequency_mhz, p.time_s, p.energy_j)]
    return parse_stage_profile("\n".join(lines) + "\n", source=f"{model} x16")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", nargs="*", default=["gpt3-175b:12", "bloom:12", "gpt3-175b:24", "bloom:24"])
    ap.add_argument("--no-lowtime", action="store_true", help="skip the lowtime comparison")
    ap.add_argument("--no-big", action="store_true", help="skip the 16x64 case")
    ap.add_argument("--no-command", action="store_true", help="skip timing the whole CLI command")
    ap.add_argument("--no-scale", action="store_true", help="skip the GPT-3 175B example plan and 16x128")
    args = ap.parse_args()
    have_lowtime = False
    if not args.no_lowtime:
        try:
            import lowtime  # noqa: F401

            have_lowtime = True
        except ImportError:
            print("lowtime is not installed (pip install lowtime==0.3.0): hetplan only\n")
    hdr = f"{'case':<18}{'points':>7}{'hetplan s':>11}{'lowtime s':>11}{'speed-up':>10}{'vs lowtime':>12}{'vs reference':>14}"
    print(hdr)
    print("-" * len(hdr))
    for case in args.cases:
        model, mb = case.split(":")
        mb = int(mb)
        prof = load_stage_profile(profile_file(model))
        t0 = time.process_time()
        fr = compute_frontier(prof, mb, IDLE_W, UNIT_S)
        ours_s = time.process_time() - t0
        ours = dict(zip(fr.result.quant_time.tolist(), fr.energy_j.tolist()))
        ref = reference(model, mb)
        ref_err = f"{max_rel_diff(ours, ref)[0]:.1e}" if ref else "-"
        lt_s, lt_err, speed = "-", "-", "-"
        if have_lowtime:
            lt, lt_time = run_lowtime(profile_file(model), prof.num_stages, mb)
            lt_s = f"{lt_time:.2f}"
            lt_err = f"{max_rel_diff(ours, lt)[0]:.1e}"
            speed = f"{lt_time / ours_s:.1f}x"
        print(f"{model + f' 8x{mb}':<18}{len(fr):>7}{ours_s:>11.2f}{lt_s:>11}{speed:>10}{lt_err:>12}{ref_err:>14}", flush=True)
    if not args.no_big:
        prof16 = sixteen_stage_profile("gpt3-175b")
        t0 = time.process_time()
        fr = compute_frontier(prof16, 64, IDLE_W, UNIT_S)
        ours_s = time.process_time() - t0
        print(f"{'gpt3-175b 16x64':<18}{len(fr):>7}{ours_s:>11.2f}{'-':>11}{'-':>10}{'-':>12}{'-':>14}")
        print(f"\n16x64: {fr.dag.num_ops} instructions, {len(fr)} frontier points from {fr.time_s.max():.3f} s to "
              f"{fr.time_s.min():.3f} s; stop: {fr.result.stop_reason}")
    print("\nCPU seconds (time.process_time); 'vs' columns: largest relative energy difference at equal iteration times.")
    if not args.no_scale:
        scale_cases()
    if not args.no_command:
        command_timings(big=not args.no_big)
    np.seterr(all="ignore")


def scale_cases() -> None:
    """The issue's scale targets, in one run: the GPT-3 175B example's best plan (``hetplan plan
    examples/gpt3-175b-a100.toml``: PP 8, interleaved v = 12, 24 micro-batches, 4,608 instructions, model-derived
    profile) at most 30x the 8x12 CSV frontier's CPU time, and 16 stages x 128 micro-batches within 60 s CPU."""
    from hetplan.energy.model import plan_stage_profile
    from hetplan.runtime.planio import load_plan

    t0 = time.process_time()
    compute_frontier(load_stage_profile(profile_file("gpt3-175b")), 12, IDLE_W, UNIT_S)
    base = time.process_time() - t0
    tmp = Path(tempfile.mkdtemp())
    subprocess.run([sys.executable, "-m", "hetplan.cli.main", "plan", str(ROOT / "examples" / "gpt3-175b-a100.toml"),
                    "-q", "-o", str(tmp / "best.json")], check=True, capture_output=True,
                   env={"PYTHONPATH": str(ROOT / "src"), "PATH": ""})
    plan = load_plan(tmp / "best.json")
    pp = plan_stage_profile(plan)
    t0 = time.process_time()
    fr = compute_frontier(pp.profile, plan.num_microbatches(0), sum(pp.idle_power_w) / len(pp.idle_power_w), UNIT_S,
                          "interleaved" if pp.virtual_stages > 1 else plan.schedule, virtual_stages=pp.virtual_stages)
    big = time.process_time() - t0
    t0 = time.process_time()
    f16 = compute_frontier(sixteen_stage_profile("gpt3-175b"), 128, IDLE_W, UNIT_S)
    s16 = time.process_time() - t0
    print(f"\n{'scale case':<34}{'instr.':>8}{'points':>8}{'CPU s':>8}{'target':>16}")
    print(f"{'gpt3-175b 8x12 csv':<34}{192:>8}{640:>8}{base:>8.2f}{'-':>16}")
    print(f"{'gpt3-175b example plan (v 12, 24)':<34}{fr.dag.num_ops:>8}{len(fr):>8}{big:>8.2f}"
          f"{f'{big / base:.0f}x (<= 30x)':>16}")
    print(f"{'16 x 128 csv':<34}{f16.dag.num_ops:>8}{len(f16):>8}{s16:>8.2f}{'<= 60 s':>16}")


def _timed(cmd: list[str]) -> tuple[float, float]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True, env={"PYTHONPATH": str(ROOT / "src"), "PATH": ""})
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def command_timings(big: bool = True) -> None:
    """Time the whole ``hetplan energy frontier`` command (module doc)."""
    tmp = Path(tempfile.mkdtemp())
    cli = [sys.executable, "-m", "hetplan.cli.main", "energy", "frontier"]
    cases = [("gpt3-175b 8x12 csv", [str(profile_file("gpt3-175b")), "-m", "12", "--gpu", "A100-SXM-80GB"]),
             ("gpt3-175b 8x24 csv", [str(profile_file("gpt3-175b")), "-m", "24", "--gpu", "A100-SXM-80GB"])]
    if big:
        p16 = tmp / "p16.csv"
        p16.write_text(sixteen_stage_profile("gpt3-175b").to_csv())
        cases.append(("gpt3-175b 16x64 csv", [str(p16), "-m", "64", "--gpu", "A100-SXM-80GB"]))
    plan = tmp / "plan.json"
    plan.write_text(json.dumps({
        "job": {"model": "gpt3-175b", "seq_len": 2048, "global_batch": 12, "train_iterations": 1},
        "pools": [{"gpu": "A100-SXM-80GB", "count": 64}],
        "stages": [{"num_layers": 12, "tp": 8}] * 8, "mbs": 1}))
    cases.append(("gpt3-175b 8x12 plan", [str(plan)]))
    print(f"\n{'whole command':<22}{'wall s':>8}{'CPU s':>8}")
    for name, args in cases:
        wall, cpu = _timed(cli + args + ["-o", str(tmp / "out"), "--json"])
        print(f"{name:<22}{wall:>8.2f}{cpu:>8.2f}", flush=True)


if __name__ == "__main__":
    main()
