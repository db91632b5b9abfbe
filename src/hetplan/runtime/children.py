"""No rank outlives its command: the process hygiene of ``hetplan run`` / ``hetplan verify``.

torchrun starts every rank in a session of its own (``start_new_session=True`` in torch's
``distributed/elastic/multiprocessing/subprocess_handler``), so killing torchrun's process group does not reach the
ranks, and a torchrun killed with SIGKILL leaves them running (issue 18: a rank holding 19 GB after ``--timeout``).
Two mechanisms close this:

* **Parent-death signal** (Linux ``prctl(PR_SET_PDEATHSIG, SIGKILL)``, prctl(2)): torchrun gets it in a
  ``preexec_fn`` (it dies when ``hetplan`` dies, even by ``kill -9``) and every rank sets it for itself as it
  starts (:func:`die_with_parent`, called by the trainer), so the chain hetplan -> torchrun -> ranks unwinds.
* **Killing the tree** on timeout or any exception (:func:`kill_tree`): the descendants of torchrun are read from
  ``/proc`` *before* anything is killed, then every process group among them gets SIGKILL.

On systems without ``prctl`` (not Linux) :func:`die_with_parent` does nothing; :func:`kill_tree` still kills
torchrun's group, and the ranks found through ``/proc`` where it exists.
"""

from __future__ import annotations

import ctypes
import os
import signal
from pathlib import Path

#: ``PR_SET_PDEATHSIG`` from ``<linux/prctl.h>``.
PR_SET_PDEATHSIG = 1
#: Environment variable carrying the pid of the ``hetplan`` process that started torchrun (read by the ranks).
LAUNCHER_PID_ENV = "HETPLAN_LAUNCHER_PID"


def _libc():
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:  # pragma: no cover
        return None


#: The C library, loaded once here: a ``preexec_fn`` runs between fork and exec, where loading a library could block.
_LIBC = _libc()


def die_with_parent(parent_pid: int | None = None, grandparent_pid: int | None = None,
                    sig: int = signal.SIGKILL) -> bool:
    """Ask the kernel to send ``sig`` to this process when its parent exits (Linux); returns whether it was set.

    The signal is armed only from the call on, so a parent that died earlier would be missed: when the call finds
    the parent is no longer ``parent_pid`` (a ``preexec_fn`` knows it), or the parent's parent no longer
    ``grandparent_pid`` (a rank knows ``hetplan``'s pid from :data:`LAUNCHER_PID_ENV`, not torchrun's), the process
    exits at once. Usable as a ``preexec_fn``.
    """
    prctl = getattr(_LIBC, "prctl", None)
    if prctl is None or prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        return False
    parent = os.getppid()
    if parent_pid is not None and parent != parent_pid:
        os._exit(1)
    if grandparent_pid is not None and _ppid(parent) not in (grandparent_pid, None):
        os._exit(1)
    return True


def _ppid(pid: int) -> int | None:
    """The parent of ``pid`` from ``/proc`` (None if unreadable)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so split after the last ')'
    return int(text[text.rindex(")") + 2:].split()[1])


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (children, grandchildren, ...), read from ``/proc``; empty where there is none."""
    children: dict[int, list[int]] = {}
    for d in Path("/proc").glob("[0-9]*"):
        ppid = _ppid(int(d.name))
        if ppid is not None:
            children.setdefault(ppid, []).append(int(d.name))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def kill_tree(pid: int) -> None:
    """SIGKILL ``pid`` (a process started with ``start_new_session=True``), its process group and every process
    group of its descendants (the ranks torchrun started in sessions of their own)."""
    below = descendants(pid)
    groups = {pid}
    for p in below:
        try:
            groups.add(os.getpgid(p))
        except ProcessLookupError:
            pass
    groups.discard(os.getpgrp())  # never our own group
    for g in groups:
        try:
            os.killpg(g, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    for p in below:  # a descendant that left its group
        try:
            os.kill(p, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
