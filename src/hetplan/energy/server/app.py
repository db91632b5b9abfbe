"""FastAPI application of the frequency plan server.

Endpoints (JSON; errors are ``{"detail": message}`` with a 4xx status):

``POST /jobs``                                  create a job (201; 409 if the id exists with another spec)
``GET  /jobs/{job}``                            job spec summary, ranks, report count, current target
``PUT  /jobs/{job}/target``                     ``{"target_time_s": x}``: new target time (frontier pick; 422 when
                                                no plan meets it)
``POST /jobs/{job}/ranks``                      ``{"rank": r, "stage": s}``: register a rank
``GET  /jobs/{job}/ranks/{rank}/schedule``      the rank's next iteration and its frequency schedule
``POST /jobs/{job}/ranks/{rank}/reports``       measured time/energy of one iteration (+ per instruction)
``GET  /jobs/{job}/reports``                    all reports
``GET  /jobs/{job}/profile``                    the measured stage profile (CSV) from online profiling; header
                                                ``X-Energy-Sources``: ``nvml`` and/or ``model`` (not measured)
``GET  /health``                                 (no token needed)

Hardening (issue 17): an optional bearer token (``Authorization: Bearer <token>``; 401 without it), a request
size limit (413), a bound on requests in flight (429 with ``Retry-After`` beyond it, instead of an unbounded
queue), malformed JSON → 422 with the parser's message. The CLI (``hetplan energy serve``) binds 127.0.0.1 by
default and refuses a non-loopback address without a token; uvicorn stops gracefully on SIGTERM (in-flight
requests finish), and every accepted write is a committed SQLite transaction (WAL, ``synchronous=FULL``), so a
``kill -9`` loses nothing that was answered 2xx.
"""

from __future__ import annotations

import hmac
import json
import threading
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Annotated, Literal

from fastapi import FastAPI, HTTPException, Path as PathParam, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from pydantic import BaseModel, ConfigDict, Field

from hetplan.energy.server import schedulers as sch
from hetplan.energy.server.store import Store
from hetplan.errors import HetplanError

NAME = r"^[A-Za-z0-9_.\-]{1,128}$"


#: Largest rank (and stage, iteration, micro-batch) a request may name: torch.distributed ranks are C ``int``
#: (32-bit), and SQLite stores at most a signed 64-bit INTEGER; a 23-digit rank in a path or body was an HTTP 500
#: (sqlite3 OverflowError) before this bound (issue 27).
MAX_INDEX = 2**31 - 1
#: A rank in a request path.
Rank = Annotated[int, PathParam(ge=0, le=MAX_INDEX)]


