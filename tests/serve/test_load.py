"""Bounded load test on loopback: 1,000 requests, 20 concurrent clients, 4 models of which 2 fit at a time.
Every request gets exactly one correct answer (no loss, no duplicate, no mix-up)."""

import pytest

pytest.importorskip("torch")
pytest.importorskip("httpx")
pytest.importorskip("fastapi")

from hetplan.serve.api import BackgroundServer, create_app  # noqa: E402
from hetplan.serve.config import ModelEntry  # noqa: E402
from hetplan.serve.engine import Engine  # noqa: E402
from hetplan.serve.loadgen import make_load, run_load  # noqa: E402

from .reference import greedy  # noqa: E402

N_REQUESTS, CONCURRENCY = 1000, 20


def test_load_no_lost_or_duplicated_responses(fixtures):
    opt = str(fixtures / "tiny-opt.json")
    ents = [ModelEntry(name=f"m{i}", model=opt, seed=i) for i in range(4)]
    # each TP=2 shard is 502,272 B + 131,072 B of KV cache (8 slots x 16 tokens): two models fit in 1.3 MB per
    # worker, not three
    eng = Engine(ents, tp=2, capacity_bytes=1_300_000, max_batch_size=8, max_queue_len=16, kv_cache_len=16)
    load = make_load([e.name for e in ents], eng.vocab_sizes, N_REQUESTS, zipf_exponent=1.0, seed=5,
                     prompt_len=6, max_new_tokens=2)
    with BackgroundServer(create_app(eng)) as url:
        res = run_load(url, load, concurrency=CONCURRENCY, max_retries=200)
        swaps = eng.scheduler.swaps
        assert len(eng.scheduler.resident()) <= 2
    print("load test:", res.summary(), "swaps", swaps)
    assert res.statuses == {200: N_REQUESTS} and not res.errors
    assert set(res.responses) == {s.client_id for s in load}
    assert all(len(v) == 1 for v in res.responses.values())  # exactly one answer each
    ids = [v[0]["id"] for v in res.responses.values()]
    assert len(set(ids)) == N_REQUESTS  # server-side ids unique too
    seeds = {e.name: e.seed for e in ents}
    for spec in load:  # every answer is the right model's answer to that prompt
        body = res.responses[spec.client_id][0]
        assert body["model"] == spec.model
        assert body["tokens"] == greedy(opt, seeds[spec.model], tuple(spec.prompt), 2)
    assert swaps > 2 and res.throughput_per_s > 0
