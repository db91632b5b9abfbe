"""ParallelLayout: one frozen, validated object for every parallel degree of a stage."""

import pytest
from pydantic import ValidationError

from hetplan.plan import GPUPool, Job, ParallelLayout, Plan, Stage


def test_degrees_and_sizes():
    lay = ParallelLayout(tp=8, cp=2, ep=4, dp_shard=4, dp_replicate=2, pp=4, zero_stage=3)
    assert lay.dp == 8
    assert lay.gpus_per_stage == 8 * 2 * 8
    assert lay.world_size == 128 * 4
    assert lay.expert_dp == 128 // 4


def test_frozen_and_hashable():
    lay = ParallelLayout(tp=2)
    with pytest.raises(ValidationError):
        lay.tp = 4
    assert len({ParallelLayout(tp=2), ParallelLayout(tp=2)}) == 1


@pytest.mark.parametrize("kwargs, rule", [
    ({"tp": 0}, "greater than or equal to 1"),
    ({"dp_shard": 2}, "needs zero_stage >= 1"),
    ({"tp": 2, "ep": 4}, "must divide tp \\* cp \\* dp"),
    ({"zero_stage": 4}, "less than or equal to 3"),
    ({"pipeline": 2}, "Extra inputs are not permitted"),
])
def test_invalid_layouts_name_the_rule(kwargs, rule):
    with pytest.raises(ValidationError, match=rule):
        ParallelLayout(**kwargs)


def test_of_shards_dp_under_zero_and_replicates_without():
    assert ParallelLayout.of(dp=4, zero_stage=1).dp_shard == 4
    assert ParallelLayout.of(dp=4, zero_stage=0).dp_replicate == 4


def test_plan_stage_layout_reads_the_plan():
    plan = Plan(job=Job(model="gpt2-xl", seq_len=1024, global_batch=32), pools=[GPUPool(gpu="A100-SXM-80GB", count=16)],
                stages=[Stage(num_layers=24, tp=2, dp=4), Stage(num_layers=24, tp=4, dp=2)], mbs=1, zero=1,
                sequence_parallel=True, virtual_stages=2)
    a, b = plan.stage_layout(0), plan.stage_layout(1)
    assert (a.tp, a.dp_shard, a.dp_replicate, a.pp, a.virtual_stages, a.zero_stage) == (2, 4, 1, 2, 2, 1)
    assert a.sequence_parallel_active and b.tp == 4 and b.dp == 2
    assert sum(plan.stage_layout(i).gpus_per_stage for i in range(plan.pp)) == plan.num_gpus


def test_degrees_arrays_give_each_configurations_group_sizes():
    """Degrees holds ints (a plan) or arrays (a search) under the same names; every derived group size of an
    array is that of the ints, element by element, and a layout's degrees are its own."""
    import numpy as np

    from hetplan.degrees import Degrees

    tp, cp, dp, ep, zero = (np.array(x) for x in ([1, 2, 4, 8], [1, 2, 1, 2], [8, 4, 2, 1], [8, 2, 8, 16],
                                                   [0, 1, 3, 1]))
    arr = Degrees.of(tp=tp, cp=cp, dp=dp, zero=zero, ep=ep, pp=2)
    for i in range(4):
        one = Degrees.of(tp=int(tp[i]), cp=int(cp[i]), dp=int(dp[i]), zero=int(zero[i]), ep=int(ep[i]), pp=2)
        for name in ("dp", "gpus_per_stage", "world_size", "dense_dp", "expert_ranks", "expert_dp"):
            assert getattr(arr, name)[i] == getattr(one, name), name
    assert arr.expert_dp.tolist() == [1.0, 8.0, 1.0, 1.0]  # tp·cp·dp / ep: 8/8, 16/2, 8/8, 16/16
    assert Degrees.of(dp=4, zero=1).dp_shard == 4 and Degrees.of(dp=4, zero=0).dp_replicate == 4
    lay = ParallelLayout(tp=2, cp=2, ep=4, dp_shard=2, dp_replicate=2, pp=3, zero_stage=1)
    assert (lay.degrees.gpus_per_stage, lay.degrees.world_size, lay.expert_dp) == (16, 48, 4)
