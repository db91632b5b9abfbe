"""Importers of other systems' measured profiles into a :class:`~hetplan.profile.db.ProfileDB` (no torch needed).

Formats (see ``shared/data/README.md``):

* **FASOP** (Hwang et al., HPDC'24; ``known_cost/*.npy`` converted to CSV): ``model,gpu,tp,index,kind,
  forward_time_s_mbs1`` — forward time (s) of each layer at micro-batch 1 in fp16 under Megatron-LM, index 0 the
  embedding, the last index the post-process (head). FASOP takes backward = 2 x forward; so do we. FASOP's model
  names carry no shapes, so the caller maps them to a :class:`ModelSpec` and sequence length
  (:data:`FASOP_MODELS` maps ``gpt2XL`` to the ``gpt2-xl`` preset at sequence length 1024, FASOP's GPT-2 setting).
  FASOP's GPU names are AWS instance families or cards (:data:`FASOP_GPUS`).
* **Aceso** (Liu et al., EuroSys'24): one CSV per ``{model}_{size}_mbs{B}_tp{T}_algo{A}.csv`` with per-op
  ``forward-compute``/``backward-compute`` in microseconds (TP communication included). A layer is the sum of the
  ``enc-*`` ops, the embedding ``encoder-embedding``, the head ``final-layernorm`` + ``gpt-post-process``. Only
  algo 0 (no recomputation) is imported as layer time. Measured on V100-SXM2-32GB; GPT-3 1.3B at sequence length
  2048 (Aceso's setting), fp16. ``prim_*`` / ``p2p`` files hold collectives (imported into ``comm_times``).
* **Espresso traces**: DeepSpeed pipeline runs; one folder per rank ``{rank}_{run}_{b0}_{b1}_..._tmp`` with
  ``operations_record.csv`` (``task,start_time,end_time,duration,rank,max_mem,alloc_mem``; seconds, bytes). We store
  per stage the median ForwardPass / BackwardPass duration (the first :data:`ESPRESSO_WARMUP_MICROBATCHES`
  micro-batches of each rank are warm-up and dropped; :func:`read_espresso_rank`, the one reader of these traces)
  and the peak ``max_mem`` in ``stage_times``; GPU types from the run name (``2A30_A4000`` = A30, A30,
  A4000 in stage order).
"""

from __future__ import annotations

import csv
import io
import math
import re
import statistics
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from hetplan.errors import HetplanError
from hetplan.inputs import read_csv, read_text
from hetplan.model.spec import ModelSpec, load_model
from hetplan.profile.db import CommRecord, LayerRecord, LayerShape, ProfileDB, normalize_device

#: FASOP GPU labels -> catalog names. G4 = AWS g4dn (T4); P3 = AWS p3 (V100-SXM2; p3 has the 16 GB part, the catalog
#: has the 32 GB one — same chip and clocks); A10 = AWS g5, whose GPU is the A10G; A100 = AWS p4d (A100-SXM4-40GB).
FASOP_GPUS = {"a100": "A100-SXM-40GB", "a10": "A10G", "rtx3090": "RTX-3090", "g4": "T4", "p3": "V100-SXM-32GB"}

#: FASOP model labels -> (preset, sequence length). Other labels (gpt2, gpt2_medium, bert, T5, transgan) have
#: shapes FASOP does not record; pass ``models=`` to import them.
FASOP_MODELS = {"gpt2xl": ("gpt2-xl", 1024)}

ACESO_DEVICE = "V100-SXM-32GB"
#: Aceso model labels -> (preset, sequence length).
ACESO_MODELS = {"gpt_1_3B": ("gpt3-1.3b", 2048)}

_ESPRESSO_GPUS = {"a30": "A30", "a4000": "RTX-A4000", "a6000": "RTX-A6000", "a60000": "RTX-A6000", "3090": "RTX-3090", "a10g": "A10G",
                  "t4": "T4", "v100": "V100-SXM-32GB"}


#: Micro-batches dropped from the front of each Espresso rank's forward / backward list: warm-up (the first forward
#: takes ~3x the others on every trace, the second is still ~1 % slow).
ESPRESSO_WARMUP_MICROBATCHES = 2


@dataclass(frozen=True)
class EspressoRank:
    """One rank's ``operations_record.csv``: its ``records`` (dicts of the CSV columns), the median forward and
    backward seconds of one micro-batch after :data:`ESPRESSO_WARMUP_MICROBATCHES`, and the peak ``max_mem``
    (bytes allocated)."""

    records: list[dict]
    forward_s: float
    backward_s: float
    peak_memory_bytes: float

    def durations(self, task: str) -> list[float]:
        """Every ``duration`` (s) of instruction ``task`` (``SendActivation``, ``OptimizerStep``, ...), in order."""
        return [float(r["duration"]) for r in self.records if r["task"] == task]


