"""CLI: hetplan simulate / capacity (JSON output), and user errors -> exit code 2 naming the field."""

import json
import sys
from pathlib import Path

import pytest

from hetplan.cli.main import main

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "serve"


def _run(monkeypatch, capsys, *args):
    monkeypatch.setattr(sys, "argv", ["hetplan", *map(str, args)])
    code = 0
    try:
        main()
    except SystemExit as exc:
        code = exc.code or 0
    out = capsys.readouterr()
    return code, out.out, out.err


def test_simulate_json(monkeypatch, capsys):
    code, out, _ = _run(monkeypatch, capsys, "simulate", EXAMPLES / "workload.toml", "--json")
    assert code == 0
    rep = json.loads(out)
    assert set(rep["models"]) == {"opt13-a", "opt13-b", "opt1-a", "opt1-b", "opt1-c", "opt1-d"}
    a = rep["all"]
    assert a["requests"] == sum(m["requests"] for m in rep["models"].values()) > 500
    for metric in ("latency", "ttft", "tpot"):
        assert 0 < a[f"p50_{metric}_s"] <= a[f"p90_{metric}_s"] <= a[f"p99_{metric}_s"]
    assert a["p50_ttft_s"] < a["p50_latency_s"] and a["output_tokens_per_s"] > 0
    assert 0 <= a["slo_attainment"] <= 1 and rep["swaps"] > 0
    # reproducible: same seed, same report
    code, out2, _ = _run(monkeypatch, capsys, "simulate", EXAMPLES / "workload.toml", "--json")
    assert json.loads(out2) == rep


def test_simulate_trace_and_table(monkeypatch, capsys):
    code, out, _ = _run(monkeypatch, capsys, "simulate", EXAMPLES / "workload-trace.toml", "--json")
    assert code == 0 and json.loads(out)["all"]["requests"] == 8
    code, out, _ = _run(monkeypatch, capsys, "simulate", EXAMPLES / "workload.toml", "--policy", "load_aware")
    assert code == 0 and "SLO met" in out and "TTFT" in out


def test_offline_throughput_over_the_makespan(monkeypatch, capsys):
    """All requests at t = 0: throughput is counted over the makespan (first arrival to last answer), not 0."""
    code, out, err = _run(monkeypatch, capsys, "simulate", EXAMPLES / "offline.toml", "--json")
    assert code == 0, err
    rep = json.loads(out)
    a = rep["all"]
    assert a["requests"] == a["completed"] == 256
    ends = a["output_tokens_per_s"] * rep["duration_s"]
    from hetplan.serve.workload import read_lengths

    rows = read_lengths(EXAMPLES / "lengths.jsonl")
    assert ends == pytest.approx(sum(rows[i % len(rows)][1] for i in range(256)))  # every output token counted
    assert a["throughput_per_s"] == pytest.approx(256 / rep["duration_s"]) and a["throughput_per_s"] > 0
    assert rep["duration_s"] >= a["p99_latency_s"]  # the makespan: every request arrived at 0
    code, out, _ = _run(monkeypatch, capsys, "simulate", EXAMPLES / "offline.toml")
    assert code == 0 and "offline" in out and "tok/s" in out and max(map(len, out.splitlines())) <= 80


def test_length_distributions_and_means(monkeypatch, capsys):
    code, out, err = _run(monkeypatch, capsys, "simulate", EXAMPLES / "lengths.toml", "--json")
    assert code == 0, err
    a = json.loads(out)["all"]
    for metric in ("latency", "ttft", "tpot"):  # the mean is reported and lies within the spread
        assert a[f"p50_{metric}_s"] * 0.5 < a[f"mean_{metric}_s"] <= a[f"p99_{metric}_s"]
    # prompts log-normal, mean 512 (clipped to 16..2048), outputs uniform 32..256: about 512 + 144 per request
    per_request = a["total_tokens_per_s"] / a["throughput_per_s"]
    assert 500 < per_request < 800
    code, out, _ = _run(monkeypatch, capsys, "simulate", EXAMPLES / "lengths.toml")
    assert code == 0 and "mean" in out and "p90" in out and max(map(len, out.splitlines())) <= 80


