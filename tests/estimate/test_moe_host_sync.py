"""The MoE token dispatcher's host synchronisation (moe.host_sync_split, compute.layer_time_s host_sync): the
GPU queue drains where the host waits for the token counts, so host launches and GPU work overlap only on either
side of it."""

from __future__ import annotations

import numpy as np
import pytest

from hetplan.estimate import compute, moe
from hetplan.hardware.catalog import load_catalog
from hetplan.model.spec import load_model

GPU = load_catalog().get("H100-SXM")


def _fwd(m, host_sync, ep=8, framework="megatron"):
    linear, core = moe.layer_gemm_times_s(m, GPU, "bf16", 1, 4096, 1, ep, 1, 1.0, framework)
    return compute.layer_time_s(m, GPU, "bf16", 1, 4096, 1, 0, 450e9, attention="flash", gemm_times_s=(linear, core),
                                extra_kernels=moe.extra_kernels(m, ep, framework), host_sync=host_sync)[0]


def test_the_split_is_two_smooth_maxima_and_never_faster():
    m = load_model("qwen3-30b-a3b")  # 128 experts, top-8, FFN 768: launch-heavy MoE layers
    split = moe.host_sync_split(m, GPU, "bf16", 1, 4096, 1, 8)
    gpu_post, kernels_post = (float(x) for x in split)
    assert gpu_post == pytest.approx(float(moe.moe_mlp_time_s(m, GPU, "bf16", 1, 4096, 1, 8)))
    total_kernels = (compute.KERNELS_PER_LAYER_FORWARD - compute.FLASH_FUSED_KERNELS
                     + float(moe.extra_kernels(m, 8)))
    assert kernels_post == pytest.approx(float(moe.extra_kernels(m, 8)) + 3 - moe.MOE_PRE_SYNC_KERNELS)
    assert 0 < kernels_post < total_kernels
    plain, synced = float(_fwd(m, None)), float(_fwd(m, split))
    k = GPU.kernel_overhead_s
    # the forward without communication: smooth max of (GPU, host) as one, or of each side of the sync
    gpu_all = (plain ** 4 - (total_kernels * k) ** 4) ** 0.25
    both = (((gpu_all - gpu_post) ** 4 + ((total_kernels - kernels_post) * k) ** 4) ** 0.25
            + (gpu_post ** 4 + (kernels_post * k) ** 4) ** 0.25)
    assert synced == pytest.approx(both, rel=1e-9)
    assert synced > plain  # a barrier can only cost time


def test_who_synchronises():
    m = load_model("mixtral-8x7b")
    assert moe.host_sync_split(load_model("llama3-8b"), GPU, "bf16", 1, 4096, 1, 1) is None  # no MoE layer
    gpu_s, kernels = moe.host_sync_split(m, GPU, "bf16", 1, 4096, 1, np.array([1, 8]), framework="fsdp")
    assert gpu_s[0] == 0 and kernels[0] == 0 and gpu_s[1] > 0  # torch grouped GEMM at EP 1 reads GPU offsets
    gpu_s, _ = moe.host_sync_split(m, GPU, "bf16", 1, 4096, 1, np.array([1, 8]))
    assert (gpu_s > 0).all()  # Megatron-Core: before_finish at EP 1 (TE's host splits), before_ep_alltoall else
    assert float(_fwd(m, moe.host_sync_split(m, GPU, "bf16", 1, 4096, 1, 1, framework="fsdp"), 1, "fsdp")) == \
        pytest.approx(float(_fwd(m, None, 1, "fsdp")))
