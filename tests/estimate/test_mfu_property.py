"""MFU is model FLOPs / (iteration time · peak · GPUs) exactly, for jobs far past int64 FLOP counts.

The model FLOPs of an iteration reach 1e20 for a 1T-parameter model on a 64M-token batch (int64 holds 9.2e18):
``hetplan.model.counts`` multiplies in float64 whatever numpy integers it is given. The reference here is the
exact Python-integer count of the same formula."""

from __future__ import annotations

from hypothesis import HealthCheck, assume, given, settings, strategies as st

from hetplan.estimate.estimator import estimate
from hetplan.hardware.catalog import load_catalog
from hetplan.model import counts
from hetplan.model.spec import ModelSpec
from hetplan.plan import GPUPool, Job, Plan, Stage, balanced_split
from hetplan.search.homogeneous import evaluate_pool
from hetplan.search.space import Pins

CAT = load_catalog()


@st.composite
def jobs(draw):
    heads = draw(st.sampled_from([16, 32, 64, 128, 192]))
    head_dim = 128
    h = heads * head_dim
    layers = draw(st.integers(2, 160))
    m = ModelSpec(name="p", family="llama", num_layers=layers, hidden_size=h, num_attention_heads=heads,
                  num_kv_heads=8, head_dim=head_dim, ffn_hidden_size=draw(st.sampled_from([3, 4])) * h,
                  vocab_size=128256, max_seq_len=1 << 17, gated_mlp=True, norm="rmsnorm", linear_bias=False,
                  learned_positions=0, tied_embeddings=False, dropout=False)
    s = draw(st.sampled_from([1024, 4096, 8192, 32768]))
    tokens = draw(st.integers(1, 64 * 2**20 // s // 64)) * 64 * s  # up to 64M tokens, 64 | global batch
    return m, s, tokens // s


def _exact_model_flops(m, gbs, s):
    return counts.model_flops_per_iteration(m, int(gbs), int(s))  # Python ints: exact


@settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(jobs(), st.sampled_from([1, 2, 8]), st.sampled_from([1, 2, 4]))
def test_mfu_times_time_peak_gpus_is_the_model_flops(job, tp, pp):
    m, s, gbs = job
    pp = min(pp, m.num_layers)
    dp = 64
    assume(counts.total_parameters(m) <= 1.1e12)  # models up to ~1T parameters
    gpu = CAT.get("H100-SXM")
    plan = Plan(job=Job(model="p", seq_len=s, global_batch=gbs), pools=[GPUPool(gpu="H100-SXM", count=tp * pp * dp)],
                stages=[Stage(num_layers=n, tp=tp, dp=dp) for n in balanced_split(m.num_layers, pp)], mbs=1)
    est = estimate(plan, model=m, pipeline_model="closed_form")
    exact = _exact_model_flops(m, gbs, s)
    got = est.mfu * est.iteration_time_s * gpu.peak_flops_per_s("bf16") * plan.num_gpus
    assert abs(got - exact) <= 1e-9 * exact

    # The search's vectorised path, on the same job and layout.
    res = evaluate_pool(m, plan.job, plan.pools[0], gpu, Pins(tp=tp, pp=pp, dp=dp, mbs=1, zero=0, recompute="none",
                                                                        virtual_stages=1))
    assert len(res) == 1
    got = res.mfu[0] * res.iteration_time_s[0] * gpu.peak_flops_per_s("bf16") * res.num_gpus[0]
    assert abs(got - exact) <= 1e-9 * exact


def test_a_405b_iteration_counts_past_int64():
    from hetplan.model.spec import load_model
    import numpy as np

    m = load_model("llama3-405b")
    exact = _exact_model_flops(m, 2048, 8192)
    assert exact > 2**63  # the case that wrapped around
    vec = counts.model_flops_per_iteration(m, np.array([2048]), np.array([8192]))
    assert abs(vec[0] - exact) <= 1e-12 * exact
