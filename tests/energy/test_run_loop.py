"""Perseus' loop in hetplan's own trainer (``hetplan run --energy-server``), on CPU with the server really started.

The plan is the tiny Llama on PP 2 x DP 2 (4 gloo ranks), its pool an A100-SXM-80GB so the ranks have a DVFS model
for their (modelled, not measured) energy. The job profiles 2 clocks, then runs the frontier of what it measured.
"""

from __future__ import annotations

import csv
import io
import json
import os
import signal
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

from hetplan.energy.dag import instruction_name, stage_order  # noqa: E402
from hetplan.errors import HetplanError  # noqa: E402
from hetplan.hardware.catalog import load_catalog  # noqa: E402
from hetplan.hardware.power import board_limited, get_power  # noqa: E402
from hetplan.runtime import planio  # noqa: E402
from hetplan.runtime.energy_loop import EnergyOptions, job_spec  # noqa: E402
from hetplan.runtime.launcher import RunOptions, run_plan  # noqa: E402

from .energy_testutil import TOKEN, ServerProcess  # noqa: E402

ROOT = Path(__file__).parents[2]
GPU = "A100-SXM-80GB"
CLOCKS = (1410, 1005)


@pytest.fixture()
def plan_path(tmp_path) -> Path:
    raw = json.loads((ROOT / "examples" / "tiny-pp2-dp2.json").read_text())
    raw["job"]["model"] = str(ROOT / "examples" / "tiny-model.json")
    raw["pools"] = [{"gpu": GPU, "count": 4, "gpus_per_node": 4}]
    p = tmp_path / "plan.json"
    p.write_text(json.dumps(raw))
    return p


def test_loop_profiles_applies_reports_and_survives_kill_9(tmp_path, plan_path):
    db = tmp_path / "energy.sqlite"
    srv = ServerProcess(db)
    try:
        energy = EnergyOptions(server=srv.url, token=TOKEN, frequencies_mhz=CLOCKS)
        res = run_plan(plan_path, RunOptions(iterations=3, warmup=1, stage_repeats=1, energy=energy))
        e = res["energy"]
        job = e["job_id"]
        auth = {"Authorization": f"Bearer {TOKEN}"}
        with httpx.Client(base_url=srv.url, headers=auth) as h:
            info = h.get(f"/jobs/{job}").json()
            reports = h.get(f"/jobs/{job}/reports").json()
            got = h.get(f"/jobs/{job}/profile")
            profile = got.text
            assert got.headers["x-energy-sources"] == "model"
            schedules = {r: h.get(f"/jobs/{job}/ranks/{r}/schedule").json() for r in range(4)}
    finally:
        os.kill(srv.proc.pid, signal.SIGKILL)  # no shutdown handler runs: only committed transactions remain
        srv.proc.wait(10)

    # The run: sweep 1410, then 1005, then a frontier plan of the measured profile; energy modelled, said so.
    assert [it["schedule_ids"] for it in e["iterations"]] == [["profile-1410"], ["profile-1005"],
                                                               [schedules[0]["schedule_id"]]]
    assert schedules[0]["schedule_id"].startswith("frontier-") and info["has_frontier"]
    assert e["energy_source"] == "model" and e["energy_measured"] is False
    assert sorted(info["ranks"]) == ["0", "1", "2", "3"] and info["reports"] == 12
    assert info["energy_sources"] == ["model"]

    # Each rank ran its stage's instructions in the server's order, at the server's clocks (recorded on CPU).
    idle = load_catalog().get(GPU).idle_power_w
    pw = board_limited(get_power(GPU), load_catalog().get(GPU).tdp_w, idle)  # the catalog board's 400 W limit
    for r in res["ranks"]:
        stage = r["pp_rank"]
        names = [instruction_name(k, m) for k, m, _ in stage_order("1f1b", 2, res["num_microbatches"], stage)]
        log = r["energy"]["frequency_log"]
        assert [x["instruction"] for x in log] == names * 3 and not any(x["applied"] for x in log)
        n = len(names)
        assert [x["frequency_mhz"] for x in log[:2 * n]] == [1410] * n + [1005] * n
        assert [x["frequency_mhz"] for x in log[2 * n:]] == schedules[r["rank"]]["frequencies_mhz"]
        for it in r["energy"]["iterations"]:  # model energy within [idle, busy at the top clock] x time
            assert idle * it["time_s"] <= it["energy_j"] <= float(pw.busy_power_w(1410, idle)) * it["time_s"]

    # Profiling mode: the measured stage profile (2 stages x F/B x 2 clocks), readable by `energy frontier`.
    rows = list(csv.DictReader(io.StringIO(profile)))
    assert {(int(x["stage"]), x["instruction"], int(x["frequency"])) for x in rows} == {
        (s, i, f) for s in (0, 1) for i in ("forward", "backward") for f in CLOCKS}
    busy = {f: float(pw.busy_power_w(pw.effective_frequency_mhz(f, idle), idle)) for f in CLOCKS}
    for x in rows:
        assert float(x["energy"]) == pytest.approx(busy[int(x["frequency"])] * float(x["time"]), rel=1e-9)

    # kill -9, restart on the same file: every report, the profile and the frontier are still there.
    srv = ServerProcess(db)
    try:
        with httpx.Client(base_url=srv.url, headers=auth) as h:
            assert h.get(f"/jobs/{job}/reports").json() == reports
            assert h.get(f"/jobs/{job}/profile").text == profile
            again = h.get(f"/jobs/{job}/ranks/0/schedule").json()
            assert again == schedules[0] and again["iteration"] == 3
    finally:
        srv.stop()
    from hetplan.cli.main import app
    from typer.testing import CliRunner

    out = CliRunner().invoke(app, ["energy", "frontier", str(plan_path), "--profile-db", str(db), "--job", job,
                                   "-o", str(tmp_path / "fr"), "--json", "--no-baselines"])
    assert out.exit_code == 0, out.output
    assert json.loads(out.output)["profile"].startswith("measured time, modelled energy")


