"""HTTP API over a real uvicorn server on 127.0.0.1 (free port): answers, errors, 429, metrics, graceful shutdown."""

import re
import threading
import time

import pytest

pytest.importorskip("torch")
httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")

from hetplan.serve.api import BackgroundServer, create_app  # noqa: E402
from hetplan.serve.config import ModelEntry  # noqa: E402
from hetplan.serve.engine import Engine  # noqa: E402

from .reference import greedy  # noqa: E402


def free_port() -> int:
    """A port free now on 127.0.0.1, for a ``hetplan serve`` process that must be told its port in advance."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


PROM_LINE = re.compile(r'^(# (HELP|TYPE) .+|[a-zA-Z_:][a-zA-Z0-9_:]*(\{[^}]*\})? -?[0-9.e+Inf-]+)$')


def _entries(fixtures):
    return [ModelEntry(name="a", model=str(fixtures / "tiny-opt.json"), seed=0),
            ModelEntry(name="b", model=str(fixtures / "tiny-llama.json"), seed=1)]


@pytest.fixture(scope="module")
def server():
    from .conftest import FIXTURES

    # one worker (world size 1), one model resident at a time, tiny queues to provoke 429
    eng = Engine(_entries(FIXTURES), capacity_bytes=1_200_000, max_batch_size=1, max_queue_len=1, policy="load_aware",
                 kv_cache_len=64)
    srv = BackgroundServer(create_app(eng, default_max_new_tokens=2))
    with srv as url:
        yield url, eng
    assert not any(p.is_alive() for p in eng._procs)  # lifespan shutdown stopped the workers


def test_generate_matches_reference(server, fixtures):
    url, _ = server
    r = httpx.post(f"{url}/v1/models/b/generate", json={"prompt_tokens": [5, 6, 7], "max_new_tokens": 3, "client_id": "x1"})
    assert r.status_code == 200
    body = r.json()
    assert body["client_id"] == "x1" and body["model"] == "b" and body["latency_s"] > 0
    assert body["tokens"] == greedy(str(fixtures / "tiny-llama.json"), 1, [5, 6, 7], 3)
    r = httpx.post(f"{url}/v1/models/a/generate", json={"prompt": "hi"})
    assert r.status_code == 200 and len(r.json()["tokens"]) == 2  # default_max_new_tokens


@pytest.mark.parametrize("path,body,code", [
    ("/v1/models/zz/generate", {"prompt": "x"}, 404),
    ("/v1/models/a/generate", {"prompt_tokens": [100000]}, 422),
    ("/v1/models/a/generate", {}, 422),
    ("/v1/models/a/generate", {"prompt": "x", "max_new_tokens": 1000}, 422),
    ("/v1/models/a/generate", {"prompt": "x", "max_new_tokens": 0}, 422),
    ("/v1/models/a/generate", {"prompt": "x", "max_new_tokens": True}, 422),  # was read as 1 token
    ("/v1/models/a/generate", {"prompt_tokens": [True, 5]}, 422),  # was read as token ids 1, 5
    ("/v1/models/a/generate", {"prompt_tokens": [5], "prompt": "x"}, 422),  # the text was dropped unsaid
])
def test_errors(server, path, body, code):
    url, _ = server
    assert httpx.post(url + path, json=body).status_code == code


def test_full_queue_answers_429_and_nothing_is_lost(server, fixtures):
    url, _ = server
    n = 12
    out: list = [None] * n

    def call(i):
        r = httpx.post(f"{url}/v1/models/{'a' if i % 2 else 'b'}/generate",
                       json={"prompt_tokens": [i + 1], "max_new_tokens": 4, "client_id": str(i)}, timeout=60)
        out[i] = (r.status_code, r.json())

    ths = [threading.Thread(target=call, args=(i,)) for i in range(n)]
    for t in ths:
        t.start()
    for t in ths:
        t.join()
    codes = [c for c, _ in out]
    assert set(codes) <= {200, 429} and 429 in codes and 200 in codes
    for i, (c, body) in enumerate(out):
        if c == 200:
            ent = _entries(fixtures)[0 if i % 2 else 1]
            assert body["client_id"] == str(i)
            assert body["tokens"] == greedy(ent.model, ent.seed, [i + 1], 4)


def test_metrics_and_models(server):
    url, _ = server
    httpx.post(f"{url}/v1/models/a/generate", json={"prompt": "abc"})
    r = httpx.get(f"{url}/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    lines = [ln for ln in r.text.splitlines() if ln]
    assert all(PROM_LINE.match(ln) for ln in lines), [ln for ln in lines if not PROM_LINE.match(ln)][:3]
    for name in ("hetplan_serve_swaps_total", "hetplan_serve_swap_bytes_total", "hetplan_serve_swap_bandwidth_bytes_per_s",
                 "hetplan_serve_queue_length", "hetplan_serve_request_latency_seconds_bucket", "hetplan_serve_requests_total"):
        assert any(ln.startswith(name) for ln in lines), name
    models = httpx.get(f"{url}/v1/models").json()
    assert {m["name"] for m in models["models"]} == {"a", "b"}
    assert all(m["kv_cache_bytes"][0] > 0 for m in models["models"])
    assert sum(m["state"] == "resident" for m in models["models"]) <= 1  # one fits at a time


def test_graceful_shutdown_finishes_in_flight_requests(fixtures):
    eng = Engine(_entries(fixtures), capacity_bytes=1_200_000, max_batch_size=1, max_queue_len=64, kv_cache_len=64)
    srv = BackgroundServer(create_app(eng, shutdown_timeout_s=30))
    url = srv.__enter__()
    results: list = []

    def call(i):
        try:
            r = httpx.post(f"{url}/v1/models/{'ab'[i % 2]}/generate",
                           json={"prompt_tokens": [i + 1], "max_new_tokens": 32}, timeout=60)
            results.append(r.status_code)
        except httpx.HTTPError as exc:  # pragma: no cover - would be a failure
            results.append(repr(exc))

    ths = [threading.Thread(target=call, args=(i,)) for i in range(8)]
    for t in ths:
        t.start()
    deadline = time.monotonic() + 30
    while sum(len(m.arrivals) for m in eng.scheduler.models.values()) < 8 and time.monotonic() < deadline:
        time.sleep(0.002)  # wait until all 8 requests reached the engine
    in_flight = len(eng._pending)
    srv.stop()  # while requests are in flight
    assert in_flight > 0
    for t in ths:
        t.join()
    assert results == [200] * 8
    assert not any(p.is_alive() for p in eng._procs)


def test_hetplan_serve_command_serves_and_stops_on_sigterm(tmp_path, fixtures):
    import os
    import signal
    import subprocess
    import sys

    port = free_port()
    cfg = tmp_path / "serve.toml"
    cfg.write_text(f"""
