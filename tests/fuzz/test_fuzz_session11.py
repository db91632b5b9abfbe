"""Hostile-input audit, session 11: inputs each valid alone but jointly impossible, and flags that were dropped
without a word. Each case exits 2 with one message naming the field (it printed a result, blamed another field,
or leaked a ZeroDivisionError's text before)."""

from __future__ import annotations

import json

import pytest

from hetplan.model.spec import load_model
from hetplan.plan import GPUPool, Job, Plan, Stage
from hetplan.runtime import exporters
from tests.fuzz.inproc import run_cli

PLAN = ["plan", "--model", "llama2-7b", "--gpu", "H100-SXM", "--gpus", "16", "--seq-len", "4096", "--global-batch",
        "64", "--iterations", "10", "-q"]


def refused(r, field: str, *words: str):
    """Exit 2, no traceback, the message naming ``field`` (and ``words``)."""
    assert not r.traceback, r.traceback
    assert r.code == 2, (r.code, r.stdout[-500:], r.stderr)
    assert f"error: {field}:" in r.stderr, r.stderr
    for w in words:
        assert w in r.stderr, r.stderr
    return r


@pytest.mark.parametrize("gpus, pp, field, words", [
    ("64", "31", "pins", "fills whole hosts of 8"),  # 31 or 62 GPUs: neither one node nor whole nodes
    ("64", "17", "pins", "fills whole hosts of 8"),
    ("264", "33", "--pp", "has 32 layers"),  # more stages than layers
])
def test_a_pinned_pipeline_no_launch_can_hold_says_why(gpus, pp, field, words):
    """These said "pins: no configuration matches ... fix: check that tp*pp*dp fits the GPU count, tp divides the
    heads ...", all of which held."""
    r = refused(run_cli("plan", "--model", "llama2-7b", "--seq-len", "4096", "--global-batch", "1024", "--tokens",
                        "1e12", "--gpu", "H100-SXM", "--gpus", gpus, "--pp", pp, "-q"), field, words)
    assert "no configuration matches" not in r.stderr


@pytest.mark.parametrize("cp", ["3", "5"])
def test_pinned_cp_not_splitting_the_sequence_names_pin_cp(cp):
    """CP 5 at seq 4096 (2 x 5 does not divide it) said "the model fits on no GPU" with a CP-less footprint."""
    refused(run_cli(*PLAN, "--cp", cp), "--cp", "cp-divides-sequence")


@pytest.mark.parametrize("pins, words", [(["--zero", "3", "--pp", "2"], "PP 2"),
                                         (["--zero", "2", "--dp", "1", "--framework", "deepspeed"], "DP 1")])
def test_pinned_zero_the_layout_cannot_take_names_pin_zero(pins, words):
    """ZeRO-2/3 with a pinned pipeline or one data-parallel rank: the generic "no configuration matches"."""
    refused(run_cli(*PLAN, *pins), "--zero", words)


def test_provider_without_a_quote_source_is_refused(tmp_path):
    """--provider with the default catalog price source was dropped without a word (plan and estimate)."""
    refused(run_cli(*PLAN, "--provider", "aws"), "--provider", "--price-source")
    out = tmp_path / "p.json"
    assert run_cli(*PLAN, "-o", out).code == 0
    refused(run_cli("estimate", out, "--provider", "aws"), "--provider")
    assert run_cli("estimate", out, "--provider", "aws", "--price-source", "on-demand").code == 0


def test_expert_tp_on_a_dense_model_is_refused(tmp_path):
    """expert_tp = 2 on Llama-2-7B was priced and exported as if absent."""
    out = tmp_path / "p.json"
    assert run_cli(*PLAN, "-o", out).code == 0
    data = json.loads(out.read_text())
    data["expert_tp"] = 2
    out.write_text(json.dumps(data))
    for cmd in (["estimate", out], ["export", out, "--to", "megatron"]):
        refused(run_cli(*cmd), "plan.expert_tp", "ep-needs-experts")


def test_a_workload_with_no_arrivals_is_refused(tmp_path):
    """total_rate_per_s = 0 simulated nothing and reported 100 % SLO attainment."""
    w = tmp_path / "w.toml"
    w.write_text('[cluster]\ngpu = "A100-SXM-80GB"\ndtype = "fp16"\n[workload]\nduration_s = 10\n'
                 'total_rate_per_s = 0\n[[models]]\nname = "a"\nmodel = "opt-1.3b"\n')
    refused(run_cli("simulate", w), "workload.total_rate_per_s", "no request")
    # a window of a nanosecond: one arrival at t = 0 made a goodput of 1e9 requests/s
    w.write_text(w.read_text().replace("duration_s = 10", "duration_s = 1e-9").replace("total_rate_per_s = 0",
                                                                                       "total_rate_per_s = 2"))
    refused(run_cli("simulate", w), "workload.duration_s", "expects")


