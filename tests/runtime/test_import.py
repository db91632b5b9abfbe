"""``hetplan import``: a framework's launch read back into a plan. Exports round-trip (property test over plans),
hand-written launches give the plan they run, exports pass the argument parser of the stated release (Megatron-LM's
recorded argument list always; torchtitan 0.3.0's own ``ConfigManager`` when the ``torchtitan`` extra is installed).
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hetplan.errors import HetplanError
from hetplan.model.spec import load_model
from hetplan.plan import GPUPool, Job, Plan, Stage
from hetplan.plan_rules import violations
from hetplan.runtime import exporters, importers
from hetplan.runtime.argspec import megatron_argv, megatron_record, parse_megatron_args

ROOT = Path(__file__).parents[2]


def _key(plan: Plan) -> dict:
    """What an export must carry and an import give back."""
    st0 = plan.stages[0]
    return {"model": load_model(plan.job.model).name, "pp": plan.pp, "layers": [s.num_layers for s in plan.stages],
            "tp": st0.tp, "dp": st0.dp, "cp": plan.cp, "ep": plan.ep, "mbs": plan.mbs,
            "global_batch": plan.job.global_batch, "seq_len": plan.job.seq_len, "virtual_stages": plan.virtual_stages,
            "recompute": st0.recompute, "zero": plan.zero if st0.dp > 1 else 0,  # one replica shards nothing
            "dtype": plan.job.dtype, "gpus": plan.num_gpus}


MODELS = {"megatron": ["llama2-7b", "llama3-8b", "mixtral-8x7b", "qwen3-30b-a3b", "gpt3-1.3b"],
          "torchtitan": ["llama2-7b", "llama3-8b", "mixtral-8x7b", "qwen3-30b-a3b"],
          "deepspeed": ["llama2-7b", "gpt3-1.3b"]}


@st.composite
def plans(draw, target: str) -> Plan:
    """A valid plan ``target`` can run: a model, PP with any split (equal, uneven, Megatron's arbitrary layout),
    TP, DP, EP folded over TP x DP, micro-batch, ZeRO, recomputation."""
    name = draw(st.sampled_from(MODELS[target]))
    spec = load_model(name)
    L = spec.num_layers
    pp = draw(st.sampled_from([1, 2, 4]))
    cuts = sorted(draw(st.lists(st.integers(1, L - 1), min_size=pp - 1, max_size=pp - 1, unique=True)))
    layers = [b - a for a, b in zip([0] + cuts, cuts + [L])]
    tp = 1 if target == "deepspeed" else draw(st.sampled_from([1, 2, 4]))
    dp = draw(st.sampled_from([1, 2, 4]))
    experts = spec.num_experts or 0
    ep = 1
    if experts and target != "deepspeed":
        ep = draw(st.sampled_from([e for e in (1, 2, 4, 8) if experts % e == 0 and (tp * dp) % e == 0]))
    zero = draw(st.sampled_from([0, 1] if target == "deepspeed" and pp > 1 else [0, 1, 2, 3]))
    if target == "torchtitan":  # FSDP2 shards over DP > 1; ZeRO-1 is written as ZeRO-2 (the export's note)
        zero = 3 if ep > 1 else {0: 0, 1: 2, 2: 2, 3: 3}[zero] if dp > 1 else 0
    mbs = draw(st.sampled_from([1, 2]))
    nmb = draw(st.sampled_from([1, 2, 4])) * pp
    rec = draw(st.sampled_from(["none", "full"]))
    job = Job(model=name, seq_len=2048, global_batch=mbs * nmb * dp, train_iterations=10, attention="flash",
              framework={"megatron": "megatron", "torchtitan": "fsdp", "deepspeed": "deepspeed"}[target])
    plan = Plan(job=job, pools=[GPUPool(gpu="H100-SXM", count=pp * tp * dp)], mbs=mbs, zero=zero, ep=ep,
                stages=[Stage(num_layers=n, tp=tp, dp=dp, recompute=rec) for n in layers],
                sequence_parallel=tp > 1)
    if violations(plan, spec):
        from hypothesis import reject
        reject()
    return plan


@pytest.mark.parametrize("target", ["megatron", "torchtitan", "deepspeed"])
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(data=st.data())
def test_export_then_import_gives_the_plan_back(target, data):
    plan = data.draw(plans(target))
    spec = load_model(plan.job.model)
    ex = exporters.export(plan, spec, target)
    back = importers.import_files(ex.files)
    assert _key(back) == _key(plan)
    if target == "megatron":  # every argument is one Megatron-LM 2026-08-22 has, with a value it takes
        parse_megatron_args(megatron_argv(ex.files["megatron_launch.sh"]))


def test_megatron_layout_string_round_trips():
    """DeepSeek-V3's 61 layers at PP 8 x VP 4 as NVIDIA's recipe writes them: the embedding with one layer, 30
    chunks of two, the loss in a chunk of its own (Megatron-LM docs, custom pipeline layout)."""
    chunks = importers.parse_layout("Et|(tt|)*30,L", 8)
    assert [sum(c) for c in chunks] == [7, 8, 8, 8, 8, 8, 8, 6] and chunks[0] == [1, 2, 2, 2]
    assert chunks[7] == [2, 2, 2, 0]
    text = exporters.megatron_layout(chunks)
    assert importers.parse_layout(text, 8) == chunks
    with pytest.raises(HetplanError, match="multiple of pp"):
        importers.parse_layout("Et|tL", 4)


HAND_MEGATRON = """#!/bin/bash
# a user's Llama 3 70B run, written by hand
export CUDA_DEVICE_MAX_CONNECTIONS=1
GPUS_PER_NODE=8
torchrun --nproc_per_node 8 --nnodes 8 --node_rank $NODE_RANK pretrain_gpt.py \\
    --tensor-model-parallel-size 8 --pipeline-model-parallel-size 4 \\
    --num-layers 80 --hidden-size 8192 --ffn-hidden-size 28672 --num-attention-heads 64 \\
    --group-query-attention --num-query-groups 8 --seq-length 4096 --max-position-embeddings 8192 \\
    --micro-batch-size 1 --global-batch-size 512 --train-iters 1000 --bf16 \\
    --use-distributed-optimizer --overlap-grad-reduce --sequence-parallel \\
    --recompute-granularity full --recompute-method uniform --recompute-num-layers 1 \\
    --num-layers-per-virtual-pipeline-stage 5 --swiglu --vocab-size 128256 \\
    --lr 3e-4 --tokenizer-type NullTokenizer  # trailing comment
"""


def test_hand_written_megatron_script():
    plan = importers.import_files({"run.sh": HAND_MEGATRON})
    assert _key(plan) == {"model": "llama3-70b", "pp": 4, "layers": [20] * 4, "tp": 8, "dp": 2, "cp": 1, "ep": 1,
                          "mbs": 1, "global_batch": 512, "seq_len": 4096, "virtual_stages": 4, "recompute": "full",
                          "zero": 1, "dtype": "bf16", "gpus": 64}
    assert plan.num_microbatches(0) == 256 and plan.sequence_parallel
    # a launch of another model family was read as a GPT decoder and priced as one
    for script in ("pretrain_bert.py", "/opt/megatron/pretrain_t5.py", "pretrain_mamba.py"):
        with pytest.raises(HetplanError, match="trains no GPT-style decoder") as err:
            importers.import_files({"run.sh": HAND_MEGATRON.replace("pretrain_gpt.py", script)})
        assert err.value.field == "FILES"


@pytest.mark.parametrize("edit, field, words", [
    # the world size is the launch's own: the degree that does not divide it is at fault, not a --gpus never given
    (("--tensor-model-parallel-size 8", "--tensor-model-parallel-size 3"), "--tensor-model-parallel-size",
     "starts 64 ranks"),
    (("--nnodes 8", "--nnodes 0"), "--nnodes", "starts no rank"),  # was "dp: ... greater than 0"
    # the schema's message once, without pydantic's "Value error, " (was "FILES: ...: FILES: Value error, ...")
    (("--global-batch-size 512", "--global-batch-size 511"), "FILES", "refuses: global_batch 511 is not divisible"),
    # full recomputation without its method / layer count, which Megatron-Core's TransformerConfig refuses: was
    # priced as every layer recomputed, or (block without a count) as none of them
    (("--recompute-method uniform --recompute-num-layers 1", ""), "--recompute-method", "Megatron-Core refuses"),
    (("--recompute-method uniform --recompute-num-layers 1", "--recompute-method block"), "--recompute-num-layers",
     "without --recompute-num-layers"),
])
def test_a_damaged_megatron_launch_names_its_flag(edit, field, words):
    with pytest.raises(HetplanError) as exc:
        importers.import_files({"run.sh": HAND_MEGATRON.replace(*edit)})
    assert exc.value.field == field and words in exc.value.message, exc.value.render()
    assert "Value error" not in exc.value.message and "--gpus" not in exc.value.render()


def test_megatron_parser_refuses_what_the_release_does_not_have():
    with pytest.raises(HetplanError, match="unrecognized arguments: --tensor-parallel-size"):
        parse_megatron_args(["--tensor-parallel-size", "8"])
    with pytest.raises(HetplanError, match="invalid choice"):
        parse_megatron_args(["--moe-token-dispatcher-type", "deepep"])
    assert "d98e8a64" in megatron_record()["source"]


HAND_TOML = """
[model]
name = "llama3"
flavor = "70B"
[training]
local_batch_size = 16
global_batch_size = 256
seq_len = 8192
steps = 100
[parallelism]
data_parallel_shard_degree = 4
tensor_parallel_degree = 8
pipeline_parallel_degree = 2
pipeline_parallel_microbatch_size = 1
module_fqns_per_model_part = [["tok_embeddings", "layers.0", "layers.1"], ["layers.2", "norm", "output"]]
[activation_checkpoint]
mode = "full"
"""


def test_hand_written_torchtitan_toml():
    """torchtitan 0.2's TOML (here with a hand-shortened split that does not cover the model: refused by the plan
    rules on import, as `hetplan import` checks) and a full one."""
    launch = "torchrun --nnodes 8 --nproc-per-node 8 -m torchtitan.train --job.config_file t.toml\n"
    plan = importers.import_files({"t.toml": HAND_TOML, "launch.sh": launch})
    assert violations(plan, load_model("llama3-70b"))[0].rule == "layers-cover-model"
    parts = [["tok_embeddings"] + [f"layers.{i}" for i in range(40)],
             [f"layers.{i}" for i in range(40, 80)] + ["norm", "output"]]
    short = next(line for line in HAND_TOML.splitlines() if line.startswith("module_fqns_per_model_part"))
    text = HAND_TOML.replace(short, f"module_fqns_per_model_part = {parts!r}".replace("'", '"'))
    plan = importers.import_files({"t.toml": text, "launch.sh": launch})
    assert _key(plan) == {"model": "llama3-70b", "pp": 2, "layers": [40, 40], "tp": 8, "dp": 4, "cp": 1, "ep": 1,
                          "mbs": 1, "global_batch": 256, "seq_len": 8192, "virtual_stages": 1, "recompute": "full",
                          "zero": 3, "dtype": "bf16", "gpus": 64}
    assert not violations(plan, load_model("llama3-70b"))


def test_hand_written_deepspeed_launch_needs_its_sequence_length():
    """A user's own DeepSpeed config and launch do not give the sequence length (the training script holds it):
    it was taken as 2048 without a word; now --seq-len gives it, and one that contradicts the launch is refused."""
    cfg = ('{"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4, "bf16": {"enabled": true}, '
           '"zero_optimization": {"stage": 1}}')
    launch = "deepspeed --num_nodes 2 --num_gpus 8 train.py --deepspeed_config ds.json\n"
    files = {"ds.json": cfg, "launch.sh": launch}
    with pytest.raises(HetplanError) as exc:
        importers.import_files(files, model="llama2-7b")
    assert exc.value.field == "--seq-len"
    plan = importers.import_files(files, model="llama2-7b", seq_len=4096)
    assert (plan.job.seq_len, plan.job.global_batch, plan.num_gpus) == (4096, 2 * 4 * 16, 16)
    given_len = {"ds.json": cfg, "launch.sh": launch.replace("ds.json", "ds.json --seq-length 8192")}
    assert importers.import_files(given_len, model="llama2-7b").job.seq_len == 8192
    with pytest.raises(HetplanError, match="contradicts") as bad:
        importers.import_files(given_len, model="llama2-7b", seq_len=4096)
    assert bad.value.field == "--seq-len"


def test_cli_import_estimate(tmp_path):
    script = tmp_path / "run.sh"
    script.write_text(HAND_MEGATRON)
    out = tmp_path / "p.json"
    r = subprocess.run([sys.executable, "-m", "hetplan.cli.main", "import", str(script), "-o", str(out)],
                       capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([sys.executable, "-m", "hetplan.cli.main", "estimate", str(out), "--json"],
                       capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0 and '"iteration_time_s"' in r.stdout, r.stderr
    bad = tmp_path / "bad.sh"
    bad.write_text(HAND_MEGATRON.replace("--tensor-model-parallel-size", "--tensor-parallel-size"))
    r = subprocess.run([sys.executable, "-m", "hetplan.cli.main", "import", str(bad)], capture_output=True, text=True,
                       cwd=ROOT)
    assert r.returncode == 2 and "--tensor-parallel-size" in r.stderr and "Traceback" not in r.stderr


# --- torchtitan 0.3.0's own parser (optional extra: pip install 'hetplan[torchtitan]') --------------------------

def _torchtitan_parse(files: dict[str, str], tmp_path: Path, monkeypatch):
    manager = pytest.importorskip("torchtitan.config.manager")
    float8 = pytest.importorskip("torchtitan.components.quantization.float8")
    # the float8 converters check for an SM89+ GPU when the config is built; the parser check runs on CPU
    monkeypatch.setattr(float8, "has_cuda_capability", lambda *a: True)
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("hetplan_torchtitan_job", None)
    words = shlex.split(files["launch.sh"].replace("\\\n", " "), comments=True)
    return manager.ConfigManager().parse_args(words[words.index("torchtitan.train") + 1:])


@pytest.mark.parametrize("name, gpus, dtype, kw", [
    ("llama3-70b", 64, "bf16", dict(stages=[40, 40], tp=8, dp=4, zero=3)),
    ("deepseek-v3", 1024, "fp8", dict(stages=[61], tp=2, dp=512, zero=3, ep=8)),
    ("mixtral-8x7b", 64, "bf16", dict(stages=[16, 16], tp=1, dp=32, zero=3, ep=8)),
    ("qwen3-235b-a22b", 256, "bf16", dict(stages=[94], tp=1, dp=256, zero=3, ep=4)),
])
def test_torchtitan_0_3_config_manager_accepts_the_export(name, gpus, dtype, kw, tmp_path, monkeypatch):
    job = Job(model=name, seq_len=4096, global_batch=gpus * 2, train_iterations=10, dtype=dtype, framework="fsdp")
    plan = Plan(job=job, pools=[GPUPool(gpu="H100-SXM", count=gpus)], mbs=1, zero=kw["zero"], ep=kw.get("ep", 1),
                stages=[Stage(num_layers=n, tp=kw["tp"], dp=kw["dp"], recompute="full") for n in kw["stages"]],
                sequence_parallel=kw["tp"] > 1)
    ex = exporters.export(plan, load_model(name), "torchtitan")
    cfg = _torchtitan_parse(ex.files, tmp_path, monkeypatch)
    par = cfg.parallelism
    assert (par.tensor_parallel_degree, par.data_parallel_shard_degree, par.expert_parallel_degree,
            par.pipeline_parallel_degree) == (kw["tp"], kw["dp"], kw.get("ep", 1), len(kw["stages"]))
    assert cfg.training.global_batch_size == gpus * 2 and cfg.training.seq_len == 4096
    assert type(cfg.activation_checkpoint).__qualname__.startswith("FullAC")


def test_torchtitan_0_3_config_manager_accepts_uneven_interleaved_chunks(tmp_path, monkeypatch):
    """Mixtral 8x7B on 64 H100 under --framework fsdp: the best interleaved plan on 2 stages with 3 uneven chunks
    each (16 layers in 6, 5, 5) is exported as torchtitan model parts; 0.3.0's parser takes them with the
    interleaved schedule, and import gives the chunks back."""
    from hetplan.plan import Inventory
    from hetplan.search.planner import search_plans
    from hetplan.search.space import Pins

    job = Job(model="mixtral-8x7b", seq_len=4096, global_batch=512, train_iterations=10, framework="fsdp")
    res = search_plans(job, Inventory(pools=[GPUPool(gpu="H100-SXM", count=64)]), top_k=1, heterogeneous=False,
                       pins=Pins(pp=2, virtual_stages=3))
    plan = res.plans[0].plan
    assert plan.pipeline_chunks is not None and sorted(plan.pipeline_chunks[0]) == [5, 5, 6]
    ex = exporters.export(plan, load_model("mixtral-8x7b"), "torchtitan")
    assert importers.import_files(ex.files).pipeline_chunks == plan.pipeline_chunks
    par = _torchtitan_parse(ex.files, tmp_path, monkeypatch).parallelism
    assert par.pipeline_parallel_schedule == "Interleaved1F1B" and len(par.module_fqns_per_model_part) == 6
    layers = [sum(f.startswith("layers.") for f in part) for part in par.module_fqns_per_model_part]
    assert layers == [plan.pipeline_chunks[k % 2][k // 2] for k in range(6)]


# --- every searched best plan launches on the framework it was planned for -----------------------------------

def _preset_gpus(name: str) -> int:
    """H100s for a preset's property case: 8 below 15 B parameters, 64 below 150 B, else 512 (what fits)."""
    from hetplan.model import counts

    n = counts.total_parameters(load_model(name))
    return 8 if n < 15e9 else 64 if n < 150e9 else 512


