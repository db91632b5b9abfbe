"""Training logs into measured runs for ``hetplan calibrate``: a Megatron-LM log or a torchtitan log becomes one
RUNS row (:data:`hetplan.calibration.user.COLUMNS` + ``step_time_s``, ``memory_gib``).

* **Megatron-LM** (and Megatron-DeepSpeed, NeMo's Megatron path): the argument block that
  ``megatron/training/arguments.py`` prints at start (``------------------------ arguments ---------------------``,
  one ``  name ....... value`` line per argument, ``---- end of arguments ----``) gives the layout; the
  ``training_log`` lines of ``megatron/training/training.py`` (``iteration N/ M | … | elapsed time per iteration
  (ms): X | …``) the step time; ``memory (MB) | … | max reserved: X`` (``report_memory``) the memory. The ZeRO
  stage: :func:`_megatron_zero`; the FP8 recipe: :data:`MEGATRON_FP8_RECIPES`; token dropping:
  ``moe_expert_capacity_factor`` and ``moe_pad_expert_input_to_capacity``; multi-token prediction:
  ``mtp_num_layers``.
* **torchtitan**: the metrics line of ``torchtitan/components/metrics.py`` (``step: N  loss: …  memory: X GiB(…%)
  tps: T …``; ``tps`` is tokens/s per GPU: the tokens of the step over time × non-data-parallel size), the start
  line ``Training starts at step 1, with local batch size B, global batch size G, sequence length S`` and the mesh
  line of ``torchtitan/distributed/parallel_dims.py``: ``Building K-D device mesh with [names], [sizes]``
  (v0.1-v0.2) or ``Building device mesh with parallelism: pp=…, dp_replicate=…, dp_shard=…, cp=…, tp=…, ep=…``
  (since 2026; v0.2 with EP names ``dp_shard_mod_ep`` and ``dp_shard_in_ep``, whose product is ``dp_shard``, and
  EP = ``dp_shard_in_ep``·CP·TP, expert-TP 1 as hetplan's export runs it); step time = G·S / (T·GPUs).
  ``dp_shard`` above 1 is FSDP2 (ZeRO-3), with ``dp_replicate`` above 1 too HSDP (``fsdp_shard`` =
  ``dp_shard``); ``dp_shard`` 1 is DDP (ZeRO-0). The job lines: ``Compiling each
  TransformerBlock with torch.compile`` (``torch_compile``), ``Float8 tensorwise scaled training active``
  (v0.1-v0.2) or ``Float8 training active with recipe R`` (``dtype`` fp8, ``fp8_recipe`` R;
  ``torchtitan/components/quantization/float8.py``); torchao's MXFP8 linear layers (``MX training active with
  recipe mxfp8…`` in v0.2, ``Converted Linear layers to MXFP8Linear`` in 0.3, ``mx.py``): ``fp8_recipe`` mxfp8. Other
  MX or NVFP4 runs (4-bit) are refused: not a job hetplan prices.

The step time is the median over the logged lines that average no iteration among the process's first
:data:`WARMUP_ITERATIONS` (compilation, allocator and NCCL warm-up; :func:`_median_after_warmup`: with
``--log-interval 100`` the first line, with a line per iteration the first three); a log of no other line is
refused. What a log does not say (the model preset, the GPU type, the node) comes from
``hetplan calibrate``'s flags.
"""

from __future__ import annotations

import re
import statistics

from hetplan.errors import HetplanError

#: Logged iterations skipped before the median: the first ones carry compilation and warm-up.
WARMUP_ITERATIONS = 3

