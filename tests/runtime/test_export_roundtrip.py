"""Exports reproduce the plan: each framework's files are parsed back the way the framework reads them and every
quantity of the plan is recovered (degrees, layer split, micro-batch, micro-batch count, global batch, virtual
stages, recomputation, ZeRO mode, dtype, model shapes). What a framework cannot run is refused with a reason."""

from __future__ import annotations

import ast
import json
import shlex
import tomllib

from pathlib import Path

import pytest

from hetplan.errors import HetplanError
from hetplan.model.spec import load_model
from hetplan.plan import GPUPool, Job, Plan, Stage
from hetplan.runtime import exporters, importers

ROOT = Path(__file__).parents[2]


def _plan(model, stages, *, gbs, mbs, seq=2048, zero=0, v=1, pools=None, dtype="bf16", attention="standard"):
    job = Job(model=model, seq_len=seq, global_batch=gbs, train_iterations=100, dtype=dtype, attention=attention)
    pools = pools or [GPUPool(gpu="H100-SXM", count=64)]
    return Plan(job=job, pools=pools, stages=[Stage(**s) for s in stages], mbs=mbs, zero=zero, virtual_stages=v,
                sequence_parallel=any(s.get("tp", 1) > 1 for s in stages))


def _expected(plan: Plan) -> dict:
    """What every framework must reproduce."""
    st = plan.stages
    rec = st[0].recompute
    return {"tp": st[0].tp, "dp": st[0].dp, "pp": plan.pp, "stage_layers": [s.num_layers for s in st],
            "mbs": plan.mbs, "global_batch": plan.job.global_batch, "microbatches": plan.num_microbatches(0),
            "virtual_stages": plan.virtual_stages, "recompute": rec, "zero": plan.zero, "dtype": plan.job.dtype}


# --- Megatron-LM: the arguments pretrain_gpt.py parses ------------------------------------------------------------

def _megatron(ex: exporters.Export, spec) -> dict:
    words = shlex.split(ex.files["megatron_launch.sh"].replace("\\\n", " "), comments=True)
    nnodes, nproc = int(words[words.index("--nnodes") + 1]), int(words[words.index("--nproc-per-node") + 1])
    args, rest = {}, words[words.index("pretrain_gpt.py") + 1:]
    for i, w in enumerate(rest):
        if w.startswith("--"):
            nxt = rest[i + 1] if i + 1 < len(rest) else None
            args[w[2:]] = nxt if nxt is not None and not nxt.startswith("--") else True
    tp, pp, cp = (int(args[k]) for k in ("tensor-model-parallel-size", "pipeline-model-parallel-size",
                                          "context-parallel-size"))
    dp = nnodes * nproc // (tp * pp * cp)  # Megatron: world / (tp * pp * cp)
    L = int(args["num-layers"])
    first, last = args.get("decoder-first-pipeline-num-layers"), args.get("decoder-last-pipeline-num-layers")
    given = [int(x) for x in (first, last) if x is not None]
    mid = (L - sum(given)) // (pp - len(given)) if pp > len(given) else 0
    layers = [mid] * pp
    if first is not None:
        layers[0] = int(first)
    if last is not None:
        layers[-1] = int(last)
    if pp == 1:
        layers = [L]
    mbs, gbs = int(args["micro-batch-size"]), int(args["global-batch-size"])
    vps = args.get("num-layers-per-virtual-pipeline-stage")
    vpr = args.get("num-virtual-stages-per-pipeline-rank")
    e, loss = ("account-for-embedding-in-pipeline-split" in args), ("account-for-loss-in-pipeline-split" in args)
    assert not ((e or loss) and (first or last)), "Megatron-Core refuses account-for-* with decoder-first/last"
    if vpr or e or loss:  # embedding / loss counted as a layer of the split: (L + e + l) / (pp * v) units per chunk
        v = int(vpr) if vpr else 1
        c = (L + e + loss) // (pp * v)
        layers = [v * c - e] + [v * c] * (pp - 2) + [v * c - loss]
    zero = 1 if "use-distributed-optimizer" in args else 0
    if "use-megatron-fsdp" in args:
        zero = {"optim_grads": 2, "optim_grads_params": 3}[args["data-parallel-sharding-strategy"]]
    rec = args.get("recompute-granularity", "none")
    dtype = "fp8" if "fp8-format" in args else "bf16" if "bf16" in args else "fp16" if "fp16" in args else "fp32"
    assert int(args["hidden-size"]) == spec.hidden_size and int(args["ffn-hidden-size"]) == spec.ffn_hidden_size
    assert int(args["num-attention-heads"]) == spec.num_attention_heads
    assert int(args.get("num-query-groups", spec.num_attention_heads)) == spec.num_kv_heads
    return {"tp": tp, "dp": dp, "pp": pp, "stage_layers": layers, "mbs": mbs, "global_batch": gbs,
            "microbatches": gbs // (mbs * dp),
            "virtual_stages": int(vpr) if vpr else L // (pp * int(vps)) if vps else 1,
            "recompute": rec, "zero": zero, "dtype": dtype, "args": args}


