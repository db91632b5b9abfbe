"""Plan loading, runtime layout checks and exporters (no torch)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hetplan.errors import HetplanError
from hetplan.runtime import exporters, planio

ROOT = Path(__file__).parents[2]
TINY = ROOT / "examples" / "tiny-pp2-dp2.json"


def _plan(tmp_path, **over):
    raw = json.loads(TINY.read_text())
    raw["job"]["model"] = str(ROOT / "examples" / "tiny-model.json")
    for k, v in over.items():
        raw[k] = v
    p = tmp_path / "plan.json"
    p.write_text(json.dumps(raw, indent=1))
    return p


def test_example_plan_layout():
    plan = planio.load_plan(TINY)
    spec = planio.plan_model(plan)
    assert spec.num_layers == 4 and spec.hidden_size == 128
    lay = planio.layout(plan, spec)
    assert (lay.pp, lay.dp, lay.tp, lay.world_size) == (2, 2, 1, 4)
    assert lay.stage_layers == ((0, 3), (3, 4)) and lay.num_microbatches == 2
    assert [lay.coords(r) for r in range(4)] == [(0, 0, 0), (0, 1, 0), (1, 0, 0), (1, 1, 0)]


def test_interleaved_chunks(tmp_path):
    p = _plan(tmp_path, stages=[{"num_layers": 2, "dp": 2}, {"num_layers": 2, "dp": 2}])
    plan = planio.load_plan(p)
    lay = planio.layout(plan, planio.plan_model(plan), schedule="interleaved", virtual_stages=2)
    # chunk k on pipeline rank k % pp, layers in chunk order
    assert lay.chunk_layers == ((0, 1), (1, 2), (2, 3), (3, 4))
    with pytest.raises(HetplanError, match="fewer layers than the 2 virtual stages"):
        planio.layout(planio.load_plan(TINY), planio.plan_model(planio.load_plan(TINY)), schedule="interleaved")


def test_malformed_json_names_line(tmp_path):
    p = tmp_path / "bad.json"
    p.write_text('{\n  "job": {"model": "x",\n  "seq_len": 1,,\n}')
    with pytest.raises(HetplanError, match=r"line 3") as e:
        planio.load_plan(p)
    assert e.value.field == "PLAN"


def test_bad_field_named(tmp_path):
    p = _plan(tmp_path, mbs=0)
    with pytest.raises(HetplanError) as e:
        planio.load_plan(p)
    assert e.value.field == "plan.mbs"


@pytest.mark.parametrize("stages, match", [
    ([{"num_layers": 2, "tp": 3, "dp": 1}, {"num_layers": 2, "tp": 3, "dp": 1}], "rule tp-divides-heads"),
    ([{"num_layers": 2, "dp": 2}, {"num_layers": 2, "dp": 1}], "different TP degrees"),
    ([{"num_layers": 2, "dp": 2}, {"num_layers": 1, "dp": 2}], "stages hold 3 layers but tiny-model has 4"),
])
def test_plans_the_runtime_cannot_run(tmp_path, stages, match):
    raw = json.loads(TINY.read_text())
    raw["job"]["model"] = str(ROOT / "examples" / "tiny-model.json")
    raw["job"]["global_batch"] = 12
    raw["stages"] = stages
    p = tmp_path / "p.json"
    p.write_text(json.dumps(raw))
    plan = planio.load_plan(p)
    with pytest.raises(HetplanError, match=match):
        planio.layout(plan, planio.plan_model(plan))


def test_too_many_processes():
    plan = planio.load_plan(TINY)
    with pytest.raises(HetplanError, match="needs 4 ranks") as e:
        planio.layout(plan, planio.plan_model(plan), max_world_size=2)
    assert e.value.fix


def test_exports():
    plan = planio.load_plan(TINY)
    spec = planio.plan_model(plan)
    meg = exporters.export(plan, spec, "megatron").files["megatron_launch.sh"]
    for arg in ("--pipeline-model-parallel-size 2", "--decoder-first-pipeline-num-layers 3",
                "--decoder-last-pipeline-num-layers 1", "--micro-batch-size 2", "--global-batch-size 8", "--swiglu",
                "--nproc-per-node 4"):
        assert arg in meg
    with pytest.raises(HetplanError, match="1-D meshes"):  # torchtitan 0.2's DDP has no pipeline
        exporters.export(plan, spec, "torchtitan", version="0.2")
    tt = exporters.export(plan.model_copy(update={"zero": 3}), spec, "torchtitan", version="0.2").files[
        "torchtitan.toml"]
    import tomllib

    cfg = tomllib.loads(tt)
    assert cfg["parallelism"]["module_fqns_per_model_part"] == [["tok_embeddings", "layers.0", "layers.1", "layers.2"],
                                                                 ["layers.3", "norm", "output"]]
    assert cfg["parallelism"]["data_parallel_shard_degree"] == 2
    assert cfg["training"]["local_batch_size"] == 4 and cfg["training"]["global_batch_size"] == 8
    ds = exporters.export(plan, spec, "deepspeed")
    assert "PARTS = [0, 4, 6]" in ds.files["hetplan_pipeline.py"]
    with pytest.raises(HetplanError, match="unknown export target"):
        exporters.export(plan, spec, "jax")
    assert "NCCL_IB_DISABLE" not in meg
    eth = plan.model_copy(update={"pools": [p.model_copy(update={"network": "ethernet"}) for p in plan.pools]})
    for target, script, at in (("megatron", "megatron_launch.sh", 1), ("torchtitan", "launch.sh", 1)):
        ex = exporters.export(eth, spec, target)
        lines = ex.files[script].splitlines()
        assert lines[at].startswith("export NCCL_IB_DISABLE=1")  # after the shebang, if the script has one
        assert at == 0 or lines[0] == "#!/usr/bin/env bash"
        assert any("NCCL_IB_DISABLE=1" in n for n in ex.notes)


def test_deepspeed_balanced_and_megatron_middle_stages(tmp_path):
    raw = json.loads(TINY.read_text())
    raw["job"]["model"] = "gpt3-1.3b"
    raw["job"]["seq_len"] = 2048
    raw["stages"] = [{"num_layers": 6, "dp": 2}] * 4
    raw["pools"][0]["count"] = 8
    p = tmp_path / "p.json"
    p.write_text(json.dumps(raw))
    plan = planio.load_plan(p)
    spec = planio.plan_model(plan)
    ds = json.loads(exporters.export(plan, spec, "deepspeed").files["ds_config.json"])
    assert ds["train_batch_size"] == 8 and ds["gradient_accumulation_steps"] == 2
    raw["stages"] = [{"num_layers": 5, "dp": 2}, {"num_layers": 7, "dp": 2}, {"num_layers": 6, "dp": 2},
                     {"num_layers": 6, "dp": 2}]
    p.write_text(json.dumps(raw))
    # middle stages that differ: Megatron-Core's layout string, one segment per stage, embedding and loss placed
    meg = exporters.export(planio.load_plan(p), spec, "megatron").files["megatron_launch.sh"]
    assert "--pipeline-model-parallel-layout 'Et*5|t*7|t*6|t*6L'" in meg
    assert "--decoder-first-pipeline-num-layers" not in meg


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "hetplan.cli.main", *args], capture_output=True, text=True, cwd=ROOT)


def test_cli_errors_exit_2(tmp_path):
    r = _cli("export", str(TINY), "--to", "jax")
    assert r.returncode == 2 and "--to" in r.stderr and "Traceback" not in r.stderr
    bad = tmp_path / "bad.json"
    bad.write_text("{\n\n oops")
    r = _cli("run", str(bad))
    assert r.returncode == 2 and "line 3" in r.stderr
    r = _cli("run", str(TINY), "--max-procs", "2")
    assert r.returncode == 2 and "needs 4 ranks" in r.stderr


def test_planner_does_not_import_torch():
    code = ("import sys, hetplan, hetplan.cli.main, hetplan.runtime.exporters, hetplan.runtime.planio, "
            "hetplan.profile.importers, hetplan.profile.db, hetplan.runtime.launcher, hetplan.runtime.verify, "
            "hetplan.profile.profiler; print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.stdout.strip() == "False", out.stderr


def test_plan_interleaving_runs_as_priced(tmp_path):
    """A plan with virtual_stages (and uneven pipeline_chunks, e.g. a searched layout with an empty loss chunk) runs
    interleaved with its own chunks when no --schedule overrides it; --schedule still does; an empty chunk inside
    the pipeline is refused naming the field."""
    p = _plan(tmp_path, stages=[{"num_layers": 3, "dp": 2}, {"num_layers": 1, "dp": 2}], virtual_stages=2,
              pipeline_chunks=[[1, 2], [1, 0]])
    plan = planio.load_plan(p)
    lay = planio.layout(plan, planio.plan_model(plan))
    assert (lay.schedule, lay.virtual_stages) == ("interleaved", 2)
    assert lay.chunk_layers == ((0, 1), (1, 2), (2, 4), (4, 4))  # chunk k on rank k % pp, layers in chunk order
    assert planio.layout(plan, planio.plan_model(plan), schedule="1f1b").schedule == "1f1b"
    bad = plan.model_copy(update={"pipeline_chunks": [[3, 0], [0, 1]]})
    with pytest.raises(HetplanError, match="without layers") as e:
        planio.layout(bad, planio.plan_model(bad))
    assert e.value.field == "plan.pipeline_chunks"


@pytest.mark.parametrize("model_type, extra, want, not_want", [
    ("qwen2", {}, ["--swiglu", "--normalization RMSNorm", "--disable-bias-linear", "--add-qkv-bias"],
     ["--qk-layernorm"]),
    ("qwen3", {"head_dim": 64}, ["--swiglu", "--normalization RMSNorm", "--qk-layernorm", "--kv-channels 64"],
     ["--add-qkv-bias"]),
    ("phi3", {}, ["--swiglu", "--normalization RMSNorm", "--position-embedding-type rope"], ["--add-qkv-bias"]),
])
def test_megatron_export_of_the_llama_block_families(tmp_path, model_type, extra, want, not_want):
    """Qwen2, Qwen3 and Phi-3 are Llama's block to Megatron-LM (SwiGLU, RMSNorm, rotary, no linear biases) plus
    Qwen2's QKV biases (``--add-qkv-bias``) and Qwen3's per-head Q/K norms (``--qk-layernorm``) and head_dim
    (``--kv-channels``); torchtitan's Llama has neither, so torchtitan refuses those two."""
    cfg = dict(json.loads((ROOT / "examples" / "tiny-model.json").read_text()), model_type=model_type, **extra)
    model = tmp_path / "tiny.json"
    model.write_text(json.dumps(cfg))
    raw = json.loads(TINY.read_text())
    raw["job"]["model"] = str(model)
    (tmp_path / "plan.json").write_text(json.dumps(raw))
    plan = planio.load_plan(tmp_path / "plan.json")
    spec = planio.plan_model(plan)
    meg = exporters.export(plan, spec, "megatron").files["megatron_launch.sh"]
    assert all(a in meg for a in want) and not any(a in meg for a in not_want), meg
    if model_type == "phi3":  # a window shorter than the sequence is not written: the export says so
        windowed = spec.model_copy(update={"sliding_window": 64, "sliding_window_layers": spec.num_layers})
        notes = exporters.export(plan, windowed, "megatron").notes
        assert any("64-token window on 4 of 4 layers is not written" in n for n in notes), notes
        return
    with pytest.raises(HetplanError, match="Q/K or post-attention norms") as info:
        exporters.export(plan.model_copy(update={"zero": 3}), spec, "torchtitan", version="0.2")
    assert info.value.field == "--to"


def test_gemma_post_norms_are_refused_by_megatron_and_torchtitan(tmp_path):
    """Gemma's four norms per layer: Megatron-LM's TransformerLayer and torchtitan's Llama have no norm after
    attention or the MLP, so both refuse rather than write a launch of another model; DeepSpeed's export (the
    user's model code) writes."""
    cfg = dict(json.loads((ROOT / "examples" / "tiny-model.json").read_text()), model_type="gemma2", head_dim=32)
    (tmp_path / "tiny.json").write_text(json.dumps(cfg))
    raw = json.loads(TINY.read_text())
    raw["job"]["model"] = str(tmp_path / "tiny.json")
    (tmp_path / "plan.json").write_text(json.dumps(raw))
    plan = planio.load_plan(tmp_path / "plan.json")
    spec = planio.plan_model(plan)
    assert spec.post_norms
    with pytest.raises(HetplanError, match="post-MLP norms") as info:
        exporters.export(plan, spec, "megatron")
    assert info.value.field == "--to" and "deepspeed" in info.value.fix
    with pytest.raises(HetplanError, match="post-attention norms"):
        exporters.export(plan.model_copy(update={"zero": 3}), spec, "torchtitan", version="0.2")
    assert exporters.export(plan, spec, "deepspeed").files
