"""The speed figures as pytest-benchmark cases (rounds, min / mean / spread, machine info, JSON with --benchmark-json).

Run them all with one command (not part of the test suite: ``testpaths`` is ``tests``):

    OMP_NUM_THREADS=1 python -m pytest benchmarks/test_speed.py --benchmark-only

The ``bench_*.py`` scripts print the domain figures (plans/s, search answers against the seed systems); these
cases time the same calls: the estimator (``bench_estimate.py``) and the core planner (``bench_plan.py``).
``extra_info`` carries the items per call, so plans/s = items / mean.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402

from bench_estimate import vectorised  # noqa: E402
from hetplan.estimate.estimator import estimate, estimate_many  # noqa: E402
from hetplan.calibration.validation import gpt_model, megatron_plan  # noqa: E402
from hetplan.plan import GPUPool, Inventory, Job  # noqa: E402
from hetplan.search.planner import search_plans  # noqa: E402

M96 = gpt_model(96, 12288, 96, 2048)


def _plan(tp=8, pp=8, dp=4, mbs=1, rc="full"):
    return megatron_plan(M96, gpu="A100-SXM-80GB", tp=tp, pp=pp, dp=dp, mbs=mbs, gbs=128, recompute=rc, seq=2048,
                         inter_node_bandwidth_bytes_per_s=200e9, dtype="bf16")


@pytest.mark.parametrize("pipeline_model", ["simulate", "closed_form"])
def test_estimate_one_plan(benchmark, pipeline_model):
    plan = _plan()
    benchmark.extra_info["items"] = 1
    est = benchmark(estimate, plan, model=M96, pipeline_model=pipeline_model)
    assert est.fits


@pytest.mark.parametrize("shape", ["mixed", "pp8"])
def test_estimate_many(benchmark, shape):
    if shape == "mixed":  # 16 pipeline shapes (pp 4-16, 8-64 micro-batches)
        grid = [(tp, pp, dp, mbs, rc) for tp in (1, 2, 4, 8) for pp in (4, 8, 12, 16) for dp in (2, 4, 8)
                for mbs in (1, 2) for rc in ("none", "selective", "full")] * 4
    else:  # one shape: pp 8, 32 micro-batches
        grid = [(tp, 8, 4, 1, rc) for tp in (1, 2, 4, 8) for rc in ("none", "selective", "full")] * 96
    plans = [_plan(*g) for g in grid]
    benchmark.extra_info["items"] = len(plans)
    out = benchmark(estimate_many, plans, model=M96)
    assert len(out) == len(plans)


def test_vectorised_stage_costs(benchmark):
    benchmark.extra_info["items"] = 20000
    rate = benchmark.pedantic(vectorised, kwargs=dict(n=20000, repeat=1), rounds=5)
    assert rate > 0


def test_plan_gpt3_175b_on_1024_a100(benchmark):
    job = Job(model="gpt3-175b", seq_len=2048, global_batch=1536, train_tokens=300e9)
    inv = Inventory(pools=[GPUPool(gpu="A100-SXM-80GB", count=1024, gpus_per_node=8,
                                   inter_node_bandwidth_bytes_per_s=200e9)])
    res = benchmark.pedantic(search_plans, args=(job, inv), kwargs=dict(top_k=5), rounds=5, warmup_rounds=1)
    benchmark.extra_info["items"] = res.configurations_evaluated
    assert res.plans


def test_capacity_example(benchmark):
    """``hetplan capacity examples/serve/capacity.toml`` (issue #25: at most 5 s of CPU; bench_serve_capacity.py
    prints the CPU time). Each round from a cold step-model memo, as a fresh process."""
    from pathlib import Path

    from hetplan.serve import capacity, replica
    from hetplan.serve.config import load_workload_config

    wf = load_workload_config(Path(__file__).resolve().parents[1] / "examples" / "serve" / "capacity.toml")

    def run():
        replica._STEP_MODELS.clear()
        return capacity.plan_capacity(wf)

    benchmark.extra_info["items"] = 1
    out = benchmark.pedantic(run, rounds=2, iterations=1)
    assert out["meets_target"]
