"""GPU prices as dated, multi-source data (``data/prices.toml``), and the choice of the price a plan is costed at.

A :class:`Quote` is one provider's $/GPU-hour for one GPU, kind (``on_demand``, ``spot``, ``committed``) and region,
with the date and the source it comes from. :func:`choose` picks the price of a pool's GPU:

* ``source="catalog"`` (the CLI default): the catalog's price (``gpus.toml``), with its date;
* ``source="on_demand" | "spot" | "committed"``: among the quotes of that kind for the GPU — of ``provider`` when
  given — the newest quote of each provider (the highest of several from one date), then the cheapest of those; a GPU without such a quote keeps its
  catalog price, and the returned :class:`Price` says so.

Every :class:`Price` says where it comes from and whether it is older than :data:`MAX_AGE_DAYS` (``stale``), so
the plan output can show the date next to the money. A date may be free text (the catalog's ``"2026"``,
``"2024-2025"``, ``"2023 to 2025-05 (before ...)"``): its age is counted from the newest day the text can mean
(:func:`newest_date`), so a price is called older than :data:`MAX_AGE_DAYS` only when it certainly is. ``tests/test_prices.py`` fails once a shipped quote is older
than :data:`MAX_AGE_DAYS`, so the file gets refreshed.
"""

from __future__ import annotations

import calendar
import datetime as dt
import re
import sys
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from hetplan.errors import HetplanError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

#: Price sources of ``--price-source``.
SOURCES = ("catalog", "on_demand", "spot", "committed")
#: A price older than this many days is flagged stale (and a shipped quote that old fails the tests).
MAX_AGE_DAYS = 365


class Quote(BaseModel):
    """One dated price: ``usd_per_gpu_hour`` for ``gpu`` at ``provider`` / ``region``, of ``kind``, as of ``date``
    (``YYYY-MM`` or ``YYYY-MM-DD``), from ``source``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    gpu: str
    provider: str
    region: str
    kind: Literal["on_demand", "spot", "committed"]
    usd_per_gpu_hour: float = Field(gt=0, allow_inf_nan=False)
    date: str = Field(pattern=r"^\d{4}-\d{2}(-\d{2})?$")
    source: str

    def as_of(self) -> dt.date:
        """The quote's date (the first of the month when only a month is given)."""
        return parse_date(self.date)


def parse_date(text: str) -> dt.date | None:
    """``YYYY-MM-DD`` or ``YYYY-MM`` (first of the month) as a date; None for anything else (e.g. ``"2023-2025"``)."""
    parts = text.strip().split("-")
    try:
        if len(parts) == 3:
            return dt.date(int(parts[0]), int(parts[1]), int(parts[2]))
        if len(parts) == 2 and len(parts[1]) == 2:
            return dt.date(int(parts[0]), int(parts[1]), 1)
    except ValueError:
        return None
    return None


_MONTHS = {name.lower(): i for i, name in enumerate(calendar.month_name) if name}
_DAY = re.compile(r"(?<!\d)(\d{4})-(\d{2})-(\d{2})(?!\d)")
_MONTH = re.compile(r"(?<![\d-])(\d{4})-(\d{2})(?![\d-])")
_NAMED_MONTH = re.compile(r"\b(" + "|".join(_MONTHS) + r")\s+(\d{4})\b", re.IGNORECASE)
_YEAR = re.compile(r"(?<!\d)((?:19|20)\d{2})(?!\d)")


def newest_date(text: str) -> dt.date | None:
    """The newest day a free-text date can mean: the latest of the days (``2026-03-15``), months (``2026-03``,
    ``June 2025``: their last day) and years (``2026``, ``2024-2025``, ``late 2024``: 31 December) it names;
    None when it names none."""
    found: list[dt.date] = []
    try:
        found += [dt.date(int(y), int(m), int(d)) for y, m, d in _DAY.findall(text)]
        months = [(int(y), int(m)) for y, m in _MONTH.findall(_DAY.sub(" ", text))]
        months += [(int(y), _MONTHS[name.lower()]) for name, y in _NAMED_MONTH.findall(text)]
    except ValueError:
        return None
    found += [dt.date(y, m, calendar.monthrange(y, m)[1]) for y, m in months if 1 <= m <= 12]
    rest = _NAMED_MONTH.sub(" ", _MONTH.sub(" ", _DAY.sub(" ", text)))
    found += [dt.date(int(y), 12, 31) for y in _YEAR.findall(rest)]
    return max(found, default=None)


@lru_cache(maxsize=1)
def load_quotes() -> tuple[Quote, ...]:
    """Every quote shipped in ``data/prices.toml``."""
    raw = tomllib.loads(resources.files("hetplan.hardware").joinpath("data/prices.toml").read_text())
    try:
        return tuple(Quote(**q) for q in raw.get("quote", []))
    except ValidationError as exc:  # pragma: no cover - the shipped file is tested
        raise HetplanError(f"bad price quote: {exc.errors()[0]['msg']}", field="prices.toml") from None


@dataclass(frozen=True)
class Price:
    """The price a pool is costed at: ``usd_per_gpu_hour``, and where it comes from (``label``: provider, kind,
    region or "catalog"), its ``date`` text, whether it is older than :data:`MAX_AGE_DAYS` (``stale``: even at the
    newest day the date can mean, :func:`newest_date`; also when it names no date), and its ``source``."""

    usd_per_gpu_hour: float
    label: str
    date: str
    stale: bool
    source: str


def _stale(date_text: str, today: dt.date) -> bool:
    """Older than :data:`MAX_AGE_DAYS` on ``today`` even at the newest day ``date_text`` can mean (also when it
    names no date)."""
    d = newest_date(date_text)
    return d is None or (today - d).days > MAX_AGE_DAYS


def choose(gpu, source: str = "catalog", provider: str | None = None, today: dt.date | None = None) -> Price:
    """The price of one GPU (a catalog :class:`~hetplan.hardware.catalog.GPUSpec`) under ``source`` and
    ``provider`` (see module doc).

    Raises:
        HetplanError: unknown ``source``, or a ``provider`` that has no quote at all.
    """
    today = today or dt.date.today()
    if source not in SOURCES:
        raise HetplanError(f"unknown price source {source!r}", field="--price-source",
                           fix=f"use one of {', '.join(s.replace('_', '-') for s in SOURCES)}")
    quotes = load_quotes()
    if provider is not None and provider.lower() not in {q.provider for q in quotes}:
        raise HetplanError(f"no quotes from provider {provider!r}", field="--provider",
                           fix=f"use one of {', '.join(sorted({q.provider for q in quotes}))}")
    catalog = Price(gpu.price_usd_per_hour, f"catalog ({gpu.price_provider})", gpu.price_date,
                    _stale(gpu.price_date, today), gpu.price_source)
    if source == "catalog":
        return catalog
    mine = [q for q in quotes if q.gpu == gpu.name and q.kind == source
            and (provider is None or q.provider == provider.lower())]
    if not mine:
        return catalog
    # per provider its newest quote (sources of one date that disagree: the highest, so cost is not understated)
    newest: dict[str, Quote] = {}
    for q in mine:
        have = newest.get(q.provider)
        if have is None or (q.as_of(), q.usd_per_gpu_hour) > (have.as_of(), have.usd_per_gpu_hour):
            newest[q.provider] = q
    best = min(newest.values(), key=lambda q: (q.usd_per_gpu_hour, q.provider))
    return Price(best.usd_per_gpu_hour, f"{best.provider} {best.kind.replace('_', '-')} ({best.region})", best.date,
                 _stale(best.date, today), best.source)
