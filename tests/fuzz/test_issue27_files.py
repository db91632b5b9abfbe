"""Issue 27, items 3-4: files. Profile imports refuse unknown GPUs, NaN / text / negative times and CSVs of
unrelated columns (generated rows); a read-only command never writes a byte into a foreign or empty SQLite file;
every output path (a file given as a folder, a folder as a file, a missing or unwritable folder) is one message,
exit 2, never a traceback."""

from __future__ import annotations

import hashlib
import sqlite3

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hetplan.errors import HetplanError
from tests.fuzz.inproc import run_cli

HEADER = "model,gpu,tp,index,kind,forward_time_s_mbs1\n"
GOOD = "gpt2XL,A100,1,1,layer,0.0031\n"


def _ok(r):
    assert not r.traceback, r.traceback
    return r


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(time=st.sampled_from(["nan", "NaN", "inf", "-inf", "-0.002", "fast", "", "1e999", "0"]),
       gpu=st.sampled_from(["A100", "A10", "H100-SXM"]))
def test_fasop_rows_with_bad_times_are_refused(tmp_path_factory, time, gpu):
    d = tmp_path_factory.mktemp("f")
    (d / "f.csv").write_text(HEADER + GOOD + f"gpt2XL,{gpu},1,2,layer,{time}\n")
    r = _ok(run_cli("profile", "import", "fasop", d / "f.csv", "--db", d / "p.db"))
    assert r.code == 2 and "forward_time_s_mbs1" in r.stderr and "line 3" in r.stderr


def _not_a_catalog_gpu(name: str) -> bool:
    """True when the importer cannot resolve ``name`` (the catalog grows: 'a30' is the A30 since it was added;
    FASOP's own names map first: 'a100' is its A100-SXM-40GB, :data:`FASOP_GPUS`)."""
    from hetplan.profile.importers import FASOP_GPUS, _device

    try:
        _device(FASOP_GPUS.get(name.lower(), name), "gpu")
    except HetplanError:
        return True
    return False


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(gpu=st.text(alphabet="abcxyzQ0123-", min_size=1, max_size=12).filter(_not_a_catalog_gpu))
def test_fasop_unknown_gpu_is_refused(tmp_path_factory, gpu):
    d = tmp_path_factory.mktemp("g")
    (d / "f.csv").write_text(HEADER + f"gpt2XL,{gpu},1,1,layer,0.003\n")
    r = _ok(run_cli("profile", "import", "fasop", d / "f.csv", "--db", d / "p.db"))
    assert r.code == 2 and "unknown GPU" in r.stderr


@pytest.mark.parametrize("text", ["a,b,c\n1,2,3\n", "a,b,c\n", "hello\n", ""])
def test_csv_of_unrelated_columns_imports_nothing_and_says_so(tmp_path, text):
    (tmp_path / "f.csv").write_text(text)
    r = _ok(run_cli("profile", "import", "fasop", tmp_path / "f.csv", "--db", tmp_path / "p.db"))
    assert r.code == 2 and "lacks columns" in r.stderr


def test_fasop_real_rows_still_import(tmp_path):
    (tmp_path / "f.csv").write_text(HEADER + GOOD + "gpt2XL,A100,1,0,embedding,0.001\n")
    r = _ok(run_cli("profile", "import", "fasop", tmp_path / "f.csv", "--db", tmp_path / "p.db"))
    assert r.code == 0 and "imported 2 rows" in r.stdout


