"""`hetplan plan` and `hetplan energy` output read line by line at 80 columns: each test is output that read wrong,
misleading or broken there."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from hetplan.cli.main import app
from tests.fuzz.inproc import run_cli
from tests.test_catalog_cli import _summaries

ROOT = Path(__file__).resolve().parents[2]
JOB = ["--model", "llama2-7b", "--seq-len", "4096", "--global-batch", "1024"]


def _two_pools_of_one_type(tmp_path) -> Path:
    """GPT-2 XL on two A10G pools (4 GPUs at $2, 8 at $1 on 50 Gb/s): the heterogeneous search's best spans both."""
    job = tmp_path / "two.toml"
    job.write_text(f'[job]\nmodel = "{ROOT / "examples" / "models" / "gpt2_xl_fasop.json"}"\nseq_len = 1024\n'
                   'global_batch = 64\ntrain_iterations = 1\ndtype = "fp16"\n'
                   '[[inventory]]\ngpu = "A10G"\ncount = 4\ngpus_per_node = 4\nprice_usd_per_hour = 2.0\n'
                   '[[inventory]]\ngpu = "A10G"\ncount = 8\ngpus_per_node = 4\nprice_usd_per_hour = 1.0\n'
                   'inter_node_bandwidth_gbit_per_s = 50\n')
    return job


def test_energy_frontier_table_fits_80_columns_with_whole_gpu_names(tmp_path):
    """`plan --energy --pareto` drew the time-$-energy frontier with heavy borders past 80 columns and its GPUs as
    "28x A100-SX…" (4 A100-SXM-40GB + 24 A10G) and "24x A30+A30…"."""
    r = run_cli("plan", ROOT / "examples" / "fasop_gpt2xl.toml", "--energy", "--pareto", tmp_path / "p.png",
                "--top", "1", "-q", columns=80)
    assert r.code == 0, r.stderr
    table = r.stdout[r.stdout.index("Time-$-energy"):]
    assert "…" not in table and "4x A100-SXM-40GB + 24x A10G" in table
    assert max(map(len, r.stdout.splitlines())) <= 80


def test_a_plan_on_two_pools_of_one_gpu_type_is_not_heterogeneous(tmp_path):
    """Two A10G pools: the plan spanning both was "[het]" in the frontier, "heterogeneous": true in its JSON, and
    "#1 heterogeneous ...: better than the best homogeneous plan" (it is homogeneous), followed by "Best
    homogeneous plan (the best homogeneous plan): ..." where that plan was not ranked."""
    job = _two_pools_of_one_type(tmp_path)
    r = run_cli("plan", job, "--pareto", tmp_path / "p.png", "--json")
    assert r.code == 0, r.stderr
    out = json.loads(r.stdout)
    spans = [p for p in out["pareto"] if len({st["gpu"] for st in p["stages"]}) == 1 and " + " in p["description"]]
    assert spans and not any(p["heterogeneous"] for p in out["pareto"])
    first, second = out["explanation"][:2]
    assert first.startswith("#1 multi-pool A10G") and "heterogeneous" not in first
    assert "than the best uniform plan (one pool, one TP, layers split evenly)" in first
    assert second.startswith("Best uniform plan (not in the top 5): A10G x")
    table = run_cli("plan", job, "--pareto", tmp_path / "p.png", "-q", columns=80)
    assert table.code == 0 and "[het]" not in table.stdout and "A10G(tp1) + A10G(tp1)x2" in table.stdout
    # the frontier's own points (and so its plot's markers) say the same: one rule, spans_gpu_types
    from hetplan.hardware.catalog import load_catalog
    from hetplan.jobfile import load_job_file
    from hetplan.model.spec import load_model
    from hetplan.plan import Inventory, Job
    from hetplan.search.pareto import pareto_frontier

    d = load_job_file(job)
    j = Job(**d["job"])
    fr = pareto_frontier(load_model(j.model), j, Inventory(pools=d["inventory"]), load_catalog())
    assert any(len(p.candidate.pools_used) > 1 for p in fr.points) and not any(p.heterogeneous for p in fr.points)
    assert not any(e.heterogeneous for e in fr.evaluated)


