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
from hetplan.hardware.prices import (MAX_AGE_DAYS, SINGLE_MARKET, Quote, choose, default_price, load_quotes,
                                     newest_date, parse_date)

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
    # the catalog price is the default rule's: median of each provider's newest on-demand quote (RunPod 2.79, GCP
    # 3.00, Lambda 3.78, AWS 3.90, Modal 3.9492, CoreWeave 6.16) = (3.78 + 3.90) / 2, not AWS's pre-cut 12.29
    assert p.usd_per_gpu_hour == h100.price_usd_per_hour == 3.84 and not p.stale
    # on-demand: newest quote per provider, then the cheapest provider
    p = choose(h100, "on_demand", today=today)
    assert (p.usd_per_gpu_hour, p.label, p.date, p.stale) == (2.79, "runpod on-demand (secure cloud)", "2026-04", False)
    # AWS has two on-demand quotes: the newest (2026-03, 3.90), not January's 10.08
    assert choose(h100, "on_demand", "aws", today=today).usd_per_gpu_hour == 3.90
    assert choose(h100, "spot", today=today).usd_per_gpu_hour == 1.52
    assert choose(h100, "committed", "lambda", today=today).usd_per_gpu_hour == 1.85
    assert choose(t4, "spot", today=today).label.startswith("catalog")  # no quote: the catalog's price
    assert choose(h100, "on_demand", today=dt.date(2027, 6, 1)).stale  # 426 days after 2026-04-01
    with pytest.raises(HetplanError, match="no quotes from provider"):
        choose(h100, "on_demand", "nobody")
    with pytest.raises(HetplanError, match="unknown price source"):
        choose(h100, "reserved")


#: Providers that are hyperscalers; every other provider of a quote is a GPU cloud.
HYPERSCALERS = {"aws", "gcp", "azure", "oracle"}


def test_default_prices_follow_the_stated_rule_and_cover_both_markets():
    """gpus.toml's price of every GPU type with on-demand quotes is default_price (as of the day it was computed);
    every type has a hyperscaler and a GPU-cloud on-demand quote within 12 months, or is listed in SINGLE_MARKET
    with the reason (and a listed type that gains both must leave the list)."""
    cat = load_catalog()
    as_of = dt.date(2026, 11, 28)
    for spec in cat.gpus.values():
        d = default_price(spec.name, today=as_of)
        if d is not None:
            assert spec.price_usd_per_hour == pytest.approx(d.usd_per_gpu_hour), spec.name
            assert spec.price_date == d.date, spec.name
        fresh = [q for q in load_quotes() if q.gpu == spec.name and q.kind == "on_demand"
                 and (as_of - q.as_of()).days <= MAX_AGE_DAYS]
        both = {q.provider in HYPERSCALERS for q in fresh} == {True, False}
        assert both != (spec.name in SINGLE_MARKET), spec.name
    assert set(SINGLE_MARKET) <= set(cat.gpus)


def test_median_rule_worked_example():
    q = [Quote(gpu="T4", provider=p, region="r", kind="on_demand", usd_per_gpu_hour=v, date=d, source="s")
         for p, v, d in (("a", 1.0, "2026-01"), ("a", 9.0, "2026-02"), ("b", 2.0, "2026-02"), ("c", 3.0, "2024-01"))]
    d = default_price("T4", q, dt.date(2026, 6, 1))  # a's newest (9.0), b 2.0; c is stale and dropped
    assert d.usd_per_gpu_hour == 5.5 and d.date == "2026-02" and not d.stale
    d = default_price("T4", q[3:], dt.date(2026, 6, 1))  # only a stale quote: used, and flagged
    assert d.usd_per_gpu_hour == 3.0 and d.stale


