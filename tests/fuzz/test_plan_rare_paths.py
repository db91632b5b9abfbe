"""Audit of `hetplan plan`'s less-travelled paths (--baseline, --search fine --explain, --profile-db, prices,
mixed-recompute plans): each test is a wrong answer or a silently accepted input found there."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.fuzz.inproc import run_cli

PLAN = ["plan", "--model", "llama2-7b", "--gpu", "H100-SXM", "--gpus", "16", "--seq-len", "4096", "--global-batch",
        "64", "--iterations", "10"]



def _aceso_profile_db(tmp_path):
    """``(repository root, path)`` of a profile database of Aceso's GPT-3 1.3B V100 profiles (the README's Aceso
    case)."""
    from hetplan.model.spec import load_model
    from hetplan.profile.db import ProfileDB
    from hetplan.profile.importers import import_aceso

    root = Path(__file__).resolve().parents[2]
    db = tmp_path / "aceso.sqlite"
    with ProfileDB(db) as pdb:
        import_aceso(pdb, root / "tests" / "fixtures" / "aceso",
                     models={"gpt_1_3B": (load_model(root / "examples" / "models" / "gpt3_1.3b_aceso.json"), 2048)})
    return root, db

def test_baseline_is_priced_as_the_search_and_estimate_price_it(tmp_path):
    """A baseline without prices (as `hetplan import` writes one) was priced at the catalog's $3.84/GPU-h while
    the search ran at --price-source spot ($1.52): the best plan, the baseline itself, 'cost 40 % of it per job'.
    It is now priced as `hetplan estimate BASELINE --price-source spot` prices it."""
    best = tmp_path / "best.json"
    assert run_cli(*PLAN, "-q", "-o", best).code == 0
    raw = json.loads(best.read_text())
    for pool in raw["pools"]:
        pool.pop("price_usd_per_hour")
    mine = tmp_path / "mine.json"
    mine.write_text(json.dumps(raw))
    for base in (best, mine):  # one written at catalog prices, one without prices
        r = run_cli(*PLAN, "--price-source", "spot", "--json", "--top", "1", "--baseline", base)
        assert r.code == 0, r.stderr
        out = json.loads(r.stdout)
        assert out["prices"][0]["from"] != "given"  # a quote, not the catalog
        assert out["baseline"]["summary"]["usd_per_hour"] == pytest.approx(out["plans"][0]["usd_per_hour"])
        assert out["baseline"]["usd_ratio"] == pytest.approx(1.0)
        est = run_cli("estimate", base, "--price-source", "spot", "--json")
        assert est.code == 0, est.stderr
        assert json.loads(est.stdout)["job_usd"] == pytest.approx(out["baseline"]["summary"]["job_usd"])


def test_fine_explain_keeps_each_steps_start_point(tmp_path):
    """The trace of the second and third start points lost its "[start 2, 1]" label: rich read it as a style tag,
    so those steps printed as "   bottleneck stage 0 ..." with no start point or step number."""

    root, db = _aceso_profile_db(tmp_path)
    args = ["plan", root / "examples" / "aceso_gpt3_1.3b.toml", "--catalog", root / "examples" / "aceso_v100_12000mb.toml",
            "--search", "fine", "--profile-db", db]
    r = run_cli(*args, "--explain", "--top", "1")
    assert r.code == 0, r.stderr
    steps = [line.strip() for line in r.stdout.splitlines() if "bottleneck stage" in line and "(" in line]
    assert any(s.startswith("[start 2, ") for s in steps), steps[-3:]
    assert not [line for line in r.stdout.splitlines() if line.startswith("   bottleneck stage")]


@pytest.mark.parametrize("flag", [["--explain"], ["--profile-db", "nope.sqlite"]])
def test_fine_search_flags_without_the_fine_search_are_refused(flag):
    """--explain and --profile-db (even one that does not exist) were dropped without a word under --search
    uniform, the default."""
    r = run_cli(*PLAN, *flag, "-q")
    assert r.code == 2 and not r.traceback, r.stderr
    assert f"error: {flag[0]}:" in r.stderr and "--search fine" in r.stderr


@pytest.mark.parametrize("flags, field", [
    (["--price-source", "bogus"], "--price-source"),
    (["--price-source", "spot", "--provider", "nosuch"], "--provider"),
    (["--provider", "aws"], "--provider"),
    (["--prices", "nope.toml"], "--prices"),
])
def test_price_options_are_checked_when_every_pool_has_its_price(flags, field):
    """With --price given (or every [[inventory]] pool priced) nothing was chosen, so an unknown price source, a
    provider without quotes and a --prices file that does not exist all exited 0."""
    r = run_cli(*PLAN, "--price", "2.5", *flags, "-q")
    assert r.code == 2 and not r.traceback, r.stderr
    assert f"error: {field}:" in r.stderr


def test_mixed_recompute_is_written_per_stage_not_none():
    """A plan whose stages recompute differently (the heterogeneous search's A6000 x5 with layers [5, 6, 6, 6, 3],
    the last stage without recomputation) showed "None" in the recompute column."""
    from pathlib import Path

    ex = Path(__file__).resolve().parents[2] / "examples" / "espresso_open_llama_3b.toml"
    js = run_cli("plan", ex, "--json", "--top", "3")
    assert js.code == 0, js.stderr
    mixed = [p for p in json.loads(js.stdout)["plans"] if p["recompute"] is None]
    assert mixed, "a plan with stages of different recomputation is ranked"
    for columns in (80, 200):
        r = run_cli("plan", ex, "-q", "--top", "3", columns=columns)
        assert r.code == 0, r.stderr
        assert "None" not in r.stdout and "full/none" in r.stdout


@pytest.mark.parametrize("goal", [["--objective", "cheapest"], ["--budget-usd", "2000"]])
def test_electricity_price_is_refused_where_the_search_ranks_or_budgets_dollars(goal):
    """--usd-per-kwh folds electricity into each ranked plan's job $ after the search, which ranks and budgets
    GPU-hours: at $0.05/GPU-h and $1/kWh "cheapest job within $2,000" printed plans of $15,273 (GPUs $1,114 +
    electricity $14,159), and #3 ($15,133) was cheaper than #1. Under fastest without a budget it still adds."""
    job = ["plan", "--model", "llama2-7b", "--seq-len", "4096", "--global-batch", "1024", "--tokens", "1e12",
           "--gpu", "H100-SXM", "--gpus", "64", "--price", "0.05", "--energy", "--top", "2"]
    r = run_cli(*job, "--usd-per-kwh", "1", *goal, "-q")
    assert r.code == 2 and not r.traceback, r.stderr
    assert "error: --usd-per-kwh:" in r.stderr and "GPU-hours" in r.stderr
    ok = run_cli(*job, "--usd-per-kwh", "1", "--json")
    assert ok.code == 0, ok.stderr
    for p in json.loads(ok.stdout)["plans"]:
        assert p["job_usd"] == pytest.approx(p["gpu_usd"] + p["energy_usd"])


