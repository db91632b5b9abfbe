"""``hetplan plan``: search and rank plans (``hetplan estimate``, the cost of one pinned plan, is
:mod:`hetplan.cli.estimate`; it shares the pricing and interval helpers of this module)."""

from __future__ import annotations

import functools
import inspect
import json
import re
import textwrap
from contextlib import contextmanager
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from hetplan.calibration.intervals import add_intervals
from hetplan.cli.output import NARROW, gpus_text, layout_text, new_table, output_file, table_console, write_output
from hetplan.errors import HetplanError
from hetplan.estimate.estimator import estimate as estimate_plan
from hetplan.hardware.catalog import load_catalog
from hetplan.jobfile import load_job_file, validated
from hetplan.plan import GPUPool, Inventory, Job
from hetplan.plan_rules import check_plan
from hetplan.report import plan_summary
from hetplan.units import duration_text, kwh_text, usd_text
from hetplan.search.objective import Objective
from hetplan.search.planner import Pins, search_plans
from hetplan.model.spec import load_model

GIB = 2**30
#: Words of the explanation line a search budget writes when it stops before proving its answer exact
#: (:mod:`hetplan.search.planner`); that line goes to stderr, never only into the explanation.
STOPPED = " stopped after "



@contextmanager
def walk_progress():
    """Progress bars of a search on standard error (rich, one per phase from its first step, removed when the search
    ends): yields ``progress(done, limit, phase)`` for the search (``limit`` None: a count with no bound), or None
    when stderr is not a terminal."""
    console = Console(stderr=True)
    if not console.is_terminal:
        yield None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   console=console, transient=True)
    tasks: dict = {}  # phase -> [task, last count seen]

    def progress(done: int, limit: int | None, phase: str) -> None:
        if not tasks:
            bar.start()
        if phase not in tasks:
            for task, last in tasks.values():  # the phases before have ended: show where they stopped
                bar.update(task, completed=last + 1, total=last + 1)
            tasks[phase] = [bar.add_task(phase, total=limit), done]
        tasks[phase][1] = done
        if done % 25 == 0:
            bar.update(tasks[phase][0], completed=done)

    try:
        yield progress
    finally:
        if tasks:
            bar.stop()


def _mem(b: float) -> str:
    return f"{b / GIB:.1f}"


def _positive(value: Optional[float], name: str) -> None:
    if value is not None and value <= 0:
        raise HetplanError(f"must be positive, got {value}", field=name, fix=f"give {name} > 0")


_PRICE_SOURCE = typer.Option("catalog", "--price-source", help="Price of pools without their own: catalog "
                             "(default) | on-demand | spot | committed (dated quotes, hetplan/hardware/data/prices.toml).")
_PROVIDER = typer.Option(None, "--provider", help="With --price-source: quotes of this provider only (aws, gcp, "
                         "lambda, coreweave, runpod, vast.ai); default: the cheapest provider's newest quote.")


_PRICES = typer.Option(None, "--prices", help="Your own dated quotes (TOML, the \\[\\[quote]] layout of "
                       "hetplan/hardware/data/prices.toml): they replace the shipped quotes of every GPU type they "
                       "name, and the default rule (median of each provider's newest on-demand quote) prices it.")
_CALIBRATION = typer.Option(None, "--calibration", help="Calibration TOML written by `hetplan calibrate` from your "
                            "measured runs: its factors and your residuals (the 80 % intervals) for plans on its "
                            "GPUs and stack.")


def _priced(pools: list[GPUPool], cat, price_source: str, provider: Optional[str],
            prices_file: Optional[Path] = None, where: str = "inventory.pools") -> tuple[list[GPUPool], list[dict]]:
    """``pools`` with the chosen price filled in where the pool gives none (hetplan.hardware.prices.choose), and
    one line per GPU type and price: the price, where it comes from, its date and whether the GPU's efficiency is
    calibrated. An unknown GPU type is named as ``where.N.gpu``."""
    from hetplan.hardware.prices import check_price_options, choose

    check_price_options(price_source.replace("-", "_"), provider, None if prices_file is None else str(prices_file))
    out, lines = [], {}
    for i, pool in enumerate(pools):
        spec = cat.get(pool.gpu, field=f"{where}.{i}.gpu")
        if pool.price_usd_per_hour is None:
            p = choose(spec, price_source.replace("-", "_"), provider,
                       prices_file=None if prices_file is None else str(prices_file))
            pool = pool.model_copy(update={"price_usd_per_hour": p.usd_per_gpu_hour})
            line = {"usd_per_gpu_hour": p.usd_per_gpu_hour, "from": p.label, "date": p.date, "stale": p.stale,
                    "source": p.source}
        else:
            line = {"usd_per_gpu_hour": pool.price_usd_per_hour, "from": "given", "date": "", "stale": False,
                    "source": "the job's price_usd_per_hour"}
        # one line per GPU type and price: two pools of one type at two prices listed only the first pool's
        lines.setdefault((spec.name, line["usd_per_gpu_hour"], line["from"]),
                         dict(gpu=spec.name, **line, calibrated=getattr(spec, "calibrated", True),
                              calibration_source=spec.calibration_source))
        out.append(pool)
    return out, list(lines.values())


def _repriced(pools: list[GPUPool], cat, price_source: str, provider: Optional[str],
              prices_file: Optional[Path] = None, where: str = "pools") -> tuple[list[GPUPool], list[dict]]:
    """:func:`_priced` for the pools of a written plan (``hetplan estimate PLAN.json``, ``plan --baseline``): a
    ``--prices`` file re-prices the GPU types it names, and a ``--price-source`` other than catalog, or a
    ``--provider``, re-prices every pool (a plan written by ``plan -o`` carries the prices that run chose). An
    unknown GPU type is named as ``where.N.gpu``."""
    if prices_file is not None:
        from hetplan.hardware.prices import user_quotes

        named = {q.gpu for q in user_quotes(str(prices_file))}
        pools = [p.model_copy(update={"price_usd_per_hour": None})
                 if cat.get(p.gpu, field=f"{where}.{i}.gpu").name in named else p for i, p in enumerate(pools)]
    if price_source != "catalog" or provider is not None:
        # an asked-for price source re-prices every pool: the prices `plan -o` wrote silently won over
        # --price-source spot / --provider (an unknown provider exited 0)
        pools = [p.model_copy(update={"price_usd_per_hour": None}) for p in pools]
    return _priced(pools, cat, price_source, provider, prices_file, where)


def _print_provenance(con, lines: list[dict], star_only: bool = False) -> None:
    """The price behind each GPU type's money, with its date (not under ``star_only``), and the GPUs whose
    efficiency is a first guess (the tables star them)."""
    from hetplan.hardware.prices import MAX_AGE_DAYS

    if not star_only:
        parts = [f"{ln['gpu']} {ln['usd_per_gpu_hour']:.2f} {ln['from']}" + (f", {ln['date']}" if ln["date"] else "")
                 + (f" (older than {MAX_AGE_DAYS} days)" if ln["stale"] else "") for ln in lines]
        con.print(textwrap.fill("Prices $/GPU-h: " + "; ".join(parts), width=max(40, con.width - 1),
                                subsequent_indent="  ", break_on_hyphens=False),
                  highlight=False, markup=False, soft_wrap=True)
    guesses = list(dict.fromkeys(ln["gpu"] for ln in lines if not ln["calibrated"]))
    if guesses:
        con.print(f"* uncalibrated: the compute efficiency of {', '.join(guesses)} is a first guess, not fitted to "
                  "measurements, so its times and costs are rough (hetplan catalog gpus)", highlight=False,
                  markup=False)


