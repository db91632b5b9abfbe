"""Console for tables: the terminal's width (``COLUMNS`` when set), or 160 columns when the output is a pipe or a
file; and :data:`NARROW`, the width under which tables switch to their compact layout.

And the one writer of output paths (:func:`output_file`, :func:`output_dir`, :func:`write_output`): every command
that writes a file or fills a folder goes through them, so an existing file given as a folder, a folder given as a
file, a missing or unwritable folder, or a full disk is one message naming the option (exit 2), never a traceback
(issue 27: ``export --out-dir FILE``, ``profile export-csv DIR``, ``validate --csv DIR`` / ``--out FILE``).
Likewise the servers' listening address (:func:`check_listen_address`)."""

import os
from pathlib import Path

from rich import box
from rich.console import Console
from rich.table import Table

#: Consoles narrower than this get the compact tables (the full ``hetplan plan`` table needs ~130 columns).
NARROW = 130


def table_console() -> Console:
    """A rich Console that does not squeeze wide tables when stdout is not a terminal and ``COLUMNS`` is unset.
    No emoji codes: a name such as ``:fire:`` prints as written (and rich's emoji table is not loaded)."""
    return Console(width=None if Console().is_terminal or os.environ.get("COLUMNS") else 160, emoji=False)


def new_table(title: str, narrow: bool, **kwargs) -> Table:
    """A rich Table: heavy borders, or under ``narrow`` only a rule under the header and one space between
    columns (what fits 80 columns)."""
    return Table(title=title, box=box.SIMPLE_HEAD if narrow else box.HEAVY_HEAD, padding=(0, 0 if narrow else 1),
                 show_edge=not narrow, **kwargs)


def _os_error(exc: OSError, path: Path, field: str, fix: str):
    from hetplan.errors import HetplanError

    return HetplanError(f"cannot write {path}: {exc.strerror or exc}", field=field, fix=fix)


def output_file(path: Path | None, field: str, figure: bool = False) -> None:
    """Refuse an output file before any work: the path a folder, its folder missing, a file or not writable, or
    (``figure``) an image format matplotlib cannot write (:func:`hetplan.inputs.check_output_path`).

    Raises:
        HetplanError: naming ``field``."""
    from hetplan.errors import HetplanError
    from hetplan.inputs import check_output_path, check_path_name

    if path is None:
        return
    check_path_name(path, field)
    if path.parent.exists() and not path.parent.is_dir():
        raise HetplanError(f"cannot write {path}: {path.parent} is a file, not a folder", field=field,
                           fix="give a file path in an existing folder")
    check_output_path(path, field, figure)
    if not os.access(path.parent, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise HetplanError(f"cannot write {path}: no permission", field=field,
                           fix="give a path in a folder you can write")


def output_dir(path: Path, field: str) -> Path:
    """Make folder ``path`` (and its parents) for a command's files; returns it.

    Raises:
        HetplanError: ``path`` (or a parent) is a file, or the folder cannot be made or written."""
    from hetplan.errors import HetplanError
    from hetplan.inputs import check_path_name

    check_path_name(path, field)
    if path.exists() and not path.is_dir():
        raise HetplanError(f"{path} is a file, not a folder", field=field, fix="give a folder path (new or existing)")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise _os_error(exc, path, field, "give a folder path you can write") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise HetplanError(f"cannot write into {path}: no permission", field=field,
                           fix="give a folder you can write")
    return path


def write_output(path: Path, text: str, field: str) -> None:
    """Write ``text`` to ``path`` (checked as :func:`output_file`), an ``OSError`` (disk full, permission taken
    away meanwhile) turned into a message naming ``field``.

    Raises:
        HetplanError: naming ``field``."""
    output_file(path, field)
    try:
        path.write_text(text)
    except OSError as exc:
        raise _os_error(exc, path, field, "give a file path in a folder you can write") from None


def check_listen_address(host: str, port: int, host_field: str, port_field: str) -> None:
    """Refuse an address a server cannot listen on before it starts: a port another process holds, a host that is
    no address of this machine or does not resolve. Uvicorn reports a failed bind only after start-up, as a log
    line and exit code 3 (``hetplan serve`` after starting its workers). Port 0 (any free port) is not probed.

    Raises:
        HetplanError: naming ``port_field`` (port in use or not allowed) or ``host_field``."""
    import errno
    import socket

    from hetplan.errors import HetplanError

    if port == 0:
        return
    try:
        family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except (socket.gaierror, UnicodeError) as exc:
        raise HetplanError(f"cannot resolve {host!r}: {exc}", field=host_field,
                           fix="give an IP address or host name of this machine, e.g. 127.0.0.1") from None
    with socket.socket(family, kind, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds: a TIME_WAIT port is free
        try:
            sock.bind(addr)
        except OSError as exc:
            if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                raise HetplanError(f"cannot listen on {host}:{port}: {exc.strerror}", field=port_field,
                                   fix="choose a free port, or stop the process that holds it") from None
            raise HetplanError(f"cannot listen on {host}:{port}: {exc.strerror}", field=host_field,
                               fix="give an address of this machine, e.g. 127.0.0.1") from None


def layout_text(s: dict) -> str:
    """TPxPPxDP of a plan summary, then ``vN`` (virtual stages), ``cpN`` (context-parallel), ``epN``
    (expert-parallel) and ``etpN`` (expert-TP) degrees when above 1; stages of different TP (or DP) degrees show
    them in stage order, ``2/1x4x2``."""
    tp, dp = ("/".join(dict.fromkeys(str(st[k]) for st in s["stages"])) if s[k] is None else s[k] for k in ("tp", "dp"))
    extra = "".join(f" {name}{s['plan'].get(key, 1)}" for key, name in (("cp", "cp"), ("ep", "ep"), ("expert_tp", "etp"))
                    if (s["plan"].get(key) or 1) > 1)
    return f"{tp}x{s['pp']}x{dp}" + (f" v{s['virtual_stages']}" if s["virtual_stages"] > 1 else "") + extra


def gpus_text(s: dict, starred: set[str] = frozenset()) -> str:
    """The GPUs of a plan summary, per GPU type in stage order: ``64x H100-SXM``, ``4x A100-SXM-40GB + 24x A10G``
    (a stage holds TP x CP x DP GPUs; the summary's ``gpu`` joins each stage's type, and ``28x
    A100-SXM-40GB+A10G+A10G+A10G+A10G+A10G+A10G`` read as 28 of each). Types in ``starred`` get a ``*``."""
    cp = s["plan"].get("cp") or 1
    count: dict[str, int] = {}
    for st in s["stages"]:
        count[st["gpu"]] = count.get(st["gpu"], 0) + st["tp"] * cp * st["dp"]
    return " + ".join(f"{n}x {gpu}" + ("*" if gpu in starred else "") for gpu, n in count.items())
