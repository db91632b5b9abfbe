"""--export vllm|sglang: the launch commands and router config written for a plan, read back with the engines'
flag names and types (round trip against the plan, not a GPU run)."""

import json
import shlex
from pathlib import Path

import pytest

from hetplan.errors import HetplanError
from hetplan.serve.export import Replica, engine_args, parse_args, replicas_from_capacity, write_export

from .test_cli import EXAMPLES, _run


def _argv(script: Path) -> list[str]:
    line = [x for x in script.read_text().splitlines() if x.startswith("exec ")][0]
    return shlex.split(line)[1:-1]  # drop "exec" and the trailing "$@"


def _devices(script: Path) -> list[int]:
    line = [x for x in script.read_text().splitlines() if x.startswith("export CUDA_VISIBLE_DEVICES=")]
    assert len(line) == 1
    return [int(x) for x in line[0].split("=", 1)[1].split(",")]


def _router(path: Path) -> dict:
    yaml = pytest.importorskip("yaml")
    return yaml.safe_load(path.read_text())


def test_capacity_export_round_trips_the_plan(monkeypatch, capsys, tmp_path):
    text = (EXAMPLES / "capacity.toml").read_text().replace("max_gpus = 8", "max_gpus = 4")
    wl = tmp_path / "cap.toml"
    wl.write_text(text)
    out_dir = tmp_path / "vllm"
    code, out, err = _run(monkeypatch, capsys, "capacity", wl, "--gpus", "A100-SXM-80GB,L4", "--json",
                          "--export", "vllm", "--out-dir", out_dir, "--no-share")
    assert code == 0, err
    plan = json.loads(out)
    from hetplan.serve.config import load_workload_config

    wf = load_workload_config(wl)
    for engine, d in (("vllm", out_dir), ("sglang", tmp_path / "sglang")):
        if engine == "sglang":
            write_export("sglang", replicas_from_capacity(wf, plan), d)
        scripts = sorted(d.glob("replica-*.sh"))
        assert len(scripts) == sum(r["replicas"] for r in plan["mix"])
        seen: dict = {}
        ports: list = []
        gpus: list = []
        for sc in scripts:
            a = parse_args(engine, _argv(sc))
            name = a["served_model_name"][0] if engine == "vllm" else a["served_model_name"]
            tp = a["tensor_parallel_size"] if engine == "vllm" else a["tp_size"]
            pp = a["pipeline_parallel_size"] if engine == "vllm" else a["pp_size"]
            key = (name, tp, pp)
            seen[key] = seen.get(key, 0) + 1
            seqs, ctx = ((a["max_num_seqs"], a["max_model_len"]) if engine == "vllm"
                         else (a["max_running_requests"], a["context_length"]))
            util = a["gpu_memory_utilization"] if engine == "vllm" else a["mem_fraction_static"]
            assert (seqs, ctx, util) == (wf.scheduler.max_batch_size, wf.scheduler.kv_cache_len,
                                         wf.cluster.memory_fraction)
            assert (a["model"] if engine == "vllm" else a["model_path"]) == "facebook/opt-13b"
            assert a["dtype"] == "float16" and not a.get("enable_sleep_mode") and not a.get("enable_memory_saver")
            ports.append(a["port"])
            gpus.append(_devices(sc))
            assert len(gpus[-1]) == tp * pp  # its own GPUs, one per worker
        reps = json.loads((d / "replicas.json").read_text())["replicas"]
        assert [r["devices"] for r in reps] == gpus  # scripts in replica order
        flat = [(r["machine"], g) for r in reps for g in r["devices"]]
        assert len(flat) == len(set(flat)) and all(g < 8 for _, g in flat)  # no GPU of a machine given twice
        assert all(len({r["gpu"] for r in reps if r["machine"] == k}) == 1 for k, _ in flat)  # one type a machine
        want: dict = {}
        for r in plan["mix"]:
            want[(r["model"], r["tp"], r["pp"])] = want.get((r["model"], r["tp"], r["pp"]), 0) + r["replicas"]
        assert seen == want  # every replica of the plan, with its TP x PP, once
        assert len(set(ports)) == len(ports)
        manifest = json.loads((d / "replicas.json").read_text())
        assert manifest["engine"] == engine and "@" in manifest["checked_against"]
        router = _router(d / "router.yaml")
        by_model: dict = {}
        for dep in router["model_list"]:
            by_model.setdefault(dep["model_name"], []).append(dep["litellm_params"])
        for name in plan["load_per_s"]:  # each model's deployments: its replicas, weighted by their planned rates
            rows = [r for r in plan["mix"] if r["model"] == name]
            assert len(by_model[name]) == sum(r["replicas"] for r in rows)
            assert sum(p["rpm"] for p in by_model[name]) == sum(int(r["rate_per_s"] * 60) * r["replicas"] for r in rows)
        assert router["router_settings"]["routing_strategy"] == "simple-shuffle"
        hosts = {r["host"] for r in reps}
        assert hosts == ({"127.0.0.1"} if len({r["machine"] for r in reps}) == 1
                         else {f"machine-{r['machine']}" for r in reps})
        assert sorted(p["api_base"] for ps in by_model.values() for p in ps) == sorted(
            f"http://{r['host']}:{r['port']}/v1" for r in reps)


