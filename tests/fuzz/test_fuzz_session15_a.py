"""Hostile-input audit, session 15 (helper A): run / verify, the HTTP APIs, job and plan files, calibration."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.fuzz.inproc import run_cli
from tests.fuzz.test_fuzz_session11 import refused

ROOT = Path(__file__).resolve().parents[2]
TINY_PLAN = ROOT / "examples" / "tiny-pp2-dp2.json"


def _tiny_plan(tmp_path, **update) -> Path:
    """examples/tiny-pp2-dp2.json with ``update`` applied to its top level, written to ``tmp_path``."""
    data = json.loads(TINY_PLAN.read_text())
    data["job"]["model"] = str(ROOT / "examples" / "tiny-model.json")
    data.update(update)
    out = tmp_path / "plan.json"
    out.write_text(json.dumps(data))
    return out


@pytest.mark.parametrize("framework", ["megatron", "deepspeed"])
def test_hsdp_shard_group_outside_fsdp_is_refused(tmp_path, framework):
    """``fsdp_shard`` (HSDP) on a Megatron-LM or DeepSpeed plan was accepted and ignored: estimate priced full
    sharding over DP (the same numbers for every fsdp_shard) and the Megatron export launched that, exit 0. It is
    refused naming plan.fsdp_shard, as fsdp_param_dtype is outside framework 'fsdp'."""
    data = json.loads(TINY_PLAN.read_text())
    data["job"].update(model=str(ROOT / "examples" / "tiny-model.json"), framework=framework)
    data.update(zero=3 if framework == "megatron" else 2, fsdp_shard=1)
    data["pools"][0]["gpu"] = "H100-SXM"
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(data))
    refused(run_cli("estimate", plan), "plan.fsdp_shard", "framework = 'fsdp'")
    refused(run_cli("export", plan, "--to", "megatron"), "plan.fsdp_shard")
    data["job"]["framework"] = "fsdp"
    plan.write_text(json.dumps(data))
    assert run_cli("estimate", plan).code == 0


def _verified_plan(tmp_path, monkeypatch, data: dict, opts):
    """The plan ``hetplan verify`` hands the estimator for plan JSON ``data`` run with ``opts`` (the profile and
    the run itself stubbed out: verify stops where it would start the run)."""
    from hetplan.estimate import estimator
    from hetplan.profile import profiler
    from hetplan.runtime import verify as verify_mod

    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(data))
    seen = []

    class Stop(Exception):
        pass

    def run_plan(*_a, **_k):
        raise Stop

    monkeypatch.setattr(profiler, "profile_layers", lambda *a, **k: {})
    monkeypatch.setattr(estimator, "estimate", lambda p, **k: seen.append(p))
    monkeypatch.setattr(verify_mod, "run_plan", run_plan)
    with pytest.raises(Stop):
        verify_mod.verify(plan, db_path=tmp_path / "db.sqlite", opts=opts, repeats=1)
    return seen[0]


@pytest.mark.parametrize("plan_update, flags, want", [
    ({}, dict(schedule="gpipe"), ("gpipe", 1, 0)),
    ({"virtual_stages": 2}, dict(schedule="1f1b"), ("1f1b", 1, 0)),
    ({}, dict(schedule="interleaved", virtual_stages=2), ("1f1b", 2, 0)),
    ({"zero": 1}, {}, ("1f1b", 1, 0)),
    ({"zero": 3}, dict(dp_mode="ddp"), ("1f1b", 1, 0)),
    ({"zero": 3}, {}, ("1f1b", 1, 3)),
    ({"sequence_parallel": True}, {}, ("1f1b", 1, 0)),
])
def test_verify_estimates_the_schedule_and_dp_it_runs(tmp_path, monkeypatch, plan_update, flags, want):
    """``hetplan verify PLAN --schedule gpipe`` ran GPipe but compared it with the estimate of the plan's 1F1B:
    the last stage's activations of every micro-batch were measured against 1F1B's one in flight (tiny-pp2-dp2:
    predicted 8.8 MiB, measured 13.6 MiB, -35 %: FAIL, exit 1, for a correct estimator). Likewise a ZeRO-1 plan
    (or --dp-mode ddp) runs as DDP, replicated, but was compared with ZeRO-1's sharded optimizer (-25 %: FAIL),
    and sequence parallelism, which the trainer's TP does not run, was priced (-10 % activations at TP 2). The
    estimate now prices the schedule, virtual stages, DP and TP the run uses."""
    pytest.importorskip("torch")
    from hetplan.runtime.launcher import RunOptions

    data = json.loads(TINY_PLAN.read_text())
    data["job"]["model"] = str(ROOT / "examples" / "tiny-model.json")
    data["stages"][0]["num_layers"] = data["stages"][1]["num_layers"] = 2  # room for 2 virtual stages
    data.update(plan_update)
    seen = _verified_plan(tmp_path, monkeypatch, data, RunOptions(**flags))
    assert (seen.schedule, seen.virtual_stages, seen.zero) == want
    assert not seen.sequence_parallel


def test_verify_estimates_without_the_recomputation_the_trainer_does_not_run(tmp_path, monkeypatch):
    """A plan with ``recompute = "full"`` ran without recomputation (the reference trainer checkpoints nothing) but
    was compared with the estimate of full recomputation: tiny-pp2-dp2 stage 0 predicted 16.4 MiB for 33.5 MiB
    measured (-51 %) and +28 % time: FAIL, exit 1. The estimate now prices what runs, and says so."""
    pytest.importorskip("torch")
    from hetplan.runtime.launcher import RunOptions

    data = json.loads(TINY_PLAN.read_text())
    data["job"]["model"] = str(ROOT / "examples" / "tiny-model.json")
    for st in data["stages"]:
        st.update(recompute="full", recompute_layers=1)
    seen = _verified_plan(tmp_path, monkeypatch, data, RunOptions())
    assert [st.recomputed_layers() for st in seen.stages] == [0, 0]
    assert [st.num_layers for st in seen.stages] == [3, 1]


def test_run_host_memory_check_counts_the_activations_the_trainer_keeps(tmp_path):
    """``hetplan run`` on CPU checked host memory with the estimate of the plan's recomputation and ZeRO-1, which
    the trainer does not run (it keeps every activation and replicates AdamW under DDP): a run needing more memory
    than the host has passed the check. It now counts what runs (:func:`hetplan.runtime.planio.as_run`)."""
    from hetplan.errors import HetplanError
    from hetplan.estimate.estimator import estimate
    from hetplan.hardware.catalog import load_catalog
    from hetplan.runtime import planio
    from hetplan.runtime.launcher import RunOptions, check_host_memory

    data = json.loads(TINY_PLAN.read_text())
    data["job"]["model"] = str(ROOT / "examples" / "tiny-model.json")
    data["pools"][0]["gpu"] = "A100-SXM-80GB"
    data["zero"] = 1
    for st in data["stages"]:
        st["recompute"] = "full"
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(data))
    plan = planio.load_plan(path)
    spec = planio.plan_model(plan)
    lay = planio.layout(plan, spec)

    def need(p) -> float:
        return sum(planio.predicted_memory_bytes(st.memory, 4) for st in
                   estimate(p, catalog=load_catalog(), model=spec).stages) * lay.dp * lay.tp

    as_planned, as_run = need(plan), need(planio.as_run(plan, lay))
    assert as_run > 1.3 * as_planned
    with pytest.raises(HetplanError) as exc:
        check_host_memory(plan, spec, lay, RunOptions(), available_bytes=int((as_planned + as_run) / 2))
    assert exc.value.field == "plan"
    check_host_memory(plan, spec, lay, RunOptions(), available_bytes=int(as_run * 1.01))


class _StubEngine:
    """What ``hetplan.serve.api.create_app`` reads of an engine, with :meth:`Engine.submit`'s refusal of a token
    id outside the vocabulary (field ``prompt``), without starting workers."""

    specs = {"a": None}
    vocab_sizes = {"a": 500}
    scheduler = None
    _closing = False

    def submit(self, model, prompt, max_new_tokens, stop_token):
        from hetplan.errors import HetplanError

        raise HetplanError("prompt must be a non-empty list of token ids in [0, 500)", field="prompt",
                           fix="send token ids within the model's vocabulary")


@pytest.mark.parametrize("body, status, field", [
    (b'{"prompt": "x",', 400, "body"),  # was field "15": the parser's character offset
    (b"\xff", 400, "body"),
    (b'{"prompt_tokens": [-1]}', 422, "prompt_tokens"),  # was "prompt", a field the request did not send
    (b'{"prompt_tokens": []}', 422, "prompt_tokens"),
    (b'{"prompt": ""}', 422, "prompt"),  # was "a non-empty list of token ids" for a text
    (b'{"prompt": "x", "max_new_tokens": 100000}', 422, "max_new_tokens"),  # had no field
    (b"{}", 422, "prompt"),
])
def test_serve_api_errors_name_the_request_field(body, status, field):
    """Each 4xx of ``POST /v1/models/{model}/generate`` names the body field at fault (``field``) and the
    message starts with it."""
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from hetplan.serve.api import create_app

    with TestClient(create_app(_StubEngine(), manage_engine=False)) as c:  # type: ignore[arg-type]
        r = c.post("/v1/models/a/generate", content=body, headers={"content-type": "application/json"})
    assert r.status_code == status, r.text
    assert r.json()["field"] == field, r.text
    assert r.json()["error"].startswith(field), r.text


def test_energy_server_profiling_error_names_the_job_spec_key(tmp_path):
    """An online-profiling job whose ``then.unit_time_s`` is longer than its measured instructions ends profiling
    with an error in the job's state; it named ``unit_time_s`` with the fix "use a smaller --unit-time-s", a flag
    of another command, not the key of the job spec the client sent. A malformed body's 422 now carries the JSON
    parser's message, as the module promises, not only "JSON decode error"."""
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from hetplan.energy.server.app import create_app

    stages, mbs = 2, 2
    with TestClient(create_app(tmp_path / "db.sqlite")) as c:
        bad = c.post("/jobs", content=b"{", headers={"content-type": "application/json"})
        assert bad.status_code == 422 and "Expecting property name" in bad.json()["detail"][0]["msg"]
        assert c.post("/jobs", json={"job_id": "p", "num_stages": stages, "num_microbatches": mbs, "scheduler": {
            "kind": "online_profiling", "frequencies_mhz": [1410, 1005],
            "then": {"idle_power_w": 60, "unit_time_s": 1e300}}}).status_code == 201
        for rank in range(stages):
            assert c.post("/jobs/p/ranks", json={"rank": rank, "stage": rank}).status_code == 200
        for _ in range(2):
            for rank in range(stages):
                s = c.get(f"/jobs/p/ranks/{rank}/schedule").json()
                f = s["frequencies_mhz"][0]
                meas = [{"instruction": i.split(":")[0], "frequency_mhz": f, "time_s": 14.1 / f, "energy_j": f / 1410}
                        for i in s["instructions"]]
                assert c.post(f"/jobs/p/ranks/{rank}/reports", json={
                    "iteration": s["iteration"], "schedule_id": s["schedule_id"], "time_s": 0.1, "energy_j": 5.0,
                    "measurements": meas}).status_code == 201
        assert c.get("/jobs/p/ranks/0/schedule").json()["schedule_id"] == "max"
        error = c.get("/jobs/p").json()["error"]
    assert error.startswith("scheduler.then.unit_time_s:") and "--unit-time-s" not in error, error


