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

from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from hetplan.errors import HetplanError
from hetplan.inputs import read_table, validation_message

T = TypeVar("T", bound=BaseModel)


def validated(cls: type[T], data: Any, where: str) -> T:
    """``cls.model_validate(data)``, turning the first validation error into a :class:`HetplanError` that names
    the field as ``where.field``, says what is expected and, for a bounded number, why
    (:func:`hetplan.inputs.validation_message`).

    Raises:
        HetplanError: invalid or unknown field, or ``data`` is not a table.
    """
    if not isinstance(data, dict):
        raise HetplanError(f"must be a table of fields, got {type(data).__name__} {_short(data)}", field=where,
                           fix=f"write [{where}] with key = value lines" if "." not in where else "give a table")
    try:
        return cls.model_validate(data)
    except ValidationError as exc:
        raise validation_message(exc, where, cls) from None


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def read_structured(path: str | Path) -> dict:
    """Parse a TOML or JSON file (by extension; JSON also when the text starts with ``{``) whose top level is a
    table, through :func:`hetplan.inputs.read_table`.

    Raises:
        HetplanError: missing or unreadable file, not UTF-8, malformed content (with line and column).
    """
    return read_table(path, str(path))


def _number(raw: dict, key: str, where: str) -> float:
    value = raw[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise HetplanError(f"must be a number, got {_short(value)}", field=f"{where}.{key}", fix="give a number")
    return value


def normalise_pool(raw: dict, where: str = "inventory") -> dict:
    """Convert the convenience bandwidth units of one inventory entry to bytes/s.

    Raises:
        HetplanError: the entry is not a table, a convenience field is not a number, or a bandwidth is given in
            both units (the bytes/s one was replaced without a word).
    """
    if not isinstance(raw, dict):
        raise HetplanError(f"must be a table, got {_short(raw)}", field=where,
                           fix="write one [[inventory]] table per GPU pool")
    out = dict(raw)
    for given, si, scale in (("inter_node_bandwidth_gbit_per_s", "inter_node_bandwidth_bytes_per_s", 1e9 / 8),
                             ("intra_node_bandwidth_gb_per_s", "intra_node_bandwidth_bytes_per_s", 1e9)):
        if given not in out:
            continue
        if si in out:
            raise HetplanError(f"give {given} or {si}, not both", field=f"{where}.{given}", fix="remove one of them")
        out[si] = _number(out, given, where) * scale
        del out[given]
    return out


def normalise_objective(raw: dict) -> dict:
    """Convert ``deadline_days`` to ``deadline_s``.

    Raises:
        HetplanError: both given (``deadline_days`` replaced ``deadline_s`` without a word), or ``deadline_days``
            not a positive number (its error named deadline_s, in seconds: "got -172800.0" for -2)."""
    out = dict(raw)
    if "deadline_days" in out and "deadline_s" in out:
        raise HetplanError("give deadline_days or deadline_s, not both", field="objective.deadline_days",
                           fix="remove one of them")
    if "deadline_days" in out:
        days = _number(out, "deadline_days", "objective")
        if not days > 0:
            raise HetplanError(f"must be positive, got {days}", field="objective.deadline_days",
                               fix="give the days the job may take, > 0")
        out["deadline_s"] = days * 86400.0
        del out["deadline_days"]
    return out


def resolve_model_path(model: str, job_file: str | Path) -> str:
    """A job file's ``model`` as the path it means: a relative path to a file resolves against the job file's
    folder (so an example runs from any folder); a preset name, an absolute path, or a relative path that only
    exists from the current folder (how job files were read before) is kept as given."""
    if not model or Path(model).is_absolute() or not (model.endswith(".json") or "/" in model or "\\" in model):
        return model
    beside = Path(job_file).parent / model
    if beside.is_file():
        return str(beside)
    return model


def load_job_file(path: str | Path) -> dict:
    """The sections of a job file as plain dicts (``job``, ``inventory`` list, ``objective``, ``pin``),
    convenience units converted, ``job.model`` resolved against the file's folder (:func:`resolve_model_path`). Validation into pydantic models is left to the caller, which may first merge
    command-line flags.

    Raises:
        HetplanError: unreadable or malformed file, unknown section, or a section of the wrong shape.
    """
    data = read_structured(path)
    known = {"job", "inventory", "objective", "pin", "search"}
    for key, value in data.items():
        if key not in known:
            raise HetplanError(f"unknown section [{key}]", field=f"{path}:{key}", fix=f"sections are {', '.join(sorted(known))}")
        if key != "inventory" and not isinstance(value, dict):
            raise HetplanError(f"must be a table, got {_short(value)}", field=key, fix=f"write [{key}] with key = value lines")
    inventory = data.get("inventory", [])
    if isinstance(inventory, dict):
        inventory = inventory.get("pools", [inventory])
    if not isinstance(inventory, list):
        raise HetplanError(f"must be a list of tables, got {_short(inventory)}", field="inventory",
                           fix="write one [[inventory]] table per GPU pool")
    job = dict(data.get("job", {}))
    if isinstance(job.get("model"), str):
        job["model"] = resolve_model_path(job["model"], path)
    return {
        "job": job,
        "inventory": [normalise_pool(p, f"inventory.{i}") for i, p in enumerate(inventory)],
        "objective": normalise_objective(data.get("objective", {})),
        "pin": data.get("pin", {}),
        "search": data.get("search", {}),
    }
