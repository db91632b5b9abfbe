"""Fit the DVFS power model (:mod:`hetplan.hardware.power`) to Perseus' measured stage profiles, and measure
the model-derived profiles (:mod:`hetplan.energy.model`) against them on a held-out model.

Data: ``shared/data/energy/stage_profile/{gpt3-175b,bloom}+{a100_sxm,a40}_bf16.csv`` (Chung et al., SOSP'24
artifact): one forward / backward of one micro-batch on one GPU of each of 8 stages at every SM clock.
The setup we read from them (:func:`perseus_plan`): 8 stages, tensor parallel 8 (EnvPipe's result for the same
runs counts 8 GPUs per stage, docs/energy.md), micro-batch 1, sequence 2048, bf16; GPT-3 175B 12 layers per
stage; BLOOM 176B 9 layers on stages 0-6 and 7 on the last.

* **Model code: Hugging Face model classes in eager PyTorch** (``attention="eager"``). Perseus runs on Merak
  (``ml-energy/merak-zeus``), which traces Hugging Face models with ``torch.fx`` and shards their linear
  layers for TP: ``examples/language-modeling/config.py`` builds ``gpt3-*`` as ``GPT2LMHeadModel`` (GPT-2's
  ``_attn``: scores divided by ``sqrt(d)``, ``torch.where`` causal mask, softmax, dropout 0.1); BLOOM, which
  Merak runs the same way, is then Hugging Face's ``BloomForCausalLM`` (``BloomAttention``: ALiBi through ``baddbmm``, ``masked_fill``, softmax in fp32 and cast
  back, no dropout; ``softmax_fp32`` in ``energy/data/bloom-176b.json``). Neither is fused: every element-wise
  step on the s x s scores is its own kernel (:func:`hetplan.estimate.compute.eager_score_bytes`).
* **No TP collectives** (``tp_collectives=False``). Stages 0-6 of each file are one measured middle stage
  repeated, and the measured forward of a BLOOM layer is 1.362x a GPT-3 layer's on A100, the ratio of their
  ``h²`` GEMM work (1.361): two all-reduces of ``s·h`` per layer (~0.7 ms of a 4.2 ms GPT-3 layer over
  NVLink) would pull it towards the ``h`` ratio 1.167. The profile is one GPU's TP shard computing alone.

Fitted per GPU (least squares on the log-ratios of time and energy, every stage, instruction and clock of the
fit model): ``dynamic_power_w``, ``voltage_floor``, ``voltage_knee_mhz``, ``power_limit_w`` and ``time_scale``,
the ratio of measured to estimated time at the top clock. ``time_scale`` absorbs what the plan does not say
about Perseus' runs (framework: Merak on HF models; kernels) and is reported, not used for plans. Everything
else — which share of each instruction scales with the clock — is the estimator's.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hetplan.energy.model import stage_times_at_clocks
from hetplan.energy.profile import INSTRUCTIONS, StageProfile
from hetplan.hardware.catalog import Catalog, load_catalog
from hetplan.hardware.power import GPUPower
from hetplan.model.spec import ModelSpec, load_model
from hetplan.plan import Plan

#: Perseus' models: model (preset name or config path) and layers per stage.
PERSEUS_MODELS = {
    "gpt3-175b": ("gpt3-175b", (12,) * 8),
    "bloom": (str(Path(__file__).parent / "data" / "bloom-176b.json"), (9,) * 7 + (7,)),
}
#: Catalog GPU of each profiled GPU (file name part).
PERSEUS_GPUS = {"a100_sxm": "A100-SXM-80GB", "a40": "A40"}


def perseus_plan(model_key: str, gpu: str) -> Plan:
    """The plan of Perseus' profiled setup (module doc) for ``model_key`` in :data:`PERSEUS_MODELS`; its stage
    times are compared without TP collectives (``tp_collectives=False``)."""
    model, layers = PERSEUS_MODELS[model_key]
    return Plan.model_validate(dict(
        job=dict(model=model, seq_len=2048, global_batch=96, train_iterations=1, dtype="bf16", attention="eager"),
        pools=[dict(gpu=gpu, count=64, gpus_per_node=8)],
        stages=[dict(num_layers=n, tp=8, dp=1) for n in layers], mbs=1))


@dataclass(frozen=True)
class FitResult:
    """A fitted power model and its fit.

    Attributes:
        power: the fitted :class:`GPUPower` (``fitted=True``).
        time_scale: measured / estimated time at the top clock (see module doc).
        time_mape, energy_mape: mean absolute relative error on the fit data (fractions).
    """

    power: GPUPower
    time_scale: float
    time_mape: float
    energy_mape: float


class _Grid:
    """Estimated stage times on a clock grid, interpolated (the fit moves ``f_cap`` continuously)."""

    def __init__(self, plan: Plan, gpu: str, clocks_mhz, catalog: Catalog, model: ModelSpec):
        self.clocks = np.array(sorted(set(float(c) for c in clocks_mhz)))
        fwd, bwd = stage_times_at_clocks(plan, catalog, model, gpu, self.clocks, self.clocks.max(), tp_collectives=False)
        self.times = {"forward": fwd, "backward": bwd}  # (clocks, stages)

    def time_s(self, stage: int, instruction: str, clock_mhz) -> np.ndarray:
        return np.interp(clock_mhz, self.clocks, self.times[instruction][:, stage])


def _rows(measured: StageProfile):
    for s in range(measured.num_stages):
        for inst in INSTRUCTIONS:
            p = measured.get(s, inst)
            yield s, inst, p.frequency_mhz.astype(float), p.time_s, p.energy_j


def predict(power: GPUPower, idle_power_w: float, time_scale: float, grid: _Grid, stage: int, instruction: str,
            frequency_mhz) -> tuple[np.ndarray, np.ndarray]:
    """Model ``(time_s, energy_j)`` of one instruction at ``frequency_mhz`` (array)."""
    fe = power.effective_frequency_mhz(frequency_mhz, idle_power_w)
    t = time_scale * grid.time_s(stage, instruction, fe)
    return t, power.busy_power_w(fe, idle_power_w) * t


def fit_power(measured: StageProfile, plan: Plan, gpu: str, *, catalog: Catalog | None = None,
              model: ModelSpec | None = None, date: str = "", source: str = "") -> FitResult:
    """Least-squares fit of the power model and time scale of ``gpu`` to ``measured`` (module doc)."""
    from scipy.optimize import least_squares

    catalog = catalog or load_catalog()
    model = model or load_model(plan.job.model)
    spec = catalog.get(gpu)
    clocks = sorted({int(f) for _, _, f, _, _ in _rows(measured) for f in f}, reverse=True)
    grid = _Grid(plan, spec.name, clocks, catalog, model)
    rows = list(_rows(measured))
    idle, fmax = spec.idle_power_w, float(clocks[0])

    def make(x) -> GPUPower:
        return GPUPower(gpu=spec.name, frequencies_mhz=tuple(clocks), dynamic_power_w=x[1], voltage_floor=x[2],
                        voltage_knee_mhz=x[3], power_limit_w=x[4], date=date, source=source, fitted=True)

    def residuals(x):
        pw, scale = make(x), float(np.exp(x[0]))
        out = []
        for s, inst, f, t, e in rows:
            tm, em = predict(pw, idle, scale, grid, s, inst, f)
            out += [np.log(tm / t), np.log(em / e)]
        return np.concatenate(out)

    tdp = spec.tdp_w
    x0 = np.array([0.0, tdp - idle, 0.8, 0.75 * fmax, 1.2 * tdp])
    lo = np.array([-2.0, 10.0, 0.3, float(clocks[-1]), 0.5 * tdp])
    hi = np.array([2.0, 2.0 * tdp, 1.0, fmax - 1.0, 2.0 * tdp])
    best = None
    for cap in (0.9 * tdp, 1.0 * tdp, 1.2 * tdp, 1.5 * tdp):  # the cap is a kink: start on both sides of it
        x0[4] = cap
        r = least_squares(residuals, x0, bounds=(lo, hi), x_scale=np.array([0.1, 50.0, 0.1, 50.0, 20.0]))
        if best is None or r.cost < best.cost:
            best = r
    pw, scale = make(best.x), float(np.exp(best.x[0]))
    errs = evaluate(measured, pw, idle, scale, grid)
    return FitResult(pw, scale, errs["time_mape"], errs["energy_mape"])


def evaluate(measured: StageProfile, power: GPUPower, idle_power_w: float, time_scale: float, grid: _Grid) -> dict:
    """Errors of the model against ``measured``: overall MAPE and, per clock, the mean absolute relative error
    of time and energy over all (stage, instruction) rows (fractions)."""
    per_f: dict[int, list[tuple[float, float]]] = {}
    for s, inst, f, t, e in _rows(measured):
        tm, em = predict(power, idle_power_w, time_scale, grid, s, inst, f)
        for fi, a, b in zip(f.tolist(), np.abs(tm / t - 1), np.abs(em / e - 1)):
            per_f.setdefault(int(fi), []).append((float(a), float(b)))
    per_clock = {f: (float(np.mean([a for a, _ in v])), float(np.mean([b for _, b in v]))) for f, v in per_f.items()}
    return {
        "time_mape": float(np.mean([a for v in per_f.values() for a, _ in v])),
        "energy_mape": float(np.mean([b for v in per_f.values() for _, b in v])),
        "time_max_per_clock": max(a for a, _ in per_clock.values()),
        "energy_max_per_clock": max(b for _, b in per_clock.values()),
        "per_clock": per_clock,
    }


def held_out(measured: StageProfile, plan: Plan, fit: FitResult, *, catalog: Catalog | None = None,
             model: ModelSpec | None = None) -> dict:
    """:func:`evaluate` of a fitted model on another model's measured profile (the held-out check)."""
    catalog = catalog or load_catalog()
    model = model or load_model(plan.job.model)
    spec = catalog.get(fit.power.gpu)
    grid = _Grid(plan, spec.name, fit.power.frequencies_mhz, catalog, model)
    return evaluate(measured, fit.power, spec.idle_power_w, fit.time_scale, grid)


