"""The fused attention kernel is a property of the job's software stack (framework, version), not of the GPU:
``Job.attention_kernel``, its framework default (its stack (``Job.stack_spec().kernel_on``)) and the catalog's measured
rates per kernel (``GPUSpec.attention_kernels``)."""

import pytest

from hetplan.errors import HetplanError
from hetplan.estimate import compute
from hetplan.estimate.estimator import estimate
from hetplan.hardware.catalog import FLASH_TO_GEMM_RATIO, load_catalog
from hetplan.plan import GPUPool, Job, Plan, Stage
from hetplan.estimate.stagework import LayerTerms, Link

CAT = load_catalog()


def _gpu(gpu, **job):
    return compute.pool_gpu(CAT, GPUPool(gpu=gpu, count=8), job=Job(model="llama3-8b", seq_len=8192,
                                                                      global_batch=8, **job))


@pytest.mark.parametrize("gpu,framework,kernel,rates", [
    # Shah et al. 2024 (FlashAttention-3) Fig. 5 / 7 on H100: cuDNN 600 / 515, FA2 370 / 318 of 989 TFLOP/s.
    ("H100-SXM", "megatron", "cudnn", (0.61, 0.52)),   # Transformer Engine prefers cuDNN on Hopper
    ("H100-SXM", "fsdp", "cudnn", (0.61, 0.52)),       # torchtitan since 6a3a9da / PyTorch >= 2.11: cuDNN first
    ("H100-SXM", "deepspeed", "fa2", (0.37, 0.32)),    # the flash-attn package
    ("H200", "megatron", "cudnn", (0.61, 0.52)),
    ("A100-SXM-80GB", "megatron", "fa2", (0.70, 0.60)),  # Dao 2023 Fig. 4-6; TE runs flash-attn on Ampere
    ("A100-SXM-80GB", "fsdp", "fa2", (0.70, 0.60)),
])
def test_the_framework_picks_the_kernel_and_the_catalog_gives_its_rate(gpu, framework, kernel, rates):
    g = _gpu(gpu, framework=framework)
    assert g.attention_kernel == kernel
    assert g.flash_attention_efficiency() == rates


def test_an_explicit_kernel_overrides_the_framework_default_and_a_pool_figure_overrides_both():
    assert _gpu("H200", framework="fsdp", attention_kernel="fa2").flash_attention_efficiency() == (0.37, 0.32)
    assert _gpu("H100-SXM", attention_kernel="fa3").flash_attention_efficiency() == (0.65, 0.56)
    pool = GPUPool(gpu="H100-SXM", count=8, attention_efficiency=(0.5, 0.4))
    job = Job(model="llama3-8b", seq_len=8192, global_batch=8, attention_kernel="fa2")
    assert compute.pool_gpu(CAT, pool, job=job).flash_attention_efficiency() == (0.5, 0.4)


def test_a_kernel_without_a_measured_rate_runs_at_the_generic_ratio_of_the_gemm_ceiling():
    g = _gpu("B200", framework="fsdp")  # cuDNN on Blackwell; no B200 attention measurement in the catalog
    assert g.attention_kernel == "cudnn"
    f, b = FLASH_TO_GEMM_RATIO
    assert g.flash_attention_efficiency() == pytest.approx((g.compute_efficiency * f, g.compute_efficiency * b))


def test_fa2_attention_time_is_the_causal_work_at_the_fa2_causal_rate():
    """Worked example, Llama 3 8B on H200 under PyTorch SDPA's flash backend: forward 4·b·s²·q·(s + 128)/(2s)
    FLOPs at 0.37 x 0.93 (FlashAttention-2's causal efficiency) of 989.4 TFLOP/s times φ(s) = s / (s + 134);
    backward 2.5x the work at 0.32 x 0.93."""
    from hetplan.model.spec import load_model

    m, g = load_model("llama3-8b"), _gpu("H200", framework="fsdp", attention_kernel="fa2")
    b, s = 2, 8192
    fwd, bwd = compute.flash_attention_time_s(m, g, "fp8", b, s, 1)
    work = 4 * b * s * s * m.q_dim * (s + 128) / (2 * s)
    phi = s / (s + 134)
    assert fwd == pytest.approx(work / (989.4e12 * 0.37 * 0.93 * phi), rel=1e-12)
    assert bwd == pytest.approx(2.5 * work / (989.4e12 * 0.32 * 0.93 * phi), rel=1e-12)


