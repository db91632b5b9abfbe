"""Hostile values for the fields and options added after the first fuzz suite (``test_fuzz_cli``): the FP8 /
torch.compile / CE / FSDP / overlap / MoE / CP / EP fields of a job and a plan, uneven pipeline splits, node
presets, the FP8 and attention efficiencies of a user catalog, ``attention_softmax_in_fp32`` of a config, the
``--cp`` / ``--ep`` / ``--energy`` / ``--usd-per-kwh`` / ``--pareto`` flags of ``hetplan plan``, the options of
``estimate`` / ``export`` / ``run`` (its ``--energy-*`` options included), and ``hetplan energy frontier
PLAN.json`` from a plan alone.

The oracle is ``test_fuzz_cli``'s: exit 2 with one message naming the field, or exit 0 with finite, consistent
numbers; here energy and its dollars too (energy >= 0, GPU $ + energy $ = job $; a frontier's times > 0 and
energies >= 0). ``hetplan run`` never starts torchrun here: its supervisor is replaced by one that returns at
once, so a case that passes every check exits 0 without a rank. Same bounds as ``test_fuzz_cli``
(``HETPLAN_FUZZ_EXAMPLES`` derandomized examples per strategy, default 8).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from .test_fuzz_cli import ANYTHING, FLAG_TEXT, FUZZ, NUMBERS, ROOT, check_numbers, check_outcome, timed, to_toml  # noqa: E402

#: Values that are right somewhere and wrong elsewhere: the new enum members, their near misses, booleans as text.
ENUMISH = st.sampled_from(["fp8", "fp4", "bf16", "fp32", "FP8", "eager", "flash", "standard", "fsdp", "megatron",
                           "deepep", "hybridep", "alltoall", "contiguous", "random", "ring", "allgather", "compiled",
                           "fa2", "fa3", "cudnn", "FA2", "last", "all", "layernorm", "moe_act", "expert_fc1", "moe",
                           "true", "false", "yes", "", True, False, 0, 1, 2, 3, -1])
#: Module lists of ``Job.recompute_modules`` / ``offload_modules``: right, repeated, misspelt, of the other list.
MODULES = st.lists(st.sampled_from(["layernorm", "moe_act", "expert_fc1", "moe", "core_attn", "LayerNorm", ""]),
                   max_size=3)
VALUE = st.one_of(ANYTHING, ENUMISH, MODULES)
NEW_JOB_FIELDS = ["dtype", "attention", "framework", "torch_compile", "moe_load_imbalance", "moe_dispatcher",
                  "moe_routing", "moe_recompute", "cp_kv_exchange", "cp_load_balance", "seq_len", "global_batch",
                  "attention_kernel", "async_tp", "recompute_modules", "offload_modules"]
NEW_PLAN_FIELDS = ["tp_comm_overlap", "cuda_graphs", "fsdp_shard", "reshard_after_forward", "grad_reduce_dtype",
                   "fsdp_param_dtype", "cross_entropy", "cp", "ep", "expert_tp", "overlap_grad_reduce", "zero",
                   "sequence_parallel", "schedule", "virtual_stages", "mbs", "pipeline_step_microbatches",
                   "pipeline_outputs"]
NEW_POOL_FIELDS = ["gpu", "node", "attention_efficiency", "gpus_per_node", "count", "kernel_overhead_s"]
NODES = st.sampled_from(["dgx-a100", "dgx-h100", "dgx-h200", "gb200-nvl72", "DGX-H100", "nope", ""])
GPUS = st.sampled_from(["A100-SXM-80GB", "H100-SXM", "V100-SXM-32GB", "cpu", "B200", "nope"])


def _plan(moe: bool) -> dict:
    plan = json.loads((ROOT / "examples" / ("tiny-moe-ep2.json" if moe else "tiny-pp2-dp2.json")).read_text())
    plan["job"]["model"] = str(ROOT / "examples" / ("tiny-moe.json" if moe else "tiny-model.json"))
    plan["pools"][0]["gpu"] = "A100-SXM-80GB"
    return plan


@st.composite
def new_field_plans(draw) -> dict:
    """The tiny dense or MoE plan with one to three new fields set to hostile (or plausible) values."""
    plan = _plan(draw(st.booleans()))
    for _ in range(draw(st.integers(1, 3))):
        where = draw(st.sampled_from(["job", "plan", "pool"]))
        table = {"job": plan["job"], "plan": plan, "pool": plan["pools"][0]}[where]
        key = draw(st.sampled_from({"job": NEW_JOB_FIELDS, "plan": NEW_PLAN_FIELDS, "pool": NEW_POOL_FIELDS}[where]))
        value = draw(NODES if key == "node" else GPUS if key == "gpu" else st.one_of(VALUE, st.tuples(
            NUMBERS, NUMBERS).map(list)) if key == "attention_efficiency" else VALUE)
        table[key] = value
    return plan


@st.composite
def combinations(draw) -> dict:
    """Each field valid on its own, the combination often not: FP8 on an A100 or V100, CP with a sequence it
    does not divide, EP that does not divide the experts, an uneven split that does not sum to the layers,
    torch.compile off outside FSDP, HSDP shards that do not divide DP."""
    moe = draw(st.booleans())
    plan = _plan(moe)
    job = plan["job"]
    job["dtype"] = draw(st.sampled_from(["bf16", "fp16", "fp8"]))
    job["seq_len"] = draw(st.sampled_from([64, 128, 32, 48, 33, 96]))
    job["framework"] = draw(st.sampled_from(["megatron", "deepspeed", "fsdp"]))
    job["attention"] = draw(st.sampled_from(["flash", "standard", "eager"]))
    if draw(st.integers(0, 3)) == 3:
        job["torch_compile"] = draw(st.booleans())
    if draw(st.integers(0, 3)) == 3:
        job["attention_kernel"] = draw(st.sampled_from(["fa2", "fa3", "cudnn"]))
    if draw(st.integers(0, 3)) == 3:
        job["async_tp"] = draw(st.booleans())
    for key, values in (("recompute_modules", ["layernorm", "moe_act"]), ("offload_modules", ["expert_fc1", "moe_act"])):
        if draw(st.integers(0, 3)) == 3:
            job[key] = draw(st.lists(st.sampled_from(values), max_size=2))
    pool = plan["pools"][0]
    pool["gpu"] = draw(st.sampled_from(["A100-SXM-80GB", "H100-SXM", "V100-SXM-32GB", "H200", "L4"]))
    pool["count"] = draw(st.sampled_from([16, 8, 4, 2]))
    pool["gpus_per_node"] = draw(st.sampled_from([8, 4, 2]))
    layers = 2 if moe else 4
    n_stages = draw(st.integers(1, 3))
    cuts = sorted(draw(st.lists(st.integers(1, layers - 1), min_size=n_stages - 1, max_size=n_stages - 1)))
    split = [b - a for a, b in zip([0, *cuts], [*cuts, layers])]  # uneven, summing to the layers
    if draw(st.integers(0, 2)) == 2:  # or not
        split = draw(st.lists(st.integers(0, layers + 1), min_size=n_stages, max_size=n_stages))
    dp = draw(st.sampled_from([1, 2, 4]))
    plan["stages"] = [{"pool": 0, "num_layers": n, "tp": draw(st.sampled_from([1, 2, 3])), "dp": dp}
                      for n in split]
    for key, values in (("cp", [1, 2, 3, 4]), ("ep", [1, 2, 3, 4, 8]), ("expert_tp", [1, 2]),
                        ("fsdp_shard", [1, 2, 3]), ("zero", [0, 1, 2, 3]), ("mbs", [1, 2, 3]),
                        ("virtual_stages", [1, 2, 3]), ("schedule", ["1f1b", "gpipe", "interleaved", "zb-h1"]),
                        ("grad_reduce_dtype", ["fp32", "bf16", "fp16"]), ("fsdp_param_dtype", ["fp32", "bf16"]),
                        ("cross_entropy", ["fp32", "bf16", "compiled"]), ("tp_comm_overlap", [True, False]),
                        ("cuda_graphs", [True, False]), ("reshard_after_forward", [True, False]),
                        ("sequence_parallel", [True, False]), ("pipeline_step_microbatches", [1, 2, 3, 5, 64]),
                        ("pipeline_outputs", ["last", "all"])):
        if draw(st.integers(0, 2)) == 0:
            plan[key] = draw(st.sampled_from(values))
    if moe and draw(st.booleans()):
        job["moe_dispatcher"] = draw(st.sampled_from(["alltoall", "deepep", "hybridep"]))
        job["moe_routing"] = draw(st.sampled_from(["random", "contiguous"]))
    return plan


def check_energy(data: dict, what: str) -> None:
    """``plan --energy [--pareto] --json``: the Pareto lists' plans consistent too; energy finite and > 0, and
    with an electricity price GPU $ + energy $ = job $."""
    fronts = [*data.get("pareto", []), *data.get("energy_pareto", [])]
    check_numbers({"plans": fronts}, what)
    for p in [*data.get("plans", []), *fronts]:
        if "job_energy_kwh" not in p:
            continue
        for key in ("energy_j_per_iteration", "job_energy_kwh", "average_power_w"):
            assert math.isfinite(p[key]) and p[key] > 0, (what, key, p[key])  # GPUs draw power while they run
        if p.get("energy_usd") is not None:
            assert 0 <= p["energy_usd"] < math.inf, (what, p)
            assert p["energy_usd"] + p["gpu_usd"] == pytest.approx(p["job_usd"], rel=1e-6), (what, p)


def check_frontier(out: Path, what: str) -> None:
    """``energy frontier`` exit 0: its summary's times and energies finite and > 0."""
    summary = json.loads((out / "summary.json").read_text())
    assert summary["points"] >= 1 and summary["pareto_points"] >= 1, (what, summary)
    assert 0 < summary["min_time_s"] <= summary["max_time_s"] < math.inf, (what, summary)
    assert 0 < summary["min_energy_j"] < math.inf and summary["idle_power_w"] >= 0, (what, summary)
    for row in json.loads((out / "plans.json").read_text())["plans"]:
        assert row["time_s"] > 0 and 0 < row["energy_j"] < math.inf, (what, row)