def test_profile_db_of_another_model_or_gpu_is_refused(tmp_path):
    """Aceso's GPT-3 1.3B times on V100s given to a Llama-2-7B search on H100s priced every layer by the cost
    model, without a word (the search's line names the profile only when a stage used it)."""

    root, db = _aceso_profile_db(tmp_path)
    for other in (PLAN, ["plan", root / "examples" / "aceso_gpt3_1.3b.toml", "--gpu", "A100-SXM-80GB", "--gpus", "4"]):
        r = run_cli(*other, "--search", "fine", "--profile-db", db, "-q")
        assert r.code == 2 and not r.traceback, r.stderr
        assert "error: --profile-db:" in r.stderr and "holds no layer times" in r.stderr


def test_energy_frontier_table_writes_money_energy_and_layout_as_the_ranking(tmp_path):
    """The time-$-energy frontier wrote job $ and kWh with no decimals ("0" and "0" on every row of FASOP's
    one-iteration job, the three figures it is a frontier of) and TP x PP x DP of a plan whose stages differ in
    TP as "Nonex9x2"."""
    from pathlib import Path

    from hetplan.units import kwh_text, usd_text

    ex = Path(__file__).resolve().parents[2] / "examples" / "fasop_gpt2xl.toml"
    args = ["plan", ex, "--per-stage-tp", "--energy", "--pareto", tmp_path / "p.png", "--top", "2"]
    js = run_cli(*args, "--json")
    assert js.code == 0, js.stderr
    front = json.loads(js.stdout)["energy_pareto"]
    r = run_cli(*args, "-q", columns=120)
    assert r.code == 0, r.stderr
    table = r.stdout[r.stdout.index("Time-$-energy"):]
    assert "None" not in table and "1/2x" in table
    for p in front:
        assert usd_text(p["job_usd"]) in table and kwh_text(p["job_energy_kwh"]) in table
    assert all(p["job_usd"] < 1 and usd_text(p["job_usd"]) != "0" for p in front)