def _launch(target: str) -> dict[str, str]:
    job = Job(model="llama2-7b", seq_len=2048, global_batch=64, train_iterations=10,
              framework="fsdp" if target == "torchtitan" else target)
    plan = Plan(job=job, pools=[GPUPool(gpu="H100-SXM", count=16)], mbs=1, zero=1 if target != "torchtitan" else 3,
                stages=[Stage(num_layers=32, dp=16)])
    return dict(exporters.export(plan, load_model("llama2-7b"), target).files)


def _import(tmp_path, files: dict[str, str], *extra):
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    return run_cli("import", *(tmp_path / n for n in files), *extra)


@pytest.mark.parametrize("old, new, field", [
    ("--tensor-model-parallel-size 1", "--tensor-model-parallel-size 0", "--tensor-model-parallel-size"),
    ("--pipeline-model-parallel-size 1", "--pipeline-model-parallel-size 0", "--pipeline-model-parallel-size"),
    ("--bf16", "--bf16 --fp16", "--bf16")])
def test_megatron_launch_megatron_refuses(tmp_path, old, new, field):
    """TP 0 leaked "ZeroDivisionError integer modulo by zero"; --bf16 with --fp16 was read as bf16."""
    files = _launch("megatron")
    name = next(iter(files))
    assert old in files[name]
    files[name] = files[name].replace(old, new)
    refused(_import(tmp_path, files), field)


def test_import_gpus_contradicting_the_launch_is_refused(tmp_path):
    """--gpus 8 against a launch of 2 nodes x 8 ranks gave a plan on 8 GPUs."""
    refused(_import(tmp_path, _launch("megatron"), "--gpus", "8"), "--gpus", "16 ranks")


@pytest.mark.parametrize("old, new, field", [
    ("pipeline_parallel_degree 1", "pipeline_parallel_degree 0", "--parallelism.pipeline_parallel_degree"),
    ("global_batch_size 64", "global_batch_size 0", "--training.global_batch_size"),
    ("tensor_parallel_degree 1", "tensor_parallel_degree 3", "--parallelism.data_parallel_shard_degree")])
def test_torchtitan_launch_torchtitan_refuses(tmp_path, old, new, field):
    """PP 0 was read as one stage, global batch 0 as local x DP, and shard -1 with TP 3 of 16 ranks as 5."""
    files = _launch("torchtitan")
    if old.startswith("tensor"):  # the shard degree left to torchtitan
        files["launch.sh"] = files["launch.sh"].replace("data_parallel_shard_degree 16", "data_parallel_shard_degree -1")
    assert old in files["launch.sh"]
    files["launch.sh"] = files["launch.sh"].replace(old, new)
    refused(_import(tmp_path, files), field)


@pytest.mark.parametrize("key, value, field", [
    ("train_micro_batch_size_per_gpu", 0, "train_micro_batch_size_per_gpu"),
    ("train_micro_batch_size_per_gpu", "auto", "train_micro_batch_size_per_gpu"),
    ("gradient_accumulation_steps", 0, "gradient_accumulation_steps"),
    ("train_batch_size", 63, "train_batch_size"), ("train_batch_size", 128, "train_batch_size"),
    ("fp16", {"enabled": True}, "bf16")])
def test_deepspeed_config_deepspeed_refuses(tmp_path, key, value, field):
    """Zero batch numbers leaked ZeroDivisionError; a train_batch_size off mbs x accumulation x DP blamed the
    pool's GPU count; bf16 with fp16 was read as bf16."""
    files = _launch("deepspeed")
    cfg = json.loads(files["ds_config.json"])
    cfg[key] = value
    files["ds_config.json"] = json.dumps(cfg)
    refused(_import(tmp_path, files), field)


def test_deepspeed_batch_without_accumulation_steps_follows_deepspeed(tmp_path):
    """train_batch_size and the micro-batch alone: DeepSpeed derives the accumulation (it was taken as 1, so DP 64
    on 16 GPUs)."""
    files = _launch("deepspeed")
    cfg = json.loads(files["ds_config.json"])
    del cfg["gradient_accumulation_steps"]
    files["ds_config.json"] = json.dumps(cfg)
    r = _import(tmp_path, files)
    assert r.code == 0, r.stderr
    plan = json.loads(r.stdout)
    assert plan["stages"][0]["dp"] == 16 and plan["job"]["global_batch"] == 64 and plan["mbs"] == 1


