"""``hetplan energy``: Perseus-style frequency plans (frontier, baselines) and the plan server.

Heavy imports (fastapi, uvicorn, matplotlib) happen inside the commands that need them.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import typer
from rich.console import Console
from rich.table import Table

from hetplan.errors import HetplanError


#: ``compute_frontier``'s parameters as ``hetplan energy frontier`` spells them (its errors name the parameter).
FRONTIER_FLAGS = {"unit_time_s": "--unit-time-s", "schedule": "--schedule", "num_microbatches": "--num-microbatches",
                  "idle_power_w": "--idle-power-w"}


@contextmanager
def _named_by_flags() -> Iterator[None]:
    """Re-raise a :class:`HetplanError` of the frontier library (which names its parameters, ``unit_time_s``) under
    this command's flag (:data:`FRONTIER_FLAGS`, ``--unit-time-s``)."""
    try:
        yield
    except HetplanError as exc:
        flag = FRONTIER_FLAGS.get(exc.field or "")
        if flag is None:
            raise
        raise HetplanError(exc.message, field=flag, fix=exc.fix) from None


def _positive(value: float, name: str, fix: str) -> None:
    if not (value > 0 and math.isfinite(value)):
        raise HetplanError(f"must be positive, got {value}", field=name, fix=fix)


@contextmanager
def _progress_bar(what: str) -> Iterator[Callable[[float], None]]:
    """A rich progress bar on stderr (only on a terminal; it disappears when done); yields ``tick(share)``."""
    from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn

    console = Console(stderr=True)
    if not console.is_terminal:
        yield lambda share: None
        return
    with Progress(TextColumn(what), BarColumn(), TaskProgressColumn(), TimeElapsedColumn(), console=console,
                  transient=True) as bar:
        task = bar.add_task(what, total=1.0)
        last = [0.0]

        def tick(share: float) -> None:
            if share - last[0] >= 0.005 or share >= 1.0:
                last[0] = share
                bar.update(task, completed=share)

        yield tick


def energy_change(saved_fraction: float) -> str:
    """The energy change of a frequency plan against all-max, signed: saved 12 % → ``(-12.0 %)``; a plan that uses
    0.2 % more energy (possible where the frontier's point at that time is not below all-max) → ``(+0.2 %)``."""
    return f"({-100 * saved_fraction + 0.0:+.1f} %)"