def test_job_spec_refuses_what_the_server_cannot_run(tmp_path, plan_path):
    plan = planio.load_plan(plan_path)
    opts = EnergyOptions(server="http://127.0.0.1:1")
    spec = job_spec(plan, b"x", 2, 4, "1f1b", opts)
    assert spec["scheduler"]["frequencies_mhz"] == list(get_power(GPU).frequencies_mhz)  # all clocks by default
    assert spec["scheduler"]["then"]["idle_power_w"] == load_catalog().get(GPU).idle_power_w
    assert spec["job_id"] == job_spec(plan, b"x", 2, 4, "1f1b", opts)["job_id"] != job_spec(plan, b"y", 2, 4, "1f1b",
                                                                                               opts)["job_id"]
    # a plans.json of `energy frontier PLAN.json` becomes a frontier pick of its plans (here 2 stages x 4 mbs)
    from hetplan.energy.frontier import compute_frontier
    from hetplan.energy.model import plan_stage_profile

    derived = plan_stage_profile(plan)
    fr = compute_frontier(derived.profile, 4, derived.idle_power_w[0], 1e-4)
    fr.write_plans_file(tmp_path / "ok.json")
    pick = job_spec(plan, b"x", 2, 4, "1f1b", EnergyOptions(server="x", plans=str(tmp_path / "ok.json"),
                                                             target_time_s=1.0))["scheduler"]
    assert pick["kind"] == "frontier_pick" and pick["target_time_s"] == 1.0 and len(pick["plans"]) == len(fr)
    assert [len(f) for f in pick["plans"][0]["frequencies_mhz"]] == [8, 8]
    with pytest.raises(HetplanError, match="does not exist"):
        job_spec(plan, b"x", 2, 4, "1f1b", EnergyOptions(server="x", plans=str(tmp_path / "nope.json")))
    with pytest.raises(HetplanError, match="one model chunk"):
        job_spec(plan, b"x", 2, 4, "interleaved", opts)
    bad = tmp_path / "plans.json"
    bad.write_text(json.dumps({"num_stages": 4, "num_microbatches": 4, "schedule": "1f1b", "idle_power_w": 80,
                               "plans": []}))
    with pytest.raises(HetplanError, match="4 stages x 4 micro-batches") as err:
        job_spec(plan, b"x", 2, 4, "1f1b", EnergyOptions(server="x", plans=str(bad)))
    assert err.value.field == "--energy-plans"
    with pytest.raises(HetplanError, match="unreachable"):  # no server: fails before any rank starts
        run_plan(plan_path, RunOptions(energy=EnergyOptions(server="http://127.0.0.1:1", frequencies_mhz=CLOCKS)))


