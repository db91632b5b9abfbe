"""Baselines the Perseus frontier is compared against, replayed on the measured profile.

All results are ``(time_s, energy_j)`` per iteration from :func:`~hetplan.energy.simulate.simulate_plan`
(measured times and energies, idle power for the time a GPU does not compute).

* **all-max**: every instruction at the highest profiled frequency (what training does by default).
* **ZeusGlobal** (Zeus, You et al., NSDI'23): ONE frequency for every GPU and instruction; we sweep all
  profiled frequencies; the curve's points are the options Zeus chooses from.
* **ZeusPerStage**: one frequency per stage (all its instructions). For each frequency ``f`` of the heaviest
  stage (largest forward+backward time at max frequency), every other stage takes its least-energy frequency
  whose forward+backward time is no longer than the heaviest stage's at ``f`` (balancing stage times, as in
  Perseus' ZeusPerStage baseline, §6.1).
* **EnvPipe** (Choi et al., ATC'23): keep the all-max iteration time; instructions on the pipeline's outer
  envelope run at the highest frequency, the others start at their lowest Pareto-optimal frequency and are
  raised, cheapest energy per second gained first, until the iteration is as fast as all-max (see
  :func:`envpipe`). On ``envpipe_result.csv`` this matches within 0.6 % (see docs/energy.md).
"""

from __future__ import annotations

import multiprocessing as mp
import os
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

import numpy as np

from hetplan.energy.dag import KIND_NAMES, CriticalPath, PipelineDAG, build_pipeline_dag
from hetplan.energy.options import pareto_mask
from hetplan.energy.profile import StageProfile
from hetplan.energy.simulate import longest_path_s, simulate_plan


@dataclass(frozen=True)
class BaselinePoint:
    """One baseline operating point.

    Attributes:
        name: baseline name. time_s, energy_j: per iteration (measured profile). frequency_mhz: shape (n,).
    """

    name: str
    time_s: float
    energy_j: float
    frequency_mhz: np.ndarray


def _max_freqs(profile: StageProfile, dag: PipelineDAG) -> np.ndarray:
    return np.array([profile.get(int(dag.stage[i]), KIND_NAMES[dag.kind[i]]).max_frequency_mhz
                     for i in range(dag.num_ops)], np.int64)


def all_max(profile: StageProfile, dag: PipelineDAG, idle_power_w: float) -> BaselinePoint:
    """Every instruction at its highest profiled frequency."""
    f = _max_freqs(profile, dag)
    t, e = simulate_plan(profile, dag, f, idle_power_w)
    return BaselinePoint("all-max", t, e, f)


def zeus_global(profile: StageProfile, dag: PipelineDAG, idle_power_w: float) -> list[BaselinePoint]:
    """One frequency for everything, for every frequency profiled on all stages (fastest first)."""
    common = None
    for p in profile.entries.values():
        fs = {int(x) for x in p.frequency_mhz}
        common = fs if common is None else common & fs
    out = []
    for f in sorted(common or (), reverse=True):
        freq = np.full(dag.num_ops, f, np.int64)
        t, e = simulate_plan(profile, dag, freq, idle_power_w)
        out.append(BaselinePoint(f"zeus-global@{f}", t, e, freq))
    return out


