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


def test_quoted_numbers_in_job_and_plan_files_are_refused(tmp_path):
    """``seq_len = "4096"`` in a job file (and ``"mbs": "2"`` in a plan JSON) were read as numbers, while the
    CLI's pins refuse text: one file meant two things. Now each names its field and says to drop the quotes."""
    job = tmp_path / "j.toml"
    base = '[job]\nmodel = "llama2-7b"\nseq_len = SEQ\nglobal_batch = 64\n[[inventory]]\ngpu = "H100-SXM"\ncount = N\n'
    job.write_text(base.replace("SEQ", '"4096"').replace("N", "8"))
    refused(run_cli("plan", job, "-q"), "job.seq_len", "without quotes")
    job.write_text(base.replace("SEQ", "4096").replace("N", '"8"'))
    refused(run_cli("plan", job, "-q"), "inventory.0.count", "without quotes")
    job.write_text(base.replace("SEQ", "4096").replace("N", "8"))
    assert run_cli("plan", job, "-q").code == 0
    out = tmp_path / "p.json"
    assert run_cli(*PLAN, "-o", out).code == 0
    data = json.loads(out.read_text())
    data["mbs"] = str(data["mbs"])
    out.write_text(json.dumps(data))
    refused(run_cli("estimate", out), "plan.mbs", "without quotes")


def test_a_stack_named_as_the_framework_says_which_field_it_belongs_in():
    """--framework torchtitan / Megatron-LM said only "Input should be 'megatron', 'deepspeed' or 'fsdp'"; the
    family itself in another case (DeepSpeed) was refused."""
    r = refused(run_cli(*PLAN, "--framework", "torchtitan"), "--framework", "software stack", "--stack torchtitan",
                "'fsdp'")
    assert "framework = 'fsdp'" in r.stderr
    refused(run_cli(*PLAN, "--framework", "Megatron-LM"), "--framework", "stack = 'megatron-lm'")
    assert run_cli(*PLAN, "--framework", "DeepSpeed").code == 0