#: The field each ``hetplan plan`` flag sets (parameter name: ``--`` and its words joined by ``-``): an error about
#: that field names the flag when it was given ("objective.deadline_s: ... (got -86400.0)" for --deadline-days -1).
_FLAG_FIELDS = {**{f"job.{k}": k for k in ("model", "seq_len", "global_batch", "dtype", "fp8_recipe", "attention",
                                           "framework", "attention_kernel", "async_tp", "stack")},
                "job.train_tokens": "tokens", "job.train_iterations": "iterations", "objective.goal": "objective",
                "objective.deadline_s": "deadline_days", "objective.budget_usd": "budget_usd",
                "objective.slo_iteration_s": "slo_s",
                **{f"inventory.pools.0.{k}": v for k, v in (
                    ("gpu", "gpu"), ("count", "gpus"), ("node", "node"), ("gpus_per_node", "gpus_per_node"),
                    ("inter_node_bandwidth_bytes_per_s", "inter_node_gbit"), ("network", "network"),
                    ("price_usd_per_hour", "price"))}}


def _errors_name_flags(command):
    """``command`` whose :class:`HetplanError` about a field a given flag set (:data:`_FLAG_FIELDS`, or a pin
    ``pin.NAME``: :meth:`Pins.flag`) names that flag, not the job file's field the flag filled in."""
    @functools.wraps(command)
    def wrapper(**kwargs):
        try:
            return command(**kwargs)
        except HetplanError as exc:
            field = exc.field or ""
            pin = field.removeprefix("pin.")
            if pin in Pins.model_fields and (kwargs.get("pin_flags") or {}).get(pin) is not None:
                exc.field = Pins.flag(pin)
            param = _FLAG_FIELDS.get(field)
            if param is not None and kwargs.get(param) is not None and kwargs.get(param) is not False:  # 0 is given
                exc.field = "--" + param.replace("_", "-")
            raise
    return wrapper


