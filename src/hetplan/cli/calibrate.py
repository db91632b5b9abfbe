"""``hetplan calibrate RUNS -o calibration.toml``: fit hetplan to your own measured runs
(:mod:`hetplan.calibration.user`); ``plan`` / ``estimate --calibration FILE`` then use the factors and your
residuals for the prediction intervals."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer


def register(app: typer.Typer) -> None:
    """Add ``calibrate``."""

    @app.command("calibrate", short_help="Fit the stack factors your measured runs identify into a calibration "
                 "file (or, with --calibration, check one).")
    def calibrate(
        runs: list[Path] = typer.Argument(..., metavar="RUNS", help="CSV files of measured runs — columns named after `hetplan "
                                          "plan`'s flags (model, gpu, gpus, seq_len, global_batch, mbs, tp, pp, dp, "
                                          "cp, ep, virtual_stages, zero, recompute, dtype, fp8_recipe, attention, "
                                          "framework, stack, node or inter_node_gbit; fsdp_shard for HSDP, "
                                          "moe_capacity_factor and moe_pad_to_capacity for token dropping, "
                                          "mtp_layers for multi-token prediction) plus "
                                          "step_time_s (and optionally "
                                          "memory_gib), or a column plan naming a plan JSON — and/or Megatron-LM "
                                          "or torchtitan training logs (one run each)."),
        output: Optional[Path] = typer.Option(None, "--output", "-o", help="Write the calibration TOML here."),
        model: Optional[str] = typer.Option(None, "--model", help="Model of runs that do not name one (logs)."),
        gpu: Optional[str] = typer.Option(None, "--gpu", help="GPU type of runs that do not name one (logs)."),
        gpus: Optional[int] = typer.Option(None, "--gpus", help="GPUs of runs that do not say (torchtitan logs "
                                           "without a mesh line)."),
        node: Optional[str] = typer.Option(None, "--node", help="Node preset of runs that do not name one."),
        catalog: Optional[Path] = typer.Option(None, "--catalog", help="User GPU catalog TOML."),
        as_json: bool = typer.Option(False, "--json", help="Print the fit as JSON."),
        plot_path: Optional[Path] = typer.Option(None, "--plot", help="Write a predicted-vs-measured plot of the "
                                                 "runs (PNG, PDF, SVG …): hetplan alone, calibrated, and each run "
                                                 "left out of the fit."),
        residuals_only: bool = typer.Option(
            False, "--residuals-only", help="Accept runs that identify no factor: the file then carries only "
            "their residuals (the intervals of `plan --calibration`), every factor at 1. Without it such runs "
            "are refused (exit 2) with each factor's reason."),
        check_file: Optional[Path] = typer.Option(
            None, "--calibration", help="Check this calibration (written by `hetplan calibrate -o`) on RUNS "
            "instead of fitting one: each run priced with and without it, and whether its measured step falls in "
            "the 80 % interval `plan --calibration` prints. Give runs it was not fitted on."),
    ) -> None:
        """Fit the stack factors (GEMM, attention, communication) that your measured runs identify, report the
        leave-one-out error and write a calibration file for `plan` / `estimate --calibration`; with
        --calibration FILE, check that file on other runs instead."""
        from rich.console import Console
        from rich.progress import Progress

        from hetplan.calibration.user import check, fit, load_calibration, read_runs
        from hetplan.cli.output import new_table, output_file, table_console, NARROW
        from hetplan.errors import HetplanError
        from hetplan.hardware.catalog import load_catalog
        from hetplan.inputs import check_output_path

        if check_file is not None and output is not None:
            raise HetplanError("--output writes a fitted calibration; --calibration checks an existing one",
                               field="--output", fix="drop --output to check FILE, or drop --calibration to fit")
        if gpus is not None and gpus < 1:  # was passed on only to runs that lack the column, else dropped
            raise HetplanError(f"--gpus {gpus}: a run uses 1 GPU or more", field="--gpus", fix="give --gpus 1 or more")
        check_output_path(output, "--output")
        output_file(plot_path, "--plot", figure=True)
        cat = load_catalog(catalog)
        cal_in = load_calibration(check_file) if check_file is not None else None
        with Progress(console=Console(stderr=True), transient=True) as bar:
            task = bar.add_task("pricing runs", total=None)
            defaults = {k: str(v) for k, v in (("model", model), ("gpu", gpu), ("gpus", gpus), ("node", node))
                        if v is not None}
            rs = read_runs(runs, cat, defaults, progress=lambda: bar.advance(task))
        if cal_in is not None:
            _print_check(check(rs, cat, cal_in), cal_in, check_file, as_json)
            return
        report = fit(rs, cat, residuals_only)
        c = report.calibration
        if output is not None:
            output.write_text(c.to_toml(", ".join(map(str, runs)), report.leave_one_out))
        if plot_path is not None:
            _plot(report, plot_path)
        if as_json:
            print(json.dumps({"compute_factor": c.compute_factor, "attention_factor": c.attention_factor,
                              "comm_factor": c.comm_factor, "gpus": c.gpus,
                              "stacks": c.stacks, "not_identified": c.not_identified, "before": report.before,
                              "after": report.after, "leave_one_out": report.leave_one_out, "rows": report.rows,
                              "memory_signed_median": c.memory_signed_median}, indent=1))
            return
        con = table_console()
        t = new_table(f"{len(rs)} runs of {', '.join(c.stacks)} on {', '.join(c.gpus)} (s per iteration)",
                      con.width < NARROW)
        for col in ("run", "measured", "hetplan", "calibrated", "left out"):
            t.add_column(col, justify="left" if col == "run" else "right")
        for r in report.rows:
            t.add_row(r["label"], f"{r['measured_s']:.3f}", f"{r['before_s']:.3f}", f"{r['after_s']:.3f}",
                      f"{r['loo_s']:.3f}")
        con.print(t)

        for name, e in (("hetplan", report.before), ("calibrated (fitted runs)", report.after),
                        ("leave-one-out", report.leave_one_out)):
            con.print(line(name, e), highlight=False)
        con.print(f"compute_factor {c.compute_factor:.3f}, attention_factor {c.attention_factor:.3f}, "
                  f"comm_factor {c.comm_factor:.3f}", highlight=False)
        for name, why in c.not_identified.items():
            con.print(f"not identified: {name} (kept at 1): {why}", highlight=False)
        if c.memory_signed_median is not None:
            con.print(f"memory: hetplan's prediction {c.memory_signed_median:+.1%} (signed median; not fitted)",
                      highlight=False)
        if output is not None:
            con.print(f"wrote {output} (use: hetplan plan ... --calibration {output})", highlight=False)
        if plot_path is not None:
            con.print(f"wrote {plot_path}", highlight=False)


def _plot(report, path: Path) -> None:
    """Measured vs predicted step time of each run of a fit (:class:`hetplan.calibration.user.FitReport`):
    hetplan alone, calibrated, and left out of the fit (leave-one-out), on one log-log panel."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from hetplan.calibration.validation import predicted_vs_measured_panel

    meas = [r["measured_s"] for r in report.rows]
    series = [(f"{name} (MAPE {e['mape']:.1%})", color, meas, [r[key] for r in report.rows])
              for name, color, key, e in (("hetplan", "tab:gray", "before_s", report.before),
                                          ("calibrated", "tab:orange", "after_s", report.after),
                                          ("left out", "tab:blue", "loo_s", report.leave_one_out))]
    fig, ax = plt.subplots(figsize=(5, 5))
    c = report.calibration
    predicted_vs_measured_panel(ax, series, f"{len(meas)} runs of {', '.join(c.stacks)} on {', '.join(c.gpus)} "
                                "(s per iteration)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def line(name: str, e: dict) -> str:
    """One summary line of errors (:func:`hetplan.calibration.user._errors`)."""
    return (f"{name}: MAPE {e['mape']:.1%}, signed median {e['signed_median']:+.1%} (+: too slow), "
            f"max {e['max_abs_error']:.1%}")


def _print_check(report, cal, path: Path, as_json: bool) -> None:
    """The held-out check of a calibration (:func:`hetplan.calibration.user.check`), as a table or JSON."""
    from hetplan.cli.output import NARROW, new_table, table_console

    if as_json:
        print(json.dumps({"calibration": str(path), "before": report.before, "after": report.after,
                          "interval_coverage": report.coverage, "not_covered": report.not_covered,
                          "rows": report.rows}, indent=1))
        return
    con = table_console()
    t = new_table(f"{len(report.rows)} runs checked against {path} (s per iteration)", con.width < NARROW)
    for col in ("run", "measured", "hetplan", "calibrated", "80 % interval", "in"):
        t.add_column(col, justify="left" if col == "run" else "right")
    for r in report.rows:
        iv = r["interval_s"]
        t.add_row(r["label"], f"{r['measured_s']:.3f}", f"{r['before_s']:.3f}", f"{r['after_s']:.3f}",
                  "unvalidated" if iv is None else f"{iv[0]:.3f}-{iv[1]:.3f}",
                  "" if r["inside"] is None else ("yes" if r["inside"] else "no"))
    con.print(t)
    con.print(line("hetplan", report.before), highlight=False)
    con.print(line("calibrated", report.after), highlight=False)
    cov = report.coverage
    if cov["n"]:
        con.print(f"measured inside the {cov['level']:.0%} interval: {cov['inside']:.0%} of {cov['n']} runs",
                  highlight=False)
    if report.not_covered:
        covers = (f"it covers {', '.join(cal.stacks)} on {', '.join(cal.gpus)}" if cal.stacks and cal.gpus
                  else "it covers no GPU and stack")
        con.print(f"{report.not_covered} run(s) on GPUs or stacks the calibration does not cover ({covers}): "
                  "priced without its factors", highlight=False)
