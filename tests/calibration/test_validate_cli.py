"""``hetplan validate --json`` as a subprocess: stable set names and the accuracy the estimator reaches
(asserted with a small margin over the achieved numbers, docs/estimator.md)."""

import json
import os
import subprocess
import sys

import pytest

#: Achieved values + margin (fractions). Update together with docs/estimator.md when the model changes.
BOUNDS = {
    # achieved 2026-11-21: single MAPE 6.98 %, tau 0.840; multi MAPE 6.72 %, tau 0.635; SC'21 MAPE 5.89 %, max
    # 10.45 %; Korthikanti MAPE 1.96 %, max 3.55 %; Aceso MAPE 8.94 % (targets of issue 3 in docs/estimator.md)
    "vtrain_single_node": {"mape": 0.075, "kendall_tau_min": 0.82},
    "vtrain_multi_node": {"mape": 0.075, "kendall_tau_min": 0.60},
    # SC'21 after v2.5's unfused gradient accumulation (2026-11-28): MAPE 3.40 %, max 7.97 %
    "megatron_sc21_table1": {"mape": 0.045, "max_abs_error": 0.09},
    # the 2021-22 stacks on A100 (2026-11-28): MAPE 6.42 %, max 28.4 % (NeMo 22.08's slow 175B table, docs/estimator.md)
    "nemo_megatron_a100": {"mape": 0.10, "max_abs_error": 0.30},
    "korthikanti_table5": {"mape": 0.025, "max_abs_error": 0.045},
    "aceso_v100": {"mape": 0.10},
    # achieved: FASOP per-layer MAPE 10.9 %, held-out half 14.4 % (docs/estimator.md, Compute)
    "fasop_layers": {"mape": 0.12},
    # achieved: Espresso's traced heterogeneous pipelines end to end, MAPE 4.6 %, max 7.0 % (docs/estimator.md)
    "espresso_hetero": {"mape": 0.06, "max_abs_error": 0.08},
}


