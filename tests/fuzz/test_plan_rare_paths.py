"""Audit of `hetplan plan`'s less-travelled paths (--baseline, --search fine --explain, --profile-db, prices,
mixed-recompute plans): each test is a wrong answer or a silently accepted input found there."""

from __future__ import annotations

import json

import pytest

from tests.fuzz.inproc import run_cli

PLAN = ["plan", "--model", "llama2-7b", "--gpu", "H100-SXM", "--gpus", "16", "--seq-len", "4096", "--global-batch",
        "64", "--iterations", "10"]


def test_baseline_is_priced_as_the_search_and_estimate_price_it(tmp_path):
    """A baseline without prices (as `hetplan import` writes one) was priced at the catalog's $3.84/GPU-h while
    the search ran at --price-source spot ($1.52): the best plan, the baseline itself, 'cost 40 % of it per job'.
    It is now priced as `hetplan estimate BASELINE --price-source spot` prices it."""
    best = tmp_path / "best.json"
    assert run_cli(*PLAN, "-q", "-o", best).code == 0
    raw = json.loads(best.read_text())
    for pool in raw["pools"]:
        pool.pop("price_usd_per_hour")
    mine = tmp_path / "mine.json"
    mine.write_text(json.dumps(raw))
    for base in (best, mine):  # one written at catalog prices, one without prices
        r = run_cli(*PLAN, "--price-source", "spot", "--json", "--top", "1", "--baseline", base)
        assert r.code == 0, r.stderr
        out = json.loads(r.stdout)
        assert out["prices"][0]["from"] != "given"  # a quote, not the catalog
        assert out["baseline"]["summary"]["usd_per_hour"] == pytest.approx(out["plans"][0]["usd_per_hour"])
        assert out["baseline"]["usd_ratio"] == pytest.approx(1.0)
        est = run_cli("estimate", base, "--price-source", "spot", "--json")
        assert est.code == 0, est.stderr
        assert json.loads(est.stdout)["job_usd"] == pytest.approx(out["baseline"]["summary"]["job_usd"])