def test_baseline_of_other_work_per_iteration_is_refused(tmp_path):
    """A Llama-2-13B baseline at seq 2048 / batch 32 was compared with Llama-2-7B at 4096 / 64 ("0.49x as fast")."""
    other = tmp_path / "other.json"
    assert run_cli("plan", "--model", "llama2-13b", "--gpu", "H100-SXM", "--gpus", "16", "--seq-len", "2048",
                   "--global-batch", "32", "--iterations", "10", "-q", "-o", other).code == 0
    refused(run_cli(*PLAN, "--baseline", other), "--baseline", "llama2-13b", "seq_len 2048", "global_batch 32")


def test_baseline_is_priced_for_the_jobs_length(tmp_path):
    """A baseline written for 10 iterations against a 1,000-iteration search: the job $ ratio compared two job
    lengths (it is the per-iteration ratio when both run the same job)."""
    short = tmp_path / "short.json"
    assert run_cli(*PLAN, "--pp", "4", "-o", short).code == 0
    long_job = [*PLAN[:-3], "--iterations", "1000"]
    r = run_cli(*long_job, "--json", "--top", "1", "--baseline", short)
    assert r.code == 0, r.stderr
    out = json.loads(r.stdout)
    best, base = out["plans"][0], out["baseline"]
    per_iteration = best["usd_per_iteration"] / base["summary"]["usd_per_iteration"]
    assert base["usd_ratio"] == pytest.approx(per_iteration, rel=1e-6)
    from hetplan.units import usd_text  # the text line's job $ as the table writes money ($0.26 printed "$0")

    text = run_cli(*PLAN, "--baseline", short).stdout
    tiny = run_cli(*PLAN, "--json", "--top", "1", "--baseline", short)
    assert f"job ${usd_text(json.loads(tiny.stdout)['baseline']['summary']['job_usd'])};" in text, text[-400:]


@pytest.mark.parametrize("sets", ["", ",,", " , "])
def test_validate_sets_naming_no_set_is_refused(sets):
    """--sets "" ran every set; --sets ",," none (exit 0 with one interval line)."""
    refused(run_cli("validate", "--sets", sets), "--sets", "names no validation set")


def test_calibrate_gpus_below_one_is_refused(tmp_path):
    """--gpus -1 was dropped where the runs give their GPU count."""
    runs = tmp_path / "r.csv"
    runs.write_text("model,gpu,gpus,seq_len,global_batch,step_time_s\nllama2-7b,H100-SXM,8,4096,64,1.0\n")
    refused(run_cli("calibrate", runs, "--gpus", "-1"), "--gpus")


def test_frontier_gpu_with_a_plan_is_refused(tmp_path):
    """--gpu names a profile CSV's GPU (its idle power); with a plan it was dropped, an unknown name included."""
    out = tmp_path / "p.json"
    assert run_cli(*PLAN, "-o", out).code == 0
    for gpu in ("Z", "A100-SXM-80GB"):
        refused(run_cli("energy", "frontier", out, "-o", tmp_path / "f", "--gpu", gpu), "--gpu", "profile CSV")


def test_profile_import_seq_len_without_model_is_refused(tmp_path):
    """--seq-len 0 (or any) without --model was dropped: the files' labels carry their own lengths."""
    f = tmp_path / "f.csv"
    f.write_text("model,gpu,tp,index,kind,forward_time_s_mbs1\ngpt2XL,A100,1,1,layer,0.0031\n")
    for value in ("0", "2048"):
        refused(run_cli("profile", "import", "fasop", f, "--db", tmp_path / "p.db", "--seq-len", value), "--seq-len")


