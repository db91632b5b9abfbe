"""Estimator speed on a 96-layer model (GPT-3 175B shapes): estimates per second on one core.

Three paths:

* ``vectorised``: :func:`hetplan.estimate.stage.stage_costs` + :func:`hetplan.estimate.pipeline.pipeline_time_s`
  on numpy arrays of many configurations at once (what the search does; every stage kind, DP, p2p, optimizer and
  memory included) — configurations per second;
* ``estimate(closed_form)`` and ``estimate(simulate)``: the full :func:`hetplan.estimate.estimator.estimate` on one
  pydantic plan at a time (closed-form pipeline, or the event simulation) — plans per second;
* ``estimate_many``: :func:`hetplan.estimate.estimator.estimate_many` on a batch of plans of the 96-layer model
  (event simulation; the same :class:`Estimate` objects ``estimate()`` returns): 1,152 plans over TP 1/2/4/8 ×
  PP 4/8/12/16 × DP 2/4/8 × micro-batch 1/2 × recompute (16 pipeline shapes, 8-64 micro-batches), and 1,152
  plans of one shape (PP 8, 32 micro-batches; TP × recompute) — plans per second. This is the issue-3 target
  (>= 10,000 full plan estimates per second on one core).

Run: ``OMP_NUM_THREADS=1 python benchmarks/bench_estimate.py`` (prints one line per path; CPU time of this
process, so other load on the machine does not count).
Cost growth: the vectorised path is O(stage kinds) per configuration, independent of layers, stages and
micro-batches; ``estimate()`` is O(p) for the stage costs plus O(p·m·v) float operations for the simulation
(its schedule compiled once per (schedule, p, m, v) and cached); ``estimate_many`` is O(Σ p) vectorised work,
O(2(m·v + p)) numpy steps per group of plans of one (schedule, p, m, v), and O(p) Python work per plan to build
its result objects, see docs/estimator.md.
"""

from __future__ import annotations

import os
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402

from hetplan.estimate.comm import ALPHA_INTER_NODE_S, LINK_EFFICIENCY, p2p_time_s  # noqa: E402
from hetplan.estimate.estimator import estimate, estimate_many  # noqa: E402
from hetplan.estimate.pipeline import pipeline_time_s  # noqa: E402
from hetplan.estimate.options import TrainingOptions  # noqa: E402
from hetplan.degrees import Degrees  # noqa: E402
from hetplan.estimate.stage import p2p_bytes, stage_costs  # noqa: E402
from hetplan.estimate.stagework import Link, Recompute, StageHardware, StageWork  # noqa: E402
from hetplan.calibration.validation import gpt_model, megatron_plan  # noqa: E402
from hetplan.hardware.catalog import get_gpu  # noqa: E402


