"""Console for tables: the terminal's width (``COLUMNS`` when set), or 160 columns when the output is a pipe or a
file; and :data:`NARROW`, the width under which tables switch to their compact layout."""

import os

from rich import box
from rich.console import Console
from rich.table import Table

#: Consoles narrower than this get the compact tables (the full ``hetplan plan`` table needs ~130 columns).
NARROW = 130


def table_console() -> Console:
    """A rich Console that does not squeeze wide tables when stdout is not a terminal and ``COLUMNS`` is unset.
    No emoji codes: a name such as ``:fire:`` prints as written (and rich's emoji table is not loaded)."""
    return Console(width=None if Console().is_terminal or os.environ.get("COLUMNS") else 160, emoji=False)


def new_table(title: str, narrow: bool, **kwargs) -> Table:
    """A rich Table: heavy borders, or under ``narrow`` only a rule under the header and one space between
    columns (what fits 80 columns)."""
    return Table(title=title, box=box.SIMPLE_HEAD if narrow else box.HEAVY_HEAD, padding=(0, 0 if narrow else 1),
                 show_edge=not narrow, **kwargs)