def test_profile_layers_beyond_memory_is_refused_not_an_allocator_traceback(tmp_path):
    """mbs 1e8 x seq 2048 of the tiny model: torch's "DefaultCPUAllocator: can't allocate memory" escaped; now a
    micro-batch above a plan's largest global batch is refused by name, and one below it that no memory holds (mbs
    65,536 x 512 tokens: the allocator overcommitted and the OOM killer ended the run after minutes) before torch
    allocates it."""
    pytest.importorskip("torch")
    model = str(__import__("pathlib").Path(__file__).resolve().parents[2] / "examples" / "tiny-model.json")
    refused(run_cli("profile", "layers", "--model", model, "--db", tmp_path / "l.db", "--kinds", "layer",
                    "--dtype", "fp32", "--mbs", "100000000", "--seq-len", "512", "--warmup", "0", "--repeats", "1"),
            "--mbs", "micro-batch 100,000,000")
    refused(run_cli("profile", "layers", "--model", model, "--db", tmp_path / "l.db", "--kinds", "layer",
                    "--dtype", "fp32", "--mbs", "65536", "--seq-len", "512", "--warmup", "0", "--repeats", "1"),
            "--mbs/--seq-len", "mbs 65,536 x seq_len 512")
    r = run_cli("profile", "layers", "--model", model, "--db", tmp_path / "l.db", "--threads", "0")  # was the default
    assert r.code == 2 and not r.traceback and "--threads" in r.stderr, r.stderr


ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("edit, words", [("default_max_new_tokens = 100", "max_new_tokens_limit"),
                                         ("default_max_new_tokens = 300\nmax_new_tokens_limit = 500", "kv_cache_len")])
def test_serve_default_request_no_request_may_have_is_refused(tmp_path, edit, words):
    """A default above the limit (or without room for a prompt in a KV-cache slot) started a server that answered
    every request without max_new_tokens with 422."""
    cfg = tmp_path / "serve.toml"
    cfg.write_text((ROOT / "examples" / "serve" / "serve.toml").read_text()
                   .replace("default_max_new_tokens = 4", edit))
    refused(run_cli("serve", cfg), "api.default_max_new_tokens", words)


@pytest.mark.parametrize("command", ["energy", "serve"])
def test_servers_on_a_port_in_use_exit_2_before_starting(tmp_path, command):
    """uvicorn logged "address already in use" and exited 3 after start-up (hetplan serve: after its workers)."""
    import socket

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen(1)
        port = str(held.getsockname()[1])
        args = (["energy", "serve", "--db", tmp_path / "e.db"] if command == "energy"
                else ["serve", ROOT / "examples" / "serve" / "serve.toml"])
        refused(run_cli(*args, "--port", port), "--port", "in use")
    refused(run_cli("energy", "serve", "--db", tmp_path / "e.db", "--host", "10.254.254.254", "--token", "x" * 20),
            "--host", "cannot listen")  # no address of this machine (no DNS look-up)


@pytest.mark.parametrize("key, value", [("fsdp_param_dtype", "bf16"), ("pipeline_outputs", "all")])
def test_fsdp_only_plan_fields_outside_fsdp_are_refused(tmp_path, key, value):
    """fsdp_param_dtype = bf16 / pipeline_outputs = all on a Megatron plan were priced as if absent."""
    out = tmp_path / "p.json"
    assert run_cli(*PLAN, "--pp", "2", "-o", out).code == 0
    data = json.loads(out.read_text())
    data[key] = value
    out.write_text(json.dumps(data))
    for cmd in (["estimate", out], ["export", out, "--to", "megatron"]):
        refused(run_cli(*cmd), f"plan.{key}", "framework 'fsdp'")
    data["job"]["framework"] = "fsdp"
    data["zero"] = 3
    out.write_text(json.dumps(data))
    assert run_cli("estimate", out).code == 0


def test_length_distribution_mean_outside_its_clip_is_refused(tmp_path):
    """A lognormal input of mean 5,000 clipped at 2,048: every draw at most 2,048, the rate bounds on a mean of
    5,000 (capacity printed a mix for it)."""
    text = (ROOT / "examples" / "serve" / "capacity-engines.toml").read_text()
    assert "mean = 512" in text
    w = tmp_path / "w.toml"
    w.write_text(text.replace("mean = 512", "mean = 5000", 1))
    refused(run_cli("capacity", w), "workload.input.mean", "outside min..max")


def test_job_file_with_both_deadlines_is_refused(tmp_path):
    """deadline_days replaced deadline_s without a word."""
    text = (ROOT / "examples" / "llama2-7b-mixed-cloud.toml").read_text()
    job = tmp_path / "job.toml"
    job.write_text(text.replace("deadline_days = 60", "deadline_days = 60\ndeadline_s = 100"))
    refused(run_cli("plan", job, "-q"), "objective.deadline_days", "not both")