CAL_TORCHTITAN = """[calibration]
gpus = ["H100-SXM"]
stacks = ["torchtitan"]
compute_factor = 0.5
attention_factor = 1
comm_factor = 1
loo_log_ratios = [0.05, -0.1, 0.02]
"""


def test_calibration_of_another_stack_is_refused_by_plan_and_estimate(tmp_path):
    """A calibration fitted on torchtitan runs on H100 (compute_factor 0.5) applied its factors to a Megatron-LM
    plan on H100: iteration 1.35 -> 2.40 s, exit 0, with hetplan's own 'megatron-lm · Hopper' interval printed
    as if uncalibrated. plan and estimate now refuse it naming --calibration; a plan on the calibrated stack
    still takes it."""
    cal = tmp_path / "cal.toml"
    cal.write_text(CAL_TORCHTITAN)
    job = ["plan", "--model", "llama2-7b", "--seq-len", "4096", "--global-batch", "64", "--iterations", "10",
           "--gpu", "H100-SXM", "--gpus", "16", "-q", "--top", "1"]
    refused(run_cli(*job, "--framework", "megatron", "--calibration", cal), "--calibration", "megatron-lm")
    plan = tmp_path / "plan.json"
    assert run_cli(*job, "--framework", "megatron", "-o", plan).code == 0
    refused(run_cli("estimate", plan, "--calibration", cal), "--calibration", "torchtitan")
    assert run_cli(*job, "--framework", "fsdp", "--calibration", cal).code == 0


