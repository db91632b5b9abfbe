"""Second audit of `hetplan plan`'s less-travelled paths (--per-stage-tp, --inventory files, -q, --baseline
prices, the heterogeneous search's one-pool plans, flags in combination): each test is a wrong first answer or a
silently accepted input found there."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.fuzz.inproc import run_cli

ROOT = Path(__file__).resolve().parents[2]
JOB = ["--model", "llama2-7b", "--seq-len", "4096", "--global-batch", "64", "--iterations", "10"]
PLAN = ["plan", *JOB, "--gpu", "H100-SXM", "--gpus", "16"]


def _refused(r, field: str) -> str:
    assert r.code == 2 and not r.traceback, (r.stderr, r.traceback)
    assert f"error: {field}:" in r.stderr, r.stderr
    return r.stderr


@pytest.mark.parametrize("args, field, why", [
    (PLAN, "--per-stage-tp", "one pool"),
    (["plan", ROOT / "examples" / "fasop_gpt2xl.toml", "--no-hetero"], "--per-stage-tp", "--no-hetero"),
    (["plan", ROOT / "examples" / "fasop_gpt2xl.toml", "--stack", "llm-foundry"], "--per-stage-tp", "no pipeline"),
    (["plan", ROOT / "examples" / "fasop_gpt2xl.toml", "--tp", "1", "--pareto", "f.png"], "--per-stage-tp",
     "TP is pinned to 1"),
])
def test_per_stage_tp_where_no_plan_spans_pools_is_refused(tmp_path, args, field, why):
    """--per-stage-tp lets stages on different pools take different TP degrees; on one pool, under --no-hetero or
    on a stack without pipelines no ranked plan spans pools, and with TP pinned no plan mixes TP degrees: the flag
    was accepted and ranked the very same plans."""
    args = [tmp_path / a if a == "f.png" else a for a in args]  # a figure, if it were drawn, in tmp_path
    err = _refused(run_cli(*args, "--per-stage-tp", "-q"), field)
    assert why in err and "changes nothing" in err


def test_per_stage_tp_in_the_job_file_is_named_there(tmp_path):
    job = tmp_path / "job.toml"
    job.write_text('[job]\nmodel = "llama2-7b"\nseq_len = 4096\nglobal_batch = 64\ntrain_iterations = 10\n'
                   '[[inventory]]\ngpu = "H100-SXM"\ncount = 16\n[search]\nper_stage_tp = true\n')
    _refused(run_cli("plan", job, "-q"), "search.per_stage_tp")


def test_per_stage_tp_still_spans_two_pools():
    r = run_cli("plan", ROOT / "examples" / "fasop_gpt2xl.toml", "--per-stage-tp", "--json", "--top", "1")
    assert r.code == 0, r.stderr
    assert json.loads(r.stdout)["heterogeneous"]["per_stage_tp"] is True


@pytest.mark.parametrize("section", ['[objective]\ngoal = "cheapest"\n', '[job]\nmodel = "gpt3-175b"\n',
                                     "[pin]\ntp = 2\n", "[search]\nheterogeneous = false\n"])
def test_inventory_file_with_other_sections_is_refused(tmp_path, section):
    """--inventory reads only the [[inventory]] pools: its [objective] goal = "cheapest" ranked the fastest job,
    its [job] and [pin] were ignored, all without a word."""
    inv = tmp_path / "inv.toml"
    inv.write_text(section + '[[inventory]]\ngpu = "H100-SXM"\ncount = 16\n')
    key = section[1:section.index("]")]
    err = _refused(run_cli("plan", *JOB, "--inventory", inv, "-q"), f"{inv}:{key}")
    assert f"[{key}] would be ignored" in err and "job file" in err
    inv.write_text('[[inventory]]\ngpu = "H100-SXM"\ncount = 16\n')  # the pools alone still plan
    assert run_cli("plan", *JOB, "--inventory", inv, "-q").code == 0


def test_quiet_prints_the_tables_and_no_notes(tmp_path):
    """-q ("only the tables of plans") still printed the fine search's outcome line, the energy notes under the
    ranking and whether the frontier's points are exact; the tables the user asked for stay."""
    args = [*PLAN, "--top", "1", "--search", "fine", "--energy", "--pareto", tmp_path / "p.png"]
    notes = ("fine search:", "Energy of the fine-grained plan", "Every point is exact", "Why:", "Memory per GPU",
             "allocations solved")
    loud = run_cli(*args, columns=80)
    assert loud.code == 0, loud.stderr
    assert all(n in loud.stdout for n in notes)
    quiet = run_cli(*args, "-q", columns=80)
    assert quiet.code == 0, quiet.stderr
    assert not [n for n in notes if n in quiet.stdout], quiet.stdout
    for table in ("fastest job", "Fine-grained plan", "Cost-time Pareto frontier", "Time-$-energy"):
        assert table in quiet.stdout
    assert max(map(len, quiet.stdout.splitlines())) <= 80


