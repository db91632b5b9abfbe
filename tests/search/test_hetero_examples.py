"""The seeds' examples through the heterogeneous search and the CLI (--pareto, --slo-s, --no-hetero)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

from hetplan.estimate.estimator import estimate
from hetplan.hardware.catalog import load_catalog
from hetplan.jobfile import load_job_file
from hetplan.model.spec import load_model
from hetplan.plan import Inventory, Job, Plan, Stage
from hetplan.search.hetero import search_hetero
from hetplan.search.objective import Objective
from hetplan.search.planner import search_plans
from hetplan.search.space import Pins

ROOT = Path(__file__).resolve().parents[2]
CAT = load_catalog()


def load(name):
    d = load_job_file(ROOT / "examples" / name)
    job = Job(**{**d["job"], "model": str(ROOT / d["job"]["model"])})
    return job, Inventory(pools=d["inventory"]), d


def test_espresso_example_regression():
    job, inv, d = load("espresso_open_llama_3b.toml")
    m = load_model(job.model)
    slo = d["objective"]["slo_iteration_s"]
    res = search_hetero(m, job, inv, CAT, goal="cheapest", slo_iteration_s=slo, pins=Pins(**d["pin"]))
    best = res.best
    assert best is not None and best.iteration_time_s <= slo
    # Regression: three A6000 stages with layers [9, 9, 8] (Espresso's returned allocation, a6000 x3).
    assert [inv.pools[k].gpu for k, _, _, _ in best.stages] == ["RTX-A6000"] * 3
    assert [n for _, _, n, _ in best.stages] == [9, 9, 8]
    est = estimate(best.to_plan(job, inv), CAT, m, pipeline_model="closed_form")
    assert est.fits and math.isclose(est.usd_per_iteration, best.usd_per_iteration, rel_tol=1e-9)
    # Espresso's cheaper answer (A6000, A6000, 3090 with [11, 12, 3]) does not fit in our memory model even with
    # FlashAttention: the last (24 GB) stage holds the logits of 16 x 3000 tokens (fp32 and a 16-bit copy).
    a6, r3 = [i for i, p in enumerate(inv.pools) if p.gpu == "RTX-A6000"][0], [i for i, p in enumerate(inv.pools) if p.gpu == "RTX-3090"][0]
    assert job.attention == "flash"
    plan = Plan(job=job, pools=inv.pools, mbs=16, stages=[Stage(pool=k, num_layers=n, recompute="full")
                                                         for k, n in ((a6, 11), (a6, 12), (r3, 3))])
    e = estimate(plan, CAT, m)
    assert not e.fits and not e.stages[2].fits
    theoretical = e.stages[2].memory.total - e.stages[2].memory.overhead
    assert theoretical < e.stages[2].memory_capacity_bytes < e.stages[2].memory.total  # the working memory decides
    # Without FlashAttention the s x s scores (and their gradient in backward) need far more than three A6000s.
    std = job.model_copy(update={"attention": "standard"})
    res_std = search_hetero(m, std, inv, CAT, goal="cheapest", slo_iteration_s=slo, pins=Pins(**d["pin"]))
    assert res_std.best is not None and len(res_std.best.stages) > 3
    assert res_std.best.usd_per_iteration > best.usd_per_iteration


def test_espresso_through_search_plans_has_heterogeneous_info():
    job, inv, d = load("espresso_open_llama_3b.toml")
    res = search_plans(job, inv, Objective(**d["objective"]), Pins(**d["pin"]), top_k=3, catalog=CAT)
    assert res.heterogeneous is not None and res.heterogeneous["allocations"] > 0
    assert res.plans[0].estimate.iteration_time_s <= d["objective"]["slo_iteration_s"]
    assert any("Heterogeneous search" in line for line in res.explanation)


def test_fasop_example_mixes_gpu_types():
    job, inv, _ = load("fasop_gpt2xl.toml")
    m = load_model(job.model)
    res = search_hetero(m, job, inv, CAT, goal="fastest")
    assert res.best is not None and len(res.best.pools_used) == 2
    homo = [search_hetero(m, job, Inventory(pools=[p]), CAT, goal="fastest").best for p in inv.pools]
    assert res.best.iteration_time_s < min(h.iteration_time_s for h in homo if h is not None)


def hetplan(*args):
    return subprocess.run([sys.executable, "-m", "hetplan.cli.main", *map(str, args)], capture_output=True, text=True,
                          cwd=ROOT, timeout=300)


def test_cli_pareto_writes_png(tmp_path):
    png = tmp_path / "pareto.png"
    r = hetplan("plan", ROOT / "examples" / "fasop_gpt2xl.toml", "--pareto", png, "--json", "--top", "2")
    assert r.returncode == 0, r.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    out = json.loads(r.stdout)
    pts = out["pareto"]
    assert len(pts) >= 2 and {"heterogeneous", "iteration_time_s", "usd_per_iteration"} <= set(pts[0])
    assert any(p["heterogeneous"] for p in pts)
    # Table/JSON figures are estimate()'s, the points are mutually non-dominated, and each says what it buys.
    for i, p in enumerate(pts):
        assert "buys" in p and "exact" in p
        assert not any(q["iteration_time_s"] <= p["iteration_time_s"] and q["usd_per_iteration"] <= p["usd_per_iteration"]
                       for j, q in enumerate(pts) if j != i)
    cheapest = min(pts, key=lambda p: p["usd_per_iteration"])
    assert cheapest["buys"] == "cheapest" and sum(p["buys"] == "cheapest" for p in pts) == 1
    assert "heterogeneous" in out and out["plans"][0]["stages"][0]["gpu"] == "A100-SXM-40GB"


def test_cli_pareto_table_fits_80_columns(tmp_path):
    """The frontier table took 160 columns whenever stdout was not a terminal, COLUMNS=80 or not."""
    import os

    r = subprocess.run([sys.executable, "-m", "hetplan.cli.main", "plan", ROOT / "examples" / "fasop_gpt2xl.toml",
                        "--pareto", tmp_path / "p.png", "--top", "1"], capture_output=True, text=True, cwd=ROOT,
                       timeout=300, env={**os.environ, "COLUMNS": "80"})
    assert r.returncode == 0, r.stderr
    assert "Cost-time Pareto frontier" in r.stdout and "cheapest" in r.stdout
    assert max(len(line) for line in r.stdout.splitlines()) <= 80


def test_cli_slo_and_no_hetero(tmp_path):
    ex = ROOT / "examples" / "fasop_gpt2xl.toml"
    r = hetplan("plan", ex, "--no-hetero", "--json", "--top", "1")
    assert r.returncode == 0, r.stderr
    assert "heterogeneous" not in json.loads(r.stdout)
    r = hetplan("plan", ex, "--slo-s", "-1")
    assert r.returncode == 2 and "--slo-s" in r.stderr + r.stdout
    r = hetplan("plan", ex, "--slo-s", "0.001")
    assert r.returncode == 2 and "slo" in (r.stderr + r.stdout).lower()


def test_default_search_proposes_only_plans_export_launches(tmp_path):
    """Every framework builds one device mesh, so by default every stage of a proposed plan has the same TP and DP
    and the best plan exports (exit 0); ``--per-stage-tp`` (FASOP's and Espresso's space) finds a faster plan of
    stages with different TP, which ``export`` refuses (exit 2) naming why."""
    ex = ROOT / "examples" / "fasop_gpt2xl.toml"
    out = {}
    for flag in ((), ("--per-stage-tp",)):
        best = tmp_path / f"best{len(flag)}.json"
        r = hetplan("plan", ex, *flag, "--json", "--top", "3", "-o", best)
        assert r.returncode == 0, r.stderr
        plans = json.loads(r.stdout)["plans"]
        assert json.loads(r.stdout)["heterogeneous"]["per_stage_tp"] is bool(flag)  # the space it searched
        out[flag] = plans
        exported = hetplan("export", best, "--to", "megatron", "--out-dir", tmp_path / f"out{len(flag)}")
        if not flag:
            for p in plans:  # one mesh: the same TP x DP on every stage
                assert len({(st["tp"], st["dp"]) for st in p["stages"]}) == 1
            assert exported.returncode == 0, exported.stderr
        else:
            assert len({st["tp"] for st in plans[0]["stages"]}) > 1
            assert exported.returncode == 2 and "one device mesh" in exported.stderr + exported.stdout
    assert out[("--per-stage-tp",)][0]["iteration_time_s"] < out[()][0]["iteration_time_s"]


def test_search_section_in_job_file(tmp_path):
    text = (ROOT / "examples" / "fasop_gpt2xl.toml").read_text()
    text = text.replace('model = "models/', f'model = "{ROOT}/examples/models/')  # the file's folder
    off = tmp_path / "off.toml"
    off.write_text(text + "\n[search]\nheterogeneous = false\n")
    r = hetplan("plan", off, "--json", "--top", "1")
    assert r.returncode == 0, r.stderr
    assert "heterogeneous" not in json.loads(r.stdout)
    bad = tmp_path / "bad.toml"
    bad.write_text(text + "\n[search]\nhetero = 1\n")
    r = hetplan("plan", bad)
    assert r.returncode == 2 and "search.hetero" in r.stderr + r.stdout


def test_reasons_when_a_heterogeneous_plan_wins():
    """Under Megatron-LM's memory (the example without ``framework = "deepspeed"``) a 3090 stage fits and the
    heterogeneous 3090 + A6000 x 2 plan is cheapest: the best homogeneous plan is then relabelled with its rank,
    and no line but the winner's calls itself best or #1."""
    job, inv, d = load("espresso_open_llama_3b.toml")
    job = job.model_copy(update={"framework": "megatron"})
    # one GPU per machine: 1 + 2 GPUs of two 8-GPU servers no launch starts (a host holds one pool's GPUs, and the
    # launch starts as many processes on each; hetplan.plan.pools_fill_whole_hosts)
    inv = Inventory(pools=[p.model_copy(update={"gpus_per_node": 1}) for p in inv.pools])
    # Espresso's setting: plain 1F1B (interleaving the uneven 26-layer split, 6 + 7 + 7 + 6 with the embedding and
    # loss as layers, makes 4 x A6000 cheapest; the heterogeneous search does not interleave)
    res = search_plans(job, inv, Objective(**d["objective"]), Pins(**d["pin"], virtual_stages=1), top_k=5,
                       catalog=CAT)
    assert "heterogeneous" in res.plans[0].reason and res.plans[0].reason.startswith("best job $")
    homo = [rp for rp in res.plans if "heterogeneous" not in rp.reason]
    assert homo, "the best homogeneous plan is in the top 5"
    first = homo[0]
    assert "the best homogeneous plan;" in first.reason
    for rp in res.plans[1:]:
        key = rp.estimate.job_usd / res.plans[0].estimate.job_usd - 1
        assert rp.reason.startswith(f"{key:+.1%} job $ vs #1")
    assert [line.startswith("#1 ") for line in res.explanation].count(True) == 1
    assert any(line.startswith(f"Best homogeneous plan (#{first.rank}): ") for line in res.explanation)