def vectorised(n: int = 20000, repeat: int = 5) -> float:
    m = gpt_model(96, 12288, 96, 2048)
    gpu = get_gpu("A100-SXM-80GB")
    link = Link(8, 300e9, 200e9)
    rng = np.random.default_rng(0)
    tp = rng.choice([1, 2, 4, 8], n)
    pp = rng.choice([1, 2, 4, 8, 16, 32], n)
    dp = rng.choice([1, 2, 4, 8], n)
    mbs = rng.choice([1, 2, 4], n)
    gbs = 1536
    mb = np.maximum(gbs // (dp * mbs), 1)
    L = 96 // pp
    col = lambda a: a[:, None]  # noqa: E731
    # three stage kinds: first (embedding), middle, last (head)
    layers = np.stack([L, L, L], axis=1)
    count = np.stack([np.ones(n), np.maximum(pp - 2, 0), (pp > 1).astype(float)], axis=1)
    emb = np.zeros((n, 3), bool); emb[:, 0] = True
    head = np.zeros((n, 3), bool); head[:, 2] = True; head[pp == 1, 0] = True
    inflight = np.stack([np.minimum(pp, mb), np.minimum(pp - 1, mb), np.ones(n)], axis=1)
    best = float("inf")
    for _ in range(repeat):
        t0 = time.process_time()
        work = StageWork(s=2048, b=col(mbs), num_layers=layers, has_embedding=emb, has_head=head,
                         single_stage=col(pp == 1), in_flight=inflight, num_microbatches=col(mb), zero=1,
                         recompute=Recompute.FULL, sequence_parallel=col(tp > 1))
        c = stage_costs(m, StageHardware(gpu, link), Degrees.of(tp=col(tp), dp=col(dp), zero=1), work,
                        TrainingOptions(attention="standard"))
        p2p = (pp - 1) * p2p_time_s(p2p_bytes(m, mbs, 2048, tp, tp > 1), 200e9 / 8, ALPHA_INTER_NODE_S,
                                    efficiency=LINK_EFFICIENCY)
        t, _, _ = pipeline_time_s(c.forward_s, c.backward_s, count, p2p, mb)
        _ = t + np.max(c.dp_exposed_s, axis=1) + np.max(c.optimizer_s, axis=1)
        best = min(best, time.process_time() - t0)
    return n / best


def full(pipeline_model: str, pp: int = 8, n: int = 200) -> float:
    m = gpt_model(96, 12288, 96, 2048)
    plan = megatron_plan(m, gpu="A100-SXM-80GB", tp=8, pp=pp, dp=4, mbs=1, gbs=128, recompute="full", seq=2048,
                         inter_node_bandwidth_bytes_per_s=200e9, dtype="bf16")
    estimate(plan, model=m, pipeline_model=pipeline_model)
    t0 = time.process_time()
    for _ in range(n):
        estimate(plan, model=m, pipeline_model=pipeline_model)
    return n / (time.process_time() - t0)


def many(shape: str, repeat: int = 3) -> tuple[float, int]:
    """estimate_many over ``mixed`` plans (16 pipeline shapes) or ``pp8`` plans (one shape: pp 8, 32 micro-batches)."""
    m = gpt_model(96, 12288, 96, 2048)
    if shape == "mixed":
        grid = [(tp, pp, dp, mbs, rc) for tp in (1, 2, 4, 8) for pp in (4, 8, 12, 16) for dp in (2, 4, 8)
                for mbs in (1, 2) for rc in ("none", "selective", "full")] * 4
    else:
        grid = [(tp, 8, 4, 1, rc) for tp in (1, 2, 4, 8) for rc in ("none", "selective", "full")] * 96
    plans = [megatron_plan(m, gpu="A100-SXM-80GB", tp=tp, pp=pp, dp=dp, mbs=mbs, gbs=128, recompute=rc, seq=2048,
                           inter_node_bandwidth_bytes_per_s=200e9, dtype="bf16") for tp, pp, dp, mbs, rc in grid]
    estimate_many(plans[:50], model=m)
    best = float("inf")
    for _ in range(repeat):
        t0 = time.process_time()
        estimate_many(plans, model=m)
        best = min(best, time.process_time() - t0)
    return len(plans) / best, len(plans)


def main() -> None:
    v = vectorised()
    print(f"vectorised stage_costs+pipeline_time_s, 96 layers: {v:,.0f} configurations/s (target >= 10,000)")
    print(f"estimate(closed_form), 96 layers, pp 8, 32 micro-batches: {full('closed_form'):,.0f} plans/s")
    print(f"estimate(simulate),    96 layers, pp 8, 32 micro-batches: {full('simulate'):,.0f} plans/s")
    rate, n = many("mixed")
    print(f"estimate_many(simulate), 96 layers, {n:,} plans in 16 shapes (pp 4-16): {rate:,.0f} plans/s "
          "(target >= 10,000)")
    rate, n = many("pp8")
    print(f"estimate_many(simulate), 96 layers, {n:,} plans of one shape (pp 8, 32 micro-batches): {rate:,.0f} "
          "plans/s (target >= 10,000)")


if __name__ == "__main__":
    main()