def test_a_single_pool_winner_is_not_called_better_than_the_best_homogeneous_plan():
    """Espresso's inventory under a 30 s SLO: the heterogeneous search's one-pool A6000 plan (uneven layers) wins,
    and the first line said it was "better than the best homogeneous plan" — it is one itself."""
    r = run_cli("plan", ROOT / "examples" / "espresso_open_llama_3b.toml", "--slo-s", "30", "--json", "--top", "2")
    assert r.code == 0, r.stderr
    first = json.loads(r.stdout)["explanation"][0]
    assert first.startswith("#1 single-pool RTX-A6000"), first
    assert "homogeneous" not in first and "than the best uniform plan" in first


def test_the_title_gives_a_fractional_job_length_as_it_is():
    """1.6e7 tokens of 4,194,304 per iteration are 3.81 iterations (what job time and $ price); the title said
    "4 iterations"."""
    r = run_cli("plan", *JOB, "--tokens", "1.6e7", "--gpu", "H100-SXM", "--gpus", "8", "-q", "--top", "1")
    assert r.code == 0, r.stderr
    assert "3.81 iterations" in r.stdout and "4 iterations" not in r.stdout


def test_gpus_left_idle_by_whole_hosts_are_said():
    """--gpus 12 on H100s (8 per node) ranked 8-GPU plans without a word on the other 4: a plan beyond one node
    takes whole hosts. 16 fill two hosts: nothing to say."""
    r = run_cli("plan", *JOB, "--iterations", "10", "--gpu", "H100-SXM", "--gpus", "12", "--top", "1", columns=80)
    assert r.code == 0, r.stderr
    assert "at most 8 of the 12 H100-SXM (8 per host) are used" in " ".join(r.stdout.split())
    r = run_cli("plan", *JOB, "--iterations", "10", "--gpu", "H100-SXM", "--gpus", "16", "--top", "1")
    assert r.code == 0 and "whole hosts" not in r.stdout


def test_an_unknown_gpu_of_the_baseline_is_refused_before_the_search(tmp_path, monkeypatch):
    """A --baseline on a GPU type the catalog lacks was refused only after the search (minutes on a large job)."""
    mine = tmp_path / "mine.json"
    plan = ["plan", *JOB, "--iterations", "10", "--gpu", "H100-SXM", "--gpus", "8", "-q", "--top", "1"]
    assert run_cli(*plan, "-o", mine).code == 0
    raw = json.loads(mine.read_text())
    raw["pools"][0]["gpu"] = "NOPE"
    mine.write_text(json.dumps(raw))

    def no_search(*args, **kwargs):
        raise AssertionError("searched before checking --baseline")

    monkeypatch.setattr("hetplan.cli.plan.search_plans", no_search)
    r = run_cli(*plan, "--baseline", mine)
    assert r.code == 2 and not r.traceback, (r.stderr, r.traceback)
    assert "error: --baseline pools.0.gpu:" in r.stderr


def test_every_command_summary_is_one_line():
    """typer's rich panel keeps a summary's line breaks: `hetplan energy --help` broke power-limits' mid-sentence
    ("per-rank" / "settings.")."""
    root = typer.main.get_command(app)
    summaries = dict(_summaries(root, "hetplan"))
    assert "hetplan energy power-limits" in summaries
    assert [path for path, text in summaries.items() if "\n" in text] == []


def test_fine_search_steps_are_indented_paragraphs():
    """--search fine --explain printed each step with its continuation lines at column 0 at 80 columns, one step
    hard to tell from the next (the ranking's "Why:" items are indented paragraphs)."""
    r = run_cli("plan", *JOB[:5], "64", "--iterations", "10", "--gpu", "H100-SXM", "--gpus", "16", "--search", "fine",
                "--explain", "-q", "--top", "1", columns=80)
    assert r.code == 0, r.stderr
    lines = r.stdout.splitlines()
    steps = lines[next(i for i, line in enumerate(lines) if line.startswith("  [1] ")):]
    assert len(steps) > 2 and all(line.startswith(("  [", "    ")) for line in steps), steps
    assert max(map(len, lines)) <= 80


def test_power_limit_table_says_whose_watts_and_clocks_it_lists(tmp_path):
    """On FASOP's A100 + A10G plan the W and clock MHz cells read "400, 300" and "1278, 1307" with no word of
    which GPU type each figure is."""
    plan = tmp_path / "het.json"
    assert run_cli("plan", ROOT / "examples" / "fasop_gpt2xl.toml", "-q", "--top", "1", "-o", plan).code == 0
    r = run_cli("energy", "power-limits", plan, "--steps", "3", columns=80)
    assert r.code == 0, r.stderr
    assert "W and clock MHz of A100-SXM-40GB, A10G" in r.stdout
    one = tmp_path / "one.json"
    assert run_cli("plan", *JOB, "--iterations", "10", "--gpu", "H100-SXM", "--gpus", "8", "-q", "--top", "1",
                   "-o", one).code == 0
    assert "W and clock MHz of" not in run_cli("energy", "power-limits", one, "--steps", "3").stdout


