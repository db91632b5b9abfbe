"""PyTorch's async TP (``Job.async_tp``): Inductor's micro-pipeline pass fuses the sequence-parallel all-gathers
and reduce-scatters with their matmuls (``compute.async_tp_exposed_s`` / ``async_tp_extra_s``)."""

import pytest

from hetplan.estimate import compute
from hetplan.hardware.catalog import load_catalog
from hetplan.model.spec import load_model
from hetplan.plan import GPUPool, Job, Plan, Stage
from hetplan.estimate.stagework import LayerTerms, Link

LINK = Link.one_node(450e9)  # the TP group in one node, 450 GB/s per direction

CAT = load_catalog()
GPU = compute.pool_gpu(CAT, GPUPool(gpu="H100-SXM", count=8))


def test_exposure_worked_example():
    """Llama 3 8B shares of the linear time: QKV 25.2M, projection 16.8M, FC1 117.4M, FC2 58.7M weights of 218M.
    A fused collective hides behind (t-1)/t of its GEMM; the backward reduce-scatters of the QKV / FC1 input
    gradients (sums of matmuls) stay exposed in full."""
    m = load_model("llama3-8b")
    w = [4096 * 6144, 4096 * 4096, 4096 * 2 * 14336, 14336 * 4096]
    linear, t, ag, rs = 10e-3, 8, 1.5e-3, 1.6e-3
    g = [linear * x / sum(w) for x in w]
    fwd, bwd, sac = compute.async_tp_exposed_s(m, ag, rs, linear, t)
    hide = lambda c, x: max(0.0, c - x * 7 / 8)  # noqa: E731
    assert fwd == pytest.approx(hide(ag, g[0]) + hide(ag, g[2]) + hide(rs, g[1]) + hide(rs, g[3]), rel=1e-12)
    assert bwd == pytest.approx(hide(ag, g[1]) + hide(ag, g[3]) + 2 * rs, rel=1e-12)
    # per-op SAC's recomputed all-gathers pair with the small wk (4096 x 1024) and w3 (4096 x 14336) GEMMs
    wk, w3 = 4096 * 1024, 4096 * 14336
    total = 4096 * 4096 * 2 + 4096 * 1024 * 2 + 3 * 4096 * 14336
    assert sac == pytest.approx(hide(ag, linear * wk / total) + hide(ag, linear * w3 / total), rel=1e-12)


def test_async_tp_hides_the_collectives_and_the_copies_of_a_large_layer():
    m = load_model("llama3-70b")
    kw = dict(sequence_parallel=True, attention="flash", sequence_dim_copies=True)
    van = compute.layer_time_s(m, GPU, "bf16", 16, 8192, 8, 0, LayerTerms(LINK, **kw))
    asy = compute.layer_time_s(m, GPU, "bf16", 16, 8192, 8, 0, LayerTerms(LINK, async_tp=True, **kw))
    free = LayerTerms(Link.one_node(1e30), sequence_parallel=True, attention="flash")
    bare = compute.layer_time_s(m, GPU, "bf16", 16, 8192, 8, 0, free)
    assert asy[0] < van[0] and asy[1] < van[1]
    assert asy[2] < 0.5 * van[2]
    # never faster than the layer without any TP communication, beyond the chunked GEMMs' and copies' own cost
    assert asy[0] >= bare[0] and asy[1] >= bare[1]
    # without TP, or without sequence parallelism, async TP changes nothing
    one = dict(attention="flash", sequence_dim_copies=True)
    assert compute.layer_time_s(m, GPU, "bf16", 16, 8192, 1, 0,
                                LayerTerms(LINK, sequence_parallel=True, async_tp=True, **one)) == \
        compute.layer_time_s(m, GPU, "bf16", 16, 8192, 1, 0, LayerTerms(LINK, sequence_parallel=True, **one))
    assert compute.layer_time_s(m, GPU, "bf16", 16, 8192, 8, 0, LayerTerms(LINK, async_tp=True, **one)) == \
        compute.layer_time_s(m, GPU, "bf16", 16, 8192, 8, 0, LayerTerms(LINK, **one))


def test_chunked_gemms_and_extra_launches_make_async_tp_lose_on_tiny_layers():
    """At one short sequence the chunks of T/t rows and the extra kernels per step cost more than they hide."""
    m = load_model("llama3-8b")
    kw = dict(sequence_parallel=True, attention="flash", sequence_dim_copies=True)
    van = compute.layer_time_s(m, GPU, "bf16", 1, 1024, 8, 0, LayerTerms(LINK, **kw))
    asy = compute.layer_time_s(m, GPU, "bf16", 1, 1024, 8, 0, LayerTerms(LINK, async_tp=True, **kw))
    assert asy[0] + asy[1] > van[0] + van[1]


def test_the_estimate_and_the_exporter_take_the_job_option():
    from hetplan.estimate.estimator import estimate
    from hetplan.runtime.exporters import export

    def exported(p):
        return "\n".join(export(p, load_model("llama3-70b"), "torchtitan").files.values())

    def plan(**kw):
        job = Job(model="llama3-70b", seq_len=8192, global_batch=64, framework="fsdp", **kw)
        return Plan(job=job, pools=[GPUPool(gpu="H100-SXM", count=64)], stages=[Stage(num_layers=80, tp=8, dp=8)],
                    mbs=8, zero=3, sequence_parallel=True)

    assert estimate(plan(async_tp=True)).iteration_time_s < estimate(plan()).iteration_time_s
    assert "--compile.enable_async_tensor_parallel" in exported(plan(async_tp=True)).split()  # torchtitan 0.3
    assert "--compile.enable_async_tensor_parallel" not in exported(plan()).split()


@pytest.mark.parametrize("kw", [dict(async_tp=True), dict(async_tp=True, framework="deepspeed"),
                                dict(async_tp=True, framework="fsdp", torch_compile=False)])
def test_async_tp_needs_fsdp_and_torch_compile(kw):
    with pytest.raises(ValueError, match="async_tp"):
        Job(model="llama3-8b", seq_len=8192, global_batch=8, **kw)


def test_cli_refuses_async_tp_outside_fsdp_with_exit_2():
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "hetplan.cli.main", "plan", "--model", "llama3-8b", "--seq-len", "8192",
                        "--global-batch", "64", "--gpu", "H100-SXM", "--gpus", "64", "--async-tp"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "async_tp" in r.stderr + r.stdout and "Traceback" not in r.stderr
