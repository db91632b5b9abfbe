"""Why the winner won and what held the others back, in sentences.

For two configurations the reason is read off their time breakdown (:data:`hetplan.search.homogeneous.COMPONENTS`):
the component whose share of the iteration grew the most against the winner (pipeline bubble, TP communication,
exposed DP synchronisation, compute including recomputation, ...), together with the dimensions that differ; where
no share grew by :data:`SAME_SHARE`, the MFU of each (the same work run more slowly per GPU); on another GPU type,
each one's price per GPU-hour, GPU count and iteration time (what the job's $ is the product of).
Also reported: of the configurations that would beat the winner but do not fit in memory, the one that misses by
the least, and the best
configuration for each other value of TP, PP, micro-batch size, recomputation, ZeRO stage and GPU type.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from hetplan.search.homogeneous import COMPONENTS, PoolResult
from hetplan.search.objective import rank_keys
from hetplan.search.space import RECOMPUTE_NAMES

GIB = 2**30
COMPONENT_NAMES = {
    "compute_s": "compute (incl. recomputation)",
    "tp_comm_s": "TP communication",
    "bubble_s": "pipeline bubble",
    "p2p_s": "pipeline p2p transfers",
    "dp_exposed_s": "exposed DP gradient sync",
    "optimizer_s": "optimizer step",
}
DIMENSIONS = ("tp", "pp", "dp", "mbs", "zero", "recompute", "virtual_stages", "cp", "ep")


def component_name(key: str, *rows: dict) -> str:
    """The reader's name of a breakdown component; ``tp_comm_s`` holds the MoE all-to-all as well
    (:class:`hetplan.estimate.stage.StageCost`), so it reads "TP/EP communication" where a row has EP > 1."""
    if key == "tp_comm_s" and any(r.get("ep", 1) > 1 for r in rows):
        return "TP/EP communication"
    return COMPONENT_NAMES[key]


def _row(results: list[PoolResult], cat, idx: int, exact_time_s: float | None = None) -> dict:
    """One configuration as a dict; ``exact_time_s`` (from estimate()) replaces the closed-form time if given,
    the closed-form breakdown still gives the shares of each component."""
    res = results[cat["pool"][idx]]
    r = int(cat["row"][idx])
    out: dict[str, Any] = {k: int(v[r]) for k, v in res.config.items()}
    out["gpu"] = res.gpu.name
    out["num_gpus"] = int(res.num_gpus[r])
    out["closed_form_time_s"] = float(res.iteration_time_s[r])
    out["iteration_time_s"] = float(res.iteration_time_s[r]) if exact_time_s is None else exact_time_s
    out["components"] = {k: float(v[r]) for k, v in res.components.items()}
    out["memory_total"] = float(res.memory["total"][r])
    out["memory_capacity"] = float(res.gpu.memory_bytes)
    out["usd_per_hour"] = float(res.usd_per_hour[r])
    out["mfu"] = float(res.mfu[r])
    return out


def describe(c: dict) -> str:
    """Short text of a configuration: ``A100-SXM-80GB x64 tp=2 pp=1 dp=32 mbs=1 zero=1 recompute=none``."""
    return (
        f"{c['gpu']} x{c['num_gpus']} tp={c['tp']} pp={c['pp']} dp={c['dp']} mbs={c['mbs']} zero={c['zero']} "
        f"recompute={RECOMPUTE_NAMES[c['recompute']]}" + (f" interleaved v={c['virtual_stages']}" if c["virtual_stages"] > 1 else "")
        + "".join(f" {d}={c[d]}" for d in ("cp", "ep") if c.get(d, 1) > 1)
    )


def why_behind(loser: dict, winner: dict, goal: str) -> str:
    """One sentence: how much worse ``loser`` is than ``winner`` and the component that explains it."""
    share = lambda c, k: c["components"][k] / c["closed_form_time_s"]  # noqa: E731
    shares = {k: share(loser, k) - share(winner, k) for k in COMPONENTS}
    key = max(shares, key=lambda k: shares[k])
    diffs = [f"{d} {loser[d] if d != 'recompute' else RECOMPUTE_NAMES[loser[d]]} vs "
             f"{winner[d] if d != 'recompute' else RECOMPUTE_NAMES[winner[d]]}"
             for d in DIMENSIONS if loser[d] != winner[d]]
    if loser["gpu"] != winner["gpu"]:
        diffs.insert(0, f"{loser['gpu']} vs {winner['gpu']}")
    lc = loser["usd_per_hour"] * loser["iteration_time_s"]
    wc = winner["usd_per_hour"] * winner["iteration_time_s"]
    # A free winner (price 0) makes the relative $ difference 0 (both free) or unbounded.
    d_usd = lc / wc - 1 if wc > 0 else (0.0 if lc == 0 else math.inf)
    d_time = loser["iteration_time_s"] / winner["iteration_time_s"] - 1
    suffix = f" ({', '.join(diffs)})" if diffs else ""
    if abs(d_usd) < 1e-3 and abs(d_time) < 1e-3:
        more = loser["memory_total"] > winner["memory_total"]
        mem = (f", needs more memory per GPU ({loser['memory_total'] / GIB:.1f} vs {winner['memory_total'] / GIB:.1f} GiB)"
               if more else "")
        return f"ties with #1 on time and ${mem}" + suffix
    if goal == "cheapest" and abs(d_usd) < 1e-3:
        return (f"same $ as #1 within 0.1 %, iteration {loser['iteration_time_s']:.2f} s instead of "
                f"{winner['iteration_time_s']:.2f} s" + suffix)
    if goal != "cheapest" and abs(d_time) < 1e-3:
        return f"same time as #1 within 0.1 %, {d_usd:+.1%} $" + suffix
    head = (("costs $ where #1 is free" if math.isinf(d_usd) else f"{d_usd:+.1%} $ for the job") if goal == "cheapest"
            else f"{d_time:+.1%} iteration time")
    if loser["gpu"] != winner["gpu"]:  # price and speed of another GPU: $ = $/GPU-h x GPUs x time
        def on(c: dict) -> str:
            return (f"{c['num_gpus']}x {c['gpu']} at ${c['usd_per_hour'] / c['num_gpus']:.2f}/GPU-h, "
                    f"{c['iteration_time_s']:.2f} s per iteration")
        rest = [d for d in diffs if not d.startswith(f"{loser['gpu']} vs ")]
        return f"{head}: {on(loser)} vs {on(winner)}" + (f" ({', '.join(rest)})" if rest else "")
    if shares[key] < SAME_SHARE:  # the same breakdown: each GPU does the same work more slowly (MFU)
        gpus = (f" on {loser['num_gpus']} vs {winner['num_gpus']} GPUs"
                if loser["num_gpus"] != winner["num_gpus"] else "")
        return f"{head}: MFU {_mfu(loser):.1%} vs {_mfu(winner):.1%}{gpus}, the same time breakdown" + suffix
    text = (f"{head}: {component_name(key, loser, winner)} {share(loser, key):.0%} of the iteration vs "
            f"{share(winner, key):.0%}")
    return text + suffix


#: A rise in a component's share of the iteration below which two breakdowns count as the same (1 percentage
#: point): the difference is then in how fast each GPU runs the same work, said as MFU, not as "100 % vs 100 %".
SAME_SHARE = 0.01


def _mfu(c: dict) -> float:
    """MFU of a :func:`_row` at its (exact where given) iteration time: the closed form's MFU scaled by
    closed-form time / time (the model FLOPs and GPUs are the same)."""
    return c["mfu"] * c["closed_form_time_s"] / c["iteration_time_s"]


def explain_ranking(objective, results, cat, ranked, ranked_idx, skipped, best_among, estimate_row,
                    seq_len: int | None = None) -> list[str]:
    """Fill ``ranked[k].reason`` and return the explanation lines (see module doc). Every figure in them is
    :func:`~hetplan.estimate.estimator.estimate`'s, like the table's.

    Args:
        ranked_idx: row indices (into ``cat``) of the ranked plans.
        best_among: ``best_among(mask)`` -> ``(row, Estimate)`` of the best plan by the objective among the rows
            where ``mask`` is true, found exactly (the planner's lower-bound-guarded walk), or ``None``.
        estimate_row: ``estimate_row(row)`` -> the :class:`~hetplan.estimate.estimator.Estimate` of one row.
        seq_len: the job's sequence length, named when CP is explained.
    """
    goal = objective.goal
    win_idx = int(ranked_idx[0])
    winner = _row(results, cat, win_idx, ranked[0].estimate.iteration_time_s)
    comp = winner["components"]
    it = winner["closed_form_time_s"]
    top = sorted(comp, key=comp.get, reverse=True)
    ranked[0].reason = (
        f"best {'job $' if goal == 'cheapest' else 'job time'}; MFU {ranked[0].estimate.mfu:.1%}; "
        + ", ".join(f"{component_name(k, winner)} {comp[k] / it:.0%}" for k in top[:3])
    )
    for k, rp in enumerate(ranked[1:], start=1):
        rp.reason = why_behind(_row(results, cat, int(ranked_idx[k]), rp.estimate.iteration_time_s), winner, goal)
    lines = [f"#1 {describe(winner)}: {ranked[0].reason}."]
    # Of the plans that would beat the winner and meet the deadline/budget but do not fit in memory, the one that
    # misses by the least (chosen on the closed form, reported with its estimate).
    key = _unconstrained_key(goal, cat)
    better_no_fit = np.flatnonzero(~cat["fits"] & _meets_constraint(objective, cat) & (key < key[win_idx]))
    if len(better_no_fit):
        capacity = np.array([r.gpu.memory_bytes for r in results], dtype=float)[cat["pool"][better_no_fit]]
        j = int(better_no_fit[np.argmin(cat["memory_total"][better_no_fit] / capacity)])
        est = estimate_row(j)
        c = _row(results, cat, j, est.iteration_time_s)
        gain = 1 - (est.usd_per_iteration if goal == "cheapest" else est.iteration_time_s) / (
            ranked[0].estimate.usd_per_iteration if goal == "cheapest" else ranked[0].estimate.iteration_time_s)
        if gain > 0:
            lines.append(
                f"Stopped by memory: {describe(c)} would be {gain:.{0 if gain >= 0.1 else 1}%} "
                f"{'cheaper' if goal == 'cheapest' else 'faster'}"
                f" but needs {c['memory_total'] / GIB:.1f} GiB per GPU > {c['memory_capacity'] / GIB:.1f} GiB."
            )
    # Best alternative for every other value of each dimension, by estimate() (an exact walk per dimension).
    dims = {d: np.concatenate([r.config[d] for r in results]) for d in DIMENSIONS}
    # another GPU type, and another pool of the winner's type (two H100 pools at two prices: the other pool's
    # plan was called "Best with another GPU type: H100-SXM x4")
    names = np.array([r.gpu.name for r in results])[cat["pool"]]
    dims["gpu"] = names
    masks = {"pool": (cat["pool"] != cat["pool"][win_idx]) & (names == names[win_idx])}
    for d, values in [*dims.items(), ("pool", cat["pool"])]:
        found = best_among(masks.get(d, values != values[win_idx]))
        if found is None:
            continue
        j, est = found
        c = _row(results, cat, j, est.iteration_time_s)
        label = {"gpu": "GPU type", "recompute": "recomputation", "mbs": "micro-batch size", "pool": "pool of the same GPU type",
                 "virtual_stages": "interleaving (virtual stages)"}.get(d, d.upper() if d != "zero" else "ZeRO stage")
        lines.append(f"Best with another {label}: {describe(c)}: {why_behind(c, winner, goal)}.")
    lines.extend(_why_split(goal, results, cat, winner, dims, estimate_row, seq_len))
    lines.extend(skipped)
    return lines


def _why_split(goal, results, cat, winner, dims, estimate_row, seq_len) -> list[str]:
    """Why the winner uses CP > 1 or EP > 1: no plan at degree 1 fits (the smallest footprint there against the
    GPU memory), or the best plan at degree 1 (by the closed form; its figures by estimate()) is slower or dearer
    (by how much and why)."""
    out = []
    for d, name in (("cp", "CP"), ("ep", "EP")):
        if winner.get(d, 1) == 1 or d not in dims:
            continue
        at_one = dims[d] == 1
        if not at_one.any():
            continue
        fitting = np.flatnonzero(at_one & cat["fits"])
        what = f"seq {seq_len}" if d == "cp" and seq_len else "the model"
        if not len(fitting):
            capacity = np.array([r.gpu.memory_bytes for r in results], dtype=float)[cat["pool"]]
            idx = np.flatnonzero(at_one)
            j = int(idx[np.argmin(cat["memory_total"][idx] / capacity[idx])])
            c = _row(results, cat, j)
            out.append(f"{name} {winner[d]} because {what} does not fit at {name} 1: "
                       f"{c['memory_total'] / GIB:.0f} GiB > {c['memory_capacity'] / GIB:.0f} GiB per GPU at best "
                       f"({describe(c)}).")
        else:  # the best at degree 1 by the closed form, reported with its estimate
            j = int(fitting[np.argmin(_unconstrained_key(goal, cat)[fitting])])
            c = _row(results, cat, j, estimate_row(j).iteration_time_s)
            out.append(f"{name} {winner[d]} because at {name} 1 the best plan ({describe(c)}) is behind: "
                       f"{why_behind(c, winner, goal)}.")
    return out


def _meets_constraint(objective, cat) -> np.ndarray:
    """The ranking's constraints (iteration SLO, deadline, budget: :func:`hetplan.search.objective.rank_keys`) on
    the closed-form times, memory ignored. It tested the deadline of ``cheapest`` and the budget of ``budget``
    only, so a plan stopped by memory could be offered that missed the SLO or another goal's deadline."""
    job_time = cat["iteration_time_s"] * cat["iterations"]
    key, _ = rank_keys(objective, job_time, cat["usd_per_hour"] * job_time / 3600, np.ones(len(job_time), dtype=bool),
                       iteration_time_s=cat["iteration_time_s"])
    return np.isfinite(key)


def _unconstrained_key(goal: str, cat) -> np.ndarray:
    """The objective without memory or deadline/budget constraints: job $ (cheapest) or iteration time."""
    if goal == "cheapest":
        return cat["usd_per_hour"] * cat["iteration_time_s"]
    return cat["iteration_time_s"]