def test_capacity_cheapest_mix_over_gpu_types(monkeypatch, capsys, tmp_path):
    text = (EXAMPLES / "capacity.toml").read_text().replace("max_gpus = 8", "max_gpus = 4")
    p = tmp_path / "cap.toml"
    p.write_text(text)
    code, out, err = _run(monkeypatch, capsys, "capacity", p, "--gpus", "A100-SXM-80GB,L4", "--json", "--no-share")
    assert code == 0, err
    res = json.loads(out)
    assert res["meets_target"] and not res["shared"]
    for name, sim in res["simulated"].items():  # the simulator checked the chosen mix
        assert sim["slo_attainment"] >= res["target_attainment"] and sim["requests"] > 0
    for name, load in res["load_per_s"].items():  # every model's load is covered by its replicas' capacity
        assert sum(r["replicas"] * r["rate_per_s"] for r in res["mix"] if r["model"] == name) >= load
    assert sum(res["gpus_by_type"].values()) == sum(r["gpus"] for r in res["mix"])
    assert all(n <= 4 for n in res["gpus_by_type"].values())
    assert res["price_usd_per_hour"] == pytest.approx(sum(r["price_usd_per_hour"] for r in res["mix"]))
    # energy: every rented GPU is charged at least its idle power over the 120 s workload; per-model parts add up
    from hetplan.energy.inference import busy_idle_power_w

    e = res["energy"]
    assert e["num_gpus"] == sum(res["gpus_by_type"].values())
    assert e["energy_j"] == pytest.approx(sum(m["energy"]["energy_j"] for m in res["simulated"].values()))
    assert e["energy_j"] >= sum(n * busy_idle_power_w(g)[1] * 120 for g, n in res["gpus_by_type"].items())
    assert e["energy_j_per_output_token"] == pytest.approx(e["energy_j"] / e["output_tokens"])
    # one OPT-13B fp16 (25.7 GB) cannot sit in half of a 24 GB L4: memory is given as the reason
    l4 = [c for c in res["candidates"] if c["gpu"] == "L4" and c["tp"] * c["pp"] == 1]
    assert l4 and "shard" in l4[0]["reason"]
    code, out, _ = _run(monkeypatch, capsys, "capacity", p, "--gpus", "A100-SXM-80GB,L4")
    assert code == 0 and "cheapest mix" in out and "SLO met" in out
    code, _, err = _run(monkeypatch, capsys, "capacity", p, "--gpus", "A100-XYZ")
    assert code == 2 and "--gpus" in err


def test_capacity_prices_catalog_and_refusals(monkeypatch, capsys, tmp_path):
    """Per-GPU prices decide the mix (a price override, then a user catalog); the search never picks an unpriced
    GPU, refuses without candidate types, and reports progress."""
    text = (EXAMPLES / "capacity.toml").read_text().replace("max_gpus = 8", "max_gpus = 4")
    p = tmp_path / "cap.toml"
    p.write_text(text)
    base = ("capacity", p, "--gpus", "A100-SXM-80GB,L4", "--json", "--no-share")
    code, out, err = _run(monkeypatch, capsys, *base, "--price", "L4=40")
    assert code == 0, err
    res = json.loads(out)
    assert {r["gpu"] for r in res["mix"]} == {"A100-SXM-80GB"}  # L4 at 40 $/h loses to the catalog's A100
    assert res["prices"]["L4"] == {"usd_per_gpu_hour": 40.0, "source": "--price"}
    from hetplan.hardware.catalog import load_catalog
    a100 = load_catalog().get("A100-SXM-80GB").price_usd_per_hour  # the catalog's default price
    assert res["price_usd_per_hour"] == pytest.approx(sum(r["gpus"] for r in res["mix"]) * a100)
    cat = tmp_path / "gpus.toml"
    cat.write_text("[gpus.A100-SXM-80GB]\nprice_usd_per_hour = 0.05\n")
    code, out, err = _run(monkeypatch, capsys, *base, "--catalog", cat)
    assert code == 0, err
    res = json.loads(out)
    assert {r["gpu"] for r in res["mix"]} == {"A100-SXM-80GB"} and res["prices"]["A100-SXM-80GB"]["usd_per_gpu_hour"] == 0.05
    # refusals: an unpriced GPU, no candidate types at all, a price for a GPU not searched, a malformed price
    for args, field in ((("--gpus", "A100-SXM-80GB,H100-SXM-96GB-500W"), "--price"),
                        (("--gpus", "L4", "--price", "A100-SXM-80GB=2"), "--price"),
                        (("--gpus", "L4", "--price", "L4"), "--price")):
        code, _, err = _run(monkeypatch, capsys, "capacity", p, *args)
        assert code == 2 and field in err and "fix" in err and "Traceback" not in err, err
    bare = tmp_path / "bare.toml"
    bare.write_text(text.replace('gpus = ["A100-SXM-80GB", "A100-PCIe-40GB", "H100-SXM-80GB", "L4", "A10G"]', ""))
    code, _, err = _run(monkeypatch, capsys, "capacity", bare)
    assert code == 2 and "capacity.gpus" in err and "no candidate GPU types" in err
    from hetplan.serve.capacity import plan_capacity
    from hetplan.serve.config import load_workload_config

    seen = []
    plan_capacity(load_workload_config(p), ["A100-SXM-80GB"], progress=lambda d, t, w: seen.append((d, t)))
    assert seen and seen[-1][0] == seen[-1][1] and [d for d, _ in seen] == list(range(1, len(seen) + 1))


