"""SQLite state of the plan server: jobs, ranks, reports and per-instruction measurements.

Everything the server knows is in these tables, and every schedule is derived from them (a rank's next
iteration is one past its last report), so killing and restarting the server loses nothing. One connection
guarded by a lock; WAL journal; each write is one transaction.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

from hetplan.errors import HetplanError

SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    job_id TEXT PRIMARY KEY,
    spec TEXT NOT NULL,              -- JSON: stages, micro-batches, schedule, scheduler config
    state TEXT NOT NULL DEFAULT '{}',-- JSON: mutable scheduler state (e.g. target time)
    created_s REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS ranks (
    job_id TEXT NOT NULL REFERENCES jobs(job_id),
    rank INTEGER NOT NULL,
    stage INTEGER NOT NULL,
    registered_s REAL NOT NULL,
    PRIMARY KEY (job_id, rank)
);
CREATE TABLE IF NOT EXISTS reports (
    job_id TEXT NOT NULL,
    rank INTEGER NOT NULL,
    iteration INTEGER NOT NULL,
    stage INTEGER NOT NULL,
    schedule_id TEXT NOT NULL,
    time_s REAL NOT NULL,
    energy_j REAL,
    received_s REAL NOT NULL,
    energy_source TEXT,              -- 'nvml' (measured), 'model' (power model x measured time) or NULL
    PRIMARY KEY (job_id, rank, iteration)
);
CREATE TABLE IF NOT EXISTS measurements (
    job_id TEXT NOT NULL,
    rank INTEGER NOT NULL,
    iteration INTEGER NOT NULL,
    stage INTEGER NOT NULL,
    instruction TEXT NOT NULL,
    frequency_mhz INTEGER NOT NULL,
    time_s REAL NOT NULL,
    energy_j REAL
);
CREATE INDEX IF NOT EXISTS measurements_job ON measurements(job_id, stage, instruction, frequency_mhz);
"""


