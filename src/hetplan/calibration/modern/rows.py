"""Reading the published rows of ``validation_data/modern/``: the CSV tables (one layout for every file, see the
README there), their cells, and the facts of the runs the tables leave out (``run_facts.toml``, each with its
evidence). A row the estimator or the plan schema cannot express raises :class:`NotExpressibleError` with the
reason, and is listed, never dropped (:class:`NotExpressible`)."""

from __future__ import annotations

import csv
import functools
import math
from dataclasses import dataclass
from importlib import resources

from hetplan.inputs import parse_toml


class NotExpressibleError(Exception):
    """A row that the estimator or the plan schema cannot express yet; the message is the reason."""


@dataclass
class NotExpressible:
    """A measured row left out of the metrics, with the reason."""

    set: str
    key: str
    reason: str


def _data(name: str):
    return resources.files("hetplan.calibration").joinpath("validation_data", "modern", name)


def read_rows(name: str) -> list[dict]:
    """The rows of the CSV file ``name`` of ``validation_data/modern/``, as dictionaries of text cells."""
    return list(csv.DictReader(_data(name).read_text().splitlines()))


@functools.cache
def run_facts() -> dict:
    """``run_facts.toml`` of ``validation_data/modern/``: per source, the facts of its runs that the tables leave
    out (launch scripts, recipes, write-ups; every entry names its evidence)."""
    return parse_toml(_data("run_facts.toml").read_text(), "validation_data/modern/run_facts.toml")


def fact_table(section: str, name: str) -> dict:
    """The table ``[section.name]`` of :func:`run_facts` without its ``evidence`` (a lookup by row value)."""
    return {k: v for k, v in run_facts()[section][name].items() if k != "evidence"}


def cell_int(r: dict, col: str, default: int | None = None) -> int | None:
    """Cell ``col`` of row ``r`` as an int (a float's integer part), or ``default`` when empty or not a number."""
    v = (r.get(col) or "").strip()
    if not v:
        return default
    try:
        return int(float(v))
    except ValueError:
        return default


def cell_float(r: dict, col: str) -> float | None:
    """Cell ``col`` of row ``r`` as a positive finite float, else None (empty, text or not a measurement)."""
    v = (r.get(col) or "").strip()
    try:
        x = float(v)
    except ValueError:
        return None
    return x if math.isfinite(x) and x > 0 else None
