"""Scheduler, policies and simulator: a worked timeline, residency by bytes, continuous vs static batching,
policies, properties."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hetplan.errors import HetplanError
from hetplan.serve.exec_model import LinearStepModel
from hetplan.serve.policies import LoadAwarePolicy, ModelState, Policy, make_policy
from hetplan.serve.scheduler import Execute, Scheduler, Swap
from hetplan.serve.simulator import SimModel, simulate, swap_cost_fn
from hetplan.serve.swap_model import SwapModel
from hetplan.serve.workload import Request


def _models(sizes, exec_s=0.5):
    return [SimModel(n, [b], LinearStepModel(base_s=exec_s)) for n, b in sizes.items()]


def _const_swap(t_in):
    return lambda load, evict: t_in


def test_worked_timeline():
    """3 models of 10 bytes, 20 bytes per worker, swap 1 s, batch 0.5 s (hand-computed in the docstring of
    docs/serving.md): A@0, B@0, C@0.1, A@0.2."""
    reqs = [Request(0, "A", 0.0), Request(1, "B", 0.0), Request(2, "C", 0.1), Request(3, "A", 0.2)]
    res = simulate(_models({"A": 10, "B": 10, "C": 10}), reqs, capacity_bytes=20, policy=Policy(),
                   swap_cost=_const_swap(1.0))
    lat = {r.id: r.latency_s for r in res.records}
    # load A [0,1]; run A(0,3) [1,1.5]; load B [1,2]; run B [2,2.5]; evict A + load C [2,3]; run C [3,3.5]
    assert lat == pytest.approx({0: 1.5, 1: 2.5, 2: 3.4, 3: 1.3})
    assert (res.swaps, res.bytes_swapped_in, res.bytes_swapped_out) == (3, 30, 10)
    assert res.batches == [("A", 2), ("B", 1), ("C", 1)]


def test_residency_is_limited_by_bytes_not_count():
    small = {f"s{i}": 10 for i in range(3)}
    reqs = [Request(i, f"s{i % 3}", 0.01 * i) for i in range(9)]
    res = simulate(_models(small), reqs, capacity_bytes=30, policy=Policy(), swap_cost=_const_swap(0.1))
    assert res.swaps == 3 and res.bytes_swapped_out == 0  # all three fit: loaded once each
    big = dict(small, big=20)
    reqs = reqs + [Request(9, "big", 3.0)]  # after the small ones have run
    res = simulate(_models(big), reqs, capacity_bytes=30, policy=Policy(), swap_cost=_const_swap(0.1))
    assert res.swaps == 4 and res.bytes_swapped_out == 20  # the 20-byte model evicts exactly two 10-byte ones


def test_model_larger_than_worker_is_an_error():
    with pytest.raises(HetplanError) as e:
        Scheduler({"x": (100, 1.0)}, 50, Policy())
    assert e.value.field == "models.x"


def test_queue_bound_refuses():
    s = Scheduler({"a": (1, 1.0)}, 10, Policy(), max_queue_len=2)
    assert [s.submit(Request(i, "a", 0.0), 0.0) for i in range(3)] == [True, True, False]
    with pytest.raises(HetplanError):
        s.submit(Request(9, "zz", 0.0), 0.0)


def test_batches_up_to_max_in_arrival_order():
    s = Scheduler({"a": (1, 1.0)}, 10, Policy(), max_batch_size=3)
    s.preload(["a"])
    for i in range(5):
        s.submit(Request(i, "a", 0.1 * i), 0.1 * i)
    acts = s.step(1.0)
    assert len(acts) == 1 and isinstance(acts[0], Execute) and [r.id for r in acts[0].requests] == [0, 1, 2]
    assert s.step(1.0) == []  # one iteration at a time
    s.exec_done(2.0, [acts[0].requests[1]])  # request 1 finished: its slot frees, request 3 joins
    act = s.step(2.0)[0]
    assert sorted(r.id for r in act.requests) == [0, 2, 3] and [r.id for r in act.joined] == [3]
    s.exec_done(3.0, act.requests)
    assert [r.id for r in s.step(3.0)[0].requests] == [4]


def test_static_batching_admits_only_into_an_empty_batch():
    s = Scheduler({"a": (1, 1.0)}, 10, Policy(), max_batch_size=3, batching="static")
    s.preload(["a"])
    for i in range(5):
        s.submit(Request(i, "a", 0.1 * i), 0.1 * i)
    act = s.step(1.0)[0]
    s.exec_done(2.0, [act.requests[1]])
    act = s.step(2.0)[0]
    assert [r.id for r in act.requests] == [0, 2] and act.joined == []  # no join until the batch empties
    s.exec_done(3.0, act.requests)
    assert [r.id for r in s.step(3.0)[0].joined] == [3, 4]
    with pytest.raises(HetplanError) as e:
        Scheduler({"a": (1, 1.0)}, 10, Policy(), batching="dynamic")
    assert e.value.field == "scheduler.batching"


def test_model_with_running_requests_is_not_evicted():
    s = Scheduler({"a": (10, 1.0), "b": (10, 1.0)}, 10, Policy())
    s.preload(["a"])
    s.submit(Request(0, "a", 0.0, max_new_tokens=5), 0.0)
    s.step(0.0)
    s.exec_done(0.1)  # request 0 still running: a's KV cache holds it
    s.submit(Request(1, "b", 0.2), 0.2)
    acts = s.step(0.2)
    assert [type(x) for x in acts] == [Execute] and acts[0].model == "a"  # b waits: a cannot be evicted
    s.exec_done(0.3, acts[0].requests)
    assert s.step(0.3) == [Swap("b", ["a"])]


def test_continuous_batching_beats_static_on_the_tail():
    """Short requests behind long ones: static batching makes them wait for the longest; continuous lets them
    join as slots free up (Orca, OSDI'22, Fig. 1)."""
    reqs = [Request(i, "a", 0.05 * i, 8, 40 if i % 4 == 0 else 2) for i in range(40)]
    model = [SimModel("a", [1], LinearStepModel(base_s=0.01, per_decode_seq_s=0.001))]
    kw = dict(capacity_bytes=10, policy=Policy(), swap_cost=_const_swap(0.0), max_batch_size=4, preload=["a"])
    p99 = {b: simulate(model, reqs, batching=b, **kw).report({})["all"]["p99_latency_s"] for b in ("static", "continuous")}
    assert p99["continuous"] < 0.6 * p99["static"]


def test_executing_model_is_never_evicted_and_loading_model_waits():
    s = Scheduler({"a": (10, 1.0), "b": (10, 1.0)}, 10, Policy())
    s.preload(["a"])
    s.submit(Request(0, "a", 0.0), 0.0)
    s.submit(Request(1, "b", 0.0), 0.0)
    acts = s.step(0.0)
    assert [type(a) for a in acts] == [Execute]  # b cannot evict a while a runs
    s.exec_done(0.5, acts[0].requests)
    acts = s.step(0.5)
    assert acts == [Swap("b", ["a"])]
    s.submit(Request(2, "b", 0.6), 0.6)
    assert s.step(0.6) == []  # b is loading: its requests wait in its queue
    s.swap_done(1.5)
    assert [r.id for r in s.step(1.5)[0].joined] == [1, 2]


def test_lru_and_load_aware_victims():
    def st(name, last, queue=0, rate_arrivals=0, swap=1.0):
        m = ModelState(name, 10, swap, state="resident", last_used_s=last)
        m.queue.extend([Request(i, name, 0.0) for i in range(queue)])
        m.arrivals.extend([9.5] * rate_arrivals)
        return m

    a, b, c = st("a", 1.0, queue=0, rate_arrivals=50), st("b", 2.0, queue=0), st("c", 3.0, queue=0)
    assert [m.name for m in Policy().pick_victims([a, b, c], 10, 10.0)] == ["a"]  # least recently used
    # load-aware spares 'a': it gets 5 req/s, so evicting it costs (0 + 5 x 1) x 1
    assert [m.name for m in LoadAwarePolicy().pick_victims([a, b, c], 10, 10.0)] == ["b"]
    assert Policy().pick_victims([a], 20, 10.0) is None
    with pytest.raises(HetplanError) as e:
        make_policy("fifo")
    assert e.value.field == "scheduler.policy"


def test_load_aware_loads_longest_queue_per_second():
    a = ModelState("a", 10, 1.0)
    a.queue.extend([Request(0, "a", 0.0)])
    b = ModelState("b", 10, 1.0)
    b.queue.extend([Request(i, "b", 1.0) for i in range(1, 4)])
    assert Policy().pick_load([a, b], 2.0).name == "a"  # FCFS
    assert LoadAwarePolicy().pick_load([a, b], 2.0).name == "b"


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 10), min_size=1, max_size=5),
    arrivals=st.lists(st.tuples(st.floats(0, 5), st.integers(0, 4)), min_size=1, max_size=40),
    cap_extra=st.integers(0, 15),
    batch=st.integers(1, 4),
    qlen=st.integers(1, 6),
    policy=st.sampled_from(["lru", "load_aware"]),
)
def test_every_request_answered_once_and_memory_bounded(sizes, arrivals, cap_extra, batch, qlen, policy):
    names = [f"m{i}" for i in range(len(sizes))]
    cap = max(sizes) + cap_extra
    models = [SimModel(n, [b], LinearStepModel(base_s=0.1, per_decode_seq_s=0.05)) for n, b in zip(names, sizes)]
    reqs = [Request(i, names[k % len(names)], t, 4, 1 + k % 3) for i, (t, k) in enumerate(arrivals)]
    used = []
    orig_step = Scheduler.step

    def spy(self, now):
        out = orig_step(self, now)
        used.append(self.used_bytes())
        return out

    Scheduler.step = spy
    try:
        res = simulate(models, reqs, capacity_bytes=cap, policy=make_policy(policy), swap_cost=_const_swap(0.3),
                       max_batch_size=batch, max_queue_len=qlen)
    finally:
        Scheduler.step = orig_step
    assert max(used) <= cap
    assert sorted(r.id for r in res.records) == [r.id for r in reqs]
    want = {r.id: r.max_new_tokens for r in reqs}
    for r in res.records:
        assert r.refused != (r.finish_s is not None)  # refused xor answered
        if r.finish_s is not None:
            assert r.output_tokens == want[r.id]  # one token per iteration, up to max_new_tokens
            assert r.latency_s >= 0.1 * want[r.id] - 1e-9 and r.first_token_s <= r.finish_s
    # every iteration gives each running request one token
    assert sum(b for _, b in res.batches) == sum(r.output_tokens for r in res.records)