def test_calibration_check_prices_runs_of_another_stack_without_its_factors(tmp_path):
    """``hetplan calibrate RUNS --calibration FILE`` says a run of a stack FILE does not cover is priced without
    its factors (``not_covered``), but it applied them by GPU alone: a Megatron-LM run on H100 was priced with
    a torchtitan calibration's compute factor."""
    from hetplan.calibration.user import Calibration, _predict, read_runs
    from hetplan.hardware.catalog import load_catalog

    runs_csv = tmp_path / "runs.csv"
    runs_csv.write_text("model,gpu,gpus,seq_len,global_batch,framework,tp,pp,dp,mbs,zero,recompute,step_time_s\n"
                        "llama2-7b,H100-SXM,16,4096,64,megatron,1,1,16,1,1,none,1.4\n")
    cat = load_catalog()
    runs = read_runs([runs_csv], cat)
    plain = _predict(runs, cat, Calibration(gpus=("H100-SXM",), stacks=("torchtitan",)))
    other = _predict(runs, cat, Calibration(compute_factor=0.5, gpus=("H100-SXM",), stacks=("torchtitan",)))
    assert other[0] == pytest.approx(plain[0])
    own = _predict(runs, cat, Calibration(compute_factor=0.5, gpus=("H100-SXM",), stacks=("megatron-lm",)))
    assert own[0] > 1.3 * plain[0]