def test_a_stack_without_sequence_parallelism_gets_no_sp_plans_and_no_duplicates():
    """Under Megatron-LM of January 2022 (no sequence parallelism) the heterogeneous walk wrote
    sequence_parallel = true on its TP plans — priced without it, so the same layout appeared twice in the ranking
    (once from each search) and the plan JSON claimed what the stack cannot run."""
    d = load_job_file(ROOT / "examples" / "llama2-7b-mixed-cloud.toml")
    job, inv = Job(**{**d["job"], "stack": "megatron-lm@2022-01"}), Inventory(pools=d["inventory"])
    res = search_plans(job, inv, Objective(**d["objective"]), Pins(**d.get("pin", {})), top_k=5, catalog=CAT)
    plans = [rp.plan for rp in res.plans]
    assert not any(p.sequence_parallel for p in plans)
    assert len({p.model_dump_json() for p in plans}) == len(plans)


def test_cli_pareto_keeps_the_deadline(tmp_path):
    """The frontier applied the SLO and the budget but not the deadline: under a 25.9 s deadline (3e-4 days) the
    ranking's cheapest plan by the deadline was 6 A6000s at $0.2448, while the frontier's "cheapest" point was 3
    A6000s at $0.1719 taking 34.4 s, past the deadline."""
    days = 3e-4
    r = hetplan("plan", ROOT / "examples" / "espresso_open_llama_3b.toml", "--deadline-days", days, "--pareto",
                tmp_path / "p.png", "--json", "--top", "1")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    pts = out["pareto"]
    assert pts and all(p["job_time_s"] <= days * 86400 for p in pts)
    cheapest = next(p for p in pts if p["buys"] == "cheapest")
    assert math.isclose(cheapest["job_usd"], out["plans"][0]["job_usd"], rel_tol=1e-9)


