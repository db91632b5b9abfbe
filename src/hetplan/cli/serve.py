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


def _fmt(x, unit: str = "", digits: int = 3) -> str:
    return "-" if x is None else f"{x:.{digits}f}{unit}"


def _ms(x):
    return None if x is None else 1e3 * x


def register(app: typer.Typer) -> None:
    """Add the ``serve``, ``simulate`` and ``capacity`` commands to ``app``."""

    @app.command("serve")
    def serve_cmd(
        config: Path = typer.Argument(..., help="SERVE.toml (see examples/serve/serve.toml)"),
        host: str = typer.Option(None, help="override api.host"),
        port: int = typer.Option(None, help="override api.port"),
    ) -> None:
        """Run the serving engine (TP x PP workers with weight swapping) behind the HTTP API."""
        from hetplan.serve.config import load_serve_config

        cfg = load_serve_config(config)
        try:
            import uvicorn

            from hetplan.serve.api import create_app
            from hetplan.serve.engine import Engine
        except ImportError as exc:  # pragma: no cover - extras missing
            raise HetplanError(f"serving needs the torch and serve extras ({exc.name} is missing)", field="install",
                               fix="pip install 'hetplan[torch,serve]'") from None
        engine = Engine.from_config(cfg)
        engine.start()  # before the server: start-up problems surface as errors, not as a failed lifespan
        a = cfg.api
        app_ = create_app(engine, default_max_new_tokens=a.default_max_new_tokens,
                          max_new_tokens_limit=a.max_new_tokens_limit, shutdown_timeout_s=a.shutdown_timeout_s)
        uvicorn.run(app_, host=host or a.host, port=port if port is not None else a.port, log_level="info",
                    timeout_graceful_shutdown=int(a.shutdown_timeout_s) + 5)

    @app.command("simulate")
    def simulate_cmd(
        workload: Path = typer.Argument(..., help="WORKLOAD.toml (see examples/serve/workload.toml)"),
        as_json: bool = typer.Option(False, "--json", help="print the report as JSON"),
        policy: str = typer.Option(None, help="override scheduler.policy (lru, load_aware)"),
    ) -> None:
        """Simulate the workload: per-model latency percentiles, SLO attainment and goodput."""
        from hetplan.serve.capacity import simulate_workload, slos
        from hetplan.serve.config import load_workload_config

        wf = load_workload_config(workload)
        if policy:
            wf.scheduler.policy = policy
        res = simulate_workload(wf)
        rep = res.report(slos(wf))
        rep.update(policy=wf.scheduler.policy, batching=wf.scheduler.batching, gpu=wf.cluster.gpu, tp=wf.cluster.tp,
                   pp=wf.cluster.pp)
        if as_json:
            typer.echo(json.dumps(rep, indent=2))
            return
        t = Table(title=f"simulate {workload.name}: {wf.cluster.gpu} TP={wf.cluster.tp} PP={wf.cluster.pp}, "
                        f"{wf.scheduler.policy}, {wf.scheduler.batching} batching")
        for col in ("model", "reqs", "p50/p99 s", "TTFT p50/p99 s", "TPOT p50/p99 ms", "SLO met", "goodput/s"):
            t.add_column(col)
        for name, m in list(rep["models"].items()) + [("all", rep["all"])]:
            t.add_row(name, str(m["requests"]), f"{_fmt(m['p50_latency_s'], digits=2)}/{_fmt(m['p99_latency_s'], digits=2)}",
                      f"{_fmt(m['p50_ttft_s'], digits=2)}/{_fmt(m['p99_ttft_s'], digits=2)}",
                      f"{_fmt(_ms(m['p50_tpot_s']), digits=1)}/{_fmt(_ms(m['p99_tpot_s']), digits=1)}",
                      _fmt(m["slo_attainment"]), _fmt(m["goodput_per_s"], digits=2))
        con = Console()
        con.print(t)
        s = next(iter(rep["models"].values()))["slo"]
        con.print(f"SLOs (s): latency {_fmt(s['latency_s'])}, TTFT {_fmt(s['ttft_s'])}, TPOT {_fmt(s['tpot_s'])}; "
                  f"swaps {rep['swaps']}, {rep['bytes_swapped_in'] / 1e9:.2f} GB in per worker; "
                  f"mean batch {rep['mean_batch_size']:.2f}")

    @app.command("capacity")
    def capacity_cmd(
        workload: Path = typer.Argument(..., help="WORKLOAD.toml with a \\[capacity] section"),
        as_json: bool = typer.Option(False, "--json", help="print the result as JSON"),
    ) -> None:
        """Fewest GPUs (type, TP x PP, from the catalog) that meet the latency SLO for the workload."""
        from hetplan.serve.capacity import plan_capacity
        from hetplan.serve.config import load_workload_config

        wf = load_workload_config(workload)
        out = plan_capacity(wf)
        if as_json:
            typer.echo(json.dumps(out, indent=2))
            return
        b = out["best"]
        con = Console()
        con.print(f"[bold]{b['num_gpus']} x {b['gpu']}[/] (TP={b['tp']}, PP={b['pp']}), "
                  f"{b['price_usd_per_hour']:.2f} $/h: min SLO attainment {b['min_slo_attainment']:.3f} "
                  f"(target {out['target_attainment']}), p99 {b['p99_latency_s']:.3f} s")
        t = Table(title="feasible alternatives (cheapest first)")
        for col in ("GPU", "GPUs", "TP", "PP", "$/h", "min attainment", "p99 s"):
            t.add_column(col)
        feas = sorted((c for c in out["candidates"] if c["feasible"]), key=lambda c: (c["num_gpus"], c["price_usd_per_hour"]))
        for c in feas[:10]:
            t.add_row(c["gpu"], str(c["num_gpus"]), str(c["tp"]), str(c["pp"]), f"{c['price_usd_per_hour']:.2f}",
                      _fmt(c["min_slo_attainment"]), _fmt(c["p99_latency_s"]))
        con.print(t)