@_errors_name_flags
def plan_command(
    job_file: Optional[Path] = typer.Argument(None, metavar="JOB.toml", help="Job TOML with sections \\[job], \\[\\[inventory]], \\[objective], \\[pin], \\[search] (see examples/)."),
    model: Optional[str] = typer.Option(None, "--model", help="Preset name or path to a HF config.json."),
    seq_len: Optional[int] = typer.Option(None, "--seq-len", help="Tokens per sequence."),
    global_batch: Optional[int] = typer.Option(None, "--global-batch", help="Sequences per iteration."),
    tokens: Optional[float] = typer.Option(None, "--tokens", help="Total training tokens (job length), e.g. 1e12."),
    iterations: Optional[int] = typer.Option(None, "--iterations", help="Job length in iterations (if no --tokens)."),
    dtype: Optional[str] = typer.Option(None, "--dtype", help="bf16, fp16 or fp8 (linear layers in FP8 as "
                                        "Transformer Engine / torchao float8 run them)."),
    fp8_recipe: Optional[str] = typer.Option(None, "--fp8-recipe", help="FP8 scaling under --dtype fp8: delayed | "
                                             "current, Transformer Engine's (current = Megatron's --fp8-recipe "
                                             "tensorwise, NeMo FP8-CS; default: delayed, MXFP8 on Blackwell); "
                                             "tensorwise | rowwise | rowwise_with_gw_hp, torchao's under "
                                             "--framework fsdp (default: the stack's, rowwise for torchtitan "
                                             "0.3.0); mxfp8 (Blackwell), TE's or torchao's MXFP8Linear."),
    attention: Optional[str] = typer.Option(None, "--attention", help="flash (FlashAttention, causal; default), "
                                            "standard (s x s scores stored, Megatron-LM without --use-flash-attn) "
                                            "or eager (the same, unfused: Hugging Face eager attention)."),
    framework: Optional[str] = typer.Option(None, "--framework", help="megatron (default) | deepspeed | fsdp: "
                                            "runs that framework's current stack, what `hetplan export` writes "
                                            "for it (Megatron-Core, DeepSpeed, torchtitan)."),
    stack: Optional[str] = typer.Option(None, "--stack", help="NAME\\[@VERSION|@YYYY-MM]: the software stack and "
                                        "release (`hetplan catalog stacks`); a month picks the release then. The "
                                        "search proposes only the parallel dimensions it runs."),
    attention_kernel: Optional[str] = typer.Option(None, "--attention-kernel", help="fa2 | fa3 | cudnn: the fused "
                                                   "attention kernel (default: the framework's on the GPU)."),
    async_tp: bool = typer.Option(False, "--async-tp", help="PyTorch's async TP (framework fsdp, compiled)."),
    gpu: Optional[str] = typer.Option(None, "--gpu", help="GPU type (one pool; see `hetplan catalog gpus`)."),
    gpus: Optional[int] = typer.Option(None, "--gpus", help="GPUs available of that type."),
    node: Optional[str] = typer.Option(None, "--node", help="Node preset (`hetplan catalog nodes`; default: the "
                                       "GPU's reference node, e.g. dgx-h100); the flags below override it."),
    gpus_per_node: Optional[int] = typer.Option(None, "--gpus-per-node", help="GPUs per node (default: the node's)."),
    inter_node_gbit: Optional[float] = typer.Option(None, "--inter-node-gbit", help="Network Gb/s per node."),
    network: Optional[str] = typer.Option(None, "--network", help="Between nodes: infiniband | roce | efa | "
                                          "ethernet (TCP, no RDMA: less bandwidth, more latency)."),
    price: Optional[float] = typer.Option(None, "--price", help="$ per GPU-hour (default: catalog)."),
    price_source: str = _PRICE_SOURCE, provider: Optional[str] = _PROVIDER, prices: Optional[Path] = _PRICES,
    inventory: Optional[Path] = typer.Option(None, "--inventory", help="TOML/JSON file of \\[\\[inventory]] pools only (they replace the job file's)."),
    catalog: Optional[Path] = typer.Option(None, "--catalog", help="User GPU catalog TOML (extends/overrides)."),
    objective: Optional[str] = typer.Option(None, "--objective", help="fastest | cheapest | budget."),
    deadline_days: Optional[float] = typer.Option(None, "--deadline-days", help="Finish within (days; holds under every goal, the constraint of cheapest)."),
    budget_usd: Optional[float] = typer.Option(None, "--budget-usd", help="Spend at most (USD; holds under every goal, the constraint of budget)."),
    slo_s: Optional[float] = typer.Option(None, "--slo-s", help="Iteration-time SLO (s): plans slower are rejected "
                                          "(with --objective cheapest: Espresso's least $ under an SLO)."),
    no_hetero: bool = typer.Option(False, "--no-hetero", help="With several pools: only plans on one GPU type "
                                   "(default: also stages on different pools, hetplan.search.hetero)."),
    per_stage_tp: bool = typer.Option(False, "--per-stage-tp", help="With several pools: let stages on different "
                                      "pools take different TP degrees (FASOP's and Espresso's space). No "
                                      "framework `export` writes launches such a plan: all build one device mesh."),
    pareto: Optional[Path] = typer.Option(None, "--pareto", help="Also compute the exact cost-time Pareto frontier "
                                          "(of the plans the SLO, deadline and budget allow, on one GPU type under "
                                          "--no-hetero), print it and draw it to this PNG."),
    pin_flags: Optional[dict] = None,  # one option per Pins field (_with_pin_options)
    top: int = typer.Option(5, "--top", help="How many plans to show."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object with a `plans` list, best first."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Print only the tables of plans (the ranking; the "
                               "fine-grained plan and frontiers when asked for) and the files written: no memory "
                               "breakdown, explanations, energy notes or search statistics."),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="Write the best plan's JSON here."),
    baseline: Optional[Path] = typer.Option(None, "--baseline", help="A plan JSON of your own run (e.g. from "
                                            "`hetplan import` of its launch script): priced the same way and "
                                            "compared with the best plan."),
    search: str = typer.Option("uniform", "--search", help="uniform (exhaustive) | fine (Aceso-style bottleneck "
                               "alleviation from the best uniform plan: per-stage GPUs/TP/DP, per-layer recompute)."),
    explain: bool = typer.Option(False, "--explain", help="With --search fine: print each bottleneck and its move."),
    profile_db: Optional[Path] = typer.Option(None, "--profile-db", help="Profile database (SQLite) of measured "
                                              "layer times, for --search fine."),
    energy: bool = typer.Option(False, "--energy", help="Joules per iteration, job kWh and what Perseus' frequency "
                                "plans save, per plan; with --pareto the time-$-energy frontier too."),
    usd_per_kwh: Optional[float] = typer.Option(None, "--usd-per-kwh", help="With --energy: electricity price, "
                                                "added to job $ after the search (so not with --objective "
                                                "cheapest or --budget-usd, which rank by GPU-hours)."),
    calibration: Optional[Path] = _CALIBRATION,
) -> None:
    """Search every TP/PP/DP/micro-batch/recompute/ZeRO configuration and rank the plans.

    Give a job file, or the same job through flags (flags override the file). Example:
    hetplan plan --model llama2-7b --seq-len 4096 --global-batch 1024 --tokens 1e12 --gpu H100-SXM --gpus 64
    """
    output_file(output, "--output")
    output_file(pareto, "--pareto", figure=True)
    if energy and pareto is not None:  # its second figure: a folder of that name was a traceback after the search
        output_file(_energy_figure(pareto), "--pareto", figure=True)
    data = load_job_file(job_file) if job_file else {"job": {}, "inventory": [], "objective": {}, "pin": {}}
    job_raw = data["job"]
    for key, val in (("model", model), ("seq_len", seq_len), ("global_batch", global_batch), ("train_tokens", tokens),
                     ("train_iterations", iterations), ("dtype", dtype), ("fp8_recipe", fp8_recipe),
                     ("attention", attention),
                     ("framework", framework), ("attention_kernel", attention_kernel), ("async_tp", async_tp or None),
                     ("stack", stack)):
        if val is not None:
            job_raw[key] = val
    if tokens is not None and iterations is None:  # a flag's job length replaces the file's other one
        job_raw.pop("train_iterations", None)
    if iterations is not None and tokens is None:
        job_raw.pop("train_tokens", None)
    for key in ("model", "seq_len", "global_batch"):
        if key not in job_raw:
            raise HetplanError("is required", field=f"job.{key}", fix=f"pass --{key.replace('_', '-')} or set it in [job]")
    _positive(gpus, "--gpus")
    _positive(tokens, "--tokens")
    _positive(deadline_days, "--deadline-days")  # its error said "objective.deadline_s ... (got -86400.0)"
    job = validated(Job, job_raw, "job")
    pools_raw = data["inventory"]
    if inventory is not None:
        if gpu is not None:  # --gpu replaced the file's pools without a word
            raise HetplanError("--inventory and --gpu each give the GPUs", field="--inventory",
                               fix="give one: --inventory FILE, or --gpu TYPE --gpus N")
        pools_raw = _inventory_file(inventory)
    pool_flags = {"--gpus": gpus, "--node": node, "--gpus-per-node": gpus_per_node, "--inter-node-gbit": inter_node_gbit,
                  "--network": network, "--price": price}
    if gpu is None and (given := [k for k, v in pool_flags.items() if v is not None]):
        # they describe the one pool of --gpu; the job file's or --inventory's pools were priced without them
        raise HetplanError(f"{', '.join(given)} set the pool of --gpu, and no --gpu is given", field=given[0],
                           fix="add --gpu TYPE, or set it in the [[inventory]] pools of the job file")
    if gpu is not None:
        if gpus is None:
            raise HetplanError("--gpu needs --gpus", field="--gpus", fix="say how many GPUs of that type are available")
        pool = {"gpu": gpu, "count": gpus}
        if node is not None:
            pool["node"] = node
        if gpus_per_node is not None:
            pool["gpus_per_node"] = gpus_per_node
        if inter_node_gbit is not None:
            pool["inter_node_bandwidth_bytes_per_s"] = inter_node_gbit * 1e9 / 8
        if network is not None:
            pool["network"] = network
        if price is not None:
            pool["price_usd_per_hour"] = price
        pools_raw = [pool]
    if not pools_raw:
        raise HetplanError("no GPUs given", field="inventory", fix="pass --gpu TYPE --gpus N, --inventory FILE, or [[inventory]]")
    inv = validated(Inventory, {"pools": pools_raw}, "inventory")
    obj_raw = data["objective"]
    if objective is not None:
        obj_raw["goal"] = objective
    if deadline_days is not None:
        obj_raw["deadline_s"] = deadline_days * 86400
    if budget_usd is not None:
        obj_raw["budget_usd"] = budget_usd
    _positive(slo_s, "--slo-s")
    if slo_s is not None:
        obj_raw["slo_iteration_s"] = slo_s
    obj = validated(Objective, obj_raw, "objective")
    pin_raw = data["pin"]
    for key, val in (pin_flags or {}).items():
        if val is not None:
            pin_raw[key] = val
    pins = _pins(pin_raw)
    if top < 1:
        raise HetplanError(f"must be at least 1, got {top}", field="--top", fix="use --top 1 or more")
    if search not in ("uniform", "fine"):
        raise HetplanError(f"unknown search {search!r}", field="--search", fix="use uniform or fine")
    if usd_per_kwh is not None and not energy:
        raise HetplanError("--usd-per-kwh needs --energy", field="--usd-per-kwh", fix="add --energy")
    if usd_per_kwh is not None and (obj.goal == "cheapest" or obj.budget_usd is not None):
        # the electricity is added to each ranked plan's job $ after the search, which ranks and budgets GPU-hours:
        # "cheapest job within $2,000" printed plans of $15,273 (GPUs $1,114 + electricity $14,159), #3 cheaper
        # than #1
        raise HetplanError("electricity is added to job $ after the search, which ranks plans and holds the budget "
                           "on GPU-hours alone", field="--usd-per-kwh",
                           fix="drop --usd-per-kwh (--energy still gives each plan's kWh), or rank by "
                               "--objective fastest without --budget-usd")
    for flag, given in (("--explain", explain), ("--profile-db", profile_db is not None)):
        if given and search != "fine":  # both were dropped without a word (a --profile-db that does not exist too)
            raise HetplanError(f"{flag} acts on the fine-grained search only", field=flag,
                               fix=f"add --search fine, or drop {flag}")
    cat = load_catalog(catalog)
    # checked before the search: a missing file, an unknown GPU or another job's plan was said after it
    mine = _baseline_plan(baseline, job, cat) if baseline is not None else None
    pools_priced, price_lines = _priced(inv.pools, cat, price_source, provider, prices)
    inv = inv.model_copy(update={"pools": pools_priced})
    cal, cat = _calibrated(calibration, cat, inv.pools, job)
    if cal is not None:
        inv = inv.model_copy(update={"pools": cal.apply_pools(inv.pools, cat)})
    _check_free_pools(inv, obj, cat)
    search_raw = data.get("search", {})
    for key, val in search_raw.items():
        if key not in ("heterogeneous", "per_stage_tp") or not isinstance(val, bool):
            raise HetplanError(f"got {key} = {val!r}", field=f"search.{key}",
                               fix="[search] takes heterogeneous = true|false and per_stage_tp = true|false")
    hetero_on = not no_hetero and search_raw.get("heterogeneous", True)
    one_type = ("one pool" if len(inv.pools) == 1 else "--no-hetero" if no_hetero
                else "[search] heterogeneous = false" if not hetero_on
                else f"stack {job.stack_spec().id} runs no pipeline" if not job.stack_spec().has("pp") else None)
    # the ranking mixes TP degrees only in plans on several pools: it ranked the same plans, flag or not (the
    # frontier's walk may split one pool's GPUs over two TP degrees, so --pareto keeps it), and a pinned TP is
    # every stage's
    same = f"TP is pinned to {pins.tp} (no plan here mixes TP degrees)" if pins.tp else (
        f"no plan here spans pools ({one_type})" if one_type and pareto is None else None)
    if (per_stage_tp or search_raw.get("per_stage_tp")) and same:
        raise HetplanError(f"it lets stages on different pools take different TP degrees, and {same}: it changes "
                           "nothing", field="--per-stage-tp" if per_stage_tp else "search.per_stage_tp",
                           fix="drop it, or let plans span pools: several pools, no --no-hetero, a stack with "
                               "pipeline parallelism, TP not pinned")
    per_stage_tp = per_stage_tp or search_raw.get("per_stage_tp", False)
    with walk_progress() as progress:
        result = search_plans(job, inv, obj, pins, top_k=top, catalog=cat, heterogeneous=hetero_on, progress=progress,
                              per_stage_tp=per_stage_tp)
    if job.train_tokens is None and job.train_iterations is None:
        typer.echo("note: no train_tokens (--tokens) or train_iterations (--iterations): job time and $ are for "
                   "one iteration", err=True)
    for line in result.explanation:  # a budget that ran out is said on stderr always, also under -q and --json
        if STOPPED in line:
            typer.echo(f"note: {line}", err=True)
    summaries = [plan_summary(rp.plan, rp.estimate, rp.reason) for rp in result.plans]
    fine = _fine(job, inv, obj, pins, cat, result, profile_db) if search == "fine" else None
    if fine is not None:
        summaries.insert(0, plan_summary(fine.plan, fine.estimate, "fine-grained search (bottleneck alleviation)"))
    best = fine.plan if fine else result.plans[0].plan
    spec = load_model(best.job.model)
    check_plan(best, spec)  # the search proposes only valid plans; the validator has the last word
    add_launch_refusals(summaries, ([fine.plan] if fine else []) + [rp.plan for rp in result.plans], spec)
    if output is not None:
        write_output(output, best.model_dump_json(indent=2) + "\n", "--output")
    if energy:
        from hetplan.cli.energy import add_energy, energy_lines

        add_energy(summaries, cat, usd_per_kwh)
    base = (_baseline(mine, baseline, cat, summaries[0], (price_source, provider, prices), cal, pools_priced,
                      _profiles(profile_db) if fine is not None else None, (usd_per_kwh,) if energy else None)
            if mine is not None else None)
    add_intervals(summaries, cat, cal)
    # the frontier, with the ranked plans on it where nothing dominates them (and the fine plan, priced by the
    # same cost model unless a profile database priced it)
    ranked = [(rp.plan, rp.estimate) for rp in result.plans] + (
        [(fine.plan, fine.estimate)] if fine is not None and profile_db is None else [])
    frontier = functools.partial(_pareto, job, inv, obj, pins, cat, pareto, per_stage_tp=per_stage_tp,
                                 heterogeneous=hetero_on, ranked=ranked)
    if as_json:
        print(json.dumps({
            "plans": summaries,
            "explanation": result.explanation,
            "configurations_evaluated": result.configurations_evaluated,
            "configurations_fitting_memory": result.configurations_fitting_memory,
            "search_time_s": result.search_time_s,
            "prices": price_lines,
            **({"fine": _fine_json(fine)} if fine else {}),
            **({"baseline": base} if base else {}),
            **({"heterogeneous": result.heterogeneous} if result.heterogeneous else {}),
            **({"homogeneous": result.homogeneous} if result.homogeneous else {}),
            **({"pareto": frontier(table=False)} if pareto is not None and not energy else {}),
            **(dict(zip(("pareto", "energy_pareto"), _energy_pareto(summaries, frontier(table=False), cat, pareto,
                                                                    job.model, usd_per_kwh, True)))
               if energy and pareto is not None else {}),
        }, indent=1))
        return
    _print_ranking(job, obj, summaries[1:] if fine else summaries, result, price_lines, quiet,
                   _whole_host_notes(inv, cat))
    if fine is not None:
        _print_fine(fine, explain, quiet)
    if energy and not quiet:
        # under --search fine summaries[0] is the fine plan, printed below the ranking, not its #1
        for line in energy_lines(summaries[0], "the fine-grained plan" if fine is not None else "#1"):
            table_console().print(line, highlight=False)
    if pareto is not None:
        walk = frontier(table=True, notes=not quiet)
        if energy:
            _energy_pareto(summaries, walk, cat, pareto, job.model, usd_per_kwh, False)
    if base is not None:
        b = base["summary"]
        table_console().print(
            # $ per iteration of its job $ (with the electricity of --usd-per-kwh, as the job $ beside it)
            f"Baseline {baseline}: {b['iteration_time_s']:.3f} s/iteration, "
            f"${usd_text(b['job_usd'] / b['iterations'])}/iteration, "
            f"job ${usd_text(b['job_usd'])}; the best plan is {base['speedup']:.2f}x as fast and costs "
            f"{base['usd_ratio']:.0%} of it per job.", highlight=False)
    if output is not None:
        # one line the terminal may wrap: rich broke it inside the command, "`hetplan estimate" / "PATH`"
        Console().print(f"Best plan written to {output} (run `hetplan estimate {output}`).", soft_wrap=True,
                        highlight=False, markup=False)


