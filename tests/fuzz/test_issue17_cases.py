"""One test per problem found by hand in issue 17 (and the bracketed names of issue 18), named after it; each runs
the ``hetplan`` command in-process and checks exit code 2 with one message naming the field, or a sane answer."""

from __future__ import annotations

import dataclasses
import json
import math
import re
import tomllib
from pathlib import Path

import pytest

from hetplan.errors import HetplanError
from hetplan.report import check_estimate

from .inproc import run_cli

ROOT = Path(__file__).resolve().parents[2]
JOB = '[job]\nmodel = "opt-125m"\nseq_len = 2048\nglobal_batch = 64\ntrain_tokens = 1e10\n'
POOL = '[[inventory]]\ngpu = "A100-SXM-80GB"\ncount = 8\n'
FLAGS = ["--model", "opt-125m", "--seq-len", "2048", "--global-batch", "64", "--tokens", "1e10",
         "--gpu", "A100-SXM-80GB", "--gpus", "8"]


def refused(r, *needles: str) -> None:
    assert r.code == 2 and not r.traceback, (r.code, r.stdout[-500:], r.traceback)
    assert r.stderr.startswith("error: ") and r.stderr.count("error:") == 1, r.stderr
    for needle in needles:
        assert needle in r.stderr, (needle, r.stderr)


def test_non_utf8_job_toml_exits_2(tmp_path):
    p = tmp_path / "job.toml"
    p.write_bytes(JOB.encode() + b"# caf\xe9\n" + POOL.encode())
    refused(run_cli("plan", p), "not UTF-8", f"byte {len(JOB) + 5}", "job.toml")


def test_binary_config_json_exits_2(tmp_path):
    p = tmp_path / "config.json"
    p.write_bytes(b"\x00\x01\x02binary")
    refused(run_cli("plan", "--model", p, *FLAGS[2:]), "model", "NUL byte at offset 0")


def test_non_utf8_catalog_exits_2(tmp_path):
    p = tmp_path / "gpus.toml"
    p.write_bytes(b'[gpus.X]\nvendor = "\xff"\n')
    refused(run_cli("plan", *FLAGS, "--catalog", p), "--catalog", "not UTF-8 text (byte 19: 0xff)")


def test_non_utf8_plan_json_exits_2(tmp_path):
    p = tmp_path / "plan.json"
    p.write_bytes(b'{"job": "\xc3\x28"}')
    refused(run_cli("estimate", p), "not UTF-8", "byte 9")


def test_tokens_inf_refused():
    refused(run_cli("plan", *FLAGS[:6], "--tokens", "inf", *FLAGS[8:]), "--tokens", "finite")


def test_inter_node_bandwidth_inf_refused(tmp_path):
    p = tmp_path / "job.toml"
    p.write_text(JOB + POOL + "inter_node_bandwidth_gbit_per_s = inf\n")
    refused(run_cli("plan", p), "inventory.0.inter_node_bandwidth_bytes_per_s", "finite")


@pytest.mark.parametrize("entry,field", [("memory_gib = nan", "memory_gib"),
                                         ("dense_tflops = { bf16 = inf }", "dense_tflops.bf16")])
def test_catalog_non_finite_gpu_field_refused(tmp_path, entry, field):
    p = tmp_path / "gpus.toml"
    p.write_text(f'[gpus.A100-SXM-80GB]\n{entry}\n')
    refused(run_cli("plan", *FLAGS, "--catalog", p), field, "finite")


def test_zero_price_no_zero_division(tmp_path):
    p = tmp_path / "job.toml"
    p.write_text(JOB + POOL + "price_usd_per_hour = 0\n")
    r = run_cli("plan", p, "--json")
    assert r.code == 0, r.stderr + r.traceback
    best = json.loads(r.stdout)["plans"][0]
    assert best["usd_per_hour"] == 0 and best["job_usd"] == 0 and best["job_time_s"] > 0
    # cheapest over a free pool: every plan ties at $0, so the exact walk would never stop; it is refused
    refused(run_cli("plan", p, "--objective", "cheapest"), "price_usd_per_hour", "--objective fastest")
    r = run_cli("plan", p)  # the human output's "why" sentences divide $ by $
    assert r.code == 0 and "Why:" in r.stdout, r.traceback