@pytest.mark.parametrize("units", ["inter_node_bandwidth_gbit_per_s = 400\ninter_node_bandwidth_bytes_per_s = 1e9",
                                   "intra_node_bandwidth_gb_per_s = 900\nintra_node_bandwidth_bytes_per_s = 1e9"])
def test_pool_with_a_bandwidth_in_both_units_is_refused(tmp_path, units):
    """The Gb/s value replaced the bytes/s one without a word (the plan ran at 400 Gb/s, not the 8 Gb/s given)."""
    job = tmp_path / "job.toml"
    job.write_text('[job]\nmodel = "llama2-7b"\nseq_len = 4096\nglobal_batch = 64\n[[inventory]]\n'
                   f'gpu = "H100-SXM"\ncount = 8\n{units}\n')
    refused(run_cli("plan", job, "-q"), f"inventory.0.{units.split(' ')[0]}", "not both")


@pytest.mark.parametrize("where", ["flag", "file"])
def test_an_empty_model_name_is_refused_as_empty(tmp_path, where):
    """model = "" read the current folder as the model: "model: . is a directory, not a file"."""
    job = tmp_path / "job.toml"
    job.write_text('[job]\nmodel = ""\nseq_len = 128\nglobal_batch = 8\n[[inventory]]\ngpu = "H100-SXM"\ncount = 8\n')
    args = [job] if where == "file" else ["--model", "", "--seq-len", "128", "--global-batch", "8", "--gpu",
                                           "H100-SXM", "--gpus", "8"]
    r = refused(run_cli("plan", *args, "-q"), "model", "empty")
    assert "directory" not in r.stderr


@pytest.mark.parametrize("flags", [["--price", "0.01"], ["--gpus", "8"], ["--network", "ethernet"],
                                   ["--inter-node-gbit", "100"]])
def test_pool_flags_without_gpu_are_refused(flags):
    """With a job file's pools, --price 0.01 printed the catalog-priced job ($86,009) as if given."""
    refused(run_cli("plan", ROOT / "examples" / "llama2-7b-mixed-cloud.toml", "-q", *flags), flags[0], "--gpu")


def test_inventory_and_gpu_together_are_refused(tmp_path):
    """--gpu replaced the pools of --inventory without a word."""
    inv = tmp_path / "inv.toml"
    inv.write_text('[[inventory]]\ngpu = "H100-SXM"\ncount = 16\n')
    refused(run_cli(*PLAN, "--inventory", inv), "--inventory", "--gpu")


def test_calibration_of_other_gpus_is_refused(tmp_path):
    """A calibration fitted on H100-SXM-96GB-500W runs, given for an H100-SXM plan: its factors and interval
    applied to no pool and the numbers printed were uncalibrated, without a word (plan and estimate)."""
    cal = tmp_path / "cal.toml"
    runs = ROOT / "tests" / "fixtures" / "calibration" / "torchtitan_llama3_8b_h100_runs.csv"
    assert run_cli("calibrate", runs, "--residuals-only", "-o", cal).code == 0
    out = tmp_path / "p.json"
    assert run_cli(*PLAN, "-o", out).code == 0
    refused(run_cli(*PLAN, "--calibration", cal), "--calibration", "H100-SXM-96GB-500W")
    refused(run_cli("estimate", out, "--calibration", cal), "--calibration", "no pool here")


def test_catalog_prices_of_an_empty_gpu_name_is_refused():
    """--gpu "" listed every GPU type's quotes as if no filter were given."""
    refused(run_cli("catalog", "prices", "--gpu", ""), "--gpu", "unknown GPU type")


def test_empty_names_are_refused_not_taken_as_absent(tmp_path):
    """simulate --policy "" kept the file's policy; import --model "" matched a preset, --gpu "" wrote gpu ""."""
    refused(run_cli("simulate", ROOT / "examples" / "serve" / "workload.toml", "--policy", ""), "--policy")
    files = _launch("megatron")
    refused(_import(tmp_path, files, "--gpu", ""), "--gpu", "empty")
    refused(_import(tmp_path, files, "--model", " "), "--model", "empty")


def test_import_for_a_gpu_the_catalog_does_not_know_is_refused(tmp_path):
    """--gpu FOO wrote a plan on GPU 'FOO' that nothing could price; an alias is written as the catalog's name."""
    refused(_import(tmp_path, _launch("megatron"), "--gpu", "FOO"), "--gpu", "unknown GPU")
    ok = _import(tmp_path, _launch("megatron"), "--gpu", "h100")
    assert ok.code == 0 and '"gpu": "H100-SXM"' in ok.stdout
