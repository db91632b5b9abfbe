"""Entry point of the ``hetplan`` command.

Each feature lives in its own ``hetplan.cli.<name>`` module exposing ``register(app)``; this module only
assembles them and turns :class:`~hetplan.errors.HetplanError` into a clear message with exit code 2.
"""

from __future__ import annotations

import importlib
import shutil
import sys
import textwrap

import typer
from typer.core import TyperGroup
from rich.console import Console
from rich.markup import escape

from hetplan.errors import HetplanError

# Subcommand modules, each with a ``register(app: typer.Typer) -> None`` function, and the commands each adds.
SUBCOMMAND_MODULES = {
    "hetplan.cli.energy": ("energy",),
    "hetplan.cli.catalog": ("catalog",),
    "hetplan.cli.plan": ("plan",),
    "hetplan.cli.estimate": ("estimate",),
    "hetplan.cli.validate": ("validate",),
    "hetplan.cli.calibrate": ("calibrate",),
    "hetplan.cli.serve": ("serve", "simulate", "capacity"),
    "hetplan.cli.profile": ("profile",),
    "hetplan.cli.runtime": ("run", "export", "import", "verify"),
}


class _LazyGroup(TyperGroup):
    """Imports a subcommand's module only when that command runs (``hetplan energy frontier`` does not import the
    planner's, serving's or the runtime's CLI: 0.56 s saved per call); listing the commands (``--help``) imports
    them all, and a name not in :data:`SUBCOMMAND_MODULES` does too, so the map is a shortcut, never a limit."""

    def _load(self, modules) -> None:
        for module in modules:
            sub = typer.Typer()
            importlib.import_module(module).register(sub)
            for name, cmd in typer.main.get_group(sub).commands.items():
                self.commands.setdefault(name, cmd)

    def list_commands(self, ctx: typer.Context) -> list[str]:
        self._load(SUBCOMMAND_MODULES)
        return super().list_commands(ctx)

    def get_command(self, ctx: typer.Context, cmd_name: str):  # a click Command (typer may vendor click)
        if cmd_name not in self.commands:
            self._load([m for m, names in SUBCOMMAND_MODULES.items() if cmd_name in names] or SUBCOMMAND_MODULES)
        return super().get_command(ctx, cmd_name)


app = typer.Typer(
    name="hetplan",
    help="Plan, price and run large-model training and serving on GPU clusters.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    cls=_LazyGroup,
)


@app.callback()
def _root() -> None:
    # the commands are added by _LazyGroup; with this callback Typer builds a group even before they are
    pass


def error_text(exc: HetplanError, width: int | None) -> str:
    """``error: `` and the error's message and ``fix:`` line, each wrapped at word boundaries to ``width`` columns
    (None: one line each), its continuation lines indented under its text."""
    lines = f"error: {exc.render()}".splitlines()
    if width is None:
        return "\n".join(lines)
    return "\n".join(textwrap.fill(line, max(width, 40), subsequent_indent=" " * (len(line) - len(line.lstrip()) + 2),
                                    break_long_words=False, break_on_hyphens=False) for line in lines)


def main() -> None:
    """Run the CLI; user errors print ``error: ...`` on stderr and exit with code 2. On a terminal the message is
    wrapped at word boundaries to its width (the terminal broke it mid-word); into a file or pipe each line is
    kept whole, for grep and logs."""
    try:
        app()
    except HetplanError as exc:
        if exc.field and exc.field.startswith("inventory.pools."):
            # a job file's pools are its [[inventory]] items, as its Gb/s fields' errors say (inventory.1.x); the
            # model's list (pools) is no key of the file. The plan command names the flags it filled first.
            exc.field = "inventory." + exc.field.removeprefix("inventory.pools.")
        width = shutil.get_terminal_size().columns if sys.stderr.isatty() else None
        text = error_text(exc, width)
        Console(stderr=True).print(f"[bold red]error:[/]{escape(text.removeprefix('error:'))}", highlight=False,
                                   soft_wrap=True)
        sys.exit(2)


if __name__ == "__main__":  # pragma: no cover
    main()