ENGINES_WORKLOAD = """
[cluster]
dtype = "fp16"
[scheduler]
max_batch_size = 32
kv_cache_len = 2048
[workload]
duration_s = 60
total_rate_per_s = 3
prompt_len = 512
max_new_tokens = 64
slo_s = 8
[capacity]
gpus = ["A100-SXM-80GB", "V100-SXM-32GB"]
engines = ["vllm"]
quantizations = ["none", "fp8"]
max_gpus = 2
exhaustive = true
[[models]]
name = "llama"
model = "llama3-8b"
"""


def test_capacity_chooses_engine_and_quantization(monkeypatch, capsys, tmp_path):
    """capacity.engines x capacity.quantizations are candidates like GPU types: each (GPU, TP x PP, engine,
    weights) gets its own rate; combinations an engine does not run are given their reason; the mix names its
    engine and weights, and FP8 weights (half the bytes) leave more KV cache, so an FP8 replica sustains at least
    the rate of its 16-bit twin."""
    p = tmp_path / "eng.toml"
    p.write_text(ENGINES_WORKLOAD)
    code, out, err = _run(monkeypatch, capsys, "capacity", p, "--json")
    assert code == 0, err
    res = json.loads(out)
    stacks = {(c["gpu"], c["stack"]) for c in res["candidates"]}
    assert ("A100-SXM-80GB", "vllm@0.10/fp8") in stacks and ("A100-SXM-80GB", "vllm@0.10/none") in stacks
    v100 = [c for c in res["candidates"] if c["gpu"] == "V100-SXM-32GB"]
    assert v100 and all(c["rate_per_s"] == 0 for c in v100)  # vLLM 0.10 does not run on Volta: said why
    assert any("does not run" in c["reason"] for c in v100)
    rate = {(c["tp"], c["pp"], c["stack"]): c["rate_per_s"] for c in res["candidates"] if c["gpu"] == "A100-SXM-80GB"}
    assert rate[(1, 1, "vllm@0.10/fp8")] >= rate[(1, 1, "vllm@0.10/none")] > 0
    assert all(r["engine"] == "vllm@0.10" and r["weights"] in (None, "fp8") for r in res["mix"])
    assert all(r["chunked_prefill"] and r["kv_block_tokens"] == 16 for r in res["mix"])  # vLLM 0.10's defaults


def test_capacity_integer_program_equals_brute_force():
    """Two models, three replica types (prices 3, 5, 2 $/h; 1, 2, 1 GPUs; the first two on GPU type X, at most 4
    GPUs per type): the integer program's cost equals the cheapest of all assignments up to 4 replicas each."""
    import itertools

    import numpy as np

    from hetplan.serve.capacity import _solve

    rates = np.array([[2.0, 5.0, 1.0], [1.0, 0.0, 3.0]])
    prices, gpus_per, gpu_of = np.array([3.0, 5.0, 2.0]), np.array([1, 2, 1]), ["X", "X", "Y"]
    for loads in ([3.0, 2.0], [7.0, 1.0], [4.0, 6.0], [9.0, 0.5]):
        best = None
        for x in itertools.product(range(5), repeat=6):
            xm = np.array(x).reshape(2, 3)
            if (xm[1, 1] and not rates[1, 1]) or any((xm * rates).sum(1) < loads):
                continue
            per_type = {t: sum(xm[m, k] * gpus_per[k] for m in range(2) for k in range(3) if gpu_of[k] == t)
                        for t in "XY"}
            if max(per_type.values()) > 4:
                continue
            cost = float((xm * prices).sum())
            best = cost if best is None else min(best, cost)
        got = _solve(rates, prices, np.array(loads), gpu_of, gpus_per, 4)
        assert (got is None) == (best is None)
        if got is not None:
            assert float((got * prices).sum()) == pytest.approx(best)


BASE = """
[cluster]
gpu = "A100-SXM-80GB"
memory_bytes = 30_000_000_000
[workload]
duration_s = 10
total_rate_per_s = 1
[[models]]
name = "a"
model = "opt-1.3b"
"""


