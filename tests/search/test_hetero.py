"""Heterogeneous search: exact partition and allocation against brute force on many random small instances,
agreement with the estimator, and the Espresso example."""

from __future__ import annotations

import itertools
import math
import random
from pathlib import Path

import numpy as np
import pytest

from hetplan.estimate.estimator import estimate
from hetplan.hardware.catalog import load_catalog
from hetplan.model.spec import ModelSpec
from hetplan.plan import GPUPool, Inventory, Job, Plan, Stage, boundary_is_intra_node, pools_fill_whole_hosts
from hetplan.search import hetero
from hetplan.search.hetero.group import Group
from hetplan.search.hetero.tables import stage_positions
from hetplan.search.partition import brute_force_partition, solve_partition
from hetplan.search.space import RECOMPUTE_NAMES, Pins, divisors

ROOT = Path(__file__).resolve().parents[2]
CAT = load_catalog()
GPU_CHOICES = ["T4", "RTX-3090", "RTX-A6000", "A100-SXM-40GB", "A10G", "V100-SXM-32GB", "RTX-A4000"]


def small_model(rng: random.Random, L: int) -> ModelSpec:
    h = rng.choice([2048, 3072, 4096])
    a = rng.choice([16, 32])
    return ModelSpec(
        name=f"toy-L{L}-h{h}", family="llama", num_layers=L, hidden_size=h, num_attention_heads=a, num_kv_heads=a,
        head_dim=h // a, ffn_hidden_size=rng.choice([2, 3, 4]) * h, vocab_size=32000, max_seq_len=8192,
        gated_mlp=True, norm="rmsnorm", linear_bias=False, learned_positions=0, tied_embeddings=False, dropout=False,
    )


def random_instance(seed: int):
    rng = random.Random(seed)
    L = rng.randint(3, 12)
    m = small_model(rng, L)
    k = rng.randint(1, 3)
    gpus = rng.sample(GPU_CHOICES, k)
    total = rng.randint(k, 8)
    counts = [1] * k
    for _ in range(total - k):
        counts[rng.randrange(k)] += 1
    pools = [
        GPUPool(gpu=g, count=c, gpus_per_node=rng.choice([1, 2, 4]), price_usd_per_hour=round(rng.uniform(0.5, 5), 2),
                inter_node_bandwidth_bytes_per_s=rng.choice([1.25e9, 3.125e9, 12.5e9]))
        for g, c in zip(gpus, counts)
    ]
    job = Job(model=m.name, seq_len=rng.choice([512, 1024, 2048, 4096]), global_batch=rng.choice([4, 8, 16]), dtype="fp16")
    return m, job, Inventory(pools=pools), rng


