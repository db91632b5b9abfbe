"""Plan schema helpers: balanced layer split and stage placement on nodes."""

import pytest
from hypothesis import given, strategies as st

from hetplan.plan import GPUPool, Job, Plan, Stage, balanced_split, boundary_is_intra_node


@given(st.integers(1, 200), st.integers(1, 200))
def test_balanced_split_properties(layers, pp):
    if pp > layers:
        with pytest.raises(ValueError):
            balanced_split(layers, pp)
        return
    split = balanced_split(layers, pp)
    assert sum(split) == layers and len(split) == pp
    assert max(split) - min(split) <= 1
    if pp > 2 and layers % pp <= pp - 2:  # extras go to middle stages first
        assert split[0] == split[-1] == layers // pp


def test_balanced_split_examples():
    assert balanced_split(26, 3) == [9, 9, 8]
    assert balanced_split(10, 4) == [2, 3, 3, 2]
    assert balanced_split(11, 4) == [3, 3, 3, 2]
    assert balanced_split(7, 1) == [7]


def test_boundaries_on_nodes():
    assert boundary_is_intra_node([2, 2, 2, 2], [0] * 4, [8]) == [True, True, True]
    assert boundary_is_intra_node([4, 4, 4, 4], [0] * 4, [8]) == [True, False, True]
    assert boundary_is_intra_node([8, 8], [0, 0], [8]) == [False]
    assert boundary_is_intra_node([2, 2], [0, 1], [8, 8]) == [False]


def test_plan_rejects_indivisible_global_batch():
    job = Job(model="gpt2-xl", seq_len=1024, global_batch=10)
    with pytest.raises(ValueError, match="not divisible by dp"):
        Plan(job=job, pools=[GPUPool(gpu="A10G", count=8)], stages=[Stage(num_layers=48, dp=4)], mbs=1)


def test_vectorised_boundary_count_matches_placement_rule():
    import numpy as np

    from hetplan.search.homogeneous import _intra_boundaries

    for g in (1, 2, 4, 8):
        sizes, pps = np.array([s for s in range(1, 20) for p in range(1, 12)]), np.array([p for s in range(1, 20) for p in range(1, 12)])
        got = _intra_boundaries(sizes, pps, g)
        want = [sum(boundary_is_intra_node([int(s)] * int(p), [0] * int(p), [g])) for s, p in zip(sizes, pps)]
        assert got.tolist() == want


def test_boundary_count_memory_does_not_grow_with_configurations_times_stages():
    """A 1,000-layer model on 16,384 GPUs counted its boundaries on a configurations x max(pp) table (18 GB, 74 s;
    a 10,000-layer one on 1,024 GPUs asked for 35 GiB): the count is per distinct stage size now."""
    import tracemalloc

    import numpy as np

    from hetplan.search.homogeneous import _intra_boundaries

    sizes, pps = np.tile([1, 2, 4, 8, 16], 4000), np.tile(np.arange(1, 1001), 20)
    tracemalloc.start()
    got = _intra_boundaries(sizes, pps, 8)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 8 * 2**20  # a 20,000 x 1,000 table of int64 is 160 MB
    assert got[:5].tolist() == [sum(boundary_is_intra_node([int(s)] * int(p), [0] * int(p), [8]))
                                for s, p in zip(sizes[:5], pps[:5])]


@pytest.mark.parametrize("where, field, value", [
    ("job", "train_iterations", True), ("job", "mtp_layers", True), ("job", "global_batch", False),
    ("plan", "zero", True), ("plan", "mbs", True), ("stage", "num_layers", True), ("pool", "count", True),
])
def test_a_boolean_is_no_number(where, field, value):
    """pydantic reads ``true`` as 1 (``train_iterations = true`` ran one iteration, ``zero = true`` ZeRO-1): every
    number of the models a user fills refuses a boolean, naming the field; a real number still passes."""
    from hetplan.errors import HetplanError
    from hetplan.jobfile import validated

    job = dict(model="llama3-8b", seq_len=4096, global_batch=64)
    pool = dict(gpu="H100-SXM", count=8)
    stage = dict(num_layers=32, tp=1, dp=8)
    plan = dict(job=job, pools=[pool], stages=[stage], mbs=1, zero=1)
    cls, data = {"job": (Job, job), "pool": (GPUPool, pool), "stage": (Stage, stage), "plan": (Plan, plan)}[where]
    validated(cls, data, where)
    with pytest.raises(HetplanError, match=f"{field} is a number, not {str(value).lower()}") as err:
        validated(cls, {**data, field: value}, where)
    assert err.value.field == f"{where}.{field}"


def test_a_bound_error_gives_the_reason_of_its_own_bound():
    """A field's reason for its upper bound ("a million GPUs is 5x the largest cluster built") is given when the
    value passes that bound, not when it is below the lower one (−8 GPUs)."""
    from hetplan.errors import HetplanError
    from hetplan.jobfile import validated

    with pytest.raises(HetplanError) as low:
        validated(GPUPool, dict(gpu="H100-SXM", count=-8), "pool")
    assert low.value.field == "pool.count" and "greater than 0" in str(low.value) and "cluster" not in str(low.value)
    with pytest.raises(HetplanError) as high:
        validated(GPUPool, dict(gpu="H100-SXM", count=10**7), "pool")
    assert "largest cluster" in str(high.value)


def test_hsdp_shard_group_without_sharding_is_refused():
    """``fsdp_shard`` (HSDP's shard groups) on a plan whose ZeRO stage shards nothing (0 or 1) changed nothing: the
    estimate was that of the plan without it. It is refused; under ZeRO-3 / FSDP it shards."""
    def plan(zero, framework):
        return Plan(job=Job(model="llama3-8b", seq_len=4096, global_batch=64, framework=framework), mbs=1,
                    zero=zero, fsdp_shard=8, pools=[GPUPool(gpu="H100-SXM", count=64)],
                    stages=[Stage(num_layers=32, tp=1, dp=64)])
    for zero, framework in ((1, "megatron"), (0, "fsdp")):
        with pytest.raises(ValueError, match="fsdp_shard = 8 sets HSDP's shard groups"):
            plan(zero, framework)
    assert plan(3, "fsdp").fsdp_shard == 8

