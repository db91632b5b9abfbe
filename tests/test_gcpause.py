"""hetplan.gcpause: the collector is off inside, and back to its previous state after — also when the block
raises, and when it was already off (the batched estimator runs inside the paused search)."""

import gc

import pytest

from hetplan.gcpause import paused_gc


def test_paused_inside_and_restored_after_also_on_error():
    assert gc.isenabled()
    with paused_gc():
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(ValueError), paused_gc():
        raise ValueError("boom")
    assert gc.isenabled()


def test_nested_pause_leaves_the_outer_one_in_force():
    with paused_gc():
        with paused_gc():
            pass
        assert not gc.isenabled()
    assert gc.isenabled()


def test_decorated_search_restores_the_collector():
    from hetplan.plan import GPUPool, Inventory, Job
    from hetplan.search.planner import search_plans

    result = search_plans(Job(model="llama2-7b", seq_len=2048, global_batch=64),
                          Inventory(pools=[GPUPool(gpu="A100-SXM-80GB", count=8)]), top_k=1)
    assert result.plans and gc.isenabled()