# Shah et al. 2024 (FlashAttention-3) Fig. 5, H100 SXM5, bf16, head dim 128, forward TFLOP/s at s = 2k / 4k / 8k /
# 16k without and with the causal mask (the causal figures count half the s² FLOPs).
FA3_PAPER_FORWARD = {
    "cudnn": ((617, 609, 600, 595), (484, 518, 529, 539)),
    "fa3": ((625, 638, 646, 648), (521, 579, 602, 616)),
    "fa2": ((362, 368, 370, 370), (298, 319, 333, 335)),
}


@pytest.mark.parametrize("kernel", sorted(FA3_PAPER_FORWARD))
def test_a_causal_kernel_runs_at_its_causal_rate_and_an_unmasked_one_at_the_non_causal_rate(kernel):
    """The causal kernel: the tiles on and below the diagonal at the non-causal rate times η
    (``attention_causal_efficiency``); without a mask: all s² at the non-causal rate. Each reproduces its own curve
    of the paper on H100 at 2k-16k (non-causal within 9 %: φ and one rate per kernel; causal within 4 %), and the
    causal kernel is not simply the non-causal one on half the work (that would be 3-16 % fast)."""
    from hetplan.model.spec import load_model

    m, g = load_model("llama3-8b"), _gpu("H100-SXM", attention_kernel=kernel)
    eta = CAT.get("H100-SXM").attention_causal_efficiency[kernel]
    assert g.flash_attention_efficiency(causal=True) == pytest.approx(
        tuple(eta * r for r in g.flash_attention_efficiency()), rel=1e-12)
    non_causal, causal = FA3_PAPER_FORWARD[kernel]
    for s, nc_meas, c_meas in zip((2048, 4096, 8192, 16384), non_causal, causal, strict=True):
        full = 4 * s * s * m.q_dim
        t_nc = compute.flash_attention_time_s(m, g, "bf16", 1, s, 1, causal=False)[0]
        t_c = compute.flash_attention_time_s(m, g, "bf16", 1, s, 1, causal=True)[0]
        assert full / t_nc / 1e12 == pytest.approx(nc_meas, rel=0.09)
        assert full / 2 / t_c / 1e12 == pytest.approx(c_meas, rel=0.04)
        tiles = full * float(compute.causal_work_fraction(s))
        assert t_c == pytest.approx(tiles / full * t_nc / eta, rel=1e-12)
        assert full / 2 / (t_nc / 2) / 1e12 > 1.03 * c_meas  # half the work at the unmasked rate: too fast


def test_a_pool_measured_rate_is_not_scaled_by_the_causal_efficiency():
    pool = GPUPool(gpu="H100-SXM", count=8, attention_efficiency=(0.5, 0.4))
    g = compute.pool_gpu(CAT, pool, job=Job(model="llama3-8b", seq_len=8192, global_batch=8))
    assert g.flash_attention_efficiency(causal=True) == g.flash_attention_efficiency() == (0.5, 0.4)


def test_the_estimate_of_an_fsdp_job_follows_its_kernel():
    def step(**kw):
        job = Job(model="llama3-8b", seq_len=8192, global_batch=16, framework="fsdp", **kw)
        plan = Plan(job=job, pools=[GPUPool(gpu="H100-SXM", count=8)], stages=[Stage(num_layers=32, tp=1, dp=8)],
                    mbs=2, zero=3)
        return estimate(plan).iteration_time_s

    cudnn, fa2, fa3 = step(), step(attention_kernel="fa2"), step(attention_kernel="fa3")
    assert fa3 < cudnn < fa2
    assert step(attention_kernel="cudnn") == cudnn


