"""The 2021-22 A100 set ``nemo_megatron_a100`` (NeMo Megatron 22.05-22.09 launcher READMEs, MT-NLG 530B):
rows, layouts, stacks and the measured iteration time derived from tokens/s."""

import statistics

import pytest

from hetplan.calibration import stacks_2022, validation
from hetplan.hardware.stacks import resolve_stack


@pytest.fixture(scope="module")
def cases():
    return stacks_2022.cases()


def test_rows_layouts_and_stacks(cases):
    assert len(cases) == 32
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
    assert by_stack == {"nemo@22.05": 7, "nemo@22.06": 7, "nemo@22.08": 3, "nemo@22.09": 11,
                        "megatron-deepspeed@2021": 3, "megatron-lm@2.0": 1}


def test_stack_releases_follow_the_launcher_changelog():
    """22.05: no sequence parallelism, no selective recomputation, no distributed Adam; 22.06 adds the first
    two, 22.08 the distributed optimizer (ZeRO-1)."""
    s05, s06, s08 = (resolve_stack(f"nemo@{v}") for v in ("22.05", "22.06", "22.08"))
    assert not s05.sequence_parallel and "selective" not in s05.recompute and s05.zero == (0,)
    assert s06.sequence_parallel and "selective" in s06.recompute and s06.zero == (0,)
    assert s08.zero == (0, 1) and resolve_stack("nemo@2022-07").id == "nemo@22.06"


def test_measured_time_from_tokens_per_second(cases):
    """22.05, one DGX A100 node: 1,440 sequences x 2,048 tokens at 39,660 tokens/s = 74.36 s; MT-NLG on 280
    nodes: the paper's 60.1 s as given."""
    assert cases[0].measured == pytest.approx(1440 * 2048 / 39660)
    assert cases[0].measured == pytest.approx(74.36, abs=0.01)
    mtnlg = [c for c in cases if c.plan.job.stack == "megatron-deepspeed@2021"]
    assert [c.measured for c in mtnlg] == [60.1, 50.2, 44.4]
    assert [c.info["n"] for c in mtnlg] == [2240, 2800, 3360]


def test_tp2_rows_within_ten_percent(cases):
    """The 5B rows at TP 2 (22.05 / 22.06) are predicted within 10 % (achieved +2.3 ... +9.6 %)."""
    for c in cases:
        if c.plan.stages[0].tp == 2:
            c.predicted = c.predict(validation.DEFAULT)
            assert abs(validation.speed_error(c)) < 0.10, c.key


def test_per_tp_partitions_the_set():
    """``per_tp`` (the set's metrics by TP degree, in ``hetplan validate --json``) counts every row once."""
    res, cases = validation.run_validation(["nemo_megatron_a100"])
    r = res["sets"]["nemo_megatron_a100"]
    assert {k: v["n"] for k, v in r["per_tp"].items()} == {"1": 6, "2": 14, "8": 12}
    tp8 = [c for c in cases if c.plan.stages[0].tp == 8]
    assert r["per_tp"]["8"]["signed_median"] == pytest.approx(statistics.median(validation.speed_error(c) for c in tp8))
