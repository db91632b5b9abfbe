"""Start the ranks of a plan with torchrun (``python -m torch.distributed.run``) and collect their results.

Local (one node, the default): ``torchrun --standalone --nproc-per-node N -m hetplan.runtime.trainer PLAN``.
``--standalone`` binds the rendezvous store to port 0 (the OS picks a free port as it binds) under a random
rendezvous id, so two local runs never meet, and no port is chosen first and bound later (another process could
take it in between; torchrun's c10d backend then joins whatever listens there as a client).
Multi-node: the usual torchrun rendezvous arguments, run the same command on every node::

    hetplan run PLAN.json --nnodes 2 --node-rank 0 --rdzv-endpoint host0:29500   # on node 0
    hetplan run PLAN.json --nnodes 2 --node-rank 1 --rdzv-endpoint host0:29500   # on node 1

(``--rdzv-backend c10d``; ranks ``node_rank * nproc_per_node + local_rank``, so pipeline stages — blocks of
``dp * tp`` consecutive ranks — stay inside nodes when ``dp * tp`` divides the GPUs per node.)

This module does not import torch (torchrun runs in a child process); it checks the plan first so bad input fails
fast with a :class:`~hetplan.errors.HetplanError`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path

from hetplan.errors import HetplanError
from hetplan.runtime import children, energy_loop, planio

#: Most local processes on a CPU-only host unless ``max_procs`` says otherwise.
DEFAULT_MAX_CPU_PROCS = 16
#: Compute dtypes the trainer runs in (``--dtype``).
DTYPES = ("fp32", "bf16", "fp16")
#: Data-parallel implementations of the trainer (``--dp-mode``).
DP_MODES = ("ddp", "fsdp")
#: Longest run accepted (s): one week; a longer wall-clock limit is a typo.
MAX_TIMEOUT_S = 7 * 86400.0


@dataclass
class RunOptions:
    """How to run a plan.

    Attributes:
        iterations, warmup: timed and untimed iterations.
        schedule: override of the plan's pipeline schedule (``1f1b``, ``gpipe``, ``interleaved``).
        virtual_stages: model chunks per rank for the interleaved schedule.
        dp_mode: ``ddp`` or ``fsdp`` (default: fsdp when the plan has ZeRO-3, else ddp).
        dtype: ``fp32``/``bf16``/``fp16`` (default: the plan's dtype on GPU, fp32 on CPU).
        nnodes, node_rank, rdzv_endpoint, rdzv_backend: torchrun rendezvous (multi-node).
        max_procs: most ranks per node (default: visible GPUs, or :data:`DEFAULT_MAX_CPU_PROCS` on CPU).
        timeout_s: wall-clock limit of the whole run.
        stage_repeats, stage_stat: repeats of the isolated stage timing and their statistic (median or min).
        threads: torch intra-op threads per rank on CPU.
        energy: run the timed iterations under the frequency plan server (:mod:`hetplan.runtime.energy_loop`).
    """

    iterations: int = 3
    warmup: int = 1
    schedule: str | None = None
    virtual_stages: int = 2
    dp_mode: str | None = None
    dtype: str | None = None
    nnodes: int = 1
    node_rank: int = 0
    rdzv_endpoint: str | None = None
    rdzv_backend: str = "c10d"
    max_procs: int | None = None
    timeout_s: float = 600.0
    stage_repeats: int = 5
    stage_stat: str = "median"
    threads: int = 1
    extra_env: dict = field(default_factory=dict)
    energy: energy_loop.EnergyOptions | None = None


def check_options(opts: RunOptions) -> None:
    """Refuse options the trainer would reject, before any process starts (issue 17: ``--dtype fp8`` used to fail
    only inside 4 started ranks).

    Raises:
        HetplanError: naming the option: an unknown dtype / DP mode / schedule, a timeout that is not a positive
            finite number of seconds (at most :data:`MAX_TIMEOUT_S`), counts below their minimum, a node rank
            outside ``0 .. nnodes-1``, or a rendezvous endpoint that is not ``HOST:PORT``.
    """
    import math

    from hetplan.runtime.planio import SCHEDULES

    if opts.dtype == "fp8":
        raise HetplanError("the trainer has no FP8 path (no Transformer Engine or float8 linear layers in it)",
                           field="--dtype", fix=f"run in one of {', '.join(DTYPES)}; to train the plan in FP8, "
                           "export it (`hetplan export --to megatron`)")
    for flag, value, allowed in (("--dtype", opts.dtype, DTYPES), ("--dp-mode", opts.dp_mode, DP_MODES),
                                 ("--schedule", opts.schedule, SCHEDULES)):
        if value is not None and value not in allowed:
            raise HetplanError(f"unknown value {value!r}", field=flag, fix=f"use one of {', '.join(allowed)}")
    t = opts.timeout_s
    if not isinstance(t, (int, float)) or not math.isfinite(t) or not 0 < t <= MAX_TIMEOUT_S:
        raise HetplanError(f"must be a positive number of seconds, at most {MAX_TIMEOUT_S:.0f} (one week); got {t}",
                           field="--timeout", fix="give the run's wall-clock limit in seconds, e.g. --timeout 600")
    for flag, value, low in (("--iterations", opts.iterations, 1), ("--warmup", opts.warmup, 0),
                             ("--virtual-stages", opts.virtual_stages, 1), ("--nnodes", opts.nnodes, 1),
                             ("--node-rank", opts.node_rank, 0), ("--threads", opts.threads, 1),
                             ("--max-procs", opts.max_procs if opts.max_procs is not None else 1, 1),
                             ("--stage-repeats", opts.stage_repeats, 1)):
        if not isinstance(value, int) or value < low:
            raise HetplanError(f"must be an integer >= {low}, got {value!r}", field=flag, fix=f"give {flag} >= {low}")
    if opts.node_rank >= opts.nnodes:
        raise HetplanError(f"node rank {opts.node_rank} is not below --nnodes {opts.nnodes}", field="--node-rank",
                           fix=f"number the nodes 0 .. {opts.nnodes - 1}")
    if opts.rdzv_endpoint is not None:
        host, _, port = opts.rdzv_endpoint.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise HetplanError(f"got {opts.rdzv_endpoint!r}", field="--rdzv-endpoint",
                               fix="give HOST:PORT of node 0, e.g. node0:29500")


def _visible_gpus() -> int:
    """GPUs visible to this node, without importing torch (nvidia-smi; 0 if absent)."""
    if os.environ.get("CUDA_VISIBLE_DEVICES") == "":
        return 0
    smi = shutil.which("nvidia-smi")
    if not smi:
        return 0
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    n = sum(1 for line in out.splitlines() if line.startswith("GPU "))
    vis = os.environ.get("CUDA_VISIBLE_DEVICES")
    return min(n, len(vis.split(","))) if vis else n


def host_memory_bytes() -> int:
    """Memory this host can give new processes (bytes): ``MemAvailable`` of ``/proc/meminfo`` (Linux), else its
    physical memory (``os.sysconf``)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def check_host_memory(plan, spec, lay: planio.Layout, opts: RunOptions, available_bytes: int | None = None) -> None:
    """A run on CPU keeps every rank's stage in host memory: its weights, gradients, AdamW states and activations
    in the run's dtype (fp32 unless ``--dtype``), the estimate's breakdown of each stage of the plan as the trainer
    runs it (:func:`hetplan.runtime.planio.as_run`: no recomputation, DDP replicated) mapped to them by
    :func:`hetplan.runtime.planio.predicted_memory_bytes`, times the stage's ``dp · tp`` ranks, over the nodes.
    Ranks that need more than the host has would be killed by the kernel or swap until ``--timeout``: refused
    before any starts. ``available_bytes``: default :func:`host_memory_bytes`.

    Raises:
        HetplanError: the ranks on this node need more memory than it has (field ``plan``)."""
    from hetplan.estimate.estimator import estimate
    from hetplan.hardware.catalog import Catalog, load_catalog

    element = 2 if opts.dtype in ("bf16", "fp16") else 4
    cat = load_catalog()

    def listed(name: str) -> bool:
        try:
            cat.get(name)
        except HetplanError:
            return False
        return True

    # a pool of a GPU type the catalog does not list (``cpu``: hetplan verify's measured host) takes a data-centre
    # GPU's entry: the breakdown of weights, gradients, optimizer states and activations does not depend on speed
    stand_in = cat.get("A100-SXM-80GB")
    cat = Catalog({**cat.gpus, **{p.gpu: stand_in.model_copy(update={"name": p.gpu, "aliases": ()})
                                  for p in plan.pools if not listed(p.gpu)}}, cat.date)
    est = estimate(planio.as_run(plan, lay, opts.dp_mode), catalog=cat, model=spec)
    need = sum(planio.predicted_memory_bytes(st.memory, element) for st in est.stages) * lay.dp * lay.tp / opts.nnodes
    have = host_memory_bytes() if available_bytes is None else available_bytes
    if need > have:
        raise HetplanError(f"the run's {lay.world_size // opts.nnodes} ranks on this host need about {need / 2**30:,.1f} "
                           f"GiB of memory ({spec.name}'s weights, gradients, AdamW states and activations in "
                           f"{'fp32' if element == 4 else opts.dtype}); it has {have / 2**30:,.1f} GiB available",
                           field="plan", fix="run a smaller model (e.g. examples/tiny-model.json) or a plan of fewer "
                                             "data-parallel ranks, --dtype bf16, or more nodes (--nnodes)")


def torchrun_command(plan_path: str | Path, world_size: int, opts: RunOptions, out: str | Path,
                     energy_job: str | None = None) -> list[str]:
    """The torchrun command line that runs ``plan_path`` (see module doc).

    Raises:
        HetplanError: ``world_size`` is not divisible by ``nnodes``.
    """
    if world_size % opts.nnodes:
        raise HetplanError(f"{world_size} ranks cannot be spread evenly over {opts.nnodes} nodes", field="--nnodes",
                           fix="choose a node count that divides the plan's pp * dp * tp")
    nproc = world_size // opts.nnodes
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc)]
    if opts.nnodes == 1 and not opts.rdzv_endpoint:
        cmd += ["--standalone"]  # c10d store on a port the OS assigns at bind time, a fresh rendezvous id
    else:
        if not opts.rdzv_endpoint:
            raise HetplanError("multi-node runs need a rendezvous endpoint", field="--rdzv-endpoint",
                               fix="pass --rdzv-endpoint HOST:PORT of node 0 on every node")
        cmd += ["--nnodes", str(opts.nnodes), "--node-rank", str(opts.node_rank), "--rdzv-backend", opts.rdzv_backend,
                "--rdzv-endpoint", opts.rdzv_endpoint]
    cmd += ["-m", "hetplan.runtime.trainer", str(plan_path), "--out", str(out), "--iterations", str(opts.iterations),
            "--warmup", str(opts.warmup), "--virtual-stages", str(opts.virtual_stages),
            "--stage-repeats", str(opts.stage_repeats), "--stage-stat", opts.stage_stat, "--threads", str(opts.threads)]
    for flag, val in (("--schedule", opts.schedule), ("--dp-mode", opts.dp_mode), ("--dtype", opts.dtype)):
        if val:
            cmd += [flag, val]
    if opts.energy is not None and energy_job is not None:
        cmd += energy_loop.trainer_args(opts.energy, energy_job)
    return cmd


