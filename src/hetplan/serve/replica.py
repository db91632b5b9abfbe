"""One serving replica as ``hetplan simulate`` and ``hetplan capacity`` price it: the requests and SLOs of a
``WORKLOAD.toml``, the engine stack and quantisation a replica runs (:class:`Stack`), its paged KV-cache settings and
pool, the iteration-time model of the cost model on the catalog GPU
(:class:`hetplan.serve.exec_model.EstimatedStepModel`, :mod:`hetplan.estimate.inference`), the swap model with the
GPU's host link, one simulation of the workload's cluster (:func:`simulate_workload`), and the energy of a
simulated run (:func:`serving_energy`, :mod:`hetplan.energy.inference`). :mod:`hetplan.serve.capacity` searches
over replicas built here.

This module does not import torch.
"""

from __future__ import annotations

from dataclasses import dataclass

from hetplan.errors import HetplanError, InfeasibleError
from hetplan.estimate.inference import (kv_cache_bytes_per_worker, kv_capacity_tokens, kv_windowed,
                                       weight_bytes_per_worker)
from hetplan.hardware.catalog import GPUSpec, load_catalog
from hetplan.hardware.engines import EngineSpec, load_engines
from hetplan.serve.config import WorkloadFile
from hetplan.serve.exec_model import EstimatedStepModel
from hetplan.serve.metrics import SLO
from hetplan.serve.policies import make_policy
from hetplan.serve.simulator import SimModel, SimResult, simulate, swap_cost_fn
from hetplan.serve.swap_model import SwapModel
from hetplan.serve.workload import (ModelLoad, Request, generate, model_rates, offline_arrivals, read_lengths,
                                    read_trace)


def workload_rates(wf: WorkloadFile) -> dict[str, float]:
    """Each model's arrival rate (requests/s) the workload declares: its ``rate_per_s``, else its Zipf share of
    ``total_rate_per_s`` (:func:`hetplan.serve.workload.model_rates`); a trace's come from its arrivals.

    Raises:
        HetplanError: negative rates.
    """
    w = wf.workload
    return model_rates([m.name for m in wf.models], w.total_rate_per_s, w.zipf_exponent,
                       {m.name: m.rate_per_s for m in wf.models if m.rate_per_s is not None})


def workload_requests(wf: WorkloadFile) -> list[Request]:
    """The requests of a workload file: its trace, ``num_requests`` at t = 0 (``offline``), or Gamma arrivals with
    Zipf-shared rates (seeded); lengths from the trace, the dataset, the distributions or the fixed lengths.

    Raises:
        HetplanError: bad trace or dataset, negative rates, a request longer than a sequence may be.
    """
    w = wf.workload
    names = [m.name for m in wf.models]
    if w.trace:
        reqs = read_trace(w.trace, names, prompt_len=w.prompt_len, max_new_tokens=w.max_new_tokens)
        # the trace's clock starts at its first request: a slice of a longer trace keeps its timestamps, and the
        # makespan (t = 0 to the last answer: throughput, goodput, the GPUs' idle energy) and capacity's rates
        # (requests over the last arrival) counted the time before it (1,000 s of idle GPUs before 3 requests)
        t0 = reqs[0].arrival_s  # sorted by arrival; read_trace refuses a trace without requests
        for r in reqs:
            r.arrival_s -= t0
        long = max(reqs, key=lambda r: r.prompt_len + r.max_new_tokens, default=None)
        if long is not None and long.prompt_len + long.max_new_tokens > wf.scheduler.kv_cache_len:
            raise HetplanError(f"request {long.id} needs {long.prompt_len + long.max_new_tokens:,} tokens (prompt + "
                               f"new), more than a KV-cache slot of {wf.scheduler.kv_cache_len:,}",
                               field="scheduler.kv_cache_len", fix="raise kv_cache_len or shorten the trace's requests")
        return reqs
    rates = workload_rates(wf)
    if w.offline:
        if w.num_requests is None and w.dataset is None:
            raise HetplanError("offline mode needs a number of requests", field="workload.num_requests",
                               fix="give workload.num_requests (or a workload.dataset: one request per row)")
        n = w.num_requests or len(read_lengths(w.dataset))
        reqs = offline_arrivals(rates, n)
    else:
        loads = [ModelLoad(m.name, rates[m.name], m.cv or w.cv) for m in wf.models]
        rate = sum(rates.values())
        if 0 < rate * w.duration_s < 1:  # rates per second over a window that holds no request's worth of arrivals
            raise HetplanError(f"duration_s = {w.duration_s:g} s at {rate:g} requests/s expects "
                               f"{rate * w.duration_s:.2g} requests: the report's rates (goodput, tokens/s) are per "
                               "second of this window", field="workload.duration_s",
                               fix=f"give a window that holds requests (at least {1 / rate:.3g} s; "
                                   "many more for stable percentiles)")
        reqs = generate(loads, w.duration_s, w.seed, prompt_len=w.prompt_len, max_new_tokens=w.max_new_tokens)
        if not reqs:  # a report over no request says 100 % SLO attainment of nothing (total_rate_per_s = 0)
            raise HetplanError(f"no request arrives: the models' rates add up to {rate:g}/s over duration_s = "
                               f"{w.duration_s:g} s", field="workload.total_rate_per_s" if rate == 0 else
                               "workload.duration_s", fix="give a rate above 0 (total_rate_per_s or a model's "
                                                          "rate_per_s) and a duration that holds requests")
    w.assign_lengths(reqs, wf.scheduler.kv_cache_len)
    return reqs