#: The shapes that make two models the same training work per token (``--baseline`` compares runs of one job).
_SAME_MODEL = ("num_layers", "hidden_size", "num_attention_heads", "num_kv_heads", "ffn_hidden_size", "vocab_size",
               "num_experts", "expert_ffn_hidden_size")


def _baseline_plan(path: Path, job, cat):
    """``--baseline``'s plan, read and checked before the search: it trains ``job``'s model, sequence length and
    global batch (else its iteration is other work: a Llama-2-13B plan at half the batch came out "0.49x as
    fast"), passes the plan rules and names GPU types of ``cat``; it is priced for ``job``'s length (a launch's own
    ``--train-iters`` of a short benchmark would make the job $ ratio that of two job lengths).

    Raises:
        HetplanError: naming ``--baseline`` and what differs."""
    from hetplan.runtime.planio import load_plan

    plan = load_plan(path, "--baseline")
    spec = load_model(plan.job.model)
    mine = load_model(job.model)
    differs = [f"model {spec.name} (the job's: {mine.name})"] if any(
        getattr(spec, k) != getattr(mine, k) for k in _SAME_MODEL) else []
    differs += [f"{k} {getattr(plan.job, k)} (the job's: {getattr(job, k)})" for k in ("seq_len", "global_batch")
                if getattr(plan.job, k) != getattr(job, k)]
    if differs:
        raise HetplanError(f"the baseline {path} trains other work per iteration: {', '.join(differs)}",
                           field="--baseline", fix="give a plan of the same model, sequence length and global batch "
                                                   "(or search the baseline's job)")
    plan = plan.model_copy(update={"job": plan.job.model_copy(update={"train_tokens": job.train_tokens,
                                                                      "train_iterations": job.train_iterations})})
    check_plan(plan, spec)
    for i, pool in enumerate(plan.pools):
        cat.get(pool.gpu, field=f"--baseline pools.{i}.gpu")
    return plan


