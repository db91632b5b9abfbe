"""The 2021-22 A100 set ``nemo_megatron_a100`` (NeMo Megatron 22.02-22.09 launcher READMEs, MT-NLG 530B):
rows, layouts, stacks and the measured iteration time derived from tokens/s."""

import statistics

import pytest

from hetplan.calibration import validation
from hetplan.hardware.stacks import resolve_stack


@pytest.fixture(scope="module")
def cases():
    return validation.stacks_2022_cases()


def test_rows_layouts_and_stacks(cases):
    assert len(cases) == 39
    by_stack = {}
    for c in cases:
        st = c.plan.stages[0]
        assert st.tp * len(c.plan.stages) * st.dp == c.info["n"]  # TP x PP x DP = the row's GPUs
        assert c.plan.job.global_batch % (st.dp * c.plan.mbs) == 0  # whole micro-batches per replica
        by_stack[c.plan.job.stack] = by_stack.get(c.plan.job.stack, 0) + 1
        spec = resolve_stack(c.plan.job.stack)
        assert spec.framework == c.plan.job.framework  # a row's framework is its stack's
        assert c.plan.zero in spec.zero and c.plan.stages[0].recompute in spec.recompute
        assert not c.plan.sequence_parallel or spec.sequence_parallel
    # each table runs the container of the commit that first published it: the 175B table of 2022-07-14 the
    # 22.06 one (the README kept it through 22.08), the tables of 2022-09-07 the 22.08 one (kept through 22.09)
    assert by_stack == {"nemo@22.02": 14, "nemo@22.06": 10, "nemo@22.08": 11,
                        "megatron-deepspeed@2021": 3, "megatron-lm@2.0": 1}


def test_stack_releases_follow_the_launcher_changelog():
    """22.01: TP and DP only, 22.02 adds pipelines; the gradient all-reduce runs after backward until 22.05
    (then during it at PP 1); 22.05: no sequence parallelism, no selective recomputation, no distributed Adam;
    22.06 adds the first two, 22.08 the distributed optimizer (ZeRO-1); the gradient reduction overlaps only at
    PP 1 until 23.05."""
    s01, s02 = resolve_stack("nemo@22.01"), resolve_stack("nemo@22.02")
    assert not s01.has("pp") and s02.has("pp") and resolve_stack("nemo@22.03").id == "nemo@22.02"
    assert not s02.overlaps_grad_reduce(1, 0) and resolve_stack("nemo@22.05").overlaps_grad_reduce(1, 0)
    s05, s06, s08 = (resolve_stack(f"nemo@{v}") for v in ("22.05", "22.06", "22.08"))
    assert not s05.sequence_parallel and "selective" not in s05.recompute and s05.zero == (0,)
    assert s06.sequence_parallel and "selective" in s06.recompute and s06.zero == (0,)
    assert s08.zero == (0, 1) and resolve_stack("nemo@2022-07").id == "nemo@22.06"
    # the DP gradient reduction overlaps the backward only without a pipeline until NeMo 1.13 (23.05 here)
    s09, s23 = resolve_stack("nemo@22.09"), resolve_stack("nemo@23.05")
    assert s09.overlaps_grad_reduce(1, 1) and not s09.overlaps_grad_reduce(8, 1) and not s05.overlaps_grad_reduce(2, 0)
    assert s23.overlaps_grad_reduce(8, 1)


def test_measured_time_from_tokens_per_second(cases):
    """r22.02 (the 2022-03-24 table), one DGX A100 node: 1,440 sequences x 2,048 tokens at 39,660 tokens/s =
    74.36 s; MT-NLG on 280 nodes: the paper's 60.1 s as given."""
    one_node = next(c for c in cases if c.key == "nemo_megatron_a100:7:nemo@22.02:gpt3-5b:n8:tp2pp1dp4")
    assert one_node.measured == pytest.approx(1440 * 2048 / 39660)
    assert one_node.measured == pytest.approx(74.36, abs=0.01)
    mtnlg = [c for c in cases if c.plan.job.stack == "megatron-deepspeed@2021"]
    assert [c.measured for c in mtnlg] == [60.1, 50.2, 44.4]
    assert [c.info["n"] for c in mtnlg] == [2240, 2800, 3360]


def test_tp2_rows_within_ten_percent(cases):
    """The 5B rows at TP 2 (22.02 / 22.06) are predicted within 10 % (achieved −0.8 ... +4.7 %)."""
    for c in cases:
        if c.plan.stages[0].tp == 2:
            c.predicted = c.predict(validation.DEFAULT)
            assert abs(validation.speed_error(c)) < 0.10, c.key


