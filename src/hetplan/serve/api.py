"""HTTP API of the serving engine (FastAPI).

Endpoints:

* ``POST /v1/models/{model}/generate`` — body ``{"prompt_tokens": [int, ...]}`` or ``{"prompt": "text"}``
  (bytes of the UTF-8 text, modulo the vocabulary: the models have random weights and no tokenizer), optional
  ``max_new_tokens`` and ``client_id`` (echoed back). Answers ``200`` with ``id``, ``model``, ``tokens``,
  ``latency_s``, ``queue_s``, ``batch_size``; ``404`` unknown model; ``422`` bad input; ``429`` the model's queue
  is full (``Retry-After`` header); ``503`` shutting down or a worker failed.
* ``GET /v1/models`` — models, residency, queue lengths, shard bytes per worker.
* ``GET /metrics`` — Prometheus text format 0.0.4 (swaps, bytes swapped, swap bandwidth, queue lengths, latency
  histograms).
* ``GET /healthz``.

Graceful shutdown: uvicorn stops accepting connections and waits for in-flight requests; the lifespan hook then
drains the engine (``shutdown_timeout_s``) and stops its workers.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time

from fastapi import FastAPI
from fastapi.responses import JSONResponse, PlainTextResponse
from pydantic import BaseModel, Field

from hetplan.errors import HetplanError
from hetplan.serve.engine import Engine, EngineClosed, QueueFull, WorkerFailed


class GenerateRequest(BaseModel):
    """Body of ``POST /v1/models/{model}/generate``."""

    prompt_tokens: list[int] | None = None
    prompt: str | None = None
    max_new_tokens: int | None = Field(default=None, ge=1)
    client_id: str | None = None


def create_app(engine: Engine, *, default_max_new_tokens: int = 1, max_new_tokens_limit: int = 64,
               shutdown_timeout_s: float = 10.0, manage_engine: bool = True) -> FastAPI:
    """The FastAPI app over ``engine``. With ``manage_engine`` the app starts the engine on startup (if not
    started) and shuts it down on shutdown."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        if manage_engine and engine.scheduler is None:
            await asyncio.to_thread(engine.start)
        yield
        if manage_engine:
            await asyncio.to_thread(engine.shutdown, shutdown_timeout_s)

    app = FastAPI(title="hetplan serve", lifespan=lifespan)

    @app.post("/v1/models/{model}/generate")
    async def generate(model: str, body: GenerateRequest):
        if model not in engine.specs:
            return JSONResponse({"error": f"unknown model {model!r}", "models": list(engine.specs)}, status_code=404)
        vocab = engine.vocab_sizes[model]
        if body.prompt_tokens is not None:
            prompt = body.prompt_tokens
        elif body.prompt is not None:
            prompt = [b % vocab for b in body.prompt.encode("utf-8")]
        else:
            return JSONResponse({"error": "give prompt_tokens or prompt"}, status_code=422)
        n = body.max_new_tokens or default_max_new_tokens
        if n > max_new_tokens_limit:
            return JSONResponse({"error": f"max_new_tokens {n} above the limit {max_new_tokens_limit}"}, status_code=422)
        try:
            fut = engine.submit(model, prompt, n)
        except QueueFull as exc:
            return JSONResponse({"error": str(exc)}, status_code=429, headers={"Retry-After": "1"})
        except (EngineClosed, WorkerFailed) as exc:
            return JSONResponse({"error": str(exc)}, status_code=503)
        except HetplanError as exc:
            return JSONResponse({"error": exc.render(), "field": exc.field}, status_code=422)
        try:
            res = await asyncio.wrap_future(fut)
        except (EngineClosed, WorkerFailed) as exc:
            return JSONResponse({"error": str(exc)}, status_code=503)
        return {"id": res.id, "model": res.model, "tokens": res.tokens, "latency_s": res.latency_s,
                "queue_s": res.queue_s, "batch_size": res.batch_size, "client_id": body.client_id}

    @app.get("/v1/models")
    async def models():
        sched = engine.scheduler
        out = []
        for name in engine.specs:
            st = sched.models[name] if sched else None
            out.append({"name": name, "state": st.state if st else "offloaded", "queue_length": len(st.queue) if st else 0,
                        "shard_bytes": engine.shard_bytes.get(name)})
        return {"models": out, "capacity_bytes": engine.capacity_bytes, "tp": engine.tp, "pp": engine.pp}

    @app.get("/metrics")
    async def metrics():
        return PlainTextResponse(engine.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/healthz")
    async def healthz():
        return {"status": "closing" if engine._closing else "ok"}

    return app


class BackgroundServer:
    """Run an app with uvicorn in a background thread (tests, load test): ``with BackgroundServer(app) as url:``.

    Binds ``host`` (default 127.0.0.1) on ``port`` (0 = a free port).
    """

    def __init__(self, app: FastAPI, host: str = "127.0.0.1", port: int = 0, startup_timeout_s: float = 180.0):
        import uvicorn

        from hetplan.serve.engine import free_port

        self.port = port or free_port()
        self.host = host
        self.server = uvicorn.Server(uvicorn.Config(app, host=host, port=self.port, log_level="warning",
                                                    lifespan="on", timeout_graceful_shutdown=30))
        self.thread = threading.Thread(target=self.server.run, daemon=True, name="hetplan-serve-http")
        self.startup_timeout_s = startup_timeout_s

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def __enter__(self) -> str:
        self.thread.start()
        deadline = time.monotonic() + self.startup_timeout_s
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("HTTP server did not start")
            time.sleep(0.05)
        return self.url

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self, timeout_s: float = 60.0) -> None:
        """Graceful stop: finish in-flight requests, run the lifespan shutdown, join the thread."""
        self.server.should_exit = True
        self.thread.join(timeout_s)