def test_prices_file_overrides_plan_and_estimate(tmp_path):
    f = tmp_path / "p.toml"
    f.write_text('[[quote]]\ngpu = "h100"\nprovider = "mine"\nregion = "x"\nkind = "on_demand"\n'
                 'usd_per_gpu_hour = 1.25\ndate = "2026-11"\nsource = "our contract"\n')
    job = ["plan", "--model", "gpt3-1.3b", "--seq-len", "2048", "--global-batch", "64", "--iterations", "100",
           "--gpu", "H100-SXM", "--gpus", "8", "--top", "1", "--json", "--prices", str(f)]
    r = _cli(*job)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    (line,) = out["prices"]
    assert line["usd_per_gpu_hour"] == 1.25 and str(f) in line["from"]
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(out["plans"][0]["plan"]))
    r = _cli("estimate", str(plan), "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["prices"][0]["usd_per_gpu_hour"] == 1.25  # the plan's price
    f2 = tmp_path / "q.toml"
    f2.write_text(f.read_text().replace("1.25", "2.5"))
    r = _cli("estimate", str(plan), "--json", "--prices", str(f2))
    assert r.returncode == 0 and json.loads(r.stdout)["prices"][0]["usd_per_gpu_hour"] == 2.5  # re-priced
    for text, field in (('[[quote]]\ngpu = "nope"\nprovider = "m"\nregion = "x"\nkind = "on_demand"\n'
                         'usd_per_gpu_hour = 1\ndate = "2026-11"\nsource = "s"\n', "--prices.quote.0.gpu"),
                        ('[[quote]]\ngpu = "T4"\n', "--prices.quote.0"), ("x = 1\n", "--prices")):
        f.write_text(text)
        r = _cli(*job)
        assert r.returncode == 2 and field in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_catalog_prices_lists_dated_quotes_at_80_columns():
    r = subprocess.run([sys.executable, "-m", "hetplan.cli.main", "catalog", "prices"], capture_output=True,
                       text=True, cwd=ROOT, env=dict(os.environ, COLUMNS="80"))
    assert r.returncode == 0, r.stderr
    assert max(len(line.rstrip()) for line in r.stdout.splitlines()) <= 80
    assert "H100-SXM 3.84: median of 6 on-demand quotes" in " ".join(r.stdout.split())
    assert "2026-05-07 *" in r.stdout


def test_a_2026_price_is_not_older_than_365_days_on_2026_11_24():
    """The plan output said "A10G 1.01 catalog (...), 2026 (older than 365 days)" on 2026-11-24: a year-only or
    free-text date was unreadable and so called stale. Its age now counts from the newest day it can mean."""
    cat = load_catalog()
    today = dt.date(2026, 11, 24)
    a10g = cat.get("A10G")
    assert a10g.price_date == "2026-01" and not choose(a10g, "catalog", today=today).stale
    assert choose(a10g, "catalog", today=dt.date(2027, 3, 1)).stale  # 394 days after 2026-01-31
    assert newest_date("2026") == dt.date(2026, 12, 31) and newest_date("2024-2025") == dt.date(2025, 12, 31)
    assert newest_date("late 2024") == newest_date("2018-2024") == dt.date(2024, 12, 31)
    assert newest_date("2026-04") == dt.date(2026, 4, 30) and newest_date("2026-02-03") == dt.date(2026, 2, 3)
    assert newest_date("2023 to 2025-05 (before June 2025)") == dt.date(2025, 6, 30)
    assert newest_date("unknown") is None and newest_date("2026-13") is None
    # a price from before AWS's June 2025 cut is older than 365 days on 2026-11-24; one from "2024-2025" may not be
    assert choose(cat.get("V100-SXM-32GB"), "catalog", today=today).stale  # "2018-2024"
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
    assert "Prices $/GPU-h: B200" in r.stdout and "packet.ai on-demand" in r.stdout  # the cheapest on-demand
    r = _cli(*job[:-6], "--gpu", "H100-SXM", "--gpus", "8", "--top", "1", "--price-source", "spot", "--json")
    (line,) = json.loads(r.stdout)["prices"]
    assert (line["gpu"], line["usd_per_gpu_hour"], line["date"], line["from"]) == (
        "H100-SXM", 1.52, "2026-04", "vast.ai spot (marketplace)")
    r = _cli(*job, "--provider", "nobody", "--price-source", "spot")
    assert r.returncode == 2 and "--provider" in r.stderr