#: torchtitan builds Llama-shaped models and the models it ships (hetplan.runtime.exporters.torchtitan): the other
#: presets' fsdp plans are refused for the model, naming --to, never for the plan.
TORCHTITAN_MODEL_REFUSAL = ("trains Llama-shaped models", "runs the models it ships")


def test_every_presets_searched_best_plan_exports_to_its_framework():
    """Every model preset at a GPU count it fits: the search's best plan under --framework megatron exports to
    Megatron-LM (passes the release's argument list) and under --framework fsdp to torchtitan 0.3 (or is refused
    for a model torchtitan does not build), and both read back as the plan — uneven interleaved chunks, EP
    folding and expert-TP included."""
    from hetplan.model.spec import list_presets
    from hetplan.plan import Inventory
    from hetplan.search.planner import search_plans

    refused, alibi_refused, post_refused = set(), set(), set()
    for name in list_presets():
        spec, gpus = load_model(name), _preset_gpus(name)
        for framework, target in (("megatron", "megatron"), ("fsdp", "torchtitan")):
            job = Job(model=name, seq_len=min(4096, spec.max_seq_len), global_batch=gpus * 2, train_iterations=100,
                      framework=framework)
            best = search_plans(job, Inventory(pools=[GPUPool(gpu="H100-SXM", count=gpus)]), top_k=1,
                                heterogeneous=False).plans[0].plan
            try:
                ex = exporters.export(best, spec, target)
            except HetplanError as e:
                alibi = target == "megatron" and spec.alibi and "ALiBi" in e.message  # BLOOM: no ALiBi in Megatron-LM
                # Gemma: no norm after attention / the MLP in Megatron-LM's TransformerLayer
                post = target == "megatron" and spec.post_norms and "post-MLP norms" in e.message
                post_refused |= {name} if post else set()
                assert e.field == "--to" and (alibi or post or target == "torchtitan" and any(
                    w in e.message for w in TORCHTITAN_MODEL_REFUSAL)), (name, framework, e)
                refused.add(name)
                alibi_refused |= {name} if alibi else set()
                continue
            if target == "megatron":
                parse_megatron_args(megatron_argv(ex.files["megatron_launch.sh"]))
            back = importers.import_files(ex.files)
            assert _key(back) == _key(best), (name, framework)
            assert (back.pipeline_chunks, back.expert_tp) == (best.pipeline_chunks, best.expert_tp), (name, framework)
    assert not refused & set(exporters.TORCHTITAN_03_MODELS)  # the models torchtitan ships all export
    assert alibi_refused == {n for n in list_presets() if load_model(n).alibi} == {"bloom-176b"}
    assert post_refused == {n for n in list_presets() if load_model(n).post_norms} == {n for n in list_presets()
                                                                                         if n.startswith("gemma")}


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(name=st.sampled_from(["qwen3-30b-a3b", "mixtral-8x7b", "gpt-oss-120b", "llama3-8b", "llama3-70b",
                             "llama2-13b", "mistral-7b", "llama4-scout"]),
       gpus=st.sampled_from([16, 24, 32, 48, 128, 256]), framework=st.sampled_from(["megatron", "fsdp"]))