# --- the cases ----------------------------------------------------------------------------------------------

@FUZZ
@given(plan=st.one_of(new_field_plans(), combinations()), command=st.sampled_from(["estimate", "export", "frontier"]),
       target=st.sampled_from(["megatron", "deepspeed", "torchtitan"]))
def test_fuzz_new_plan_fields(tmp_path, plan, command, target):
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    args = {"estimate": ["estimate", path, "--json"],
            "export": ["export", path, "--to", target, "--out-dir", tmp_path / "x"],
            "frontier": ["energy", "frontier", path, "-o", tmp_path / "f", "--no-plot", "--no-baselines",
                         "--unit-time-s", "1e-4"]}[command]
    r = timed(*args)
    check_outcome(r, f"{command} {plan}")
    if r.code == 0 and command == "frontier":
        check_frontier(tmp_path / "f", f"frontier {plan}")


@FUZZ
@given(fields=st.lists(st.tuples(st.sampled_from(["job", "inventory", "pin"]), st.data()), min_size=1, max_size=3))
def test_fuzz_new_job_fields(tmp_path, fields):
    data = {"job": {"model": "opt-125m", "seq_len": 2048, "global_batch": 64, "train_tokens": 1e10},
            "inventory": [{"gpu": "A100-SXM-80GB", "count": 8}], "objective": {"goal": "fastest"}, "pin": {}}
    for section, draw in fields:
        table = data["inventory"][0] if section == "inventory" else data[section]
        key = draw.draw(st.sampled_from({"job": NEW_JOB_FIELDS, "inventory": NEW_POOL_FIELDS,
                                         "pin": ["cp", "ep", "tp", "pp", "virtual_stages"]}[section]))
        table[key] = draw.draw(NODES if key == "node" else GPUS if key == "gpu" else VALUE)
    path = tmp_path / "job.toml"
    path.write_text(to_toml(data))
    check_outcome(timed("plan", path, "--json", "--top", "2"), f"job file {data}")