def _baseline(plan, path: Path, cat, best: dict, pricing: tuple = ("catalog", None, None), cal=None,
              searched: list[GPUPool] = (), profiles=None, energy: tuple | None = None) -> dict:
    """``--baseline``: the user's plan (:func:`_baseline_plan`, read from ``path``) priced by the same estimator,
    catalog, prices and calibration as the search's plans — as ``hetplan estimate PATH`` with the same
    ``pricing`` (``--price-source``, ``--provider``, ``--prices``: :func:`_repriced`) and ``cal`` prices it — with
    the best plan's speed-up (baseline time / best time) and cost ratio (best job $ / baseline job $). A pool of a
    GPU type the search priced (``searched``, its priced pools) costs what the search's does, $/GPU-h
    (:func:`_searched_prices`: a ``--price 2`` search against its own plan, written without prices, read "costs
    52 % of it per job" at the catalog's $3.84). ``profiles``: the measured layer times that priced ``best``
    (``--search fine --profile-db``; the fine search's own plan as baseline came out "1.12x as fast" when only the
    best was priced on them). ``energy``: ``(usd_per_kwh,)`` under ``--energy``, its energy and electricity added
    as to the ranking's plans (:func:`hetplan.cli.energy.add_energy`; at $2/kWh the best plan's job $ had its
    electricity and its own plan as baseline not: $0.3057 and $0.2305, "costs 100 % of it").

    Raises:
        HetplanError: naming ``--baseline``: the plan does not fit in memory."""
    spec = load_model(plan.job.model)
    pools, _ = _repriced(plan.pools, cat, *pricing, where="--baseline pools")  # a plan of `hetplan import` had catalog prices under --price-source spot
    pools = _searched_prices(pools, searched, cat)
    plan = plan.model_copy(update={"pools": cal.apply_pools(pools, cat) if cal else pools})
    est = estimate_plan(plan, cat, spec, profiles)
    if not est.fits:  # `hetplan estimate` refuses it; it was compared as a run ("the best plan is 0.99x as fast")
        worst = max(est.stages, key=lambda se: se.memory.required / se.memory_capacity_bytes)
        raise HetplanError(f"the baseline {path} does not fit in GPU memory: stage {est.stages.index(worst)} needs "
                           f"{_mem(worst.memory.required)} GiB per GPU > {_mem(worst.memory_capacity_bytes)} GiB "
                           f"(`hetplan estimate {path}`)",
                           field="--baseline", fix="give a plan that fits: raise tp/pp, use recompute or ZeRO, or "
                                                   "lower mbs")
    summary = plan_summary(plan, est, "baseline")
    if energy is not None:
        from hetplan.cli.energy import add_energy

        add_energy([summary], cat, *energy)
    return {"plan": str(path), "summary": summary,
            "speedup": summary["iteration_time_s"] / best["iteration_time_s"],
            "usd_ratio": best["job_usd"] / summary["job_usd"] if summary["job_usd"] > 0 else float("nan")}


def _searched_prices(pools: list[GPUPool], searched: list[GPUPool], cat) -> list[GPUPool]:
    """``pools`` (a baseline's) each at the price of the search's pool (``searched``) of its GPU type: the one at
    the same position when that is of its type (a plan written by ``plan -o`` lists the search's pools), else the
    one price the search gave that type; a type the search did not price, or priced at two prices in pools at
    other positions, keeps its own."""
    out = []
    for i, pool in enumerate(pools):
        name = cat.get(pool.gpu).name
        same = [p.price_usd_per_hour for p in searched if cat.get(p.gpu).name == name]
        if i < len(searched) and cat.get(searched[i].gpu).name == name:
            same = [searched[i].price_usd_per_hour]
        out.append(pool.model_copy(update={"price_usd_per_hour": same[0]}) if len(set(same)) == 1 else pool)
    return out


def _calibrated(path: Path | None, cat, pools=(), job=None):
    """``(calibration, catalog with its factors)`` of ``--calibration`` (``(None, cat)`` without one).

    Raises:
        HetplanError: a calibration of GPU types none of ``pools`` is on (its factors and interval applied to
            none, and the numbers printed were uncalibrated without a word), or of stacks other than ``job``'s
            (its factors, what the runs' stack reaches on those GPUs, priced another stack's plans while the
            interval printed was hetplan's own)."""
    if path is None:
        return None, cat
    from hetplan.calibration.intervals import stack_name
    from hetplan.calibration.user import load_calibration

    cal = load_calibration(path)
    names = sorted({cat.get(p.gpu).name for p in pools})
    if names and not set(names) & set(cal.gpus):
        raise HetplanError(f"{path} calibrates {', '.join(cal.gpus) or 'no GPU type'} "
                           f"({', '.join(cal.stacks) or 'no stack'}); no pool here is on those GPUs "
                           f"({', '.join(names)})", field="--calibration",
                           fix="drop --calibration, or fit one on runs of these GPUs (hetplan calibrate)")
    if job is not None and stack_name(job) not in cal.stacks:
        raise HetplanError(f"{path} calibrates stack {', '.join(cal.stacks) or '(none)'}; this job runs "
                           f"{stack_name(job)}, whose kernels and collectives its factors do not describe",
                           field="--calibration",
                           fix="drop --calibration, plan the job on the calibrated stack (--stack / --framework), "
                               "or fit a calibration on runs of this stack (hetplan calibrate)")
    return cal, cal.apply_catalog(cat)


def _interval_text(s: dict) -> str:
    """The compact interval of a plan summary's iteration time (``±12 %``, ``-3/+20 %``), ``unvalidated``, or ""."""
    iv = s.get("iteration_time_s_interval")
    if iv is None:
        return "unvalidated" if "unvalidated" in s.get("interval", {}) else ""
    lo, hi = (round(100 * (x / s["iteration_time_s"] - 1)) for x in iv)
    return f"±{hi} %" if lo == -hi else f"{lo:+d}/{hi:+d} %"


def add_launch_refusals(summaries: list[dict], plans: list, spec) -> None:
    """Add ``export_refused`` (:func:`hetplan.runtime.exporters.launch_refusal`) to the summary of each plan of
    model ``spec`` that ``hetplan export`` cannot launch under its own framework: its numbers price a run no export
    here writes."""
    from hetplan.runtime.exporters import launch_refusal

    for s, p in zip(summaries, plans):
        refusal = launch_refusal(p, spec)
        if refusal is not None:
            s["export_refused"] = refusal


