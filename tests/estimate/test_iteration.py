"""The one iteration assembly (hetplan.estimate.iteration): worked example, stage kinds vs stages, simulated
schedule, boundaries vectorised vs one by one."""

import numpy as np
import pytest

from hetplan.estimate.comm import p2p_time_s
from hetplan.estimate.estimator import estimate_detailed, pool_link
from hetplan.estimate.iteration import assemble_iteration, boundary_time_s
from hetplan.estimate.reshard import boundary_transfer_time_s
from hetplan.estimate.schedule import simulate
from hetplan.estimate.stage import Link, boundary_alpha_s, boundary_bandwidth_bytes_per_s, p2p_bytes
from hetplan.calibration.validation import gpt_model, megatron_plan
from hetplan.hardware.catalog import load_catalog
from hetplan.plan import GPUPool


def test_closed_form_worked_example():
    # per-stage f+b = 3, 6, 3 s; m = 4; one-way transfers 0.25 + 0.25 s:
    # T = 12 + 2·0.5 + 3·6 = 31; iteration = 31 + max e 0.3 + max o 0.05; bubble = 31 - 4·6 - 1 = 6.
    it = assemble_iteration([1, 2, 1], [2, 4, 2], [0.1, 0.3, 0.2], [0.05, 0.02, 0.01], 0.5, 4,
                            memory_bytes=[5, 9, 7], capacity_bytes=[10, 8, 10])
    assert it.pipeline_s == pytest.approx(31.0)
    assert it.iteration_s == pytest.approx(31.35)
    assert it.bubble_s == pytest.approx(6.0) and it.p2p_s == pytest.approx(1.0)
    assert it.bottleneck_s == pytest.approx(6.0)
    assert int(it.peak_stage) == 1 and not bool(it.fits)  # 9 of 8 bytes: the middle stage is over


def test_stage_kinds_with_counts_equal_the_stages_spelled_out():
    rng = np.random.default_rng(1)
    for _ in range(50):
        count = rng.integers(0, 4, size=4)
        count[0] = max(count[0], 1)
        f, b, e, o = (rng.uniform(0.1, 2.0, size=4) for _ in range(4))
        m, v, c = int(rng.integers(1, 9)), int(rng.integers(1, 3)), float(rng.uniform(0, 1))
        kinds = assemble_iteration(f, b, e, o, c, m, count=count, virtual_stages=v)
        rep = np.repeat(np.arange(4), count)
        flat = assemble_iteration(f[rep], b[rep], e[rep], o[rep], c, m, virtual_stages=v)
        for k in ("pipeline_s", "bottleneck_s", "bubble_s", "dp_exposed_s", "optimizer_s", "iteration_s"):
            assert getattr(kinds, k) == pytest.approx(getattr(flat, k), rel=1e-12), k


def test_simulated_assembly_waits_for_each_stage_then_the_optimizer():
    f, b, c = [1.0, 1.5, 1.0], [2.0, 3.0, 2.0], [0.2, 0.1]
    e, o = [0.5, 0.0, 4.0], [0.1, 0.3, 0.2]
    sim = simulate(f, b, c, 6, "1f1b")
    it = assemble_iteration(f, b, e, o, sum(c), 6, simulated=(sim.makespan_s, sim.stage_end_s))
    after = max(end + x for end, x in zip(sim.stage_end_s, e))
    assert it.iteration_s == pytest.approx(after + 0.3)
    assert it.dp_exposed_s == pytest.approx(after - sim.makespan_s)
    assert it.pipeline_s == pytest.approx(sim.makespan_s)


def test_estimator_reports_the_assembly():
    m = gpt_model(24, 2048, 16, 1024)
    plan = megatron_plan(m, gpu="A100-SXM-80GB", tp=2, pp=4, dp=1, mbs=1, gbs=32, recompute="full", seq=1024,
                         inter_node_bandwidth_bytes_per_s=100e9)
    est, sim, costs, p2p = estimate_detailed(plan, model=m)
    it = assemble_iteration(*([float(getattr(c, k)) for c in costs] for k in ("forward_s", "backward_s", "dp_exposed_s",
                                                                     "optimizer_s")),
                            sum(p2p), 32, simulated=(sim.makespan_s, sim.stage_end_s))
    assert est.iteration_time_s == pytest.approx(float(it.iteration_s), rel=1e-12)
    assert est.bubble_time_s == pytest.approx(float(it.bubble_s), rel=1e-12)


def test_boundaries_vectorised_equal_one_by_one():
    cat = load_catalog()
    m = gpt_model(24, 2048, 16, 1024)
    links = [pool_link(GPUPool(gpu=g, count=16, gpus_per_node=n, inter_node_bandwidth_bytes_per_s=bw), cat.get(g))
             for g, n, bw in (("A100-SXM-80GB", 8, 100e9), ("A10G", 4, 25e9))]
    rng = np.random.default_rng(3)
    n = 40
    send = [rng.choice([1, 2, 4], n), rng.choice([1, 2], n), rng.choice([1, 2], n), rng.choice([1, 2], n)]
    recv = [np.where(rng.random(n) < 0.5, send[k], rng.choice([1, 2, 4], n)) for k in range(4)]
    recv[1] = send[1]  # one CP degree per plan
    ls, lr = rng.integers(0, 2, n), rng.integers(0, 2, n)
    intra = rng.random(n) < 0.5
    cols = lambda idx: Link(*(np.array([getattr(links[i], f) for i in idx]) for f in Link.__dataclass_fields__))  # noqa: E731
    got = boundary_time_s(m, 1024, send, recv, cols(ls), cols(lr), intra)
    for j in range(n):
        s, r = tuple(int(x[j]) for x in send), tuple(int(x[j]) for x in recv)
        one = boundary_time_s(m, 1024, s, r, links[ls[j]], links[lr[j]], bool(intra[j]))
        assert isinstance(one, float) and got[j] == pytest.approx(one, rel=1e-12)
        bw = float(boundary_bandwidth_bytes_per_s(links[ls[j]], links[lr[j]], s[0] * s[1] * s[2], intra[j]))
        alpha = float(boundary_alpha_s(links[ls[j]], links[lr[j]], intra[j]))
        if (s[0], s[2], s[3]) == (r[0], r[2], r[3]):  # a plain send of the rank's b·(s/cp)·h/t activations
            want = float(p2p_time_s(p2p_bytes(m, s[3], 1024 / s[1], s[0], False), bw, alpha,
                                    efficiency=links[lr[j]].intra_link_efficiency))
        else:
            want = boundary_transfer_time_s(m, 1024, (s[0], s[2], s[3]), (r[0], r[2], r[3]), bw, alpha, links[lr[j]])
        assert one == pytest.approx(want, rel=1e-12)
