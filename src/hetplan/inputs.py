"""Reading what a user hands to hetplan: every file goes through :func:`read_text`, every parsed table through
pydantic models whose errors :func:`validation_message` turns into one :class:`~hetplan.errors.HetplanError`.

So each way a file can be wrong gives one message naming the file (and the field) and exit code 2, never a
traceback: a missing path, a directory, no permission, a file far larger than what it claims to be, bytes that
are not UTF-8 (the message gives the byte offset), binary content, malformed TOML/JSON (line and column),
nesting too deep for the parser, a top level that is not a table.

Numbers are bounded where they are declared (pydantic ``Field(le=..., json_schema_extra={"why": ...})``, made
by :func:`bounded`); the reason a bound exists is shown with the error, e.g. "job.global_batch: Input should be
less than or equal to 65536 (got 1000000000000): 65,536 sequences is LAMB's record batch ...". A boolean is no
number (:class:`UserInput`): "job.train_iterations: train_iterations is a number, not true".
"""

from __future__ import annotations

import csv
import io
import json
import os
import sys
import types
import typing
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, ValidationError, model_validator

from hetplan.errors import HetplanError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

#: Largest input file read (bytes). The biggest legitimate inputs are profile CSVs and traces of a few MB; a
#: job, plan, catalog or config.json is a few kB.
MAX_FILE_BYTES = 64 * 2**20


def read_text(path: str | Path, field: str, max_bytes: int = MAX_FILE_BYTES) -> str:
    """The UTF-8 text of a user file.

    Args:
        path: the file.
        field: what the file is, for the message (``"job file"``, ``"--catalog"``, ``"workload.trace"``).
        max_bytes: refuse larger files (a file that big is not what it claims to be).

    Raises:
        HetplanError: missing, a directory, unreadable, too large, not UTF-8 (with the byte offset), or binary.
    """
    p = Path(path)
    check_path_name(p, field)
    try:
        if p.is_dir():
            raise HetplanError(f"{p} is a directory, not a file", field=field, fix="give the path of a file")
        with p.open("rb") as f:  # at most max_bytes + 1: /dev/zero or a pipe states no size and never ends (hang)
            data = f.read(max_bytes + 1)
        if len(data) > max_bytes:
            size = p.stat().st_size
            what = f"{size:,} bytes" if size > max_bytes else f"a stream of more than {max_bytes:,} bytes"
            raise HetplanError(f"{p} is {what}; a {field} is at most {max_bytes:,}", field=field,
                               fix="check that this is the right file")
    except FileNotFoundError:
        raise HetplanError(f"file {p} does not exist", field=field, fix="check the path") from None
    except PermissionError:
        raise HetplanError(f"no permission to read {p}", field=field, fix="check the file's permissions") from None
    except OSError as exc:
        raise HetplanError(f"cannot read {p}: {exc.strerror or exc}", field=field, fix="check the path") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise HetplanError(f"{p} is not UTF-8 text (byte {exc.start}: {data[exc.start]:#04x})",
                           field=field, fix="save the file as UTF-8 text") from None
    if "\x00" in text:
        raise HetplanError(f"{p} holds a NUL byte at offset {data.index(0)}: it is binary, not text", field=field,
                           fix="give a text file") from None
    return text.removeprefix("\ufeff")


def parse_json(text: str, origin: str, field: str | None = None) -> Any:
    """``json.loads(text)`` with errors naming ``origin`` (the file), the line and the column; ``field`` (default
    ``origin``) is the input the error is filed under.

    Raises:
        HetplanError: malformed, or nested too deeply for the parser.
    """
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise HetplanError(f"malformed JSON in {origin} at line {exc.lineno}, column {exc.colno}: {exc.msg}",
                           field=field or origin, fix="fix the JSON syntax there") from None
    except RecursionError:
        raise HetplanError(f"{origin} is nested too deeply to be a hetplan input", field=field or origin,
                           fix="check that this is the right file") from None


def parse_toml(text: str, origin: str, field: str | None = None) -> dict:
    """``tomllib.loads(text)`` with errors naming ``origin`` (the file) and the line; ``field`` as for
    :func:`parse_json`.

    Raises:
        HetplanError: malformed, or nested too deeply for the parser.
    """
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise HetplanError(f"malformed TOML in {origin}: {exc}", field=field or origin,
                           fix="fix the TOML syntax at that line") from None
    except RecursionError:
        raise HetplanError(f"{origin} is nested too deeply to be a hetplan input", field=field or origin,
                           fix="check that this is the right file") from None


