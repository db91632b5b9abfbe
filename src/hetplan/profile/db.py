"""The profile database: measured layer, embedding, head, collective and stage times in one SQLite file.

Concept. The estimator (:func:`hetplan.estimate.estimator.estimate`) asks one question of measured data: *how long
do the forward and backward passes of one transformer layer of this shape take on this device, in this dtype, for
this micro-batch size, sequence length and TP degree?* (:class:`~hetplan.estimate.estimator.LayerTimeSource`).
:class:`ProfileDB` answers it from rows written by the torch profiler (:mod:`hetplan.profile.profiler`) or by the
importers of other systems' profiles (:mod:`hetplan.profile.importers`), interpolating between measured micro-batch
sizes and sequence lengths (see :meth:`ProfileDB.layer_time_s`).

Key of a layer row: device name (the catalog's canonical name when the device is in the GPU catalog, ``"cpu"`` for
the host CPU), dtype (``bf16``/``fp16``/``fp32``), kind (``layer``/``embedding``/``head``), the layer shape
(hidden size, attention heads, key/value heads, head size, MLP width, gated MLP, norm, linear biases, rotary
positions, padded vocabulary for embedding/head rows), micro-batch size, sequence length, TP degree, the source
(``hetplan-profiler``, ``fasop``, ``aceso``, ``espresso``) and the software versions (e.g. ``torch 2.13.0+cpu``).
Several software versions may hold the same point; lookups take the most recent row.

Schema (version :data:`SCHEMA_VERSION`, stored in table ``meta``)::

    meta(key TEXT PRIMARY KEY, value TEXT)
    layer_times(device, dtype, kind, hidden_size, num_heads, num_kv_heads, head_dim, ffn_hidden_size, gated_mlp,
                norm, linear_bias, rotary, vocab_size, mbs, seq_len, tp, forward_s, backward_s,
                peak_memory_bytes, repeats, source, software, created_utc)       UNIQUE(key columns, source, software)
    comm_times(device, backend, collective, world_size, message_bytes, time_s, bandwidth_bytes_per_s,
               source, software, created_utc)                                    UNIQUE(device..message_bytes, source, software)
    stage_times(source, run, device, stage, first_layer, end_layer, num_layers, mbs, seq_len, forward_s,
                backward_s, peak_memory_bytes, created_utc)                     UNIQUE(source, run, stage)

Units: seconds, bytes, bytes/s. Times are of ONE micro-batch through ONE layer (or the embedding / the head with
its loss) on ONE rank of the TP group, TP communication included.

This module does not import torch.
"""

from __future__ import annotations

import bisect
import csv
import io
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

from hetplan.errors import HetplanError
from hetplan.inputs import check_path_name, read_text
from hetplan.model import counts
from hetplan.model.spec import ModelSpec

#: Version of the SQLite schema written by this module. Opening a file with another version raises.
SCHEMA_VERSION = 1

_LAYER_KEY = (
    "device", "dtype", "kind", "hidden_size", "num_heads", "num_kv_heads", "head_dim", "ffn_hidden_size",
    "gated_mlp", "norm", "linear_bias", "rotary", "vocab_size", "mbs", "seq_len", "tp",
)

