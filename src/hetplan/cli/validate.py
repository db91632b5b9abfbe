"""``hetplan validate``: run the estimator on public measured training data and report its error.

Sets (stable names, read by other tools): vtrain_single_node, vtrain_multi_node, megatron_sc21_table1,
korthikanti_table5, aceso_v100, fasop_layers, espresso_hetero, nemo_megatron_a100 (the 2021-22 stacks on A100,
:func:`hetplan.calibration.validation.stacks_2022_cases`); modern sets (:mod:`hetplan.calibration.modern`):
dgxc_h100, dgxc_gb200, torchtitan, llama3_405b, megatron_lm_h100, moe_h100, long_context_cp, megatron_bridge; the independent
check ``independent_h100`` (:mod:`hetplan.calibration.independent`; only a seeded half of its llm-foundry rows
fitted that stack's own residuals) and ``llm_foundry_a100`` (llm-foundry's A100 tables, every row held out). See
:mod:`hetplan.calibration.validation` and docs/estimator.md.

The table shows, per set, the error metrics and the calibration / held-out split; with ``fasop_layers`` also its
errors per GPU type and the A10G / A100 per-layer time ratio of GPT-2 XL at micro-batch 1 against FASOP's measured
1.43 (the same figures as ``--json``'s ``per_gpu`` and ``a10g_over_a100_gpt2xl``).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Optional

import typer

from hetplan.cli.output import NARROW, new_table


def _fmt(x: float, pct: bool = True) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{100 * x:.1f} %" if pct else f"{x:.3f}"


def _signed(x: float) -> str:
    return "-" if x is None or math.isnan(x) else f"{100 * x:+.1f} %"


def _print_stacks(console, stacks: dict) -> None:
    """The error per software stack (``--json``'s ``stacks``): n, MAPE, signed median, max and its sets."""

    t = new_table("Per stack (every row of the sets run; signed: predicted speed / measured - 1, + = too fast)",
                  console.width < NARROW)
    for col in ("stack", "n", "MAPE", "signed", "max", "sets"):
        t.add_column(col, no_wrap=col != "sets")
    for name, r in stacks.items():
        t.add_row(name, str(r["n"]), _fmt(r["mape"]), _signed(r["signed_median"]), _fmt(r["max_abs_error"]),
                  ", ".join(r["sets"]))
    console.print(t)


#: What each first-table set was fitted on (the footnote under that table), by set.
_FITTED_ON = {
    "vtrain_single_node": "seeded 25 % of vTrain rows (A100)", "vtrain_multi_node": "seeded 25 % of vTrain rows (A100)",
    "aceso_v100": "Aceso TP-1 rows (V100)",
    "fasop_layers": "seeded half of FASOP's per-layer rows (A10G efficiency and the launch cost of FASOP's hosts)",
    "espresso_hetero": "Espresso's runs that fitted A30/A4000/A6000/3090",
}


def _legacy_footnote(names: list[str]) -> str:
    """The footnote of the first table, for the sets chosen only: vTrain's own MAPE where a vTrain set ran, what
    each set's calibration rows are, and which sets are fully held out."""
    parts = []
    if any(n.startswith("vtrain") for n in names):
        parts.append("vTrain's own MAPE: 8.37 % single-node, 14.73 % multi-node.")
    parts.append("Kendall τ: within each job (same model, GPU count, global batch).")
    fitted = list(dict.fromkeys(_FITTED_ON[n] for n in names if n in _FITTED_ON))
    if fitted:
        parts.append("Calibration: " + ", ".join(fitted) + ".")
    held = [n for n in names if n not in _FITTED_ON]
    if held:
        parts.append(", ".join(held) + (" is" if len(held) == 1 else " are") + " fully held out.")
    return " ".join(parts)


def _print_fasop(console, r: dict) -> None:
    """FASOP's set in detail: errors per GPU type and the A10G / A100 layer-time ratio (``--json`` figures)."""

    if "per_gpu" in r:
        t = new_table("fasop_layers: per-layer forward time at micro-batch 1, per GPU type", console.width < NARROW)
        for col in ("GPU", "n", "MAPE", "mean error", "max |err|"):
            t.add_column(col, no_wrap=True)
        for gpu, g in r["per_gpu"].items():
            t.add_row(gpu, str(g["n"]), _fmt(g["mape"]), f"{100 * g['mean_error']:+.1f} %", _fmt(g["max_abs_error"]))
        console.print(t)
    q = r.get("a10g_over_a100_gpt2xl")
    if q:
        console.print(f"A10G / A100 layer time, GPT-2 XL, TP 1: micro-batch 1 predicted {q['predicted_mbs1']:.2f}, "
                      f"measured {q['measured_mbs1']:.2f} (FASOP); micro-batch 8 predicted {q['predicted_mbs8']:.2f}; "
                      f"peak ratio {q['peak_ratio']:.2f}.")


def _print_modern(console, sets: dict) -> None:
    """The modern sets (:mod:`hetplan.calibration.modern`): errors, the rows not expressible yet and what each
    set compares (its MFU convention)."""
    from collections import Counter

    t = new_table("Modern sets (errors as % of measured)", console.width < NARROW)
    for col in ("set", "n", "excl.", "MAPE", "signed", "max", "τ", "held-out", "memory"):
        t.add_column(col, no_wrap=True)
    for name, r in sets.items():
        mem = r.get("memory", {}).get("max_abs_error", float("nan"))
        t.add_row(name, str(r["n"]), str(r["not_expressible"]["n"]), _fmt(r["mape"]), _signed(r["signed_median"]),
                  _fmt(r["max_abs_error"]),
                  _fmt(r["kendall_tau"], pct=False), _fmt(r["held_out"]["mape"]), _fmt(mem))
    console.print(t)

    def say(text: str) -> None:
        console.print(text, highlight=False)

    for name, r in sets.items():
        say(f"[bold]{name}[/]: {r['convention']}.")
        if "dense_cp1" in r:
            d = r["dense_cp1"]
            say(f"  dense, CP 1: n {d['n']}, MAPE {_fmt(d['mape'])}, τ {_fmt(d['kendall_tau'], pct=False)}")
            for dt, d in r.get("dense_cp1_per_dtype", {}).items():
                say(f"    {dt}: n {d['n']}, MAPE {_fmt(d['mape'])}, max {_fmt(d['max_abs_error'])}")
        if len(r.get("per_dtype", {})) > 1:
            say("  by dtype: " + "; ".join(f"{dt} n {d['n']}, MAPE {_fmt(d['mape'])}" for dt, d in r["per_dtype"].items()))
        if r["does_not_fit"]:
            say(f"  predicted not to fit although they ran: {len(r['does_not_fit'])} of {r['n']} rows")
        for reason, k in Counter(x["reason"] for x in r["not_expressible"]["rows"]).most_common():
            say(f"  not expressible ({k}): {reason}")
        for note, k in r["approximations"].items():
            say(f"  approximated ({k}): {note}")
        if "rows" in r:  # the independent set: its median and worst rows (all rows in --json)
            say(f"  median |error| {_fmt(r['median_abs_error'])}; worst rows (predicted / measured - 1):")
            for x in r["rows"][:3]:
                say(f"    {100 * x['error']:+.1f} %  {x['key']}")
    say("excl.: rows not expressible yet (listed one by one in --json); memory: max |error| over the rows that "
        "report memory.")


def _print_serving(console, r: dict) -> None:
    """The serving set (:mod:`hetplan.calibration.serving`): calibration / held-out halves, per source, worst rows."""
    from rich.table import Table

    t = Table(title="Serving set (time errors in %; bias: speed, + = too fast)")
    for col in ("part", "n", "MAPE", "bias", "median", "max"):
        t.add_column(col, no_wrap=col == "part")
    parts = [("all", r), ("calibration", r["calibration"]), ("held-out", r["held_out"])]
    parts += [(name, x) for name, x in r["per_source"].items()]
    for name, x in parts:
        t.add_row(name, str(x["n"]), _fmt(x["mape"]), _signed(x["signed_median"]), _fmt(x["median_abs_error"]),
                  _fmt(x["max_abs_error"]))
    console.print(t)
    console.print(f"serving: {r['convention']}; target MAPE ≤ {100 * r['target']['mape']:.0f} %. Worst rows:",
                  highlight=False)
    for x in r["rows"][:3]:
        console.print(f"  time {100 * x['error']:+.1f} %  {x['key']}", highlight=False)


def _print_energy(console, r: dict) -> None:
    """The energy set (:mod:`hetplan.energy.validation`): J per instruction and average power, held out."""
    from rich.table import Table

    t = Table(title="Energy: Perseus' measured J per instruction (GPT-3 fitted, BLOOM held out)")
    for col in ("rows", "n", "energy MAPE", "signed", "power MAPE", "signed", "power |err| median"):
        t.add_column(col)
    for name, e, p in (("all", r, r["power"]), ("held out", r["held_out"], r["power_held_out"])):
        t.add_row(name, str(e["n"]), _fmt(e["mape"]), _signed(e["signed_median"]), _fmt(p["mape"]),
                  _signed(p["signed_median"]), _fmt(p["median_abs"]))
    console.print(t)
    sv = r.get("serving")
    if sv:
        h = sv["power_held_out"]
        console.print(f"Serving power (ML.ENERGY, compute-bound rows, held-out models): {h['n']} rows, MAPE "
                      f"{_fmt(h['mape'])}, signed {_signed(h['signed_median'])}, |err| median {_fmt(h['median_abs'])}",
                      highlight=False)
    console.print(f"Target (held out): power per GPU within 10 % median, energy within 15 % where the time is within "
                  f"10 %: {'met' if r['met'] else 'NOT met'}.")


def _finite(x):
    """``x`` with every NaN or infinite float replaced by None (``null`` in JSON)."""
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def register(app: typer.Typer) -> None:
    """Add ``validate`` to ``app``."""

    @app.command("validate", short_help="Estimator error (MAPE, signed median) on every published validation "
                 "set, per set and per software stack.")
    def validate(
        json_out: bool = typer.Option(False, "--json", help="print {\"sets\": {NAME: {n, mape, max_abs_error, "
                                      "signed_median, kendall_tau, calibration, held_out}}, \"stacks\": {STACK: {n, "
                                      "mape, max_abs_error, signed_median, sets}}, \"interval_coverage\": {SET: {n, in_sample, "
                                      "leave_set_out, unvalidated_leave_set_out}}} only (fasop_layers adds per_gpu and a10g_over_a100_gpt2xl; "
                                      "independent_h100 and llm_foundry_a100 add rows: per-row errors, worst first (llm_foundry_a100 also "
                                      "per_gpu, per_model, per_seq_len); nemo_megatron_a100 adds "
                                      "per_tp: the metrics per TP degree; bigscience_a100 adds per_tp, per_pp and "
                                      "measured_oom: whether its rows that ran out of memory are refused); a metric without a value "
                                      "(one row, no held-out rows) is null"),
        sets: Optional[str] = typer.Option(None, "--sets", help="comma-separated subset of: vtrain_single_node, vtrain_multi_node, "
                                              "megatron_sc21_table1, korthikanti_table5, aceso_v100, fasop_layers, "
                                              "espresso_hetero, nemo_megatron_a100, dgxc_h100, dgxc_gb200, torchtitan, llama3_405b, "
                                              "megatron_lm_h100, moe_h100, long_context_cp, bigscience_a100, megatron_bridge, "
                                              "independent_h100, llm_foundry_a100, serving, energy"),
        csv_path: Optional[Path] = typer.Option(None, "--csv", help="write one row per configuration"),
        plot_path: Optional[Path] = typer.Option(None, "--plot", help="write a predicted-vs-measured plot; the suffix picks the format (.png, .svg, .pdf …)"),
        out_dir: Optional[Path] = typer.Option(None, "--out", help="write validation.csv and validation.png here"),
        write_residuals: bool = typer.Option(False, "--write-residuals", help="rewrite the package's table of held-out "
                                             "residuals that every plan's 80 % interval comes from "
                                             "(hetplan.calibration.intervals) and exit"),
    ) -> None:
        """Estimator error on vTrain, Megatron SC'21 Table 1, Korthikanti Table 5, Aceso's V100 profile and FASOP's
        per-layer profiles (A100, A10G, RTX 3090 at micro-batch 1), the 2021-22 stacks on A100 (NeMo Megatron
        22.02-22.09, MT-NLG 530B under Megatron-DeepSpeed; bigscience_a100: BLOOM's layout search and
        production steps under DeepSpeed's pipeline engine), and on the modern H100/H200/B200/GB200 sets
        (DGX Cloud, torchtitan, Llama 3, Megatron-LM, MoE, long context; megatron_bridge: Megatron-Bridge's FP8
        Llama rows on H100, B200, GB200 and GB300, held out); independent_h100: published H100 runs
        of llm-foundry, NeMo 24.07 and fms-fsdp (a seeded half of llm-foundry's fitted that stack's residuals, the
        rest held out; the issue's independent check: median ≤ 10 %, no
        row beyond 25 %); llm_foundry_a100: llm-foundry's A100 80GB / 40GB tables of 2023, all held out; serving: published TensorRT-LLM and vLLM serving benchmarks (TTFT, TPOT, tokens/s)
        against the engine-aware inference cost model (docs/serving.md); energy: measured J per instruction and
        average power per GPU against the power model (hetplan.energy.validation, docs/energy.md)."""
        from hetplan.calibration import independent, modern, serving
        from hetplan.errors import HetplanError
        from hetplan.calibration import validation as v

        if write_residuals:
            from hetplan.calibration.intervals import write_residuals as write

            given = [flag for flag, val in (("--json", json_out), ("--sets", sets), ("--csv", csv_path),
                                            ("--plot", plot_path), ("--out", out_dir)) if val not in (None, False)]
            if given:  # they were ignored: --sets X --write-residuals rewrote the table from every set
                raise HetplanError(f"--write-residuals rewrites the package's residuals from every set and prints "
                                   f"nothing else; {', '.join(given)} would be ignored", field="--write-residuals",
                                   fix=f"run --write-residuals alone, or drop it to use {', '.join(given)}")
            typer.echo(f"wrote {write()}")
            return

        from hetplan.energy import validation as energy_set

        every = v.SET_NAMES + modern.SET_NAMES + (independent.SET_NAME, independent.A100_SET_NAME, serving.SET_NAME,
                                                  energy_set.SET_NAME)
        # each set once: --sets aceso_v100,aceso_v100 ran its 12 rows twice and printed n = 24 for the set and stack
        names = every if sets is None else tuple(dict.fromkeys(s.strip() for s in sets.split(",") if s.strip()))
        if not names:  # --sets "" ran every set, --sets ",," none (an interval line and exit 0)
            raise HetplanError(f"--sets {sets!r} names no validation set", field="--sets",
                               fix=f"leave --sets out for every set, or name some of: {', '.join(every)}")
        bad = [n for n in names if n not in every]
        if bad:
            raise HetplanError(f"unknown validation set(s) {', '.join(bad)}", field="--sets",
                               fix=f"use some of: {', '.join(every)}")
        from hetplan.cli.output import output_dir, output_file

        if out_dir is not None:
            output_dir(out_dir, "--out")
            csv_path = csv_path or out_dir / "validation.csv"
            plot_path = plot_path or out_dir / "validation.png"
        output_file(csv_path, "--csv")
        output_file(plot_path, "--plot", figure=True)
        every_chosen = names
        new = tuple(n for n in names if n in modern.SET_NAMES)
        check_independent = independent.SET_NAME in names
        serving_result, serving_cases = serving.run_serving() if serving.SET_NAME in names else ({}, [])
        names = tuple(n for n in names if n in v.SET_NAMES)
        result, cases = v.run_validation(names)
        new_result, new_cases = modern.run_modern(new)
        if check_independent:
            ind_result, ind_cases = independent.run_independent()
            new_result.update(ind_result)
            new_cases += ind_cases
        if independent.A100_SET_NAME in every_chosen:
            a100_result, a100_cases = independent.run_a100()
            new_result.update(a100_result)
            new_cases += a100_cases
        result["sets"].update(new_result)
        result["sets"].update(serving_result)
        energy_result = energy_set.run_energy() if energy_set.SET_NAME in every_chosen else {}
        result["sets"].update(energy_result)
        cases += new_cases
        if csv_path is not None:
            v.write_csv(cases, csv_path)
        if plot_path is not None:
            v.plot(cases, plot_path)
        from hetplan.calibration.intervals import coverage, load_residuals, per_stack

        result["stacks"] = per_stack(cases) | serving.per_engine(serving_cases)
        # per chosen set, and "all" over every set of the package's residual table
        result["interval_coverage"] = {k: v for k, v in coverage(list(load_residuals())).items()
                                       if k == "all" or k in every_chosen}
        if json_out:
            # strict JSON: a metric with no value (Kendall tau of one row, coverage of a set with no held-out
            # rows) is null, not NaN, which JSON.parse, Go and serde refuse
            typer.echo(json.dumps(_finite(result), indent=2, allow_nan=False))
            return
        from hetplan.cli.output import table_console

        console = table_console()
        narrow = console.width < NARROW  # an 80-column terminal: compact, numbers whole (they were cut to '14…')
        table = new_table("Estimator vs. measured (errors as % of measured)", narrow)
        for col in ("set", "n", "MAPE", "signed", "max |err|" if not narrow else "max",
                    "Kendall τ" if not narrow else "τ", "held-out MAPE" if not narrow else "held-out",
                    "calib. MAPE" if not narrow else "calib.", "target", "met"):
            table.add_column(col, no_wrap=col != "target")  # set names stay whole (they are what --sets takes)
        for name in names:
            r = result["sets"][name]
            tgt = v.TARGETS.get(name, {})
            met = []
            for k, bound in tgt.items():
                val = r[k]
                met.append(val >= bound if k == "kendall_tau" else val <= bound)
            tgt_txt = ", ".join(
                f"{'τ' if k == 'kendall_tau' else 'MAPE' if k == 'mape' else 'max'} {'≥' if k == 'kendall_tau' else '≤'} "
                f"{b if k == 'kendall_tau' else f'{100 * b:.0f} %'}" for k, b in tgt.items()
            )
            table.add_row(
                name, str(r["n"]), _fmt(r["mape"]), _signed(r["signed_median"]), _fmt(r["max_abs_error"]),
                _fmt(r["kendall_tau"], pct=False),
                _fmt(r.get("held_out", {}).get("mape", float("nan"))), _fmt(r.get("calibration", {}).get("mape", float("nan"))),
                tgt_txt or "-", ("yes" if all(met) else "NO") if met else "-",
            )
        if names:  # only modern / independent sets chosen: no empty first table
            console.print(table)
        if "fasop_layers" in names:
            _print_fasop(console, result["sets"]["fasop_layers"])
        if new_result:
            _print_modern(console, new_result)
        if serving_result:
            _print_serving(console, serving_result[serving.SET_NAME])
        if energy_result:
            _print_energy(console, energy_result[energy_set.SET_NAME])
        if names:
            console.print(_legacy_footnote(names), highlight=False)
        if result["stacks"]:  # none when only the energy set ran
            _print_stacks(console, result["stacks"])
        cov = result["interval_coverage"]["all"]
        console.print(f"80 % intervals (package residuals, {cov['n']} held-out rows): hold the measured time on "
                      f"{_fmt(cov['in_sample'])} of rows; {_fmt(cov['leave_set_out'])} when each set is left out of "
                      f"its own intervals ({cov['unvalidated_leave_set_out']} rows then unvalidated). --json: "
                      "interval_coverage per set.", highlight=False)
        if csv_path is not None:
            console.print(f"wrote {csv_path}")
        if plot_path is not None:
            console.print(f"wrote {plot_path}")
