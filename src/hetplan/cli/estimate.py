"""``hetplan estimate``: the cost of one fully pinned plan (a plan JSON as ``hetplan plan -o`` writes it): iteration
time, memory per stage, MFU, money, and the prediction interval of its regime."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Optional

import typer

from hetplan.calibration.intervals import add_intervals
from hetplan.cli.output import NARROW, new_table, output_file, table_console
from hetplan.cli.plan import (_CALIBRATION, _PRICE_SOURCE, _PRICES, _PROVIDER, _calibrated, _interval_lines, _interval_text, _mem,
                              _print_provenance, _profiles, _repriced, add_launch_refusals)
from hetplan.errors import HetplanError
from hetplan.estimate.estimator import estimate as estimate_plan
from hetplan.estimate.memory import fit_warning
from hetplan.estimate.variability import slowest_gpu_factor
from hetplan.hardware.catalog import load_catalog
from hetplan.hardware.stacks import resolve_stack
from hetplan.jobfile import read_structured, resolve_model_path, validated
from hetplan.model.spec import load_model
from hetplan.plan import Plan
from hetplan.plan_rules import check_plan
from hetplan.report import plan_summary
from hetplan.units import duration_text, usd_text
from hetplan.search.planner import check_job


def estimate_command(
    plan_file: Path = typer.Argument(..., metavar="PLAN.json", help="A plan JSON (as written by `hetplan plan -o`)."),
    catalog: Optional[Path] = typer.Option(None, "--catalog", help="User GPU catalog TOML."),
    as_json: bool = typer.Option(False, "--json", help="Print the estimate as JSON."),
    timeline: Optional[Path] = typer.Option(None, "--timeline", help="Draw the pipeline schedule (Gantt chart) to this file; its suffix picks the format (.png, .svg, .pdf …)."),
    profile_db: Optional[Path] = typer.Option(None, "--profile-db", help="Profile database (SQLite) of measured "
                                              "layer times: stages it covers use them (column `source`)."),
    price_source: str = _PRICE_SOURCE, provider: Optional[str] = _PROVIDER, prices_file: Optional[Path] = _PRICES,
    stack: Optional[str] = typer.Option(None, "--stack", help="NAME\\[@VERSION|@YYYY-MM]: price the plan under this "
                                        "stack (`hetplan catalog stacks`); its framework, attention and compile "
                                        "replace the plan's."),
    calibration: Optional[Path] = _CALIBRATION,
) -> None:
    """Estimate one fully pinned plan: iteration time, memory per stage, MFU, money. --price-source other
    than catalog, or --provider, re-prices every pool (a written plan carries the prices `plan` chose)."""
    output_file(timeline, "--timeline", figure=True)
    if stack is not None:  # named by the flag, not by the plan's job.stack it replaces
        resolve_stack(stack, field="--stack")
    raw = read_structured(plan_file)
    if isinstance(raw.get("job"), dict) and isinstance(raw["job"].get("model"), str):
        # a model config beside the plan (examples/tiny-pp2-dp2.json) is found from any folder
        raw["job"]["model"] = resolve_model_path(raw["job"]["model"], plan_file)
    if stack is not None and isinstance(raw.get("job"), dict):
        raw["job"] = {k: v for k, v in raw["job"].items() if k not in ("framework", "attention", "torch_compile")}
        raw["job"]["stack"] = stack
    plan = validated(Plan, raw, "plan")
    m = load_model(plan.job.model)
    check_job(plan.job, m)
    check_plan(plan, m)
    cat = load_catalog(catalog)
    pools_priced, prices = _repriced(plan.pools, cat, price_source, provider, prices_file)
    cal, cat = _calibrated(calibration, cat, pools_priced, plan.job)
    plan = plan.model_copy(update={"pools": cal.apply_pools(pools_priced, cat) if cal else pools_priced})
    profiles = _profiles(profile_db)
    est = estimate_plan(plan, cat, m, profiles)
    if timeline is not None:
        from hetplan.estimate.timeline import draw_timeline

        try:
            draw_timeline(plan, timeline, model=m, catalog=cat, profiles=profiles)
        except ImportError:
            raise HetplanError("drawing a timeline needs matplotlib", field="--timeline",
                               fix="pip install 'hetplan[plot]'") from None
    summary = plan_summary(plan, est)
    add_intervals([summary], cat, cal)
    add_launch_refusals([summary], [plan], m)
    if as_json:
        print(json.dumps(dict(summary, estimate=asdict(est), prices=prices), indent=1))
        return
    con = table_console()
    narrow = con.width < NARROW
    t = new_table(f"{plan.job.model}: {plan.num_gpus} GPUs, pp {plan.pp}, mbs {plan.mbs}, "
                  f"{plan.num_microbatches(0)} micro-batches, ZeRO-{plan.zero}", narrow)
    cols = (("stage", "GPU", "TP", "DP", "layers", "recompute", "fwd/bwd ms", "source", "GiB/capacity", "fits")
            if narrow else ("stage", "GPU", "TP", "DP", "layers", "recompute", "fwd ms", "bwd ms", "source", "mem GiB",
                            "capacity GiB", "fits"))
    for col in cols:
        t.add_column(col)
    warnings: list[str] = []
    for i, se in enumerate(est.stages):
        fwd, bwd = f"{se.forward_s * 1e3:.1f}", f"{se.backward_s * 1e3:.1f}"
        mem, cap = _mem(se.memory.total), _mem(se.memory_capacity_bytes)
        figures = (f"{fwd}/{bwd}", se.time_source, f"{mem}/{cap}") if narrow else (fwd, bwd, se.time_source, mem, cap)
        # fits, but its expected footprint does not: a warning, not a refusal
        warning = fit_warning(se.memory.required, se.memory.total, se.memory_capacity_bytes)
        if warning:
            warnings.append(f"stage {i}: {warning}")
        t.add_row(str(i), se.gpu, str(se.tp), str(se.dp), str(se.num_layers), se.recompute, *figures,
                  ("tight" if warning else "yes") if se.fits else "[red]NO[/]")
    con.print(t)
    for line in warnings:
        con.print(line, highlight=False, markup=False)
    con.print(f"iteration {est.iteration_time_s:.3f} s (bubble {est.bubble_fraction:.1%}, exposed DP sync "
              f"{est.dp_exposed_time_s:.3f} s), {est.tokens_per_s:,.0f} tokens/s, MFU {est.mfu:.1%} (HFU {est.hfu:.1%}); "
              f"${usd_text(est.usd_per_hour)}/h, ${usd_text(est.usd_per_iteration)}/iteration; job {duration_text(est.job_time_s)}, "
              f"${usd_text(est.job_usd)}" + (f"; iteration time {_interval_text(summary)}" if _interval_text(summary) else ""))
    slowest = max(((float(slowest_gpu_factor(se.tp * plan.cp * se.dp, cat.get(se.gpu).speed_variability)),
                    se.tp * plan.cp * se.dp, cat.get(se.gpu).speed_variability) for se in est.stages))
    if slowest[0] > 1.0:  # hetplan.estimate.variability
        con.print(f"slowest GPU: a stage of {slowest[1]} GPUs computes at the pace of its slowest, compute "
                  f"+{slowest[0] - 1:.1%} (boards of one type differ by {slowest[2]:.1%}, one standard deviation)",
                  highlight=False)
    if plan.job.mtp_layers:  # Job.mtp_layers, inside the last stage's times and memory
        con.print(f"multi-token prediction: {plan.job.mtp_layers} module(s) on the last stage (each one more layer, "
                  "the embedding copy, the 2h -> h projection and a pass of the output head)", highlight=False)
    if any(se.alltoall_s > 0 for se in est.stages):  # the EP all-to-all inside the stage times
        a2a = [(se.alltoall_s * 1e3, se.alltoall_s / (se.forward_s + se.backward_s)) for se in est.stages]
        parts = (", ".join(f"stage {i} {ms:.1f} ms ({share:.0%})" for i, (ms, share) in enumerate(a2a))
                 if len(a2a) <= 4 else f"{min(a[0] for a in a2a):.1f}-{max(a[0] for a in a2a):.1f} ms per stage "
                 f"({min(a[1] for a in a2a):.0%}-{max(a[1] for a in a2a):.0%})")
        cf = plan.job.moe_capacity_factor
        drop = ("" if cf is None else
                f", tokens dropped beyond capacity {cf:g}{' and padded to it' if plan.job.moe_pad_to_capacity else ''}")
        con.print(f"MoE all-to-all (EP {plan.ep}, {plan.job.moe_dispatcher}{drop}"
                  f"{', 1F1B-overlapped: exposed part' if plan.job.moe_a2a_overlap else ''}) per micro-batch, forward "
                  f"+ backward, share of the stage's time: {parts}", highlight=False)
    for line in _interval_lines(summary):
        con.print(line, highlight=False, markup=False)
    _print_provenance(con, prices)
    if not est.fits:
        raise HetplanError("the plan does not fit in GPU memory (see the table)", field="plan",
                           fix="raise tp/pp, use recompute or ZeRO, or lower mbs")


def register(app: typer.Typer) -> None:
    """Add ``hetplan estimate``."""
    app.command("estimate", short_help="Estimate one fully pinned plan: iteration time, memory per stage, MFU, "
                "money.")(estimate_command)
