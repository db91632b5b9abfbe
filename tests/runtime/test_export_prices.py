"""The estimate prices what the export launches: for a grid of small plans per target, ``hetplan export`` then
``hetplan import`` gives a plan whose re-estimated iteration time and peak memory equal the original's (a field
the export changed or dropped would move them), and what a target cannot launch as priced is refused (exit 2,
rule ``framework-can-launch`` / ``stack-has-option``). torchtitan's DDP and HSDP are priced as launched."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from hetplan.errors import HetplanError
from hetplan.estimate.estimator import estimate
from hetplan.model import counts
from hetplan.model.spec import load_model
from hetplan.plan import GPUPool, Job, Plan, Stage
from hetplan.plan_rules import violations
from hetplan.runtime import exporters, importers

FRAMEWORK = {"megatron": "megatron", "torchtitan": "fsdp", "deepspeed": "deepspeed"}


def _grid(target: str):
    """Small plans ``target`` launches: Llama 3 8B (GPT-3 1.3B for DeepSpeed), PP 1-2, TP 1-2, DP 4, every
    ZeRO / sharding mode the target has (HSDP, no resharding after forward under torchtitan), recomputation."""
    model = "gpt3-1.3b" if target == "deepspeed" else "llama3-8b"
    L = load_model(model).num_layers
    if target == "torchtitan":
        modes = [dict(zero=0), dict(zero=3), dict(zero=2), dict(zero=3, fsdp_shard=2),
                 dict(zero=3, reshard_after_forward=False), dict(zero=0, reshard_after_forward=False)]
    elif target == "megatron":
        modes = [dict(zero=0), dict(zero=1), dict(zero=3)]
    else:
        modes = [dict(zero=0), dict(zero=1)]
    for pp, tp, mode, rec in itertools.product((1, 2), (1, 2), modes, ("none", "full")):
        if target == "deepspeed" and tp > 1:
            continue
        layers = [L // pp + (i < L % pp) for i in range(pp)]
        job = Job(model=model, seq_len=2048, global_batch=32, train_iterations=10, framework=FRAMEWORK[target])
        plan = Plan(job=job, pools=[GPUPool(gpu="H100-SXM", count=pp * tp * 4)], mbs=2,
                    stages=[Stage(num_layers=n, tp=tp, dp=4, recompute=rec) for n in layers],
                    sequence_parallel=tp > 1, **mode)
        if not violations(plan, load_model(model)):
            yield plan


def _priced(plan: Plan) -> tuple[float, float]:
    est = estimate(plan)
    return est.iteration_time_s, max(st.memory.total for st in est.stages)


@pytest.mark.parametrize("target", ["torchtitan", "megatron", "deepspeed"])
def test_export_import_prices_the_same(target):
    """Every plan of the grid: the launch read back is priced as the plan was (time and peak memory)."""
    plans = list(_grid(target))
    assert len(plans) >= 8
    for plan in plans:
        files = exporters.export(plan, load_model(plan.job.model), target).files
        back = importers.import_files(files)
        assert _priced(back) == pytest.approx(_priced(plan), rel=1e-9), (plan.zero, plan.fsdp_shard, plan.pp)


def test_launch_options_the_estimate_prices_travel():
    """Options the estimate prices and the exports dropped (or the import did not read back): the bf16 gradient
    reduction (Megatron-LM ``--grad-reduce-in-bf16``; torchtitan refuses one: its ``mixed_precision_reduce`` is
    ``Literal["float32"]``, so the ``bfloat16`` once written stopped the launch at parsing), torchtitan's loss
    outside ``torch.compile`` (``components = model``: ``cross_entropy = "fp32"``), both torchtitan releases;
    Megatron-LM's ``--attention-backend`` read back as the attention kernel."""
    for target, version, kw in (("megatron", None, dict(grad_reduce_dtype="bf16")),
                                ("deepspeed", None, dict(grad_reduce_dtype="bf16")),
                                ("torchtitan", "0.3", dict(cross_entropy="fp32")),
                                ("torchtitan", "0.2", dict(cross_entropy="fp32"))):
        plan = next(_grid(target)).model_copy(update=kw)
        if version == "0.2":  # the release that reads the TOML (hetplan.runtime.exporters.torchtitan)
            plan = plan.model_copy(update={"job": plan.job.model_copy(update={"stack": "torchtitan@2025-10"})})
        files = exporters.export(plan, load_model(plan.job.model), target, version=version).files
        back = importers.import_files(files)
        assert {k: getattr(back, k) for k in kw} == kw
        assert _priced(back) == pytest.approx(_priced(plan), rel=1e-9)
        if target == "torchtitan":
            with pytest.raises(HetplanError) as e:
                exporters.export(plan.model_copy(update={"grad_reduce_dtype": "bf16"}), load_model(plan.job.model),
                                 target, version=version)
            assert e.value.field == "plan.grad_reduce_dtype"
            launch = files.get("torchtitan.toml", files["launch.sh"])
            bf16 = ('mixed_precision_param = "bfloat16"\nmixed_precision_reduce = "bfloat16"' if version == "0.2"
                    else "--training.mixed_precision_reduce bfloat16 --training.mixed_precision_param bfloat16")
            edited = launch.replace('mixed_precision_param = "bfloat16"' if version == "0.2"
                                    else "--training.mixed_precision_param bfloat16", bf16)
            assert edited != launch
            with pytest.raises(HetplanError, match="float32 only"):  # a launch torchtitan refuses to parse
                importers.import_files({**files, ("torchtitan.toml" if version == "0.2" else "launch.sh"): edited})
    for kernel in ("cudnn", "fa3"):  # Megatron-Core --attention-backend fused / flash (flash-attn 3 on Hopper)
        plan = next(_grid("megatron"))
        plan = plan.model_copy(update={"job": plan.job.model_copy(update={"attention_kernel": kernel})})
        back = importers.import_files(exporters.export(plan, load_model(plan.job.model), "megatron").files)
        assert back.job.attention_kernel == kernel
        assert _priced(back) == pytest.approx(_priced(plan), rel=1e-9)


