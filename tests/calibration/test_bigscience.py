"""BigScience's A100 runs of DeepSpeed's pipeline engine (set ``bigscience_a100``): the rows load as published,
each row's model reproduces its published TFLOP/s from its step time (which fixes the layer counts the tables
give only as a size), DeepSpeed's layer partition as the chronicle and the 176B README state it."""

import csv
from importlib import resources

import pytest

from hetplan.calibration import modern
from hetplan.calibration.modern import bigscience as bs
from hetplan.estimate import memory


def _rows():
    text = resources.files("hetplan.calibration").joinpath("validation_data", "modern", modern.FILES[bs.SET])
    return list(csv.DictReader(text.read_text().splitlines()))


@pytest.fixture(scope="module")
def loaded():
    return bs.bigscience_cases()


def test_every_row_is_a_case_or_listed_with_its_reason(loaded):
    cases, skipped = loaded
    rows = _rows()
    assert len(rows) == 135
    assert len(cases) == 128 and len(skipped) == 7
    oom = [s for s in skipped if s.reason.startswith("measured OOM")]
    assert len(oom) == 6 == sum(r["memory_gb_per_gpu"] == "OOM" for r in rows)
    # the one row whose layout does not multiply to its GPUs (40 nodes, DP 8 x TP 8 x PP 10)
    assert [s for s in skipped if s not in oom][0].reason.startswith("TP 8 x PP 10 x DP 8")


def test_each_row_reproduces_its_published_tflops():
    """SC'21 Eq. 3 with the row's model: exact from 02-21 on (PR 251's formula), 0.964 of it before, on every
    row but the 8-layer proxies of 02-17 — so the layer counts read off the tables' "Size" are the ones that ran."""
    for r in _rows():
        if not r["iteration_time_s"] or not r["layers"]:
            continue
        ratio = float(r["tflops_reported"]) / bs.sc21_tflops(r)
        if r["date"] >= "02-21" or r["section"] == "production":
            assert ratio == pytest.approx(1.0, abs=0.002), r
        elif r["layers"] != "8":
            assert ratio == pytest.approx(0.964, abs=0.002), r


def test_deepspeed_partition_as_published():
    # chronicle, "Re-do": 78 layers on 12 stages leave the last stage one block, the others 7
    assert bs.deepspeed_partition(78, 12, False) == [7] * 11 + [1]
    # tr11-176B-ml README: 'type:transformer|embedding' gives [embed | 5], 6 x 10, [5 | embed]
    assert bs.deepspeed_partition(70, 12, True) == [5] + [6] * 10 + [5]
    assert bs.deepspeed_partition(72, 12, False) == [6] * 12
    assert bs.deepspeed_partition(106, 12, True) == [8] + [9] * 10 + [8]


def test_vocabulary_padding_and_model():
    assert bs.padded_vocab(250680, 4) == bs.padded_vocab(250680, 8) == 250880
    assert bs.padded_vocab(250680, 1) == 250752
    r = next(r for r in _rows() if r["section"] == "production")
    assert bs.bigscience_config(r) | {"model_type": "bloom"} == {
        "model_type": "bloom", "n_layer": 70, "hidden_size": 14336, "n_head": 112, "vocab_size": 250880,
        "seq_length": 2048, "hidden_dropout": 0.1, "attention_dropout": 0.1}
    m = bs.bigscience_model(r)
    assert (m.num_layers, m.hidden_size, m.num_attention_heads, m.vocab_size) == (70, 14336, 112, 250880)
    assert m.tied_embeddings and m.learned_positions == 0  # ALiBi
    # the 176B README's sizes: one layer 12h^2 + 13h, the embedding V x h
    assert m.hidden_size * m.vocab_size == 3_596_615_680


