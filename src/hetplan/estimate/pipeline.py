"""Iteration time of a pipeline from per-stage costs (1F1B and GPipe).

For p stages with per-micro-batch forward f_i and backward b_i, m micro-batches and p2p transfer times c_j
on the p-1 stage boundaries (each crossed once forward, once backward per micro-batch), both schedules take

    T = sum_i (f_i + b_i) + 2 sum_j c_j + (m - 1) · max_i (f_i + b_i)

(the fill/drain of one micro-batch through every stage, then m-1 micro-batches at the bottleneck stage's pace:
Narayanan et al. SC'21 Sec. 2.2 for equal stages, generalised to unequal stages as in FASOP (Hwang et al.
HPDC'24, Eq. 4) and Espresso). The pipeline bubble is the time the bottleneck stage waits:
``T - m · max_i (f_i + b_i)``. Event simulation of the schedules comes with the estimator-fidelity work.

Arrays: ``stage_*`` have shape (..., K) over K stage kinds, each kind repeated ``count`` times (count 0 = absent).
"""

from __future__ import annotations

import numpy as np


def pipeline_time_s(stage_forward_s, stage_backward_s, count, p2p_total_s, num_microbatches):
    """Return ``(iteration_pipeline_time_s, bottleneck_stage_time_s, bubble_time_s)`` (arrays over configs)."""
    per = stage_forward_s + stage_backward_s
    total = np.sum(per * count, axis=-1)
    bottleneck = np.max(np.where(count > 0, per, 0.0), axis=-1)
    t = total + 2 * p2p_total_s + (num_microbatches - 1) * bottleneck
    return t, bottleneck, t - num_microbatches * bottleneck