def test_calibration_stacks_written_with_a_release_are_read_by_name(tmp_path):
    """A hand-written ``stacks = ["torchtitan@0.3.0"]`` (the form --stack takes) matched no plan: plans are
    matched by stack name, so its interval never applied (and its factors now would be refused)."""
    cal = tmp_path / "cal.toml"
    cal.write_text(CAL_TORCHTITAN.replace('"torchtitan"', '"torchtitan@0.3.0"'))
    r = run_cli("plan", "--model", "llama2-7b", "--seq-len", "4096", "--global-batch", "64", "--iterations", "10",
                "--gpu", "H100-SXM", "--gpus", "16", "--framework", "fsdp", "--json", "--top", "1",
                "--calibration", cal)
    assert r.code == 0, r.stderr
    assert json.loads(r.stdout)["plans"][0]["interval"]["source"] == "calibration"


def test_run_says_what_it_runs_unlike_the_plan(tmp_path, monkeypatch):
    """``hetplan run`` of a ZeRO-1 plan with full recomputation runs it as DDP without recomputation (the reference
    trainer's) and printed only "DP ddp"; it now says both, in the text and in ``--json`` (``notes``), as verify
    does (:func:`hetplan.runtime.planio.run_differences`)."""
    from hetplan.runtime import launcher

    data = json.loads(TINY_PLAN.read_text())
    data["job"]["model"] = str(ROOT / "examples" / "tiny-model.json")
    data["zero"] = 1
    for st in data["stages"]:
        st.update(recompute="full")
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(data))
    res = {"world_size": 4, "pp": 2, "dp": 2, "tp": 1, "schedule": "1f1b", "dp_mode": "ddp", "dtype": "fp32",
           "device": "cpu", "backend": "gloo", "software": "torch", "iteration_time_s": 0.1, "iterations": 1,
           "loss": 1.0, "dp_replicas_in_sync": True, "ranks": []}
    monkeypatch.setattr(launcher, "run_plan", lambda *a, **k: dict(res))
    r = run_cli("run", plan, "--json")
    assert r.code == 0, r.stderr
    notes = json.loads(r.stdout)["notes"]
    assert any("ZeRO-1 runs as DDP" in n for n in notes) and any("recomputes no activations" in n for n in notes)
    r = run_cli("run", plan)
    assert r.code == 0 and "note: the plan's ZeRO-1 runs as DDP" in r.stdout