def check_context(wf: WorkloadFile, specs: dict, requests: list[Request]) -> None:
    """Refuse requests longer than their model's positions (``max_seq_len``, the config's
    ``max_position_embeddings``): no engine serves them (vLLM refuses a ``max_model_len`` beyond the model's), yet
    the cost model priced them and the report looked valid. The longest request is the longest in ``requests`` and,
    for generated lengths, the longest the distributions may draw (a capacity probe draws others).

    Raises:
        HetplanError: naming where the lengths come from (``workload.trace``, ``workload.dataset``,
            ``workload.input`` / ``workload.output`` or the fixed ``workload.prompt_len`` / ``max_new_tokens``).
    """
    w = wf.workload
    for name, spec in specs.items():
        mine = [r for r in requests if r.model == name]
        long = max(mine, key=lambda r: r.prompt_len + r.max_new_tokens, default=None)
        tokens = long.prompt_len + long.max_new_tokens if long is not None else 0
        if not w.trace:
            tokens = max(tokens, w.max_tokens())
        if tokens <= spec.max_seq_len:
            continue
        field = ("workload.trace" if w.trace else "workload.dataset" if w.dataset else "workload.input"
                 if w.input else "workload.output" if w.output else "workload.prompt_len"
                 if w.prompt_len >= w.max_new_tokens else "workload.max_new_tokens")
        raise HetplanError(f"model {name} ({spec.name}) has {spec.max_seq_len:,} positions, but a request of it needs "
                           f"{tokens:,} tokens (prompt + new): no engine serves it", field=field,
                           fix=f"keep prompt + new tokens within {spec.max_seq_len:,} for this model, or serve a model "
                               "with a longer context")


def slos(wf: WorkloadFile) -> dict[str, SLO]:
    """SLOs of each model: its own ``slo_s`` / ``ttft_slo_s`` / ``tpot_slo_s`` or the workload's."""
    w = wf.workload
    return {m.name: SLO(m.slo_s or w.slo_s, m.ttft_slo_s or w.ttft_slo_s, m.tpot_slo_s or w.tpot_slo_s)
            for m in wf.models}


@dataclass(frozen=True)
class Stack:
    """What software a replica runs: a serving engine release (:class:`hetplan.hardware.engines.EngineSpec`;
    None: the training cost model, as before engines were data) and its weight dtype (``fp8``/``int8``/``int4``;
    None: the cluster's ``dtype``)."""

    engine: EngineSpec | None = None
    weights: str | None = None

    @property
    def label(self) -> str:
        """``engine@version/weights`` for tables and JSON (``-`` without an engine)."""
        return f"{self.engine.label if self.engine else '-'}/{self.weights or 'none'}"


