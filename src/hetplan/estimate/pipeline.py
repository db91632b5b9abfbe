"""Closed-form iteration time of a pipeline from per-stage costs (GPipe, 1F1B, interleaved 1F1B), vectorised.

For p stages with per-micro-batch forward f_i and backward b_i, m micro-batches, p2p transfer times c_j on the
p-1 stage boundaries (each crossed once forward, once backward per micro-batch) and v virtual stages per stage
(v = 1 without interleaving):

    T = Σ_i (f_i + b_i) / v + 2 Σ_j c_j + (m - 1/v) · max_i (f_i + b_i)

(the fill/drain of one micro-batch chunk through every stage, then the rest at the bottleneck stage's pace:
Narayanan et al. SC'21 Sec. 2.2 for equal stages, bubble ``(p-1)/v · (f+b)``; generalised to unequal stages as in
FASOP, Hwang et al. HPDC'24, Eq. 4, and Espresso). The pipeline bubble is the time the bottleneck stage waits:
``T - m · max_i (f_i + b_i)``.

This is what the search uses on arrays of thousands of configurations. :func:`hetplan.estimate.schedule.simulate`
is the exact event simulation used by :func:`hetplan.estimate.estimator.estimate`; the two agree exactly for
equal stages without p2p time. With unequal stages or p2p time the simulation can be longer (in 1F1B each
boundary's p2p lies on the steady-state cycle of the stages before it) or shorter (a slow first stage overlaps
the others' fill and drain) — see docs/estimator.md.

Arrays: ``stage_*`` have shape (..., K) over K stage kinds, each kind repeated ``count`` times (count 0 = absent).
Cost: O(K) per configuration, independent of the number of layers and micro-batches.
"""

from __future__ import annotations

import numpy as np
from hetplan.estimate.arrays import Array


def pipeline_time_s(stage_forward_s: Array, stage_backward_s: Array, count: Array, p2p_total_s: Array,
                    num_microbatches: Array, *, virtual_stages: Array = 1):
    """Return ``(iteration_pipeline_time_s, bottleneck_stage_time_s, bubble_time_s)`` (arrays over configs).

    Args:
        virtual_stages: v of interleaved 1F1B (array allowed); 1 for GPipe / 1F1B.
    """
    per = stage_forward_s + stage_backward_s
    v = np.asarray(virtual_stages, dtype=float)
    total = np.sum(per * count, axis=-1)
    bottleneck = np.max(np.where(count > 0, per, 0.0), axis=-1)
    t = total / v + 2 * p2p_total_s + (num_microbatches - 1.0 / v) * bottleneck
    return t, bottleneck, t - num_microbatches * bottleneck
