"""``hetplan energy``: Perseus-style frequency plans (frontier, baselines) and the plan server.

Heavy imports (fastapi, uvicorn, matplotlib) happen inside the commands that need them.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from hetplan.errors import HetplanError


def _positive(value: float, name: str, fix: str) -> None:
    if not (value > 0 and math.isfinite(value)):
        raise HetplanError(f"must be positive, got {value}", field=name, fix=fix)


def register(app: typer.Typer) -> None:
    """Add the ``energy`` sub-app (``frontier``, ``serve``) to ``app``."""
    energy = typer.Typer(name="energy", help="GPU frequency plans on the iteration time–energy frontier (Perseus).",
                         no_args_is_help=True)
    app.add_typer(energy, name="energy")

    @energy.command("frontier")
    def frontier_cmd(
        profile: Path = typer.Argument(..., help="stage profile CSV: stage,instruction,frequency,time,energy"),
        num_microbatches: int = typer.Option(..., "--num-microbatches", "-m", help="micro-batches per iteration"),
        idle_power_w: float = typer.Option(..., "--idle-power-w", help="GPU power while blocked on communication (W)"),
        unit_time_s: float = typer.Option(0.001, "--unit-time-s", help="time quantum of the planner (s)"),
        schedule: str = typer.Option("1f1b", "--schedule", help="1f1b or gpipe"),
        output: Path = typer.Option(..., "-o", "--output", help="output directory"),
        straggler_slowdown: float = typer.Option(None, "--straggler-slowdown",
                                                 help="also pick the plan for a straggler this much slower (e.g. 1.2)"),
        baselines: bool = typer.Option(True, "--baselines/--no-baselines", help="compute EnvPipe / Zeus baselines"),
        plot: bool = typer.Option(True, "--plot/--no-plot", help="write frontier.png"),
        plans: bool = typer.Option(True, "--plans/--no-plans", help="write one plan JSON per point"),
        as_json: bool = typer.Option(False, "--json", help="print the summary as JSON"),
    ) -> None:
        """Compute the frontier; write DIR/frontier.csv, DIR/plans/plan_NNNNN.json, DIR/summary.json, DIR/frontier.png."""
        from hetplan.energy.frontier import compute_frontier
        from hetplan.energy.profile import load_stage_profile
        from hetplan.energy.report import plot_frontier, summarize

        if num_microbatches < 1:
            raise HetplanError(f"must be ≥ 1, got {num_microbatches}", field="--num-microbatches",
                               fix="use the number of micro-batches per iteration, e.g. 12")
        _positive(unit_time_s, "--unit-time-s", "use e.g. 0.001 (1 ms)")
        if not (idle_power_w >= 0 and math.isfinite(idle_power_w)):
            raise HetplanError(f"must be ≥ 0, got {idle_power_w}", field="--idle-power-w",
                               fix="use the GPU's blocking power, e.g. 83.64 (A100-SXM)")
        prof = load_stage_profile(profile)
        fr = compute_frontier(prof, num_microbatches, idle_power_w, unit_time_s, schedule.lower())
        try:
            output.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise HetplanError(f"cannot create {output}: {exc.strerror or exc}", field="--output",
                               fix="give a writable directory") from None
        fr.write_csv(output / "frontier.csv")
        if plans:
            fr.write_plans(output / "plans")
        summary = summarize(fr, straggler_slowdown=straggler_slowdown, baselines=baselines)
        summary["profile"] = str(profile)
        (output / "summary.json").write_text(json.dumps(summary, indent=1))
        if plot:
            plot_frontier(fr, output / "frontier.png", summary)
        if as_json:
            short = {k: summary[k] for k in ("points", "pareto_points", "planner_time_s", "min_time_s", "max_time_s",
                                             "all_max", "energy_saved_at_max_speed_j", "at_max_speed")}
            for k in ("straggler", "envpipe"):
                if k in summary:
                    short[k] = summary[k]
            short["output"] = str(output)
            typer.echo(json.dumps(short, indent=1))
            return
        con = Console()
        t = Table(title=f"{profile.name}: {prof.num_stages} stages × {num_microbatches} micro-batches ({schedule})")
        t.add_column("what")
        t.add_column("time (s)", justify="right")
        t.add_column("energy (J)", justify="right")
        t.add_row("frontier fastest", f"{fr.time_s.min():.3f}", f"{fr.energy_j[-1]:.1f}")
        t.add_row("frontier least energy", f"{fr.time_s[int(fr.energy_j.argmin())]:.3f}", f"{fr.energy_j.min():.1f}")
        t.add_row("all-max (replayed)", f"{summary['all_max']['time_s']:.4f}", f"{summary['all_max']['energy_j']:.1f}")
        b = summary.get("at_max_speed")
        if b:
            t.add_row("Perseus at all-max time", f"{b['time_s']:.4f}", f"{b['energy_at_deadline_j']:.1f}  (saves {100 * b['saved_fraction']:.1f} %)")
        if summary.get("envpipe"):
            t.add_row("EnvPipe", f"{summary['envpipe']['time_s']:.4f}", f"{summary['envpipe']['energy_j']:.1f}")
        s = summary.get("straggler")
        if s:
            t.add_row(f"straggler ×{s['slowdown']:g}", f"{s['straggler_time_s']:.4f}",
                      f"{s['energy_at_deadline_j']:.1f}  (saves {100 * s['saved_fraction']:.1f} %)")
        con.print(t)
        con.print(f"{len(fr)} points ({summary['pareto_points']} Pareto-optimal) in {fr.result.planner_time_s:.2f} s CPU; "
                  f"wrote {output}/frontier.csv" + (f", {len(fr)} plans" if plans else ""))

    @energy.command("serve")
    def serve_cmd(
        db: Path = typer.Option(Path("hetplan-energy.sqlite"), "--db", help="SQLite state file"),
        host: str = typer.Option("127.0.0.1", "--host"),
        port: int = typer.Option(7787, "--port"),
    ) -> None:
        """Run the frequency plan server (training ranks register, fetch schedules, report measurements)."""
        try:
            import uvicorn

            from hetplan.energy.server.app import create_app
        except ImportError as exc:  # pragma: no cover - extras missing
            raise HetplanError(f"the plan server needs the serve extra ({exc.name} is missing)", field="install",
                               fix="pip install 'hetplan[serve]'") from None
        if not 0 < port < 65536:
            raise HetplanError(f"port {port} is out of range", field="--port", fix="use 1..65535")
        uvicorn.run(create_app(db), host=host, port=port, log_level="info")