def _fsdp(zero: int, **kw) -> Plan:
    job = Job(model="llama3-8b", seq_len=4096, global_batch=32, train_iterations=10, framework="fsdp")
    return Plan(job=job, pools=[GPUPool(gpu="H100-SXM", count=8)], stages=[Stage(num_layers=32, dp=8)], mbs=1,
                zero=zero, **kw)


def test_torchtitan_ddp_is_priced_as_fsdp2_with_one_rank_shards():
    """Worked example, Llama 3 8B on 8 H100 (DP 8, 4 micro-batches): ZeRO-0 under fsdp is torchtitan's DDP
    (replicate degree 8, shard degree 1), which torchtitan 0.3.0 runs as FSDP2 on a replicate-only mesh: HSDP
    whose shard groups are one rank. So it is priced exactly as ``fsdp_shard = 1`` (brute force through the
    whole estimate); every rank holds the whole fp32 parameters (4 B), gradients (4 B) and AdamW moments (8 B)
    where FSDP over 8 ranks holds an eighth; each unit's fp32 gradient is all-reduced across the 8 replicas
    instead of reduce-scattered, and nothing is gathered over the network."""
    ddp, hsdp1, fsdp = estimate(_fsdp(0)), estimate(_fsdp(3, fsdp_shard=1)), estimate(_fsdp(3))
    assert ddp.iteration_time_s == pytest.approx(hsdp1.iteration_time_s, rel=1e-12)
    assert ddp.stages[0].memory.total == pytest.approx(hsdp1.stages[0].memory.total, rel=1e-12)
    d, f = ddp.stages[0].memory, fsdp.stages[0].memory
    assert d.optimizer == pytest.approx(8 * f.optimizer, rel=1e-12)  # 8 B / parameter, unsharded vs over 8
    params = d.optimizer / 8
    m = load_model("llama3-8b")
    assert params == pytest.approx(32 * counts.layer_parameters(m) + counts.embedding_parameters(m)
                                   + counts.head_parameters(m), rel=1e-3)  # all 8.0 B of them
    assert d.weights - f.weights == pytest.approx(4 * params * 7 / 8, rel=1e-9)  # fp32 parameters, 7/8 more
    assert d.total - f.total > 14 * params * 7 / 8  # + gradients 4 B and moments 8 B, 7/8 more
    # ZeRO-0 and the same plan exported and imported back: the replicate degree, priced the same
    files = exporters.export(_fsdp(0), load_model("llama3-8b"), "torchtitan").files
    assert "--parallelism.data_parallel_replicate_degree 8" in files["launch.sh"]
    back = importers.import_files(files)
    assert back.zero == 0 and estimate(back).iteration_time_s == pytest.approx(ddp.iteration_time_s, rel=1e-12)


def test_hsdp_exports_its_shard_group():
    """HSDP (``fsdp_shard`` 4 of DP 8) was written as FSDP over all 8; now replicate 2 x shard 4, read back."""
    files = exporters.export(_fsdp(3, fsdp_shard=4), load_model("llama3-8b"), "torchtitan").files
    assert "--parallelism.data_parallel_replicate_degree 2" in files["launch.sh"]
    assert "--parallelism.data_parallel_shard_degree 4" in files["launch.sh"]
    back = importers.import_files(files)
    assert (back.zero, back.fsdp_shard) == (3, 4)


def test_what_the_target_cannot_launch_as_priced_is_refused():
    """A named torchao recipe exported to Megatron-LM (which would write --fp8-recipe delayed), torchao's
    tensorwise on torchtitan 0.3.0 (removed there; was written as rowwise with a note), a gradient reduction
    after the backward on torchtitan (FSDP2 and DDP reduce during it), an attention kernel torchtitan's SDPA
    does not pick."""
    spec = load_model("llama3-8b")
    rowwise = _fsdp(3).model_copy(update={"job": _fsdp(3).job.model_copy(update={"dtype": "fp8",
                                                                                  "fp8_recipe": "rowwise"})})
    with pytest.raises(HetplanError, match="framework-can-launch") as e:
        exporters.export(rowwise, spec, "megatron")
    assert e.value.field == "plan.job.fp8_recipe"
    tensorwise = rowwise.model_copy(update={"job": rowwise.job.model_copy(update={"fp8_recipe": "tensorwise"})})
    with pytest.raises(HetplanError, match="stack-has-option"):
        exporters.export(tensorwise, spec, "torchtitan")
    with pytest.raises(HetplanError, match="overlap_grad_reduce"):
        exporters.export(_fsdp(3, overlap_grad_reduce=False), spec, "torchtitan")
    fa2 = _fsdp(3).model_copy(update={"job": _fsdp(3).job.model_copy(update={"attention_kernel": "fa2"})})
    with pytest.raises(HetplanError, match="cudnn") as e:  # torchtitan 0.3.0's SDPA runs cuDNN first on H100
        exporters.export(fa2, spec, "torchtitan")
    assert e.value.field == "plan.job.attention_kernel"


