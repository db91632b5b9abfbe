"""Assembly of pipeline stages into one training iteration: the one place where per-stage costs
(:func:`hetplan.estimate.stage.stage_costs`) and pipeline-boundary transfers become an iteration time.

The estimator (:func:`hetplan.estimate.estimator.estimate`, one plan or a batch), the homogeneous search (arrays
of configurations, stage kinds repeated ``count`` times), the heterogeneous search (whose exact layer partition,
:mod:`hetplan.search.partition`, minimises the closed form below) and the fine-grained search all call it, so a
term added here reaches every one of them.

For p stages with per-micro-batch forward ``f_i`` and backward ``b_i`` (s), exposed data-parallel time ``e_i``
and optimizer step ``o_i`` (s), ``m`` micro-batches, one-way boundary transfers ``c_j`` (s, :func:`boundary_time_s`):

* **closed form** (:func:`hetplan.estimate.pipeline.pipeline_time_s`): pipeline ``T = Σ(f+b)/v + 2Σc +
  (m - 1/v)·max(f+b)``; iteration ``T + max_i e_i + max_i o_i``;
* **simulated** (:mod:`hetplan.estimate.schedule`, or the search's exact 1F1B recurrence): each stage reduces its
  gradients after its own last backward (it ends at ``end_i``), the optimizer step (whose gradient-norm all-reduce
  spans the stages) waits for all: iteration ``max_i (end_i + e_i) + max_i o_i``; the exposed DP time reported is
  what the reduction adds after the pipeline's makespan.

A framework that runs an iteration as ``calls`` calls of its pipeline schedule of ``m`` micro-batches each,
accumulating gradients across them (:attr:`hetplan.plan.Plan.pipeline_step_microbatches`, NeMo AutoModel), flushes
the pipeline and reduces the gradients in every call (``torch.distributed.pipelining``: each call's last backward
runs the data-parallel reduction, ``stage.py`` ``backward_maybe_with_nosync``): iteration
``calls·(T + max_i e_i) + max_i o_i``, and ``calls`` times every per-call figure below.

The bubble reported apart is ``max(0, T - m·max(f+b) - 2Σc)`` (the transfers are reported as ``p2p_s``). Memory:
the stage with the largest share of its GPU's memory is the peak; the plan fits when every stage does.

Arrays: stage quantities have shape ``(..., K)`` over K stages (or stage kinds, each repeated ``count`` times;
count 0 = absent), per-pipeline ones shape ``(...)``. Units: seconds, bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hetplan.estimate.comm import p2p_time_s
from hetplan.estimate.pipeline import pipeline_time_s
from hetplan.estimate.reshard import boundary_transfer_time_s
from hetplan.estimate.stage import Link, boundary_alpha_s, boundary_bandwidth_bytes_per_s, p2p_bytes
from hetplan.model.spec import ModelSpec
from hetplan.estimate.arrays import Array


@dataclass(frozen=True, slots=True)
class IterationTime:
    """One iteration of each pipeline (module doc), arrays over pipelines (s): ``pipeline_s`` the makespan of the
    forward/backward schedule, ``bottleneck_s`` the slowest stage's forward+backward per micro-batch, ``bubble_s``
    the bottleneck stage's idle time less the transfers, ``p2p_s`` the transfers (both directions),
    ``dp_exposed_s`` data-parallel time not hidden, ``optimizer_s`` the slowest stage's step, ``iteration_s``
    the whole; ``peak_stage`` the index of the stage using the largest share of its GPU memory and ``fits``
    whether every stage fits (when memory was given)."""

    pipeline_s: np.ndarray
    bottleneck_s: np.ndarray
    bubble_s: np.ndarray
    p2p_s: np.ndarray
    dp_exposed_s: np.ndarray
    optimizer_s: np.ndarray
    iteration_s: np.ndarray
    peak_stage: np.ndarray | None = None
    fits: np.ndarray | None = None


def assemble_iteration(forward_s: Array, backward_s: Array, dp_exposed_s: Array, optimizer_s: Array,
                       p2p_total_s: Array, num_microbatches: Array, *,
                       count: Array = None, virtual_stages: Array = 1, simulated: Array = None,
                       memory_bytes: Array = None,
                       capacity_bytes: Array = None, calls: Array = 1) -> IterationTime:
    """Iteration time of pipelines from their stages' costs (module doc).

    Args:
        forward_s, backward_s, dp_exposed_s, optimizer_s: per stage, shape ``(..., K)``.
        p2p_total_s: Σ of the one-way boundary transfers of each pipeline, shape ``(...)``.
        num_microbatches: m per pipeline (per call of the schedule); virtual_stages: v of interleaved 1F1B (1
            otherwise); calls: calls of the schedule per iteration (module doc), shape ``(...)`` or a scalar.
        count: how many stages of each kind (``(..., K)``, 0 = absent); default one of each.
        simulated: ``(makespan_s, stage_end_s)`` of an event-simulated schedule (shapes ``(...)`` and
            ``(..., K)``); default the closed form.
        memory_bytes, capacity_bytes: per stage (bytes): the peak stage and whether all fit.
    """
    f, b = np.asarray(forward_s, dtype=float), np.asarray(backward_s, dtype=float)
    e, o = np.asarray(dp_exposed_s, dtype=float), np.asarray(optimizer_s, dtype=float)
    per = f + b
    present = np.ones(per.shape, dtype=bool) if count is None else np.asarray(count) > 0
    optimizer = np.max(np.where(present, o, 0.0), axis=-1)
    if simulated is None:
        cnt = present.astype(float) if count is None else count
        t_pipe, bottleneck, _ = pipeline_time_s(f, b, cnt, p2p_total_s, num_microbatches,
                                                virtual_stages=virtual_stages)
        dp_exposed = np.max(np.where(present, e, 0.0), axis=-1)
        iteration = t_pipe + dp_exposed + optimizer
    else:
        t_pipe, ends = (np.asarray(x, dtype=float) for x in simulated)
        bottleneck = np.max(np.where(present, per, 0.0), axis=-1)
        after = np.max(np.where(present, ends + e, -np.inf), axis=-1)
        dp_exposed = after - t_pipe
        iteration = after + optimizer
    p2p = np.asarray(p2p_total_s, dtype=float)
    bubble = np.maximum(0.0, t_pipe - num_microbatches * bottleneck - 2 * p2p)
    n = np.asarray(calls, dtype=float)
    if np.any(n != 1.0):  # every call flushes the pipeline and reduces the gradients; one optimizer step
        t_pipe, bubble, p2p, dp_exposed = n * t_pipe, n * bubble, n * p2p, n * dp_exposed
        iteration = t_pipe + dp_exposed + optimizer
    peak = fits = None
    if memory_bytes is not None:
        mem = np.asarray(memory_bytes, dtype=float)
        cap = np.asarray(capacity_bytes, dtype=float)
        peak = np.argmax(np.where(present, mem / cap, -np.inf), axis=-1)
        fits = np.all(~present | (mem <= cap), axis=-1)
    return IterationTime(t_pipe, bottleneck, bubble, 2 * p2p, dp_exposed, optimizer, iteration, peak, fits)


def boundary_time_s(m: ModelSpec, seq_len: Array, sender: Array, receiver: Array, sender_link: Link,
                    receiver_link: Link, intra_node: Array) -> Array:
    """One-way time of one micro-batch across pipeline boundaries (s; the activation forward, or its gradient
    backward), as every caller prices it.

    Args:
        sender, receiver: the two stages' ``(tp, cp, dp, mbs)`` (ints or arrays; mbs per replica, sequences).
        sender_link, receiver_link: their :class:`~hetplan.estimate.stage.Link` (fields scalars or arrays).
        intra_node: whether both stages sit in one node (:func:`hetplan.plan.boundary_is_intra_node`).

    Equal layouts: a p2p send of :func:`~hetplan.estimate.stage.p2p_bytes` (the rank's ``s/cp`` tokens) over
    :func:`~hetplan.estimate.stage.boundary_bandwidth_bytes_per_s` with
    :func:`~hetplan.estimate.stage.boundary_alpha_s`; layouts that differ in TP, DP or micro-batch reshard
    (:func:`hetplan.estimate.reshard.boundary_transfer_time_s`, one boundary at a time). Returns a float for
    scalar arguments, else an array.
    """
    ts, cs, ds, bs = (np.asarray(x) for x in sender)
    tr, dr, br = (np.asarray(x) for x in (receiver[0], receiver[2], receiver[3]))
    bw = boundary_bandwidth_bytes_per_s(sender_link, receiver_link, ts * cs * ds, intra_node)
    alpha = boundary_alpha_s(sender_link, receiver_link, intra_node)
    msg = p2p_bytes(m, bs, seq_len / cs, np.maximum(ts, tr), False)
    # at NCCL's intra-node fraction of the bandwidth, as every pipeline send (network.toml's one p2p efficiency)
    out = np.asarray(p2p_time_s(msg, bw, alpha, efficiency=receiver_link.intra_link_efficiency), dtype=float)
    reshard = (ts != tr) | (ds != dr) | (bs != br)
    if not np.any(reshard):
        return out if out.ndim else float(out)
    out = np.array(np.broadcast_to(out, np.broadcast(out, reshard).shape))
    bw, alpha = np.broadcast_to(bw, out.shape), np.broadcast_to(alpha, out.shape)
    rl = [np.broadcast_to(np.asarray(x), out.shape) for x in (
        receiver_link.gpus_per_node, receiver_link.intra_node_bandwidth_bytes_per_s,
        receiver_link.inter_node_bandwidth_bytes_per_s, receiver_link.inter_node_alpha_s,
        receiver_link.intra_node_alpha_s, receiver_link.intra_link_efficiency, receiver_link.inter_link_efficiency)]
    lay = [np.broadcast_to(x, out.shape) for x in (ts, ds, bs, tr, dr, br)]
    s = np.broadcast_to(np.asarray(seq_len), out.shape)
    mask = np.broadcast_to(reshard, out.shape)
    for j in (map(tuple, np.argwhere(mask)) if out.ndim else [()]):
        out[j] = boundary_transfer_time_s(
            m, int(s[j]), (int(lay[0][j]), int(lay[1][j]), int(lay[2][j])),
            (int(lay[3][j]), int(lay[4][j]), int(lay[5][j])), float(bw[j]), float(alpha[j]),
            Link(int(rl[0][j]), float(rl[1][j]), float(rl[2][j]), inter_node_alpha_s=float(rl[3][j]),
                 intra_node_alpha_s=float(rl[4][j]), intra_link_efficiency=float(rl[5][j]),
                 inter_link_efficiency=float(rl[6][j])))
    return out if out.ndim else float(out)
