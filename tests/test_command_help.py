"""The commands panel of `hetplan ... --help` on an 80-column terminal."""

import typer

from hetplan.cli.main import app


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
