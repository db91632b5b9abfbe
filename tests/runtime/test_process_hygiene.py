"""No rank outlives ``hetplan run``: a timed-out run and a run whose parent is killed with SIGKILL leave no process
(real torchrun, 2 gloo ranks on CPU); options are refused before any process starts."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hetplan.runtime import children

ROOT = Path(__file__).parents[2]
TINY = ROOT / "examples" / "tiny-pp2-dp2.json"


def _plan(tmp_path) -> Path:
    """A 2-rank plan (PP 1 x DP 2) in a folder of its own: its path marks every process of the run."""
    raw = json.loads(TINY.read_text())
    raw["job"]["model"] = str(ROOT / "examples" / "tiny-model.json")
    raw["pools"][0]["count"] = 2
    raw["stages"] = [{"pool": 0, "num_layers": 4, "tp": 1, "dp": 2}]
    p = tmp_path / "hygiene-plan.json"
    p.write_text(json.dumps(raw))
    return p


def _procs(marker: str) -> dict[int, str]:
    """Live (not zombie) processes whose command line contains ``marker``: pid -> command line."""
    out = {}
    for d in Path("/proc").glob("[0-9]*"):
        try:
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (d / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker in cmd and state != "Z" and int(d.name) != os.getpid():
            out[int(d.name)] = cmd
    return out


def _ranks(marker: str) -> dict[int, str]:
    return {p: c for p, c in _procs(marker).items() if "hetplan.runtime.trainer" in c and "torch.distributed.run" not in c}


def _wait_until(cond, timeout_s: float) -> bool:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.2)
    return cond()


def _cmd(plan: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "hetplan.cli.main", "run", str(plan), "--iterations", "1000000", *extra]


pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc (Linux)")


def test_killed_parent_leaves_no_rank(tmp_path):
    """kill -9 of `hetplan run` while its 2 ranks train: torchrun dies with it (parent-death signal), the ranks with
    torchrun (each rank arms the same signal as it starts)."""
    pytest.importorskip("torch")
    plan = _plan(tmp_path)
    parent = subprocess.Popen(_cmd(plan, "--timeout", "300"), cwd=ROOT, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        assert _wait_until(lambda: len(_ranks(str(plan))) == 2, 120), _procs(str(plan))
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        assert _wait_until(lambda: not _procs(str(plan)), 30), _procs(str(plan))
    finally:
        for pid in _procs(str(plan)):
            os.kill(pid, signal.SIGKILL)


def test_timed_out_run_leaves_no_rank(tmp_path):
    """`hetplan run --timeout` gives up with exit 2 and kills torchrun and every rank (they run in sessions of their
    own, which killing torchrun's group alone would miss)."""
    pytest.importorskip("torch")
    plan = _plan(tmp_path)
    seen: set[int] = set()
    proc = subprocess.Popen(_cmd(plan, "--timeout", "20"), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        while proc.poll() is None:
            seen |= set(_ranks(str(plan)))
            time.sleep(0.2)
        err = proc.stderr.read()
        assert proc.returncode == 2 and "--timeout" in err and "did not finish within 20 s" in err, err[-2000:]
        assert len(seen) == 2, "the ranks never started: the timeout was too short to test anything"
        alive = _procs(str(plan))
        assert not alive, alive
    finally:
        for pid in _procs(str(plan)):
            os.kill(pid, signal.SIGKILL)


def test_kill_tree_reaches_children_in_their_own_sessions():
    """The torchrun situation without torch: a parent whose child runs in a new session."""
    code = ("import subprocess, sys, time; "
            "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'], start_new_session=True); "
            "print(c.pid, flush=True); time.sleep(300)")
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                              start_new_session=True)
    child = int(parent.stdout.readline())
    assert os.getpgid(child) != os.getpgid(parent.pid)
    assert children.descendants(parent.pid) == [child]
    children.kill_tree(parent.pid)
    parent.wait()
    assert _wait_until(lambda: not Path(f"/proc/{child}").exists() or
                       Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z", 10)


def test_die_with_parent_in_preexec_fn():
    """A child armed with the parent-death signal dies when its parent is killed with SIGKILL."""
    code = ("import os, subprocess, sys, time; from hetplan.runtime import children; me = os.getpid(); "
            "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'], start_new_session=True, "
            "preexec_fn=lambda: children.die_with_parent(me)); print(c.pid, flush=True); time.sleep(300)")
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    parent.kill()
    parent.wait()
    assert _wait_until(lambda: not Path(f"/proc/{child}").exists(), 10)


@pytest.mark.parametrize("args, field", [
    (("--dtype", "fp8"), "--dtype"), (("--dp-mode", "zero5"), "--dp-mode"), (("--timeout", "-1"), "--timeout"),
    (("--timeout", "inf"), "--timeout"), (("--schedule", "zigzag"), "--schedule"),
    (("--node-rank", "1"), "--node-rank"), (("--nnodes", "2", "--rdzv-endpoint", "node0"), "--rdzv-endpoint"),
])
def test_run_options_refused_before_torchrun(tmp_path, args, field):
    """Each bad option exits 2 with one message naming it, in well under the seconds torchrun needs to start."""
    plan = _plan(tmp_path)
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "hetplan.cli.main", "run", str(plan), *args], cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and field in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert "torch" not in r.stderr and time.monotonic() - t0 < 30