def read_table(path: str | Path, field: str) -> dict:
    """A TOML or JSON file (JSON by the ``.json`` extension or a leading ``{``) whose top level is a table.

    Raises:
        HetplanError: any problem of :func:`read_text`, malformed content, or a top level that is not a table.
    """
    text = read_text(path, field)
    origin = str(path)
    if str(path).endswith(".json") or text.lstrip().startswith("{"):
        data = parse_json(text, origin, field)
    else:
        data = parse_toml(text, origin, field)
    if not isinstance(data, dict):
        raise HetplanError(f"{origin} holds a JSON {type(data).__name__}, not an object", field=field,
                           fix="the top level must be an object {...} of named fields")
    return data


def read_csv(text: str, origin: str, field: str, line_key: str | None = None) -> tuple[list[str] | None, list[dict]]:
    """The header (``None`` when the text is empty) and the rows (dicts) of CSV ``text``; ``line_key``: also give
    each row its line number under that key.

    Raises:
        HetplanError: the csv module refuses it (e.g. a field longer than its 128 kB limit, a NUL byte); a header
            of one column holding semicolons or tabs (a file separated by them, as spreadsheets in many locales save
            "CSV": it read as one unknown column); a row with more or fewer cells than the header (fewer: its last
            columns read as empty, and a trace's missing max_new_tokens took the default unsaid); a column named
            twice.
    """
    reader = csv.DictReader(io.StringIO(text, newline=""))
    rows = []
    try:
        header = reader.fieldnames
        sep = next((s for s in (";", "\t") if header and len(header) == 1 and s in header[0]), None)
        if sep is not None:
            shown = repr(header[0]) if len(header[0]) <= 50 else repr(header[0][:50]) + "..."
            raise HetplanError(f"{origin}: the header is one column, {shown}: the file is separated by {sep!r}, "
                               "not commas", field=field,
                               fix="save it as comma-separated values (a spreadsheet's \"CSV (comma delimited)\")")
        for row in reader:
            if None in row:  # DictReader files cells past the header under the key None, a list no reader expects
                raise HetplanError(f"{origin} line {reader.line_num}: {len(header or ()) + len(row[None])} cells "
                                   f"under a header of {len(header or ())} columns", field=field,
                                   fix="remove the extra cells (a comma too many, or an unquoted comma in a "
                                       "value), or name their column in the header")
            if None in row.values():  # DictReader fills a short row's last columns with None: read as left empty
                given = sum(v is not None for v in row.values())
                raise HetplanError(f"{origin} line {reader.line_num}: {given} cells under a header of "
                                   f"{len(header or ())} columns", field=field,
                                   fix="add the missing cells (an empty one between two commas is allowed), or "
                                       "remove their columns from the header")
            rows.append(row if line_key is None else {**row, line_key: reader.line_num})
    except csv.Error as exc:
        raise HetplanError(f"{origin} line {reader.line_num}: not a CSV file ({exc})", field=field,
                           fix="give a comma-separated text file with a header line") from None
    twice = sorted({c for c in header or () if list(header or ()).count(c) > 1})
    if twice:  # DictReader keeps the last of two same-named columns: the first would be dropped unsaid
        raise HetplanError(f"{origin}: column(s) {', '.join(map(repr, twice))} appear more than once in the header",
                           field=field, fix="keep one column of each name")
    return header, rows


#: Figure formats matplotlib's ``savefig`` writes (``FigureCanvasBase.get_supported_filetypes()`` of matplotlib 3.9+).
FIGURE_SUFFIXES = (".png", ".pdf", ".svg", ".svgz", ".eps", ".ps", ".jpg", ".jpeg", ".tif", ".tiff", ".webp",
                   ".gif", ".avif", ".pgf", ".raw", ".rgba")


#: Linux's limits (include/uapi/linux/limits.h): NAME_MAX bytes a path component, PATH_MAX bytes a path. Past them
#: ``Path.exists()`` / ``is_dir()`` raise ``OSError(ENAMETOOLONG)`` instead of answering.
NAME_MAX_BYTES, PATH_MAX_BYTES = 255, 4096


