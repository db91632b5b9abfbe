"""Expert parallelism (hetplan.estimate.moe): token counts, grouped GEMMs, all-to-all, MLA GEMMs, sharding."""

import numpy as np
import pytest

from hetplan.degrees import Degrees
from hetplan.estimate import comm, moe
from hetplan.model import counts
from hetplan.model.spec import load_model
from hetplan.estimate.stagework import LayerTerms, Link

LINK = Link.one_node(450e9)  # the TP group in one node, 450 GB/s per direction


def gemm_flops(shapes):
    return sum(2 * M * N * K * batch for M, N, K, batch, *_ in shapes)


@pytest.mark.parametrize("name,ep", [("mixtral-8x7b", 8), ("qwen3-30b-a3b", 16), ("deepseek-v3", 64)])
def test_expert_gemms_over_the_ep_group_are_the_moe_layer_flops(name, ep):
    """At balance (t = 1), the router, the grouped experts of all ``ep`` ranks and the shared experts do the
    MoE layer's forward FLOPs of counts.mlp_forward_flops for the ep ranks' tokens."""
    m = load_model(name)
    b, s = 2, 4096
    shapes = moe.moe_mlp_gemms(m, b, s, 1, ep)
    per_rank = gemm_flops(shapes)
    n_moe, n = m.num_moe_layers, m.num_layers
    dense = 2 * b * s * m.hidden_size * m.ffn_hidden_size * 3
    moe_layer = (counts.mlp_forward_flops(m, b * s) * n - (n - n_moe) * dense) / n_moe
    assert per_rank == pytest.approx(moe_layer, rel=1e-12)


def test_expert_tokens_brute_force_uniform_routing():
    """Route every token of ep ranks to k distinct experts round-robin (perfect balance): each expert gets
    expert_tokens tokens, and imbalance scales the busiest."""
    m = load_model("mixtral-8x7b")  # 8 experts, top-2
    ep, T = 4, 96
    load = np.zeros(m.num_experts)
    for rank in range(ep):
        for tok in range(T):
            for j in range(m.experts_per_token):
                load[(rank * T + tok) * m.experts_per_token % m.num_experts + j] += 1
    assert load.max() == load.min() == moe.expert_tokens(m, T, ep)
    assert moe.expert_tokens(m, T, ep, imbalance=1.25) == 1.25 * load.max()


def test_grouped_gemm_row_efficiency():
    assert moe.grouped_gemm_row_efficiency(128) == 1.0
    assert moe.grouped_gemm_row_efficiency(64) == 0.5
    assert moe.grouped_gemm_row_efficiency(129) == pytest.approx(129 / 256)
    assert moe.grouped_gemm_row_efficiency(0) == 1.0