def test_plans_run_the_pipeline_engine_of_2022_on_jean_zay(loaded):
    cases, _ = loaded
    c = next(c for c in cases if c.key.split(":")[2] == "production")
    assert c.plan.job.framework == "deepspeed" and c.plan.job.stack == "megatron-deepspeed@2022"
    assert [s.num_layers for s in c.plan.stages] == [5] + [6] * 10 + [5]
    pool = c.plan.pools[0]
    assert pool.gpus_per_node == 8 and pool.inter_node_bandwidth_bytes_per_s == 50e9
    assert all(s.recompute == "full" for s in c.plan.stages) and c.plan.zero == 1
    assert c.memory_includes_context  # nvidia-smi's memory: compared with the stage total itself
    c.evaluate()
    est_total = c.predicted_memory_bytes
    c.memory_includes_context = False
    c.evaluate()
    assert est_total - c.predicted_memory_bytes == pytest.approx(memory.CUDA_CONTEXT_BYTES)


def test_not_in_the_gpu_efficiency_fit():
    from hetplan.calibration import modern_fit

    assert bs.SET in modern.SET_NAMES and bs.SET in modern.NOT_FITTED
    assert bs.SET not in modern_fit._FIT_SETS


def _under(c, stack):
    from hetplan.estimate.estimator import estimate

    plan = c.plan.model_copy(update={"job": c.plan.job.model_copy(update={"stack": stack})})
    return estimate(plan, model=c.model)


def test_bf16_optimizer_terms_worked_example(loaded):
    """The production step (bf16) under the 2022 release, whose BF16_Optimizer holds the state, against the same
    plan under the 2021 release (DeepSpeed's ZeRO-1 optimizer): per GPU, 4 B per parameter of fp32 gradient
    buffer, 18 B per parameter moved after every micro-batch's backward, and the gradient reduction an fp32
    all-reduce where ZeRO-1 reduce-scatters."""
    from hetplan.estimate.stage import AUTOGRAD_ACCUMULATE_PASSES, BF16_ACCUMULATE_BYTES_PER_PARAMETER
    from hetplan.estimate.variability import slowest_gpu_factor
    from hetplan.hardware.catalog import load_catalog

    cases, _ = loaded
    c = next(c for c in cases if c.key.split(":")[2] == "production")
    new, old = _under(c, "megatron-deepspeed@2022"), _under(c, "megatron-deepspeed@2021")
    hbm = load_catalog().get(c.plan.pools[0].gpu).hbm_bandwidth_bytes_per_s
    mb = c.plan.job.global_batch // (c.plan.stages[0].dp * c.plan.mbs)  # micro-batches per step
    assert mb == 2048 // (8 * 2)
    for a, b in zip(new.stages, old.stages):
        params = (a.memory.gradients - b.memory.gradients) / memory.BF16_OPTIMIZER_GRAD_BYTES
        assert a.memory.gradients == pytest.approx(3 * b.memory.gradients)  # (2 + 4) B against 2 B
        assert params == pytest.approx(3.7e9, rel=0.1)  # six layers of 617 M on a middle stage, TP 4
        # the 2021 release's ZeRO-1 leaves the sum to autograd's in-place .grad accumulation (6 B per parameter
        # after every micro-batch but the first; stage.autograd_accumulation_time_s)
        extra = BF16_ACCUMULATE_BYTES_PER_PARAMETER - AUTOGRAD_ACCUMULATE_PASSES * 2 * (mb - 1) / mb
        slowest = slowest_gpu_factor(a.tp * a.dp, load_catalog().get(a.gpu).speed_variability)  # 32 GPUs
        assert a.backward_s - b.backward_s == pytest.approx(params * extra / hbm * slowest)
        assert a.forward_s == b.forward_s
        assert a.dp_exposed_s > 1.4 * b.dp_exposed_s  # all-reduce (2x a reduce-scatter's traffic) + all-gather
    assert new.iteration_time_s > old.iteration_time_s


