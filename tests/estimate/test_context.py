"""Context parallelism (hetplan.estimate.context): local sequence, activations, K/V exchange."""

import pytest

from hetplan.degrees import Degrees
from hetplan.errors import HetplanError
from hetplan.estimate import comm, context
from hetplan.estimate.comm import group_collective_time_s
from hetplan.estimate.stagework import Link
from hetplan.model import counts
from hetplan.model.spec import load_model

M = load_model("llama3-70b")


def brute_causal_pairs(cp, s):
    """(query, key <= query) pairs of each rank under the 2·cp-chunk split (rank i: chunks i and 2cp-1-i)."""
    c = s // (2 * cp)
    work = []
    for r in range(cp):
        rows = list(range(r * c, (r + 1) * c)) + list(range((2 * cp - 1 - r) * c, (2 * cp - r) * c))
        work.append(sum(q + 1 for q in rows))
    return work


@pytest.mark.parametrize("cp", [2, 4, 8])
def test_load_balanced_split_gives_every_rank_the_same_causal_work(cp):
    work = brute_causal_pairs(cp, 64 * cp)
    assert len(set(work)) == 1


@pytest.mark.parametrize("attention", ["flash", "standard"])
@pytest.mark.parametrize("cp", [1, 2, 8])
def test_activations_per_rank(attention, cp):
    b, s, t = 1, 32768, 8
    ours = context.layer_activation_bytes(M, b, s, t, cp, True, "none", attention)
    local = counts.layer_activation_bytes(M, b, s / cp, t, True, "none", attention)
    if attention == "flash":
        assert ours == pytest.approx(local)
    else:  # the scores are (s/cp) x s per head: 2 bytes, no dropout
        linear_part = counts.layer_activation_bytes(M, b, s / cp, t, True, "selective", attention)
        assert ours - linear_part == pytest.approx(2 * M.num_attention_heads * (s / cp) * s * b / t)
    assert context.layer_activation_bytes(M, b, s, t, 1, True, "none", attention) == pytest.approx(
        counts.layer_activation_bytes(M, b, s, t, True, "none", attention))


def test_ring_hides_behind_long_blocks_and_is_exposed_without_compute():
    kw = dict(link=Link(8, 450e9, 400e9))
    b, s, t, cp = 1, 131072, 8, 4
    fwd, bwd = context.kv_exchange_time_s(M, b, s, t, cp, "ring", block_forward_s=1.0, **kw)
    assert fwd == 0 and bwd == 0
    fwd, bwd = context.kv_exchange_time_s(M, b, s, t, cp, "ring", block_forward_s=0.0, **kw)
    block = context.kv_block_bytes(M, b, s, t, cp)
    assert block == 2 * b * (s / cp) * 2 * 8 * 128 / t
    step = block / (400e9 / 8 * comm.INTER_LINK_EFFICIENCY) + comm.ALPHA_INTER_NODE_S  # t·cp = 32 > 8
    assert fwd == pytest.approx((cp - 1) * step) and bwd == pytest.approx(2 * fwd)


def test_allgather_is_the_cp_group_collective():
    kw = dict(link=Link(8, 450e9, 400e9))
    b, s, t, cp = 1, 131072, 2, 4
    fwd, bwd = context.kv_exchange_time_s(M, b, s, t, cp, "allgather", block_forward_s=0.0, **kw)
    gathered = context.kv_block_bytes(M, b, s, t, cp) * cp
    assert fwd == bwd == pytest.approx(group_collective_time_s(gathered, "allgather", cp, t, kw["link"],
                                                               nic_sharers=8))
    assert context.kv_exchange_time_s(M, b, s, t, 1, "allgather", 0.0, **kw) == (0, 0)


def test_gradient_reduction_and_bad_kind():
    assert Degrees(dp_replicate=4, cp=8).dense_dp == 32
    with pytest.raises(HetplanError, match="job.cp_kv_exchange"):
        context.check_kv_exchange("all2all")


def test_estimate_with_cp_splits_activations_and_uses_cp_times_the_gpus():
    from hetplan.estimate.estimator import estimate
    from hetplan.plan import GPUPool, Job, Plan, Stage

    def plan(cp):
        job = Job(model="llama3-8b", seq_len=65536, global_batch=8, attention="flash")
        pool = GPUPool(gpu="H100-SXM", count=8 * cp, gpus_per_node=8, inter_node_bandwidth_bytes_per_s=400e9)
        return Plan(job=job, pools=[pool], stages=[Stage(num_layers=32, tp=8, dp=1, recompute="full")], mbs=1,
                    sequence_parallel=True, cp=cp)

    one, four = estimate(plan(1)), estimate(plan(4))
    assert plan(4).num_gpus == 32
    assert four.stages[0].memory.activations < one.stages[0].memory.activations / 3
    assert four.iteration_time_s < one.iteration_time_s / 2


@pytest.mark.parametrize("cp", [2, 4, 8])
def test_without_load_balance_the_last_rank_does_2cp_minus_1_half_blocks(cp):
    """Brute force: contiguous chunks of c tokens; rank r's queries attend causally to every key up to their
    own; the busiest rank's pairs are attention_blocks(cp, False) half-blocks of c^2 (up to the diagonal's c/2)."""
    c = 64
    pairs = [sum(r * c + j + 1 for j in range(c)) for r in range(cp)]
    assert max(pairs) == pytest.approx(context.attention_blocks(cp, False) * c * c / 2, rel=1 / c)
    assert context.attention_blocks(cp, True) == cp


def test_estimate_without_load_balance_is_slower_only_with_cp():
    from hetplan.estimate.estimator import estimate
    from hetplan.plan import GPUPool, Job, Plan, Stage

    def est(cp, balance):
        job = Job(model="llama3-8b", seq_len=131072, global_batch=8, attention="flash", cp_load_balance=balance)
        pool = GPUPool(gpu="H100-SXM", count=8 * cp, gpus_per_node=8, inter_node_bandwidth_bytes_per_s=400e9)
        return estimate(Plan(job=job, pools=[pool], stages=[Stage(num_layers=32, tp=8, dp=1, recompute="full")],
                             mbs=1, sequence_parallel=True, cp=cp)).iteration_time_s

    assert est(4, False) > 1.3 * est(4, True)
    assert est(1, False) == est(1, True)


def test_a_pool_with_another_attention_kernel_runs_long_sequences_slower():
    """GPUPool.attention_efficiency (FlashAttention-2 on H100, 0.37 / 0.32 of the peak) replaces the catalog's
    cuDNN rates for that pool only."""
    from hetplan.estimate.compute import pool_gpu
    from hetplan.estimate.estimator import estimate
    from hetplan.hardware.catalog import load_catalog
    from hetplan.plan import GPUPool, Job, Plan, Stage

    pool = GPUPool(gpu="H100-SXM", count=8, attention_efficiency=(0.37, 0.32))
    assert pool_gpu(load_catalog(), pool).flash_attention_efficiency() == (0.37, 0.32)

    def est(p):
        job = Job(model="llama3-8b", seq_len=65536, global_batch=8, attention="flash")
        return estimate(Plan(job=job, pools=[p], stages=[Stage(num_layers=32, tp=8, dp=1, recompute="full")],
                             mbs=1, sequence_parallel=True)).iteration_time_s

    assert est(pool) > 1.2 * est(GPUPool(gpu="H100-SXM", count=8))
