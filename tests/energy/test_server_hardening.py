"""``hetplan energy serve`` as a real process: token, size limit, malformed JSON, 429, SIGTERM, kill -9 + restart.

Each test starts the server with the CLI (a separate Python process on 127.0.0.1, an OS-chosen free port) and
talks HTTP to it; the database is a real SQLite file.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

pytest.importorskip("fastapi")
uvicorn = pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

from hetplan.energy.client import PlanClient  # noqa: E402
from hetplan.errors import HetplanError  # noqa: E402

from .energy_testutil import TOKEN, ServerProcess  # noqa: E402

S, M = 2, 2
JOB = {"job_id": "j", "num_stages": S, "num_microbatches": M,
       "scheduler": {"kind": "point_solution", "plans": [{"frequencies_mhz": [[1410] * 2 * M] * S}]}}


def _run_iterations(c: PlanClient, n: int) -> list[int]:
    done = []
    for _ in range(n):
        s = c.next_schedule()
        c.report(s.iteration, s.schedule_id, 0.1, 10.0, [])
        done.append(s.iteration)
    return done


def test_token_size_limit_and_malformed_json(tmp_path):
    srv = ServerProcess(tmp_path / "db.sqlite", "--max-body-bytes", "4096")
    try:
        assert httpx.get(srv.url + "/jobs/j").status_code == 401  # no token
        r = httpx.get(srv.url + "/jobs/j", headers={"Authorization": "Bearer wrong-token-000000"})
        assert r.status_code == 401 and "bearer token" in r.json()["detail"]
        with pytest.raises(HetplanError, match="bearer token"):
            srv.client(token="not-the-token-000").create_job(JOB)
        c = srv.client()
        c.create_job(JOB)
        auth = {"Authorization": f"Bearer {TOKEN}"}
        r = httpx.post(srv.url + "/jobs", content=b"x" * 5000, headers={**auth, "content-type": "application/json"})
        assert r.status_code == 413 and "limit of 4096" in r.json()["detail"]

        def chunks():  # no content-length: the limit still holds
            for _ in range(10):
                yield b"x" * 1000

        r = httpx.post(srv.url + "/jobs", content=chunks(), headers={**auth, "content-type": "application/json"})
        assert r.status_code == 413
        r = httpx.post(srv.url + "/jobs", content=b'{"job_id": "k", "num_stages": ', headers={**auth,
                       "content-type": "application/json"})
        assert r.status_code == 422 and "JSON" in str(r.json()["detail"])
    finally:
        srv.stop()


def test_kill_9_and_restart_lose_nothing(tmp_path):
    db = tmp_path / "db.sqlite"
    srv = ServerProcess(db)
    try:
        boot = srv.client()
        boot.create_job(JOB)
        clients = [srv.client(rank, rank % S) for rank in range(4)]
        for c in clients:
            c.register()
        for c in clients:
            assert _run_iterations(c, 3) == [0, 1, 2]
    finally:
        os.kill(srv.proc.pid, signal.SIGKILL)  # no shutdown handler runs
        srv.proc.wait(10)
    srv = ServerProcess(db)
    try:
        with httpx.Client(base_url=srv.url, headers={"Authorization": f"Bearer {TOKEN}"}) as h:
            reports = h.get("/jobs/j/reports").json()
            assert sorted((r["rank"], r["iteration"]) for r in reports) == [(r, i) for r in range(4) for i in range(3)]
        clients = [srv.client(rank, rank % S) for rank in range(4)]
        for c in clients:
            c.register()  # idempotent after the restart
            assert _run_iterations(c, 1) == [3]  # each rank continues where it was
    finally:
        srv.stop()


def test_sigterm_is_graceful(tmp_path):
    db = tmp_path / "db.sqlite"
    srv = ServerProcess(db)
    c = srv.client()
    c.create_job(JOB)
    c.register()
    _run_iterations(c, 2)
    srv.proc.send_signal(signal.SIGTERM)
    # uvicorn shuts down (lifespan shutdown: the store checkpoints and closes), then re-raises the signal
    assert srv.proc.wait(30) in (0, -signal.SIGTERM)
    assert "Application shutdown complete" in srv.proc.stderr.read().decode()
    assert not (tmp_path / "db.sqlite-wal").exists() or (tmp_path / "db.sqlite-wal").stat().st_size == 0
    srv = ServerProcess(db)
    try:
        assert _run_iterations(srv.client(), 1) == [2]
    finally:
        srv.stop()


@pytest.mark.parametrize("args, needle", [
    (["--host", "0.0.0.0"], "without a token"),
    (["--host", "10.1.2.3", "--token", "short"], "too short"),
    (["--port", "70000"], "--port"),
])
def test_serve_refuses(tmp_path, args, needle):
    env = dict(os.environ)
    env.pop("HETPLAN_ENERGY_TOKEN", None)
    r = subprocess.run([sys.executable, "-m", "hetplan.cli.main", "energy", "serve", "--db", str(tmp_path / "x.db"),
                        *args], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 2 and needle in r.stderr and "Traceback" not in r.stderr


def test_too_many_in_flight_gets_429(tmp_path):
    """The bound on requests in flight answers 429 instead of queueing (in-process uvicorn, a held request)."""
    from hetplan.energy.server.app import create_app

    app = create_app(tmp_path / "db.sqlite", max_in_flight=1)
    gate, entered = threading.Event(), threading.Event()
    jobs = app.state.store.jobs

    def slow_jobs():
        entered.set()
        gate.wait(20)
        return jobs()

    app.state.store.jobs = slow_jobs
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    th = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    th.start()
    try:
        while not server.started:
            time.sleep(0.01)
        first = threading.Thread(target=lambda: httpx.get(url + "/health", timeout=30))
        first.start()
        assert entered.wait(20)
        r = httpx.get(url + "/health", timeout=10)
        assert r.status_code == 429 and r.headers["retry-after"] == "1"
        gate.set()
        first.join(20)
        assert httpx.get(url + "/health", timeout=10).status_code == 200
    finally:
        gate.set()
        server.should_exit = True
        th.join(20)
        sock.close()