def _frontier_inputs(source, num_microbatches, idle_power_w, gpu, profile, profile_db, job, power_catalog,
                     schedule, virtual_stages):
    """``(stage profile, micro-batches, idle power, schedule, virtual stages, origin)`` for ``energy frontier``:
    a plan gives the model-derived profile (or ``--profile`` / ``--profile-db`` a measured one), its micro-batches,
    schedule and the catalog idle power of its GPUs (mean over stages); a profile CSV needs ``-m`` and
    ``--idle-power-w`` or ``--gpu``."""
    from hetplan.energy.profile import check_profile_gpus, load_stage_profile, parse_stage_profile
    from hetplan.hardware.catalog import load_catalog
    from hetplan.hardware.power import get_power

    if (profile_db is None) != (job is None):
        raise HetplanError("--profile-db and --job go together", field="--profile-db",
                           fix="give both: the plan server's SQLite file and the job id")
    measured, origin = None, "model-derived"
    if profile is not None:
        measured, origin = load_stage_profile(profile), f"measured ({profile})"
    elif profile_db is not None:
        from hetplan.energy.server.store import Store

        if not profile_db.is_file():
            raise HetplanError(f"{profile_db} does not exist", field="--profile-db", fix="give the server's --db file")
        store = Store(profile_db, read_only=True, field="--profile-db")
        rows = store.measured_profile(job)
        if not rows:
            raise HetplanError(f"job {job!r} has no measured profile in {profile_db}", field="--job",
                               fix="run the job with the online_profiling scheduler first")
        measured = parse_stage_profile("stage,instruction,frequency,time,energy\n" + "".join(
            f"{s},{i},{f},{t!r},{e!r}\n" for s, i, f, t, e, _ in rows), f"{profile_db}:{job}")
        # ranks without NVML report the DVFS model's energy for their measured time (hetplan.runtime.energy_loop)
        what = "measured" if "model" not in store.energy_sources(job) else "measured time, modelled energy"
        origin = f"{what} ({profile_db}:{job})"
    if source.suffix.lower() == ".json":
        if gpu is not None:  # was dropped without a word, an unknown name included
            raise HetplanError(f"--gpu {gpu} names the GPU of a profile CSV; a plan's pools name its GPUs",
                               field="--gpu", fix="drop --gpu (give --idle-power-w W for another idle power)")
        from hetplan.energy.model import plan_stage_profile
        from hetplan.model.spec import load_model
        from hetplan.plan_rules import PlanRuleError, check_plan
        from hetplan.runtime.planio import load_plan

        plan = load_plan(source)
        model = load_model(plan.job.model)
        if virtual_stages is not None:  # a profile holds one model chunk's times: derive them for these chunks
            plan = plan.model_copy(update={"virtual_stages": virtual_stages})
        try:
            check_plan(plan, model)
        except PlanRuleError as exc:
            if exc.rule != "virtual-stages" or virtual_stages is None:
                raise
            raise HetplanError(exc.message, field="--virtual-stages", fix="give a number of model chunks the "
                               "plan's stages can interleave, or leave the option out") from None
        derived = plan_stage_profile(plan, model=model,
                                     power_catalog=None if power_catalog is None else str(power_catalog))
        if measured is not None:  # an 8-stage A40 profile was planned as this plan's pipeline without a word
            check_profile_gpus(measured, [(p.gpu, p.max_frequency_mhz) for p in derived.power],
                               "--profile" if profile is not None else "--job",
                               fix="give a profile measured on this plan's stages and GPUs")
        prof = measured or derived.profile
        M = num_microbatches or plan.num_microbatches(0)
        idle = idle_power_w if idle_power_w is not None else sum(derived.idle_power_w) / len(derived.idle_power_w)
        v = derived.virtual_stages
        sched = schedule or ("interleaved" if v > 1 else plan.schedule)
        plan_time = None
        if measured is None and num_microbatches is None:  # the estimator's iteration of this very pipeline
            from hetplan.estimate.estimator import estimate

            plan_time = estimate(plan, model=model).iteration_time_s
        return prof, M, idle, sched.lower(), v, origin, plan_time
    prof = measured or load_stage_profile(source)
    origin = origin if measured else f"measured ({source})"
    if num_microbatches is None:
        raise HetplanError("a profile CSV needs the number of micro-batches", field="--num-microbatches",
                           fix="add e.g. --num-microbatches 12 (or give a plan JSON)")
    if gpu is not None:  # checked even where --idle-power-w makes its idle power unused
        name = load_catalog().get(gpu, field="--gpu").name
        try:
            top = get_power(name, None if power_catalog is None else str(power_catalog),
                            field="--gpu").max_frequency_mhz
        except HetplanError as exc:  # no DVFS data for this GPU: its clocks are unknown (a bad file still raises)
            if exc.field != "--gpu":
                raise
            top = None
        check_profile_gpus(prof, [None if top is None else (name, top)] * prof.num_stages, "--gpu",
                           fix="give the GPU the profile was measured on (or --idle-power-w W without --gpu)")
    if idle_power_w is None:
        if gpu is None:
            raise HetplanError("a profile CSV needs the idle power", field="--idle-power-w",
                               fix="add --idle-power-w W or --gpu NAME (the catalog's idle power)")
        idle_power_w = load_catalog().get(gpu, field="--gpu").idle_power_w
    return prof, num_microbatches, idle_power_w, (schedule or "1f1b").lower(), virtual_stages or 1, origin, None