def test_baseline_that_does_not_fit_is_refused(tmp_path):
    """A baseline that does not fit (Llama-2-7B at micro-batch 16 on 64 H100s: 296 GiB per GPU) was compared as
    a run, "the best plan is 0.99x as fast", while `hetplan estimate` of the same file exits 2."""
    best = tmp_path / "best.json"
    assert run_cli(*PLAN, "-q", "-o", best).code == 0
    raw = json.loads(best.read_text())
    raw["mbs"] = 4
    raw["stages"] = [dict(st, recompute="none") for st in raw["stages"]]
    raw["zero"] = 0
    big = tmp_path / "big.json"
    big.write_text(json.dumps(raw))
    assert run_cli("estimate", big).code == 2
    r = run_cli(*PLAN, "-q", "--baseline", big)
    assert r.code == 2 and not r.traceback, r.stderr
    assert "error: --baseline:" in r.stderr and "does not fit" in r.stderr


@pytest.mark.parametrize("command, shown", [
    (["plan"], ["[[quote]]", "NAME[@VERSION|@YYYY-MM]"]),
    (["estimate"], ["NAME[@VERSION|@YYYY-MM]"]),
    (["catalog", "prices"], ["[[quote]]"]),
    (["catalog", "stacks"], ["NAME[@VERSION|@YYYY-MM]"]),
    (["catalog", "engines"], ["ENGINE[@VERSION]"]),
])
def test_help_keeps_its_brackets(command, shown):
    """Typer renders help as rich markup (typer/core.py DEFAULT_MARKUP_MODE = "rich" when rich is installed), so
    unescaped brackets were taken for style tags: `plan --help` read "the [] layout of prices.toml" and
    "--stack NAME: the software stack"."""
    r = run_cli(*command, "--help", columns=200)
    assert r.code == 0, r.stderr
    text = " ".join(r.stdout.split())
    for s in shown:
        assert s in text, (s, text[:2000])


def test_baseline_is_priced_on_the_profile_that_priced_the_fine_plan(tmp_path):
    """With --search fine --profile-db the best plan is priced on the measured layer times and the baseline was
    priced by the cost model: the fine search's own plan as baseline came out "1.12x as fast, 89 % of the cost"."""

    root, db = _aceso_profile_db(tmp_path)
    args = ["plan", root / "examples" / "aceso_gpt3_1.3b.toml", "--catalog", root / "examples" / "aceso_v100_12000mb.toml",
            "--search", "fine", "--profile-db", db, "--top", "1"]
    best = tmp_path / "best.json"
    assert run_cli(*args, "-q", "-o", best).code == 0
    r = run_cli(*args, "--json", "--baseline", best)
    assert r.code == 0, r.stderr
    base = json.loads(r.stdout)["baseline"]
    assert base["speedup"] == pytest.approx(1.0) and base["usd_ratio"] == pytest.approx(1.0)
    assert {st["time_source"] for st in base["summary"]["stages"]} == {"profiled"}


def test_energy_line_names_the_plan_it_describes():
    """Under --search fine the energy line said "Energy of #1" of the fine plan (printed below the ranking, not
    its #1), and wrote a one-iteration job's 0.0004 kWh as "0.0 kWh" and its electricity as "$0.00"."""
    from pathlib import Path

    ex = Path(__file__).resolve().parents[2] / "examples" / "fasop_gpt2xl.toml"
    js = run_cli("plan", ex, "--no-hetero", "--search", "fine", "--energy", "--usd-per-kwh", "0.2", "--json")
    assert js.code == 0, js.stderr
    fine = json.loads(js.stdout)["plans"][0]
    r = run_cli("plan", ex, "--no-hetero", "--search", "fine", "--energy", "--usd-per-kwh", "0.2", columns=200)
    assert r.code == 0, r.stderr
    assert "Energy of the fine-grained plan at the top SM clock" in r.stdout and "Energy of #1" not in r.stdout
    assert "0.0 kWh per job" not in r.stdout and f"{fine['job_energy_kwh']:.3g} kWh per job" in r.stdout
    assert "Electricity $0.00 " not in r.stdout