def test_cli_pareto_no_hetero_has_one_gpu_type_per_point(tmp_path):
    """--no-hetero ranked only plans on one GPU type, but its --pareto frontier still mixed A100s and A10Gs."""
    r = hetplan("plan", ROOT / "examples" / "fasop_gpt2xl.toml", "--no-hetero", "--pareto", tmp_path / "p.png",
                "--json", "--top", "1")
    assert r.returncode == 0, r.stderr
    pts = json.loads(r.stdout)["pareto"]
    assert pts and not any(p["heterogeneous"] for p in pts)
    assert all(len({st["gpu"] for st in p["stages"]}) == 1 for p in pts)


def test_frontier_counts_each_allocation_solved_once():
    """The frontier's title read "32 of 27 allocations solved" on the Espresso example: the closed-form seeds'
    solves and the walk's were added, an allocation solved by both counted twice."""
    from hetplan.search.pareto import pareto_frontier

    job, inv, d = load("espresso_open_llama_3b.toml")
    fr = pareto_frontier(load_model(job.model), job, inv, CAT, Pins(**d["pin"]),
                         slo_iteration_s=d["objective"]["slo_iteration_s"])
    assert fr.points and 0 < fr.result.allocations_solved <= fr.result.allocations


def test_cli_pareto_holds_the_ranked_plans(tmp_path):
    """The frontier is exact over H (each allocation's closed-form-optimal 1F1B plan), which holds no interleaved
    plan: on Llama-2-70B with 128 H100s the ranking's #1 (2x16x4, 3 virtual stages: 14.15 s, $1.932 per iteration)
    was faster and cheaper than the frontier's fastest point (2x8x8: 14.34 s, $1.959), printed right under it."""
    r = hetplan("plan", "--model", "llama2-70b", "--seq-len", "4096", "--global-batch", "512", "--tokens", "1e11",
                "--gpu", "H100-SXM", "--gpus", "128", "--top", "10", "--json", "--pareto", tmp_path / "p.png")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    pts, plans = out["pareto"], out["plans"]
    assert plans[0]["virtual_stages"] > 1
    for q in pts:
        assert not any(p["iteration_time_s"] < q["iteration_time_s"] and p["usd_per_iteration"] < q["usd_per_iteration"]
                       for p in plans), q["description"]
    assert any(math.isclose(q["iteration_time_s"], plans[0]["iteration_time_s"], rel_tol=1e-12) for q in pts)