class _Strict(BaseModel):
    """Request bodies: unknown fields, NaN / infinity and a boolean for a number are refused (422)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)


class PlanIn(_Strict):
    frequencies_mhz: list[list[Annotated[int, Field(gt=0, le=MAX_INDEX)]]]
    time_s: float | None = Field(default=None, ge=0)
    energy_j: float | None = Field(default=None, ge=0)
    name: str | None = None


class Then(_Strict):
    idle_power_w: float = Field(ge=0)
    unit_time_s: float = Field(default=0.001, gt=0)
    target_time_s: float | None = Field(default=None, gt=0)
    slowdown: float | None = Field(default=None, ge=1)


class OnlineProfiling(_Strict):
    kind: Literal["online_profiling"]
    frequencies_mhz: list[Annotated[int, Field(gt=0, le=MAX_INDEX)]] = Field(min_length=1)
    iterations_per_frequency: int = Field(default=1, ge=1)
    then: Then | None = None


class PointSolution(_Strict):
    kind: Literal["point_solution"]
    plans: list[PlanIn] = Field(min_length=1)
    iterations_per_plan: int = Field(default=1, ge=1)


class FrontierPick(_Strict):
    kind: Literal["frontier_pick"]
    plans: list[PlanIn] = Field(min_length=1)
    idle_power_w: float = Field(ge=0)
    target_time_s: float | None = Field(default=None, gt=0)


class JobIn(_Strict):
    job_id: str = Field(pattern=NAME)
    num_stages: int = Field(ge=1, le=4096)
    num_microbatches: int = Field(ge=1, le=1_000_000)
    schedule: Literal["1f1b", "gpipe"] = "1f1b"
    scheduler: Annotated[OnlineProfiling | PointSolution | FrontierPick, Field(discriminator="kind")]


class RankIn(_Strict):
    rank: int = Field(ge=0, le=MAX_INDEX)
    stage: int = Field(ge=0, le=MAX_INDEX)


class MeasurementIn(_Strict):
    instruction: Literal["forward", "backward"]
    frequency_mhz: int = Field(gt=0, le=MAX_INDEX)
    time_s: float = Field(ge=0)
    energy_j: float | None = Field(default=None, ge=0)
    microbatch: int | None = Field(default=None, ge=0, le=MAX_INDEX)


class ReportIn(_Strict):
    iteration: int = Field(ge=0, le=MAX_INDEX)
    schedule_id: str = Field(min_length=1, max_length=128)
    time_s: float = Field(ge=0)
    energy_j: float | None = Field(default=None, ge=0)
    energy_source: Literal["nvml", "model"] | None = None
    measurements: list[MeasurementIn] = Field(default_factory=list, max_length=1_000_000)


class TargetIn(_Strict):
    target_time_s: float = Field(gt=0)


#: The frontier library's parameters (which its errors name) as keys of a job spec's online profiling.
THEN_KEYS = {k: f"scheduler.then.{k}" for k in ("unit_time_s", "idle_power_w")}
#: Default request body limit (bytes): a report of 1F1B with 4,096 micro-batches and per-instruction
#: measurements is ~1 MB.
MAX_BODY_BYTES = 8 * 2**20
#: Default bound on requests being served at once (more get 429).
MAX_IN_FLIGHT = 256


class _Guard:
    """ASGI middleware: bearer token, body size limit and in-flight bound (module doc)."""

    def __init__(self, app, token: str | None, max_body_bytes: int, max_in_flight: int):
        self.app, self.token = app, token
        self.max_body, self.slots = int(max_body_bytes), threading.BoundedSemaphore(int(max_in_flight))

    @staticmethod
    async def _reply(send, status: int, detail: str, headers: tuple = ()) -> None:
        body = json.dumps({"detail": detail}).encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                *headers]})
        await send({"type": "http.response.body", "body": body})

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        if self.token is not None and scope.get("path") != "/health":
            got = headers.get(b"authorization", b"").decode("latin-1")
            if not hmac.compare_digest(got.encode(), f"Bearer {self.token}".encode()):
                return await self._reply(send, 401, "missing or wrong bearer token; send 'Authorization: Bearer "
                                                    "<token>' (the server's --token)", ((b"www-authenticate", b"Bearer"),))
        length = headers.get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_body):
            return await self._reply(send, 413, f"request body of {length.decode(errors='replace')} bytes is over the "
                                                f"limit of {self.max_body} bytes")
        if not self.slots.acquire(blocking=False):
            return await self._reply(send, 429, "too many requests in flight; retry shortly", ((b"retry-after", b"1"),))
        try:
            if length is None and scope.get("method") in ("POST", "PUT", "PATCH"):
                chunks, size, more = [], 0, True
                while more:  # chunked body: read it within the limit, then replay it
                    msg = await receive()
                    chunk = msg.get("body", b"")
                    size += len(chunk)
                    if size > self.max_body:
                        return await self._reply(send, 413, f"request body is over the limit of {self.max_body} bytes")
                    chunks.append(chunk)
                    more = msg.get("more_body", False)
                replay = [{"type": "http.request", "body": b"".join(chunks), "more_body": False}]

                async def receive_again():
                    return replay.pop() if replay else await receive()

                return await self.app(scope, receive_again, send)
            return await self.app(scope, receive, send)
        finally:
            self.slots.release()


def create_app(db_path: str | Path, *, token: str | None = None, max_body_bytes: int = MAX_BODY_BYTES,
               max_in_flight: int = MAX_IN_FLIGHT) -> FastAPI:
    """Build the server on the SQLite file ``db_path`` (created if missing; state survives restarts).

    Args:
        token: bearer token every request but ``/health`` must carry (None: no authentication).
        max_body_bytes: larger request bodies get 413. max_in_flight: more concurrent requests get 429.
    """
    store = Store(db_path)

    @asynccontextmanager
    async def lifespan(_: FastAPI):
        yield
        store.close()  # graceful stop (SIGTERM): checkpoint the WAL into the database file

    app = FastAPI(title="hetplan energy plan server", version="1", lifespan=lifespan)
    app.add_middleware(_Guard, token=token, max_body_bytes=max_body_bytes, max_in_flight=max_in_flight)
    app.state.store = store
    cache: dict[str, tuple[dict, dict]] = {}
    lock = threading.RLock()

    @app.exception_handler(HetplanError)
    async def _hetplan_error(_: Request, exc: HetplanError) -> JSONResponse:
        return JSONResponse(status_code=422, content={"detail": exc.render(), "field": exc.field, "fix": exc.fix})

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        # FastAPI's own handler echoes each error's input, and a NaN or Infinity input (JSON accepts neither)
        # made its response an HTTP 500 (issue 27): say where and what, not the value.
        errors = [{"loc": [str(x) for x in e.get("loc", ())], "msg": str(e.get("msg", "")) + (
                   f": {e['ctx']['error']}" if e.get("type") == "json_invalid" and "error" in (e.get("ctx") or {})
                   else ""), "type": str(e.get("type", ""))} for e in exc.errors()]
        return JSONResponse(status_code=422, content={"detail": errors})

    def job_or_404(job_id: str) -> tuple[dict, dict]:
        with lock:
            if job_id in cache:
                return cache[job_id]
            got = store.job(job_id)
            if got is None:
                raise HTTPException(404, detail=f"unknown job {job_id!r}; create it with POST /jobs")
            cache[job_id] = got
            return got

    def stage_or_404(job_id: str, rank: int) -> int:
        stage = store.rank_stage(job_id, rank)
        if stage is None:
            raise HTTPException(404, detail=f"rank {rank} is not registered in job {job_id!r}; "
                                            f"POST /jobs/{job_id}/ranks first")
        return stage

    def save_state(job_id: str, spec: dict, state: dict) -> None:
        with lock:
            store.set_state(job_id, state)
            cache[job_id] = (spec, state)

    def maybe_finish_profiling(job_id: str, spec: dict, state: dict) -> dict:
        s = spec["scheduler"]
        if s["kind"] != "online_profiling" or not s.get("then") or "frontier" in state or "error" in state:
            return state
        total = len(s["frequencies_mhz"]) * s.get("iterations_per_frequency", 1)
        ranks = store.ranks(job_id)
        if not ranks or any(store.next_iteration(job_id, r) < total for r in ranks):
            return state
        with lock:
            spec, state = job_or_404(job_id)
            if "frontier" in state or "error" in state:
                return state
            try:
                new = dict(state, **sch.frontier_state_from_profile(spec, store.measured_profile(job_id), s["then"]))
            except HetplanError as exc:  # keep running at max frequency, tell the user why, in the spec's keys
                key = THEN_KEYS.get(exc.field or "")
                if key is not None:  # the frontier library names its parameter and the CLI's flag
                    flag = "--" + (exc.field or "").replace("_", "-")
                    exc = HetplanError(exc.message, field=key, fix=(exc.fix or "").replace(flag, key))
                new = dict(state, error=exc.render())
            save_state(job_id, spec, new)
            return new

    @app.get("/health")
    def health() -> dict:
        return {"ok": True, "jobs": len(store.jobs())}

    @app.post("/jobs", status_code=201)
    def create_job(job: JobIn) -> dict:
        spec = job.model_dump()
        sch.validate_spec(spec)
        state: dict = {}
        s = spec["scheduler"]
        if s["kind"] == "frontier_pick" and s.get("target_time_s") is not None:
            state["target_time_s"] = s["target_time_s"]
        if not store.create_job(job.job_id, spec, state):
            existing, _ = job_or_404(job.job_id)
            if existing != spec:
                raise HTTPException(409, detail=f"job {job.job_id!r} exists with a different spec")
        return {"job_id": job.job_id, "created": True}

    @app.get("/jobs/{job_id}")
    def get_job(job_id: str) -> dict:
        spec, state = job_or_404(job_id)
        return {"job_id": job_id, "num_stages": spec["num_stages"], "num_microbatches": spec["num_microbatches"],
                "schedule": spec["schedule"], "scheduler": spec["scheduler"]["kind"], "ranks": store.ranks(job_id),
                "reports": store.count_reports(job_id), "target_time_s": state.get("target_time_s"),
                "has_frontier": "frontier" in state, "error": state.get("error"),
                "energy_sources": store.energy_sources(job_id)}

    @app.put("/jobs/{job_id}/target")
    def set_target(job_id: str, body: TargetIn) -> dict:
        spec, state = job_or_404(job_id)
        if spec["scheduler"]["kind"] == "point_solution":
            raise HTTPException(409, detail="a point_solution job runs fixed plans; it has no target time")
        plans = spec["scheduler"].get("plans") or state.get("frontier", {}).get("plans")
        if plans:  # a frontier pick's plans, or those the profiling produced (before that: nothing to check)
            sch.check_target(plans, body.target_time_s)
        save_state(job_id, spec, dict(state, target_time_s=body.target_time_s))
        return {"job_id": job_id, "target_time_s": body.target_time_s}

    @app.post("/jobs/{job_id}/ranks")
    def register(job_id: str, body: RankIn) -> dict:
        spec, _ = job_or_404(job_id)
        if body.stage >= spec["num_stages"]:
            raise HTTPException(422, detail=f"stage {body.stage} does not exist: job {job_id!r} has stages "
                                            f"0..{spec['num_stages'] - 1}")
        created, existing = store.register(job_id, body.rank, body.stage)
        if not created and existing != body.stage:
            raise HTTPException(409, detail=f"rank {body.rank} is already registered on stage {existing}")
        return {"job_id": job_id, "rank": body.rank, "stage": body.stage,
                "next_iteration": store.next_iteration(job_id, body.rank)}

    @app.get("/jobs/{job_id}/ranks/{rank}/schedule")
    def schedule(job_id: str, rank: Rank) -> dict:
        spec, state = job_or_404(job_id)
        stage = stage_or_404(job_id, rank)
        state = maybe_finish_profiling(job_id, spec, state)
        it = store.next_iteration(job_id, rank)
        sid, freqs = sch.schedule_for(spec, state, stage, it)
        return {"job_id": job_id, "rank": rank, "stage": stage, "iteration": it, "schedule_id": sid,
                "instructions": sch.instructions(spec, stage), "frequencies_mhz": freqs}

    @app.post("/jobs/{job_id}/ranks/{rank}/reports", status_code=201)
    def report(job_id: str, rank: Rank, body: ReportIn) -> JSONResponse:
        job_or_404(job_id)
        stage = stage_or_404(job_id, rank)
        nxt = store.next_iteration(job_id, rank)
        if body.iteration > nxt:
            raise HTTPException(409, detail=f"rank {rank} reported iteration {body.iteration} but its next iteration "
                                            f"is {nxt}; fetch the schedule and report iterations in order")
        meas = [(m.instruction, m.frequency_mhz, m.time_s, m.energy_j) for m in body.measurements]
        stored = store.add_report(job_id, rank, stage, body.iteration, body.schedule_id, body.time_s, body.energy_j, meas,
                                  body.energy_source)
        if not stored:  # a retry of a report we already have: idempotent
            return JSONResponse(status_code=200, content={"stored": False, "duplicate": True, "iteration": body.iteration})
        return JSONResponse(status_code=201, content={"stored": True, "iteration": body.iteration})

    @app.get("/jobs/{job_id}/reports")
    def reports(job_id: str) -> list[dict]:
        job_or_404(job_id)
        return store.reports(job_id)

    @app.get("/jobs/{job_id}/profile", response_class=PlainTextResponse)
    def profile(job_id: str) -> PlainTextResponse:
        job_or_404(job_id)
        rows = store.measured_profile(job_id)
        if not rows:
            raise HTTPException(404, detail=f"job {job_id!r} has no per-instruction measurements with energy yet")
        text = "stage,instruction,frequency,time,energy\n" + "".join(f"{s},{i},{f},{t!r},{e!r}\n" for s, i, f, t, e, _ in rows)
        # "model": some energies are the DVFS model times measured time (ranks without NVML), not measurements
        return PlainTextResponse(text, headers={"X-Energy-Sources": ",".join(store.energy_sources(job_id)) or "none"})

    return app