def test_bad_kernel_choices_are_refused_naming_the_field():
    with pytest.raises(ValueError, match="attention_kernel"):
        Job(model="llama3-8b", seq_len=8192, global_batch=8, attention="standard", attention_kernel="fa2")
    with pytest.raises(ValueError, match="attention_kernel"):
        Job(model="llama3-8b", seq_len=8192, global_batch=8, attention_kernel="fa4")


def test_the_catalog_takes_rates_per_kernel_and_refuses_a_kernel_choice(tmp_path):
    f = tmp_path / "cat.toml"
    f.write_text('[gpus.H100-SXM]\nattention_kernels = { fa2 = [0.40, 0.33] }\n')
    g = compute.pool_gpu(load_catalog(f), GPUPool(gpu="H100-SXM", count=8),
                         job=Job(model="llama3-8b", seq_len=8192, global_batch=8, attention_kernel="fa2"))
    assert g.flash_attention_efficiency() == (0.40, 0.33)
    f.write_text('[gpus.H100-SXM]\nattention_kernel = "fa2"\n')
    with pytest.raises(HetplanError, match="per job"):
        load_catalog(f)
    f.write_text('[gpus.H100-SXM]\nattention_kernels = { fa9 = [0.4, 0.3] }\n')
    with pytest.raises(HetplanError):
        load_catalog(f)
    f.write_text('[gpus.H100-SXM]\nattention_kernels = { fa2 = [1.4, 0.3] }\n')
    with pytest.raises(HetplanError):
        load_catalog(f)


def test_under_context_parallelism_only_the_diagonal_block_is_causal():
    """A CP rank's attention: its one diagonal block causal (η, tile fraction), the other ``attention_blocks - 1``
    half-blocks without a mask at the non-causal rate: 4 blocks (CP 4, balanced) cost 3/2 unmasked blocks more
    than 1 (no CP) at the same local length."""
    from hetplan.model.spec import load_model

    m, g = load_model("llama3-8b"), _gpu("H100-SXM")
    b, s = 1, 8192
    nf, nb = compute.flash_attention_time_s(m, g, "bf16", b, s, 1, causal=False)
    one, four = (compute.layer_time_s(m, g, "bf16", b, s, 1, 0,
                                      LayerTerms(Link.one_node(450e9), attention="flash", attention_blocks=k))
                 for k in (1, 4))
    assert four[0] - one[0] == pytest.approx(1.5 * nf, rel=1e-3)
    assert four[1] - one[1] == pytest.approx(1.5 * nb, rel=1e-3)


@pytest.mark.parametrize("s, w", [(8192, 128), (8192, 1024), (8192, 4096), (4096, 4096), (2048, 8192), (8192, 200)])
def test_window_work_fraction_counts_the_tiles_a_sliding_window_kernel_computes(s, w):
    """Brute force: FlashAttention's forward visits, for each block of B query rows, the key blocks from
    ``(first row - w) // B`` to the diagonal (``n_block_min`` from ``window_size_left``); the fraction of the s x s
    product those tiles cover is the formula's within a tile's rounding."""
    from hetplan.estimate.compute import FLASH_TILE as B, causal_work_fraction, window_work_fraction

    tiles = sum(i - max(0, (i * B - w) // B) + 1 for i in range(s // B))
    brute = min(tiles * B * B / (s * s), float(causal_work_fraction(s)))
    assert float(window_work_fraction(s, w)) == pytest.approx(brute, rel=0.06, abs=2 * B / s)
    assert float(window_work_fraction(s, w)) <= float(causal_work_fraction(s))
