"""`hetplan catalog ...` on an 80-column terminal."""

import typer

from hetplan.cli.main import app
from tests.fuzz.inproc import run_cli


def _summaries(group, path: str):
    """``(command path, summary)`` of every command under ``group``: what typer's rich panel prints, its
    short_help or else its docstring's first paragraph."""
    ctx = typer.Context(group)
    for name in group.list_commands(ctx):  # hetplan's lazy group adds its commands here
        sub = group.get_command(ctx, name)
        yield f"{path} {name}", (sub.short_help or (sub.help or "").split("\n\n")[0]).strip()
        if hasattr(sub, "list_commands"):  # a group (typer may vendor its own click)
            yield from _summaries(sub, f"{path} {name}")


def test_catalog_command_summaries_are_one_line():
    """typer's rich panel keeps the line breaks of a command's summary: `hetplan catalog --help` broke
    `prices`, `nodes`, `stacks` and `engines` mid-sentence where their docstrings' source lines ended
    ("the median of" / "each provider's newest ...")."""
    root = typer.main.get_command(app)
    summaries = dict(_summaries(root.get_command(typer.Context(root), "catalog"), "hetplan catalog"))
    assert "hetplan catalog prices" in summaries
    assert [path for path, text in summaries.items() if "\n" in text] == []


def test_node_names_are_whole_at_80_columns():
    """`catalog nodes` cut its names to 'dgx-a100-3…' and 'A100-SXM-4…' at 80 columns: the name is what a
    pool's `node = NAME` takes."""
    r = run_cli("catalog", "nodes", columns=80)
    assert r.code == 0 and "…" not in r.stdout
    assert "dgx-a100-320gb" in r.stdout and "gcp-a3-megagpu-8g" in r.stdout
    assert max(len(line) for line in r.stdout.splitlines()) <= 80


def test_a_gpu_without_a_price_shows_none():
    """GB300 (sold as racks on contract) has price 0 in the catalog, meaning none: `catalog gpus` showed a
    free GPU at 0.00 $/GPU-h, and `catalog prices --gpu GB300` an empty table and 'GB300 0.00'."""
    gpus = run_cli("catalog", "gpus", columns=80)
    row = next(line for line in gpus.stdout.splitlines() if line.startswith("GB300 "))
    assert "0.00" not in row and " none " in row
    prices = run_cli("catalog", "prices", "--gpu", "GB300", columns=80)
    assert prices.code == 0 and "no public quotes for GB300" in prices.stdout and "GB300 none:" in prices.stdout
    assert "$/GPU-h" not in prices.stdout and "0.00" not in prices.stdout
