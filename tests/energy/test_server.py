"""The plan server started for real on loopback (uvicorn), with many concurrent fake ranks."""

from __future__ import annotations

import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

pytest.importorskip("fastapi")
uvicorn = pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

from hetplan.energy.client import IterationRunner, PlanClient
from hetplan.energy.frontier import compute_frontier
from hetplan.energy.nvml import open_gpu
from hetplan.energy.profile import parse_stage_profile
from hetplan.energy.server.app import create_app
from hetplan.energy.server.schedulers import pick_frontier_point
from hetplan.errors import HetplanError

from .test_solver import synthetic_profile


class LiveServer:
    """uvicorn serving the app on 127.0.0.1 in a thread, on an OS-chosen port."""

    def __init__(self, db):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        cfg = uvicorn.Config(create_app(db), log_level="warning", limit_concurrency=1000, backlog=2048)
        self.server = uvicorn.Server(cfg)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def __enter__(self):
        self.thread.start()
        deadline = time.time() + 20
        while not self.server.started:
            assert time.time() < deadline, "server did not start"
            time.sleep(0.01)
        return self

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(20)
        self.sock.close()


S, M = 4, 3
FREQS = [1500, 1400, 1300, 1200]


def plan(f_first: int, f_rest: int, t=None, e=None) -> dict:
    freqs = [[f_first] + [f_rest] * (2 * M - 1) for _ in range(S)]
    out = {"frequencies_mhz": freqs}
    if t is not None:
        out.update(time_s=t, energy_j=e)
    return out


JOBS = {
    "point": {"job_id": "point", "num_stages": S, "num_microbatches": M,
              "scheduler": {"kind": "point_solution", "plans": [plan(1500, 1400), plan(1300, 1200)], "iterations_per_plan": 5}},
    "pick": {"job_id": "pick", "num_stages": S, "num_microbatches": M,
             "scheduler": {"kind": "frontier_pick", "idle_power_w": 60.0, "target_time_s": 1.05,
                           "plans": [plan(1200, 1200, 1.3, 80.0), plan(1300, 1300, 1.1, 90.0), plan(1500, 1500, 1.0, 100.0)]}},
    "prof": {"job_id": "prof", "num_stages": S, "num_microbatches": M,
             "scheduler": {"kind": "online_profiling", "frequencies_mhz": FREQS, "iterations_per_frequency": 2}},
}
PROFILE = parse_stage_profile(synthetic_profile(S, np.random.default_rng(7)))


def fake_measurements(schedule, stage):
    out = []
    for (kind, mb), f in zip(schedule.order, schedule.frequencies_mhz):
        p = PROFILE.get(stage, kind)
        k = int(np.argmin(np.abs(p.frequency_mhz - f)))
        out.append({"instruction": kind, "microbatch": mb, "frequency_mhz": f, "time_s": float(p.time_s[k]),
                    "energy_j": float(p.energy_j[k])})
    return out


def run_rank(url, job, rank, stage, iterations, seen):
    c = PlanClient(url, job, rank, stage)
    c.register()
    for _ in range(iterations):
        s = c.next_schedule()
        assert len(s.frequencies_mhz) == 2 * M
        seen.append((job, rank, s.iteration, s.schedule_id, tuple(s.frequencies_mhz)))
        meas = fake_measurements(s, stage)
        t = sum(m["time_s"] for m in meas)
        r = c.report(s.iteration, s.schedule_id, t, sum(m["energy_j"] for m in meas), meas)
        assert r["stored"] is True
        if s.iteration % 4 == 1:  # a client retry: idempotent, never stored twice
            assert c.report(s.iteration, s.schedule_id, t, 1.0, meas)["duplicate"] is True
    c.close()


