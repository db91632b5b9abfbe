"""``hetplan run`` on CPU refuses, before any rank starts, a run whose ranks need more host memory than there is."""

from __future__ import annotations

from pathlib import Path

import pytest

from hetplan.errors import HetplanError
from hetplan.plan import GPUPool, Job, Plan, Stage
from hetplan.runtime import planio
from hetplan.runtime.launcher import RunOptions, check_host_memory, host_memory_bytes

ROOT = Path(__file__).parents[2]


def _check(plan_path: Path, available_gib: float, opts: RunOptions = RunOptions()) -> None:
    plan = planio.load_plan(plan_path)
    spec = planio.plan_model(plan)
    check_host_memory(plan, spec, planio.layout(plan, spec), opts, available_bytes=int(available_gib * 2**30))


def test_a_7b_model_on_16_cpu_ranks_is_refused_a_tiny_one_runs(tmp_path):
    """Llama-2-7B at DP 16: each rank holds 6.7 B parameters in fp32 with their gradients (8 B each, 54 GB), its
    AdamW states (its ZeRO-1 runs as DDP: replicated) and activations: over 1 TiB on one host, refused at 24 GiB
    naming the plan.
    The tiny PP 2 x DP 2 example needs a few MiB and runs; bf16 halves the need."""
    job = Job(model="llama2-7b", seq_len=2048, global_batch=64)
    big = tmp_path / "big.json"
    big.write_text(Plan(job=job, pools=[GPUPool(gpu="H100-SXM", count=16)], mbs=1, zero=1,
                        stages=[Stage(num_layers=32, dp=16)]).model_dump_json())
    with pytest.raises(HetplanError) as exc:
        _check(big, 24)
    assert exc.value.field == "plan" and "16 ranks" in exc.value.message
    need_gib = float(exc.value.message.split("about ")[1].split(" GiB")[0].replace(",", ""))
    assert 16 * 6.7e9 * 8 / 2**30 < need_gib < 2 * 16 * 6.7e9 * 16 / 2**30
    with pytest.raises(HetplanError) as half:
        _check(big, 24, RunOptions(dtype="bf16"))
    assert float(half.value.message.split("about ")[1].split(" GiB")[0].replace(",", "")) == pytest.approx(
        need_gib / 2, abs=0.1)  # the message rounds to 0.1 GiB
    _check(ROOT / "examples" / "tiny-pp2-dp2.json", 0.5)  # a few MiB: no error
    assert host_memory_bytes() > 2**28  # this host reports its memory
