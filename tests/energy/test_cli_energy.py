"""``hetplan energy frontier`` end to end, and its errors (exit code 2, no traceback)."""

from __future__ import annotations

import csv
import json
import subprocess
import sys

import pytest

from hetplan.energy.frontier import FrequencyPlan

from .energy_testutil import FIXTURES, profile_path


def hetplan(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "hetplan.cli.main", *map(str, args)], capture_output=True, text=True, check=False,
                          cwd=cwd, timeout=300)


def test_frontier_command(tmp_path):
    out = tmp_path / "out"
    r = hetplan("energy", "frontier", profile_path("gpt3-175b"), "--num-microbatches", 12, "--idle-power-w", 83.64,
                "--unit-time-s", 0.001, "-o", out, "--json", "--straggler-slowdown", 1.2, "--plan-files", "--plot")
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    assert summary["points"] == 640 and summary["planner_time_s"] > 0
    assert 0.10 < summary["at_max_speed"]["saved_fraction"] < 0.25
    assert summary["energy_saved_at_max_speed_j"] == pytest.approx(summary["at_max_speed"]["saved_j"])
    assert summary["straggler"]["saved_j"] > summary["energy_saved_at_max_speed_j"]
    with open(out / "frontier.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert list(rows[0]) == ["time", "energy"] and len(rows) == 640
    with open(FIXTURES / "frontier_reference" / "gpt3-175b_bf16_mb12.csv") as fh:
        ref = list(csv.DictReader(fh))
    assert float(rows[1]["time"]) == float(ref[0]["time"])
    assert float(rows[1]["energy"]) == pytest.approx(float(ref[0]["energy"]), rel=1e-6)
    plans = sorted((out / "plans").glob("plan_*.json"))
    assert len(plans) == 640
    p = FrequencyPlan.from_json(plans[-1].read_text())
    assert len(p.frequencies_mhz) == 8 and all(len(x) == 24 for x in p.frequencies_mhz)
    assert p.instructions[7][:3] == ["forward:0", "backward:0", "forward:1"]
    assert (out / "summary.json").exists() and (out / "frontier.png").stat().st_size > 1000
    # the one-file form holds the same plans
    from hetplan.energy.frontier import read_plan

    assert read_plan(out / "plans.json", -1) == p
    assert read_plan(out / "plans.json", 100) == FrequencyPlan.from_json(plans[100].read_text())


def test_frontier_of_a_plan_without_profile(tmp_path):
    """A plan alone: model-derived profile, the plan's micro-batches and schedule, catalog idle power."""
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({
        "job": {"model": "gpt3-1.3b", "seq_len": 2048, "global_batch": 16, "train_iterations": 10},
        "pools": [{"gpu": "A100-SXM-80GB", "count": 4}],
        "stages": [{"num_layers": 6}, {"num_layers": 6}, {"num_layers": 6}, {"num_layers": 6}],
        "mbs": 1, "schedule": "1f1b", "virtual_stages": 2}))
    r = hetplan("energy", "frontier", plan, "-o", tmp_path / "o", "--json", "--no-plot", "--unit-time-s", 0.0005)
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout)
    assert s["profile"] == "model-derived" and s["idle_power_w"] == pytest.approx(83.64)
    assert s["points"] > 10 and 0 < s["at_max_speed"]["saved_fraction"] < 0.5
    from hetplan.energy.frontier import read_plan

    p = read_plan(tmp_path / "o" / "plans.json", -1)
    assert p.schedule == "interleaved" and p.virtual_stages == 2 and p.num_microbatches == 16
    assert len(p.frequencies_mhz[0]) == 2 * 16 * 2 and p.instructions[0][0] == "forward:0:0"
    assert set(f for row in p.frequencies_mhz for f in row) <= set(range(855, 1411, 15))


def test_frontier_gpipe_small(tmp_path):
    r = hetplan("energy", "frontier", profile_path("bloom"), "-m", 2, "--idle-power-w", 83.64, "--schedule", "gpipe",
                "-o", tmp_path, "--no-plot", "--no-baselines", "--no-plans")
    assert r.returncode == 0, r.stderr
    assert "Pareto-optimal" in r.stdout


@pytest.mark.parametrize("args, needle", [
    (["--num-microbatches", "0"], "--num-microbatches"),
    (["--num-microbatches", "-3"], "--num-microbatches"),
    (["-m", "4", "--idle-power-w", "-5"], "--idle-power-w"),
    (["-m", "4", "--unit-time-s", "0"], "--unit-time-s"),
    (["-m", "4", "--unit-time-s", "1e-9"], "--unit-time-s ≥ 5.02e-05"),  # ran > 150 s without progress before
    (["-m", "4", "--unit-time-s", "1e-9"], "error: --unit-time-s:"),  # named by the flag, not compute_frontier's
    (["-m", "4", "--schedule", "zigzag"], "error: --schedule:"),      # unit_time_s / schedule parameters
    (["-m", "4", "--schedule", "zigzag"], "unknown schedule"),
    (["-m", "4", "--straggler-slowdown", "0.5"], "straggler slowdown"),
    ([], "--num-microbatches"),
    (["-m", "4", "--idle-power-w", None], "--idle-power-w"),
    (["-m", "4", "--idle-power-w", None, "--gpu", "Z9000"], "unknown GPU type"),
    (["-m", "4", "--profile-db", "x.sqlite"], "--profile-db"),
])
def test_frontier_bad_options(tmp_path, args, needle):
    base = ["energy", "frontier", profile_path("gpt3-175b"), "--idle-power-w", "83.64", "-o", tmp_path / "o", "--no-plans"]
    if "--idle-power-w" in args:
        base = base[:3] + base[5:]
        if None in args:
            args = [a for a in args if a not in ("--idle-power-w", None)]
    r = hetplan(*base, *args)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert needle in r.stderr and "Traceback" not in r.stderr


