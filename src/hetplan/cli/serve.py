"""``hetplan serve``, ``hetplan simulate`` and ``hetplan capacity``: the Computron-style serving commands.

Heavy imports (torch, fastapi, uvicorn) happen inside ``serve`` only, so ``simulate`` and ``capacity`` work in the
light core install.
"""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from hetplan.errors import HetplanError
from hetplan.inputs import check_path_name

# The launch-export options simulate and capacity share (hetplan.serve.export).
_OUT_DIR = typer.Option(None, "--out-dir", help="folder for --export")
_HOST = typer.Option(None, "--host", help="with --export: the machines' addresses, comma-separated in machine order "
                     "(default: 127.0.0.1 on one machine, else machine-0, machine-1 ...)")
_GPUS_PER_HOST = typer.Option(8, "--gpus-per-host", help="with --export: GPUs per machine; each replica gets its own "
                              "CUDA_VISIBLE_DEVICES on one machine")


def _fmt(x, unit: str = "", digits: int = 3) -> str:
    return "-" if x is None else f"{x:.{digits}f}{unit}"


def _ms(x):
    return None if x is None else 1e3 * x


def _slo_text(models: dict) -> str:
    """The SLOs the table's "SLO met" counts against: one set where every model has the same, else each model's
    (a model's own ``slo_s`` / ``ttft_slo_s`` / ``tpot_slo_s`` override the workload's; the line used to show the
    first model's as every model's)."""
    def one(s: dict) -> str:
        return f"latency {_fmt(s['latency_s'])}, TTFT {_fmt(s['ttft_s'])}, TPOT {_fmt(s['tpot_s'])}"

    per = {name: m["slo"] for name, m in models.items()}
    if len({tuple(sorted(s.items())) for s in per.values()}) == 1:
        return "SLOs (s): " + one(next(iter(per.values())))
    return "SLOs (s): " + "; ".join(f"{name} {one(s)}" for name, s in per.items())


def _latency_table(con: Console, rep: dict, title: str) -> None:
    """Mean and p50/p90/p99 of end-to-end latency (s), TTFT (s) and TPOT (ms) per model and overall: one row per
    model and metric, so the table stays within 80 columns."""
    t = Table(title=title)
    for col in ("model", "metric", "mean", "p50", "p90", "p99"):
        t.add_column(col, justify="left" if col in ("model", "metric") else "right")
    for name, m in list(rep["models"].items()) + [("all", rep["all"])]:
        for i, (metric, label, scale, digits) in enumerate((("latency", "e2e s", 1.0, 3), ("ttft", "TTFT s", 1.0, 3),
                                                             ("tpot", "TPOT ms", 1e3, 1))):
            vals = [m.get(f"{q}_{metric}_s") for q in ("mean", "p50", "p90", "p99")]
            t.add_row(name if i == 0 else "", label,
                      *(_fmt(None if v is None else v * scale, digits=digits) for v in vals))
    con.print(t)


