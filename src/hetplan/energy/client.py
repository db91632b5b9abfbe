"""Client of the plan server, for a training loop.

Typical use on each rank (``gpu`` may be None: no NVML, no GPU — the loop still runs and reports time, and with
``power_w`` the DVFS model's energy; :mod:`hetplan.runtime.energy_loop` does this inside ``hetplan run``)::

    client = PlanClient("http://127.0.0.1:7787", job_id="gpt3", rank=rank, stage=stage)
    client.register()
    runner = IterationRunner(client, gpu=open_gpu(local_rank), sync=torch.cuda.synchronize)
    for step in range(steps):
        it = runner.begin()                          # fetch this iteration's frequency schedule
        for kind, mb in it.order:                    # ("forward", 0), ("forward", 1), ("backward", 0), ...
            with runner.instruction(kind, mb):       # sets the planned SM frequency, measures time and energy
                forward(mb) if kind == "forward" else backward(mb)
        runner.end()                                 # reports iteration time/energy (+ per instruction)

Requests are retried on connection errors; reports are idempotent on the server, so a retry never
duplicates or loses one.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import httpx

from hetplan.errors import HetplanError


@dataclass
class Schedule:
    """One iteration's schedule for a rank.

    Attributes:
        iteration, schedule_id: as issued by the server.
        instructions: ``["forward:0", ...]`` in execution order. frequencies_mhz: same length.
    """

    iteration: int
    schedule_id: str
    instructions: list[str]
    frequencies_mhz: list[int]

    @property
    def order(self) -> list[tuple[str, int]]:
        """``[(kind, micro_batch), ...]`` in execution order."""
        return [(s.split(":")[0], int(s.split(":")[1])) for s in self.instructions]


#: Environment variable holding the plan server's bearer token (server and client).
TOKEN_ENV = "HETPLAN_ENERGY_TOKEN"


class PlanClient:
    """HTTP client of one rank.

    Args:
        base_url: server URL. job_id, rank, stage: identity of this rank.
        retries: attempts per request on connection errors / 5xx / 429. timeout_s: per request.
        token: the server's bearer token (default: ``$HETPLAN_ENERGY_TOKEN``, none if unset).

    Raises (every method):
        HetplanError: the server answered 4xx (message included) or could not be reached after the retries.
    """

    def __init__(self, base_url: str, job_id: str, rank: int, stage: int, *, retries: int = 5,
                 timeout_s: float = 30.0, transport: httpx.BaseTransport | None = None, token: str | None = None):
        self.job_id, self.rank, self.stage = job_id, int(rank), int(stage)
        self.retries = retries
        token = token if token is not None else os.environ.get(TOKEN_ENV)
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(base_url=base_url.rstrip("/"), timeout=timeout_s, transport=transport,
                                  headers=headers)

    def close(self) -> None:
        self._http.close()

    def _call(self, method: str, path: str, **kw) -> dict | list:
        delay = 0.05
        last: Exception | None = None
        for _ in range(max(self.retries, 1)):
            try:
                r = self._http.request(method, path, **kw)
            except httpx.TransportError as exc:
                last = exc
            else:
                if r.status_code < 400:
                    return r.json()
                if r.status_code < 500 and r.status_code != 429:
                    try:
                        detail = r.json().get("detail", r.text)
                    except ValueError:
                        detail = r.text
                    raise HetplanError(f"plan server refused {method} {path}: {detail}", field="server",
                                       fix="check the job id, rank and stage")
                last = RuntimeError(f"HTTP {r.status_code}: {r.text[:200]}")
            time.sleep(delay)
            delay = min(delay * 2, 2.0)
        raise HetplanError(f"plan server unreachable for {method} {path}: {last}", field="server",
                           fix="start it with 'hetplan energy serve' and check the URL")

    def create_job(self, spec: dict) -> dict:
        """POST /jobs (idempotent for an identical spec)."""
        return self._call("POST", "/jobs", json=spec)

    def register(self) -> dict:
        """POST /jobs/{job}/ranks: announce this rank and its pipeline stage."""
        return self._call("POST", f"/jobs/{self.job_id}/ranks", json={"rank": self.rank, "stage": self.stage})

    def next_schedule(self) -> Schedule:
        """GET the frequency schedule (one frequency in MHz per instruction, in schedule order) of the next iteration."""
        d = self._call("GET", f"/jobs/{self.job_id}/ranks/{self.rank}/schedule")
        return Schedule(d["iteration"], d["schedule_id"], d["instructions"], d["frequencies_mhz"])

    def report(self, iteration: int, schedule_id: str, time_s: float, energy_j: float | None,
               measurements: list[dict] | None = None, energy_source: str | None = None) -> dict:
        """POST the measured iteration time (s) and energy (J, None without NVML or power model) for
        ``schedule_id``; ``energy_source`` says where the energy comes from (:data:`ENERGY_SOURCES`). A repeated
        report of one iteration is accepted once."""
        body = {"iteration": iteration, "schedule_id": schedule_id, "time_s": time_s, "energy_j": energy_j,
                "measurements": measurements or []}
        if energy_source is not None:
            body["energy_source"] = energy_source
        return self._call("POST", f"/jobs/{self.job_id}/ranks/{self.rank}/reports", json=body)


@dataclass
class _Iter:
    schedule: Schedule
    start_s: float
    start_mj: int | None
    pos: int = 0
    busy_s: float = 0.0
    busy_j: float = 0.0
    measurements: list[dict] = field(default_factory=list)


#: Where a reported energy comes from: the GPU's NVML energy counter, or the DVFS power model times the measured
#: time (no GPU: :class:`IterationRunner` with ``power_w``); absent when neither is available.
ENERGY_SOURCES = ("nvml", "model")


class IterationRunner:
    """Applies a schedule around each forward/backward and reports the measurements.

    Args:
        client: the rank's :class:`PlanClient`.
        gpu: an :class:`hetplan.energy.nvml.NvmlGpu` or None (no frequency control, no energy counter).
        sync: called before reading clocks/counters (e.g. ``torch.cuda.synchronize``) so that asynchronous
            GPU work is attributed to the right instruction.
        power_w: without ``gpu``: busy power (W) of the modelled GPU at a SM clock (MHz), e.g.
            ``GPUPower.busy_power_w`` at the clock the power limit lets it sustain. An instruction's energy is then
            ``power_w(f) · measured time`` and the iteration's adds ``idle_power_w`` for the time between
            instructions; reported with ``energy_source = "model"`` (not measured).
        idle_power_w: the modelled GPU's blocking power (W), with ``power_w``.

    Attributes:
        frequency_log: every frequency this rank set, or would have set without a GPU, in execution order:
            ``{"iteration", "instruction", "frequency_mhz", "applied"}`` (``applied``: NVML locked the clock).
        energy_source: ``"nvml"``, ``"model"`` or None (:data:`ENERGY_SOURCES`).
    """

    def __init__(self, client: PlanClient, gpu=None, sync: Callable[[], None] | None = None,
                 power_w: Callable[[int], float] | None = None, idle_power_w: float = 0.0):
        self.client, self.gpu, self.sync = client, gpu, sync or (lambda: None)
        self.power_w, self.idle_power_w = (None if gpu is not None else power_w), float(idle_power_w)
        # a simulated NVML's counter is the power model's (hetplan.energy.nvml.SimulatedNvml): not measured
        self.energy_source = (("model" if getattr(gpu, "simulated", False) else "nvml") if gpu is not None
                              else ("model" if power_w is not None else None))
        self.frequency_log: list[dict] = []
        self._it: _Iter | None = None

    def _energy_mj(self) -> int | None:
        return None if self.gpu is None else self.gpu.energy_mj()

    def begin(self) -> Schedule:
        """Fetch the next schedule and start timing the iteration."""
        sched = self.client.next_schedule()
        self.sync()
        self._it = _Iter(sched, time.perf_counter(), self._energy_mj())
        return sched

    @contextmanager
    def instruction(self, kind: str, microbatch: int) -> Iterator[int]:
        """Run one forward/backward at its planned frequency; yields that frequency (MHz).

        Raises:
            HetplanError: called outside begin()/end(), or out of the schedule's order.
        """
        it = self._it
        if it is None:
            raise HetplanError("instruction() outside an iteration", field="runner", fix="call begin() first")
        name = f"{kind}:{microbatch}"
        if it.pos >= len(it.schedule.instructions) or it.schedule.instructions[it.pos] != name:
            expected = it.schedule.instructions[it.pos] if it.pos < len(it.schedule.instructions) else "end()"
            raise HetplanError(f"ran {name} but the schedule expects {expected}", field="runner",
                               fix="run the instructions in Schedule.order")
        freq = it.schedule.frequencies_mhz[it.pos]
        applied = self.gpu.set_frequency_mhz(freq) if self.gpu is not None else False
        self.frequency_log.append({"iteration": it.schedule.iteration, "instruction": name, "frequency_mhz": freq,
                                   "applied": bool(applied)})
        self.sync()
        t0, e0 = time.perf_counter(), self._energy_mj()
        yield freq
        self.sync()
        t1, e1 = time.perf_counter(), self._energy_mj()
        dt = t1 - t0
        if e0 is not None and e1 is not None:
            energy: float | None = (e1 - e0) / 1000.0
        elif self.power_w is not None:
            energy = float(self.power_w(freq)) * dt
        else:
            energy = None
        it.busy_s += dt
        it.busy_j += energy or 0.0
        it.measurements.append({"instruction": kind, "microbatch": microbatch, "frequency_mhz": freq,
                                "time_s": dt, "energy_j": energy})
        it.pos += 1

    def end(self) -> dict:
        """Report the iteration (time, energy, per-instruction measurements) to the server; returns
        ``{"iteration", "schedule_id", "time_s", "energy_j", "energy_source", "stored"}`` (``stored`` False: the
        server already had this iteration)."""
        it = self._it
        if it is None:
            raise HetplanError("end() without begin()", field="runner", fix="call begin() first")
        self.sync()
        t = time.perf_counter() - it.start_s
        e1 = self._energy_mj()
        if it.start_mj is not None and e1 is not None:
            e: float | None = (e1 - it.start_mj) / 1000.0
        elif self.power_w is not None:
            e = it.busy_j + self.idle_power_w * max(t - it.busy_s, 0.0)
        else:
            e = None
        self._it = None
        reply = self.client.report(it.schedule.iteration, it.schedule.schedule_id, t, e, it.measurements,
                                   energy_source=self.energy_source)
        return {"iteration": it.schedule.iteration, "schedule_id": it.schedule.schedule_id, "time_s": t,
                "energy_j": e, "energy_source": self.energy_source, "stored": bool(reply.get("stored"))}
