"""Every search prices a configuration as estimate() prices its plan, whatever options the job sets (issue 24).

Random jobs (hypothesis) set every job option (framework, stack, dtype, attention and kernel, compile, async TP,
MoE dispatch / routing / recompute / overlap / imbalance, recompute_modules and offload_modules, CP's K/V exchange
and load balance), on a dense and an MoE model. For each, the homogeneous search's rows, the fine-grained search's
states and the heterogeneous search's best plan are compared with ``estimate()`` of the same plan: iteration time
and memory per GPU to 1e-9 relative. The plans a search proposes carry the plan-level options at their defaults
(:meth:`hetplan.estimate.options.TrainingOptions.from_job`), so these are the options a search can be given.

Before TrainingOptions the searches dropped ``recompute_modules`` and ``offload_modules``: Qwen3-30B-A3B on 16
H100 with ``offload_modules = ["expert_fc1", "moe_act"]`` was 100.0 GiB in the search and 85.5 GiB in estimate()
(:func:`test_qwen3_offload_memory_is_estimates`).
"""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from hetplan.estimate.compute import pool_gpu
from hetplan.estimate.estimator import estimate
from hetplan.hardware.catalog import load_catalog
from hetplan.hardware.stacks import load_stacks
from hetplan.model.spec import load_model
from hetplan.plan import GPUPool, Inventory, Job
from hetplan.search import hetero
from hetplan.search.fine_cost import FineCostModel, FineStage, FineState
from hetplan.search.homogeneous import evaluate_pool
from hetplan.search.planner import _plan_from_row
from hetplan.search.space import Pins

CAT = load_catalog()
DENSE = load_model("gpt3-1.3b").model_copy(update={"num_layers": 8})
MOE = load_model("qwen3-30b-a3b").model_copy(update={"num_layers": 8})
MODELS = {"dense": DENSE, "moe": MOE}
REL = 1e-9


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=REL)


@st.composite
def jobs(draw) -> tuple:
    """A model and a valid job with every option drawn."""
    kind = draw(st.sampled_from(sorted(MODELS)))
    framework = draw(st.sampled_from(["megatron", "deepspeed", "fsdp"]))
    releases = [s.id for s in load_stacks().stacks if s.framework == framework]
    opts: dict = dict(
        framework=framework,
        stack=draw(st.one_of(st.none(), st.sampled_from(releases))),
        dtype=draw(st.sampled_from(["bf16", "fp16", "fp8"])),
        attention=draw(st.sampled_from(["flash", "standard", "eager"])),
        moe_load_imbalance=draw(st.sampled_from([1.0, 1.25, 2.0])),
        moe_dispatcher=draw(st.sampled_from(["alltoall", "deepep", "hybridep"])),
        moe_routing=draw(st.sampled_from(["random", "contiguous"])),
        moe_recompute=draw(st.booleans()),
        moe_a2a_overlap=draw(st.booleans()),
        cp_kv_exchange=draw(st.sampled_from(["ring", "allgather"])),
        cp_load_balance=draw(st.booleans()),
    )
    if opts["attention"] == "flash":
        opts["attention_kernel"] = draw(st.sampled_from([None, "fa2", "cudnn"]))
    if framework == "megatron":
        opts["recompute_modules"] = draw(st.lists(st.sampled_from(["layernorm", "moe_act"]), unique=True))
        opts["offload_modules"] = draw(st.lists(st.sampled_from(["expert_fc1", "moe_act"]), unique=True))
    if framework == "fsdp":
        opts["torch_compile"] = draw(st.booleans())
        opts["async_tp"] = opts["torch_compile"] and draw(st.booleans())
    seq_len = draw(st.sampled_from([1024, 4096]))
    try:
        job = Job(model=MODELS[kind].name, seq_len=seq_len, global_batch=draw(st.sampled_from([8, 32])),
                  train_iterations=10, **opts)
    except ValidationError:
        assume(False)
    return MODELS[kind], job


