"""FLOPs, parameters, activation and model-state memory against the published formulas (exact)."""

import pytest

from hetplan.estimate import memory
from hetplan.model import counts
from hetplan.model.spec import ModelSpec, load_model
from estimate.stage_kwargs import memory_of


def megatron_num_floating_point_operations(batch, s, L, h, a, g, f, V, swiglu, kv_channels):
    """Megatron-LM ``training.py::num_floating_point_operations`` (dense, no MoE), transcribed as a formula:
    12 b s L h^2 [ (1 + g/a + s/h) (a d / h) + (f/h) (3/2 if SwiGLU) + V / (2 L h) ]."""
    ratio = kv_channels * a / h
    gated = 1.5 if swiglu else 1.0
    return 12 * batch * s * L * h * h * ((1 + g / a + s / h) * ratio + f / h * gated + V / (2 * L * h))


@pytest.mark.parametrize("name", ["gpt3-175b", "llama2-7b", "llama2-70b", "llama3-8b", "mistral-7b", "gpt2-xl", "megatron-gpt-1t"])
@pytest.mark.parametrize("batch,seq", [(1, 2048), (8, 4096), (1536, 2048)])
def test_flops_match_megatron(name, batch, seq):
    m = load_model(name)
    ours = counts.model_flops_per_iteration(m, batch, seq)
    ref = megatron_num_floating_point_operations(
        batch, seq, m.num_layers, m.hidden_size, m.num_attention_heads, m.num_kv_heads, m.ffn_hidden_size,
        m.padded_vocab_size(), m.gated_mlp, m.head_dim,
    )
    assert ours == pytest.approx(ref, rel=1e-12)


@pytest.mark.parametrize("name", ["llama3-8b", "gpt3-175b"])
def test_causal_flops_match_megatron_since_2025(name):
    """Megatron-LM's count since 2025 halves the s x s core term (``/ 2  # causal mask``): the formula above with
    ``s/h`` replaced by ``s/(2h)``."""
    m, batch, seq = load_model(name), 4, 8192
    ours = counts.model_flops_per_iteration(m, batch, seq, causal=True)
    ref = megatron_num_floating_point_operations(
        batch, seq, m.num_layers, m.hidden_size, m.num_attention_heads, m.num_kv_heads, m.ffn_hidden_size,
        m.padded_vocab_size(), m.gated_mlp, m.head_dim,
    )
    core = 12 * batch * seq * m.num_layers * m.hidden_size * m.hidden_size * (seq / m.hidden_size) * m.q_dim / m.hidden_size
    assert ours == pytest.approx(ref - core / 2, rel=1e-12)


def test_narayanan_eq3_with_full_recompute():
    # Narayanan et al. SC'21 Eq. 3 (full recomputation = one more forward of every layer):
    # 96 B s L h^2 (1 + s/6h + V/16Lh).
    m = load_model("gpt3-175b")
    b, s, L, h, V = 1536, 2048, 96, 12288, m.padded_vocab_size()
    eq3 = 96 * b * s * L * h * h * (1 + s / (6 * h) + V / (16 * L * h))
    ours = counts.model_flops_per_iteration(m, b, s) + L * counts.layer_forward_flops(m, b, s)
    assert ours == pytest.approx(eq3, rel=1e-12)


def gpt(**kw):
    base = dict(name="t", family="megatron_gpt", num_layers=24, hidden_size=2048, num_attention_heads=16, num_kv_heads=16,
                head_dim=128, ffn_hidden_size=8192, vocab_size=51200, max_seq_len=2048, gated_mlp=False, norm="layernorm",
                linear_bias=False, learned_positions=0, tied_embeddings=False, dropout=True)
    base.update(kw)
    return ModelSpec(**base)


@pytest.mark.parametrize("t", [1, 2, 4, 8])
def test_korthikanti_table2(t):
    m = gpt()
    s, b, h, a = 2048, 4, m.hidden_size, m.num_attention_heads
    sbh = s * b * h
    no_sp = counts.layer_activation_bytes(m, b, s, t, sequence_parallel=False)
    assert no_sp == pytest.approx(sbh * (10 + 24 / t + 5 * a * s / (h * t)))
    assert counts.layer_activation_bytes(m, b, s, t, sequence_parallel=True) == pytest.approx(sbh * (34 / t + 5 * a * s / (h * t)))
    assert counts.layer_activation_bytes(m, b, s, t, True, "selective") == pytest.approx(sbh * 34 / t)
    assert counts.layer_activation_bytes(m, b, s, t, False, "full") == pytest.approx(2 * sbh)


def megatron_weight_and_optimizer_bytes(m, tp, pp, dp, distributed_optimizer):
    """Megatron-LM ``theoretical_memory_usage.compute_weight_and_optimizer_memory`` (no MoE), as a formula."""
    L, h, a, g, f = m.num_layers, m.hidden_size, m.num_attention_heads, m.num_kv_heads, m.ffn_hidden_size
    p_layers = 2 * L * h * h * ((1 + g / a) * (m.q_dim / h) + f / h + 2 / h + 1 / (L * h))
    emb = h * m.vocab_size
    shard = (p_layers / pp + emb) / tp
    if pp == 1:
        shard += emb / tp
    per_param = 6 + 12 / dp if distributed_optimizer else 18
    return shard * per_param


