"""Per-stack residuals, fitted only on the stack's own public rows (``python -m hetplan.calibration.stack_fit``).

What a stack does differently is modelled first (:mod:`hetplan.hardware.stacks`: kernels, fusion, overlap,
memory); what remains is a residual the stack's own measurements identify, fitted on a seeded fraction of them
with the rest held out, as :mod:`hetplan.calibration.modern_fit` fits the GPUs' constants. Today one stack has
enough public rows for that: MosaicML llm-foundry (77 H100 rows of its benchmarking README,
``validation_data/independent/``). Two constants are fitted jointly on a seeded half of them
(:data:`FIT_FRACTION`, the hash of the row key with :data:`hetplan.calibration.validation.CALIBRATION_SEED`):

* ``k``: the rate of llm-foundry's Triton FlashAttention (``attn_impl: triton``, the benchmark default,
  ``llmfoundry/models/layers/flash_attn_triton.py`` on the pre-MLIR Triton compiler) as a fraction of
  FlashAttention-2's rate on the same GPU (H100: the catalog's ``attention_kernels.fa2``, Shah et al. 2024). No
  H100 figure of that kernel is published; its rows at 8k-64k tokens, where attention is most of the step,
  identify it, and the rows that ran flash-attn 2 (``sweep.py --attn_impl flash``) do not depend on it.
* ``gemm_factor``: the stack's residual GEMM efficiency (:attr:`hetplan.hardware.stacks.StackSpec.gemm_factor`)
  on the GPU's fitted ``compute_efficiency`` — what eager Composer/FSDP1 around the same cuBLAS GEMMs loses that
  the modelled terms (eager element-wise kernels, FSDP1 collectives, FSDP1's gradient passes, the unfused
  DecoupledAdamW step) do not charge.

llm-foundry's 223 A100 rows (``hetplan validate --sets llm_foundry_a100``) are not fitted on: the A100 entries
carry the fitted ``k`` as their Triton rate over FlashAttention-2's, and those rows check it held out.

How: least squares on log(predicted / measured) over the calibration rows (Nelder-Mead on the two), bounded.
The values enter the package data by hand, in a reviewed commit, with this provenance (``gpus.toml`` H100
``attention_kernels.triton``; ``stacks.toml`` llm-foundry ``gemm_factor``): nothing mutates module state.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from hetplan.calibration import independent
from hetplan.calibration.validation import metrics
from hetplan.hardware.catalog import Catalog, load_catalog
from hetplan.hardware.stacks import resolve_stack

#: Seeded fraction of the stack's rows fitted on (the rest held out).
FIT_FRACTION = independent.FOUNDRY_FIT_FRACTION
#: Search intervals: the Triton kernel's rate over FlashAttention-2's, and the GEMM factor.
K_BOUNDS, FACTOR_BOUNDS = (0.2, 1.0), (0.5, 1.2)


@dataclass
class StackFit:
    """The fitted residuals of llm-foundry and the held-out error before (catalog / data as checked in) and after.

    Attributes:
        gpu: the GPU the Triton rate is fitted for; k: its rate over FlashAttention-2's; gemm_factor: the stack's.
        n_calibration, n_held_out: rows fitted on / held out.
        held_out_before, held_out_after: :func:`hetplan.calibration.validation.metrics` of the held-out rows.
    """

    gpu: str
    k: float
    gemm_factor: float
    n_calibration: int
    n_held_out: int
    held_out_before: dict
    held_out_after: dict


def foundry_cases(catalog: Catalog | None = None) -> list:
    """The llm-foundry rows of ``independent_h100`` as cases (calibration on the seeded fraction,
    :data:`FIT_FRACTION`)."""
    cases, _ = independent.independent_cases(catalog)
    return [c for c in cases if ":nemo:" not in c.key and ":fms:" not in c.key]


def catalog_for(catalog: Catalog, gpu: str, k: float, gemm_factor: float, stack: str) -> Catalog:
    """``catalog`` with ``gpu``'s Triton rate at ``k`` x FlashAttention-2's (and FA2's causal efficiency) and its
    GEMM efficiencies scaled so that the estimate, which multiplies by ``stack``'s checked-in ``gemm_factor``,
    runs at ``gemm_factor``."""
    spec = catalog.get(gpu)
    f, b = spec.attention_kernels["fa2"]
    scale = gemm_factor / resolve_stack(stack).gemm_factor
    update = {"attention_kernels": dict(spec.attention_kernels) | {"triton": (f * k, b * k)},
              "attention_causal_efficiency": dict(spec.attention_causal_efficiency) | {
                  "triton": spec.attention_causal_efficiency.get("fa2", 1.0)},
              "compute_efficiency": min(1.0, spec.compute_efficiency * scale)}
    if spec.fp8_compute_efficiency is not None:
        update["fp8_compute_efficiency"] = min(1.0, spec.fp8_compute_efficiency * scale)
    gpus = dict(catalog.gpus)
    gpus[gpu] = spec.model_copy(update=update)
    return Catalog(gpus, catalog.date)


def _sq_log_err(cases, catalog) -> float:
    return float(sum(math.log(c.evaluate(catalog) / c.measured) ** 2 for c in cases))


def fit_foundry(catalog: Catalog | None = None) -> StackFit:
    """Fit ``k`` and ``gemm_factor`` on the seeded half of llm-foundry's rows (module doc)."""
    from scipy.optimize import minimize

    base = catalog or load_catalog()
    cases = foundry_cases(base)
    gpu = cases[0].plan.pools[0].gpu
    cal = [c for c in cases if c.is_calibration]
    held = [c for c in cases if not c.is_calibration]
    stack = independent.FOUNDRY_STACK

    def loss(x) -> float:
        k = float(np.clip(x[0], *K_BOUNDS))
        g = float(np.clip(x[1], *FACTOR_BOUNDS))
        return _sq_log_err(cal, catalog_for(base, gpu, k, g, stack))

    res = minimize(loss, x0=np.array([0.6, 0.9]), method="Nelder-Mead", options={"xatol": 2e-3, "fatol": 1e-5})
    k, g = (round(float(np.clip(v, *bounds)), 3) for v, bounds in zip(res.x, (K_BOUNDS, FACTOR_BOUNDS)))
    for c in held:
        c.evaluate(base)
    before = metrics(held)
    for c in held:
        c.evaluate(catalog_for(base, gpu, k, g, stack))
    after = metrics(held)
    return StackFit(gpu, k, g, len(cal), len(held), before, after)


def main() -> None:  # pragma: no cover - prints the fit
    fit = fit_foundry()
    print(f"{fit.gpu}: Triton FlashAttention at {fit.k:.3f} x FlashAttention-2; llm-foundry gemm_factor "
          f"{fit.gemm_factor:.3f}; {fit.n_calibration} calibration rows, {fit.n_held_out} held out")
    for name, m in (("before", fit.held_out_before), ("after", fit.held_out_after)):
        print(f"  held-out {name}: MAPE {100 * m['mape']:.1f} %, signed median {100 * m['signed_median']:+.1f} %, "
              f"max {100 * m['max_abs_error']:.1f} %")


if __name__ == "__main__":  # pragma: no cover
    main()
