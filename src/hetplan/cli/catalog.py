"""``hetplan catalog gpus|nodes|models|prices|stacks|engines``: what the bundled catalog knows."""

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


def _usd(price: float) -> str:
    """A price per GPU-hour as shown: 0 in the catalog is no price (nobody rents the GPU), not a free one."""
    return f"{price:.2f}" if price > 0 else "none"


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
            f"{g.tdp_w:.0f}", _usd(g.price_usd_per_hour),
            (re.findall(r"\d{4}", g.price_date) or ["?"])[-1] if narrow
            else f"{g.price_provider.split(',')[0]} {g.price_date}",
        )))
        t.add_row(*(row[c] for c in keep))
    con.print(t)


@catalog_app.command("prices", short_help="Dated public GPU prices by provider, and each GPU type's default price.")
def prices(
    gpu: Optional[str] = typer.Option(None, "--gpu", help="Only this GPU type."),
    prices_file: Optional[str] = typer.Option(None, "--prices", help="Your quotes (the \\[\\[quote]] layout of "
                                              "prices.toml), replacing the shipped ones of the GPU types they name."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON (every quote with its source)."),
) -> None:
    """Dated public GPU prices ($/GPU-hour) by provider and kind, and each GPU type's default price: the median of
    each provider's newest on-demand quote within 12 months (hetplan/hardware/data/prices.toml)."""
    import datetime as dt
    import textwrap

    from hetplan.hardware.prices import MAX_AGE_DAYS, default_price, load_quotes, newest_per_provider
    from hetplan.hardware.prices import _stale as stale

    cat = load_catalog()
    quotes = load_quotes(prices_file)
    names = [cat.get(gpu, field="--gpu").name] if gpu is not None else list(cat.gpus)  # --gpu "": all of them
    today = dt.date.today()
    rows, defaults = [], []
    for name in names:
        mine = sorted((q for q in quotes if q.gpu == name), key=lambda q: (q.kind, q.usd_per_gpu_hour))
        d = default_price(name, quotes, today)
        used = {id(q) for q in newest_per_provider(x for x in mine if x.kind == "on_demand")
                if d is not None and (not stale(q.date, today) or d.stale)}
        for q in mine:
            rows.append((q, id(q) in used, stale(q.date, today)))
        spec = cat.get(name)
        defaults.append({"gpu": name, "usd_per_gpu_hour": d.usd_per_gpu_hour if d else spec.price_usd_per_hour,
                         "rule": d.label if d else f"no on-demand quote: catalog price ({spec.price_provider})",
                         "date": d.date if d else spec.price_date,
                         "stale": d.stale if d else stale(spec.price_date, today)})
    if as_json:
        print(json.dumps({"max_age_days": MAX_AGE_DAYS, "defaults": defaults,
                          "quotes": [dict(q.model_dump(), default_rule=u, stale=st) for q, u, st in rows]}, indent=1))
        return
    con = table_console()
    t = new_table("GPU prices, $/GPU-hour (* in the default's median; ! older than 12 months)", con.width < NARROW)
    for col in ("GPU", "provider", "kind", "$/GPU-h", "date", ""):
        t.add_column(col, justify="right" if col == "$/GPU-h" else "left", no_wrap=True)
    for q, used, st in rows:
        t.add_row(q.gpu, q.provider, q.kind.replace("_", "-"), f"{q.usd_per_gpu_hour:.2f}", q.date,
                  ("*" if used else "") + ("!" if st else ""))
    if rows:
        con.print(t)
    else:  # an empty table said nothing (GB300: sold as racks on contract)
        con.print(f"no public quotes for {', '.join(names)}", highlight=False)
    width = max(40, min(con.width, 100) - 1)
    con.print("Default price (what `hetplan plan` charges a pool without its own; --price-source picks another):",
              highlight=False)
    for d in defaults:
        line = (f"{d['gpu']} {_usd(d['usd_per_gpu_hour'])}: {d['rule']}, {d['date']}"
                + (" (older than 12 months)" if d["stale"] else ""))
        con.print(textwrap.fill(line, width=width, initial_indent="  ", subsequent_indent="    "),
                  highlight=False, markup=False)


@catalog_app.command("nodes", short_help="Node presets: GPUs per node and per host, NICs, network.")
def nodes(as_json: bool = typer.Option(False, "--json", help="Print JSON (SI units).")) -> None:
    """Node presets: GPUs per node (NVLink domain) and per host (what a launch starts processes on: 4 per NVL72
    compute tray), NICs x Gb/s, network, and which GPU types default to them."""
    cat = load_nodes()
    if as_json:
        print(json.dumps({"date": cat.date, "nodes": [n.model_dump(mode="json") for n in cat.nodes.values()]}, indent=1))
        return
    con = table_console()
    t = new_table(f"Node presets ({cat.date}); `node = NAME` in a pool", con.width < NARROW)
    t.caption = ("GPUs: the NVLink domain; N/host where hosts are smaller (a launch starts its processes per "
                 "host). default: the node a pool of that GPU type gets when it names none")
    for col in ("name", "GPU", "GPUs", "NICs x Gb/s", "network", "default"):  # names whole: what `node =` takes
        t.add_column(col, justify="right" if col == "GPUs" else "left", no_wrap=col in ("name", "GPU"))
    for n in cat.nodes.values():
        gpus = str(n.gpus_per_node) + (f" ({n.gpus_per_host}/host)" if n.gpus_per_host else "")
        t.add_row(n.name, n.gpu, gpus, f"{n.nics} x {n.nic_bandwidth_bytes_per_s * 8 / 1e9:.0f}",
                  n.network, "yes" if n.reference_for else "")
    con.print(t)


@catalog_app.command("models")
def models(as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """Bundled model presets with their shapes, total and active parameters (MoE: top-k routed experts)."""
    specs = [load_model(n) for n in list_presets()]
    if as_json:
        print(json.dumps([dict(m.model_dump(mode="json"), parameters=counts.total_parameters(m),
                               active_parameters=counts.active_parameters(m)) for m in specs], indent=1))
        return
    t = Table(title="Model presets (any HF config.json path works too). heads: query/KV; ffn: per expert for "
                    "MoE; parameters in billions, active = per token (top-k experts)", box=box.SIMPLE_HEAD, pad_edge=False,
              padding=(0, 0))
    # whole names and "E top-k" at 80 columns (issue 27: "llama2-7…" beside "llama2-7b"): no column wraps,
    # one space between columns
    for col in ("name", "layers", "hidden", "heads", "ffn", "experts", "total B", "active B"):
        t.add_column(col, justify="left" if col == "name" else "right", no_wrap=True)
    for m in specs:
        ffn = m.expert_ffn_hidden_size if m.is_moe else m.ffn_hidden_size
        experts = f"{m.num_experts} top-{m.experts_per_token}" if m.is_moe else "-"
        t.add_row(m.name, str(m.num_layers), str(m.hidden_size), f"{m.num_attention_heads}/{m.num_kv_heads}",
                  str(ffn), experts, f"{counts.total_parameters(m) / 1e9:.1f}",
                  f"{counts.active_parameters(m) / 1e9:.1f}")
    table_console().print(t)


def _attention(st) -> str:
    """A stack's attention in a few characters: ``std``/``eager``, or the flash kernel with per-family ones
    (``fa2 H,B:cudnn``: FlashAttention-2, cuDNN on Hopper and Blackwell)."""
    if st.attention != "flash":
        return {"standard": "std", "eager": "eager"}[st.attention]
    base = st.attention_kernel.get("default", "fa2")
    other: dict[str, list[str]] = {}
    for fam, k in st.attention_kernel.items():
        if fam != "default" and k != base:
            other.setdefault(k, []).append(fam[0])
    return " ".join([base] + [f"{','.join(f)}:{k}" for k, f in other.items()])


def _dims(st) -> str:
    """A stack's parallel dimensions beside DP in at most four characters: ``TVCE`` (TP, PP with interleaved
    1F1B, CP, EP; ``P``: PP without interleaving), ``-`` for data parallelism alone."""
    out = "".join(("V" if st.interleaved else "P") if d == "pp" else d[0].upper() for d in st.parallel if d != "dp")
    return out or "-"


def _print_field(con, name: str, shown: str, source: str) -> None:
    """One field of ``catalog stacks NAME`` / ``catalog engines NAME`` and its source, wrapped to the console's
    width with the source indented under it, printed as written (a source such as ``[parallelism]
    enable_async_tensor_parallel`` is a TOML section, not rich markup, which swallowed it)."""
    import textwrap

    width = max(con.width, 40)
    lines = textwrap.wrap(f"{name}: {shown}", width, initial_indent="  ", subsequent_indent="    ") or [f"  {name}:"]
    lines += textwrap.wrap(f"source: {source}", width, initial_indent="      ", subsequent_indent="        ",
                           break_on_hyphens=False)
    con.print("\n".join(lines), highlight=False, markup=False, soft_wrap=True)


@catalog_app.command("stacks", short_help="Software stacks: what each framework release runs, each field sourced.")
def stacks(
    name: Optional[str] = typer.Argument(None, metavar="NAME", help="NAME\\[@VERSION|@YYYY-MM]: one release with every field's source."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON (every field and its source)."),
) -> None:
    """Software stacks: what each framework release runs (GEMM path, attention kernel by GPU, sequence
    parallelism, TP-comm overlap, DP overlap, launch, ZeRO, parallel dimensions), each field sourced; `--stack` /
    job `stack` pick one; the searches propose only the parallel dimensions a stack runs."""
    from hetplan.hardware.stacks import FRAMEWORK_STACK, load_stacks, resolve_stack

    cat = load_stacks()
    chosen = [resolve_stack(name, field="NAME")] if name else list(cat.stacks)
    if as_json:
        print(json.dumps({"date": cat.date, "stacks": [dict(s.model_dump(mode="json"), id=s.id) for s in chosen]},
                         indent=1))
        return
    con = table_console()
    if name:
        st = chosen[0]
        con.print(f"[bold]{st.id}[/] (released {st.released}; framework {st.framework})", highlight=False)
        for f in ("released",) + tuple(st.model_fields)[3:-1]:
            value = getattr(st, f)
            shown = ", ".join(map(str, value)) if isinstance(value, tuple) else (
                ", ".join(f"{k} {v}" for k, v in value.items()) if isinstance(value, dict) else str(value))
            _print_field(con, f, shown, st.sources.get(f, "hetplan (framework family)"))
        return
    narrow = con.width < NARROW
    t = new_table(f"Software stacks ({cat.date}); a release holds until the next", narrow)
    cols = ("stack", "from", "GEMM", "attention", "SP", "TPo", "DPo", "launch", "ZeRO", "dims")
    rows = []
    latest = {s.name: s for s in cat.stacks}
    for st in cat.stacks:
        star = "*" if st.name in FRAMEWORK_STACK.values() and latest[st.name] is st else ""
        z = st.zero
        rows.append((st.id + star, st.released, "TE" if st.gemm == "transformer-engine" else "cuBLAS", _attention(st),
                  "y" if st.sequence_parallel else "-", "y" if st.tp_comm_overlap else "-",
                  {"bucketed": "y", "none": "-", "ddp-only": "z0", "after-last-microbatch": "z12",
                   "single-stage": "pp1"}[st.dp_overlap],
                  {"eager": "eager", "cuda-graphs": "graphs", "compiled": "tc"}[st.launch],
                  f"{z[0]}-{z[-1]}" if len(z) > 1 and z == tuple(range(z[0], z[-1] + 1)) else ",".join(map(str, z)),
                  _dims(st)))
    for i, col in enumerate(cols):  # at 80 columns the long release names fold, every short code stays whole
        width = max(len(col), *(len(r[i]) for r in rows))
        t.add_column(col, no_wrap=col != "stack", overflow="fold",
                     min_width=None if col in ("stack", "attention") else width)
    for r in rows:
        t.add_row(*r)
    con.print(t)
    con.print("* the default stack of its framework (" + ", ".join(f"{fw}: {n}" for fw, n in FRAMEWORK_STACK.items())
              + "), what `hetplan export` writes. SP: sequence parallelism; TPo: TP-communication overlap; DPo: DP "
              "gradient reduction overlapped with backward (z0: only ZeRO-0 through torch DDP; z12: only ZeRO-1/2 "
              "without a pipeline, DeepSpeed; pp1: only without a pipeline, NeMo 2022); launch: graphs = CUDA graphs available, "
              "tc = torch.compile by default; "
              "attention: std = s x s scores stored, H,B:cudnn = cuDNN on Hopper and Blackwell; dims: the parallel "
              "dimensions beside DP it runs (T/P/C/E = TP/PP/CP/EP, V = PP with interleaved 1F1B), the only ones the "
              "searches propose. `hetplan catalog stacks NAME` shows every field's source.", highlight=False)


#: Short names of the serving engines' attention kernels in the engines table.
_KERNEL_SHORT = {"flashinfer": "fi", "trtllm-fmha": "fmha", "xformers": "xf"}


@catalog_app.command("engines", short_help="Serving engines: decode path, attention kernels, KV cache, each sourced.")
def engines(
    name: Optional[str] = typer.Argument(None, metavar="ENGINE", help="ENGINE\\[@VERSION]: one release with every field's source."),
    engines_file: Optional[str] = typer.Option(None, "--engines", help="User TOML extending the engine data."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON (every field and its source)."),
) -> None:
    """Serving engines (vLLM, SGLang, TensorRT-LLM, HF eager, TGI): decode path and CUDA-graph batches, attention
    kernel by GPU generation, KV block and memory budget, default max sequences, weight dtypes, each sourced."""
    from hetplan.hardware.engines import load_engines

    cat = load_engines(engines_file)
    chosen = [cat.get(name, field="ENGINE")] if name else cat.all()
    if as_json:
        print(json.dumps({"date": cat.date, "engines": [dict(e.model_dump(mode="json"), label=e.label)
                                                        for e in chosen]}, indent=1))
        return
    con = table_console()
    if name:
        e = chosen[0]
        con.print(f"[bold]{e.label}[/] ({e.display}, {e.repository}; released {e.released})", highlight=False)
        for f in tuple(e.model_fields)[5:-1]:
            value = getattr(e, f)
            shown = ", ".join(map(str, value)) if isinstance(value, tuple) else (
                "; ".join(f"{k} {', '.join(v) if isinstance(v, tuple) else v}" for k, v in value.items())
                if isinstance(value, dict) else str(value))
            key = "non_torch_memory_gib" if f == "non_torch_memory_bytes" else f
            _print_field(con, f, shown, e.sources.get(key, "-"))
        return
    t = new_table(f"Serving engines ({cat.date})", con.width < NARROW)
    for col in ("engine", "decode", "graphs", "attn A / H", "block", "budget", "max seqs", "fp8"):
        t.add_column(col, no_wrap=True)
    for e in chosen:
        attn = " / ".join(_KERNEL_SHORT.get(e.attention.get(f, "-"), e.attention.get(f, "-"))
                          for f in ("Ampere", "Hopper"))
        small = e.max_num_seqs_small_gpu
        t.add_row(e.label, {"cuda_graphs": "graphs", "compiled": "compiled", "eager": "eager"}[e.decode_path],
                  f"≤{e.cuda_graph_batch_sizes[-1]}" if e.cuda_graph_batch_sizes else "-", attn,
                  str(e.kv_block_tokens or "-"), f"{e.gpu_memory_utilization:g} {e.memory_budget}",
                  f"{e.max_num_seqs}/{small}" if small else str(e.max_num_seqs),
                  "w8a8" if e.fp8_compute else ("w8" if "fp8" in e.weight_dtypes else "-"))
    con.print(t)
    con.print("graphs: largest decode batch replayed as a CUDA graph; attn: Ampere / Hopper kernel (fi = FlashInfer, "
              "fmha = TensorRT-LLM context FMHA); budget: KV memory fraction of the total or of the memory free after "
              "loading; max seqs: default (/ on A100 and GPUs under 70 GiB); fp8: W8A8 FP8 GEMMs on Ada/Hopper (w8: "
              "weight-only). `hetplan catalog engines NAME` shows every field's source.", highlight=False)


def register(app: typer.Typer) -> None:
    """Add ``hetplan catalog``."""
    app.add_typer(catalog_app, name="catalog")
