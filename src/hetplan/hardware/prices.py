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
from hetplan.inputs import bounded

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
    # the bound every other price field has (GPUSpec, GPUPool, capacity.prices): a user quote of 1e30 $/h was
    # taken into the median (fuzz)
    usd_per_gpu_hour: float = bounded(1000.0, "no GPU rents for $1,000 an hour", gt=0, allow_inf_nan=False)
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


@lru_cache(maxsize=8)
def load_quotes(user_file: str | None = None) -> tuple[Quote, ...]:
    """Every quote shipped in ``data/prices.toml``; with ``user_file`` (``--prices FILE``, the same
    ``[[quote]]`` layout) the user's quotes replace the shipped ones of every GPU type the file names.

    Raises:
        HetplanError: an unreadable or malformed ``user_file``, or a quote in it with a bad field (named)."""
    raw = tomllib.loads(resources.files("hetplan.hardware").joinpath("data/prices.toml").read_text())
    try:
        shipped = tuple(Quote(**q) for q in raw.get("quote", []))
    except ValidationError as exc:  # pragma: no cover - the shipped file is tested
        raise HetplanError(f"bad price quote: {exc.errors()[0]['msg']}", field="prices.toml") from None
    if user_file is None:
        return shipped
    mine = user_quotes(user_file)
    named = {q.gpu for q in mine}
    return tuple(q for q in shipped if q.gpu not in named) + mine


@lru_cache(maxsize=8)
def user_quotes(user_file: str) -> tuple[Quote, ...]:
    """The quotes of a ``--prices`` file (module doc of :func:`load_quotes`), GPU names made canonical.

    Raises:
        HetplanError: as :func:`load_quotes`."""
    from hetplan.hardware.catalog import load_catalog
    from hetplan.inputs import parse_toml, read_text, validation_message

    data = parse_toml(read_text(user_file, "--prices"), user_file, "--prices")
    extra = set(data) - {"quote", "meta"}
    entries = data.get("quote")
    if extra or not isinstance(entries, list) or not entries:
        raise HetplanError(f"{user_file} has no [[quote]] tables" + (f" (unknown: {sorted(extra)})" if extra else ""),
                           field="--prices", fix="write one [[quote]] table per price: gpu, provider, region, kind, "
                                                 "usd_per_gpu_hour, date (YYYY-MM), source")
    mine = []
    for i, q in enumerate(entries):
        if not isinstance(q, dict):
            raise HetplanError("must be a table", field=f"--prices.quote.{i}", fix="write [[quote]] tables")
        try:
            mine.append(Quote(**q))
        except (ValidationError, TypeError) as exc:
            if isinstance(exc, ValidationError):
                raise validation_message(exc, f"--prices.quote.{i}", Quote) from None
            raise HetplanError(str(exc), field=f"--prices.quote.{i}", fix="check the quote's fields") from None
    catalog = load_catalog()
    for i, q in enumerate(mine):  # a quote for a GPU the catalog does not know would price nothing
        canonical = catalog.get(q.gpu, field=f"--prices.quote.{i}.gpu").name
        if canonical != q.gpu:
            mine[i] = q.model_copy(update={"gpu": canonical})
    return tuple(mine)


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


#: GPU types whose on-demand quotes do not cover both a hyperscaler and a GPU cloud within :data:`MAX_AGE_DAYS`
#: (``data/prices.toml``), and why; their default rests on what there is and says so (tests/test_prices.py keeps
#: this list exact).
SINGLE_MARKET = {
    "H100-SXM-96GB-500W": "Meta's own fleet (Llama 3), not rented publicly",
    "GB200": "sold as NVL72 racks on contract; one GPU cloud lists an on-demand Superchip, no hyperscaler does",
    "GB300": "sold as NVL72 racks on contract; no dated public on-demand quote found by 2026-11",
    "A100-SXM-80GB": "no dated 2026 hyperscaler on-demand quote found (AWS p4de 2024 only)",
    "A100-PCIE-40GB": "no dated public quote since 2025",
    "A100-PCIE-80GB": "one GPU cloud only",
    "V100-SXM-32GB": "retired by the hyperscalers' current lists; no dated 2026 quote found",
    "V100-PCIE-32GB": "retired; no dated 2026 quote found",
    "T4": "GPU clouds only in 2026 sources (AWS g4dn undated)",
    "A10": "one GPU cloud only (Lambda)",
    "A10G": "an AWS-only part (g5 instances)",
    "A40": "no dated public quote since 2025",
    "RTX-A6000": "no dated public quote since 2024",
    "RTX-A4000": "no dated public quote since 2025",
    "A30": "no public on-demand quote found",
    "RTX-3090": "a GeForce card: NVIDIA's GeForce licence bars data-center use, so no hyperscaler rents it",
    "RTX-4090": "a GeForce card: no hyperscaler rents it",
    "L40S": "GPU clouds only in 2026 sources (AWS g6e 2024 only)",
}


