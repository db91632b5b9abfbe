"""Memory per GPU: worked cases against Megatron-LM's theoretical memory and Korthikanti et al.'s formulas
(exact), and properties."""

import pytest
from hypothesis import given, settings, strategies as st

from hetplan.estimate import memory
from hetplan.estimate.estimator import estimate_detailed, in_flight_microbatches
from hetplan.model.spec import ModelSpec
from hetplan.plan import GPUPool, Job, Plan, Stage
from stage_kwargs import memory_of


def _gpt(L=32, h=4096, a=32, V=51200, bias=False, dropout=True):
    return ModelSpec(name="w", family="megatron_gpt", num_layers=L, hidden_size=h, num_attention_heads=a,
                     num_kv_heads=a, head_dim=h // a, ffn_hidden_size=4 * h, vocab_size=V, max_seq_len=2048,
                     gated_mlp=False, norm="layernorm", linear_bias=bias, learned_positions=0, tied_embeddings=True,
                     dropout=dropout)


def megatron_weight_optimizer_bytes(L, h, V, t, p, dp, distributed_optimizer):
    """Megatron-LM ``theoretical_memory_usage.compute_weight_and_optimizer_memory`` (GPT, MHA, tied, f = 4h),
    transcribed as a formula: most loaded shard = (P_layers / p + h·V) / t; 18 B/param, or 6 + 12/dp with the
    distributed optimizer."""
    p_layers = 2 * L * h * h * (2 + 4 + 2 / h + 1 / (L * h))
    shard = (p_layers / p + h * V) / t
    return shard * (6 + 12 / dp if distributed_optimizer else 18)


def megatron_activation_bytes(L, h, V, s, b, t, p, v=None, m=None):
    """Megatron-LM ``compute_activation_memory`` (first stage, SP + selective recompute, f = 4h)."""
    act = s * b * h * (18 + 4 * 4) * L
    act += 8 * s * b * p + s * b * h * p
    if v is not None:
        act *= 1 + (p - 1) / (p * v)
    elif p > 1 and m is not None:
        act *= min(1, m / p)
    if p == 1:
        act += s * b * h * 4 * (1 + V / h)
    return act / t


