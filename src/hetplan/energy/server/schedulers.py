"""Schedulers: which frequency schedule a rank runs in a given iteration.

A *schedule* is the list of SM frequencies (MHz) of one stage's instructions in execution order, for one
iteration. Schedules are a pure function of the job spec, its state and the stored reports, so they survive
restarts. Three kinds (Perseus, SOSP'24, §5: profiling, then frequency plans from the frontier):

* ``online_profiling``: sweep ``frequencies_mhz`` (every instruction of every stage at the same frequency,
  ``iterations_per_frequency`` iterations each) while ranks report per-instruction time and energy; the mean
  per (stage, instruction, frequency) is the job's measured stage profile. Afterwards, if ``then`` is given,
  the frontier of that profile is computed once and the job continues as ``frontier_pick``; otherwise every
  instruction runs at the highest swept frequency.
* ``point_solution``: run the given plans in order, ``iterations_per_plan`` iterations each, then keep the last.
* ``frontier_pick``: from frontier points ``(time_s, energy_j, frequencies_mhz)`` run the one of least energy
  (idle power counted up to the target) that finishes within the target time; the target can be changed at
  run time (e.g. a straggler appeared).
"""

from __future__ import annotations

from typing import Any

from hetplan.energy.dag import instruction_name, stage_order
from hetplan.errors import HetplanError

KINDS = ("online_profiling", "point_solution", "frontier_pick")


def instructions(spec: dict, stage: int) -> list[str]:
    """``["forward:0", ...]``: the stage's instructions in execution order."""
    v = spec.get("virtual_stages", 1)
    return [instruction_name(k, m, c, v)
            for k, m, c in stage_order(spec["schedule"], spec["num_stages"], spec["num_microbatches"], stage, v)]


def validate_spec(spec: dict) -> None:
    """Check a job spec beyond its types (plan shapes, non-empty sweeps).

    Raises:
        HetplanError: with the offending field.
    """
    S, M = spec["num_stages"], spec["num_microbatches"]
    sch = spec["scheduler"]
    kind = sch["kind"]
    if kind in ("point_solution", "frontier_pick"):
        plans = sch.get("plans") or []
        if not plans:
            raise HetplanError("needs at least one plan", field="scheduler.plans", fix="give frequency plans")
        for i, p in enumerate(plans):
            f = p["frequencies_mhz"]
            if len(f) != S or any(len(x) != 2 * M for x in f):
                raise HetplanError(f"plan {i} must have {S} stages × {2 * M} frequencies",
                                   field=f"scheduler.plans[{i}].frequencies_mhz",
                                   fix="one frequency per forward/backward of every stage, in schedule order")
            if kind == "frontier_pick" and (p.get("time_s") is None or p.get("energy_j") is None):
                raise HetplanError(f"plan {i} needs time_s and energy_j", field=f"scheduler.plans[{i}]",
                                   fix="use the plans written by 'hetplan energy frontier'")
        if kind == "frontier_pick" and sch.get("target_time_s") is not None:
            check_target(plans, sch["target_time_s"], "scheduler.target_time_s")
    if kind == "online_profiling" and not sch.get("frequencies_mhz"):
        raise HetplanError("needs frequencies to sweep", field="scheduler.frequencies_mhz",
                           fix="list the SM frequencies (MHz) to profile, e.g. [1410, 1200, 1005]")


def check_target(plans: list[dict], target_time_s: float, field: str = "target_time_s") -> None:
    """Refuse a target time below every plan's time: no plan meets it, and :func:`pick_frontier_point` would run
    the fastest plan in its place without a word (the same refusal as
    :meth:`hetplan.energy.frontier.Frontier.index_for_time`).

    Raises:
        HetplanError: (``field``) the target is below the fastest plan's time.
    """
    fastest = min(p["time_s"] for p in plans)
    if target_time_s < fastest - 1e-12:
        raise HetplanError(f"no plan finishes within {target_time_s:.6g} s (the fastest takes {fastest:.6g} s)",
                           field=field, fix=f"give a target time >= {fastest:.6g} s")


