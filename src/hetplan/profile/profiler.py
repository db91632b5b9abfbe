"""The torch profiler: times one transformer layer, the embedding and the head (with its loss), forward and
backward, and the collectives, on whatever device this host has; writes into a :class:`ProfileDB`.

Layers (:func:`profile_layers`): for every ``(kind, dtype, tp, seq_len, mbs)`` point not yet in the database
(resumable: points already stored for this device and software version are skipped), build the part
(:func:`hetplan.profile.torchparts.build_stage`: random weights; TP > 1 sharded with DTensor over ``tp`` local
processes started with torchrun), run ``warmup`` untimed and ``repeats`` timed forward + backward passes of one
micro-batch and store the medians (CUDA events on GPU, ``perf_counter`` on CPU). Peak memory of the point: on GPU
``torch.cuda.max_memory_allocated`` during the passes; on CPU the parameter bytes plus the peak of bytes saved for
backward (:class:`hetplan.profile.torchparts.SavedTensorMeter`).

Collectives (:func:`profile_collectives`): all-reduce, all-gather, reduce-scatter and send/recv over ``world_size``
local ranks (gloo on CPU, nccl on GPU) for several message sizes; median of repeats; bus bandwidth as in
NCCL-tests (``docs/PERFORMANCE.md`` of nvidia/nccl-tests: all-reduce algbw x 2(n-1)/n, all-gather and
reduce-scatter x (n-1)/n). Collectives a backend lacks are skipped and reported.

Entry point for the torchrun workers: ``python -m hetplan.profile.profiler {layers|comm} SPEC.json OUT.json``.
Imports torch lazily (only inside the functions that measure).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Iterable

from hetplan.errors import HetplanError
from hetplan.model.spec import ModelSpec
from hetplan.profile.db import CommRecord, LayerRecord, LayerShape, ProfileDB, normalize_device

KINDS = ("layer", "embedding", "head")
COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "send-recv")


@dataclass(frozen=True)
class Point:
    """One layer-profile point."""

    kind: str
    dtype: str
    tp: int
    seq_len: int
    mbs: int


def _host() -> tuple[str, str]:
    """(device name as stored, software) of this host, importing torch."""
    from hetplan.profile import torchparts
    import torch

    dev = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    return normalize_device(torchparts.device_name(dev)), torchparts.software_version()


#: Largest micro-batch profiled: a plan's largest global batch (:class:`hetplan.plan.JobSpec`, 65,536 sequences).
MAX_MBS = 65536
#: Bytes a point may need, as a multiple of its layer's stored activations without recomputation
#: (:func:`hetplan.model.counts.layer_activation_bytes`): the forward's saved tensors, the backward's gradients of
#: as many, and the transient working set (:data:`hetplan.estimate.memory.BACKWARD_WORKING_SET`, 1.72) — a bound
#: for refusing a point before torch asks the allocator for it.
POINT_ACTIVATION_FACTOR = 4.0


def _device_memory_bytes() -> int:
    """Memory of the device the points run on: the GPU's free memory, else the host's physical memory."""
    import torch

    if torch.cuda.is_available():
        return int(torch.cuda.mem_get_info()[0])
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def check_point_memory(spec: ModelSpec, points: Iterable[Point], available_bytes: int) -> None:
    """Refuse a point whose layer would need more than ``available_bytes`` (:data:`POINT_ACTIVATION_FACTOR` x its
    activations at the point's dtype): on a CPU the allocator overcommits such a request and the kernel's
    out-of-memory killer ends the process minutes later (mbs 65,536 x 512 tokens of the 128-wide tiny model: killed
    after 100 s), where a request beyond the address space fails at once.

    Raises:
        HetplanError: naming ``--mbs/--seq-len``, the point and the device's bytes.
    """
    from hetplan.model import counts

    for p in points:
        width = 4 if p.dtype == "fp32" else 2
        need = POINT_ACTIVATION_FACTOR * float(counts.layer_activation_bytes(
            spec, p.mbs, p.seq_len, p.tp, recompute="none", attention="flash")) * width / 2
        if need > available_bytes:
            raise HetplanError(f"{p.kind} ({p.dtype}) at mbs {p.mbs:,} x seq_len {p.seq_len:,} needs about "
                               f"{need / 2**30:,.0f} GiB, more than this device's {available_bytes / 2**30:,.0f} GiB",
                               field="--mbs/--seq-len", fix="profile smaller micro-batches or sequences")


def plan_points(db: ProfileDB, spec: ModelSpec, *, device: str, software: str, dtypes: Iterable[str],
                mbs: Iterable[int], seq_lens: Iterable[int], tps: Iterable[int] = (1,),
                kinds: Iterable[str] = KINDS) -> tuple[list[Point], int]:
    """The points still to measure (and how many are already stored for this device and software).

    Raises:
        HetplanError: unknown kind or dtype, TP that does not divide the heads, non-positive sizes, a sequence
            longer than the model's positions (``--seq-len 100000`` on a 512-position model ran for minutes
            timing attention no plan can use; plans refuse it too, ``plan_rules``), or a micro-batch above the
            largest global batch (65,536 sequences, :class:`hetplan.plan.JobSpec`).
    """
    todo, done = [], 0
    for k in kinds:
        if k not in KINDS:
            raise HetplanError(f"unknown kind {k!r}", field="--kinds", fix=f"use {', '.join(KINDS)}")
    for d in dtypes:
        if d not in ("fp32", "bf16", "fp16"):
            raise HetplanError(f"unknown dtype {d!r}", field="--dtype", fix="use fp32, bf16 or fp16")
    for v, name in ((list(mbs), "--mbs"), (list(seq_lens), "--seq-len"), (list(tps), "--tp")):
        if not v or min(v) < 1:
            raise HetplanError(f"{name} needs positive integers, got {v}", field=name, fix=f"e.g. {name} 1,2,4")
    for t in tps:
        for what, n in (("num_attention_heads", spec.num_attention_heads), ("num_kv_heads", spec.num_kv_heads),
                        ("ffn_hidden_size", spec.ffn_hidden_size)):
            if n % t:
                raise HetplanError(f"TP = {t} does not divide {what} = {n}", field="--tp",
                                   fix=f"choose TP degrees that divide {n}")
    long = [x for x in seq_lens if x > spec.max_seq_len]
    if long:
        raise HetplanError(f"seq_len {long[0]:,} is longer than {spec.name} allows ({spec.max_seq_len:,} positions)",
                           field="--seq-len", fix=f"profile sequences of at most {spec.max_seq_len:,} tokens")
    big = [b for b in mbs if b > MAX_MBS]
    if big:
        raise HetplanError(f"micro-batch {big[0]:,} is above {MAX_MBS:,} sequences, the largest global batch a plan "
                           "takes", field="--mbs", fix=f"profile micro-batches of at most {MAX_MBS:,}, e.g. --mbs 1,2,4")
    for d in dtypes:
        for t in tps:
            for s in seq_lens:
                for b in mbs:
                    for k in kinds:
                        if db.has_layer(device, d, k, LayerShape.of(spec, k), b, s, t, software):
                            done += 1
                        else:
                            todo.append(Point(k, d, t, s, b))
    return todo, done


def measure_point(spec: ModelSpec, p: Point, *, tp_mesh=None, warmup: int = 2, repeats: int = 5,
                  seed: int = 0, stat: str = "median") -> dict:
    """Measure one point on this process's device (a TP group's ranks call it together). Returns
    ``{"forward_s", "backward_s", "peak_memory_bytes", "repeats"}``."""
    import torch

    from hetplan.profile import torchparts

    dev = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    dtype = torchparts.torch_dtype(p.dtype)
    first, last = p.kind == "embedding", p.kind == "head"
    end = 1 if p.kind == "layer" else 0
    mod = torchparts.build_stage(spec, 0, end, first, last, tp_mesh=tp_mesh, dtype=dtype, device=dev, seed=seed)
    x = torchparts.sample_input(spec, first, p.mbs, p.seq_len, dtype, dev, seed=seed)
    target = torch.randint(0, spec.vocab_size, (p.mbs, p.seq_len)).to(dev) if last else None
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
        torch.cuda.reset_peak_memory_stats(dev)
        base = torch.cuda.memory_allocated(dev)
    f, b = torchparts.time_forward_backward(mod, x, last=last, target=target, warmup=warmup, repeats=repeats,
                                                stat=stat)
    if dev.type == "cuda":
        peak = torch.cuda.max_memory_allocated(dev) - base + sum(q.numel() * q.element_size() for q in mod.parameters())
    else:
        meter = torchparts.SavedTensorMeter(exclude=mod)
        with meter.track():
            out = mod(x)
            if last:
                out = torchparts.loss_fn(out, target)
        del out
        torchparts.collect()
        peak = meter.peak_bytes + sum(torchparts._local(q).numel() * torchparts._local(q).element_size()
                                      for q in mod.parameters())
    del mod
    return {"forward_s": f, "backward_s": b, "peak_memory_bytes": float(peak), "repeats": repeats}


def profile_layers(db: ProfileDB, spec: ModelSpec, *, dtypes: Iterable[str] = ("bf16",), mbs: Iterable[int] = (1,),
                   seq_lens: Iterable[int] = (2048,), tps: Iterable[int] = (1,), kinds: Iterable[str] = KINDS,
                   warmup: int = 2, repeats: int = 5, threads: int | None = None, stat: str = "median",
                   progress: Callable[[int, int, Point], None] | None = None) -> dict:
    """Measure the missing points and store them (see module doc). Returns ``{"measured", "skipped", "device",
    "software"}``. ``progress(done, total, point)`` is called after each point (TP > 1 points: after each torchrun
    launch, which measures all points of one TP degree).

    Raises:
        HetplanError: bad arguments (see :func:`plan_points`), torch missing, a TP worker failed, a point that
            does not fit the device's memory (naming its micro-batch and sequence).
    """
    try:
        import torch
    except ImportError:
        raise HetplanError("profiling needs torch", field="hetplan[torch]", fix="pip install 'hetplan[torch]'") from None
    if threads and not torch.cuda.is_available():
        torch.set_num_threads(threads)
    device, software = _host()
    todo, done = plan_points(db, spec, device=device, software=software, dtypes=list(dtypes), mbs=list(mbs),
                             seq_lens=list(seq_lens), tps=list(tps), kinds=list(kinds))
    check_point_memory(spec, todo, _device_memory_bytes())
    total, n = len(todo), 0
    for p in [q for q in todo if q.tp == 1]:
        try:
            r = measure_point(spec, p, warmup=warmup, repeats=repeats, stat=stat)
        except RuntimeError as exc:  # torch.OutOfMemoryError is one; the CPU allocator raises a plain RuntimeError
            if not (isinstance(exc, torch.OutOfMemoryError) or "can't allocate memory" in str(exc)):
                raise
            raise HetplanError(f"{p.kind} ({p.dtype}) at mbs {p.mbs} x seq_len {p.seq_len} does not fit the memory "
                               f"of {device}: {str(exc).splitlines()[0][:200]}", field="--mbs/--seq-len",
                               fix=f"profile smaller micro-batches or sequences ({n} points measured so far are "
                                   "stored; a rerun resumes)") from None
        db.add_layer(_record(spec, p, r, device, software))
        n += 1
        if progress:
            progress(n, total, p)
    by_tp: dict[int, list[Point]] = {}
    for p in todo:
        if p.tp > 1:
            by_tp.setdefault(p.tp, []).append(p)
    for t, pts in by_tp.items():
        results = _torchrun_worker("layers", t, {"spec": spec.model_dump(), "points": [asdict(p) for p in pts],
                                                 "warmup": warmup, "repeats": repeats, "threads": threads or 1,
                                                 "stat": stat})
        for p, r in zip(pts, results):
            db.add_layer(_record(spec, p, r, device, software), commit=False)
        db.commit()
        n += len(pts)
        if progress:
            progress(n, total, pts[-1])
    return {"measured": n, "skipped": done, "device": device, "software": software}


def _record(spec: ModelSpec, p: Point, r: dict, device: str, software: str) -> LayerRecord:
    return LayerRecord(device=device, dtype=p.dtype, kind=p.kind, shape=LayerShape.of(spec, p.kind), mbs=p.mbs,
                       seq_len=p.seq_len, tp=p.tp, forward_s=r["forward_s"], backward_s=r["backward_s"],
                       peak_memory_bytes=r["peak_memory_bytes"], repeats=r["repeats"], source="hetplan-profiler",
                       software=software)


def profile_collectives(db: ProfileDB, *, world_size: int = 2, sizes_bytes: Iterable[int] = (2**16, 2**20, 2**24),
                        collectives: Iterable[str] = COLLECTIVES, repeats: int = 5, timeout_s: float = 300) -> dict:
    """Measure collectives over ``world_size`` local ranks (torchrun) and store them. Returns ``{"measured",
    "skipped_collectives", "device", "backend"}``.

    Raises:
        HetplanError: world size < 2, unknown collective, the workers failed.
    """
    if world_size < 2:
        raise HetplanError("collectives need at least 2 ranks", field="--comm-world-size", fix="use 2 or more")
    colls = list(collectives)
    bad = [c for c in colls if c not in COLLECTIVES]
    if bad:
        raise HetplanError(f"unknown collectives {bad}", field="--collectives", fix=f"use {', '.join(COLLECTIVES)}")
    res = _torchrun_worker("comm", world_size, {"sizes": list(sizes_bytes), "collectives": colls, "repeats": repeats},
                           timeout_s=timeout_s)
    n = 0
    for r in res["records"]:
        db.add_comm(CommRecord(**r), commit=False)
        n += 1
    db.commit()
    return {"measured": n, "skipped_collectives": res["skipped"], "device": res["device"], "backend": res["backend"]}


def _torchrun_worker(mode: str, nproc: int, payload: dict, timeout_s: float = 900):
    with tempfile.TemporaryDirectory(prefix="hetplan-profile-") as tmp:
        spec_file, out_file = Path(tmp) / "in.json", Path(tmp) / "out.json"
        spec_file.write_text(json.dumps(payload))
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
               "-m", "hetplan.profile.profiler", mode, str(spec_file), str(out_file)]  # see runtime.launcher
        env = dict(os.environ, OMP_NUM_THREADS=str(payload.get("threads", 1)))
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env)
        if proc.returncode != 0 or not out_file.is_file():
            tail = "\n".join(l for l in proc.stderr.splitlines() if not l.startswith("[W"))[-2500:]
            raise HetplanError(f"profiling workers failed (exit {proc.returncode}):\n{tail}", field="profile",
                               fix="rerun with fewer points or check the device")
        return json.loads(out_file.read_text())


# -- torchrun worker side ------------------------------------------------------------------------------------------

def _worker(mode: str, spec_file: str, out_file: str) -> None:
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    from hetplan.profile import torchparts

    payload = json.loads(Path(spec_file).read_text())
    cuda = torch.cuda.is_available()
    local = int(os.environ.get("LOCAL_RANK", 0))
    if cuda:
        torch.cuda.set_device(local)
    else:
        torch.set_num_threads(int(payload.get("threads", 1)))
    backend = "nccl" if cuda else "gloo"
    dist.init_process_group(backend, timeout=timedelta(seconds=300))
    rank, world = dist.get_rank(), dist.get_world_size()
    succeeded = False
    try:
        if mode == "layers":
            from torch.distributed.device_mesh import init_device_mesh

            mesh = init_device_mesh("cuda" if cuda else "cpu", (world,), mesh_dim_names=("tp",))
            spec = ModelSpec(**payload["spec"])
            out = []
            for p in payload["points"]:
                r = measure_point(spec, Point(**p), tp_mesh=mesh, warmup=payload["warmup"], repeats=payload["repeats"],
                                  stat=payload.get("stat", "median"))
                # A TP group is as slow as its slowest rank.
                vals = [None] * world
                dist.all_gather_object(vals, r)
                out.append({"forward_s": max(v["forward_s"] for v in vals),
                            "backward_s": max(v["backward_s"] for v in vals),
                            "peak_memory_bytes": max(v["peak_memory_bytes"] for v in vals), "repeats": r["repeats"]})
            result = out
        else:
            result = _comm_bench(payload, backend, cuda, rank, world)
        if rank == 0:
            Path(out_file).write_text(json.dumps(result))
        succeeded = True
    finally:
        torchparts.finish_process_group(succeeded)


def _comm_bench(payload: dict, backend: str, cuda: bool, rank: int, world: int) -> dict:
    import torch
    import torch.distributed as dist

    from hetplan.profile import torchparts

    dev = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    device = normalize_device(torchparts.device_name(dev))
    software = torchparts.software_version()
    records, skipped = [], []
    n = world
    for coll in payload["collectives"]:
        for size in payload["sizes"]:
            elems = max(n, int(size) // 4 // n * n)
            nbytes = elems * 4
            buf = torch.ones(elems, dtype=torch.float32, device=dev)
            shard = torch.empty(elems // n, dtype=torch.float32, device=dev)

            def op():
                if coll == "all-reduce":
                    dist.all_reduce(buf)
                elif coll == "all-gather":
                    dist.all_gather_into_tensor(buf, shard)
                elif coll == "reduce-scatter":
                    dist.reduce_scatter_tensor(shard, buf)
                elif rank in (0, 1):  # send/recv between ranks 0 and 1
                    if rank == 0:
                        dist.send(buf, 1)
                    else:
                        dist.recv(buf, 0)

            try:
                times = []
                for i in range(1 + payload["repeats"]):
                    dist.barrier()
                    torchparts._sync(dev)
                    t0 = time.perf_counter()
                    op()
                    torchparts._sync(dev)
                    if i:
                        times.append(time.perf_counter() - t0)
            except (RuntimeError, NotImplementedError) as exc:
                skipped.append(f"{coll}: {str(exc).splitlines()[0][:120]}")
                dist.barrier()
                break
            t = torch.tensor([statistics.median(times)], dtype=torch.float64, device=dev)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)  # the slowest rank's time
            ts = float(t[0])
            factor = {"all-reduce": 2 * (n - 1) / n, "all-gather": (n - 1) / n, "reduce-scatter": (n - 1) / n}.get(coll, 1.0)
            records.append(asdict(CommRecord(device=device, backend=backend, collective=coll,
                                             world_size=2 if coll == "send-recv" else n, message_bytes=float(nbytes),
                                             time_s=ts, bandwidth_bytes_per_s=nbytes / ts * factor,
                                             source="hetplan-profiler", software=software)))
    return {"records": records, "skipped": skipped, "device": device, "backend": backend}


if __name__ == "__main__":
    _worker(*sys.argv[1:4])
    from hetplan.profile import torchparts

    torchparts.exit_rank(0)  # no interpreter finalization racing gloo's worker threads (see exit_rank)
