"""estimate(): event simulation vs closed form, interleaving, timeline."""

from dataclasses import asdict

import pytest

from hetplan.estimate.estimator import estimate, estimate_detailed
from hetplan.estimate.timeline import draw_timeline, timeline_data
from hetplan.calibration.validation import gpt_model, megatron_plan


def _plan(pp=4, gbs=32, mbs=1, tp=2, dp=1):
    m = gpt_model(24, 2048, 16, 1024)
    return m, megatron_plan(m, gpu="A100-SXM-80GB", tp=tp, pp=pp, dp=dp, mbs=mbs, gbs=gbs, recompute="full",
                            seq=1024, inter_node_bandwidth_bytes_per_s=100e9)


def test_closed_form_and_simulation_agree_closely_for_balanced_plans():
    m, plan = _plan()
    sim = estimate(plan, model=m)
    closed = estimate(plan, model=m, pipeline_model="closed_form")
    assert sim.pipeline_model == "simulate" and closed.pipeline_model == "closed_form"
    assert sim.iteration_time_s == pytest.approx(closed.iteration_time_s, rel=0.03)


def test_single_stage_is_exactly_the_closed_form():
    m, plan = _plan(pp=1, tp=8)
    sim = estimate(plan, model=m)
    closed = estimate(plan, model=m, pipeline_model="closed_form")
    assert sim.iteration_time_s == pytest.approx(closed.iteration_time_s, rel=1e-12)


def test_interleaving_is_faster_and_falls_back_when_not_divisible():
    m, plan = _plan(pp=4, gbs=16)
    plain = estimate(plan, model=m)
    inter = estimate(plan, model=m, virtual_stages=2)
    assert inter.virtual_stages == 2 and inter.bubble_time_s < plain.bubble_time_s
    # faster once the extra chunks' p2p calls (tests/estimate/test_p2p_call.py) are left out: on this small
    # model (0.4 s steps) they cost as much as the halved bubble saves
    from hetplan.estimate.comm import CommConstants
    no_calls = CommConstants(p2p_call_s=0.0)
    assert estimate(plan, model=m, virtual_stages=2, comm_constants=no_calls).iteration_time_s < \
        estimate(plan, model=m, comm_constants=no_calls).iteration_time_s
    assert inter.memory_bytes_per_gpu.activations > plain.memory_bytes_per_gpu.activations
    m, odd = _plan(pp=4, gbs=6)
    assert estimate(odd, model=m, virtual_stages=2).virtual_stages == 1


def test_unknown_pipeline_model_is_an_error():
    from hetplan.errors import HetplanError

    m, plan = _plan()
    with pytest.raises(HetplanError):
        estimate(plan, model=m, pipeline_model="magic")


def test_timeline(tmp_path):
    m, plan = _plan(pp=4, gbs=8)
    est, bars = timeline_data(plan, model=m, virtual_stages=2)
    kinds = {b[1] for b in bars}
    assert {"F", "B", "OPT"} <= kinds
    assert sum(1 for b in bars if b[1] == "F") == 4 * 8 * 2
    assert max(b[5] for b in bars) == pytest.approx(est.iteration_time_s)
    out = draw_timeline(plan, tmp_path / "t.png", model=m)
    assert out.stat().st_size > 1000
    _, sim, _, _ = estimate_detailed(plan, model=m, record=True)
    assert len(sim.ops) == 2 * 4 * 8


def _random_plans(seed, n):
    """Random plans over three GPU types, uneven splits, per-layer recompute, resharding boundaries,
    GPipe / 1F1B / interleaving, two models — the cases estimate_many must batch without changing a number."""
    import random

    from hetplan.model.spec import load_model
    from hetplan.plan import GPUPool, Job, Plan, Stage

    rng = random.Random(seed)
    plans = []
    for _ in range(n):
        model = rng.choice(["gpt3-1.3b", "open_llama_3b_v2"])
        layers = load_model(model).num_layers
        pools = [GPUPool(gpu=g, count=64, gpus_per_node=rng.choice([4, 8]), inter_node_bandwidth_bytes_per_s=bw)
                 for g, bw in zip(rng.sample(["A100-SXM-80GB", "A10G", "RTX-3090"], 2), (12.5e9, 100e9))]
        p = rng.choice([1, 2, 4])
        cuts = sorted(rng.sample(range(1, layers), p - 1))
        sizes = [b - a for a, b in zip([0] + cuts, cuts + [layers])]
        dp, mbs = rng.choice([1, 2]), rng.choice([1, 2])
        stages = [Stage(pool=rng.randrange(2), num_layers=k, tp=rng.choice([1, 2]), dp=dp,
                        recompute=rng.choice(["none", "selective", "full"]),
                        recompute_layers=rng.randint(0, k) if rng.random() < 0.2 else None) for k in sizes]
        plans.append(Plan(job=Job(model=model, seq_len=1024, global_batch=dp * mbs * 4 * p, train_tokens=1e9),
                          pools=pools, stages=stages, mbs=mbs, zero=rng.choice([0, 1]),
                          schedule=rng.choice(["1f1b", "gpipe"]), virtual_stages=rng.choice([1, 2]),
                          sequence_parallel=rng.random() < 0.5))
    return plans


