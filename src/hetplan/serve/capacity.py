"""Simulate a ``WORKLOAD.toml`` and plan capacity: the fewest GPUs (type, TP x PP) that meet the latency SLO.

:func:`simulate_workload` builds the simulator's inputs from a workload file — requests (Gamma/Zipf or a trace),
weight and KV-cache bytes per worker (:mod:`hetplan.estimate.inference`), the iteration-time model of the cost
model on the catalog GPU (:class:`hetplan.serve.exec_model.EstimatedStepModel`) and the swap model with the GPU's
host link — and runs :func:`hetplan.serve.simulator.simulate`.

:func:`plan_capacity` searches exhaustively (the space is small): every candidate GPU type, every cluster size
n = 1, 2, 4, ... up to ``capacity.max_gpus`` and every TP x PP = n whose TP divides the models' heads; a
candidate is feasible when every model's shards fit the worker memory and every model's SLO attainment reaches
``capacity.target_attainment`` in simulation. The answer is the feasible candidate with the fewest GPUs, then the
lowest price per hour, then the lowest p99 latency. When none is feasible the error says why.

This module does not import torch.
"""

from __future__ import annotations

from dataclasses import dataclass

from hetplan.errors import HetplanError, InfeasibleError
from hetplan.hardware.catalog import GPUSpec, load_catalog
from hetplan.serve.config import WorkloadFile
from hetplan.estimate.inference import kv_cache_bytes_per_worker, weight_bytes_per_worker
from hetplan.serve.exec_model import EstimatedStepModel
from hetplan.serve.metrics import SLO
from hetplan.serve.policies import make_policy
from hetplan.serve.simulator import SimModel, SimResult, simulate, swap_cost_fn
from hetplan.serve.swap_model import SwapModel
from hetplan.serve.workload import ModelLoad, Request, generate, model_rates, read_trace


def workload_requests(wf: WorkloadFile) -> list[Request]:
    """The requests of a workload file: its trace, or Gamma arrivals with Zipf-shared rates (seeded).

    Raises:
        HetplanError: bad trace, negative rates.
    """
    w = wf.workload
    names = [m.name for m in wf.models]
    if w.trace:
        return read_trace(w.trace, names, prompt_len=w.prompt_len, max_new_tokens=w.max_new_tokens)
    rates = model_rates(names, w.total_rate_per_s, w.zipf_exponent,
                        {m.name: m.rate_per_s for m in wf.models if m.rate_per_s is not None})
    loads = [ModelLoad(m.name, rates[m.name], m.cv or w.cv) for m in wf.models]
    return generate(loads, w.duration_s, w.seed, prompt_len=w.prompt_len, max_new_tokens=w.max_new_tokens)


def slos(wf: WorkloadFile) -> dict[str, SLO]:
    """SLOs of each model: its own ``slo_s`` / ``ttft_slo_s`` / ``tpot_slo_s`` or the workload's."""
    w = wf.workload
    return {m.name: SLO(m.slo_s or w.slo_s, m.ttft_slo_s or w.ttft_slo_s, m.tpot_slo_s or w.tpot_slo_s)
            for m in wf.models}


def sim_model(name: str, spec, gpu: GPUSpec, tp: int, pp: int, dtype: str, slots: int, kv_cache_len: int) -> SimModel:
    """A model as the simulator sees it on ``gpu`` x TP x PP: weight and KV-cache bytes per worker from
    :mod:`hetplan.estimate.inference`, iteration times from the cost model."""
    return SimModel(name, weight_bytes_per_worker(spec, tp, pp, dtype), EstimatedStepModel(spec, gpu, tp, pp, dtype),
                    kv_cache_bytes_per_worker(spec, slots * kv_cache_len, tp, pp, dtype))


def simulate_workload(wf: WorkloadFile, *, gpu: GPUSpec | None = None, tp: int | None = None, pp: int | None = None,
                      requests: list[Request] | None = None, capacity_bytes: int | None = None) -> SimResult:
    """Simulate ``wf`` on ``gpu`` (default: ``cluster.gpu``) partitioned ``tp`` x ``pp`` (default: the file's).

    Raises:
        HetplanError: no GPU given, unknown GPU/model, a model that does not fit, bad workload values.
    """
    c = wf.cluster
    default_cap = None
    if gpu is None:
        if c.gpu is None:
            raise HetplanError("the simulator needs a GPU type for its cost models", field="cluster.gpu",
                               fix='set cluster.gpu to a catalog name, e.g. "A100-SXM-80GB"')
        gpu = load_catalog().get(c.gpu, field="cluster.gpu")
        default_cap = c.memory_bytes
    tp, pp = tp or c.tp, pp or c.pp
    dtype = c.dtype
    gpu.peak_flops_per_s(dtype)  # raises on an unsupported dtype
    cap = capacity_bytes or default_cap or int(gpu.memory_bytes * c.memory_fraction)
    sw = wf.swap
    swap_model = SwapModel(gpu.host_link_bandwidth_bytes_per_s, sw.efficiency, sw.gpus_per_switch,
                           sw.switch_bandwidth_bytes_per_s, sw.overhead_s)
    s = wf.scheduler
    models = [sim_model(m.name, m.spec(), gpu, tp, pp, dtype, s.max_batch_size, s.kv_cache_len) for m in wf.models]
    reqs = requests if requests is not None else workload_requests(wf)
    return simulate(models, reqs, capacity_bytes=cap, policy=make_policy(s.policy, rate_window_s=s.rate_window_s),
                    swap_cost=swap_cost_fn(swap_model, s.write_back), max_batch_size=s.max_batch_size,
                    max_queue_len=s.max_queue_len, preload=s.preload, batching=s.batching,
                    duration_s=wf.workload.duration_s if not wf.workload.trace else None)


