"""A bounded HTTP load generator for the serving API (loopback; used by the load test and the benchmark).

``concurrency`` client coroutines share a fixed list of requests; each request carries a unique ``client_id``
that the API echoes, so lost, duplicated or mixed-up responses are detected. A 429 answer is retried after a
short pause, at most ``max_retries`` times. Needs ``httpx``.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import numpy as np


@dataclass
class LoadSpec:
    """One request of the load: model, prompt token ids, tokens to generate, unique client id."""

    client_id: str
    model: str
    prompt: list[int]
    max_new_tokens: int


@dataclass
class LoadResult:
    """Outcome of a load run.

    Attributes:
        responses: client_id -> list of JSON bodies received with status 200 (exactly one each when correct).
        statuses: count per final HTTP status.
        retries_429: answers 429 that were retried.
        latencies_s: client-side latency of each successful request (s).
        wall_s: duration of the run (s).
    """

    responses: dict[str, list[dict]] = field(default_factory=dict)
    statuses: dict[int, int] = field(default_factory=dict)
    retries_429: int = 0
    latencies_s: list[float] = field(default_factory=list)
    wall_s: float = 0.0
    errors: list[str] = field(default_factory=list)

    @property
    def throughput_per_s(self) -> float:
        return len(self.latencies_s) / self.wall_s if self.wall_s > 0 else 0.0

    def summary(self) -> dict:
        lat = np.asarray(self.latencies_s)
        pct = {f"p{q}_latency_s": float(np.percentile(lat, q)) if lat.size else None for q in (50, 90, 99)}
        return {"requests": sum(self.statuses.values()), "ok": self.statuses.get(200, 0), "statuses": self.statuses,
                "retries_429": self.retries_429, "wall_s": self.wall_s, "throughput_per_s": self.throughput_per_s,
                **pct, "errors": self.errors[:5]}


def make_load(models: list[str], vocab_sizes: dict[str, int], n_requests: int, *, prompts_per_model: int = 5,
              prompt_len: int = 8, max_new_tokens: int = 2, zipf_exponent: float = 0.0, seed: int = 0) -> list[LoadSpec]:
    """``n_requests`` requests over ``models`` (Zipf popularity), prompts drawn from a small seeded set per model
    (so every answer can be checked against a reference)."""
    rng = np.random.default_rng(seed)
    w = np.arange(1, len(models) + 1, dtype=float) ** (-zipf_exponent)
    w /= w.sum()
    prompts = {m: [rng.integers(0, vocab_sizes[m], size=prompt_len).tolist() for _ in range(prompts_per_model)] for m in models}
    out = []
    for i in range(n_requests):
        m = models[int(rng.choice(len(models), p=w))]
        out.append(LoadSpec(f"c{i}", m, prompts[m][int(rng.integers(prompts_per_model))], max_new_tokens))
    return out


async def _run(url: str, load: list[LoadSpec], concurrency: int, max_retries: int, timeout_s: float) -> LoadResult:
    import httpx

    res = LoadResult()
    q: asyncio.Queue = asyncio.Queue()
    for spec in load:
        q.put_nowait(spec)

    async def client(http: httpx.AsyncClient) -> None:
        while True:
            try:
                spec = q.get_nowait()
            except asyncio.QueueEmpty:
                return
            body = {"prompt_tokens": spec.prompt, "max_new_tokens": spec.max_new_tokens, "client_id": spec.client_id}
            t0 = time.perf_counter()
            status = None
            for attempt in range(max_retries + 1):
                try:
                    r = await http.post(f"{url}/v1/models/{spec.model}/generate", json=body)
                except httpx.HTTPError as exc:
                    res.errors.append(f"{spec.client_id}: {exc!r}")
                    status = -1
                    break
                status = r.status_code
                if status == 429 and attempt < max_retries:
                    res.retries_429 += 1
                    await asyncio.sleep(0.01 * (attempt + 1))
                    continue
                if status == 200:
                    res.responses.setdefault(r.json()["client_id"], []).append(r.json())
                    res.latencies_s.append(time.perf_counter() - t0)
                break
            res.statuses[status] = res.statuses.get(status, 0) + 1

    t0 = time.perf_counter()
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=timeout_s, limits=limits) as http:
        await asyncio.gather(*(client(http) for _ in range(concurrency)))
    res.wall_s = time.perf_counter() - t0
    return res


def run_load(url: str, load: list[LoadSpec], *, concurrency: int = 20, max_retries: int = 50,
             timeout_s: float = 60.0) -> LoadResult:
    """Send ``load`` to the API at ``url`` with ``concurrency`` clients; blocks until every request is answered."""
    return asyncio.run(_run(url, load, concurrency, max_retries, timeout_s))