def pool_choices(g, k, pool, d):
    """Every use of pool ``k`` the space allows: unused, ``s`` stages of one TP degree, or as many stages of TP
    ``tp_a`` as fit plus stages of a smaller ``tp_b`` on exactly all the GPUs left over."""
    tps = sorted(st.tp for st in g.types if st.pool == k)
    out = [()]
    for ta in tps:
        for sa in range(1, pool.count // (ta * d) + 1):
            out.append(((ta, sa),))
            for tb in tps:
                for sb in range(1, 64):
                    used = (sa * ta + sb * tb) * d
                    if tb < ta and used == pool.count and pool.count - sa * ta * d < ta * d:
                        out.append(((ta, sa), (tb, sb)))
    return out


def block_orders(blocks):
    """Every stage order of the space as (pool, tp) per stage: pools contiguous in any order, a pool's two TP
    sub-blocks in either order."""
    pools = sorted({k for k, _ in blocks})
    seen = set()
    for perm in itertools.permutations(blocks):
        seq = tuple((k, t) for k, (t, s) in perm for _ in range(s))
        runs = [k for i, (k, _) in enumerate(seq) if i == 0 or seq[i - 1][0] != k]
        if len(runs) == len(pools) and seq not in seen:  # each pool one contiguous run
            seen.add(seq)
            yield list(seq)


def block_orders_of_space(m, job, inv, pins=Pins()):
    """Every stage order of the space of :mod:`hetplan.search.hetero`: for every (d, b, zero), every use of each
    pool (:func:`pool_choices`) and every order of the (pool, TP) blocks, yields ``(group, b, d, zero, $/h, seq,
    kinds, in_flight, tables, p2p)`` — the stage types in order, their position kinds and in-flight counts, their cost
    tables and the order's round-trip p2p time (boundaries by :func:`hetplan.plan.boundary_is_intra_node`)."""
    L = m.num_layers
    types = hetero.stage_types(m, inv, CAT, job.dtype, pins)
    # CP: powers of two splitting the sequence into 2·cp chunks of >= 4096 tokens per rank; EP: divisors of the
    # expert count dividing dp·cp (the space's rules, hetplan.search.space).
    cps = [c for c in (1, 2, 4, 8) if c == 1 or (job.seq_len % (2 * c) == 0 and job.seq_len // c >= 4096
                                                 and c <= max(pl.count for pl in inv.pools))]
    for d in divisors(job.global_batch):
        for b in divisors(job.global_batch // d):
            for z, c in itertools.product((0, 1), cps):
                if z == 1 and d == 1:
                    continue
                for e in ([1] if not m.is_moe else [e for e in divisors(m.num_experts) if (d * c) % e == 0]):
                    yield from _orders_of_group(m, job, inv, types, L, b, d, z, c, e)


def _orders_of_group(m, job, inv, types, L, b, d, z, c, e):
    g = Group(m, job, inv, types, b, d, z, [0, 1, 2], L, c, e)
    if not g.types:
        return
    per_pool = [pool_choices(g, k, pool, d * c) for k, pool in enumerate(inv.pools)]
    for choice in itertools.product(*per_pool):
        blocks = [(k, sub) for k, subs in enumerate(choice) for sub in subs]
        if not blocks or sum(s for _, (t, s) in blocks) > L:
            continue
        used = [sum(s * t * c * d for kk, (t, s) in blocks if kk == k) for k in range(len(inv.pools))]
        if not pools_fill_whole_hosts(used, [pl.launch_gpus for pl in inv.pools]):  # what a launch can start
            continue
        rate = sum(s * t * c * d * g.by_key[(k, t)].price_usd_per_hour for k, (t, s) in blocks)
        for perm in block_orders(blocks):
            seq = [g.by_key[(k, t)] for k, t in perm]
            p = len(seq)
            kinds, fl = stage_positions(p, g.mb)
            tabs = [g.tables[(st.pool, st.tp)] for st in seq]
            intra = boundary_is_intra_node([st.tp * c * d for st in seq], [st.pool for st in seq],
                                           [pl.gpus_per_node for pl in inv.pools])
            p2p = 2 * sum(g.p2p(seq[j], seq[j + 1], intra[j]) for j in range(p - 1))
            yield g, b, d, z, rate, seq, kinds, fl, tabs, p2p


def brute_force(m, job, inv, pins=Pins()):
    """Every plan of the space of :mod:`hetplan.search.hetero` (:func:`block_orders_of_space`), every composition
    of the layers — the partition by enumeration. Returns a list of (T, $/h, description)."""
    out = []
    for g, b, d, z, rate, seq, kinds, fl, tabs, p2p in block_orders_of_space(m, job, inv, pins):
        a = np.array([tb.a[kk, f - 1] for tb, kk, f in zip(tabs, kinds, fl)])
        e = np.array([tb.e[kk, f - 1] for tb, kk, f in zip(tabs, kinds, fl)])
        o = np.array([tb.o[kk, f - 1] for tb, kk, f in zip(tabs, kinds, fl)])
        nmax = [int(tb.nmax[kk, f - 1]) for tb, kk, f in zip(tabs, kinds, fl)]
        res = brute_force_partition(a, e, o, nmax, m.num_layers, g.mb, p2p)
        if res is not None:
            out.append((res[0], rate, (b, d, z, g.cp, g.ep, [(st.pool, st.tp) for st in seq], res[1])))
    return out


def test_partition_matches_brute_force():
    rng = np.random.default_rng(0)
    for trial in range(300):
        p = int(rng.integers(1, 6))
        L = int(rng.integers(p, 13))
        slope = rng.uniform(0.5, 3.0, size=(p, 1))
        base = rng.uniform(0, 2, size=(p, 1))
        n = np.arange(L + 1)[None, :]
        a = base + slope * n + np.where(rng.random((p, 1)) < 0.3, rng.uniform(0, 2) * (n > rng.integers(1, L + 1)), 0)
        e = rng.uniform(0, 1, size=(p, L + 1)) * (rng.random() < 0.5)
        o = np.sort(rng.uniform(0, 0.5, size=(p, L + 1)), axis=1)
        nmax = rng.integers(0, L + 1, size=p)
        m = int(rng.integers(1, 9))
        ref = brute_force_partition(a, e, o, nmax, L, m, 0.3)
        got = solve_partition(a, e, o, nmax, L, m, 0.3)
        if ref is None:
            assert got is None, trial
        else:
            assert got is not None and math.isclose(got[0], ref[0], rel_tol=1e-12), (trial, got, ref)
            if ref[0] * 1.0001 < math.inf:  # an upper bound just above the optimum keeps it, at it drops it
                assert solve_partition(a, e, o, nmax, L, m, 0.3, upper_bound=ref[0] * (1 + 1e-9)) is not None
                assert solve_partition(a, e, o, nmax, L, m, 0.3, upper_bound=ref[0] * (1 - 1e-9)) is None


SEEDS = range(40)


@pytest.mark.parametrize("seed", SEEDS)
def test_search_finds_brute_force_optimum(seed):
    m, job, inv, rng = random_instance(seed)
    plans = brute_force(m, job, inv)
    fast = hetero.search_hetero(m, job, inv, CAT, goal="fastest")
    if not plans:
        assert fast.best is None
        return
    t_best = min(t for t, _, _ in plans)
    assert fast.best is not None and math.isclose(fast.best.iteration_time_s, t_best, rel_tol=1e-9)
    # Cheapest under an SLO between the fastest and the slowest plan.
    slo = t_best * rng.uniform(1.0, 3.0)
    ok = [(t * r / 3600, t) for t, r, _ in plans if t <= slo]
    cheap = hetero.search_hetero(m, job, inv, CAT, goal="cheapest", slo_iteration_s=slo)
    assert math.isclose(cheap.best.usd_per_iteration, min(ok)[0], rel_tol=1e-9)
    assert cheap.best.iteration_time_s <= slo
    # Fastest under a budget.
    c_min = min(t * r / 3600 for t, r, _ in plans)
    budget = c_min * rng.uniform(1.0, 2.0)
    ok = [t for t, r, _ in plans if t * r / 3600 <= budget]
    fb = hetero.search_hetero(m, job, inv, CAT, goal="fastest", budget_usd_per_iteration=budget)
    assert math.isclose(fb.best.iteration_time_s, min(ok), rel_tol=1e-9)
    # The whole Pareto frontier (time, $ per iteration).
    pts = sorted((t, t * r / 3600) for t, r, _ in plans)
    ref, c_run = [], math.inf
    for t, c in pts:
        if c < c_run * (1 - 1e-12):
            ref.append((t, c))
            c_run = c
    par = hetero.search_hetero(m, job, inv, CAT, goal="pareto")
    got = [(f.iteration_time_s, f.usd_per_iteration) for f in par.frontier]
    assert len(got) == len(ref), (got, ref)
    for (t1, c1), (t2, c2) in zip(got, ref):
        assert math.isclose(t1, t2, rel_tol=1e-9) and math.isclose(c1, c2, rel_tol=1e-9)


def moe_instance(seed: int):
    """A small MoE model (4 or 8 experts, top-2) with sequences long enough for CP 2-4, on 1-2 pools of 2-8
    GPUs: a case whose space has CP and EP > 1."""
    rng = random.Random(seed)
    L = rng.randint(2, 4)
    h, a = 1024, 8
    m = ModelSpec(
        name=f"toy-moe-L{L}", family="qwen3_moe", num_layers=L, hidden_size=h, num_attention_heads=a, num_kv_heads=a,
        head_dim=h // a, ffn_hidden_size=2 * h, vocab_size=32000, max_seq_len=65536, gated_mlp=True, norm="rmsnorm",
        linear_bias=False, learned_positions=0, tied_embeddings=False, dropout=False,
        num_experts=rng.choice([4, 8]), experts_per_token=2, expert_ffn_hidden_size=h,
    )
    k = rng.randint(1, 2)
    pools = [GPUPool(gpu=g, count=rng.choice([2, 4, 8]), gpus_per_node=rng.choice([2, 4]),
                     price_usd_per_hour=round(rng.uniform(0.5, 5), 2), inter_node_bandwidth_bytes_per_s=12.5e9)
             for g in rng.sample(["A100-SXM-80GB", "RTX-A6000", "A10G"], k)]
    job = Job(model=m.name, seq_len=rng.choice([8192, 16384]), global_batch=rng.choice([2, 4]), dtype="bf16")
    return m, job, Inventory(pools=pools)


@pytest.mark.parametrize("seed", range(4))
def test_search_finds_brute_force_optimum_with_cp_and_ep(seed):
    """CP and EP are dimensions of the heterogeneous space: the search's fastest plan is the brute-force optimum
    over every (dp, mbs, ZeRO, CP, EP, pool use, order, partition), and its CP/EP reach the plan and estimate()."""
    m, job, inv = moe_instance(seed)
    plans = brute_force(m, job, inv)
    assert {(x[2][3], x[2][4]) for x in plans} - {(1, 1)}, "the instance has plans with CP or EP > 1"
    fast = hetero.search_hetero(m, job, inv, CAT, goal="fastest")
    t_best = min(t for t, _, _ in plans)
    assert fast.best is not None and math.isclose(fast.best.iteration_time_s, t_best, rel_tol=1e-9)
    plan = fast.best.to_plan(job, inv)
    assert (plan.cp, plan.ep) == (fast.best.cp, fast.best.ep)
    assert fast.best.num_gpus == sum(st.tp * plan.cp * st.dp for st in plan.stages)
    est = estimate(plan, CAT, m, pipeline_model="closed_form")
    assert math.isclose(est.iteration_time_s, fast.best.iteration_time_s, rel_tol=1e-9)
    pinned = hetero.search_hetero(m, job, inv, CAT, goal="fastest", pins=Pins(cp=2, ep=2))
    want = [t for t, _, x in plans if (x[3], x[4]) == (2, 2)]
    assert (pinned.best is None) == (not want)
    if want:
        assert (pinned.best.cp, pinned.best.ep) == (2, 2)
        assert math.isclose(pinned.best.iteration_time_s, min(want), rel_tol=1e-9)


@pytest.mark.parametrize("seed", range(8))
def test_reported_time_is_the_estimators(seed):
    m, job, inv, _ = random_instance(100 + seed)
    res = hetero.search_hetero(m, job, inv, CAT, goal="pareto")
    for c in res.frontier[:5]:
        # The search optimises the estimator's closed form (hetplan.estimate.pipeline); the default estimate
        # event-simulates the schedule and is reported after re-estimation.
        est = estimate(c.to_plan(job, inv), CAT, m, pipeline_model="closed_form")
        assert est.fits
        assert math.isclose(est.iteration_time_s, c.iteration_time_s, rel_tol=1e-9)
        assert math.isclose(est.usd_per_iteration, c.usd_per_iteration, rel_tol=1e-9)


@pytest.mark.parametrize("seed", range(3))
def test_lightest_recompute_is_optimal(seed):
    """Against estimate() on every plan of a tiny instance, every recomputation of every stage included."""
    rng = random.Random(500 + seed)
    m = small_model(rng, 4)
    inv = Inventory(pools=[GPUPool(gpu="T4", count=2, gpus_per_node=2, price_usd_per_hour=0.5),
                           GPUPool(gpu="RTX-3090", count=1, gpus_per_node=1, price_usd_per_hour=1.0)])
    job = Job(model=m.name, seq_len=2048, global_batch=4, dtype="fp16")
    best = math.inf
    stage_opts = [(0, 1), (1, 1)]
    for p in (1, 2, 3):
        for seq in itertools.product(stage_opts, repeat=p):
            if sum(1 for s in seq if s[0] == 0) > 2 or sum(1 for s in seq if s[0] == 1) > 1:
                continue
            pools_in = [s[0] for s in seq]
            if any(pools_in[i] != pools_in[i + 1] and pools_in[i] in pools_in[i + 2:] for i in range(p - 1)):
                continue  # blocks of one pool are contiguous in the space
            for cuts in itertools.combinations(range(1, 4), p - 1):
                ns = [b - a for a, b in zip((0,) + cuts, cuts + (4,))]
                for rcs in itertools.product(RECOMPUTE_NAMES, repeat=p):
                    for b in divisors(4):
                        plan = Plan(job=job, pools=inv.pools, mbs=b, zero=0, sequence_parallel=True,
                                    stages=[Stage(pool=k, tp=t, dp=1, num_layers=n, recompute=r)
                                            for (k, t), n, r in zip(seq, ns, rcs)])
                        est = estimate(plan, CAT, m, pipeline_model="closed_form")
                        if est.fits_footprint:
                            best = min(best, est.iteration_time_s)
    res = hetero.search_hetero(m, job, inv, CAT, goal="fastest", pins=Pins(dp=1, tp=1))
    if best == math.inf:
        assert res.best is None
    else:
        assert math.isclose(res.best.iteration_time_s, best, rel_tol=1e-9)


def test_intra_node_matches_plan():
    m, job, inv, _ = random_instance(7)
    types = hetero.stage_types(m, inv, CAT, job.dtype, Pins())
    g = Group(m, job, inv, types, 1, 1, 0, [0, 1, 2], m.num_layers)
    rng = random.Random(1)
    for _ in range(50):
        seq = [rng.choice(g.types) for _ in range(rng.randint(1, 6))]
        assert g.intra_node(seq) == boundary_is_intra_node(
            [st.tp for st in seq], [st.pool for st in seq], [pl.gpus_per_node for pl in inv.pools])


def test_c_min_of_a_group_without_stage_types_is_zero_and_it_has_no_allocation():
    """A group whose width ``cp·d`` exceeds every pool has no stage type; its boundary bound is 0 (was: "min() arg
    is an empty sequence") and it has no allocation."""
    m, job, inv, _ = random_instance(0)
    types = hetero.stage_types(m, inv, CAT, job.dtype, Pins())
    g = Group(m, job, inv, types, 1, 1 + max(p.count for p in inv.pools), 0, [0, 1, 2], m.num_layers)
    assert types and not g.types
    assert g.c_min() == 0.0
    opts, idx, p, gpus, rate, t_lb, t_sim = hetero.allocation_bounds(g, Pins(), return_sim=True)
    assert idx.shape == (0, len(inv.pools)) and len(p) == len(gpus) == len(rate) == len(t_lb) == len(t_sim) == 0