def test_measured_oom_rows_the_estimate_refuses():
    refused = {r["key"].split(":", 2)[2] for r in bs.oom_check() if not r["fits"]}
    # DP 48 at PP 1 (100.9 GiB), TP 2 x PP 6 x DP 32 at micro-batch 2, and the bf16 100-layer TP 4 x PP 6 x DP 16
    # at micro-batch 2 (BF16_Optimizer's unpartitioned fp32 gradients: 51 GiB without them)
    assert refused == {"lower-pp:tp8pp1dp48mb1", "tp-variations:tp2pp6dp32mb2", "rebalancing:tp4pp6dp16mb2"}


def test_misaligned_head_dimension_runs_the_attention_core_on_cuda_cores():
    """Megatron's attention core strides its batches by the head dimension: d = 225 (hidden 14,400 / 64 heads,
    2-byte-aligned batches) runs the two batched GEMMs at the fp32 FMA rate, 312 / 19.5 = 16x slower on an A100;
    d = 224 does not; d = 100 (8-byte aligned) takes the GPU's measured slowdown (A100: 9.1x, BLOOM's d = 108 rows),
    nothing on a GPU where it was not measured (H100)."""
    from hetplan.estimate import compute
    from hetplan.hardware.catalog import load_catalog
    from hetplan.model.spec import ModelSpec

    a100 = load_catalog().get("A100-SXM-80GB")
    r = next(r for r in _rows() if r["hidden"] == "14400" and r["heads"] == "64" and r["tp"] == "8")
    m225 = bs.bigscience_model(r)
    m224 = ModelSpec(**(m225.model_dump() | {"hidden_size": 14336, "head_dim": 224, "ffn_hidden_size": 4 * 14336}))
    assert compute.core_alignment_factor(m225, a100, "fp16") == pytest.approx(16.0)
    assert compute.core_alignment_factor(m224, a100, "fp16") == 1.0
    m100 = ModelSpec(**(m225.model_dump() | {"hidden_size": 1600, "num_attention_heads": 16, "num_kv_heads": 16,
                                            "head_dim": 100, "ffn_hidden_size": 6400}))
    assert compute.core_alignment_factor(m100, a100, "fp16") == a100.core_align8_slowdown == 9.1
    assert compute.core_alignment_factor(m100, load_catalog().get("H100-SXM"), "bf16") == 1.0
    lin225, core225 = compute.attention_gemm_times_s(m225, a100, "fp16", 1, 2048, 8)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(compute, "core_alignment_factor", lambda *a: 1.0)
        lin, core = compute.attention_gemm_times_s(m225, a100, "fp16", 1, 2048, 8)
    assert lin225 == lin and core225 == pytest.approx(16 * core)


def test_set_accuracy_reached(loaded):
    """Figures reached (docs/estimator.md, "DeepSpeed's pipeline engine"), with a small margin: a regression guard.
    The held-out three quarters reach them too: the stack's residual is fitted on the seeded quarter
    (test_stack_fit)."""
    from hetplan.calibration.modern import run_modern

    r = run_modern([bs.SET])[0][bs.SET]
    assert r["n"] == 128
    assert r["mape"] <= 0.05 and abs(r["signed_median"]) <= 0.03 and r["max_abs_error"] <= 0.30
    assert r["held_out"]["mape"] <= 0.05 and abs(r["held_out"]["signed_median"]) <= 0.03


def test_validate_reports_per_tp_per_pp_and_the_oom_rows():
    from hetplan.calibration.modern import run_modern

    r = run_modern([bs.SET])[0][bs.SET]
    assert set(r["per_tp"]) == {"1", "2", "4", "8"} and sum(g["n"] for g in r["per_tp"].values()) == r["n"]
    assert sum(g["n"] for g in r["per_pp"].values()) == r["n"] and "48" in r["per_pp"]
    assert all(abs(r["per_tp"][t]["signed_median"]) < 0.05 for t in ("4", "8"))  # no TP trend left (was +10 / +17 %)
    assert len(r["measured_oom"]) == 6 and r["does_not_fit"] == []