def test_per_tp_partitions_the_set():
    """``per_tp`` (the set's metrics by TP degree, in ``hetplan validate --json``) counts every row once."""
    res, cases = validation.run_validation(["nemo_megatron_a100"])
    r = res["sets"]["nemo_megatron_a100"]
    assert {k: v["n"] for k, v in r["per_tp"].items()} == {"1": 6, "2": 21, "8": 12}
    tp8 = [c for c in cases if c.plan.stages[0].tp == 8]
    assert r["per_tp"]["8"]["signed_median"] == pytest.approx(statistics.median(validation.speed_error(c) for c in tp8))


def test_separate_wgrad_accumulation_by_release():
    """Which releases add each micro-batch's weight gradients with a kernel of their own (stack field
    ``wgrad_accumulation``): Megatron-LM v2.x yes, v3.0 (gradient-accumulation fusion) no; NeMo 22.05 / 22.06
    yes; 22.08 / 22.09 only without a pipeline; Transformer Engine NeMo (23.05) no."""
    sep = {v: resolve_stack(v).separate_wgrad_accumulation for v in
           ("megatron-lm@2.0", "megatron-lm@2.5", "megatron-lm@3.0", "megatron-lm", "nemo@22.05", "nemo@22.06",
            "nemo@22.08", "nemo@22.09", "nemo@23.05")}
    assert sep["megatron-lm@2.0"](1) and sep["megatron-lm@2.5"](8)
    assert not sep["megatron-lm@3.0"](1) and not sep["megatron-lm"](1)
    assert sep["nemo@22.05"](1) and sep["nemo@22.06"](4)
    assert sep["nemo@22.08"](1) and not sep["nemo@22.08"](8) and sep["nemo@22.09"](1) and not sep["nemo@22.09"](2)
    assert not sep["nemo@23.05"](1)


def test_separate_accumulation_worked_example():
    """SC'21's 1.7B (24 layers, h 2,304, 1.65e9 parameters) at TP 1 on A100 (2,039 GB/s): v2.5 adds each
    micro-batch's fp16 gradients into the fp16 main_grad (2 + 2 + 2 B) = 4.86 ms more backward per micro-batch
    than v3.0's fused accumulation; bf16 accumulates in fp32 (2 + 4 + 4 B) = 8.10 ms."""
    from hetplan.estimate.estimator import estimate
    from hetplan.model.counts import total_parameters

    m = validation.gpt_model(24, 2304, 24, 2048)
    assert total_parameters(m) == pytest.approx(1.65e9, rel=0.01)
    for dtype, per_param in (("fp16", 6.0), ("bf16", 10.0)):
        bwd = {}
        for stack in ("megatron-lm@2.5", "megatron-lm@3.0"):
            plan = validation.megatron_plan(m, gpu=validation.A100, tp=1, pp=1, dp=8, mbs=4, gbs=64, recompute="full",
                                            seq=2048, inter_node_bandwidth_bytes_per_s=200e9, stack=stack, dtype=dtype)
            bwd[stack] = estimate(plan, model=m).stages[0].backward_s
        extra = bwd["megatron-lm@2.5"] - bwd["megatron-lm@3.0"]
        assert extra == pytest.approx(total_parameters(m) * per_param / 2.039e12, rel=0.01)
    assert extra == pytest.approx(8.10e-3, rel=0.01)


def test_apex_distributed_adam_gathers_after_its_step(cases):
    """NeMo 22.08 at PP 1 (apex DistributedFusedAdam of 2022-08): the all-gather of the updated bf16 parameters
    runs inside the optimizer step, so all of it is exposed on top of the overlapped reduce-scatter's tail."""
    from hetplan.estimate.comm import dp_collective_time_s
    from hetplan.estimate.estimator import estimate, pool_link
    from hetplan.hardware.catalog import load_catalog

    c = next(c for c in cases if c.plan.job.stack == "nemo@22.08" and c.info["n"] == 256)
    est = estimate(c.plan, model=c.model)
    params = est.stages[0].memory.weights / 2  # bf16 weights
    link = pool_link(c.plan.pools[0], load_catalog().get(c.plan.pools[0].gpu))
    gather = float(dp_collective_time_s(params * 2, "allgather", 256, 1, link))
    assert gather > 0.04  # 10 GB of bf16 parameters over 32 nodes' NICs
    assert est.stages[0].dp_exposed_s >= gather