#: Each new flag with values a user would type for it (so that cases get past the parser) and near misses.
PLAN_FLAG_VALUES = {"--dtype": ["fp8", "fp16", "fp4"], "--cp": ["2", "4", "3", "32"], "--ep": ["2", "8", "3", "64"],
                    "--node": ["dgx-a100", "dgx-h100", "gb200-nvl72", "nope"], "--attention": ["eager", "standard"],
                    "--framework": ["fsdp", "deepspeed"], "--price-source": ["spot", "on-demand", "committed"],
                    "--provider": ["aws", "lambda", "nope"], "--search": ["exact", "fast", "nope"],
                    "--usd-per-kwh": ["0.1", "0", "-1", "inf", "1e9"], "--gpu": ["H100-SXM", "V100-SXM-32GB", "L4"],
                    "--seq-len": ["4096", "32768", "2049"], "--model": ["mixtral-8x7b", "llama2-7b"]}
FLAG_VALUES = st.one_of(FLAG_TEXT, ENUMISH.map(str))


@st.composite
def flag_pairs(draw, choices: dict) -> list:
    """One to three ``(flag, value)`` pairs: a value typed for the flag two times in three, else anything."""
    pairs = []
    for _ in range(draw(st.integers(1, 3))):
        flag = draw(st.sampled_from(sorted(choices)))
        typed = draw(st.integers(0, 2)) and choices[flag]
        pairs.append((flag, draw(st.sampled_from(typed) if typed else FLAG_VALUES)))
    return pairs