@pytest.mark.parametrize("text,needle", [
    (BASE + "[[models\n", "line"),                                              # TOML syntax, with its line
    (BASE.replace("opt-1.3b", "opt-13c"), "models.a.model"),                     # unknown model
    (BASE.replace("total_rate_per_s = 1", "total_rate_per_s = -1"), "workload.total_rate_per_s"),
    (BASE.replace('"A100-SXM-80GB"', '"A100-XYZ"'), "cluster.gpu"),             # unknown GPU
    (BASE.replace("duration_s = 10", "duraton_s = 10"), "workload.duraton_s"),  # typo'd key
    (BASE + "[scheduler]\npolicy = \"fifo\"\n", "scheduler.policy"),
    (BASE.replace("total_rate_per_s = 1", "trace = \"neg.csv\""), "workload.trace.prompt_len"),  # negative length
    (BASE + "[workload.input]\ndist = \"lognormal\"\nmean = 100\n", "workload.input"),  # std and max missing
    (BASE.replace("total_rate_per_s = 1", "offline = true"), "workload.num_requests"),
    (BASE.replace('gpu = "A100-SXM-80GB"', 'gpu = "A100-SXM-80GB"\nengine = "vlm"'), "cluster.engine"),  # unknown
    (BASE.replace('gpu = "A100-SXM-80GB"', 'gpu = "A100-SXM-80GB"\nengine = "vllm@0.4"'), "cluster.engine"),
    (BASE.replace('gpu = "A100-SXM-80GB"', 'gpu = "T4"\nengine = "vllm"\nquantization = "fp8"')
     .replace("30_000_000_000", "10_000_000_000"),  # within the T4's 16 GB
     "cluster.quantization"),                                                   # no FP8 on Turing in vLLM
    (BASE.replace('gpu = "A100-SXM-80GB"', 'gpu = "A100-SXM-80GB"\nquantization = "int4"'),
     "cluster.quantization"),                                                   # quantized weights need an engine
    (BASE.replace("memory_bytes = 30_000_000_000", "memory_bytes = 1_000"), "models.a"),  # does not fit
    # 30 PB on an 80 GB GPU: models placed in memory the GPU does not have, exit 0
    (BASE.replace("memory_bytes = 30_000_000_000", "memory_bytes = 30_000_000_000_000_000"), "cluster.memory_bytes"),
    (BASE.replace("total_rate_per_s = 1", "total_rate_per_s = 1\nprompt_len = 4000") + "[scheduler]\n"
     "kv_cache_len = 8192\n", "workload.prompt_len"),  # beyond OPT-1.3B's 2,048 positions: was priced, exit 0
    (BASE.replace("total_rate_per_s = 1", 'trace = "hdr.csv"'), "workload.trace"),  # header only: 0 requests, exit 0
    # a token budget below kv_cache_len without chunked prefill (vLLM refuses it): was raised without a word
    (BASE + "[scheduler]\nkv_cache_len = 1024\nmax_batched_tokens = 512\nchunked_prefill = false\n",
     "scheduler.max_batched_tokens"),
])
def test_user_errors_exit_2(monkeypatch, capsys, tmp_path, text, needle):
    p = tmp_path / "w.toml"
    p.write_text(text)
    (tmp_path / "neg.csv").write_text("arrival_s,model,prompt_len\n0.0,a,-12\n")
    (tmp_path / "hdr.csv").write_text("arrival_s,model\n")
    code, _, err = _run(monkeypatch, capsys, "simulate", p)
    assert code == 2 and needle in err and "fix" in err and "Traceback" not in err


@pytest.mark.parametrize("edit,needle", [
    # quantized weights with no engine to price them: every candidate was refused and the error named
    # capacity.gpus, with the fix "allow more GPUs or larger GPU types"
    (lambda t: t + '[capacity]\nquantizations = ["fp8"]\n', "capacity.quantizations"),
    # a trace whose requests all arrive at t = 0: its rate divided by zero (ZeroDivisionError traceback)
    (lambda t: t.replace("total_rate_per_s = 1", 'trace = "zero.jsonl"'), "workload.trace"),
    # a request beyond the model's positions (capacity sized a KV pool for it)
    (lambda t: t.replace("total_rate_per_s = 1", "total_rate_per_s = 1\nmax_new_tokens = 3000") + "[scheduler]\n"
     "kv_cache_len = 4096\n", "workload.max_new_tokens"),
    # one memory size for every candidate type: it was ignored, each type sized by its own memory
    (lambda t: t.replace('gpu = "A100-SXM-80GB"\n', 'gpu = "A100-SXM-80GB"\nmemory_bytes = 30_000_000_000\n'),
     "cluster.memory_bytes"),
])
def test_capacity_user_errors_exit_2(monkeypatch, capsys, tmp_path, edit, needle):
    p = tmp_path / "w.toml"
    p.write_text(edit(BASE.replace("memory_bytes = 30_000_000_000\n", "")))
    (tmp_path / "zero.jsonl").write_text('{"arrival_s": 0, "model": "a"}\n{"arrival_s": 0, "model": "a"}\n')
    code, _, err = _run(monkeypatch, capsys, "capacity", p)
    assert code == 2 and needle in err and "fix" in err and "Traceback" not in err, err


def test_serve_config_errors_print_their_bound_reasons(monkeypatch, capsys, tmp_path):
    """serve/workload TOML errors go through the shared message (hetplan.inputs.validation_message), like every
    other input: a bounded number says why it is bounded, an unknown key lists the keys allowed there."""
    p = tmp_path / "w.toml"
    p.write_text(BASE.replace("total_rate_per_s = 1", "total_rate_per_s = 1\ncv = 50"))
    code, _, err = _run(monkeypatch, capsys, "simulate", p)
    assert code == 2 and "workload.cv" in err and "(got 50)" in err and "bursts" in err  # the bound's reason
    p.write_text(BASE.replace("duration_s = 10", "duraton_s = 10"))
    code, _, err = _run(monkeypatch, capsys, "simulate", p)
    assert code == 2 and "workload.duraton_s: unknown field" in err and "allowed fields here:" in err
    assert "duration_s" in err