def register(app: typer.Typer) -> None:
    """Add the ``energy`` sub-app (``frontier``, ``serve``) to ``app``."""
    energy = typer.Typer(name="energy", help="GPU frequency plans on the iteration time–energy frontier (Perseus).",
                         no_args_is_help=True)
    app.add_typer(energy, name="energy")

    @energy.command("frontier")
    def frontier_cmd(
        source: Path = typer.Argument(..., metavar="PLAN.json|PROFILE.csv",
                                      help="a plan (stage profile derived from the cost model) or a measured stage "
                                           "profile CSV with columns stage, instruction, frequency, time, energy"),
        output: Path = typer.Option(..., "-o", "--output", help="output directory"),
        num_microbatches: int = typer.Option(None, "--num-microbatches", "-m",
                                             help="micro-batches per iteration (default: the plan's)"),
        idle_power_w: float = typer.Option(None, "--idle-power-w",
                                           help="GPU power while blocked (W; default: the catalog's for the GPU)"),
        gpu: str = typer.Option(None, "--gpu", help="GPU of a profile CSV (for its catalog idle power)"),
        profile: Path = typer.Option(None, "--profile", help="with a plan: use this measured profile CSV"),
        profile_db: Path = typer.Option(None, "--profile-db", help="with --job: the plan server's SQLite file, "
                                                                   "its measured profile (online profiling)"),
        job: str = typer.Option(None, "--job", help="job id in --profile-db"),
        power_catalog: Path = typer.Option(None, "--power-catalog", help="user GPU DVFS/power TOML"),
        unit_time_s: float = typer.Option(0.001, "--unit-time-s", help="time quantum of the planner (s; at least "
                                                                          "1/1000 of the shortest instruction)"),
        schedule: str = typer.Option(None, "--schedule", help="1f1b, gpipe or interleaved (default: the plan's; 1f1b)"),
        virtual_stages: int = typer.Option(None, "--virtual-stages", help="model chunks per stage (interleaved)"),
        straggler_slowdown: float = typer.Option(None, "--straggler-slowdown",
                                                 help="also pick the plan for a straggler this much slower (e.g. 1.2; 1 to 100)"),
        baselines: bool = typer.Option(True, "--baselines/--no-baselines", help="compute EnvPipe / Zeus baselines"),
        plot: bool = typer.Option(False, "--plot/--no-plot", help="also draw DIR/frontier.png (matplotlib)"),
        plans: bool = typer.Option(True, "--plans/--no-plans", help="write the frequency plans (DIR/plans.json)"),
        plan_files: bool = typer.Option(False, "--plan-files", help="also one file per point (plan_*.json in DIR/plans)"),
        as_json: bool = typer.Option(False, "--json", help="print the summary as JSON"),
    ) -> None:
        """Compute the frontier; write DIR/frontier.csv, DIR/plans.json, DIR/summary.json (DIR/frontier.png)."""
        from hetplan.energy.frontier import compute_frontier
        from hetplan.energy.report import plot_frontier, summarize

        if num_microbatches is not None and not 1 <= num_microbatches <= 65536:  # fuzz: 1e6 ran for a minute
            raise HetplanError(f"must be from 1 to 65,536 (the largest global batch, one sequence per micro-batch), "
                               f"got {num_microbatches}", field="--num-microbatches",
                               fix="use the number of micro-batches per iteration, e.g. 12")
        if virtual_stages is not None and not 1 <= virtual_stages <= 1024:  # fuzz: 1e20 was a numpy traceback
            raise HetplanError(f"must be from 1 to 1,024 (a plan's bound: more chunks than layers per GPU), got "
                               f"{virtual_stages}", field="--virtual-stages", fix="use 1 (no interleaving) or e.g. 2")
        _positive(unit_time_s, "--unit-time-s", "use e.g. 0.001 (1 ms)")
        if idle_power_w is not None and not (idle_power_w >= 0 and math.isfinite(idle_power_w)):
            raise HetplanError(f"must be ≥ 0, got {idle_power_w}", field="--idle-power-w",
                               fix="use the GPU's blocking power, e.g. 83.64 (A100-SXM)")
        prof, M, idle, sched, v, origin, plan_time = _frontier_inputs(source, num_microbatches, idle_power_w, gpu, profile,
                                                           profile_db, job, power_catalog, schedule, virtual_stages)
        # a GPU blocked in a p2p wait draws less than one computing (Perseus §4: P_blocking is the floor of every
        # instruction's power); an idle power above the profile's least computing power made every frontier point
        # cost more the faster it ran (fuzz: --idle-power-w 1e9 gave exit 0 and 1e9 W idle GPUs)
        busy_w = min(float(np.min(e.energy_j / e.time_s)) for e in prof.entries.values())
        if idle > busy_w:
            raise HetplanError(f"idle power {idle:g} W is above the least power of a computing instruction in the "
                               f"profile ({busy_w:.1f} W)", field="--idle-power-w",
                               fix="give the GPU's blocking power (e.g. 83.64 W for A100-SXM), or --gpu NAME")
        if M * v > 65536:  # the instruction DAG grows with M·v: no larger than 65,536 micro-batches without chunks
            raise HetplanError(f"{M} micro-batches x {v} virtual stages = {M * v:,} chunk passes per stage, more than "
                               "65,536", field="--virtual-stages" if virtual_stages else "--num-microbatches",
                               fix="use fewer micro-batches or virtual stages")
        try:
            output.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise HetplanError(f"cannot create {output}: {exc.strerror or exc}", field="--output",
                               fix="give a writable directory") from None
        pending = None
        with _named_by_flags():
            if baselines:  # on the other core while the solver runs
                from hetplan.energy.baselines import summary_entries_in_background
                from hetplan.energy.dag import build_pipeline_dag

                pending = summary_entries_in_background(prof, build_pipeline_dag(prof.num_stages, M, sched, v), idle)
            with _progress_bar(f"frontier of {2 * prof.num_stages * M * v:,} instructions") as tick:
                fr = compute_frontier(prof, M, idle, unit_time_s, sched, virtual_stages=v, progress=tick)
        fr.write_csv(output / "frontier.csv")
        if plans:
            fr.write_plans_file(output / "plans.json")
        if plan_files:
            fr.write_plans(output / "plans")
        summary = summarize(fr, straggler_slowdown=straggler_slowdown, baselines=pending() if pending else False)
        summary["profile"] = origin
        if plan_time is not None:  # what `hetplan plan --energy` charges: the pipeline plus what lies outside it
            summary["plan_iteration_time_s"] = plan_time
            summary["outside_pipeline_s"] = outside = plan_time - summary["all_max"]["time_s"]
            # one GPU per stage, like the frontier: all-max plus idle power over what lies outside the pipeline
            # (plan --energy's energy_j_per_iteration is this times the GPUs per stage)
            summary["plan_all_max_energy_j"] = summary["all_max"]["energy_j"] + prof.num_stages * idle * max(outside, 0)
        (output / "summary.json").write_text(json.dumps(summary, indent=1))
        drawn = plot_frontier(fr, output / "frontier.png", summary) if plot else None
        if as_json:
            short = {k: summary[k] for k in ("points", "pareto_points", "planner_time_s", "min_time_s", "max_time_s",
                                             "all_max", "fastest", "least_energy", "energy_saved_at_max_speed_j", "at_max_speed", "idle_power_w",
                                             "profile")}
            for k in ("straggler", "envpipe", "plan_iteration_time_s", "outside_pipeline_s", "plan_all_max_energy_j"):
                if k in summary:
                    short[k] = summary[k]
            short["output"] = str(output)
            typer.echo(json.dumps(short, indent=1))
            return
        con = Console()
        t = Table(title=f"{source.name}: {prof.num_stages} stages × {M} micro-batches ({sched}); {origin} profile")
        t.add_column("what")
        t.add_column("time (s)", justify="right")
        t.add_column("energy (J)", justify="right")
        # every plan replayed on the profile: the planner floors each instruction to the unit, and its fastest point
        # (planned 1.496 s) read 2.6 % faster than all-max (1.536 s) on an interleaved H100 plan
        for name, key in (("frontier fastest", "fastest"), ("frontier least energy", "least_energy")):
            t.add_row(f"{name} (replayed)", f"{summary[key]['replay_time_s']:.4f}",
                      f"{summary[key]['replay_energy_j']:.1f}")
        t.add_row("all-max (replayed)", f"{summary['all_max']['time_s']:.4f}", f"{summary['all_max']['energy_j']:.1f}")
        if plan_time is not None:
            t.add_row("plan iteration (estimator)", f"{plan_time:.4f}", f"{summary['plan_all_max_energy_j']:.1f}")
        b = summary.get("at_max_speed")
        if b:
            t.add_row("Perseus at all-max time", f"{b['replay_time_s']:.4f}",
                      f"{b['energy_at_deadline_j']:.1f} {energy_change(b['saved_fraction'])}")
        if summary.get("envpipe"):
            t.add_row("EnvPipe", f"{summary['envpipe']['time_s']:.4f}", f"{summary['envpipe']['energy_j']:.1f}")
        s = summary.get("straggler")
        if s:
            t.add_row(f"straggler ×{s['slowdown']:g}", f"{s['straggler_time_s']:.4f}",
                      f"{s['energy_at_deadline_j']:.1f} {energy_change(s['saved_fraction'])}")
        con.print(t)
        # every file written (summary.json, plans/ and frontier.png went unsaid)
        written = ["frontier.csv", *(["plans.json"] if plans else []), *(["plans/"] if plan_files else []),
                   "summary.json", *(["frontier.png"] if drawn else [])]
        con.print(f"{len(fr)} points ({summary['pareto_points']} Pareto-optimal) in {fr.result.planner_time_s:.2f} s "
                  f"CPU; idle {idle:.2f} W; wrote {', '.join(written)} in {output}", highlight=False)

    @energy.command("power-limits")
    def power_limits_cmd(
        plan_path: Path = typer.Argument(..., metavar="PLAN.json", help="a plan (hetplan plan -o)"),
        steps: int = typer.Option(12, "--steps", help="power limits from the board minimum to the TDP"),
        eta: float = typer.Option(0.5, "--eta", help="Zeus' weight on energy (0 = fastest, 1 = least energy)"),
        settings: Path = typer.Option(None, "--settings", help="write the chosen limit per rank (nvidia-smi -pl / "
                                                              "NVML) as JSON here"),
        power_catalog: Path = typer.Option(None, "--power-catalog", help="user GPU DVFS/power TOML"),
        as_json: bool = typer.Option(False, "--json", help="print the curve, Zeus' choice and the settings as JSON"),
    ) -> None:
        """Iteration time and energy of PLAN over the GPUs' power limit (Zeus' knob).

        Zeus' choice of limit, and its setting per rank (nvidia-smi -pl / NVML)."""
        from hetplan.energy.power_limit import power_limit_curve, rank_settings, zeus_choice
        from hetplan.runtime.planio import load_plan

        if not (0 <= eta <= 1):
            raise HetplanError(f"must be in [0, 1], got {eta}", field="--eta",
                               fix="0 = fastest, 1 = least energy; Zeus' default is 0.5")
        if not 2 <= steps <= 200:
            raise HetplanError(f"must be from 2 to 200, got {steps}", field="--steps", fix="use e.g. 12")
        plan = load_plan(plan_path)
        pts = power_limit_curve(plan, steps=steps, power_catalog=None if power_catalog is None else str(power_catalog))
        k = zeus_choice(pts, plan.num_gpus, eta)
        ranks = rank_settings(plan, pts[k])
        if settings is not None:
            from hetplan.cli.output import output_file

            output_file(settings, "--settings")
            settings.write_text(json.dumps({"eta": eta, "point": pts[k].to_dict(), "ranks": ranks}, indent=1))
        if as_json:
            typer.echo(json.dumps({"points": [p.to_dict() for p in pts], "zeus_index": k, "eta": eta,
                                   "ranks": ranks}, indent=1))
            return
        types = list(pts[0].power_limit_w)  # W and clock MHz list one figure per GPU type: say whose
        t = Table(title=f"{plan_path.name}: {plan.num_gpus} GPUs under a power limit (Zeus' knob)",
                  caption=f"W and clock MHz of {', '.join(types)}" if len(types) > 1 else None)
        for col in ("limit", "W", "clock MHz", "iter s", "kJ/iter", "W/GPU", ""):
            t.add_column(col, justify="right")
        base = pts[0]
        for i, p in enumerate(pts):
            t.add_row(f"{p.share_of_tdp:.0%}", ", ".join(f"{w:.0f}" for w in p.power_limit_w.values()),
                      ", ".join(f"{c:.0f}" for c in p.clock_mhz.values()), f"{p.iteration_time_s:.3f}",
                      f"{p.energy_j / 1e3:,.1f} {energy_change(1 - p.energy_j / base.energy_j)}",
                      f"{p.average_power_w:.0f}", "Zeus" if i == k else "")
        con = Console()
        con.print(t)
        con.print(f"Zeus (η = {eta:g}) picks {pts[k].share_of_tdp:.0%} of TDP: {ranks[0]['nvidia_smi']} on rank 0, "
                  f"... ({len(ranks)} ranks{'; written to ' + str(settings) if settings else ''}).")

    @energy.command("serve")
    def serve_cmd(
        db: Path = typer.Option(Path("hetplan-energy.sqlite"), "--db", help="SQLite state file"),
        host: str = typer.Option("127.0.0.1", "--host", help="address to bind (non-loopback needs a token)"),
        port: int = typer.Option(7787, "--port"),
        token: str = typer.Option(None, "--token", envvar="HETPLAN_ENERGY_TOKEN",
                                  help="bearer token clients must send (env HETPLAN_ENERGY_TOKEN)"),
        max_body_bytes: int = typer.Option(8 * 2**20, "--max-body-bytes", help="larger requests get 413"),
        max_in_flight: int = typer.Option(256, "--max-in-flight", help="more concurrent requests get 429"),
    ) -> None:
        """Run the frequency plan server (training ranks register, fetch schedules, report measurements)."""
        import ipaddress

        try:
            import uvicorn

            from hetplan.energy.server.app import create_app
        except ImportError as exc:  # pragma: no cover - extras missing
            raise HetplanError(f"the plan server needs the serve extra ({exc.name} is missing)", field="install",
                               fix="pip install 'hetplan[serve]'") from None
        if not 0 < port < 65536:
            raise HetplanError(f"port {port} is out of range", field="--port", fix="use 1..65535")
        if max_body_bytes < 1024:
            raise HetplanError(f"got {max_body_bytes}: a body limit under 1,024 bytes refuses every report",
                               field="--max-body-bytes", fix="use the default (8 MiB) or at least 1024")
        if max_in_flight < 1:
            raise HetplanError(f"got {max_in_flight}: the server would answer every request 429",
                               field="--max-in-flight", fix="use the default (256) or at least 1")
        if token is not None and len(token) < 16:
            raise HetplanError("the token is too short (under 16 characters)", field="--token",
                               fix="use a long random token, e.g. `python -c 'import secrets; print(secrets.token_hex(16))'`")
        try:
            loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
        except ValueError:
            loopback = False
        if not loopback and token is None:
            raise HetplanError(f"refusing to serve on {host} without a token: anyone who reaches it could change "
                               "your GPUs' clocks", field="--host",
                               fix="keep --host 127.0.0.1, or give --token (or HETPLAN_ENERGY_TOKEN)")
        if db.exists() and not db.is_file():
            raise HetplanError(f"{db} is not a file", field="--db", fix="give a path for the SQLite file")
        from hetplan.cli.output import check_listen_address

        check_listen_address(host, port, "--host", "--port")
        uvicorn.run(create_app(db, token=token, max_body_bytes=max_body_bytes, max_in_flight=max_in_flight),
                    host=host, port=port, log_level="info", timeout_graceful_shutdown=10)