def brute_alltoall(message_bytes, ep, stride, G, intra, inter):
    """Place ep ranks stride GPUs apart, count bytes to peers in / outside the node; NIC shared by G GPUs."""
    nodes = [(r * stride) // G for r in range(ep)]
    t_in = t_out = 0.0
    for peer in range(1, ep):
        share = message_bytes / ep
        if nodes[peer] == nodes[0]:
            t_in += share / (intra * comm.INTRA_LINK_EFFICIENCY)
        else:
            t_out += share / (inter / G * comm.INTER_LINK_EFFICIENCY)
    return max(t_in, t_out)


@pytest.mark.parametrize("ep,stride", [(2, 1), (8, 1), (4, 2), (16, 1), (32, 2), (64, 8), (8, 8)])
def test_alltoall_matches_brute_force_placement(ep, stride):
    G, intra, inter, msg = 8, 450e9, 400e9, 64e6
    ours = moe.alltoall_time_s(msg, ep, stride, Link(G, intra, inter))
    alpha = comm.ALPHA_INTER_NODE_S if ep * stride > G else comm.ALPHA_INTRA_NODE_S
    assert ours == pytest.approx(brute_alltoall(msg, ep, stride, G, intra, inter) + alpha)


def test_alltoall_across_nodes_costs_more_and_ep1_is_free():
    G, intra, inter, msg = 8, 450e9, 400e9, 64e6
    assert moe.alltoall_time_s(msg, 1, 1, Link(G, intra, inter)) == 0
    inside = moe.alltoall_time_s(msg, 8, 1, Link(G, intra, inter))
    across = moe.alltoall_time_s(msg, 16, 1, Link(G, intra, inter))
    assert across > 3 * inside  # half the bytes leave the node at 1/8 of 400 GB/s vs 450 GB/s NVLink


def test_mla_gemms_are_the_counted_flops():
    m = load_model("deepseek-v3")
    b, s = 1, 4096
    linear, core = moe.mla_gemms(m, b, s, 1)
    assert gemm_flops(linear) == pytest.approx(2 * b * s * sum(i * o for i, o in counts.attention_linears(m)))
    assert gemm_flops(core) == pytest.approx(2 * b * s * s * (m.q_dim + m.attn_out_dim))
    # TP splits the up- and output projections, not the down-projections.
    lin8, _ = moe.mla_gemms(m, b, s, 8)
    down = 2 * b * s * m.hidden_size * (m.q_lora_rank + m.kv_lora_rank + m.qk_rope_head_dim)
    assert gemm_flops(lin8) == pytest.approx(down + (gemm_flops(linear) - down) / 8)


@pytest.mark.parametrize("tp,cp,dp,ep,edp", [(2, 1, 16, 32, 1), (2, 1, 128, 8, 32), (2, 1, 4, 8, 1), (1, 2, 8, 4, 4)])
def test_expert_data_parallel_matches_modelzoo_rows(tp, cp, dp, ep, edp):
    """Megatron MoE ModelZoo Qwen3-235B rows state their EDP (calibration/validation_data/modern)."""
    assert Degrees(tp=tp, cp=cp, dp_replicate=dp, ep=ep).expert_dp == edp


def test_parameters_per_gpu_shards_experts_over_ep():
    m = load_model("qwen3-235b-a22b")
    stage = 94 * counts.layer_parameters(m)
    experts = moe.expert_parameters(m, 94)
    dense, expert = moe.parameters_per_gpu(stage, experts, 4, 32)
    assert experts == pytest.approx(94 * 128 * 3 * 4096 * 1536)
    assert dense * 4 + expert * 32 == pytest.approx(stage)


def _plan(model, pp, tp, dp, ep=1, cp=1, seq=4096, gbs=256, zero=1, imbalance=1.25):
    from hetplan.plan import GPUPool, Job, Plan, Stage, balanced_split

    L = load_model(model).num_layers
    job = Job(model=model, seq_len=seq, global_batch=gbs, attention="flash", moe_load_imbalance=imbalance)
    pool = GPUPool(gpu="H100-SXM", count=tp * pp * dp * cp, gpus_per_node=8, inter_node_bandwidth_bytes_per_s=400e9)
    stages = [Stage(num_layers=k, tp=tp, dp=dp, recompute="full") for k in balanced_split(L, pp)]
    return Plan(job=job, pools=[pool], stages=stages, mbs=1, zero=zero, sequence_parallel=tp > 1, cp=cp, ep=ep)


def test_estimate_shards_expert_states_over_ep():
    """Mixtral 8x7B on 8 GPUs (DP 8, ZeRO-1): EP 8 divides the expert weights and gradients by 8 and shards
    their optimizer states over expert-DP 1 instead of DP 8; the non-expert part is unchanged."""
    from hetplan.estimate.estimator import estimate

    m = load_model("mixtral-8x7b")
    e1, e8 = (estimate(_plan("mixtral-8x7b", 1, 1, 8, ep=ep)).stages[0].memory for ep in (1, 8))
    experts = m.num_layers * counts.layer_expert_parameters(m)
    assert e1.weights - e8.weights == pytest.approx(experts * 2 * (1 - 1 / 8))
    assert e1.gradients - e8.gradients == pytest.approx(experts * 4 * (1 - 1 / 8))
    assert e8.optimizer == pytest.approx(e1.optimizer)  # expert-DP 8 / 8 = 1 owns what DP 8 owned before


def test_estimate_moe_time_grows_with_imbalance_and_across_nodes():
    from hetplan.estimate.estimator import estimate

    balanced = estimate(_plan("qwen3-30b-a3b", 1, 1, 16, ep=8, imbalance=1.0)).iteration_time_s
    skewed = estimate(_plan("qwen3-30b-a3b", 1, 1, 16, ep=8, imbalance=1.5)).iteration_time_s
    across = estimate(_plan("qwen3-30b-a3b", 1, 1, 16, ep=16, imbalance=1.0)).iteration_time_s
    assert balanced < skewed and balanced < across


def test_megatron_export_carries_ep_cp_moe_and_mla_arguments():
    """The plan's EP and CP and the model's experts, dense layers and MLA ranks reach Megatron-LM's arguments."""
    from hetplan.runtime.exporters import export_megatron

    plan = _plan("deepseek-v3", 1, 1, 16, ep=8).model_copy(update={"cp": 1})
    text = "\n".join(export_megatron(plan, load_model("deepseek-v3")).files.values())
    for arg in ("--expert-model-parallel-size 8", "--num-experts 256", "--moe-router-topk 8",
                "--moe-ffn-hidden-size 2048", "--moe-shared-expert-intermediate-size 2048",
                "--moe-layer-freq '[0,0,0,1,", "--multi-latent-attention", "--kv-lora-rank 512", "--q-lora-rank 1536",
                "--qk-head-dim 128", "--qk-pos-emb-head-dim 64", "--v-head-dim 128", "--context-parallel-size 1"):
        assert arg in text, arg
    assert "--moe-token-dispatcher-type alltoall" in text
    assert "--overlap-moe-expert-parallel-comm" not in text
    deepep = plan.model_copy(update={"job": plan.job.model_copy(update={"moe_dispatcher": "deepep",
                                                                         "moe_recompute": True,
                                                                         "moe_a2a_overlap": True}),
                                     "stages": [s.model_copy(update={"recompute": "none"}) for s in plan.stages]})
    # Megatron-Core refuses the all-to-all overlap with moe in recompute_modules (transformer_config.py): one each
    overlap = deepep.model_copy(update={"job": deepep.job.model_copy(update={"moe_recompute": False})})
    recompute = deepep.model_copy(update={"job": deepep.job.model_copy(update={"moe_a2a_overlap": False})})
    text = "\n".join(export_megatron(overlap, load_model("deepseek-v3")).files.values()) + "\n".join(
        export_megatron(recompute, load_model("deepseek-v3")).files.values())
    for arg in ("--moe-token-dispatcher-type flex --moe-flex-dispatcher-backend deepep",
                "--recompute-granularity selective", "--recompute-modules moe", "--overlap-moe-expert-parallel-comm"):
        assert arg in text, arg
    cp_plan = _plan("llama3-8b", 1, 8, 1, cp=4, seq=32768, gbs=8)
    assert "--context-parallel-size 4" in "\n".join(export_megatron(cp_plan, load_model("llama3-8b")).files.values())


def test_run_refuses_moe_and_cp_plans_before_starting_ranks():
    """``hetplan run`` names what its reference trainer lacks instead of starting torchrun."""
    from hetplan.errors import HetplanError
    from hetplan.runtime import planio

    with pytest.raises(HetplanError, match=r"deepseek_v3 router .*MLA"):
        planio.layout(_plan("deepseek-v3", 1, 1, 16, ep=8), load_model("deepseek-v3"))
    with pytest.raises(HetplanError, match="CP 4.*flash_attention_for_cpu"):
        planio.layout(_plan("llama3-8b", 1, 8, 1, cp=4, seq=32768, gbs=8), load_model("llama3-8b"))


def test_capacity_imbalance_caps_and_padding_fixes_the_busiest_expert():
    """Megatron-Core's token dropping: capacity ``ceil(T·k/E·c)`` per rank and expert, so the busiest expert takes
    ``min(imbalance, c)`` of its share; padded to capacity exactly ``c``; dropless unchanged."""
    assert moe.capacity_imbalance(1.4, None) == 1.4
    assert moe.capacity_imbalance(1.4, 1.25) == 1.25 and moe.capacity_imbalance(1.1, 1.25) == 1.1
    assert moe.capacity_imbalance(1.1, 1.25, pad=True) == 1.25
    assert np.allclose(moe.capacity_imbalance(np.array([1.0, 3.0]), 2.0), [1.0, 2.0])


def test_token_dropping_prices_the_capped_expert_rows():
    """Qwen3-30B-A3B at EP 8 on 16 H100: with capacity factor 1.1 the busiest expert is priced at 1.1 whatever
    imbalance the job states beyond it (the multinomial spread of random routing, 1.01 here, is below it); padded
    to a capacity of 1.5 it costs what a job skewed to exactly 1.5 costs without dropping — and it is slower than
    dropping alone, since the padding rows are sent and multiplied."""
    from hetplan.estimate.estimator import estimate

    def t(imbalance=1.25, **job):
        plan = _plan("qwen3-30b-a3b", 1, 1, 16, ep=8, imbalance=imbalance)
        return estimate(plan.model_copy(update={"job": plan.job.model_copy(update=job)})).iteration_time_s

    assert t(2.0, moe_capacity_factor=1.1) == pytest.approx(t(1.1))
    assert t(1.0, moe_capacity_factor=1.5, moe_pad_to_capacity=True) == pytest.approx(t(1.5))
    assert t(1.0, moe_capacity_factor=1.5) < t(1.0, moe_capacity_factor=1.5, moe_pad_to_capacity=True)
    assert t(moe_capacity_factor=1.0) < t()


def test_token_dropping_is_validated_exported_imported_and_refused_where_it_cannot_run():
    """The job refuses padding without a capacity, a capacity outside Megatron-Core and under DeepEP; a dense model with one breaks
    ``moe-modules-need-experts``; Megatron-LM's export writes both flags and its importer reads them back;
    torchtitan (dropless router) refuses to launch it, and so does ``hetplan run``'s reference trainer."""
    from hetplan.errors import HetplanError
    from hetplan.plan import Job
    from hetplan.plan_rules import launch_violations, violations
    from hetplan.runtime import planio
    from hetplan.runtime.exporters import export_megatron
    from hetplan.runtime.importers import import_megatron

    with pytest.raises(ValueError, match="needs moe_capacity_factor"):
        Job(model="mixtral-8x7b", seq_len=4096, global_batch=64, moe_pad_to_capacity=True)
    with pytest.raises(ValueError, match="routes dropless"):
        Job(model="mixtral-8x7b", seq_len=4096, global_batch=64, moe_capacity_factor=1.0, framework="fsdp")
    with pytest.raises(ValueError, match="alltoall dispatcher only"):
        Job(model="mixtral-8x7b", seq_len=4096, global_batch=64, moe_capacity_factor=1.0, moe_dispatcher="deepep")
    plan = _plan("mixtral-8x7b", 1, 1, 16, ep=8)
    plan = plan.model_copy(update={"job": plan.job.model_copy(update={"moe_capacity_factor": 1.0,
                                                                     "moe_pad_to_capacity": True})})
    m = load_model("mixtral-8x7b")
    assert not violations(plan, m)
    dense = plan.model_copy(update={"job": plan.job.model_copy(update={"model": "llama3-8b"}), "ep": 1})
    assert [e.rule for e in violations(dense, load_model("llama3-8b"))] == ["moe-modules-need-experts"]
    files = export_megatron(plan, m).files
    text = "\n".join(files.values())
    assert "--moe-expert-capacity-factor 1 " in text + " " and "--moe-pad-expert-input-to-capacity" in text
    launch = next(name for name in files if name.endswith(".sh"))
    back = import_megatron(files[launch], model="mixtral-8x7b", gpu="H100-SXM")
    assert back.job.moe_capacity_factor == 1.0 and back.job.moe_pad_to_capacity
    bad = launch_violations(plan, m, "torchtitan")
    assert any(e.field == "plan.job.moe_capacity_factor" and "dropless" in e.message for e in bad)
    assert not [e for e in launch_violations(plan, m, "megatron") if "capacity" in e.field]
    with pytest.raises(HetplanError, match="dropless"):
        planio.layout(plan, m)


def _tiny_moe(experts, k):
    return load_model("qwen3-30b-a3b").model_copy(update={"num_experts": experts, "experts_per_token": k})


@pytest.mark.parametrize("experts,k,groups", [(8, 2, 4), (16, 4, 2), (16, 4, 8), (12, 3, 3)])
def test_distinct_destinations_random_is_the_mean_over_all_routings(experts, k, groups):
    """Brute force: every k-subset of the experts equally likely; count the groups of E/groups consecutive
    experts each subset touches."""
    from itertools import combinations

    per = experts // groups
    hits = [len({e // per for e in subset}) for subset in combinations(range(experts), k)]
    assert moe.distinct_destinations(_tiny_moe(experts, k), groups) == pytest.approx(np.mean(hits))


def test_distinct_destinations_contiguous_follows_automodel_fake_gate():
    """NeMo AutoModel's FakeBalancedGate: token i takes experts (i·k + j) mod E; count the ranks per token."""
    for experts, k, ep in [(256, 8, 64), (128, 4, 64), (128, 8, 8), (32, 4, 16)]:
        per = experts // ep
        ranks = [len({((i * k + j) % experts) // per for j in range(k)}) for i in range(200)]
        assert moe.distinct_destinations(_tiny_moe(experts, k), ep, "contiguous") == pytest.approx(np.mean(ranks))


def test_deepep_sends_one_copy_per_remote_node():
    """Brute force over all routings of a token from rank 0: DeepEP's NIC bytes are the token's distinct remote
    nodes; Megatron's all-to-all sends every remote copy, so more."""
    from itertools import combinations

    m, ep, G = _tiny_moe(16, 4), 8, 4  # two experts per rank, 4 ranks per node, 2 nodes
    node = [(e // 2) // G for e in range(16)]
    remote = np.mean([len({node[e] for e in sub} - {0}) for sub in combinations(range(16), 4)])
    token = m.hidden_size * moe.DISPATCH_BYTES
    nvlink, nic = moe.deepep_traffic_bytes(m, 1.0, ep, 1, G)
    assert nic == pytest.approx(token * remote)
    assert nic < moe.dispatch_bytes(m, 1, 1, 1) * (ep - G) / ep  # k copies, half of them remote
    assert moe.deepep_traffic_bytes(m, 1.0, 4, 1, G)[1] == 0  # one node: nothing through the NICs


def test_deepep_alltoall_is_faster_across_nodes_and_contiguous_routing_fastest():
    m = load_model("deepseek-v3")
    net = Link(8, 450e9, 400e9)
    times = [moe.moe_alltoall_time_s(m, 1, 4096, 1, 64, 1, net, dispatch=moe.MoEOptions(d, r))
             for d, r in (("alltoall", "random"), ("deepep", "random"), ("deepep", "contiguous"))]
    assert times[0] > times[1] > times[2] > 0


def test_extra_kernels_count_te_grouped_linear_per_local_expert():
    m = load_model("qwen3-235b-a22b")  # 128 experts, every layer MoE, no shared expert
    assert moe.extra_kernels(m, 8) == moe.MOE_EXTRA_KERNELS + 2 * 128 / 8
    assert moe.extra_kernels(m, 8, "fsdp") == moe.MOE_EXTRA_KERNELS + 2
    assert moe.extra_kernels(load_model("llama3-8b"), 8) == 0
    ds = load_model("deepseek-v3")  # 3 dense layers of 61, a shared expert
    assert moe.extra_kernels(ds, 64) == pytest.approx((moe.MOE_EXTRA_KERNELS + 8 + 3) * 58 / 61)


def test_moe_recompute_trades_the_moe_activations_for_one_more_moe_forward():
    """--recompute-modules moe: the MoE MLP activations are not stored and the MoE MLP (GEMMs and all-to-all)
    runs once more in backward; with full recomputation it changes nothing."""
    from hetplan.estimate.estimator import estimate

    def est(moe_recompute, recompute="none"):
        plan = _plan("qwen3-30b-a3b", 2, 1, 8, ep=8)
        plan = plan.model_copy(update={"job": plan.job.model_copy(update={"moe_recompute": moe_recompute}),
                                       "stages": [s.model_copy(update={"recompute": recompute}) for s in plan.stages]})
        return estimate(plan)

    plain, again = est(False), est(True)
    assert again.stages[0].memory.activations < 0.5 * plain.stages[0].memory.activations
    assert again.stages[0].backward_s > plain.stages[0].backward_s
    assert again.stages[0].forward_s == pytest.approx(plain.stages[0].forward_s)
    full, full_again = est(False, "full"), est(True, "full")
    assert full_again.iteration_time_s == pytest.approx(full.iteration_time_s)
    assert full_again.stages[0].memory.total == pytest.approx(full.stages[0].memory.total)


def test_deepep_reaches_8_gpus_over_nvlink_hybridep_the_whole_nvl72():
    """On a 72-GPU NVLink domain DeepEP still sends beyond its 8-GPU host through the NICs; HybridEP keeps the
    whole EP 32 group on NVLink; on 8-GPU nodes the two are the same."""
    m = load_model("qwen3-235b-a22b")
    nvl72 = Link(72, 900e9, 72 * 50e9)
    deepep, hybrid = (moe.moe_alltoall_time_s(m, 1, 4096, 1, 32, 1, nvl72, dispatch=moe.MoEOptions(d))
                      for d in ("deepep", "hybridep"))
    assert deepep > 3 * hybrid
    dgx = Link(8, 450e9, 400e9)
    assert moe.moe_alltoall_time_s(m, 1, 4096, 1, 32, 1, dgx, dispatch=moe.MoEOptions("deepep")) == pytest.approx(
        moe.moe_alltoall_time_s(m, 1, 4096, 1, 32, 1, dgx, dispatch=moe.MoEOptions("hybridep")))


def test_expert_tp_splits_expert_states_and_all_gathers_tokens():
    """Expert-TP 4 divides the expert weights, gradients and optimizer states of every GPU by 4 more (expert-DP
    4x smaller) and adds the expert-TP all-gather / reduce-scatter of the dispatched tokens."""
    from hetplan.estimate.estimator import estimate

    m = load_model("mixtral-8x7b")
    base = _plan("mixtral-8x7b", 1, 4, 8, ep=8)
    e1, e4 = (estimate(base.model_copy(update={"expert_tp": etp})) for etp in (1, 4))
    experts = m.num_layers * counts.layer_expert_parameters(m)
    assert e1.stages[0].memory.weights - e4.stages[0].memory.weights == pytest.approx(experts * 2 * (1 / 8 - 1 / 32))
    assert e4.stages[0].tp_comm_s > e1.stages[0].tp_comm_s
    assert moe.moe_alltoall_time_s(m, 1, 4096, 4, 8, 4, Link(8, 450e9, 400e9), etp=4) > \
        moe.moe_alltoall_time_s(m, 1, 4096, 4, 8, 4, Link(8, 450e9, 400e9))
    with pytest.raises(ValueError, match="expert_tp"):
        base.model_copy(update={"expert_tp": 3}).stage_layout(0)


def test_cuda_graphs_drop_the_per_kernel_host_floor():
    """--enable-cuda-graph / --cuda-graph-impl: a graphed MoE layer replays its kernels with no host launch each.
    Worked example (Qwen3-235B, EP 8, micro-batch 1 x 4096 tokens, t = 1: no TP collective): without graphs the
    forward is the p-norm of GPU work and host floor, ``(gpu⁴ + (n·k)⁴)^¼`` with ``n`` the dense kernels less the
    fused flash ones plus TE's per-expert GEMM launches; with graphs it is the GPU work alone."""
    from hetplan.estimate import compute
    from hetplan.hardware.catalog import get_gpu

    m, g = load_model("qwen3-235b-a22b"), get_gpu("H100-SXM")
    b, s, ep = 1, 4096, 8
    kw = dict(attention="flash", gemm_times_s=moe.layer_gemm_times_s(m, g, "bf16", b, s, 1, ep),
              extra_kernels=moe.extra_kernels(m, ep))
    fwd, bwd, _ = compute.layer_time_s(m, g, "bf16", b, s, 1, 0, LayerTerms(LINK, **kw))
    gf, gb, _ = compute.layer_time_s(m, g, "bf16", b, s, 1, 0, LayerTerms(LINK, cuda_graphs=True, **kw))
    n = compute.KERNELS_PER_LAYER_FORWARD - compute.FLASH_FUSED_KERNELS + moe.MOE_EXTRA_KERNELS + 2 * 128 / ep
    host = n * g.kernel_overhead_s
    assert fwd ** 4 - gf ** 4 == pytest.approx(host ** 4, rel=1e-6)
    assert bwd ** 4 - gb ** 4 == pytest.approx((2 * host) ** 4, rel=1e-6)
    nofloor = compute.layer_time_s(m, g.model_copy(update={"kernel_overhead_s": 0.0}), "bf16", b, s, 1, 0,
                                   LayerTerms(LINK, **kw))
    assert (gf, gb) == pytest.approx(nofloor[:2], rel=1e-12)


def test_exposed_alltoall_is_bounded_by_the_paired_compute():
    """--overlap-moe-expert-parallel-comm, worked by hand on Megatron-Core's schedule (combine_bwd | pre_dispatch_fwd;
    dispatch_fwd -> dispatch_bwd | mlp_bwd -> mlp_dw -> mlp_fwd; combine_fwd | pre_dispatch_bwd). 10 ms of
    dispatch + combine per pass (5 ms each all-to-all) with all 3 + 5 ms of compute in pre_dispatch: the comm chain
    5 + 5 + 5, then pre_dispatch_bwd after the backward dispatch, beside the 5 ms forward combine on 0.9 of the SMs
    (5 + 0.1 · 5 = 5.5 ms): pair 20.5 ms, (20.5 - 8) / 2 = 6.25 ms per pass (6 ms with all SMs).
    2 ms (1 ms each) with a 1 ms expert forward (attention 2 + 1 ms, experts 1 + 2 ms): the comm hides entirely
    (pair = 8 ms of compute), so only the SM share 0.1 · 2 ms is left; with no expert compute the dispatches have
    nothing to hide behind: pair 10 ms with all SMs, 10.2 ms with each attention part 0.1 · 1 ms longer beside
    its 1 ms combine: 1.1 ms exposed per pass."""
    assert moe.exposed_alltoall_s(10e-3, 3e-3, 5e-3, 0.1) == pytest.approx(6.25e-3)
    assert moe.exposed_alltoall_s(10e-3, 3e-3, 5e-3, 0.0) == pytest.approx(6e-3)
    assert moe.overlap_pair_time_s(1e-3, 2e-3, 3e-3, 1e-3) == pytest.approx(8e-3)
    assert moe.exposed_alltoall_s(2e-3, 3e-3, 5e-3, 0.1, 1e-3) == pytest.approx(0.2e-3)
    assert moe.exposed_alltoall_s(2e-3, 3e-3, 5e-3, 0.1) == pytest.approx(1.1e-3)
    assert moe.exposed_alltoall_s(2e-3, 3e-3, 5e-3, 0.0) == pytest.approx(1e-3)
    assert moe.exposed_alltoall_s(0.0, 3e-3, 5e-3, 0.1, 1e-3) == 0.0


def test_contention_slows_the_compute_on_a_communication_bound_pair():
    """Worked by hand (ms): 2 ms per dispatch or combine, attention 1 / 3, experts 1 (forward), ρ 0.2. Each
    compute node is longer by ρ times the part of it its paired communication covers: pre_dispatch_fwd 1 + 0.2 · 1
    = 1.2 (beside the 2 ms backward combine), each expert node 1 + 0.2 · min(1, 4/3) = 1.2 (beside the two
    dispatches), pre_dispatch_bwd 3 + 0.2 · 2 = 3.4. Comm chain: combine_bwd 0-2, dispatch_fwd 2-4, dispatch_bwd
    4-6 (after mlp_bwd 2-3.2), mlp_fwd 4-5.2 (after mlp_dw 3.2-4.4), combine_fwd 6-8, pre_dispatch_bwd 6-9.4: pair
    9.4 where all SMs give 9.0 — the slowed attention backward sits on the communication chain's tail."""
    assert moe.overlap_pair_time_s(2e-3, 1e-3, 3e-3, 1e-3, 0.2) == pytest.approx(9.4e-3)
    assert moe.overlap_pair_time_s(2e-3, 1e-3, 3e-3, 1e-3) == pytest.approx(9.0e-3)
    # compute-bound: the communication hides and the slowdown is the floor ρ · (dispatch + combine) per pass
    assert moe.exposed_alltoall_s(2e-3, 5e-3, 9e-3, 0.2, 2e-3) == pytest.approx(0.2 * 2e-3)


def test_deepep_takes_its_own_sms_from_the_overlapped_compute():
    """DeepEP's normal kernels hold ``Buffer.num_sms = 20`` SMs (Megatron-Core's default), the alltoall dispatcher
    NCCL's thread blocks: on an H100 SXM (132 SMs) 20/132 and ctas/132."""
    from hetplan.estimate.comm import NCCL_CTAS
    from hetplan.hardware.catalog import get_gpu

    g = get_gpu("H100-SXM")
    assert moe.alltoall_contention(g, "deepep", NCCL_CTAS) == pytest.approx(20 / 132)
    assert moe.alltoall_contention(g, "alltoall", NCCL_CTAS) == pytest.approx(NCCL_CTAS / 132)
    assert moe.alltoall_contention(g, "alltoall", 24) == pytest.approx(24 / 132)


def _two_stream_pair_s(d, af, ab, mf):
    """Brute force of Megatron-Core's ``TransformerLayerSchedulePlan.run``: the nodes in issue order, each on its
    stream, starting when its stream and its inputs are free (event semantics of CUDA streams)."""
    nodes = [("combine_bwd", "comm", d, []), ("pre_fwd", "comp", af, []), ("mlp_bwd", "comp", mf, ["combine_bwd"]),
             ("dispatch_fwd", "comm", d, ["pre_fwd"]), ("mlp_dw", "comp", mf, ["mlp_bwd"]),
             ("dispatch_bwd", "comm", d, ["mlp_bwd"]), ("mlp_fwd", "comp", mf, ["dispatch_fwd"]),
             ("combine_fwd", "comm", d, ["mlp_fwd"]), ("pre_bwd", "comp", ab, ["dispatch_bwd"])]
    free, end = {"comm": 0.0, "comp": 0.0}, {}
    for name, stream, dur, deps in nodes:
        start = max([free[stream]] + [end[x] for x in deps])
        end[name] = free[stream] = start + dur
    return max(end.values())


def test_overlap_pair_matches_a_two_stream_simulation():
    rng = np.random.default_rng(0)
    x = rng.uniform(0.0, 5e-3, size=(200, 4))
    for d, af, ab, mf in x:
        assert moe.overlap_pair_time_s(d, af, ab, mf) == pytest.approx(_two_stream_pair_s(d, af, ab, mf), rel=1e-12)
    got = moe.overlap_pair_time_s(x[:, 0], x[:, 1], x[:, 2], x[:, 3])
    assert got == pytest.approx([_two_stream_pair_s(*row) for row in x], rel=1e-12)
    # never shorter than either stream's own work, never longer than running everything in a row
    assert np.all(got >= np.maximum(4 * x[:, 0], x[:, 1] + x[:, 2] + 3 * x[:, 3]) - 1e-15)
    assert np.all(got <= 4 * x[:, 0] + x[:, 1] + x[:, 2] + 3 * x[:, 3] + 1e-15)


def test_estimate_hides_the_alltoall_only_where_the_job_overlaps_it():
    """Qwen3-30B-A3B with EP 16 across two nodes: the overlapped job is faster, by at most its all-to-all time
    (the per-layer savings never exceed the all-to-all's share ``1 - ρ``); a dense model is unchanged."""
    from hetplan.estimate.comm import overlap_contention
    from hetplan.estimate.estimator import estimate, pool_link
    from hetplan.hardware.catalog import get_gpu

    def est(model, ep, overlap):
        plan = _plan(model, 1, 1, 16, ep=ep, imbalance=1.0)
        return estimate(plan.model_copy(update={"job": plan.job.model_copy(update={"moe_a2a_overlap": overlap})}))

    plain, hidden = est("qwen3-30b-a3b", 16, False), est("qwen3-30b-a3b", 16, True)
    m = load_model("qwen3-30b-a3b")
    g = get_gpu("H100-SXM")
    link = pool_link(_plan("qwen3-30b-a3b", 1, 1, 16, ep=16).pools[0], g)
    a2a = moe.moe_alltoall_time_s(m, 1, 4096, 1, 16, 1, link,
                                  imbalance=moe.routing_imbalance(m, 4096, 16))  # random routing's spread
    saved = plain.stages[0].forward_s - hidden.stages[0].forward_s
    assert 0 < saved <= m.num_layers * a2a * (1 - overlap_contention(g, link.nccl_ctas)) * (1 + 1e-9)
    assert hidden.iteration_time_s < plain.iteration_time_s
    assert est("llama3-8b", 1, True).iteration_time_s == est("llama3-8b", 1, False).iteration_time_s


#: torchao's forward + backward benchmark of one grouped GEMM on B200 (pytorch/ao
#: ``torchao/prototype/moe_training/README.md``, "Autograd function"): (M, N, K) -> bf16 ms at 1, 2, 4, 8 groups.
TORCHAO_GROUPED_MM_BF16_MS = {(128000, 8192, 5120): (43.1402, 39.4876, 39.1892, 37.7007),
                              (128000, 2048, 7168): (13.0648, 14.9002, 15.8236, 14.9668)}


@pytest.mark.parametrize("shape", sorted(TORCHAO_GROUPED_MM_BF16_MS))
def test_torch_grouped_mm_on_blackwell_matches_torchao_benchmark(shape):
    """torchtitan's routed experts (framework fsdp) on B200 run at moe.TORCH_GROUPED_MM_BLACKWELL: forward +
    backward (3 GEMMs of 2MNK) of the published shapes within 15 % of every measured group count, where the dense
    cuBLAS ceiling would be 20 % and more too fast; Megatron-Core (TE grouped GEMM) keeps the dense ceiling."""
    from hetplan.estimate import compute, fp8
    from hetplan.hardware.catalog import load_catalog

    gpu = load_catalog().get("B200")
    M, N, K = shape
    ceiling = moe.grouped_gemm_ceiling(gpu, "bf16", "fsdp")
    eff = compute.gemm_efficiency(gpu, M, N, K, "bf16") * ceiling / fp8.gemm_ceiling(gpu, "bf16")
    predicted_ms = 3 * 2.0 * M * N * K / (gpu.peak_flops_per_s("bf16") * eff) * 1e3
    for measured in TORCHAO_GROUPED_MM_BF16_MS[shape]:
        assert abs(predicted_ms / measured - 1) < 0.15, (predicted_ms, measured)
    dense_ms = 3 * 2.0 * M * N * K / (gpu.peak_flops_per_s("bf16") * compute.gemm_efficiency(gpu, M, N, K)) * 1e3
    assert dense_ms < 0.8 * min(TORCHAO_GROUPED_MM_BF16_MS[shape])
    assert moe.grouped_gemm_ceiling(gpu, "bf16", "megatron") == fp8.gemm_ceiling(gpu, "bf16")
    assert moe.grouped_gemm_ceiling(load_catalog().get("H100-SXM"), "bf16", "fsdp") == \
        fp8.gemm_ceiling(load_catalog().get("H100-SXM"), "bf16")


def test_expert_bias_loop_bytes_and_kernels_worked_example():
    """GPT-OSS 120B (128 experts, top-4, h 2,880, f_e 2,880, biased experts) at EP 8, one 4,096-token micro-batch:
    Megatron-Core's ``TEGroupedMLP._apply_bias`` loops over the 16 local experts for the FC2 bias (``b * p``, the
    add: 2 kernels each, then one ``cat``): 33 kernels, 16,384 routed copies x 2,880 x 12 B = 0.566 GB; NeMo
    AutoModel's DeepEP experts add the FC1 bias the same way (one add per expert + ``cat``: 17 more kernels,
    8 B x 5,760 more per copy); torchtitan's vectorised add: 4 kernels per GEMM whatever the experts, 8 B per
    element of both outputs."""
    from hetplan.hardware.catalog import get_gpu

    m, g = load_model("gpt-oss-120b"), get_gpu("H100-SXM")
    bw = g.hbm_bandwidth_bytes_per_s
    assert moe.expert_bias_kernels(m, 8) == 33
    assert moe.expert_bias_kernels(m, 8, "fsdp", "deepep") == 33 + 17
    assert moe.expert_bias_kernels(m, 8, "fsdp") == moe.expert_bias_kernels(m, 64, "fsdp") == 8
    copies = 4 * 4096
    assert moe.expert_bias_time_s(m, g, 1, 4096, 1, 8) * bw == pytest.approx(copies * 2880 * 12)
    assert moe.expert_bias_time_s(m, g, 1, 4096, 1, 8, framework="fsdp", dispatcher="deepep") * bw == \
        pytest.approx(copies * (2880 * 12 + 5760 * 8))
    assert moe.expert_bias_time_s(m, g, 1, 4096, 1, 8, framework="fsdp") * bw == pytest.approx(
        copies * (2880 * 8 + 5760 * 8))
    # the busiest rank's copies: imbalance and expert-TP (the copies all-gathered over the etp group, FC1 split)
    assert moe.expert_bias_time_s(m, g, 1, 4096, 1, 8, imbalance=1.25) == pytest.approx(
        1.25 * moe.expert_bias_time_s(m, g, 1, 4096, 1, 8))
    # counted once per layer in the host floor with the other MoE kernels
    assert moe.extra_kernels(m, 8) - moe.extra_kernels(m.model_copy(update={"linear_bias": False}), 8) == 33
    assert moe.extra_kernels(m, 8, "fsdp", "deepep") - moe.extra_kernels(m, 8, "fsdp") == 50 - 8


@pytest.mark.parametrize("name", ["qwen3-30b-a3b", "deepseek-v3", "mixtral-8x7b", "llama3-8b"])
def test_expert_bias_costs_nothing_without_biases(name):
    from hetplan.hardware.catalog import get_gpu

    m = load_model(name)
    assert moe.expert_bias_kernels(m, 8) == 0.0 and moe.expert_bias_kernels(m, 8, "fsdp", "deepep") == 0.0
    assert moe.expert_bias_kernels(m, 8, "fsdp") == 0.0
    assert moe.expert_bias_time_s(m, get_gpu("H100-SXM"), 1, 4096, 1, 8) == 0.0


def test_estimate_charges_the_expert_bias_loop_more_with_more_local_experts():
    """GPT-OSS 120B on 64 H100 (DP 64): the eager loop's launches grow with the local experts, so with biases
    the step is slower, and by more at EP 8 (16 local experts) than at EP 64 (2)."""
    from hetplan.estimate.estimator import estimate

    def step(ep, bias):
        p = _plan("gpt-oss-120b", 1, 1, 64, ep=ep, gbs=128, imbalance=1.0)
        return estimate(p, model=load_model("gpt-oss-120b").model_copy(update={"linear_bias": bias})).iteration_time_s

    more8, more64 = step(8, True) - step(8, False), step(64, True) - step(64, False)
    assert more8 > more64 > 0


def test_unpaired_passes_follow_megatron_combined_1f1b_warmup():
    """Megatron-Core's combined 1F1B runs (pp - i - 1)·2 + (v - 1)·pp + 1 warm-up chunk forwards alone on stage i
    (one more than the plain interleaved warm-up); over m·v chunk passes that is the in-flight count over m.
    PP 8 × VP 4, 128 micro-batches: stage 0 39 of 512 chunks, the last stage 25; one stage: 1 of m."""
    from hetplan.estimate.estimator import in_flight_microbatches

    p, v, m = 8, 4, 128
    for i in (0, 7):
        warmup = (p - i - 1) * 2 + (v - 1) * p + 1
        got = moe.unpaired_pass_share(in_flight_microbatches("1f1b", p, i, m, v), m)
        assert got == pytest.approx(warmup / (m * v))
    assert moe.unpaired_pass_share(in_flight_microbatches("1f1b", 1, 0, 16, 1), 16) == pytest.approx(1 / 16)
    assert moe.unpaired_pass_share(in_flight_microbatches("1f1b", 4, 0, 2, 1), 2) == 1.0  # all warm-up
    assert moe.unpaired_pass_share(3.0, None) == 0.0


def test_overlap_hides_nothing_with_one_micro_batch():
    """With one micro-batch per iteration there is no second micro-batch to pair with: the overlapped job costs
    what the plain one does; with 16 it is faster."""
    from hetplan.estimate.estimator import estimate

    def step(gbs, overlap):
        plan = _plan("qwen3-30b-a3b", 1, 1, 16, ep=16, gbs=gbs, imbalance=1.0)
        job = plan.job.model_copy(update={"moe_a2a_overlap": overlap})
        return estimate(plan.model_copy(update={"job": job})).iteration_time_s

    assert step(16, True) == pytest.approx(step(16, False), rel=1e-12)
    assert step(256, True) < step(256, False)


def test_torchtitan_splits_experts_over_tp_at_ep1():
    """Under fsdp (torchtitan) at EP 1 the experts are split over TP like a dense MLP (``expert_param_placement_dense``,
    torchtitan ``models/common/moe_sharding.py``): a plan's expert-TP 1 is launched as expert-TP = TP, so it costs
    exactly what the explicit expert-TP 2 costs; each GPU holds half the expert weights of a Megatron-Core launch
    with expert-TP 1, whose experts are whole on every TP rank; and no expert-TP token gather is charged, the
    tokens arriving by the MLP side's sequence-parallel all-gather (4 collectives per pass, as a dense layer)."""
    from hetplan.estimate.estimator import estimate
    from hetplan.plan import Job

    m = load_model("mixtral-8x7b")
    plan = _plan("mixtral-8x7b", 1, 2, 4, zero=3)
    fsdp = plan.model_copy(update={"job": Job(**{**plan.job.model_dump(), "framework": "fsdp"})})
    implied, explicit = (estimate(fsdp.model_copy(update={"expert_tp": etp})) for etp in (1, 2))
    assert implied.iteration_time_s == explicit.iteration_time_s
    assert implied.stages[0].memory.weights == explicit.stages[0].memory.weights
    megatron = estimate(plan.model_copy(update={"zero": 1}))
    experts = m.num_layers * counts.layer_expert_parameters(m)
    # FSDP shards every weight over dp 4 and the experts over the TP 2 as well; ZeRO-1 keeps 16-bit weights whole
    assert implied.stages[0].memory.weights < megatron.stages[0].memory.weights - experts * 2 * (1 / 2)
    assert implied.stages[0].alltoall_s == 0.0
    assert moe.mlp_tp_collective_share(m, 1, "fsdp") == 1.0
    assert moe.mlp_tp_collective_share(m, 8, "fsdp") == 0.0
    assert moe.launched_degrees(Degrees.of(tp=2, dp=4, ep=8), "fsdp").expert_tp == 1
    assert moe.launched_degrees(Degrees.of(tp=2, dp=4, ep=1), "megatron").expert_tp == 1


def test_routed_experts_run_no_tp_collectives_of_their_own():
    """Megatron-Core's routed experts take the rank's sequence shard through the dispatcher (its only TP-side
    gather is over the expert-TP group): a MoE layer without shared experts runs the attention's all-gather and
    reduce-scatter only, half a dense layer's TP communication; shared experts gather and scatter like an MLP
    (DeepSeek-V3: every layer); dense layers count in the mean (DeepSeek-V3's first three)."""
    from hetplan.estimate import compute
    from hetplan.hardware.catalog import load_catalog

    qwen, dsv3 = load_model("qwen3-30b-a3b"), load_model("deepseek-v3")
    assert moe.mlp_tp_collective_share(qwen, 8) == 0.0
    assert moe.mlp_tp_collective_share(dsv3, 8) == 1.0
    mixed = qwen.model_copy(update={"first_dense_layers": 8})
    assert moe.mlp_tp_collective_share(mixed, 8) == pytest.approx(8 / qwen.num_layers)
    gpu = load_catalog().get("H100-SXM")
    link = Link(8, 450e9, 400e9)
    tp_comm = [compute.layer_time_s(qwen, gpu, "bf16", 1, 4096, 4, 0,
                                    LayerTerms(link, sequence_parallel=True, attention="flash",
                                               mlp_tp_collectives=share))[2] for share in (0.0, 1.0)]
    assert tp_comm[0] == pytest.approx(tp_comm[1] / 2)
    no_sp = [compute.layer_time_s(qwen, gpu, "bf16", 1, 4096, 4, 0,
                                  LayerTerms(link, attention="flash", mlp_tp_collectives=share))[2]
             for share in (0.0, 1.0)]
    assert no_sp[0] == no_sp[1]  # without SP the layer all-reduces twice whatever runs its MLP


def test_expert_tp_ranks_keep_the_gathered_inputs_of_their_copies():
    """Each of an expert's ``expert_tp`` ranks keeps the whole input (2h bytes) of every copy routed to it and a
    ``1/expert_tp`` slice of its outputs: the MoE activations grow by ``k·b·s·2h·(expert_tp - 1)``."""
    m = load_model("mixtral-8x7b")
    b, s = 1, 4096
    extra = counts.moe_mlp_activation_bytes(m, b, s, 4) - counts.moe_mlp_activation_bytes(m, b, s)
    assert extra == pytest.approx(m.experts_per_token * b * s * 2 * m.hidden_size * 3)