def zeus_per_stage(profile: StageProfile, dag: PipelineDAG, idle_power_w: float) -> list[BaselinePoint]:
    """One frequency per stage, balancing every stage to the heaviest stage's speed (fastest first)."""
    S = dag.num_stages

    def fb(stage: int) -> dict[int, tuple[float, float]]:
        fw, bw = profile.get(stage, "forward"), profile.get(stage, "backward")
        out = {}
        for f in {int(x) for x in fw.frequency_mhz} & {int(x) for x in bw.frequency_mhz}:
            tf, ef = fw.at_frequency(f)
            tb, eb = bw.at_frequency(f)
            out[f] = (tf + tb, ef + eb)
        return out

    tables = [fb(s) for s in range(S)]
    heavy = max(range(S), key=lambda s: tables[s][max(tables[s])][0])
    points = []
    for f_heavy in sorted(tables[heavy], reverse=True):
        budget = tables[heavy][f_heavy][0]
        per_stage = []
        for s in range(S):
            if s == heavy:
                per_stage.append(f_heavy)
                continue
            # least energy (counting idle power while waiting for the heaviest stage) within the budget
            fits = [(e + idle_power_w * (budget - t), f) for f, (t, e) in tables[s].items() if t <= budget + 1e-12]
            per_stage.append(min(fits)[1] if fits else max(tables[s]))
        freq = np.array([per_stage[int(s)] for s in dag.stage], np.int64)
        t, e = simulate_plan(profile, dag, freq, idle_power_w)
        points.append(BaselinePoint(f"zeus-per-stage@{f_heavy}", t, e, freq))
    return points


def envelope_mask(dag: PipelineDAG) -> np.ndarray:
    """shape (n,) bool: the pipeline's outer envelope (EnvPipe, ATC'23, §3): the first forward of every stage,
    every instruction of the last stage, and the last backward of every stage."""
    S, M = dag.num_stages, dag.num_microbatches
    last_b = 0 if dag.schedule == "gpipe" else M - 1
    return (dag.stage == S - 1) | ((dag.kind == 0) & (dag.microbatch == 0)) | ((dag.kind == 1) & (dag.microbatch == last_b))


