"""``hetplan run`` / ``hetplan export`` / ``hetplan verify``: run a plan on torch.distributed, hand it to a
framework, and compare measured with predicted. Torch is imported only by ``run`` and ``verify`` (in the ranks and in
verify's profiling), never at import time.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from hetplan.cli.output import output_dir, output_file, write_output



def _opts(iterations, warmup, schedule, virtual_stages, dp_mode, dtype, nnodes, node_rank, rdzv_endpoint, max_procs,
          timeout, threads):
    from hetplan.runtime.launcher import RunOptions

    return RunOptions(iterations=iterations, warmup=warmup, schedule=schedule, virtual_stages=virtual_stages,
                      dp_mode=dp_mode, dtype=dtype, nnodes=nnodes, node_rank=node_rank, rdzv_endpoint=rdzv_endpoint,
                      max_procs=max_procs, timeout_s=timeout, threads=threads)


_ITER = typer.Option(3, "--iterations", min=1, help="Timed iterations.")
_WARM = typer.Option(1, "--warmup", min=0, help="Untimed iterations first.")
_SCHED = typer.Option(None, "--schedule", help="Override the plan's schedule: 1f1b, gpipe, interleaved.")
_VIRT = typer.Option(2, "--virtual-stages", min=1, help="Model chunks per rank with --schedule interleaved (a plan "
                     "with virtual_stages runs its own).")
_DPM = typer.Option(None, "--dp-mode", help="ddp or fsdp (default: fsdp for ZeRO-3 plans, else ddp).")
_DT = typer.Option(None, "--dtype", help="fp32, bf16, fp16 (default: the plan's on GPU, fp32 on CPU).")
_NN = typer.Option(1, "--nnodes", min=1, help="Nodes (torchrun rendezvous).")
_NR = typer.Option(0, "--node-rank", min=0, help="This node's rank.")
_RDZV = typer.Option(None, "--rdzv-endpoint", help="HOST:PORT of node 0 (multi-node).")
_MAXP = typer.Option(None, "--max-procs", help="Most ranks per node (default: GPUs, or 16 on CPU).")
_TO = typer.Option(600.0, "--timeout", help="Wall-clock limit of the run (s).")
_THR = typer.Option(1, "--threads", min=1, help="torch threads per rank on CPU.")


def run_cmd(
    plan: Path = typer.Argument(..., metavar="PLAN.json", help="Plan JSON."),
    iterations: int = _ITER, warmup: int = _WARM, schedule: Optional[str] = _SCHED, virtual_stages: int = _VIRT,
    dp_mode: Optional[str] = _DPM, dtype: Optional[str] = _DT, nnodes: int = _NN, node_rank: int = _NR,
    rdzv_endpoint: Optional[str] = _RDZV, max_procs: Optional[int] = _MAXP, timeout: float = _TO, threads: int = _THR,
    as_json: bool = typer.Option(False, "--json", help="Print the results as JSON (SI units)."),
    energy_server: Optional[str] = typer.Option(None, "--energy-server", help="Run the timed iterations under this "
                                                "frequency plan server (hetplan energy serve): Perseus' loop."),
    token: Optional[str] = typer.Option(None, "--token", envvar="HETPLAN_ENERGY_TOKEN",
                                        help="The plan server's bearer token."),
    energy_job: Optional[str] = typer.Option(None, "--energy-job", help="Job id on the server (default: from the "
                                             "plan, so a rerun continues the job)."),
    energy_plans: Optional[Path] = typer.Option(None, "--energy-plans", help="plans.json of 'hetplan energy "
                                                "frontier': run its plans (default: profile, then the frontier)."),
    energy_target_s: Optional[float] = typer.Option(None, "--energy-target-s", min=0.0, help="Iteration time the "
                                                    "frequency plan must meet (default: the all-max time)."),
    energy_frequencies: Optional[str] = typer.Option(None, "--energy-frequencies", help="SM clocks to profile, "
                                                     "MHz, e.g. 1410,1200 (default: all of the plan's GPU)."),
) -> None:
    """Run PLAN on torch.distributed (random weights, synthetic tokens): iteration time and memory per rank.

    MoE plans (Mixtral, Qwen-MoE) run their EP: experts split over DP ranks, all-to-all token dispatch.
    CP plans are refused: torch 2.13 has no ring attention on CPU (docs/runtime.md)."""
    from hetplan.runtime.launcher import run_plan

    opts = _opts(iterations, warmup, schedule, virtual_stages, dp_mode, dtype, nnodes, node_rank, rdzv_endpoint,
                 max_procs, timeout, threads)
    if energy_server is not None and not energy_server.strip():
        from hetplan.errors import HetplanError

        raise HetplanError("--energy-server is empty", field="--energy-server",
                           fix="give the plan server's URL (e.g. http://127.0.0.1:8100) or leave the option out")
    if energy_server:
        opts.energy = _energy_opts(energy_server, token, energy_job, energy_plans, energy_target_s,
                                   energy_frequencies)
    elif any(x is not None for x in (energy_job, energy_plans, energy_target_s, energy_frequencies)):
        from hetplan.errors import HetplanError

        raise HetplanError("the --energy-* options need a plan server", field="--energy-server",
                           fix="add --energy-server URL (start one with 'hetplan energy serve')")
    with Console(stderr=True).status("running the plan"):
        res = run_plan(plan, opts)
    if not res:
        Console().print("this node's ranks finished; node 0 reports")
        return
    from hetplan.runtime import planio

    res["notes"] = planio.run_differences(planio.load_plan(plan), res["tp"], opts.dp_mode)
    if as_json:
        print(json.dumps(res, indent=1))
        return
    c = Console()
    ep = f", EP {res['ep']} in DP" if res.get("ep", 1) > 1 else ""
    c.print(f"{res['world_size']} ranks (pp {res['pp']} x dp {res['dp']} x tp {res['tp']}{ep}), {res['schedule']}, "
            f"DP {res['dp_mode']}, {res['dtype']} on {res['device']} ({res['backend']}, {res['software']})")
    for note in res["notes"]:
        c.print(f"note: {note}", highlight=False)
    c.print(f"iteration time {res['iteration_time_s'] * 1e3:.1f} ms (median of {res['iterations']}), "
            f"loss {res['loss']:.4f}, DP replicas in sync: {res['dp_replicas_in_sync']}")
    t = Table(title="per rank (stage times: one micro-batch, isolated)")
    for col in ("rank", "pp", "dp", "tp", "layers", "fwd ms", "bwd ms", "tensor MiB", "CUDA peak MiB", "peak RSS MiB"):
        t.add_column(col, justify="right")
    for r in res["ranks"]:
        cuda = r["cuda_max_allocated_bytes"]
        t.add_row(str(r["rank"]), str(r["pp_rank"]), str(r["dp_rank"]), str(r["tp_rank"]), str(r["layers"]),
                  f"{r['forward_s'] * 1e3:.2f}", f"{r['backward_s'] * 1e3:.2f}", f"{r['tensor_bytes'] / 2**20:.1f}",
                  "-" if cuda is None else f"{cuda / 2**20:.1f}", f"{r['peak_rss_bytes'] / 2**20:.0f}")
    c.print(t)
    if res.get("energy"):
        _print_energy(c, res["energy"])


def _energy_opts(server, token, job, plans, target_s, frequencies):
    from hetplan.errors import HetplanError
    from hetplan.runtime.energy_loop import EnergyOptions

    freqs = None
    if frequencies:
        try:
            freqs = tuple(int(x) for x in frequencies.split(","))
        except ValueError:
            freqs = ()
        if not freqs or min(freqs) <= 0:
            raise HetplanError(f"got {frequencies!r}", field="--energy-frequencies",
                               fix="give positive SM clocks in MHz separated by commas, e.g. 1410,1200,1005")
    import httpx

    try:
        url = httpx.URL(server)
    except httpx.InvalidURL as exc:
        url, why = None, str(exc)
    if url is None or url.scheme not in ("http", "https") or not url.host:
        raise HetplanError(f"got {server!r}" + (f" ({why})" if url is None else ""), field="--energy-server",
                           fix="give the plan server's http://HOST:PORT, e.g. http://127.0.0.1:7787")
    if target_s is not None and not 0 < target_s < float("inf"):
        raise HetplanError(f"got {target_s}", field="--energy-target-s",
                           fix="give the iteration time to meet in seconds, a finite number > 0, e.g. 0.5")
    return EnergyOptions(server=server, token=token, job_id=job, plans=None if plans is None else str(plans),
                         target_time_s=target_s, frequencies_mhz=freqs)


def _print_energy(c: Console, e: dict) -> None:
    label = "measured (NVML)" if e["energy_measured"] else f"{e['energy_source']}: DVFS model x measured time, " \
                                                           "not measured"
    t = Table(title=f"plan server {e['server']}, job {e['job_id']}; energy {label}")
    for col in ("iteration", "schedule", "time ms", "energy J"):
        t.add_column(col, justify="right")
    for it in e["iterations"]:
        t.add_row(str(it["iteration"]), ",".join(it["schedule_ids"]), f"{it['time_s'] * 1e3:.1f}",
                  "-" if it["energy_j"] is None else f"{it['energy_j']:.2f}")
    c.print(t)


def export_cmd(
    plan: Path = typer.Argument(..., metavar="PLAN.json", help="Plan JSON."),
    to: str = typer.Option(..., "--to", help="megatron, deepspeed or torchtitan."),
    out_dir: Optional[Path] = typer.Option(None, "--out-dir", "-o", help="Write the files here (default: print them)."),
    virtual_stages: Optional[int] = typer.Option(None, "--virtual-stages", help="Interleaved schedule chunks per rank."),
    framework_version: Optional[str] = typer.Option(
        None, "--framework-version", help="Release to write for: torchtitan 0.3 (default: --module/--config + "
        "overrides) or 0.2 (TOML); Megatron-LM 2026-08-22; DeepSpeed 0.19."),
) -> None:
    """Write the launch arguments / config files of Megatron-LM, DeepSpeed or torchtitan for PLAN."""
    from hetplan.runtime import exporters, planio

    p = planio.load_plan(plan)
    from hetplan.hardware.catalog import load_catalog

    catalog = load_catalog()
    for pool in p.pools:  # a hand-edited GPU name is refused as estimate refuses it (the runtime's host "cpu" runs)
        if pool.gpu != "cpu":
            catalog.get(pool.gpu)
    if virtual_stages is not None:  # the override passes the same rules as a plan's own virtual_stages
        from hetplan.errors import HetplanError
        from hetplan.plan_rules import check_plan

        if virtual_stages < 1:
            raise HetplanError(f"got {virtual_stages}: model chunks per rank are 1 (no interleaving) or more",
                               field="--virtual-stages", fix="use --virtual-stages 1 or more, or leave it out")
        try:
            check_plan(p.model_copy(update={"virtual_stages": virtual_stages}), planio.plan_model(p))
        except HetplanError as exc:  # it named plan.virtual_stages, a field the plan file may not have
            if exc.field == "plan.virtual_stages":
                exc.field = "--virtual-stages"
                exc.fix = "give --virtual-stages 1 (no interleaving) or one the stages' layers allow, or leave it out"
            raise
    ex = exporters.export(p, planio.plan_model(p), to, virtual_stages, framework_version)
    c = Console()
    if out_dir:
        output_dir(out_dir, "--out-dir")
    for name, text in ex.files.items():
        if out_dir:
            write_output(out_dir / name, text, "--out-dir")
            c.print(f"wrote {out_dir / name}")
        else:
            c.print(f"[bold]# {name}[/]", highlight=False)
            print(text)
    for n in ex.notes:
        Console(stderr=True).print(f"note: {n}", highlight=False)


def import_cmd(
    files: list[Path] = typer.Argument(..., metavar="FILES", help="A Megatron-LM launch script or arguments file; a torchtitan 0.3 "
                                       "launch (+ hetplan_torchtitan_job.py) or 0.2 TOML (+ launch.sh); a DeepSpeed "
                                       "JSON config + its launch script."),
    output: Optional[Path] = typer.Option(None, "-o", "--output", help="Write the plan JSON here (default: print)."),
    model: Optional[str] = typer.Option(None, "--model", help="The model (default: the preset with the launch's "
                                        "shapes)."),
    gpu: Optional[str] = typer.Option(None, "--gpu", help="GPU type the launch runs on (default: the one its "
                                      "'# hetplan gpu:' line names — hetplan's exports write one — else H100-SXM)."),
    gpus: Optional[int] = typer.Option(None, "--gpus", min=1, help="World size, when the launch does not give "
                                       "--nnodes x --nproc-per-node."),
    seq_len: Optional[int] = typer.Option(None, "--seq-len", min=1, help="Tokens per sequence, for a DeepSpeed "
                                          "launch that does not give it (its training script holds it)."),
) -> None:
    """Read a framework launch back into a plan: `hetplan estimate` prices it, `plan --baseline` compares it."""
    from hetplan.errors import HetplanError
    from hetplan.inputs import read_text
    from hetplan.runtime.importers import import_files
    from hetplan.runtime.planio import plan_model
    from hetplan.plan_rules import check_plan

    output_file(output, "--output")
    for value, flag in ((model, "--model"), (gpu, "--gpu")):
        if value is not None and not value.strip():  # --model "" matched a preset, --gpu "" wrote gpu ""
            raise HetplanError(f"{flag} is empty", field=flag, fix=f"give {flag} a name, or leave it out")
    from hetplan.hardware.catalog import load_catalog
    from hetplan.runtime.importers import DEFAULT_GPU, hetplan_line

    texts = {}
    for f in files:
        texts[f.name] = read_text(f, "FILES")
    field = "--gpu"
    if gpu is None:
        gpu, field = hetplan_line(texts, "gpu"), "FILES (# hetplan gpu:)"
    if gpu is None:
        gpu = DEFAULT_GPU
        Console(stderr=True).print(f"note: the launch names no GPU type: priced as {gpu} (give --gpu)", highlight=False)
    try:  # a GPU the catalog does not know wrote a plan nothing could price
        gpu = load_catalog().get(gpu).name
    except HetplanError as exc:
        raise HetplanError(exc.message, field=field, fix=exc.fix) from None
    plan = import_files(texts, model=model, gpu=gpu, gpus=gpus, seq_len=seq_len)
    check_plan(plan, plan_model(plan))
    text = plan.model_dump_json(indent=2) + "\n"
    if output:
        write_output(output, text, "--output")
        Console(stderr=True).print(f"wrote {output}: {plan.job.model}, {plan.num_gpus} GPUs, PP {plan.pp}, TP "
                                   f"{plan.stages[0].tp}, DP {plan.stages[0].dp}, EP {plan.ep}", highlight=False)
    else:
        print(text, end="")


def verify_cmd(
    plan: Path = typer.Argument(..., metavar="PLAN.json", help="Plan JSON."),
    db: Optional[str] = typer.Option(None, "--db", help="Profile database to use/extend (default: a temporary one)."),
    repeats: int = typer.Option(25, "--repeats", min=1, help="Timing repeats (minimum taken) on both sides."),
    iterations: int = _ITER, warmup: int = _WARM, schedule: Optional[str] = _SCHED, virtual_stages: int = _VIRT,
    dp_mode: Optional[str] = _DPM, max_procs: Optional[int] = _MAXP, timeout: float = _TO, threads: int = _THR,
    as_json: bool = typer.Option(False, "--json", help="Print JSON: per stage predicted/measured time and memory."),
) -> None:
    """Profile -> estimate -> run -> predicted vs measured per stage. Exit 1 if outside the stated tolerance."""
    from hetplan.runtime.verify import verify

    opts = _opts(iterations, warmup, schedule, virtual_stages, dp_mode, None, 1, 0, None, max_procs, timeout, threads)
    with Console(stderr=True).status("profiling, estimating and running"):
        res = verify(plan, db_path=db, opts=opts, repeats=repeats)
    if as_json:
        print(json.dumps(res, indent=1))
    else:
        c = Console()
        t = Table(title=f"verify {plan} on {res['device']} ({res['dtype']}, {res['software']})")
        for col in ("stage", "layers", "source", "pred ms", "meas ms", "time err", "pred MiB", "meas MiB", "mem err"):
            t.add_column(col, justify="right")
        for s in res["stages"]:
            t.add_row(str(s["stage"]), str(s["layers"]), s["time_source"], f"{s['predicted_time_s'] * 1e3:.2f}",
                      f"{s['measured_time_s'] * 1e3:.2f}", f"{s['time_error']:+.1%}",
                      f"{s['predicted_memory_bytes'] / 2**20:.2f}", f"{s['measured_memory_bytes'] / 2**20:.2f}",
                      f"{s['memory_error']:+.1%}")
        c.print(t)
        c.print(f"iteration: predicted {res['predicted_iteration_time_s'] * 1e3:.1f} ms, measured "
                f"{res['measured_iteration_time_s'] * 1e3:.1f} ms (not asserted: ranks share this host's cores)")
        for n in res.get("notes", []):
            c.print(f"note: {n}", highlight=False)
        c.print(f"tolerance: |time err| <= {res['time_tolerance']:.0%}, |memory err| <= {res['memory_tolerance']:.0%}"
                f" -> {'PASS' if res['within_tolerance'] else 'FAIL'}")
    if not res["within_tolerance"]:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    """Add ``hetplan run``, ``hetplan export``, ``hetplan import`` and ``hetplan verify`` to ``app``."""
    app.command("run")(run_cmd)
    app.command("export")(export_cmd)
    app.command("import")(import_cmd)
    app.command("verify")(verify_cmd)
