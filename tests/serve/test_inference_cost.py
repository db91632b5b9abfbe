"""One cost model: serving's prefill, decode, swap and KV bytes come from the training estimator's functions.

The consistency test builds the *training* plan of the same shape (model, GPU, TP x PP, micro-batch b, sequence s)
and checks that serving reads the same numbers off it: weight bytes per GPU (what a swap moves) and the forward
pass of a micro-batch (what a prefill costs, but for the head, which a server applies to the last position only).
"""

import pytest

from hetplan.errors import HetplanError
from hetplan.estimate.compute import gemm_time_s, head_time_s
from hetplan.estimate.estimator import estimate_detailed
from hetplan.estimate.inference import (decode_step_time_s, kv_cache_bytes_per_worker, prefill_time_s, step_time_s,
                                        weight_bytes_per_worker)
from hetplan.hardware.catalog import get_gpu
from hetplan.model.spec import load_model
from hetplan.plan import GPUPool, Job, Plan, Stage

GPU = "A100-SXM-80GB"


def _training(m, tp, pp, b, s):
    # serving costs prefill with the standard attention kernels (inference_cost); train with the same
    plan = Plan(job=Job(model=m.name, seq_len=s, global_batch=b, attention="standard"),
                pools=[GPUPool(gpu=GPU, count=tp * pp)],
                stages=[Stage(num_layers=m.num_layers // pp, tp=tp, dp=1, recompute="none") for _ in range(pp)],
                mbs=b, zero=0)
    return estimate_detailed(plan, model=m)[2]


@pytest.mark.parametrize("tp,pp", [(1, 1), (2, 1), (1, 2), (2, 2)])
def test_serving_and_training_agree_on_the_same_shape(tp, pp):
    m, gpu = load_model("llama2-7b"), get_gpu(GPU)
    b, s = 2, 512
    costs = _training(m, tp, pp, b, s)
    # swap bytes per worker = the training memory model's weight bytes per GPU of that stage (fp16)
    want = [float(c.memory.weights) for c in costs for _ in range(tp)]
    assert weight_bytes_per_worker(m, tp, pp, "fp16") == pytest.approx(want, rel=1e-12)
    if pp == 1:
        # prefill of b prompts of s tokens = training forward of that micro-batch, with the head on the last
        # position only instead of all s positions plus the loss
        fwd = float(costs[0].forward_s)
        head_all = float(head_time_s(m, gpu, "fp16", b, s, tp)[0])
        head_last = float(gemm_time_s(gpu, "fp16", b, m.padded_vocab_size() / tp, m.hidden_size))
        assert prefill_time_s(m, gpu, "fp16", s, batch=b, tp=tp) == pytest.approx(fwd - head_all + head_last, rel=1e-9)


def test_decode_is_memory_bound_and_flat_in_context():
    m, gpu = load_model("llama2-7b"), get_gpu(GPU)
    t128 = decode_step_time_s(m, gpu, "fp16", 1, 128)
    t2048 = decode_step_time_s(m, gpu, "fp16", 1, 2048)
    assert t128 >= 6_738_415_616 * 2 / gpu.hbm_bandwidth_bytes_per_s  # every fp16 weight read once per token
    assert t2048 / t128 < 1.05  # the KV read of 2,048 tokens (1 GiB) is small next to the weights
    # 64 sequences x 2,048 tokens = 64 GiB of KV: decode becomes bound by the KV reads
    assert decode_step_time_s(m, gpu, "fp16", 64, 64 * 2048) > 2 * decode_step_time_s(m, gpu, "fp16", 64, 64 * 16)
    # prefill is compute-bound: 4x the tokens cost more than 3x the time
    assert prefill_time_s(m, gpu, "fp16", 2048) > 3 * prefill_time_s(m, gpu, "fp16", 512)
    # one iteration: the joining prompts in one padded prefill pass, then one decode step over the running ones
    assert step_time_s(m, gpu, "fp16", [512, 300], [100, 200]) == pytest.approx(
        prefill_time_s(m, gpu, "fp16", 512, batch=2) + decode_step_time_s(m, gpu, "fp16", 2, 300))


def test_kv_cache_bytes_worked_example():
    m = load_model("llama2-7b")  # 32 layers, 32 kv heads x 128 = 4,096 kv_dim
    # 2 (K, V) x 32 layers x 2,048 tokens x 4,096 x 2 bytes = 1 GiB; TP 2 x PP 2: a quarter per worker
    assert kv_cache_bytes_per_worker(m, 2048, 1, 1) == [2**30]
    assert kv_cache_bytes_per_worker(m, 2048, 2, 2) == [2**28] * 4
    with pytest.raises(HetplanError) as e:
        weight_bytes_per_worker(m, 3, 1)
    assert e.value.field == "tp"
    with pytest.raises(HetplanError) as e:
        kv_cache_bytes_per_worker(m, 10, 1, 64)
    assert e.value.field == "pp"
