"""Run the ``hetplan`` command inside the test process (no subprocess): ``hetplan.cli.main.main`` with
``sys.argv`` set and stdout/stderr captured, so hundreds of hostile cases cost milliseconds each."""

from __future__ import annotations

import contextlib
import io
import os
import sys
import traceback
from dataclasses import dataclass

from hetplan.cli.main import main


@dataclass
class Result:
    """Exit code, captured output, and the traceback text when an exception escaped ``main`` (else ``""``)."""

    code: int
    stdout: str
    stderr: str
    traceback: str


def run_cli(*args, columns: int = 160) -> Result:
    """``hetplan ARGS`` in-process with a terminal ``columns`` wide."""
    out, err = io.StringIO(), io.StringIO()
    argv, env = sys.argv, os.environ.get("COLUMNS")
    sys.argv = ["hetplan", *map(str, args)]
    os.environ["COLUMNS"] = str(columns)
    code, tb = 0, ""
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            main()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # noqa: BLE001 - the point is to catch what escapes
        code, tb = 1, traceback.format_exc()
    finally:
        sys.argv = argv
        if env is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = env
    return Result(code, out.getvalue(), err.getvalue(), tb)