def test_simulator_is_deterministic_and_policies_differ_in_swaps():
    from hetplan.serve.workload import ModelLoad, generate

    loads = [ModelLoad(f"m{i}", r, 2.0) for i, r in enumerate([6.0, 3.0, 2.0, 1.0])]
    reqs = generate(loads, 60.0, seed=2)
    models = _models({f"m{i}": 10 for i in range(4)}, exec_s=0.05)
    sm = SwapModel(1e3, overhead_s=0.0)  # 10 bytes at 1 kB/s: 10 ms per swap
    kw = dict(capacity_bytes=20, swap_cost=swap_cost_fn(sm))
    a = simulate(models, reqs, policy=Policy(), **kw)
    b = simulate(models, reqs, policy=Policy(), **kw)
    assert [r.finish_s for r in a.records] == [r.finish_s for r in b.records]
    assert a.swaps > 4


def test_step_model_fit_recovers_coefficients():
    true = LinearStepModel(0.002, 0.001, 1e-4, 5e-4, 1e-6)
    steps = [(p, d, true.step_time_s(p, d)) for p in ([], [8], [16, 4]) for d in ([], [10], [10, 30, 50])]
    fit = LinearStepModel.fit(steps)
    for p, d, t in steps:
        assert fit.step_time_s(p, d) == pytest.approx(t, rel=1e-6)
    with pytest.raises(HetplanError):
        LinearStepModel.fit([])