def test_searched_best_plan_exports_at_any_gpu_count(name, gpus, framework):
    """The same as the every-preset test at other GPU counts (24 and 48: not powers of two): the best plan
    exports to its framework and reads back."""
    from hypothesis import assume

    from hetplan.errors import InfeasibleError
    from hetplan.plan import Inventory
    from hetplan.search.planner import search_plans

    spec = load_model(name)
    job = Job(model=name, seq_len=4096, global_batch=gpus * 4, train_iterations=100, framework=framework)
    try:
        best = search_plans(job, Inventory(pools=[GPUPool(gpu="H100-SXM", count=gpus)]), top_k=1,
                            heterogeneous=False).plans[0].plan
    except InfeasibleError:
        assume(False)
        raise
    target = "megatron" if framework == "megatron" else "torchtitan"
    try:
        ex = exporters.export(best, spec, target)
    except HetplanError as e:  # only a model torchtitan does not build (llama4-scout)
        assert target == "torchtitan" and any(w in e.message for w in TORCHTITAN_MODEL_REFUSAL), e
        return
    if target == "megatron":
        parse_megatron_args(megatron_argv(ex.files["megatron_launch.sh"]))
    back = importers.import_files(ex.files)
    assert _key(back) == _key(best) and back.pipeline_chunks == best.pipeline_chunks