def test_missing_file_and_bad_serve_config(monkeypatch, capsys, tmp_path):
    code, _, err = _run(monkeypatch, capsys, "simulate", tmp_path / "nope.toml")
    assert code == 2 and "does not exist" in err
    p = tmp_path / "s.toml"
    p.write_text('[cluster]\ntp = 0\n[[models]]\nname = "a"\nmodel = "opt-125m"\n')
    code, _, err = _run(monkeypatch, capsys, "serve", p)
    assert code == 2 and "cluster.tp" in err


def test_example_serve_config_is_valid():
    from hetplan.estimate.inference import kv_cache_bytes_per_worker, weight_bytes_per_worker
    from hetplan.serve.config import load_serve_config

    cfg = load_serve_config(EXAMPLES / "serve.toml")
    c, s = cfg.cluster, cfg.scheduler
    per = [max(w + k for w, k in zip(weight_bytes_per_worker(m.spec(), c.tp, c.pp, c.dtype),
                                     kv_cache_bytes_per_worker(m.spec(), s.max_batch_size * s.kv_cache_len, c.tp, c.pp,
                                                               c.dtype))) for m in cfg.models]
    cap = cfg.cluster.capacity_bytes()
    assert 2 * max(per) <= cap < 3 * min(per)  # exactly two of the four models fit, as the comment says


def test_serve_refuses_a_reachable_address_without_a_token(monkeypatch, capsys, tmp_path, fixtures):
    p = tmp_path / "s.toml"
    p.write_text(f'[[models]]\nname = "a"\nmodel = "{fixtures / "tiny-opt.json"}"\n')
    monkeypatch.delenv("HETPLAN_SERVE_TOKEN", raising=False)
    code, _, err = _run(monkeypatch, capsys, "serve", p, "--host", "0.0.0.0")
    assert code == 2 and "api.host" in err and "token" in err
    code, _, err = _run(monkeypatch, capsys, "serve", p, "--host", "0.0.0.0", "--token", "short")
    assert code == 2 and "--token" in err


def test_serve_model_too_big_for_worker_exits_2(monkeypatch, capsys, tmp_path, fixtures):
    p = tmp_path / "s.toml"
    p.write_text(f'[cluster]\ndtype = "fp32"\nmemory_bytes = 1000\n[[models]]\nname = "a"\nmodel = "{fixtures / "tiny-opt.json"}"\n')
    code, _, err = _run(monkeypatch, capsys, "serve", p)
    assert code == 2 and "models.a" in err and "memory_bytes" in err


@pytest.mark.parametrize("extra,field", [('engine = "vllm"\n', "cluster.engine"),
                                         ('engine = "vllm"\nquantization = "fp8"\n', "cluster.engine"),
                                         ('quantization = "int4"\n', "cluster.quantization")])
def test_serve_refuses_simulator_only_settings(monkeypatch, capsys, tmp_path, fixtures, extra, field):
    """The torch engine runs its own kernels: an engine stack or quantisation in SERVE.toml would be silently
    ignored, so they exit 2 naming the field."""
    p = tmp_path / "s.toml"
    p.write_text(f'[cluster]\ndtype = "fp32"\nmemory_bytes = 100_000_000\n{extra}[[models]]\nname = "a"\n'
                 f'model = "{fixtures / "tiny-opt.json"}"\n')
    code, _, err = _run(monkeypatch, capsys, "serve", p)
    assert code == 2 and field in err and "fix" in err and "Traceback" not in err, err


