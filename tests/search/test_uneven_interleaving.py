"""Uneven interleaved pipelines in the uniform search: layer counts that no equal split of pp x v chunks (with
the embedding / loss counted as layers) expresses are enumerated as per-chunk layer lists where the job's
framework takes them (frameworks.toml splits = any: Megatron-Core's --pipeline-model-parallel-layout,
torchtitan's module_fqns_per_model_part), priced as estimate() prices the plan, exported exactly."""

from __future__ import annotations

import numpy as np
import pytest

from hetplan.estimate.compute import pool_gpu
from hetplan.estimate.estimator import estimate
from hetplan.hardware.catalog import load_catalog
from hetplan.model.spec import load_model
from hetplan.plan import GPUPool, Inventory, Job, balanced_chunks, balanced_split, ends_split
from hetplan.plan_rules import violations
from hetplan.runtime import exporters, importers
from hetplan.runtime.argspec import megatron_argv, parse_megatron_args
from hetplan.search.homogeneous import evaluate_pool
from hetplan.search.planner import _plan_from_row, search_plans
from hetplan.search.space import Pins, enumerate_space

NVIDIA_DSV3 = "Et|(tt|)*30L"  # Megatron-LM DeepSeek-V3 recipe layout at PP 8 x VP 4 (without the MTP layer)


