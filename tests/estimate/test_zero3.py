"""ZeRO-3 / FSDP communication: per-micro-batch gathers and reduce-scatter, overlapped pass by pass."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from hetplan.estimate.estimator import estimate
from hetplan.estimate.stage import zero3_exposed_s
from hetplan.calibration.validation import gpt_model, megatron_plan


def test_zero3_exposed_worked_cases():
    # G = 1, R = 2, F = 2, B = 4, L = 4: both passes hide their collectives; the first layer's gather (0.25) and
    # the last layer's reduce-scatter (0.5) remain, per micro-batch.
    assert zero3_exposed_s(1.0, 2.0, 2.0, 4.0, 4, 2) == 2 * (0.25 + 0.5)
    # B = 2: each unit's backward (0.5) hides only 0.5 of the next gather + this reduce-scatter (0.75): 3 x 0.25
    # exposed (overlap is bounded by each unit's compute, not by the pass's total).
    assert zero3_exposed_s(1.0, 2.0, 2.0, 2.0, 4, 2) == 2 * (0.25 + 3 * 0.25 + 0.5)
    # without resharding after forward the backward gathers nothing: only the reduce-scatters remain
    assert zero3_exposed_s(1.0, 2.0, 2.0, 0.4, 4, 2, reshard_after_forward=False) == pytest.approx(
        2 * (0.25 + 0.5 + 3 * (0.5 - 0.1)))
    # one layer: nothing to overlap with
    assert zero3_exposed_s(1.0, 2.0, 5.0, 9.0, 1, 3) == 3 * (1.0 + 2.0)
    # without overlap the reduce-scatter is entirely exposed
    assert zero3_exposed_s(1.0, 2.0, 2.0, 4.0, 4, 2, overlap=False) == 2 * (0.25 + 2.0)


@settings(max_examples=80, deadline=None)
@given(g=st.floats(0, 5), r=st.floats(0, 5), f=st.floats(0.01, 5), b=st.floats(0.01, 10), layers=st.integers(1, 96),
       m=st.integers(1, 16), dg=st.floats(0, 2), dc=st.floats(0, 2))
def test_zero3_exposed_properties(g, r, f, b, layers, m, dg, dc):
    e = float(zero3_exposed_s(g, r, f, b, layers, m))
    assert e >= m * (g + r) / layers - 1e-9  # the first gather and the last reduce-scatter are never hidden
    assert e <= m * (2 * g + r) + 1e-9
    assert float(zero3_exposed_s(g + dg, r + dc, f, b, layers, m)) >= e - 1e-9  # more communication never helps
    assert float(zero3_exposed_s(g, r, f + dg, b + dc, layers, m)) <= e + 1e-9  # more compute hides more
    assert float(zero3_exposed_s(g, r, f, b, layers, m, overlap=False)) >= e - 1e-9
    assert float(zero3_exposed_s(g, r, f, b, layers, m, reshard_after_forward=False)) <= e + 1e-9


def _zero3_plan(gbs, dp=32):
    m = gpt_model(24, 4096, 32, 2048)
    plan = megatron_plan(m, gpu="A100-SXM-80GB", tp=8, pp=1, dp=dp, mbs=1, gbs=gbs, recompute="full", seq=2048,
                         inter_node_bandwidth_bytes_per_s=100e9, dtype="bf16", overlap_grad_reduce=True)
    return m, plan.model_copy(update={"zero": 3})


def test_zero3_reduce_scatters_every_micro_batch():
    """Sharded gradients cannot be accumulated locally: 4 micro-batches pay 4 reduce-scatters and 8 gathers,
    so the ZeRO-3 communication per iteration grows linearly with the micro-batches (ZeRO-1 does not)."""
    m, one = _zero3_plan(gbs=32)
    _, four = _zero3_plan(gbs=128)
    e1, e4 = estimate(one, model=m), estimate(four, model=m)
    assert e4.dp_exposed_time_s == pytest.approx(4 * e1.dp_exposed_time_s, rel=1e-9)
    z1 = estimate(four.model_copy(update={"zero": 1}), model=m)
    assert z1.dp_exposed_time_s < e4.dp_exposed_time_s
    assert np.isfinite(e4.iteration_time_s) and e4.iteration_time_s > 4 * 0.9 * e1.iteration_time_s


def test_zero3_at_fixed_global_batch_stops_scaling():
    """Issue 13: GPT-3 175B with ZeRO-3 on 384 -> 768 -> 1,536 A100 (TP 8, micro-batch 4 -> 2 -> 1) at a fixed
    global batch: the same gathers per micro-batch over half the compute each time; throughput per GPU falls
    several-fold (it was predicted flat before the per-micro-batch, per-unit model)."""
    from hetplan.plan import GPUPool, Job, Plan, Stage

    tflops = []
    for n, mbs in ((384, 4), (768, 2), (1536, 1)):
        plan = Plan(job=Job(model="gpt3-175b", seq_len=2048, global_batch=1536),
                    pools=[GPUPool(gpu="A100-SXM-80GB", count=n)],
                    stages=[Stage(num_layers=96, tp=8, dp=n // 8, recompute="full")], mbs=mbs, zero=3,
                    sequence_parallel=True)
        tflops.append(estimate(plan, pipeline_model="closed_form").mfu * 312)
    assert tflops[0] / tflops[2] > 3


def test_fsdp_framework_shards_in_fp32_and_hsdp_replicates():
    from stage_kwargs import memory_of

    m = gpt_model(24, 4096, 32, 2048)
    kw = dict(num_layers=24, has_embedding=False, has_head=False, single_stage=True, b=1, s=2048, t=1, dp=64,
              zero=3, recompute="full", sequence_parallel=False, in_flight=1, attention="flash")
    f = memory_of(m, framework="fsdp", **kw)  # no pipeline (a pipeline stage: test_memory.py)
    from hetplan.model import counts
    P, Lp = 24 * counts.layer_parameters(m), counts.layer_parameters(m)
    assert float(f.weights) == pytest.approx(4 * P / 64 + 2 * 2 * Lp)  # fp32 shard + two unsharded bf16 units
    assert float(f.optimizer) == pytest.approx(8 * P / 64)
    h = memory_of(m, framework="fsdp", fsdp_shard=8, **kw)  # HSDP: shard over 8, replicate x 8
    assert float(h.optimizer) == pytest.approx(8 * P / 8)
    keep = memory_of(m, framework="fsdp", reshard_after_forward=False, **kw)
    assert float(keep.weights) == pytest.approx(4 * P / 64 + 24 * 2 * Lp)
    # ZeRO-1/2: torchtitan's fsdp_reshard_after_forward "never", whatever reshard_after_forward says
    z2 = memory_of(m, framework="fsdp", **(kw | {"zero": 2}))
    assert float(z2.weights) == pytest.approx(float(keep.weights))
    # ZeRO-0: torchtitan's DDP (replicate degree dp, shard degree 1): every rank holds the whole fp32 states
    ddp = memory_of(m, framework="fsdp", **(kw | {"zero": 0}))
    assert float(ddp.weights) == pytest.approx(4 * P + 2 * 2 * Lp)
    assert float(ddp.optimizer) == pytest.approx(8 * P)


def test_pipelined_fsdp_gathers_and_reduce_scatters_once_per_step():
    """FSDP in a pipeline (torch.distributed.pipelining's backward_maybe_with_nosync): each unit is gathered for
    the first micro-batch and kept; the accumulated gradients are reduce-scattered once after the last backward.
    So the FSDP traffic per iteration does not grow with the micro-batches (it does without a pipeline), and the
    exposed part is the first micro-batch's gathers plus the whole reduce-scatter, not hidden behind any backward."""
    from hetplan.plan import GPUPool, Job, Plan, Stage

    def plan(gbs, pp):
        return Plan(job=Job(model="llama2-7b", seq_len=4096, global_batch=gbs, framework="fsdp"),
                    pools=[GPUPool(gpu="H100-SXM", count=32 * pp)],
                    stages=[Stage(num_layers=32 // pp, tp=1, dp=32, recompute="full") for _ in range(pp)],
                    mbs=1, zero=3)

    def exposed(p):
        return estimate(p, pipeline_model="closed_form").dp_exposed_time_s

    assert exposed(plan(32 * 16, 2)) == pytest.approx(exposed(plan(32 * 4, 2)), rel=1e-9)
    assert exposed(plan(32 * 16, 1)) == pytest.approx(4 * exposed(plan(32 * 4, 1)), rel=1e-9)  # no pipeline


def test_fsdp2_copies_worked_example():
    """FSDP2's copy-out (read + write of each gathered element) and reduce-scatter copy-in (read the bf16
    gradient, write it in the reduce dtype), at the GPU's HBM bandwidth."""
    from types import SimpleNamespace

    from hetplan.estimate.stage import fsdp2_copy_s

    gpu = SimpleNamespace(hbm_bandwidth_bytes_per_s=2e12)
    f, b = fsdp2_copy_s(1e9, gpu, 2, 4)  # 1e9 parameters, bf16 all-gather, fp32 reduce-scatter
    assert float(f) == pytest.approx(2 * 2 * 1e9 / 2e12)  # 2 ms
    assert float(b) == pytest.approx((2 * 2 + 2 + 4) * 1e9 / 2e12)  # gather again + copy-in: 5 ms
    _, keep = fsdp2_copy_s(1e9, gpu, 1, 2, reshard_after_forward=False)  # float8 gather, bf16 reduce
    assert float(keep) == pytest.approx((2 + 2) * 1e9 / 2e12)


def test_fsdp1_passes_worked_example():
    """FSDP1's passes per micro-batch: the cast of the fp32 shard to the bf16 one before each all-gather
    ((4 + 2) / shard per element), and in backward the cat of the views' gradients (2 + 2), the cast to an fp32
    reduce dtype (2 + 4) and the pre-division (4 + 4), at the GPU's HBM bandwidth."""
    from types import SimpleNamespace

    from hetplan.estimate.stage import fsdp1_passes_s

    gpu = SimpleNamespace(hbm_bandwidth_bytes_per_s=2e12)
    f, b = fsdp1_passes_s(1e9, gpu, 2, 4, 8)  # 1e9 parameters, bf16 gather, fp32 reduce, 8 shards
    assert float(f) == pytest.approx(6 / 8 * 1e9 / 2e12)  # 0.375 ms
    assert float(b) == pytest.approx(float(f) + (4 + 6 + 8) * 1e9 / 2e12)  # re-gather cast + 9 ms
    _, bf16 = fsdp1_passes_s(1e9, gpu, 2, 2, 8, reshard_after_forward=False)  # bf16 reduce: no cast, 2 B divide
    assert float(bf16) == pytest.approx((4 + 4) * 1e9 / 2e12)
    _, alone = fsdp1_passes_s(1e9, gpu, 2, 2, 1, reshard_after_forward=False, sharded_bytes=2)  # nothing to divide
    assert float(alone) == pytest.approx(4 * 1e9 / 2e12)


def test_fsdp2_and_fsdp1_stacks_pay_their_own_passes():
    """The same FSDP plan under torchtitan (FSDP2: copy-out and copy-in) and fms-fsdp (FSDP1: shard cast, gradient
    cat, cast and pre-division; bf16 reduce-scatter here): per micro-batch, the forward and backward differ by the
    two stacks' passes and nothing else; in a pipeline they run once per step, exposed."""
    from hetplan.estimate.stage import fsdp1_passes_s, fsdp2_copy_s
    from hetplan.estimate.variability import slowest_gpu_factor
    from hetplan.hardware.catalog import load_catalog
    from hetplan.plan import GPUPool, Job, Plan, Stage

    def plan(stack, pp=1, gbs=64):
        return Plan(job=Job(model="llama2-7b", seq_len=4096, global_batch=gbs, framework="fsdp", stack=stack,
                            attention_kernel="fa2"),
                    pools=[GPUPool(gpu="H100-SXM", count=32 * pp)],
                    stages=[Stage(num_layers=32 // pp, tp=1, dp=32, recompute="full") for _ in range(pp)],
                    mbs=1, zero=3, grad_reduce_dtype="fp32")

    # torchtitan@2025-10: separate wq / wk / wv and w1 / w3 like fms-fsdp's 2024 model (StackSpec.projections;
    # 0.3.0 fuses QKV)
    two, one = estimate(plan("torchtitan@2025-10")), estimate(plan("fms-fsdp"))
    s2, s1 = two.stages[0], one.stages[0]
    from hetplan.estimate import memory
    from hetplan.model.spec import load_model

    params = memory.stage_parameters(load_model("llama2-7b"), 32, True, True, True)  # TP 1: all of them
    h100 = load_catalog().get("H100-SXM")
    f2, b2 = fsdp2_copy_s(params, h100, 2, 4)
    f1, b1 = fsdp1_passes_s(params, h100, 2, 4, 32)
    slowest = float(slowest_gpu_factor(32, h100.speed_variability))  # the stage's 32 GPUs (estimate.variability)
    assert s2.forward_s - s1.forward_s == pytest.approx(float(f2 - f1) * slowest, rel=1e-6)
    assert s2.backward_s - s1.backward_s == pytest.approx(float(b2 - b1) * slowest, rel=1e-6)
    assert float(b1) > float(b2)  # FSDP1's cat and pre-division move more than FSDP2's copy-in
    p2, p1 = estimate(plan("torchtitan@2025-10", pp=2)), estimate(plan("fms-fsdp", pp=2))
    assert p2.stages[0].forward_s == pytest.approx(p1.stages[0].forward_s, rel=1e-12)  # not per micro-batch
    assert p1.dp_exposed_time_s > p2.dp_exposed_time_s  # the larger FSDP1 passes, exposed once per step


def test_unfused_adamw_stack_pays_its_passes():
    """llm-foundry's Composer DecoupledAdamW and fms-fsdp's foreach torch AdamW (no fused Adam in either stack) move
    80 B per owned parameter where a fused AdamW moves 30: the same FSDP1 plan's optimizer step under llm-foundry
    or fms-fsdp and under HF Accelerate (``adamw_torch_fused``) is 80 / 30."""
    from hetplan.estimate.compute import ADAM_BYTES_PER_PARAMETER, UNFUSED_ADAMW_BYTES_PER_PARAMETER
    from hetplan.plan import GPUPool, Job, Plan, Stage

    def step(stack):
        p = Plan(job=Job(model="llama2-7b", seq_len=2048, global_batch=64, framework="fsdp", stack=stack,
                         attention_kernel="fa2"),
                 pools=[GPUPool(gpu="H100-SXM", count=32)], stages=[Stage(num_layers=32, tp=1, dp=32)],
                 mbs=2, zero=3)
        return estimate(p).optimizer_time_s

    assert step("llm-foundry") / step("hf-accelerate") == pytest.approx(
        UNFUSED_ADAMW_BYTES_PER_PARAMETER / ADAM_BYTES_PER_PARAMETER, rel=1e-9)
    assert step("fms-fsdp") == pytest.approx(step("llm-foundry"), rel=1e-12)


def test_fsdp1_gathers_fp8_runs_in_bf16():
    """torchao's float8 all-gather is an FSDP2 extension: under an FSDP1 stack (llm-foundry's Transformer Engine
    FP8 rows) the unsharded units and the all-gathers stay bf16, so the FP8 plan holds the same gathered weights
    as the bf16 one; under torchtitan's tensorwise releases (FSDP2, float8 all-gather) FP8 halves the gathered
    linear weights, while torchtitan 0.3.0's rowwise recipe gathers bf16 (hetplan.estimate.fp8)."""
    from hetplan.estimate.fp8 import gathered_weight_bytes
    from hetplan.plan import GPUPool, Job, Plan, Stage

    assert gathered_weight_bytes("fp8", "fsdp") == 1 and gathered_weight_bytes("fp8", "fsdp", fsdp1=True) == 2

    def weights(stack, dtype):
        p = Plan(job=Job(model="llama2-7b", seq_len=2048, global_batch=64, framework="fsdp", stack=stack,
                         attention_kernel="fa2", dtype=dtype, torch_compile=True),
                 pools=[GPUPool(gpu="H100-SXM", count=8)], stages=[Stage(num_layers=32, tp=1, dp=8)],
                 mbs=2, zero=3)
        return estimate(p).memory_bytes_per_gpu.weights

    assert weights("llm-foundry", "fp8") == pytest.approx(weights("llm-foundry", "bf16"), rel=1e-12)
    assert weights("torchtitan@2025-10", "fp8") < weights("torchtitan@2025-10", "bf16")
    assert weights("torchtitan@0.3.0", "fp8") == pytest.approx(weights("torchtitan@0.3.0", "bf16"), rel=1e-12)


def test_fsdp_root_unit_parameters():
    """FSDP's root unit holds what is outside the layers: Llama 3 8B's untied embedding and output (2·V·h) and the
    final norm (h) on a single stage; nothing on a middle pipeline stage; DeepSpeed ZeRO-3 keeps even units."""
    from hetplan.estimate import memory
    from hetplan.estimate.stage import fsdp_root_parameters
    from hetplan.model.spec import load_model

    m = load_model("llama3-8b")
    whole = memory.stage_parameters(m, m.num_layers, True, True, True)
    layers = m.num_layers * memory.layer_parameters_per_gpu(m, 1)
    root = float(fsdp_root_parameters(whole, layers, "fsdp"))
    assert root == pytest.approx(2 * m.vocab_size * m.hidden_size + m.hidden_size, rel=1e-9)
    assert root > 4 * float(memory.layer_parameters_per_gpu(m, 1))  # 1.05 B: 4.8 layers
    middle = memory.stage_parameters(m, 8, False, False, False)
    assert float(fsdp_root_parameters(middle, 8 * memory.layer_parameters_per_gpu(m, 1), "fsdp")) == 0.0
    assert float(fsdp_root_parameters(whole, layers, "deepspeed")) == 0.0


def test_fsdp_root_unit_is_exposed_every_micro_batch():
    """Growing the root unit (a larger vocabulary, same layers) adds its whole all-gather and reduce-scatter to the
    exposed time of each micro-batch: at least its bytes over the node's network at full speed, where units split
    evenly over the layers would expose about 1/L of it."""
    from hetplan.model.spec import load_model
    from hetplan.plan import GPUPool, Job, Plan, Stage

    base = load_model("llama3-8b")

    def exposed(vocab: int, microbatches: int) -> float:
        m = base.model_copy(update={"vocab_size": vocab, "name": f"llama3-8b-v{vocab}"})
        p = Plan(job=Job(model="llama3-8b", seq_len=8192, global_batch=128 * microbatches, framework="fsdp",
                         stack="torchtitan@2025-05"),
                 pools=[GPUPool(gpu="H100-SXM", count=128)], stages=[Stage(num_layers=32, tp=1, dp=128)],
                 mbs=1, zero=3, grad_reduce_dtype="fp32")
        return estimate(p, model=m).dp_exposed_time_s

    extra_params = 2 * (256_000 - 128_256) * base.hidden_size  # untied embedding and output
    node_bytes_per_s = 8 * 400e9 / 8  # a DGX H100's 8 x 400 Gb/s NICs (nodes.toml), at full speed
    # each node receives the other 15 nodes' shards of the bf16 gather and sends as much of the fp32 reduce-scatter
    floor = extra_params * (2 + 4) * (120 / 128) / node_bytes_per_s  # 14.7 ms; even units: about 1/32 of it
    for mb in (1, 2):
        assert exposed(256_000, mb) - exposed(128_256, mb) >= mb * floor


def test_attention_unpad_worked_example_and_switch():
    """llm-foundry's flash path (bert_padding around flash_attn_varlen_func): per layer and token, forward gathers
    Q, K, V (4 B per element) and pads the output (6 B), backward gathers the output gradient (4 B) and zero-fills
    and scatters Q, K, V's (6 B); only where the stack lists the kernel it runs (fa2 under llm-foundry, not its
    Triton kernel, not torchtitan)."""
    from types import SimpleNamespace

    from unittest.mock import patch

    from hetplan.estimate.stage import attention_unpad_s
    from hetplan.hardware.catalog import load_catalog
    from hetplan.hardware.stacks import resolve_stack
    from hetplan.model.spec import load_model
    from hetplan.plan import GPUPool, Job, Plan, Stage

    m = load_model("llama2-7b")  # multi-head: Q, K, V and the output each h = 4096 wide
    f, b = attention_unpad_s(m, SimpleNamespace(hbm_bandwidth_bytes_per_s=2e12), 2, 2048, 1)
    h, tokens = 4096, 2 * 2048
    assert float(f) == pytest.approx((4 * 3 * h + 6 * h) * tokens / 2e12)
    assert float(b) == pytest.approx((4 * h + 6 * 3 * h) * tokens / 2e12)

    def forward(kernel, unpad):
        p = Plan(job=Job(model="llama2-7b", seq_len=2048, global_batch=64, framework="fsdp", stack="llm-foundry",
                         attention_kernel=kernel),
                 pools=[GPUPool(gpu="H100-SXM", count=8)], stages=[Stage(num_layers=32, tp=1, dp=8)], mbs=2, zero=3)
        spec = resolve_stack("llm-foundry").model_copy(update={"attention_unpad": unpad})
        with patch("hetplan.estimate.options._stack", lambda *_: spec):
            return estimate(p).stages[0].forward_s

    unpad_f, _ = attention_unpad_s(m, load_catalog().get("H100-SXM"), 2, 2048, 1)
    assert forward("fa2", ("fa2",)) - forward("fa2", ()) == pytest.approx(32 * float(unpad_f), rel=1e-9)
    assert forward("triton", ("fa2",)) == pytest.approx(forward("triton", ()), rel=1e-12)  # its kernel is padded
    assert resolve_stack("llm-foundry").attention_unpad == ("fa2",) and not resolve_stack("torchtitan").attention_unpad


def test_torchtitan_own_embedding_and_output_units():
    """Since pytorch/torchtitan#1094 (torchtitan@2025-10: fsdp_units = "embedding-output") the output layer and
    final norm are a unit of their own, gathered behind the last layer's forward and reduce-scattered behind its
    backward: of the earlier root unit only the embedding stays exposed. Per micro-batch the exposed time drops by
    at least (1 - rho) of the output unit's gather and reduce-scatter over the nodes' network at full speed."""
    from hetplan.plan import GPUPool, Job, Plan, Stage

    def exposed(release: str, microbatches: int) -> float:
        p = Plan(job=Job(model="llama3-8b", seq_len=8192, global_batch=128 * microbatches, framework="fsdp",
                         stack=release, torch_compile=True, attention_kernel="fa2"),
                 pools=[GPUPool(gpu="H100-SXM", count=128)], stages=[Stage(num_layers=32, tp=1, dp=128)],
                 mbs=1, zero=3, grad_reduce_dtype="fp32")
        return estimate(p).dp_exposed_time_s

    from hetplan.model.spec import load_model

    m = load_model("llama3-8b")
    output_params = m.vocab_size * m.hidden_size + m.hidden_size  # output layer and final norm
    floor = output_params * (2 + 4) * (120 / 128) / (8 * 400e9 / 8)  # bf16 gather + fp32 reduce-scatter
    rho = 24 / 132  # NCCL's CTAs next to compute on H100 (comm.overlap_contention)
    for mb in (1, 2):
        drop = exposed("torchtitan@2025-05", mb) - exposed("torchtitan@2025-10", mb)
        assert drop >= mb * (1 - rho) * floor
        assert exposed("torchtitan@2025-10", mb) > 0
