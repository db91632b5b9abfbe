"""Shape-dependent efficiency and host launch floor against FASOP's measured per-layer times (issue 3).

Measured figures: tests/fixtures/fasop/gpt2xl_layer_forward_ms.csv (FASOP HPDC'24 profiles, source in the file) and
the packaged ``fasop_layers`` validation set. Tolerances are stated per assertion.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest

from hetplan.errors import HetplanError
from hetplan.calibration import calibrate, validation
from hetplan.estimate import compute
from hetplan.estimate.estimator import estimate
from hetplan.hardware.catalog import load_catalog
from hetplan.plan import GPUPool

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "fasop" / "gpt2xl_layer_forward_ms.csv"


def _fixture():
    lines = [ln for ln in FIXTURE.read_text().splitlines() if not ln.startswith("#")]
    return {(r["gpu"], int(r["tp"])): float(r["forward_ms"]) / 1e3 for r in csv.DictReader(lines)}


def test_packaged_fasop_rows_match_the_fixture():
    rows = {(dev, tp): meas for label, _, _, dev, tp, meas in validation.fasop_rows() if label == "gpt2XL"}
    fix = _fixture()
    assert set(fix) <= set(rows)
    for k, v in fix.items():
        assert rows[k] == pytest.approx(v, rel=2e-3), k


@pytest.mark.parametrize("gpu,tol", [("A100-SXM-40GB", 0.25), ("A10G", 0.10), ("RTX-3090", 0.35)])
def test_gpt2xl_tp1_layer_forward_within_tolerance(gpu, tol):
    m, s = validation.fasop_models()["gpt2XL"]
    pred = validation.fasop_layer_forward_s(m, gpu, s, 1)
    assert abs(pred / _fixture()[(gpu, 1)] - 1) <= tol


def test_a100_over_a10g_ratio_at_microbatch_1_is_compressed_like_fasops():
    """FASOP: A10G/A100 layer time 1.43 at micro-batch 1 although the peak ratio is 4.5. We must be within 5 %
    of 1.43 (we were at 2.9 with the uncalibrated A10, 2.0 with the uncalibrated A10G, 1.69 before the A100's
    8-byte-aligned attention core, GPT-2 XL's d = 100, took its measured slowdown), and the ratio must grow at
    micro-batch 8, where the host floor no longer hides the GPU difference (from 1.46 to 1.65: less than the 3.7
    it was, the A100's slow attention core growing with the micro-batch too)."""
    res, cases = validation.run_validation(("fasop_layers",))
    r = res["sets"]["fasop_layers"]["a10g_over_a100_gpt2xl"]
    assert r["measured_mbs1"] == pytest.approx(2.342 / 1.638)
    assert abs(r["predicted_mbs1"] / r["measured_mbs1"] - 1) <= 0.05
    assert r["predicted_mbs8"] > 1.1 * r["predicted_mbs1"]
    assert r["predicted_mbs8"] < r["peak_ratio"]


def test_fasop_layers_errors():
    """Whole set MAPE <= 13 %, held-out half <= 18 %, A10G <= 15 % (measured 10.5 / 13.5 / 11.0 %)."""
    res, _ = validation.run_validation(("fasop_layers",))
    r = res["sets"]["fasop_layers"]
    assert r["n"] == 33
    assert r["mape"] <= 0.13
    assert r["held_out"]["mape"] <= 0.18 and r["held_out"]["n"] >= 10
    assert r["per_gpu"]["A10G"]["mape"] <= 0.15


def test_committed_constants_are_what_calibrate_fits():
    fit = calibrate.fit_fasop()
    cat = load_catalog()
    assert cat.get("A10G").compute_efficiency == pytest.approx(fit["A10G_compute_efficiency"], rel=0.01)
    assert cat.get("A10G").kernel_overhead_s == pytest.approx(fit["A10G_kernel_overhead_s"], rel=0.02)
    assert validation.FASOP_HOSTS["A100-SXM-40GB"][1] == pytest.approx(fit["p4d_kernel_overhead_s"], rel=0.02)
    assert validation.FASOP_HOSTS["RTX-3090"][1] == pytest.approx(fit["rtx3090_host_kernel_overhead_s"], rel=0.02)
    assert fit["held_out"]["mape"] < 0.2


def test_a10_takes_a10g_efficiency_and_keeps_the_default_host():
    cat = load_catalog()
    assert cat.get("A10").compute_efficiency == cat.get("A10G").compute_efficiency
    assert cat.get("A10").kernel_overhead_s == cat.get("A100-SXM-40GB").kernel_overhead_s


def _small_plan(kernel_overhead_s):
    m = validation.gpt_model(4, 1024, 16, 1024, vocab=50257)
    plan = validation.megatron_plan(m, gpu="A100-SXM-40GB", tp=1, pp=1, dp=1, mbs=1, gbs=4, recompute="none",
                                    seq=1024, inter_node_bandwidth_bytes_per_s=100e9)
    pool = plan.pools[0].model_copy(update={"kernel_overhead_s": kernel_overhead_s})
    return plan.model_copy(update={"pools": [pool]}), m


def test_pool_kernel_overhead_is_a_host_floor_in_estimate():
    base, m = _small_plan(None)
    same, _ = _small_plan(load_catalog().get("A100-SXM-40GB").kernel_overhead_s)
    slow, _ = _small_plan(2 * 73.8e-6)
    t0 = estimate(base, model=m).iteration_time_s
    assert estimate(same, model=m).iteration_time_s == pytest.approx(t0, rel=1e-12)
    # A host-bound small model: a host twice as slow as p4d makes the iteration markedly slower.
    assert estimate(slow, model=m).iteration_time_s > 1.3 * t0


def test_pool_gpu_applies_override_and_names_the_field():
    cat = load_catalog()
    gpu = compute.pool_gpu(cat, GPUPool(gpu="A10G", count=4, kernel_overhead_s=1e-4))
    assert gpu.kernel_overhead_s == 1e-4 and gpu.name == "A10G"
    assert compute.pool_gpu(cat, GPUPool(gpu="A10G", count=4)) == cat.get("A10G").model_copy(update={"attention_kernel": "fa2"})
    with pytest.raises(HetplanError) as e:
        compute.pool_gpu(cat, GPUPool(gpu="B9000", count=1), field="plan.pools[0].gpu")
    assert "plan.pools[0].gpu" in str(e.value.field if hasattr(e.value, "field") else e.value)


def test_pool_kernel_overhead_rejects_nonsense():
    with pytest.raises(ValueError):
        GPUPool(gpu="A10G", count=1, kernel_overhead_s=-1.0)
    with pytest.raises(ValueError):
        GPUPool(gpu="A10G", count=1, kernel_overhead_s=1.0)  # 1 s per kernel: seconds given as microseconds?
    assert math.isfinite(GPUPool(gpu="A10G", count=1, kernel_overhead_s=7e-5).kernel_overhead_s)
