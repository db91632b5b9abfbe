"""Stage time/energy profiles derived from a plan: the estimator's stage times at every SM clock, times the
GPU's DVFS power model — a profile before the cluster is rented.

For each GPU type of the plan and each supported SM clock ``f`` (:mod:`hetplan.hardware.power`):

1. ``f_eff = min(f, f_cap)``: the clock the power limit lets a compute-bound kernel sustain;
2. the estimator (:func:`hetplan.estimate.estimator.estimate_many`, the ONE cost model) re-runs the plan with
   that GPU's dense peak FLOP/s scaled by ``f_eff / f_max``. Its roofline decides, GEMM by GEMM, what is
   compute-bound (scales with ``1/f``) and what is memory-bound (HBM bandwidth: the memory clock does not
   follow the SM clock); element-wise kernels, the host launch floor and communication do not scale. No
   formula is re-derived here; the stage's ``forward_s`` / ``backward_s`` at clock ``f`` are the estimator's.
   Recomputation runs inside the backward (Megatron-LM recomputes a layer just before its backward), so it is
   part of the backward instruction, as in the estimator;
3. energy of one instruction = ``P_busy(f_eff) · time`` (the GPU computes, or waits inside its own TP
   collectives, for the whole instruction; the time between instructions is charged ``P_idle`` by the planner).

With interleaved 1F1B (``v`` model chunks) an instruction is one chunk: ``1/v`` of the stage's time and energy,
like the estimator's schedule (:func:`hetplan.estimate.schedule.simulate`).

Cost: one :func:`estimate_many` call over (number of distinct effective clocks) copies of the plan per GPU type
(~40-60 for the A100/A40 tables), a few tens of ms.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hetplan.energy.profile import InstructionProfile, StageProfile
from hetplan.errors import HetplanError
from hetplan.estimate.compute import pool_gpu
from hetplan.estimate.estimator import effective_virtual_stages, estimate_many
from hetplan.hardware.catalog import Catalog, GPUSpec, load_catalog
from hetplan.hardware.power import GPUPower, board_limited, get_power
from hetplan.model.spec import ModelSpec, load_model
from hetplan.plan import Plan


@dataclass(frozen=True)
class PlanProfile:
    """A model-derived stage profile and what the planner needs next to it.

    Attributes:
        profile: the :class:`StageProfile` (one GPU of each stage; one chunk with interleaving).
        idle_power_w: per stage, the catalog blocking power of its GPU (W).
        gpus_per_stage: per stage, the GPUs running that stage's instructions (``tp·cp·dp``,
            :attr:`hetplan.degrees.Degrees.gpus_per_stage`).
        virtual_stages: model chunks per stage (1 without interleaving).
        power: per stage, the DVFS model of its GPU.
    """

    profile: StageProfile
    idle_power_w: tuple[float, ...]
    gpus_per_stage: tuple[int, ...]
    virtual_stages: int
    power: tuple[GPUPower, ...]


def plan_stage_profile(plan: Plan, catalog: Catalog | None = None, model: ModelSpec | None = None, *,
                       power_catalog: str | None = None, time_scale: float = 1.0,
                       tdp_fallback: bool = False, tp_collectives: bool = True,
                       power_limit_w: float | str | None = None, time_reference: str = "sustained") -> PlanProfile:
    """Derive the stage profile of ``plan`` at every supported SM clock of its GPUs (module doc).

    Args:
        plan: any plan (homogeneous or heterogeneous).
        catalog, model: as for :func:`~hetplan.estimate.estimator.estimate` (defaults: package catalog, the
            plan's model).
        power_catalog: optional user power catalog TOML (:mod:`hetplan.hardware.power`).
        time_scale: factor on every estimated time (1 for plans; the calibration uses it to absorb a
            measurement setup the plan does not describe, :mod:`hetplan.energy.calibrate`).
        tdp_fallback: a GPU without a DVFS model runs at one clock drawing its TDP (:func:`tdp_power`)
            instead of raising.
        tp_collectives: False: the instructions without their TP collectives (:func:`stage_times_at_clocks`;
            Perseus' profiles, :mod:`hetplan.energy.calibrate`).
        power_limit_w: the board power limit (W; ``nvidia-smi -pl``) of every GPU of the plan. None: each GPU's
            catalog TDP (the default limit), or the DVFS model's own limit where that is lower. A limit above
            the TDP is refused: a board cannot be set above its maximum limit. ``"model"``: the DVFS model's
            own limit (the board it was fitted on, e.g. Perseus' A100 at ~480 W; calibration only).
        time_reference: ``"sustained"`` (plans): the estimator's time is the time at the clock the DEFAULT
            limit (TDP) sustains, because its compute efficiencies were calibrated on measured runs of boards at
            their default limit, which throttled as they do; other clocks scale by ``f_eff / f_cap(TDP)``.
            ``"top"``: the estimator's time is at the top clock uncapped (:mod:`hetplan.energy.calibrate`'s
            protocol for Perseus' profiles, where a fitted ``time_scale`` absorbs the rest).

    Raises:
        HetplanError: a GPU without a DVFS model, or anything :func:`estimate_many` rejects.
    """
    catalog = catalog or load_catalog()
    model = model or load_model(plan.job.model)
    v = effective_virtual_stages(plan)
    S = len(plan.stages)
    stage_gpu = [pool_gpu(catalog, plan.pools[st.pool], field=f"plan.stages.{i}.pool", job=plan.job)
                 for i, st in enumerate(plan.stages)]
    if time_reference not in ("sustained", "top"):
        raise HetplanError(f"unknown time reference {time_reference!r}", field="time_reference",
                           fix="use 'sustained' (plans) or 'top' (calibration on measured profiles)")
    power = {g.name: _power(g, power_catalog, tdp_fallback, f"plan.pools.{st.pool}.gpu")
             for g, st in zip(stage_gpu, plan.stages)}
    times = {s: {} for s in range(S)}  # stage -> frequency -> (forward_s, backward_s, busy_power_w)
    for name, pw in list(power.items()):
        gpu = catalog.get(name)
        idle = gpu.idle_power_w
        default = board_limited(pw, gpu.tdp_w, idle)
        power[name] = pw = board_limited(pw, gpu.tdp_w, idle, power_limit_w)
        f = np.array(pw.frequencies_mhz, dtype=float)
        f_eff = pw.effective_frequency_mhz(f, idle)
        distinct = sorted(set(f_eff.tolist()), reverse=True)
        ref = default.cap_frequency_mhz(idle) if time_reference == "sustained" else pw.max_frequency_mhz
        fwd, bwd = stage_times_at_clocks(plan, catalog, model, name, distinct, ref, tp_collectives=tp_collectives)
        row = {fe: k for k, fe in enumerate(distinct)}
        for s in range(S):
            if stage_gpu[s].name == name:
                for fi, fe in zip(f.tolist(), f_eff.tolist()):
                    times[s][int(fi)] = (fwd[row[fe], s], bwd[row[fe], s], float(pw.busy_power_w(fe, idle)))
    entries = {}
    for s in range(S):
        freqs = np.array(sorted(times[s], reverse=True), dtype=np.int64)
        fw = np.array([times[s][int(x)][0] for x in freqs]) * time_scale / v
        bw = np.array([times[s][int(x)][1] for x in freqs]) * time_scale / v
        pb = np.array([times[s][int(x)][2] for x in freqs])
        if not (np.all(np.isfinite(fw)) and np.all(fw > 0) and np.all(np.isfinite(bw)) and np.all(bw > 0)):
            raise HetplanError(f"stage {s} has no positive finite instruction time", field=f"plan.stages.{s}",
                               fix="give the stage at least one layer")
        entries[(s, "forward")] = InstructionProfile(s, "forward", freqs, fw, pb * fw)
        entries[(s, "backward")] = InstructionProfile(s, "backward", freqs, bw, pb * bw)
    return PlanProfile(
        profile=StageProfile(entries, source="model-derived", frequencies_mhz=()),
        idle_power_w=tuple(float(g.idle_power_w) for g in stage_gpu),
        gpus_per_stage=tuple(plan.stage_layout(i).gpus_per_stage for i in range(S)),  # tp·cp·dp (+ EP's)
        virtual_stages=v,
        power=tuple(power[g.name] for g in stage_gpu),
    )


def tdp_power(gpu: GPUSpec) -> GPUPower:
    """A one-clock stand-in power model for a GPU without DVFS data: busy at its TDP, no frequency choice."""
    return GPUPower(gpu=gpu.name, frequencies_mhz=(1,), power_limit_w=gpu.tdp_w,
                    dynamic_power_w=max(gpu.tdp_w - gpu.idle_power_w, 1e-3), voltage_floor=1.0, voltage_knee_mhz=0.5,
                    date="", source="no DVFS data: busy at the catalog TDP", fitted=False)


def _power(gpu: GPUSpec, power_catalog, tdp_fallback: bool, field: str) -> GPUPower:
    try:
        return get_power(gpu.name, power_catalog, field=field)
    except HetplanError:
        if tdp_fallback:
            return tdp_power(gpu)
        raise


def stage_times_at_clocks(plan: Plan, catalog: Catalog, model: ModelSpec, gpu_name: str, clocks_mhz,
                          max_clock_mhz: float, *, tp_collectives: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """The estimator's per-micro-batch ``(forward_s, backward_s)`` of every stage, shape (len(clocks), S) each,
    with GPU type ``gpu_name`` running at each SM clock (its dense peak scaled by ``clock / max_clock``; other
    GPU types unchanged). Stages on other GPU types get their own (unscaled) times.

    With ``tp_collectives=False`` the stage's TP collectives are taken out: without recomputation and TP
    overlap the forward and the backward run the same collectives (two all-reduces of ``b·s·h`` per layer,
    :func:`hetplan.estimate.compute.layer_time_s`), half of the estimator's ``tp_comm_s`` each.

    Raises:
        HetplanError: as :func:`~hetplan.estimate.estimator.estimate_many`; ``tp_collectives=False`` for a plan
            with recomputation or TP overlap.
    """
    if not tp_collectives and (plan.tp_comm_overlap or any(st.recompute != "none" for st in plan.stages)):
        raise HetplanError("TP collectives can be taken out of a stage only without recomputation and TP overlap",
                           field="plan.stages", fix="use recompute = 'none' and tp_comm_overlap = false")
    name = catalog.get(gpu_name).name
    est = estimates_at_clock_scales(plan, catalog, model, [{name: float(c) / float(max_clock_mhz)} for c in clocks_mhz])
    fwd = np.array([[st.forward_s for st in e.stages] for e in est])
    bwd = np.array([[st.backward_s for st in e.stages] for e in est])
    if not tp_collectives:
        tp = np.array([[st.tp_comm_s for st in e.stages] for e in est]) / 2
        fwd, bwd = fwd - tp, bwd - tp
    return fwd, bwd


def estimates_at_clock_scales(plan: Plan, catalog: Catalog, model: ModelSpec,
                              scales: list[dict[str, float]]) -> list:
    """The estimator's :class:`~hetplan.estimate.estimator.Estimate` of ``plan`` once per entry of ``scales``,
    each GPU type named there running with its dense peak scaled by the factor (its SM clock over the clock the
    catalog's peak is calibrated at; other GPU types unchanged). One :func:`estimate_many` call."""
    variants, plans = {}, []
    for k, by_gpu in enumerate(scales):
        rename = {}
        for gpu_name, scale in by_gpu.items():
            base = catalog.get(gpu_name)
            spec = base.model_copy(update={
                "name": f"{base.name}@{k}", "aliases": (),
                "dense_flops_per_s": {d: x * scale for d, x in base.dense_flops_per_s.items()}})
            variants[spec.name] = spec
            rename[base.name] = spec.name
        pools = [p.model_copy(update={"gpu": rename[catalog.get(p.gpu).name]})
                 if catalog.get(p.gpu).name in rename else p for p in plan.pools]
        plans.append(plan.model_copy(update={"pools": pools}))
    return estimate_many(plans, Catalog({**catalog.gpus, **variants}, catalog.date), model)

