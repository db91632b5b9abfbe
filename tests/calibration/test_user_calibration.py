"""``hetplan calibrate`` (hetplan.calibration.user): fitted on a seeded quarter of one stack's published runs, the
rest of that stack's runs; the CLI round trip into ``plan --calibration``; bad RUNS files."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from hetplan.calibration import independent
from hetplan.calibration.intervals import case_stack
from hetplan.calibration.user import Calibration, Run, _predict, fit
from hetplan.calibration.validation import _is_calibration
from hetplan.hardware.catalog import load_catalog

RUNS = Path(__file__).parents[1] / "fixtures" / "calibration" / "torchtitan_llama3_8b_h100_runs.csv"


def _cli(*args: str, cwd=None):
    return subprocess.run([sys.executable, "-m", "hetplan.cli.main", *args], capture_output=True, text=True,
                          timeout=300, cwd=cwd)


@pytest.mark.slow
def test_quarter_of_llm_foundry_calibrates_the_rest():
    """llm-foundry's 77 published H100 runs (independent_h100, never fitted by hetplan): hetplan alone is off by a
    median 14.3 % on the 58 held-out; fitted on the seeded other 19, within 8.5 % median with |signed median| < 5 %
    (achieved 8.0 %, +1.8 %); the compute factor is identified, the communication factor is not (said why)."""
    cat = load_catalog()
    cases = [c for c in independent.independent_cases(cat)[0] if case_stack(c) == "llm-foundry"]
    runs = [Run(i, c.plan, c.model, c.plan.job.global_batch * c.plan.job.seq_len / (c.measured * c.plan.num_gpus))
            for i, c in enumerate(cases)]
    pick = [_is_calibration("user:" + c.key, 0.25) for c in cases]
    quarter = [r for r, p in zip(runs, pick) if p]
    rest = [r for r, p in zip(runs, pick) if not p]
    rep = fit(quarter, cat)
    meas = np.array([r.step_time_s for r in rest])
    before = _predict(rest, cat, Calibration(gpus=rep.calibration.gpus)) / meas - 1
    after = _predict(rest, cat, rep.calibration) / meas - 1
    assert np.median(np.abs(before)) > 0.12
    assert np.median(np.abs(after)) <= 0.085 and abs(np.median(after)) < 0.05
    assert rep.calibration.compute_factor < 0.9 and "comm_factor" in rep.calibration.not_identified
    assert rep.leave_one_out["n"] == len(quarter)


def test_calibrate_cli_round_trip(tmp_path):
    out = _cli("calibrate", str(RUNS), "-o", str(tmp_path / "cal.toml"), "--json")
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout)
    assert r["after"]["mape"] < r["before"]["mape"] and r["gpus"] == ["H100-SXM"]
    assert "comm_factor" in r["not_identified"]  # two runs identify one factor
    base = ["plan", "--model", "llama3-8b", "--seq-len", "8192", "--global-batch", "16", "--tokens", "1e9", "--gpu",
            "H100-SXM", "--gpus", "8", "--framework", "fsdp", "--tp", "1", "--pp", "1", "--mbs", "2", "--zero", "3",
            "--recompute", "selective", "--json", "--top", "1"]
    plain = json.loads(_cli(*base).stdout)["plans"][0]
    cal = _cli(*base, "--calibration", str(tmp_path / "cal.toml"))
    assert cal.returncode == 0, cal.stderr
    p = json.loads(cal.stdout)["plans"][0]
    assert p["interval"]["source"] == "calibration"
    assert p["iteration_time_s"] == pytest.approx(r["rows"][0]["after_s"], rel=1e-6)
    assert p["iteration_time_s"] > plain["iteration_time_s"] * 1.2  # the stack runs slower than hetplan's default


@pytest.mark.parametrize("body, field", [
    ("model,gpu,gpus,seq_len,global_batch,step_time_s\nllama3-8b,H100-SXM,8,8192,16,nan\n", "runs.step_time_s"),
    ("model,gpu,gpus,seq_len,global_batch,step_time_s\nllama3-8b,H100-SXM,8,8192,16,-2\n", "runs.step_time_s"),
    ("model,gpu,gpus,seq_len,global_batch,speed\nllama3-8b,H100-SXM,8,8192,16,2\n", "RUNS"),
    ("model,gpu,gpus,seq_len,global_batch\nllama3-8b,H100-SXM,8,8192,16\n", "RUNS.step_time_s"),
    ("model,gpu,gpus,seq_len,global_batch,step_time_s\nllama3-8b,H100-SXM,eight,8192,16,2\n", "runs.gpus"),
    ("model,gpu,gpus,seq_len,global_batch,step_time_s\nllama3-8b,H100-SXM,8,8192,16,2\n", "RUNS"),  # one run
    ("", "RUNS"),
])
def test_bad_runs_exit_2_naming_the_field(tmp_path, body, field):
    f = tmp_path / "runs.csv"
    f.write_text(body)
    out = _cli("calibrate", str(f))
    assert out.returncode == 2 and field in out.stderr + out.stdout and "Traceback" not in out.stderr


def test_bad_calibration_file_exit_2(tmp_path):
    f = tmp_path / "cal.toml"
    f.write_text("[calibration]\ncompute_factor = -1\n")
    out = _cli("estimate", str(tmp_path / "none.json"), "--calibration", str(f))
    assert out.returncode == 2 and "Traceback" not in out.stderr
