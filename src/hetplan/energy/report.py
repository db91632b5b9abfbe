"""Summaries of a frontier: energy saved at full speed and under a straggler, baselines, plot.

*Energy saved at the all-max iteration time* (Perseus §2.2, "intrinsic energy bloat"): replay the all-max
plan on the measured profile to get its time ``T_max`` and energy; take the frontier point of least energy
whose replay takes at most ``T_max`` (within :data:`SAME_TIME_TOLERANCE`; idle power counted up to the later of
the two times); the saving is the difference of the two replays.

*Straggler* (Perseus §2.3, "extrinsic energy bloat"): when another pipeline is slower by a factor ``k``
(``T' = k · T_max``), all-max would finish early and idle until ``T'``; Perseus instead picks the plan of
least energy whose replay finishes by ``T'``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from hetplan.energy import baselines as B
from hetplan.energy.frontier import Frontier
from hetplan.errors import HetplanError


#: An ``energy_source`` (:func:`hetplan.energy.job.plan_energy`, the serving simulator's) in words, for output.
ENERGY_SOURCE_WORDS = {"dvfs-model": "fitted DVFS power model",
                       "dvfs-physics": "DVFS power model transferred, not fitted",
                       "tdp": "TDP while busy: an upper bound"}


#: "The same iteration time": a frontier plan's replay may exceed all-max's by this fraction (time is floored to
#: the unit in the planner, so its plans replay slower; at 1 ms on an interleaved A100 plan even the fastest point
#: replayed 0.5 % slower than all-max, docs/energy.md).
SAME_TIME_TOLERANCE = 0.01


def best_plan_within(frontier: Frontier, deadline_s: float, tolerance: float = 0.0) -> dict | None:
    """The frontier plan of least energy (idle-padded to ``deadline_s``) whose replayed time fits the deadline.

    The candidates are the planner's frontier points planned within the deadline, ranked by their planned energy,
    as Perseus picks (§4.4). Quantization floors every instruction's time to the unit, so a point replays on the
    measured profile slower than planned (0.1–0.7 % on the reference profiles; 2.6 % on an interleaved H100 plan
    of 256 instructions, where the point planned at the all-max time replayed 2 % slower than all-max); the first
    candidate whose replay fits ``deadline_s · (1 + tolerance)`` is taken, and its energy is counted on its replay.

    Returns:
        ``{"index", "time_s", "energy_j", "replay_time_s", "replay_energy_j", "deadline_s",
        "energy_at_deadline_j"}``: planned (quantized) time and model energy, the replay's time and energy, the
        later of ``deadline_s`` and the replay's time, and the replay's energy idle-padded to it (s, J); None when
        no point's replay is fast enough.
    """
    S, P = frontier.dag.num_stages, frontier.idle_power_w
    t, e = frontier.time_s, frontier.energy_j
    limit = deadline_s * (1 + tolerance) + 1e-12
    ok = np.nonzero(t <= deadline_s + 1e-12)[0]
    padded = e[ok] + S * P * (deadline_s - t[ok])
    for i in ok[np.argsort(padded, kind="stable")]:
        rt, re = frontier.simulate(int(i))
        if rt <= limit:
            end = max(deadline_s, rt)
            return {"index": int(i), "time_s": float(t[i]), "energy_j": float(e[i]),
                    "replay_time_s": rt, "replay_energy_j": re, "deadline_s": end,
                    "energy_at_deadline_j": B.energy_at(rt, re, end, S, P)}
    return None


def _replayed(frontier: Frontier, index: int) -> dict:
    """Point ``index``: ``{"index", "time_s", "energy_j", "replay_time_s", "replay_energy_j"}`` (planned, replayed)."""
    rt, re = frontier.simulate(index)
    return {"index": index, "time_s": float(frontier.time_s[index]), "energy_j": float(frontier.energy_j[index]),
            "replay_time_s": rt, "replay_energy_j": re}


#: Largest straggler slowdown: a rank 100x slower than all-max is a failed GPU, not a straggler; the idle energy
#: of a 1e307x longer wait overflowed to Infinity / NaN in summary.json (fuzz).
MAX_STRAGGLER_SLOWDOWN = 100.0
_STRAGGLER_WHY = "a rank 100x slower than the others is a failure, not a straggler"


def summarize(frontier: Frontier, *, straggler_slowdown: float | None = None, baselines: bool | dict = True) -> dict:
    """A JSON-able summary: points, planner time, savings at max speed and under a straggler, baselines
    (``baselines``: True computes them, a dict from :func:`~hetplan.energy.baselines.summary_entries` is used as
    it is, False leaves them out).

    Raises:
        HetplanError: ``straggler_slowdown`` < 1.
    """
    dag, prof, P = frontier.dag, frontier.profile, frontier.idle_power_w
    S = dag.num_stages
    mx = B.all_max(prof, dag, P)
    out: dict = {
        "num_stages": S,
        "num_microbatches": dag.num_microbatches,
        "schedule": dag.schedule,
        "unit_time_s": frontier.unit_time_s,
        "idle_power_w": P,
        "points": len(frontier),
        "pareto_points": int(frontier.pareto_indices().size),
        "min_time_s": float(frontier.time_s.min()),
        "max_time_s": float(frontier.time_s.max()),
        "min_energy_j": float(frontier.energy_j.min()),
        "planner_time_s": frontier.result.planner_time_s,
        "stop_reason": frontier.result.stop_reason,
        "all_max": {"time_s": mx.time_s, "energy_j": mx.energy_j},
        "fastest": _replayed(frontier, int(frontier.time_s.argmin())),
        "least_energy": _replayed(frontier, int(frontier.energy_j.argmin())),
    }
    best = best_plan_within(frontier, mx.time_s, SAME_TIME_TOLERANCE)
    if best is not None:  # both idle-padded to the later of the two times
        base = B.energy_at(mx.time_s, mx.energy_j, best["deadline_s"], S, P)
        best["saved_j"] = base - best["energy_at_deadline_j"]
        best["saved_fraction"] = best["saved_j"] / base
    out["at_max_speed"] = best
    out["energy_saved_at_max_speed_j"] = None if best is None else best["saved_j"]
    if straggler_slowdown is not None:
        if not 1.0 <= straggler_slowdown <= MAX_STRAGGLER_SLOWDOWN:
            raise HetplanError(f"straggler slowdown must be from 1 to {MAX_STRAGGLER_SLOWDOWN:g}, got "
                               f"{straggler_slowdown}: {_STRAGGLER_WHY}", field="--straggler-slowdown",
                               fix="use e.g. 1.2 for a straggler 20 % slower than all-max")
        deadline = straggler_slowdown * mx.time_s
        base = B.energy_at(mx.time_s, mx.energy_j, deadline, S, P)
        sb = best_plan_within(frontier, deadline)
        if sb is not None:
            sb["slowdown"] = straggler_slowdown
            sb["straggler_time_s"] = deadline
            sb["all_max_energy_j"] = base
            sb["saved_j"] = base - sb["energy_at_deadline_j"]
            sb["saved_fraction"] = sb["saved_j"] / base
        out["straggler"] = sb
    if baselines is True:
        out.update(B.summary_entries(prof, dag, P))
    elif baselines:  # computed elsewhere (baselines.summary_entries_in_background)
        out.update(baselines)
    return out


def plot_frontier(frontier: Frontier, path: str | Path, summary: dict | None = None) -> Path | None:
    """Draw the frontier (and baselines from ``summary``) to ``path``; None when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # pragma: no cover - plot extra missing
        return None
    fig, ax = plt.subplots(figsize=(7, 5), tight_layout=True)
    ax.plot(frontier.time_s, frontier.energy_j, "-", color="tab:blue", lw=1.5, label="Perseus frontier (model)")
    if summary:
        mx = summary["all_max"]
        ax.plot([mx["time_s"]], [mx["energy_j"]], "ks", label="all-max (replayed)")
        if summary.get("at_max_speed"):
            b = summary["at_max_speed"]
            ax.plot([b["time_s"]], [b["energy_j"]], "b*", ms=12, label="Perseus plan at all-max time")
        if summary.get("envpipe"):
            ax.plot([summary["envpipe"]["time_s"]], [summary["envpipe"]["energy_j"]], "r^", label="EnvPipe")
        for key, style, label in (("zeus_global", "o", "ZeusGlobal"), ("zeus_per_stage", "x", "ZeusPerStage")):
            pts = summary.get(key) or []
            if pts:
                ax.plot([p["time_s"] for p in pts], [p["energy_j"] for p in pts], style, ms=4, alpha=0.6, label=label)
        if summary.get("straggler"):
            s = summary["straggler"]
            ax.axvline(s["straggler_time_s"], color="gray", ls="--", lw=1, label=f"straggler ×{s['slowdown']:g}")
    ax.set_xlabel("iteration time (s)")
    ax.set_ylabel("iteration energy (J)")
    ax.set_title(f"{frontier.dag.num_stages} stages × {frontier.dag.num_microbatches} micro-batches, {frontier.dag.schedule}")
    ax.legend(fontsize=8)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)