@pytest.fixture(scope="module")
def raw():
    out = subprocess.run([sys.executable, "-m", "hetplan.cli.main", "validate", "--json"], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return out.stdout


@pytest.fixture(scope="module")
def result(raw):
    return json.loads(raw)


def test_json_is_strict_json(raw):
    """``validate --json`` wrote NaN (Kendall tau of single-row groups, interval_coverage of sets without
    held-out rows), which JSON.parse, Go and serde refuse: a metric without a value is null."""
    def refuse(token):
        raise ValueError(f"non-standard JSON constant {token}")

    d = json.loads(raw, parse_constant=refuse)
    assert d["interval_coverage"]["espresso_hetero"]["leave_set_out"] is None


def test_interval_coverage_follows_sets():
    """``--sets`` chooses the per-set coverage rows too; ``all`` stays the whole residual table."""
    out = subprocess.run([sys.executable, "-m", "hetplan.cli.main", "validate", "--json", "--sets", "torchtitan"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    cov = json.loads(out.stdout)["interval_coverage"]
    assert set(cov) == {"torchtitan", "all"} and cov["all"]["n"] > cov["torchtitan"]["n"]


def test_a_set_named_twice_runs_once():
    """--sets aceso_v100,aceso_v100 ran its 12 rows twice: n = 24 for the set and for its stack."""
    from tests.fuzz.inproc import run_cli

    r = run_cli("validate", "--json", "--sets", "aceso_v100, aceso_v100")
    assert r.code == 0 and not r.traceback, r.stderr
    out = json.loads(r.stdout)
    assert out["sets"]["aceso_v100"]["n"] == 12 and [s["n"] for s in out["stacks"].values()] == [12]


def test_set_names_and_fields(result):
    assert set(result["sets"]) == {"vtrain_single_node", "vtrain_multi_node", "megatron_sc21_table1",
                                   "korthikanti_table5", "aceso_v100", "fasop_layers", "espresso_hetero",
                                   "dgxc_h100", "dgxc_gb200", "torchtitan", "llama3_405b", "megatron_lm_h100",
                                   "moe_h100", "long_context_cp", "bigscience_a100", "independent_h100", "serving",
                                   "energy", "nemo_megatron_a100", "llm_foundry_a100", "megatron_bridge"}
    for r in result["sets"].values():
        assert {"n", "mape", "max_abs_error", "signed_median", "kendall_tau"} <= set(r)
        assert abs(r["signed_median"]) <= r["max_abs_error"] / (1 - r["max_abs_error"]) + 1e-12
    assert result["sets"]["vtrain_single_node"]["n"] == 1440
    assert result["sets"]["vtrain_multi_node"]["n"] == 109
    assert result["sets"]["megatron_sc21_table1"]["n"] == 10
    assert result["sets"]["korthikanti_table5"]["n"] == 8
    assert result["sets"]["fasop_layers"]["n"] == 33
    assert result["sets"]["espresso_hetero"]["n"] == 9
    assert result["sets"]["bigscience_a100"]["n"] == 128
    assert result["sets"]["nemo_megatron_a100"]["n"] == 39


@pytest.mark.parametrize("name", list(BOUNDS))
def test_accuracy(result, name):
    r = result["sets"][name]
    b = BOUNDS[name]
    assert r["mape"] <= b["mape"]
    if "max_abs_error" in b:
        assert r["max_abs_error"] <= b["max_abs_error"]
    if "kendall_tau_min" in b:
        assert r["kendall_tau"] >= b["kendall_tau_min"]


def test_held_out_reported_for_calibrated_sets(result):
    for name in ("vtrain_single_node", "vtrain_multi_node", "aceso_v100", "fasop_layers", "espresso_hetero"):
        assert result["sets"][name]["held_out"]["n"] > 0
        assert result["sets"][name]["calibration"]["n"] > 0


def test_plain_output_and_files(tmp_path):
    out = subprocess.run([sys.executable, "-m", "hetplan.cli.main", "validate", "--sets", "korthikanti_table5",
                          "--out", str(tmp_path)], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "COLUMNS": "200"})
    assert out.returncode == 0, out.stderr
    assert "korthikanti_table5" in out.stdout
    assert "korthikanti_table5 is fully held out" in out.stdout and "vTrain's own MAPE" not in out.stdout
    assert (tmp_path / "validation.csv").read_text().count("\n") == 9
    assert (tmp_path / "validation.png").stat().st_size > 1000


def test_only_modern_sets_print_no_empty_first_table():
    out = subprocess.run([sys.executable, "-m", "hetplan.cli.main", "validate", "--sets", "llama3_405b"],
                         capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "80"})
    assert out.returncode == 0, out.stderr
    assert "Modern sets" in out.stdout and "llama3_405b" in out.stdout
    assert "Estimator vs. measured" not in out.stdout and "vTrain's own MAPE" not in out.stdout


def test_fasop_json_fields_are_stable(result):
    r = result["sets"]["fasop_layers"]
    assert set(r["per_gpu"]) == {"A100-SXM-40GB", "A10G", "RTX-3090"}
    for g in r["per_gpu"].values():
        assert {"n", "mape", "max_abs_error", "mean_error"} <= set(g)
    assert sum(g["n"] for g in r["per_gpu"].values()) == r["n"]
    q = r["a10g_over_a100_gpt2xl"]
    assert q["measured_mbs1"] == pytest.approx(2.342 / 1.638)
    # the host floor compresses the GPU difference at micro-batch 1, not at 8 (docs/estimator.md, Compute)
    assert q["measured_mbs1"] < q["predicted_mbs1"] < q["predicted_mbs8"] < q["peak_ratio"]


def test_table_shows_what_json_knows_for_fasop(result):
    out = subprocess.run([sys.executable, "-m", "hetplan.cli.main", "validate", "--sets", "fasop_layers"],
                         capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "200"})
    assert out.returncode == 0, out.stderr
    r = result["sets"]["fasop_layers"]
    for gpu, g in r["per_gpu"].items():
        line = next(ln for ln in out.stdout.splitlines() if gpu in ln)
        assert f"{100 * g['mape']:.1f} %" in line and f"{100 * g['mean_error']:+.1f} %" in line, line
    q = r["a10g_over_a100_gpt2xl"]
    assert f"micro-batch 1 predicted {q['predicted_mbs1']:.2f}, measured 1.43 (FASOP)" in out.stdout
    assert "FASOP's per-layer rows" in out.stdout  # the footer names its calibration half
    other = subprocess.run([sys.executable, "-m", "hetplan.cli.main", "validate", "--sets", "korthikanti_table5"],
                           capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "200"})
    assert "A10G / A100" not in other.stdout and "per GPU type" not in other.stdout