def test_cli_refuses_with_exit_2(tmp_path):
    """``hetplan export`` of the FP8 rowwise plan to Megatron-LM: exit 2, the rule and the field, no traceback."""
    import subprocess
    import sys

    plan = _fsdp(3)
    plan = plan.model_copy(update={"job": plan.job.model_copy(update={"dtype": "fp8", "fp8_recipe": "rowwise"})})
    path = tmp_path / "p.json"
    path.write_text(plan.model_dump_json())
    r = subprocess.run([sys.executable, "-m", "hetplan.cli.main", "export", str(path), "--to", "megatron"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "framework-can-launch" in r.stderr and "plan.job.fp8_recipe" in r.stderr
    assert "Traceback" not in r.stderr


def test_the_search_weighs_ddp_only_where_the_stack_runs_it():
    """Under fsdp the search's rows hold DDP (ZeRO-0 over DP > 1) beside FSDP2 where the stack runs ZeRO-0
    (torchtitan), none on llm-foundry (FULL_SHARD only), and FSDP2 never resharding after forward (ZeRO-2) only
    without a pipeline, where torchtitan's default policy would reshard (``space.fsdp_zero_stages``); the ten
    best plans of a small model, whatever mode each has, export to torchtitan and are priced the same read back.
    Pinned ``--zero 0`` gives DDP, refused on llm-foundry (``pin.zero``)."""
    from hetplan.hardware.catalog import load_catalog
    from hetplan.plan import Inventory
    from hetplan.search.homogeneous import evaluate_pool
    from hetplan.search.planner import search_plans
    from hetplan.search.space import Pins

    spec = load_model("open-llama-3b-v2")
    inv = Inventory(pools=[GPUPool(gpu="H100-SXM", count=8)])
    job = Job(model="open-llama-3b-v2", seq_len=2048, global_batch=256, train_iterations=10, framework="fsdp")
    plans = [p.plan for p in search_plans(job, inv, top_k=10, heterogeneous=False).plans]
    for stack, modes in ((None, {0, 2, 3}), ("llm-foundry@0.3", {3})):  # the rows with DP > 1 the search weighs
        rows = evaluate_pool(spec, job.model_copy(update={"stack": stack}), inv.pools[0],
                             load_catalog().get("H100-SXM"), Pins()).config
        assert set(rows["zero"][rows["dp"] > 1].tolist()) == modes
        assert set(rows["pp"][rows["zero"] == 2].tolist()) <= {1}
        if stack is None:  # torchtitan 0.3.0's DDP at any TP / PP (FSDP2 on a replicate mesh)
            assert np.any((rows["zero"] == 0) & (rows["dp"] > 1) & ((rows["tp"] > 1) | (rows["pp"] > 1)))
    assert any(p.zero == 2 for p in plans)  # a 3B model on 8 H100 keeps its gathered parameters: faster
    rows = evaluate_pool(spec, job.model_copy(update={"stack": "torchtitan@2025-10"}), inv.pools[0],
                         load_catalog().get("H100-SXM"), Pins()).config
    ddp = (rows["zero"] == 0) & (rows["dp"] > 1)  # torch DDP: 1-D meshes only
    assert np.any(ddp) and np.all(rows["tp"][ddp] == 1) and np.all(rows["pp"][ddp] == 1)
    for plan in plans:
        back = importers.import_files(exporters.export(plan, spec, "torchtitan").files)
        assert _priced(back) == pytest.approx(_priced(plan), rel=1e-9)
    ddp = search_plans(job, inv, top_k=3, heterogeneous=False, pins=Pins(zero=0)).plans
    assert all(p.plan.zero == 0 and p.plan.stages[0].dp > 1 for p in ddp)
    foundry = job.model_copy(update={"stack": "llm-foundry@0.3"})
    assert all(p.plan.zero == 3 for p in search_plans(foundry, inv, top_k=10, heterogeneous=False).plans)
    with pytest.raises(HetplanError) as e:
        search_plans(foundry, inv, top_k=1, heterogeneous=False, pins=Pins(zero=0, dp=8))
    assert e.value.field == "pin.zero"


def test_torch_ddp_of_torchtitan_before_2026_03():
    """torchtitan to v0.2.x (stack ``torchtitan@2025-10``, the TOML export) ran DDP as torch DDP's Reducer
    (``replicate(model, bucket_cap_mb=100)``, fp32 parameters under autocast, 1-D meshes only). Worked example,
    Llama 3 8B on 8 H100: every rank holds fp32 parameters and their bf16 casts (6 B), the fp32 ``.grad`` and
    the Reducer's bucket copy (8 B) and AdamW's moments (8 B); DP with TP is refused (rule stack-has-option);
    the 0.2 TOML writes the replicate degree and reads back to the same price."""
    spec = load_model("llama3-8b")
    old = _fsdp(0).model_copy(update={"job": _fsdp(0).job.model_copy(update={"stack": "torchtitan@2025-10"})})
    mem = estimate(old).stages[0].memory
    params = mem.optimizer / 8
    assert params == pytest.approx(32 * counts.layer_parameters(spec) + counts.embedding_parameters(spec)
                                   + counts.head_parameters(spec), rel=1e-9)
    assert (mem.weights, mem.gradients) == (pytest.approx(6 * params), pytest.approx(8 * params))
    files = exporters.export(old, spec, "torchtitan", version="0.2").files
    assert "data_parallel_replicate_degree = 8" in files["torchtitan.toml"]
    back = importers.import_files(files | {"launch.sh": files["launch.sh"]}, gpus=8)
    assert back.job.stack == "torchtitan@2025-10" and back.zero == 0
    assert _priced(back) == pytest.approx(_priced(old), rel=1e-9)
    tp2 = old.model_copy(update={"pools": [GPUPool(gpu="H100-SXM", count=16)],
                                 "stages": [Stage(num_layers=32, tp=2, dp=8)], "sequence_parallel": True})
    assert [v.rule for v in violations(tp2, spec)] == ["stack-has-option"]
    tp2_now = tp2.model_copy(update={"job": _fsdp(0).job})  # 0.3.0's DDP takes TP; the 0.2 TOML cannot
    with pytest.raises(HetplanError, match="1-D meshes") as e:
        exporters.export(tp2_now, spec, "torchtitan", version="0.2")
    assert e.value.field == "plan.zero"


def test_tp_overlap_needs_sequence_parallelism():
    """``tp_comm_overlap`` / ``async_tp`` with TP > 1 and no sequence parallelism was accepted and priced as no
    overlap, and the Megatron-LM export wrote ``--tp-comm-overlap`` without ``--sequence-parallel``, which
    Megatron-LM asserts against (``megatron/training/arguments.py``); now the plan is refused. At TP 1 (nothing to
    overlap; Megatron-LM turns sequence parallelism off there and would assert too) the flag is not written."""
    from pydantic import ValidationError

    job = Job(model="llama3-8b", seq_len=2048, global_batch=32, train_iterations=10)
    pools = [GPUPool(gpu="H100-SXM", count=8)]
    with pytest.raises(ValidationError, match="sequence_parallel = false"):
        Plan(job=job, pools=pools, stages=[Stage(num_layers=32, tp=2, dp=4)], mbs=1, tp_comm_overlap=True)
    with pytest.raises(ValidationError, match="job.async_tp"):
        Plan(job=_fsdp(3).job.model_copy(update={"async_tp": True}), pools=pools,
             stages=[Stage(num_layers=32, tp=2, dp=4)], mbs=1, zero=3)
    tp1 = Plan(job=job, pools=pools, stages=[Stage(num_layers=32, dp=8)], mbs=1, tp_comm_overlap=True)
    files = exporters.export(tp1, load_model("llama3-8b"), "megatron").files
    assert "--tp-comm-overlap" not in files["megatron_launch.sh"]
    assert _priced(importers.import_files(files)) == pytest.approx(_priced(tp1), rel=1e-9)


def test_torchtitan_refuses_what_it_launches_otherwise():
    """Plans torchtitan would launch as another plan than priced, each refused naming the field: Transformer
    Engine's TP overlap (written as nothing), stored s x s attention scores (torchtitan runs SDPA's fused
    kernels), TP without sequence parallelism on 0.2 (whose TP always runs it), ZeRO-0 with CP (torchtitan's FSDP
    mesh is shard degree x CP: sharded over the CP ranks)."""
    spec = load_model("llama3-8b")
    tp2 = dict(pools=[GPUPool(gpu="H100-SXM", count=8)], stages=[Stage(num_layers=32, tp=2, dp=4)])
    old = _fsdp(3).job.model_copy(update={"stack": "torchtitan@2025-10"})
    allgather = _fsdp(3).job.model_copy(update={"cp_kv_exchange": "allgather"})
    for plan, version, field in (
            (_fsdp(3).model_copy(update=dict(tp2, sequence_parallel=True, tp_comm_overlap=True)), None,
             "plan.tp_comm_overlap"),
            (_fsdp(3).model_copy(update={"job": _fsdp(3).job.model_copy(update={"attention": "standard"})}), None,
             "plan.job.attention"),
            (_fsdp(3).model_copy(update=dict(tp2, job=old)), "0.2", "plan.sequence_parallel"),
            (_fsdp(0).model_copy(update=dict(cp=2, stages=[Stage(num_layers=32, dp=4)], job=allgather)), None,
             "plan.zero")):
        assert not violations(plan, spec)
        with pytest.raises(HetplanError) as e:
            exporters.export(plan, spec, "torchtitan", version=version)
        assert e.value.field == field


def test_torchtitan_sharding_on_one_dp_rank_and_with_cp_is_priced_as_launched():
    """torchtitan's FSDP mesh is the shard degree x CP, and FSDP2 runs on a one-rank mesh too: ZeRO-2 on one DP
    rank (written as resharding after forward, priced without), FSDP over CP ranks only (read back as ZeRO-0,
    unsharded) and HSDP with CP (written with shard groups CP times too large) now read back at the plan's price."""
    spec = load_model("llama3-8b")
    cp2 = {"cp": 2, "job": _fsdp(3).job.model_copy(update={"cp_kv_exchange": "allgather"})}  # torchtitan 0.3's
    for plan in (_fsdp(2).model_copy(update={"pools": [GPUPool(gpu="H100-SXM", count=1)],
                                             "stages": [Stage(num_layers=32, dp=1)]}),
                 _fsdp(3).model_copy(update={**cp2, "stages": [Stage(num_layers=32, dp=1)]}),
                 _fsdp(3).model_copy(update={**cp2, "stages": [Stage(num_layers=32, dp=4)], "fsdp_shard": 4}),
                 _fsdp(3).model_copy(update={**cp2, "stages": [Stage(num_layers=32, dp=4)], "fsdp_shard": 2})):
        plan = Plan.model_validate(plan.model_dump())
        assert not violations(plan, spec)
        back = importers.import_files(exporters.export(plan, spec, "torchtitan").files)
        assert back.fsdp_shard == plan.fsdp_shard
        assert _priced(back) == pytest.approx(_priced(plan), rel=1e-9), plan.model_dump(exclude_defaults=True)


def test_context_parallel_exchange_and_balance_are_launched_as_priced():
    """The K/V exchange and load balancing of CP the estimate prices (``Job.cp_kv_exchange``,
    ``cp_load_balance``) were neither written nor read back: Megatron-LM launched its p2p ring for an all-gather
    plan, torchtitan 0.2 its default all-gather for a ring plan, 0.3 (no option: PyTorch's all-gather) likewise, and
    both load-balance always. Now written (``--cp-comm-type all_gather``; ``context_parallel_rotate_method``) and
    read back at the plan's price, or refused naming the field; an a2a (Ulysses) launch is refused on import."""
    spec = load_model("llama3-8b")
    for target, version, framework, stack in (("megatron", None, "megatron", None), ("torchtitan", "0.2", "fsdp",
                                              "torchtitan@2025-10"), ("torchtitan", None, "fsdp", None)):
        for kv in ("ring", "allgather"):
            job = Job(model="llama3-8b", seq_len=4096, global_batch=32, train_iterations=10, framework=framework,
                      stack=stack, cp_kv_exchange=kv)
            plan = Plan(job=job, pools=[GPUPool(gpu="H100-SXM", count=8)], stages=[Stage(num_layers=32, dp=4)],
                        mbs=1, zero=1 if framework == "megatron" else 3, cp=2)
            if version is None and target == "torchtitan" and kv == "ring":
                with pytest.raises(HetplanError) as e:
                    exporters.export(plan, spec, target, version=version)
                assert e.value.field == "plan.job.cp_kv_exchange"
                continue
            back = importers.import_files(exporters.export(plan, spec, target, version=version).files)
            assert back.job.cp_kv_exchange == kv and back.job.cp_load_balance
            assert _priced(back) == pytest.approx(_priced(plan), rel=1e-9), (target, version, kv)
            unbalanced = plan.model_copy(update={"job": job.model_copy(update={"cp_load_balance": False})})
            with pytest.raises(HetplanError) as e:
                exporters.export(unbalanced, spec, target, version=version)
            assert e.value.field == "plan.job.cp_load_balance"
    files = exporters.export(plan, spec, "megatron").files
    with pytest.raises(HetplanError) as e:
        importers.import_files({"run.sh": files["megatron_launch.sh"].replace("--cp-comm-type all_gather",
                                                                               "--cp-comm-type a2a")})
    assert e.value.field == "--cp-comm-type"


def test_a_virtual_stages_override_says_it_launches_another_schedule():
    """``hetplan export --virtual-stages V`` on a plan priced with another interleaving wrote the launch without a
    word; the note now says so, and the launch read back is priced as the plan with V virtual stages."""
    plan = next(p for p in _grid("megatron") if p.pp == 2 and p.stages[0].tp == 1)
    assert plan.virtual_stages == 1
    spec = load_model(plan.job.model)
    ex = exporters.export(plan, spec, "megatron", virtual_stages=2)
    assert any("priced with 1 virtual stage" in n for n in ex.notes)
    back = importers.import_files(ex.files)
    assert back.virtual_stages == 2
    assert _priced(back) == pytest.approx(_priced(plan.model_copy(update={"virtual_stages": 2})), rel=1e-9)
    assert not any("virtual stage" in n for n in exporters.export(plan, spec, "megatron", virtual_stages=1).notes)


def test_torchtitan_03_ties_what_the_plan_ties_and_refuses_tying_with_pp():
    """torchtitan 0.3.0 builds a tied model tied (its Llama 3.2 1B / 3B and small Qwen3 flavors) and refuses weight
    tying with pipeline parallelism at start-up ('Weight tying is not supported with Pipeline Parallel',
    ``torchtitan/models/common/decoder.py``): such an export was written for PP 2. A Llama shape hetplan generates
    was built untied (priced tied, without a note); now ``enable_weight_tying`` follows the model."""
    for name in ("llama3.2-1b", "qwen3-0.6b"):
        spec = load_model(name)
        assert spec.tied_embeddings
        job = Job(model=name, seq_len=2048, global_batch=32, train_iterations=10, framework="fsdp")
        pp2 = Plan(job=job, pools=[GPUPool(gpu="H100-SXM", count=8)], mbs=1, zero=3,
                   stages=[Stage(num_layers=spec.num_layers // 2, dp=4)] * 2)
        assert not violations(pp2, spec)
        with pytest.raises(HetplanError) as e:
            exporters.export(pp2, spec, "torchtitan")
        assert e.value.field == "plan.stages"
        if name.startswith("llama"):  # 0.2 unties it (with a note)
            pp2_old = pp2.model_copy(update={"job": job.model_copy(update={"stack": "torchtitan@2025-10"})})
            assert any("unties" in n for n in exporters.export(pp2_old, spec, "torchtitan", version="0.2").notes)
    spec = load_model("mistral-7b")
    job = Job(model="mistral-7b", seq_len=2048, global_batch=32, train_iterations=10, framework="fsdp")
    plan = Plan(job=job, pools=[GPUPool(gpu="H100-SXM", count=8)], mbs=1, zero=3, stages=[Stage(num_layers=32, dp=8)])
    assert "enable_weight_tying=False" in exporters.export(plan, spec, "torchtitan").files["hetplan_torchtitan_job.py"]
    tied = spec.model_copy(update={"tied_embeddings": True})
    assert "enable_weight_tying=True" in exporters.export(plan, tied, "torchtitan").files["hetplan_torchtitan_job.py"]


@pytest.mark.parametrize("kw, job", [(dict(ep=1), {}), (dict(pp=2), {}), (dict(recompute="full"), {}),
                                     ({}, dict(moe_recompute=True))])
def test_megatron_a2a_overlap_it_refuses_is_refused(kw, job):
    """``moe_a2a_overlap`` (``--overlap-moe-expert-parallel-comm``) was written where Megatron-Core's
    TransformerConfig asserts against it: EP 1, PP without virtual stages, full recomputation, the MoE layer
    recomputed. Refused now, naming the field; the overlap it runs still exports and reads back."""
    def plan(ep=2, pp=1, recompute="none", **job_kw):
        j = Job(model="mixtral-8x7b", seq_len=2048, global_batch=32, train_iterations=10, moe_a2a_overlap=True,
                **job_kw)
        return Plan(job=j, pools=[GPUPool(gpu="H100-SXM", count=8 * pp)], mbs=1, zero=1, ep=ep,
                    stages=[Stage(num_layers=32 // pp, dp=8, recompute=recompute)] * pp)
    spec = load_model("mixtral-8x7b")
    bad = plan(**kw, **job)
    assert not violations(bad, spec)
    with pytest.raises(HetplanError) as e:
        exporters.export(bad, spec, "megatron")
    assert e.value.field == "plan.job.moe_a2a_overlap"
    back = importers.import_files(exporters.export(plan(), spec, "megatron").files)
    assert back.job.moe_a2a_overlap and _priced(back) == pytest.approx(_priced(plan()), rel=1e-9)


def test_megatron_fp8_parameters_need_the_distributed_optimizer():
    """An FP8 plan is priced with FP8 parameters (``--fp8-param-gather``, no bf16 weight copy), which Megatron-LM
    allows only with its distributed optimizer or FSDP (``megatron/training/arguments.py`` asserts): a ZeRO-0 FP8
    plan over DP 8 was exported with the flag and no distributed optimizer, now refused naming ``plan.zero``; on
    one data-parallel rank the distributed optimizer shards nothing, so it is written and priced the same."""
    spec = load_model("llama3-8b")
    job = Job(model="llama3-8b", seq_len=2048, global_batch=32, train_iterations=10, dtype="fp8")
    dp8 = Plan(job=job, pools=[GPUPool(gpu="H100-SXM", count=8)], mbs=1, stages=[Stage(num_layers=32, dp=8)])
    with pytest.raises(HetplanError) as e:
        exporters.export(dp8, spec, "megatron")
    assert e.value.field == "plan.zero"
    tp8 = Plan(job=job, pools=[GPUPool(gpu="H100-SXM", count=8)], mbs=1, stages=[Stage(num_layers=32, tp=8)],
               sequence_parallel=True)
    files = exporters.export(tp8, spec, "megatron").files
    assert "--use-distributed-optimizer" in files["megatron_launch.sh"] and "--fp8-param-gather" in \
        files["megatron_launch.sh"]
    assert _priced(importers.import_files(files)) == pytest.approx(_priced(tp8), rel=1e-9)


def test_megatron_fsdp_launch_leaves_cuda_device_max_connections_unset():
    """Megatron-FSDP (ZeRO-2 / 3 under megatron) asserts 'FSDP requires CUDA_DEVICE_MAX_CONNECTIONS > 1 or unset'
    (``megatron/training/arguments.py``); the launch exported ``CUDA_DEVICE_MAX_CONNECTIONS=1`` for every plan."""
    spec = load_model("llama3-8b")
    tp2 = next(p for p in _grid("megatron") if p.stages[0].tp == 2)
    for zero in (0, 1, 2, 3):
        plan = Plan.model_validate(tp2.model_copy(update={"zero": zero}).model_dump())
        script = exporters.export(plan, spec, "megatron").files["megatron_launch.sh"]
        assert ("export CUDA_DEVICE_MAX_CONNECTIONS=1" in script) == (zero < 2), zero
        assert ("unset CUDA_DEVICE_MAX_CONNECTIONS" in script) == (zero >= 2), zero


def _mg(model="mixtral-8x7b", recompute="none", recompute_layers=None, tp=1, plan_kw=None, gpu="H100-SXM", **job_kw):
    spec = load_model(model)
    job = Job(model=model, seq_len=2048, global_batch=32, train_iterations=10, **job_kw)
    return Plan(job=job, pools=[GPUPool(gpu=gpu, count=8)], mbs=1, zero=1, ep=2 if spec.is_moe else 1,
                sequence_parallel=tp > 1, stages=[Stage(num_layers=spec.num_layers, tp=tp, dp=8 // tp,
                                                        recompute=recompute, recompute_layers=recompute_layers)],
                **(plan_kw or {}))


@pytest.mark.parametrize("plan, field", [
    (lambda: _mg("llama3-8b", "full", plan_kw=dict(cuda_graphs=True)), "plan.cuda_graphs"),
    (lambda: _mg("gpt3-1.3b", "selective", attention="standard", plan_kw=dict(cuda_graphs=True)), "plan.cuda_graphs"),
    (lambda: _mg("gpt3-1.3b", mtp_layers=1), "plan.job.mtp_layers"),
    (lambda: _mg(dtype="fp8", recompute_modules=["moe_act"]), "plan.job.recompute_modules"),
    (lambda: _mg(moe_recompute=True, offload_modules=["moe_act"]), "plan.job.offload_modules"),
    (lambda: _mg(recompute="full", recompute_layers=2, recompute_modules=["layernorm"]), "plan.job.recompute_modules"),
], ids=["graphs-full-recompute", "graphs-selective-dropout", "mtp-learned-positions", "fp8-delayed-moe_act",
        "offload-in-recomputed-moe", "block-recompute-and-modules"])
def test_megatron_refuses_what_megatron_core_asserts_against(plan, field):
    """Launches Megatron-Core's ``validate_args`` / ``TransformerConfig`` refuse (NVIDIA/Megatron-LM d98e8a64,
    checked by running them on every export of a fuzzed grid): per-layer CUDA graphs with full recomputation, or
    with the attention core recomputed under dropout; MTP with learned positions; moe_act / layernorm recomputation
    under FP8 delayed scaling; offloading inside a MoE layer recomputed whole. And full recomputation of the first k
    layers with per-module recomputation, which one ``--recompute-granularity`` cannot launch (the modules were
    dropped while the estimate priced them on the other layers). Each was written; now exit 2 naming the field."""
    p = plan()
    spec = load_model(p.job.model)
    assert not violations(p, spec)
    with pytest.raises(HetplanError) as e:
        exporters.export(p, spec, "megatron")
    assert e.value.field == field


def test_megatron_launch_details_megatron_core_needs():
    """CUDA graphs of a token-dropping MoE capture the whole MoE layer with padding, and not the router /
    preprocess without it (its device-to-host copies: Megatron-Core asserts, and its local graphs add preprocess to
    any router capture); fine-grained offloading sets ``NVTE_CPU_OFFLOAD_V1=1`` (asserted under TE >= 2.10); an FP8
    ``--fp8-recipe delayed`` launch on Blackwell reads back as delayed (was read as the GPU's default, MXFP8)."""
    def script(p):
        return exporters.export(p, load_model(p.job.model), "megatron").files["megatron_launch.sh"]
    padded = script(_mg(moe_capacity_factor=1.0, moe_pad_to_capacity=True, plan_kw=dict(cuda_graphs=True)))
    assert "--cuda-graph-modules attn moe " in padded
    dropped = script(_mg(moe_capacity_factor=1.0, plan_kw=dict(cuda_graphs=True)))
    assert "--cuda-graph-modules attn " in dropped and "moe_router" not in dropped
    assert "--cuda-graph-modules attn moe_router moe_preprocess" in script(_mg(plan_kw=dict(cuda_graphs=True)))
    assert "export NVTE_CPU_OFFLOAD_V1=1" in script(_mg(offload_modules=["expert_fc1"]))
    delayed = _mg("llama3-8b", gpu="B200", dtype="fp8", fp8_recipe="delayed")
    back = importers.import_files(exporters.export(delayed, load_model("llama3-8b"), "megatron").files, gpu="B200")
    assert back.job.fp8_recipe == "delayed"
    assert _priced(back) == pytest.approx(_priced(delayed), rel=1e-9)


def test_deepspeed_carries_the_attention_its_training_script_builds():
    """DeepSpeed's config names no attention; the plan's (stored s x s scores, or a named fused kernel) was dropped
    from the export and read back as FlashAttention with the GPU's default kernel: a GPT-3 1.3B plan with
    ``attention = "standard"`` came back 19 % faster and 8 GB lighter. ``pipeline_module.json`` (hetplan's, which
    the training script reads for the model and sequence length) now carries both."""
    spec = load_model("gpt3-1.3b")
    for kw in (dict(attention="standard"), dict(attention_kernel="fa3")):
        job = Job(model="gpt3-1.3b", seq_len=2048, global_batch=32, train_iterations=10, framework="deepspeed", **kw)
        plan = Plan(job=job, pools=[GPUPool(gpu="H100-SXM", count=8)], mbs=1, zero=1, stages=[Stage(num_layers=24,
                                                                                                      dp=8)])
        back = importers.import_files(exporters.export(plan, spec, "deepspeed").files)
        assert {k: getattr(back.job, k) for k in kw} == kw
        assert _priced(back) == pytest.approx(_priced(plan), rel=1e-9)


def test_torchtitan_refuses_async_tp_the_estimate_did_not_price():
    """The estimate prices async TP on dense models only (``hetplan.estimate.stage``); a MoE plan with it at TP 2
    was exported with ``--compile.enable_async_tensor_parallel``, a launch other than the one priced."""
    spec = load_model("mixtral-8x7b")
    job = Job(model="mixtral-8x7b", seq_len=2048, global_batch=32, train_iterations=10, framework="fsdp",
              async_tp=True)
    plan = Plan(job=job, pools=[GPUPool(gpu="H100-SXM", count=8)], mbs=1, zero=3, ep=2, sequence_parallel=True,
                stages=[Stage(num_layers=32, tp=2, dp=4)])
    assert not violations(plan, spec)
    with pytest.raises(HetplanError) as e:
        exporters.export(plan, spec, "torchtitan")
    assert e.value.field == "plan.job.async_tp"


def test_megatron_stage_without_layers_goes_through_the_layout():
    """A stage holding only the embedding or the loss ([32, 0]) was written as ``--decoder-last-pipeline-num-layers
    0``, which Megatron-Core refuses ('num_layers_in_last_pipeline_stage must be larger than 0'); it is the layout
    string now (``Et*32|L``), read back as the plan."""
    spec = load_model("llama3-8b")
    for layers, layout in (([32, 0], "Et*32|L"), ([0, 32], "E|t*32L"), ([16, 0, 0, 16], "Et*16|||t*16L")):
        job = Job(model="llama3-8b", seq_len=2048, global_batch=32, train_iterations=10)
        plan = Plan(job=job, pools=[GPUPool(gpu="H100-SXM", count=4 * len(layers))], mbs=1, zero=1,
                    stages=[Stage(num_layers=n, dp=4) for n in layers])
        files = exporters.export(plan, spec, "megatron").files
        assert f"--pipeline-model-parallel-layout '{layout}'" in files["megatron_launch.sh"]
        assert "pipeline-num-layers 0" not in files["megatron_launch.sh"]
        back = importers.import_files(files)
        assert [s.num_layers for s in back.stages] == layers and _priced(back) == pytest.approx(_priced(plan), rel=1e-9)


def test_megatron_layout_holds_the_mtp_modules():
    """With MTP, Megatron-Core asserts the layout holds the MTP modules ('Number of mtp layers in layout must match
    mtp_num_layers'); the export wrote the layout without them, and the import refused a layout with them."""
    spec = load_model("llama3-8b")
    job = Job(model="llama3-8b", seq_len=2048, global_batch=32, train_iterations=10, mtp_layers=1)
    plan = Plan(job=job, pools=[GPUPool(gpu="H100-SXM", count=16)], mbs=1, zero=1,
                stages=[Stage(num_layers=n, dp=4) for n in (10, 7, 5, 10)])
    files = exporters.export(plan, spec, "megatron").files
    assert "--pipeline-model-parallel-layout 'Et*10|t*7|t*5|t*10mL'" in files["megatron_launch.sh"]
    back = importers.import_files(files)
    assert back.job.mtp_layers == 1 and _priced(back) == pytest.approx(_priced(plan), rel=1e-9)
    with pytest.raises(HetplanError) as e:  # the layout without them: Megatron-Core refuses it
        importers.import_files({"run.sh": files["megatron_launch.sh"].replace("t*10mL", "t*10L")})
    assert e.value.field == "--pipeline-model-parallel-layout"


def test_fsdp_context_parallelism_defaults_to_what_torchtitan_launches():
    """torchtitan all-gathers K/V (0.3.0 only that; 0.2's rotate method and PyTorch's context_parallel default to
    it), Megatron-Core runs the p2p ring: a job that names neither gets its framework's, so a CP plan the fsdp search
    proposes exports to torchtitan 0.3 and reads back priced the same (it was planned as the ring, which the export
    refuses for 0.3)."""
    from hetplan.plan import Inventory
    from hetplan.search.planner import search_plans
    from hetplan.search.space import Pins

    assert Job(model="llama3-8b", seq_len=8192, global_batch=8, framework="fsdp").cp_kv_exchange == "allgather"
    assert Job(model="llama3-8b", seq_len=8192, global_batch=8, stack="torchtitan").cp_kv_exchange == "allgather"
    assert Job(model="llama3-8b", seq_len=8192, global_batch=8).cp_kv_exchange == "ring"
    assert Job(model="llama3-8b", seq_len=8192, global_batch=8, framework="fsdp",
               cp_kv_exchange="ring").cp_kv_exchange == "ring"
    job = Job(model="llama3-8b", seq_len=65536, global_batch=8, train_iterations=10, framework="fsdp")
    plan = search_plans(job, Inventory(pools=[GPUPool(gpu="H100-SXM", count=8)]), top_k=1, heterogeneous=False,
                        pins=Pins(cp=4)).plans[0].plan
    assert plan.cp == 4 and plan.job.cp_kv_exchange == "allgather"
    back = importers.import_files(exporters.export(plan, load_model("llama3-8b"), "torchtitan").files)
    assert back.job.cp_kv_exchange == "allgather" and _priced(back) == pytest.approx(_priced(plan), rel=1e-9)
