"""``hetplan profile``: measure layers and collectives on this host, import other systems' profiles, list a database.

Torch is imported only by ``profile layers`` / ``profile comm`` (the ``torch`` extra); importing this module and
the importers do not need it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from hetplan.errors import HetplanError

profile_app = typer.Typer(help="Profile layers and collectives into a SQLite profile database; import profiles.",
                          no_args_is_help=True)

DEFAULT_DB = "hetplan-profiles.db"


def _ints(text: str, field: str) -> list[int]:
    try:
        vals = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise HetplanError(f"{text!r} is not a comma-separated list of integers", field=field,
                           fix=f"e.g. {field} 1,2,4") from None
    if not vals or min(vals) < 1:
        raise HetplanError(f"{text!r} needs positive integers", field=field, fix=f"e.g. {field} 1,2,4")
    return vals


@profile_app.command("layers")
def layers(
    model: str = typer.Option(..., "--model", help="Preset name or config.json path."),
    db: str = typer.Option(DEFAULT_DB, "--db", help="SQLite profile database (created if missing)."),
    dtype: str = typer.Option("bf16", "--dtype", help="Comma-separated dtypes: fp32, bf16, fp16."),
    mbs: str = typer.Option("1,2,4", "--mbs", help="Comma-separated micro-batch sizes."),
    seq_len: str = typer.Option("2048", "--seq-len", help="Comma-separated sequence lengths."),
    tp: str = typer.Option("1", "--tp", help="Comma-separated TP degrees (TP > 1 starts that many local ranks)."),
    kinds: str = typer.Option("layer,embedding,head", "--kinds", help="What to time."),
    warmup: int = typer.Option(2, "--warmup", min=0),
    repeats: int = typer.Option(5, "--repeats", min=1),
    threads: Optional[int] = typer.Option(None, "--threads", min=1, help="torch threads on CPU (default: torch's)."),
) -> None:
    """Time forward and backward of one layer, the embedding and the head (median of repeats); resumable."""
    from rich.progress import Progress

    from hetplan.model.spec import load_model
    from hetplan.profile.db import ProfileDB
    from hetplan.profile.profiler import profile_layers

    spec = load_model(model)
    with ProfileDB(db) as pdb, Progress(console=Console(stderr=True)) as bar:
        task = bar.add_task("profiling", total=None)

        def progress(done, total, p):
            bar.update(task, completed=done, total=total,
                       description=f"{p.kind} {p.dtype} tp={p.tp} s={p.seq_len} mbs={p.mbs}")

        out = profile_layers(pdb, spec, dtypes=[d.strip() for d in dtype.split(",")], mbs=_ints(mbs, "--mbs"),
                             seq_lens=_ints(seq_len, "--seq-len"), tps=_ints(tp, "--tp"),
                             kinds=[k.strip() for k in kinds.split(",")], warmup=warmup, repeats=repeats,
                             threads=threads, progress=progress)
    Console().print(f"{out['measured']} points measured, {out['skipped']} already in {db} "
                    f"(device {out['device']}, {out['software']})")


@profile_app.command("comm")
def comm(
    db: str = typer.Option(DEFAULT_DB, "--db"),
    world_size: int = typer.Option(2, "--world-size", help="Local ranks (gloo on CPU, nccl on GPU)."),
    sizes: str = typer.Option("65536,1048576,16777216", "--sizes", help="Message sizes in bytes, comma-separated."),
    collectives: str = typer.Option("all-reduce,all-gather,reduce-scatter,send-recv", "--collectives"),
    repeats: int = typer.Option(5, "--repeats", min=1),
) -> None:
    """Time all-reduce, all-gather, reduce-scatter and send/recv over local ranks (bus bandwidth, NCCL-tests style)."""
    from hetplan.profile.db import ProfileDB
    from hetplan.profile.profiler import profile_collectives

    with ProfileDB(db) as pdb, Console(stderr=True).status("timing collectives"):
        out = profile_collectives(pdb, world_size=world_size, sizes_bytes=_ints(sizes, "--sizes"),
                                  collectives=[c.strip() for c in collectives.split(",")], repeats=repeats)
    Console().print(f"{out['measured']} collective points on {out['device']} ({out['backend']})")
    for s in out["skipped_collectives"]:
        Console().print(f"skipped {s}")


@profile_app.command("import")
def import_(
    fmt: str = typer.Argument(..., metavar="FORMAT", help="fasop | aceso | espresso"),
    path: Path = typer.Argument(..., metavar="PATH", help="FASOP CSV, Aceso profiled-time folder, or an Espresso run folder."),
    db: str = typer.Option(DEFAULT_DB, "--db"),
    models: Optional[list[str]] = typer.Option(None, "--model", help="LABEL=MODEL: the model (preset or config.json) "
                                               "whose layers the files labelled LABEL measure, e.g. gpt_1_3B="
                                               "examples/models/gpt3_1.3b_aceso.json (fasop, aceso; repeatable)."),
    seq_len: Optional[int] = typer.Option(None, "--seq-len", help="Sequence length of the --model profiles "
                                          "(default: the label's known one, else 2048 as in Aceso's scripts)."),
) -> None:
    """Import measured profiles of FASOP, Aceso or Espresso (no torch needed)."""
    from hetplan.profile import importers
    from hetplan.profile.db import ProfileDB

    fns = {"fasop": importers.import_fasop, "aceso": importers.import_aceso, "espresso": importers.import_espresso}
    if fmt not in fns:
        raise HetplanError(f"unknown format {fmt!r}", field="FORMAT", fix="use fasop, aceso or espresso")
    kwargs = {}
    if seq_len is not None and not models:  # was dropped: the files' own labels carry their sequence lengths
        raise HetplanError(f"--seq-len {seq_len} is the sequence length of --model profiles; none is given",
                           field="--seq-len", fix="add --model LABEL=MODEL, or drop --seq-len")
    if models:
        if fmt == "espresso":
            raise HetplanError("Espresso runs name their model themselves", field="--model", fix="drop --model")
        known = {**importers.FASOP_MODELS, **importers.ACESO_MODELS}
        kwargs["models"] = {}
        for item in models:
            label, sep, model = item.partition("=")
            if not sep or not label or not model:
                raise HetplanError(f"got {item!r}", field="--model", fix="write LABEL=MODEL, e.g. gpt_1_3B=gpt3-1.3b")
            if seq_len is not None and not 0 < seq_len <= 2**20:
                raise HetplanError(f"got {seq_len}", field="--seq-len", fix="give a length in 1..1,048,576")
            kwargs["models"][label] = (model, seq_len or known.get(label, (None, 2048))[1])
    with ProfileDB(db) as pdb:
        n = fns[fmt](pdb, path, **kwargs)
    Console().print(f"imported {n} rows from {path} into {db}")


@profile_app.command("export-csv")
def export_csv(
    out: Path = typer.Argument(..., metavar="OUT.csv", help="CSV file to write (e.g. src/hetplan/profile/data/h200-2026-11.csv)."),
    db: str = typer.Option(DEFAULT_DB, "--db"),
    source: Optional[str] = typer.Option("hetplan-profiler", "--source", help="Only rows of this source ('' = all)."),
) -> None:
    """Write the layer rows as CSV (the form in which measured profiles ship as package data)."""
    from hetplan.profile.db import ProfileDB

    from hetplan.cli.output import output_file

    output_file(out, "OUT")
    with ProfileDB(db, read_only=True) as pdb:
        n = pdb.export_csv(out, source or None)
    Console().print(f"wrote {n} rows to {out}")


@profile_app.command("show")
def show(
    db: str = typer.Option(DEFAULT_DB, "--db"),
    as_json: bool = typer.Option(False, "--json", help="Print JSON (SI units)."),
) -> None:
    """List a profile database."""
    from hetplan.profile.db import ProfileDB

    with ProfileDB(db, read_only=True) as pdb:
        rows, comm_rows, stages = list(pdb.layer_rows()), pdb.comm_rows(), pdb.stage_rows()
        version = pdb.schema_version
    if as_json:
        print(json.dumps({"schema_version": version, "layers": rows, "comm": comm_rows, "stages": stages}, indent=1))
        return
    from hetplan.cli.output import NARROW, new_table, table_console

    c = table_console()
    t = new_table(f"{db}: layer times (schema v{version}; ms per micro-batch)", c.width < NARROW)
    cols = ("device", "dtype", "kind", "h", "heads", "ffn", "tp", "seq", "mbs", "fwd ms", "bwd ms", "source")
    cells = [(r["device"], r["dtype"], r["kind"], str(r["hidden_size"]), str(r["num_heads"]),
              str(r["ffn_hidden_size"]), str(r["tp"]), str(r["seq_len"]), str(r["mbs"]),
              f"{r['forward_s'] * 1e3:.3f}", f"{r['backward_s'] * 1e3:.3f}", r["source"]) for r in rows]
    for i, col in enumerate(cols):  # the names and the source fold at 80 columns, the numbers stay whole
        text = col in ("device", "kind", "source")
        t.add_column(col, justify="left" if text else "right", overflow="fold", no_wrap=not text,
                     min_width=None if text else max(len(col), *(len(x[i]) for x in cells), 1) if cells else None)
    for x in cells:
        t.add_row(*x)
    c.print(t)
    c.print(f"{len(comm_rows)} collective rows, {len(stages)} stage rows")


def register(app: typer.Typer) -> None:
    """Add ``hetplan profile ...`` to ``app``."""
    app.add_typer(profile_app, name="profile")