def test_use_gpus_that_only_mixed_pools_hold(tmp_path):
    """--use-gpus 32 on FASOP's 4 A100 + 28 A10G (FASOP's own answer uses all 32) was refused as "no configuration
    matches the pinned dimensions" before the heterogeneous search ran, since no pool alone holds 32 GPUs; under
    --no-hetero (or past the inventory) the refusal now says so."""
    ex = ROOT / "examples" / "fasop_gpt2xl.toml"
    r = hetplan("plan", ex, "--use-gpus", "32", "--json", "--top", "2")
    assert r.returncode == 0, r.stderr
    assert all(p["num_gpus"] == 32 for p in json.loads(r.stdout)["plans"])
    r = hetplan("plan", ex, "--use-gpus", "32", "--no-hetero")
    assert r.returncode == 2 and "--use-gpus" in r.stderr and "the largest has 28" in r.stderr
    r = hetplan("plan", ex, "--use-gpus", "64")
    assert r.returncode == 2 and "the inventory has 32 GPUs" in r.stderr


def test_deadline_and_budget_refusal_names_the_pair_not_the_deadline():
    """FASOP's inventory, $0.01 and a 0.864 s deadline: "no plan finishes by the deadline of 0.9 s; the fastest
    plan that fits takes 0.9 s" — the fastest it knew (four A100s, 0.945 s) left out the mixed plan of 0.81 s,
    which meets the deadline; the deadline and the budget together are why."""
    ex = ROOT / "examples" / "fasop_gpt2xl.toml"
    r = hetplan("plan", ex, "--objective", "budget", "--budget-usd", "0.01", "--deadline-days", "1e-5")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "error: objective: no plan both finishes by the deadline" in r.stderr, r.stderr
    r = hetplan("plan", ex, "--deadline-days", "9e-6")  # 0.7776 s: below every plan, said to the digit
    assert r.returncode == 2 and "deadline of 0.7776 s; the fastest plan that fits takes 0.8102 s" in r.stderr, r.stderr
