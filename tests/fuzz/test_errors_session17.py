"""Errors that named the wrong field, unit or fix (session 17): each case exits 2 and names what the user wrote."""

from __future__ import annotations

import io
import re
import sys
from pathlib import Path

import pytest

from tests.fuzz.inproc import run_cli
from tests.fuzz.test_fuzz_session11 import refused

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _edited(tmp_path: Path, example: str, old: str, new: str) -> Path:
    text = (EXAMPLES / example).read_text()
    assert old in text
    path = tmp_path / Path(example).name
    path.write_text(text.replace(old, new, 1))
    return path


@pytest.mark.parametrize("old, new, field, words", [
    # said "tp: num_attention_heads = 40 ... fix: choose a TP degree", a key no serving file has
    ("tp = 2", "tp = 3", "cluster.tp", ("not divisible by TP = 3", "set cluster.tp to a degree that splits every "
                                        "model: 1, 2, 4, 8")),
    ("pp = 2", "pp = 50", "cluster.pp", ("exceeds the 40 layers", "set cluster.pp to at most 40")),
])
def test_simulate_names_the_cluster_key_of_a_split_no_model_takes(tmp_path, old, new, field, words):
    refused(run_cli("simulate", _edited(tmp_path, "serve/workload.toml", old, new)), field, *words)


@pytest.mark.parametrize("old, new, field, words", [
    ("tp = 2", "tp = 5", "cluster.tp", ("not divisible by TP = 5", "1, 2, 3, 4, 6, 12")),
    ("pp = 1", "pp = 3", "cluster.pp", ("exceeds the 2 layers", "at most 2")),
])
def test_serve_names_the_cluster_key_before_starting_workers(tmp_path, old, new, field, words):
    from hetplan.errors import HetplanError
    from hetplan.serve.config import load_serve_config

    path = _edited(tmp_path, "serve/serve.toml", old, new)
    with pytest.raises(HetplanError) as exc:
        load_serve_config(path)
    assert exc.value.field == field and all(w in exc.value.render() for w in words)


def test_calibrate_gives_the_fix_in_the_csv_columns(tmp_path):
    runs = tmp_path / "runs.csv"
    runs.write_text("model,gpu,gpus,seq_len,global_batch,mbs,tp,step_time_s\n"
                    "llama3-8b,H100-SXM,6,8192,16,2,4,2.8\n")
    r = refused(run_cli("calibrate", runs), "runs.gpus", "gpus = 6 is not one", "fix: set gpus to a multiple of 4")
    assert "--use-gpus" not in r.stderr and "pin" not in r.stderr.split("fix:")[1]


def test_an_out_of_range_bandwidth_flag_is_reported_in_gbit():
    # said "Input should be greater than or equal to 125000000 (got 62500000.0) ... in bytes/s" for 0.5 Gb/s
    refused(run_cli("plan", "--model", "llama2-7b", "--seq-len", "4096", "--global-batch", "512", "--tokens", "1e9",
                    "--gpu", "A100-SXM-80GB", "--gpus", "16", "--inter-node-gbit", "0.5"),
            "--inter-node-gbit", "must be at least 1 Gb/s", "got 0.5 Gb/s")


def test_calibrate_reports_an_out_of_range_bandwidth_column_in_gbit(tmp_path):
    runs = tmp_path / "runs.csv"
    runs.write_text("model,gpu,gpus,seq_len,global_batch,mbs,tp,inter_node_gbit,step_time_s\n"
                    "llama3-8b,H100-SXM,8,8192,16,2,4,1e9,2.8\n")
    refused(run_cli("calibrate", runs), "runs.inter_node_gbit", "at most 80,000 Gb/s", "got 1e+09 Gb/s")


def test_validate_plot_help_names_the_formats_it_writes():
    r = run_cli("validate", "--help")
    assert r.code == 0 and ".svg" in r.stdout and ".pdf" in r.stdout and "(PNG)" not in r.stdout


@pytest.mark.parametrize("name, words", [
    # said "its releases numbered like 23.04 end there (2023-04), the next is core_r0.4" and no way to name one
    ("megatron@99", ("after 23.04 (2023-04) its releases are numbered like core_r0.4",
                     "write megatron-lm@VERSION", "core_r0.15", "megatron-lm@YYYY-MM")),
    ("nemo@abc", ("nemo has no release 'abc'", "write nemo@VERSION", "24.07")),
])
def test_catalog_stacks_says_how_to_name_a_release(name, words):
    refused(run_cli("catalog", "stacks", name), "NAME", *words)