def add_energy(summaries: list[dict], catalog, usd_per_kwh: float | None) -> None:
    """``hetplan plan --energy``: add :func:`hetplan.energy.job.plan_energy`'s fields to every plan summary, and
    with ``usd_per_kwh`` fold the electricity into ``job_usd`` (the GPU-hour part stays in ``gpu_usd``)."""
    from hetplan.energy.job import plan_energy
    from hetplan.estimate.estimator import estimate
    from hetplan.plan import Plan

    for s in summaries:
        if "energy_j_per_iteration" in s:
            continue
        plan = Plan.model_validate(s["plan"])
        s.update(plan_energy(plan, estimate(plan, catalog), catalog, usd_per_kwh=usd_per_kwh))
        if usd_per_kwh is not None:
            s["gpu_usd"] = s["job_usd"]
            s["job_usd"] = s["gpu_usd"] + s["energy_usd"]


def energy_lines(best: dict, name: str = "#1") -> list[str]:
    """What ``hetplan plan --energy`` prints under the ranking about plan #1 (``name``: the plan, when it is not
    the ranking's #1)."""
    from hetplan.energy.report import ENERGY_SOURCE_WORDS
    from hetplan.units import kwh_text, usd_text

    kj = best["energy_j_per_iteration"] / 1e3
    line = (f"Energy of {name} at the top SM clock: {kj:,.1f} kJ per iteration, {kwh_text(best['job_energy_kwh'])} kWh "
            f"per job, {best['average_power_w'] / 1e3:,.1f} kW on average "
            f"({ENERGY_SOURCE_WORDS[best['energy_source']]})")  # it read "(dvfs-physics)"
    out = [line]
    if best["perseus_saved_fraction"] is not None:
        out.append(f"Perseus' frequency plans remove {best['perseus_saved_fraction']:.1%} of it at the same iteration "
                   f"time ({best['perseus_saved_j_per_iteration'] / 1e3:,.1f} kJ per iteration).")
    if best.get("energy_usd") is not None:
        out.append(f"Electricity ${usd_text(best['energy_usd'])} of the job's ${usd_text(best['job_usd'])}.")
    return out


