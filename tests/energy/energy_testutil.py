"""Shared paths and constants of the energy tests."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "energy"
IDLE_A100_W = 83.64  # W, Perseus' blocking power of A100-SXM (../shared/data/energy/README.md)
IDLE_A40_W = 70.38  # W, A40


def profile_path(model: str, device: str = "a100_sxm") -> Path:
    return FIXTURES / f"{model}+{device}_bf16.csv"


#: Bearer token of the servers the tests start.
TOKEN = "0123456789abcdef0123"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """``hetplan energy serve`` started as a process on 127.0.0.1 (a free port) over the SQLite file ``db``."""

    def __init__(self, db, *args, token=TOKEN):
        env = dict(os.environ)
        env.pop("HETPLAN_ENERGY_TOKEN", None)
        # The free port is released before the server binds it, so another process may take it in between: then
        # the server exits with "address already in use" and is started again on another port.
        for _ in range(5):
            self.port = _free_port()
            self.url = f"http://127.0.0.1:{self.port}"
            cmd = [sys.executable, "-m", "hetplan.cli.main", "energy", "serve", "--db", str(db), "--port",
                   str(self.port), *(["--token", token] if token else []), *args]
            # stdout (uvicorn's access log) is not read: a pipe would fill up and stall the server
            self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
            err = self._wait_ready()
            if err is None:
                return
            assert "address already in use" in err.lower(), err  # uvicorn's log, or hetplan's check before it
        raise AssertionError(f"no free port for the server: {err}")

    def _wait_ready(self) -> str | None:
        """Poll /health until this server answers (None) or its process ends (its stderr)."""
        import httpx

        deadline = time.time() + 60
        while True:
            try:
                ok = httpx.get(self.url + "/health", timeout=1).status_code == 200
            except httpx.TransportError:
                ok = False
            if self.proc.poll() is not None:  # checked after the answer: a foreign server on the port must not pass
                return self.proc.stderr.read().decode()
            if ok:
                return None
            assert time.time() < deadline, "server did not start"
            time.sleep(0.1)

    def client(self, rank=0, stage=0, token=TOKEN, job="j"):
        from hetplan.energy.client import PlanClient

        return PlanClient(self.url, job, rank, stage, token=token, retries=2)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
