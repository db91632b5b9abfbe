"""Phillips–Dessouky solver: brute force on tiny pipelines, max-flow backends, termination."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from hetplan.energy.dag import build_pipeline_dag
from hetplan.energy.frontier import compute_frontier
from hetplan.energy.maxflow import min_cut_source_side
from hetplan.energy.profile import parse_stage_profile


def synthetic_profile(num_stages: int, rng: np.random.Generator, levels: int = 4) -> str:
    rows = ["stage,instruction,frequency,time,energy"]
    for s in range(num_stages):
        for inst, base in (("forward", 10), ("backward", 20)):
            t0 = base + int(rng.integers(0, 4))
            e0 = float(rng.uniform(20, 40))
            slope = float(rng.uniform(0.2, 0.5))
            for k in range(levels):  # k = 0 fastest: 1 ms slower per level, energy convex-decreasing
                t = (t0 + k + 0.5) / 1000
                e = e0 * np.exp(-slope * k) + 5 + 0.15 * t0
                rows.append(f"{s},{inst},{1500 - 100 * k},{float(t)!r},{float(e)!r}")
    return "\n".join(rows) + "\n"


def brute_force(frontier):
    """Least model energy at every iteration time by enumerating all integer durations."""
    dag, opts = frontier.dag, frontier.options
    spec = 2 * dag.stage + dag.kind
    ranges = [range(opts[k].min_quant, opts[k].max_quant + 1) for k in spec]
    D = np.array(list(itertools.product(*ranges)), dtype=np.int64)  # (K, n)
    ef = np.zeros((D.shape[0], dag.num_ops + 1), np.int64)
    pred = dag.pred_matrix()
    for idx in dag.levels:
        ef[:, idx] = ef[:, pred[idx]].max(axis=2) + D[:, idx]
    T = ef[:, : dag.num_ops].max(axis=1)
    cost = np.zeros(D.shape[0])
    for v in range(dag.num_ops):
        cost += opts[spec[v]].model_energy_j(D[:, v])
    best = {}
    for t in np.unique(T):
        best[int(t)] = float(cost[T <= t].min())
    return best


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("S,M,schedule", [(2, 2, "1f1b"), (2, 2, "gpipe"), (3, 1, "1f1b")])
def test_frontier_is_optimal_on_tiny_pipelines(seed, S, M, schedule):
    rng = np.random.default_rng(seed * 31 + S * 7 + M)
    prof = parse_stage_profile(synthetic_profile(S, rng))
    fr = compute_frontier(prof, M, 50.0, 0.001, schedule)
    best = brute_force(fr)
    P, u = 50.0, 0.001
    assert len(fr) >= 2
    for q, e in zip(fr.result.quant_time, fr.energy_j):
        comp = e - S * P * q * u
        # every visited point is the least-energy schedule for its iteration time
        assert comp == pytest.approx(best[int(q)], rel=1e-6, abs=1e-5)
    # and the solver went all the way to the fastest iteration time
    assert int(fr.result.quant_time[-1]) == min(best)
    assert np.all(np.diff(fr.result.quant_time) == -1)


def random_graph(rng, n, m):
    m = min(m, n * (n - 1) // 2)  # at most one edge per unordered pair
    rows, cols = [], []
    seen = set()
    while len(rows) < m:
        u, v = (int(x) for x in rng.integers(0, n, 2))
        if u != v and (u, v) not in seen and (v, u) not in seen:
            seen.add((u, v))
            rows.append(u)
            cols.append(v)
    return np.array(rows), np.array(cols), rng.integers(1, 50, m)


@pytest.mark.parametrize("seed", range(20))
def test_maxflow_backends_agree(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(4, 30))
    r, c, k = random_graph(rng, n, int(rng.integers(n, 3 * n)))
    f1, s1 = min_cut_source_side(n, r, c, k, 0, n - 1, backend="scipy")
    f2, s2 = min_cut_source_side(n, r, c, k, 0, n - 1, backend="python")
    assert f1 == f2
    assert (s1 == s2).all()  # the minimal minimum cut is unique
    # cut value equals flow value
    cut = sum(int(w) for u, v, w in zip(r, c, k) if s1[u] and not s1[v])
    assert cut == f1


def test_big_capacities_use_exact_python_flow():
    r, c = np.array([0, 1, 0]), np.array([1, 2, 2])
    k = np.array([2**40, 2**35, 5])
    f, side = min_cut_source_side(3, r, c, k, 0, 2)
    assert f == 2**35 + 5
    assert side.tolist() == [True, True, False]


def test_python_backend_same_frontier(gpt_profile):
    a = compute_frontier(gpt_profile, 2, 83.64, 0.001, max_points=60)
    b = compute_frontier(gpt_profile, 2, 83.64, 0.001, maxflow_backend="python", max_points=60)
    assert a.result.quant_time.tolist() == b.result.quant_time.tolist()
    np.testing.assert_allclose(a.energy_j, b.energy_j, rtol=1e-12)


def test_dag_for_solver_is_linear_size():
    d = build_pipeline_dag(16, 64)
    assert d.num_ops == 2048 and len(d.levels) < 2 * (64 + 16) + 2


def test_schedule_implementations_agree(gpt_profile):
    from hetplan.energy.options import build_options
    from hetplan.energy.solver import PhillipsDessoukySolver

    opts = [build_options(gpt_profile.get(s, i), 0.001, 83.64) for s in range(8) for i in ("forward", "backward")]
    solver = PhillipsDessoukySolver(build_pipeline_dag(8, 5), opts, 83.64)
    rng = np.random.default_rng(0)
    for _ in range(5):
        d = rng.integers(solver.qmin, solver.qmax + 1)
        solver._py_sched = True
        a = solver.schedule(d)
        solver._py_sched = False
        b = solver.schedule(d)
        assert a[0] == b[0] and (a[1] == b[1]).all() and (a[2] == b[2]).all()


def dag_network(rng, n, m):
    """A random network whose edges go from lower to higher node ids, source 0 and sink n-1: acyclic, nothing
    enters the source or leaves the sink (like the solver's network)."""
    pairs = {tuple(sorted(int(x) for x in rng.choice(n, 2, replace=False))) for _ in range(m)}
    r, c = (np.array(x) for x in zip(*sorted(pairs)))
    return r, c


@pytest.mark.parametrize("seed", range(10))
@pytest.mark.parametrize("acyclic", [True, False])
def test_static_network_matches_one_shot(seed, acyclic):
    from hetplan.energy.maxflow import StaticNetwork

    rng = np.random.default_rng(100 + seed)
    n = int(rng.integers(4, 25))
    if acyclic:
        r, c = dag_network(rng, n, int(rng.integers(n, 3 * n)))
    else:
        r, c, _ = random_graph(rng, n, int(rng.integers(n, 3 * n)))
    net = StaticNetwork(n, r, c, 0, n - 1)
    if acyclic:
        assert net.warm
    k = rng.integers(0, 30, r.size)
    for _ in range(8):  # successive calls start from the last flow: change some capacities, up and down
        change = rng.random(r.size) < 0.3
        k = np.where(change, rng.integers(0, 30, r.size), k)  # zero capacities allowed
        keep = k > 0
        f1, s1 = net.min_cut(k)
        f2, s2 = min_cut_source_side(n, r[keep], c[keep], k[keep], 0, n - 1, backend="python")
        f3, s3 = net.min_cut(k, backend="python")
        assert f1 == f2 == f3 and (s1 == s2).all() and (s1 == s3).all()
        f = net.flow  # the flow it keeps is a maximum flow: within capacities, conserved
        assert (f >= 0).all() and (f <= k).all()
        bal = np.bincount(c, weights=f, minlength=n) - np.bincount(r, weights=f, minlength=n)
        assert (bal[1:-1] == 0).all() and bal[-1] == f1


def test_solver_network_starts_warm(gpt_profile):
    from hetplan.energy.maxflow import StaticNetwork
    from hetplan.energy.options import build_options
    from hetplan.energy.solver import PhillipsDessoukySolver

    opts = [build_options(gpt_profile.get(s, i), 0.001, 83.64) for s in range(8) for i in ("forward", "backward")]
    assert PhillipsDessoukySolver(build_pipeline_dag(8, 4), opts, 83.64).net.warm
    # a cycle 1 → 2 → 3 → 1 between the terminals: every call starts from zero
    assert not StaticNetwork(5, np.array([0, 1, 2, 3, 3]), np.array([1, 2, 3, 1, 4]), 0, 4).warm


def test_replay_longest_path_list_and_numpy_agree(monkeypatch):
    from hetplan.energy import dag as dag_mod
    from hetplan.energy.simulate import longest_path_s

    d = build_pipeline_dag(6, 9, "gpipe")
    x = np.random.default_rng(1).uniform(0.01, 0.2, d.num_ops)
    a = longest_path_s(d, x)
    monkeypatch.setattr(dag_mod.PipelineDAG, "narrow", property(lambda self: False))
    b = longest_path_s(d, x)
    assert a[0] == b[0] and np.allclose(a[1], b[1]) and np.allclose(a[2], b[2])


@pytest.mark.parametrize("schedule,S,M,v", [("1f1b", 6, 9, 1), ("gpipe", 4, 5, 1), ("interleaved", 4, 8, 2)])
def test_envpipe_critical_path_updates_match_full_passes(schedule, S, M, v):
    """The incremental critical path (one duration changed at a time, only the layers a change reaches
    recomputed) gives the same iteration time and earliest finishes (bit for bit) and latest starts as a full
    longest-path pass after every change."""
    from hetplan.energy.dag import CriticalPath
    from hetplan.energy.simulate import longest_path_s

    d = build_pipeline_dag(S, M, schedule, v)
    rng = np.random.default_rng(3)
    x = rng.uniform(0.01, 0.2, d.num_ops)
    path = CriticalPath(d, x)
    for _ in range(60):
        i = int(rng.integers(d.num_ops))
        x[i] = rng.uniform(0.005, 0.2) if rng.random() < 0.5 else x[i] * 0.9  # up and down
        path.set(i, float(x[i]))
        T, ef, ls = longest_path_s(d, x)
        T2, ef2, ls2 = path.times()
        assert T2 == T and (ef2 == ef).all()
        np.testing.assert_allclose(ls2, ls, atol=1e-12)


def test_envpipe_same_without_fixed_arity_pairs(gpt_profile, monkeypatch):
    """The full-recomputation path (DAGs without ``topo_pairs``) picks the same plan."""
    from hetplan.energy import baselines as B
    from hetplan.energy import dag as dag_mod

    a = B.envpipe(gpt_profile, build_pipeline_dag(8, 6), 83.64)
    monkeypatch.setattr(dag_mod.PipelineDAG, "topo_pairs", property(lambda self: None))
    b = B.envpipe(gpt_profile, build_pipeline_dag(8, 6), 83.64)
    assert (a.frequency_mhz == b.frequency_mhz).all() and a.energy_j == b.energy_j


def test_baselines_in_background_are_the_baselines(gpt_profile):
    """The CLI's child-process baselines equal the in-process ones; a failure over there is raised here."""
    from hetplan.energy import baselines as B
    from hetplan.errors import HetplanError

    dag = build_pipeline_dag(8, 4)
    assert B.summary_entries_in_background(gpt_profile, dag, 83.64)() == B.summary_entries(gpt_profile, dag, 83.64)
    with pytest.raises(HetplanError):  # 9 stages, the profile has 8
        B.summary_entries_in_background(gpt_profile, build_pipeline_dag(9, 4), 83.64)()


def test_large_flow_values_stay_on_the_compiled_max_flow(gpt_profile, monkeypatch):
    """The folded formulation's flow carries Σ lb of every critical instruction; above int32 (2,147 J in µJ)
    that is no infinite edge crossed. Scaling a real profile's energies by 1,000 puts Σ lb above int32 within a
    few steps: the frontier must equal the exact Python flow's without ever calling it (it took 107 of 2,000
    steps and 93 % of the GPT-3 175B plan's frontier time before)."""
    from hetplan.energy import maxflow

    text = gpt_profile.to_csv().splitlines()
    rows = [text[0]] + [",".join(r.split(",")[:4] + [repr(float(r.split(",")[4]) * 1000)]) for r in text[1:]]
    big = parse_stage_profile("\n".join(rows) + "\n")
    exact = compute_frontier(big, 12, 83.64e3, 0.001, maxflow_backend="python", max_points=60)
    calls = []
    real = maxflow._python_dinic
    monkeypatch.setattr(maxflow, "_python_dinic", lambda *a: calls.append(1) or real(*a))
    fast = compute_frontier(big, 12, 83.64e3, 0.001, max_points=60)
    assert np.array_equal(fast.result.quant_time, exact.result.quant_time)
    np.testing.assert_allclose(fast.energy_j, exact.energy_j, rtol=1e-12)
    assert calls == []
