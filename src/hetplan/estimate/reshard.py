"""Transfer across a pipeline boundary whose two stages lay out the micro-batch differently (resharding).

Stages of a fine-grained plan (Aceso, Liu et al. EuroSys'24, Sec. 3 and 4.1) may differ in TP degree, DP degree
and per-replica micro-batch. Both sides hold the same pipeline micro-batch of ``B = dp·mbs`` sequences; its
boundary activation has ``A = B·s·h·2`` bytes (fp16/bf16).

* The sender side holds ``A / dp_a`` per replica and, with Megatron-LM's scatter/gather optimisation (Narayanan et
  al. SC'21, Sec. 4.1), sends ``A / (dp_a·tp_a)`` per rank; the receiver side needs ``A / dp_b`` per replica and
  receives ``A / (dp_b·tp_b)`` per rank. Ranks send in parallel, so the side with fewer ranks sets the time:
  ``p2p(max(A/(dp_a·tp_a), A/(dp_b·tp_b)))``.
* When the layouts differ and the receiver has TP > 1, its TP group then all-gathers its ``A / dp_b`` slice
  (Aceso counts such resharding collectives between ops whose tensor layouts differ, Sec. 4.1); with equal
  layouts the gather is part of the measured / modelled layer, as before.

With equal ``(tp, dp, mbs)`` on both sides the result is exactly :func:`hetplan.estimate.stage.p2p_bytes` sent
with :func:`hetplan.estimate.comm.p2p_time_s`, the estimator's uniform-plan figure.

Units: seconds, bytes, bytes/s.
"""

from __future__ import annotations

from hetplan.estimate.comm import group_collective_time_s, p2p_time_s
from hetplan.estimate.stagework import Link
from hetplan.model import counts
from hetplan.model.spec import ModelSpec


def boundary_transfer_time_s(m: ModelSpec, seq_len: int, sender: tuple[int, int, int], receiver: tuple[int, int, int],
                             bandwidth_bytes_per_s: float, p2p_alpha_s: float, receiver_link: Link) -> float:
    """One transfer (activation forward, or gradient backward) across a boundary (see module doc).

    Args:
        sender, receiver: ``(tp, dp, mbs)`` of the two stages (mbs per replica, sequences).
        bandwidth_bytes_per_s: per-rank bandwidth of the boundary
            (:func:`hetplan.estimate.stage.boundary_bandwidth_bytes_per_s`).
        p2p_alpha_s: latency of the boundary transfer (:func:`hetplan.estimate.stage.boundary_alpha_s`).
        receiver_link: the receiver's :class:`~hetplan.estimate.stagework.Link` (its node, for its TP
            all-gather).
    Returns:
        seconds.
    """
    ta, da, ba = sender
    tb, db, bb = receiver
    total = da * ba * seq_len * m.hidden_size * counts.BYTES_PER_ACTIVATION
    per_rank = max(total / (da * ta), total / (db * tb))
    t = float(p2p_time_s(per_rank, bandwidth_bytes_per_s, p2p_alpha_s, efficiency=receiver_link.intra_link_efficiency))
    if (ta, da, ba) != (tb, db, bb) and tb > 1:
        t += float(group_collective_time_s(total / db, "allgather", tb, 1, receiver_link))
    return t