# --- DeepSpeed: ds_config.json + PipelineModule partition ---------------------------------------------------------

def _deepspeed(ex: exporters.Export, spec) -> dict:
    cfg, pipe = json.loads(ex.files["ds_config.json"]), json.loads(ex.files["pipeline_module.json"])
    if "hetplan_pipeline.py" in ex.files:  # the PipelineModule subclass's boundaries
        tree = ast.parse(ex.files["hetplan_pipeline.py"])
        parts = next(ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign)
                     and n.targets[0].id == "PARTS")
    else:  # DeepSpeed's uniform partition of the L + 2 layer specs is what the plan asked for
        parts = pipe["parts"]
        assert pipe["stage_layers"] == exporters.balanced_split_ds(spec.num_layers, pipe["num_stages"])
    sizes = [b - a for a, b in zip(parts, parts[1:])]
    sizes[0] -= 1  # the embedding spec
    sizes[-1] -= 1  # final norm + head
    mbs, gas, gbs = cfg["train_micro_batch_size_per_gpu"], cfg["gradient_accumulation_steps"], cfg["train_batch_size"]
    rec = "full" if pipe["activation_checkpoint_interval"] else "none"
    return {"tp": 1, "dp": gbs // (mbs * gas), "pp": pipe["num_stages"], "stage_layers": sizes, "mbs": mbs,
            "global_batch": gbs, "microbatches": gas, "virtual_stages": 1, "recompute": rec,
            "zero": cfg["zero_optimization"]["stage"],
            "dtype": "bf16" if cfg["bf16"]["enabled"] else "fp16" if cfg["fp16"]["enabled"] else "fp32"}


# --- torchtitan: the TOML job config and the flavor module ---------------------------------------------------------