@pytest.mark.parametrize("pipeline_model", ["simulate", "closed_form"])
def test_estimate_many_equals_estimate_plan_by_plan(pipeline_model):
    """Batching (grouped stage costs, one p2p call, simulate_many for >= 16 plans of one shape) changes no
    number beyond float rounding, with and without measured layer times."""
    from hetplan.estimate.estimator import estimate_many

    class Profiles:  # measured times for one GPU type only: rows with and without them in one batch
        def layer_time_s(self, gpu, model, dtype, mbs, seq_len, tp):
            return (1e-3 * mbs / tp, 2.1e-3 * mbs / tp) if gpu == "A10G" else None

    plans = _random_plans(3, 60)
    plans = plans + [next(p for p in _random_plans(4, 40) if p.pp == 1)]  # a plan without boundaries last
    m, base = _plan(pp=4, gbs=32)
    same_shape = [base.model_copy(update={"zero": z}) for z in (0, 1)] * 10  # 20 plans of one shape
    for profiles in (None, Profiles()):
        batch = estimate_many(plans, profiles=profiles, pipeline_model=pipeline_model)
        for plan, got in zip(plans, batch):
            ref = asdict(estimate(plan, profiles=profiles, pipeline_model=pipeline_model))
            _assert_close(asdict(got), ref)
    for plan, got in zip(same_shape, estimate_many(same_shape, model=m, pipeline_model=pipeline_model)):
        _assert_close(asdict(got), asdict(estimate(plan, model=m, pipeline_model=pipeline_model)))


def _assert_close(got, ref):
    if isinstance(ref, dict):
        assert got.keys() == ref.keys()
        for k in ref:
            _assert_close(got[k], ref[k])
    elif isinstance(ref, list):
        assert len(got) == len(ref)
        for a, b in zip(got, ref):
            _assert_close(a, b)
    elif isinstance(ref, float):
        assert got == pytest.approx(ref, rel=1e-12, abs=1e-15)
    else:
        assert got == ref


def test_hfu_counts_recomputation_and_flash_attention_score_recompute():
    """HFU/MFU = hardware/model FLOPs: full recompute adds one forward (Narayanan et al. Eq. 3: 4 vs 3 forwards
    of the layers), selective the attention core 4·b·s²·q per layer, FlashAttention's backward the scores
    2·b·s²·q per layer (and selective adds nothing with flash)."""
    from hetplan.model import counts

    m, plan = _plan(pp=2, gbs=8)
    gbs, s, L = 8, 1024, m.num_layers
    model = float(counts.model_flops_per_iteration(m, gbs, s))
    layer_f = float(counts.layer_forward_flops(m, gbs, s))
    core = 4 * gbs * s * s * m.q_dim
    cases = [("standard", "none", 0.0), ("standard", "selective", core * L), ("standard", "full", layer_f * L),
             ("flash", "none", core / 2 * L), ("flash", "selective", core / 2 * L),
             ("flash", "full", (layer_f + core / 2) * L)]
    for attention, recompute, extra in cases:
        p = plan.model_copy(update={
            "job": plan.job.model_copy(update={"attention": attention}),
            "stages": [st.model_copy(update={"recompute": recompute}) for st in plan.stages]})
        e = estimate(p, model=m)
        assert e.hfu / e.mfu == pytest.approx((model + extra) / model, rel=1e-12), (attention, recompute)


def _on_network(plan, network):
    return plan.model_copy(update={"pools": [p.model_copy(update={"network": network}) for p in plan.pools]})


def test_ethernet_between_nodes():
    """Ethernet (TCP) between nodes: the p2p across a node boundary gets 2/3 of the RDMA bandwidth and 40 µs of
    latency; DP across nodes slows down; a plan inside one node does not change."""
    from hetplan.estimate.stage import p2p_bytes

    m, plan = _plan(pp=4, tp=8, dp=1, gbs=32)  # each stage fills one node: every boundary crosses nodes
    ib, eth = (estimate_detailed(_on_network(plan, n), model=m) for n in ("infiniband", "ethernet"))
    msg = float(p2p_bytes(m, 1, 1024, 8, True))
    per_rank = 100e9 / 8  # the node's NICs shared by its 8 sending GPUs
    assert ib[3][0] == pytest.approx(msg / (per_rank * 0.77) + 8e-6, rel=1e-12)
    assert eth[3][0] == pytest.approx(msg / (per_rank * (0.6 / 0.9) * 0.77) + 40e-6, rel=1e-12)
    assert eth[0].iteration_time_s > ib[0].iteration_time_s
    m, wide = _plan(pp=1, tp=8, dp=4, gbs=32)  # DP across 4 nodes
    assert estimate(_on_network(wide, "ethernet"), model=m).dp_exposed_time_s > \
        estimate(_on_network(wide, "infiniband"), model=m).dp_exposed_time_s
    m, local = _plan(pp=1, tp=2, dp=4, gbs=32)  # 8 GPUs: one node
    a, b = (estimate(_on_network(local, n), model=m) for n in ("infiniband", "ethernet"))
    assert asdict(a) == asdict(b)