def test_config_json_that_is_a_list_exits_2(tmp_path):
    p = tmp_path / "config.json"
    p.write_text("[1, 2]")
    refused(run_cli("plan", "--model", p, *FLAGS[2:]), "model", "JSON object")


def test_config_hidden_size_string_exits_2(tmp_path):
    cfg = json.loads((ROOT / "examples" / "tiny-model.json").read_text())
    cfg["hidden_size"] = "4096"
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    refused(run_cli("plan", "--model", p, "--seq-len", "128", *FLAGS[4:]), "hidden_size")


def test_catalog_gpus_not_a_table_exits_2(tmp_path):
    p = tmp_path / "gpus.toml"
    p.write_text('gpus = "H100"\n')
    refused(run_cli("plan", *FLAGS, "--catalog", p), "--catalog", "[gpus] must be a table")


def test_deeply_nested_plan_json_exits_2(tmp_path):
    p = tmp_path / "plan.json"
    p.write_text('{"job": ' + "[" * 100_000 + "]" * 100_000 + "}")
    refused(run_cli("estimate", p), "nested too deeply")


def test_unreadable_file_exits_2(tmp_path, monkeypatch):
    p = tmp_path / "job.toml"
    p.write_text(JOB + POOL)

    opened = Path.open

    def denied(self, *args, **kwargs):
        if self == p:
            raise PermissionError(13, "Permission denied")
        return opened(self, *args, **kwargs)
    monkeypatch.setattr(Path, "open", denied)  # the tests may run as root, which chmod cannot stop
    refused(run_cli("plan", p), "no permission to read")


def test_directory_given_as_job_file_exits_2(tmp_path):
    refused(run_cli("plan", tmp_path), "is a directory")


def test_file_too_large_exits_2(tmp_path):
    p = tmp_path / "job.toml"
    with p.open("wb") as fh:  # sparse: no 65 MB written
        fh.truncate(65 * 2**20)
    refused(run_cli("plan", p), "bytes; a", "check that this is the right file")


def test_tiny_network_bandwidth_refused():
    refused(run_cli("plan", *FLAGS, "--inter-node-gbit", "1e-9"), "--inter-node-gbit", "1 Gb/s")


def test_global_batch_1e12_refused(tmp_path):
    p = tmp_path / "job.toml"
    p.write_text(JOB.replace("global_batch = 64", "global_batch = 1_000_000_000_000") + POOL)
    refused(run_cli("plan", p), "job.global_batch", "65536", "LAMB")


def test_estimate_plan_with_huge_global_batch_refused(tmp_path):
    plan = json.loads((ROOT / "examples" / "tiny-pp2-dp2.json").read_text())
    plan["job"]["model"] = str(ROOT / "examples" / "tiny-model.json")
    plan["job"]["global_batch"] = 2**40
    p = tmp_path / "plan.json"
    p.write_text(json.dumps(plan))
    refused(run_cli("estimate", p), "plan.job.global_batch")


def test_huge_gpu_count_refused_not_a_400_digit_cost(tmp_path):
    p = tmp_path / "job.toml"
    p.write_text(JOB + POOL.replace("count = 8", f"count = {2**62}"))
    refused(run_cli("plan", p), "inventory.0.count", "largest cluster")
    refused(run_cli("plan", *FLAGS[:6], "--tokens", "1e300", *FLAGS[8:]), "--tokens")


def test_nonfinite_estimate_refused():
    """The class guard: an estimate with an overflowed figure (as MFU was when FLOPs passed int64) is refused."""
    from hetplan.estimate.estimator import estimate
    from hetplan.plan import Plan

    plan = Plan.model_validate(json.loads((ROOT / "examples" / "tiny-pp2-dp2.json").read_text())
                               | {"pools": [{"gpu": "A100-SXM-80GB", "count": 4}]}
                               | {"job": {"model": str(ROOT / "examples" / "tiny-model.json"), "seq_len": 128,
                                          "global_batch": 8, "train_iterations": 3}})
    est = estimate(plan)
    check_estimate(est)  # a sane one passes
    for field, bad in (("mfu", -0.3), ("mfu", est.hfu * 2), ("hfu", 1.7), ("job_usd", math.inf),
                       ("iteration_time_s", math.nan)):
        broken = dataclasses.replace(est, **{field: bad})
        with pytest.raises(HetplanError, match=field):
            check_estimate(broken)