def test_shared_cluster_export_uses_sleep_mode(monkeypatch, capsys, tmp_path):
    """simulate --export: one instance per model on the shared GPUs, each allowed its simulated footprint's share
    of the memory, with vLLM's sleep mode (SGLang's memory saver) on: the engines' form of weight swapping."""
    for engine, flag in (("vllm", "enable_sleep_mode"), ("sglang", "enable_memory_saver")):
        d = tmp_path / engine
        code, out, err = _run(monkeypatch, capsys, "simulate", EXAMPLES / "workload.toml", "--json", "--export", engine,
                              "--out-dir", d)
        assert code == 0, err
        scripts = sorted(d.glob("replica-*.sh"))
        assert len(scripts) == 6
        args = [parse_args(engine, _argv(s)) for s in scripts]
        assert all(a[flag] for a in args)
        util = [a["gpu_memory_utilization" if engine == "vllm" else "mem_fraction_static"] for a in args]
        # footprints of workload.toml's models per worker: 13B shard ~6.6 GB + KV, 1.3B ~0.7 GB + KV, of 80 GB
        assert all(0 < u < 0.15 for u in util) and util[0] > 5 * util[-1]
        assert all(_devices(s) == [0, 1, 2, 3] for s in scripts)  # TP 2 x PP 2: every model on the same 4 GPUs


def test_max_model_len_is_at_most_the_models_positions(monkeypatch, capsys, tmp_path):
    """A kv_cache_len above a model's positions (2,560 for OPT's 2,048) was written as ``--max-model-len 2560``,
    which vLLM refuses at start ("greater than the derived max_model_len"): the launch now says the model's 2,048,
    and keeps kv_cache_len where it is shorter."""
    for kv, want in ((2560, 2048), (1024, 1024)):
        text = (EXAMPLES / "workload.toml").read_text()
        assert "[scheduler]" in text
        wl = tmp_path / f"w{kv}.toml"
        wl.write_text(text.replace("[scheduler]", f"[scheduler]\nkv_cache_len = {kv}", 1)
                      .replace("max_batch_size = 8", "max_batch_size = 2"))  # the longer KV slots fit 8 GB
        d = tmp_path / f"vllm{kv}"
        code, out, err = _run(monkeypatch, capsys, "simulate", wl, "--json", "--export", "vllm", "--out-dir", d)
        assert code == 0, err
        lens = {parse_args("vllm", _argv(sc))["max_model_len"] for sc in sorted(d.glob("replica-*.sh"))}
        assert lens == {want}


@pytest.mark.parametrize("args,field", [
    (("--export", "trtllm", "--out-dir", "X"), "--export"),
    (("--export", "vllm"), "--out-dir"),
    (("--out-dir", "X"), "--export"),
])
def test_export_option_errors_exit_2(monkeypatch, capsys, tmp_path, args, field):
    args = tuple(str(tmp_path / a) if a == "X" else a for a in args)
    code, _, err = _run(monkeypatch, capsys, "simulate", EXAMPLES / "workload.toml", *args)
    assert code == 2 and field in err and "fix" in err and "Traceback" not in err


def test_engine_args_refusals_and_quantization():
    r = Replica("m", "org/m", "H100-SXM", 2, 1, 0, 8000, 64, 4096, 0.9, "bf16", weights="fp8")
    assert parse_args("vllm", engine_args("vllm", r))["quantization"] == "fp8"
    r.weights = "int4"
    assert parse_args("sglang", engine_args("sglang", r))["quantization"] == "awq"
    r.block_tokens = 24  # not among vLLM's --block-size choices
    with pytest.raises(HetplanError) as e:
        engine_args("vllm", r)
    assert e.value.field == "scheduler.kv_block_tokens"
    assert parse_args("sglang", engine_args("sglang", r))["page_size"] == 24  # SGLang takes any page size
    r.block_tokens, r.chunked_prefill, r.max_batched_tokens = 16, True, 2048
    a = parse_args("vllm", engine_args("vllm", r))
    assert a["enable_chunked_prefill"] and a["max_num_batched_tokens"] == 2048
    assert parse_args("sglang", engine_args("sglang", r))["chunked_prefill_size"] == 2048