def newest_per_provider(quotes) -> list[Quote]:
    """Each provider's newest quote (of two on one date, the higher, so cost is not understated)."""
    newest: dict[str, Quote] = {}
    for q in quotes:
        have = newest.get(q.provider)
        if have is None or (q.as_of(), q.usd_per_gpu_hour) > (have.as_of(), have.usd_per_gpu_hour):
            newest[q.provider] = q
    return sorted(newest.values(), key=lambda q: (q.usd_per_gpu_hour, q.provider))


def default_price(gpu_name: str, quotes=None, today: dt.date | None = None) -> Price | None:
    """The default price of GPU type ``gpu_name`` by the stated rule (``data/prices.toml`` header): each
    provider's newest on-demand quote, those older than :data:`MAX_AGE_DAYS` dropped when a newer one exists, the
    median of the rest (of an even count, the mean of the middle two). None when the type has no on-demand quote.
    ``date`` is the newest quote's, ``stale`` whether even that is older than :data:`MAX_AGE_DAYS`."""
    import statistics

    today = today or dt.date.today()
    mine = newest_per_provider(q for q in (quotes if quotes is not None else load_quotes())
                               if q.gpu == gpu_name and q.kind == "on_demand")
    if not mine:
        return None
    fresh = [q for q in mine if not _stale(q.date, today)]
    used = fresh or mine
    newest = max(used, key=lambda q: q.as_of())
    providers = ", ".join(f"{q.provider} {q.usd_per_gpu_hour:g}" for q in used)
    return Price(round(statistics.median(q.usd_per_gpu_hour for q in used), 4),
                 f"median of {len(used)} on-demand quote{'s' if len(used) > 1 else ''} ({providers})",
                 newest.date, not fresh, "hetplan/hardware/data/prices.toml (the default rule in its header)")


def check_price_options(source: str = "catalog", provider: str | None = None,
                        prices_file: str | None = None) -> tuple[Quote, ...]:
    """The quotes :func:`choose` picks from, once ``source``, ``provider`` and ``prices_file`` are checked — also
    where every pool gives its own price and nothing is chosen (``--price-source bogus``, ``--provider nosuch``
    and a ``--prices`` file that does not exist exited 0 there).

    Raises:
        HetplanError: as :func:`choose`."""
    if source not in SOURCES:
        raise HetplanError(f"unknown price source {source!r}", field="--price-source",
                           fix=f"use one of {', '.join(s.replace('_', '-') for s in SOURCES)}")
    if provider is not None and source == "catalog":  # the catalog's one price has no provider to pick
        raise HetplanError(f"--provider {provider} picks among dated quotes, but the price source is the catalog",
                           field="--provider", fix="add --price-source on-demand (or spot, committed), or drop "
                                                   "--provider")
    quotes = load_quotes(prices_file)
    if provider is not None and provider.lower() not in {q.provider for q in quotes}:
        raise HetplanError(f"no quotes from provider {provider!r}", field="--provider",
                           fix=f"use one of {', '.join(sorted({q.provider for q in quotes}))}")
    return quotes


def choose(gpu, source: str = "catalog", provider: str | None = None, today: dt.date | None = None,
           prices_file: str | None = None) -> Price:
    """The price of one GPU (a catalog :class:`~hetplan.hardware.catalog.GPUSpec`) under ``source`` and
    ``provider`` (see module doc).

    Raises:
        HetplanError: unknown ``source``, a ``provider`` that has no quote at all, or one with the catalog source.
    """
    today = today or dt.date.today()
    quotes = check_price_options(source, provider, prices_file)
    catalog = Price(gpu.price_usd_per_hour, f"catalog ({gpu.price_provider})", gpu.price_date,
                    _stale(gpu.price_date, today), gpu.price_source)
    if source == "catalog":
        if prices_file is not None and gpu.name in {q.gpu for q in user_quotes(prices_file)}:
            mine = default_price(gpu.name, quotes, today)
            if mine is not None:  # the user's on-demand quotes, by the same rule
                return Price(mine.usd_per_gpu_hour, f"{mine.label} from {prices_file}", mine.date, mine.stale,
                             f"{prices_file} (--prices)")
        return catalog
    mine = [q for q in quotes if q.gpu == gpu.name and q.kind == source
            and (provider is None or q.provider == provider.lower())]
    if not mine:
        return catalog
    best = newest_per_provider(mine)[0]  # the cheapest provider's newest quote
    return Price(best.usd_per_gpu_hour, f"{best.provider} {best.kind.replace('_', '-')} ({best.region})", best.date,
                 _stale(best.date, today), best.source)
