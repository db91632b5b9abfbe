"""Reading jobs, inventories and plans from TOML/JSON files, with errors that name the bad field.

A job file (``hetplan plan JOB.toml``) has the sections::

    [job]            # hetplan.plan.Job: model, seq_len, global_batch, train_tokens | train_iterations, dtype,
                     #   attention = "standard" | "flash", framework = "megatron" | "deepspeed"
    [[inventory]]    # one table per GPU pool: hetplan.plan.GPUPool (gpu, count, gpus_per_node, ...)
    [objective]      # hetplan.search.objective.Objective: goal, deadline_s | deadline_days, budget_usd, slo_iteration_s
    [pin]            # optional fixed dimensions: tp, pp, dp, mbs, zero, recompute, num_gpus
    [search]         # optional: heterogeneous = false (only plans on one GPU type)

Convenience units accepted in files (converted to SI on load): ``inter_node_bandwidth_gbit_per_s`` (Gb/s),
``intra_node_bandwidth_gb_per_s`` (GB/s), ``deadline_days``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from hetplan.errors import HetplanError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

T = TypeVar("T", bound=BaseModel)


def validated(cls: type[T], data: Any, where: str) -> T:
    """``cls.model_validate(data)``, turning the first validation error into a :class:`HetplanError` that names
    the field as ``where.field`` and says what is expected.

    Raises:
        HetplanError: invalid or unknown field.
    """
    try:
        return cls.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(p) for p in (where, *err["loc"]) if p != "")
        if err["type"] == "extra_forbidden":
            allowed = ", ".join(_model_at(cls, err["loc"][:-1]).model_fields)
            raise HetplanError("unknown field", field=loc, fix=f"allowed fields here: {allowed}") from None
        if err["type"] == "missing":
            raise HetplanError("required field is missing", field=loc, fix="add it") from None
        got = err.get("input")
        raise HetplanError(f"{err['msg']} (got {got!r})", field=loc, fix="correct the value") from None


def _model_at(cls: type[BaseModel], loc: tuple) -> type[BaseModel]:
    """The pydantic model that holds the field at ``loc`` inside ``cls`` (list indices skipped), or ``cls`` when the
    path leaves the models."""
    import typing

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


def read_structured(path: str | Path) -> dict:
    """Parse a TOML or JSON file (by extension; JSON also when the text starts with ``{``).

    Raises:
        HetplanError: missing file, or malformed content (with line and column).
    """
    p = Path(path)
    if not p.is_file():
        raise HetplanError(f"file {path} does not exist", field=str(path), fix="check the path")
    text = p.read_text()
    if p.suffix == ".json" or text.lstrip().startswith("{"):
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise HetplanError(
                f"malformed JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}", field=str(path),
                fix="fix the JSON syntax there",
            ) from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise HetplanError(f"malformed TOML: {exc}", field=str(path), fix="fix the TOML syntax at that line") from None


def normalise_pool(raw: dict) -> dict:
    """Convert the convenience bandwidth units of one inventory entry to bytes/s."""
    out = dict(raw)
    if "inter_node_bandwidth_gbit_per_s" in out:
        out["inter_node_bandwidth_bytes_per_s"] = out.pop("inter_node_bandwidth_gbit_per_s") * 1e9 / 8
    if "intra_node_bandwidth_gb_per_s" in out:
        out["intra_node_bandwidth_bytes_per_s"] = out.pop("intra_node_bandwidth_gb_per_s") * 1e9
    return out


def normalise_objective(raw: dict) -> dict:
    """Convert ``deadline_days`` to ``deadline_s``."""
    out = dict(raw)
    if "deadline_days" in out:
        out["deadline_s"] = out.pop("deadline_days") * 86400.0
    return out


def load_job_file(path: str | Path) -> dict:
    """The sections of a job file as plain dicts (``job``, ``inventory`` list, ``objective``, ``pin``),
    convenience units converted. Validation into pydantic models is left to the caller, which may first merge
    command-line flags.

    Raises:
        HetplanError: malformed file or unknown section.
    """
    data = read_structured(path)
    known = {"job", "inventory", "objective", "pin", "search"}
    for key in data:
        if key not in known:
            raise HetplanError(f"unknown section [{key}]", field=f"{path}:{key}", fix=f"sections are {', '.join(sorted(known))}")
    inventory = data.get("inventory", [])
    if isinstance(inventory, dict):
        inventory = inventory.get("pools", [inventory])
    return {
        "job": data.get("job", {}),
        "inventory": [normalise_pool(p) for p in inventory],
        "objective": normalise_objective(data.get("objective", {})),
        "pin": data.get("pin", {}),
        "search": data.get("search", {}),
    }
