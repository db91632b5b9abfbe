"""The runtime on real torch.distributed processes (gloo, CPU) and ``hetplan verify`` with its asserted tolerance."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

from hetplan.runtime.launcher import RunOptions, run_plan
from hetplan.runtime.verify import MEMORY_TOLERANCE, TIME_TOLERANCE

ROOT = Path(__file__).parents[2]
TINY = ROOT / "examples" / "tiny-pp2-dp2.json"


def test_verify_tiny_pp2_dp2_within_tolerance():
    """4 gloo processes (PP 2 x DP 2, uneven split 3 + 1): profile -> estimate -> run -> compare."""
    r = subprocess.run([sys.executable, "-m", "hetplan.cli.main", "verify", str(TINY), "--json"], capture_output=True,
                       text=True, cwd=ROOT, timeout=400)
    assert r.returncode in (0, 1), r.stderr[-3000:]
    res = json.loads(r.stdout)
    assert len(res["stages"]) == 2
    for s in res["stages"]:
        for key in ("predicted_time_s", "measured_time_s", "predicted_memory_bytes", "measured_memory_bytes"):
            assert s[key] > 0
        assert s["time_source"] == "profiled"
    assert res["run"]["dp_replicas_in_sync"] is True
    assert res["run"]["world_size"] == 4 and res["run"]["backend"] == "gloo"
    errors = [(s["time_error"], s["memory_error"]) for s in res["stages"]]
    assert all(abs(t) <= TIME_TOLERANCE for t, _ in errors), errors
    assert all(abs(m) <= MEMORY_TOLERANCE for _, m in errors), errors
    assert r.returncode == 0


def test_run_fsdp_gpipe_matches_ddp_1f1b():
    """FSDP2 + GPipe gives the same trained weights as DDP + 1F1B (same data, same seeds): both DP paths average the
    gradients and both schedules accumulate all micro-batches."""
    opts = dict(iterations=1, warmup=1, stage_repeats=1)
    a = run_plan(TINY, RunOptions(dp_mode="fsdp", schedule="gpipe", **opts))
    b = run_plan(TINY, RunOptions(dp_mode="ddp", schedule="1f1b", **opts))
    assert a["dp_mode"] == "fsdp" and a["schedule"] == "gpipe" and b["dp_mode"] == "ddp"
    assert a["dp_replicas_in_sync"] and b["dp_replicas_in_sync"]
    for ra, rb in zip(a["ranks"], b["ranks"]):
        assert ra["param_checksum"] == pytest.approx(rb["param_checksum"], rel=1e-6)
    assert a["loss"] == pytest.approx(b["loss"], rel=1e-4)


def test_run_plan_own_uneven_interleaving(tmp_path):
    """A searched-style plan with virtual_stages 2 and a layer list per chunk (the last chunk holds only the loss,
    as NVIDIA's DeepSeek-V3 layout) runs interleaved with those chunks without --schedule: what it was priced as."""
    raw = json.loads(TINY.read_text())
    raw["job"]["model"] = str(ROOT / "examples" / "tiny-model.json")
    raw.update(virtual_stages=2, pipeline_chunks=[[1, 2], [1, 0]])
    p = tmp_path / "chunks.json"
    p.write_text(json.dumps(raw))
    res = run_plan(p, RunOptions(iterations=1, warmup=1, stage_repeats=1))
    assert (res["schedule"], res["virtual_stages"]) == ("interleaved", 2) and res["dp_replicas_in_sync"]
    # PP 2 x DP 2: rank 0 (stage 0) holds chunks 0 and 2, rank 2 (stage 1) chunks 1 and 3 (the empty loss chunk)
    assert res["ranks"][0]["layers"] == [[0, 1], [2, 4]] and res["ranks"][2]["layers"] == [[1, 2], [4, 4]]


def test_run_tp2_pp2_interleaved(tmp_path):
    """TP 2 (DTensor) x PP 2 with the interleaved 1F1B schedule, 2 virtual stages per rank."""
    raw = json.loads(TINY.read_text())
    raw["job"]["model"] = str(ROOT / "examples" / "tiny-model.json")
    raw["job"]["global_batch"] = 4
    raw["stages"] = [{"num_layers": 2, "tp": 2, "dp": 1}, {"num_layers": 2, "tp": 2, "dp": 1}]
    p = tmp_path / "tp2.json"
    p.write_text(json.dumps(raw))
    res = run_plan(p, RunOptions(iterations=1, warmup=1, stage_repeats=1, schedule="interleaved", virtual_stages=2))
    assert (res["pp"], res["dp"], res["tp"]) == (2, 1, 2) and res["schedule"] == "interleaved"
    # chunk k on pipeline rank k % 2: rank 0 holds layers 0 and 2, rank 2 (next stage) layers 1 and 3
    assert res["ranks"][0]["layers"] == [[0, 1], [2, 3]] and res["ranks"][2]["layers"] == [[1, 2], [3, 4]]
    assert res["loss"] == pytest.approx(6.24, abs=0.3)  # ~ ln(512) for random weights and tokens
    ranks = res["ranks"]
    # Each TP rank holds half of the sharded layer weights (plus replicated norms / embedding / head).
    assert ranks[0]["weights_bytes"] == ranks[1]["weights_bytes"] < 2 * 4 * 128 * 512 * 2 + 4 * 4 * 128 * 128 + 4 * 512 * 128


def test_tp_equivalence(tmp_path):
    """The DTensor TP stage (2 gloo ranks) gives the unsharded stage's loss and gradients (incl. the backward
    all-reduce of the column-parallel inputs, which reaches the input gradient and the norm weights)."""
    worker = Path(__file__).with_name("tp_equivalence_worker.py")
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                        str(worker), str(ROOT / "examples" / "tiny-model.json"), str(tmp_path)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    rows = [json.loads(f.read_text()) for f in sorted(tmp_path.glob("rank*.json"))]
    assert len(rows) == 2
    for row in rows:
        assert row["loss_tp"] == pytest.approx(row["loss_full"], rel=1e-6)
        assert row["input_grad_diff"] <= 1e-5 * row["input_grad_max"]
        assert row["norm_grad_diff"] <= 1e-5 * row["norm_grad_max"]
