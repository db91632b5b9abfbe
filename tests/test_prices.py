"""Prices as dated, multi-source data (hetplan.hardware.prices) and the provenance the plan output shows."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hetplan.errors import HetplanError
from hetplan.hardware.catalog import load_catalog
from hetplan.hardware.prices import MAX_AGE_DAYS, Quote, choose, load_quotes, newest_date, parse_date

ROOT = Path(__file__).parents[1]


def test_shipped_quotes_are_fresh():
    """Fails once a shipped quote is older than MAX_AGE_DAYS: refresh hetplan/hardware/data/prices.toml."""
    today = dt.date.today()
    old = [(q.gpu, q.provider, q.kind, q.date) for q in load_quotes() if (today - q.as_of()).days > MAX_AGE_DAYS]
    future = [(q.gpu, q.provider, q.date) for q in load_quotes() if q.as_of() > today]
    assert not old, f"prices older than {MAX_AGE_DAYS} days: {old}"
    assert not future, future


def test_quotes_are_multi_source_and_name_catalog_gpus():
    quotes = load_quotes()
    cat = load_catalog()
    assert all(q.gpu in cat.gpus and q.source for q in quotes)
    h100 = [q for q in quotes if q.gpu == "H100-SXM"]
    assert {q.kind for q in h100} == {"on_demand", "spot", "committed"}
    assert len({q.provider for q in h100 if q.kind == "on_demand"}) >= 4


def test_choose():
    cat = load_catalog()
    h100, t4 = cat.get("H100-SXM"), cat.get("T4")
    today = dt.date(2026, 11, 23)
    p = choose(h100, "catalog", today=today)
    assert p.usd_per_gpu_hour == h100.price_usd_per_hour and p.stale  # "2023 to 2025-05 (before June 2025 ...)"
    # on-demand: newest quote per provider, then the cheapest provider: RunPod 2.79 < Lambda 2.99 < GCP 3.00 <
    # CoreWeave 6.16 < AWS 12.29
    p = choose(h100, "on_demand", today=today)
    assert (p.usd_per_gpu_hour, p.label, p.date, p.stale) == (2.79, "runpod on-demand (secure cloud)", "2026-04", False)
    # AWS has three on-demand quotes; the two dated 2026-03 disagree (3.90, 12.29): the higher one, not understated
    assert choose(h100, "on_demand", "aws", today=today).usd_per_gpu_hour == 12.29
    assert choose(h100, "spot", today=today).usd_per_gpu_hour == 1.52
    assert choose(h100, "committed", "lambda", today=today).usd_per_gpu_hour == 1.85
    assert choose(t4, "spot", today=today).label.startswith("catalog")  # no quote: the catalog's price
    assert choose(h100, "on_demand", today=dt.date(2027, 6, 1)).stale  # 426 days after 2026-04-01
    with pytest.raises(HetplanError, match="no quotes from provider"):
        choose(h100, "on_demand", "oracle")
    with pytest.raises(HetplanError, match="unknown price source"):
        choose(h100, "reserved")


def test_a_2026_price_is_not_older_than_365_days_on_2026_11_24():
    """The plan output said "A10G 1.01 catalog (...), 2026 (older than 365 days)" on 2026-11-24: a year-only or
    free-text date was unreadable and so called stale. Its age now counts from the newest day it can mean."""
    cat = load_catalog()
    today = dt.date(2026, 11, 24)
    a10g = cat.get("A10G")
    assert a10g.price_date == "2026" and not choose(a10g, "catalog", today=today).stale
    assert choose(a10g, "catalog", today=dt.date(2028, 1, 1)).stale  # 366 days after 2026-12-31
    assert newest_date("2026") == dt.date(2026, 12, 31) and newest_date("2024-2025") == dt.date(2025, 12, 31)
    assert newest_date("late 2024") == newest_date("2018-2024") == dt.date(2024, 12, 31)
    assert newest_date("2026-04") == dt.date(2026, 4, 30) and newest_date("2026-02-03") == dt.date(2026, 2, 3)
    assert newest_date("2023 to 2025-05 (before June 2025)") == dt.date(2025, 6, 30)
    assert newest_date("unknown") is None and newest_date("2026-13") is None
    # a price from before AWS's June 2025 cut is older than 365 days on 2026-11-24; one from "2024-2025" may not be
    assert choose(cat.get("H100-SXM"), "catalog", today=today).stale
    assert (today - newest_date("2024-2025")).days <= MAX_AGE_DAYS < (today - newest_date("2024")).days


def test_dates_and_quote_validation():
    assert parse_date("2026-03") == dt.date(2026, 3, 1) and parse_date("2026-01-15") == dt.date(2026, 1, 15)
    assert parse_date("2023-2025 (before the cut)") is None and parse_date("2024") is None
    with pytest.raises(ValueError):
        Quote(gpu="T4", provider="x", region="y", kind="on_demand", usd_per_gpu_hour=float("inf"), date="2026-01",
              source="s")
    with pytest.raises(ValueError):
        Quote(gpu="T4", provider="x", region="y", kind="on_demand", usd_per_gpu_hour=1.0, date="late 2024", source="s")


def test_calibrated_flag_matches_the_calibration_source():
    cat = load_catalog()
    for spec in cat.gpus.values():
        assert spec.calibrated == ("fitted by" in spec.calibration_source and not spec.calibration_source.startswith(
            "not ")), spec.name
    assert cat.get("A100-SXM-80GB").calibrated and not cat.get("B200").calibrated


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "hetplan.cli.main", *args], capture_output=True, text=True, cwd=ROOT,
                          env=dict(os.environ, COLUMNS="200"))


def test_plan_output_shows_price_date_and_uncalibrated_gpu():
    job = ["plan", "--model", "gpt3-1.3b", "--seq-len", "2048", "--global-batch", "64", "--iterations", "100",
           "--gpu", "B200", "--gpus", "8", "--top", "1"]
    r = _cli(*job, "--price-source", "on-demand")
    assert r.returncode == 0, r.stderr
    assert "8x B200*" in r.stdout and "* uncalibrated: the compute efficiency of B200" in r.stdout
    assert "Prices $/GPU-h: B200" in r.stdout and "catalog" in r.stdout  # no B200 quote: the catalog's, with date
    r = _cli(*job[:-6], "--gpu", "H100-SXM", "--gpus", "8", "--top", "1", "--price-source", "spot", "--json")
    (line,) = json.loads(r.stdout)["prices"]
    assert (line["gpu"], line["usd_per_gpu_hour"], line["date"], line["from"]) == (
        "H100-SXM", 1.52, "2026-04", "vast.ai spot (marketplace)")
    r = _cli(*job, "--provider", "nobody", "--price-source", "spot")
    assert r.returncode == 2 and "--provider" in r.stderr
