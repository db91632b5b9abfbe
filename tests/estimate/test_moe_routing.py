"""Fine-grained MoE terms (issue 28): the load spread of random top-k routing (moe.routing_imbalance, checked
against brute-force simulation of the routing) and the token permutation's memory traffic (moe.permute_time_s,
worked examples), charged as GPU work of the layer (compute.layer_time_s extra_gpu_s)."""

from __future__ import annotations

import numpy as np
import pytest

from hetplan.estimate import compute, moe
from hetplan.hardware.catalog import load_catalog
from hetplan.model.spec import load_model
from hetplan.estimate.stagework import LayerTerms, Link

LINK = Link.one_node(450e9)  # the TP group in one node, 450 GB/s per direction

GPU = load_catalog().get("H100-SXM")


def _simulated_imbalance(e, k, ep, tokens, trials, seed):
    """Mean over ``trials`` of the busiest EP rank's routed copies over ``k·T``: every one of the group's ``ep·T``
    tokens picks ``k`` distinct experts uniformly (the k smallest of E uniform draws); rank r holds experts
    ``r·E/ep ... (r+1)·E/ep - 1``."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(trials):
        picks = np.argpartition(rng.random((ep * tokens, e)), k, axis=1)[:, :k]
        per_rank = np.bincount((picks // (e // ep)).ravel(), minlength=ep)
        out.append(per_rank.max() / (k * tokens))
    return float(np.mean(out))


@pytest.mark.parametrize("e,k,ep,tokens", [(128, 8, 16, 256), (32, 4, 8, 512), (64, 2, 4, 1024)])
def test_routing_imbalance_matches_brute_force_routing(e, k, ep, tokens):
    m = load_model("qwen3-30b-a3b").model_copy(update={"num_experts": e, "experts_per_token": k})
    predicted = float(moe.routing_imbalance(m, tokens, ep))
    simulated = _simulated_imbalance(e, k, ep, tokens, trials=60, seed=e + k + ep)
    assert predicted > 1.0
    # the excess over perfect balance within 12 % (CLT and Blom's order-statistic approximation; 60 trials)
    assert predicted - 1.0 == pytest.approx(simulated - 1.0, rel=0.12)


def test_routing_imbalance_is_one_without_expert_parallelism_and_shrinks_with_tokens():
    m = load_model("qwen3-30b-a3b")
    assert float(moe.routing_imbalance(m, 4096, 1)) == pytest.approx(1.0)
    few, many = (float(moe.routing_imbalance(m, t, 16)) for t in (512, 8192))
    assert many < few  # the spread falls as 1/sqrt(k·T)
    assert (few - 1.0) / (many - 1.0) == pytest.approx(4.0, rel=1e-9)


def test_permute_bytes_worked_example():
    """Qwen3-30B-A3B (h 2048, k 8, 128 experts, every layer MoE), 4,096 tokens per rank, balanced: 32,768 copies.
    EP 16 (8 local experts): permute-out read + 4 sort passes = 5 passes of copies, plus the tokens read once and
    written once: (5·32,768 + 2·4,096) · 2,048 · 2 B = 704,643,072 B. EP 128 (one local expert, no sort):
    (32,768 + 8,192) · 4,096 B = 167,772,160 B."""
    m = load_model("qwen3-30b-a3b")
    bw = GPU.hbm_bandwidth_bytes_per_s
    assert float(moe.permute_time_s(m, GPU, 1, 4096, 1, 16)) * bw == pytest.approx(704_643_072)
    assert float(moe.permute_time_s(m, GPU, 1, 4096, 1, 128)) * bw == pytest.approx(167_772_160)
    assert moe.permute_time_s(load_model("llama3-8b"), GPU, 1, 4096, 1, 1) == 0.0


def test_fp8_padding_of_expert_segments_worked_example():
    """Megatron-Core FP8 experts pad each expert's segment (Fp8Padding: read + write) and drop the padding rows
    of the output (Fp8Unpadding: read + write): 4 more passes of the 32,768 copies at EP 16, 4 · 32,768 · 2,048 ·
    2 B = 536,870,912 B on top of the 704,643,072 B of test_permute_bytes_worked_example. Only under FP8 on
    Megatron-Core, and not where HybridEP's dispatch writes padded segments itself or torchtitan aligns them in
    its permutation indices."""
    m = load_model("qwen3-30b-a3b")
    bw = GPU.hbm_bandwidth_bytes_per_s
    padded = float(moe.permute_time_s(m, GPU, 1, 4096, 1, 16, fp8_padding=True)) * bw
    assert padded == pytest.approx(704_643_072 + 536_870_912)
    assert moe.fp8_pads_experts("fp8", "megatron", "alltoall") and moe.fp8_pads_experts("fp8", "megatron", "deepep")
    assert not moe.fp8_pads_experts("fp8", "megatron", "hybridep")
    assert not moe.fp8_pads_experts("fp8", "fsdp", "alltoall") and not moe.fp8_pads_experts("bf16", "megatron",
                                                                                          "alltoall")


def test_permutation_is_gpu_work_forward_and_again_in_backward():
    m = load_model("qwen3-30b-a3b")
    gemms = moe.layer_gemm_times_s(m, GPU, "bf16", 4, 4096, 1, 8, 1, 1.0)
    kw = dict(attention="flash", gemm_times_s=gemms, cuda_graphs=True)  # no host floor: GPU time only
    f0, b0, _ = compute.layer_time_s(m, GPU, "bf16", 4, 4096, 1, 0, LayerTerms(LINK, **kw))
    extra = float(moe.permute_time_s(m, GPU, 4, 4096, 1, 8))
    f1, b1, _ = compute.layer_time_s(m, GPU, "bf16", 4, 4096, 1, 0, LayerTerms(LINK, extra_gpu_s=extra, **kw))
    assert float(f1 - f0) == pytest.approx(extra) and float(b1 - b0) == pytest.approx(extra)
    _, b2, _ = compute.layer_time_s(m, GPU, "bf16", 4, 4096, 1, 2, LayerTerms(LINK, extra_gpu_s=extra, **kw))
    _, b3, _ = compute.layer_time_s(m, GPU, "bf16", 4, 4096, 1, 2, LayerTerms(LINK, **kw))
    assert float(b2 - b3) == pytest.approx(2 * extra)  # full recomputation runs the forward's again


def test_te_grouped_gemm_runs_four_experts_at_a_time():
    """Transformer Engine issues one GEMM per local expert on 4 streams: the shape efficiency sees 4 experts' rows
    at once, PyTorch's single grouped kernel all of them. With 32 local experts of 64 rows (small M_e) the TE
    GEMMs are slower; with one local expert both are the same GEMM."""
    assert float(moe.grouped_gemm_rows(64, 32)) == 256 and float(moe.grouped_gemm_rows(64, 32, "fsdp")) == 2048
    assert float(moe.grouped_gemm_rows(512, 2)) == 1024  # fewer experts than streams: all of them
    m = load_model("qwen3-30b-a3b")
    # 4 x 4,096 tokens at EP 1: 128 local experts of 1,024 rows, compute-bound; the same bf16 ceiling on Hopper
    te, torch_mm = (float(moe.moe_mlp_time_s(m, GPU, "bf16", 4, 4096, 1, 1, framework=f)) for f in ("megatron", "fsdp"))
    assert te > torch_mm
    one_te, one_mm = (float(moe.moe_mlp_time_s(m, GPU, "bf16", 1, 4096, 1, 128, framework=f))
                      for f in ("megatron", "fsdp"))
    assert one_te == pytest.approx(one_mm)


def _busiest_share(e, k, ep):
    """The most of a token's ``k`` copies one EP rank can take, against its mean ``k/ep``, over every choice of
    ``k`` distinct experts (rank r holds the ``E/ep`` consecutive experts from ``r·E/ep``)."""
    from itertools import combinations

    return max(np.bincount(np.array(c) // (e // ep), minlength=ep).max()
               for c in combinations(range(e), k)) / (k / ep)


@pytest.mark.parametrize("e,k,ep", [(8, 2, 1), (8, 2, 2), (8, 2, 8), (16, 4, 1), (16, 4, 2), (16, 4, 8),
                                    (16, 4, 16)])
def test_bounded_imbalance_is_what_routing_can_send_one_rank(e, k, ep):
    """The bound is the most any routing sends one rank (every choice of experts enumerated); at EP 1 it is 1."""
    m = load_model("qwen3-30b-a3b").model_copy(update={"num_experts": e, "experts_per_token": k})
    bound = float(moe.bounded_imbalance(m, 100.0, ep))
    assert bound == pytest.approx(_busiest_share(e, k, ep))
    assert float(moe.bounded_imbalance(m, 1.25, ep)) == min(1.25, bound)
    assert (bound == 1.0) == (ep == 1)


def test_a_learned_routers_skew_costs_nothing_without_expert_parallelism():
    """Qwen3-30B-A3B on 8 GPUs at EP 1: the one rank holds all 128 experts and multiplies every routed copy, so the
    default learned-router imbalance (1.25) prices it as balanced routing; at EP 8 it costs time."""
    from hetplan.estimate.estimator import estimate
    from hetplan.plan import GPUPool, Job, Plan, Stage

    def t(ep, imbalance):
        job = Job(model="qwen3-30b-a3b", seq_len=4096, global_batch=64, moe_load_imbalance=imbalance)
        plan = Plan(job=job, pools=[GPUPool(gpu="H100-SXM", count=8)], ep=ep, mbs=1,
                    stages=[Stage(num_layers=48, tp=1, dp=8, recompute="full")])
        return estimate(plan).iteration_time_s

    assert t(1, 1.25) == pytest.approx(t(1, 1.0), rel=1e-12)
    assert t(8, 1.25) > t(8, 1.0) * 1.01