def test_engine_defaults_replace_max_batch_size(tmp_path):
    """Without scheduler.max_batch_size a replica runs its engine's own max_num_seqs (engines.toml: vLLM V1 1,024
    on >= 70 GiB GPUs but A100, else 256; V0 256) and V0's 1 % admission watermark; with it, the user's value;
    the exported --max-num-seqs carries the same number."""
    from hetplan.hardware.catalog import get_gpu
    from hetplan.hardware.engines import get_engine
    from hetplan.serve.replica import Stack, max_running, scheduler_kwargs
    from hetplan.serve.config import load_workload_config

    text = (EXAMPLES / "capacity-engines.toml").read_text()
    assert "\nmax_batch_size" not in text
    bare, fixed = tmp_path / "bare.toml", tmp_path / "fixed.toml"
    bare.write_text(text)
    fixed.write_text(text.replace("[scheduler]\n", "[scheduler]\nmax_batch_size = 64\n"))
    wf, wf64 = load_workload_config(bare), load_workload_config(fixed)
    h100, a100, l40s = get_gpu("H100-SXM"), get_gpu("A100-SXM-80GB"), get_gpu("L40S")
    v1, v0 = Stack(get_engine("vllm@0.10")), Stack(get_engine("vllm@0.6"))
    assert [max_running(wf, v1, g) for g in (h100, a100, l40s)] == [1024, 256, 256]
    assert max_running(wf, v0, h100) == 256 and max_running(wf, Stack(), h100) == 8
    assert max_running(wf64, v1, h100) == 64
    kw0, kw1 = scheduler_kwargs(wf, v0, a100), scheduler_kwargs(wf, v1, h100)
    assert (kw0["max_batch_size"], kw0["kv_watermark"]) == (256, 0.01)
    assert (kw1["max_batch_size"], kw1["kv_watermark"]) == (1024, 0.0)
    row = {"model": "llama3-8b", "gpu": "H100-SXM", "tp": 1, "pp": 1, "weights": None, "kv_block_tokens": 16,
           "max_batched_tokens": 8192, "chunked_prefill": True, "replicas": 1, "rate_per_s": 3.0,
           "max_num_seqs": max_running(wf, v1, h100)}
    r = replicas_from_capacity(wf, {"mix": [row]})[0]
    assert parse_args("vllm", engine_args("vllm", r))["max_num_seqs"] == 1024


def test_placement_pins_gpus_per_machine_and_hosts(tmp_path):
    """First-fit per GPU type onto machines of 4 GPUs: A100 replicas of 2, 4, 2, 1 GPUs and one L4 -> machine 0
    (GPUs 0-1, then 2-3), machine 1 (0-3), machine 2 (0), machine 3 (the L4); the scripts and router carry it;
    placeholders without --host; too few hosts or a replica wider than a machine exit with the option named."""
    from hetplan.serve.export import place_replicas

    def reps():
        sizes = [(2, 1), (2, 2), (1, 2), (1, 1)]
        out = [Replica("a", "org/a", "A100-SXM-80GB", tp, pp, i, 8000 + i, 64, 4096, 0.9, "bf16", rate_per_s=1.0)
               for i, (tp, pp) in enumerate(sizes)]
        return out + [Replica("b", "org/b", "L4", 1, 1, 0, 8004, 64, 4096, 0.9, "bf16", rate_per_s=1.0)]

    r = reps()
    assert place_replicas(r, 4) == 4
    assert [(x.machine, x.devices) for x in r] == [(0, [0, 1]), (1, [0, 1, 2, 3]), (0, [2, 3]), (2, [0]), (3, [0])]
    assert [x.host for x in r] == ["machine-0", "machine-1", "machine-0", "machine-2", "machine-3"]
    hosts = ["10.0.0.1", "10.0.0.2", "10.0.0.3", "gpu-l4"]
    paths = write_export("sglang", r, tmp_path, hosts=hosts, gpus_per_host=4)
    scripts = sorted(p for p in paths if p.suffix == ".sh")
    assert [_devices(s) for s in scripts] == [x.devices for x in r]
    for s in scripts:
        assert parse_args("sglang", _argv(s))["host"] == "0.0.0.0"  # reachable by a router on another machine
    router = _router(tmp_path / "router.yaml")
    assert [d["litellm_params"]["api_base"] for d in router["model_list"]] == [
        f"http://{hosts[x.machine]}:{x.port}/v1" for x in r]
    manifest = json.loads((tmp_path / "replicas.json").read_text())
    assert [(m["host"], m["devices"]) for m in manifest["replicas"]] == [(hosts[x.machine], x.devices) for x in r]
    with pytest.raises(HetplanError) as e:
        place_replicas(reps(), 4, hosts[:3])
    assert e.value.field == "--host" and "4 machines" in e.value.message
    with pytest.raises(HetplanError) as e:
        place_replicas(reps(), 2)
    assert e.value.field == "--gpus-per-host"
    one = reps()[:1]
    place_replicas(one, 8)
    assert one[0].host == "127.0.0.1" and "--host" not in engine_args("vllm", one[0])


@pytest.mark.parametrize("args,field", [
    (("--host", "10.0.0.1"), "--host"),                                     # --host without --export
    (("--export", "vllm", "--out-dir", "X", "--host", "http://a"), "--host"),  # not an address
])
def test_host_option_errors_exit_2(monkeypatch, capsys, tmp_path, args, field):
    args = tuple(str(tmp_path / a) if a == "X" else a for a in args)
    code, _, err = _run(monkeypatch, capsys, "simulate", EXAMPLES / "workload.toml", *args)
    assert code == 2 and field in err and "fix" in err and "Traceback" not in err
