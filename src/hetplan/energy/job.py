"""Energy of a whole plan: joules per iteration and kWh per job at the top clock, what Perseus' frontier
removes at the same iteration time, electricity $, and the time–$–energy Pareto frontier of several plans.

Per iteration, at the top clock, every GPU of stage ``s`` (``n_s = tp·cp·dp`` of them, :attr:`hetplan.degrees.Degrees.gpus_per_stage`) runs its ``M·v``
forward and backward instructions (energy from the model-derived profile, :mod:`hetplan.energy.model`) and
draws its blocking power ``P_idle`` for the rest of the estimator's iteration time (pipeline bubble, exposed
DP synchronisation, optimizer step — counted as waiting, a small underestimate for the optimizer step):

    E_iteration = Σ_s n_s · [ M·v·(E_F,s + E_B,s) + P_idle,s · (T_iteration - M·v·(t_F,s + t_B,s)) ]
    job kWh     = E_iteration · iterations / 3.6e6

*What Perseus removes*: of the frontier plans of the plan's pipeline (one GPU per stage;
:mod:`hetplan.energy.frontier`) whose replay on the profile (unquantized) is not slower than all-max, the
least energy against all-max's, both idle-padded to the later of their times (so time quantization cannot
pass for a saving; "not slower" within :data:`SAME_TIME_TOLERANCE`), scaled by the mean GPUs per stage
(``N / S``; exact when every stage has the same ``n_s``). The planner's time unit is coarser here (1/1000 of
the pipeline time, at most 1/30 of the shortest instruction, and no finer than keeps steps × instructions within
:data:`FRONTIER_WORK` while the unit is under 1/4 of the shortest instruction: the solver takes at most one step per quantum of the pipeline time and each step is O(n),
docs/energy.md) so that a plan costs about a second at most, whatever its size; ``hetplan energy frontier``
plans at 1 ms. Every plan with a DVFS model gets its saving (``None`` only for ``energy_source = "tdp"``).

GPUs without a DVFS model (:func:`hetplan.hardware.power.get_power`) are charged their TDP while computing
and get no frontier (``energy_source = "tdp"``).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from hetplan.energy.model import plan_stage_profile
from hetplan.energy.report import SAME_TIME_TOLERANCE
from hetplan.errors import HetplanError
from hetplan.estimate.estimator import Estimate
from hetplan.hardware.catalog import Catalog, load_catalog
from hetplan.model.spec import ModelSpec, load_model
from hetplan.plan import Plan

J_PER_KWH = 3.6e6
#: Budget of the frontier ``hetplan plan --energy`` computes per plan: pipeline-time quanta × instructions (each
#: solver step shortens the iteration by one quantum and costs O(instructions); 1e6 is ~0.5 s of CPU).
FRONTIER_WORK = 1e6
#: ... but the unit stays within this share of the shortest instruction (quantization error; the saving is
#: measured by replaying the plans unquantized, so a coarse unit finds a smaller saving, never a false one).
FRONTIER_UNIT_COARSEST = 1 / 4
#: Frontier time unit as a fraction of the all-max pipeline time, and at most this share of the shortest
#: instruction (module doc).
FRONTIER_UNIT_FRACTION = 1 / 1000
FRONTIER_UNIT_OF_INSTRUCTION = 1 / 30


def plan_energy(plan: Plan, est: Estimate, catalog: Catalog | None = None, model: ModelSpec | None = None, *,
                usd_per_kwh: float | None = None, frontier: bool = True) -> dict:
    """Energy figures of ``plan`` (module doc); JSON-ready.

    Returns:
        ``energy_j_per_iteration``, ``job_energy_kwh``, ``average_power_w`` (all GPUs), ``energy_source``
        (``"dvfs-model"``, ``"dvfs-physics"`` or ``"tdp"``: :func:`_energy_source`), ``perseus_saved_j_per_iteration`` and ``perseus_saved_fraction`` (None
        when not computed), ``energy_usd`` (None without ``usd_per_kwh``).

    Raises:
        HetplanError: a negative or non-finite ``usd_per_kwh``; what the estimator raises.
    """
    if usd_per_kwh is not None and not (math.isfinite(usd_per_kwh) and usd_per_kwh >= 0):
        raise HetplanError(f"must be a finite price ≥ 0, got {usd_per_kwh}", field="--usd-per-kwh",
                           fix="give the electricity price in $/kWh, e.g. 0.12")
    catalog = catalog or load_catalog()
    model = model or load_model(plan.job.model)
    pp = plan_stage_profile(plan, catalog, model, tdp_fallback=True)
    M, v = plan.num_microbatches(0), pp.virtual_stages
    T = est.iteration_time_s
    e_iter = 0.0
    for s in range(len(plan.stages)):
        f, b = pp.profile.get(s, "forward"), pp.profile.get(s, "backward")
        busy_t = M * v * (f.time_s[0] + b.time_s[0])
        busy_e = M * v * (f.energy_j[0] + b.energy_j[0])
        e_iter += pp.gpus_per_stage[s] * (busy_e + pp.idle_power_w[s] * max(T - busy_t, 0.0))
    iterations = est.iterations
    kwh = e_iter * iterations / J_PER_KWH
    out = {
        "energy_j_per_iteration": e_iter,
        "job_energy_kwh": kwh,
        "average_power_w": e_iter / T,
        "energy_source": _energy_source(pp.power),
        "perseus_saved_j_per_iteration": None,
        "perseus_saved_fraction": None,
        "energy_usd": None if usd_per_kwh is None else kwh * usd_per_kwh,
    }
    if frontier and out["energy_source"] != "tdp":
        saved = _perseus_saving(pp, M)
        if saved is not None:
            out["perseus_saved_j_per_iteration"] = saved * plan.num_gpus / len(plan.stages)
            out["perseus_saved_fraction"] = out["perseus_saved_j_per_iteration"] / e_iter
    return out


def _energy_source(power) -> str:
    """``"tdp"`` if a GPU of the plan has no DVFS model, ``"dvfs-physics"`` if one has a model that is not fitted
    (transferred from a fitted GPU, ``gpu_power.toml``), else ``"dvfs-model"`` (every model fitted)."""
    if any(not p.fitted and len(p.frequencies_mhz) == 1 for p in power):
        return "tdp"
    return "dvfs-model" if all(p.fitted for p in power) else "dvfs-physics"


def _perseus_saving(pp, M: int) -> float | None:
    """Pipeline energy (one GPU per stage, J) that the frontier's fastest plan saves against all-max, both
    replayed on the profile (unquantized) and idle-padded to the later of the two times."""
    from hetplan.energy.baselines import all_max
    from hetplan.energy.frontier import compute_frontier

    prof = pp.profile
    fast = [prof.get(s, i).time_s.min() for s in range(prof.num_stages) for i in ("forward", "backward")]
    pipe = sum(prof.get(s, i).time_s[0] for s in range(prof.num_stages) for i in ("forward", "backward"))
    pipe_s = pipe * M * pp.virtual_stages / prof.num_stages
    n = 2 * prof.num_stages * M * pp.virtual_stages
    unit = max(min(pipe_s * FRONTIER_UNIT_FRACTION, min(fast) * FRONTIER_UNIT_OF_INSTRUCTION),
               min(pipe_s * n / FRONTIER_WORK, min(fast) * FRONTIER_UNIT_COARSEST), 1e-7)
    idle = sum(pp.idle_power_w) / len(pp.idle_power_w)
    sched = "interleaved" if pp.virtual_stages > 1 else "1f1b"
    fr = compute_frontier(prof, M, idle, unit, sched, virtual_stages=pp.virtual_stages)
    mx = all_max(prof, fr.dag, idle)
    S, saved = prof.num_stages, 0.0
    for i in np.argsort(fr.time_s, kind="stable"):  # fastest first, while the replay keeps all-max's time
        t_p, e_p = fr.simulate(int(i))
        if t_p > mx.time_s * (1 + SAME_TIME_TOLERANCE):
            break
        T = max(t_p, mx.time_s)
        saved = max(saved, mx.energy_j + S * idle * (T - mx.time_s) - (e_p + S * idle * (T - t_p)))
    return saved


def pareto3(points: list[tuple[float, float, float]]) -> list[int]:
    """Indices of the points no other point beats or ties in all of (time, $, energy) while beating in one."""
    a = np.asarray(points, dtype=float)
    keep = []
    for i in range(len(a)):
        le = np.all(a <= a[i], axis=1)
        lt = np.any(a < a[i], axis=1)
        if not np.any(le & lt):
            keep.append(i)
    return keep


def plot_pareto3(summaries: list[dict], frontier: list[int], path: str | Path, title: str = "") -> Path:
    """Draw iteration time vs job $ with job kWh as colour; Pareto-optimal plans circled. Needs matplotlib.

    Raises:
        HetplanError: matplotlib is missing.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # pragma: no cover - plot extra missing
        raise HetplanError("drawing the Pareto frontier needs matplotlib", field="--pareto",
                           fix="pip install 'hetplan[plot]'") from None
    t = [s["iteration_time_s"] for s in summaries]
    usd = [s["job_usd"] for s in summaries]
    kwh = [s["job_energy_kwh"] for s in summaries]
    fig, ax = plt.subplots(figsize=(7, 5), tight_layout=True)
    sc = ax.scatter(t, usd, c=kwh, cmap="viridis", s=30, zorder=2)
    ax.scatter([t[i] for i in frontier], [usd[i] for i in frontier], s=120, facecolors="none", edgecolors="red",
               zorder=3, label="Pareto-optimal in (time, $, energy)")
    fig.colorbar(sc, ax=ax, label="job energy (kWh)")
    ax.set_xlabel("iteration time (s)")
    ax.set_ylabel("job cost ($)")
    ax.set_title(title or "time – $ – energy")
    ax.legend(fontsize=8)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)