def print_energy_pareto(summaries: list[dict], path: Path, title: str, quiet: bool) -> list[dict]:
    """The time–$–energy Pareto frontier of ``summaries`` (they carry energy): print (unless ``quiet``), draw to
    ``path``, return the frontier's summaries (fastest first)."""
    from hetplan.energy.job import pareto3, plot_pareto3

    seen, uniq = set(), []
    for s in summaries:  # the ranking and the cost-time walk may propose the same plan
        key = json.dumps(s["plan"], sort_keys=True)
        if key not in seen:
            seen.add(key)
            uniq.append(s)
    front = pareto3([(s["iteration_time_s"], s["job_usd"], s["job_energy_kwh"]) for s in uniq])
    plot_pareto3(uniq, front, path, title)
    pts = sorted((uniq[i] for i in front), key=lambda s: s["iteration_time_s"])
    if not quiet:
        from hetplan.cli.output import NARROW, gpus_text, layout_text, new_table, table_console
        from hetplan.units import kwh_text, usd_text

        con = table_console()
        narrow = con.width < NARROW
        # built as the ranking is: at 80 columns it broke its borders and cut the GPUs to "28x A100-SX…" (a plan
        # of 4 A100 + 24 A10G)
        t = new_table(f"Time-$-energy Pareto frontier ({len(pts)} of {len(uniq)} plans)", narrow)
        plan_cols = ("plan",) if narrow else ("GPUs", "TPxPPxDP", "mbs", "ZeRO")
        for col in ("#", *plan_cols, "iter s", "job $", "job kWh", "Perseus saves"):
            t.add_column(col, justify="left" if col in ("plan", "GPUs") else "right", no_wrap=col != "plan")
        for i, s in enumerate(pts, start=1):
            saved = s["perseus_saved_fraction"]
            plan = ((f"{gpus_text(s)}\n{layout_text(s)} mbs {s['mbs']} ZeRO-{s['zero']}",) if narrow
                    else (gpus_text(s), layout_text(s), str(s["mbs"]), str(s["zero"])))
            # money and energy as the ranking writes them (",.0f" printed $0.0184 and 0.0014 kWh as 0)
            t.add_row(str(i), *plan, f"{s['iteration_time_s']:.2f}", usd_text(s["job_usd"]),
                      kwh_text(s["job_energy_kwh"]), "-" if saved is None else f"{saved:.1%}")
        con.print(t)
        con.print(f"Drawn to {path}.", highlight=False)
    return pts
