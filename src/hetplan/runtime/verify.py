"""``hetplan verify``: profile -> estimate -> run -> predicted vs measured, per pipeline stage.

1. **Profile** the plan's layer, embedding and head on this host (:func:`hetplan.profile.profiler.profile_layers`)
   at the plan's micro-batch size, sequence length and TP degree, in the dtype the runtime will compute in (the
   plan's dtype on GPU; fp32 on CPU), into a profile database (``--db``, else a temporary file).
2. **Estimate** the plan with :func:`hetplan.estimate.estimator.estimate` and ``profiles=`` that database, so layer
   times are measured and the rest (embedding, head, collectives, memory) analytic. On CPU the GPU catalog has no
   entry for the host, so verify adds one, ``cpu``, whose peak FLOP/s and memory bandwidth are measured here (one
   matmul, one copy and one tiny-op benchmark, on the runtime's threads; compute efficiency 1, no GEMM-shape
   penalty, measured per-op overhead). On GPU the pools' GPU is the
   catalog entry of the GPU found.
3. **Run** the plan (:func:`hetplan.runtime.launcher.run_plan`).
4. **Compare** per stage:

   * time: predicted ``forward_s + backward_s`` of one micro-batch (:class:`StageEstimate`) vs. the measured
     forward + backward of one micro-batch through the stage's module, timed in isolation inside the running job
     (mean over the stage's DP ranks). Both sides use the minimum of repeats and, on CPU, the thread's CPU time
     (:func:`hetplan.profile.torchparts.time_forward_backward`): shared CI hosts add noise to wall-clock times.
   * memory: the runtime trains in one dtype with AdamW (fp32 on CPU: 4-byte weights, gradients, two Adam states
     and activations; bf16 on GPU: 2-byte ones) while the estimator predicts Megatron-style mixed precision
     (2 + 4 + 12 bytes per parameter, 2-byte activations, plus CUDA overhead); we rescale the estimator's
     components to the runtime's element size ``e`` (:func:`predicted_memory_bytes`) and compare with
     ``torch.cuda.max_memory_allocated`` on GPU, and on CPU with the tensor account of the rank (parameters +
     gradients + optimizer states + peak bytes saved for backward).

Relative error = (predicted - measured) / measured. :data:`TIME_TOLERANCE` and :data:`MEMORY_TOLERANCE` are the
tolerances CI asserts on CPU (see docs/runtime.md for the numbers measured).
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from hetplan.errors import HetplanError
from hetplan.runtime import planio
from hetplan.runtime.planio import predicted_memory_bytes
from hetplan.runtime.launcher import RunOptions, check_options, run_plan

#: Largest |relative error| of per-stage time accepted on CPU (the CI test asserts it).
TIME_TOLERANCE = 0.5
#: Largest |relative error| of per-stage memory accepted on CPU.
MEMORY_TOLERANCE = 0.25


class DtypeAlias:
    """A :class:`LayerTimeSource` that answers a query for one dtype with the rows of another (CPU verify: the
    estimator asks for the plan's bf16, the runtime computes in fp32)."""

    def __init__(self, source, alias: dict[str, str]):
        self.source, self.alias = source, alias

    def layer_time_s(self, gpu, model, dtype, mbs, seq_len, tp):
        return self.source.layer_time_s(gpu, model, self.alias.get(dtype, dtype), mbs, seq_len, tp)


@dataclass
class StageComparison:
    """One stage: predicted and measured time of one micro-batch (s) and memory per rank (bytes)."""

    stage: int
    layers: tuple[int, int]
    time_source: str
    predicted_time_s: float
    measured_time_s: float
    predicted_memory_bytes: float
    measured_memory_bytes: float

    @property
    def time_error(self) -> float:
        """(predicted - measured) / measured stage time (fraction)."""
        return (self.predicted_time_s - self.measured_time_s) / self.measured_time_s

    @property
    def memory_error(self) -> float:
        """(predicted - measured) / measured memory per rank (fraction)."""
        return (self.predicted_memory_bytes - self.measured_memory_bytes) / self.measured_memory_bytes

    def as_dict(self) -> dict:
        """The ``hetplan verify --json`` fields of this stage."""
        return {"stage": self.stage, "layers": list(self.layers), "time_source": self.time_source,
                "predicted_time_s": self.predicted_time_s, "measured_time_s": self.measured_time_s,
                "time_error": self.time_error, "predicted_memory_bytes": self.predicted_memory_bytes,
                "measured_memory_bytes": self.measured_memory_bytes, "memory_error": self.memory_error}


def host_catalog(threads: int = 1):
    """The GPU catalog plus a ``cpu`` entry measured on this host (see module doc). Imports torch.

    Returns ``(catalog, info)`` with ``info = {"flops_per_s", "memory_bandwidth_bytes_per_s"}``.
    """
    import torch

    from hetplan.hardware.catalog import Catalog, GPUSpec, load_catalog

    torch.set_num_threads(threads)
    # Best of several short runs, on the thread's CPU clock (as the layer timings): robust to other load.
    n = 512
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    best = float("inf")
    for _ in range(10):
        t0 = time.thread_time()
        a @ b
        best = min(best, time.thread_time() - t0)
    flops = 2 * n**3 / best
    x = torch.empty(2**24 // 4)
    y = torch.empty_like(x)
    y.copy_(x)
    best = float("inf")
    for _ in range(10):
        t0 = time.thread_time()
        y.copy_(x)
        best = min(best, time.thread_time() - t0)
    bw = 2 * x.numel() * 4 / best
    # Per-op overhead: best time of a tiny op (the "kernel launch" of a CPU op).
    tiny = torch.ones(8)
    best_op = float("inf")
    for _ in range(50):
        t0 = time.thread_time()
        tiny + tiny
        best_op = min(best_op, time.thread_time() - t0)
    import os

    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    base = load_catalog()
    cpu = GPUSpec(
        name="cpu", aliases=("host-cpu",), vendor="host", architecture="host CPU", form_factor="host",
        memory_bytes=int(mem), hbm_bandwidth_bytes_per_s=bw,
        dense_flops_per_s={"fp32": flops, "bf16": flops, "fp16": flops}, gpu_link="loopback (gloo)",
        gpu_link_bandwidth_bytes_per_s=1e9, host_link="none", host_link_bandwidth_bytes_per_s=1e9, tdp_w=1.0,
        idle_power_w=1.0, price_usd_per_hour=0.0, price_provider="none", price_date="n/a", price_source="n/a",
        compute_efficiency=1.0,
        calibration_source=f"measured by hetplan verify: {threads}-thread fp32 matmul {n}^3 and a 16 MiB copy",
        sources=("measured on this host",),
    )
    # Newer catalogs carry GPU-fitted GEMM-shape and kernel-overhead calibrations; for the CPU the FLOP rate is
    # measured directly, so no shape penalty, and the per-op overhead is measured too.
    extra = {"gemm_half_dim": 0.0, "kernel_overhead_s": best_op, "calibrated": True}
    cpu = cpu.model_copy(update={k: v for k, v in extra.items() if k in GPUSpec.model_fields})
    gpus = dict(base.gpus)
    gpus["cpu"] = cpu
    return Catalog(gpus, base.date), {"flops_per_s": flops, "memory_bandwidth_bytes_per_s": bw,
                                      "op_overhead_s": best_op}


def verify(plan_path: str | Path, *, db_path: str | Path | None = None, opts: RunOptions | None = None,
           repeats: int = 7, progress=None) -> dict:
    """Profile, estimate, run and compare (see module doc). Returns::

        {"device", "dtype", "stages": [StageComparison.as_dict()...], "predicted_iteration_time_s",
         "measured_iteration_time_s", "time_tolerance", "memory_tolerance", "within_tolerance", "run": {...},
         "host": {...}}

    Raises:
        HetplanError: bad plan, torch missing, the run failed.
    """
    import torch

    from hetplan.estimate.estimator import estimate
    from hetplan.profile.db import ProfileDB, normalize_device
    from hetplan.profile.profiler import profile_layers
    from hetplan.profile import torchparts

    opts = opts or RunOptions()
    opts.stage_stat, opts.stage_repeats = "min", repeats
    check_options(opts)
    plan = planio.load_plan(plan_path)
    spec = planio.plan_model(plan)
    lay = planio.layout(plan, spec, schedule=opts.schedule, virtual_stages=opts.virtual_stages)
    cuda = torch.cuda.is_available()
    run_dtype = opts.dtype or (plan.job.dtype if cuda else "fp32")
    element = torch.tensor([], dtype=torchparts.torch_dtype(run_dtype)).element_size()
    tmp = None
    if db_path is None:
        tmp = tempfile.TemporaryDirectory(prefix="hetplan-verify-")
        db_path = Path(tmp.name) / "profiles.db"
    try:
        with ProfileDB(db_path) as db:
            prof = profile_layers(db, spec, dtypes=[run_dtype], mbs=[plan.mbs], seq_lens=[plan.job.seq_len],
                                  tps=[lay.tp], repeats=repeats, threads=opts.threads, stat="min", progress=progress)
            if cuda:
                from hetplan.hardware.catalog import load_catalog

                catalog, host = load_catalog(), {}
                device = normalize_device(torch.cuda.get_device_name(0))
                catalog.get(device, field="device")
            else:
                catalog, host = host_catalog(opts.threads)
                device = "cpu"
            vplan = planio.as_run(plan, lay, opts.dp_mode)
            for pool in vplan.pools:
                pool.gpu = device
            est = estimate(vplan, catalog=catalog, model=spec,
                           profiles=DtypeAlias(db, {plan.job.dtype: run_dtype}))
        result = run_plan(plan_path, opts)
    finally:
        if tmp is not None:
            tmp.cleanup()
    if not result:
        raise HetplanError("this node is not rank 0 of the run; verify reports on node 0", field="--node-rank",
                           fix="read the report on node 0")
    stages = []
    for i, se in enumerate(est.stages):
        ranks = [r for r in result["ranks"] if r["pp_rank"] == i]
        meas_t = sum(r["forward_s"] + r["backward_s"] for r in ranks) / len(ranks)
        key = "cuda_max_allocated_bytes" if cuda else "tensor_bytes"
        meas_m = sum(r[key] for r in ranks) / len(ranks)
        stages.append(StageComparison(
            stage=i, layers=tuple(lay.stage_layers[i]), time_source=se.time_source,
            predicted_time_s=se.forward_s + se.backward_s, measured_time_s=meas_t,
            predicted_memory_bytes=predicted_memory_bytes(se.memory, element), measured_memory_bytes=meas_m))
    ok = all(abs(s.time_error) <= TIME_TOLERANCE and abs(s.memory_error) <= MEMORY_TOLERANCE for s in stages)
    notes = [f"{d}: estimated as run" for d in planio.run_differences(plan, lay.tp, opts.dp_mode)]
    if result.get("dp_mode") == "fsdp":
        notes.append("FSDP: the measured stage time includes the per-micro-batch parameter all-gathers and gradient "
                     "reduce-scatters (wall clock), which the estimator counts in dp_exposed_s, not in the stage's "
                     "forward/backward; the time comparison is meaningful for DDP (ZeRO-0) plans")
    if result.get("tp", 1) > 1 and not cuda:
        notes.append("TP on CPU: stage times are wall clock (they wait on gloo all-reduces), so noisier")
    if result.get("ep", 1) > 1 and not cuda:
        notes.append("EP on CPU: stage times are wall clock (they wait on gloo all-to-alls of ranks sharing cores)")
    return {
        "plan": str(plan_path), "device": result.get("device"), "dtype": run_dtype, "software": result.get("software"),
        "stages": [s.as_dict() for s in stages],
        "predicted_iteration_time_s": est.iteration_time_s, "measured_iteration_time_s": result["iteration_time_s"],
        "time_tolerance": TIME_TOLERANCE, "memory_tolerance": MEMORY_TOLERANCE, "within_tolerance": ok,
        "profiled": prof, "host": host, "notes": notes,
        "run": {k: v for k, v in result.items() if k != "ranks"},
    }
