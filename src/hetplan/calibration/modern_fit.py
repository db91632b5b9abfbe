"""Fit the GEMM efficiency of today's GPUs on the modern sets (``python -m hetplan.calibration.modern_fit``).

What is fitted: one physical constant per (GPU type, GEMM dtype) — the large-GEMM efficiency ``e_max`` of
:mod:`hetplan.estimate.compute` (``GPUSpec.compute_efficiency`` for bf16, ``GPUSpec.fp8_compute_efficiency`` for fp8,
:func:`efficiency_field`) — never a per-row factor. On which rows: the
seeded calibration fraction (:data:`hetplan.calibration.modern.CALIBRATION_FRACTION`, a hash of the row key) of
every expressible dense modern row of that GPU and dtype without context parallelism, all sets together (MoE rows
run grouped expert GEMMs, another efficiency, and CP rows add the K/V exchange: both are left to validation); the
other rows are held out and reported
before and after the fit. How: least squares on log(predicted / measured) (a rate and a time weigh the same),
bounded to [0.3, 1.0], everything else (``gemm_half_dim``, kernel overhead, links) as in the catalog.

One communication constant is fitted before them: the stage time per p2p call of an interleaved schedule's
extra model chunks (:data:`hetplan.estimate.comm.P2P_CALL_S`, :func:`fit_p2p_call`), on the time ratios of
rows of one job that differ in the virtual stages only (a seeded half of those jobs; the others held out).

The fit returns data (:class:`EfficiencyFit`); :func:`catalog_with` builds a new catalog from it. Nothing
mutates module state: the values enter the package catalog (``hardware/data/gpus.toml``) by hand, in a reviewed
commit, with the provenance in ``calibration_source``, as the A100 fit does.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from hetplan.calibration import modern
from hetplan.calibration.validation import metrics
from hetplan.hardware.catalog import Catalog, load_catalog

#: Search interval of an efficiency (fraction of the dense peak).
BOUNDS = (0.3, 1.0)


@dataclass
class EfficiencyFit:
    """The fitted efficiency of one (GPU, dtype).

    Attributes:
        gpu, dtype, field: catalog GPU, GEMM dtype and the :class:`GPUSpec` field fitted.
        value, was: fitted and catalog value.
        n_calibration, n_held_out: rows fitted on / held out.
        held_out_before, held_out_after: :func:`hetplan.calibration.validation.metrics` of the held-out rows with
            the catalog value and with the fitted one.
    """

    gpu: str
    dtype: str
    field: str
    value: float
    was: float
    n_calibration: int
    n_held_out: int
    held_out_before: dict
    held_out_after: dict


def efficiency_field(dtype: str) -> str:
    """The :class:`GPUSpec` field holding the GEMM efficiency of ``dtype``: ``fp8_compute_efficiency`` for fp8,
    ``compute_efficiency`` for bf16 / fp16."""
    return "fp8_compute_efficiency" if dtype == "fp8" else "compute_efficiency"


def _with(catalog: Catalog, gpu: str, field: str, value: float) -> Catalog:
    gpus = dict(catalog.gpus)
    gpus[gpu] = gpus[gpu].model_copy(update={field: value})
    return Catalog(gpus, catalog.date)


def catalog_with(fits: Iterable[EfficiencyFit], catalog: Catalog | None = None) -> Catalog:
    """A new catalog: ``catalog`` (default: the package catalog) with the fitted values."""
    out = catalog or load_catalog()
    for f in fits:
        out = _with(out, f.gpu, f.field, f.value)
    return out


def _log_err(cases, catalog, comm_constants=None) -> np.ndarray:
    return np.array([math.log(c.evaluate(catalog, comm_constants) / c.measured) for c in cases])


def fit_gpu_dtype(cases: list, gpu: str, dtype: str, catalog: Catalog | None = None) -> EfficiencyFit | None:
    """Fit the efficiency of (``gpu``, ``dtype``) on the calibration rows among ``cases`` (module doc); None when
    there is no calibration row. ``was``: the catalog value (an unfitted FP8 efficiency: ``compute_efficiency``,
    which the estimator then uses)."""
    from scipy.optimize import minimize_scalar

    catalog = catalog or load_catalog()
    field = efficiency_field(dtype)
    mine = [c for c in cases if (c.gpu, c.dtype) == (gpu, dtype)]
    cal = [c for c in mine if c.is_calibration]
    held = [c for c in mine if not c.is_calibration]
    if not cal:
        return None
    spec = catalog.get(gpu)
    was = float(getattr(spec, field) if getattr(spec, field) is not None else spec.compute_efficiency)  # unfitted FP8
    res = minimize_scalar(lambda e: float(np.sum(_log_err(cal, _with(catalog, gpu, field, e)) ** 2)),
                          bounds=BOUNDS, method="bounded", options={"xatol": 1e-4})
    value = round(float(res.x), 3)
    for c in held:
        c.evaluate(catalog)
    before = metrics(held)
    for c in held:
        c.evaluate(_with(catalog, gpu, field, value))
    after = metrics(held)
    return EfficiencyFit(gpu, dtype, field, value, was, len(cal), len(held), before, after)


#: Search interval of the p2p call time (s).
P2P_CALL_BOUNDS = (0.0, 3e-3)
#: Seeded fraction of the VP-contrast jobs (hash of the job key) the p2p call time is fitted on.
CONTRAST_FRACTION = 0.5


@dataclass
class P2PCallFit:
    """The fitted p2p call time (s).

    Attributes:
        p2p_call_s, was: fitted and current value (s).
        jobs_calibration, jobs_held_out: the VP-contrast jobs (:func:`vp_contrast_pairs`) fitted on / held out.
        held_out_before, held_out_after: mean |error| of the held-out pairs' time ratio (fraction) and their
            Kendall-τ-style agreement (share of pairs ordered as measured), without the term (0 s) and with the
            fitted value.
    """

    p2p_call_s: float
    was: float
    jobs_calibration: list
    jobs_held_out: list
    held_out_before: dict
    held_out_after: dict


def vp_contrast_pairs(cases: list) -> dict[str, list[tuple]]:
    """``{job: [(a, b), ...]}``: pairs of cases of one job (same model, GPU, GPU count, batch, sequence; the
    :attr:`group`) that differ in the virtual stages only — the contrast that isolates the cost of more p2p calls
    (Megatron's interleaved schedule runs ``v`` chunk calls per micro-batch and direction)."""
    out: dict[str, list[tuple]] = {}
    for i, a in enumerate(cases):
        for b in cases[i + 1:]:
            ia, ib = dict(a.info), dict(b.info)
            if a.group == b.group and ia.pop("vp") != ib.pop("vp") and ia == ib:
                out.setdefault(a.group, []).append((a, b))
    return out


def _pair_metrics(pairs: list[tuple], comm_constants=None) -> dict:
    errs, agree = [], []
    for a, b in pairs:
        pa, pb = a.evaluate(None, comm_constants), b.evaluate(None, comm_constants)
        errs.append(abs((pa / pb) / (a.measured / b.measured) - 1))
        agree.append((pa - pb) * (a.measured - b.measured) > 0)
    return {"n": len(pairs), "ratio_mape": float(np.mean(errs)) if errs else math.nan,
            "ordered": float(np.mean(agree)) if agree else math.nan}


def fit_p2p_call(cases: list) -> P2PCallFit | None:
    """Fit :data:`hetplan.estimate.comm.P2P_CALL_S` on the time ratios of VP-contrast pairs
    (:func:`vp_contrast_pairs`): least squares on log(predicted ratio / measured ratio) over the jobs in the
    seeded :data:`CONTRAST_FRACTION` (hash of the job key), the other jobs held out. A ratio within one job
    cancels the GEMM efficiency and every per-job constant, so the fit sees the per-call cost alone. None
    without calibration jobs."""
    from scipy.optimize import minimize_scalar

    from hetplan.calibration.validation import _is_calibration
    from hetplan.estimate.comm import CommConstants

    jobs = vp_contrast_pairs(cases)
    cal = [p for j, ps in jobs.items() if _is_calibration(j, CONTRAST_FRACTION) for p in ps]
    held = [p for j, ps in jobs.items() if not _is_calibration(j, CONTRAST_FRACTION) for p in ps]
    if not cal:
        return None

    def loss(call):
        cc = CommConstants(p2p_call_s=call)
        return sum(math.log((a.evaluate(None, cc) / b.evaluate(None, cc)) / (a.measured / b.measured)) ** 2
                   for a, b in cal)

    res = minimize_scalar(loss, bounds=P2P_CALL_BOUNDS, method="bounded", options={"xatol": 1e-6})
    call, was = round(float(res.x), 5), CommConstants().p2p_call_s
    return P2PCallFit(call, was, sorted(j for j in jobs if _is_calibration(j, CONTRAST_FRACTION)),
                      sorted(j for j in jobs if not _is_calibration(j, CONTRAST_FRACTION)),
                      _pair_metrics(held, CommConstants(p2p_call_s=0.0)),
                      _pair_metrics(held, CommConstants(p2p_call_s=call)))


#: Search interval of the dropless load imbalance (tokens of the busiest EP rank over its balanced share).
IMBALANCE_BOUNDS = (1.0, 4.0)


@dataclass
class DroplessImbalanceFit:
    """The fitted load imbalance of the ModelZoo's dropless runs.

    Attributes:
        imbalance, was: fitted and current value (:data:`hetplan.calibration.modern.moe.MODELZOO_DROPLESS_IMBALANCE`).
        pairs: keys of the dropless rows of the pairs (:func:`dropless_pairs`).
        left_out_before, left_out_after: mean |error| of the pairs' throughput ratio (fraction), with
            :data:`hetplan.estimate.moe.DEFAULT_LOAD_IMBALANCE` and with each pair left out of its own fit.
    """

    imbalance: float
    was: float
    pairs: list
    left_out_before: float
    left_out_after: float


def dropless_pairs(cases: list) -> list[tuple]:
    """``[(forced, dropless), ...]``: rows of one job and layout (same :attr:`group` and ``info``) measured with
    forced-balance routing (imbalance 1) and with the dropless learned router
    (:func:`hetplan.calibration.modern.moe.routing_of`): the contrast that isolates the cost of the busiest EP
    rank's extra tokens, every other term cancelling in the ratio."""
    from hetplan.calibration.modern.moe import MODELZOO_DROPLESS_IMBALANCE

    def routed(c, imbalance):
        return c.set == "moe_h100" and c.plan.job.moe_load_imbalance == imbalance

    forced = [c for c in cases if routed(c, 1.0)]
    return [(f, d) for d in cases if routed(d, MODELZOO_DROPLESS_IMBALANCE)
            for f in forced if f.group == d.group and f.info == d.info]


def _with_imbalance(case, imbalance: float):
    out = copy.copy(case)
    out.plan = case.plan.model_copy(update={"job": case.plan.job.model_copy(
        update={"moe_load_imbalance": imbalance})})
    return out


def _ratio_log_err(forced, dropless, imbalance: float) -> float:
    """log(predicted / measured) of the dropless row's time (or rate) over its forced twin's."""
    return math.log((_with_imbalance(dropless, imbalance).evaluate() / forced.evaluate())
                    / (dropless.measured / forced.measured))


def _fit_imbalance(pairs: list[tuple]) -> float:
    from scipy.optimize import minimize_scalar

    res = minimize_scalar(lambda x: sum(_ratio_log_err(f, d, x) ** 2 for f, d in pairs), bounds=IMBALANCE_BOUNDS,
                          method="bounded", options={"xatol": 1e-4})
    return round(float(res.x), 2)


def fit_dropless_imbalance(cases: list) -> DroplessImbalanceFit | None:
    """Fit :data:`hetplan.calibration.modern.moe.MODELZOO_DROPLESS_IMBALANCE` on the throughput ratios of the
    forced / dropless pairs (:func:`dropless_pairs`): least squares on log(predicted ratio / measured ratio) over
    all pairs; each pair is also predicted by the value fitted on the others (leave one out: four pairs are too
    few to split). A ratio within one layout cancels the GEMM efficiency and every per-layout term, so the fit sees
    the busiest rank's extra tokens alone. None with fewer than two pairs."""
    from hetplan.calibration.modern.moe import MODELZOO_DROPLESS_IMBALANCE
    from hetplan.estimate.moe import DEFAULT_LOAD_IMBALANCE

    pairs = dropless_pairs(cases)
    if len(pairs) < 2:
        return None
    before = [abs(math.expm1(_ratio_log_err(f, d, DEFAULT_LOAD_IMBALANCE))) for f, d in pairs]
    after = [abs(math.expm1(_ratio_log_err(f, d, _fit_imbalance(pairs[:i] + pairs[i + 1:]))))
             for i, (f, d) in enumerate(pairs)]
    return DroplessImbalanceFit(_fit_imbalance(pairs), MODELZOO_DROPLESS_IMBALANCE, [d.key for _, d in pairs],
                                float(np.mean(before)), float(np.mean(after)))


#: Search interval of the 8-byte-aligned attention core's slowdown.
ALIGN8_BOUNDS = (1.0, 30.0)
#: The GA100 entries of the catalog: one silicon, one cuBLAS kernel choice (the fit's value goes to each).
GA100_GPUS = ("A100-SXM-80GB", "A100-SXM-40GB", "A100-PCIE-40GB", "A100-PCIE-80GB")


@dataclass
class CoreAlign8Fit:
    """The fitted A100 slowdown of the 8-byte-aligned attention core
    (:attr:`hetplan.hardware.catalog.GPUSpec.core_align8_slowdown`).

    Attributes:
        value, was: fitted and catalog value (None: not charged).
        rows: keys of the rows fitted on (BLOOM's d = 108 rows).
        held_out: ``{key: (error without the charge, error with the fitted one)}`` of FASOP's A100 layer times of
            GPT-2 XL (d = 100): measured / predicted − 1.
    """

    value: float
    was: float | None
    rows: list
    held_out: dict


def fit_core_align8(cases: list) -> CoreAlign8Fit | None:
    """Fit the A100's :attr:`~hetplan.hardware.catalog.GPUSpec.core_align8_slowdown` on the rows of ``cases``
    (``bigscience_a100``'s) whose head dimension leaves the attention core's batch pointers exactly 8 bytes aligned
    (least squares on log(predicted / measured); all four are BLOOM's 128-head layouts of hidden 13,824, the
    chronicle's "NHEADs comparison"), every GA100 entry taking the value; FASOP's A100 GPT-2 XL layer times
    (16 heads of d = 100, another stack and another year) are held out. None without such rows."""
    from scipy.optimize import minimize_scalar

    from hetplan.calibration import validation

    from hetplan.estimate.compute import SIMT_BELOW_BYTES, head_alignment_bytes

    rows = [c for c in cases if c.gpu in GA100_GPUS and head_alignment_bytes(c.model) == SIMT_BELOW_BYTES]
    if not rows:
        return None
    base = load_catalog()

    def with_value(x: float | None) -> Catalog:
        out = base
        for g in GA100_GPUS:
            out = _with(out, g, "core_align8_slowdown", x)
        return out

    res = minimize_scalar(lambda x: float(np.sum(_log_err(rows, with_value(x)) ** 2)), bounds=ALIGN8_BOUNDS,
                          method="bounded", options={"xatol": 1e-3})
    value = round(float(res.x), 1)
    fasop = [c for c in validation.fasop_cases() if "gpt2XL" in c.key and "A100" in c.key]
    held = {c.key: tuple(c.measured / c.predict(validation.Constants(catalog=with_value(x))) - 1
                         for x in (None, value)) for c in fasop}
    for c in rows:  # the fit left each row evaluated at a trial value: back to the catalog's
        c.evaluate()
    return CoreAlign8Fit(value, base.get(GA100_GPUS[0]).core_align8_slowdown, sorted(c.key for c in rows), held)


_FIT_SETS = tuple(n for n in modern.SET_NAMES if n not in modern.NOT_FITTED)


def fit_cases(sets: Iterable[str] = _FIT_SETS, catalog: Catalog | None = None) -> list:
    """The rows the fit draws on (module doc): the expressible dense rows without CP of the modern ``sets``
    (by default every modern set but :data:`hetplan.calibration.modern.NOT_FITTED`)."""
    return [c for cs, _ in modern.load_sets(sets, catalog).values() for c in cs
            if not getattr(c.model, "num_experts", 0) and c.info.get("cp", 1) == 1]


def fit_modern(sets: Iterable[str] = _FIT_SETS, catalog: Catalog | None = None) -> list[EfficiencyFit]:
    """Fit every (GPU, dtype) that has calibration rows among :func:`fit_cases`."""
    catalog = catalog or load_catalog()
    cases = fit_cases(sets, catalog)
    out = []
    for gpu, dtype in sorted({(c.gpu, c.dtype) for c in cases}):
        f = fit_gpu_dtype(cases, gpu, dtype, catalog)
        if f is not None:
            out.append(f)
    return out


#: Search interval of the GPU speed variability (dimensionless).
SPEED_VARIABILITY_BOUNDS = (0.0, 0.1)
#: Seeded fraction of the weak-scaling series (hash of the series name) the speed variability is fitted on.
SERIES_FRACTION = 0.5
#: Row fields that grow along a weak-scaling series; the rest (and the batch per replica) stay.
_SCALED = ("n", "dp", "gbs")


def weak_scaling_series(cases: list) -> dict[str, list]:
    """``{series: cases}``: runs of at least three consecutive rows (``cases`` in their files' order) of one set
    that repeat one configuration (model, GPU, TP, PP, CP, EP, VP, micro-batch, sequence, dtype, recompute, and the
    batch per data-parallel replica) on more and more GPUs — the weak-scaling tables of the DGX Cloud recipes.
    Along one, the GEMM efficiency and every per-job constant cancel; what changes is how many GPUs each stage
    waits for."""
    runs: list[list] = []
    for c in cases:  # in the order of their set's file
        info = {k: v for k, v in c.info.items() if k not in _SCALED}
        info["per_replica"] = c.info.get("gbs", 0) / max(1, c.info.get("dp", 1))
        last = runs[-1][-1] if runs else None
        if last is not None and last[0].set == c.set and last[1] == info and last[0].info["n"] < c.info["n"]:
            runs[-1].append((c, info))
        else:
            runs.append([(c, info)])
    return {r[0][0].key.rsplit(":", 1)[0]: [c for c, _ in r] for r in runs if len(r) >= 3}


def _within_series_sq(series: Iterable[list], catalog: Catalog) -> float:
    """Σ over ``series`` of the squared log errors about each series' own mean (the level cancels)."""
    out = 0.0
    for cases in series:
        e = _log_err(cases, catalog)
        out += float(np.sum((e - e.mean()) ** 2))
    return out


def with_every_gpu(catalog: Catalog, field: str, value: float) -> Catalog:
    """A new catalog: ``catalog`` with ``field`` set to ``value`` on every GPU type."""
    return Catalog({k: g.model_copy(update={field: value}) for k, g in catalog.gpus.items()}, catalog.date)


@dataclass
class SpeedVariabilityFit:
    """The fitted GPU speed variability (:mod:`hetplan.estimate.variability`).

    Attributes:
        value, was: fitted and catalog value (the catalog's default, one value for every GPU).
        series_calibration, series_held_out: the weak-scaling series (:func:`weak_scaling_series`) fitted on /
            held out.
        held_out_before, held_out_after: root-mean-square of the held-out rows' log errors about their series'
            mean, without the term (σ = 0) and with the fitted value.
    """

    value: float
    was: float
    series_calibration: list
    series_held_out: list
    held_out_before: float
    held_out_after: float


def fit_speed_variability(cases: list, catalog: Catalog | None = None) -> SpeedVariabilityFit | None:
    """Fit :attr:`hetplan.hardware.catalog.GPUSpec.speed_variability` (one value, every GPU) on the seeded
    :data:`SERIES_FRACTION` of the weak-scaling series among ``cases``: least squares on the log errors about
    each series' mean, so only how the error grows with the GPU count along a series counts. None without a
    calibration series."""
    from scipy.optimize import minimize_scalar

    from hetplan.calibration.validation import _is_calibration

    catalog = catalog or load_catalog()
    series = weak_scaling_series(cases)
    cal = {k: v for k, v in series.items() if _is_calibration(k, SERIES_FRACTION)}
    held = {k: v for k, v in series.items() if not _is_calibration(k, SERIES_FRACTION)}
    if not cal:
        return None
    res = minimize_scalar(lambda s: _within_series_sq(cal.values(), with_every_gpu(catalog, "speed_variability", s)),
                          bounds=SPEED_VARIABILITY_BOUNDS, method="bounded", options={"xatol": 1e-4})
    value = round(float(res.x), 3)
    rows = max(1, sum(len(v) for v in held.values()))

    def rms(s: float) -> float:
        return math.sqrt(_within_series_sq(held.values(), with_every_gpu(catalog, "speed_variability", s)) / rows)

    was = float(next(iter(catalog.gpus.values())).speed_variability)
    return SpeedVariabilityFit(value, was, sorted(cal), sorted(held), rms(0.0), rms(value))


def main() -> None:  # pragma: no cover - prints the fit
    p = fit_p2p_call(fit_cases())
    if p is not None:
        b, a = p.held_out_before, p.held_out_after
        print(f"p2p call {1e3 * p.was:.2f} -> {1e3 * p.p2p_call_s:.2f} ms on jobs {p.jobs_calibration}; held-out "
              f"({a['n']} pairs of {len(p.jobs_held_out)} jobs): ratio error {100 * b['ratio_mape']:.1f} % -> "
              f"{100 * a['ratio_mape']:.1f} %, ordered as measured {b['ordered']:.2f} -> {a['ordered']:.2f}")
    d = fit_dropless_imbalance(modern.load_sets(["moe_h100"])["moe_h100"][0])
    if d is not None:
        print(f"ModelZoo dropless imbalance {d.was:.2f} -> {d.imbalance:.2f} on {len(d.pairs)} pairs; ratio "
              f"error {100 * d.left_out_before:.1f} % (default) -> {100 * d.left_out_after:.1f} % (each left out)")
    a = fit_core_align8(modern.load_sets(["bigscience_a100"])["bigscience_a100"][0])
    if a is not None:
        print(f"A100 8-byte-aligned attention core {a.was} -> {a.value}x on {len(a.rows)} BLOOM rows; held-out FASOP "
              "GPT-2 XL (measured / predicted - 1): " + ", ".join(f"{100 * b:+.1f} -> {100 * x:+.1f} %"
                                                                  for b, x in a.held_out.values()))
    v = fit_speed_variability([c for cs, _ in modern.load_sets(modern.SET_NAMES).values() for c in cs])
    if v is not None:
        print(f"GPU speed variability {v.was:.3f} -> {v.value:.3f} on {len(v.series_calibration)} weak-scaling "
              f"series; held-out ({len(v.series_held_out)}) RMS about each series' mean "
              f"{100 * v.held_out_before:.2f} % -> {100 * v.held_out_after:.2f} %")
    for f in fit_modern():
        print(f"{f.gpu} {f.dtype}: {f.field} {f.was:.3f} -> {f.value:.3f} on {f.n_calibration} rows; held-out "
              f"({f.n_held_out}) MAPE {100 * f.held_out_before['mape']:.1f} % -> {100 * f.held_out_after['mape']:.1f} %")


if __name__ == "__main__":  # pragma: no cover
    main()