def test_plan_baseline_compares_the_users_run(tmp_path):
    """`plan --baseline`: the search's own best as baseline is 1.00x at 100 % of the cost; the same run with full
    recomputation (a user's launch read back by import) is slower, so the best plan is faster than it."""
    import json

    def run(*args):
        r = subprocess.run([sys.executable, "-m", "hetplan.cli.main", *map(str, args)], capture_output=True,
                           text=True, cwd=ROOT)
        assert r.returncode == 0, r.stderr
        return r.stdout

    job = ["plan", "--model", "llama3-8b", "--gpu", "H100-SXM", "--gpus", "8", "--seq-len", "4096",
           "--global-batch", "64", "--tokens", "1e9", "--no-hetero"]
    best = tmp_path / "best.json"
    run(*job, "-q", "-o", best)
    out = json.loads(run(*job, "--json", "--top", "1", "--baseline", best))["baseline"]
    assert out["speedup"] == pytest.approx(1.0) and out["usd_ratio"] == pytest.approx(1.0)
    ex = exporters.export(Plan.model_validate_json(best.read_text()), load_model("llama3-8b"), "megatron")
    script = tmp_path / "run.sh"
    script.write_text(ex.files["megatron_launch.sh"].replace("--hidden-size", "--recompute-granularity full "
                                                             "--recompute-method uniform --recompute-num-layers 1 --hidden-size"))
    user = tmp_path / "user.json"
    run("import", script, "-o", user)
    out = json.loads(run(*job, "--json", "--top", "1", "--baseline", user))["baseline"]
    assert out["speedup"] > 1.05 and out["usd_ratio"] < 1