def test_splits_cover_the_layers_and_nvidia_layout_is_the_ends_split():
    assert ends_split(61, 8, 4) == importers.parse_layout(NVIDIA_DSV3, 8)
    for L in (7, 32, 61, 94, 126):
        for pp in range(2, 9):
            for v in range(2, L // pp + 1):
                bal = balanced_chunks(L, pp, v)
                assert bal is not None and [sum(c) for c in bal] == balanced_split(L, pp)
                assert all(len(c) == v and min(c) >= 1 and max(c) - min(c) <= 1 for c in bal)
                ends = ends_split(L, pp, v)
                if ends is not None:
                    flat = [n for c in ends for n in c]
                    assert sum(flat) == L and min(flat) >= 0 and len(set(flat[1:-1])) == 1


def test_space_has_uneven_interleaving_only_where_the_framework_takes_layer_lists():
    m = load_model("deepseek-v3")
    kw = dict(seq_len=4096, pins=Pins(pp=8, tp=2, dp=64), available=1024, gpus_per_node=8, attention="flash")
    with_lists = enumerate_space(m, 8192, **kw, uneven=True)
    assert {(4, 0), (4, 1)} <= set(zip(with_lists["virtual_stages"].tolist(), with_lists["split"].tolist()))
    assert set(enumerate_space(m, 8192, **kw)["virtual_stages"]) == {1}  # 61 layers: no equal split at PP 8
    assert set(enumerate_space(m, 8192, **kw, uneven=True, interleave=False)["virtual_stages"]) == {1}
    for pin in (1, 4, None):  # every row once, a pinned v included
        kw["pins"] = Pins(pp=8, tp=2, dp=64, virtual_stages=pin)
        space = enumerate_space(m, 8192, **kw, uneven=True)
        rows = np.stack([space[k] for k in sorted(space)], axis=1)
        assert len(np.unique(rows, axis=0)) == len(rows) and (pin is None or set(space["virtual_stages"]) == {pin})


def test_search_proposes_nvidia_deepseek_v3_layout_and_exports_it():
    """DeepSeek-V3, 1,024 H100, fp8, PP 8 x VP 4 pinned: the search's plans include NVIDIA's layout, each costs
    what estimate() says, and the Megatron-LM export writes that layout (accepted by the release's argument list)
    and reads back as the plan."""
    spec = load_model("deepseek-v3")
    job = Job(model="deepseek-v3", seq_len=4096, global_batch=8192, train_iterations=10, dtype="fp8")
    res = search_plans(job, Inventory(pools=[GPUPool(gpu="H100-SXM", count=1024)]), top_k=4,
                       pins=Pins(pp=8, virtual_stages=4), heterogeneous=False)
    nvidia = importers.parse_layout(NVIDIA_DSV3, 8)
    assert any(rp.plan.pipeline_chunks == nvidia for rp in res.plans)
    for rp in res.plans:
        assert rp.plan.pipeline_chunks is not None and violations(rp.plan, spec) == []
        assert estimate(rp.plan).iteration_time_s == rp.estimate.iteration_time_s
        script = exporters.export(rp.plan, spec, "megatron").files["megatron_launch.sh"]
        parse_megatron_args(megatron_argv(script))
        assert "--pipeline-model-parallel-layout" in script
        assert importers.import_files({"run.sh": script}).pipeline_chunks == rp.plan.pipeline_chunks
    best = next(rp.plan for rp in res.plans if rp.plan.pipeline_chunks == nvidia)
    assert "--pipeline-model-parallel-layout 'Et|(t*2|)*30L'" in exporters.export(best, spec, "megatron").files[
        "megatron_launch.sh"]


@pytest.mark.parametrize("framework, target", [("megatron", "megatron"), ("fsdp", "torchtitan")])
def test_uneven_rows_agree_with_estimate_and_export(framework, target):
    """Every sampled interleaved row whose split needs a layer list per chunk: estimate() of the plan built from
    it has the row's memory and no less than its lower bound; it passes the plan rules and exports (torchtitan:
    model parts) and imports back with its chunks."""
    m = load_model("mixtral-8x7b")
    job = Job(model="mixtral-8x7b", seq_len=4096, global_batch=64, train_iterations=10, framework=framework)
    pool = GPUPool(gpu="H100-SXM", count=16)
    cat = load_catalog()
    res = evaluate_pool(m, job, pool, pool_gpu(cat, pool), Pins())
    rows = [int(i) for i in np.nonzero(res.config["virtual_stages"] > 1)[0]]
    plans = {i: _plan_from_row(job, Inventory(pools=[pool]), m, res, i) for i in rows}
    uneven = [i for i in rows if plans[i].pipeline_chunks is not None]
    assert uneven and set(res.config["split"][uneven]) == {0, 1}
    for i in np.random.default_rng(0).choice(uneven, size=12, replace=False):
        plan = plans[int(i)]
        e = estimate(plan, cat, m)
        assert res.lower_bound_time_s[i] <= e.iteration_time_s * (1 + 1e-6)
        assert res.memory["total"][i] == pytest.approx(e.memory_bytes_per_gpu.total, rel=1e-9)
        assert violations(plan, m) == []
        back = importers.import_files(exporters.export(plan, m, target).files)
        assert back.pipeline_chunks == plan.pipeline_chunks and back.virtual_stages == plan.virtual_stages


def test_multi_token_prediction_in_a_launch_is_read_and_an_m_in_the_layout_refused_by_name():
    """DeepSeek-V3's MTP module: a plan that does not train it exports no --mtp-num-layers and says so; a launch
    with --mtp-num-layers and its 'm' at the end of the layout (Megatron-Core asserts the layout holds the MTP
    modules) imports as a job that trains it (priced on the last stage, Job.mtp_layers); an 'm' elsewhere, or a
    count other than --mtp-num-layers, is refused naming the flag, never a plan of another run."""
    from hetplan.errors import HetplanError
    from hetplan.plan import Plan, Stage

    spec = load_model("deepseek-v3")
    chunks = importers.parse_layout(NVIDIA_DSV3, 8)
    job = Job(model="deepseek-v3", seq_len=4096, global_batch=8192, train_iterations=10, dtype="fp8")
    plan = Plan(job=job, pools=[GPUPool(gpu="H100-SXM", count=1024)], mbs=1, zero=1, ep=64, virtual_stages=4,
                sequence_parallel=True, pipeline_chunks=chunks,
                stages=[Stage(num_layers=sum(c), tp=2, dp=64, recompute="full") for c in chunks])
    ex = exporters.export(plan, spec, "megatron")
    script = ex.files["megatron_launch.sh"]
    assert spec.mtp_layers == 1 and "--mtp-num-layers" not in script  # the priced run: no MTP, and said so
    assert any("multi-token-prediction" in n for n in ex.notes)
    assert importers.import_files({"run.sh": script}).pipeline_chunks == chunks
    back = importers.import_files({"run.sh": script.replace("--num-layers", "--mtp-num-layers 1 --num-layers")
                                   .replace("*30L'", "*30mL'")})
    assert back.job.mtp_layers == 1 and back.pipeline_chunks == chunks
    for layout, mtp in (("Et|(tt|)*30mL", 0), ("Et|(tt|)*30L", 1), ("Etm|(tt|)*30L", 1)):
        with pytest.raises(HetplanError, match="MTP module") as e:
            importers.parse_layout(layout, 8, mtp)
        assert e.value.field == "--pipeline-model-parallel-layout"
    assert importers.parse_layout("Et|(tt|)*30mL", 8, 1) == chunks


@pytest.mark.parametrize("framework, pins, rule, words", [
    ("deepspeed", dict(virtual_stages=2), "stack-has-option", "interleaved 1F1B, which stack deepspeed@0.16 lacks"),
    ("megatron", dict(pp=1, virtual_stages=2), "virtual-stages", "needs pipeline parallelism"),
    ("megatron", dict(pp=16, virtual_stages=3), "virtual-stages", "at least 3 layers on each of the 16 stages"),
])
def test_pinned_virtual_stages_name_the_rule(framework, pins, rule, words):
    from hetplan.plan_rules import PlanRuleError

    job = Job(model="llama3-8b", seq_len=4096, global_batch=512, train_iterations=10, framework=framework)
    with pytest.raises(PlanRuleError, match=words) as e:
        search_plans(job, Inventory(pools=[GPUPool(gpu="H100-SXM", count=64)]), pins=Pins(**pins),
                     heterogeneous=False)
    assert e.value.rule == rule and e.value.field == "pin.virtual_stages"


@pytest.mark.parametrize("model, gpus", [("mixtral-8x7b", 32), ("llama2-13b", 16)])
def test_memory_cut_of_interleaved_rows_is_exact(model, gpus):
    """Interleaved rows whose plain-1F1B sibling needs more than the near-miss limit are not computed: computed
    anyway, each needs more than the limit too, and every other row's peak is the one computed without the cut."""
    from hetplan.estimate.estimator import pool_link
    from hetplan.estimate.options import TrainingOptions
    from hetplan.estimate.stagework import StageHardware
    from hetplan.search.homogeneous import NEAR_MISS_MEMORY_FACTOR, _peak_memory_bytes, _pruned_peak_memory_bytes

    m = load_model(model)
    job = Job(model=model, seq_len=4096, global_batch=gpus * 4, train_iterations=10)
    pool = GPUPool(gpu="H100-SXM", count=gpus)
    gpu = load_catalog().get("H100-SXM")
    cfg = enumerate_space(m, job.global_batch, gpus, 8, Pins(), "flash", seq_len=4096, uneven=True)
    base = cfg.pop("base")
    hw, opt = StageHardware(gpu, pool_link(pool, gpu)), TrainingOptions.from_job(job)
    limit = NEAR_MISS_MEMORY_FACTOR * gpu.memory_bytes
    cut = _pruned_peak_memory_bytes(m, job, cfg, hw, opt, base, Pins(), limit)
    full = _peak_memory_bytes(m, job, cfg, hw, opt)
    skipped = np.isinf(cut)
    assert skipped.any() and np.all(full[skipped] > limit)
    assert np.array_equal(cut[~skipped], full[~skipped])
