"""One test per problem the fuzz strategies of ``test_fuzz_options`` found in the fields and options added after
the first fuzz suite, named after it: each ended in a traceback (or read a wrong value) and now exits 2 with one
message naming the field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .inproc import run_cli
from .test_issue17_cases import refused

ROOT = Path(__file__).resolve().parents[2]


def _plan(tmp_path: Path, **fields) -> Path:
    plan = json.loads((ROOT / "examples" / "tiny-pp2-dp2.json").read_text())
    plan["job"]["model"] = str(ROOT / "examples" / "tiny-model.json")
    plan["pools"][0]["gpu"] = "A100-SXM-80GB"
    plan.update(fields)
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    return path


def _moe_plan(tmp_path: Path, **fields) -> Path:
    """:func:`_plan` on the tiny MoE model (2 layers: one per stage); an expert degree needs experts (rule
    ``ep-needs-experts``)."""
    path = _plan(tmp_path, **fields)
    plan = json.loads(path.read_text())
    plan["job"]["model"] = str(ROOT / "examples" / "tiny-moe.json")
    for st in plan["stages"]:
        st["num_layers"] = 1
    path.write_text(json.dumps(plan))
    return path


def test_expert_tp_not_dividing_the_ranks_exits_2_not_a_layout_traceback(tmp_path):
    # expert_tp 2 on stages of 2 ranks each is fine; expert_tp 4 cannot re-partition 2 ranks
    assert run_cli("estimate", _moe_plan(tmp_path, expert_tp=2), "--json").code == 0
    refused(run_cli("estimate", _moe_plan(tmp_path, expert_tp=4)), "stages[0]", "expert_tp", "must divide")
    refused(run_cli("estimate", _plan(tmp_path, expert_tp=4)), "stages[0]", "expert_tp", "must divide")


@pytest.fixture
def no_torchrun(monkeypatch):
    """``hetplan run`` stops where torchrun would start (exit 0, no rank)."""
    from hetplan.runtime import launcher

    monkeypatch.setattr(launcher, "_supervise", lambda cmd, env, timeout_s, tmp: (0, ""))


@pytest.mark.parametrize("idle", ['"idle_power_w": "abc",', "", '"idle_power_w": NaN,', '"idle_power_w": -1,'])
def test_energy_plans_file_without_a_valid_idle_power_exits_2(tmp_path, no_torchrun, idle):
    plans = tmp_path / "plans.json"
    plans.write_text('{"num_stages": 2, "num_microbatches": 2, "schedule": "1f1b", ' + idle +
                     ' "plans": [{"time_s": 0.1, "energy_j": 5, "frequencies_mhz": [[1410], [1410]]}]}')
    refused(run_cli("run", _plan(tmp_path), "--energy-server", "http://127.0.0.1:1", "--energy-plans", plans),
            "--energy-plans", "not a plans file")


@pytest.mark.parametrize("value", ["inf", "0"])
def test_energy_target_s_inf_or_zero_refused_before_the_server(tmp_path, no_torchrun, value):
    refused(run_cli("run", _plan(tmp_path), "--energy-server", "http://127.0.0.1:1", "--energy-target-s", value),
            "--energy-target-s")


@pytest.mark.parametrize("url", ["http://[::1", "ftp://127.0.0.1:1", "not a url", "http://:0"])
def test_energy_server_that_is_no_http_url_refused(tmp_path, no_torchrun, url):
    refused(run_cli("run", _plan(tmp_path), "--energy-server", url), "--energy-server")


@pytest.mark.parametrize("url", ["", "  "])
def test_empty_energy_server_is_refused_not_taken_as_no_server(tmp_path, no_torchrun, url):
    refused(run_cli("run", _plan(tmp_path), "--energy-server", url), "--energy-server")


def test_attention_softmax_in_fp32_as_a_string_refused_not_read_as_true(tmp_path):
    cfg = json.loads((ROOT / "examples" / "tiny-model.json").read_text())
    cfg["attention_softmax_in_fp32"] = "false"  # bool("false") is True: the softmax would be costed in fp32
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    refused(run_cli("plan", "--model", path, "--seq-len", "128", "--global-batch", "8", "--tokens", "1e8", "--gpu",
                    "A100-SXM-80GB", "--gpus", "4"), "attention_softmax_in_fp32", "true or false")


WORKLOAD = """[cluster]
gpu = "A100-SXM-80GB"
dtype = "fp16"
memory_bytes = 14_000_000_000
[workload]
duration_s = 5
{line}
[[models]]
name = "opt1-a"
model = "opt-1.3b"
"""


def test_max_new_tokens_beyond_the_kv_cache_slot_refused_not_a_minutes_long_simulation(tmp_path):
    # fuzz (200 examples): max_new_tokens = 802,001 simulated for minutes; a slot holds kv_cache_len = 256 tokens
    (tmp_path / "w.toml").write_text(WORKLOAD.format(line="max_new_tokens = 802001"))
    refused(run_cli("simulate", tmp_path / "w.toml", "--json"), "kv_cache_len", "802,065")
    (tmp_path / "w.toml").write_text(WORKLOAD.format(line="max_new_tokens = 192"))  # 64 + 192 = 256 fits
    assert run_cli("simulate", tmp_path / "w.toml", "--json").code == 0


def test_trace_request_beyond_the_kv_cache_slot_refused(tmp_path):
    (tmp_path / "trace.csv").write_text("arrival_s,model,prompt_len,max_new_tokens\n0.0,opt1-a,64,4\n"
                                        "0.1,opt1-a,32,900000\n")
    (tmp_path / "w.toml").write_text(WORKLOAD.format(line='trace = "trace.csv"'))
    refused(run_cli("simulate", tmp_path / "w.toml", "--json"), "scheduler.kv_cache_len", "request 1", "900,032")


def test_num_experts_1e15_refused_not_a_minutes_long_ep_divisor_search(tmp_path):
    cfg = json.loads((ROOT / "examples" / "tiny-moe.json").read_text())
    cfg["num_local_experts"] = 10**15
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    refused(run_cli("plan", "--model", path, "--seq-len", "64", "--global-batch", "8", "--tokens", "1e7", "--gpu",
                    "A100-SXM-80GB", "--gpus", "4"), "model.num_local_experts", "1048576")


def test_frontier_of_1000_micro_batches_no_recursion_error(tmp_path):
    # the exact Python max flow walked augmenting paths recursively: 1,000 micro-batches on one stage exceeded
    # Python's recursion limit (RecursionError traceback)
    plan = json.loads((ROOT / "examples" / "tiny-moe-ep2.json").read_text())
    plan["job"]["model"] = str(ROOT / "examples" / "tiny-moe.json")
    plan["pools"][0]["gpu"] = "A100-SXM-80GB"
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    r = run_cli("energy", "frontier", tmp_path / "plan.json", "-o", tmp_path / "f", "-m", "1000", "--no-plot",
                "--no-baselines", "--unit-time-s", "1e-4")
    assert r.code == 0 and not r.traceback, (r.stderr, r.traceback[-2000:])
    summary = json.loads((tmp_path / "f" / "summary.json").read_text())
    assert summary["num_microbatches"] == 1000 and 0 < summary["min_time_s"] and summary["min_energy_j"] > 0
    refused(run_cli("energy", "frontier", tmp_path / "plan.json", "-o", tmp_path / "g", "-m", "1000000"),
            "--num-microbatches", "65,536")


def test_python_max_flow_on_a_path_longer_than_the_recursion_limit():
    import numpy as np

    from hetplan.energy.maxflow import min_cut_source_side

    n = 5000  # a chain 0 -> 1 -> ... -> n-1 with one narrowest edge: flow = its capacity, cut right before it
    rows, cols = np.arange(n - 1), np.arange(1, n)
    caps = np.full(n - 1, 10, np.int64)
    caps[3000] = 3
    flow, side = min_cut_source_side(n, rows, cols, caps, 0, n - 1, backend="python")
    assert flow == 3 and side[:3001].all() and not side[3001:].any()


FLAGS = ["--model", "opt-125m", "--seq-len", "2048", "--global-batch", "64", "--tokens", "1e10", "--gpu",
         "A100-SXM-80GB", "--gpus", "8"]


@pytest.mark.parametrize("name,needle", [("t.txt", "unknown image format '.txt'"),
                                         ("missing/t.png", "does not exist")])
def test_timeline_to_a_non_image_or_missing_folder_refused_not_a_matplotlib_traceback(tmp_path, name, needle):
    refused(run_cli("estimate", _plan(tmp_path), "--timeline", tmp_path / name), "--timeline", needle)


@pytest.mark.parametrize("name,needle", [("p.txt", "unknown image format"), ("missing/p.png", "does not exist")])
def test_pareto_to_a_non_image_or_missing_folder_refused_before_the_search(tmp_path, name, needle):
    refused(run_cli("plan", *FLAGS, "--pareto", tmp_path / name), "--pareto", needle)


def test_plan_output_that_is_a_folder_refused(tmp_path):
    refused(run_cli("plan", *FLAGS, "-o", tmp_path), "--output", "it is a folder")


def _with_job(tmp_path: Path, job: dict, **fields) -> Path:
    path = _plan(tmp_path, **fields)
    plan = json.loads(path.read_text())
    plan["job"].update(job)
    path.write_text(json.dumps(plan))
    return path


@pytest.mark.parametrize("target", ["deepspeed", "torchtitan"])
def test_megatron_module_options_refused_by_other_exports_not_dropped(tmp_path, target):
    # the export wrote a DeepSpeed / torchtitan config without them: a run with more activation memory than the
    # estimate (exit 0, silently wrong); Megatron-LM takes them as --recompute-modules / --offload-modules
    path = _with_job(tmp_path, {"recompute_modules": ["layernorm"]})
    refused(run_cli("export", path, "--to", target, "--out-dir", tmp_path / "x"), "plan.job.recompute_modules",
            "export --to megatron")
    assert run_cli("export", path, "--to", "megatron", "--out-dir", tmp_path / "m").code == 0
    assert "--recompute-modules layernorm" in (tmp_path / "m" / "megatron_launch.sh").read_text()
    moe = json.loads((ROOT / "examples" / "tiny-moe-ep2.json").read_text())  # EP 1: DeepSpeed has no EP
    moe["job"].update(model=str(ROOT / "examples" / "tiny-moe.json"), offload_modules=["moe_act"])
    moe.update(ep=1, pools=[{"gpu": "A100-SXM-80GB", "count": 2, "gpus_per_node": 2}])
    (tmp_path / "moe.json").write_text(json.dumps(moe))
    refused(run_cli("export", tmp_path / "moe.json", "--to", "deepspeed", "--out-dir", tmp_path / "d"),
            "plan.job.offload_modules", "export --to megatron")
    assert run_cli("export", tmp_path / "moe.json", "--to", "megatron", "--out-dir", tmp_path / "n").code == 0
    assert "--offload-modules moe_act" in (tmp_path / "n" / "megatron_launch.sh").read_text()


@pytest.mark.parametrize("target", ["megatron", "deepspeed", "torchtitan"])
def test_several_pipeline_calls_per_iteration_refused_by_every_export(tmp_path, target):
    # 2 micro-batches per iteration (global batch 8 / dp 2 / mbs 2) in calls of 1: NeMo AutoModel's split, which
    # the exports (one call of the schedule per iteration) dropped, running faster than the estimate
    path = _with_job(tmp_path, {"framework": "fsdp"}, pipeline_step_microbatches=1)
    refused(run_cli("export", path, "--to", target, "--out-dir", tmp_path / "x"), "plan.pipeline_step_microbatches",
            "2 calls")
    # a step of at least the iteration's micro-batches is one call: exported
    path = _with_job(tmp_path, {"framework": "fsdp"}, pipeline_step_microbatches=2)
    assert run_cli("export", path, "--to", target, "--out-dir", tmp_path / "y").code == 0


def _frontier(tmp_path: Path, plan: Path, *flags) -> tuple:
    out = tmp_path / f"f{len(list(tmp_path.iterdir()))}"
    r = run_cli("energy", "frontier", plan, "-o", out, "--no-plot", "--no-baselines", "--unit-time-s", "1e-4", *flags)
    return r, (json.loads((out / "summary.json").read_text()) if r.code == 0 else None)


def test_frontier_virtual_stages_option_gives_the_plans_own_frontier_not_v_times_the_work(tmp_path):
    # fuzz: --virtual-stages 99999999999999999999 was a numpy traceback; by hand, --virtual-stages 2 on a plan of
    # virtual_stages 1 ran each stage's whole forward / backward twice (min time 0.0254 s against 0.0170 s for the
    # same plan saved with virtual_stages 2), and --virtual-stages 1 on that plan halved it (0.0088 s, 0.0128 s)
    (tmp_path / "p").mkdir()
    plain, interleaved = _plan(tmp_path / "p"), tmp_path / "v2.json"
    interleaved.write_text(json.dumps({**json.loads(plain.read_text()), "virtual_stages": 2}))
    for base, other, v in ((plain, interleaved, "2"), (interleaved, plain, "1")):
        (r1, s1), (r2, s2) = _frontier(tmp_path, base, "--virtual-stages", v), _frontier(tmp_path, other)
        assert r1.code == r2.code == 0, (r1.stderr, r2.stderr)
        assert s1["min_time_s"] == s2["min_time_s"] and s1["min_energy_j"] == pytest.approx(s2["min_energy_j"])
    refused(_frontier(tmp_path, plain, "--virtual-stages", "3")[0], "--virtual-stages", "divisible by 3")
    for v in ("0", "4096", "99999999999999999999"):
        refused(_frontier(tmp_path, plain, "--virtual-stages", v)[0], "--virtual-stages")
    refused(_frontier(tmp_path, interleaved, "-m", "40000")[0], "--num-microbatches", "80,000")


@pytest.mark.parametrize("field,modules", [("recompute_modules", ["moe_act"]), ("offload_modules", ["expert_fc1"]),
                                           ("offload_modules", ["moe_act"]),
                                           # routing and dispatch settings, away from their defaults: ignored unsaid
                                           ("moe_load_imbalance", 2.0), ("moe_dispatcher", "deepep"),
                                           ("moe_routing", "contiguous"), ("moe_a2a_overlap", True)])
def test_moe_layer_modules_on_a_dense_model_refused_not_ignored(tmp_path, field, modules):
    # the estimate of the dense tiny model dropped them (the same numbers as without), and the Megatron-LM export
    # passed --recompute-modules moe_act, which Megatron-Core refuses without --moe-grouped-gemm
    path = _with_job(tmp_path, {field: modules})
    for args in (("estimate", path), ("export", path, "--to", "megatron", "--out-dir", tmp_path / "x")):
        refused(run_cli(*args), f"plan.job.{field}", "moe-modules-need-experts", "has no experts")
    assert run_cli("estimate", _with_job(tmp_path, {"recompute_modules": ["layernorm"]})).code == 0
    assert run_cli("estimate", _with_job(tmp_path, {"moe_load_imbalance": 1.25})).code == 0  # the default: no refusal
    moe = json.loads((ROOT / "examples" / "tiny-moe-ep2.json").read_text())
    moe["job"].update(model=str(ROOT / "examples" / "tiny-moe.json"), **{field: modules})
    moe["pools"][0]["gpu"] = "A100-SXM-80GB"
    (tmp_path / "moe.json").write_text(json.dumps(moe))
    assert run_cli("estimate", tmp_path / "moe.json").code == 0


def test_pipeline_step_microbatches_outside_fsdp_refused_not_costed_as_extra_flushes(tmp_path):
    # Megatron-LM and DeepSpeed run all of an iteration's micro-batches in one call of their schedule; the
    # estimate added a pipeline flush per call of 1 (0.0130 s -> 0.0176 s on the tiny pp-2 Megatron plan), a split they
    # never make
    for framework in ("megatron", "deepspeed"):
        path = _with_job(tmp_path, {"framework": framework}, pipeline_step_microbatches=1)
        refused(run_cli("estimate", path), "pipeline_step_microbatches", f"{framework} runs all", "framework = 'fsdp'")
    assert run_cli("estimate", _with_job(tmp_path, {"framework": "fsdp"}, pipeline_step_microbatches=1)).code == 0


@pytest.mark.parametrize("framework", ["fsdp", "deepspeed"])
@pytest.mark.parametrize("field", ["recompute_modules", "offload_modules"])
def test_megatron_module_options_outside_megatron_exit_2(tmp_path, framework, field):
    # Job's docstring: Megatron-Core options; checked by hand (plan JSON) and through a job file
    modules = ["layernorm"] if field == "recompute_modules" else ["moe_act"]
    path = _with_job(tmp_path, {"framework": framework, field: modules})
    for args in (("estimate", path), ("export", path, "--to", "megatron", "--out-dir", tmp_path / "x")):
        refused(run_cli(*args), "Megatron-Core options", f"framework {framework!r}")
    (tmp_path / "job.toml").write_text(f'[job]\nmodel = "opt-125m"\nseq_len = 2048\nglobal_batch = 64\n'
                                       f'train_tokens = 1e10\nframework = "{framework}"\n{field} = {json.dumps(modules)}\n'
                                       '[[inventory]]\ngpu = "A100-SXM-80GB"\ncount = 8\n')
    refused(run_cli("plan", tmp_path / "job.toml"), "job", "Megatron-Core options")