def _torchtitan(ex: exporters.Export, spec) -> dict:
    cfg = tomllib.loads(ex.files["torchtitan.toml"])
    par, tr = cfg["parallelism"], cfg["training"]
    dp = par["data_parallel_replicate_degree"] * par["data_parallel_shard_degree"]
    pp = par["pipeline_parallel_degree"]
    if pp > 1:  # micro-batches per step = local_batch_size / microbatch size; no accumulation
        mbs = par["pipeline_parallel_microbatch_size"]
        micro = tr["local_batch_size"] // mbs
        assert tr["global_batch_size"] == tr["local_batch_size"] * dp
        parts = par["module_fqns_per_model_part"]
        layers = [0] * pp
        for k, part in enumerate(parts):  # looped schedules: model part k on pipeline rank k % pp
            layers[k % pp] += sum(1 for fqn in part if fqn.startswith("layers."))
        v = len(parts) // pp
        assert parts[0][0] == "tok_embeddings" and parts[-1][-2:] == ["norm", "output"]
        flat = [f for part in parts for f in part if f.startswith("layers.")]
        assert flat == [f"layers.{i}" for i in range(spec.num_layers)]  # every layer once, in model order
    else:  # one micro-batch per step, global / (local * dp) steps accumulated
        mbs = tr["local_batch_size"]
        micro = tr["global_batch_size"] // (mbs * dp)
        layers, v = [spec.num_layers], 1
    if par["data_parallel_shard_degree"] > 1:
        zero = 3 if par["fsdp_reshard_after_forward"] != "never" else 2
    else:
        zero = 0
    if "hetplan_torchtitan_model.py" in ex.files:  # the flavor's shapes, through torchtitan's FeedForward formula
        call = next(n.value for n in ast.walk(ast.parse(ex.files["hetplan_torchtitan_model.py"]))
                    if isinstance(n, ast.Assign) and isinstance(n.value, ast.Call))
        kw = {k.arg: ast.literal_eval(k.value) for k in call.keywords}
        hidden = int(kw["ffn_dim_multiplier"] * int(2 * 4 * kw["dim"] / 3))
        ffn = kw["multiple_of"] * ((hidden + kw["multiple_of"] - 1) // kw["multiple_of"])
        assert (kw["dim"], kw["n_layers"], kw["n_heads"], kw["n_kv_heads"], kw["vocab_size"], ffn) == (
            spec.hidden_size, spec.num_layers, spec.num_attention_heads, spec.num_kv_heads, spec.vocab_size,
            spec.ffn_hidden_size)
        assert cfg["experimental"]["custom_import"] == "hetplan_torchtitan_model"
    return {"tp": par["tensor_parallel_degree"], "dp": dp, "pp": pp, "stage_layers": layers, "mbs": mbs,
            "global_batch": tr["global_batch_size"], "microbatches": micro, "virtual_stages": v,
            "recompute": cfg["activation_checkpoint"]["mode"], "zero": zero, "flavor": cfg["model"]["flavor"],
            "dtype": "fp8" if "quantize.linear.float8" in cfg["model"].get("converters", []) else
            {"bfloat16": "bf16", "float32": "fp32"}[tr["mixed_precision_param"]]}


def _torchtitan_03(ex: exporters.Export, spec) -> dict:
    """torchtitan 0.3's command line, read back by ``hetplan import`` (the overrides ConfigManager applies)."""
    plan = importers.import_files(ex.files)
    assert load_model(plan.job.model) == spec
    return {"tp": plan.stages[0].tp, "dp": plan.stages[0].dp, "pp": plan.pp,
            "stage_layers": [s.num_layers for s in plan.stages], "mbs": plan.mbs,
            "global_batch": plan.job.global_batch, "microbatches": plan.num_microbatches(0),
            "virtual_stages": plan.virtual_stages, "recompute": plan.stages[0].recompute, "zero": plan.zero,
            "dtype": plan.job.dtype}


READ = {"megatron": _megatron, "deepspeed": _deepspeed, "torchtitan": _torchtitan, "torchtitan@0.3": _torchtitan_03}

#: (name, plan, targets that must reproduce it)
CASES = [
    ("uneven-pp2-ddp", lambda: _plan("llama2-7b", [{"num_layers": 17, "dp": 4}, {"num_layers": 15, "dp": 4}],
                                      gbs=64, mbs=2), ("megatron", "deepspeed", "torchtitan")),
    ("tp2-pp4-zero1-full-interleaved", lambda: _plan(
        "llama2-7b", [{"num_layers": 8, "tp": 2, "dp": 2, "recompute": "full"}] * 4, gbs=64, mbs=1, zero=1, v=2),
     ("megatron",)),
    ("pp1-fsdp-16-microbatches", lambda: _plan("llama3-8b", [{"num_layers": 32, "dp": 8}], gbs=128, mbs=1, zero=3),
     ("megatron", "torchtitan")),
    ("pp3-uneven-zero1-recompute", lambda: _plan(
        "gpt3-1.3b", [{"num_layers": 9, "dp": 2, "recompute": "full"}, {"num_layers": 8, "dp": 2, "recompute": "full"},
                      {"num_layers": 7, "dp": 2, "recompute": "full"}], gbs=32, mbs=4, zero=1),
     ("megatron", "deepspeed")),
    ("llama3-style-uneven-interleaved", lambda: _plan(
        str(ROOT / "examples" / "tiny-model.json"), [{"num_layers": 1}, {"num_layers": 2}, {"num_layers": 1}],
        gbs=12, mbs=2, seq=128, v=2), ("megatron", "torchtitan")),
    ("llama3-style-uneven-1f1b-embedding", lambda: _plan(  # 32 layers + the embedding = 3 x 11 units
        "llama2-7b", [{"num_layers": 10, "dp": 2}, {"num_layers": 11, "dp": 2}, {"num_layers": 11, "dp": 2}],
        gbs=64, mbs=2), ("megatron", "deepspeed", "torchtitan")),
    ("llama3-style-uneven-1f1b-embedding-and-loss", lambda: _plan(  # 4 layers + embedding + loss = 3 x 2 units
        str(ROOT / "examples" / "tiny-model.json"), [{"num_layers": 1}, {"num_layers": 2}, {"num_layers": 1}],
        gbs=12, mbs=2, seq=128), ("megatron", "deepspeed", "torchtitan")),
    ("fp8-tp2-pp2-fsdp", lambda: _plan("llama3-8b", [{"num_layers": 16, "tp": 2, "dp": 4}] * 2, gbs=64, mbs=1,
                                       zero=3, dtype="fp8", attention="flash"), ("megatron", "torchtitan")),
    ("zero2-pp1-selective", lambda: _plan("llama2-7b", [{"num_layers": 32, "tp": 4, "dp": 4, "recompute": "selective"}],
                                          gbs=64, mbs=2, zero=2), ("megatron", "torchtitan")),
]


def st_dp(plan: Plan) -> int:
    return plan.stages[0].dp


@pytest.mark.parametrize("name, make, targets", CASES, ids=[c[0] for c in CASES])
def test_export_reads_back_as_the_plan(name, make, targets):
    plan = make()
    spec = load_model(plan.job.model)
    want = _expected(plan)
    # torchtitan runs SDPA's fused attention only: a plan priced with stored scores is refused there
    flash = plan.model_copy(update={"job": plan.job.model_copy(update={"attention": "flash"})})
    for target in targets + (("torchtitan@0.3",) if "torchtitan" in targets else ()):
        name, _, version = target.partition("@")
        # the TOML reader reads torchtitan 0.2's form; 0.3's command line is read back by hetplan import
        version = version or ("0.2" if name == "torchtitan" else None)
        if version == "0.2" and plan.zero == 0 and st_dp(plan) > 1 and (plan.pp > 1 or plan.stages[0].tp > 1):
            with pytest.raises(HetplanError, match="1-D meshes"):  # 0.2's DDP: 'not supported > 1D parallelism'
                exporters.export(flash, spec, name, version=version)
            continue
        ex = exporters.export(flash if name == "torchtitan" else plan, spec, name, version=version)
        got = READ[target](ex, spec)
        assert {k: got[k] for k in want} == want, (target, got)


@pytest.mark.parametrize("tokens, iterations", [(1e12, 238_419), (4_194_304_000.0, 1000), (4_194_305.0, 2)])
@pytest.mark.parametrize("target", ["megatron", "deepspeed", "torchtitan@0.2", "torchtitan@0.3"])
def test_a_token_budget_launches_enough_iterations(target, tokens, iterations):
    """1e12 tokens at 1,024 x 4,096 per iteration launched int(238,418.6) = 238,418 iterations, 2.4 M tokens short
    of the job (plan printed 238,419); an exact multiple stays exact."""
    job = Job(model="llama2-7b", seq_len=4096, global_batch=1024, train_tokens=tokens)
    plan = Plan(job=job, pools=[GPUPool(gpu="H100-SXM", count=64)], stages=[Stage(num_layers=32, dp=64)], mbs=2)
    assert job.launch_iterations() == iterations
    name, _, version = target.partition("@")
    text = "\n".join(exporters.export(plan, load_model("llama2-7b"), name, version=version or None).files.values())
    words = {"megatron": f"--train-iters {iterations} ", "deepspeed": f'"train_iterations": {iterations}',
             "torchtitan@0.2": f"steps = {iterations}\n", "torchtitan@0.3": f"--training.steps {iterations} "}
    assert words[target] in text


def test_torchtitan_pp1_runs_one_microbatch_per_step():
    """Issue 18: a plan at micro-batch 1 x 16 accumulated micro-batches must not run 16 sequences per step."""
    plan = _plan("llama3-8b", [{"num_layers": 32, "dp": 8}], gbs=128, mbs=1, zero=3, attention="flash")
    cfg = tomllib.loads(exporters.export(plan, load_model("llama3-8b"), "torchtitan", version="0.2")
                        .files["torchtitan.toml"])
    assert cfg["training"]["local_batch_size"] == 1 and cfg["training"]["global_batch_size"] == 128
    assert cfg["model"] == {"name": "llama3", "flavor": "8B"}  # a flavor torchtitan ships


def test_megatron_uneven_split_flags_match_the_plan():
    """Uneven splits go to Megatron as the embedding / loss counted as a layer (Llama 3) when that is what the plan
    is, else as the first / last stage's own layer counts; never both (Megatron-Core asserts against it)."""
    spec = load_model("llama2-7b")

    def flags(layers):
        plan = _plan("llama2-7b", [{"num_layers": n, "dp": 2} for n in layers], gbs=64, mbs=2)
        return {k for k in _megatron(exporters.export(plan, spec, "megatron"), spec)["args"]
                if "pipeline-split" in k or "pipeline-num-layers" in k}

    assert flags([10, 11, 11]) == {"account-for-embedding-in-pipeline-split"}
    assert flags([11, 11, 10]) == {"account-for-loss-in-pipeline-split"}
    assert flags([8, 8, 8, 8]) == set()
    assert flags([9, 11, 12]) == {"decoder-first-pipeline-num-layers", "decoder-last-pipeline-num-layers"}
    assert flags([12, 10, 10]) == {"decoder-first-pipeline-num-layers"}


def test_megatron_cp_and_moe_arguments():
    spec = load_model("llama2-7b")
    plan = _plan("llama2-7b", [{"num_layers": 32, "tp": 4, "dp": 2}], gbs=64, mbs=1)
    cp2 = plan.model_copy(update={"stages": [plan.stages[0].model_copy(update={"cp": 2})]})
    args = _megatron(exporters.export(cp2, spec, "megatron"), spec)["args"]
    assert args["context-parallel-size"] == "2" and "num-experts" not in args
    moe = spec.model_copy(update={"num_experts": 8, "experts_per_token": 2, "expert_ffn_hidden_size": 1408})
    ep = plan.model_copy(update={"stages": [plan.stages[0].model_copy(update={"ep": 2})]})
    args = _megatron(exporters.export(ep, moe, "megatron"), moe)["args"]
    assert (args["num-experts"], args["moe-router-topk"], args["expert-model-parallel-size"],
            args["moe-ffn-hidden-size"], args["expert-tensor-parallel-size"]) == ("8", "2", "2", "1408", "1")


def test_mixed_gpu_types_export_with_node_ranks():
    """Stages on different GPU types with one TP/DP: Megatron and DeepSpeed run them; the note says which nodes."""
    pools = [GPUPool(gpu="A100-SXM-80GB", count=8), GPUPool(gpu="V100-SXM-32GB", count=8)]
    plan = _plan("gpt3-1.3b", [{"pool": 0, "num_layers": 14, "dp": 8}, {"pool": 1, "num_layers": 10, "dp": 8}],
                 gbs=64, mbs=2, pools=pools, dtype="fp16")
    spec = load_model("gpt3-1.3b")
    for target in ("megatron", "deepspeed"):
        ex = exporters.export(plan, spec, target)
        assert READ[target](ex, spec)["stage_layers"] == [14, 10]
        assert any("stage 0 on A100-SXM-80GB: node ranks 0-0; stage 1 on V100-SXM-32GB: node ranks 1-1" in n
                   for n in ex.notes), ex.notes


def test_heterogeneous_tp_refused_without_suggesting_run():
    pools = [GPUPool(gpu="A100-SXM-80GB", count=8), GPUPool(gpu="V100-SXM-32GB", count=8)]
    plan = _plan("gpt3-1.3b", [{"pool": 0, "num_layers": 14, "tp": 2, "dp": 4}, {"pool": 1, "num_layers": 10, "dp": 8}],
                 gbs=64, mbs=1, pools=pools, dtype="fp16")
    for target in exporters.TARGETS:
        with pytest.raises(HetplanError, match="one device mesh") as e:
            exporters.export(plan, load_model("gpt3-1.3b"), target)
        assert "stage 0: TP 2 DP 4, stage 1: TP 1 DP 8" in e.value.message and "hetplan run" not in e.value.fix


@pytest.mark.parametrize("target, update, match", [
    ("deepspeed", {"zero": 2}, "refuses pipeline parallelism with ZeRO-2"),
    ("deepspeed", {"stages": [Stage(num_layers=16, tp=2, dp=2)] * 2}, "has no tensor parallelism"),
    ("torchtitan", {"job": Job(model="gpt3-1.3b", seq_len=2048, global_batch=64)}, "Llama-shaped"),
    ("torchtitan", {"job": Job(model="llama2-7b", seq_len=2048, global_batch=64, dtype="fp16")}, "not float16"),
    ("torchtitan", {"fsdp_param_dtype": "bf16"}, "fp32 sharded parameters"),
    ("torchtitan", {"cross_entropy": "bf16"}, "fp32 sharded parameters"),
    ("megatron", {"schedule": "gpipe"}, "1f1b only, not gpipe .*rule framework-can-launch"),
    ("deepspeed", {"virtual_stages": 2}, "deepspeed 0.19 has no interleaved schedule"),
])
def test_what_a_framework_cannot_run_is_refused(target, update, match):
    plan = _plan("llama2-7b", [{"num_layers": 16, "dp": 4}] * 2, gbs=64, mbs=2).model_copy(update=update)
    spec = load_model(plan.job.model)
    if spec.num_layers != 32:
        plan = plan.model_copy(update={"stages": [Stage(num_layers=12, dp=4)] * 2})
    with pytest.raises(HetplanError, match=match):
        exporters.export(plan, spec, target)


def test_selective_recompute_under_flash_goes_to_deepspeed_as_none():
    plan = _plan("gpt3-1.3b", [{"num_layers": 12, "dp": 2, "recompute": "selective"}] * 2, gbs=16, mbs=2,
                 attention="flash")
    ex = exporters.export(plan, load_model("gpt3-1.3b"), "deepspeed")
    assert _deepspeed(ex, load_model("gpt3-1.3b"))["recompute"] == "none" and any("FlashAttention" in n for n in ex.notes)
    with pytest.raises(HetplanError, match="no selective"):
        exporters.export(plan.model_copy(update={"job": plan.job.model_copy(update={"attention": "standard"})}),
                         load_model("gpt3-1.3b"), "deepspeed")


def test_megatron_partial_full_recompute_is_block_method():
    plan = _plan("llama2-7b", [{"num_layers": 16, "dp": 4, "recompute": "full", "recompute_layers": 5}] * 2,
                 gbs=64, mbs=2)
    args = _megatron(exporters.export(plan, load_model("llama2-7b"), "megatron"), load_model("llama2-7b"))["args"]
    assert (args["recompute-method"], args["recompute-num-layers"]) == ("block", "5")


def test_fp8_export_carries_the_recipe_the_estimate_assumed():
    """Megatron-LM: bf16 plus NeMo's FP8 recipe on Hopper (hybrid, delayed scaling over 1,024 steps, FP8
    parameters) and MXFP8 on Blackwell; torchtitan 0.2: the float8 converter with the FSDP2 float8 all-gather
    (tensorwise), 0.3: rowwise (its converter's default), the head filtered, torch.compile on; DeepSpeed refuses
    with the reason."""
    plan = _plan("llama3-8b", [{"num_layers": 32, "tp": 2, "dp": 4}], gbs=64, mbs=1, zero=1, dtype="fp8",
                 attention="flash")
    spec = load_model("llama3-8b")
    args = _megatron(exporters.export(plan, spec, "megatron"), spec)["args"]
    assert args["bf16"] is True and args["fp8-format"] == "hybrid" and args["fp8-recipe"] == "delayed"
    assert args["fp8-amax-history-len"] == "1024" and args["fp8-amax-compute-algo"] == "max"
    assert args["fp8-param-gather"] is True
    b200 = plan.model_copy(update={"pools": [GPUPool(gpu="B200", count=64)]})
    args = _megatron(exporters.export(b200, spec, "megatron"), spec)["args"]
    assert args["fp8-recipe"] == "mxfp8" and args["fp8-format"] == "e4m3"
    cfg = tomllib.loads(exporters.export(plan, spec, "torchtitan", version="0.2").files["torchtitan.toml"])
    assert cfg["model"]["converters"] == ["quantize.linear.float8"] and cfg["compile"]["enable"] is True
    assert cfg["quantize"]["linear"]["float8"] == {"enable_fsdp_float8_all_gather": True,
                                                   "precompute_float8_dynamic_scale_for_fsdp": True,
                                                   "filter_fqns": ["output"]}
    # torchtitan 0.3: converters live in the model spec, so a generated job module builds it with float8
    files = exporters.export(plan, spec, "torchtitan").files
    launch = " ".join(files["launch.sh"].replace("\\\n", " ").split())
    assert "--module hetplan_torchtitan_job --config hetplan_job" in launch
    assert "Float8LinearConverter.Config(recipe_name='rowwise', filter_fqns=['lm_head'], model_compile_enabled=True)" \
        in files["hetplan_torchtitan_job.py"]
    with pytest.raises(HetplanError, match="no FP8"):
        exporters.export(plan.model_copy(update={"stages": [Stage(num_layers=32, dp=8)]}), spec, "deepspeed")


def test_torchtitan_export_carries_torch_compile():
    """The job's torch_compile is torchtitan's [compile] (blocks and loss compiled), eager exports enable = false."""
    spec = load_model("llama3-8b")
    plan = _plan("llama3-8b", [{"num_layers": 32, "dp": 8}], gbs=64, mbs=1, zero=3, attention="flash")
    cfg = tomllib.loads(exporters.export(plan, spec, "torchtitan", version="0.2").files["torchtitan.toml"])
    assert cfg["compile"] == {"enable": True, "components": ["model", "loss"]}
    eager = plan.model_copy(update={"job": plan.job.model_copy(update={"framework": "fsdp", "torch_compile": False})})
    cfg = tomllib.loads(exporters.export(eager, spec, "torchtitan", version="0.2").files["torchtitan.toml"])
    assert cfg["compile"] == {"enable": False}
    words = exporters.export(plan, spec, "torchtitan").files["launch.sh"].split()
    assert "--compile.enable" in words and words[words.index("--compile.components") + 1] == "model,loss"
    words = exporters.export(eager, spec, "torchtitan").files["launch.sh"].split()
    assert "--compile.no-enable" in words and "--compile.components" not in words


def test_current_scaling_exports_as_tensorwise_and_reads_back():
    """``fp8_recipe = "current"`` is Megatron-Core's ``--fp8-recipe tensorwise`` (TE ``Float8CurrentScaling``,
    ``megatron/core/fp8_utils.py``), with no amax history; ``hetplan import`` reads it back as ``current``."""
    plan = _plan("llama3-8b", [{"num_layers": 32, "tp": 2, "dp": 4}], gbs=64, mbs=1, zero=1, dtype="fp8",
                 attention="flash")
    plan = plan.model_copy(update={"job": plan.job.model_copy(update={"fp8_recipe": "current"})})
    spec = load_model("llama3-8b")
    ex = exporters.export(plan, spec, "megatron")
    args = _megatron(ex, spec)["args"]
    assert args["fp8-recipe"] == "tensorwise" and "fp8-amax-history-len" not in args
    assert importers.import_files(ex.files).job.fp8_recipe == "current"


def test_megatron_writes_tp_overlap_and_cuda_graphs_the_estimate_priced():
    """tp_comm_overlap and cuda_graphs change the estimate (hetplan.estimate.compute); Megatron-LM's export writes
    them (--tp-comm-overlap, --cuda-graph-impl local; both were dropped) and import reads them back. A MoE model
    gets partial graphs (attention, router, preprocessing: dropless experts cannot be captured) with a note;
    torchtitan 0.3 refuses graphs with pipeline parallelism and DeepSpeed any, naming the rule and the source."""
    from hetplan.plan_rules import PlanRuleError, launch_violations
    from hetplan.runtime import importers
    from hetplan.runtime.argspec import megatron_argv, parse_megatron_args

    job = Job(model="llama3-8b", seq_len=4096, global_batch=64, train_iterations=10)
    plan = Plan(job=job, pools=[GPUPool(gpu="H100-SXM", count=16)], mbs=1, zero=1, sequence_parallel=True,
                tp_comm_overlap=True, cuda_graphs=True, stages=[Stage(num_layers=16, tp=4, dp=2)] * 2)
    script = exporters.export(plan, load_model("llama3-8b"), "megatron").files["megatron_launch.sh"]
    assert "--tp-comm-overlap" in script and "--cuda-graph-impl local" in script
    assert "--cuda-graph-modules" not in script  # a dense layer is captured whole
    args = parse_megatron_args(megatron_argv(script))
    assert args["tp_comm_overlap"] and args["cuda_graph_impl"] == "local"
    back = importers.import_files({"run.sh": script})
    assert back.tp_comm_overlap and back.cuda_graphs
    moe_job = Job(model="mixtral-8x7b", seq_len=4096, global_batch=64, train_iterations=10)
    moe = plan.model_copy(update={"job": moe_job, "ep": 2, "tp_comm_overlap": False})
    ex = exporters.export(moe, load_model("mixtral-8x7b"), "megatron")
    assert "--cuda-graph-modules attn moe_router moe_preprocess" in ex.files["megatron_launch.sh"]
    assert any("experts run eagerly" in n for n in ex.notes)
    fsdp = plan.model_copy(update={"job": job.model_copy(update={"framework": "fsdp"}), "zero": 3,
                                   "tp_comm_overlap": False})
    (err,) = launch_violations(fsdp, load_model("llama3-8b"), "torchtitan")
    assert isinstance(err, PlanRuleError) and err.rule == "framework-can-launch" and \
        "no CUDA graphs with pipeline parallelism" in err.message and "disable_cuda_graphs" in err.message
    ds = plan.model_copy(update={"job": job.model_copy(update={"framework": "deepspeed"}), "tp_comm_overlap": False})
    assert any("captures no CUDA graphs" in e.message for e in launch_violations(ds, load_model("llama3-8b"),
                                                                                 "deepspeed"))
