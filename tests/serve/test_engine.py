"""The real engine on CPU: TP/PP outputs equal the single-process model, continuous batching (join, leave, stop
token), residency by bytes (weights + KV cache), memory really freed, bounded queues."""

import time

import pytest

torch = pytest.importorskip("torch")

from hetplan.errors import HetplanError  # noqa: E402
from hetplan.serve.config import ModelEntry  # noqa: E402
from hetplan.serve.engine import Engine, QueueFull  # noqa: E402

from .reference import greedy  # noqa: E402

# Bytes per worker (TP = 2, fp32, 4 KV slots x 32 tokens): OPT toy 502,272 B weights + 131,072 B KV cache,
# Llama toy 390,912 + 49,152 B. An OPT and a Llama fit (1,073,408 B), two OPTs (1,266,688 B) or any three do not.
CAPACITY = 1_100_000
KV_LEN = 32


def _entries(fixtures):
    opt, llama = str(fixtures / "tiny-opt.json"), str(fixtures / "tiny-llama.json")
    return [ModelEntry(name="o0", model=opt, seed=0), ModelEntry(name="l1", model=llama, seed=1),
            ModelEntry(name="o2", model=opt, seed=2), ModelEntry(name="l3", model=llama, seed=3)]


@pytest.fixture(scope="module")
def eng(request):
    from .conftest import FIXTURES

    e = Engine(_entries(FIXTURES), tp=2, pp=1, capacity_bytes=CAPACITY, max_batch_size=4, max_queue_len=8,
               kv_cache_len=KV_LEN).start()
    yield e
    e.shutdown()


def _ref(fixtures, name, prompt, n):
    ent = {e.name: e for e in _entries(fixtures)}[name]
    return greedy(ent.model, ent.seed, prompt, n)


def test_tp2_outputs_equal_single_process_model(eng, fixtures):
    for name in ("o0", "l1", "o2", "l3"):
        prompt = [3, 1, 4, 1, 5]
        assert eng.generate(name, prompt, 4).tokens == _ref(fixtures, name, prompt, 4)


def test_batching_keeps_each_answer(eng, fixtures):
    prompts = [[1, 2, 3], [9, 8, 7, 6, 5, 4], [42], [10, 20, 30, 40]]
    with eng._lock:  # submit all before the scheduler can start an iteration: they join one batch
        futs = [eng.submit("o2", p, n) for p, n in zip(prompts, (3, 5, 2, 4))]
    res = [f.result(30) for f in futs]
    assert max(r.batch_size for r in res) > 1
    for p, n, r in zip(prompts, (3, 5, 2, 4), res):
        assert r.tokens == _ref(fixtures, "o2", p, n)  # each row its own KV-cache slot and positions: same as alone


def test_continuous_batching_requests_join_and_leave(eng, fixtures):
    long = eng.submit("l1", [4, 4, 4], 20)
    deadline = time.monotonic() + 60
    while not any(r.tokens for r in list(eng._running.values())) and time.monotonic() < deadline:
        time.sleep(0.005)  # until the long request has its first token: it is in the running batch
    short = eng.submit("l1", [8, 1], 2)  # joins the running batch between two decode steps
    rs = short.result(30)
    assert not long.done()  # the short one left the batch while the long one still decodes
    rl = long.result(30)
    assert rs.batch_size == 2  # it joined a batch that was already running
    assert rs.tokens == _ref(fixtures, "l1", [8, 1], 2) and rl.tokens == _ref(fixtures, "l1", [4, 4, 4], 20)
    assert 0 < rl.ttft_s < rl.latency_s and rl.tpot_s > 0


def test_stop_token_ends_generation(eng, fixtures):
    ref = _ref(fixtures, "o0", [2, 7, 1], 8)
    stop = ref[2]
    got = eng.generate("o0", [2, 7, 1], 8, stop_token=stop).tokens
    assert got == ref[: ref.index(stop) + 1]  # up to and including the first stop token


def test_residency_by_bytes_and_memory_really_freed(eng):
    for name in ("o0", "l1", "o2", "l3", "o0"):
        eng.generate(name, [1, 2], 1)
    stats = eng.memory_stats()
    resident = eng.scheduler.resident()
    assert set(resident) == set(stats[0]["resident"]) == set(stats[1]["resident"])
    for s in stats:
        want = sum(eng.shard_bytes[m][s["rank"]] + eng.kv_bytes[m][s["rank"]] for m in resident)
        assert s["live_device_bytes"] == want <= CAPACITY  # tensors of evicted models were released
        assert s["budget_free_bytes"] == CAPACITY - want
    assert len(resident) == 2  # two models fit by bytes (weights + KV cache)
    victim = next(m for m in eng.specs if m not in resident)
    before = {s["rank"]: s["live_device_bytes"] for s in stats}
    eng.generate(victim, [5], 1)
    after = eng.memory_stats()
    newly = set(eng.scheduler.resident())
    for s in after:
        assert s["live_device_bytes"] == sum(eng.shard_bytes[m][s["rank"]] + eng.kv_bytes[m][s["rank"]] for m in newly)
    assert victim in newly and len(set(resident) - newly) >= 1  # a victim was swapped out to make room
    assert all(s["live_device_bytes"] <= CAPACITY for s in after) and before