def pick_frontier_point(plans: list[dict], target_time_s: float | None, num_stages: int, idle_power_w: float) -> int:
    """Index of the least-energy plan finishing within ``target_time_s`` (the fastest if none or no target)."""
    fastest = min(range(len(plans)), key=lambda i: plans[i]["time_s"])
    if target_time_s is None:
        return fastest
    ok = [i for i, p in enumerate(plans) if p["time_s"] <= target_time_s + 1e-12]
    if not ok:
        return fastest
    # energy + N·P_idle·(target - time): the N·P_idle·target term is the same for every plan, so it is left out;
    # with it, a target of 1e300 s rounded every plan's energy away (all equal: the first plan, not the least
    # energy) and 1e308 overflowed to inf
    return min(ok, key=lambda i: plans[i]["energy_j"] - num_stages * idle_power_w * plans[i]["time_s"])


def schedule_for(spec: dict, state: dict, stage: int, iteration: int) -> tuple[str, list[int]]:
    """``(schedule_id, frequencies_mhz)`` for ``stage`` in ``iteration``."""
    sch = spec["scheduler"]
    kind = sch["kind"]
    n = 2 * spec["num_microbatches"]
    if kind == "point_solution":
        plans = sch["plans"]
        k = min(iteration // max(sch.get("iterations_per_plan", 1), 1), len(plans) - 1)
        return f"plan-{k}", list(plans[k]["frequencies_mhz"][stage])
    if kind == "frontier_pick":
        k = pick_frontier_point(sch["plans"], state.get("target_time_s", sch.get("target_time_s")),
                                spec["num_stages"], sch.get("idle_power_w", 0.0))
        return f"frontier-{k}", list(sch["plans"][k]["frequencies_mhz"][stage])
    if kind == "online_profiling":
        freqs = sch["frequencies_mhz"]
        k = iteration // max(sch.get("iterations_per_frequency", 1), 1)
        if k < len(freqs):
            return f"profile-{freqs[k]}", [int(freqs[k])] * n
        if "frontier" in state:
            fr = state["frontier"]
            k = pick_frontier_point(fr["plans"], state.get("target_time_s"), spec["num_stages"], fr["idle_power_w"])
            return f"frontier-{k}", list(fr["plans"][k]["frequencies_mhz"][stage])
        return "max", [int(max(freqs))] * n
    raise HetplanError(f"unknown scheduler {kind!r}", field="scheduler.kind", fix=f"use one of {', '.join(KINDS)}")


def frontier_state_from_profile(spec: dict, rows: list[tuple], then: dict[str, Any]) -> dict:
    """Compute the frontier of a measured profile and turn it into ``frontier_pick`` state.

    Args:
        rows: ``(stage, instruction, frequency_mhz, time_s, energy_j, samples)`` from the store.
        then: ``{"idle_power_w", "unit_time_s", "target_time_s" | None, "slowdown" | None}``.

    Raises:
        HetplanError: the measured profile is incomplete or invalid.
    """
    from hetplan.energy.baselines import all_max
    from hetplan.energy.frontier import compute_frontier
    from hetplan.energy.profile import parse_stage_profile

    text = "stage,instruction,frequency,time,energy\n" + "".join(
        f"{s},{i},{f},{t!r},{e!r}\n" for s, i, f, t, e, _ in rows)
    prof = parse_stage_profile(text, source="measured profile")
    if prof.num_stages != spec["num_stages"]:
        raise HetplanError(f"measured {prof.num_stages} stages, job has {spec['num_stages']}", field="measurements",
                           fix="every stage must report per-instruction measurements while profiling")
    fr = compute_frontier(prof, spec["num_microbatches"], then["idle_power_w"], then.get("unit_time_s", 0.001),
                          spec["schedule"])
    plans = [{"time_s": float(fr.time_s[i]), "energy_j": float(fr.energy_j[i]),
              "frequencies_mhz": fr.plan(i).frequencies_mhz} for i in range(len(fr))]
    target = then.get("target_time_s")
    if target is None:
        target = all_max(prof, fr.dag, then["idle_power_w"]).time_s * float(then.get("slowdown") or 1.0)
    return {"frontier": {"plans": plans, "idle_power_w": then["idle_power_w"]}, "target_time_s": target,
            "profile_csv": text}
