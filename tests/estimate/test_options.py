"""TrainingOptions: every field of Job and Plan is an option, structural or cost-neutral, and every option is
costed (changing it alone moves estimate()'s iteration time or memory)."""

import dataclasses

import pytest

from hetplan.estimate.estimator import estimate
from hetplan.estimate.options import COST_NEUTRAL, STRUCTURAL, TrainingOptions
from hetplan.plan import GPUPool, Job, Plan, Stage


def test_every_job_and_plan_field_is_an_option_structural_or_cost_neutral():
    options = {f.name for f in dataclasses.fields(TrainingOptions)}
    sets = (options, set(STRUCTURAL), set(COST_NEUTRAL))
    for a in range(3):
        for b in range(a + 1, 3):
            assert not sets[a] & sets[b], sets[a] & sets[b]
    every = (set(Job.model_fields) | set(Plan.model_fields)) - {"job"}
    missing = every - set().union(*sets)
    assert not missing, f"add {sorted(missing)} to TrainingOptions, STRUCTURAL or COST_NEUTRAL"
    assert set().union(*sets) - every == set()  # nothing listed that Job / Plan lacks


def _plan(kind: str, job: dict | None = None, plan: dict | None = None) -> Plan:
    """A small plan of each kind the options act on (dense Megatron with CP, MoE with EP, FSDP pipeline)."""
    if kind == "moe":
        base_job = dict(model="qwen3-30b-a3b", seq_len=4096, global_batch=64)
        base = dict(pools=[GPUPool(gpu="H100-SXM", count=16)], stages=[Stage(num_layers=24, tp=1, dp=8)] * 2,
                    mbs=1, zero=1, ep=8)
    elif kind == "fsdp":
        base_job = dict(model="llama3-8b", seq_len=4096, global_batch=64, framework="fsdp")
        base = dict(pools=[GPUPool(gpu="H100-SXM", count=16)], stages=[Stage(num_layers=16, tp=2, dp=4)] * 2,
                    mbs=1, zero=3, sequence_parallel=True)
    else:
        base_job = dict(model="llama3-8b", seq_len=8192, global_batch=64)
        base = dict(pools=[GPUPool(gpu="H100-SXM", count=16)], stages=[Stage(num_layers=16, tp=2, dp=2)] * 2,
                    mbs=1, zero=1, sequence_parallel=True, cp=2)
    return Plan(job=Job(**{**base_job, **(job or {})}), **{**base, **(plan or {})})


#: One non-default value of every option, on a plan where it acts: (plan kind, job or plan, value[, changes of
#: the plan kind that both plans get]).
CHANGES = {
    "dtype": ("dense", "job", "fp8"),
    "fp8_recipe": ("dense", "job", "current", {"job": {"dtype": "fp8"}}),
    "attention": ("dense", "job", "standard"),
    "attention_kernel": ("dense", "job", "fa2"),
    "framework": ("dense", "job", "deepspeed"),
    "torch_compile": ("fsdp", "job", False),
    "async_tp": ("fsdp", "job", True),
    "moe_load_imbalance": ("moe", "job", 2.0),
    "moe_dispatcher": ("moe", "job", "deepep"),
    "moe_routing": ("moe", "job", "contiguous", {"job": {"moe_dispatcher": "deepep"}}),
    "moe_recompute": ("moe", "job", True),
    "moe_a2a_overlap": ("moe", "job", True),
    "moe_capacity_factor": ("moe", "job", 1.0),
    "moe_pad_to_capacity": ("moe", "job", True, {"job": {"moe_capacity_factor": 2.0}}),
    "mtp_layers": ("moe", "job", 1),
    "recompute_modules": ("moe", "job", ["layernorm", "moe_act"]),
    "offload_modules": ("moe", "job", ["expert_fc1", "moe_act"]),
    "cp_kv_exchange": ("dense", "job", "allgather"),
    "cp_load_balance": ("dense", "job", False),
    "stack": ("dense", "job", "megatron-lm@2021-06"),
    "overlap_grad_reduce": ("dense", "plan", False),
    "tp_comm_overlap": ("dense", "plan", True),
    "cuda_graphs": ("dense", "plan", True),
    "fsdp_shard": ("fsdp", "plan", 2),
    "reshard_after_forward": ("fsdp", "plan", False, {"plan": {"stages": [Stage(num_layers=32, tp=2, dp=8)]}}),
    "grad_reduce_dtype": ("dense", "plan", "bf16"),
    "fsdp_param_dtype": ("fsdp", "plan", "bf16"),
    "cross_entropy": ("fsdp", "plan", "fp32"),
    "pipeline_step_microbatches": ("fsdp", "plan", 4),
    "pipeline_outputs": ("fsdp", "plan", "all"),
}


def test_every_option_has_a_change_to_check():
    assert set(CHANGES) == {f.name for f in dataclasses.fields(TrainingOptions)}


@pytest.mark.parametrize("name", sorted(CHANGES))
def test_every_option_is_costed(name):
    kind, where, value, *extra = CHANGES[name]
    both = extra[0] if extra else {}
    base = _plan(kind, **both)
    changed = _plan(kind, **{**both, where: {**both.get(where, {}), name: value}})
    assert getattr(TrainingOptions.from_plan(changed), name) != getattr(TrainingOptions.from_plan(base), name)

    def costs(plan):
        est = estimate(plan)
        return [est.iteration_time_s] + [(st.memory.total, st.forward_s, st.backward_s) for st in est.stages]

    assert costs(base) != costs(changed)


def test_from_job_is_from_plan_of_a_default_plan_and_hashable():
    plan = _plan("moe", job={"offload_modules": ["moe_act"], "moe_dispatcher": "deepep"})
    opts = TrainingOptions.from_job(plan.job)
    assert opts == TrainingOptions.from_plan(plan)
    assert opts.offload_modules == ("moe_act",) and opts.moe.dispatcher == "deepep"
    assert len({opts, TrainingOptions.from_plan(plan)}) == 1
    assert TrainingOptions.from_plan(_plan("dense", plan={"cuda_graphs": True})) != TrainingOptions.from_job(
        _plan("dense").job)
    with pytest.raises(dataclasses.FrozenInstanceError):
        opts.dtype = "fp16"  # type: ignore[misc]


@pytest.mark.parametrize("function, bound", [
    ("hetplan.estimate.stage:stage_costs", 6),
    ("hetplan.estimate.memory:stage_memory_bytes", 4),
    ("hetplan.estimate.compute:layer_time_s", 8),
])
def test_cost_functions_take_few_parameters(function, bound):
    """Issue #24's bounds: an option travels in TrainingOptions / LayerTerms, not as one more parameter."""
    import importlib
    import inspect

    module, name = function.split(":")
    params = inspect.signature(getattr(importlib.import_module(module), name)).parameters
    assert len(params) <= bound, f"{name} takes {len(params)} parameters: {list(params)}"
