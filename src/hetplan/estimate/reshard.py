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

from hetplan.estimate.comm import ALPHA_INTER_NODE_S, group_collective_time_s, p2p_time_s
from hetplan.model import counts
from hetplan.model.spec import ModelSpec


def boundary_transfer_time_s(m: ModelSpec, seq_len: int, sender: tuple[int, int, int], receiver: tuple[int, int, int],
                             bandwidth_bytes_per_s: float, *, gpus_per_node: int = 8,
                             intra_node_bandwidth_bytes_per_s: float | None = None,
                             inter_node_bandwidth_bytes_per_s: float | None = None,
                             p2p_alpha_s: float = ALPHA_INTER_NODE_S,
                             inter_node_alpha_s: float = ALPHA_INTER_NODE_S,
                             intra_node_alpha_s: float | None = None) -> float:
    """One transfer (activation forward, or gradient backward) across a boundary (see module doc).

    Args:
        sender, receiver: ``(tp, dp, mbs)`` of the two stages (mbs per replica, sequences).
        bandwidth_bytes_per_s: per-rank bandwidth of the boundary
            (:func:`hetplan.estimate.stage.boundary_bandwidth_bytes_per_s`).
        gpus_per_node, intra_node_bandwidth_bytes_per_s, inter_node_bandwidth_bytes_per_s: the receiver's node
            (for its TP all-gather; default intra = ``bandwidth_bytes_per_s``).
        p2p_alpha_s: latency of the boundary transfer (:func:`hetplan.estimate.stage.boundary_alpha_s`);
        inter_node_alpha_s: the receiver's per-step latency between nodes (its network); intra_node_alpha_s: inside
            its node (default :data:`hetplan.estimate.comm.ALPHA_INTRA_NODE_S`).
    Returns:
        seconds.
    """
    ta, da, ba = sender
    tb, db, bb = receiver
    total = da * ba * seq_len * m.hidden_size * counts.BYTES_PER_ACTIVATION
    per_rank = max(total / (da * ta), total / (db * tb))
    t = float(p2p_time_s(per_rank, bandwidth_bytes_per_s, p2p_alpha_s))
    if (ta, da, ba) != (tb, db, bb) and tb > 1:
        intra = intra_node_bandwidth_bytes_per_s or bandwidth_bytes_per_s
        inter = inter_node_bandwidth_bytes_per_s or intra
        t += float(group_collective_time_s(total / db, "allgather", tb, 1, gpus_per_node, intra, inter,
                                           inter_alpha_s=inter_node_alpha_s, intra_alpha_s=intra_node_alpha_s))
    return t