# --- DeepSpeed 0.19's own config class (optional extra: pip install 'hetplan[deepspeed]') -----------------------

_DS_CHECK = """
import json, sys
import deepspeed
deepspeed.init_distributed(dist_backend="gloo")
from deepspeed.runtime.config import DeepSpeedConfig
class MPU:  # the data-parallel world the launch gives DeepSpeed
    def __init__(self, dp): self.dp = dp
    def get_data_parallel_world_size(self): return self.dp
cfg, dp = json.loads(sys.argv[1]), int(sys.argv[2])
c = DeepSpeedConfig(cfg, mpu=MPU(dp))
print(json.dumps([c.train_batch_size, c.train_micro_batch_size_per_gpu, c.gradient_accumulation_steps,
                  c.zero_optimization_stage]))
"""


def test_deepspeed_0_19_config_class_accepts_the_export(tmp_path):
    """DeepSpeed's DeepSpeedConfig (0.19.8) parses the exported ds_config.json and checks train_batch_size =
    micro-batch x accumulation x DP (in a subprocess: DeepSpeed initialises a one-rank gloo group)."""
    import importlib.util
    import json
    import os

    if importlib.util.find_spec("deepspeed") is None:
        pytest.skip("DeepSpeed not installed (pip install 'hetplan[deepspeed]')")
    job = Job(model="llama2-7b", seq_len=4096, global_batch=64, train_iterations=10)
    plan = Plan(job=job, pools=[GPUPool(gpu="H100-SXM", count=16)], mbs=2, zero=1,
                stages=[Stage(num_layers=17, dp=8, recompute="full"), Stage(num_layers=15, dp=8, recompute="full")])
    cfg = exporters.export(plan, load_model("llama2-7b"), "deepspeed").files["ds_config.json"]
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29617", "RANK": "0", "WORLD_SIZE": "1",
           "LOCAL_RANK": "0"}
    r = subprocess.run([sys.executable, "-c", _DS_CHECK, cfg, "8"], capture_output=True, text=True, env=env,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout.strip().splitlines()[-1]) == [64, 2, 4, 1]
    r = subprocess.run([sys.executable, "-c", _DS_CHECK, cfg, "4"], capture_output=True, text=True, env=env,
                       timeout=600)
    assert r.returncode != 0 and "train_batch_size is not equal" in r.stderr