def run_plan(plan_path: str | Path, opts: RunOptions | None = None) -> dict:
    """Run a plan for real and return rank 0's results (see :func:`hetplan.runtime.trainer.run_rank`);
    on nodes other than 0 of a multi-node run, returns ``{}``.

    Raises:
        HetplanError: bad options (:func:`check_options`), bad plan (see :func:`hetplan.runtime.planio.layout`),
            more ranks per node than allowed, ranks on CPU that need more memory than the host has
            (:func:`check_host_memory`), torch missing, or the ranks failed / timed out (with the tail of their
            log; no rank is left running, :func:`_supervise`).
    """
    opts = opts or RunOptions()
    check_options(opts)
    plan = planio.load_plan(plan_path)
    spec = planio.plan_model(plan)
    gpus = _visible_gpus()
    if gpus and opts.dtype is None and plan.job.dtype not in DTYPES:  # an FP8 plan runs in the plan's dtype on GPU
        check_options(replace(opts, dtype=plan.job.dtype))
    per_node = opts.max_procs or (gpus if gpus else DEFAULT_MAX_CPU_PROCS)
    lay = planio.layout(plan, spec, schedule=opts.schedule, virtual_stages=opts.virtual_stages,
                        max_world_size=per_node * opts.nnodes)
    if not gpus:  # ranks on CPU hold their stages in host memory
        check_host_memory(plan, spec, lay, opts)
    try:
        import importlib.util

        if importlib.util.find_spec("torch") is None:
            raise ImportError
    except ImportError:
        raise HetplanError("the runtime needs torch", field="hetplan[torch]",
                           fix="pip install 'hetplan[torch]'") from None
    job = None
    if opts.energy is not None:  # before any rank starts: a bad server, token or plans file fails here
        job = energy_loop.prepare_job(plan, plan_path, lay.pp, lay.num_microbatches, lay.schedule, opts.energy)
    with tempfile.TemporaryDirectory(prefix="hetplan-run-") as tmp:
        out = Path(tmp) / "result.json"
        cmd = torchrun_command(Path(plan_path).resolve(), lay.world_size, opts, out, job)
        env = dict(os.environ, OMP_NUM_THREADS=str(opts.threads), **opts.extra_env)
        if opts.energy is not None and opts.energy.token:
            from hetplan.energy.client import TOKEN_ENV

            env[TOKEN_ENV] = opts.energy.token  # not on the command line, where ps shows it
        env[children.LAUNCHER_PID_ENV] = str(os.getpid())
        env.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
        returncode, log = _supervise(cmd, env, opts.timeout_s, Path(tmp))
        if returncode is None:
            raise HetplanError(f"the run did not finish within {opts.timeout_s:g} s (all its ranks were killed):\n"
                               f"{log[-3000:]}", field="--timeout",
                               fix="raise --timeout, or check that all nodes joined the rendezvous")
        if returncode != 0:
            log = "\n".join(l for l in log.splitlines() if not l.startswith("[W"))
            raise HetplanError(f"the ranks failed (exit {returncode}):\n{_root_cause(log)}", field="run",
                               fix="see the error above; rerun the torchrun command by hand for the full log: "
                                   + " ".join(cmd))
        if not out.is_file():
            return {}
        return json.loads(out.read_text())