def _interval_lines(s: dict) -> list[str]:
    """What #1's interval rests on, the MFU record it exceeds (if any), and the export's refusal to launch it (if
    any)."""
    iv = s.get("interval", {})
    out = []
    if "unvalidated" in iv:
        out.append(f"Interval: {iv['unvalidated']}.")
    elif iv:
        spread = (", widened by how far one source of runs sits from the others" if iv.get("source") == "validation"
                  else "")
        out.append(f"Interval ({iv['level']:.0%}): from {iv['n']} held-out measured runs of {iv['regime']} "
                   f"(signed median error there {iv['signed_median_error']:+.1%}){spread}; tokens/s, MFU, job time "
                   "and $ share it.")
    if "mfu_record" in s:
        out.append("Note: " + s["mfu_record"]["note"] + ".")
    if "export_refused" in s:
        r = s["export_refused"]
        out.append(f"Note: `hetplan export --to {r['target']}` refuses this plan: {r['message']} (fix: {r['fix']}); "
                   "the numbers price a run it does not launch.")
    return out


def _check_free_pools(inv: Inventory, obj: Objective, cat) -> None:
    """Refuse ``cheapest`` over a pool priced at $0/GPU-h: every plan on it costs $0, so the ranking's lower bound
    on $ (0) can never exceed the best found (0) and the exact walk would re-estimate the pool's whole space.

    Raises:
        HetplanError: goal ``cheapest`` and a pool whose price (its own or the catalog's) is 0.
    """
    if obj.goal != "cheapest":
        return
    for i, pool in enumerate(inv.pools):
        price = pool.price_usd_per_hour if pool.price_usd_per_hour is not None else cat.get(pool.gpu).price_usd_per_hour
        if price == 0:
            raise HetplanError(f"{pool.gpu} is priced at $0/GPU-h, so every plan on it is the cheapest",
                               field=f"inventory.pools.{i}.price_usd_per_hour",
                               fix="give its (amortised) price per GPU-hour, or use --objective fastest")


def _pareto(job, inv, obj, pins, cat, path: Path, table: bool, notes: bool = False, per_stage_tp: bool = False,
            heterogeneous: bool = True, ranked=()) -> list[dict]:
    """Compute, print (``table``, and under ``notes`` the search's statistics and whether each point is exact) and
    plot the cost-time frontier under the ranking's SLO, deadline and budget (``per_stage_tp``, ``heterogeneous``:
    as the search's), with the ranking's ``(plan, estimate)`` pairs (``ranked``) on it where nothing dominates
    them; return its points as JSON dicts."""
    from hetplan.search.pareto import buys, by_cost, pareto_frontier, plot_frontier

    m = load_model(job.model)
    it = job.iterations()
    budget = obj.budget_usd / it if obj.budget_usd else None
    with walk_progress() as progress:
        fr = pareto_frontier(m, job, inv, cat, pins, slo_iteration_s=obj.slo_iteration_s,
                             budget_usd_per_iteration=budget, progress=progress, per_stage_tp=per_stage_tp,
                             deadline_s=obj.deadline_s, heterogeneous=heterogeneous,
                             incumbents=[(p, e, _described(plan_summary(p, e))) for p, e in ranked])
    if not fr.points:
        raise HetplanError("no plan fits in memory (or meets the SLO/deadline/budget), so there is no frontier",
                           field="inventory", fix="add GPUs or relax the SLO/deadline/budget")
    plot_frontier(fr, path, title=f"{job.model}: cost vs iteration time ({len(fr.points)} frontier plans)")
    pts = by_cost(fr.points)
    bought = {id(c): buys(p, c) for p, c in zip(pts, pts[1:])}
    # heterogeneous: stages on different GPU types (two pools of one type were "[het]" and "heterogeneous": true)
    out = [dict(plan_summary(p.plan, p.estimate), heterogeneous=p.heterogeneous, description=p.description,
                buys=bought.get(id(p), "cheapest"), exact=p.estimate.iteration_time_s < fr.proven_below_s)
           for p in fr.points]
    if table:
        con = table_console()  # COLUMNS when set (it printed 160 columns at COLUMNS=80 through a pipe)
        r = fr.result
        n = len(fr.points)
        stats = (f"; {r.allocations_solved:,} of {r.allocations:,} allocations solved, {r.plans_estimated:,} plans "
                 f"estimated in {r.search_time_s:.2f} s" if notes else "")
        t = new_table(f"Cost-time Pareto frontier by estimate() ({n} plan{'' if n == 1 else 's'}{stats})",
                      con.width < NARROW)
        for col in ("#", "plan", "GPUs", "iter s", "$/iteration", "$/h", "what the extra $ buys"):
            t.add_column(col, no_wrap=col in ("#", "GPUs", "iter s", "$/iteration", "$/h"))
        pts = by_cost(fr.points)
        what = ["cheapest"] + [f"{buys(p, c)} than #{i}" for i, (p, c) in enumerate(zip(pts, pts[1:]), start=1)]
        for i, (p, b) in enumerate(zip(pts, what), start=1):
            t.add_row(str(i), ("\\[het] " if p.heterogeneous else "") + p.description, str(p.plan.num_gpus),
                      f"{p.estimate.iteration_time_s:.3f}", f"{p.estimate.usd_per_iteration:.4f}",
                      f"{p.estimate.usd_per_hour:,.2f}", b)
        con.print(t)
        if notes and fr.result.complete:
            con.print("Every point is exact over each allocation's closed-form-optimal plan and the ranked plans (no "
                      "unestimated plan's lower bound could dominate it).")
        elif notes:
            con.print(f"Walk stopped at its expansion limit: points faster than {fr.proven_below_s:.3f} s per "
                      f"iteration are exact; slower ones may be dominated by an unestimated plan.")
        con.print(f"Frontier drawn to {path}.")
    return out


def _energy_pareto(summaries, walk: list[dict], cat, path: Path, model: str, usd_per_kwh, quiet: bool):
    """``(cost-time frontier, time-$-energy frontier)`` over the ranked plans and the cost-time frontier's
    (``walk``, :func:`_pareto`'s points), both with energy; the second drawn next to ``path``."""
    from hetplan.cli.energy import add_energy, print_energy_pareto

    add_energy(walk, cat, usd_per_kwh)
    return walk, print_energy_pareto(summaries + walk, _energy_figure(path), f"{model}: time, $ and energy", quiet)


def _energy_figure(path: Path) -> Path:
    """Where ``--energy --pareto PATH`` draws the time-$-energy frontier: ``PATH-energy`` with PATH's suffix."""
    return path.with_name(path.stem + "-energy" + path.suffix)


def _profiles(profile_db: Optional[Path]):
    """The measured layer times of ``--profile-db`` (None without one)."""
    if profile_db is None:
        return None
    if not profile_db.is_file():
        raise HetplanError(f"{profile_db} does not exist", field="--profile-db",
                           fix="give a profile database written by `hetplan profile` or an importer")
    from hetplan.profile.db import ProfileDB

    return ProfileDB(profile_db, read_only=True, field="--profile-db")


