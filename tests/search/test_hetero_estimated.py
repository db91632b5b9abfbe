"""The heterogeneous search is exact by :func:`estimate` itself over its candidate set H (each GPU allocation's
closed-form-optimal plan), checked against brute force on many small random instances: every allocation, every
block order, every composition of the layers; every closed-form-optimal plan of an allocation (ties included) is
estimated, since the search may pick any of them."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from hetplan.estimate.estimator import estimate, estimate_detailed
from hetplan.search import hetero
from hetplan.search.homogeneous import stage_chain_lower_bound_s
from hetplan.search.objective import Objective, estimate_keys
from tests.search.test_hetero import CAT, block_orders_of_space, random_instance


def brute_force_h(m, job, inv):
    """For each allocation: a list of ``(plan, estimate)`` of its closed-form-optimal plans (ties included)."""
    L = m.num_layers
    by_allocation: dict = {}  # (b, d, zero, blocks) -> [(T, stages)]
    for g, b, d, z, rate, seq, kinds, fl, tabs, p2p in block_orders_of_space(m, job, inv):
        blocks = tuple(sorted((st.pool, st.tp) for st in seq))
        plans = by_allocation.setdefault((b, d, z, g.cp, g.ep, blocks, rate), [])
        for cuts in itertools.combinations(range(1, L), len(seq) - 1):
            ns = [y - x for x, y in zip((0,) + cuts, cuts + (L,))]
            if any(n > tb.nmax[kk, f - 1] for tb, kk, f, n in zip(tabs, kinds, fl, ns)):
                continue
            a = [tb.a[kk, f - 1, n] for tb, kk, f, n in zip(tabs, kinds, fl, ns)]
            e = [tb.e[kk, f - 1, n] for tb, kk, f, n in zip(tabs, kinds, fl, ns)]
            o = [tb.o[kk, f - 1, n] for tb, kk, f, n in zip(tabs, kinds, fl, ns)]
            t = sum(a) + p2p + (g.mb - 1) * max(a) + max(e) + max(o)
            rcs = [int(tb.rc[kk, f - 1, n]) for tb, kk, f, n in zip(tabs, kinds, fl, ns)]
            plans.append((t, [(st.pool, st.tp, n, rc) for st, n, rc in zip(seq, ns, rcs)]))
    out = []
    for (b, d, z, cp, ep, _, rate), plans in by_allocation.items():
        if not plans:
            continue
        t_min = min(t for t, _ in plans)
        tied = []
        for t, stages in plans:
            if t <= t_min * (1 + 1e-12):
                c = hetero.HeteroCandidate(stages, b, d, z, t, rate, cp, ep)
                plan = c.to_plan(job, inv)
                tied.append((plan, estimate(plan, CAT, m)))
        out.append(tied)
    return out


def objectives(rng, h, iterations):
    """Fastest, cheapest under an iteration SLO, fastest under a job budget (constraints drawn from H)."""
    ests = [e for tied in h for _, e in tied if e.fits]
    if not ests:
        return [Objective(goal="fastest")]
    t_best = min(e.iteration_time_s for e in ests)
    c_best = min(e.job_usd for e in ests)
    return [Objective(goal="fastest"),
            Objective(goal="cheapest", slo_iteration_s=t_best * rng.uniform(1.0, 3.0)),
            Objective(goal="budget", budget_usd=c_best * rng.uniform(1.0, 2.0))]


def check_instance(seed: int):
    m, job, inv, rng = random_instance(seed)
    h = brute_force_h(m, job, inv)
    for obj in objectives(rng, h, job.iterations()):
        res = hetero.search_hetero_estimated(m, job, inv, CAT, obj, top_k=3)
        assert res.complete
        # The search may pick any closed-form-optimal plan of an allocation: the best of H is at most the least,
        # over allocations, of the worst estimate among its ties.
        worst = []
        for tied in h:
            keys = [estimate_keys(obj, e) for _, e in tied]
            worst.append(math.inf if any(k is None for k in keys) else max(k[0] for k in keys))
        ref = min(worst, default=math.inf)
        if not res.top:
            assert ref == math.inf, (seed, obj)
            continue
        got = res.top[0]
        again = estimate(got.plan, CAT, m)
        assert math.isclose(again.iteration_time_s, got.estimate.iteration_time_s, rel_tol=1e-12)
        key = estimate_keys(obj, again)
        assert key is not None and key[0] <= ref * (1 + 1e-9), (seed, obj, key, ref)
        for ep in res.evaluated:  # the bound that admitted each plan is a lower bound of its estimate
            assert ep.lower_bound_s <= ep.estimate.iteration_time_s * (1 + 1e-9)
    # Pareto: every allocation has a closed-form-optimal plan that a frontier point weakly dominates.
    fr = hetero.search_hetero_estimated(m, job, inv, CAT, Objective(), pareto=True)
    assert fr.complete
    pts = [(f.estimate.iteration_time_s, f.estimate.usd_per_iteration) for f in fr.frontier]
    for i, (t1, c1) in enumerate(pts):
        assert not any((t2 <= t1 and c2 <= c1) for j, (t2, c2) in enumerate(pts) if j != i)
    for tied in h:
        fits = [e for _, e in tied if e.fits]
        if len(fits) < len(tied) or not fits:
            continue
        assert any(any(t <= e.iteration_time_s * (1 + 1e-9) and c <= e.usd_per_iteration * (1 + 1e-9)
                       for t, c in pts) for e in fits), seed


@pytest.mark.parametrize("seed", range(12))
def test_estimated_search_matches_brute_force(seed):
    check_instance(seed)


@pytest.mark.parametrize("seed", range(20))
def test_chain_bound_below_estimate(seed):
    """stage_chain_lower_bound_s on the search's own stage costs never exceeds estimate(), on random plans of
    random instances (uneven splits, mixed pools)."""
    m, job, inv, rng = random_instance(300 + seed)
    res = hetero.search_hetero(m, job, inv, CAT, goal="pareto")
    for c in res.candidates[:6]:
        plan = c.to_plan(job, inv)
        est, _, costs, p2p = estimate_detailed(plan, CAT, m)
        f = np.array([s.forward_s + s.backward_s for s in est.stages])
        e = np.array([s.dp_exposed_s for s in est.stages])
        o = np.array([float(cc.optimizer_s) for cc in costs])
        lb = stage_chain_lower_bound_s(f, p2p, plan.num_microbatches(0), e, o)
        assert lb <= est.iteration_time_s * (1 + 1e-9), (seed, lb, est.iteration_time_s)


@pytest.mark.parametrize("seed", range(10))
def test_order_bound_below_estimate_of_every_split(seed):
    """Group.order_lower_bound_s of a stage order never exceeds estimate() of any layer split of that order (with
    each stage's lightest fitting recomputation), on random instances (mixed pools, memory limits, slow links)."""
    m, job, inv, rng = random_instance(500 + seed)
    L = m.num_layers
    orders = list(block_orders_of_space(m, job, inv))
    checked, tight = 0, 0.0
    for g, b, d, z, rate, seq, kinds, fl, tabs, p2p in rng.sample(orders, min(6, len(orders))):
        bound = g.order_lower_bound_s(seq)
        splits = list(itertools.combinations(range(1, L), len(seq) - 1))
        for cuts in rng.sample(splits, min(25, len(splits))):
            ns = [y - x for x, y in zip((0,) + cuts, cuts + (L,))]
            if any(n > tb.nmax[kk, f - 1] for tb, kk, f, n in zip(tabs, kinds, fl, ns)):
                continue
            rcs = [int(tb.rc[kk, f - 1, n]) for tb, kk, f, n in zip(tabs, kinds, fl, ns)]
            c = hetero.HeteroCandidate([hetero.StageChoice(st.pool, st.tp, n, rc) for st, n, rc in zip(seq, ns, rcs)],
                                       b, d, z, 0.0, rate)
            est = estimate(c.to_plan(job, inv), CAT, m)
            assert bound <= est.iteration_time_s * (1 + 1e-9), (seed, ns, bound, est.iteration_time_s)
            checked += 1
            tight = max(tight, bound / est.iteration_time_s)
    assert checked > 0 and tight > 0.5, (checked, tight)  # compared with real splits, and not vacuous


def test_walk_from_bulk_bounds_ranks_as_the_walk_from_t_sim():
    """With the cut known from the start (incumbents fill the top k, here the worst plans the plain walk estimated),
    the refined and stage-order bounds of every allocation under the cut are computed on arrays before the walk,
    which starts from those alone; the ranking equals that of the walk started from T_SIM (every bound computed
    item by item)."""
    checked = 0
    for seed, obj, k in itertools.product(range(300, 310), (Objective(goal="fastest"), Objective(goal="cheapest")),
                                          (1, 2)):
        m, job, inv, _ = random_instance(seed)
        lazy = hetero.search_hetero_estimated(m, job, inv, CAT, obj, top_k=k, seed=False)
        assert lazy.complete
        key = lambda ep: estimate_keys(obj, ep.estimate)  # noqa: E731
        ranked = sorted((ep for ep in lazy.evaluated if key(ep) is not None), key=key)
        worst = ranked[-k:]
        if len(lazy.top) < k or any(key(w)[0] <= key(lazy.top[-1])[0] for w in worst):
            continue  # too few plans to fill the cut with plans worse than the top k
        bulk = hetero.search_hetero_estimated(m, job, inv, CAT, obj, top_k=k, seed=False,
                                              incumbents=[(w.plan, w.estimate) for w in worst])
        assert bulk.complete
        got = [key(ep)[0] for ep in bulk.top]
        want = [key(ep)[0] for ep in lazy.top]
        assert len(got) == len(want) and all(math.isclose(a, b, rel_tol=1e-12) for a, b in zip(got, want)), (
            seed, obj.goal, k, got, want)
        checked += 1
    assert checked >= 10, checked
