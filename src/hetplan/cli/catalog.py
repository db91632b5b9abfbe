"""``hetplan catalog gpus|nodes|models``: what the bundled catalog knows."""

from __future__ import annotations

import json
import re
from typing import Optional

import typer

from hetplan.cli.output import NARROW, new_table, table_console
from rich import box
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
    con = table_console()
    narrow = con.width < NARROW
    t = new_table(f"GPU catalog ({cat.date}); links unidirectional per GPU; TFLOP/s dense", narrow)
    # Under 130 columns: no fp16 and host-link columns (fp16 equals bf16 on every GPU that has both) and the
    # price's latest year without its provider.
    cols = ("name", "memory GiB", "HBM GB/s", "bf16 TF/s", "fp16 TF/s", "GPU link GB/s", "host GB/s", "TDP W",
            "$/GPU-h", "price as of")
    keep = [c for c in cols if not narrow or c not in ("fp16 TF/s", "host GB/s")]
    for col in keep:
        t.add_column(col, justify="left" if col in ("name", "price as of") else "right", no_wrap=col == "name")
    for g in cat.gpus.values():
        f = g.dense_flops_per_s
        row = dict(zip(cols, (
            g.name, f"{g.memory_bytes / 2**30:.0f}", f"{g.hbm_bandwidth_bytes_per_s / 1e9:.0f}",
            f"{f['bf16'] / 1e12:.0f}" if "bf16" in f else "-", f"{f['fp16'] / 1e12:.0f}" if "fp16" in f else "-",
            f"{g.gpu_link_bandwidth_bytes_per_s / 1e9:.0f}", f"{g.host_link_bandwidth_bytes_per_s / 1e9:.0f}",
            f"{g.tdp_w:.0f}", f"{g.price_usd_per_hour:.2f}",
            (re.findall(r"\d{4}", g.price_date) or ["?"])[-1] if narrow
            else f"{g.price_provider.split(',')[0]} {g.price_date}",
        )))
        t.add_row(*(row[c] for c in keep))
    con.print(t)


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
    """Bundled model presets with their shapes, total and active parameters (MoE: top-k routed experts)."""
    specs = [load_model(n) for n in list_presets()]
    if as_json:
        print(json.dumps([dict(m.model_dump(mode="json"), parameters=counts.total_parameters(m),
                               active_parameters=counts.active_parameters(m)) for m in specs], indent=1))
        return
    t = Table(title="Model presets (any HF config.json path works too). heads: query/KV; ffn: per expert for "
                    "MoE; parameters in billions, active = per token (top-k experts)", box=box.SIMPLE_HEAD, pad_edge=False)
    for col in ("name", "layers", "hidden", "heads", "ffn", "experts", "total B", "active B"):
        t.add_column(col, justify="left" if col == "name" else "right")
    for m in specs:
        ffn = m.expert_ffn_hidden_size if m.is_moe else m.ffn_hidden_size
        experts = f"{m.num_experts} top-{m.experts_per_token}" if m.is_moe else "-"
        t.add_row(m.name, str(m.num_layers), str(m.hidden_size), f"{m.num_attention_heads}/{m.num_kv_heads}",
                  str(ffn), experts, f"{counts.total_parameters(m) / 1e9:.1f}",
                  f"{counts.active_parameters(m) / 1e9:.1f}")
    table_console().print(t)


def register(app: typer.Typer) -> None:
    """Add ``hetplan catalog``."""
    app.add_typer(catalog_app, name="catalog")
