"""Prediction intervals (hetplan.calibration.intervals): the conformal rule on worked examples and by simulation,
coverage on held-out validation rows, the residual table kept current, and the fields `plan --json` prints."""

import hashlib
import json
import math
import subprocess
import sys

import numpy as np
import pytest

from hetplan.calibration import intervals as iv


def test_conformal_worked_examples():
    r = [math.log(x) for x in (0.9, 1.0, 1.1, 1.2, 0.95, 1.05, 1.15, 0.85, 1.3)]
    lo, hi = iv.conformal_factors(r)  # n = 9: k = floor(0.1 * 10) = 1, the extremes
    assert (lo, hi) == pytest.approx((0.85, 1.3))
    assert iv.conformal_factors(r[:8]) is None  # k = 0: no 80 % interval from 8 rows
    r19 = [math.log(1 + i / 100) for i in range(19)]  # k = 2: second smallest and second largest
    assert iv.conformal_factors(r19) == pytest.approx((1.01, 1.17))


def test_conformal_coverage_by_simulation():
    """Split-conformal coverage is >= 80 % for exchangeable rows: 4,000 seeded draws of 12 residuals + 1 new run."""
    rng = np.random.default_rng(7)
    hits = []
    for _ in range(4000):
        x = rng.normal(0.1, 0.2, size=13)
        lo, hi = iv.conformal_factors(x[:12])
        hits.append(lo <= math.exp(x[12]) <= hi)
    assert np.mean(hits) >= 0.8 - 0.02  # binomial sd at n = 4000: 0.6 %


def test_held_out_coverage_on_validation_rows():
    """Intervals from a seeded half of the residual table hold the measured time of >= 75 % of the other half's
    rows (achieved 90.8 % over 792 rows with the source shifts, 81.4 % without; the issue's bound is 70 %)."""
    rows = list(iv.load_residuals())
    first = [r for r in rows if hashlib.sha256(("iv:" + r.key).encode()).digest()[0] < 128]
    second = [r for r in rows if r not in first]
    hits = []
    shifts = iv.source_shifts(first)
    for r in second:
        i = iv.interval_from(first, r.stack, r.generation, r.moe, r.num_gpus, shifts)
        if not isinstance(i, str):
            hits.append(i.low_factor * r.predicted_time_s <= r.measured_time_s <= i.high_factor * r.predicted_time_s)
    assert len(hits) > 500 and np.mean(hits) >= 0.75


def test_conformal_level_is_the_fit_and_gives_a_new_source_its_nominal_coverage():
    """The conformal rule's level is the smallest that gives the validation sets, each judged by intervals built
    without it, 80 % coverage on average; at the nominal 0.80 they get less (the sources seen estimate the spread
    of the next one too narrowly), and in sample the intervals still hold >= 80 %."""
    rows = list(iv.load_residuals())
    assert iv.fit_conformal_level(rows) == iv.CONFORMAL_LEVEL > iv.LEVEL
    nominal, chosen = iv.coverage(rows, iv.LEVEL), iv.coverage(rows)
    assert iv.per_set_coverage(nominal) < iv.LEVEL <= iv.per_set_coverage(chosen)
    assert chosen["all"]["leave_set_out_per_set"] == iv.per_set_coverage(chosen)
    assert iv.per_set_coverage(chosen, "in_sample") >= iv.LEVEL and chosen["all"]["in_sample"] >= iv.LEVEL
    assert chosen["all"]["leave_set_out"] >= 0.75  # row-weighted (vTrain's 1,055 single-node rows weigh most)


def test_coverage_counts_in_sample_and_leave_set_out():
    """A set alone in its stack is unvalidated once left out; in sample, split-conformal holds >= 80 % of its own
    rows (the interval spans the k-th smallest to the k-th largest of n rows: n + 2 - 2k of them)."""
    rng = np.random.default_rng(3)

    def row(name, stack, i, ratio):
        return iv.Residual(name, f"{name}:{i}", stack, "H100-SXM", "Hopper", False, 64, "bf16", 1.0, ratio, 0.4)

    a = [row("a", "torchtitan", i, math.exp(x)) for i, x in enumerate(rng.normal(0, 0.1, 23))]
    b = [row("b", "torchtitan", i, math.exp(x)) for i, x in enumerate(rng.normal(0.3, 0.01, 12))]
    c = [row("c", "nemo", i, 1.0) for i in range(5)]
    cov = iv.coverage(a + b + c, 0.82)  # at 0.84 (k = 1 of 23) a's one row at +0.33 would reach b's +0.30
    assert cov["c"]["unvalidated_leave_set_out"] == 5 and math.isnan(cov["c"]["leave_set_out"])
    assert cov["b"]["leave_set_out"] < 0.2  # b sits 30 % above a's spread: a's interval misses it
    shifts = iv.source_shifts(a + b + c)
    assert len(shifts) == 2  # c is the only nemo source: no shift of its own
    hits = 0
    for r in a:
        lo, hi = iv.conformal_factors([x.log_ratio + d for x in a + b for d in shifts], 0.82)
        hits += lo <= r.measured_time_s <= hi
    assert cov["a"]["in_sample"] == pytest.approx(hits / len(a))
    assert cov["all"]["n"] == 40 and cov["all"]["unvalidated_leave_set_out"] == 5


