"""Synchronous training runs at the pace of its slowest GPU.

GPUs of one SKU do not run equally fast: manufacturing variability under the GPU's power and thermal management
gives each board its own sustained clock. Sinha et al., "Not All GPUs Are Created Equal: Characterizing
Variability in Large-Scale, Accelerator-Rich Systems" (SC'22, arXiv 2208.11035), measured this on four clusters
(V100 and MI60, over 90 % of each cluster's GPUs): 8 % average performance variation (max 22 %) between GPUs of
one SKU, outliers up to 1.5x slower than the median GPU, whatever the application or the cooling.

A training step of a pipeline stage synchronises its ``n = tp · cp · dp`` GPUs: every TP collective of every
layer, the CP exchange and the data-parallel gradient reduction wait for the last rank to arrive. So the stage's
compute runs at the pace of the slowest of ``n`` GPUs. With each GPU's sustained time per unit of work
``1 + σ·Z`` (Z standard normal, σ :attr:`hetplan.hardware.catalog.GPUSpec.speed_variability`), the slowest of
``n`` takes ``1 + σ·E[max of n Z]`` (:func:`expected_max_normal`).

The catalog's GEMM and attention efficiencies were fitted on, and measured at, one node or less (vTrain's
single-node A100 profiles, the kernels' single-GPU benchmarks): they already hold the slowest of up to
:data:`REFERENCE_GPUS` GPUs. A stage of ``n`` GPUs is charged the gap beyond that (:func:`slowest_gpu_factor`):
``1 + σ·max(0, E[max of n] − E[max of 8])`` — +0.9σ at 64 GPUs, +2.0σ at 2,048, +2.5σ at 16,384.

Not modelled: the pipeline's stages are coupled only through their point-to-point transfers, so the slowest of
all ``pp · n`` GPUs is not charged; a GPU that changes speed within a run (each collective then waits for a
different rank; FP8's higher power draw makes this larger) is charged as one that keeps its speed.
"""

from __future__ import annotations

import math

import numpy as np

from hetplan.estimate.arrays import Array

#: GPUs the catalog's efficiencies already hold the slowest of: one 8-GPU node (module doc).
REFERENCE_GPUS = 8


#: Quadrature grid of :func:`expected_max_normal` (standard deviations): the tails beyond ±9 add under 1e-9 for n
#: up to 10^9; trapezoids of 0.005 reproduce Harter's (1961) tabulated values to 1e-5 (tests). Φ from ``math.erfc``
#: (scipy's import would cost every ``hetplan plan`` 0.2 s).
_GRID = np.linspace(-9.0, 9.0, 3601)
_LOG_CDF = np.log(np.maximum([0.5 * math.erfc(-x / math.sqrt(2.0)) for x in _GRID], 1e-300))  # log Φ(x)
_KNOWN: dict[int, float] = {1: 0.0}


def _integrate(n: np.ndarray) -> np.ndarray:
    """``E[max of n]`` for each of the integers ``n`` (module doc) on :data:`_GRID`."""
    power = np.exp(n[:, None] * _LOG_CDF[None, :])  # Φ(x)^n
    pos = _GRID >= 0
    neg = _GRID <= 0
    return (np.trapezoid(1.0 - power[:, pos], _GRID[pos], axis=1)
            - np.trapezoid(power[:, neg], _GRID[neg], axis=1))


def expected_max_normal(n: Array) -> np.ndarray:
    """``E[max(Z_1..Z_n)]`` of ``n`` independent standard normal variables (``n`` GPUs, rounded, at least 1):
    ``∫_0^∞ (1 − Φ(x)^n) dx − ∫_{−∞}^0 Φ(x)^n dx`` by the trapezoid rule on :data:`_GRID`, each ``n`` once per
    process (0 for one, 1.4236 for 8, 3.4 for 2,048). Arrays broadcast."""
    n = np.maximum(np.rint(np.asarray(n, dtype=float)), 1.0).astype(np.int64)
    values, inverse = np.unique(n, return_inverse=True)
    new = np.array([v for v in values if int(v) not in _KNOWN], dtype=np.int64)
    if new.size:
        _KNOWN.update(zip((int(v) for v in new), _integrate(new.astype(float)).tolist()))
    return np.array([_KNOWN[int(v)] for v in values])[inverse].reshape(n.shape)


def slowest_gpu_factor(n: Array, speed_variability: Array) -> np.ndarray:
    """Factor on the compute time of a pipeline stage of ``n = tp · cp · dp`` GPUs (module doc):
    ``1 + σ·max(0, E[max of n] − E[max of REFERENCE_GPUS])``, ``σ`` the GPU's ``speed_variability``
    (dimensionless: the standard deviation of its sustained speed over the mean). 1 up to one node. Arrays
    broadcast."""
    gap = np.maximum(expected_max_normal(n) - expected_max_normal(REFERENCE_GPUS), 0.0)
    return 1.0 + np.asarray(speed_variability, dtype=float) * gap
