"""Load test of the serving API on loopback: 1,000 requests, 20 concurrent clients, 4 models, 2 resident.

Run: ``python benchmarks/bench_serve_load.py [--requests N] [--concurrency C] [--tp T]``. Starts the engine
(OPT-shaped toy models on CPU workers) behind uvicorn on 127.0.0.1, sends the bounded load with
:mod:`hetplan.serve.loadgen`, checks that every request got exactly one answer, and prints throughput, latency
percentiles, 429 retries and swaps as JSON.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "serve"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--concurrency", type=int, default=20)
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--model", default=str(FIXTURES / "tiny-opt.json"))
    ap.add_argument("--capacity-bytes", type=int, default=1_300_000)
    args = ap.parse_args()

    from hetplan.serve.api import BackgroundServer, create_app
    from hetplan.serve.config import ModelEntry
    from hetplan.serve.engine import Engine
    from hetplan.serve.loadgen import make_load, run_load

    ents = [ModelEntry(name=f"m{i}", model=args.model, seed=i) for i in range(4)]
    eng = Engine(ents, tp=args.tp, capacity_bytes=args.capacity_bytes, max_batch_size=8, max_queue_len=16,
                 kv_cache_len=16)
    load = make_load([e.name for e in ents], eng.vocab_sizes, args.requests, zipf_exponent=1.0, seed=5,
                     prompt_len=6, max_new_tokens=2)
    with BackgroundServer(create_app(eng)) as url:
        res = run_load(url, load, concurrency=args.concurrency, max_retries=200)
        swaps = eng.scheduler.swaps
        resident_max = len(eng.scheduler.resident())
    ok = (res.statuses == {200: args.requests} and set(res.responses) == {s.client_id for s in load}
          and all(len(v) == 1 for v in res.responses.values()))
    out = res.summary()
    out.update(swaps=swaps, resident_at_end=resident_max, exactly_one_answer_each=ok,
               concurrency=args.concurrency, tp=args.tp)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