class _Recording(LinearStepModel):
    """1 s per iteration; remembers the prefill lengths and decode contexts it was asked about."""

    def __init__(self):
        super().__init__(base_s=1.0)
        object.__setattr__(self, "calls", [])

    def step_time_s(self, prefill_lens, decode_contexts, prefill_contexts=None):
        self.calls.append((list(prefill_lens), list(decode_contexts)))
        return 1.0


def _one_model(blocks, step=None):
    return [SimModel("m", [1], step or LinearStepModel(base_s=1.0), kv_blocks=blocks)]


def test_preemption_by_recompute_worked_example():
    """Pool of 4 blocks x 2 tokens; A and B (prompt 3, 3 new tokens) at t = 0, A first (its iteration starts on
    its arrival). [0,1] A prefills (2 blocks); [1,2] A decodes (position 4 fits its second block), B joins (2
    blocks: pool full); [2,3] A's decode needs a third block: B (the newest) is preempted, A gets its third token
    and finishes at 3; [3,4] B is prefilled again over its prompt and its 1 token (4 positions) and gets its
    second; [4,5] B decodes its third: done at 5."""
    step = _Recording()
    reqs = [Request(0, "m", 0.0, 3, 3), Request(1, "m", 0.0, 3, 3)]
    res = simulate(_one_model(4, step), reqs, capacity_bytes=10, policy=Policy(), swap_cost=_const_swap(0.0),
                   preload=["m"], block_tokens=2, max_seq_tokens=6)
    lat = {r.id: r.latency_s for r in res.records}
    assert lat == {0: 3.0, 1: 5.0} and res.preemptions == 1
    assert [r.output_tokens for r in res.records] == [3, 3] and [r.ttft_s for r in res.records] == [1.0, 2.0]
    # (a mixed iteration is followed by the price of its prefill part alone: the energy split)
    assert step.calls == [([3], []), ([3], [4]), ([3], []), ([], [5]), ([4], []), ([], [5])]
    # whole slots (no paging): no preemption, B done at 4
    res = simulate([SimModel("m", [1], LinearStepModel(base_s=1.0))], reqs, capacity_bytes=10, policy=Policy(),
                   swap_cost=_const_swap(0.0), preload=["m"])
    assert {r.id: r.latency_s for r in res.records} == {0: 3.0, 1: 4.0} and res.preemptions == 0