def test_light_core_modules_do_not_import_torch_or_fastapi():
    import subprocess

    code = ("import sys, hetplan.cli.main, hetplan.serve.simulator, hetplan.serve.workload, hetplan.serve.capacity, hetplan.serve.export, "
            "hetplan.serve.scheduler, hetplan.serve.swap_model, hetplan.serve.metrics, hetplan.serve.config; "
            "bad = [m for m in ('torch', 'fastapi', 'uvicorn') if m in sys.modules]; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_energy_per_request_and_token(monkeypatch, capsys, tmp_path):
    """Energy from the power model over each GPU's busy and idle time: decoding in larger batches costs fewer
    joules per output token; GPUs waiting for requests are charged their idle power; the parts add up."""
    from hetplan.energy.inference import busy_idle_power_w

    text = (EXAMPLES / "offline.toml").read_text().replace("num_requests = 256", "num_requests = 64").replace(
        '"lengths.jsonl"', json.dumps(str(EXAMPLES / "lengths.jsonl")))
    out = {}
    for batch in (4, 64):
        p = tmp_path / f"o{batch}.toml"
        p.write_text(text.replace("max_batch_size = 256", f"max_batch_size = {batch}"))
        code, o, err = _run(monkeypatch, capsys, "simulate", p, "--json")
        assert code == 0, err
        out[batch] = json.loads(o)
    e4, e64 = out[4]["energy"], out[64]["energy"]
    assert e64["energy_j_per_output_token"] < 0.5 * e4["energy_j_per_output_token"]
    busy_w, idle_w, source = busy_idle_power_w("A100-SXM-80GB")
    for rep in out.values():
        e = rep["energy"]
        assert e["energy_source"] == source and e["output_tokens"] == rep["all"]["output_tokens_per_s"] * rep["duration_s"]
        wall = rep["duration_s"]  # offline: the makespan, every GPU busy or idle over it
        assert e["energy_j"] == pytest.approx(busy_w * rep["busy_s"] + idle_w * (wall - rep["busy_s"]))
        assert e["prefill_energy_j"] == pytest.approx(busy_w * rep["prefill_busy_s"])
        assert e["energy_j_per_request"] == pytest.approx(e["energy_j"] / 64)
    # the same requests spread over a longer window: the extra time is idle power on every GPU (TP = 2 here)
    slow = text.replace("offline = true\nnum_requests = 64", "duration_s = 120\ntotal_rate_per_s = 0.5").replace(
        "tp = 1", "tp = 2")
    p = tmp_path / "slow.toml"
    p.write_text(slow)
    code, o, err = _run(monkeypatch, capsys, "simulate", p, "--json")
    assert code == 0, err
    rep = json.loads(o)
    e, wall = rep["energy"], max(rep["duration_s"], rep["end_s"])  # the window, or the last answer after it
    assert e["num_gpus"] == 2 and e["idle_energy_j"] == pytest.approx(2 * idle_w * (wall - rep["busy_s"]), rel=1e-6)
    code, o, _ = _run(monkeypatch, capsys, "simulate", p)
    assert "J/output token" in o


def test_capacity_probes_take_the_trace_lengths(tmp_path):
    """A trace's models are probed with their own requests' lengths: a model whose requests generate 16x more
    tokens sustains a lower rate on the same replica."""
    from hetplan.hardware.catalog import load_catalog
    from hetplan.serve.capacity import max_rate_per_s
    from hetplan.serve.config import load_workload_config

    p = tmp_path / "w.toml"
    p.write_text(BASE.replace("total_rate_per_s = 1", "total_rate_per_s = 1\nslo_s = 10")
                 + "[capacity]\ntarget_attainment = 0.9\n")
    wf = load_workload_config(p)
    entry = wf.models[0]
    gpu = load_catalog().get("A100-SXM-80GB")
    short = max_rate_per_s(wf, entry, entry.spec(), gpu, 1, 1, lengths=[(64, 4)])
    long = max_rate_per_s(wf, entry, entry.spec(), gpu, 1, 1, lengths=[(64, 64)])
    assert short > 2 * long > 0


def test_capacity_pruned_search_equals_exhaustive(tmp_path):
    """The lazily simulated search (rate bounds stand in for unsimulated candidates) returns the exhaustive
    search's price, a mix that covers the loads at simulated rates, with far fewer rate searches; every rate
    simulated is within its bound. Three OPT-13B on 2 GPU types (60 candidates) and one Llama 3 8B over A100 and
    V100 x vLLM x 2 weight dtypes x TP x PP <= 2 (24 candidates)."""
    from hetplan.serve.capacity import plan_capacity
    from hetplan.serve.config import load_workload_config

    eng = tmp_path / "eng.toml"
    eng.write_text(ENGINES_WORKLOAD.replace("exhaustive = true", "exhaustive = false"))
    for path, gpus in ((EXAMPLES / "capacity.toml", ["A100-PCIE-40GB", "L4"]), (eng, None)):
        wf = load_workload_config(path)
        full, lazy = (plan_capacity(wf, gpus, exhaustive=True, share=False),
                      plan_capacity(wf, gpus, share=False))
        assert lazy["price_usd_per_hour"] == pytest.approx(full["price_usd_per_hour"], rel=1e-12)
        assert lazy["meets_target"] and full["meets_target"]
        for name, load in lazy["load_per_s"].items():
            assert sum(r["replicas"] * r["rate_per_s"] for r in lazy["mix"] if r["model"] == name) >= load
        done = [c for c in lazy["candidates"] if c["rate_per_s"] is not None and c["rate_bound_per_s"] > 0]
        assert 0 < len(done) <= len(lazy["candidates"]) // 4
        full_rate = {(c["model"], c["gpu"], c["tp"], c["pp"], c["stack"]): c for c in full["candidates"]}
        for c in lazy["candidates"]:
            f = full_rate[(c["model"], c["gpu"], c["tp"], c["pp"], c["stack"])]
            assert f["rate_per_s"] <= f["rate_bound_per_s"]
            if c["rate_per_s"] is not None:
                assert c["rate_per_s"] == f["rate_per_s"]


def test_a_model_without_requests_attains_nothing(monkeypatch, capsys, tmp_path):
    """A model the workload sends no request in its window has no SLO attainment (JSON null, "-" in the table);
    it used to print 1.000, a number no request measured. Capacity still counts it as meeting its target."""
    p = tmp_path / "w.toml"
    p.write_text('[cluster]\ngpu = "A100-SXM-80GB"\n[workload]\nduration_s = 2\n[[models]]\nname = "a"\n'
                 'model = "opt-1.3b"\nrate_per_s = 2\n[[models]]\nname = "b"\nmodel = "opt-1.3b"\nrate_per_s = 0.01\n')
    code, out, err = _run(monkeypatch, capsys, "simulate", p, "--json")
    assert code == 0, err
    rep = json.loads(out)
    assert rep["models"]["b"]["requests"] == 0 and rep["models"]["b"]["slo_attainment"] is None
    assert rep["models"]["a"]["requests"] > 0 and 0 <= rep["models"]["a"]["slo_attainment"] <= 1
    code, out, _ = _run(monkeypatch, capsys, "simulate", p)
    row = next(line for line in out.splitlines() if line.startswith("│ b ") and "0 │" in line)
    assert "1.000" not in row and "-" in row
    from hetplan.serve.capacity import attains

    assert attains(rep["models"]["b"], 0.99) and not attains({"slo_attainment": 0.5}, 0.99)


def test_simulate_table_shows_each_models_own_slos(monkeypatch, capsys, tmp_path):
    """Models with their own SLOs: the line under the table gave the first model's SLOs as everyone's (model b's
    0.05 s latency and 10 ms TPOT, which its 0.000 attainment is measured against, were shown as a's 5 s)."""
    p = tmp_path / "w.toml"
    p.write_text('[cluster]\ngpu = "A100-SXM-80GB"\n[workload]\nduration_s = 5\ntotal_rate_per_s = 2\n'
                 'max_new_tokens = 4\n[[models]]\nname = "a"\nmodel = "opt-1.3b"\nslo_s = 5\n[[models]]\nname = "b"\n'
                 'model = "opt-1.3b"\nslo_s = 0.05\ntpot_slo_s = 0.01\n')
    code, out, err = _run(monkeypatch, capsys, "simulate", p)
    assert code == 0, err
    text = " ".join(out.split())
    assert "a latency 5.000, TTFT -, TPOT -; b latency 0.050, TTFT -, TPOT 0.010" in text, out
    code, out, err = _run(monkeypatch, capsys, "simulate", EXAMPLES / "workload.toml")
    assert "SLOs (s): latency 2.000, TTFT 1.500, TPOT 0.100;" in " ".join(out.split())  # one set: shown once


def test_capacity_refusal_quotes_the_candidates_nearest_to_fitting(monkeypatch, capsys, tmp_path):
    """Llama-2-70B on up to 4 L4 / A10G: the refusal quoted the first two reasons in alphabetical order, "largest
    shard 137.95 GB" (the whole model on one GPU) twice without naming a GPU, hiding that TP 4 still needs 34.49 GB
    of a 24 GB GPU; it names the nearest candidates now."""
    p = tmp_path / "w.toml"
    p.write_text('[workload]\nduration_s = 30\ntotal_rate_per_s = 1\nslo_s = 5\n[capacity]\ngpus = ["A10G", "L4"]\n'
                 'max_gpus = 4\n[[models]]\nname = "a"\nmodel = "llama-2-70b"\n')
    code, _, err = _run(monkeypatch, capsys, "capacity", p)
    text = " ".join(err.split())
    assert code == 2 and "capacity.gpus" in text and "Traceback" not in text, err
    assert "the nearest: L4 TP 4 x PP 1: largest shard 34.49 GB >" in text and "137.95" not in text, err


@pytest.mark.parametrize("text, field, fix", [
    ('[workload]\nmax_new_tokens = 300\n', "scheduler.kv_cache_len", "raise kv_cache_len or shorten the requests"),
    ('[workload]\noffline = true\ntrace = "t.csv"\n', "workload.offline", "drop one of them"),
    ('[workload]\nduration_s = 100000\ntotal_rate_per_s = 100\n', "workload.duration_s", "shorten duration_s"),
    ('[scheduler]\npreload = ["z"]\n', "scheduler.preload", "name models of the [[models]] entries: a"),
    ('[[models]]\nname = "a"\nmodel = "opt-1.3b"\n', "models", "give each [[models]] entry its own name"),
])
def test_checks_across_fields_name_the_field_and_the_fix(monkeypatch, capsys, tmp_path, text, field, fix):
    """The workload file's checks across sections were refused as 'error: (top level): ...' with the fix 'correct
    the values it names'; they name the field and say the fix now."""
    p = tmp_path / "w.toml"
    p.write_text('[cluster]\ngpu = "A100-SXM-80GB"\n[[models]]\nname = "a"\nmodel = "opt-1.3b"\n' + text)
    code, _, err = _run(monkeypatch, capsys, "simulate", p)
    text = " ".join(err.split())
    assert code == 2 and f"error: {field}: " in text and f"fix: {fix}" in text and "top level" not in text, err


def test_an_unknown_policy_option_is_named_as_given(monkeypatch, capsys):
    """``--policy fifo`` was refused as the file's field (``error: scheduler.policy``), which the file did not set."""
    for policy in ("fifo", ""):
        code, _, err = _run(monkeypatch, capsys, "simulate", EXAMPLES / "workload.toml", "--policy", policy)
        assert code == 2 and "error: --policy: unknown policy" in err and "lru, load_aware" in err, err


def test_capacity_table_without_dedicated_replicas_and_one_gpu(monkeypatch, capsys, tmp_path):
    """examples/serve/capacity.toml picks one shared group: the text printed an empty table titled "no dedicated
    replicas" (a header of 8 columns and no row); and one GPU was "1 GPUs"."""
    code, out, err = _run(monkeypatch, capsys, "capacity", EXAMPLES / "capacity.toml")
    assert code == 0, err
    assert "no dedicated replicas: the models share replica groups" in out and "load/s" not in out
    p = tmp_path / "w.toml"
    p.write_text('[cluster]\ngpu = "A100-SXM-80GB"\n[workload]\nduration_s = 5\n[[models]]\nname = "a"\n'
                 'model = "opt-1.3b"\nrate_per_s = 2\n')
    code, out, err = _run(monkeypatch, capsys, "simulate", p)
    assert code == 0 and "energy on 1 GPU:" in out, err


def test_a_trace_starts_at_its_first_request(monkeypatch, capsys, tmp_path):
    """A slice of a longer trace, its 3 requests at 1,000-1,001 s, was counted from t = 0: 0.003 requests/s over
    1,001 s with 83.7 kJ of idle GPU before the first request, and capacity planned for that rate; it reports what
    the same trace starting at 0 does."""
    reports = []
    for t0 in (0.0, 1000.0):
        (tmp_path / "t.csv").write_text("arrival_s,model\n" + "".join(f"{t0 + t},a\n" for t in (0.0, 0.5, 1.0)))
        p = tmp_path / "w.toml"
        p.write_text('[cluster]\ngpu = "A100-SXM-80GB"\n[workload]\ntrace = "t.csv"\n[[models]]\nname = "a"\n'
                     'model = "opt-1.3b"\n')
        code, out, err = _run(monkeypatch, capsys, "simulate", p, "--json")
        assert code == 0, err
        reports.append(json.loads(out))
    early, late = reports
    assert late["duration_s"] == pytest.approx(early["duration_s"]) and late["duration_s"] < 2
    assert late["all"]["throughput_per_s"] == pytest.approx(early["all"]["throughput_per_s"])
    assert late["all"]["throughput_per_s"] > 1
    assert late["energy"]["energy_j"] == pytest.approx(early["energy"]["energy_j"])
    from hetplan.serve.config import load_workload_config
    from hetplan.serve.replica import workload_requests

    assert [r.arrival_s for r in workload_requests(load_workload_config(p))] == [0.0, 0.5, 1.0]


def test_capacity_trace_rate_is_over_the_span_of_its_arrivals(monkeypatch, capsys, tmp_path):
    """A trace of 10 requests 1 s apart (at 1,000..1,009 s) arrives at 1 request/s: 9 gaps over its 9 s span.
    The load was 10 requests / 9 s = 1.11/s (n over the span of n points)."""
    (tmp_path / "t.csv").write_text("arrival_s,model\n" + "".join(f"{1000 + i},a\n" for i in range(10)))
    p = tmp_path / "w.toml"
    p.write_text(BASE.replace("memory_bytes = 30_000_000_000\n", "").replace("duration_s = 10\n", "")
                 .replace("total_rate_per_s = 1", 'trace = "t.csv"'))
    code, out, err = _run(monkeypatch, capsys, "capacity", p, "--json")
    assert code == 0, err
    assert json.loads(out)["load_per_s"] == {"a": pytest.approx(1.0)}


def test_capacity_plans_for_the_declared_rates(monkeypatch, capsys, tmp_path):
    """capacity's λ_m is the rate the workload declares, not the count its seeded draw happens to hold: at 1
    request/s over 10 s the draw holds 9 requests, and the load read 0.9/s (examples/serve/capacity.toml's
    3 requests/s read 2.5/s)."""
    p = tmp_path / "w.toml"
    p.write_text(BASE.replace("memory_bytes = 30_000_000_000\n", "") + 'rate_per_s = 0.75\n[[models]]\nname = "b"\n'
                 'model = "opt-1.3b"\n')
    code, out, err = _run(monkeypatch, capsys, "capacity", p, "--json")
    assert code == 0, err
    assert json.loads(out)["load_per_s"] == {"a": pytest.approx(0.75), "b": pytest.approx(1.0)}
