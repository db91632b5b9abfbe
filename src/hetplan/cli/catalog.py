"""``hetplan catalog gpus|nodes|models``: what the bundled catalog knows."""

from __future__ import annotations

import json
from typing import Optional

import typer

from hetplan.cli.output import table_console
from rich.table import Table

from hetplan.hardware.catalog import load_catalog, load_nodes
from hetplan.model import counts
from hetplan.model.spec import list_presets, load_model

catalog_app = typer.Typer(help="List the GPU types and model presets hetplan knows.", no_args_is_help=True)


@catalog_app.command("gpus")
def gpus(
    catalog: Optional[str] = typer.Option(None, "--catalog", help="User TOML extending/overriding the GPU catalog."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON (SI units)."),
) -> None:
    """GPU types: memory, bandwidths, dense TFLOP/s, TDP and default price."""
    cat = load_catalog(catalog)
    if as_json:
        print(json.dumps({"date": cat.date, "gpus": [g.model_dump(mode="json") for g in cat.gpus.values()]}, indent=1))
        return
    t = Table(title=f"GPU catalog ({cat.date}); links unidirectional per GPU; TFLOP/s dense")
    for col in ("name", "memory GiB", "HBM GB/s", "bf16 TF/s", "fp16 TF/s", "GPU link GB/s", "host GB/s", "TDP W", "$/GPU-h", "price as of"):
        t.add_column(col, justify="left" if col in ("name", "price as of") else "right")
    for g in cat.gpus.values():
        f = g.dense_flops_per_s
        t.add_row(
            g.name, f"{g.memory_bytes / 2**30:.0f}", f"{g.hbm_bandwidth_bytes_per_s / 1e9:.0f}",
            f"{f['bf16'] / 1e12:.0f}" if "bf16" in f else "-", f"{f['fp16'] / 1e12:.0f}" if "fp16" in f else "-",
            f"{g.gpu_link_bandwidth_bytes_per_s / 1e9:.0f}", f"{g.host_link_bandwidth_bytes_per_s / 1e9:.0f}",
            f"{g.tdp_w:.0f}", f"{g.price_usd_per_hour:.2f}", f"{g.price_provider.split(',')[0]} {g.price_date}",
        )
    table_console().print(t)


@catalog_app.command("nodes")
def nodes(as_json: bool = typer.Option(False, "--json", help="Print JSON (SI units).")) -> None:
    """Node presets: GPUs per node (NVLink domain), NICs x Gb/s, network, and which GPU types default to them."""
    cat = load_nodes()
    if as_json:
        print(json.dumps({"date": cat.date, "nodes": [n.model_dump(mode="json") for n in cat.nodes.values()]}, indent=1))
        return
    t = Table(title=f"Node presets ({cat.date}); `node = NAME` in a pool")
    t.caption = "default: the node a pool of that GPU type gets when it names none"
    for col in ("name", "GPU", "GPUs", "NICs x Gb/s", "network", "default"):
        t.add_column(col, justify="right" if col == "GPUs" else "left")
    for n in cat.nodes.values():
        t.add_row(n.name, n.gpu, str(n.gpus_per_node), f"{n.nics} x {n.nic_bandwidth_bytes_per_s * 8 / 1e9:.0f}",
                  n.network, "yes" if n.reference_for else "")
    table_console().print(t)


@catalog_app.command("models")
def models(as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """Bundled model presets with their shapes and parameter counts."""
    specs = [load_model(n) for n in list_presets()]
    if as_json:
        print(json.dumps([dict(m.model_dump(mode="json"), parameters=counts.total_parameters(m)) for m in specs], indent=1))
        return
    t = Table(title="Model presets (config.json files; any HF config.json path works too)")
    for col in ("name", "family", "layers", "hidden", "heads", "kv heads", "ffn", "vocab", "max seq", "parameters"):
        t.add_column(col, justify="left" if col in ("name", "family") else "right")
    for m in specs:
        t.add_row(m.name, m.family, str(m.num_layers), str(m.hidden_size), str(m.num_attention_heads),
                  str(m.num_kv_heads), str(m.ffn_hidden_size), str(m.vocab_size), str(m.max_seq_len),
                  f"{counts.total_parameters(m) / 1e9:.2f} B")
    table_console().print(t)


def register(app: typer.Typer) -> None:
    """Add ``hetplan catalog``."""
    app.add_typer(catalog_app, name="catalog")