def test_baseline_takes_the_price_the_search_gave_its_pool(tmp_path):
    """A search at --price 2 against its own best plan written without prices (as `hetplan import` writes one):
    the baseline was priced at the catalog's $3.84/GPU-h, so the same plan "costs 52 % of it per job"."""
    best = tmp_path / "best.json"
    assert run_cli(*PLAN, "-q", "--top", "1", "-o", best).code == 0
    raw = json.loads(best.read_text())
    for pool in raw["pools"]:
        pool.pop("price_usd_per_hour")
    mine = tmp_path / "mine.json"
    mine.write_text(json.dumps(raw))
    for base in (best, mine):  # one written at the catalog's price, one without a price
        r = run_cli(*PLAN, "--price", "2", "--json", "--top", "1", "--baseline", base)
        assert r.code == 0, r.stderr
        out = json.loads(r.stdout)
        assert out["plans"][0]["usd_per_hour"] == pytest.approx(32.0)
        assert out["baseline"]["summary"]["usd_per_hour"] == pytest.approx(32.0)
        assert out["baseline"]["usd_ratio"] == pytest.approx(1.0)


def test_one_pool_plan_of_the_heterogeneous_search_is_not_called_heterogeneous():
    """Espresso's 3090 + A6000 inventory: the heterogeneous search's A6000 x5 plan (layers [5, 6, 6, 6, 3], one
    pool) was ranked as "heterogeneous RTX-A6000(tp1)x5 ..."."""
    r = run_cli("plan", ROOT / "examples" / "espresso_open_llama_3b.toml", "--json", "--top", "3")
    assert r.code == 0, r.stderr
    plans = json.loads(r.stdout)["plans"]
    one_pool = [p for p in plans if len({st["gpu"] for st in p["stages"]}) == 1 and "layers [" in p["reason"]]
    assert one_pool, [p["reason"] for p in plans]
    for p in one_pool:
        assert "heterogeneous" not in p["reason"] and "single-pool" in p["reason"]


@pytest.mark.parametrize("flags, field", [
    (["--gpu", "NOPE", "--gpus", "8"], "--gpu"),  # was "gpu"
    (["--gpu", "H100-SXM", "--gpus", "8", "--price", "-1"], "--price"),  # was inventory.pools.0.price_usd_per_hour
    (["--gpu", "H100-SXM", "--gpus", "8", "--gpus-per-node", "0"], "--gpus-per-node"),
    (["--gpu", "H100-SXM", "--gpus", "8", "--deadline-days", "-1"], "--deadline-days"),  # "(got -86400.0)"
    (["--gpu", "H100-SXM", "--gpus", "8", "--deadline-days", "1e-5"], "--deadline-days"),  # no plan that fast
    (["--gpu", "H100-SXM", "--gpus", "8", "--budget-usd", "0.01"], "--budget-usd"),
    (["--gpu", "H100-SXM", "--gpus", "8", "--objective", "slowest"], "--objective"),
    (["--gpu", "H100-SXM", "--gpus", "8", "--iterations", "0"], "--iterations"),  # 0 is a value given
])
def test_a_bad_flag_is_named_as_the_flag(flags, field):
    """Errors about a value a flag set named the job file's field the flag fills in ("objective.deadline_s: ...
    (got -86400.0)" for --deadline-days -1), or "gpu" for --gpu."""
    err = _refused(run_cli(*PLAN[:-4], *flags, "-q"), field)
    assert "objective." not in err and "inventory." not in err and "-86400" not in err


def test_a_bad_gpu_of_an_inventory_file_names_its_pool(tmp_path):
    inv = tmp_path / "inv.toml"
    inv.write_text('[[inventory]]\ngpu = "H100-SXM"\ncount = 8\n[[inventory]]\ngpu = "NOPE"\ncount = 8\n')
    _refused(run_cli("plan", *JOB, "--inventory", inv, "-q"), "inventory.1.gpu")