[cluster]
device = "cpu"
dtype = "fp32"
memory_bytes = 1_200_000
[scheduler]
max_batch_size = 2
kv_cache_len = 32
[api]
port = {port}
default_max_new_tokens = 2
[[models]]
name = "a"
model = "{fixtures / 'tiny-opt.json'}"
[[models]]
name = "b"
model = "{fixtures / 'tiny-llama.json'}"
seed = 1
""")
    proc = subprocess.Popen([sys.executable, "-m", "hetplan.cli.main", "serve", str(cfg)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read() if proc.poll() is not None else "timeout"
            time.sleep(0.2)
        for name, ent_seed, path in (("a", 0, "tiny-opt.json"), ("b", 1, "tiny-llama.json")):
            r = httpx.post(f"http://127.0.0.1:{port}/v1/models/{name}/generate", json={"prompt_tokens": [4, 2]}, timeout=30)
            assert r.status_code == 200 and r.json()["tokens"] == greedy(str(fixtures / path), ent_seed, [4, 2], 2)
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=60)
        log = proc.stdout.read()
        # uvicorn shuts down gracefully, then re-raises the captured SIGTERM (exit status -15)
        assert code in (0, -signal.SIGTERM) and "Application shutdown complete" in log, log
        # the engine's queues are released at shutdown: the SIGTERM re-raised after it skips the exit handlers
        # that would unlink their semaphores, and the resource tracker (writing here too) warned of 9 leaked ones
        assert "leaked semaphore" not in log, log
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)


def test_token_size_limit_and_malformed_json(server):
    """A second app over the same engine, with a bearer token and a 2 kB body limit."""
    _, eng = server
    with BackgroundServer(create_app(eng, token="s3cret-token-0123456789", max_request_bytes=2048,
                                     manage_engine=False)) as url:
        gen = f"{url}/v1/models/a/generate"
        assert httpx.post(gen, json={"prompt": "x"}).status_code == 401
        assert httpx.post(gen, json={"prompt": "x"}, headers={"Authorization": "Bearer nope"}).status_code == 401
        assert httpx.get(f"{url}/metrics").status_code == 401
        assert httpx.get(f"{url}/healthz").status_code == 200  # probes need no token
        auth = {"Authorization": "Bearer s3cret-token-0123456789"}
        assert httpx.post(gen, json={"prompt": "x", "max_new_tokens": 1}, headers=auth).status_code == 200
        r = httpx.post(gen, json={"prompt_tokens": [1] * 2000}, headers=auth)  # ~6 kB body
        assert r.status_code == 413 and "2,048" in r.json()["error"]
        r = httpx.post(gen, content=iter([b'{"prompt": "x"}']), headers=auth)  # chunked: no Content-Length
        assert r.status_code == 411
        r = httpx.post(gen, content=b'{"prompt": "x",', headers={**auth, "Content-Type": "application/json"})
        assert r.status_code == 400 and "JSON" in r.json()["error"]
        r = httpx.post(gen, json={"prompt_tokens": "abc"}, headers=auth)
        assert r.status_code == 422 and r.json()["field"] == "prompt_tokens"
        r = httpx.post(gen, json={"prompt": "x", "temperature": 2}, headers=auth)
        assert r.status_code == 422 and r.json()["field"] == "temperature"


def _descendants(pid: int) -> set[int]:
    """Process ids whose parent chain leads to ``pid`` (from /proc)."""
    import os

    parent = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as fh:
                    parent[int(d)] = int(fh.read().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
    out, frontier = set(), {pid}
    while frontier:
        frontier = {c for c, p in parent.items() if p in frontier} - out
        out |= frontier
    return out


def _alive(pid: int) -> bool:
    import os

    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
    finally:
        os.sched_yield()


@pytest.mark.skipif(not __import__("os").path.isdir("/proc"), reason="needs /proc (Linux)")
def test_kill_9_of_hetplan_serve_leaves_no_worker(tmp_path, fixtures):
    import os
    import signal
    import subprocess
    import sys

    port = free_port()
    cfg = tmp_path / "serve.toml"
    cfg.write_text(f"""