def check_path_name(path: str | Path, field: str) -> None:
    """Refuse a path the file system cannot name (a component over 255 bytes or the whole over 4,096), before
    any ``exists()`` on it raises ``ENAMETOOLONG`` (fuzz: ``-o``, ``--out-dir``, ``import``, ``--db`` of 5,000
    characters were tracebacks).

    Raises:
        HetplanError: naming ``field``.
    """
    raw = os.fsencode(str(path))
    if len(raw) >= PATH_MAX_BYTES or any(len(part) > NAME_MAX_BYTES for part in raw.split(b"/")):
        raise HetplanError(f"path {str(path)[:40]}... ({len(raw):,} bytes) is longer than the file system allows "
                           f"({NAME_MAX_BYTES} bytes a name, {PATH_MAX_BYTES - 1:,} a path)", field=field,
                           fix="give a shorter path")


def check_output_path(path: Path | None, field: str, figure: bool = False) -> None:
    """Refuse an output path before any work: its folder missing or a file, the path a folder, or (``figure``)
    a suffix matplotlib cannot write (fuzz: ``--timeline t.txt`` and ``--pareto /missing/p.png`` were tracebacks).

    Raises:
        HetplanError: naming ``field``.
    """
    if path is None:
        return
    check_path_name(path, field)
    if path.is_dir() or not path.parent.is_dir():
        raise HetplanError(f"cannot write {path}: " + ("it is a folder" if path.is_dir() else
                                                        f"folder {path.parent} does not exist"),
                           field=field, fix="give a file path in an existing folder")
    if figure and path.suffix.lower() not in FIGURE_SUFFIXES:
        raise HetplanError(f"cannot draw a figure to {path.name}: unknown image format {path.suffix or '(none)'!r}",
                           field=field, fix="end the file name in .png, .svg or .pdf")


def bounded(limit: float, why: str, *, why_low: str | None = None, units: tuple[str, str, float] | None = None,
            **field_kwargs) -> Any:
    """A pydantic ``Field`` bounded above by ``limit`` (and by ``field_kwargs``' ``gt``/``ge`` below), whose error
    message gives ``why``, the reason for the upper bound, when a value passes it, and ``why_low`` (if given) when
    a value falls below the lower one — "a million GPUs is 5x the largest cluster built" explains nothing about -8.
    A ``why`` that spans both bounds ("from 1 Gb/s ... to 80 Tb/s") serves both. ``units``: ``(unit, other unit,
    factor to it)`` of a field users also give in the other unit (``("bytes/s", "Gb/s", 8e-9)``): the error gives
    the value and the bound in the other unit first (it said 1.25e+20 and 1e13 for the 1e12 Gb/s a user wrote)."""
    if why_low is None and why.startswith("from "):
        why_low = why
    return Field(le=limit, json_schema_extra={"why": why, "why_low": why_low, "units": units}, **field_kwargs)


def _alternatives(annotation: Any) -> tuple:
    """The types a field's annotation admits: the members of a union, else the annotation itself."""
    union = typing.get_origin(annotation) in (typing.Union, types.UnionType)
    return typing.get_args(annotation) if union else (annotation,)


def _takes_number(annotation: Any) -> bool:
    """Whether a field's type is a number (``int``, ``float``, a ``Literal`` of integers, optionally ``None``) and
    not a boolean."""
    args = _alternatives(annotation)
    literal = [a for a in args if typing.get_origin(a) is typing.Literal]
    numbers = any(a in (int, float) for a in args) or any(
        all(isinstance(v, int) and not isinstance(v, bool) for v in typing.get_args(a)) for a in literal)
    return numbers and bool not in args


def _takes_text(annotation: Any) -> bool:
    """Whether a field's type admits a string (``str``, a ``Literal`` with a string, a path)."""
    return any(a is str or a is Path or (typing.get_origin(a) is typing.Literal
                                         and any(isinstance(v, str) for v in typing.get_args(a)))
               for a in _alternatives(annotation))