def test_energy_frontier_figure_path_is_checked_before_the_search(tmp_path):
    """--energy --pareto P.png also draws P-energy.png; a folder of that name was a traceback (IsADirectoryError)
    after the search, the first figure already written."""
    (tmp_path / "p-energy.png").mkdir()
    r = run_cli(*PLAN, "--energy", "--pareto", tmp_path / "p.png", "-q")
    assert r.code == 2 and not r.traceback, r.traceback
    assert "error: --pareto:" in r.stderr and "p-energy.png" in r.stderr
    assert not (tmp_path / "p.png").exists()


def test_two_pools_of_one_gpu_type_at_two_prices_both_listed(tmp_path):
    """Two H100 pools, one at a given $2.00 and one at the catalog's price: the provenance line listed only
    "H100-SXM 2.00 given", so plans on the second pool read as priced at $2."""
    job = tmp_path / "two.toml"
    job.write_text('[job]\nmodel = "llama2-7b"\nseq_len = 4096\nglobal_batch = 256\ntrain_iterations = 10\n'
                   '[[inventory]]\ngpu = "H100-SXM"\ncount = 16\nprice_usd_per_hour = 2.0\n'
                   '[[inventory]]\ngpu = "H100-SXM"\ncount = 16\n')
    r = run_cli("plan", job, "--json", "--top", "1")
    assert r.code == 0, r.stderr
    prices = json.loads(r.stdout)["prices"]
    assert sorted(p["from"] == "given" for p in prices) == [False, True]
    text = run_cli("plan", job, "--top", "1", columns=200).stdout
    line = text[text.index("Prices $/GPU-h:"):]
    assert line.count("H100-SXM") == 2


def test_another_pool_of_the_same_gpu_type_is_not_another_gpu_type(tmp_path):
    """Two H100 pools at $2.00 and the catalog's price: "Best with another GPU type: H100-SXM x4 ... +92.0 % $"."""
    job = tmp_path / "two.toml"
    job.write_text('[job]\nmodel = "llama2-7b"\nseq_len = 4096\nglobal_batch = 256\ntrain_iterations = 10\n'
                   '[objective]\ngoal = "cheapest"\n'
                   '[[inventory]]\ngpu = "H100-SXM"\ncount = 16\nprice_usd_per_hour = 2.0\n'
                   '[[inventory]]\ngpu = "H100-SXM"\ncount = 16\n')
    r = run_cli("plan", job, "--json", "--top", "1")
    assert r.code == 0, r.stderr
    lines = json.loads(r.stdout)["explanation"]
    assert not [ln for ln in lines if ln.startswith("Best with another GPU type")]
    assert [ln for ln in lines if ln.startswith("Best with another pool of the same GPU type: H100-SXM")]


def test_missing_baseline_is_named_and_refused_before_the_search(tmp_path):
    """A --baseline that does not exist was "error: PLAN: file ... does not exist" (no such argument of `plan`),
    said after the whole search."""
    r = run_cli(*PLAN, "-q", "--baseline", tmp_path / "nope.json")
    assert r.code == 2 and not r.traceback
    assert "error: --baseline: file" in r.stderr and "PLAN" not in r.stderr


def test_fine_table_counts_context_parallel_gpus():
    """The fine-grained plan's table wrote a stage's GPUs as TP x DP: 8 for Llama-3-8B at CP 2 on 16 H100s."""
    args = ["plan", "--model", "llama3-8b", "--seq-len", "16384", "--global-batch", "64", "--iterations", "10",
            "--gpu", "H100-SXM", "--gpus", "16", "--cp", "2", "--search", "fine", "--top", "1"]
    js = run_cli(*args, "--json")
    assert js.code == 0, js.stderr
    plan = json.loads(js.stdout)["plans"][0]
    assert plan["plan"]["cp"] == 2 and plan["num_gpus"] == 16
    r = run_cli(*args, "-q", columns=120)
    table = r.stdout[r.stdout.index("Fine-grained plan"):].splitlines()
    header = next(line.split() for line in table if line.split()[:2] == ["stage", "GPUs"])
    row = next(line.split() for line in table if line.split()[:1] == ["0"])
    assert "CP" in header and row[header.index("GPUs")] == "16" and row[header.index("CP")] == "2"