@settings(max_examples=60, deadline=None)
@given(target=st.sampled_from(["megatron", "torchtitan", "deepspeed"]), data=st.data())
def test_import_of_a_damaged_launch_says_what_is_wrong(target, data):
    """A launch with one word replaced (a number by text, zero or a negative, an option dropped) is read back or
    refused with a HetplanError naming the field — never another exception (the CLI turns that into exit 2)."""
    job = Job(model="llama2-7b", seq_len=2048, global_batch=64, train_iterations=10, attention="flash",
              framework="fsdp" if target == "torchtitan" else target)
    plan = Plan(job=job, pools=[GPUPool(gpu="H100-SXM", count=16)], mbs=2, zero=1 if target != "torchtitan" else 3,
                stages=[Stage(num_layers=17, dp=8), Stage(num_layers=15, dp=8)])
    files = dict(exporters.export(plan, load_model("llama2-7b"), target).files)
    name = data.draw(st.sampled_from(sorted(files)))
    words = files[name].split(" ")
    i = data.draw(st.integers(0, len(words) - 1))
    words[i] = data.draw(st.sampled_from(["", "x", "0", "-3", "1e9", "--bogus", "'", "{", "[]"]))
    files[name] = " ".join(words)
    try:
        importers.import_files(files)
    except HetplanError as e:
        assert e.field and e.fix


