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