def test_concurrent_ranks_restart_and_errors(tmp_path):
    db = tmp_path / "plans.sqlite"
    ranks_per_job = 2 * S  # two data-parallel pipelines per job
    iters = 10
    seen: list = []
    with LiveServer(db) as srv:
        boot = PlanClient(srv.url, "point", 0, 0)
        for spec in JOBS.values():
            boot.create_job(spec)
            boot.create_job(spec)  # idempotent
        with ThreadPoolExecutor(max_workers=24) as pool:
            futs = [pool.submit(run_rank, srv.url, job, r, r % S, iters, seen)
                    for job in JOBS for r in range(ranks_per_job)]
            for f in futs:
                f.result()
        with httpx.Client(base_url=srv.url) as h:
            for job in JOBS:
                reps = h.get(f"/jobs/{job}/reports").json()
                assert len(reps) == ranks_per_job * iters  # no report lost, none duplicated
                assert {(r["rank"], r["iteration"]) for r in reps} == {(r, i) for r in range(ranks_per_job) for i in range(iters)}
            profile_csv = h.get("/jobs/prof/profile").text
    # schedules were what the schedulers promise
    by = {(j, r, i): (sid, f) for j, r, i, sid, f in seen}
    assert by[("point", 3, 4)][0] == "plan-0" and by[("point", 3, 5)] == ("plan-1", tuple([1300] + [1200] * 5))
    assert by[("pick", 0, 0)][0] == "frontier-2"  # 1.05 s target: only the 1.0 s plan fits
    assert [by[("prof", 1, i)][0] for i in range(10)] == [f"profile-{f}" for f in FREQS for _ in (0, 1)] + ["max", "max"]
    # the measured profile is the one the fake ranks ran on
    measured = parse_stage_profile(profile_csv)
    for s in range(S):
        for inst in ("forward", "backward"):
            p, q = measured.get(s, inst), PROFILE.get(s, inst)
            assert p.frequency_mhz.tolist() == FREQS
            np.testing.assert_allclose(p.time_s, q.time_s[: len(FREQS)])
            np.testing.assert_allclose(p.energy_j, q.energy_j[: len(FREQS)])

    # restart on the same database: nothing lost, ranks continue where they were
    with LiveServer(db) as srv, httpx.Client(base_url=srv.url) as h:
        assert h.get("/jobs/point").json()["reports"] == ranks_per_job * iters
        c = PlanClient(srv.url, "point", 3, 3)
        assert c.register()["next_iteration"] == iters
        s = c.next_schedule()
        assert (s.iteration, s.schedule_id) == (iters, "plan-1")
        # a new target time moves the frontier pick to the cheapest plan that fits
        assert h.put("/jobs/pick/target", json={"target_time_s": 1.2}).status_code == 200
        assert PlanClient(srv.url, "pick", 0, 0).next_schedule().schedule_id == "frontier-1"

        # malformed or unknown requests: 4xx with a message
        def bad(method, path, status, needle, **kw):
            r = h.request(method, path, **kw)
            assert r.status_code == status, (path, r.status_code, r.text)
            assert needle in r.text
        bad("GET", "/jobs/nope", 404, "unknown job")
        bad("GET", "/jobs/point/ranks/99/schedule", 404, "not registered")
        bad("POST", "/jobs/point/ranks", 422, "does not exist", json={"rank": 50, "stage": 9})
        bad("POST", "/jobs/point/ranks", 409, "already registered", json={"rank": 3, "stage": 1})
        bad("POST", "/jobs/point/ranks", 422, "rank", json={"rank": -1, "stage": 0})
        bad("POST", "/jobs", 422, "JSON", content=b"{not json", headers={"content-type": "application/json"})
        bad("POST", "/jobs", 422, "scheduler", json={"job_id": "x", "num_stages": 2, "num_microbatches": 2})
        bad("POST", "/jobs", 422, "plan 0 must have", json={"job_id": "x", "num_stages": 2, "num_microbatches": 2,
                                                           "scheduler": {"kind": "point_solution", "plans": [{"frequencies_mhz": [[1]]}]}})
        bad("POST", "/jobs", 422, "kind", json={"job_id": "x", "num_stages": 2, "num_microbatches": 2, "scheduler": {"kind": "magic"}})
        bad("POST", "/jobs", 409, "different spec", json=dict(JOBS["point"], schedule="gpipe"))
        bad("POST", "/jobs/point/ranks/3/reports", 422, "time_s",
            json={"iteration": iters, "schedule_id": "plan-1", "time_s": -1})
        bad("POST", "/jobs/point/ranks/3/reports", 409, "next iteration is",
            json={"iteration": iters + 5, "schedule_id": "plan-1", "time_s": 1})
        bad("POST", "/jobs/nope/ranks/0/reports", 404, "unknown job", json={"iteration": 0, "schedule_id": "a", "time_s": 1})
        bad("PUT", "/jobs/point/target", 409, "no target", json={"target_time_s": 1.0})
        with pytest.raises(HetplanError, match="unknown job"):
            PlanClient(srv.url, "nope", 0, 0).register()