@FUZZ
@given(flags=flag_pairs(PLAN_FLAG_VALUES), energy=st.booleans(), pareto=st.integers(0, 3))
def test_fuzz_new_plan_flags(tmp_path, flags, energy, pareto):
    args = ["plan", "--model", "opt-125m", "--seq-len", "2048", "--global-batch", "64", "--tokens", "1e10",
            "--gpu", "A100-SXM-80GB", "--gpus", "8"]
    for flag, value in flags:
        args += [flag, value]
    args += ["--energy"] if energy else []
    args += ["--pareto", tmp_path / "p.png"] if pareto == 0 else []
    r = timed(*args, "--json", "--top", "2")
    check_outcome(r, f"flags {flags} energy={energy} pareto={pareto == 0}")
    if r.code == 0 and r.stdout.lstrip().startswith("{"):
        check_energy(json.loads(r.stdout), f"flags {flags}")


RUN_FLAGS = {"--dtype": ["fp8", "bf16", "fp32", "fp16"], "--dp-mode": ["ddp", "fsdp", "zero5"],
             "--schedule": ["1f1b", "gpipe", "interleaved", "zb"], "--timeout": ["600", "0", "-1", "1e12", "inf"],
             "--iterations": ["1", "0", "1000000000"], "--warmup": ["0", "-1"], "--virtual-stages": ["1", "2", "3"],
             "--nnodes": ["1", "2", "0"], "--node-rank": ["0", "1", "5"], "--rdzv-endpoint": ["node0:29500", "x",
                                                                                              ":1", "h:99999"],
             "--max-procs": ["1", "4", "0", "-3"], "--threads": ["1", "0"], "--energy-job": ["j1", "", "a/b"],
             "--energy-target-s": ["0.1", "0", "inf", "nan", "-1"], "--energy-frequencies": ["1410,1200", "0",
                                                                                           "1410,,", "abc"],
             "--energy-plans": ["plans.json"], "--token": ["t", ""]}
SERVERS = st.sampled_from(["http://127.0.0.1:1", "", "not a url", "ftp://127.0.0.1:1", "http://[::1", "http://:0",
                           "http://127.0.0.1:99999"])