def test_chunked_prefill_worked_example():
    """Token budget 4; A (prompt 6) and B (prompt 2), 2 new tokens each, at t = 0. Chunked: [0,1] A's first 4
    prompt tokens; [1,2] A's last 2 and B's 2 (first tokens of both); [2,3] both decode. Whole prompts: [0,1] A
    alone (longer than the budget, so in an iteration of its own); [1,2] A decodes, B joins; [2,3] B decodes."""
    reqs = [Request(0, "m", 0.0, 6, 2), Request(1, "m", 0.0, 2, 2)]
    out = {}
    for chunked in (True, False):
        step = _Recording()
        res = simulate(_one_model(None, step), reqs, capacity_bytes=10, policy=Policy(),
                       swap_cost=_const_swap(0.0), preload=["m"], max_batched_tokens=4, chunked_prefill=chunked)
        out[chunked] = ([r.ttft_s for r in res.records], [r.latency_s for r in res.records], step.calls)
    assert out[True] == ([2.0, 2.0], [3.0, 3.0], [([4], []), ([2, 2], []), ([], [7, 3])])
    assert out[False] == ([1.0, 2.0], [2.0, 3.0], [([6], []), ([2], [7]), ([2], []), ([], [3])])


def test_pool_smaller_than_one_sequence_is_an_error():
    with pytest.raises(HetplanError) as e:
        Scheduler({"m": (1, 0.0)}, 10, Policy(), kv_blocks={"m": 3}, block_tokens=16, max_seq_tokens=64)
    assert e.value.field == "scheduler.kv_cache_len" and "48 tokens" in e.value.message


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 3), st.integers(1, 40), st.integers(1, 24)), min_size=1, max_size=30),
       st.integers(0, 30), st.sampled_from([1, 4, 16]), st.one_of(st.none(), st.integers(1, 64)), st.booleans(),
       st.integers(1, 8))
