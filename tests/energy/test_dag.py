"""Pipeline DAG construction."""

from __future__ import annotations

import numpy as np
import pytest

from hetplan.energy.dag import build_pipeline_dag, stage_order
from hetplan.errors import HetplanError

# DeepSpeed/Lowtime synchronous 1F1B order for 4 stages x 6 micro-batches (as printed by the reference planner)
REF_1F1B_4x6 = [
    "F0 F1 F2 F3 B0 F4 B1 F5 B2 B3 B4 B5",
    "F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 B4 B5",
    "F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 B5",
    "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5",
]


def _fmt(order):
    return " ".join(("F" if k == 0 else "B") + str(m) for k, m, _c in order)


def test_1f1b_order_matches_reference():
    assert [_fmt(stage_order("1f1b", 4, 6, s)) for s in range(4)] == REF_1F1B_4x6
    assert _fmt(stage_order("1f1b", 4, 2, 0)) == "F0 F1 B0 B1"
    # the estimator's GPipe (Megatron-LM order: backwards in micro-batch order), one order for both
    assert _fmt(stage_order("gpipe", 2, 3, 0)) == "F0 F1 F2 B0 B1 B2"


def test_order_is_the_estimators():
    from hetplan.estimate.schedule import stage_order as est_order

    for schedule, S, M, v in (("1f1b", 4, 6, 1), ("gpipe", 3, 5, 1), ("interleaved", 2, 4, 2), ("interleaved", 4, 8, 3)):
        for s in range(S):
            got = [("F" if k == 0 else "B", m, c) for k, m, c in stage_order(schedule, S, M, s, v)]
            assert got == est_order(schedule, S, s, M, v)


def test_interleaved_dag_is_the_estimators_schedule():
    """Longest path of the DAG with unit forward and double backward = the estimator's interleaved makespan
    (zero p2p), which is the closed form (m + (p-1)/v)·(f+b) scaled by the chunk size."""
    from hetplan.estimate.schedule import simulate

    S, M, v = 4, 8, 2
    d = build_pipeline_dag(S, M, "interleaved", v)
    assert d.num_ops == 2 * S * M * v
    dur = np.where(d.kind == 0, 1.0, 2.0) / v
    lvl_end = np.zeros(d.num_ops)
    for level in d.levels:
        for u in level:
            preds = d.src[d.dst == u]
            lvl_end[u] = (lvl_end[preds].max() if preds.size else 0.0) + dur[u]
    est = simulate([1.0] * S, [2.0] * S, [0.0] * (S - 1), M, "interleaved", v)
    assert lvl_end.max() == pytest.approx(est.makespan_s)
    assert lvl_end.max() == pytest.approx((M + (S - 1) / v) * 3.0)


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
@pytest.mark.parametrize("S,M", [(1, 1), (2, 3), (8, 12), (16, 64)])
def test_dag_shape(schedule, S, M):
    d = build_pipeline_dag(S, M, schedule)
    assert d.num_ops == 2 * S * M
    assert d.src.size == S * (2 * M - 1) + 2 * (S - 1) * M
    # levels are a topological order: every edge goes to a later level
    lvl = np.empty(d.num_ops, int)
    for k, idx in enumerate(d.levels):
        lvl[idx] = k
    assert (lvl[d.src] < lvl[d.dst]).all()
    assert d.entry.tolist() == [d.stage_ops[0][0]]
    # each micro-batch: forward crosses stages upward, backward downward
    for s in range(S):
        assert sorted(d.microbatch[d.stage_ops[s]].tolist()) == sorted(list(range(M)) * 2)


def test_dag_errors():
    with pytest.raises(HetplanError, match="micro-batches"):
        build_pipeline_dag(2, 0)
    with pytest.raises(HetplanError, match="stages"):
        build_pipeline_dag(-1, 3)
    with pytest.raises(HetplanError, match="unknown schedule"):
        build_pipeline_dag(2, 2, "zigzag")
    with pytest.raises(HetplanError, match="multiple"):
        build_pipeline_dag(4, 6, "interleaved", 2)
    with pytest.raises(HetplanError, match="interleaved"):
        build_pipeline_dag(4, 8, "1f1b", 2)