SETTINGS = settings(max_examples=40, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


@SETTINGS
@given(jobs(), st.integers(0, 2**31))
def test_homogeneous_rows_are_estimates(case, seed):
    m, job = case
    pool = GPUPool(gpu="H100-SXM", count=8)
    gpu = pool_gpu(CAT, pool, job=job)
    res = evaluate_pool(m, job, pool, gpu, Pins())
    assume(len(res.iteration_time_s))
    inv = Inventory(pools=[pool])
    rows = np.random.default_rng(seed).choice(len(res.iteration_time_s), size=min(4, len(res.iteration_time_s)),
                                              replace=False)
    for i in rows:
        plan = _plan_from_row(job, inv, m, res, int(i))
        est = estimate(plan, CAT, m, pipeline_model="closed_form")
        assert _close(float(res.memory["total"][i]), est.memory_bytes_per_gpu.total), plan
        assert bool(res.fits[i]) == est.fits_footprint  # the searches recommend no tight plan
        # The closed form ignores interleaving's per-chunk transfers; and under Megatron-Core's all-to-all overlap
        # a stage's unpaired warm-up passes depend on its index, which the search's middle-stage kinds price at
        # their first (slowest) stage: exact bottleneck, the other middle stages' sum a little high
        # (docs/planner.md, "Stage kinds"; at most 0.04 % on the rows hypothesis has found).
        per_index = m.is_moe and job.moe_a2a_overlap and plan.pp > 2
        if plan.virtual_stages == 1 and not per_index:
            assert _close(float(res.iteration_time_s[i]), est.iteration_time_s), plan
        elif plan.virtual_stages == 1:
            assert est.iteration_time_s * (1 - 1e-9) <= float(res.iteration_time_s[i]) <= est.iteration_time_s * 1.005, plan


@SETTINGS
@given(jobs(), st.integers(0, 2**31))
def test_fine_states_are_estimates(case, seed):
    m, job = case
    rng = random.Random(seed)
    pool = GPUPool(gpu="H100-SXM", count=8)
    cm = FineCostModel(m, job, pool, pool_gpu(CAT, pool, job=job))
    L = m.num_layers
    for _ in range(2):
        p = rng.randint(1, 3)
        cuts = sorted(rng.sample(range(1, L), p - 1))
        stages = [FineStage(b - a, t, 1) for a, b, t in zip([0] + cuts, cuts + [L], [rng.choice([1, 2])] * p)]
        state = FineState(tuple(stages), rng.choice([2, 4, 8]), rng.choice([0, 1]))
        c = cm.cost(state)
        est = estimate(cm.to_plan(state), CAT, m)
        assert _close(c.iteration_time_s, est.iteration_time_s)
        assert all(_close(a, b.memory.total) for a, b in zip(c.memory_bytes, est.stages))


@SETTINGS
@given(jobs())
def test_heterogeneous_best_is_the_estimate(case):
    m, job = case
    inv = Inventory(pools=[GPUPool(gpu="H100-SXM", count=4, gpus_per_node=4),
                           GPUPool(gpu="A100-SXM-80GB", count=4, gpus_per_node=4)])
    assume(job.dtype != "fp8")  # the A100 has no FP8
    res = hetero.search_hetero(m, job, inv, CAT, goal="fastest")
    assume(res.best is not None)
    est = estimate(res.best.to_plan(job, inv), CAT, m, pipeline_model="closed_form")
    assert est.fits
    assert _close(res.best.iteration_time_s, est.iteration_time_s)


def test_qwen3_offload_memory_is_estimates():
    """The issue's case: the search's memory of every configuration is estimate()'s, offloading included."""
    m = load_model("qwen3-30b-a3b")
    job = Job(model="qwen3-30b-a3b", seq_len=4096, global_batch=512, train_tokens=1e11,
              offload_modules=["expert_fc1", "moe_act"])
    pool = GPUPool(gpu="H100-SXM", count=16)
    res = evaluate_pool(m, job, pool, pool_gpu(CAT, pool, job=job), Pins(pp=1, tp=1, cp=1))
    inv = Inventory(pools=[pool])
    for i in range(len(res.iteration_time_s)):
        plan = _plan_from_row(job, inv, m, res, i)
        est = estimate(plan, CAT, m)
        assert res.memory["total"][i] == pytest.approx(est.memory_bytes_per_gpu.total, rel=REL), plan