def test_job_spec_refuses_an_impossible_target_and_clocks_the_gpu_lacks(tmp_path, plan_path):
    """A target time below the fastest plan of --energy-plans was sent on, and the server ran the fastest plan
    instead without a word; a sweep clock above the GPU's top clock (1,410 MHz on an A100) could not be locked, so
    the ranks profiled their default clock under its label. Both are refused before the job is created."""
    from hetplan.energy.frontier import compute_frontier
    from hetplan.energy.model import plan_stage_profile

    plan = planio.load_plan(plan_path)
    derived = plan_stage_profile(plan)
    fr = compute_frontier(derived.profile, 4, derived.idle_power_w[0], 1e-4)
    fr.write_plans_file(tmp_path / "ok.json")
    fastest = float(fr.time_s.min())
    for target, ok in ((fastest, True), (fastest * 0.9, False)):
        opts = EnergyOptions(server="x", plans=str(tmp_path / "ok.json"), target_time_s=target)
        if ok:
            assert job_spec(plan, b"x", 2, 4, "1f1b", opts)["scheduler"]["target_time_s"] == target
            continue
        with pytest.raises(HetplanError, match="no plan finishes within") as err:
            job_spec(plan, b"x", 2, 4, "1f1b", opts)
        assert err.value.field == "--energy-target-s"
    assert job_spec(plan, b"x", 2, 4, "1f1b", EnergyOptions(server="x", frequencies_mhz=(1410, 840)))
    with pytest.raises(HetplanError, match="1500 MHz is above the top SM clock") as err:
        job_spec(plan, b"x", 2, 4, "1f1b", EnergyOptions(server="x", frequencies_mhz=(1500, 1410)))
    assert err.value.field == "--energy-frequencies"


def test_energy_options_without_a_server_exit_2(plan_path):
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "hetplan.cli.main", "run", str(plan_path), "--energy-frequencies",
                        "1410"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "--energy-server" in r.stderr and "Traceback" not in r.stderr


def test_loop_on_a_simulated_nvml(tmp_path, plan_path, monkeypatch):
    """HETPLAN_SIMULATED_NVML: the ranks run the NVML path on CPU: every planned clock is locked (applied), energy
    comes from the simulated counter, reported as modelled; the server's frontier plan is then applied too."""
    from hetplan.energy.nvml import SIMULATED_ENV

    monkeypatch.setenv(SIMULATED_ENV, GPU)
    srv = ServerProcess(tmp_path / "energy.sqlite")
    try:
        energy = EnergyOptions(server=srv.url, token=TOKEN, frequencies_mhz=CLOCKS)
        res = run_plan(plan_path, RunOptions(iterations=3, warmup=1, stage_repeats=1, energy=energy))
    finally:
        srv.stop()
    assert res["energy"]["energy_source"] == "model"
    idle = load_catalog().get(GPU).idle_power_w
    pw = board_limited(get_power(GPU), load_catalog().get(GPU).tdp_w, idle)
    for r in res["ranks"]:
        log = r["energy"]["frequency_log"]
        assert log and all(x["applied"] for x in log)
        for it in r["energy"]["iterations"]:  # the counter ran at busy power of the locked clocks all along
            lo = float(pw.busy_power_w(pw.effective_frequency_mhz(min(CLOCKS), idle), idle))
            assert lo * it["time_s"] * 0.98 <= it["energy_j"] <= 400.0 * it["time_s"] * 1.02