def test_help_names_the_fasop_set():
    out = subprocess.run([sys.executable, "-m", "hetplan.cli.main", "validate", "--help"], capture_output=True,
                         text=True, timeout=60, env={**os.environ, "COLUMNS": "200"})
    assert out.returncode == 0
    assert "fasop_layers" in out.stdout and "FASOP" in out.stdout


def test_unknown_set_is_a_clear_error():
    out = subprocess.run([sys.executable, "-m", "hetplan.cli.main", "validate", "--sets", "nope"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert "unknown validation set" in out.stderr


def test_per_stack_table_partitions_the_rows(result):
    """Every row of every set is counted under exactly one stack: the counts add up to the sets' rows, and the
    stacks of the visible sets are the ones their sources name (vTrain: Megatron-DeepSpeed; DGX Cloud: NeMo)."""
    stacks = result["stacks"]
    # the energy set is GPU joules per instruction of Perseus' profiles, priced by the power model, no stack's
    assert sum(r["n"] for r in stacks.values()) == sum(r["n"] for k, r in result["sets"].items() if k != "energy")
    for r in stacks.values():
        assert {"n", "mape", "signed_median", "max_abs_error", "sets"} <= set(r) and r["sets"]
    assert stacks["megatron-deepspeed"]["sets"] == ["bigscience_a100", "nemo_megatron_a100", "vtrain_multi_node",
                                                    "vtrain_single_node"]
    assert {"dgxc_h100", "dgxc_gb200", "nemo_megatron_a100"} <= set(stacks["nemo"]["sets"])
    assert {"llm-foundry", "fms-fsdp", "torchtitan", "deepspeed"} <= set(stacks)


def test_tables_fit_80_columns_with_every_number_whole():
    """At COLUMNS=80 the heavy-bordered tables fitted by cutting every number to '14…' / '+0…'; the compact
    layout keeps them whole."""
    import os

    out = subprocess.run([sys.executable, "-m", "hetplan.cli.main", "validate", "--sets",
                          "vtrain_multi_node,korthikanti_table5,bigscience_a100"], capture_output=True, text=True,
                         timeout=300, env={**os.environ, "COLUMNS": "80"})
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80 and "…" not in out.stdout
    row = next(line for line in lines if line.startswith("vtrain_multi_node "))
    assert len(row.split()) >= 9 and row.split()[1].isdigit()
    assert any(line.startswith("bigscience_a100 ") for line in lines)


@pytest.mark.parametrize("flags", [["--sets", "vtrain_single_node"], ["--json"], ["--csv", "v.csv"]])
def test_write_residuals_refuses_the_flags_it_would_ignore(monkeypatch, capsys, flags):
    """`--sets X --write-residuals` rewrote the package's residuals from every set (exit 0), --sets unread."""
    import hetplan.calibration.intervals as iv
    from hetplan.cli.main import main

    written = []
    monkeypatch.setattr(iv, "write_residuals", lambda: written.append(1) or "residuals.csv")
    monkeypatch.setattr(sys, "argv", ["hetplan", "validate", "--write-residuals", *flags])
    with pytest.raises(SystemExit) as exc:
        main()
    err = capsys.readouterr().err
    assert exc.value.code == 2 and not written and "--write-residuals" in err and flags[0] in err, err
