"""Hostile-input audit, session 12: what the earlier audits left open."""

from __future__ import annotations

import json

from tests.fuzz.inproc import run_cli
from tests.fuzz.test_fuzz_session11 import PLAN, refused


def test_export_of_a_plan_edited_to_an_unknown_gpu_is_refused(tmp_path):
    """A plan JSON whose pool names a GPU the catalog does not know was exported (estimate refused it)."""
    out = tmp_path / "p.json"
    assert run_cli(*PLAN, "-o", out).code == 0
    data = json.loads(out.read_text())
    data["pools"][0]["gpu"] = "Z100"
    out.write_text(json.dumps(data))
    for to in ("megatron", "deepspeed", "torchtitan"):
        refused(run_cli("export", out, "--to", to, "--out-dir", tmp_path / to), "gpu", "Z100")
        assert not (tmp_path / to).exists()
