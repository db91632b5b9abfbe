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

Megatron-DeepSpeed (:func:`fit_megatron_deepspeed`): BLOOM's layout search (``bigscience_a100``, 128 timed rows
under ``megatron-deepspeed@2022-02``) leaves an error that grows with the TP degree after every term modelled from
the stack's code (docs/estimator.md, "DeepSpeed's pipeline engine on BLOOM's A100 runs"): signed median +1 % at
TP 1, +5 % at TP 2, +10 % at TP 4, +17 % at TP 8, in proportion to the share of the step in TP collectives.
Fitted on its seeded quarter (:attr:`~hetplan.calibration.modern.mapping.ModernCase.is_calibration`), a factor on
the efficiency of the TP collectives (``tp_comm_factor``) identifies it within ±8 % (Gauss-Newton standard error
of the log); a GEMM factor leaves the TP trend, one on every collective inside a node slows the TP 1 row's
data-parallel all-reduce as well, and one on the node's network is not identified. Held out: the other three
quarters and MT-NLG 530B's three rows (Smith et al. 2022, the 2021 fork on Selene, ``nemo_megatron_a100``),
which the fit never sees. The factor is a residual, not a code path: what makes the pipeline engine's TP
collectives slower than NCCL's bus bandwidth was not found (docs/estimator.md lists the candidates checked).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from hetplan.calibration import independent
from hetplan.calibration.validation import DEFAULT, metrics
from hetplan.estimate.comm import CommConstants
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


@dataclass
class CommFit:
    """A stack's fitted ``tp_comm_factor`` and the held-out error before (factor 1) and after.

    Attributes:
        stack: the stack whose rows were fitted on; factor: the fitted value (rounded to 0.01).
        n_calibration, n_held_out: its rows fitted on / held out.
        held_out_before, held_out_after: :func:`hetplan.calibration.validation.metrics` of the held-out rows.
        other_release_before, other_release_after: the same for the stack's rows of another release that the fit
            never sees (MT-NLG's rows of ``megatron-deepspeed@2021``).
    """

    stack: str
    factor: float
    n_calibration: int
    n_held_out: int
    held_out_before: dict
    held_out_after: dict
    other_release_before: dict
    other_release_after: dict


#: Search interval of ``tp_comm_factor`` (the field's bounds).
COMM_FACTOR_BOUNDS = (0.1, 1.5)


def comm_trial(factor: float, stack: str) -> CommConstants:
    """The communication constants under which ``stack``'s estimate runs at ``tp_comm_factor`` = ``factor`` (a
    dimensionless fraction of the NCCL efficiency; the estimator multiplies the constants' trial factor by the
    checked-in one).

    Raises:
        HetplanError: ``stack`` names no release (:func:`hetplan.hardware.stacks.resolve_stack`)."""
    return replace(CommConstants(), tp_comm_factor=factor / resolve_stack(stack).tp_comm_factor)


def comm_loss(cases, factor: float, stack: str, catalog: Catalog) -> float:
    """Σ log²(predicted / measured) of ``cases`` (:class:`~hetplan.calibration.modern.mapping.ModernCase`, their
    iteration times in seconds) with ``stack``'s factor at ``factor`` (dimensionless)."""
    cc = comm_trial(factor, stack)
    return float(sum(math.log(c.evaluate(catalog, comm_constants=cc) / c.measured) ** 2 for c in cases))


def megatron_deepspeed_cases(catalog: Catalog | None = None) -> tuple[list, list]:
    """``bigscience_a100``'s timed rows and MT-NLG's rows of ``nemo_megatron_a100`` (the 2021 fork)."""
    from hetplan.calibration.modern import bigscience
    from hetplan.calibration.validation import stacks_2022_cases

    cases, _ = bigscience.bigscience_cases(catalog)
    other = [c for c in stacks_2022_cases() if c.info["stack"].startswith("megatron-deepspeed")]
    return cases, other


def _evaluate(cases, catalog: Catalog, cc: CommConstants | None) -> dict:
    for c in cases:
        if hasattr(c, "evaluate"):
            c.evaluate(catalog, comm_constants=cc)
        else:  # a validation Case: its predictor takes the constants
            c.predicted = c.predict(replace(DEFAULT, catalog=catalog, comm=cc or CommConstants()))
    return metrics(cases)


def fit_megatron_deepspeed(catalog: Catalog | None = None) -> CommFit:
    """Fit ``megatron-deepspeed``'s ``tp_comm_factor`` on the seeded quarter of ``bigscience_a100`` (module
    doc): a bounded scalar search on log(factor), rounded to 0.01."""
    from scipy.optimize import minimize_scalar

    from hetplan.calibration.modern import bigscience

    base = catalog or load_catalog()
    cases, other = megatron_deepspeed_cases(base)
    cal = [c for c in cases if c.is_calibration]
    held = [c for c in cases if not c.is_calibration]
    stack = bigscience.STACK
    lo, hi = (math.log(b) for b in COMM_FACTOR_BOUNDS)
    res = minimize_scalar(lambda x: comm_loss(cal, math.exp(x), stack, base), bounds=(lo, hi), method="bounded",
                          options={"xatol": 1e-3})
    factor = round(math.exp(float(res.x)), 2)
    before, other_before = (_evaluate(cs, base, comm_trial(1.0, stack)) for cs in (held, other))
    after, other_after = (_evaluate(cs, base, comm_trial(factor, stack)) for cs in (held, other))
    return CommFit(resolve_stack(stack).id, factor, len(cal), len(held), before, after, other_before, other_after)


def _print_metrics(label: str, m: dict) -> None:  # pragma: no cover - prints the fit
    print(f"  {label}: MAPE {100 * m['mape']:.1f} %, signed median {100 * m['signed_median']:+.1f} %, "
          f"max {100 * m['max_abs_error']:.1f} %")


def main() -> None:  # pragma: no cover - prints the fit
    comm = fit_megatron_deepspeed()
    print(f"{comm.stack}: tp_comm_factor {comm.factor:.2f}; {comm.n_calibration} calibration rows, "
          f"{comm.n_held_out} held out")
    for label, m in (("held-out before", comm.held_out_before), ("held-out after", comm.held_out_after),
                     ("MT-NLG (2021 fork) before", comm.other_release_before),
                     ("MT-NLG (2021 fork) after", comm.other_release_after)):
        _print_metrics(label, m)
    fit = fit_foundry()
    print(f"{fit.gpu}: Triton FlashAttention at {fit.k:.3f} x FlashAttention-2; llm-foundry gemm_factor "
          f"{fit.gemm_factor:.3f}; {fit.n_calibration} calibration rows, {fit.n_held_out} held out")
    for name, m in (("before", fit.held_out_before), ("after", fit.held_out_after)):
        _print_metrics(f"held-out {name}", m)


if __name__ == "__main__":  # pragma: no cover
    main()