def _digest(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _foreign_db(path) -> None:
    """A SQLite file that is not hetplan's: one unrelated table."""
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE runs (id INTEGER)")
    con.commit()
    con.close()


@pytest.mark.parametrize("kind", ["empty", "foreign", "text"])
def test_read_only_commands_write_nothing(tmp_path, kind):
    db = tmp_path / "x.db"
    if kind == "empty":
        db.write_bytes(b"")
    elif kind == "text":
        db.write_text("not a database\n")
    else:
        _foreign_db(db)
    before = _digest(db)
    plan = tmp_path / "p.json"
    assert run_cli("plan", "--model", "llama2-7b", "--seq-len", "2048", "--global-batch", "16", "--iterations",
                   "2", "--gpu", "H100-SXM", "--gpus", "8", "-q", "-o", plan).code == 0
    for args in (("profile", "show", "--db", db), ("profile", "export-csv", tmp_path / "o.csv", "--db", db),
                 ("estimate", plan, "--profile-db", db)):
        r = _ok(run_cli(*args))
        assert r.code == 2 and "profile database" in r.stderr, (args, r.stderr)
    assert _digest(db) == before
    assert not (tmp_path / "o.csv").exists()


def test_output_paths(tmp_path):
    plan = tmp_path / "p.json"
    assert run_cli("plan", "--model", "llama2-7b", "--seq-len", "2048", "--global-batch", "16", "--iterations",
                   "2", "--gpu", "H100-SXM", "--gpus", "8", "-q", "-o", plan).code == 0
    afile = tmp_path / "afile"
    afile.write_text("x")
    cases = [("export", plan, "--to", "megatron", "--out-dir", afile),
             ("export", plan, "--to", "megatron", "--out-dir", afile / "sub"),
             ("plan", "--model", "llama2-7b", "--seq-len", "2048", "--global-batch", "16", "--iterations", "2",
              "--gpu", "H100-SXM", "--gpus", "8", "-q", "-o", tmp_path),
             ("plan", "--model", "llama2-7b", "--seq-len", "2048", "--global-batch", "16", "--iterations", "2",
              "--gpu", "H100-SXM", "--gpus", "8", "-q", "-o", afile / "p.json"),
             ("validate", "--sets", "fasop_layers", "--csv", tmp_path),
             ("validate", "--sets", "fasop_layers", "--out", afile)]
    for args in cases:
        r = _ok(run_cli(*args))
        assert r.code == 2 and "fix:" in r.stderr, (args, r.stderr)
    r = _ok(run_cli("export", plan, "--to", "megatron", "--out-dir", tmp_path / "new" / "dir"))
    assert r.code == 0 and any((tmp_path / "new" / "dir").iterdir())


@settings(max_examples=40, deadline=None)
@given(body=st.sampled_from(["NaN", "Infinity", "-Infinity", "1e400", "-1e400"]),
       where=st.sampled_from(["report", "measurement", "target", "energy"]))
def test_energy_server_non_finite_numbers_are_422(body, where):
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from hetplan.energy.server.app import create_app
    c = TestClient(create_app(":memory:"), raise_server_exceptions=False)
    job = {"job_id": "j", "num_stages": 1, "num_microbatches": 2,
           "scheduler": {"kind": "point_solution", "plans": [{"frequencies_mhz": [[1000] * 4]}]}}
    assert c.post("/jobs", json=job).status_code == 201
    assert c.post("/jobs/j/ranks", json={"rank": 0, "stage": 0}).status_code == 200
    texts = {"report": f'{{"iteration": 0, "schedule_id": "x", "time_s": {body}}}',
             "energy": f'{{"iteration": 0, "schedule_id": "x", "time_s": 1, "energy_j": {body}}}',
             "measurement": '{"iteration": 0, "schedule_id": "x", "time_s": 1, "measurements": [{"instruction": '
                            f'"forward", "frequency_mhz": 1000, "time_s": {body}}}]}}',
             "target": f'{{"target_time_s": {body}}}'}
    url = "/jobs/j/target" if where == "target" else "/jobs/j/ranks/0/reports"
    send = c.put if where == "target" else c.post
    r = send(url, content=texts[where], headers={"content-type": "application/json"})
    assert r.status_code == 422, (r.status_code, r.text)


@settings(max_examples=30, deadline=None)
@given(rank=st.integers(2**31, 10**30))
def test_energy_server_huge_rank_is_422(rank):
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from hetplan.energy.server.app import create_app
    c = TestClient(create_app(":memory:"), raise_server_exceptions=False)
    assert c.get(f"/jobs/j/ranks/{rank}/schedule").status_code == 422
    assert c.post(f"/jobs/j/ranks/{rank}/reports", json={"iteration": 0, "schedule_id": "x",
                                                        "time_s": 1}).status_code == 422
    assert c.post("/jobs/j/ranks", json={"rank": rank, "stage": 0}).status_code == 422


@pytest.mark.parametrize("kind", ["profile", "foreign", "text"])
def test_energy_serve_refuses_other_databases(tmp_path, kind):
    from hetplan.energy.server.store import Store
    from hetplan.errors import HetplanError
    from hetplan.profile.db import ProfileDB
    db = tmp_path / "x.db"
    if kind == "profile":
        ProfileDB(db).close()
    elif kind == "text":
        db.write_text("not sqlite\n")
    else:
        _foreign_db(db)
    before = _digest(db)
    with pytest.raises(HetplanError):
        Store(db)
    assert _digest(db) == before
    r = _ok(run_cli("energy", "serve", "--db", db, "--max-in-flight", "0"))
    assert r.code == 2 and "--max-in-flight" in r.stderr


@pytest.mark.parametrize("what", ["fasop", "runs", "trace"])
def test_a_row_with_more_cells_than_the_header_is_refused_naming_its_line(tmp_path, what):
    """csv.DictReader files the extra cells of a row under the key None (a list): the RUNS reader called .strip()
    on it (a traceback), other readers dropped them unsaid. Every user CSV now names the line (exit 2)."""
    f = tmp_path / "f.csv"
    if what == "fasop":
        f.write_text(HEADER + GOOD + "gpt2XL,A100,1,2,layer,0.003,7\n")
        r = _ok(run_cli("profile", "import", "fasop", f, "--db", tmp_path / "p.db"))
    elif what == "runs":
        f.write_text("model,gpu,gpus,seq_len,global_batch,step_time_s\nllama3-8b,H100-SXM,8,8192,16,2.0\n"
                     "llama3-8b,H100-SXM,16,8192,32,2.1,extra\n")
        r = _ok(run_cli("calibrate", f))
    else:
        f.write_text("arrival_s,model\n0.1,a\n0.2,a,3\n")
        from hetplan.serve.workload import read_trace

        with pytest.raises(HetplanError, match="line 3: 3 cells under a header of 2 columns"):
            read_trace(f, ["a"])
        return
    assert r.code == 2 and "cells under a header of 6 columns" in r.stderr and "line 3" in r.stderr