class UserInput(BaseModel):
    """Base of the models a user's file fills (job, plan, pools, stages, catalogs, serving configs): a boolean
    or a quoted number where a number belongs is refused, naming the field. pydantic reads ``true`` as 1, so
    ``train_iterations = true`` ran one iteration and ``zero = true`` ZeRO-1 — a silently wrong number; and it
    reads ``seq_len = "4096"`` as 4096 where the CLI's pins refuse the text, so one file meant two things."""

    @model_validator(mode="before")
    @classmethod
    def _no_boolean_numbers(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for name, field in cls.model_fields.items():
                value = data.get(name)
                if isinstance(value, bool) and _takes_number(field.annotation):
                    raise ValueError(f"{name} is a number, not {str(value).lower()}; fix: give {name} a number")
                if isinstance(value, str) and _takes_number(field.annotation) and not _takes_text(field.annotation):
                    raise ValueError(f"{name} is a number, not the text {value[:40]!r}; fix: write the number "
                                     f"without quotes")
        return data


def validation_message(exc: ValidationError, where: str, cls: type[BaseModel] | None = None) -> HetplanError:
    """The first error of ``exc`` as a :class:`HetplanError` naming the field ``where.a.b``, the value given,
    what is expected and, for a bounded number, why the bound exists."""
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in (where, *err["loc"]) if p != "")
    info = _field_at(cls, err["loc"]) if cls is not None else None
    if err["type"] == "extra_forbidden":
        owner = _model_at(cls, err["loc"][:-1]) if cls is not None else None
        fix = f"allowed fields here: {', '.join(owner.model_fields)}" if owner else "remove it"
        return HetplanError("unknown field", field=loc, fix=fix)
    if err["type"] == "missing":
        what = f": {info.description.split('.')[0]}" if info is not None and info.description else ""
        return HetplanError("required field is missing", field=loc, fix=f"add {err['loc'][-1]}{what}")
    got = err.get("input")
    shown = repr(got) if len(repr(got)) <= 60 else repr(got)[:57] + "..."
    extra = info.json_schema_extra if info is not None and isinstance(info.json_schema_extra, dict) else {}
    why = extra.get("why_low" if err["type"] in ("greater_than_equal", "greater_than") else "why")
    if err["type"] in ("finite_number",):
        return HetplanError(f"must be a finite number (got {shown})", field=loc, fix="give a finite value")
    if err["type"] in ("less_than_equal", "less_than", "greater_than_equal", "greater_than"):
        text = f"{err['msg']} (got {shown})"
        if extra.get("units"):
            unit, other, factor = extra["units"]
            bound = next(iter(err["ctx"].values()))
            relation = {"less_than_equal": "at most", "less_than": "below", "greater_than_equal": "at least",
                        "greater_than": "above"}[err["type"]]
            text = (f"must be {relation} {bound * factor:,g} {other} = {bound:g} {unit} (got {got * factor:,g} "
                    f"{other} = {got:g} {unit})")
        return HetplanError(text + (f": {why}" if why else ""), field=loc, fix="give a value within the bounds")
    if err["type"] == "value_error" and isinstance(got, dict):  # a check across fields: the message names them
        msg, _, fix = err["msg"].removeprefix("Value error, ").partition("; fix: ")
        first = msg.split(" ", 1)[0]
        owner = _model_at(cls, err["loc"]) if cls is not None else None
        head = first.split(".", 1)[0]
        # the check names the field it refuses first ("fp8_recipe 'rowwise' is ..."), or its path in a section
        # ("scheduler.kv_cache_len = 256 ...", a section the file may leave to its defaults)
        if first in got or ("." in first and (head in got or (owner is not None and head in owner.model_fields))):
            loc = f"{loc}.{first}" if loc else first
        return HetplanError(msg, field=loc, fix=fix or "correct the values it names")
    if err["type"] == "value_error" and "; fix: " in err["msg"]:  # a field check that says its own fix
        msg, _, fix = err["msg"].removeprefix("Value error, ").partition("; fix: ")
        return HetplanError(f"{msg} (got {shown})", field=loc, fix=fix)
    return HetplanError(f"{err['msg']} (got {shown})", field=loc, fix="correct the value")


def _model_at(cls: type[BaseModel], loc: tuple) -> type[BaseModel]:
    """The pydantic model that holds the field at ``loc`` inside ``cls`` (list indices skipped), or ``cls`` when the
    path leaves the models."""
    for part in loc:
        if isinstance(part, int):
            continue
        field = cls.model_fields.get(part)
        if field is None:
            return cls
        inner = [a for a in (field.annotation, *typing.get_args(field.annotation))
                 if isinstance(a, type) and issubclass(a, BaseModel)]
        if not inner:
            return cls
        cls = inner[0]
    return cls


def _field_at(cls: type[BaseModel], loc: tuple):
    """The ``FieldInfo`` of the deepest model field on the path ``loc`` inside ``cls``, or ``None``."""
    info = None
    for part in loc:
        field = cls.model_fields.get(part) if isinstance(part, str) else None
        if field is None:
            continue
        info = field
        inner = [a for a in (field.annotation, *typing.get_args(field.annotation))
                 if isinstance(a, type) and issubclass(a, BaseModel)]
        if not inner:
            break
        cls = inner[0]
    return info