def test_the_estimate_command_after_o_is_not_broken_across_lines(tmp_path):
    """At 80 columns "Best plan written to PATH (run `hetplan estimate PATH`)." was broken inside the command,
    "`hetplan estimate" on one line and "PATH`)." on the next: a copy of it ran `hetplan estimate` alone."""
    out = tmp_path / ("a-long-folder-name-for-the-plans-of-this-job" * 2) / "best.json"
    out.parent.mkdir()
    r = run_cli("plan", *JOB, "--iterations", "10", "--gpu", "H100-SXM", "--gpus", "8", "-q", "--top", "1",
                "-o", out, columns=80)
    assert r.code == 0, r.stderr
    assert f"`hetplan estimate {out}`" in r.stdout


def test_the_title_states_the_deadline_budget_and_slo_the_plans_meet():
    """The title said "cheapest job by the deadline" without the deadline, and nothing of Espresso's 100 s SLO
    ("cheapest job"), which every ranked plan meets."""
    r = run_cli("plan", *JOB[:5], "64", "--tokens", "1e10", "--gpu", "H100-SXM", "--gpus", "16", "--objective",
                "cheapest", "--deadline-days", "30", "--budget-usd", "5000", "-q", "--top", "1")
    assert r.code == 0, r.stderr
    assert "cheapest job within 30.0 d and $5,000" in r.stdout and "by the deadline" not in r.stdout
    r = run_cli("plan", ROOT / "examples" / "espresso_open_llama_3b.toml", "-q", "--top", "1")
    assert r.code == 0 and "cheapest job, iteration ≤ 100 s" in " ".join(r.stdout.split()), r.stdout


def test_energy_frontier_names_every_file_it_writes(tmp_path):
    """`energy frontier` said "wrote DIR/frontier.csv, plans.json" and not the summary.json it always writes, the
    frontier.png of --plot or the plans/ folder of --plan-files."""
    r = run_cli("energy", "frontier", ROOT / "tests" / "fixtures" / "energy" / "bloom+a100_sxm_bf16.csv", "-m", "4",
                "--idle-power-w", "83.64", "-o", tmp_path, "--plot", "--plan-files", "--no-baselines", columns=80)
    assert r.code == 0, r.stderr
    said = " ".join(r.stdout.split())
    assert f"wrote frontier.csv, plans.json, plans/, summary.json, frontier.png in {tmp_path}" in said
    assert {p.name for p in tmp_path.iterdir()} == {"frontier.csv", "plans.json", "plans", "summary.json",
                                                    "frontier.png"}


def test_plan_energy_says_where_its_power_comes_from_in_words():
    """`plan --energy` ended its energy line with the JSON code "(dvfs-model)" / "(dvfs-physics)"; `serve` says
    the same in words."""
    for gpu, words in (("H100-SXM", "fitted DVFS power model"), ("RTX-A4000", "DVFS power model transferred, not "
                                                                              "fitted")):
        r = run_cli("plan", *JOB[:5], "64", "--iterations", "10", "--gpu", gpu, "--gpus", "8", "--energy", "--top",
                    "1")
        assert r.code == 0, r.stderr
        assert f"kW on average ({words})" in " ".join(r.stdout.split()) and "(dvfs-" not in r.stdout


def test_the_layout_legend_lists_only_the_marks_the_ranking_shows():
    """At 80 columns every ranking's caption spent two of its three lines on the legend of vN, cpN, epN and etpN,
    also where no layout carried any of them."""
    plan = ["plan", *JOB[:5], "64", "--iterations", "10", "--gpu", "H100-SXM", "--gpus", "8", "--top", "2", "-q"]
    r = run_cli(*plan, "--pp", "1", columns=80)
    assert r.code == 0, r.stderr
    said = " ".join(r.stdout.split())
    assert "plan: GPUs, then TPxPPxDP, micro-batch, ZeRO stage, recomputation" in said and "cpN" not in said
    r = run_cli(*plan, "--pp", "2", "--virtual-stages", "2", columns=80)
    said = " ".join(r.stdout.split())
    assert "TPxPPxDP [vN: virtual stages], micro-batch" in said and "cpN" not in said