def register(app: typer.Typer) -> None:
    """Add the ``serve``, ``simulate`` and ``capacity`` commands to ``app``."""

    @app.command("serve")
    def serve_cmd(
        config: Path = typer.Argument(..., metavar="SERVE.toml", help="SERVE.toml (see examples/serve/serve.toml)"),
        host: str = typer.Option(None, help="override api.host (default 127.0.0.1; other addresses need --token)"),
        port: int = typer.Option(None, min=0, max=65535, help="override api.port"),
        token: str = typer.Option(None, envvar="HETPLAN_SERVE_TOKEN", show_envvar=True,
                                  help="bearer token every request must send (Authorization: Bearer TOKEN)"),
    ) -> None:
        """Run the serving engine (TP x PP workers with weight swapping) behind the HTTP API."""
        from hetplan.serve.config import is_loopback, load_serve_config

        cfg = load_serve_config(config)
        bind = host or cfg.api.host
        if token is not None and (len(token) < 16 or not token.isprintable() or " " in token):
            raise HetplanError("the bearer token must be at least 16 printable characters without spaces",
                               field="--token", fix="use e.g. the output of: python -c 'import secrets; "
                                                    "print(secrets.token_urlsafe(32))'")
        if not is_loopback(bind) and token is None:
            raise HetplanError(f"refusing to serve on {bind}, which other machines can reach, without a token",
                               field="api.host", fix="give --token (or HETPLAN_SERVE_TOKEN), or bind 127.0.0.1")
        try:
            import uvicorn

            from hetplan.serve.api import create_app
            from hetplan.serve.engine import Engine
        except ImportError as exc:  # pragma: no cover - extras missing
            raise HetplanError(f"serving needs the torch and serve extras ({exc.name} is missing)", field="install",
                               fix="pip install 'hetplan[torch,serve]'") from None
        from hetplan.cli.output import check_listen_address

        check_listen_address(bind, port if port is not None else cfg.api.port, "--host" if host else "api.host",
                             "--port" if port is not None else "api.port")  # before the workers start
        engine = Engine.from_config(cfg)
        engine.start()  # before the server: start-up problems surface as errors, not as a failed lifespan
        a = cfg.api
        app_ = create_app(engine, default_max_new_tokens=a.default_max_new_tokens,
                          max_new_tokens_limit=a.max_new_tokens_limit, shutdown_timeout_s=a.shutdown_timeout_s,
                          token=token, max_request_bytes=a.max_request_bytes)
        uvicorn.run(app_, host=bind, port=port if port is not None else a.port, log_level="info",
                    timeout_graceful_shutdown=int(a.shutdown_timeout_s) + 5)

    @app.command("simulate")
    def simulate_cmd(
        workload: Path = typer.Argument(..., metavar="WORKLOAD.toml", help="WORKLOAD.toml (see examples/serve/workload.toml)"),
        as_json: bool = typer.Option(False, "--json", help="print the report as JSON"),
        policy: str = typer.Option(None, help="override scheduler.policy (lru, load_aware)"),
        export: str = typer.Option(None, "--export", help="also write one launch command per model for this "
                                   "engine (vllm, sglang; sleep mode where models share the GPUs) and a router "
                                   "config into --out-dir"),
        out_dir: Path = _OUT_DIR,
        host: str = _HOST,
        gpus_per_host: int = _GPUS_PER_HOST,
    ) -> None:
        """Simulate the workload: per-model latency percentiles, SLO attainment and goodput."""
        from hetplan.serve.replica import simulate_workload, slos
        from hetplan.serve.config import load_workload_config

        _check_export(export, out_dir)
        hosts = _hosts(host, export)
        wf = load_workload_config(workload)
        if policy is not None:  # --policy "" was dropped; an unknown one was refused as scheduler.policy
            from hetplan.serve.policies import POLICIES

            if policy not in POLICIES:
                raise HetplanError(f"unknown policy {policy!r}", field="--policy",
                                   fix=f"use one of {', '.join(POLICIES)}")
            wf.scheduler.policy = policy
        res = simulate_workload(wf)
        rep = res.report(slos(wf))
        rep.update(policy=wf.scheduler.policy, batching=wf.scheduler.batching, gpu=wf.cluster.gpu, tp=wf.cluster.tp,
                   pp=wf.cluster.pp, engine=wf.cluster.engine)
        from hetplan.serve.replica import serving_energy

        rep["energy"] = serving_energy(res, wf.cluster.gpu or "", wf.cluster.tp, wf.cluster.pp,
                                       max(res.duration_s, res.end_s))
        if export:
            from hetplan.serve.replica import cluster_footprints
            from hetplan.serve.export import replicas_from_cluster, write_export

            foot, mem = cluster_footprints(wf)
            paths = write_export(export, replicas_from_cluster(wf, foot, mem), out_dir, hosts=hosts,
                                 gpus_per_host=gpus_per_host, source=f"simulate {workload.name}")
            rep["export"] = [str(p) for p in paths]
        if as_json:
            typer.echo(json.dumps(rep, indent=2))
            return
        con = Console()
        _latency_table(con, rep, f"simulate {workload.name}: {wf.cluster.gpu} TP={wf.cluster.tp} "
                                 f"PP={wf.cluster.pp}, {wf.scheduler.policy}, {wf.scheduler.batching} batching")
        t = Table(title=f"throughput over {rep['duration_s']:.2f} s"
                        + (" (offline: all requests at t = 0)" if wf.workload.offline else ""))
        for col in ("model", "reqs", "done", "SLO met", "goodput/s", "req/s", "out tok/s", "tok/s"):
            t.add_column(col, justify="right" if col != "model" else "left")
        for name, m in list(rep["models"].items()) + [("all", rep["all"])]:
            t.add_row(name, str(m["requests"]), str(m["completed"]), _fmt(m["slo_attainment"]),
                      _fmt(m["goodput_per_s"], digits=2), _fmt(m["throughput_per_s"], digits=2),
                      _fmt(m["output_tokens_per_s"], digits=1), _fmt(m["total_tokens_per_s"], digits=1))
        con.print(t)
        con.print(f"{_slo_text(rep['models'])}; "
                  f"swaps {rep['swaps']}, {rep['bytes_swapped_in'] / 1e9:.2f} GB in per worker; "
                  f"mean batch {rep['mean_batch_size']:.2f}; preemptions {rep['preemptions']}")
        con.print(f"priced as engine {wf.cluster.engine}" if wf.cluster.engine else
                  "priced as eager PyTorch (no cluster.engine): set cluster.engine = \"vllm\" (or sglang, "
                  "tensorrt-llm) for a production engine's CUDA-graph decode, paged KV budget and step overhead",
                  highlight=False)
        _energy_line(con, rep["energy"])

    @app.command("capacity")
    def capacity_cmd(
        workload: Path = typer.Argument(..., metavar="WORKLOAD.toml", help="WORKLOAD.toml (see examples/serve/capacity.toml)"),
        gpus: str = typer.Option(None, "--gpus", help="candidate GPU types, comma-separated (default: "
                                 "capacity.gpus, else cluster.gpu; with none the command refuses)"),
        catalog: Path = typer.Option(None, "--catalog", help="GPU catalog TOML extending or overriding the "
                                     "package's (same layout as its gpus.toml in hetplan/hardware/data/)"),
        price: list[str] = typer.Option(None, "--price", help="GPU=USD per GPU-hour, overriding the catalog "
                                        "and capacity.prices; repeatable, e.g. --price A100-SXM-80GB=3.67"),
        as_json: bool = typer.Option(False, "--json", help="print the result as JSON"),
        export: str = typer.Option(None, "--export", help="write one launch command per replica for this engine "
                                   "(vllm, sglang) and a router config (LiteLLM) into --out-dir"),
        out_dir: Path = _OUT_DIR,
        host: str = _HOST,
        gpus_per_host: int = _GPUS_PER_HOST,
        share: bool = typer.Option(None, "--share/--no-share", help="also try replica groups several models "
                                   "share by swapping (Computron; default: capacity.share_gpus, on)"),
        exhaustive: bool = typer.Option(None, "--exhaustive/--pruned", help="simulate every candidate replica, or "
                                        "only those a rate bound cannot rule out (default: capacity.exhaustive, "
                                        "else pruned; the same price)"),
    ) -> None:
        """Cheapest mix of GPU types, counts and TP x PP per model that meets the SLOs (checked by simulation)."""
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        from hetplan.serve.capacity import plan_capacity
        from hetplan.serve.config import load_workload_config

        _check_export(export, out_dir)
        hosts = _hosts(host, export)
        wf = load_workload_config(workload)
        names = [g.strip() for g in gpus.split(",") if g.strip()] if gpus is not None else None
        if names is not None and not names:
            raise HetplanError("--gpus names no GPU type", field="--gpus", fix="e.g. --gpus A100-SXM-80GB,H100-SXM,L4")
        prices = _parse_prices(price or [])
        err = Console(stderr=True)
        with Progress(TextColumn("capacity: rate search"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      TextColumn("{task.description}"), console=err, transient=True) as bar:
            task = bar.add_task("", total=None)

            def step(done: int, total: int, what: str) -> None:
                bar.update(task, completed=done, total=total, description=what)

            only = [export] if export and not (wf.capacity.engines or wf.cluster.engine) else None
            out = plan_capacity(wf, names, catalog=str(catalog) if catalog else None, prices=prices, progress=step,
                                engines=only, exhaustive=exhaustive, share=share)
        if export:
            other = sorted({r["engine"] for r in out["mix"] + out["shared"] if r["engine"] and r["engine"].split("@")[0] != export})
            if other:
                raise HetplanError(f"the plan runs {', '.join(other)}, not {export}", field="--export",
                                   fix=f"export for that engine, or set capacity.engines = [\"{export}\"]")
            from hetplan.serve.export import replicas_from_capacity, write_export

            paths = write_export(export, replicas_from_capacity(wf, out), out_dir, hosts=hosts,
                                 gpus_per_host=gpus_per_host, source=f"capacity {workload.name}")
            out["export"] = [str(p) for p in paths]
        if as_json:
            typer.echo(json.dumps(out, indent=2))
            return
        con = Console()
        kinds = ", ".join(f"{n} x {g}" for g, n in out["gpus_by_type"].items())
        con.print(f"[bold]cheapest mix: {kinds}[/], {out['price_usd_per_hour']:.2f} $/h")
        if out["mix"]:
            t = Table(title="replicas per model")
            for col in ("model", "load/s", "GPU", "TPxPP", "engine", "reps", "max/s", "$/h"):
                t.add_column(col)
            for r in out["mix"]:
                t.add_row(r["model"], f"{out['load_per_s'][r['model']]:.2f}", r["gpu"], f"{r['tp']}x{r['pp']}",
                          f"{r['engine'] or '-'}/{r['weights'] or wf.cluster.dtype}", str(r["replicas"]),
                          f"{r['rate_per_s']:.2f}", f"{r['price_usd_per_hour']:.2f}")
            con.print(t)
        else:  # an empty table's header, titled "no dedicated replicas", read as a table of them
            con.print("no dedicated replicas: the models share replica groups")
        if out["shared"]:
            t = Table(title="models sharing a replica group (swapping)")
            for col in ("models", "GPU", "TPxPP", "engine", "swaps", "$/h"):
                t.add_column(col)
            for r in out["shared"]:
                t.add_row(", ".join(r["models"]), r["gpu"], f"{r['tp']}x{r['pp']}",
                          f"{r['engine'] or '-'}/{r['weights'] or wf.cluster.dtype}", str(r["swaps"]),
                          f"{r['price_usd_per_hour']:.2f}")
            con.print(t)
        t = Table(title=f"simulated (target: {out['target_attainment']:.0%} of requests within SLO)")
        for col in ("model", "reqs", "SLO met", "p99 s", "TTFT p99 s", "TPOT p99 ms", "J/token"):
            t.add_column(col)
        for name, r in out["simulated"].items():
            t.add_row(name, str(r["requests"]), _fmt(r["slo_attainment"]), _fmt(r["p99_latency_s"]),
                      _fmt(r["p99_ttft_s"]), _fmt(_ms(r["p99_tpot_s"]), digits=1),
                      _fmt(r["energy"]["energy_j_per_output_token"], digits=2))
        con.print(t)
        _energy_line(con, out["energy"])
        used = sorted(out["gpus_by_type"])
        con.print("prices: " + "; ".join(f"{g} {out['prices'][g]['usd_per_gpu_hour']:.2f} $/h "
                                         f"({out['prices'][g]['source']})" for g in used))
        if not out["meets_target"]:
            con.print("[yellow]the simulated mix misses the target after 3 rounds of derating; see the table[/]")
        if export:
            con.print(f"wrote {len(out['export']) - 2} {export} launch scripts, replicas.json and router.yaml to "
                      f"{out_dir}")


def _energy_line(con: Console, e: dict) -> None:
    """One line: energy, J per request and per output token, and where the power comes from
    (:data:`hetplan.energy.report.ENERGY_SOURCE_WORDS`)."""
    from hetplan.energy.report import ENERGY_SOURCE_WORDS

    src = ", ".join(ENERGY_SOURCE_WORDS.get(x, x) for x in e["energy_source"].split(","))
    con.print(f"energy on {e['num_gpus']} GPU{'s' if e['num_gpus'] != 1 else ''}: {e['energy_j'] / 1e3:.1f} kJ, "
              f"{_fmt(e['energy_j_per_request'], digits=1)} J/request, "
              f"{_fmt(e['energy_j_per_output_token'], digits=2)} J/output token ({src})")


def _check_export(export: str | None, out_dir: Path | None) -> None:
    """``--export`` and ``--out-dir`` go together, and the engine is one that can be exported for (checked before
    any simulation).

    Raises:
        HetplanError: naming the option at fault.
    """
    from hetplan.serve.export import EXPORT_ENGINES

    if export is None and out_dir is None:
        return
    if export is None:
        raise HetplanError("--out-dir without --export", field="--export", fix="add --export vllm or --export sglang")
    if export not in EXPORT_ENGINES:
        raise HetplanError(f"unknown engine {export!r} to export for", field="--export",
                           fix=f"use one of {', '.join(EXPORT_ENGINES)}")
    if out_dir is None:
        raise HetplanError("--export needs a folder to write into", field="--out-dir", fix="add --out-dir DIR")
    check_path_name(out_dir, "--out-dir")
    if out_dir.exists() and not out_dir.is_dir():
        raise HetplanError(f"{out_dir} is a file, not a folder", field="--out-dir", fix="give a folder path")


def _hosts(text: str | None, export: str | None) -> list[str] | None:
    """``--host "10.0.0.5,10.0.0.6"`` -> the addresses (None when not given).

    Raises:
        HetplanError: ``--host`` without ``--export``, an empty address or one with spaces or URL syntax.
    """
    if text is None:
        return None
    if export is None:
        raise HetplanError("--host places exported replicas", field="--host", fix="add --export vllm|sglang --out-dir D")
    hosts = [h.strip() for h in text.split(",")]
    bad = [h for h in hosts if not h or any(c in h for c in " /:@")]
    if bad:
        raise HetplanError(f"bad machine address {bad[0]!r} in --host", field="--host",
                           fix="give host names or IPv4 addresses, comma-separated, e.g. --host 10.0.0.5,10.0.0.6")
    return hosts


def _parse_prices(items: list[str]) -> dict[str, float]:
    """``["A100-SXM-80GB=3.67", ...]`` -> ``{"A100-SXM-80GB": 3.67}``.

    Raises:
        HetplanError: an item without ``=``, a price that is not a positive number below 1,000 $/h.
    """
    out = {}
    for item in items:
        name, sep, value = item.partition("=")
        try:
            usd = float(value)
        except ValueError:
            usd = float("nan")
        if not sep or not name.strip() or not 0 < usd <= 1000:
            raise HetplanError(f"bad price {item!r}", field="--price",
                               fix="write GPU=USD_PER_GPU_HOUR with a price in (0, 1000], e.g. A100-SXM-80GB=3.67")
        out[name.strip()] = usd
    return out