def read_espresso_rank(folder: str | Path) -> EspressoRank | None:
    """Read one Espresso rank folder (module doc); None when it holds no forward or backward after warm-up.

    Raises:
        HetplanError: the folder has no ``operations_record.csv``.
    """
    path = Path(folder) / "operations_record.csv"
    ops = _open_csv(path, {"task", "duration", "max_mem"}, "an Espresso operations_record.csv")
    fw = [_num(o, "duration", path) for o in ops if o["task"] == "ForwardPass"][ESPRESSO_WARMUP_MICROBATCHES:]
    bw = [_num(o, "duration", path) for o in ops if o["task"] == "BackwardPass"][ESPRESSO_WARMUP_MICROBATCHES:]
    if not fw or not bw:
        return None
    return EspressoRank(ops, statistics.median(fw), statistics.median(bw), max(_num(o, "max_mem", path) for o in ops))


def _open_csv(path: Path, need: set[str] | frozenset[str] = frozenset(), what: str = "") -> list[dict]:
    """The rows of a CSV file; its header must name the ``need`` columns (checked even when no row follows: a
    CSV of unrelated columns imported nothing and said nothing). Each row gets ``_line`` (its line number).

    Raises:
        HetplanError: unreadable file, a row of more cells than the header (:func:`hetplan.inputs.read_csv`), or
            columns missing (``what``: the format, for the fix)."""
    names, rows = read_csv(read_text(path, "path"), str(path), "path", line_key="_line")
    header = set(names or ())
    if not need <= header:
        raise HetplanError(f"{path} lacks columns {sorted(need - header)} (it has {sorted(header)[:8]})",
                           field="path", fix=f"give {what or 'a file of the expected format'}")
    return rows


def _num(row: dict, key: str, path, integer: bool = False, positive: bool = False) -> float:
    """Column ``key`` of ``row`` as a finite number >= 0 (> 0 under ``positive``; an int under ``integer``): a
    text, NaN, infinite or negative time would be stored as a measurement and price plans with it (issue 27).

    Raises:
        HetplanError: naming the file, line and column."""
    raw = row.get(key)
    try:
        value = int(raw) if integer else float(raw)
    except (TypeError, ValueError):
        value = None
    if value is None or not math.isfinite(value) or value < 0 or (positive and value == 0):
        kind = "a whole number" if integer else "a finite number"
        raise HetplanError(f"{path} line {row.get('_line', '?')}: {key} = {raw!r} is not {kind} "
                           f"{'> 0' if positive else '>= 0'}", field=f"path.{key}",
                           fix="correct or remove that row")
    return value


def _device(name: str, field: str) -> str:
    """The catalog name of GPU ``name`` (an alias or vendor name works): a profile of a GPU the catalog does not
    know would never be looked up (plans name catalog GPUs) and would be imported for nothing.

    Raises:
        HetplanError: unknown GPU."""
    from hetplan.hardware.catalog import load_catalog

    device = normalize_device(name)
    try:
        return load_catalog().get(device).name
    except HetplanError:
        raise HetplanError(f"unknown GPU {name!r}", field=field,
                           fix="name a GPU of the catalog (hetplan catalog gpus)") from None


def _some(n: int, path, what: str) -> int:
    """``n`` rows imported; none is an error (a file of another format, or labels no --model maps)."""
    if n == 0:
        raise HetplanError(f"nothing imported from {path}: {what}", field="path",
                           fix="check the format and the --model LABEL=MODEL mappings")
    return n