def megatron_activation_bytes(m, s, b, tp, pp, num_microbatches):
    """Megatron-LM ``theoretical_memory_usage.compute_activation_memory`` (selective recompute + SP, 1F1B)."""
    h, L, V = m.hidden_size, m.num_layers, m.vocab_size
    act = s * b * h * (18 + 4 * m.ffn_hidden_size / h) * L
    act += 8 * s * b * pp + s * b * h * pp
    if pp > 1:
        act *= min(1, num_microbatches / pp)
    else:
        act += s * b * h * 4 * (1 + V / h)
    return act / tp


@pytest.mark.parametrize("tp,pp,dp", [(1, 1, 1), (2, 1, 4), (8, 1, 16), (4, 4, 8), (8, 8, 2), (1, 2, 64)])
@pytest.mark.parametrize("zero", [0, 1])
def test_memory_matches_megatron_theoretical(tp, pp, dp, zero):
    m = gpt()
    s, b, mb = 2048, 2, 16
    first = memory_of(
        m, num_layers=m.num_layers // pp, has_embedding=True, has_head=pp == 1, single_stage=pp == 1, b=b, s=s, t=tp,
        dp=dp, zero=zero, recompute="selective", sequence_parallel=True, in_flight=min(pp, mb),
    )
    states = first.weights + first.gradients + first.optimizer
    # Megatron spreads the final LayerNorm (2h parameters) over all stages (its 1/(Lh) term); we put it on the
    # last stage only: the two agree up to those 2h parameters.
    assert abs(states - megatron_weight_and_optimizer_bytes(m, tp, pp, dp, zero == 1)) <= 2 * m.hidden_size * 18 / tp
    assert first.activations == pytest.approx(megatron_activation_bytes(m, s, b, tp, pp, mb), rel=1e-12)
    assert first.total > states + first.activations  # overhead is added on top


def test_zero_stages_shard_model_states():
    m = gpt()
    kw = dict(num_layers=24, has_embedding=True, has_head=True, single_stage=True, b=1, s=2048, t=1, dp=8,
              recompute="full", sequence_parallel=False, in_flight=1)
    mem = [memory_of(m, zero=z, **kw) for z in range(4)]
    p = counts.total_parameters(m)
    assert mem[0].optimizer == 12 * p and mem[1].optimizer == 12 * p / 8
    # ZeRO-2/3 under megatron run as Megatron-FSDP: + one layer's 16-bit gradient and two layers' fp32 main-gradient
    # buckets (memory.MEGATRON_FSDP_MAIN_GRAD_UNITS, custom_fsdp's double-buffer limit)
    buckets = counts.layer_parameters(m) * (2 + memory.MEGATRON_FSDP_MAIN_GRAD_UNITS * 4)
    assert mem[1].gradients == 4 * p and mem[2].gradients == pytest.approx(4 * p / 8 + buckets)
    assert mem[2].weights == 2 * p
    assert mem[3].weights == pytest.approx(2 * p / 8 + 2 * 2 * counts.layer_parameters(m))  # + prefetch buffer
    assert [x.total for x in mem] == sorted((x.total for x in mem), reverse=True)


def test_post_norms_and_bias_free_norms():
    """Gemma's post-attention and post-MLP norms (``post_norms``) are two more norms per layer: h parameters each
    (RMSNorm), and their inputs (the attention and MLP outputs, 2·s·b·h bytes each) are kept for backward, on every
    TP rank or split by sequence parallelism; an MPT ``no_bias`` LayerNorm holds its weight only."""
    from hetplan.estimate import elementwise

    m = load_model("llama2-7b")
    post = m.model_copy(update={"post_norms": True})
    h, b, s, t = m.hidden_size, 2, 4096, 4
    assert counts.dense_layer_parameters(post) - counts.dense_layer_parameters(m) == 2 * h
    for sp, share in ((False, 1), (True, t)):
        extra = (counts.layer_activation_bytes(post, b, s, t, sequence_parallel=sp)
                 - counts.layer_activation_bytes(m, b, s, t, sequence_parallel=sp))
        assert extra == 2 * 2 * s * b * h / share
    assert counts.layer_activation_bytes(post, b, s, t, recompute="full") == counts.layer_activation_bytes(
        m, b, s, t, recompute="full")
    assert (elementwise.eager_layer_kernels(post) - elementwise.eager_layer_kernels(m)
            == 2 * elementwise.RMSNORM_EXTRA_KERNELS)
    assert (elementwise.eager_layer_bytes(post, b, s) - elementwise.eager_layer_bytes(m, b, s)
            == 2 * elementwise.RMSNORM_EXTRA_BYTES * b * s * h)
    gpt = load_model("gpt3-1.3b")
    bare = gpt.model_copy(update={"norm_bias": False})
    assert counts.total_parameters(gpt) - counts.total_parameters(bare) == (2 * gpt.num_layers + 1) * gpt.hidden_size
