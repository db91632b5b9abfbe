"""One test per problem the fuzz strategies of ``test_fuzz_options`` found in the fields and options added after
the first fuzz suite, named after it: each ended in a traceback (or read a wrong value) and now exits 2 with one
message naming the field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .inproc import run_cli
from .test_issue17_cases import refused

ROOT = Path(__file__).resolve().parents[2]


def _plan(tmp_path: Path, **fields) -> Path:
    plan = json.loads((ROOT / "examples" / "tiny-pp2-dp2.json").read_text())
    plan["job"]["model"] = str(ROOT / "examples" / "tiny-model.json")
    plan["pools"][0]["gpu"] = "A100-SXM-80GB"
    plan.update(fields)
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    return path


def test_expert_tp_not_dividing_the_ranks_exits_2_not_a_layout_traceback(tmp_path):
    # expert_tp 2 on stages of 2 ranks each is fine; expert_tp 4 cannot re-partition 2 ranks
    assert run_cli("estimate", _plan(tmp_path, expert_tp=2), "--json").code == 0
    refused(run_cli("estimate", _plan(tmp_path, expert_tp=4)), "stages[0]", "expert_tp", "must divide")


@pytest.fixture
def no_torchrun(monkeypatch):
    """``hetplan run`` stops where torchrun would start (exit 0, no rank)."""
    from hetplan.runtime import launcher

    monkeypatch.setattr(launcher, "_supervise", lambda cmd, env, timeout_s, tmp: (0, ""))


@pytest.mark.parametrize("idle", ['"idle_power_w": "abc",', "", '"idle_power_w": NaN,', '"idle_power_w": -1,'])
def test_energy_plans_file_without_a_valid_idle_power_exits_2(tmp_path, no_torchrun, idle):
    plans = tmp_path / "plans.json"
    plans.write_text('{"num_stages": 2, "num_microbatches": 2, "schedule": "1f1b", ' + idle +
                     ' "plans": [{"time_s": 0.1, "energy_j": 5, "frequencies_mhz": [[1410], [1410]]}]}')
    refused(run_cli("run", _plan(tmp_path), "--energy-server", "http://127.0.0.1:1", "--energy-plans", plans),
            "--energy-plans", "not a plans file")


@pytest.mark.parametrize("value", ["inf", "0"])
def test_energy_target_s_inf_or_zero_refused_before_the_server(tmp_path, no_torchrun, value):
    refused(run_cli("run", _plan(tmp_path), "--energy-server", "http://127.0.0.1:1", "--energy-target-s", value),
            "--energy-target-s")


@pytest.mark.parametrize("url", ["http://[::1", "ftp://127.0.0.1:1", "not a url", "http://:0"])
def test_energy_server_that_is_no_http_url_refused(tmp_path, no_torchrun, url):
    refused(run_cli("run", _plan(tmp_path), "--energy-server", url), "--energy-server")


def test_attention_softmax_in_fp32_as_a_string_refused_not_read_as_true(tmp_path):
    cfg = json.loads((ROOT / "examples" / "tiny-model.json").read_text())
    cfg["attention_softmax_in_fp32"] = "false"  # bool("false") is True: the softmax would be costed in fp32
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    refused(run_cli("plan", "--model", path, "--seq-len", "128", "--global-batch", "8", "--tokens", "1e8", "--gpu",
                    "A100-SXM-80GB", "--gpus", "4"), "attention_softmax_in_fp32", "true or false")
