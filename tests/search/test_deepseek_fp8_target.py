"""Issue 14's FP8 target: DeepSeek-V3 on 1,024 H100 (seq 4096, global batch 8192, dtype fp8) plans with EP > 1 and
fits. The full command (`hetplan plan --model deepseek-v3 --gpu H100-SXM --gpus 1024 --seq-len 4096
--global-batch 8192 --dtype fp8`) searches every TP/PP/DP/EP; here TP and PP are pinned to the full search's
answer (TP 2, PP 32) to keep the test fast, and EP, DP, micro-batch, ZeRO and recomputation are searched."""

import time

from hetplan.plan import GPUPool, Inventory, Job
from hetplan.search.planner import search_plans
from hetplan.search.space import Pins


def test_deepseek_v3_fp8_on_1024_h100_plans_with_expert_parallelism():
    job = Job(model="deepseek-v3", seq_len=4096, global_batch=8192, dtype="fp8")
    inv = Inventory(pools=[GPUPool(gpu="H100-SXM", count=1024)])
    t0 = time.perf_counter()
    res = search_plans(job, inv, pins=Pins(tp=2, pp=32), heterogeneous=False)
    assert time.perf_counter() - t0 < 60  # a bound against hangs, not a speed test (benchmarks/)
    best = res.plans[0]
    assert best.plan.job.dtype == "fp8"
    assert best.plan.stage_layout(0).ep > 1
    assert best.estimate.fits
    assert 0 < best.estimate.mfu < 1