def test_frontier_bad_profile(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("stage,instruction,frequency,time,energy\n0,forward,1410,abc,3\n")
    for path, needle in ((bad, "not a number"), (tmp_path / "missing.csv", "does not exist")):
        r = hetplan("energy", "frontier", path, "-m", 4, "--idle-power-w", 80, "-o", tmp_path / "o")
        assert r.returncode == 2 and needle in r.stderr and "Traceback" not in r.stderr


def test_cli_loads_only_the_command_it_runs():
    """``hetplan energy ...`` imports no other command's module (the lazy group in cli/main.py); ``--help`` lists
    every command; the command map names exactly what each module registers."""
    import subprocess
    import sys

    import typer

    from hetplan.cli.main import SUBCOMMAND_MODULES

    code = ("import sys; sys.argv = ['hetplan', 'energy', '--help']\n"
            "from hetplan.cli.main import main\n"
            "try:\n    main()\nexcept SystemExit:\n    pass\n"
            "print(sorted(m for m in sys.modules if m.startswith('hetplan.cli.')), file=sys.stderr)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.stderr.strip().splitlines()[-1] == "['hetplan.cli.energy', 'hetplan.cli.main']", r.stderr
    r = subprocess.run([sys.executable, "-m", "hetplan.cli.main", "--help"], capture_output=True, text=True,
                       timeout=120, env={**__import__("os").environ, "COLUMNS": "200"})
    listed = {line.split()[1] for line in r.stdout.splitlines() if line.startswith("│ ") and len(line.split()) > 2}
    every = {name for names in SUBCOMMAND_MODULES.values() for name in names}
    assert every <= listed, every - listed
    import importlib

    for module, names in SUBCOMMAND_MODULES.items():
        sub = typer.Typer()
        importlib.import_module(module).register(sub)
        got = {c.name for c in sub.registered_commands} | {g.name for g in sub.registered_groups}
        assert got == set(names), module


def test_energy_change_is_signed_once_when_perseus_saves_a_negative_amount():
    from hetplan.cli.energy import energy_change

    assert energy_change(0.123) == "(-12.3 %)"
    assert energy_change(-0.002) == "(+0.2 %)"


def _eight_stage_plan(tmp_path, stages=8):
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({
        "job": {"model": "gpt3-1.3b", "seq_len": 2048, "global_batch": 16, "train_iterations": 10},
        "pools": [{"gpu": "A100-SXM-80GB", "count": stages}],
        "stages": [{"num_layers": 24 // stages}] * stages, "mbs": 1, "schedule": "1f1b"}))
    return plan


def test_frontier_refuses_a_profile_of_other_gpus_or_another_pipeline(tmp_path):
    """A measured profile is planned on the GPUs said to run it: an A40 profile (clocks to 1,740 MHz) with
    ``--gpu A100-SXM-80GB`` (top clock 1,410 MHz) made plans of clocks the A100 cannot lock, at the A100's idle
    power; a plan's ``--profile`` of 8 stages replaced the plan's 7-stage pipeline; both exit 0 before."""
    a40, a100 = profile_path("bloom", "a40"), profile_path("bloom")
    base = ["energy", "frontier", "-m", 4, "-o", tmp_path / "o", "--no-baselines", "--no-plans", "--json"]
    r = hetplan(*base, a40, "--gpu", "A100-SXM-80GB")
    assert r.returncode == 2 and "error: --gpu:" in r.stderr and "1740 MHz" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    for profile, gpu in ((a40, "A40"), (a100, "A100-SXM-80GB"), (a100, "H100-SXM")):
        assert hetplan(*base, profile, "--gpu", gpu).returncode == 0, (profile, gpu)
    base = base[:2] + base[4:]
    r = hetplan(*base, _eight_stage_plan(tmp_path), "--profile", a40)
    assert r.returncode == 2 and "error: --profile:" in r.stderr and "A100-SXM-80GB (1410 MHz)" in r.stderr
    r = hetplan(*base, _eight_stage_plan(tmp_path, 6), "--profile", a100)
    assert r.returncode == 2 and "8 pipeline stages, the pipeline has 6" in r.stderr, r.stderr
    r = hetplan(*base, _eight_stage_plan(tmp_path), "--profile", a100)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["profile"].startswith("measured")


@pytest.mark.parametrize("command", [["energy", "frontier"], ["energy", "power-limits"], ["energy", "serve"],
                                     ["simulate"], ["capacity"], ["serve"]])
def test_help_is_whole_on_an_80_column_terminal(command):
    """At 80 columns rich cut words longer than the help column: the profile CSV's columns read
    ``stage,instruction,frequency,time,en…``, ``--plan-files`` ``DIR/plans/plan_NNNN…`` and capacity's
    ``--catalog`` ``hetplan/hardware/data/gpus.to…``."""
    from typer.testing import CliRunner

    from hetplan.cli.main import app

    r = CliRunner().invoke(app, [*command, "--help"], env={"COLUMNS": "80"})
    assert r.exit_code == 0 and "…" not in r.output, r.output
    assert max(map(len, r.output.splitlines())) <= 80