@dataclass(frozen=True)
class KVSettings:
    """The paged-KV and token-budget settings a replica runs with: the workload's ``[scheduler]`` values where set,
    else its engine's defaults (``kv_block_tokens``, ``chunked_prefill``, ``max_num_batched_tokens``), else 16-token
    blocks, no budget and no chunking. ``block_tokens`` 0 (an engine with a contiguous cache, or
    ``paged_kv = false``): whole slots."""

    block_tokens: int
    max_batched_tokens: int | None
    chunked_prefill: bool


def kv_settings(wf: WorkloadFile, stack: Stack = Stack()) -> KVSettings:
    """:class:`KVSettings` of a replica running ``stack`` (without chunking, an engine's default budget below
    ``kv_cache_len`` is raised to it, as vLLM raises its own: it requires ``max_num_batched_tokens >=
    max_model_len`` then).

    Raises:
        HetplanError: a ``scheduler.max_batched_tokens`` the workload sets below ``kv_cache_len`` without chunked
            prefill: vLLM refuses it ("max_num_batched_tokens ... is smaller than max_model_len", ``vllm/config``),
            and one prompt of ``kv_cache_len`` tokens could never be scheduled; it was raised without a word.
    """
    s, e = wf.scheduler, stack.engine
    block = s.kv_block_tokens if s.kv_block_tokens is not None else (e.kv_block_tokens if e is not None else 16)
    chunked = s.chunked_prefill if s.chunked_prefill is not None else bool(e is not None and e.chunked_prefill)
    budget = s.max_batched_tokens
    if budget is not None and not chunked and budget < s.kv_cache_len:
        raise HetplanError(f"scheduler.max_batched_tokens = {budget:,} is below kv_cache_len = {s.kv_cache_len:,} "
                           "without chunked prefill: a prompt that long could never be scheduled (vLLM refuses "
                           "this)", field="scheduler.max_batched_tokens",
                           fix=f"give at least {s.kv_cache_len:,}, lower kv_cache_len, or set chunked_prefill = true")
    if budget is None and e is not None and e.max_num_batched_tokens:
        budget = e.max_num_batched_tokens
    if budget is not None and not chunked:
        budget = max(budget, s.kv_cache_len)
    return KVSettings(block if s.paged_kv else 0, budget, chunked)


def max_running(wf: WorkloadFile, stack: Stack = Stack(), gpu: GPUSpec | None = None) -> int:
    """Running sequences per replica at most (the scheduler's ``max_batch_size``, vLLM's ``max_num_seqs``,
    SGLang's ``max_running_requests``): ``scheduler.max_batch_size`` where the workload sets it, else the engine's
    own default on ``gpu`` (:meth:`hetplan.hardware.engines.EngineSpec.default_max_num_seqs`, sourced in
    ``engines.toml``: vLLM V0 256, V1 1,024 on >= 70 GiB GPUs other than A100 ...), else the schema's 8."""
    s = wf.scheduler
    if "max_batch_size" in s.model_fields_set or stack.engine is None or gpu is None:
        return s.max_batch_size
    return stack.engine.default_max_num_seqs(gpu)