def test_a_plan_on_two_gpu_types_counts_each():
    """FASOP's 4 A100 + 24 A10G plan read "28x A100-SXM-40GB+A10G+A10G+A10G+A10G+A10G+A10G" (the summary's
    stage types joined): 28 of each, on an 80-column terminal over two lines."""
    ex = ROOT / "examples" / "fasop_gpt2xl.toml"
    js = run_cli("plan", ex, "--json", "--top", "1")
    assert js.code == 0, js.stderr
    best = json.loads(js.stdout)["plans"][0]
    assert best["num_gpus"] == 28 and len({st["gpu"] for st in best["stages"]}) == 2
    r = run_cli("plan", ex, "-q", "--top", "1", columns=80)
    assert r.code == 0, r.stderr
    assert "1 4x A100-SXM-40GB + 24x A10G " in r.stdout and "+A10G+A10G" not in r.stdout


@pytest.mark.parametrize("pin, field", [(["--tp", "16"], "--tp"), (["--pp", "64"], "--pp"),
                                        (["--cp", "3"], "--cp")])
def test_a_pin_flag_the_search_refuses_is_named_as_the_flag(pin, field):
    """The search's pin checks named "pin.tp" for --tp 16 (a bad value of the flag itself said --tp already)."""
    _refused(run_cli(*PLAN, *pin, "-q"), field)


def test_a_pin_of_the_job_file_keeps_its_field(tmp_path):
    job = tmp_path / "job.toml"
    job.write_text('[job]\nmodel = "llama2-7b"\nseq_len = 4096\nglobal_batch = 64\ntrain_iterations = 10\n'
                   '[[inventory]]\ngpu = "H100-SXM"\ncount = 16\n[pin]\ntp = 16\n')
    _refused(run_cli("plan", job, "-q"), "pin.tp")


def test_an_unknown_gpu_of_the_baseline_names_the_baseline(tmp_path):
    """A --baseline on a GPU type the catalog lacks said "gpu: unknown GPU type" (the search's --gpu, as read)."""
    best = tmp_path / "best.json"
    assert run_cli(*PLAN, "-q", "--top", "1", "-o", best).code == 0
    raw = json.loads(best.read_text())
    raw["pools"][0]["gpu"] = "NOPE"
    best.write_text(json.dumps(raw))
    _refused(run_cli(*PLAN, "-q", "--top", "1", "--baseline", best), "--baseline pools.0.gpu")
    _refused(run_cli("estimate", best), "pools.0.gpu")


@pytest.mark.parametrize("days", ["-2", "0", "nan"])
def test_a_bad_deadline_in_days_of_the_job_file_is_named_in_days(tmp_path, days):
    """deadline_days = -2 in [objective] said "objective.deadline_s: ... (got -172800.0)": a field and a unit the
    file does not have."""
    job = tmp_path / "job.toml"
    job.write_text('[job]\nmodel = "llama2-7b"\nseq_len = 4096\nglobal_batch = 64\ntrain_iterations = 10\n'
                   f'[objective]\ndeadline_days = {days}\n[[inventory]]\ngpu = "H100-SXM"\ncount = 16\n')
    err = _refused(run_cli("plan", job, "-q"), "objective.deadline_days")
    assert "86400" not in err and "172800" not in err


def test_baseline_pays_the_electricity_the_ranking_pays(tmp_path):
    """Under --energy --usd-per-kwh 2 the best plan's job $ had its electricity and the same plan as baseline had
    not: the ranking read $0.3057, the baseline line "job $0.2305 ... costs 100 % of it per job"."""
    best = tmp_path / "best.json"
    assert run_cli(*PLAN, "-q", "--top", "1", "-o", best).code == 0
    args = [*PLAN, "--top", "1", "--energy", "--usd-per-kwh", "2", "--baseline", best]
    r = run_cli(*args, "--json")
    assert r.code == 0, r.stderr
    out = json.loads(r.stdout)
    plan, base = out["plans"][0], out["baseline"]["summary"]
    assert plan["energy_usd"] > 0.05 * plan["job_usd"]
    assert base["job_usd"] == pytest.approx(plan["job_usd"]) and base["energy_usd"] == pytest.approx(plan["energy_usd"])
    from hetplan.units import usd_text

    text = run_cli(*args, "-q", columns=200).stdout
    line = text[text.index("Baseline "):]
    assert f"job ${usd_text(plan['job_usd'])};" in line
    assert f"${usd_text(plan['job_usd'] / plan['iterations'])}/iteration" in line


def test_quiet_keeps_the_legend_of_the_tables_star():
    """-q printed "8x B200*" with no word on what the star means (its legend went with the price lines)."""
    r = run_cli(*PLAN[:-4], "--gpu", "B200", "--gpus", "8", "--top", "1", "-q", columns=80)
    assert r.code == 0, r.stderr
    assert "8x B200*" in r.stdout and "* uncalibrated: the compute efficiency of B200" in r.stdout
    assert "Prices $/GPU-h" not in r.stdout
