"""Issue 27, item 3: silently accepted inputs now refused at their cause, each class generated (hypothesis) as
well as the named case: text for booleans, job lengths (neither, both, less than one iteration), a kernel or dtype
the plan's GPUs lack, MoE options on a dense model; and job-file paths resolved against the file's folder."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from hetplan.hardware.catalog import load_catalog
from hetplan.model.spec import load_model
from hetplan.plan import GPUPool, Job, Plan, Stage
from hetplan.plan_rules import KERNEL_ARCHITECTURES, violations
from tests.fuzz.inproc import run_cli

ROOT = Path(__file__).resolve().parents[2]
CAT = load_catalog()
BOOLS = ["moe_recompute", "moe_a2a_overlap", "moe_pad_to_capacity", "cp_load_balance", "torch_compile", "async_tp"]
BASE = dict(model="llama2-7b", seq_len=4096, global_batch=64)


def _plan(gpu: str, **job) -> Plan:
    j = Job(**{**BASE, "train_iterations": 10, **job})
    return Plan(job=j, pools=[GPUPool(gpu=gpu, count=8)], stages=[Stage(num_layers=32, tp=1, dp=8)], mbs=1)


@settings(max_examples=30, deadline=None)
@given(field=st.sampled_from(BOOLS), text=st.sampled_from(["yes", "no", "true", "True", "1", "on", "false", ""]))
def test_text_is_no_boolean(field, text):
    with pytest.raises(ValidationError, match="not text"):
        Job(**BASE, **{field: text})


@settings(max_examples=30, deadline=None)
@given(tokens=st.floats(min_value=1e-300, max_value=64 * 4096 * (1 - 1e-9)), iters=st.integers(1, 10**6))
def test_job_lengths(tokens, iters):
    with pytest.raises(ValidationError, match="less than one iteration"):
        Job(**BASE, train_tokens=tokens)
    with pytest.raises(ValidationError, match="not both"):
        Job(**BASE, train_tokens=1e12, train_iterations=iters)
    assert Job(**BASE, train_iterations=iters).iterations() == iters


@pytest.mark.parametrize("gpu", [g.name for g in CAT.gpus.values()])
def test_kernel_and_dtype_rules_follow_the_architecture(gpu):
    spec, g = load_model("llama2-7b"), CAT.get(gpu)
    family = g.architecture.split()[0]
    for kernel, families in KERNEL_ARCHITECTURES.items():
        dtype = "bf16" if "bf16" in g.dense_flops_per_s else "fp16"
        rules = {e.rule for e in violations(_plan(gpu, attention_kernel=kernel, dtype=dtype), spec)}
        assert ("attention-kernel-on-gpu" in rules) == (family not in families), (kernel, rules)
    for dtype in ("bf16", "fp16", "fp8"):
        rules = {e.rule for e in violations(_plan(gpu, dtype=dtype), spec)}
        assert ("dtype-on-gpu" in rules) == (dtype not in g.dense_flops_per_s), (dtype, rules)


def test_fa3_on_a100_and_moe_recompute_on_dense_exit_2(tmp_path):
    r = run_cli("plan", "--model", "llama2-7b", "--seq-len", "4096", "--global-batch", "64", "--iterations", "10",
                "--gpu", "A100-SXM-80GB", "--gpus", "8", "--attention-kernel", "fa3", "-q")
    assert r.code == 2 and "attention-kernel-on-gpu" in r.stderr and "fix:" in r.stderr
    job = tmp_path / "j.toml"
    job.write_text('[job]\nmodel = "llama2-7b"\nseq_len = 4096\nglobal_batch = 64\ntrain_iterations = 2\n'
                   'moe_recompute = true\n[[inventory]]\ngpu = "H100-SXM"\ncount = 8\n')
    r = run_cli("plan", job, "-q")
    assert r.code == 2 and "moe_recompute" in r.stderr and "no experts" in r.stderr


def test_no_job_length_is_said_and_titled_one_iteration():
    r = run_cli("plan", "--model", "llama2-7b", "--seq-len", "4096", "--global-batch", "64", "--gpu", "H100-SXM",
                "--gpus", "8", "-q", "--top", "1")
    assert r.code == 0 and "job time and $ are for one iteration" in r.stderr
    assert "1 iteration —" in r.stdout and "1 iterations" not in r.stdout


def test_job_file_model_path_resolves_against_its_folder(tmp_path, monkeypatch):
    shutil.copytree(ROOT / "examples" / "models", tmp_path / "ex" / "models")
    shutil.copy(ROOT / "examples" / "fasop_gpt2xl.toml", tmp_path / "ex" / "job.toml")
    monkeypatch.chdir(tmp_path)  # outside the repository and outside the job file's folder
    r = run_cli("plan", "ex/job.toml", "-q", "--top", "1", "--no-hetero")
    assert r.code == 0, r.stderr


def _preset(name: str) -> dict:
    import json
    from importlib import resources
    return json.loads(resources.files("hetplan.model").joinpath(f"presets/{name}.json").read_text())


@settings(max_examples=40, deadline=None)
@given(case=st.sampled_from([("mixtral-8x7b", "num_local_experts"), ("qwen3-235b-a22b", "num_experts"),
                             ("deepseek-v3", "n_routed_experts"), ("deepseek-v3", "kv_lora_rank"),
                             ("deepseek-v3", "v_head_dim"), ("gpt-oss-120b", "num_local_experts"),
                             ("llama4-scout", "num_local_experts")]),
       value=st.sampled_from([0, None]))
def test_zero_family_fields_are_refused_not_reinterpreted(case, value):
    from hetplan.errors import HetplanError
    from hetplan.model.spec import from_hf_config
    name, key = case
    cfg = _preset(name)
    target = cfg.get("text_config", cfg)
    target[key] = value
    with pytest.raises(HetplanError) as err:
        from_hf_config(cfg, name)
    assert key in err.value.field


@settings(max_examples=40, deadline=None)
@given(h=st.integers(64, 8192), a=st.integers(2, 128))
def test_hidden_not_divisible_by_heads_needs_head_dim(h, a):
    from hetplan.errors import HetplanError
    from hetplan.model.spec import from_hf_config
    cfg = _preset("llama2-7b")
    cfg.update(hidden_size=h, num_attention_heads=a, num_key_value_heads=a)
    if h % a:
        with pytest.raises(HetplanError, match="not divisible"):
            from_hf_config(cfg, "x")
        cfg["head_dim"] = 64
    assert from_hf_config(cfg, "x").head_dim == (64 if h % a else h // a)


@settings(max_examples=30, deadline=None)
@given(types=st.lists(st.sampled_from(["sliding_attention", "full_attention", "chunked", ""]), max_size=40))
def test_gpt_oss_layer_types(types):
    from hetplan.errors import HetplanError
    from hetplan.model.spec import from_hf_config
    cfg = _preset("gpt-oss-120b")
    cfg["layer_types"] = types
    ok = not types or (len(types) == cfg["num_hidden_layers"] and all(
        t in ("sliding_attention", "full_attention") for t in types))
    if ok:
        from_hf_config(cfg, "x")
    else:
        with pytest.raises(HetplanError, match="layer_types"):
            from_hf_config(cfg, "x")


@settings(max_examples=30, deadline=None)
@given(step=st.integers(1, 10**9), v=st.sampled_from([1, 2]))
def test_pipeline_step_microbatches_rule(step, v):
    job = Job(**BASE, train_iterations=10, framework="fsdp")  # 64 sequences, mbs 1, dp 2: 32 micro-batches
    plan = Plan(job=job, pools=[GPUPool(gpu="H100-SXM", count=8)], mbs=1, virtual_stages=v, zero=3,
                stages=[Stage(num_layers=8, tp=1, dp=2) for _ in range(4)], pipeline_step_microbatches=step)
    rules = {e.rule for e in violations(plan, load_model("llama2-7b"))}
    bad = step > 32 or (v > 1 and step % 4 != 0)
    assert ("pipeline-step-microbatches" in rules) == bad, rules


def test_catalog_models_shows_whole_names_at_80_columns():
    from hetplan.model.spec import list_presets
    r = run_cli("catalog", "models", columns=80)
    assert r.code == 0 and "…" not in r.stdout
    assert max(len(line.rstrip()) for line in r.stdout.splitlines()) <= 80
    names = {line.split()[0] for line in r.stdout.splitlines() if line.strip()}
    assert set(list_presets()) <= names


@pytest.fixture(scope="module")
def h100_plan(tmp_path_factory):
    plan = tmp_path_factory.mktemp("v") / "p.json"
    assert run_cli("plan", "--model", "llama2-7b", "--seq-len", "2048", "--global-batch", "16", "--iterations", "2",
                   "--gpu", "H100-SXM", "--gpus", "8", "-q", "-o", plan).code == 0
    return plan


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(v=st.integers(-10**6, 0))
def test_export_virtual_stages_override_below_one_is_refused(h100_plan, v):
    r = run_cli("export", h100_plan, "--to", "megatron", "--virtual-stages", v)
    assert r.code == 2 and "--virtual-stages" in r.stderr and not r.traceback


@settings(max_examples=25, deadline=None)
@given(key=st.sampled_from(["memory_gib", "dense_tflops.fp8", "dense_tflops.bf16", "hbm_bandwidth_gb_per_s"]),
       value=st.sampled_from(["1e300", "1e-9", "-1", "0", "1e400", "nan"]))
def test_user_catalog_numbers_out_of_physics_are_refused(tmp_path_factory, key, value):
    d = tmp_path_factory.mktemp("c")
    if key.startswith("dense_tflops."):
        body = f"dense_tflops = {{ bf16 = 989, fp16 = 989, {key.split('.')[1]} = {value} }}"
    else:
        body = f"{key} = {value}"
    (d / "cat.toml").write_text(f"[gpus.H100-SXM]\n{body}\n")
    r = run_cli("plan", "--model", "llama2-7b", "--seq-len", "2048", "--global-batch", "16", "--iterations", "2",
                "--gpu", "H100-SXM", "--gpus", "8", "-q", "--catalog", d / "cat.toml")
    assert not r.traceback, r.traceback
    assert r.code == 2 and "fix:" in r.stderr, (body, r.stdout[-300:], r.stderr)


@pytest.mark.parametrize("kernel,backend", [("cudnn", "fused"), ("fa2", "flash"), ("fa3", "flash")])
def test_megatron_export_keeps_the_attention_kernel(tmp_path, kernel, backend):
    plan = tmp_path / "p.json"
    assert run_cli("plan", "--model", "llama2-7b", "--seq-len", "2048", "--global-batch", "16", "--iterations", "2",
                   "--gpu", "H100-SXM", "--gpus", "8", "--attention-kernel", kernel, "-q", "-o", plan).code == 0
    r = run_cli("export", plan, "--to", "megatron")
    assert r.code == 0 and f"--attention-backend {backend}" in r.stdout and "--use-flash-attn" not in r.stdout