def _fine(job, inv, obj, pins, cat, result, profile_db):
    """Run the fine-grained search (hetplan.search.fine) from the uniform result."""
    from hetplan.search.fine import fine_search

    profiles = _profiles(profile_db)
    if profiles is not None:  # a database of another model, dtype or GPU priced every layer analytically, unsaid
        m = load_model(job.model)
        gpus = sorted({cat.get(p.gpu).name for p in inv.pools})
        if not any(profiles.covers(g, m, job.dtype) for g in gpus):
            raise HetplanError(f"{profile_db} holds no layer times of {m.name} ({job.dtype}) on {', '.join(gpus)}: "
                               "the fine search would price every layer by the cost model", field="--profile-db",
                               fix="profile this model on these GPUs (hetplan profile), or drop --profile-db")
    return fine_search(job, inv, obj, pins, catalog=cat, profiles=profiles, uniform=None if profiles else result)


def _fine_json(fine) -> dict:
    return {
        "iteration_time_s": fine.estimate.iteration_time_s,
        "uniform_iteration_time_s": fine.start_estimate.iteration_time_s,
        "speedup": fine.speedup,
        "evaluations": fine.evaluations,
        "start_points": fine.start_points,
        "search_time_s": fine.search_time_s,
        "trace": [vars(s) for s in fine.trace],
    }


def _print_fine(fine, explain: bool, quiet: bool = False) -> None:
    """The fine-grained plan's table; with ``explain`` each step of the search, and unless ``quiet`` its outcome
    and search time."""
    con = table_console()
    t = new_table("Fine-grained plan (bottleneck alleviation, Aceso EuroSys'24)", con.width < NARROW)
    cp = fine.plan.cp  # a stage's GPUs are TP x CP x DP (they read TP x DP: 8 of a CP 2 plan's 16)
    for col in ("stage", "GPUs", "TP", *(("CP",) if cp > 1 else ()), "DP", "mbs", "layers", "recompute", "fwd+bwd ms",
                "GiB/GPU"):
        t.add_column(col, justify="right")
    for i, (st, se) in enumerate(zip(fine.plan.stages, fine.estimate.stages)):
        rc = st.recompute if st.recompute == "none" else f"{st.recompute} {st.recomputed_layers()}/{st.num_layers}"
        t.add_row(str(i), str(st.tp * cp * st.dp), str(st.tp), *((str(cp),) if cp > 1 else ()), str(st.dp),
                  str(fine.plan.stage_mbs(i)), str(st.num_layers), rc, f"{(se.forward_s + se.backward_s) * 1e3:.1f}",
                  _mem(se.memory.total))
    con.print(t)
    if explain:
        _print_items(con, fine.explanation()[:-1])
    if not quiet:
        con.print(fine.explanation()[-1] + f", {fine.search_time_s:.2f} s.", highlight=False, markup=False)


def _print_items(con, items: list[str]) -> None:
    """One item per paragraph, indented, its continuation lines indented under it (the fine search's steps ran
    on at column 0, one step hard to tell from the next); no markup: rich took a step's "[start 2, 1]" for a
    style tag and dropped it."""
    for item in items:
        con.print(textwrap.fill(item, width=max(40, con.width - 1), initial_indent="  ", subsequent_indent="    ",
                                break_on_hyphens=False),
                  highlight=False, markup=False, soft_wrap=True)


def _inventory_file(path: Path) -> list[dict]:
    """The ``[[inventory]]`` pools of ``--inventory PATH``.

    Raises:
        HetplanError: the file has another section ([job], [objective], [pin], [search]): only its pools are
            read, and a ``goal = "cheapest"`` there ranked by the fastest job without a word."""
    data = load_job_file(path)
    for key in ("job", "objective", "pin", "search"):
        if data[key]:
            raise HetplanError(f"--inventory reads only the [[inventory]] pools; its [{key}] would be ignored",
                               field=f"{path}:{key}",
                               fix=f"move [{key}] into the job file (the JOB.toml argument), or give it as flags")
    return data["inventory"]


def _pins(raw: dict) -> Pins:
    """The :class:`Pins` of a job file's ``[pin]`` section with the pin flags given over it; a bad value exits 2
    naming its flag."""
    for key, val in raw.items():
        if key not in Pins.model_fields:
            raise HetplanError("unknown pin", field=f"pin.{key}", fix=f"pins are {', '.join(sorted(Pins.model_fields))}")
        choices = Pins.choices(key)
        if choices is not None:
            if val not in choices or isinstance(val, bool):  # True == 1: zero = true would pin ZeRO-1
                listed = ", ".join(str(c) for c in choices[:-1]) + f" or {choices[-1]}"
                raise HetplanError(f"got {val!r}", field=Pins.flag(key), fix=f"use {listed}")
        elif not isinstance(val, int) or isinstance(val, bool) or val < 1:
            quoted = isinstance(val, str) and val.strip().isdigit()
            raise HetplanError(f"must be a positive integer, got {val!r} (the flag, or {key} in the job file's [pin])",
                               field=Pins.flag(key),
                               fix=f"write {key} = {val.strip()} without quotes" if quoted else "give a value >= 1")
    return Pins(**raw)


def _iterations(job: Job) -> str:
    """ "1 iteration", "3.81 iterations", "238,419 iterations" (the job's length, for a title: what the job time
    and $ are priced for; 1e6 tokens of 262,144 per iteration read "4 iterations")."""
    n = job.iterations()
    return (f"{n:,.0f}" if n >= 100 or n == round(n) else f"{n:.3g}") + " iteration" + ("" if n == 1 else "s")


def _with_pin_options(command):
    """``command`` with one ``typer`` option per :class:`Pins` field in place of its ``pin_flags`` parameter (the
    flag :meth:`Pins.flag`, the field's description as help, an int or, for a list of words, a text value),
    passing the values given as ``pin_flags``: a new pin needs a field of :class:`Pins` only."""
    sig = inspect.signature(command)
    pins = []
    for name, f in Pins.model_fields.items():
        words = Pins.choices(name) is not None and isinstance(Pins.choices(name)[0], str)
        pins.append(inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                      default=typer.Option(None, Pins.flag(name), help=f.description),
                                      annotation=Optional[str] if words else Optional[int]))
    params = []
    for p in sig.parameters.values():
        params += pins if p.name == "pin_flags" else [p]

    @functools.wraps(command)
    def wrapper(**kwargs):
        return command(**{k: v for k, v in kwargs.items() if k not in Pins.model_fields},
                       pin_flags={k: kwargs[k] for k in Pins.model_fields})

    wrapper.__signature__ = sig.replace(parameters=params)  # type: ignore[attr-defined]
    wrapper.__annotations__ = {p.name: p.annotation for p in params}
    return wrapper


def _whole_host_notes(inv: Inventory, cat) -> list[str]:
    """One note per pool whose GPUs do not fill whole hosts (:attr:`hetplan.plan.GPUPool.launch_gpus`: a server,
    or an NVL72 rack's tray of 4): the search's plans take whole hosts beyond one
    (:func:`hetplan.plan.fills_whole_nodes`), so the rest sit idle (``--gpus 12`` on H100s ranked 8-GPU plans
    without a word on the other 4)."""
    out = []
    for pool in inv.pools:
        per = pool.launch_gpus
        if pool.count > per and pool.count % per:
            out.append(f"Note: plans on more than one host take whole hosts (a launch starts as many processes on "
                       f"each), so at most {pool.count // per * per} of the {pool.count} {cat.get(pool.gpu).name} "
                       f"({per} per host) are used.")
    return out