@st.composite
def energy_plans_files(draw) -> str:
    """A plans.json of ``energy frontier`` with one hostile field (or garbage)."""
    data = {"num_stages": 2, "num_microbatches": 4, "schedule": "1f1b", "idle_power_w": 80.0,
            "plans": [{"time_s": 0.1, "energy_j": 50.0, "frequencies_mhz": [[1410, 1410], [1410, 1410]]}]}
    where = draw(st.sampled_from(["top", "plan", "garbage"]))
    if where == "garbage":
        return draw(st.sampled_from(["", "[]", "{}", "nan", '{"plans": 3}', "\x00"]))
    table = data if where == "top" else data["plans"][0]
    table[draw(st.sampled_from(sorted(table)))] = draw(VALUE)
    return json.dumps(data)


@FUZZ
@given(flags=flag_pairs(RUN_FLAGS), server=st.one_of(st.none(), SERVERS), plans=energy_plans_files())
def test_fuzz_run_options(tmp_path, monkeypatch, flags, server, plans):
    from hetplan.runtime import energy_loop, launcher

    def no_torchrun(cmd, env, timeout_s, tmp):  # every check passed: stop before a rank starts
        return 0, ""

    def no_server(plan, plan_path, num_stages, num_microbatches, schedule, opts):  # every local check passed
        energy_loop.job_spec(plan, Path(plan_path).read_bytes(), num_stages, num_microbatches, schedule, opts)
        return "job"

    monkeypatch.setattr(launcher, "_supervise", no_torchrun)
    if server == "http://127.0.0.1:1":  # the one reachable-looking address: skip the connection retries
        monkeypatch.setattr(energy_loop, "prepare_job", no_server)
    (tmp_path / "plans.json").write_text(plans)
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(_plan(False)))
    args = ["run", path]
    for flag, value in flags:
        args += [flag, tmp_path / "plans.json" if flag == "--energy-plans" else value]
    args += [] if server is None else ["--energy-server", server]
    check_outcome(timed(*args), f"run {flags} server={server} plans={plans[:200]}")


@FUZZ
@given(key=st.sampled_from(["attention_softmax_in_fp32", "num_local_experts", "num_experts_per_tok",
                            "num_key_value_heads", "head_dim"]), value=VALUE)
def test_fuzz_new_config_keys(tmp_path, key, value):
    cfg = json.loads((ROOT / "examples" / "tiny-moe.json").read_text())
    cfg[key] = value
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    check_outcome(timed("plan", "--model", path, "--seq-len", "64", "--global-batch", "8", "--tokens", "1e7",
                        "--gpu", "A100-SXM-80GB", "--gpus", "4", "--json", "--top", "2"), f"config {key} = {value!r}")


@FUZZ
@given(field=st.sampled_from(["fp8_compute_efficiency", "attention_efficiency", "sm_count", "calibrated",
                              "dense_tflops"]),
       value=st.one_of(VALUE, st.tuples(NUMBERS, NUMBERS).map(list),
                       st.dictionaries(st.sampled_from(["fp8", "bf16"]), NUMBERS, min_size=1, max_size=2)),
       gpu=st.sampled_from(["A100-SXM-80GB", "H100-SXM"]), dtype=st.sampled_from(["bf16", "fp8"]))
def test_fuzz_new_catalog_fields(tmp_path, field, value, gpu, dtype):
    path = tmp_path / "gpus.toml"
    path.write_text(to_toml({"gpus": {gpu: {field: value}}}))
    check_outcome(timed("plan", "--model", "opt-125m", "--seq-len", "2048", "--global-batch", "64", "--tokens",
                        "1e10", "--gpu", gpu, "--gpus", "8", "--dtype", dtype, "--catalog", path, "--json", "--top",
                        "2"), f"catalog {gpu}.{field} = {value!r} ({dtype})")