@dataclass
class Candidate:
    """One evaluated cluster: GPU type, GPUs (= TP x PP), feasibility, and why not."""

    gpu: str
    num_gpus: int
    tp: int
    pp: int
    feasible: bool
    reason: str
    price_usd_per_hour: float
    min_slo_attainment: float | None = None
    p99_latency_s: float | None = None
    goodput_per_s: float | None = None

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def _sizes(max_gpus: int) -> list[int]:
    out, n = [], 1
    while n <= max_gpus:
        out.append(n)
        n *= 2
    return out


def plan_capacity(wf: WorkloadFile) -> dict:
    """Search GPU type x cluster size x (TP, PP) by simulation (see the module docstring).

    Returns:
        ``{"best": Candidate dict, "candidates": [...], "target_attainment": x}``.

    Raises:
        InfeasibleError: no candidate meets the SLO; the message gives the best attainment reached and whether
            memory was the limit.
        HetplanError: unknown GPU or model, bad workload.
    """
    cat = load_catalog()
    names = wf.capacity.gpus or cat.names()
    gpus = [cat.get(n, field="capacity.gpus") for n in names]
    specs = [m.spec() for m in wf.models]
    reqs = workload_requests(wf)
    target = wf.capacity.target_attainment
    slo = slos(wf)
    cands: list[Candidate] = []
    for n in _sizes(wf.capacity.max_gpus):
        for gpu in gpus:
            for tp in [t for t in _sizes(n) if n % t == 0]:
                pp = n // tp
                price = gpu.price_usd_per_hour * n
                c = Candidate(gpu.name, n, tp, pp, False, "", price)
                cands.append(c)
                try:
                    gpu.peak_flops_per_s(wf.cluster.dtype)
                    cap = int(gpu.memory_bytes * wf.cluster.memory_fraction)
                    worst = max(sim_model("", s, gpu, tp, pp, wf.cluster.dtype, wf.scheduler.max_batch_size,
                                          wf.scheduler.kv_cache_len).bytes for s in specs)
                except HetplanError as exc:
                    c.reason = exc.message
                    continue
                if worst > cap:
                    c.reason = f"largest shard {worst / 1e9:.2f} GB > {cap / 1e9:.2f} GB usable per GPU"
                    continue
                res = simulate_workload(wf, gpu=gpu, tp=tp, pp=pp, requests=[Request(r.id, r.model, r.arrival_s, r.prompt_len, r.max_new_tokens) for r in reqs],
                                        capacity_bytes=cap)
                rep = res.report(slo)
                att = min(v["slo_attainment"] for v in rep["models"].values())
                c.min_slo_attainment, c.p99_latency_s, c.goodput_per_s = att, rep["all"]["p99_latency_s"], rep["all"]["goodput_per_s"]
                c.feasible = att >= target
                c.reason = "meets the SLO" if c.feasible else f"SLO attainment {att:.3f} < {target}"
        feasible = [c for c in cands if c.feasible]
        if feasible:
            best = min(feasible, key=lambda c: (c.num_gpus, c.price_usd_per_hour, c.p99_latency_s or 0.0))
            return {"best": best.as_dict(), "candidates": [c.as_dict() for c in cands], "target_attainment": target}
    tried = [c for c in cands if c.min_slo_attainment is not None]
    if not tried:
        raise InfeasibleError(
            f"no candidate up to {wf.capacity.max_gpus} GPUs holds the largest model's shard in memory",
            field="capacity.max_gpus", fix="allow more GPUs or GPUs with more memory")
    top = max(tried, key=lambda c: c.min_slo_attainment)
    raise InfeasibleError(
        f"no cluster up to {wf.capacity.max_gpus} GPUs meets SLO attainment {target}; best is {top.min_slo_attainment:.3f} "
        f"on {top.num_gpus} x {top.gpu} (TP={top.tp}, PP={top.pp})",
        field="capacity.max_gpus", fix="allow more GPUs, relax slo_s or target_attainment, or lower the load")