def test_online_profiling_then_frontier(tmp_path):
    S2, M2 = 2, 2
    prof = parse_stage_profile(synthetic_profile(S2, np.random.default_rng(3)))
    freqs = [1500, 1400, 1300, 1200]
    spec = {"job_id": "auto", "num_stages": S2, "num_microbatches": M2,
            "scheduler": {"kind": "online_profiling", "frequencies_mhz": freqs,
                          "then": {"idle_power_w": 50.0, "unit_time_s": 0.001, "slowdown": 1.1}}}
    with LiveServer(tmp_path / "db.sqlite") as srv:
        clients = [PlanClient(srv.url, "auto", s, s) for s in range(S2)]
        clients[0].create_job(spec)
        for c in clients:
            c.register()
        for _ in range(len(freqs)):
            for c in clients:
                s = c.next_schedule()
                meas = []
                for (kind, mb), f in zip(s.order, s.frequencies_mhz):
                    t, e = prof.get(c.stage, kind).at_frequency(f)
                    meas.append({"instruction": kind, "frequency_mhz": f, "time_s": t, "energy_j": e})
                c.report(s.iteration, s.schedule_id, 1.0, 1.0, meas)
        final = [c.next_schedule() for c in clients]
        assert all(s.schedule_id.startswith("frontier-") for s in final)
    # the server picked what we pick locally from the same profile
    fr = compute_frontier(prof, M2, 50.0, 0.001)
    from hetplan.energy.baselines import all_max

    target = 1.1 * all_max(prof, fr.dag, 50.0).time_s
    pts = [{"time_s": float(fr.time_s[i]), "energy_j": float(fr.energy_j[i]), "i": int(i)} for i in range(len(fr))]
    k = pick_frontier_point(pts, target, S2, 50.0)
    want = fr.plan(pts[k]["i"]).frequencies_mhz
    assert [s.frequencies_mhz for s in final] == want


def test_iteration_runner_without_gpu(tmp_path):
    spec = {"job_id": "loop", "num_stages": 1, "num_microbatches": 2,
            "scheduler": {"kind": "point_solution", "plans": [{"frequencies_mhz": [[1410, 1410, 1200, 1200]]}]}}
    with LiveServer(tmp_path / "db.sqlite") as srv:
        c = PlanClient(srv.url, "loop", 0, 0)
        c.create_job(spec)
        c.register()
        runner = IterationRunner(c, gpu=None)
        for _ in range(3):
            it = runner.begin()
            for kind, mb in it.order:
                with runner.instruction(kind, mb) as f:
                    assert f in (1410, 1200)
                    time.sleep(0.002)
            assert runner.end()["stored"]
        it = runner.begin()
        with pytest.raises(HetplanError, match="expects forward:0"), runner.instruction("backward", 1):
            pass
        reps = httpx.get(srv.url + "/jobs/loop/reports").json()
        assert len(reps) == 3 and all(r["time_s"] >= 0.008 and r["energy_j"] is None for r in reps)


def test_unreachable_server():
    c = PlanClient("http://127.0.0.1:9", "j", 0, 0, retries=2)
    with pytest.raises(HetplanError, match="unreachable"):
        c.register()


def test_nvml_optional():
    gpu = open_gpu(0)
    if gpu is None:
        pytest.skip("no NVIDIA GPU / pynvml here: NVML control is optional and skipped")
    e0 = gpu.energy_mj()  # pragma: no cover - GPU machines only
    assert gpu.energy_mj() >= e0 and gpu.supported_sm_clocks_mhz()


def test_nvml_device_follows_cuda_visible_devices():
    """CUDA device k is the k-th entry of CUDA_VISIBLE_DEVICES; NVML numbers every GPU (or takes the UUID)."""
    from hetplan.energy.nvml import nvml_device

    assert nvml_device(0, "") == 0 and nvml_device(1, "") == 1
    assert nvml_device(0, "3,1") == 3 and nvml_device(1, "3,1") == 1
    assert nvml_device(0, "GPU-8f2c, 2") == "GPU-8f2c" and nvml_device(1, "GPU-8f2c, 2") == 2


def test_a_target_no_plan_meets_is_refused(tmp_path):
    """A frontier pick asked for a target time below its fastest plan (1.0 s) ran the fastest plan without a word,
    at job creation and on PUT /target; both answer 422 naming the field now."""
    with LiveServer(tmp_path / "db.sqlite") as srv, httpx.Client(base_url=srv.url) as h:
        job = dict(JOBS["pick"], job_id="late")
        r = h.post("/jobs", json={**job, "scheduler": {**job["scheduler"], "target_time_s": 0.9}})
        assert r.status_code == 422 and r.json()["field"] == "scheduler.target_time_s", r.text
        assert "the fastest takes 1 s" in r.json()["detail"]
        assert h.post("/jobs", json=job).status_code == 201
        r = h.put("/jobs/late/target", json={"target_time_s": 0.5})
        assert r.status_code == 422 and r.json()["field"] == "target_time_s", r.text
        assert h.put("/jobs/late/target", json={"target_time_s": 1.0}).status_code == 200
        # a profiling job has no plans before its sweep ends: any target is taken then
        assert h.post("/jobs", json=JOBS["prof"]).status_code == 201
        assert h.put("/jobs/prof/target", json={"target_time_s": 0.001}).status_code == 200