def kv_pool_tokens(wf: WorkloadFile, spec, tp: int, pp: int, dtype: str, capacity_bytes: int,
                   n_models: int, gpu: GPUSpec | None = None, stack: Stack = Stack()) -> int | None:
    """Tokens of a model's KV pool per :class:`hetplan.serve.config.SchedulerConfig`: ``kv_cache_tokens`` as
    given; else, one model on the workers, what the memory budget leaves: under an engine its own rule
    (:func:`hetplan.estimate.inference.kv_capacity_tokens`: ``gpu_memory_utilization`` = ``memory_fraction`` of the
    GPU, less weights, activation peak and non-torch memory; used when no ``cluster.memory_bytes`` overrides the
    worker's memory), without one ``capacity_bytes`` less the weights (vLLM's rule, vllm/worker/worker.py
    ``determine_num_available_blocks``, without the activation peak); else, several models sharing the workers,
    ``max_batch_size`` x ``kv_cache_len``. Rounded down to whole blocks; ``None`` when paging is off."""
    s, c = wf.scheduler, wf.cluster
    kv = kv_settings(wf, stack)
    if kv.block_tokens == 0:
        return None
    if s.kv_cache_tokens is not None:
        tokens = s.kv_cache_tokens
    elif n_models == 1 and stack.engine is not None and gpu is not None and c.memory_bytes is None:
        try:
            tokens = kv_capacity_tokens(spec, gpu, stack.engine, tp=tp, pp=pp, dtype=dtype, weights=stack.weights,
                                        gpu_memory_utilization=c.memory_fraction,
                                        max_num_seqs=max_running(wf, stack, gpu),
                                        max_num_batched_tokens=kv.max_batched_tokens)
        except InfeasibleError:
            tokens = 0
    elif n_models == 1:
        weights = weight_bytes_per_worker(spec, tp, pp, dtype, stack.weights, stack.engine)
        per_token = kv_cache_bytes_per_worker(spec, 1, tp, pp, dtype, stack.engine)
        tokens = min((capacity_bytes - w) // max(k, 1) for w, k in zip(weights, per_token))
    else:  # the pool each resident model reserves: scheduler.max_batch_size (8 unless set) sequences, not the
        # engine's max_num_seqs, whose 256-1,024 longest sequences would not leave room for another model
        tokens = s.max_batch_size * s.kv_cache_len
    return max(0, int(tokens) // kv.block_tokens * kv.block_tokens)


_STEP_MODELS: dict[tuple, tuple] = {}


def step_model(spec, gpu: GPUSpec, tp: int, pp: int, dtype: str, stack: Stack = Stack()) -> EstimatedStepModel:
    """One :class:`EstimatedStepModel` per (model, GPU, TP, PP, dtype, stack) objects, shared by every simulation
    of a search so its memo of iteration times is too (a capacity search asks the same iterations in every rate
    probe). Keyed on the objects' identities (specs hold dicts, so they do not hash); the entry keeps them alive."""
    key = (id(spec), id(gpu), tp, pp, dtype, id(stack.engine), stack.weights)
    if key not in _STEP_MODELS:
        if len(_STEP_MODELS) > 1024:
            _STEP_MODELS.clear()
        _STEP_MODELS[key] = (spec, gpu, stack, EstimatedStepModel(spec, gpu, tp, pp, dtype, stack.engine,
                                                                  stack.weights))
    return _STEP_MODELS[key][3]


def sim_model(name: str, spec, gpu: GPUSpec, tp: int, pp: int, dtype: str, wf: WorkloadFile, capacity_bytes: int,
              n_models: int = 1, stack: Stack = Stack()) -> SimModel:
    """A model as the simulator sees it on ``gpu`` x TP x PP running ``stack``: weight and KV-cache bytes per
    worker from :mod:`hetplan.estimate.inference` (the paged pool of :func:`kv_pool_tokens`, or ``max_batch_size``
    whole slots of ``kv_cache_len``), iteration times from the cost model."""
    s = wf.scheduler
    pool = kv_pool_tokens(wf, spec, tp, pp, dtype, capacity_bytes, n_models, gpu, stack)
    tokens = pool if pool is not None else max_running(wf, stack, gpu) * s.kv_cache_len
    block = kv_settings(wf, stack).block_tokens
    return SimModel(name, weight_bytes_per_worker(spec, tp, pp, dtype, stack.weights, stack.engine),
                    step_model(spec, gpu, tp, pp, dtype, stack),
                    kv_cache_bytes_per_worker(spec, tokens, tp, pp, dtype, stack.engine),
                    kv_blocks=None if pool is None else pool // block,
                    kv_window_spec=spec if pool is not None and kv_windowed(spec, stack.engine) else None)


def scheduler_kwargs(wf: WorkloadFile, stack: Stack = Stack(), gpu: GPUSpec | None = None) -> dict:
    """The scheduler settings of :func:`hetplan.serve.simulator.simulate` from the workload file and the engine's
    defaults on ``gpu`` (:func:`kv_settings`, :func:`max_running`, the engine's admission watermark
    ``kv_watermark``)."""
    s, kv = wf.scheduler, kv_settings(wf, stack)
    return dict(max_batch_size=max_running(wf, stack, gpu), max_queue_len=s.max_queue_len, batching=s.batching,
                block_tokens=kv.block_tokens or 16, max_batched_tokens=kv.max_batched_tokens,
                chunked_prefill=kv.chunked_prefill, max_seq_tokens=s.kv_cache_len,
                kv_watermark=stack.engine.kv_watermark if stack.engine is not None and kv.block_tokens else 0.0)


def check_stack(stack: Stack, gpu: GPUSpec, dtype: str, field: str = "cluster") -> None:
    """Raise unless ``stack`` runs on ``gpu``: the engine supports the GPU's generation and runs its weight dtype.

    Raises:
        HetplanError: naming ``FIELD.engine`` or ``FIELD.quantization`` and the fix.
    """
    e = stack.engine
    if e is None:
        if stack.weights is not None:
            raise HetplanError(f"{stack.weights} weights are priced by a serving engine's kernels",
                               field=f"{field}.quantization", fix='set cluster.engine (e.g. "vllm") or drop it')
        return
    try:
        e.attention_kernel(gpu)
    except HetplanError as exc:
        raise HetplanError(exc.message, field=f"{field}.engine", fix=exc.fix) from None
    try:
        e.check_weight_dtype(stack.weights or dtype, gpu)
    except HetplanError as exc:
        raise HetplanError(exc.message, field=f"{field}.quantization", fix=exc.fix) from None


def cluster_stack(wf: WorkloadFile, gpu: GPUSpec | None = None) -> Stack:
    """The :class:`Stack` of ``cluster.engine`` and ``cluster.quantization`` (checked on ``gpu`` when given).

    Raises:
        HetplanError: unknown engine or release (field ``cluster.engine``), quantization without an engine or one
            the engine does not run on the GPU (``cluster.quantization``).
    """
    c = wf.cluster
    eng = load_engines().get(c.engine, field="cluster.engine") if c.engine else None
    stack = Stack(eng, c.quantization)
    if eng is None and c.quantization:
        raise HetplanError(f"{c.quantization} weights are priced by a serving engine's kernels",
                           field="cluster.quantization", fix='set cluster.engine (e.g. "vllm") or drop it')
    if gpu is not None:
        check_stack(stack, gpu, c.dtype)
    return stack


def workload_swap_model(wf: WorkloadFile, gpu: GPUSpec) -> SwapModel:
    """The swap model of ``wf``'s ``[swap]`` (Computron's fit by default) over ``gpu``'s host link."""
    sw = wf.swap
    return SwapModel(gpu.host_link_bandwidth_bytes_per_s, sw.efficiency, sw.gpus_per_switch,
                     sw.switch_bandwidth_bytes_per_s, sw.overhead_s)


def simulate_workload(wf: WorkloadFile, *, gpu: GPUSpec | None = None, tp: int | None = None, pp: int | None = None,
                      requests: list[Request] | None = None, capacity_bytes: int | None = None) -> SimResult:
    """Simulate ``wf`` on ``gpu`` (default: ``cluster.gpu``) partitioned ``tp`` x ``pp`` (default: the file's).

    Raises:
        HetplanError: no GPU given, unknown GPU/model, the file's ``cluster.tp`` / ``cluster.pp`` not splitting a
            model (:meth:`~hetplan.serve.config.WorkloadFile.check_split`), a model that does not fit, bad workload
            values.
    """
    c = wf.cluster
    default_cap = None
    if gpu is None:
        if c.gpu is None:
            raise HetplanError("the simulator needs a GPU type for its cost models", field="cluster.gpu",
                               fix='set cluster.gpu to a catalog name, e.g. "A100-SXM-80GB"')
        gpu = load_catalog().get(c.gpu, field="cluster.gpu")
        default_cap = c.capacity_bytes()
    stack = cluster_stack(wf, gpu)
    if tp is None and pp is None:
        wf.check_split(stack.engine)
    tp, pp = tp or c.tp, pp or c.pp
    dtype = c.dtype
    gpu.peak_flops_per_s(dtype)  # raises on an unsupported dtype
    cap = capacity_bytes or default_cap or int(gpu.memory_bytes * c.memory_fraction)
    swap_model = workload_swap_model(wf, gpu)
    s = wf.scheduler
    specs = {m.name: m.spec() for m in wf.models}
    models = [sim_model(m.name, specs[m.name], gpu, tp, pp, dtype, wf, cap, len(wf.models), stack) for m in wf.models]
    reqs = requests if requests is not None else workload_requests(wf)
    check_context(wf, specs, reqs)
    return simulate(models, reqs, capacity_bytes=cap, policy=make_policy(s.policy, rate_window_s=s.rate_window_s),
                    swap_cost=swap_cost_fn(swap_model, s.write_back), preload=s.preload, **scheduler_kwargs(wf, stack, gpu),
                    duration_s=wf.workload.duration_s if not (wf.workload.trace or wf.workload.offline) else None)


def cluster_footprints(wf: WorkloadFile) -> tuple[dict[str, int], int]:
    """Per model, the bytes per worker it holds while resident on the workload's cluster (weights + KV pool, as
    :func:`simulate_workload` sizes them), and the GPU's memory (bytes).

    Raises:
        HetplanError: no ``cluster.gpu``; as :func:`sim_model`.
    """
    c = wf.cluster
    if c.gpu is None:
        raise HetplanError("the export needs the cluster's GPU type", field="cluster.gpu",
                           fix='set cluster.gpu to a catalog name, e.g. "A100-SXM-80GB"')
    gpu = load_catalog().get(c.gpu, field="cluster.gpu")
    cap = c.capacity_bytes()
    stack = cluster_stack(wf, gpu)
    out = {m.name: sim_model(m.name, m.spec(), gpu, c.tp, c.pp, c.dtype, wf, cap, len(wf.models), stack).bytes
           for m in wf.models}
    return out, gpu.memory_bytes


def serving_energy(res: SimResult | None, gpu: str, tp: int, pp: int, wall_s: float) -> dict:
    """Energy of one replica (TP x PP GPUs of type ``gpu``) over ``wall_s`` seconds of a simulation ``res`` (None:
    it served nothing and idled), from :func:`hetplan.energy.inference.inference_energy`: each GPU computes the
    iterations' prefill and decode parts (``SimResult.prefill_busy_s``, the rest of ``busy_s``) over PP — the
    stages of one iteration run one after another, so a GPU computes 1/PP of it — and idles the rest of
    ``wall_s`` (swaps included: the copy engines, not the SMs, move the weights). Returns
    :meth:`InferenceEnergy.to_dict` with ``num_gpus``, ``requests`` (finished) and ``output_tokens``."""
    from hetplan.energy.inference import inference_energy

    busy = res.busy_s if res is not None else 0.0
    pre = res.prefill_busy_s if res is not None else 0.0
    done = [r for r in res.records if r.finish_s is not None] if res is not None else []
    tokens = sum(r.output_tokens for r in res.records) if res is not None else 0
    e = inference_energy(gpu, prefill_busy_s=pre / pp, decode_busy_s=max(busy - pre, 0.0) / pp,
                         idle_s=max(wall_s - busy / pp, 0.0), num_gpus=tp * pp, num_requests=len(done),
                         output_tokens=tokens)
    return {**e.to_dict(), "num_gpus": tp * pp, "requests": len(done), "output_tokens": tokens}


def energy_summary(parts: list[dict]) -> dict:
    """Energies of several replicas summed; per request and per output token over all of them (J)."""
    e = sum(p["energy_j"] for p in parts)
    n = sum(p["requests"] for p in parts)
    t = sum(p["output_tokens"] for p in parts)
    sources = sorted({s for p in parts for s in p["energy_source"].split(",") if s})
    return {"energy_j": e, "energy_j_per_request": e / n if n else None,
            "energy_j_per_output_token": e / t if t else None, "num_gpus": sum(p["num_gpus"] for p in parts),
            "requests": n, "output_tokens": t, "energy_source": ",".join(sources)}