#: The flags of the commands that read a plan, each with typed values and near misses.
PLAN_COMMAND_FLAGS = {
    "estimate": {"--price-source": ["spot", "on-demand", "nope"], "--provider": ["aws", "nope"],
                 "--timeline": ["t.png", "t.txt"], "--catalog": ["nope.toml"]},
    "export": {"--to": ["megatron", "deepspeed", "torchtitan", "nope"], "--virtual-stages": ["1", "2", "0", "-1"]},
    "frontier": {"-m": ["1", "2", "4", "0", "1000000"], "--idle-power-w": ["80", "0", "-5", "1e6", "nan"],
                 "--straggler-slowdown": ["1.0", "1.5", "0.5", "inf"], "--unit-time-s": ["1e-4", "1e-3", "0", "10"],
                 "--schedule": ["1f1b", "gpipe", "interleaved"], "--virtual-stages": ["1", "2", "0"],
                 "--gpu": ["A100-SXM-80GB", "nope"]},
}


@FUZZ
@given(data=st.data(), command=st.sampled_from(sorted(PLAN_COMMAND_FLAGS)), moe=st.booleans())
def test_fuzz_plan_command_flags(tmp_path, data, command, moe):
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(_plan(moe)))
    flags = data.draw(flag_pairs(PLAN_COMMAND_FLAGS[command]))
    extra = [x for flag, value in flags for x in (flag, tmp_path / value if value.endswith((".png", ".txt", ".toml"))
                                                   else value)]
    args = {"estimate": ["estimate", path, "--json"], "export": ["export", path, "--to", "megatron", "--out-dir", tmp_path / "x"],
            "frontier": ["energy", "frontier", path, "-o", tmp_path / "f", "--no-plot", "--no-baselines"]}[command]
    if command == "frontier" and "--unit-time-s" not in extra:
        args += ["--unit-time-s", "1e-4"]
    r = timed(*args, *extra)
    check_outcome(r, f"{command} {flags} moe={moe}")
    if r.code == 0 and command == "frontier":
        check_frontier(tmp_path / "f", f"frontier {flags}")


#: Flags typed next to ``--attention-kernel`` / ``--async-tp``: the ones they depend on (framework, attention,
#: dtype, GPU) and the degrees async TP acts on.
KERNEL_FLAGS = {"--framework": ["fsdp", "megatron", "deepspeed"], "--attention": ["flash", "standard", "eager"],
                "--dtype": ["bf16", "fp8", "fp16"], "--gpu": ["H100-SXM", "A100-SXM-80GB", "V100-SXM-32GB", "B200"],
                "--tp": ["1", "2", "8"], "--pp": ["1", "2"], "--cp": ["1", "2"], "--zero": ["0", "3"],
                "--model": ["llama2-7b", "mixtral-8x7b"], "--seq-len": ["4096", "2049"]}


@FUZZ
@given(kernel=st.one_of(st.none(), st.sampled_from(["fa2", "fa3", "cudnn", "FA3", "fa4", ""])),
       async_tp=st.booleans(), flags=flag_pairs(KERNEL_FLAGS), job_file=st.booleans())
def test_fuzz_kernel_flags_with_others(tmp_path, kernel, async_tp, flags, job_file):
    """``plan --attention-kernel`` / ``--async-tp`` with the flags they depend on, given as flags or through a job
    file whose ``[job]`` the flags override."""
    args = ["plan", "--tokens", "1e10", "--gpus", "16"]
    if job_file:
        path = tmp_path / "job.toml"
        path.write_text(to_toml({"job": {"model": "opt-125m", "seq_len": 2048, "global_batch": 64},
                                 "inventory": [{"gpu": "H100-SXM", "count": 16}]}))
        args.insert(1, path)
    else:
        args += ["--model", "opt-125m", "--seq-len", "2048", "--global-batch", "64"]
        if "--gpu" not in [f for f, _ in flags]:
            args += ["--gpu", "H100-SXM"]
    args += [] if kernel is None else ["--attention-kernel", kernel]
    args += ["--async-tp"] if async_tp else []
    for flag, value in flags:
        args += [flag, value]
    check_outcome(timed(*args, "--json", "--top", "2"), f"kernel={kernel} async_tp={async_tp} {flags} file={job_file}")


