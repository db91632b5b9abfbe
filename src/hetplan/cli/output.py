"""Console for tables: the terminal's width, or 160 columns when the output is a pipe or a file."""

from rich.console import Console


def table_console() -> Console:
    """A rich Console that does not squeeze wide tables when stdout is not a terminal."""
    return Console(width=None if Console().is_terminal else 160)