def test_paged_chunked_every_request_gets_all_its_tokens(shape, extra_blocks, block, budget, chunked, batch):
    """Any workload, pool, block size, token budget and batch: every request finishes once with all its tokens,
    the pool is whole again at the end; with a pool that cannot run out, paging changes nothing."""
    reqs = [Request(i, "m", t, p, n) for i, (t, p, n) in enumerate(sorted(shape))]
    longest = max(p + n for _, p, n in shape)
    blocks = -(-longest // block) + extra_blocks
    if budget is not None and not chunked:
        budget = max(budget, longest)  # whole prompts: the budget must hold the longest sequence (as in vLLM)
    res = simulate(_one_model(blocks), reqs, capacity_bytes=10, policy=Policy(), swap_cost=_const_swap(0.0),
                   preload=["m"], block_tokens=block, max_batched_tokens=budget, chunked_prefill=chunked,
                   max_seq_tokens=longest, max_batch_size=batch, max_queue_len=1000)
    assert all(r.finish_s is not None and r.output_tokens == q.max_new_tokens for r, q in
               zip(sorted(res.records, key=lambda r: r.id), reqs))
    ample = _one_model(batch * -(-longest // block))
    a = simulate(ample, reqs, capacity_bytes=10, policy=Policy(), swap_cost=_const_swap(0.0), preload=["m"],
                 block_tokens=block, max_seq_tokens=longest, max_batch_size=batch, max_queue_len=1000)
    b = simulate(_one_model(None), reqs, capacity_bytes=10, policy=Policy(), swap_cost=_const_swap(0.0),
                 preload=["m"], max_batch_size=batch, max_queue_len=1000)
    assert a.preemptions == 0 and [r.finish_s for r in a.records] == [r.finish_s for r in b.records]


def _joins(watermark: float, prompt: int, free_blocks: int = 100) -> list[int]:
    s = Scheduler({"a": (1, 1.0)}, 10, Policy(), max_batch_size=8, kv_blocks={"a": free_blocks}, block_tokens=16,
                  max_seq_tokens=prompt + 16, kv_watermark=watermark)
    s.preload(["a"])
    for i in range(3):
        s.submit(Request(i, "a", 0.0, prompt_len=prompt, max_new_tokens=4), 0.0)
    return [r.id for r in s.step(0.0)[0].joined]


def test_kv_watermark_holds_blocks_back_at_admission_only():
    """vLLM V0's can_allocate: a sequence joins while free - its blocks >= int(w * pool). 100 blocks of 16
    tokens, prompts of 48 blocks: two join without a watermark (4 left), one with 5 % (the second would leave
    4 < 5), two again with 4 % (4 >= 4); 47-block prompts leave 6 >= 5, so two join under 5 %."""
    assert _joins(0.0, 48 * 16) == [0, 1]
    assert _joins(0.05, 48 * 16) == [0]
    assert _joins(0.04, 48 * 16) == [0, 1]
    assert _joins(0.05, 47 * 16) == [0, 1]
    # decode growth is not held back: one sequence filling the pool but for the watermark still decodes into it
    s = Scheduler({"a": (1, 1.0)}, 10, Policy(), kv_blocks={"a": 10}, block_tokens=16, kv_watermark=0.2)
    s.preload(["a"])
    s.submit(Request(0, "a", 0.0, prompt_len=8 * 16, max_new_tokens=32), 0.0)
    act = s.step(0.0)[0]
    assert [r.id for r in act.joined] == [0] and s.free_blocks["a"] == 2
    s.exec_done(1.0, [])
    s.step(1.0)
    assert s.free_blocks["a"] == 1  # the 129th token took a ninth block out of the 2 held back


def test_kv_watermark_counts_in_the_one_sequence_check():
    with pytest.raises(HetplanError) as e:
        Scheduler({"a": (1, 1.0)}, 10, Policy(), kv_blocks={"a": 10}, block_tokens=16, max_seq_tokens=160,
                  kv_watermark=0.1)
    assert e.value.field == "scheduler.kv_cache_len" and "1 kept free" in e.value.message
    with pytest.raises(HetplanError) as e:
        Scheduler({"a": (1, 1.0)}, 10, Policy(), kv_blocks={"a": 10}, kv_watermark=1.0)
    assert e.value.field == "kv_watermark"


def _window_model(layers: int = 4, window_layers: int = 2, window: int = 8):
    from hetplan.model.spec import load_model

    return load_model("gpt-oss-120b").model_copy(update={"num_layers": layers, "sliding_window_layers": window_layers,
                                                         "sliding_window": window})


@pytest.mark.parametrize("tokens,cached", [(1, 0), (7, 6), (8, 7), (9, 8), (17, 16), (40, 39), (40, 0), (40, 20)])
def test_kv_layer_blocks_brute_force(tokens, cached):
    """Blocks x layers against a per-layer enumeration: a full layer holds every block with a cached token; a
    window layer (w = 8, blocks of 4) the blocks from the one holding token cached - w on (vLLM V1 frees the older
    ones before it allocates the step's tokens)."""
    from hetplan.estimate.inference import kv_layer_blocks

    m, b = _window_model(), 4
    blocks = {j for j in range((tokens + b - 1) // b)}
    kept = {j for j in blocks if (j + 1) * b > max(0, cached - 8)}
    assert kv_layer_blocks(m, b, tokens, cached, windowed=True) == 2 * len(blocks) + 2 * len(kept)
    assert kv_layer_blocks(m, b, tokens, cached, windowed=False) == 4 * len(blocks)


def test_windowed_pool_frees_blocks_that_leave_the_window():
    """Pool of 6 blocks (24 layer-blocks), blocks of 4 tokens, 4 layers of which 2 have an 8-token window.
    Whole slots would fit one 20-token sequence (5 blocks); windowed, a sequence's window layers shed blocks as
    it decodes: its prefill of 12 tokens takes 4·3 = 12; the decode to token 13 takes 2·4 + 2·3 (blocks 1-3 hold
    tokens 4-12 of the window) = 14; the decode to token 20, 2·5 + 2·3 = 16 (block 0 and 1 left the window)."""
    m = _window_model()
    s = Scheduler({"a": (1, 1.0)}, 10, Policy(), kv_blocks={"a": 6}, block_tokens=4, max_seq_tokens=20,
                  kv_windows={"a": m})
    s.preload(["a"])
    s.submit(Request(0, "a", 0.0, prompt_len=12, max_new_tokens=9), 0.0)
    s.step(0.0)
    assert s.free_blocks["a"] == 24 - 12
    s.exec_done(1.0, [])
    s.step(1.0)
    assert s.seqs[0].blocks == 14 and s.free_blocks["a"] == 24 - 14
    t = 2.0
    while s.seqs[0].cached < 19:  # each step plans the decode of token cached + 1
        s.exec_done(t, [])
        s.step(t)
        t += 1.0
    assert s.seqs[0].blocks == 2 * 5 + 2 * 3 and s.free_blocks["a"] == 24 - 16


def test_windowed_pool_runs_more_sequences_than_whole_layers():
    """The same workload and pool: with the window layers holding their window only, more sequences run at once
    and fewer are preempted; every request still gets all its tokens."""
    m = _window_model()
    reqs = [Request(i, "m", 0.0, 16, 48) for i in range(6)]
    out = {}
    for windowed in (False, True):
        model = SimModel("m", [1], LinearStepModel(base_s=1.0), kv_blocks=40, kv_window_spec=m if windowed else None)
        out[windowed] = simulate([model], reqs, capacity_bytes=10, policy=Policy(), swap_cost=_const_swap(0.0),
                                 preload=["m"], block_tokens=4, max_seq_tokens=64, max_batch_size=8)
    for res in out.values():
        assert all(r.output_tokens == 48 for r in res.records)
    assert out[True].preemptions < out[False].preemptions
    assert max(r.finish_s for r in out[True].records) < max(r.finish_s for r in out[False].records)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 3), st.integers(1, 40), st.integers(1, 24)), min_size=1, max_size=25),
       st.integers(0, 20), st.sampled_from([1, 4, 16]), st.one_of(st.none(), st.integers(8, 64)), st.booleans(),
       st.integers(1, 8), st.sampled_from([4, 8, 32]))
def test_windowed_pool_every_request_gets_all_its_tokens(shape, extra_blocks, block, budget, chunked, batch, window):
    """Any workload, pool, block size, token budget, batch and window, with whole layers and with the window
    layers returning their blocks as sequences decode past the window: every request finishes once with all its
    tokens, and the pool is whole again at the end (no block lost or freed twice on the way)."""
    from unittest import mock

    import hetplan.serve.simulator as simulator_module

    made: list[Scheduler] = []

    class Recorded(Scheduler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self)

    m = _window_model(window=window)
    reqs = [Request(i, "m", t, p, n) for i, (t, p, n) in enumerate(sorted(shape))]
    longest = max(p + n for _, p, n in shape)
    blocks = -(-longest // block) + extra_blocks
    if budget is not None and not chunked:
        budget = max(budget, longest)
    out = {}
    for windowed in (False, True):
        model = SimModel("m", [1], LinearStepModel(base_s=1.0), kv_blocks=blocks,
                         kv_window_spec=m if windowed else None)
        with mock.patch.object(simulator_module, "Scheduler", Recorded):
            out[windowed] = simulate([model], reqs, capacity_bytes=10, policy=Policy(),
                                     swap_cost=_const_swap(0.0), preload=["m"], block_tokens=block,
                                     max_batched_tokens=budget, chunked_prefill=chunked, max_seq_tokens=longest,
                                     max_batch_size=batch, max_queue_len=1000)
        assert all(r.finish_s is not None and r.output_tokens == q.max_new_tokens for r, q in
                   zip(sorted(out[windowed].records, key=lambda r: r.id), reqs))
        sched = made[-1]
        assert not sched.seqs and sched.free_blocks == sched.kv_blocks