_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS layer_times (
    id INTEGER PRIMARY KEY,
    device TEXT NOT NULL, dtype TEXT NOT NULL, kind TEXT NOT NULL,
    hidden_size INTEGER NOT NULL, num_heads INTEGER NOT NULL, num_kv_heads INTEGER NOT NULL,
    head_dim INTEGER NOT NULL, ffn_hidden_size INTEGER NOT NULL, gated_mlp INTEGER NOT NULL,
    norm TEXT NOT NULL, linear_bias INTEGER NOT NULL, rotary INTEGER NOT NULL, vocab_size INTEGER NOT NULL,
    mbs INTEGER NOT NULL, seq_len INTEGER NOT NULL, tp INTEGER NOT NULL,
    forward_s REAL NOT NULL, backward_s REAL NOT NULL, peak_memory_bytes REAL,
    repeats INTEGER, source TEXT NOT NULL, software TEXT NOT NULL, created_utc TEXT NOT NULL,
    UNIQUE ({", ".join(_LAYER_KEY)}, source, software)
);
CREATE INDEX IF NOT EXISTS layer_lookup ON layer_times (device, dtype, kind, hidden_size, ffn_hidden_size, tp);
CREATE TABLE IF NOT EXISTS comm_times (
    id INTEGER PRIMARY KEY,
    device TEXT NOT NULL, backend TEXT NOT NULL, collective TEXT NOT NULL, world_size INTEGER NOT NULL,
    message_bytes REAL NOT NULL, time_s REAL NOT NULL, bandwidth_bytes_per_s REAL NOT NULL,
    source TEXT NOT NULL, software TEXT NOT NULL, created_utc TEXT NOT NULL,
    UNIQUE (device, backend, collective, world_size, message_bytes, source, software)
);
CREATE TABLE IF NOT EXISTS stage_times (
    id INTEGER PRIMARY KEY,
    source TEXT NOT NULL, run TEXT NOT NULL, device TEXT NOT NULL, stage INTEGER NOT NULL,
    first_layer INTEGER NOT NULL, end_layer INTEGER NOT NULL, num_layers INTEGER NOT NULL,
    mbs INTEGER, seq_len INTEGER, forward_s REAL NOT NULL, backward_s REAL NOT NULL,
    peak_memory_bytes REAL, created_utc TEXT NOT NULL,
    UNIQUE (source, run, stage)
);
"""


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def normalize_device(name: str) -> str:
    """Canonical device name: the GPU catalog's name when ``name`` is a known GPU or alias, else ``name`` lower-cased
    with spaces as dashes (``"cpu"`` stays ``"cpu"``). ``"NVIDIA H200"`` -> ``"H200"``."""
    from hetplan.hardware.catalog import load_catalog

    raw = name.strip()
    cat = load_catalog()
    for cand in (raw, raw.removeprefix("NVIDIA ").removeprefix("Tesla "), raw.replace(" ", "-")):
        try:
            return cat.get(cand).name
        except HetplanError:
            continue
    return raw.lower().replace(" ", "-")


@dataclass(frozen=True)
class LayerShape:
    """The shape columns of a layer row (see module doc). ``vocab_size`` is the padded vocabulary for embedding and
    head rows, 0 for transformer-layer rows."""

    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    ffn_hidden_size: int
    gated_mlp: bool
    norm: str
    linear_bias: bool
    rotary: bool
    vocab_size: int = 0

    @classmethod
    def of(cls, m: ModelSpec, kind: str = "layer") -> "LayerShape":
        """The shape of ``m``'s layers (``kind="layer"``) or of its embedding / head (vocabulary included)."""
        return cls(
            hidden_size=m.hidden_size, num_heads=m.num_attention_heads, num_kv_heads=m.num_kv_heads,
            head_dim=m.head_dim, ffn_hidden_size=m.ffn_hidden_size, gated_mlp=m.gated_mlp, norm=m.norm,
            linear_bias=m.linear_bias, rotary=m.learned_positions == 0,
            vocab_size=0 if kind == "layer" else m.padded_vocab_size(),
        )

    def columns(self) -> tuple:
        return (self.hidden_size, self.num_heads, self.num_kv_heads, self.head_dim, self.ffn_hidden_size,
                int(self.gated_mlp), self.norm, int(self.linear_bias), int(self.rotary), self.vocab_size)


@dataclass(frozen=True)
class LayerRecord:
    """One measured point: ``forward_s``/``backward_s`` of one micro-batch (seconds), optional peak memory (bytes)."""

    device: str
    dtype: str
    kind: str
    shape: LayerShape
    mbs: int
    seq_len: int
    tp: int
    forward_s: float
    backward_s: float
    peak_memory_bytes: float | None = None
    repeats: int | None = None
    source: str = "hetplan-profiler"
    software: str = "unknown"


@dataclass(frozen=True)
class CommRecord:
    """One measured collective: ``time_s`` for a ``message_bytes`` buffer per rank over ``world_size`` ranks;
    ``bandwidth_bytes_per_s`` is the bus bandwidth (NCCL-tests convention: algorithm bandwidth times
    2(n-1)/n for all-reduce, (n-1)/n for all-gather / reduce-scatter, 1 for send/recv)."""

    device: str
    backend: str
    collective: str
    world_size: int
    message_bytes: float
    time_s: float
    bandwidth_bytes_per_s: float
    source: str = "hetplan-profiler"
    software: str = "unknown"