def _print_ranking(job: Job, obj: Objective, summaries: list[dict], result, prices: list[dict] = (),
                   quiet: bool = False, notes: list[str] = ()) -> None:
    con = table_console()
    # the limits the plans meet, as given ("by the deadline" did not say which; an SLO went unsaid)
    limits = ([duration_text(obj.deadline_s)] if obj.deadline_s else []) + (
        [f"${usd_text(obj.budget_usd)}"] if obj.budget_usd else [])
    goal = ("cheapest job" if obj.goal == "cheapest" else "fastest job") + (
        f" within {' and '.join(limits)}" if limits else "") + (
        f", iteration ≤ {obj.slo_iteration_s:g} s" if obj.slo_iteration_s else "")
    title = f"{job.model}: seq {job.seq_len}, global batch {job.global_batch}, {_iterations(job)} — {goal}"
    guess = {ln["gpu"] for ln in prices if not ln["calibrated"]}
    con.print(_ranking_table(title, summaries, narrow=con.width < NARROW, guess=guess))
    if quiet:  # the table's * still needs its legend
        _print_provenance(con, prices, star_only=True)
        return
    best = summaries[0]
    mem = best["memory_bytes_per_gpu"]
    con.print(
        f"Memory per GPU of #1 (peak stage): weights {_mem(mem['weights'])} + gradients {_mem(mem['gradients'])} + "
        f"optimizer {_mem(mem['optimizer'])} + activations {_mem(mem['activations'])} + overhead {_mem(mem['overhead'])} "
        f"= {_mem(mem['total'])} GiB"
    )
    con.print(_stages_line(best), markup=False)
    for i, st in enumerate(best["stages"]):  # fits, but its expected footprint does not (hetplan.estimate.memory)
        if st.get("memory_warning"):
            con.print(f"stage {i}: {st['memory_warning']}", highlight=False, markup=False)
    for line in [*_interval_lines(best), *notes]:
        con.print(line, highlight=False, markup=False)
    con.print("[bold]Why:[/]")
    why = [result.explanation[0], *(f"#{i}: {s['reason']}" for i, s in enumerate(summaries[1:], start=2)),
           *merge_best_with_another([ln for ln in result.explanation[1:]  # said on stderr already
                                     if not (ln.startswith("Homogeneous exact") and STOPPED in ln)])]
    _print_items(con, why)
    con.print(f"Searched {result.configurations_evaluated:,} configurations ({result.configurations_fitting_memory:,} fit in memory) "
              f"in {result.search_time_s:.2f} s.")
    if prices:
        _print_provenance(con, prices)


def _ranking_table(title: str, summaries: list[dict], narrow: bool, guess: set[str] = frozenset()) -> Table:
    """The ranked plans: one column per figure, or under ``narrow`` (< 130 columns) the plan's GPUs and layout
    in one two-line cell and only the figures that decide a ranking (iteration time, MFU, memory, job time, $).
    GPU types in ``guess`` (uncalibrated efficiency) are starred."""
    # the marks the layouts carry, only (the whole legend took two of the narrow caption's three lines under
    # every ranking at 80 columns)
    marks = {m for s in summaries for m in re.findall(r" (v|cp|ep|etp)\d", layout_text(s))}
    legend = ", ".join(f"{m}N: {what}" for m, what in (("v", "virtual stages"), ("cp", "context-parallel"),
                                                       ("ep", "expert-parallel"), ("etp", "expert-TP")) if m in marks)
    legend = f" \\[{legend}]" if legend else ""
    t = new_table(title, narrow, caption=f"plan: GPUs, then TPxPPxDP{legend}, micro-batch, ZeRO stage, recomputation"
                  if narrow else f"TPxPPxDP{legend}" if legend else None)
    kwh = ("job kWh",) if "job_energy_kwh" in summaries[0] else ()  # hetplan plan --energy
    if narrow:
        for col in ("#", "plan", "iter s", "MFU", "GiB", "job time", "job $") + kwh:
            t.add_column(col, justify="left" if col == "plan" else "right", no_wrap=col != "plan")
    else:
        for col in ("#", "GPUs", "TPxPPxDP", "mbs", "ZeRO", "recompute", "iter s", "tokens/s", "MFU", "GiB/GPU",
                    "$/h", "job time", "job $") + kwh:
            t.add_column(col, justify="right" if col not in ("GPUs", "recompute") else "left")
    for i, s in enumerate(summaries, start=1):
        layout = layout_text(s)
        gpus = gpus_text(s, guess)
        iv = _interval_text(s)
        figures = (f"{s['iteration_time_s']:.2f}" + (f"\n{iv}" if iv else ""), f"{s['mfu']:.1%}",
                   _mem(s["memory_bytes_per_gpu"]["total"]))
        money = (duration_text(s["job_time_s"]), usd_text(s["job_usd"])) + ((kwh_text(s["job_energy_kwh"]),) if kwh else ())
        if narrow:
            t.add_row(str(i), f"{gpus}\n{layout} mbs {s['mbs']} ZeRO-{s['zero']} {_recompute(s)}", *figures, *money)
        else:
            t.add_row(str(i), gpus, layout, str(s["mbs"]), str(s["zero"]), _recompute(s), figures[0],
                      f"{s['tokens_per_s']:,.0f}", *figures[1:], usd_text(s["usd_per_hour"]), *money)
    return t


def _described(s: dict) -> str:
    """A plan summary in one line, as the narrow ranking writes it: ``64x H100-SXM 2x16x4 v3 mbs 1 ZeRO-1 none``."""
    return f"{gpus_text(s)} {layout_text(s)} mbs {s['mbs']} ZeRO-{s['zero']} {_recompute(s)}"


def _recompute(s: dict) -> str:
    """The recomputation of a plan summary; stages of different modes show them in stage order, ``full/none``, as
    :func:`_layout` shows TP and DP (the table printed the summary's ``None``)."""
    return s["recompute"] or "/".join(dict.fromkeys(st["recompute"] for st in s["stages"]))


def _stages_line(s: dict) -> str:
    """"Stages of #1: [GPU tpTxcpCxdpD: N layers], ..." of a plan summary (``cpC`` when CP is above 1); a run of
    equal consecutive stages is written once with its count, ``[…] × 94``."""
    cp = f"cp{s['plan'].get('cp', 1)}x" if s["plan"].get("cp", 1) > 1 else ""
    runs: list[list] = []
    for st in s["stages"]:
        text = f"[{st['gpu']} tp{st['tp']}x{cp}dp{st['dp']}: {st['num_layers']} layers]"
        if runs and runs[-1][0] == text:
            runs[-1][1] += 1
        else:
            runs.append([text, 1])
    return "Stages of #1: " + ", ".join(text if n == 1 else f"{text} × {n}" for text, n in runs)


def merge_best_with_another(lines: list[str]) -> list[str]:
    """Merge the explanation lines "Best with another X: PLAN: WHY" that name the same plan into one line
    ("Best with another X, Y and Z: PLAN: WHY") where the first of them stood; other lines unchanged."""
    out: list = []
    names: dict[str, list[str]] = {}
    for line in lines:
        m = re.match(r"Best with another (.+?): (.*)$", line)
        if m is None:
            out.append(line)
            continue
        what, rest = m.groups()
        if rest not in names:
            names[rest] = []
            out.append((rest,))
        names[rest].append(what)
    joined = {rest: ", ".join(w[:-1]) + " and " + w[-1] if len(w) > 1 else w[0] for rest, w in names.items()}
    return [x if isinstance(x, str) else f"Best with another {joined[x[0]]}: {x[0]}" for x in out]


def register(app: typer.Typer) -> None:
    """Add ``hetplan plan``."""
    app.command("plan")(_with_pin_options(plan_command))
