"""Power limits as the knob: the iteration time–energy curve of a plan over the board power limit, Zeus'
choice on it, and the per-rank settings that apply it.

Clocks are what Perseus plans; the *power limit* (``nvidia-smi -pl``, NVML ``nvmlDeviceSetPowerManagementLimit``)
is what operators set, and Zeus' knob (You et al., "Zeus: Understanding and Optimizing GPU Energy
Consumption of DNN Training", NSDI'23, §4). Under a limit ``L`` a GPU computing GEMM-bound work sustains
``f_cap(L)``, the clock whose busy power is ``L`` (:mod:`hetplan.hardware.power`); memory-bound work does not
slow. For each limit, as a share of each GPU type's TDP (one share for every GPU, Zeus' global limit):

1. the estimator (:func:`hetplan.energy.model.estimates_at_clock_scales`, the one cost model) re-runs the plan
   with each GPU's dense peak scaled by ``f_cap(L) / f_cap(TDP)`` (the estimator's time is the time at the
   default limit, :func:`~hetplan.energy.model.plan_stage_profile`): iteration time ``T(L)``, stage times;
2. energy per iteration, as :func:`hetplan.energy.job.plan_energy` charges it:
   ``E = Σ_s n_s · [M·v·P_busy(f_cap(L))·(t_F + t_B) + P_idle · (T − M·v·(t_F + t_B))]``.

Zeus picks the limit minimising ``η · E + (1 − η) · N · P_max · T`` (NSDI'23, Eq. 2: energy and time in one
cost, ``P_max`` the largest limit, η ∈ [0, 1] the weight on energy).
Limits range from the board's minimum (what its lowest clock draws, :func:`~hetplan.hardware.power.board_limited`)
to the TDP.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from hetplan.energy.model import estimates_at_clock_scales
from hetplan.errors import HetplanError
from hetplan.estimate.compute import pool_gpu
from hetplan.hardware.catalog import Catalog, load_catalog
from hetplan.hardware.power import board_limited, get_power
from hetplan.model.spec import ModelSpec, load_model
from hetplan.plan import Plan


@dataclass(frozen=True)
class PowerLimitPoint:
    """The plan under one power limit.

    Attributes:
        share_of_tdp: the limit as a share of each GPU type's TDP (its default and highest limit).
        power_limit_w: per GPU type, the limit to set (W; ``share · TDP``); the model's sustained power is the
            same share of its default (a fitted board may sustain a little under its TDP, the A40 287 of 300 W).
        clock_mhz: per GPU type, the clock GEMM-bound work sustains under it (MHz).
        iteration_time_s, energy_j: per iteration, all GPUs (s, J). average_power_w: per GPU (W).
    """

    share_of_tdp: float
    power_limit_w: dict[str, float]
    clock_mhz: dict[str, float]
    iteration_time_s: float
    energy_j: float
    average_power_w: float

    def to_dict(self) -> dict:
        return asdict(self)


def power_limit_curve(plan: Plan, catalog: Catalog | None = None, model: ModelSpec | None = None, *,
                      steps: int = 12, power_catalog: str | None = None) -> list[PowerLimitPoint]:
    """``steps`` limits from the largest board minimum (as a share of TDP) to the TDP; highest limit first.

    Raises:
        HetplanError: ``steps`` < 2 or > 200; a GPU of the plan without a DVFS model.
    """
    if isinstance(steps, bool) or not 2 <= int(steps) <= 200:
        raise HetplanError(f"steps must be from 2 to 200, got {steps}", field="steps", fix="use e.g. 12")
    catalog = catalog or load_catalog()
    model = model or load_model(plan.job.model)
    gpus = {}
    for i, st in enumerate(plan.stages):
        g = pool_gpu(catalog, plan.pools[st.pool], field=f"plan.stages.{i}.pool", job=plan.job)
        gpus.setdefault(g.name, g)
    power = {n: get_power(n, power_catalog, field="plan.pools.gpu") for n in gpus}
    default = {n: board_limited(p, gpus[n].tdp_w, gpus[n].idle_power_w) for n, p in power.items()}
    floor = max(float(p.busy_power_w(min(p.frequencies_mhz), gpus[n].idle_power_w)) / default[n].power_limit_w
                for n, p in power.items())
    shares = np.linspace(1.0, floor, int(steps))
    ref = {n: b.cap_frequency_mhz(gpus[n].idle_power_w) for n, b in default.items()}
    # the model's sustained limit scales with the setting (the fitted A40 sustains 287 W of its 300 W default)
    limited = [{n: board_limited(p, gpus[n].tdp_w, gpus[n].idle_power_w, min(sh * default[n].power_limit_w,
                                                                          gpus[n].tdp_w))
                for n, p in power.items()} for sh in shares]
    clocks = [{n: float(min(b.cap_frequency_mhz(gpus[n].idle_power_w), b.max_frequency_mhz)) for n, b in lim.items()}
              for lim in limited]
    ests = estimates_at_clock_scales(plan, catalog, model, [{n: c[n] / ref[n] for n in c} for c in clocks])
    M = plan.num_microbatches(0)
    stage_gpu = [pool_gpu(catalog, plan.pools[st.pool], job=plan.job).name for st in plan.stages]
    out = []
    for sh, lim, clk, est in zip(shares, limited, clocks, ests):
        T = est.iteration_time_s
        e = 0.0
        for s, st in enumerate(plan.stages):
            g = stage_gpu[s]
            busy_t = M * (est.stages[s].forward_s + est.stages[s].backward_s)  # M·v chunk passes of 1/v each
            p_busy = float(lim[g].busy_power_w(clk[g], gpus[g].idle_power_w))
            e += plan.stage_layout(s).gpus_per_stage * (p_busy * busy_t + gpus[g].idle_power_w * max(T - busy_t, 0.0))
        out.append(PowerLimitPoint(float(sh), {n: float(sh * gpus[n].tdp_w) for n in lim}, clk, T, e,
                                   e / T / plan.num_gpus))
    return out


def zeus_choice(points: list[PowerLimitPoint], num_gpus: int, eta: float = 0.5) -> int:
    """Index of the point Zeus' cost ``η·E + (1 − η)·N·P_max·T`` (NSDI'23, Eq. 2) picks.

    Raises:
        HetplanError: η outside [0, 1].
    """
    if not (isinstance(eta, (int, float)) and 0 <= eta <= 1 and math.isfinite(eta)):
        raise HetplanError(f"eta must be in [0, 1], got {eta}", field="eta",
                           fix="0 = fastest, 1 = least energy; Zeus' default is 0.5")
    p_max = max(max(p.power_limit_w.values()) for p in points)
    cost = [eta * p.energy_j + (1 - eta) * num_gpus * p_max * p.iteration_time_s for p in points]
    return int(np.argmin(cost))


def rank_settings(plan: Plan, point: PowerLimitPoint, catalog: Catalog | None = None) -> list[dict]:
    """Per global rank: its stage, GPU type, local GPU index and the limit, with the ``nvidia-smi`` command and
    the NVML call that apply it. Ranks are numbered stage by stage (``rank = (pp_rank·dp + dp_rank)·tp +
    tp_rank``, hetplan's device mesh, :mod:`hetplan.runtime.planio`); local index = rank mod the processes the
    launch starts per host (:attr:`hetplan.plan.Plan.processes_per_host`: 4 on an NVL72 tray, not the rack's 72). Setting a limit needs root (or an operator's daemon); the training job only reads it."""
    catalog = catalog or load_catalog()
    out, rank = [], 0
    for s, st in enumerate(plan.stages):
        pool = plan.pools[st.pool]
        g = pool_gpu(catalog, pool, job=plan.job).name
        watts = point.power_limit_w[g]
        for _ in range(plan.stage_layout(s).gpus_per_stage):
            local = rank % plan.processes_per_host
            out.append({"rank": rank, "stage": s, "gpu": g, "local_gpu": local, "power_limit_w": round(watts, 1),
                        "nvidia_smi": f"nvidia-smi -i {local} -pl {round(watts)}",
                        "nvml": f"nvmlDeviceSetPowerManagementLimit(nvmlDeviceGetHandleByIndex({local}), "
                                f"{round(watts * 1000)})"})
            rank += 1
    return out