@pytest.mark.parametrize("example", ["llama2-7b-mixed-cloud", "espresso_open_llama_3b", "gpt3-175b-a100"])
def test_readme_examples_export_and_import_back(example, tmp_path, monkeypatch):
    """The README's examples: `hetplan plan EXAMPLE -o plan.json`, then every export target that launches the plan
    (the others refuse naming the field, e.g. torchtitan's fp16 or a non-Llama model), then `hetplan import` of the
    files: the same plan comes back (a model given as a config.json path included: DeepSpeed's
    pipeline_module.json names it as the plan does)."""
    from tests.fuzz.inproc import run_cli

    monkeypatch.chdir(tmp_path)
    assert run_cli("plan", ROOT / "examples" / f"{example}.toml", "-q", "-o", "plan.json").code == 0
    plan = Plan.model_validate_json((tmp_path / "plan.json").read_text())
    back_ok = 0
    for target in ("megatron", "torchtitan", "deepspeed"):
        r = run_cli("export", "plan.json", "--to", target, "--out-dir", target)
        if r.code != 0:
            assert r.code == 2 and not r.traceback and "fix" in r.stderr, r.stderr
            continue
        files = sorted(str(p) for p in (tmp_path / target).iterdir())
        r = run_cli("import", *files, "-o", f"{target}.json")
        assert r.code == 0 and not r.traceback, r.stderr
        back = Plan.model_validate_json((tmp_path / f"{target}.json").read_text())
        # another framework's target runs the ZeRO mode it has (torchtitan runs ZeRO-1 as ZeRO-2, frameworks.toml)
        own = {"megatron": "megatron", "fsdp": "torchtitan", "deepspeed": "deepspeed"}[plan.job.framework]
        skip = {"gpus"} | (set() if target == own else {"zero"})
        assert {k: v for k, v in _key(back).items() if k not in skip} == \
            {k: v for k, v in _key(plan).items() if k not in skip}, target
        assert back.num_gpus == plan.num_gpus
        back_ok += 1
    assert back_ok >= 1  # Megatron-LM launches each of them


def test_an_exported_launch_carries_its_gpu_type_back(tmp_path):
    """`hetplan import` of an export priced the A100 plan as H100-SXM (its default) without a word: the export now
    names the GPU in a `# hetplan gpu:` line that import reads; a launch without one says which GPU it assumed."""
    from tests.fuzz.inproc import run_cli

    plan = tmp_path / "a.json"
    assert run_cli("plan", "--model", "llama2-7b", "--gpu", "A100-SXM-80GB", "--gpus", "16", "--seq-len", "4096",
                   "--global-batch", "64", "-q", "-o", plan).code == 0
    for to in ("megatron", "deepspeed", "torchtitan"):
        out = tmp_path / to
        assert run_cli("export", plan, "--to", to, "--out-dir", out).code == 0
        back = tmp_path / f"{to}.json"
        assert run_cli("import", *sorted(out.iterdir()), "-o", back).code == 0
        assert json.loads(back.read_text())["pools"][0]["gpu"] == "A100-SXM-80GB", to
    launch = (tmp_path / "megatron" / "megatron_launch.sh").read_text()
    bare = tmp_path / "bare.sh"
    bare.write_text("\n".join(x for x in launch.splitlines() if not x.startswith("# hetplan gpu:")))
    r = run_cli("import", bare, "-o", tmp_path / "bare.json")
    assert r.code == 0 and "priced as H100-SXM" in r.stderr
    assert json.loads((tmp_path / "bare.json").read_text())["pools"][0]["gpu"] == "H100-SXM"