_ARG = re.compile(r"^\s*(?:\S+\s+)?([A-Za-z_][A-Za-z0-9_]*) \.+ (.*?)\s*$")
#: A number is read only where the framework wrote something after it (Megatron's ``|``, the line's end,
#: torchtitan's next field): a log cut mid-line (a killed job, a copied tail) ends in a number cut short, and its
#: last ``elapsed time per iteration (ms): 42`` (of 4200.0) halved the median of two steps (fuzz).
_MEGATRON_STEP = re.compile(r"iteration\s+(\d+)\s*/\s*\d+\s*\|.*?elapsed time per iteration \(ms\):\s*([0-9.]+)\s*\|")
_MEGATRON_MEMORY = re.compile(r"max reserved:\s*([0-9.]+)(?=\s)")
#: The first line of Megatron-LM's argument block (``megatron/training/arguments.py`` ``_print_args``).
_MEGATRON_ARGS = re.compile(r"^-+ arguments -+\s*$", re.MULTILINE)
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_TITAN_STEP = re.compile(r"step:\s*(\d+).*?memory:\s*([0-9.]+)\s*GiB.*?tps:\s*([0-9,]+)(?=\s)")
_TITAN_START = re.compile(r"local batch size (\d+), global batch size (\d+),.*?sequence length (\d+)")
_TITAN_MESH = re.compile(r"Building \d+-D device mesh with \[([^\]]*)\], \[([^\]]*)\]")
_TITAN_MESH_DEGREES = re.compile(r"Building device mesh with parallelism: ((?:\w+=\d+,?\s*)+)")
_TITAN_COMPILE = "Compiling each TransformerBlock with torch.compile"
_TITAN_FLOAT8 = re.compile(r"Float8 (tensorwise) scaled training active|Float8 training active with recipe (\w+)")
#: torchao's MXFP8 linear layers: v0.2's ``MX training active with recipe mxfp8...`` (``mx.py`` MXLinear, the
#: ``mxfp8`` / ``mxfp8_cublas`` / ``mxfp8_cublas_rceil`` recipes) and 0.3's ``Converted Linear layers to MXFP8Linear``
_TITAN_MXFP8 = re.compile(r"MX training active with recipe mxfp8|Converted Linear layers to MXFP8Linear")
#: any other MX / NVFP4 run (MXFP4, NVFP4): not a job hetplan prices
_TITAN_MX = re.compile(r"MX training active|Float8 training active with recipe mx|NVFP4")


def _is_megatron(text: str) -> bool:
    """Whether ``text`` is a Megatron-LM log: its argument block's first or last line (a log cut inside the block
    has only the first)."""
    return "end of arguments" in text or bool(_MEGATRON_ARGS.search(text))


def is_log(text: str) -> bool:
    """Whether ``text`` is a Megatron-LM or torchtitan training log (rather than a RUNS CSV): any line either
    framework writes that a log cut short or stopped before its first step still has (such a log was read as a
    CSV, and refused for its "unknown column(s) using torch.bfloat16 …")."""
    text = _ANSI.sub("", text)
    return _is_megatron(text) or any(r.search(text) for r in (_TITAN_STEP, _TITAN_START, _TITAN_MESH,
                                                               _TITAN_MESH_DEGREES))


def _median_after_warmup(points: list[tuple[int, float]], origin: str, what: str) -> float:
    """Median of the values of the logged lines ``(iteration, value)`` that average no warm-up iteration.

    A line logged at iteration ``i`` averages the iterations since the previous line (Megatron-LM's
    ``elapsed time per iteration`` over ``--log-interval`` iterations, ``megatron/training/training.py``
    ``training_log``; torchtitan's ``tps`` over the steps since its last metrics line, which it writes at step 1
    and every ``metrics.log_freq`` steps, ``torchtitan/components/metrics.py`` ``should_log``). The process
    started at the first line's iteration less the log interval (that of the last two lines; 0 at the least):
    a line is kept when the line before it is at least :data:`WARMUP_ITERATIONS` iterations past that start.

    Raises:
        HetplanError: no line, or none but warm-up (``RUNS``)."""
    if not points:
        raise HetplanError(f"{origin} has no {what} lines", field="RUNS",
                           fix="give the log of a run that logged training iterations")
    iterations = [i for i, _ in points]
    interval = iterations[-1] - iterations[-2] if len(points) > 1 else iterations[0]
    start = max(0, iterations[0] - max(interval, 1))
    kept = [v for prev, (_, v) in zip([start, *iterations[:-1]], points) if prev - start >= WARMUP_ITERATIONS]
    if not kept:  # its last was taken: torchtitan's step 1 (compilation) read 5.8x the step
        raise HetplanError(f"{origin} has {len(points)} {what} line(s) up to iteration {iterations[-1]}, each "
                           f"averaging some of the first {WARMUP_ITERATIONS} iterations (compilation and allocator "
                           "warm-up)", field="RUNS",
                           fix="give a log with lines logged after those iterations, or write the run as a CSV row")
    return statistics.median(kept)


#: Megatron-FSDP's ``--data-parallel-sharding-strategy`` -> ZeRO stage (``megatron/training/arguments.py``; default
#: ``optim_grads_params``): what hetplan's Megatron export writes for ZeRO 0-3 (docs/runtime.md).
MEGATRON_FSDP_ZERO = {"no_shard": "0", "optim": "1", "optim_grads": "2", "optim_grads_params": "3"}
#: Megatron-LM's ``--fp8-recipe`` -> :attr:`hetplan.plan.Job.fp8_recipe` (``tensorwise`` is Transformer Engine's
#: current scaling); ``mxfp8`` and ``blockwise`` take the stack's default.
MEGATRON_FP8_RECIPES = {"delayed": "delayed", "tensorwise": "current"}