def envpipe(profile: StageProfile, dag: PipelineDAG, idle_power_w: float, tolerance_s: float = 1e-9) -> BaselinePoint:
    """EnvPipe-style plan (Choi et al., ATC'23, §4): keep the all-max iteration time, slow everything else.

    Envelope instructions (:func:`envelope_mask`) stay at the highest frequency; every other instruction
    starts at its lowest Pareto-optimal frequency. While the iteration is slower than all-max, the critical
    instruction whose next faster frequency costs the least energy per second gained (idle power counted) is
    raised one step. Measured times and energies throughout. Cost: one raise per step (~19,000 on 16 × 64),
    each an incremental critical-path update (:class:`~hetplan.energy.dag.CriticalPath`, at most O(n)) and
    O(n) array work.
    """
    n = dag.num_ops
    cache: dict[tuple[int, int], tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
    ladders = []  # per instruction: max frequency then lower Pareto-optimal ones, descending frequency
    for i in range(n):
        key = (int(dag.stage[i]), int(dag.kind[i]))
        if key not in cache:
            p = profile.get(key[0], KIND_NAMES[key[1]])
            m = pareto_mask(p.time_s, p.energy_j)
            m[p.frequency_mhz == p.frequency_mhz.max()] = True
            o = np.argsort(-p.frequency_mhz[m], kind="stable")
            cache[key] = (p.frequency_mhz[m][o], p.time_s[m][o], p.energy_j[m][o])
        ladders.append(cache[key])
    width = max(lad[0].size for lad in ladders)
    F = np.zeros((n, width), np.int64)
    Tm = np.full((n, width), np.inf)
    Em = np.full((n, width), np.inf)
    size = np.empty(n, np.int64)
    for i, (f, t, e) in enumerate(ladders):
        size[i] = f.size
        F[i, : f.size], Tm[i, : f.size], Em[i, : f.size] = f, t, e
    rows = np.arange(n)
    T0, _, _ = longest_path_s(dag, Tm[:, 0])
    level = np.where(envelope_mask(dag), 0, size - 1)
    eff = np.where(np.isfinite(Tm), Em - idle_power_w * np.where(np.isfinite(Tm), Tm, 0.0), np.inf)  # above idling
    # energy per second gained by raising an instruction from ladder step l to l - 1 (inf at the top: it cannot)
    rate = np.full((n, width), np.inf)
    with np.errstate(invalid="ignore"):  # the padding beyond a ladder's end (inf - inf) is never read
        dt = Tm[:, 1:] - Tm[:, :-1]
        de = eff[:, :-1] - eff[:, 1:]
        rate[:, 1:] = np.where(dt > 0, de / np.where(dt > 0, dt, 1.0), -np.inf)
    now = rate[rows, level]
    dur = Tm[rows, level]
    path = CriticalPath(dag, dur) if dag.topo_pairs is not None else None
    while True:
        T, ef, ls = longest_path_s(dag, dur) if path is None else path.times()
        if T <= T0 + tolerance_s:
            break
        r = np.where(ls - (ef - dur) < tolerance_s, now, np.inf)  # critical instructions that can still be raised
        v = int(np.argmin(r))
        if r[v] == np.inf:  # pragma: no cover - envelope at max frequency always reaches T0
            break
        level[v] -= 1
        now[v] = rate[v, level[v]]
        dur[v] = Tm[v, level[v]]
        if path is not None:
            path.set(v, float(dur[v]))
    freq = F[rows, level]
    t, e = simulate_plan(profile, dag, freq, idle_power_w)
    return BaselinePoint("envpipe", t, e, freq)


def summary_entries(profile: StageProfile, dag: PipelineDAG, idle_power_w: float) -> dict:
    """The baselines as the energy summary reports them: ``{"envpipe": {time_s, energy_j}, "zeus_global":
    [{frequency_mhz, time_s, energy_j}], "zeus_per_stage": [{name, time_s, energy_j}]}``."""
    env = envpipe(profile, dag, idle_power_w)
    return {
        "envpipe": {"time_s": env.time_s, "energy_j": env.energy_j},
        "zeus_global": [{"frequency_mhz": int(b.frequency_mhz[0]), "time_s": b.time_s, "energy_j": b.energy_j}
                        for b in zeus_global(profile, dag, idle_power_w)],
        "zeus_per_stage": [{"name": b.name, "time_s": b.time_s, "energy_j": b.energy_j}
                           for b in zeus_per_stage(profile, dag, idle_power_w)],
    }


def _summary_entries_of(profile: StageProfile, shape: tuple[int, int, str, int], idle_power_w: float) -> dict:
    return summary_entries(profile, build_pipeline_dag(*shape), idle_power_w)


def summary_entries_in_background(profile: StageProfile, dag: PipelineDAG, idle_power_w: float) -> Callable[[], dict]:
    """Start :func:`summary_entries` in a child process; return a function that waits for its result.

    The baselines do not depend on the frontier, so ``hetplan energy frontier`` computes them on the second
    core while the solver runs on the first (16 × 64: EnvPipe takes a third of the command's CPU time). Where
    the OS cannot fork or there is one CPU, the returned function computes them when called. If the child
    fails, the function computes them in this process, so that the error is raised here as it would be without
    a child.
    """
    if "fork" not in mp.get_all_start_methods() or (os.cpu_count() or 1) < 2:
        return lambda: summary_entries(profile, dag, idle_power_w)
    pool = ProcessPoolExecutor(1, mp_context=mp.get_context("fork"))
    shape = (dag.num_stages, dag.num_microbatches, dag.schedule, dag.virtual_stages)
    job = pool.submit(_summary_entries_of, profile, shape, idle_power_w)  # the DAG is rebuilt there (cheap)

    def wait() -> dict:
        try:
            return job.result()
        except Exception:  # noqa: BLE001 - any failure over there: compute here, raising what it raises
            return summary_entries(profile, dag, idle_power_w)
        finally:
            pool.shutdown()

    return wait


def energy_at(time_s: float, energy_j: float, deadline_s: float, num_stages: int, idle_power_w: float) -> float:
    """Energy of a point that finishes at ``time_s`` and then idles until ``deadline_s`` (J)."""
    return energy_j + num_stages * idle_power_w * max(deadline_s - time_s, 0.0)
