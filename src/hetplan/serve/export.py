"""Launch a serving plan on real engines: one vLLM or SGLang launch command per replica, and a router config.

``hetplan capacity WORKLOAD.toml --export vllm|sglang --out-dir D`` turns the cheapest mix into replicas (each
model's replicas on their own GPUs, Mélange's setting, and the groups of models that share GPUs, with the
engines' weight swapping below); ``hetplan simulate WORKLOAD.toml --export ...`` turns the
shared cluster of a Computron-style workload into one engine instance per model on the same GPUs, with the
engines' form of weight swapping switched on: vLLM's ``--enable-sleep-mode`` (an instance put to sleep offloads
its weights to host memory and drops its KV cache, and wakes up on demand) and SGLang's ``--enable-memory-saver``
with ``--enable-weights-cpu-backup`` (``release_memory_occupation`` / ``resume_memory_occupation``).

What each flag carries (the plan's own numbers, nothing re-derived):

==============================  ===============================  ==========================================
plan                            vLLM                             SGLang
==============================  ===============================  ==========================================
model (``hf_model``)            ``serve MODEL``                  ``--model-path``
served name                     ``--served-model-name``          ``--served-model-name``
TP, PP                          ``--tensor-parallel-size``,      ``--tp-size``, ``--pp-size``
                                ``--pipeline-parallel-size``
max running sequences           ``--max-num-seqs``               ``--max-running-requests``
  (``max_batch_size``, else
  the engine's default)
``scheduler.kv_cache_len``      ``--max-model-len``              ``--context-length``
  (at most the model's
  positions)
``cluster.memory_fraction``     ``--gpu-memory-utilization``     ``--mem-fraction-static``
  (a shared GPU: the model's
  share of the memory)
``scheduler.kv_block_tokens``   ``--block-size``                 ``--page-size``
``max_batched_tokens``          ``--max-num-batched-tokens``     ``--max-prefill-tokens``
``chunked_prefill``             ``--enable-chunked-prefill``     ``--chunked-prefill-size`` (N, or -1: off)
weight dtype                    ``--dtype``, ``--quantization``  ``--dtype``, ``--quantization``
port                            ``--port``                       ``--port``
==============================  ===============================  ==========================================

Flag names and types were checked against the engines' argument parsers: vLLM ``vllm/engine/arg_utils.py``
``EngineArgs.add_cli_args`` at commit 001999d2f360 (vLLM v0.7 line, early 2025: ``--block-size`` choices 8, 16, 32,
64, 128; ``--enable-sleep-mode``; ``--quantization`` from ``QUANTIZATION_METHODS``) and SGLang
``python/sglang/srt/server_args.py`` ``ServerArgs`` at commit 001067fffe33 (2026: flags are the field names,
``tp_size`` -> ``--tp-size``; ``--enable-memory-saver``, ``--enable-weights-cpu-backup``). :func:`parse_args`
reads the written arguments back with the same names and types, which the tests use to check them against the
plan.

The router is a LiteLLM proxy config (``router.yaml``; https://docs.litellm.ai/docs/proxy/configs): every
replica is one deployment of its model name at ``http://HOST:PORT/v1`` (an OpenAI-compatible server, which both
engines start), with ``rpm`` = 60 x the rate the replica sustains in the plan, so LiteLLM's default
``simple-shuffle`` routing spreads a model's requests over its replicas in proportion to their capacity.

**Placement** (:func:`place_replicas`): the replicas of each GPU type are packed first-fit, in plan order, onto
machines of ``gpus_per_host`` GPUs (``--gpus-per-host``, default 8, an HGX/DGX board), a replica never split
over machines (one engine instance is one process group on one machine here); each script exports
``CUDA_VISIBLE_DEVICES`` with its replica's GPUs on its machine. Instances sharing GPUs (sleep mode) all get
the same GPUs of one machine. Machine k's address is the k-th ``--host``; without ``--host`` a plan on one
machine is written for 127.0.0.1 and a plan on several for placeholders ``machine-K`` (to be resolved, e.g. in
``/etc/hosts``, or replaced). An instance on a non-loopback address binds ``--host 0.0.0.0`` (SGLang binds
127.0.0.1 by default, so a router elsewhere could not reach it).

This module does not import torch.
"""