def frontier_gap(measured: StageProfile, derived: StageProfile, idle_power_w: float, num_microbatches: int,
                 unit_time_s: float = 0.001, *, relative: bool = False) -> dict:
    """Compare the frontier planned from a model-derived profile with the one planned from the measured
    profile: at every iteration time ``T`` of the measured frontier that both reach, the least energy each
    frontier offers within ``T`` (idle power counted up to ``T``, :meth:`Frontier.index_for_time`).
    With ``relative`` the derived frontier is read at ``T · (its fastest time / the measured fastest time)``:
    the same slowdown from the fastest plan, which takes the error of the time at the top clock out.

    Returns:
        ``{"max_rel_energy_diff", "mean_rel_energy_diff", "times_compared", "measured_fastest_s",
        "derived_fastest_s"}`` (fractions, count, s).
    """
    from hetplan.energy.frontier import compute_frontier

    fm = compute_frontier(measured, num_microbatches, idle_power_w, unit_time_s)
    fd = compute_frontier(derived, num_microbatches, idle_power_w, unit_time_s)
    S = fm.dag.num_stages
    k = fd.time_s.min() / fm.time_s.min() if relative else 1.0
    diffs = []
    for t in fm.time_s:
        td = t * k
        if td < fd.time_s.min() or td > fd.time_s.max():
            continue
        i = fm.index_for_time(t)
        em = fm.energy_j[i] + S * idle_power_w * (t - fm.time_s[i])
        j = fd.index_for_time(td)
        ed = fd.energy_j[j] + S * idle_power_w * (td - fd.time_s[j])
        diffs.append(abs(ed / em - 1))
    return {"max_rel_energy_diff": max(diffs) if diffs else float("nan"),
            "mean_rel_energy_diff": float(np.mean(diffs)) if diffs else float("nan"),
            "times_compared": len(diffs), "measured_points": len(fm),
            "measured_fastest_s": float(fm.time_s.min()), "derived_fastest_s": float(fd.time_s.min())}
