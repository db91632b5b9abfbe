"""The reference trainer: one rank of a plan on ``torch.distributed`` (start it with torchrun, see
:mod:`hetplan.runtime.launcher`). Imports torch.

Per rank:

1. ``init_process_group`` (``nccl`` on GPU, ``gloo`` on CPU) and a ``("pp", "dp", "tp")`` device mesh
   (:class:`~hetplan.runtime.planio.Layout`).
2. Its model chunk(s) (:func:`hetplan.profile.torchparts.build_stage`: random weights, the plan's uneven layer
   split; TP with DTensor); DP with DDP (``--dp-mode ddp``, ZeRO-0) or FSDP2 ``fully_shard`` (``fsdp``, the
   default when the plan asks for ZeRO-3). MoE models with EP > 1: each rank builds its EP group's share of the
   experts (:mod:`hetplan.runtime.expert_parallel`); the expert gradients are reduced over expert-DP after the
   backward (FSDP ignores the experts), the dense ones over DP (by FSDP, or after the backward with "ddp").
3. ``torch.distributed.pipelining``: :class:`PipelineStage` per chunk and ``Schedule1F1B`` / ``ScheduleGPipe`` /
   ``ScheduleInterleaved1F1B`` over the plan's micro-batches (single-stage plans run a plain gradient-accumulation
   loop); AdamW; synthetic tokens (seeded per DP replica).
4. ``warmup`` untimed and ``iterations`` timed iterations (``time.perf_counter`` after a barrier, CUDA synchronised);
   with ``--energy-server`` each timed iteration runs the plan server's frequency schedule and reports time and
   energy (:mod:`hetplan.runtime.energy_loop`).
5. Stage timing in isolation: ranks take turns (one at a time, so ranks sharing CPU cores do not slow each other)
   timing forward and backward of one micro-batch through their own chunk(s), median of repeats.
6. Memory per rank: ``torch.cuda.max_memory_allocated`` on GPU; on both, a tensor account: parameter, gradient and
   optimizer-state bytes plus the peak of activation bytes saved for backward during a timed iteration
   (:class:`~hetplan.profile.torchparts.SavedTensorMeter`); and the process's peak RSS.

Rank 0 gathers every rank's numbers and writes them as JSON (``--out``), see :func:`run_rank`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from hetplan.profile import torchparts
from hetplan.runtime import children, energy_loop, expert_parallel, planio


def _parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m hetplan.runtime.trainer", description=__doc__.splitlines()[0])
    ap.add_argument("plan")
    ap.add_argument("--out", default=None, help="JSON file rank 0 writes the results to")
    ap.add_argument("--iterations", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--schedule", default=None, choices=planio.SCHEDULES)
    ap.add_argument("--virtual-stages", type=int, default=2)
    ap.add_argument("--dp-mode", default=None, choices=("ddp", "fsdp"))
    ap.add_argument("--dtype", default=None, choices=tuple(torchparts.DTYPES))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--stage-repeats", type=int, default=5)
    ap.add_argument("--stage-stat", default="median", choices=("median", "min"))
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads per rank on CPU")
    ap.add_argument("--energy-server", default=None, help="frequency plan server URL (hetplan.runtime.energy_loop)")
    ap.add_argument("--energy-job", default=None, help="its job id (created by the launcher)")
    return ap.parse_args(argv)


def run_rank(argv: list[str] | None = None) -> dict | None:
    """Run this rank (environment from torchrun: RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT).

    Returns (on rank 0; None elsewhere) and writes to ``--out``::

        {"world_size", "pp", "dp", "tp", "ep", "schedule", "dp_mode", "dtype", "device", "software",
         "iteration_time_s" (median over timed iterations, max over ranks), "iteration_times_s" (rank 0),
         "loss" (last iteration, last stage), "ranks": [{"rank", "pp_rank", "dp_rank", "tp_rank", "layers",
         "forward_s", "backward_s" (one micro-batch through the rank's chunks, isolated), "weights_bytes",
         "gradients_bytes", "optimizer_bytes", "activation_peak_bytes", "tensor_bytes", "cuda_max_allocated_bytes",
         "peak_rss_bytes"}]}
    """
    args = _parse(argv)
    plan = planio.load_plan(args.plan)
    spec = planio.plan_model(plan)
    lay = planio.layout(plan, spec, schedule=args.schedule, virtual_stages=args.virtual_stages)
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if world != lay.world_size:
        raise SystemExit(f"plan needs {lay.world_size} ranks, torchrun started {world}")
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
        torch.set_num_threads(max(1, args.threads))
    backend = "nccl" if cuda else "gloo"
    dist.init_process_group(backend, timeout=timedelta(seconds=300))
    succeeded = False
    try:
        result = _train(args, plan, spec, lay, rank, device, backend)
        succeeded = True
        return result
    finally:
        torchparts.finish_process_group(succeeded)


def _train(args, plan, spec, lay: planio.Layout, rank: int, device: torch.device, backend: str) -> dict | None:
    from torch.distributed.device_mesh import init_device_mesh

    dtype_name = args.dtype or (plan.job.dtype if device.type == "cuda" else "fp32")
    dtype = torchparts.torch_dtype(dtype_name)
    mesh = init_device_mesh(device.type, (lay.pp, lay.dp, lay.tp), mesh_dim_names=("pp", "dp", "tp"))
    pp_rank, dp_rank, tp_rank = lay.coords(rank)
    dp_mode = planio.dp_mode(plan, args.dp_mode)
    nchunks = lay.pp * lay.virtual_stages
    my_chunks = [k for k in range(nchunks) if k % lay.pp == pp_rank]
    # Under pipelining or EP, DP = DDP's gradient all-reduce done once after the last backward (the DDP wrapper
    # inside torch.distributed.pipelining left the last stage's replicas out of sync in our tests with torch 2.13;
    # with EP the experts differ between DP ranks).
    manual_dp = lay.dp > 1 and dp_mode == "ddp" and (lay.pp > 1 or lay.ep > 1)
    ep_group, expert_dp = expert_parallel.process_groups(lay, rank) if lay.ep > 1 else (None, None)
    raw, wrapped = [], []
    for k in my_chunks:
        a, b = lay.chunk_layers[k]
        mod = torchparts.build_stage(spec, a, b, k == 0, k == nchunks - 1, tp_mesh=mesh["tp"], dtype=dtype,
                                     device=device, seed=args.seed, ep=ep_group)
        raw.append(mod)
        if lay.dp > 1 and dp_mode == "ddp" and not manual_dp:
            from torch.nn.parallel import DistributedDataParallel as DDP

            if lay.tp > 1:
                from torch.distributed.tensor.parallel.ddp import _pre_dp_module_transform

                _pre_dp_module_transform(mod)
            mod = DDP(mod, process_group=mesh["dp"].get_group(),
                      device_ids=[device.index] if device.type == "cuda" else None)
        elif lay.dp > 1 and dp_mode == "fsdp":
            from torch.distributed.fsdp import fully_shard

            # with EP the experts differ between DP ranks: FSDP leaves them alone, they are reduced below
            ignored = set(expert_parallel.split_parameters([mod])[1]) if lay.ep > 1 else None
            fully_shard(mod, mesh=mesh["dp"], ignored_params=ignored)
        wrapped.append(mod)
    params = [p for m in raw for p in m.parameters()]
    dense, experts = expert_parallel.split_parameters(raw) if lay.ep > 1 else (params, [])
    opt = torch.optim.AdamW(params, lr=1e-4)

    mbs, s, nmb = plan.mbs, plan.job.seq_len, lay.num_microbatches
    g = torch.Generator().manual_seed(1000 + dp_rank)
    tokens = torch.randint(0, spec.vocab_size, (mbs * nmb, s), generator=g).to(device)
    target = torch.randint(0, spec.vocab_size, (mbs * nmb, s), generator=g).to(device)
    first_rank, last_rank = pp_rank == 0, pp_rank == lay.pp - 1

    schedule = None
    if lay.pp > 1:
        from torch.distributed.pipelining import (PipelineStage, Schedule1F1B, ScheduleGPipe,
                                                  ScheduleInterleaved1F1B)

        stages = [PipelineStage(m, k, nchunks, device, group=mesh["pp"].get_group())
                  for k, m in zip(my_chunks, wrapped)]
        if lay.schedule == "interleaved":
            schedule = ScheduleInterleaved1F1B(stages, n_microbatches=nmb, loss_fn=torchparts.loss_fn)
        else:
            cls = Schedule1F1B if lay.schedule == "1f1b" else ScheduleGPipe
            schedule = cls(stages[0], n_microbatches=nmb, loss_fn=torchparts.loss_fn)

    loop = None
    if args.energy_server:
        loop = energy_loop.RankLoop(args.energy_server, args.energy_job, rank, pp_rank,
                                    energy_loop.stage_gpu(plan, pp_rank), device)
        if schedule is not None:
            loop.attach(stages)
    meter = torchparts.SavedTensorMeter(exclude=raw)

    def step() -> float | None:
        opt.zero_grad(set_to_none=True)
        loss_val = None
        if schedule is not None:
            losses: list = []
            if first_rank:
                schedule.step(tokens, target=target if last_rank else None, losses=losses)
            elif last_rank:
                schedule.step(target=target, losses=losses)
            else:
                schedule.step()
            if losses:
                loss_val = float(torch.stack([l.detach().float() for l in losses]).mean())
        else:
            model = wrapped[0]
            for i in range(nmb):
                sl = slice(i * mbs, (i + 1) * mbs)
                sync = i == nmb - 1 or not hasattr(model, "no_sync")
                ctx = model.no_sync() if not sync else contextlib.nullcontext()
                with ctx:
                    with energy_loop.instruction(loop, "forward", i):
                        loss = torchparts.loss_fn(model(tokens[sl]), target[sl]) / nmb
                    with energy_loop.instruction(loop, "backward", i):
                        loss.backward()
                loss_val = (loss_val or 0.0) + float(loss.detach())
        if manual_dp:
            _allreduce_grads(dense, mesh["dp"].get_group(), lay.dp)
        if lay.ep > 1:
            _allreduce_grads(experts, expert_dp, lay.dp)  # summed over expert-DP, divided by DP
        opt.step()
        return loss_val

    for _ in range(args.warmup):
        step()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    times, loss_val = [], None
    for it in range(args.iterations):
        dist.barrier()
        if loop is not None:  # after the barrier: every rank has reported the previous iteration
            loop.begin()
            dist.barrier()
        torchparts._sync(device)
        t0 = time.perf_counter()
        if it == 0:
            with meter.track():
                loss_val = step()
        else:
            loss_val = step()
        torchparts._sync(device)
        times.append(time.perf_counter() - t0)
        if loop is not None:
            loop.end()
    torchparts.collect()
    cuda_peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
    states = torchparts.model_state_bytes(raw, opt)

    # DP replicas must hold the same weights after the updates (each saw different tokens): checks gradient sync.
    # With EP the experts are compared over expert-DP, the rest over DP.
    in_sync = True
    for ps, group in ((dense, mesh["dp"].get_group()), (experts, expert_dp)):
        if not ps:  # no experts (every rank of an expert-DP group is in the same stage, so all agree)
            continue
        with torch.no_grad():
            checksum = float(sum(_full(p).double().sum() for p in ps))
        sums: list = [None] * dist.get_world_size(group)
        dist.all_gather_object(sums, checksum, group=group)
        in_sync = in_sync and max(sums) - min(sums) <= 1e-6 * max(1.0, abs(checksum))
    with torch.no_grad():
        checksum = float(sum(_full(p).double().sum() for p in params))

    # Isolated stage timing, one TP group at a time.
    fwd = bwd = 0.0
    # Ranks that share collectives inside a forward run together: the TP group, and with FSDP the whole stage, with
    # EP the EP group. Waiting ranks sleep on the rendezvous store (a gloo barrier would keep their cores busy).
    group_size = lay.tp * (lay.dp if dp_mode == "fsdp" else lay.ep)
    store = dist.distributed_c10d._get_default_store()
    dist.barrier()
    turn, nturns = rank // group_size, dist.get_world_size() // group_size
    if turn > 0:
        _sleep_until(store, f"hetplan-stage-timing-{turn}")
    fwd = bwd = 0.0
    for k, mod in zip(my_chunks, raw):
        x = torchparts.sample_input(spec, k == 0, mbs, s, dtype, device, seed=k)
        f, b = torchparts.time_forward_backward(mod, x, last=k == nchunks - 1, target=target[:mbs],
                                                warmup=2, repeats=args.stage_repeats, stat=args.stage_stat,
                                                clock="wall" if lay.ep > 1 else None)
        fwd, bwd = fwd + f, bwd + b
    # The group's first rank opens the next turn once every rank of the group is done.
    store.set(f"hetplan-stage-timing-{turn}-rank-{rank}", "1")
    if rank == turn * group_size:
        for r in range(turn * group_size, (turn + 1) * group_size):
            _sleep_until(store, f"hetplan-stage-timing-{turn}-rank-{r}")
        store.set(f"hetplan-stage-timing-{turn + 1}", "1")
    _sleep_until(store, f"hetplan-stage-timing-{nturns}")
    dist.barrier()
    mine = {
        "rank": rank, "pp_rank": pp_rank, "dp_rank": dp_rank, "tp_rank": tp_rank,
        "layers": [list(lay.chunk_layers[k]) for k in my_chunks],
        "forward_s": fwd, "backward_s": bwd,
        "iteration_time_s": statistics.median(times),
        "weights_bytes": states["weights"], "gradients_bytes": states["gradients"],
        "optimizer_bytes": states["optimizer"], "activation_peak_bytes": meter.peak_bytes,
        "tensor_bytes": states["weights"] + states["gradients"] + states["optimizer"] + meter.peak_bytes,
        "cuda_max_allocated_bytes": cuda_peak, "peak_rss_bytes": torchparts.peak_rss_bytes(),
        "loss": loss_val, "param_checksum": checksum, "dp_replicas_in_sync": in_sync,
        "energy": None if loop is None else loop.close(),
    }
    everyone: list = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    if rank != 0:
        return None
    result = {
        "world_size": lay.world_size, "pp": lay.pp, "dp": lay.dp, "tp": lay.tp, "ep": lay.ep,
        "schedule": lay.schedule,
        "virtual_stages": lay.virtual_stages, "dp_mode": dp_mode if lay.dp > 1 else "none", "dtype": dtype_name,
        "backend": backend, "device": torchparts.device_name(device), "software": torchparts.software_version(),
        "mbs": mbs, "seq_len": s, "num_microbatches": nmb, "iterations": args.iterations,
        "iteration_time_s": max(r["iteration_time_s"] for r in everyone), "iteration_times_s": times,
        "loss": next((r["loss"] for r in reversed(everyone) if r["loss"] is not None), None),
        "dp_replicas_in_sync": all(r["dp_replicas_in_sync"] for r in everyone),
        "ranks": everyone,
    }
    if loop is not None:
        result["energy"] = energy_loop.run_summary(args.energy_server, args.energy_job, [r["energy"] for r in everyone])
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2))
    return result


def _sleep_until(store, key: str, poll_s: float = 0.005) -> None:
    """Wait (sleeping, not spinning) until ``key`` exists in the rendezvous store."""
    while not store.check([key]):
        time.sleep(poll_s)


def _full(p: torch.Tensor) -> torch.Tensor:
    """The whole tensor of an FSDP-sharded DTensor parameter (collective over its DP mesh); TP shards stay local."""
    from torch.distributed.tensor import DTensor

    if isinstance(p, DTensor) and p.device_mesh.mesh_dim_names == ("dp",):
        return p.full_tensor()
    return torchparts._local(p)


def _allreduce_grads(params, group, dp: int) -> None:
    """Average gradients over the DP group: one flat all-reduce per dtype (DDP's result, without overlap)."""
    by_dtype: dict = {}
    for p in params:
        if p.grad is not None:
            by_dtype.setdefault(p.grad.dtype, []).append(p)
    for ps in by_dtype.values():
        grads = [torchparts._local(p.grad) for p in ps]
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, group=group)
        flat /= dp
        off = 0
        for g in grads:
            n = g.numel()
            g.copy_(flat[off:off + n].view_as(g))
            off += n


def main(argv: list[str] | None = None) -> None:
    """Entry point for ``python -m hetplan.runtime.trainer PLAN.json [--out FILE] ...`` under torchrun."""
    # torchrun starts each rank in a session of its own: end the rank when torchrun ends (hetplan.runtime.children)
    launcher = os.environ.get(children.LAUNCHER_PID_ENV)
    children.die_with_parent(grandparent_pid=int(launcher) if launcher else None)
    result = run_rank(argv)
    if result is not None and not _parse(argv).out:
        json.dump(result, sys.stdout, indent=2)
    torchparts.exit_rank(0)  # no interpreter finalization racing gloo's worker threads (see exit_rank)


if __name__ == "__main__":
    main()
