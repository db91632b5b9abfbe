"""Profile database (real SQLite files) and the FASOP / Aceso / Espresso importers on real shared-data figures."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from hetplan.errors import HetplanError
from hetplan.estimate.estimator import estimate
from hetplan.model.spec import load_model
from hetplan.plan import GPUPool, Job, Plan, Stage
from hetplan.profile.db import SCHEMA_VERSION, LayerRecord, LayerShape, ProfileDB, normalize_device
from hetplan.profile.importers import espresso_gpus, import_aceso, import_espresso, import_fasop

FIX = Path(__file__).parents[1] / "fixtures" / "profile"


def _rec(m, mbs, s, f, b, device="cpu", dtype="fp32", tp=1, kind="layer"):
    return LayerRecord(device=device, dtype=dtype, kind=kind, shape=LayerShape.of(m, kind), mbs=mbs, seq_len=s, tp=tp,
                       forward_s=f, backward_s=b, software="test")


def test_schema_version_file_and_reopen(tmp_path):
    path = tmp_path / "p.db"
    m = load_model("gpt3-1.3b")
    with ProfileDB(path) as db:
        db.add_layer(_rec(m, 1, 1024, 0.01, 0.02))
        assert db.schema_version == SCHEMA_VERSION
    con = sqlite3.connect(path)
    assert con.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()[0] == str(SCHEMA_VERSION)
    assert con.execute("SELECT forward_s FROM layer_times").fetchone()[0] == 0.01
    con.execute("UPDATE meta SET value='999' WHERE key='schema_version'")
    con.commit()
    con.close()
    with pytest.raises(HetplanError, match="schema version 999"):
        ProfileDB(path)


def test_not_a_database(tmp_path):
    bad = tmp_path / "x.db"
    bad.write_text("this is not sqlite" * 100)
    with pytest.raises(HetplanError, match="not a profile database"):
        ProfileDB(bad)


def test_interpolation_in_mbs_and_seq_len(tmp_path):
    m = load_model("gpt3-1.3b")
    with ProfileDB(tmp_path / "p.db") as db:
        for mbs, s, f in [(1, 1024, 1.0), (4, 1024, 4.0), (1, 2048, 3.0), (4, 2048, 12.0)]:
            db.add_layer(_rec(m, mbs, s, f, 2 * f))
        assert db.layer_time_s("cpu", m, "fp32", 1, 1024, 1) == (1.0, 2.0)
        f, b = db.layer_time_s("cpu", m, "fp32", 2, 1024, 1)  # linear in mbs
        assert f == pytest.approx(2.0) and b == pytest.approx(4.0)
        f, _ = db.layer_time_s("cpu", m, "fp32", 2, 1536, 1)  # then linear in seq_len: (2 + 6) / 2
        assert f == pytest.approx(4.0)
        # Outside the range: nearest point scaled by the analytic FLOP ratio (linear in mbs).
        f, _ = db.layer_time_s("cpu", m, "fp32", 8, 1024, 1)
        assert f == pytest.approx(8.0)
        assert db.layer_time_s("cpu", m, "fp32", 1, 1024, 2) is None  # other TP: nothing measured
        assert db.layer_time_s("cpu", m, "bf16", 1, 1024, 1) is None
        assert db.layer_time_s("cpu", load_model("gpt2-xl"), "fp32", 1, 1024, 1) is None  # other shape
        db.extrapolate = False
        assert db.layer_time_s("cpu", m, "fp32", 8, 1024, 1) is None


def test_device_names_normalised():
    assert normalize_device("NVIDIA H200") == "H200"
    assert normalize_device("a100-80gb") == "A100-SXM-80GB"
    assert normalize_device("cpu") == "cpu"


def test_fasop_import_and_estimator_uses_it(tmp_path):
    with ProfileDB(tmp_path / "p.db") as db:
        n = import_fasop(db, FIX / "fasop_layer_forward_times.csv")
        # gpt2XL on A100, A10, RTX3090 x TP 1/2/4 x (layer, embedding, head); bert has no shapes -> skipped.
        assert n == 3 * 3 * 3
        m = load_model("gpt2-xl")
        f, b = db.layer_time_s("A100-SXM-40GB", m, "fp16", 1, 1024, 1)
        assert f == pytest.approx(0.0016384583333333331) and b == pytest.approx(2 * f)  # FASOP: bwd = 2 fwd
        f10, _ = db.layer_time_s("A10G", m, "fp16", 1, 1024, 2)
        assert f10 == pytest.approx(0.0016447205833333336)
        assert db.kind_time_s("embedding", "A100-SXM-40GB", m, "fp16", 1, 1024, 1)[0] == pytest.approx(0.000159)
        # mbs 2 from the mbs-1 point: FLOP-proportional (x2).
        assert db.layer_time_s("A100-SXM-40GB", m, "fp16", 2, 1024, 1)[0] == pytest.approx(2 * f)

        job = Job(model="gpt2-xl", seq_len=1024, global_batch=8, dtype="fp16")
        plan = Plan(job=job, pools=[GPUPool(gpu="A100-SXM-40GB", count=8), GPUPool(gpu="H100-SXM", count=8)],
                    stages=[Stage(pool=0, num_layers=24), Stage(pool=1, num_layers=24)], mbs=1)
        est = estimate(plan, profiles=db)
        assert [s.time_source for s in est.stages] == ["profiled", "analytic"]
        per_layer = (est.stages[0].forward_s - 0) / 24
        assert per_layer == pytest.approx(0.0016384583333333331, rel=0.05)  # + analytic embedding share


def test_aceso_import_real_figures(tmp_path):
    with ProfileDB(tmp_path / "p.db") as db:
        n = import_aceso(db, FIX / "aceso")
        m = load_model("gpt3-1.3b")
        # Sum of the enc-* ops of gpt_1_3B_mbs1_tp1_algo0.csv: forward 5,629.99 us, backward 9,377.22 us.
        f, b = db.layer_time_s("V100-SXM-32GB", m, "fp16", 1, 2048, 1)
        assert f == pytest.approx(5629.988e-6, rel=1e-6) and b == pytest.approx(9377.219e-6, rel=1e-6)
        f2, _ = db.layer_time_s("V100-SXM-32GB", m, "fp16", 2, 2048, 1)
        f4, _ = db.layer_time_s("V100-SXM-32GB", m, "fp16", 4, 2048, 1)
        f3, _ = db.layer_time_s("V100-SXM-32GB", m, "fp16", 3, 2048, 1)
        assert f3 == pytest.approx((f2 + f4) / 2)
        assert db.layer_time_s("V100-SXM-32GB", m, "fp16", 1, 2048, 2) is not None
        head = db.kind_time_s("head", "V100-SXM-32GB", m, "fp16", 1, 2048, 1)
        assert head[0] == pytest.approx((60.588 + 9597.570) * 1e-6)
        comm = db.comm_rows()
        p2p = [r for r in comm if r["collective"] == "send-recv"]
        assert len(p2p) == 11 and max(r["bandwidth_bytes_per_s"] for r in p2p) == pytest.approx(11.05e9)
        assert any(r["collective"] == "all-gather" and r["world_size"] == 2 for r in comm)
        assert n == 4 * 3 + len(comm)  # 4 algo0 files x 3 kinds (+ algo1 skipped) + collectives
        assert db.comm_bandwidth_bytes_per_s("V100-SXM-32GB", "send-recv", 2) == pytest.approx(11.05e9)


def test_espresso_import_real_trace(tmp_path):
    assert espresso_gpus("motivation1_2A30_A4000") == ["A30", "A30", "RTX-A4000"]
    assert espresso_gpus("motivation1_A10G_1V100_2T4") == ["A10G", "V100-SXM-32GB", "T4", "T4"]
    with ProfileDB(tmp_path / "p.db") as db:
        assert import_espresso(db, FIX / "espresso" / "motivation1_2A30_A4000") == 3
        rows = db.stage_rows()
    assert [r["device"] for r in rows] == ["A30", "A30", "RTX-A4000"]
    assert [(r["first_layer"], r["end_layer"]) for r in rows] == [(0, 15), (15, 29), (29, 35)]
    # Medians of ForwardPass / BackwardPass (first two micro-batches dropped) and peak max_mem of operations_record.csv.
    assert rows[0]["forward_s"] == pytest.approx(0.3700408935546875)
    assert rows[2]["backward_s"] == pytest.approx(0.6433506011962891)
    assert rows[0]["peak_memory_bytes"] == 21772916736


def test_importer_errors(tmp_path):
    db = ProfileDB()
    with pytest.raises(HetplanError, match="does not exist"):
        import_fasop(db, tmp_path / "missing.csv")
    with pytest.raises(HetplanError, match="not a directory"):
        import_aceso(db, tmp_path / "nope")
    with pytest.raises(HetplanError, match="no Espresso rank folders"):
        import_espresso(db, tmp_path)


def test_cli_import_and_show(tmp_path):
    import json
    import subprocess
    import sys

    db = tmp_path / "cli.db"
    run = lambda *a: subprocess.run([sys.executable, "-m", "hetplan.cli.main", "profile", *a], capture_output=True,
                                    text=True)
    r = run("import", "aceso", str(FIX / "aceso"), "--db", str(db))
    assert r.returncode == 0, r.stderr
    r = run("import", "fasop", str(FIX / "fasop_layer_forward_times.csv"), "--db", str(db))
    assert r.returncode == 0 and "imported 27 rows" in r.stdout
    r = run("show", "--db", str(db), "--json")
    data = json.loads(r.stdout)
    assert data["schema_version"] == SCHEMA_VERSION
    assert {row["source"] for row in data["layers"]} == {"aceso", "fasop"}
    r = run("import", "pipedream", str(FIX), "--db", str(db))
    assert r.returncode == 2 and "unknown format" in r.stderr
    r = run("show", "--db", str(tmp_path / "none.db"))
    assert r.returncode == 2


def test_csv_round_trip_and_bundled(tmp_path):
    from hetplan.profile.db import bundled_profiles

    with ProfileDB(tmp_path / "a.db") as db:
        import_fasop(db, FIX / "fasop_layer_forward_times.csv")
        assert db.export_csv(tmp_path / "rows.csv") == 27
        ref = db.layer_time_s("A100-SXM-40GB", load_model("gpt2-xl"), "fp16", 1, 1024, 1)
    with ProfileDB(tmp_path / "b.db") as db2:
        assert db2.import_csv(tmp_path / "rows.csv") == 27
        assert db2.layer_time_s("A100-SXM-40GB", load_model("gpt2-xl"), "fp16", 1, 1024, 1) == ref
    # every row of the profiles shipped as package data is imported (none ship yet: docs/runtime.md)
    from importlib import resources

    folder = resources.files("hetplan.profile").joinpath("data")
    shipped = [f for f in folder.iterdir() if f.name.endswith(".csv")] if folder.is_dir() else []
    assert bundled_profiles().counts()["layer_times"] == sum(len(f.read_text().splitlines()) - 1 for f in shipped)