def import_fasop(db: ProfileDB, path: str | Path, models: dict[str, tuple[ModelSpec | str, int]] | None = None,
                 dtype: str = "fp16") -> int:
    """Import FASOP's layer forward times (CSV, see module doc). Returns the number of rows written.

    Each (model, gpu, tp) gives one ``layer`` row (median over its layers; FASOP repeats one figure), one
    ``embedding`` and one ``head`` row, at micro-batch 1. ``models`` maps FASOP model labels (case-insensitive) to a
    model spec or preset name and its sequence length (default :data:`FASOP_MODELS`); unmapped labels are skipped.

    Raises:
        HetplanError: missing file or missing columns.
    """
    need = {"model", "gpu", "tp", "index", "kind", "forward_time_s_mbs1"}
    rows = _open_csv(Path(path), need, "FASOP's converted CSV (model,gpu,tp,index,kind,forward_time_s_mbs1)")
    mapping = {k.lower(): v for k, v in (models or FASOP_MODELS).items()}
    groups: dict[tuple, list[float]] = defaultdict(list)
    for r in rows:
        tp = int(_num(r, "tp", path, integer=True, positive=True))
        groups[(r["model"].lower(), r["gpu"].lower(), tp, r["kind"])].append(
            _num(r, "forward_time_s_mbs1", path, positive=True))
    recs = []
    for (model, gpu, tp, kind), times in groups.items():
        if model not in mapping:
            continue
        spec, seq = mapping[model]
        spec = load_model(spec) if isinstance(spec, str) else spec
        device = _device(FASOP_GPUS.get(gpu, gpu), "path.gpu")
        ours = {"layer": "layer", "embedding": "embedding", "post_process": "head"}.get(kind)
        if ours is None:
            continue
        f = statistics.median(times)
        recs.append(LayerRecord(device=device, dtype=dtype, kind=ours, shape=LayerShape.of(spec, ours),
                                mbs=1, seq_len=seq, tp=tp, forward_s=f, backward_s=2 * f, source="fasop",
                                software="Megatron-LM (FASOP HPDC'24 known_cost)"))
    return _some(db.add_layers(recs), path, f"no row of a mapped model ({', '.join(sorted(mapping))})")


_ACESO_NAME = re.compile(r"^(?P<model>.+)_mbs(?P<mbs>\d+)_tp(?P<tp>\d+)_algo(?P<algo>\d+)\.csv$")


def import_aceso(db: ProfileDB, directory: str | Path, models: dict[str, tuple[ModelSpec | str, int]] | None = None,
                 device: str = ACESO_DEVICE, dtype: str = "fp16") -> int:
    """Import Aceso's per-op profiles from ``directory`` (see module doc). Returns rows written (layer times plus
    collectives).

    ``models`` maps Aceso file prefixes (``gpt_1_3B``) to a spec or preset and sequence length (default
    :data:`ACESO_MODELS`); other prefixes (t5, resnet) are skipped.

    Raises:
        HetplanError: ``directory`` is not a directory.
    """
    d = Path(directory)
    if not d.is_dir():
        raise HetplanError(f"{d} is not a directory", field="path", fix="give Aceso's profiled-time directory")
    mapping = models or ACESO_MODELS
    device = _device(device, "--device")
    recs = []
    for f in sorted(d.glob("*.csv")):
        m = _ACESO_NAME.match(f.name)
        if not m or m["model"] not in mapping or m["algo"] != "0":
            continue
        spec, seq = mapping[m["model"]]
        spec = load_model(spec) if isinstance(spec, str) else spec
        ops = _open_csv(f, {"op_name", "forward-compute", "backward-compute"}, "an Aceso per-op profile CSV")
        sums = {"layer": [0.0, 0.0], "embedding": [0.0, 0.0], "head": [0.0, 0.0]}
        for op in ops:
            name = op["op_name"]
            kind = ("layer" if name.startswith("enc-") else "embedding" if name == "encoder-embedding"
                    else "head" if name in ("final-layernorm", "gpt-post-process") else None)
            if kind:
                sums[kind][0] += _num(op, "forward-compute", f) * 1e-6
                sums[kind][1] += _num(op, "backward-compute", f) * 1e-6
        for kind, (fw, bw) in sums.items():
            recs.append(LayerRecord(device=device, dtype=dtype, kind=kind, shape=LayerShape.of(spec, kind),
                                    mbs=int(m["mbs"]), seq_len=seq, tp=int(m["tp"]), forward_s=fw, backward_s=bw,
                                    source="aceso", software="Megatron-LM (Aceso EuroSys'24 profiled-time-miniset)"))
    n = db.add_layers(recs)
    # Collectives: prim_{model}_{size}_{collective}_{n}gpus.csv with data_size(MB),time(ms).
    prim = re.compile(r"^prim_.+?_(?P<coll>all_gather|all_to_all|all_reduce|reduce_scatter)_(?P<n>\d+)gpus\.csv$")
    for f in sorted(d.glob("prim_*.csv")):
        pm = prim.match(f.name)
        if not pm:
            continue
        nranks = int(pm["n"])
        factor = {"all_reduce": 2 * (nranks - 1) / nranks}.get(pm["coll"], (nranks - 1) / nranks)
        for r in _open_csv(f, {"data_size(MB)", "time(ms)"}, "an Aceso collective CSV"):
            size = _num(r, "data_size(MB)", f) * 2**20
            t = _num(r, "time(ms)", f, positive=True) * 1e-3
            db.add_comm(CommRecord(device=device, backend="nccl", collective=pm["coll"].replace("_", "-"),
                                   world_size=nranks, message_bytes=size, time_s=t,
                                   bandwidth_bytes_per_s=size / t * factor, source="aceso",
                                   software="Aceso EuroSys'24"), commit=False)
            n += 1
    p2p = d / "p2p_intra_node.csv"
    if p2p.is_file():
        header, values = (list(csv.reader(io.StringIO(read_text(p2p, "path"), newline=""))) + [[], []])[:2]
        # Header: message sizes in MB; values: bandwidth in GB/s (Aceso's p2p benchmark).
        for size_mb, gbps in zip(header, values):
            size = _num({"size_mb": size_mb, "_line": 1}, "size_mb", p2p, positive=True) * 2**20
            bw = _num({"gbps": gbps, "_line": 2}, "gbps", p2p, positive=True) * 1e9
            db.add_comm(CommRecord(device=device, backend="nccl", collective="send-recv", world_size=2,
                                   message_bytes=size, time_s=size / bw, bandwidth_bytes_per_s=bw, source="aceso",
                                   software="Aceso EuroSys'24"), commit=False)
            n += 1
    db.commit()
    return _some(n, d, f"no {', '.join(sorted(mapping))} profile (files *_mbsB_tpT_algo0.csv)")


