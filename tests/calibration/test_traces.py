"""The schedule simulation against Espresso's measured DeepSpeed pipelines (hetplan.calibration.traces).

Fixture: tests/fixtures/profile/espresso/motivation1_2A30_A4000 (A30, A30, RTX A4000; 4 micro-batches). The whole
trace set (../shared/data/traces/espresso_hetero) is used where present, skipped otherwise (not package data).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from hetplan.calibration import traces
from hetplan.calibration.traces import predicted_iteration_s, read_pipeline, schedule_errors
from hetplan.profile.importers import read_espresso_rank

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "profile"  # holds espresso/motivation1_*
HAVE_TRACES = traces.ESPRESSO_TRACES.is_dir() and any(traces.ESPRESSO_TRACES.glob("*/motivation1_*"))


def test_reads_the_fixture_run():
    (run, gpus, _, folders), = traces.espresso_runs(FIXTURES)
    tp = read_pipeline(run, gpus, folders)
    # Medians of operations_record.csv: A30 stages 0.37 s forward / 1.14 s backward; a 65.5 MB activation
    # (8 x 2000 x 2048 x 2 B) takes 0.188 / 0.192 s to send (the sends whose partner was waiting; the five
    # shortest are 0.185); an iteration (4 micro-batches) takes 11.76 s.
    assert tp.forward_s[0] == pytest.approx(0.370, abs=0.005) and tp.backward_s[0] == pytest.approx(1.138, abs=0.01)
    assert tp.p2p_s == pytest.approx([0.188, 0.192], abs=0.002)
    ranks = [read_espresso_rank(f) for f in folders]
    for j, t in enumerate(tp.p2p_s):  # the transfer alone: no shorter than the fastest send, far below the waits
        sends = ranks[j].durations("SendActivation") + ranks[j + 1].durations("SendGrad")
        assert min(sends) <= t < 0.2 * max(sends)
    assert tp.iteration_s == pytest.approx(11.76, abs=0.02)
    assert tp.step_s < 1.0 and tp.num_microbatches == 4


def test_deepspeed_p2p_model_reproduces_the_fixture_run():
    """DeepSpeed's blocking instructions reproduce the measured iteration within 5 %; the asynchronous model and
    Megatron-LM's calls are 12-18 % short, because DeepSpeed's sends wait for the partner's receive at each step."""
    (run, gpus, _, folders), = traces.espresso_runs(FIXTURES)
    tp = read_pipeline(run, gpus, folders)
    err = {k: predicted_iteration_s(tp, k) / tp.iteration_s - 1 for k in ("async", "megatron", "deepspeed")}
    assert abs(err["deepspeed"]) < 0.05
    assert err["async"] < err["megatron"] < err["deepspeed"] < 0  # what the model leaves out is only ever missing
    assert abs(err["async"]) > 0.12


@pytest.mark.skipif(not HAVE_TRACES, reason="Espresso's traces are not here")
def test_deepspeed_p2p_model_on_every_traced_run():
    """All 12 readable runs (2-4 stages, 7 GPU types): DeepSpeed's model within 5 % on each (MAPE 3.2 %, measured
    2026-11-21), the asynchronous one 9.8 %."""
    rows = schedule_errors()
    assert len(rows) == 12
    assert all(abs(r["deepspeed"]) < 0.05 for r in rows)
    mape = {k: sum(abs(r[k]) for r in rows) / len(rows) for k in ("async", "megatron", "deepspeed")}
    assert mape["deepspeed"] < 0.04 < mape["megatron"] < mape["async"]