def _pipeline_plan(moe: bool, pp: int, framework: str, global_batch: int, mbs: int) -> dict:
    """The tiny dense (4 layers) or MoE (2 layers, EP 2; EP 1 under DeepSpeed, whose stack runs no EP:
    ``stacks.toml`` parallel) model on ``pp`` stages of DP 2 each."""
    layers = 2 if moe else 4
    plan = {"job": {"model": str(ROOT / "examples" / ("tiny-moe.json" if moe else "tiny-model.json")), "seq_len": 64,
                    "global_batch": global_batch, "train_iterations": 3, "framework": framework},
            "pools": [{"gpu": "A100-SXM-80GB", "count": 2 * pp, "gpus_per_node": 8}],
            "stages": [{"pool": 0, "num_layers": layers // pp, "tp": 1, "dp": 2} for _ in range(pp)], "mbs": mbs}
    if moe and framework != "deepspeed":
        plan["ep"] = 2
    return plan


def _estimate(tmp_path: Path, plan: dict) -> dict:
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    r = timed("estimate", path, "--json")
    check_outcome(r, f"estimate {plan}")
    assert r.code == 0, (plan, r.stderr)
    return json.loads(r.stdout)


@FUZZ
@given(moe=st.booleans(), pp=st.sampled_from([1, 2]), framework=st.sampled_from(["megatron", "fsdp", "deepspeed"]),
       microbatches=st.sampled_from([1, 2, 3, 4, 6, 8]), mbs=st.sampled_from([1, 2]),
       step=st.sampled_from([1, 2, 3, 5, 7, 100]), outputs=st.sampled_from(["last", "all"]))
def test_pipeline_step_microbatches_estimates(tmp_path, moe, pp, framework, microbatches, mbs, step, outputs):
    """``Plan.pipeline_step_microbatches`` that divides the micro-batches, does not, exceeds them, or is 1, on one
    stage or two: refused outside ``framework = "fsdp"``, else always a finite estimate; with one stage, or a step of at least the iteration's micro-batches,
    the same estimate as without it (one call of the schedule); otherwise ``ceil(m / step)`` calls, each with its
    pipeline flush: no faster, and no more memory (fewer micro-batches buffered per call)."""
    plan = _pipeline_plan(moe, pp, framework, 2 * mbs * microbatches, mbs)
    if framework != "fsdp" and outputs != "last":  # PyTorch pipelining's setting: refused, not dropped
        (tmp_path / "plan.json").write_text(json.dumps({**plan, "pipeline_outputs": outputs}))
        r = timed("estimate", tmp_path / "plan.json")
        check_outcome(r, f"outputs {outputs} {framework}")
        assert r.code == 2 and "pipeline_outputs" in r.stderr, r.stderr
    plan["pipeline_outputs"] = outputs if framework == "fsdp" else "last"
    base = _estimate(tmp_path, plan)
    if framework != "fsdp":  # Megatron-LM and DeepSpeed run an iteration in one call: refused, not costed
        (tmp_path / "plan.json").write_text(json.dumps({**plan, "pipeline_step_microbatches": step}))
        r = timed("estimate", tmp_path / "plan.json")
        check_outcome(r, f"step {step} {framework}")
        assert r.code == 2 and "pipeline_step_microbatches" in r.stderr and "framework" in r.stderr, r.stderr
        return
    split = _estimate(tmp_path, {**plan, "pipeline_step_microbatches": step})
    check_numbers(split, f"step {step}")
    assert base["num_microbatches"] == split["num_microbatches"] == microbatches
    if pp == 1 or step >= microbatches:
        assert split["iteration_time_s"] == base["iteration_time_s"], (base, split)
        assert split["memory_bytes_per_gpu"] == base["memory_bytes_per_gpu"]
    else:
        assert split["iteration_time_s"] > base["iteration_time_s"]
        assert split["memory_bytes_per_gpu"]["total"] <= base["memory_bytes_per_gpu"]["total"]