_RANK_DIR = re.compile(r"^(?P<rank>\d+)_(?P<run>.+?)_(?P<bounds>0(?:_\d+)+)_tmp$")


def espresso_gpus(run: str) -> list[str]:
    """GPU types in stage order from an Espresso run name: ``motivation1_2A30_A4000`` -> ``[A30, A30, RTX-A4000]``.
    Unknown tokens are skipped; returns ``[]`` when the name lists no GPUs."""
    out = []
    for tok in run.split("_"):
        m = re.fullmatch(r"(\d*)([A-Za-z]*\d+[A-Za-z]*)", tok)
        if not m:
            continue
        count, name = m.groups()
        key = name.lower()
        if key not in _ESPRESSO_GPUS:
            # "33090" = 3 x 3090, "2A60000" (sic) = 2 x A6000
            for known in sorted(_ESPRESSO_GPUS, key=len, reverse=True):
                if tok.lower().endswith(known) and tok[: -len(known)].isdigit():
                    count, key = tok[: -len(known)], known
                    break
            else:
                continue
        out += [_ESPRESSO_GPUS[key]] * int(count or 1)
    return out


def import_espresso(db: ProfileDB, run_dir: str | Path, mbs: int | None = 8, seq_len: int | None = 2000) -> int:
    """Import one Espresso run folder (one sub-folder per rank, see module doc) into ``stage_times``.

    Returns the number of stages written. ``mbs``/``seq_len`` are recorded with the stages (Espresso's llama-1.3B
    runs: micro-batch most likely 8, sequence length 2000).

    Raises:
        HetplanError: the folder holds no rank folders.
    """
    d = Path(run_dir)
    ranks = [(m, p) for p in d.iterdir() if p.is_dir() and (m := _RANK_DIR.match(p.name))] if d.is_dir() else []
    if not ranks:
        raise HetplanError(f"{d} holds no Espresso rank folders ({{rank}}_{{run}}_{{bounds}}_tmp)", field="path",
                           fix="give one run folder of shared/data/traces/espresso_hetero")
    n = 0
    for m, p in sorted(ranks, key=lambda mp: int(mp[0]["rank"])):
        rank = int(m["rank"])
        bounds = [int(x) for x in m["bounds"].split("_")]
        gpus = espresso_gpus(m["run"]) or espresso_gpus(d.name)
        device = gpus[rank] if rank < len(gpus) else "unknown"
        if not (p / "operations_record.csv").is_file():
            continue
        r = read_espresso_rank(p)
        if r is None:
            continue
        db.add_stage(source="espresso", run=f"{d.name}/{m['run']}_{m['bounds']}", device=device, stage=rank,
                     first_layer=bounds[rank], end_layer=bounds[rank + 1], forward_s=r.forward_s,
                     backward_s=r.backward_s, mbs=mbs, seq_len=seq_len, peak_memory_bytes=r.peak_memory_bytes,
                     commit=False)
        n += 1
    db.commit()
    return n