def test_error_keeps_bracketed_names(tmp_path):
    p = tmp_path / "job.toml"
    p.write_text("[jobs]\n")
    r = run_cli("plan", p)
    refused(r, "unknown section [jobs]", "sections are inventory, job")
    r = run_cli("plan", "--model", "opt-125m", "--seq-len", "2048", "--global-batch", "64")
    refused(r, "[[inventory]]")


def test_plan_fits_80_columns(tmp_path):
    r = run_cli("plan", *FLAGS, "--top", "3", "-o", tmp_path / "plan.json", columns=80)
    assert r.code == 0, r.stderr
    lines = r.stdout.splitlines()
    # the "hetplan estimate PATH" hint is one soft-wrapped line, so that the command copies whole (the terminal
    # folds it; test_the_estimate_command_after_o_is_not_broken_across_lines)
    assert max(len(ln) for ln in lines if not ln.startswith("Best plan written to")) <= 80
    assert "…" not in r.stdout  # no cell truncated
    rows = [ln for ln in lines if re.match(r"\s*[123] \d+x ", ln)]  # table rows, not wrapped "why" lines
    assert len(rows) == 3 and all("A100-SXM-80GB" in ln for ln in rows)
    r = run_cli("estimate", tmp_path / "plan.json", columns=80)
    assert r.code == 0 and max(map(len, r.stdout.splitlines())) <= 80 and "…" not in r.stdout
    r = run_cli("catalog", "gpus", columns=80)
    assert r.code == 0 and max(map(len, r.stdout.splitlines())) <= 80 and "…" not in r.stdout


def test_quiet_prints_only_the_table():
    r = run_cli("plan", *FLAGS, "--top", "2", "--quiet")
    assert r.code == 0 and "A100-SXM-80GB" in r.stdout
    assert "Why:" not in r.stdout and "Memory per GPU" not in r.stdout and "Searched" not in r.stdout


def test_flash_attention_lists_no_duplicate_selective_rows():
    r = run_cli("plan", *FLAGS, "--attention", "flash", "--top", "6", "--json")
    plans = json.loads(r.stdout)["plans"]
    assert all(p["recompute"] != "selective" for p in plans)
    keys = [(p["tp"], p["pp"], p["dp"], p["mbs"], p["zero"], p["virtual_stages"], p["recompute"]) for p in plans]
    assert len(set(keys)) == len(keys)


def test_best_with_another_lines_merged():
    from hetplan.cli.plan import merge_best_with_another

    lines = ["Stopped by memory: X.", "Best with another PP: P1: +1%.", "Best with another DP: P1: +1%.",
             "Best with another TP: P2: +3%.", "Best with another ZeRO stage: P1: +1%."]
    assert merge_best_with_another(lines) == [
        "Stopped by memory: X.", "Best with another PP, DP and ZeRO stage: P1: +1%.", "Best with another TP: P2: +3%."]


def test_pytest_prints_its_summary_line():
    """CI parses "N passed": ``addopts = "-q"`` plus ``pytest -q`` made it -qq, which prints no summary."""
    opts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert "-q" not in str(opts.get("addopts", "")).split()


def test_edited_catalog_and_config_files_are_read_anew(tmp_path):
    """In one process (a notebook, this test suite) the catalog and config.json caches are keyed on the file's
    text, not its path: an edited file is not answered from the cache."""
    cat = tmp_path / "gpus.toml"
    cat.write_text("[gpus.A100-SXM-80GB]\nprice_usd_per_hour = 1.0\n")
    first = json.loads(run_cli("plan", *FLAGS, "--catalog", cat, "--json", "--top", "1").stdout)["plans"][0]
    cat.write_text("[gpus.A100-SXM-80GB]\nprice_usd_per_hour = 2.0\n")
    second = json.loads(run_cli("plan", *FLAGS, "--catalog", cat, "--json", "--top", "1").stdout)["plans"][0]
    assert second["usd_per_hour"] == pytest.approx(2 * first["usd_per_hour"])
    cfg = json.loads((ROOT / "examples" / "tiny-model.json").read_text())
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    args = ("plan", "--model", path, "--seq-len", "128", *FLAGS[4:], "--json", "--top", "1")
    assert run_cli(*args).code == 0
    path.write_text(json.dumps(dict(cfg, hidden_size="128")))
    refused(run_cli(*args), "hidden_size")
