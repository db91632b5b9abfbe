"""The independent H100 set (``hetplan validate`` ``independent_h100``, :mod:`hetplan.calibration.independent`):
llm-foundry's published MPT runs, NeMo 24.07 and fms-fsdp; only a seeded half of the llm-foundry rows fitted that
stack's own residuals. The bound is what the estimator achieves, with a small margin, so
that a change which makes the independent check worse fails here (docs/estimator.md, "Independent check")."""

import csv
import json
import os
import subprocess
import sys
from importlib import resources

import numpy as np
import pytest

from hetplan.calibration import independent, modern, modern_fit
from hetplan.model import counts

#: Achieved 2026-11-24: median |error| 17.6 % (main at 4529d39), 16.4 % after the K½ GEMM term and the attention
#: kernel / async TP / float8 terms (e097dc3), 16.2 % with causal FlashAttention's rate (0125eaa; MAPE 20.3 %);
#: 2026-11-28: 3.8 % (MAPE 5.8 %, held-out MAPE 5.9 %) with llm-foundry as its stack and that stack's residuals
#: fitted on a seeded half of its rows (hetplan.calibration.stack_fit). The issue aims at a median of 10 % and no
#: row beyond 25 % (``independent.TARGET``); this bound guards against regressions.
MEDIAN_BOUND = 0.05


@pytest.fixture(scope="module")
def run():
    res, cases = independent.run_independent()
    return res[independent.SET_NAME], cases


def _csv_rows(name=independent.FOUNDRY_FILE):
    text = resources.files("hetplan.calibration").joinpath("validation_data", "independent", name).read_text()
    return list(csv.DictReader(text.splitlines()))


def test_every_row_is_predicted_or_listed_with_a_reason(run):
    r, cases = run
    rows, nemo, fms = _csv_rows(), _csv_rows(independent.NEMO_FILE), _csv_rows(independent.FMS_FILE)
    assert len(rows) == 77 and all(row["source"].startswith("mosaicml/llm-foundry@") for row in rows)
    assert len(nemo) == 7 and all(row["source"].startswith("NVIDIA/NeMo@") for row in nemo)
    assert len(fms) == 4 and all(row["source"].startswith("foundation-model-stack/fms-fsdp@") for row in fms)
    assert r["n"] + r["not_expressible"]["n"] == len(rows) + len(nemo) + len(fms)
    # the one row whose configuration is not fully published is listed, with why
    assert [x["reason"] for x in r["not_expressible"]["rows"]] == [
        "fms-fsdp 'Selective AC' checkpoints every k-th block; k is not published"]
    assert all(x["reason"] for x in r["not_expressible"]["rows"])
    assert all(np.isfinite(c.predicted) and c.predicted > 0 for c in cases)
    assert len(r["rows"]) == r["n"]


def test_published_configuration_is_what_is_predicted(run):
    _, cases = run
    by_key = {c.key: c for c in cases}
    rows = _csv_rows()
    for i, row in enumerate(rows):
        c = by_key[next(k for k in by_key if k.startswith(f"{independent.SET_NAME}:{i}:"))]
        p = c.plan
        assert p.num_gpus == int(row["num_gpus"]) and p.job.global_batch == int(row["global_batch"])
        assert p.mbs == int(row["micro_batch"]) and p.job.seq_len == int(row["seq_len"])
        assert p.reshard_after_forward == ("SHARD_GRAD_OP" not in row["zero_or_fsdp"])
        assert {st.recompute for st in p.stages} == {row["recompute"]}
        assert c.dtype == ("fp8" if row["dtype"].startswith("fp8") else "bf16")
        # the model is the one that ran: the README's NumParams, to the parameter
        assert counts.total_parameters(c.model) == int(row["notes"].split("NumParams ")[1].split()[0])


def test_nemo_rows_run_their_published_layout_on_models_outside_the_modern_sets(run):
    _, cases = run
    nemo = [c for c in cases if ":nemo:" in c.key]
    rows = _csv_rows(independent.NEMO_FILE)
    assert len(nemo) == len(rows)
    modern_models = {row["model"] for row in modern.read_rows(modern.FILES["dgxc_h100"])}
    for c, row in zip(sorted(nemo, key=lambda c: int(c.key.split(":")[2])), rows):
        assert row["model"] not in modern_models
        assert (c.info["tp"], c.info["pp"], c.info["cp"], c.info["vp"]) == tuple(int(row[k]) for k in ("tp", "pp", "cp", "vp"))
        assert c.plan.num_gpus == int(row["num_gpus"]) and c.dtype == "fp8"
        assert c.model.num_layers == int(row["layers"]) and c.model.hidden_size == int(row["hidden"])


def test_fms_rows_run_on_their_800_gbps_nodes_with_hsdp_where_published(run):
    _, cases = run
    fms = {c.key.split(":")[3]: c for c in cases if ":fms:" in c.key}
    assert set(fms) == {"Llama 2 7B", "Llama 2 34B", "Llama 2 70B"}
    for c in fms.values():
        assert c.plan.pools[0].inter_node_bandwidth_bytes_per_s == 100e9 and c.plan.num_gpus == 96
        assert c.plan.job.global_batch == 192 and c.plan.mbs == 2 and c.plan.job.seq_len == 4096
    assert fms["Llama 2 7B"].plan.fsdp_shard == 8 and fms["Llama 2 70B"].plan.fsdp_shard is None
    assert {c.plan.stages[0].recompute for c in fms.values()} == {"none", "full"}


def test_only_a_seeded_half_of_llm_foundry_fitted_its_own_residuals(run):
    """NeMo and fms-fsdp rows fitted nothing; a seeded half of the llm-foundry rows fitted that stack's residuals
    (hetplan.calibration.stack_fit), and the other half is held out; modern_fit never reads the set."""
    r, cases = run
    cal = [c for c in cases if c.is_calibration]
    assert cal and all(":nemo:" not in c.key and ":fms:" not in c.key for c in cal)
    assert 0.35 < len(cal) / 77 < 0.65
    assert r["held_out"]["n"] == r["n"] - len(cal) and r["calibration"]["n"] == len(cal)
    assert independent.SET_NAME not in modern.SET_NAMES
    assert not any(c.set == independent.SET_NAME for c in modern_fit.fit_cases())


def test_rows_that_ran_fit_in_memory(run):
    r, _ = run
    assert r["does_not_fit"] == []


def test_median_error_within_bound(run):
    r, _ = run
    errors = np.array([x["error"] for x in r["rows"]])
    assert r["median_abs_error"] == pytest.approx(np.median(np.abs(errors)))
    assert r["median_abs_error"] <= MEDIAN_BOUND
    assert r["target"] == {"median_abs_error": 0.10, "max_abs_error": 0.25}


def test_validate_json_and_table_name_the_set():
    env = {**os.environ, "COLUMNS": "80"}
    out = subprocess.run([sys.executable, "-m", "hetplan.cli.main", "validate", "--sets", "independent_h100",
                          "--json"], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout)["sets"]["independent_h100"]
    assert r["n"] == 87 and "held out" in r["convention"]
    table = subprocess.run([sys.executable, "-m", "hetplan.cli.main", "validate", "--sets", "independent_h100"],
                           capture_output=True, text=True, timeout=120, env=env)
    assert table.returncode == 0, table.stderr
    assert "independent_h100" in table.stdout and f"median |error| {100 * r['median_abs_error']:.1f} %" in table.stdout
    assert max(len(line) for line in table.stdout.splitlines()) <= 80