[cluster]
tp = 2
dtype = "fp32"
memory_bytes = 2_000_000
[scheduler]
max_batch_size = 2
kv_cache_len = 32
[api]
port = {port}
[[models]]
name = "a"
model = "{fixtures / 'tiny-opt.json'}"
""")
    proc = subprocess.Popen([sys.executable, "-m", "hetplan.cli.main", "serve", str(cfg)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.2)
        children = _descendants(proc.pid)
        assert len(children) >= 2  # the two TP workers (and multiprocessing's resource tracker)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        deadline = time.monotonic() + 30
        while any(_alive(c) for c in children) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [c for c in children if _alive(c)]  # no worker outlives its parent
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)


def test_a_body_sent_as_a_form_is_415_naming_the_content_type(server):
    """`curl -d '{"prompt_tokens": [1]}'` sends application/x-www-form-urlencoded: the JSON object was refused as
    422 "body: Input should be a valid dictionary or object"; the header is what to fix."""
    url, _ = server
    body = b'{"prompt_tokens": [4, 2]}'
    r = httpx.post(url + "/v1/models/a/generate", content=body,
                   headers={"content-type": "application/x-www-form-urlencoded"})
    assert r.status_code == 415 and r.json()["field"] == "content-type"
    assert "Content-Type: application/json" in r.json()["error"]
    for ctype in ("application/json; charset=utf-8", "application/vnd.api+json"):  # JSON under other names
        assert httpx.post(url + "/v1/models/a/generate", content=body, headers={"content-type": ctype},
                          timeout=30).status_code == 200