@pytest.mark.parametrize("edit, field, words", [
    # degrees whose product is not the world size: torchtitan's ParallelDims asserts; was read as a 4-GPU plan
    (("--parallelism.data_parallel_shard_degree 4", "--parallelism.data_parallel_shard_degree 2"),
     "--parallelism.data_parallel_shard_degree", "is not the launch's 8 ranks"),
    # a schedule hetplan does not price: was read as 1F1B
    (("--parallelism.pipeline_parallel_schedule 1F1B", "--parallelism.pipeline_parallel_schedule ZBVZeroBubble"),
     "--parallelism.pipeline_parallel_schedule", "hetplan prices 1F1B"),
    # without the flag torchtitan 0.3.0 captures CUDA graphs (its default); was refused naming plan.cuda_graphs
    (("--training.disable_cuda_graphs", ""), "--training.disable_cuda_graphs", "CUDA graphs"),
])
def test_a_hand_edited_torchtitan_launch_names_its_flag(edit, field, words):
    job = Job(model="llama3-8b", seq_len=2048, global_batch=32, train_iterations=10, framework="fsdp")
    plan = Plan(job=job, pools=[GPUPool(gpu="H100-SXM", count=8)], mbs=1, zero=3,
                stages=[Stage(num_layers=16, dp=4)] * 2)
    files = dict(exporters.export(plan, load_model("llama3-8b"), "torchtitan").files)
    assert edit[0] in files["launch.sh"]
    files["launch.sh"] = files["launch.sh"].replace(*edit)
    with pytest.raises(HetplanError) as exc:
        importers.import_files(files)
    assert exc.value.field == field and words in exc.value.message, exc.value.render()


def test_megatron_launch_without_expert_tp_runs_the_tp_degree():
    """Megatron-LM sets ``--expert-tensor-parallel-size`` to the TP degree when the launch gives none
    (``megatron/training/arguments.py`` validate_args): a MoE launch without it is read as expert-TP = TP, with it
    as given; a dense model keeps expert-TP 1."""
    import re

    job = Job(model="mixtral-8x7b", seq_len=4096, global_batch=64, attention="flash")
    pool = GPUPool(gpu="H100-SXM", count=16, gpus_per_node=8)
    plan = Plan(job=job, pools=[pool], stages=[Stage(num_layers=32, tp=2, dp=8, recompute="full")], mbs=1, zero=1,
                sequence_parallel=True, ep=8, expert_tp=2)
    script = exporters.export(plan, load_model("mixtral-8x7b"), "megatron").files["megatron_launch.sh"]
    assert "--expert-tensor-parallel-size 2" in script
    assert importers.import_files({"run.sh": script}).expert_tp == 2
    bare = re.sub(r"--expert-tensor-parallel-size \d+", "", script)
    assert importers.import_files({"run.sh": bare}).expert_tp == 2
    assert importers.import_files({"run.sh": bare.replace("--expert-model-parallel-size 8",
                                                          "--expert-model-parallel-size 4")}).expert_tp == 2
    assert importers.import_files({"run.sh": HAND_MEGATRON}).expert_tp == 1


@pytest.mark.parametrize("flag, value", [("--micro-batch-size", "0"), ("--seq-length", "-5"),
                                         ("--global-batch-size", "0")])
def test_a_launch_value_the_plan_refuses_is_named_as_the_launch_spells_it(flag, value):
    """A value the plan schema refuses is named by the launch's own flag (it was the plan's ``mbs``, ``seq_len``
    and ``global_batch``, names the launch never wrote)."""
    import re

    job = Job(model="llama3-8b", seq_len=4096, global_batch=64, attention="flash")
    plan = Plan(job=job, pools=[GPUPool(gpu="H100-SXM", count=16, gpus_per_node=8)],
                stages=[Stage(num_layers=32, tp=2, dp=8)], mbs=1, zero=1, sequence_parallel=True)
    script = exporters.export(plan, load_model("llama3-8b"), "megatron").files["megatron_launch.sh"]
    with pytest.raises(HetplanError) as err:
        importers.import_files({"run.sh": re.sub(rf"{flag} \d+", f"{flag} {value}", script)})
    assert err.value.field == flag