def _megatron_zero(get) -> str:
    """The ZeRO stage of a Megatron-LM argument block: Megatron-FSDP (``use_megatron_fsdp``, before it
    ``use_custom_fsdp``) by its sharding strategy, PyTorch FSDP2 (``use_torch_fsdp2``) 3, the distributed
    optimizer 1, else 0."""
    if "True" in (get("use_megatron_fsdp"), get("use_custom_fsdp")):
        return MEGATRON_FSDP_ZERO.get(get("data_parallel_sharding_strategy") or "optim_grads_params", "3")
    if get("use_torch_fsdp2") == "True":
        return "3"
    return "1" if get("use_distributed_optimizer") == "True" else "0"


def megatron_row(text: str, origin: str) -> dict[str, str]:
    """The RUNS row of a Megatron-LM log (module doc).

    Raises:
        HetplanError: no argument block, or no iteration lines.
    """
    if "end of arguments" not in text:
        raise HetplanError(f"{origin} has no whole Megatron-LM argument block (its '---- arguments ----' line "
                           "without '---- end of arguments ----': the log is cut short)", field="RUNS",
                           fix="give the whole log from the start of the run (it prints the arguments first)")
    block = _MEGATRON_ARGS.split(text, 1)[-1]
    block = block.split("end of arguments", 1)[0]
    args = {m.group(1): m.group(2) for line in block.splitlines() if (m := _ARG.match(line))}

    def get(name: str, default: str = "") -> str:
        v = args.get(name, default)
        return "" if v in ("None", "none") else v

    tp, pp, cp = (int(get(k, "1") or 1) for k in ("tensor_model_parallel_size", "pipeline_model_parallel_size",
                                                   "context_parallel_size"))
    row = {"framework": "megatron", "tp": str(tp), "pp": str(pp), "cp": str(cp),
           "ep": get("expert_model_parallel_size", "1") or "1", "mbs": get("micro_batch_size"),
           "global_batch": get("global_batch_size"), "seq_len": get("seq_length"), "gpus": get("world_size")}
    if row["gpus"]:
        world, model_parallel = int(row["gpus"]), tp * pp * cp
        if world % model_parallel:  # was floored into a DP degree, and refused with the fix "pin --use-gpus"
            raise HetplanError(f"{origin}: world_size {world} is not a multiple of TP {tp} x PP {pp} x CP {cp}, "
                               "so no data-parallel degree fits", field="RUNS",
                               fix="give the log as Megatron-LM wrote it, or write the run as a CSV row")
        row["dp"] = str(world // model_parallel)
    vp = get("virtual_pipeline_model_parallel_size")
    if vp:
        row["virtual_stages"] = vp
    granularity = get("recompute_granularity")
    row["recompute"] = granularity or "none"
    row["dtype"] = "fp8" if get("fp8") else "bf16" if get("bf16") == "True" else "fp16" if get("fp16") == "True" else "fp32"
    row["zero"] = _megatron_zero(get)
    if row["dtype"] == "fp8" and (recipe := MEGATRON_FP8_RECIPES.get(get("fp8_recipe"))):
        row["fp8_recipe"] = recipe
    capacity = get("moe_expert_capacity_factor")
    if capacity and float(capacity) >= 0:  # token dropping (a negative factor is Megatron-Core's dropless)
        row["moe_capacity_factor"] = capacity
        row["moe_pad_to_capacity"] = "true" if get("moe_pad_expert_input_to_capacity") == "True" else "false"
    if get("mtp_num_layers") not in ("", "0"):
        row["mtp_layers"] = get("mtp_num_layers")
    steps = [(int(i), float(x) / 1e3) for i, x in _MEGATRON_STEP.findall(text)]
    row["step_time_s"] = repr(_median_after_warmup(steps, origin, "'elapsed time per iteration (ms)'"))
    mem = _MEGATRON_MEMORY.findall(text)
    if mem:
        row["memory_gib"] = repr(max(float(x) for x in mem) / 1024)
    return {k: v for k, v in row.items() if v}


def torchtitan_row(text: str, origin: str) -> dict[str, str]:
    """The RUNS row of a torchtitan log (module doc).

    Raises:
        HetplanError: no metrics lines, or no start line (batch and sequence length).
    """
    text = _ANSI.sub("", text)
    steps = _TITAN_STEP.findall(text)
    start = _TITAN_START.search(text)
    if start is None:
        raise HetplanError(f"{origin} has no 'Training starts at step …, with local batch size …' line",
                           field="RUNS", fix="give the log from the start of the run, or write the run as a CSV row")
    local, gbs, seq = (int(x) for x in start.groups())
    row = {"framework": "fsdp", "mbs": str(local), "global_batch": str(gbs), "seq_len": str(seq)}
    dims = _titan_mesh(text)
    if dims:
        gpus = 1
        for name, size in dims.items():
            if name != "ep":  # the expert mesh folds into the others (efsdp = dp_shard·cp·tp / ep)
                gpus *= size
        for name in ("tp", "pp", "cp", "ep"):
            if name in dims:
                row[name] = str(dims[name])
        shard, replicate = dims.get("dp_shard", 1), dims.get("dp_replicate", 1) * dims.get("dp", 1)
        row["dp"] = str(shard * replicate)
        row["gpus"] = str(gpus)
        row["zero"] = "3" if shard > 1 else "0"
        if shard > 1 and replicate > 1:
            row["fsdp_shard"] = str(shard)
    if _TITAN_MXFP8.search(text):  # torchao's MXFP8 linear layers (hetplan.estimate.fp8, fp8_recipe mxfp8)
        row["dtype"], row["fp8_recipe"] = "fp8", "mxfp8"
    elif _TITAN_MX.search(text):
        raise HetplanError(f"{origin} is an MX / NVFP4 run other than MXFP8 (MXFP4, NVFP4): torchao's 4-bit linear "
                           "layers are not a job hetplan prices",
                           field="RUNS", fix="calibrate with the bf16, float8 or MXFP8 runs of the stack")
    if _TITAN_COMPILE in text:
        row["torch_compile"] = "true"
    if float8 := _TITAN_FLOAT8.search(text):
        row["dtype"] = "fp8"
        row["fp8_recipe"] = float8.group(1) or float8.group(2)
    tps = _median_after_warmup([(int(i), float(t.replace(",", ""))) for i, _, t in steps], origin, "'step: … tps:'")
    row["tokens_per_s_per_gpu"] = repr(tps)
    row["memory_gib"] = repr(max(float(m) for _, m, _ in steps))
    return row


def _titan_mesh(text: str) -> dict[str, int]:
    """The parallel degrees a torchtitan log's mesh line names (module doc), by name; empty without one."""
    if mesh := _TITAN_MESH.search(text):
        names = [n.strip(" '\"") for n in mesh.group(1).split(",")]
        dims = dict(zip(names, (int(x) for x in mesh.group(2).split(","))))
        if "dp_shard_mod_ep" in dims:  # v0.2 with EP: dp_shard split around the experts, expert-TP 1
            inside = dims.pop("dp_shard_in_ep", 1)
            dims["dp_shard"] = dims.pop("dp_shard_mod_ep") * inside
            dims["ep"] = inside * dims.get("cp", 1) * dims.get("tp", 1)
        return dims
    if mesh := _TITAN_MESH_DEGREES.search(text):
        return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", mesh.group(1))}
    return {}


def log_row(text: str, origin: str) -> dict[str, str]:
    """The RUNS row of a Megatron-LM or torchtitan log. A torchtitan row carries ``tokens_per_s_per_gpu``
    until the GPU count is known (:func:`finish_row`).

    Raises:
        HetplanError: naming RUNS and the file: a damaged number in the log (``inf`` or ``0.0`` as a parallel
            size, a zero degree; fuzz: int('inf') and a division by zero were tracebacks)."""
    try:
        return megatron_row(text, origin) if _is_megatron(text) else torchtitan_row(text, origin)
    except HetplanError:
        raise
    except (ValueError, ZeroDivisionError, OverflowError) as exc:
        raise HetplanError(f"{origin}: a number in the log cannot be read ({exc})", field="RUNS",
                           fix="give the log as the framework wrote it, or write the run as a CSV row") from None


def finish_row(row: dict[str, str], origin: str) -> dict[str, str]:
    """Turn a torchtitan row's tokens/s per GPU into ``step_time_s`` once ``gpus`` is known (from the log's mesh
    or the flags).

    Raises:
        HetplanError: the GPU count is unknown.
    """
    tps = row.pop("tokens_per_s_per_gpu", None)
    if tps is None:
        return row
    if not row.get("gpus"):
        raise HetplanError(f"{origin} does not say how many GPUs ran", field="--gpus",
                           fix="pass --gpus N (the world size of the run)")
    try:
        row["step_time_s"] = repr(int(row["global_batch"]) * int(row["seq_len"]) / (float(tps) * int(row["gpus"])))
    except (ValueError, ZeroDivisionError, OverflowError) as exc:
        raise HetplanError(f"{origin}: no step time from tokens/s {tps} on {row['gpus']} GPUs ({exc})", field="RUNS",
                           fix="give a log with positive tokens/s, or pass --gpus N") from None
    return row
