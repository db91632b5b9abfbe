"""Swap cost model: shard bytes (the training memory model's counts) against the torch shards, worked examples,
and the published Computron load times (fitted, and held out)."""


import math

import numpy as np
import pytest

from hetplan.errors import HetplanError
from hetplan.estimate.inference import weight_bytes_per_worker
from hetplan.model.counts import total_parameters
from hetplan.model.spec import load_model
from hetplan.plan import layer_ranges
from hetplan.serve.swap_model import COMPUTRON_A100_PCIE4, COMPUTRON_OPT13B_LOAD_TIME_S, SwapModel

# Stated tolerance of the swap model against Computron (Zou et al. 2023) OPT-13B load times: every point within
# 25 % and RMS relative error below 17 % (docs/serving.md explains the two outliers).
COMPUTRON_MAX_REL_ERR = 0.25
COMPUTRON_RMS_REL_ERR = 0.17


@pytest.fixture
def opt13b(fixtures):
    return load_model(fixtures / "opt-13b.json")


@pytest.mark.parametrize("tp,pp", [(1, 1), (2, 1), (1, 2), (2, 2)])
def test_shard_bytes_close_to_torch_module_bytes(fixtures, tp, pp):
    """The cost model counts parameters as training memory does (unpadded vocabulary, norms split over TP); the
    torch shards pad the vocabulary to 128·t rows and replicate the position table, norms and row biases over TP.
    On the small OPT (h = 256, vocabulary 8,192) they differ by at most 1.9 % (TP = 2: mostly the replicated
    258 x 256 position table); on real models by less (OPT-13B, TP = 2: its 2,050 x 5,120 table is 0.2 %)."""
    torch = pytest.importorskip("torch")
    from hetplan.model.torch_transformer import Partition, TransformerStage, parameter_bytes

    spec = load_model(fixtures / "small-opt.json")
    want = weight_bytes_per_worker(spec, tp, pp, "fp32")
    got = []
    for s, (lo, hi) in enumerate(layer_ranges(spec.num_layers, pp)):
        for r in range(tp):
            st = TransformerStage(spec, Partition(lo, hi, s == 0, s == pp - 1, r, tp), dtype=torch.float32)
            got.append(parameter_bytes(st))
    assert want == pytest.approx(got, rel=0.02)


def test_unsharded_bytes_match_counts(opt13b):
    assert weight_bytes_per_worker(opt13b, 1, 1) == [2 * total_parameters(opt13b)]
    assert total_parameters(opt13b) == pytest.approx(12.85e9, rel=0.01)  # OPT paper Table 1: 13B
    # PP keeps a second copy of the tied embedding on the last stage
    two = weight_bytes_per_worker(opt13b, 1, 2)
    assert sum(two) == 2 * (total_parameters(opt13b) + opt13b.vocab_size * 5120)


def test_worked_example_with_shared_switch():
    sm = SwapModel(32e9, efficiency=0.5, gpus_per_switch=2, switch_bandwidth_bytes_per_s=32e9, overhead_s=0.1)
    # two GPUs on a switch split its uplink: 0.5 * min(32, 32/2) = 8 GB/s each; a lone GPU gets 16 GB/s
    assert sm.worker_bandwidths(3) == pytest.approx([8e9, 8e9, 16e9])
    assert sm.transfer_time_s([1.6e9] * 4) == pytest.approx(0.1 + 0.2)
    assert sm.transfer_time_s([0, 0, 3.2e9]) == pytest.approx(0.1 + 0.2)
    assert sm.transfer_time_s([]) == 0.0
    # out and in overlapped (full-duplex link): the longer direction
    assert sm.swap_time_s([1.6e9, 1.6e9], [0.8e9, 0.8e9]) == pytest.approx(0.3)


def test_bad_swap_model_values():
    with pytest.raises(HetplanError) as e:
        SwapModel(32e9, efficiency=1.5)
    assert e.value.field == "swap.efficiency"
    with pytest.raises(HetplanError):
        weight_bytes_per_worker(load_model("llama2-7b"), 3, 1)  # 32 heads not divisible by 3


def _rel_errors(sm, spec):
    return {k: (sm.load_time_s(spec, *k, "fp16") - t) / t for k, t in COMPUTRON_OPT13B_LOAD_TIME_S.items()}


def test_computron_published_load_times_within_tolerance(opt13b):
    errs = _rel_errors(COMPUTRON_A100_PCIE4, opt13b)
    assert max(abs(e) for e in errs.values()) <= COMPUTRON_MAX_REL_ERR
    assert math.sqrt(np.mean([e * e for e in errs.values()])) <= COMPUTRON_RMS_REL_ERR
    # exact model values at the fitted constants (regression guard): (1,1) moves 25.71 GB at 0.743 x 32 GB/s
    assert COMPUTRON_A100_PCIE4.load_time_s(opt13b, 1, 1) == pytest.approx(0.251 + 25.70694656e9 / (0.743 * 32e9))


def test_computron_constants_are_the_least_squares_fit(opt13b):
    from scipy.optimize import least_squares

    def res(x):
        return list(_rel_errors(SwapModel(32e9, min(x[0], 1.0), overhead_s=max(x[1], 0.0)), opt13b).values())

    fit = least_squares(res, [0.6, 0.1])
    assert fit.x[0] == pytest.approx(COMPUTRON_A100_PCIE4.efficiency, abs=2e-3)
    assert fit.x[1] == pytest.approx(COMPUTRON_A100_PCIE4.overhead_s, abs=2e-3)


def _fit(spec, keys):
    from scipy.optimize import least_squares

    def res(x):
        sm = SwapModel(32e9, min(x[0], 1.0), overhead_s=max(x[1], 0.0))
        return [(sm.load_time_s(spec, *k) - COMPUTRON_OPT13B_LOAD_TIME_S[k]) / COMPUTRON_OPT13B_LOAD_TIME_S[k] for k in keys]

    x = least_squares(res, [0.6, 0.1]).x
    return SwapModel(32e9, min(x[0], 1.0), overhead_s=max(x[1], 0.0))


def test_computron_held_out_points(opt13b):
    """Fitted on the five multi-GPU points, the model predicts the held-out single-GPU load (1.350 s) within 4 %;
    leaving out each point in turn, the held-out errors are -3.7, +10.9, -30.3, -8.0, -20.9 and +50.6 % (RMS
    26 %): the (2,2) and (4,1) points contradict each other (docs/serving.md)."""
    keys = list(COMPUTRON_OPT13B_LOAD_TIME_S)
    sm = _fit(opt13b, [k for k in keys if k != (1, 1)])
    assert sm.load_time_s(opt13b, 1, 1) == pytest.approx(COMPUTRON_OPT13B_LOAD_TIME_S[(1, 1)], rel=0.04)
    held = []
    for k in keys:
        t = _fit(opt13b, [q for q in keys if q != k]).load_time_s(opt13b, *k)
        held.append((t - COMPUTRON_OPT13B_LOAD_TIME_S[k]) / COMPUTRON_OPT13B_LOAD_TIME_S[k])
    assert math.sqrt(np.mean(np.square(held))) <= 0.27 and max(map(abs, held)) <= 0.52


def test_more_parallelism_never_slower_in_the_model(opt13b):
    sm = COMPUTRON_A100_PCIE4
    t = {k: sm.load_time_s(opt13b, *k) for k in COMPUTRON_OPT13B_LOAD_TIME_S}
    assert t[(1, 1)] > t[(2, 1)] > t[(4, 1)]
    assert t[(1, 1)] > t[(1, 2)] > t[(1, 4)]