def test_source_shifts_worked_example():
    """Two sources of one regime 20 % apart: each sits ±log(1.2) from the other; a stack's only source gives no
    shift; the interval of the regime spans both sources' rows moved by both shifts."""
    def row(name, stack, i, ratio):
        return iv.Residual(name, f"{name}:{i}", stack, "H100-SXM", "Hopper", False, 64, "bf16", 1.0, ratio, 0.4)

    a = [row("a", "torchtitan", i, 1.0) for i in range(9)]
    b = [row("b", "torchtitan", i, 1.2) for i in range(9)]
    c = [row("c", "nemo", i, 1.0) for i in range(9)]
    d = math.log(1.2)
    assert iv.source_shifts(a + b + c) == pytest.approx([-d, d])
    assert iv.source_shifts(c).tolist() == [0.0]  # one source: nothing known of the next
    i = iv.interval_from(a + b + c, "torchtitan", "Hopper", False, 64)
    # 36 sums: 9 each at -d, 0, d and 2d; k = floor(0.1 * 37) = 3: the extremes
    assert (i.low_factor, i.high_factor) == pytest.approx((1 / 1.2, 1.2 * 1.2))


def test_unvalidated_stack_says_so():
    out = iv.interval_from(list(iv.load_residuals()), "hf-accelerate", "Hopper", False, 64)
    assert isinstance(out, str) and out.startswith("unvalidated: 0 held-out")


def test_regime_widens_until_enough_rows():
    rows = list(iv.load_residuals())
    i = iv.interval_from(rows, "megatron-lm", "Hopper", False, 64)
    assert i.n >= iv.MIN_ROWS and i.regime == "megatron-lm · Hopper"  # 8 dense Hopper rows: the MoE ones join
    assert sum(r.stack == "megatron-lm" and r.generation == "Hopper" for r in rows) == i.n


def test_mfu_record_is_the_best_measured_row():
    rows = list(iv.load_residuals())
    rec = iv.mfu_record(rows, "megatron-lm", "A100-SXM-80GB")
    assert rec.measured_mfu == max(r.measured_mfu for r in rows if r.stack == "megatron-lm" and r.gpu == rec.gpu)
    s = {"iteration_time_s": 10.0, "tokens_per_s": 1e5, "mfu": rec.measured_mfu + 0.01}
    iv.annotate(s, iv.Interval(0.9, 1.2, 30, "x"), rec)
    assert s["iteration_time_s_interval"] == pytest.approx([9.0, 12.0])
    assert s["tokens_per_s_interval"] == pytest.approx([1e5 / 1.2, 1e5 / 0.9])
    assert iv._closed_parts(rec.key) in s["mfu_record"]["note"]


