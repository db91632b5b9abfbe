"""Megatron-LM's command-line arguments of a stated release, as data: parse an argument list the way
Megatron-LM's own ``argparse`` parser does, without Megatron-LM (which needs Python >= 3.12 and CUDA to import).

``data/megatron_lm_args.json`` records every option string of the parser that
``megatron/training/arguments.py: add_megatron_arguments()`` builds (NVIDIA/Megatron-LM commit ``d98e8a64``,
2026-08-22; the source and release are in the file), with its destination, type, ``nargs`` and choices. The
record was dumped by building that parser on CPU. :func:`parse_megatron_args` rebuilds an equivalent parser from
the record, so an export (``hetplan export --to megatron``) is checked against the release's real argument list
in tests, and ``hetplan import`` reads a user's launch script with the same parser. No torch.
"""

from __future__ import annotations

import argparse
import json
import shlex
from functools import lru_cache
from importlib import resources
from typing import Any

from hetplan.errors import HetplanError

_TYPES = {"int": int, "float": float, "str": str}


@lru_cache(maxsize=1)
def megatron_record() -> dict[str, Any]:
    """The recorded argument list: ``{"source", "release", "options": {option: {dest, type, nargs?, choices?}}}``."""
    text = (resources.files("hetplan.runtime") / "data" / "megatron_lm_args.json").read_text()
    return dict(json.loads(text))


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # type: ignore[override]
        raise HetplanError(f"Megatron-LM ({megatron_record()['release']}) refuses the arguments: {message}",
                           field="Megatron-LM arguments", fix="use the options of Megatron-LM's arguments.py")


@lru_cache(maxsize=1)
def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="pretrain_gpt.py", allow_abbrev=False, add_help=False)
    by_dest: dict[tuple[str, str], list[str]] = {}
    specs: dict[tuple[str, str], dict[str, Any]] = {}
    for opt, rec in megatron_record()["options"].items():
        key = (rec["dest"], json.dumps(rec, sort_keys=True))
        by_dest.setdefault(key, []).append(opt)
        specs[key] = rec
    for key, opts in by_dest.items():
        rec = specs[key]
        if rec["type"] == "flag":  # value fixed by the option (store_true / store_false / store_const)
            p.add_argument(*opts, dest=opts[0].lstrip("-").replace("-", "_"), action="store_true",
                           default=argparse.SUPPRESS)
            continue
        kw: dict[str, Any] = {"type": _TYPES[rec["type"]], "default": argparse.SUPPRESS}
        if "nargs" in rec:
            kw["nargs"] = rec["nargs"]
        if "choices" in rec:
            kw["choices"] = [_TYPES[rec["type"]](c) for c in rec["choices"]]
        p.add_argument(*opts, dest=opts[0].lstrip("-").replace("-", "_"), **kw)
    return p


def parse_megatron_args(argv: list[str]) -> dict[str, Any]:
    """Parse ``argv`` with the recorded Megatron-LM parser: ``{option name without dashes, '_' for '-': value}``
    for the options given (a flag maps to True).

    Raises:
        HetplanError: an option the release does not have, a value of the wrong type, a choice it refuses.
    """
    return dict(vars(_parser().parse_args(argv)))


def megatron_argv(script: str) -> list[str]:
    """The arguments of the ``*.py`` training script in a Megatron-LM launch script (``torchrun ... pretrain_gpt.py
    ARGS``), or of an arguments file (only ``--options``); comments, line continuations and environment lines
    are skipped.

    Raises:
        HetplanError: no arguments found.
    """
    lines = []
    for raw in script.replace("\\\n", " ").splitlines():
        line = raw.split(" #", 1)[0].strip()
        if line and not line.startswith("#"):
            lines.append(line)
    for line in lines:
        words = shlex.split(line)
        for i, w in enumerate(words):
            if w.endswith(".py"):
                return words[i + 1:]
    words = [w for line in lines for w in shlex.split(line)]
    if words and words[0].startswith("--"):
        return words
    raise HetplanError("found no Megatron-LM arguments (a line running a *.py training script, or a file of "
                       "--options)", field="launch script", fix="give the launch script or the arguments file")
