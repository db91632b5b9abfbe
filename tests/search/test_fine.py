"""Fine-grained search (hetplan.search.fine): exactness of its cost model, optimality on enumerable instances, never
worse than the uniform search, determinism, Aceso's GPT-3 1.3B case, schema/estimator additions and the CLI."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from hetplan.errors import HetplanError
from hetplan.estimate.comm import p2p_time_s
from hetplan.estimate.estimator import estimate
from hetplan.estimate.reshard import boundary_transfer_time_s
from hetplan.estimate.schedule import simulate
from hetplan.estimate.stage import p2p_bytes
from hetplan.estimate.stagework import Link
from hetplan.hardware.catalog import load_catalog
from hetplan.model.spec import load_model
from hetplan.plan import GPUPool, Inventory, Job, Plan, Stage
from hetplan.search.fine import FineSearch, enumerate_states, fine_search, with_gpu_memory
from hetplan.search.fine_cost import FineCostModel, FineStage, FineState, simulate_1f1b
from hetplan.search.planner import search_plans

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "aceso"
ACESO_13 = FIX / "gpt_1_3B_aceso.json"
V100 = "V100-SXM-32GB"


# -- cost model ------------------------------------------------------------------------------------------------
def test_fast_1f1b_equals_event_simulation():
    rng = random.Random(0)
    for _ in range(300):
        p = rng.randint(1, 6)
        m = rng.choice([1, 2, 3, p, p + 1, 2 * p, 17, 64, 200])
        f = [rng.uniform(0.5, 2) for _ in range(p)]
        b = [x * rng.uniform(1.5, 3) for x in f]
        c = [rng.choice([0.0, 0.01, 0.3]) for _ in range(p - 1)]
        if rng.random() < 0.3:  # equal stages reach the periodic steady state: the shortcut is taken
            f, b = [1.0] * p, [2.0] * p
        ref = simulate(f, b, c, m, "1f1b")
        got, ends = simulate_1f1b(f, b, c, m)
        assert got == pytest.approx(ref.makespan_s, rel=1e-12)
        assert ends == pytest.approx(ref.stage_end_s, rel=1e-12)


def test_cost_model_equals_estimator_on_fine_plans():
    """Per-stage GPUs/TP/DP, per-stage mbs, partial recompute and resharding: the search's numbers are
    estimate()'s numbers."""
    rng = random.Random(1)
    cat = with_gpu_memory(load_catalog(), V100, 12e9)  # tight: recomputation is repaired per layer
    m = load_model("gpt3-1.3b")
    job = Job(model="gpt3-1.3b", seq_len=2048, global_batch=64, dtype="fp16")
    pool = GPUPool(gpu=V100, count=8)
    cm = FineCostModel(m, job, pool, cat.get(V100))
    partial = differing = 0
    for _ in range(40):
        p = rng.randint(1, 4)
        B = rng.choice([2, 4, 8])
        cuts = sorted(rng.sample(range(1, 24), p - 1))
        ns = [b - a for a, b in zip([0] + cuts, cuts + [24])]
        stages = []
        for n in ns:
            g = rng.choice([1, 2])
            t = rng.choice([1, g])
            stages.append(FineStage(n, t, g // t))
        s = FineState(tuple(stages), B, rng.choice([0, 1]))
        c = cm.cost(s)
        plan = cm.to_plan(s)
        est = estimate(plan, cat, m)
        assert c.iteration_time_s == pytest.approx(est.iteration_time_s, rel=1e-9)
        assert c.memory_bytes == pytest.approx([se.memory.total for se in est.stages], rel=1e-9)
        partial += any(st.recompute_layers is not None for st in plan.stages)
        differing += len({st.dp for st in plan.stages}) > 1
    assert partial and differing  # the interesting cases were exercised


def test_cost_model_equals_estimator_on_interleaved_fine_plans():
    """Interleaved 1F1B states (v = 2..4, uneven stages in near-equal chunks, per-stage TP/DP, repaired
    recomputation): the search's numbers are estimate()'s for the plan it writes (virtual_stages and
    pipeline_chunks), which passes the plan rules."""
    from hetplan.plan_rules import violations

    rng = random.Random(3)
    cat = with_gpu_memory(load_catalog(), V100, 12e9)
    m = load_model("gpt3-1.3b")
    job = Job(model="gpt3-1.3b", seq_len=2048, global_batch=64, dtype="fp16")
    pool = GPUPool(gpu=V100, count=8)
    cm = FineCostModel(m, job, pool, cat.get(V100))
    search = FineSearch(cm)
    seen = set()
    while len(seen) < 12:
        p, v, B = rng.choice([2, 4]), rng.choice([2, 3, 4]), rng.choice([2, 4])
        cuts = sorted(rng.sample(range(v, 24 - v, v), p - 1)) if p == 2 else [5, 11, 18]
        ns = [b - a for a, b in zip([0] + cuts, cuts + [24])]
        stages = tuple(FineStage(n, *rng.choice([(1, 1), (1, 2), (2, 1)])) for n in ns)
        s = FineState(stages, B, rng.choice([0, 1]), virtual_stages=v)
        if not search.valid(s) or s in seen:
            continue
        seen.add(s)
        plan = cm.to_plan(s)
        assert plan.virtual_stages == v and violations(plan, m) == []
        est = estimate(plan, cat, m)
        assert cm.cost(s).iteration_time_s == pytest.approx(est.iteration_time_s, rel=1e-9)
        assert cm.cost(s).memory_bytes == pytest.approx([se.memory.total for se in est.stages], rel=1e-9)
    deepspeed = FineCostModel(m, job.model_copy(update={"framework": "deepspeed"}), pool, cat.get(V100))
    assert not any(FineSearch(deepspeed).valid(s) for s in seen)  # DeepSpeed's pipeline engine: 1F1B only


def test_fine_search_interleaves_when_it_pays():
    """Llama 2 7B on 16 H100 from the best plain-1F1B plan at PP 4: the fine search's own interleaving move
    finds a faster interleaved plan, reported through estimate()."""
    from hetplan.search.space import Pins

    job = Job(model="llama2-7b", seq_len=4096, global_batch=64, dtype="bf16")
    inv = Inventory(pools=[GPUPool(gpu="H100-SXM", count=16)])
    plain = search_plans(job, inv, pins=Pins(pp=4, virtual_stages=1), top_k=1).plans[0].plan
    r = fine_search(job, inv, start=plain, budget_evaluations=600)
    assert r.start_plan.virtual_stages == 1 and r.plan.virtual_stages > 1
    assert r.estimate.iteration_time_s < r.start_estimate.iteration_time_s
    assert estimate(r.plan).iteration_time_s == r.estimate.iteration_time_s


def test_reshard_equals_p2p_for_equal_layouts_and_costs_more_otherwise():
    m = load_model("gpt3-1.3b")
    link = Link(8, 50e9, 50e9)
    same = boundary_transfer_time_s(m, 2048, (2, 2, 4), (2, 2, 4), 50e9, link.p2p_alpha_s, link)
    assert same == pytest.approx(float(p2p_time_s(p2p_bytes(m, 4, 2048, 2, True), 50e9, link.p2p_alpha_s,
                                                       efficiency=link.intra_link_efficiency)))
    assert boundary_transfer_time_s(m, 2048, (1, 4, 2), (4, 1, 8), 50e9, link.p2p_alpha_s, link) > same


# -- schema ----------------------------------------------------------------------------------------------------
def _job(gbs=16):
    return Job(model="gpt3-1.3b", seq_len=2048, global_batch=gbs, dtype="fp16")


def test_schema_additions_default_and_validation():
    pools = [GPUPool(gpu=V100, count=4)]
    plan = Plan(job=_job(), pools=pools, stages=[Stage(num_layers=24, dp=2)], mbs=2)
    assert plan.stages[0].recompute_layers is None and plan.stages[0].mbs is None
    assert plan.num_microbatches(0) == 4
    ok = Plan(job=_job(), pools=pools, mbs=2, stages=[Stage(num_layers=12, dp=2, recompute="full", recompute_layers=5),
                                                     Stage(num_layers=12, dp=1, mbs=4)])
    assert ok.num_microbatches(1) == ok.num_microbatches(0) == 4 and ok.stages[0].recomputed_layers() == 5
    with pytest.raises(ValidationError):
        Plan(job=_job(), pools=pools, mbs=2, stages=[Stage(num_layers=24, recompute="full", recompute_layers=25)])
    with pytest.raises(ValidationError):  # pipeline micro-batches of different sizes
        Plan(job=_job(), pools=pools, mbs=2, stages=[Stage(num_layers=12, dp=2), Stage(num_layers=12, dp=1, mbs=2)])


# -- search quality --------------------------------------------------------------------------------------------
def _instances(seed: int, n: int, tmp: Path):
    base = json.loads(ACESO_13.read_text())
    rng = random.Random(seed)
    for _ in range(n):
        L = rng.choice([3, 5, 6, 7, 9])
        h = rng.choice([512, 1024, 2048, 4096])
        seq = rng.choice([1024, 2048])
        gpu = rng.choice([V100, "A100-SXM-80GB"])
        N = rng.choice([2, 3, 4])
        gbs = rng.choice([8, 16, 32, 64])
        mem = rng.choice([4, 6, 8, 12, 16, 32])
        cfg = dict(base, num_hidden_layers=L, hidden_size=h, ffn_hidden_size=4 * h, num_attention_heads=h // 64)
        path = tmp / f"m_{L}_{h}.json"
        path.write_text(json.dumps(cfg))
        yield path, seq, gpu, N, gbs, mem


#: Measured (seed 1, 30 instances, 28 feasible — asserted; 26 while the CUDA context was an assumed 1 GiB, before
#: PyTorch's measured 0.27 GiB with lazy module loading, issue 29; the best uniform plan is not optimal on 7 of them,
#: 2026-11-28 — asserted at least 5, as the count moves with the estimator's calibration): the search found the
#: optimum of the enumerated fine-grained space on every one, worst gap 0.
def test_optimum_rate_on_enumerable_instances(tmp_path):
    found, nonuniform, gaps = 0, 0, []
    for path, seq, gpu, N, gbs, mem in _instances(1, 30, tmp_path):
        m = load_model(path)
        job = Job(model=str(path), seq_len=seq, global_batch=gbs, dtype="fp16", attention="standard")
        pool = GPUPool(gpu=gpu, count=N)
        cat = with_gpu_memory(load_catalog(), gpu, mem * 2**30)
        try:
            r = fine_search(job, Inventory(pools=[pool]), catalog=cat, model=m)
        except HetplanError:
            continue  # nothing fits
        cm = FineCostModel(m, job, pool, cat.get(gpu), max_stages=N)
        states = enumerate_states(FineSearch(cm), r.start_plan.num_gpus)
        best = min(cm.cost(s).key for s in states)
        assert best[0] == 0
        gap = r.estimate.iteration_time_s / best[1] - 1
        gaps.append(gap)
        found += gap <= 1e-9
        nonuniform += r.start_estimate.iteration_time_s / best[1] - 1 > 1e-9
        assert r.estimate.iteration_time_s <= r.start_estimate.iteration_time_s
    assert len(gaps) == 28 and nonuniform >= 5  # instances that fit; those where fine-grained plans matter
    assert found == len(gaps) and max(gaps) <= 1e-9


@pytest.mark.parametrize("model,gpu,count,per_node,gbs", [
    ("gpt3-1.3b", "A100-SXM-80GB", 8, 8, 256),
    ("gpt3-6.7b", V100, 16, 8, 512),
    ("llama2-7b", "H100-SXM", 32, 8, 512),
])
def test_never_worse_than_uniform(model, gpu, count, per_node, gbs):
    job = Job(model=model, seq_len=2048, global_batch=gbs, dtype="fp16" if gpu == V100 else "bf16")
    inv = Inventory(pools=[GPUPool(gpu=gpu, count=count, gpus_per_node=per_node)])
    uniform = search_plans(job, inv, top_k=1)
    r = fine_search(job, inv, budget_evaluations=1500)
    assert r.estimate.fits
    assert r.estimate.iteration_time_s <= uniform.plans[0].estimate.iteration_time_s * (1 + 1e-12)
    assert r.plan.num_gpus == uniform.plans[0].plan.num_gpus
    assert r.evaluations <= 1500


def test_deterministic_and_budgeted():
    job = Job(model="gpt3-6.7b", seq_len=2048, global_batch=512, dtype="fp16")
    inv = Inventory(pools=[GPUPool(gpu=V100, count=16)])
    a = fine_search(job, inv, budget_evaluations=400)
    b = fine_search(job, inv, budget_evaluations=400)
    assert a.plan == b.plan and a.evaluations == b.evaluations
    assert [s.text() for s in a.trace] == [s.text() for s in b.trace]
    assert a.evaluations <= 400
    one = fine_search(job, inv, budget_evaluations=1)
    assert one.estimate.iteration_time_s <= one.start_estimate.iteration_time_s
    with pytest.raises(HetplanError):
        fine_search(job, inv, budget_evaluations=0)


# -- Aceso's case ----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def aceso_db():
    from hetplan.profile.db import ProfileDB
    from hetplan.profile.importers import import_aceso

    db = ProfileDB()
    import_aceso(db, FIX, models={"gpt_1_3B": (load_model(ACESO_13), 2048)})
    return db


def test_aceso_gpt3_1_3b_small_case(aceso_db):
    """GPT-3 1.3B, 4 x V100-32GB limited to 12,000 MB, global batch 512 (Aceso's artifact): Aceso predicted 58.76 s
    and measured 59.01 s per iteration. Measured here (2026-11-29): uniform 59.81 s, fine 58.69 s (PP 4 of 6 layers
    each, ZeRO-1, 11.70 of the 11.72 GiB limit; 0.5 % under Aceso's measurement). Before ZeRO-3 under
    ``framework = "megatron"`` ran as Megatron-FSDP (its per-micro-batch gradient copy and main-gradient buckets,
    docs/estimator.md) the fine search found a ZeRO-3 plan at 58.71 s; that plan now needs more than the limit."""
    m = load_model(ACESO_13)
    job = Job(model=str(ACESO_13), seq_len=2048, global_batch=512, dtype="fp16", attention="standard")
    inv = Inventory(pools=[GPUPool(gpu=V100, count=4, gpus_per_node=4)])
    cat = with_gpu_memory(load_catalog(), V100, 12000 * 2**20)
    r = fine_search(job, inv, catalog=cat, model=m, profiles=aceso_db)
    assert all(se.time_source == "profiled" for se in r.estimate.stages)
    assert r.estimate.fits
    assert r.estimate.iteration_time_s <= r.start_estimate.iteration_time_s
    assert r.estimate.iteration_time_s == pytest.approx(59.01, rel=0.02)  # Aceso measured
    assert r.evaluations < 1000


# -- CLI -------------------------------------------------------------------------------------------------------
def _cli(*args):
    return subprocess.run([sys.executable, "-m", "hetplan.cli.main", *map(str, args)], capture_output=True, text=True,
                          timeout=120)


def test_cli_search_fine_json_and_explain():
    args = ["plan", "--model", "gpt3-1.3b", "--seq-len", "2048", "--global-batch", "512", "--dtype", "fp16",
            "--gpu", V100, "--gpus", "4"]
    out = _cli(*args, "--search", "fine", "--json")
    assert out.returncode == 0, out.stderr
    d = json.loads(out.stdout)
    assert {"plans", "explanation", "configurations_evaluated", "search_time_s", "fine"} <= set(d)
    assert d["plans"][0]["iteration_time_s"] <= d["plans"][1]["iteration_time_s"]
    assert d["fine"]["trace"] and "bottleneck_stage" in d["fine"]["trace"][0]
    out = _cli(*args, "--search", "fine", "--explain")
    assert out.returncode == 0 and "bottleneck stage" in out.stdout and "fine search:" in out.stdout
    bad = _cli(*args, "--search", "bogus")
    assert bad.returncode == 2 and "--search" in bad.stderr and "Traceback" not in bad.stderr


def test_pins_hold_in_the_fine_search():
    from hetplan.search.space import Pins

    job = Job(model="gpt3-6.7b", seq_len=2048, global_batch=512, dtype="fp16")
    inv = Inventory(pools=[GPUPool(gpu=V100, count=16)])
    r = fine_search(job, inv, pins=Pins(tp=2, zero=1, recompute="none"), budget_evaluations=300)
    assert all(st.tp == 2 and st.recompute == "none" for st in r.plan.stages) and r.plan.zero == 1


def test_cli_profile_db(tmp_path, aceso_db):
    from hetplan.profile.db import ProfileDB
    from hetplan.profile.importers import import_aceso

    path = tmp_path / "aceso.sqlite"
    with ProfileDB(path) as db:
        import_aceso(db, FIX, models={"gpt_1_3B": (load_model(ACESO_13), 2048)})
    out = _cli("plan", "--model", ACESO_13, "--seq-len", "2048", "--global-batch", "512", "--dtype", "fp16", "--gpu",
               V100, "--gpus", "4", "--gpus-per-node", "4", "--search", "fine", "--profile-db", path, "--json")
    assert out.returncode == 0, out.stderr
    d = json.loads(out.stdout)
    assert all(s["time_source"] == "profiled" for s in d["plans"][0]["stages"])
    assert d["fine"]["iteration_time_s"] <= d["fine"]["uniform_iteration_time_s"]

    # `hetplan estimate --profile-db` re-estimates a written plan from the same measured layers (and its
    # timeline); without the database the same plan is analytic and takes another time.
    plan_path = tmp_path / "plan.json"
    plan_path.write_text(json.dumps(d["plans"][0]["plan"]))
    out = _cli("estimate", plan_path, "--profile-db", path, "--json", "--timeline", tmp_path / "t.png")
    assert out.returncode == 0, out.stderr
    prof = json.loads(out.stdout)
    assert all(s["time_source"] == "profiled" for s in prof["estimate"]["stages"])
    assert (tmp_path / "t.png").stat().st_size > 0
    from hetplan.profile.db import ProfileDB

    plan = Plan.model_validate(d["plans"][0]["plan"])
    with ProfileDB(path) as db:
        ref = estimate(plan, profiles=db)
    assert prof["iteration_time_s"] == pytest.approx(ref.iteration_time_s, rel=1e-12)
    analytic = json.loads(_cli("estimate", plan_path, "--json").stdout)
    assert all(s["time_source"] == "analytic" for s in analytic["estimate"]["stages"])
    assert analytic["iteration_time_s"] != pytest.approx(ref.iteration_time_s, rel=1e-3)
    missing = _cli("estimate", plan_path, "--profile-db", tmp_path / "nope.sqlite")
    assert missing.returncode == 2 and "--profile-db" in missing.stderr and "Traceback" not in missing.stderr


# -- CP and EP -----------------------------------------------------------------------------------------------------
def _moe_config(tmp: Path, layers: int, experts: int) -> Path:
    """A small Qwen3-MoE config.json (top-2 of ``experts`` routed experts in every layer), long context allowed."""
    cfg = dict(model_type="qwen3_moe", hidden_size=1024, intermediate_size=2048, moe_intermediate_size=1024,
               num_attention_heads=8, num_key_value_heads=8, head_dim=128, num_hidden_layers=layers,
               num_experts=experts, num_experts_per_tok=2, decoder_sparse_step=1, vocab_size=32000,
               max_position_embeddings=65536, tie_word_embeddings=False)
    path = tmp / f"moe_{layers}_{experts}.json"
    path.write_text(json.dumps(cfg))
    return path


def test_cost_model_equals_estimator_with_cp_and_ep(tmp_path):
    """States with CP and EP > 1 (per-stage DP, resharding), EP folded over TP x CP x DP and expert-TP (MoE
    parallel folding): the fine search's numbers are estimate()'s; the search takes folded states where the
    job's framework runs them (frameworks.toml: Megatron-LM yes, DeepSpeed's pipeline engine no)."""
    rng = random.Random(2)
    path = _moe_config(tmp_path, 4, 4)
    m = load_model(path)
    job = Job(model=str(path), seq_len=16384, global_batch=8, dtype="bf16")
    cat = load_catalog()
    pool = GPUPool(gpu="A100-SXM-80GB", count=16, gpus_per_node=8)
    cm = FineCostModel(m, job, pool, cat.get("A100-SXM-80GB"))
    seen, folded = set(), set()
    for _ in range(40):
        p = rng.randint(1, 3)
        cuts = sorted(rng.sample(range(1, 4), p - 1))
        ns = [b - a for a, b in zip([0] + cuts, cuts + [4])]
        cp = rng.choice([1, 2, 4])
        stages = [FineStage(n, rng.choice([1, 2]), rng.choice([1, 2])) for n in ns]
        etp = rng.choice([1, 2]) if all(st.tp == 2 for st in stages) else 1
        ep = rng.choice([e for e in (1, 2, 4) if all((st.tp * st.dp * cp) % (e * etp) == 0 for st in stages)])
        s = FineState(tuple(stages), 2, rng.choice([0, 1]), cp, ep, etp)
        c = cm.cost(s)
        est = estimate(cm.to_plan(s), cat, m)
        assert c.iteration_time_s == pytest.approx(est.iteration_time_s, rel=1e-9)
        assert c.memory_bytes == pytest.approx([se.memory.total for se in est.stages], rel=1e-9)
        seen.add((cp > 1, ep > 1))
        folded.add((any(ep * etp > st.dp * cp for st in stages), etp > 1))
    assert seen == {(False, False), (True, False), (False, True), (True, True)}
    assert {(False, False), (True, False)} <= folded and any(etp for _, etp in folded)
    state = FineState((FineStage(4, 2, 1),), 2, 0, 1, 2)  # EP 2 over TP 2 x DP 1
    assert FineSearch(cm).valid(state) and FineSearch(cm).valid(FineState(state.stages, 2, 0, 1, 2, 2)) is False
    ds = FineCostModel(m, job.model_copy(update={"framework": "deepspeed"}), pool, cat.get("A100-SXM-80GB"))
    assert not FineSearch(ds).valid(state)


def test_cp_and_ep_search_reaches_the_enumerated_optimum(tmp_path):
    """A MoE model at 16K tokens on 4 GPUs: the enumerated space has CP 1/2/4 and EP 1/2/4 states; the search
    (starting from the best uniform plan) ends at the optimum of all of them and reports it through estimate()."""
    path = _moe_config(tmp_path, 3, 4)
    m = load_model(path)
    job = Job(model=str(path), seq_len=16384, global_batch=4, dtype="bf16")
    pool = GPUPool(gpu="A100-SXM-80GB", count=4, gpus_per_node=4)
    cat = load_catalog()
    r = fine_search(job, Inventory(pools=[pool]), catalog=cat, model=m)
    cm = FineCostModel(m, job, pool, cat.get("A100-SXM-80GB"), max_stages=4)
    states = enumerate_states(FineSearch(cm), r.start_plan.num_gpus)
    assert {(s.cp, s.ep) for s in states} >= {(1, 1), (2, 2), (4, 4), (2, 1), (1, 4)}
    best = min(states, key=lambda s: cm.cost(s).key)
    assert cm.cost(best).key[0] == 0
    assert r.estimate.iteration_time_s == pytest.approx(cm.cost(best).iteration_time_s, rel=1e-9)
    assert r.estimate.iteration_time_s <= r.start_estimate.iteration_time_s


def test_profiled_start_point_follows_the_objective(aceso_db):
    """With measured layer times the uniform start points are re-ranked on them, but by iteration time whatever
    the objective: under ``cheapest`` on 16 V100s the search started from a 16-GPU plan at $0.2534 per job over
    the 8-GPU plan at $0.2504, and it keeps its start's GPUs."""
    from hetplan.estimate.estimator import estimate_many
    from hetplan.search.objective import Objective

    job = Job(model=str(ACESO_13), seq_len=2048, global_batch=512, train_iterations=1, dtype="fp16",
              attention="standard")
    inv = Inventory(pools=[GPUPool(gpu=V100, count=16, gpus_per_node=4, price_usd_per_hour=3.9)])
    cat = with_gpu_memory(load_catalog(), V100, 12000 * 2**20)
    m = load_model(ACESO_13)
    obj = Objective(goal="cheapest")
    uniform = search_plans(job, inv, obj, top_k=8, catalog=cat)
    ests = estimate_many([rp.plan for rp in uniform.plans], cat, m, aceso_db)
    cheapest = min(e.job_usd for e in ests if e.fits)
    r = fine_search(job, inv, obj, catalog=cat, model=m, profiles=aceso_db, uniform=uniform)
    assert r.start_estimate.job_usd == pytest.approx(cheapest, rel=1e-12)
    assert r.estimate.job_usd <= cheapest


def test_mixed_pool_plans_are_no_start_points():
    """On FASOP's A100 + A10G inventory the best uniform plan mixes pools: `plan --search fine` said "start:
    fine-grained search starts from a one-pool 1F1B plan; fix: give a plan whose stages share one pool", a field
    and a fix the command does not have. It names --search and --no-hetero now; and a mixed-pool runner-up
    behind a one-pool best (which failed the same way) is skipped."""
    from hetplan.jobfile import load_job_file

    root = Path(__file__).resolve().parents[2]
    r = _cli("plan", root / "examples" / "fasop_gpt2xl.toml", "--search", "fine", "-q")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "error: --search:" in r.stderr and "--no-hetero" in r.stderr
    d = load_job_file(root / "examples" / "fasop_gpt2xl.toml")
    job, inv = Job(**d["job"]), Inventory(pools=d["inventory"])
    mixed = search_plans(job, inv, top_k=2)
    one = search_plans(job, inv, top_k=1, heterogeneous=False)
    assert len({st.pool for st in mixed.plans[0].plan.stages}) > 1
    uniform = one.model_copy(update={"plans": [one.plans[0], *mixed.plans]})
    res = fine_search(job, inv, uniform=uniform, budget_evaluations=200)
    assert len({st.pool for st in res.plan.stages}) == 1
    assert res.estimate.iteration_time_s <= one.plans[0].estimate.iteration_time_s