def test_mfu_record_says_what_the_plan_runs_that_the_record_did_not():
    """The record above GPT-3 175B's 62.6 % on 1,024 A100 (the bench_plan answer) is Korthikanti et al.'s 1T run
    on Megatron-LM 3.0 of 2022 with selective recomputation and the unfused-score attention of then; the note
    says so and what the plan runs instead (today's release, no recomputation, FlashAttention), and says when
    nothing of that differs."""
    from hetplan.plan import GPUPool, Job, Plan, Stage

    rows = list(iv.load_residuals())
    rec = iv.mfu_record(rows, "megatron-lm", "A100-SXM-80GB")
    assert (rec.key, rec.release, rec.recompute, rec.attention) == ("k5:1T:selective", "megatron-lm@3.0",
                                                                     "selective", "standard")
    plan = Plan(job=Job(model="gpt3-175b", seq_len=2048, global_batch=1536), mbs=2, zero=1,
                pools=[GPUPool(gpu="A100-SXM-80GB", count=1024)], virtual_stages=12,
                stages=[Stage(num_layers=12, tp=4, dp=32) for _ in range(8)])
    s = {"iteration_time_s": 17.0, "tokens_per_s": 1e5, "mfu": 0.626, "plan": plan.model_dump(mode="json")}
    iv.annotate(s, iv.Interval(0.9, 1.2, 30, "x"), rec)
    assert s["mfu_record"]["differs"] == {"release": "megatron-lm@core_r0.15", "recompute": "none",
                                          "attention": "flash"}
    assert s["mfu_record"]["note"].endswith("(k5:1T:selective: megatron-lm@3.0 of 2022-07, selective recomputation, "
                                            "standard attention); this plan runs megatron-lm@core_r0.15 of 2026-01, "
                                            "no recomputation, flash attention")
    same = plan.model_copy(update={"job": plan.job.model_copy(update={"stack": "megatron-lm@3.0",
                                                                       "attention": "standard"}),
                                   "stages": [st.model_copy(update={"recompute": "selective"}) for st in plan.stages]})
    s = {"iteration_time_s": 17.0, "tokens_per_s": 1e5, "mfu": 0.626, "plan": same.model_dump(mode="json")}
    iv.annotate(s, iv.Interval(0.9, 1.2, 30, "x"), rec)
    assert s["mfu_record"]["differs"] == {} and "runs the same release, recomputation and attention" in s[
        "mfu_record"]["note"]


@pytest.mark.slow
def test_residual_table_is_current():
    """The shipped table equals what the current cost model gives (regenerate: hetplan validate --write-residuals)."""
    now = iv.residuals_csv(iv.build_residuals())
    assert now == iv.residuals_csv(iv.load_residuals()), "run `hetplan validate --write-residuals` and commit"


def _plan_json(*args: str) -> dict:
    out = subprocess.run([sys.executable, "-m", "hetplan.cli.main", "plan", "--model", "llama2-7b", "--seq-len", "4096",
                          "--global-batch", "1024", "--tokens", "1e12", "--gpu", "H100-SXM", "--gpus", "64", "--json",
                          *args], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)["plans"][0]


def test_plan_json_carries_intervals():
    p = _plan_json("--top", "1")
    lo, hi = p["iteration_time_s_interval"]
    assert lo < p["iteration_time_s"] < hi and p["interval"]["n"] >= iv.MIN_ROWS
    assert p["job_usd_interval"][1] / p["job_usd"] == pytest.approx(hi / p["iteration_time_s"])
    assert p["tokens_per_s_interval"][0] == pytest.approx(p["tokens_per_s"] * p["iteration_time_s"] / hi)
    assert "unvalidated" in _plan_json("--top", "1", "--framework", "deepspeed")["interval"]


def test_a_dense_plan_is_held_to_the_dense_record():
    """The MFU record a plan is compared with is of its own kind: on GB300 under megatron-lm the only row was the
    ModelZoo's Qwen3-235B MoE run (23.8 %), and a dense Llama 3 70B FP8 plan at 35 % printed that it was above
    it. A dense plan has no dense record there, so no note; an MoE plan keeps the MoE one."""
    rows = list(iv.load_residuals())
    moe = iv.mfu_record(rows, "megatron-lm", "GB300", moe=True)
    assert moe is not None and moe.moe and iv.mfu_record(rows, "megatron-lm", "GB300") == moe
    assert iv.mfu_record(rows, "megatron-lm", "GB300", moe=False) is None
    dense = iv.mfu_record(rows, "nemo", "GB300", moe=False)  # Megatron-Bridge's Llama rows
    assert dense is not None and not dense.moe and dense.measured_mfu > moe.measured_mfu


def test_mfu_record_note_pairs_its_parentheses():
    """The H100 record's key cuts its model name inside a parenthesis ("GPT 16B (Megatron we"); the note closes
    it, so the sentence's own parentheses pair."""
    rec = iv.package_mfu_record("megatron-lm", "H100-SXM", False)
    assert rec.key.count("(") > rec.key.count(")")
    s = {"iteration_time_s": 10.0, "tokens_per_s": 1e5, "mfu": rec.measured_mfu + 0.01}
    iv.annotate(s, iv.Interval(0.9, 1.2, 30, "x"), rec)
    note = s["mfu_record"]["note"]
    assert note.count("(") == note.count(")") and "…)" in note