def _supervise(cmd: list[str], env: dict, timeout_s: float, tmp: Path) -> tuple[int | None, str]:
    """Run torchrun so that no rank outlives this call (:mod:`hetplan.runtime.children`): torchrun in a session of
    its own that dies with this process; on timeout, on any exception (Ctrl-C) and after a failure the whole tree
    is killed. Returns ``(exit code or None on timeout, stderr + stdout)``."""
    me = os.getpid()
    with open(tmp / "stdout.log", "w+b") as so, open(tmp / "stderr.log", "w+b") as se:
        proc = subprocess.Popen(cmd, stdout=so, stderr=se, env=env, start_new_session=True,
                                preexec_fn=lambda: children.die_with_parent(me))
        try:
            code: int | None = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            code = None
        finally:
            children.kill_tree(proc.pid)  # ranks left behind by a failed or killed torchrun, if any
            proc.wait()
        so.seek(0)
        se.seek(0)
        return code, se.read().decode(errors="replace") + so.read().decode(errors="replace")


def _root_cause(log: str, limit: int = 3000) -> str:
    lines = log.splitlines()
    errs = [i for i, l in enumerate(lines) if "Error" in l and ("[rank" in l or l.startswith(("hetplan", "Runtime")))]
    if errs:
        i = errs[0]
        return "\n".join(lines[max(0, i - 5): i + 5])[-limit:]
    return log[-limit:]
