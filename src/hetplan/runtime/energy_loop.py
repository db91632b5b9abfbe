"""``hetplan run PLAN.json --energy-server URL``: Perseus' loop (SOSP'24 §5) in hetplan's own trainer.

The launcher (this module's :func:`prepare_job`, no torch) creates the job on the frequency plan server
(:mod:`hetplan.energy.server`) before any rank starts, so a bad URL, token or plans file fails at once:

* with ``plans`` (the ``plans.json`` of ``hetplan energy frontier``): a ``frontier_pick`` job, which runs the
  least-energy plan that meets the target time (``target_time_s``; default: the fastest plan);
* without: an ``online_profiling`` job, Perseus' profiling mode: every timed iteration runs all instructions at
  one SM clock of the sweep (``frequencies_mhz``; default: every clock the power catalog lists for the plan's
  GPU), ranks report each instruction's time and energy, and once every rank has run the sweep the server turns
  the measured profile into a frontier (idle power from the GPU catalog) and serves its plans from then on.
  The measured profile is ``GET /jobs/{job}/profile``, or ``hetplan energy frontier --profile-db DB --job ID``.

Each rank (:class:`RankLoop`, in the trainer) registers ``(rank, pipeline stage)``, then per timed iteration
fetches its stage's frequency schedule, applies one frequency per instruction and reports time and energy.

Hook point: each :class:`torch.distributed.pipelining.PipelineStage`'s ``forward_one_chunk`` and
``backward_one_chunk`` are wrapped on the instance (:meth:`RankLoop.attach`). Every torch schedule (GPipe, 1F1B)
runs a micro-batch's compute through exactly these two calls, after its receives were waited for and before its
sends, so the measured time is the instruction's compute alone; wrapping the stage rather than the schedule
keeps the trainer on torch's own schedules. The order the schedule calls them in is checked against the
server's (:func:`hetplan.estimate.schedule.stage_order`); a difference is an error, not a silent mislabel.
Recomputation runs inside the backward call, as in the energy planner (:mod:`hetplan.energy.model`).
Without pipelining the trainer's gradient-accumulation loop opens the same instructions itself.

Frequencies are applied with NVML (:mod:`hetplan.energy.nvml`) when the rank has a GPU and pynvml; energy is
then NVML's counter (``energy_source = "nvml"``). With ``HETPLAN_SIMULATED_NVML=GPU`` a CPU rank runs the same
NVML path on a simulated board (clocks locked from the GPU's table, energy counter from its power model;
``energy_source = "model"``). On CPU nothing can be set: each rank records the frequency it
would set (``frequency_log``), and energy is the plan's GPU's DVFS model (:mod:`hetplan.hardware.power`) times
the measured time, plus idle power between instructions (``energy_source = "model"``: not measured).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

from hetplan.errors import HetplanError
from hetplan.hardware.catalog import load_catalog
from hetplan.hardware.power import board_limited, get_power


@dataclass(frozen=True)
class EnergyOptions:
    """How ``hetplan run`` talks to the plan server.

    Attributes:
        server: base URL, e.g. ``http://127.0.0.1:7787``. token: its bearer token (None: ``$HETPLAN_ENERGY_TOKEN``
            if set; the ranks get it through the environment, never on a command line).
        job_id: the server's job (default: ``hetplan-`` + a hash of the plan, schedule and micro-batches, so
            running the same plan again continues the same job).
        plans: ``plans.json`` from ``hetplan energy frontier`` (a ``frontier_pick`` job); None: online profiling.
        target_time_s: iteration time the frontier pick must meet (None: the fastest plan, or after profiling
            the all-max iteration time).
        frequencies_mhz: profiling sweep (None: every clock of the plan's GPU in the power catalog).
    """

    server: str
    token: str | None = None
    job_id: str | None = None
    plans: str | None = None
    target_time_s: float | None = None
    frequencies_mhz: tuple[int, ...] | None = None


def _stage_gpus(plan) -> list[str]:
    cat = load_catalog()
    return [cat.get(plan.pools[st.pool].gpu, field=f"plan.stages.{i}.pool").name for i, st in enumerate(plan.stages)]


def job_spec(plan, plan_bytes: bytes, num_stages: int, num_microbatches: int, schedule: str,
             opts: EnergyOptions) -> dict:
    """The ``POST /jobs`` body for a run of ``plan`` (module doc).

    Raises:
        HetplanError: interleaved schedule; unreadable or mismatched plans file; a target time no plan of the
            file meets (``--energy-target-s``); a sweep clock above a GPU's top clock (``--energy-frequencies``); no
            common clock to sweep.
    """
    if schedule not in ("1f1b", "gpipe"):
        raise HetplanError(f"the plan server runs one model chunk per stage; {schedule!r} is not supported",
                           field="--schedule", fix="run with --schedule 1f1b or gpipe")
    key = hashlib.sha256(plan_bytes + f"|{schedule}|{num_microbatches}".encode()).hexdigest()[:12]
    job_id = opts.job_id or f"hetplan-{key}"
    base = {"job_id": job_id, "num_stages": num_stages, "num_microbatches": num_microbatches, "schedule": schedule}
    if opts.plans is not None:
        from hetplan.inputs import read_text

        text = read_text(opts.plans, field="--energy-plans")  # missing / unreadable file: its own message
        try:
            data = json.loads(text)
            plans = [{"time_s": p["time_s"], "energy_j": p["energy_j"], "frequencies_mhz": p["frequencies_mhz"]}
                     for p in data["plans"]]
            got = (data["num_stages"], data["num_microbatches"], data["schedule"])
            idle = data["idle_power_w"]
            numbers = [idle, *(p[k] for p in plans for k in ("time_s", "energy_j"))]
            if not all(type(x) in (int, float) and 0 <= x < math.inf for x in numbers):
                raise ValueError("a time, energy or idle power that is not a finite number >= 0")
        except (ValueError, KeyError, TypeError) as exc:
            raise HetplanError(f"{opts.plans} is not a plans file ({exc})", field="--energy-plans",
                               fix="give the plans.json written by 'hetplan energy frontier PLAN.json'") from None
        if got != (num_stages, num_microbatches, schedule):
            raise HetplanError(f"{opts.plans} plans {got[0]} stages x {got[1]} micro-batches ({got[2]}), the run has "
                               f"{num_stages} x {num_microbatches} ({schedule})", field="--energy-plans",
                               fix="compute the frontier for this plan: hetplan energy frontier PLAN.json -o DIR")
        if not plans:
            raise HetplanError(f"{opts.plans} holds no plans", field="--energy-plans",
                               fix="give the plans.json written by 'hetplan energy frontier PLAN.json'")
        sched: dict = {"kind": "frontier_pick", "plans": plans, "idle_power_w": float(idle)}
        if opts.target_time_s is not None:
            from hetplan.energy.server.schedulers import check_target

            check_target(plans, opts.target_time_s, "--energy-target-s")  # before the server gets a job it refuses
            sched["target_time_s"] = opts.target_time_s
        return {**base, "scheduler": sched}
    gpus = _stage_gpus(plan)
    freqs = opts.frequencies_mhz
    if freqs is not None:  # a clock above the GPU's top one cannot be locked (NVML refuses it: the rank then ran
        for g in sorted(set(gpus)):  # the whole sweep at its default clock and reported it as that clock's profile)
            try:
                top = get_power(g).max_frequency_mhz
            except HetplanError:  # no DVFS data for this GPU: its clocks are unknown
                continue
            if max(freqs) > top:
                raise HetplanError(f"{max(freqs)} MHz is above the top SM clock of the plan's {g} ({top} MHz)",
                                   field="--energy-frequencies",
                                   fix=f"sweep clocks the GPU supports, at most {top} MHz (nvidia-smi -q -d "
                                       "SUPPORTED_CLOCKS)")
    if freqs is None:
        common = None
        for g in set(gpus):
            clocks = set(get_power(g).frequencies_mhz)  # raises for a GPU without a DVFS model
            common = clocks if common is None else common & clocks
        if not common:
            raise HetplanError(f"the plan's GPUs ({', '.join(sorted(set(gpus)))}) share no SM clock to profile",
                               field="--energy-frequencies", fix="list the clocks to sweep, e.g. 1410,1200,1005")
        freqs = tuple(sorted(common, reverse=True))
    cat = load_catalog()
    idle = sum(cat.get(g).idle_power_w for g in gpus) / len(gpus)
    then: dict = {"idle_power_w": idle}
    if opts.target_time_s is not None:
        then["target_time_s"] = opts.target_time_s
    return {**base, "scheduler": {"kind": "online_profiling", "frequencies_mhz": list(freqs), "then": then}}


def prepare_job(plan, plan_path: str | Path, num_stages: int, num_microbatches: int, schedule: str,
                opts: EnergyOptions) -> str:
    """Create the run's job on the server (idempotent for the same spec); returns the job id.

    Raises:
        HetplanError: as :func:`job_spec`; the server unreachable or refusing the job (e.g. the id exists with
            another spec: give another ``--energy-job``).
    """
    from hetplan.energy.client import PlanClient

    spec = job_spec(plan, Path(plan_path).read_bytes(), num_stages, num_microbatches, schedule, opts)
    client = PlanClient(opts.server, spec["job_id"], 0, 0, token=opts.token, retries=3)
    try:
        client.create_job(spec)
    finally:
        client.close()
    return spec["job_id"]


class RankLoop:
    """One rank's side of the loop (module doc): register, then per timed iteration fetch, apply and report.

    Args:
        server, job_id: the plan server and job. rank: global rank. stage: pipeline stage (``pp_rank``).
        gpu_name: the plan's GPU of this stage (catalog name) for the CPU power model.
        device: the torch device; on ``cuda`` NVML is opened for ``device.index``.

    Raises:
        HetplanError: the server refused the registration or cannot be reached.
    """

    def __init__(self, server: str, job_id: str, rank: int, stage: int, gpu_name: str, device):
        from hetplan.energy.client import IterationRunner, PlanClient

        self.client = PlanClient(server, job_id, rank, stage)
        self.client.register()
        gpu, sync, power_w, idle = None, None, None, 0.0
        from hetplan.energy.nvml import SIMULATED_ENV, nvml_device, open_gpu

        if device.type == "cuda":
            import torch

            gpu, sync = open_gpu(nvml_device(device.index or 0)), torch.cuda.synchronize
        elif os.environ.get(SIMULATED_ENV):  # CPU: the NVML path on a simulated board (energy.nvml.SimulatedNvml)
            gpu = open_gpu(rank)
        if gpu is None:
            try:
                spec = load_catalog().get(gpu_name)
                pw = board_limited(get_power(gpu_name), spec.tdp_w, spec.idle_power_w)  # the default limit
            except HetplanError:
                pw = None  # no DVFS model (e.g. a "cpu" pool): frequencies recorded, no energy
            if pw is not None:
                idle = spec.idle_power_w

                def power_w(f: int, pw=pw, idle=idle) -> float:
                    return float(pw.busy_power_w(pw.effective_frequency_mhz(f, idle), idle))
        self.runner = IterationRunner(self.client, gpu=gpu, sync=sync, power_w=power_w, idle_power_w=idle)
        self.iterations: list[dict] = []
        self._active = False

    def attach(self, stages) -> None:
        """Wrap each PipelineStage's ``forward_one_chunk`` / ``backward_one_chunk`` (module doc, hook point)."""
        for st in stages:
            for kind, name in (("forward", "forward_one_chunk"), ("backward", "backward_one_chunk")):
                setattr(st, name, self._metered(kind, getattr(st, name)))

    def _metered(self, kind: str, call):
        def run(chunk_id, *args, **kwargs):
            with self.instruction(kind, int(chunk_id)):
                return call(chunk_id, *args, **kwargs)

        return run

    def instruction(self, kind: str, microbatch: int):
        """Context of one instruction at its planned clock; a no-op outside :meth:`begin` / :meth:`end`
        (warm-up iterations run at the default clocks and are not reported)."""
        return self.runner.instruction(kind, microbatch) if self._active else contextlib.nullcontext()

    def begin(self) -> None:
        """Fetch this iteration's schedule (call after a barrier: every rank has reported the previous one)."""
        self.runner.begin()
        self._active = True

    def end(self) -> None:
        """Report the iteration to the server."""
        self._active = False
        self.iterations.append(self.runner.end())

    def close(self) -> dict:
        """Release the clock lock and the connection; returns this rank's record for the run result:
        ``{"stage", "energy_source", "iterations", "frequency_log"}``."""
        if self.runner.gpu is not None:
            self.runner.gpu.reset()
        self.client.close()
        return {"stage": self.client.stage, "energy_source": self.runner.energy_source, "iterations": self.iterations,
                "frequency_log": self.runner.frequency_log}


def instruction(loop: RankLoop | None, kind: str, microbatch: int):
    """``loop.instruction(kind, microbatch)``, or a no-op without a loop."""
    return contextlib.nullcontext() if loop is None else loop.instruction(kind, microbatch)


def run_summary(server: str, job_id: str, ranks: list[dict]) -> dict:
    """The run result's ``energy`` entry from every rank's :meth:`RankLoop.close` record: per iteration, the
    slowest rank's time, the sum of the ranks' energies (None if a rank has none) and the schedules run."""
    per: dict[int, list[dict]] = {}
    for r in ranks:
        for it in r["iterations"]:
            per.setdefault(it["iteration"], []).append(it)
    iters = []
    for k in sorted(per):
        rows = per[k]
        e = [x["energy_j"] for x in rows]
        iters.append({"iteration": k, "time_s": max(x["time_s"] for x in rows),
                      "energy_j": None if any(v is None for v in e) else sum(e),
                      "schedule_ids": sorted({x["schedule_id"] for x in rows})})
    sources = sorted({r["energy_source"] or "none" for r in ranks})
    return {"server": server, "job_id": job_id, "energy_source": "+".join(sources),
            "energy_measured": sources == ["nvml"], "iterations": iters}


def trainer_args(opts: EnergyOptions, job_id: str) -> list[str]:
    """The trainer's command-line arguments for the loop."""
    return ["--energy-server", opts.server, "--energy-job", job_id]


def stage_gpu(plan, stage: int) -> str:
    """Catalog name of the GPU that runs pipeline stage ``stage`` of ``plan``."""
    return _stage_gpus(plan)[stage]