class ProfileDB:
    """A profile database in one SQLite file (created with the current schema if missing).

    Implements :class:`hetplan.estimate.estimator.LayerTimeSource`.

    Args:
        path: the SQLite file (``":memory:"`` for a throw-away database).
        extrapolate: answer outside the measured micro-batch / sequence-length range by scaling the nearest
            measured point with the analytic FLOP ratio (default True); when False such queries return None.
        read_only: open an existing file without writing (:meth:`_open_read_only`); the write methods then fail.
        field: the option the file came from, for messages.
    Raises:
        HetplanError: the file is not a SQLite database, or it has another schema version.
    """

    def __init__(self, path: str | Path = ":memory:", *, extrapolate: bool = True, read_only: bool = False,
                 field: str = "--db"):
        self.path = str(path)
        self.extrapolate = extrapolate
        if read_only:
            self._open_read_only(field)
            return
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        try:
            self.conn = sqlite3.connect(self.path)
            self.conn.executescript(_SCHEMA)
            row = self.conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        except sqlite3.DatabaseError as exc:
            raise HetplanError(f"{self.path} is not a profile database ({exc})", field="--db",
                               fix="give a new file name or a file written by `hetplan profile`") from None
        if row is None:
            self.conn.execute("INSERT INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
            self.conn.execute("INSERT OR IGNORE INTO meta VALUES ('created_utc', ?)", (_now(),))
            self.conn.commit()
        elif int(row[0]) != SCHEMA_VERSION:
            raise HetplanError(
                f"{self.path} has profile schema version {row[0]}, this hetplan reads version {SCHEMA_VERSION}",
                field="--db", fix="re-profile into a new file (or use the hetplan version that wrote it)",
            )

    def _open_read_only(self, field: str) -> None:
        """Open an existing profile database without writing a byte (SQLite ``mode=ro``): a read (``profile
        show``, ``export-csv``, ``plan``/``estimate --profile-db``) must not create hetplan's tables in an empty
        file or in another program's database (issue 27).

        Raises:
            HetplanError: missing file, not SQLite, not a hetplan profile database, another schema version."""
        p = Path(self.path)
        check_path_name(p, field)
        if not p.is_file():
            raise HetplanError(f"{p} does not exist" if not p.exists() else f"{p} is not a file", field=field,
                               fix="give a profile database written by `hetplan profile` or an importer")
        try:
            self.conn = sqlite3.connect(f"{p.resolve().as_uri()}?mode=ro", uri=True)
            tables = {r[0] for r in self.conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            missing = {"meta", "layer_times", "comm_times", "stage_times"} - tables
            row = None if missing else self.conn.execute(
                "SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        except sqlite3.DatabaseError as exc:
            raise HetplanError(f"{p} is not a profile database ({exc})", field=field,
                               fix="give a file written by `hetplan profile` or an importer") from None
        if missing or row is None:
            self.conn.close()
            lacks = ", ".join(sorted(missing)) or "schema version"
            raise HetplanError(f"{p} is not a hetplan profile database (no {lacks})", field=field,
                               fix="give a file written by `hetplan profile` or an importer")
        if str(row[0]) != str(SCHEMA_VERSION):
            self.conn.close()
            raise HetplanError(
                f"{p} has profile schema version {row[0]}, this hetplan reads version {SCHEMA_VERSION}",
                field=field, fix="re-profile into a new file (or use the hetplan version that wrote it)")

    # -- context manager -------------------------------------------------------------------------------------
    def close(self) -> None:
        """Close the connection."""
        self.conn.close()

    def __enter__(self) -> "ProfileDB":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def schema_version(self) -> int:
        """Schema version stored in the file."""
        return int(self.conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()[0])

    # -- writing ---------------------------------------------------------------------------------------------
    def add_layer(self, rec: LayerRecord, *, commit: bool = True) -> None:
        """Insert or replace one measured layer / embedding / head point."""
        self.add_layers([rec], commit=commit)

    def add_layers(self, recs: Iterable[LayerRecord], *, commit: bool = True) -> int:
        """Insert or replace many points; returns how many."""
        rows = [
            (rec.device, rec.dtype, rec.kind, *rec.shape.columns(), rec.mbs, rec.seq_len, rec.tp, rec.forward_s,
             rec.backward_s, rec.peak_memory_bytes, rec.repeats, rec.source, rec.software, _now())
            for rec in recs
        ]
        cols = ", ".join((*_LAYER_KEY, "forward_s", "backward_s", "peak_memory_bytes", "repeats", "source",
                          "software", "created_utc"))
        self.conn.executemany(f"INSERT OR REPLACE INTO layer_times ({cols}) VALUES ({', '.join('?' * 23)})", rows)
        if commit:
            self.conn.commit()
        return len(rows)

    def add_comm(self, rec: CommRecord, *, commit: bool = True) -> None:
        """Insert or replace one collective measurement."""
        self.conn.execute(
            "INSERT OR REPLACE INTO comm_times (device, backend, collective, world_size, message_bytes, time_s, "
            "bandwidth_bytes_per_s, source, software, created_utc) VALUES (?,?,?,?,?,?,?,?,?,?)",
            (rec.device, rec.backend, rec.collective, rec.world_size, rec.message_bytes, rec.time_s,
             rec.bandwidth_bytes_per_s, rec.source, rec.software, _now()),
        )
        if commit:
            self.conn.commit()

    def add_stage(self, *, source: str, run: str, device: str, stage: int, first_layer: int, end_layer: int,
                  forward_s: float, backward_s: float, mbs: int | None = None, seq_len: int | None = None,
                  peak_memory_bytes: float | None = None, commit: bool = True) -> None:
        """Insert or replace one measured pipeline stage (per micro-batch forward / backward, seconds)."""
        self.conn.execute(
            "INSERT OR REPLACE INTO stage_times (source, run, device, stage, first_layer, end_layer, num_layers, mbs, "
            "seq_len, forward_s, backward_s, peak_memory_bytes, created_utc) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
            (source, run, device, stage, first_layer, end_layer, end_layer - first_layer, mbs, seq_len, forward_s,
             backward_s, peak_memory_bytes, _now()),
        )
        if commit:
            self.conn.commit()

    def commit(self) -> None:
        """Commit pending writes."""
        self.conn.commit()

    # -- reading ---------------------------------------------------------------------------------------------
    def has_layer(self, device: str, dtype: str, kind: str, shape: LayerShape, mbs: int, seq_len: int, tp: int,
                  software: str | None = None) -> bool:
        """Whether this exact point is stored (optionally for one software version): used to resume profiling."""
        sql = (f"SELECT 1 FROM layer_times WHERE {' AND '.join(f'{k} = ?' for k in _LAYER_KEY)}"
               + (" AND software = ?" if software else "") + " LIMIT 1")
        args = (device, dtype, kind, *shape.columns(), mbs, seq_len, tp) + ((software,) if software else ())
        return self.conn.execute(sql, args).fetchone() is not None

    def points(self, device: str, dtype: str, kind: str, shape: LayerShape, tp: int) -> dict[tuple[int, int], tuple[float, float]]:
        """All measured ``(mbs, seq_len) -> (forward_s, backward_s)`` of one key, the most recent row per point."""
        sql = (
            "SELECT mbs, seq_len, forward_s, backward_s FROM layer_times WHERE lower(device) = lower(?) AND dtype = ? "
            "AND kind = ? AND hidden_size = ? AND num_heads = ? AND num_kv_heads = ? AND head_dim = ? "
            "AND ffn_hidden_size = ? AND gated_mlp = ? AND norm = ? AND linear_bias = ? AND rotary = ? "
            "AND vocab_size = ? AND tp = ? ORDER BY created_utc, id"
        )
        out: dict[tuple[int, int], tuple[float, float]] = {}
        for mbs, s, f, b in self.conn.execute(sql, (device, dtype, kind, *shape.columns(), tp)):
            out[(mbs, s)] = (f, b)
        return out

    def covers(self, device: str, model: ModelSpec, dtype: str) -> bool:
        """Whether any transformer-layer time of ``model``'s shape in ``dtype`` on ``device`` is stored (any TP,
        micro-batch or sequence length): else :meth:`layer_time_s` returns None for every query of it."""
        sql = ("SELECT 1 FROM layer_times WHERE lower(device) = lower(?) AND dtype = ? AND kind = 'layer' AND "
               "hidden_size = ? AND num_heads = ? AND num_kv_heads = ? AND head_dim = ? AND ffn_hidden_size = ? AND "
               "gated_mlp = ? AND norm = ? AND linear_bias = ? AND rotary = ? AND vocab_size = ? LIMIT 1")
        args = (normalize_device(device), dtype, *LayerShape.of(model).columns())
        return self.conn.execute(sql, args).fetchone() is not None

    def layer_rows(self) -> Iterator[dict]:
        """Every layer row as a dict (for listing and export)."""
        cur = self.conn.execute("SELECT * FROM layer_times ORDER BY device, dtype, kind, hidden_size, tp, seq_len, mbs")
        names = [d[0] for d in cur.description]
        for row in cur:
            yield dict(zip(names, row))

    def comm_rows(self) -> list[dict]:
        """Every collective row as a dict."""
        cur = self.conn.execute("SELECT * FROM comm_times ORDER BY device, backend, collective, world_size, message_bytes")
        names = [d[0] for d in cur.description]
        return [dict(zip(names, row)) for row in cur]

    def stage_rows(self) -> list[dict]:
        """Every stage row as a dict."""
        cur = self.conn.execute("SELECT * FROM stage_times ORDER BY source, run, stage")
        names = [d[0] for d in cur.description]
        return [dict(zip(names, row)) for row in cur]

    def counts(self) -> dict[str, int]:
        """Row count per table."""
        return {t: self.conn.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0]
                for t in ("layer_times", "comm_times", "stage_times")}

    # -- CSV (package data) -----------------------------------------------------------------------------------
    def export_csv(self, path: str | Path, source: str | None = None) -> int:
        """Write the layer rows (optionally of one ``source``) to a CSV file with the table's columns; returns
        the row count. This is the form in which measured GPU profiles ship as package data
        (``hetplan/profile/data/*.csv``)."""
        rows = [r for r in self.layer_rows() if source is None or r["source"] == source]
        cols = [*_LAYER_KEY, "forward_s", "backward_s", "peak_memory_bytes", "repeats", "source", "software",
                "created_utc"]
        with Path(path).open("w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=cols, extrasaction="ignore")
            w.writeheader()
            w.writerows(rows)
        return len(rows)

    def import_csv(self, path: str | Path) -> int:
        """Read layer rows written by :meth:`export_csv`; returns the row count.

        Raises:
            HetplanError: the file lacks columns.
        """
        rows = list(csv.DictReader(io.StringIO(read_text(path, "path"), newline="")))
        need = {*_LAYER_KEY, "forward_s", "backward_s", "source", "software"}
        if rows and not need <= set(rows[0]):
            raise HetplanError(f"{path} lacks columns {sorted(need - set(rows[0]))}", field="path",
                               fix="give a CSV written by `hetplan profile export-csv`")
        recs = []
        for r in rows:
            shape = LayerShape(int(r["hidden_size"]), int(r["num_heads"]), int(r["num_kv_heads"]), int(r["head_dim"]),
                               int(r["ffn_hidden_size"]), bool(int(r["gated_mlp"])), r["norm"],
                               bool(int(r["linear_bias"])), bool(int(r["rotary"])), int(r["vocab_size"]))
            recs.append(LayerRecord(
                device=r["device"], dtype=r["dtype"], kind=r["kind"], shape=shape, mbs=int(r["mbs"]),
                seq_len=int(r["seq_len"]), tp=int(r["tp"]), forward_s=float(r["forward_s"]),
                backward_s=float(r["backward_s"]),
                peak_memory_bytes=float(r["peak_memory_bytes"]) if r.get("peak_memory_bytes") else None,
                repeats=int(r["repeats"]) if r.get("repeats") else None, source=r["source"], software=r["software"]))
        return self.add_layers(recs)

    # -- the LayerTimeSource protocol ------------------------------------------------------------------------
    def layer_time_s(self, gpu: str, model: ModelSpec, dtype: str, mbs: int, seq_len: int, tp: int) -> tuple[float, float] | None:
        """Measured ``(forward_s, backward_s)`` of one transformer layer of ``model`` (see :meth:`kind_time_s`)."""
        return self.kind_time_s("layer", gpu, model, dtype, mbs, seq_len, tp)

    def kind_time_s(self, kind: str, device: str, model: ModelSpec, dtype: str, mbs: int, seq_len: int,
                    tp: int) -> tuple[float, float] | None:
        """Measured ``(forward_s, backward_s)`` of one micro-batch of ``kind`` (``layer``, ``embedding``, ``head``).

        Interpolation. Points of the same key measured at several ``(mbs, seq_len)``: for each measured
        sequence length the time at ``mbs`` is interpolated linearly between the two nearest measured micro-batch
        sizes; then linearly in sequence length between the two nearest measured sequence lengths. Outside the
        measured range (and when ``extrapolate``) the nearest point is scaled by the ratio of analytic layer FLOPs
        (:func:`hetplan.model.counts.layer_forward_flops`, which is linear in mbs and has the s² attention term;
        for the embedding, linear in tokens; for the head, :func:`~hetplan.model.counts.head_forward_flops`).
        Returns None when the key has no points (or the query is outside the range and ``extrapolate`` is False).
        """
        device = normalize_device(device)
        pts = self.points(device, dtype, kind, LayerShape.of(model, kind), tp)
        if not pts:
            return None
        by_s: dict[int, dict[int, tuple[float, float]]] = {}
        for (b, s), v in pts.items():
            by_s.setdefault(s, {})[b] = v

        def work(b: float, s: float) -> float:
            if kind == "layer":
                return float(counts.layer_forward_flops(model, b, s))
            if kind == "head":
                return float(counts.head_forward_flops(model, b, s))
            return b * s

        def interp(xs: list[int], x: float, value, scale) -> tuple[float, float] | None:
            i = bisect.bisect_left(xs, x)
            if i < len(xs) and xs[i] == x:
                return value(xs[i])
            if 0 < i < len(xs):
                lo, hi = xs[i - 1], xs[i]
                w = (x - lo) / (hi - lo)
                a, c = value(lo), value(hi)
                if a is None or c is None:
                    return None
                return (a[0] + w * (c[0] - a[0]), a[1] + w * (c[1] - a[1]))
            if not self.extrapolate:
                return None
            near = xs[0] if i == 0 else xs[-1]
            v = value(near)
            if v is None:
                return None
            r = scale(near)
            return (v[0] * r, v[1] * r)

        seqs = sorted(by_s)

        def at_seq(s: int):
            bs = sorted(by_s[s])
            return interp(bs, mbs, lambda b: by_s[s][b], lambda b: work(mbs, s) / work(b, s))

        return interp(seqs, seq_len, at_seq, lambda s: work(mbs, seq_len) / work(mbs, s))

    def comm_bandwidth_bytes_per_s(self, device: str, collective: str, world_size: int, backend: str | None = None) -> float | None:
        """Largest measured bus bandwidth of ``collective`` over ``world_size`` ranks (bytes/s), or None."""
        sql = ("SELECT MAX(bandwidth_bytes_per_s) FROM comm_times WHERE lower(device) = lower(?) AND collective = ? "
               "AND world_size = ?" + (" AND backend = ?" if backend else ""))
        args = (normalize_device(device), collective, world_size) + ((backend,) if backend else ())
        row = self.conn.execute(sql, args).fetchone()
        return None if row is None or row[0] is None else float(row[0])


def bundled_profiles() -> ProfileDB:
    """An in-memory database of the measured profiles shipped as package data (``hetplan/profile/data/*.csv``,
    each dated and with its software versions in the rows); empty when none ship yet (none were measured on a
    GPU so far, see docs/runtime.md)."""
    from importlib import resources

    db = ProfileDB(":memory:")
    try:
        folder = resources.files("hetplan.profile").joinpath("data")
        files = [f for f in folder.iterdir() if f.name.endswith(".csv")] if folder.is_dir() else []
    except (FileNotFoundError, ModuleNotFoundError):  # pragma: no cover
        files = []
    for f in files:
        with resources.as_file(f) as path:
            db.import_csv(path)
    return db
