"""The torch profiler on this host (CPU in CI): real timings into a real SQLite file, resumable; collectives over gloo."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from hetplan.errors import HetplanError
from hetplan.model.spec import load_model
from hetplan.profile.db import ProfileDB
from hetplan.profile.profiler import profile_collectives, profile_layers

TINY = Path(__file__).parents[2] / "examples" / "tiny-model.json"


def test_profile_layers_resumable(tmp_path):
    m = load_model(TINY)
    path = tmp_path / "prof.db"
    seen = []
    with ProfileDB(path) as db:
        out = profile_layers(db, m, dtypes=["fp32"], mbs=[1, 2], seq_lens=[32], tps=[1], repeats=3, threads=1,
                             progress=lambda done, total, p: seen.append((done, total)))
        assert out["measured"] == 6 and out["skipped"] == 0 and out["device"] == "cpu"
        assert seen[-1] == (6, 6)
    with ProfileDB(path) as db:  # reopen the file: nothing left to measure
        again = profile_layers(db, m, dtypes=["fp32"], mbs=[1, 2, 4], seq_lens=[32], tps=[1], repeats=3, threads=1)
        assert again["measured"] == 3 and again["skipped"] == 6
        rows = list(db.layer_rows())
        assert len(rows) == 9 and all(r["forward_s"] > 0 and r["backward_s"] > 0 for r in rows)
        layer = {r["mbs"]: r for r in rows if r["kind"] == "layer"}
        params = 4 * (4 * 128 * 128 + 3 * 128 * 512 + 2 * 128)  # fp32 bytes of one tiny layer
        assert all(r["peak_memory_bytes"] > params for r in layer.values())
        # Saved activations grow with the micro-batch.
        assert layer[4]["peak_memory_bytes"] > layer[1]["peak_memory_bytes"]
        assert db.layer_time_s("cpu", m, "fp32", 3, 32, 1) is not None  # interpolated between mbs 2 and 4


def test_profile_tp2_layer_and_collectives(tmp_path):
    m = load_model(TINY)
    with ProfileDB(tmp_path / "prof.db") as db:
        out = profile_layers(db, m, dtypes=["fp32"], mbs=[1], seq_lens=[32], tps=[2], kinds=["layer"], repeats=3)
        assert out["measured"] == 1
        (row,) = list(db.layer_rows())
        assert row["tp"] == 2 and row["forward_s"] > 0
        res = profile_collectives(db, world_size=2, sizes_bytes=[2**16, 2**20], collectives=["all-reduce", "send-recv"],
                                  repeats=3)
        assert res["backend"] == "gloo" and res["measured"] == 4
        rows = db.comm_rows()
        assert {r["collective"] for r in rows} == {"all-reduce", "send-recv"}
        assert all(r["time_s"] > 0 and r["bandwidth_bytes_per_s"] > 0 for r in rows)


def test_bad_profile_arguments():
    m = load_model(TINY)
    with pytest.raises(HetplanError, match="does not divide"):
        profile_layers(ProfileDB(), m, dtypes=["fp32"], tps=[3])
    with pytest.raises(HetplanError, match="unknown dtype"):
        profile_layers(ProfileDB(), m, dtypes=["int4"])


def test_profile_refuses_sequences_beyond_the_model_and_huge_micro_batches():
    """--seq-len 100000 on the 512-position tiny model, or --mbs 100000, ran for minutes (killed at 120 s) timing
    points no plan can use (plans refuse both); now refused before any timing, naming the option."""
    m = load_model(TINY)
    with pytest.raises(HetplanError, match="longer than") as err:
        profile_layers(ProfileDB(), m, dtypes=["fp32"], mbs=[1], seq_lens=[100_000])
    assert err.value.field == "--seq-len" and "512" in err.value.fix
    with pytest.raises(HetplanError, match="65,536") as err:
        profile_layers(ProfileDB(), m, dtypes=["fp32"], mbs=[100_000], seq_lens=[16])
    assert err.value.field == "--mbs"
