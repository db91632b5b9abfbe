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

The fit returns data (:class:`EfficiencyFit`); :func:`catalog_with` builds a new catalog from it. Nothing
mutates module state: the values enter the package catalog (``hardware/data/gpus.toml``) by hand, in a reviewed
commit, with the provenance in ``calibration_source``, as the A100 fit does.
"""

from __future__ import annotations

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


def _log_err(cases, catalog) -> np.ndarray:
    return np.array([math.log(c.evaluate(catalog) / c.measured) for c in cases])


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


def fit_cases(sets: Iterable[str] = modern.SET_NAMES, catalog: Catalog | None = None) -> list:
    """The rows the fit draws on (module doc): the expressible dense rows without CP of the modern ``sets``."""
    return [c for cs, _ in modern.load_sets(sets, catalog).values() for c in cs
            if not getattr(c.model, "num_experts", 0) and c.info.get("cp", 1) == 1]


def fit_modern(sets: Iterable[str] = modern.SET_NAMES, catalog: Catalog | None = None) -> list[EfficiencyFit]:
    """Fit every (GPU, dtype) that has calibration rows among :func:`fit_cases`."""
    catalog = catalog or load_catalog()
    cases = fit_cases(sets, catalog)
    out = []
    for gpu, dtype in sorted({(c.gpu, c.dtype) for c in cases}):
        f = fit_gpu_dtype(cases, gpu, dtype, catalog)
        if f is not None:
            out.append(f)
    return out


def main() -> None:  # pragma: no cover - prints the fit
    for f in fit_modern():
        print(f"{f.gpu} {f.dtype}: {f.field} {f.was:.3f} -> {f.value:.3f} on {f.n_calibration} rows; held-out "
              f"({f.n_held_out}) MAPE {100 * f.held_out_before['mape']:.1f} % -> {100 * f.held_out_after['mape']:.1f} %")


if __name__ == "__main__":  # pragma: no cover
    main()