class Store:
    """Thread-safe access to the server's SQLite file.

    Args:
        path: database file (created if missing); ``":memory:"`` for a throw-away store.
        read_only: open an existing server file without writing (``energy frontier --profile-db``).
        field: the option the file came from, for messages.
    Raises:
        HetplanError: not SQLite, or another program's database (:meth:`_check_ours`).
    """

    def __init__(self, path: str | Path, *, read_only: bool = False, field: str = "--db"):
        self.path = str(path)
        self._lock = threading.RLock()
        try:
            if read_only:
                self._db = sqlite3.connect(f"{Path(self.path).resolve().as_uri()}?mode=ro", uri=True,
                                           check_same_thread=False, isolation_level=None, timeout=30)
            else:
                self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None, timeout=30)
            self._check_ours(field, read_only)
            if read_only:
                return
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")  # a committed report survives even a power loss
            self._db.executescript(SCHEMA)
        except sqlite3.DatabaseError as exc:
            raise HetplanError(f"{self.path} is not a plan-server database ({exc})", field=field,
                               fix="give a new file name or the file an earlier `hetplan energy serve` wrote") from None
        if "energy_source" not in {r[1] for r in self._db.execute("PRAGMA table_info(reports)")}:
            self._db.execute("ALTER TABLE reports ADD COLUMN energy_source TEXT")  # a file from before the column

    def _check_ours(self, field: str, read_only: bool) -> None:
        """Refuse another program's SQLite file (a hetplan profile database, anything else with tables but none of
        the server's): the server would add its tables into it (issue 27: ``energy serve --db`` on a profile DB).
        A read-only open also needs the server's tables.

        Raises:
            HetplanError: naming ``field``; sqlite3.DatabaseError: not SQLite (turned into a message above)."""
        tables = {r[0] for r in self._db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        ours = {"jobs", "ranks", "reports", "measurements"}
        if (tables and not tables & ours) or (read_only and not ours <= tables):
            self._db.close()
            what = "a hetplan profile database" if "layer_times" in tables else (
                f"another program's database (tables {', '.join(sorted(tables)[:5])})" if tables else "empty")
            raise HetplanError(f"{self.path} is {what}, not a plan-server database", field=field,
                               fix="give a new file name or the file an earlier `hetplan energy serve` wrote")

    def close(self) -> None:
        """Checkpoint the WAL into the main file and close (a later open needs no recovery)."""
        with self._lock:
            try:
                self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            except sqlite3.Error:  # pragma: no cover - closing anyway
                pass
            self._db.close()

    def _write(self, sql_params: list[tuple[str, tuple]]) -> None:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                for sql, params in sql_params:
                    self._db.execute(sql, params)
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    def _read(self, sql: str, params: tuple = ()) -> list[tuple]:
        with self._lock:
            return self._db.execute(sql, params).fetchall()

    # jobs ------------------------------------------------------------------------------------------
    def create_job(self, job_id: str, spec: dict[str, Any], state: dict[str, Any]) -> bool:
        """Insert a job; False if a job with that id already exists (nothing is changed then)."""
        with self._lock:
            if self._read("SELECT 1 FROM jobs WHERE job_id=?", (job_id,)):
                return False
            self._write([("INSERT INTO jobs(job_id, spec, state, created_s) VALUES (?,?,?,?)",
                          (job_id, json.dumps(spec), json.dumps(state), time.time()))])
            return True

    def job(self, job_id: str) -> tuple[dict, dict] | None:
        """``(spec, state)`` of a job, or None."""
        rows = self._read("SELECT spec, state FROM jobs WHERE job_id=?", (job_id,))
        return (json.loads(rows[0][0]), json.loads(rows[0][1])) if rows else None

    def jobs(self) -> list[str]:
        return [r[0] for r in self._read("SELECT job_id FROM jobs ORDER BY created_s")]

    def set_state(self, job_id: str, state: dict[str, Any]) -> None:
        self._write([("UPDATE jobs SET state=? WHERE job_id=?", (json.dumps(state), job_id))])

    # ranks -----------------------------------------------------------------------------------------
    def register(self, job_id: str, rank: int, stage: int) -> tuple[bool, int | None]:
        """Register a rank; returns ``(created, existing_stage)``. Re-registering the same stage is a no-op."""
        with self._lock:
            rows = self._read("SELECT stage FROM ranks WHERE job_id=? AND rank=?", (job_id, rank))
            if rows:
                return False, int(rows[0][0])
            self._write([("INSERT INTO ranks(job_id, rank, stage, registered_s) VALUES (?,?,?,?)",
                          (job_id, rank, stage, time.time()))])
            return True, None

    def rank_stage(self, job_id: str, rank: int) -> int | None:
        rows = self._read("SELECT stage FROM ranks WHERE job_id=? AND rank=?", (job_id, rank))
        return int(rows[0][0]) if rows else None

    def ranks(self, job_id: str) -> dict[int, int]:
        return {int(r): int(s) for r, s in self._read("SELECT rank, stage FROM ranks WHERE job_id=? ORDER BY rank", (job_id,))}

    # reports ---------------------------------------------------------------------------------------
    def next_iteration(self, job_id: str, rank: int) -> int:
        """One past the rank's last reported iteration (0 before any report)."""
        rows = self._read("SELECT MAX(iteration) FROM reports WHERE job_id=? AND rank=?", (job_id, rank))
        return 0 if rows[0][0] is None else int(rows[0][0]) + 1

    def add_report(self, job_id: str, rank: int, stage: int, iteration: int, schedule_id: str, time_s: float,
                   energy_j: float | None, measurements: list[tuple[str, int, float, float | None]],
                   energy_source: str | None = None) -> bool:
        """Store a report and its per-instruction measurements atomically; False if that iteration exists."""
        with self._lock:
            if self._read("SELECT 1 FROM reports WHERE job_id=? AND rank=? AND iteration=?", (job_id, rank, iteration)):
                return False
            ops = [("INSERT INTO reports(job_id, rank, iteration, stage, schedule_id, time_s, energy_j, received_s, "
                    "energy_source) VALUES (?,?,?,?,?,?,?,?,?)",
                    (job_id, rank, iteration, stage, schedule_id, time_s, energy_j, time.time(), energy_source))]
            ops += [("INSERT INTO measurements VALUES (?,?,?,?,?,?,?,?)",
                     (job_id, rank, iteration, stage, inst, freq, t, e)) for inst, freq, t, e in measurements]
            self._write(ops)
            return True

    def reports(self, job_id: str) -> list[dict]:
        rows = self._read("SELECT rank, iteration, stage, schedule_id, time_s, energy_j, energy_source FROM reports "
                          "WHERE job_id=? ORDER BY iteration, rank", (job_id,))
        return [{"rank": r[0], "iteration": r[1], "stage": r[2], "schedule_id": r[3], "time_s": r[4], "energy_j": r[5],
                 "energy_source": r[6]} for r in rows]

    def energy_sources(self, job_id: str) -> list[str]:
        """The distinct energy sources of the job's reports (``"nvml"``, ``"model"``), sorted."""
        return [r[0] for r in self._read("SELECT DISTINCT energy_source FROM reports WHERE job_id=? AND "
                                         "energy_source IS NOT NULL ORDER BY energy_source", (job_id,))]

    def count_reports(self, job_id: str) -> int:
        return int(self._read("SELECT COUNT(*) FROM reports WHERE job_id=?", (job_id,))[0][0])

    def measured_profile(self, job_id: str) -> list[tuple[int, str, int, float, float, int]]:
        """Mean ``(stage, instruction, frequency_mhz, time_s, energy_j, samples)`` over all measurements with energy."""
        return [(int(s), str(i), int(f), float(t), float(e), int(n)) for s, i, f, t, e, n in self._read(
            "SELECT stage, instruction, frequency_mhz, AVG(time_s), AVG(energy_j), COUNT(*) FROM measurements "
            "WHERE job_id=? AND energy_j IS NOT NULL GROUP BY stage, instruction, frequency_mhz "
            "ORDER BY stage, instruction DESC, frequency_mhz DESC", (job_id,))]
