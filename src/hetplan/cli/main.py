"""Entry point of the ``hetplan`` command.

Each feature lives in its own ``hetplan.cli.<name>`` module exposing ``register(app)``; this module only
assembles them and turns :class:`~hetplan.errors.HetplanError` into a clear message with exit code 2.
"""

from __future__ import annotations

import importlib
import sys

import typer
from rich.console import Console
from rich.markup import escape

from hetplan.errors import HetplanError

app = typer.Typer(
    name="hetplan",
    help="Plan, price and run large-model training and serving on GPU clusters.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)

# Subcommand modules, each with a ``register(app: typer.Typer) -> None`` function.
SUBCOMMAND_MODULES = [
    "hetplan.cli.energy",
    "hetplan.cli.catalog",
    "hetplan.cli.plan",
    "hetplan.cli.validate",
    "hetplan.cli.serve",
    "hetplan.cli.profile",
    "hetplan.cli.runtime",
]

for _name in SUBCOMMAND_MODULES:
    importlib.import_module(_name).register(app)


def main() -> None:
    """Run the CLI; user errors print ``error: ...`` on stderr and exit with code 2."""
    try:
        app()
    except HetplanError as exc:
        Console(stderr=True).print(f"[bold red]error:[/] {escape(exc.render())}", highlight=False, soft_wrap=True)
        sys.exit(2)


if __name__ == "__main__":  # pragma: no cover
    main()