from __future__ import annotations

import argparse
import json
import shlex
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Sequence

from hetplan.errors import HetplanError

#: Engines ``--export`` writes for.
EXPORT_ENGINES = ("vllm", "sglang")
#: The parser versions the flags were checked against (module docstring).
CHECKED_AGAINST = {
    "vllm": "vllm-project/vllm vllm/engine/arg_utils.py @ 001999d2f360 (v0.7 line, 2025)",
    "sglang": "sgl-project/sglang python/sglang/srt/server_args.py @ 001067fffe33 (2026)",
}
#: ``--block-size`` choices of vLLM's parser (arg_utils.py at the commit above).
VLLM_BLOCK_SIZES = (8, 16, 32, 64, 128)
#: Serving dtype -> the engines' ``--dtype`` value (both parsers accept these choices).
_DTYPE = {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32"}
#: Weight dtype -> ``--quantization`` method: FP8 is quantized online from 16-bit weights by both engines
#: (vLLM ``fp8``, SGLang ``fp8``); INT8 and INT4 need pre-quantized checkpoints: SGLang ``w8a8_int8``, AWQ for INT4
#: (vLLM ``awq``, SGLang ``awq``); vLLM reads INT8 (W8A8) from a compressed-tensors checkpoint's config.
_QUANT = {"vllm": {"fp8": "fp8", "int8": "compressed-tensors", "int4": "awq"},
          "sglang": {"fp8": "fp8", "int8": "w8a8_int8", "int4": "awq"}}


@dataclass
class Replica:
    """One engine instance of a serving plan.

    Attributes:
        name: served model name (the API name). model: what the engine loads (Hugging Face repository or path).
        gpu: GPU type; tp, pp: its TP x PP workers. index: replica number within the model.
        port: HTTP port. max_num_seqs: running sequences at most. max_model_len: longest sequence (tokens).
        gpu_memory_utilization: fraction of each GPU's memory the instance may use.
        dtype: 16/32-bit activation dtype; weights: weight dtype (``fp8``/``int8``/``int4`` -> quantization).
        block_tokens: KV block size; max_batched_tokens, chunked_prefill: the per-step token budget.
        sleep: several models share these GPUs (sleep mode / memory saver).
        rate_per_s: requests per second the replica sustains in the plan (0: not planned for a rate).
        argv: its launch command (:func:`engine_args`).
        machine, host, devices: the machine it runs on (number and address) and its GPUs there
            (:func:`place_replicas`; ``CUDA_VISIBLE_DEVICES``).
        group: with ``sleep``, the shared replica group: instances of one group run on the same GPUs.
    """

    name: str
    model: str
    gpu: str
    tp: int
    pp: int
    index: int
    port: int
    max_num_seqs: int
    max_model_len: int
    gpu_memory_utilization: float
    dtype: str
    weights: str | None = None
    block_tokens: int = 16
    max_batched_tokens: int | None = None
    chunked_prefill: bool = False
    sleep: bool = False
    rate_per_s: float = 0.0
    argv: list[str] = field(default_factory=list)
    machine: int = 0
    host: str = "127.0.0.1"
    devices: list[int] = field(default_factory=list)
    group: int = 0


def _max_model_len(entry, kv_cache_len: int) -> int:
    """The longest sequence an engine instance of ``entry`` serves: ``scheduler.kv_cache_len``, at most the model's
    positions (``max_position_embeddings``): vLLM refuses a ``--max-model-len`` above them ("User-specified
    max_model_len is greater than the derived max_model_len", ``vllm/config``) and no request is longer
    (:func:`hetplan.serve.replica.check_context`)."""
    return min(kv_cache_len, entry.spec().max_seq_len)


def _model_path(entry) -> str:
    """What the engine loads: ``hf_model``, else the ``model`` value (a config.json's folder)."""
    if entry.hf_model:
        return entry.hf_model
    return str(Path(entry.model).parent) if entry.model.endswith(".json") else entry.model


def replicas_from_capacity(wf, out: dict, base_port: int = 8000) -> list[Replica]:
    """The replicas of a :func:`hetplan.serve.capacity.plan_capacity` result, one per (model, configuration,
    replica), then one instance per model of each shared group (sleep mode / memory saver on, each allowed its
    simulated footprint's share of the GPU memory, planned for its model's whole load), ports from ``base_port``
    up."""
    s, c = wf.scheduler, wf.cluster
    entries = {m.name: m for m in wf.models}
    reps: list[Replica] = []
    for row in out["mix"]:
        for j in range(row["replicas"]):
            e = entries[row["model"]]
            reps.append(Replica(e.name, _model_path(e), row["gpu"], row["tp"], row["pp"], j, base_port + len(reps),
                                row.get("max_num_seqs", s.max_batch_size), _max_model_len(e, s.kv_cache_len),
                                c.memory_fraction, c.dtype, row.get("weights"),
                                row["kv_block_tokens"] or 16, row["max_batched_tokens"], row["chunked_prefill"],
                                False, float(row["rate_per_s"])))
    for g, row in enumerate(out.get("shared", [])):  # models sharing one replica group by swapping
        for name in row["models"]:
            e = entries[name]
            share = min(c.memory_fraction, row["footprint_bytes"][name] / row["gpu_memory_bytes"])
            reps.append(Replica(e.name, _model_path(e), row["gpu"], row["tp"], row["pp"], 0, base_port + len(reps),
                                row["max_num_seqs"], _max_model_len(e, s.kv_cache_len), round(share, 4), c.dtype,
                                row.get("weights"),
                                row["kv_block_tokens"] or 16, row["max_batched_tokens"], row["chunked_prefill"],
                                True, float(out["load_per_s"][name]), group=g))
    return reps


def replicas_from_cluster(wf, footprint_bytes: dict[str, int], gpu_memory_bytes: int,
                          base_port: int = 8000) -> list[Replica]:
    """One instance per model on the shared cluster of a workload file (``cluster.gpu`` x TP x PP), each allowed
    the share of the GPU memory its weights and KV pool take in the simulation (``footprint_bytes`` per worker),
    with sleep mode / memory saver on when there are several models."""
    from hetplan.hardware.catalog import load_catalog
    from hetplan.serve.replica import cluster_stack, kv_settings, max_running

    stack = cluster_stack(wf)
    kv = kv_settings(wf, stack)
    seqs = max_running(wf, stack, load_catalog().get(wf.cluster.gpu, field="cluster.gpu") if wf.cluster.gpu else None)
    s, c = wf.scheduler, wf.cluster
    shared = len(wf.models) > 1
    reps = []
    for i, e in enumerate(wf.models):
        share = min(c.memory_fraction, footprint_bytes[e.name] / gpu_memory_bytes) if shared else c.memory_fraction
        reps.append(Replica(e.name, _model_path(e), c.gpu or "", c.tp, c.pp, 0, base_port + i, seqs,
                            _max_model_len(e, s.kv_cache_len), round(share, 4), c.dtype, c.quantization,
                            kv.block_tokens or 16,
                            kv.max_batched_tokens, kv.chunked_prefill, shared))
    return reps


def place_replicas(replicas: Sequence[Replica], gpus_per_host: int = 8,
                   hosts: Sequence[str] | None = None) -> int:
    """Give every replica its machine, address and GPUs (module docstring); returns the number of machines.

    Raises:
        HetplanError: a replica wider than a machine (``--gpus-per-host``), fewer ``--host`` addresses than
            machines, a bad ``gpus_per_host``.
    """
    if gpus_per_host < 1:
        raise HetplanError(f"gpus_per_host = {gpus_per_host}", field="--gpus-per-host", fix="give 1 or more")
    machines: list[tuple[str, int]] = []  # (GPU type, GPUs used)
    shared: dict[int, int] = {}  # shared group -> the machine its sleep-mode instances share
    for r in replicas:
        n = r.tp * r.pp
        if n > gpus_per_host:
            raise HetplanError(f"replica {r.index} of {r.name} needs {n} GPUs ({r.gpu}, TP {r.tp} x PP {r.pp}), "
                               f"more than a machine of {gpus_per_host}", field="--gpus-per-host",
                               fix=f"give --gpus-per-host {n} or more (a replica runs on one machine here), or "
                                   f"plan with at most {gpus_per_host} GPUs per replica (capacity.max_gpus, TP x PP)")
        if r.sleep and r.group in shared:
            r.machine = shared[r.group]
            r.devices = list(range(n))
            continue
        k = next((i for i, (g, used) in enumerate(machines)
                  if g == r.gpu and used + n <= gpus_per_host and not r.sleep), None)
        if k is None:
            machines.append((r.gpu, 0))
            k = len(machines) - 1
        used = machines[k][1]
        r.machine, r.devices = k, list(range(used, used + n))
        machines[k] = (r.gpu, used + n)
        if r.sleep:
            shared[r.group] = k
    if hosts and len(hosts) < len(machines):
        raise HetplanError(f"the plan runs on {len(machines)} machines but --host gives {len(hosts)} addresses",
                           field="--host", fix=f"give {len(machines)} comma-separated addresses, in machine order "
                                               "(or none: placeholders machine-0, machine-1, ...)")
    for r in replicas:
        r.host = (hosts[r.machine] if hosts else "127.0.0.1" if len(machines) == 1 else f"machine-{r.machine}")
    return len(machines)


def _loopback(host: str) -> bool:
    return host in ("127.0.0.1", "localhost", "::1")


def engine_args(engine: str, r: Replica) -> list[str]:
    """The launch command of replica ``r`` on ``engine`` (argv, program first).

    Raises:
        HetplanError: unknown engine, a KV block size vLLM's parser refuses, a weight dtype without a
            quantization method, or a dtype the engines do not name.
    """
    if engine not in EXPORT_ENGINES:
        raise HetplanError(f"unknown engine {engine!r} to export for", field="--export",
                           fix=f"use one of {', '.join(EXPORT_ENGINES)}")
    if r.dtype not in _DTYPE:
        raise HetplanError(f"dtype {r.dtype!r} has no engine name", field="cluster.dtype",
                           fix=f"use one of {', '.join(_DTYPE)}")
    quant = None
    if r.weights and r.weights not in ("fp16", "bf16", "fp32"):
        quant = _QUANT[engine].get(r.weights)
        if quant is None:
            raise HetplanError(f"{engine} has no quantization method for {r.weights} weights", field="quantization",
                               fix=f"use one of {', '.join(_QUANT[engine])} or 16-bit weights")
    if engine == "vllm":
        if r.block_tokens not in VLLM_BLOCK_SIZES:
            raise HetplanError(f"vLLM's --block-size takes {', '.join(map(str, VLLM_BLOCK_SIZES))}, not "
                               f"{r.block_tokens}", field="scheduler.kv_block_tokens", fix="use 16 (vLLM's default)")
        argv = ["vllm", "serve", r.model, "--served-model-name", r.name, "--tensor-parallel-size", str(r.tp),
                "--pipeline-parallel-size", str(r.pp), "--max-num-seqs", str(r.max_num_seqs), "--max-model-len",
                str(r.max_model_len), "--gpu-memory-utilization", f"{r.gpu_memory_utilization:g}", "--dtype",
                _DTYPE[r.dtype], "--block-size", str(r.block_tokens), "--port", str(r.port)]
        if quant:
            argv += ["--quantization", quant]
        if r.max_batched_tokens is not None:
            argv += ["--max-num-batched-tokens", str(r.max_batched_tokens)]
        if r.chunked_prefill:
            argv += ["--enable-chunked-prefill"]
        if r.sleep:
            argv += ["--enable-sleep-mode"]
        if not _loopback(r.host):
            argv += ["--host", "0.0.0.0"]
        return argv
    argv = ["python", "-m", "sglang.launch_server", "--model-path", r.model, "--served-model-name", r.name,
            "--tp-size", str(r.tp), "--pp-size", str(r.pp), "--max-running-requests", str(r.max_num_seqs),
            "--context-length", str(r.max_model_len), "--mem-fraction-static", f"{r.gpu_memory_utilization:g}",
            "--dtype", _DTYPE[r.dtype], "--page-size", str(r.block_tokens), "--port", str(r.port)]
    if quant:
        argv += ["--quantization", quant]
    if r.max_batched_tokens is not None:
        argv += ["--max-prefill-tokens", str(r.max_batched_tokens),
                 "--chunked-prefill-size", str(r.max_batched_tokens if r.chunked_prefill else -1)]
    if r.sleep:
        argv += ["--enable-memory-saver", "--enable-weights-cpu-backup"]
    if not _loopback(r.host):
        argv += ["--host", "0.0.0.0"]
    return argv


def _parser(engine: str) -> argparse.ArgumentParser:
    """The subset of the engine's own parser that :func:`engine_args` writes: same flag names and types."""
    p = argparse.ArgumentParser(prog=engine, add_help=False)
    if engine == "vllm":
        p.add_argument("model")
        p.add_argument("--served-model-name", nargs="+")
        p.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
        p.add_argument("--pipeline-parallel-size", "-pp", type=int, default=1)
        p.add_argument("--max-num-seqs", type=int)
        p.add_argument("--max-model-len", type=int)
        p.add_argument("--gpu-memory-utilization", type=float, default=0.9)
        p.add_argument("--dtype", choices=["auto", "half", "float16", "bfloat16", "float", "float32"])
        p.add_argument("--block-size", type=int, choices=list(VLLM_BLOCK_SIZES))
        p.add_argument("--port", type=int)
        p.add_argument("--quantization", "-q")
        p.add_argument("--max-num-batched-tokens", type=int)
        p.add_argument("--enable-chunked-prefill", action="store_true")
        p.add_argument("--enable-sleep-mode", action="store_true")
        p.add_argument("--host")
    else:
        p.add_argument("--model-path", "--model")
        p.add_argument("--served-model-name")
        p.add_argument("--tp-size", "--tensor-parallel-size", type=int, default=1)
        p.add_argument("--pp-size", "--pipeline-parallel-size", type=int, default=1)
        p.add_argument("--max-running-requests", type=int)
        p.add_argument("--context-length", type=int)
        p.add_argument("--mem-fraction-static", type=float)
        p.add_argument("--dtype", choices=["auto", "half", "float16", "bfloat16", "float", "float32"])
        p.add_argument("--page-size", type=int)
        p.add_argument("--port", type=int)
        p.add_argument("--quantization")
        p.add_argument("--max-prefill-tokens", type=int)
        p.add_argument("--chunked-prefill-size", type=int)
        p.add_argument("--enable-memory-saver", action="store_true")
        p.add_argument("--enable-weights-cpu-backup", action="store_true")
        p.add_argument("--host")
    return p


def parse_args(engine: str, argv: Sequence[str]) -> dict:
    """Read a command written by :func:`engine_args` back into ``{flag: value}`` (argparse, the engines' names and
    types; program words dropped).

    Raises:
        HetplanError: an argument the engine's parser would refuse.
    """
    argv = list(argv)
    skip = 2 if engine == "vllm" else 3  # "vllm serve" / "python -m sglang.launch_server"
    try:
        ns = _parser(engine).parse_args(argv[skip:])
    except SystemExit:
        raise HetplanError(f"{engine} would refuse {shlex.join(argv)}", field="--export",
                           fix="report this as a bug of hetplan's exporter") from None
    return vars(ns)


def _yaml_str(x) -> str:
    return json.dumps(x)  # a JSON string is a YAML flow scalar


def router_config(replicas: Sequence[Replica]) -> str:
    """LiteLLM proxy ``config.yaml`` text mapping each model name to its replicas at their hosts (module
    docstring)."""
    lines = ["# LiteLLM proxy config written by hetplan: `litellm --config router.yaml`",
             "# one deployment per engine replica; rpm = 60 x the requests/s it sustains in the plan", "model_list:"]
    for r in replicas:
        lines += [f"  - model_name: {_yaml_str(r.name)}",
                  "    litellm_params:",
                  f"      model: {_yaml_str('openai/' + r.name)}",
                  f"      api_base: {_yaml_str(f'http://{r.host}:{r.port}/v1')}",
                  '      api_key: "none"']
        if r.rate_per_s > 0:
            lines.append(f"      rpm: {max(1, int(r.rate_per_s * 60))}")
    lines += ["router_settings:", '  routing_strategy: "simple-shuffle"', ""]
    return "\n".join(lines)


def write_export(engine: str, replicas: Sequence[Replica], out_dir: str | Path, *,
                 hosts: Sequence[str] | None = None, gpus_per_host: int = 8, source: str = "") -> list[Path]:
    """Place the replicas (:func:`place_replicas`), then write ``replica-NNN-MODEL.sh`` per replica (its
    ``CUDA_VISIBLE_DEVICES`` and launch command), ``replicas.json`` (every replica with its machine, GPUs and
    argv) and ``router.yaml`` into ``out_dir`` (created); returns the paths written.

    Raises:
        HetplanError: ``out_dir`` is a file or cannot be created; as :func:`place_replicas` and
            :func:`engine_args`.
    """
    place_replicas(replicas, gpus_per_host, hosts)
    d = Path(out_dir)
    if d.exists() and not d.is_dir():
        raise HetplanError(f"{d} is a file, not a folder", field="--out-dir", fix="give a folder path")
    try:
        d.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise HetplanError(f"cannot create {d}: {exc.strerror or exc}", field="--out-dir",
                           fix="give a writable folder path") from None
    written = []
    for i, r in enumerate(replicas):
        r.argv = engine_args(engine, r)
        p = d / f"replica-{i:03d}-{r.name}.sh"
        head = (f"#!/bin/sh\n# hetplan {source}: model {r.name}, replica {r.index}, {r.gpu} x {r.tp * r.pp} "
                f"(TP {r.tp} x PP {r.pp})" + (f", planned for {r.rate_per_s:.3g} requests/s" if r.rate_per_s else "")
                + ("; shares its GPUs with other models (sleep mode)" if r.sleep else "")
                + f"\n# run on machine {r.machine} ({r.host}), its GPUs {','.join(map(str, r.devices))}"
                + f"\n# flags checked against {CHECKED_AGAINST[engine]}\n")
        p.write_text(head + f"export CUDA_VISIBLE_DEVICES={','.join(map(str, r.devices))}\n"
                     + "exec " + shlex.join(r.argv) + ' "$@"\n')
        p.chmod(0o755)
        written.append(p)
    manifest = {"engine": engine, "checked_against": CHECKED_AGAINST[engine], "source": source,
                "replicas": [asdict(r) for r in replicas]}
    (d / "replicas.json").write_text(json.dumps(manifest, indent=2) + "\n")
    (d / "router.yaml").write_text(router_config(replicas))
    return written + [d / "replicas.json", d / "router.yaml"]