def _plan(m, *, tp, pp, dp, mbs, gbs, zero, recompute="selective"):
    L = m.num_layers
    return Plan(job=Job(model="w", seq_len=2048, global_batch=gbs, attention="standard"),
                pools=[GPUPool(gpu="A100-SXM-80GB", count=tp * pp * dp)],
                stages=[Stage(num_layers=L // pp, tp=tp, dp=dp, recompute=recompute) for _ in range(pp)],
                mbs=mbs, zero=zero, sequence_parallel=True)


@pytest.mark.parametrize("tp,dp,zero", [(1, 1, 0), (2, 4, 0), (8, 2, 1), (4, 16, 1)])
def test_weights_and_optimizer_match_megatron_single_stage(tp, dp, zero):
    m = _gpt()
    est, _, costs, _ = estimate_detailed(_plan(m, tp=tp, pp=1, dp=dp, mbs=1, gbs=8 * dp, zero=zero), model=m)
    mem = costs[0].memory
    ours = float(mem.weights + mem.gradients + mem.optimizer)
    assert ours == pytest.approx(megatron_weight_optimizer_bytes(32, 4096, 51200, tp, 1, dp, zero == 1), rel=1e-12)


def test_weights_first_stage_close_to_megatron_with_pipeline():
    # Megatron spreads the final LayerNorm (2h) over all stages; we keep it on the last: 2h(1-1/p)/t params apart.
    m = _gpt()
    _, _, costs, _ = estimate_detailed(_plan(m, tp=2, pp=4, dp=2, mbs=1, gbs=16, zero=0), model=m)
    mem = costs[0].memory
    ours = float(mem.weights + mem.gradients + mem.optimizer)
    ref = megatron_weight_optimizer_bytes(32, 4096, 51200, 2, 4, 2, False)
    assert abs(ours - ref) <= 18 * 2 * 4096 / 4 / 2 + 1e-6


@pytest.mark.parametrize("tp,pp,v,mbs,m_", [(1, 1, None, 1, 4), (8, 1, None, 2, 4), (4, 4, None, 1, 8), (2, 4, None, 1, 2),
                                          (8, 8, 3, 1, 64), (2, 4, 2, 2, 8)])
def test_activations_match_megatron(tp, pp, v, mbs, m_):
    m = _gpt()
    gbs = m_ * mbs
    est, _, costs, _ = estimate_detailed(_plan(m, tp=tp, pp=pp, dp=1, mbs=mbs, gbs=gbs, zero=0), model=m,
                                         virtual_stages=v)
    assert est.virtual_stages == (v or 1)
    ours = float(costs[0].memory.activations)
    ref = megatron_activation_bytes(32, 4096, 51200, 2048, mbs, tp, pp, v, m_)
    assert ours == pytest.approx(ref, rel=1e-12)


def test_interleaved_in_flight_is_megatron_penalty():
    for p, v in ((4, 2), (8, 3), (35, 3)):
        assert in_flight_microbatches("1f1b", p, 0, 10 * p, v) == pytest.approx(p * (1 + (p - 1) / (p * v)))


@pytest.mark.parametrize("t", [1, 2, 8])
def test_korthikanti_table2_per_layer(t):
    """Korthikanti et al. 2023 Table 2 (activations per layer, bytes): GPT with dropout."""
    m = _gpt(L=1, h=2048, a=16)
    s, b, h, a = 2048, 2, 2048, 16
    sbh = s * b * h
    cases = {
        (0, False): sbh * (10 + 24 / t + 5 * a * s / (h * t)),
        (0, True): sbh * (34 / t + 5 * a * s / (h * t)),
        (1, False): sbh * (10 + 24 / t),
        (1, True): sbh * 34 / t,
    }
    for (rc, sp), ref in cases.items():
        mem = memory_of(m, num_layers=1, has_embedding=False, has_head=False, single_stage=False, b=b, s=s,
                                 t=t, dp=1, zero=0, recompute=rc, sequence_parallel=sp, in_flight=1)
        assert float(mem.activations) == pytest.approx(ref, rel=1e-12)
    # full recompute: 2sbh per layer kept (Table 2 last row) + the working set of the layer being recomputed
    L, inflight = 8, 3
    mem = memory_of(m, num_layers=L, has_embedding=False, has_head=False, single_stage=False, b=b, s=s,
                             t=t, dp=1, zero=0, recompute="full", sequence_parallel=False, in_flight=inflight)
    assert float(mem.activations) == pytest.approx(inflight * L * 2 * sbh + cases[(0, False)], rel=1e-12)


def _total(m, **kw):
    base = dict(num_layers=8, has_embedding=True, has_head=False, single_stage=False, b=2, s=2048, t=1, dp=4, zero=0,
                recompute="none", sequence_parallel=False, in_flight=4)
    base.update(kw)
    return float(memory_of(m, **base).total)


@settings(max_examples=40, deadline=None)
@given(h=st.sampled_from([1024, 2048, 4096]), b=st.integers(1, 8), layers=st.integers(2, 24), inflight=st.integers(1, 8),
       rc=st.integers(0, 2), sp=st.booleans(), zero=st.integers(0, 3), dp=st.sampled_from([1, 2, 8]))
def test_more_tp_never_raises_memory(h, b, layers, inflight, rc, sp, zero, dp):
    m = _gpt(L=24, h=h, a=16)
    kw = dict(b=b, num_layers=layers, in_flight=inflight, recompute=rc, zero=zero, dp=dp)
    totals = [_total(m, t=t, sequence_parallel=sp and t > 1, **kw) for t in (1, 2, 4, 8)]
    assert all(x >= y - 1e-6 for x, y in zip(totals, totals[1:]))


@settings(max_examples=40, deadline=None)
@given(b=st.integers(1, 8), layers=st.integers(8, 24), inflight=st.integers(1, 8), dp=st.sampled_from([2, 4, 16]))
def test_more_zero_and_recompute_never_raise_memory(b, layers, inflight, dp):
    m = _gpt(L=24, h=2048, a=16)
    zs = [_total(m, b=b, num_layers=layers, in_flight=inflight, dp=dp, zero=z) for z in range(4)]
    assert all(x >= y for x, y in zip(zs, zs[1:]))
    none = _total(m, b=b, num_layers=layers, in_flight=inflight, recompute="none")
    assert none >= _total(m, b=b, num_layers=layers, in_flight=inflight, recompute="selective")
    assert none >= _total(m, b=b, num_layers=layers, in_flight=inflight, recompute="full")


def test_bf16_gradient_buffer_matches_megatron_distributed_optimizer_table():
    """Megatron-LM ``docs/source/api-guide/dist_optimizer.md``: bf16 params with fp32 grads 6 + 12/d bytes per
    parameter, 16-bit grads 4 + 16/d — the 4/d being the fp32 copy of the owned gradient shard, which exists only
    during the optimizer step (activations freed), so it raises the peak only when it exceeds the activations."""
    m = _gpt(L=4, h=1024, a=16, V=32000)
    kw = dict(num_layers=4, has_embedding=False, has_head=False, single_stage=False, b=1, s=1024, t=1, zero=1,
              recompute="none", sequence_parallel=False, in_flight=1)
    P = 4 * (12 * 1024 * 1024 + 13 * 1024)
    for dp in (1, 2, 8):
        f32 = memory_of(m, dp=dp, **kw)
        b16 = memory_of(m, dp=dp, grad_reduce_dtype="bf16", **kw)
        for mem, per in ((f32, 6 + 12 / dp), (b16, 4 + 12 / dp)):
            states = float(mem.weights + mem.gradients + mem.optimizer)
            assert states == pytest.approx(P * per, rel=1e-3)
        step = 4 * P / dp - float(b16.activations)  # the optimizer step's fp32 gradient shard, activations freed
        assert float(b16.transient) == pytest.approx(max(float(f32.transient), step), rel=1e-9)
    # DeepSpeed and FSDP keep their own gradient layouts: the Megatron buffer dtype does not apply
    ds = dict(kw, framework="deepspeed", dp=2)
    assert float(memory_of(m, grad_reduce_dtype="bf16", **ds).total) == float(
        memory_of(m, **ds).total)


def _fsdp_kw(**kw):
    base = dict(num_layers=8, has_embedding=False, has_head=False, single_stage=False, b=1, s=1024, t=1, dp=8,
                zero=3, recompute="full", sequence_parallel=False, in_flight=1, attention="flash", framework="fsdp")
    return {**base, **kw}


def test_fsdp_pipeline_stage_holds_every_unit_unsharded_with_its_accumulated_gradient():
    """torch.distributed.pipelining runs every backward but the last with ``set_reshard_after_backward(False)`` and
    ``set_requires_gradient_sync(False)`` (``stage.py``, ``backward_maybe_with_nosync``), and FSDP2 upcasts the
    unsharded gradient it accumulates to the reduce dtype (``FSDPParam.to_accumulated_grad_if_needed``): a stage
    of L units holds L unsharded bf16 units (2 B) and an fp32 unsharded gradient (4 B) per parameter, instead of
    2 units in flight and the sharded fp32 gradient; the first stage also its embedding (the root unit). Worked
    example: 8 layers of a 1024-wide GPT, FSDP over 8."""
    from hetplan.model import counts

    m = _gpt(L=8, h=1024, a=16, V=32000)
    Lp = counts.layer_parameters(m)
    P = 8 * Lp
    alone = memory_of(m, **_fsdp_kw(single_stage=True))
    assert float(alone.weights) == pytest.approx(4 * P / 8 + 2 * 2 * Lp)
    assert float(alone.gradients) == pytest.approx(4 * P / 8 + (2 + 4) * Lp)
    mid = memory_of(m, **_fsdp_kw())
    assert float(mid.weights) == pytest.approx(4 * P / 8 + 8 * 2 * Lp)
    assert float(mid.gradients) == pytest.approx(4 * P + (2 + 4) * Lp)
    assert float(mid.optimizer) == float(alone.optimizer) == pytest.approx(8 * P / 8)
    bf16 = memory_of(m, **_fsdp_kw(grad_reduce_dtype="bf16"))  # reduce dtype = grad dtype: no upcast
    assert float(bf16.gradients) == pytest.approx(2 * P + (2 + 4) * Lp)
    first = memory_of(m, **_fsdp_kw(has_embedding=True))
    E = counts.embedding_parameters(m)
    assert float(first.weights) == pytest.approx(4 * (P + E) / 8 + 8 * 2 * Lp + 2 * E)
    assert float(first.gradients) == pytest.approx(4 * (P + E) + (2 + 4) * Lp)


def test_fsdp_bf16_resident_parameters_hold_two_two_four_bytes():
    """NeMo AutoModel's default bf16 model storage with ``torch.optim.Adam``: sharded bf16 parameter, bf16
    gradient and two bf16 moments, 2 + 2 + 4 bytes per parameter over the shard group (torchtitan: 4 + 4 + 8)."""
    from hetplan.model import counts

    m = _gpt(L=8, h=1024, a=16, V=32000)
    P, Lp = 8 * counts.layer_parameters(m), counts.layer_parameters(m)
    f32 = memory_of(m, **_fsdp_kw(single_stage=True))
    b16 = memory_of(m, **_fsdp_kw(single_stage=True, fsdp_param_dtype="bf16"))
    assert float(f32.weights - b16.weights) == pytest.approx(2 * P / 8)
    assert float(f32.gradients - b16.gradients) == pytest.approx(2 * P / 8)
    assert float(f32.optimizer - b16.optimizer) == pytest.approx(4 * P / 8)
    assert float(b16.weights) == pytest.approx(2 * P / 8 + 2 * 2 * Lp)  # the gathered units stay bf16


@pytest.mark.parametrize("loss,t,per_logit,stack", [
    ("fp32", 1, 12 + 2, "torchtitan@2025-10"), ("fp32", 2, 16 + 2, "torchtitan@2025-10"),
    ("bf16", 2, 6, "torchtitan@2025-10"), ("compiled", 2, 4, "torchtitan@2025-10"),
    ("compiled", 1, 4 / 8, "torchtitan@0.3.0"), ("fp32", 1, (12 + 2) / 8, "torchtitan@0.3.0")])
def test_fsdp_cross_entropy_peak_per_logit(loss, t, per_logit, stack):
    """The last stage's loss phase holds ``k·s·b·V/t`` bytes plus the output layer's saved input ``2·s·b·h`` (the
    whole sequence on every TP rank): eager on fp32-cast logits 12 (saved fp32 log-softmax, its fp32 gradient, the
    fp32 input gradient), 16 vocab-parallel under TP (DTensor's ``(grad_input + exp(x)) * grad_output``), eager
    bf16 6, compiled 4 (bf16 input saved, bf16 gradient written); the eager fp32 losses of a single stage 2 more,
    the deleted 16-bit logits' block the allocator cannot reuse for the 4-byte gradients
    (:data:`hetplan.estimate.memory.LOGITS_HOLE_BYTES`). torchtitan 0.3.0's chunked loss (8 chunks) holds one
    chunk's logits and the whole sequence's float32 hidden-state gradient accumulator, ``4·s·b·h``. Where the
    loss phase is the peak, transient = loss − head − recomputed layer."""
    m = _gpt(L=2, h=1024, a=16, V=512000)  # the loss phase is the peak, also for one chunk of eight
    kw = _fsdp_kw(num_layers=2, has_head=True, single_stage=True, s=4096, t=t, stack=stack)
    mem = memory_of(m, cross_entropy=loss, **kw)
    logits = 4096 * m.padded_vocab_size() / t
    head = 4 * 4096 * (1024 + m.padded_vocab_size()) / t
    recomputed = float(mem.activations) - 2 * 2 * 4096 * 1024 - head  # full recompute: 2 layer inputs + head
    accumulator = 4 * 4096 * 1024 if stack == "torchtitan@0.3.0" else 0
    loss_phase = per_logit * logits + 2 * 4096 * 1024 + accumulator
    assert float(mem.transient) == pytest.approx(loss_phase - head - recomputed, rel=1e-9)


@settings(max_examples=40, deadline=None)
@given(b=st.integers(1, 4), layers=st.integers(2, 24), inflight=st.integers(1, 8), t=st.sampled_from([1, 2, 8]),
       single=st.booleans(), head=st.booleans(), rc=st.integers(0, 2), reduce=st.sampled_from([None, "bf16"]))
def test_fsdp_memory_properties(b, layers, inflight, t, single, head, rc, reduce):
    """FSDP (either a single stage or a stage of a pipeline): more DP ranks never raise the memory per GPU, bf16
    resident parameters never hold more than fp32 ones, and the compiled loss never more than the eager bf16 one,
    nor that more than the eager fp32 one."""
    m = _gpt(L=24, h=2048, a=16, V=64000)
    kw = dict(framework="fsdp", b=b, num_layers=layers, in_flight=inflight, t=t, sequence_parallel=t > 1,
              single_stage=single, has_head=head or single, has_embedding=single, recompute=rc, zero=3,
              grad_reduce_dtype=reduce)
    totals = [_total(m, dp=dp, **kw) for dp in (1, 2, 8, 64)]
    assert all(x >= y - 1e-6 for x, y in zip(totals, totals[1:]))
    assert _total(m, dp=8, fsdp_param_dtype="bf16", **kw) <= _total(m, dp=8, **kw)
    losses = [_total(m, dp=8, cross_entropy=c, **kw) for c in ("fp32", "bf16", "compiled")]
    assert all(x >= y - 1e-6 for x, y in zip(losses, losses[1:]))


def test_logits_hole_is_the_best_fit_allocator_on_the_eager_loss():
    """Brute force of :data:`hetplan.estimate.memory.LOGITS_HOLE_BYTES`: a best-fit allocator over one growing
    segment (the smallest free block that fits, split; freed neighbours merged; else the segment grows), run on
    the eager fp32 loss's tensors in units of bytes per logit — forward: logits 2, fp32 copy 4, log-softmax 4,
    then the copy and (``del pred``) the logits freed; backward: nll_loss's gradient 4, log-softmax's gradient 4 —
    reserves 14 where 12 are allocated at once."""
    free, top, live, peak = [], 0, {}, [0, 0]  # free blocks (start, size); segment end; name -> (start, size)

    def alloc(name, size):
        nonlocal top
        fits = sorted((sz, st) for st, sz in free if sz >= size)
        if fits:
            sz, st = fits[0]
            free.remove((st, sz))
            if sz > size:
                free.append((st + size, sz - size))
        else:
            st, top = top, top + size
        live[name] = (st, size)
        peak[0], peak[1] = max(peak[0], sum(s for _, s in live.values())), max(peak[1], top)

    def release(name):
        st, sz = live.pop(name)
        for fs, fz in list(free):  # merge with free neighbours
            if fs + fz == st or st + sz == fs:
                free.remove((fs, fz))
                st, sz = min(st, fs), sz + fz
        free.append((st, sz))

    for name, size in (("logits", 2), ("fp32", 4), ("log_softmax", 4)):
        alloc(name, size)
    release("fp32")
    release("logits")
    alloc("nll_grad", 4)
    alloc("log_softmax_grad", 4)
    assert peak == [12, 12 + memory.LOGITS_HOLE_BYTES]


def test_pytorch_pipeline_buffers_worked_example():
    """A PyTorch pipeline (``framework = "fsdp"``, torch.distributed.pipelining) holds one activation receive
    buffer per micro-batch on every stage but the first and one gradient receive buffer per micro-batch on every
    stage but the last (``2·s·b·h/t`` each with sequence parallelism; the in-flight micro-batches' activation
    buffers are their first layer's saved input, counted once), and the outputs kept for ``step()``'s return
    value: the last stage's 16-bit logits of every micro-batch (``output_chunks``), with ``pipeline_outputs =
    "all"`` (PyTorch before pytorch/pytorch#153383) every other stage's outputs too. Worked example: 4 stages, 8
    micro-batches, TP 2 with SP; a single stage holds none."""
    m = _gpt(L=8, h=1024, a=16, V=32000)
    s, b, t, mb = 2048, 2, 2, 8
    io = 2 * s * b * 1024 / t
    logits = 2 * s * b * m.padded_vocab_size() / t
    for first, last, in_flight, extra, older in ((True, False, 4, mb * io, mb * io),
                                                 (False, False, 3, (mb - 3 + mb) * io, mb * io),
                                                 (False, True, 1, (mb - 1) * io + mb * logits, 0.0)):
        kw = _fsdp_kw(has_embedding=first, has_head=last, in_flight=in_flight, s=s, b=b, t=t, sequence_parallel=True)
        base = memory_of(m, **kw).activations
        with_buffers = memory_of(m, num_microbatches=mb, **kw).activations
        assert float(with_buffers - base) == pytest.approx(extra)
        every = memory_of(m, num_microbatches=mb, pipeline_outputs="all", **kw).activations
        assert float(every - with_buffers) == pytest.approx(older)
    alone = _fsdp_kw(has_embedding=True, has_head=True, single_stage=True)
    assert float(memory_of(m, num_microbatches=mb, **alone).total) == float(
        memory_of(m, **alone).total)


@pytest.mark.parametrize("t", [1, 2, 8])
def test_pytorch_tp_saves_the_all_gathered_inputs(t):
    """A layer without checkpointing under PyTorch TP with sequence parallelism (``framework = "fsdp"``) saves the
    all-gathered inputs of attention and MLP whole, ``2 x 2·s·b·h`` per TP rank, where Megatron saves their
    ``1/t`` shards (Korthikanti et al.'s ``34·s·b·h/t``): ``4·s·b·h·(1 − 1/t)`` more per layer, none at t = 1 or
    without SP."""
    m = _gpt(L=8, h=1024, a=16, V=32000)
    s, b, layers = 2048, 1, 8
    kw = dict(num_layers=layers, has_embedding=False, has_head=False, single_stage=False, b=b, s=s, t=t, dp=8, zero=3,
              recompute="none", in_flight=1, attention="flash")
    fsdp = memory_of(m, framework="fsdp", sequence_parallel=True, **kw).activations
    megatron = memory_of(m, framework="megatron", sequence_parallel=True, **kw).activations
    assert float(fsdp - megatron) == pytest.approx(layers * 4 * s * b * 1024 * (1 - 1 / t))
    no_sp = [memory_of(m, framework=f, sequence_parallel=False, **kw).activations
             for f in ("fsdp", "megatron")]
    assert float(no_sp[0]) == float(no_sp[1])


def test_pipeline_step_microbatches_size_the_buffers_and_flush_per_call():
    """``Plan.pipeline_step_microbatches`` (NeMo AutoModel: several schedule calls per iteration): an FSDP pipeline
    whose 32 micro-batches run as 8 calls of 4 allocates the receive buffers of 4 and holds at most 4 micro-batches
    in flight, so its memory is lower, never higher, on every stage; and it flushes the pipeline and reduces the
    gradients in every call: 8 times the pipeline and exposed DP time of one 4-micro-batch call, one optimizer step."""
    from hetplan.estimate.estimator import estimate

    m = _gpt(L=8, h=1024, a=16, V=32000)
    base = _plan(m, tp=1, pp=4, dp=2, mbs=1, gbs=64, zero=3, recompute="full")
    base = base.model_copy(update={"job": base.job.model_copy(update={"framework": "fsdp", "attention": "flash"})})
    whole, split = (estimate(base.model_copy(update={"pipeline_step_microbatches": k}), model=m) for k in (None, 4))
    one_call = estimate(base.model_copy(update={"job": base.job.model_copy(update={"global_batch": 8})}), model=m)
    assert split.pipeline_time_s == pytest.approx(8 * one_call.pipeline_time_s, rel=1e-12)
    assert split.dp_exposed_time_s == pytest.approx(8 * one_call.dp_exposed_time_s, rel=1e-12)
    assert split.iteration_time_s == pytest.approx(
        8 * (one_call.pipeline_time_s + one_call.dp_exposed_time_s) + one_call.optimizer_time_s, rel=1e-12)
    assert split.iteration_time_s > whole.iteration_time_s  # 8 bubbles and 8 reductions instead of one
    io = 2 * 2048 * 1 * 1024  # one stage output, bytes
    for i, (a, b) in enumerate(zip(whole.stages, split.stages)):
        assert b.memory.total < a.memory.total
        if i == 0:  # first stage: 32 -> 4 gradient buffers, 4 in flight either way
            assert a.memory.activations - b.memory.activations == pytest.approx(28 * io)


def test_allgather_cp_holds_every_ranks_kv_in_the_layer_backward():
    """All-gather CP (PyTorch's ``context_parallel`` ``_AllGatherRotater``, Llama 3): the layer being
    back-propagated holds the K/V of all ``cp`` ranks, ``cp x 2·(s/cp)·b·(g·d + g·d)/t`` grouped (Megatron) or
    widened to the query heads ``cp x 2·(s/cp)·b·(a·d + a·d)/t`` where torchtitan's ``repeat_kv`` feeds SDPA
    (``framework = "fsdp"``); ring CP holds one block (not counted). Worked example: a = 16, g = 4, d = 64."""
    m = _gpt(L=4, h=1024, a=16, V=32000, dropout=False).model_copy(update={"num_kv_heads": 4})
    s, b, t, cp = 8192, 1, 2, 4
    assert float(memory.sdpa_kv_bytes(m, b, s / cp, t)) == 2 * (s / cp) * (2 * 4 * 64) / t
    assert float(memory.sdpa_kv_bytes(m, b, s / cp, t, expanded=True)) == 2 * (s / cp) * (2 * 16 * 64) / t
    for framework, expanded in (("megatron", False), ("fsdp", True)):
        kw = _fsdp_kw(num_layers=4, s=s, t=t, cp=cp, sequence_parallel=True, framework=framework, zero=1)
        ring, gathered = (memory_of(m, cp_kv_exchange=x, **kw) for x in ("ring", "allgather"))
        extra = cp * float(memory.sdpa_kv_bytes(m, b, s / cp, t, expanded=expanded))
        assert float(gathered.transient - ring.transient) == pytest.approx(extra)
        assert float(gathered.total - ring.total) == pytest.approx(extra * (1 + memory.ALLOCATOR_MARGIN))
    one = _fsdp_kw(num_layers=4, s=s, t=t, cp=1, sequence_parallel=True)
    assert float(memory_of(m, cp_kv_exchange="allgather", **one).total) == float(
        memory_of(m, **one).total)


# ---- Does it fit: the CUDA context by stack release, the fit test against the footprint (issue 29) ----------------

def test_cuda_context_follows_the_stacks_module_loading():
    """Eager module loading (666,632,192 B) for stacks released before PyTorch 1.13 set CUDA_MODULE_LOADING=LAZY,
    lazy (287,047,680 B) from 2022-11 on (pytorch/pytorch PR 86509); the stage carries the one it charged."""
    assert memory.context_bytes("2022-10") == memory.CUDA_CONTEXT_BYTES == 666_632_192
    assert memory.context_bytes("2022-11") == memory.CUDA_CONTEXT_LAZY_BYTES == 287_047_680
    m = _gpt()
    kw = dict(num_layers=4, has_embedding=False, has_head=False, single_stage=False, b=1, s=2048, t=2, dp=1, zero=0,
              recompute="none", sequence_parallel=False, in_flight=2, framework="megatron")
    old = memory_of(m, stack="nemo@22.09", **kw)
    new = memory_of(m, stack="nemo@23.05", **kw)
    assert float(old.context) == memory.CUDA_CONTEXT_BYTES and float(new.context) == memory.CUDA_CONTEXT_LAZY_BYTES
    for mem in (old, new):  # the context is in the footprint and in the fit test, once
        allocated = sum(float(getattr(mem, k)) for k in ("weights", "gradients", "optimizer", "activations",
                                                          "transient"))
        assert float(mem.total) == pytest.approx(allocated * (1 + memory.ALLOCATOR_MARGIN) + float(mem.context))
        assert float(mem.required) == pytest.approx(allocated * (1 - memory.FIT_TOLERANCE) + float(mem.context))


def test_fit_warning_only_between_required_and_the_footprint():
    cap = 80 * 2**30
    assert memory.fit_warning(70 * 2**30, 75 * 2**30, cap) is None  # fits with room
    assert memory.fit_warning(81 * 2**30, 85 * 2**30, cap) is None  # refused: not a warning
    text = memory.fit_warning(79 * 2**30, 84 * 2**30, cap)
    assert text is not None and "84.0 GiB of 80.0 GiB" in text and "79.0 GiB" in text


def test_published_nemo_2208_5b_tp1_layout_fits_an_a100_80gb():
    """NeMo Megatron 22.08's GPT-3 5B at TP 1, micro-batch 2, no recomputation (launcher conf/training/gpt3/5b.yaml
    at 3579cdb3, the table's first commit, kept through 562d401d of 22.09: ``activations_checkpoint_num_layers:
    0``) ran on DGX A100 80GB (README §7.1.2). Its allocated peak
    is 79.4 GiB (apex DistributedFusedAdam's contiguous fp32 gradient buffer, 4 B per parameter, plus Korthikanti's
    34 sbh + 5 as²b per layer), so it fits only because the fit test does not refuse for the allocator's margin:
    the footprint (what nvidia-smi would show) exceeds 80 GiB and the stage carries a warning instead."""
    import csv

    from hetplan.calibration import validation as v
    from hetplan.estimate.estimator import estimate

    rows = list(csv.DictReader(v._data(v.STACKS_2022_FILE).splitlines()))
    r = next(r for r in rows if r["stack"] == "nemo@22.08" and r["model"] == "gpt3-5b" and r["num_gpus"] == "8")
    plan, m = v.stacks_2022_row_plan(r)
    est = estimate(plan, model=m)
    (st,) = est.stages
    allocated = (st.memory.required - st.memory.context) / (1 - memory.FIT_TOLERANCE)
    assert 79.0 * 2**30 < allocated < 80.0 * 2**30
    assert est.fits and st.memory.required <= st.memory_capacity_bytes < st.memory.total
    assert memory.fit_warning(st.memory.required, st.memory.total, st.memory_capacity_bytes)


def test_stack_memory_residual_is_its_refit_and_helps_its_held_out_rows():
    """megatron-deepspeed@2022-02's residual in stacks.toml is what hetplan.calibration.memory_fit fits on the
    seeded quarter of BLOOM's nvidia-smi memory rows; on the other rows it cuts the memory error."""
    from hetplan.calibration.memory_fit import fit_bigscience
    from hetplan.hardware.stacks import resolve_stack

    f = fit_bigscience()
    assert f.residual_gib == resolve_stack("megatron-deepspeed@2022-02").memory_residual_gib > 0
    assert f.n_fit + f.n_held_out == 92 and f.n_held_out > 3 * f.n_fit - 10
    assert f.held_out_mape_after < 0.05 < 0.15 < f.held_out_mape_before
    assert abs(f.held_out_signed_after) < 0.05
    assert resolve_stack("megatron-deepspeed@2023-09").memory_residual_gib == 0.0  # not carried over unmeasured


def test_no_published_2021_22_or_llama3_run_is_refused():
    """Every row of nemo_megatron_a100 (NeMo 22.02-22.08, MT-NLG, Megatron-LM 2.0 on A100) and of llama3_405b ran:
    none is refused (``benchmarks/bench_memory_fit.py`` sweeps every set; before issue 29's fit test NeMo 22.09's
    5B rows 17-18 and Llama 3's 8,192-GPU row were)."""
    from hetplan.calibration import modern
    from hetplan.calibration import validation as v
    from hetplan.estimate.estimator import estimate

    cases = v.all_cases(["nemo_megatron_a100"]) + modern.run_modern(("llama3_405b",))[1]
    assert len(cases) == 41
    refused = [c.key for c in cases if not estimate(c.plan, model=c.model, virtual_stages=c.virtual_stages).fits]
    assert refused == []


def test_one_stage_holds_one_microbatch_whatever_the_schedule():
    """Without a pipeline no schedule runs: each micro-batch's backward follows its forward (Megatron-LM's
    forward_backward_no_pipelining), so a GPipe schedule named on a one-stage plan holds one micro-batch's
    activations, not all of them; with two stages GPipe holds every micro-batch."""
    from hetplan.estimate.estimator import estimate

    job = Job(model="gpt3-1.3b", seq_len=2048, global_batch=64, dtype="bf16")
    pool = GPUPool(gpu="A100-SXM-80GB", count=8)

    def act(pp, schedule):
        plan = Plan(job=job, pools=[pool], mbs=1, zero=1, schedule=schedule,
                    stages=[Stage(num_layers=24 // pp, tp=1, dp=8 // pp)] * pp)
        return estimate(plan).stages[0].memory.activations

    assert act(1, "gpipe") == pytest.approx(act(1, "1f1b"), rel=1e-12)
    assert act(2, "gpipe") > 2 * act(2, "1f1b")  # 8 micro-batches in flight against 2


@pytest.mark.parametrize("framework", ["megatron", "deepspeed", "fsdp"])
def test_zero3_gathers_no_more_layers_than_the_stage_has(framework):
    """ZeRO-3 / FSDP holds the gathered 16-bit parameters of the layer computing and the one prefetched: two
    layers, but one on a one-layer stage (there is nothing to prefetch), and never more layers than the stage
    has when FSDP keeps them from forward to backward (``reshard_after_forward`` False)."""
    m = _gpt(L=24, h=2048, a=16)
    dp = 8
    kw = dict(has_embedding=False, has_head=False, single_stage=True, b=1, s=2048, t=1, dp=dp, zero=3,
              recompute="none", sequence_parallel=False, in_flight=1, framework=framework)
    layer = float(memory.layer_parameters_per_gpu(m, 1))  # parameters of one layer

    def weights(**extra):
        return float(memory_of(m, **{**kw, **extra}).weights)

    one, two, three = (weights(num_layers=n) for n in (1, 2, 3))
    shard = 2 * layer / dp if framework != "fsdp" else 4 * layer / dp  # 16-bit (fp32 under FSDP2) shard per layer
    assert one == pytest.approx(shard + 2 * layer, rel=1e-6)  # its shard and itself gathered
    assert two - one == pytest.approx(shard + 2 * layer, rel=1e-6)  # a second layer gathered (prefetched)
    assert three - two == pytest.approx(shard, rel=1e-6)  # a third: only its shard
    if framework == "fsdp":
        kept = dict(reshard_after_forward=False)
        assert weights(num_layers=1, **kept) == pytest.approx(one, rel=1e-9)
        assert weights(num_layers=3, **kept) == pytest.approx(3 * (shard + 2 * layer), rel=1e-6)
