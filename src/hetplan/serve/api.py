"""HTTP API of the serving engine (FastAPI).

Endpoints:

* ``POST /v1/models/{model}/generate`` — body ``{"prompt_tokens": [int, ...]}`` or ``{"prompt": "text"}`` (one of them: both is 422)
  (bytes of the UTF-8 text, modulo the vocabulary: the models have random weights and no tokenizer), optional
  ``max_new_tokens``, ``stop_token`` and ``client_id`` (echoed back). Answers ``200`` with ``id``, ``model``,
  ``tokens``, ``latency_s``, ``ttft_s``, ``tpot_s``, ``queue_s``, ``batch_size``; ``400`` malformed JSON; ``401``
  no or wrong token; ``404`` unknown model; ``411``/``413`` no length / body too large; ``415`` a Content-Type
  other than JSON; ``422`` bad input; ``429``
  the model's queue is full (``Retry-After`` header); ``503`` shutting down or a worker failed.
* ``GET /v1/models`` — models, residency, queue lengths, weight and KV-cache bytes per worker.
* ``GET /metrics`` — Prometheus text format 0.0.4 (swaps, bytes swapped, swap bandwidth, queue lengths, latency
  histograms).
* ``GET /healthz``.

Guards (docs/serving.md, "Security"): with a ``token`` every endpoint but ``/healthz`` needs the header
``Authorization: Bearer <token>`` (401 otherwise; compared in constant time); a request body must state its
``Content-Length`` (411) and stay within ``max_request_bytes`` (413); malformed JSON answers 400 and a field of
the wrong type or size 422, each with one message naming the field.

Graceful shutdown: uvicorn stops accepting connections and waits for in-flight requests; the lifespan hook then
drains the engine (``shutdown_timeout_s``) and stops its workers.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import threading
import time

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from hetplan.errors import HetplanError
from hetplan.serve.engine import Engine, EngineClosed, QueueFull, WorkerFailed


#: Largest request body accepted by default (bytes): a prompt of ~100k token ids in JSON.
MAX_REQUEST_BYTES = 1 << 20


class GenerateRequest(BaseModel):
    """Body of ``POST /v1/models/{model}/generate``. Strict types: ``"max_new_tokens": true`` is refused (422),
    not read as 1 token, nor a token id ``true`` as id 1."""

    model_config = ConfigDict(extra="forbid", strict=True)

    prompt_tokens: list[int] | None = Field(default=None, max_length=1 << 17)
    prompt: str | None = Field(default=None, max_length=1 << 19)
    max_new_tokens: int | None = Field(default=None, ge=1)
    stop_token: int | None = Field(default=None, ge=0)
    client_id: str | None = Field(default=None, max_length=256)


def create_app(engine: Engine, *, default_max_new_tokens: int = 1, max_new_tokens_limit: int = 64,
               shutdown_timeout_s: float = 10.0, manage_engine: bool = True, token: str | None = None,
               max_request_bytes: int = MAX_REQUEST_BYTES) -> FastAPI:
    """The FastAPI app over ``engine``. With ``manage_engine`` the app starts the engine on startup (if not
    started) and shuts it down on shutdown; ``token`` and ``max_request_bytes``: see the module docstring."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        if manage_engine and engine.scheduler is None:
            await asyncio.to_thread(engine.start)
        yield
        if manage_engine:
            await asyncio.to_thread(engine.shutdown, shutdown_timeout_s)

    app = FastAPI(title="hetplan serve", lifespan=lifespan)
    expected = f"Bearer {token}".encode() if token else None

    @app.middleware("http")
    async def guard(request: Request, call_next):
        if expected is not None and request.url.path != "/healthz":
            got = request.headers.get("authorization", "").encode()
            if not hmac.compare_digest(got, expected):
                return JSONResponse({"error": "missing or wrong bearer token"}, status_code=401,
                                    headers={"WWW-Authenticate": "Bearer"})
        if request.method in ("POST", "PUT", "PATCH"):
            length = request.headers.get("content-length")
            if length is None or not length.isdigit():
                return JSONResponse({"error": "the request must state its Content-Length"}, status_code=411)
            if int(length) > max_request_bytes:
                return JSONResponse({"error": f"request body of {int(length):,} bytes exceeds the limit of "
                                              f"{max_request_bytes:,} bytes"}, status_code=413)
            # FastAPI reads a body as JSON without a Content-Type or with a JSON one (application/json, …+json);
            # curl -d sends application/x-www-form-urlencoded, and the JSON object was refused as "body: Input
            # should be a valid dictionary"
            ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
            if ctype and not (ctype == "application/json" or ctype.startswith("application/") and ctype.endswith("+json")):
                return JSONResponse({"error": f"content-type: the body is sent as {ctype}; send it as JSON with the "
                                              "header Content-Type: application/json", "field": "content-type"},
                                    status_code=415)
        return await call_next(request)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException):
        # FastAPI's own 400 for a body it cannot decode (not UTF-8, JSON nested too deeply), and 404 / 405 of
        # unknown paths, in this API's shape ({"error", "field"}) rather than {"detail"}
        if exc.status_code == 400:
            return JSONResponse({"error": "body: could not be read as JSON (not UTF-8, or nested too deeply)",
                                 "field": "body"}, status_code=400)
        return JSONResponse({"error": str(exc.detail)}, status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def bad_request(request: Request, exc: RequestValidationError):
        err = exc.errors()[0]
        if err.get("type") == "json_invalid":  # its loc is the character offset, not a field
            at = [x for x in err.get("loc", ()) if x != "body"]
            why = (err.get("ctx") or {}).get("error", "invalid JSON")
            return JSONResponse({"error": f"body: malformed JSON{f' at character {at[0]}' if at else ''}: {why}",
                                 "field": "body"}, status_code=400)
        where = ".".join(str(x) for x in err.get("loc", ()) if x != "body") or "body"
        return JSONResponse({"error": f"{where}: {err.get('msg', 'invalid')}", "field": where}, status_code=422)

    @app.post("/v1/models/{model}/generate")
    async def generate(model: str, body: GenerateRequest):
        if model not in engine.specs:
            return JSONResponse({"error": f"unknown model {model!r}", "models": list(engine.specs)}, status_code=404)
        vocab = engine.vocab_sizes[model]
        if body.prompt_tokens is not None and body.prompt is not None:
            return JSONResponse({"error": "prompt_tokens: give prompt_tokens or prompt, not both", "field": "prompt_tokens"},
                                status_code=422)
        if body.prompt_tokens is not None:
            prompt, given = body.prompt_tokens, "prompt_tokens"
        elif body.prompt is not None:
            prompt, given = [b % vocab for b in body.prompt.encode("utf-8")], "prompt"
        else:
            return JSONResponse({"error": "prompt: give prompt_tokens or prompt", "field": "prompt"}, status_code=422)
        if not prompt:
            return JSONResponse({"error": f"{given}: is empty; give at least one token", "field": given},
                                status_code=422)
        n = body.max_new_tokens or default_max_new_tokens
        if n > max_new_tokens_limit:
            return JSONResponse({"error": f"max_new_tokens: {n} is above the limit {max_new_tokens_limit}",
                                 "field": "max_new_tokens"}, status_code=422)
        try:
            fut = engine.submit(model, prompt, n, body.stop_token)
        except QueueFull as exc:
            return JSONResponse({"error": str(exc)}, status_code=429, headers={"Retry-After": "1"})
        except (EngineClosed, WorkerFailed) as exc:
            return JSONResponse({"error": str(exc)}, status_code=503)
        except HetplanError as exc:  # the engine's "prompt" is the body's field that carried it
            field = given if exc.field == "prompt" else exc.field
            return JSONResponse({"error": exc.render().replace("prompt:", f"{field}:", 1), "field": field},
                                status_code=422)
        try:
            res = await asyncio.wrap_future(fut)
        except (EngineClosed, WorkerFailed) as exc:
            return JSONResponse({"error": str(exc)}, status_code=503)
        return {"id": res.id, "model": res.model, "tokens": res.tokens, "latency_s": res.latency_s,
                "ttft_s": res.ttft_s, "tpot_s": res.tpot_s, "queue_s": res.queue_s, "batch_size": res.batch_size,
                "client_id": body.client_id}

    @app.get("/v1/models")
    async def models():
        sched = engine.scheduler
        out = []
        for name in engine.specs:
            st = sched.models[name] if sched else None
            out.append({"name": name, "state": st.state if st else "offloaded", "queue_length": len(st.queue) if st else 0,
                        "shard_bytes": engine.shard_bytes.get(name), "kv_cache_bytes": engine.kv_bytes.get(name)})
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

    Binds ``host`` (default 127.0.0.1) on ``port``; 0 lets the OS pick a free port when the server binds (no
    window in which another process could take it), read back into ``port`` once started.
    """

    def __init__(self, app: FastAPI, host: str = "127.0.0.1", port: int = 0, startup_timeout_s: float = 180.0):
        import uvicorn

        self.port = port
        self.host = host
        self.server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning",
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
        self.port = self.server.servers[0].sockets[0].getsockname()[1]
        return self.url

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self, timeout_s: float = 60.0) -> None:
        """Graceful stop: finish in-flight requests, run the lifespan shutdown, join the thread."""
        self.server.should_exit = True
        self.thread.join(timeout_s)