def test_bounded_queue_raises_queue_full(eng):
    with eng._lock:  # nothing can drain while we hold the controller lock
        futs = [eng.submit("l3", [1], 1) for _ in range(8)]
        with pytest.raises(QueueFull):
            eng.submit("l3", [1], 1)
    assert all(len(f.result(30).tokens) == 1 for f in futs)


def test_bad_requests(eng):
    with pytest.raises(HetplanError) as e:
        eng.submit("nope", [1], 1)
    assert e.value.field == "model"
    with pytest.raises(HetplanError) as e:
        eng.submit("o0", [10_000], 1)
    assert e.value.field == "prompt"


def test_metrics_count_swaps_and_latency(eng):
    m = eng.metrics
    assert m.get("hetplan_serve_swaps_total") == eng.scheduler.swaps > 0
    text = m.render()
    for name in ("hetplan_serve_swap_bytes_total", "hetplan_serve_swap_bandwidth_bytes_per_s",
                 "hetplan_serve_queue_length", "hetplan_serve_request_latency_seconds_bucket"):
        assert name in text


def test_tp2_pp2_engine(fixtures):
    ents = _entries(fixtures)[:2]  # 4 workers: two pipeline stages, each a TP group of two
    with Engine(ents, tp=2, pp=2, capacity_bytes=CAPACITY, kv_cache_len=KV_LEN) as e:
        assert len(e.shard_bytes["o0"]) == 4
        for ent in ents:
            assert e.generate(ent.name, [7, 7, 2], 3).tokens == greedy(ent.model, ent.seed, [7, 7, 2], 3)
        procs = e._procs
    # shutdown stops the workers, each by exiting 0 (not killed after the join timeout, not aborted by gloo's
    # threads at interpreter shutdown: worker_main ends with exit_rank), and removes the rendezvous file
    assert [p.exitcode for p in procs] == [0, 0, 0, 0]
    assert not __import__("os").path.exists(e._rendezvous_dir)


def test_paged_admission_and_recompute_preemption_keep_every_answer(fixtures):
    """A KV pool of 32 tokens in blocks of 4 (8 blocks) for 4 sequences that each grow to 18 tokens, and a budget
    of 20 tokens per iteration (sequences of at most 20): the scheduler admits by blocks and preempts by
    recompute; every answer still equals the single-process model's greedy output (a resumed request is prefilled
    over its prompt and its tokens)."""
    ent = _entries(fixtures)[0]
    prompts = [[5, 1, 2, 3, 4, 6], [7, 7, 1, 2, 9, 9], [3, 3, 3, 1, 1, 1], [8, 6, 4, 2, 0, 1]]
    with Engine([ent], tp=1, capacity_bytes=1 << 30, max_batch_size=4, kv_cache_len=20, preload=[ent.name],
                kv_cache_tokens=32, kv_block_tokens=4, max_batched_tokens=20) as e:
        with e._lock:
            futs = [e.submit(ent.name, p, 12) for p in prompts]
        res = [f.result(60) for f in futs]
        assert e.scheduler.preemptions > 0
        assert max(sum(p) + len(d) for _, p, d, _ in e.exec_log) <= 20  # no iteration beyond the token budget
        assert any(p and max(p) > 6 for _, p, _, _ in e.exec_log)  # a resumed request: prompt and tokens prefilled
    for p, r in zip(prompts, res):
        assert r.tokens == _ref(fixtures, ent.name, p, 12)


def test_chunked_prefill_keeps_every_answer(fixtures):
    """Prompts of 14-22 tokens under a budget of 8 tokens per iteration with chunked prefill: prompts are split
    over iterations (each chunk written after the tokens cached before it, attending over them), decodes go first;
    every answer equals the single-process model's greedy output, on TP = 2."""
    ents = _entries(fixtures)[:2]  # an OPT (learned positions) and a Llama (rotary, GQA)
    prompts = [[(7 * i + 3 * j) % 50 + 1 for j in range(14 + 2 * i)] for i in range(5)]
    with Engine(ents, tp=2, capacity_bytes=CAPACITY, max_batch_size=4, kv_cache_len=KV_LEN,
                preload=[e.name for e in ents], max_batched_tokens=8, chunked_prefill=True) as e:
        with e._lock:
            futs = [(ent.name, p, e.submit(ent.name, p, 6)) for p in prompts for ent in ents]
        res = [(n, p, f.result(60)) for n, p, f in futs]
        assert max(sum(p) + len(d) for _, p, d, _ in e.exec_log) <= 8  # the budget holds every iteration
        assert any(len(p) >= 1 and sum(p) == 8 and d == () for _, p, d, _ in e.exec_log)  # a prompt was split
    for name, p, r in res:
        assert r.tokens == _ref(fixtures, name, p, 6), name