def test_errors_wrap_at_word_boundaries_on_a_terminal(tmp_path, monkeypatch):
    """At 80 columns the terminal broke the one long line mid-word; now the message and its fix wrap at words."""
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    from hetplan.cli.main import main

    path = _edited(tmp_path, "serve/workload.toml", "tp = 2", "tp = 3")
    piped = run_cli("simulate", path, columns=80).stderr  # into a pipe: one line each, for grep and logs
    assert piped.count("\n") == 2 and len(piped.splitlines()[0]) > 80
    err = Terminal()
    monkeypatch.setattr(sys, "stderr", err)
    monkeypatch.setattr(sys, "argv", ["hetplan", "simulate", str(path)])
    monkeypatch.setenv("COLUMNS", "80")
    with pytest.raises(SystemExit) as code:
        main()
    text = re.sub(r"\x1b\[[0-9;]*m", "", err.getvalue())  # the bold red of "error:"
    lines = text.splitlines()
    assert code.value.code == 2 and text.startswith("error: ") and text.count("error:") == 1
    assert len(lines) > 2 and all(len(ln) <= 80 for ln in lines), text
    assert text.split() == piped.split()  # no word split across two lines
    assert any(ln.startswith("  fix: ") for ln in lines) and lines[1].startswith("  ")


def test_estimate_names_the_stack_flag(tmp_path):
    # said "plan.job.stack: ... (got 'megatron@99')": the plan file has no such stack, the flag gave it
    refused(run_cli("estimate", EXAMPLES / "tiny-pp2-dp2.json", "--stack", "megatron@99"), "--stack",
            "megatron-lm has no release '99'")


def test_estimate_timeline_help_names_the_formats_it_writes():
    r = run_cli("estimate", "--help")
    assert r.code == 0 and ".svg" in r.stdout and "to this PNG" not in r.stdout


@pytest.mark.parametrize("flags, field, words", [
    # the row has no node / gpu column: the flags filled them in, and the error named runs.node / runs.gpu
    (("--gpu", "H100-SXM", "--gpus", "8", "--node", "zz"), "--node", ("unknown node 'zz'",)),
    (("--gpu", "Z9", "--gpus", "8"), "--gpu", ("unknown GPU type 'Z9'",)),
    (("--gpu", "H100-SXM", "--gpus", "100000000"), "--gpus", ("a million GPUs",)),
])
def test_calibrate_names_the_flag_that_filled_a_bad_value(tmp_path, flags, field, words):
    runs = tmp_path / "runs.csv"
    runs.write_text("model,seq_len,global_batch,mbs,step_time_s\nllama3-8b,8192,16,2,2.8\n")
    refused(run_cli("calibrate", runs, *flags), field, *words)


def test_export_names_the_virtual_stages_flag():
    # said "plan.virtual_stages: ... fix: set virtual_stages = 1 or change the plan"; the plan file has 1
    refused(run_cli("export", EXAMPLES / "tiny-pp2-dp2.json", "--to", "megatron", "--virtual-stages", "3"),
            "--virtual-stages", "divisible by 3", "fix: give --virtual-stages 1")


@pytest.mark.parametrize("old, new, field", [
    ("count = 64", "count = -64", "inventory.1.count"),  # was inventory.pools.1.count
    ("inter_node_bandwidth_gbit_per_s = 3200", 'inter_node_bandwidth_gbit_per_s = "fast"',
     "inventory.1.inter_node_bandwidth_gbit_per_s"),
])
def test_job_file_pool_errors_name_the_inventory_item_one_way(tmp_path, old, new, field):
    refused(run_cli("plan", _edited(tmp_path, "llama2-7b-mixed-cloud.toml", old, new), "-q"), field)


@pytest.mark.parametrize("column, value, field, words", [
    # named "runs (row 2) job.fp8_recipe": the digit split the column's name into fp and _recipe
    ("fp8_recipe", "foo", "runs.fp8_recipe", ("got 'foo'",)),
    # the fix read "or leave dp empty/mbs" (plan's "unpin dp/mbs")
    ("mbs", "3", "runs.global_batch", ("or leave dp/mbs empty",)),
])
def test_calibrate_names_a_column_and_its_fix_in_csv_terms(tmp_path, column, value, field, words):
    row = {"model": "llama3-8b", "gpu": "H100-SXM", "gpus": "8", "seq_len": "8192", "global_batch": "16",
           "step_time_s": "2.8", column: value}
    runs = tmp_path / "runs.csv"
    runs.write_text(",".join(row) + "\n" + ",".join(row.values()) + "\n")
    refused(run_cli("calibrate", runs), field, *words)


def test_an_unknown_gpu_suggests_the_names_it_begins():
    # "A100" was answered "did you mean A10, H100-SXM, V100-SXM-32GB?", no A100 among them
    r = refused(run_cli("catalog", "prices", "--gpu", "A100"), "--gpu", "did you mean")
    assert "A100-SXM-80GB" in r.stderr and "V100" not in r.stderr


def test_catalog_engines_names_its_engine_argument():
    refused(run_cli("catalog", "engines", "vllmm"), "ENGINE", "unknown serving engine 'vllmm'")


def test_a_trace_row_short_of_cells_is_refused(tmp_path):
    # "0.5,opt13-a,128" under arrival_s,model,prompt_len,max_new_tokens replayed with the default max_new_tokens
    (tmp_path / "w.toml").write_text((EXAMPLES / "serve" / "workload-trace.toml").read_text())
    (tmp_path / "trace.csv").write_text((EXAMPLES / "serve" / "trace.csv").read_text() + "0.5,opt13-a,128\n")
    refused(run_cli("simulate", tmp_path / "w.toml"), "workload.trace", "line 10: 3 cells under a header of 4")
