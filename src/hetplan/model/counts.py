"""Parameter, FLOP and activation-memory counts of a decoder-only transformer.

Notation (Narayanan et al., SC'21, "Efficient Large-Scale Language Model Training on GPU Clusters Using
Megatron-LM", Sec. 5.1; Korthikanti et al., MLSys'23, "Reducing Activation Recomputation in Large Transformer
Models", Sec. 4): b micro-batch size (sequences), s sequence length, h hidden size, a attention heads,
g key/value heads, f MLP inner size, V vocabulary, L layers, t tensor-parallel degree.

Functions taking ``b``/``s``/``t`` accept numpy arrays as well as scalars (they broadcast), so the search can
evaluate many configurations in one call.
"""

from __future__ import annotations

import numpy as np

from hetplan.errors import HetplanError
from hetplan.model.spec import ModelSpec

BYTES_PER_ACTIVATION = 2  # bf16/fp16 activations
#: Attention implementations: ``standard`` materialises the s x s scores (Megatron-LM's unfused core attention,
#: what Korthikanti et al. 2023 count); ``flash`` is FlashAttention (Dao et al., NeurIPS 2022), which keeps only
#: the output and the fp32 softmax log-sum-exp and recomputes the scores in backward; ``eager`` stores what
#: ``standard`` does (plus the fp32 softmax output of a model with ``softmax_fp32``) but runs each element-wise
#: step as its own kernel (Hugging Face eager attention; :func:`hetplan.estimate.compute.eager_score_bytes`).
ATTENTION_KINDS = ("standard", "flash", "eager")
#: Bytes per element of FlashAttention's saved softmax statistics (log-sum-exp, fp32; Dao et al. 2022 Alg. 2).
FLASH_LSE_BYTES = 4


def as_float(x):
    """``x`` as float64 if it is a numpy integer array or scalar, else unchanged (Python ints are exact).

    Token, FLOP and byte counts of large jobs overflow int64 (Llama 3 405B at 16M tokens per iteration: 4.4e19
    FLOPs > 9.2e18), and numpy integer arithmetic wraps around silently; every count below multiplies in float64
    (exact up to 2^53, relative error 1e-16 above)."""
    if isinstance(x, (np.ndarray, np.integer)) and np.issubdtype(np.asarray(x).dtype, np.integer):
        return np.asarray(x, dtype=np.float64)
    return x


def check_attention(attention: str) -> str:
    """Return ``attention`` if it is one of :data:`ATTENTION_KINDS`.

    Raises:
        HetplanError: unknown attention implementation (field ``job.attention``).
    """
    if attention not in ATTENTION_KINDS:
        raise HetplanError(f"unknown attention implementation {attention!r}", field="job.attention",
                           fix="use 'standard' (s x s scores stored), 'eager' (the same, unfused: Hugging Face) or "
                               "'flash' (FlashAttention)")
    return attention


def attention_linears(m: ModelSpec) -> tuple[tuple[int, int], ...]:
    """``(in_features, out_features)`` of a layer's attention projections, in order (one description of the
    attention GEMMs: parameters and FLOPs both derive from it).

    Standard / GQA: Q ``h -> a·d``, K and V ``h -> g·d``, O ``a·d -> h``. MLA (DeepSeek-V2 Sec. 2.1.2-2.1.3):
    Q down ``h -> r_q`` and up ``r_q -> a·d_qk`` (or ``h -> a·d_qk`` without ``q_lora_rank``), KV down
    ``h -> r_kv + d_rope`` (the latent and the shared rotary key), KV up ``r_kv -> a·(d_nope + d_v)``, O ``a·d_v -> h``.
    """
    h = m.hidden_size
    if not m.is_mla:
        return ((h, m.q_dim), (h, m.kv_dim), (h, m.v_dim), (m.attn_out_dim, h))
    a, d_qk, rope, r_kv = m.num_attention_heads, m.head_dim, m.qk_rope_head_dim, m.kv_lora_rank
    q = ((h, m.q_lora_rank), (m.q_lora_rank, a * d_qk)) if m.q_lora_rank else ((h, a * d_qk),)
    d_v = m.v_head_dim or d_qk
    return q + ((h, r_kv + rope), (r_kv, a * (d_qk - rope + d_v)), (a * d_v, h))


def attention_parameters(m: ModelSpec) -> int:
    """Parameters of one attention block: :func:`attention_linears` plus biases (all four projections with
    ``linear_bias``; Q, K, V with ``qkv_bias``), Q/K norm weights (``qk_norm``: ``head_dim`` each), MLA's latent
    norms (``r_q + r_kv``) and one sink logit per head (``attention_sinks``)."""
    p = sum(i * o for i, o in attention_linears(m))
    if m.linear_bias:
        p += sum(o for _, o in attention_linears(m))
    elif m.qkv_bias:
        p += m.q_dim + m.kv_dim + m.v_dim
    if m.qk_norm:
        p += 2 * m.head_dim
    if m.is_mla:
        p += m.q_lora_rank + m.kv_lora_rank
    if m.attention_sinks:
        p += m.num_attention_heads
    return p


def mlp_parameters(m: ModelSpec, ffn: int) -> int:
    """Parameters of one MLP of inner size ``ffn``: 2 h·ffn matrices, 3 for a gated (SwiGLU) MLP (Shazeer 2020,
    "GLU Variants Improve Transformer"), plus biases (``2·ffn + h`` gated, ``ffn + h`` otherwise)."""
    h = m.hidden_size
    p = (3 if m.gated_mlp else 2) * h * ffn
    if m.linear_bias:
        p += (2 * ffn if m.gated_mlp else ffn) + h
    return p


def router_parameters(m: ModelSpec) -> int:
    """The router ``h -> E`` (with a bias under ``linear_bias``, GPT-OSS) plus Qwen2-MoE's shared-expert gate."""
    h, e = m.hidden_size, m.num_experts
    return h * e + (e if m.linear_bias else 0) + (h if m.shared_expert_gate else 0)


def expert_layer_parameters(m: ModelSpec) -> int:
    """Routed-expert parameters of one MoE layer: ``E`` experts (the part expert parallelism shards)."""
    return m.num_experts * mlp_parameters(m, m.expert_ffn_hidden_size) if m.is_moe else 0


def norm_parameters(m: ModelSpec) -> int:
    """Parameters of one norm over the hidden size: weight and bias (2h) for a LayerNorm with ``norm_bias``, the
    weight only (h) for RMSNorm or a bias-free LayerNorm (MPT ``no_bias``)."""
    return 2 * m.hidden_size if m.norm == "layernorm" and m.norm_bias else m.hidden_size


def layer_norms(m: ModelSpec) -> int:
    """Norms over the hidden size in one layer: before attention and before the MLP, plus, with ``post_norms``,
    after each of them (Gemma 2 / 3's ``post_attention_layernorm`` and ``post_feedforward_layernorm``)."""
    return 4 if m.post_norms else 2


def _norms(m: ModelSpec) -> int:
    return layer_norms(m) * norm_parameters(m)


def dense_layer_parameters(m: ModelSpec) -> int:
    """Parameters of a layer with a dense MLP (all layers of a dense model): attention + MLP + two norms."""
    return attention_parameters(m) + mlp_parameters(m, m.ffn_hidden_size) + _norms(m)


def moe_layer_parameters(m: ModelSpec, active: bool = False) -> int:
    """Parameters of a MoE layer: attention, router, the routed experts (only ``experts_per_token`` of them if
    ``active``), the shared experts and two norms."""
    shared = mlp_parameters(m, m.shared_expert_ffn_hidden_size) if m.shared_expert_ffn_hidden_size else 0
    experts = m.experts_per_token if active else m.num_experts
    return (attention_parameters(m) + router_parameters(m) + experts * mlp_parameters(m, m.expert_ffn_hidden_size)
            + shared + _norms(m))


def _layer_mean(m: ModelSpec, dense, moe):
    """Mean over the L layers of a per-layer quantity that is ``dense`` on dense layers and ``moe`` on MoE
    layers; ``dense`` itself for a dense model (so dense counts stay exact integers)."""
    if not m.is_moe:
        return dense
    n_moe = m.num_moe_layers
    return ((m.num_layers - n_moe) * dense + n_moe * moe) / m.num_layers


def layer_parameters(m: ModelSpec):
    """Parameters of one transformer layer (attention + MLP + two norms), biases included; for a MoE model the
    mean over its dense and MoE layers (so ``L ·`` this is exact; a stage of n layers holds ``n ·`` this, which
    is off by the dense/MoE mix of the stage where dense layers are not spread evenly — DeepSeek's first 3).

    Attention: :func:`attention_parameters` (Q and O are h x (a*d), K and V are h x (g*d) for standard models).
    MLP: :func:`mlp_parameters`. Norms: :func:`norm_parameters`.
    """
    return _layer_mean(m, dense_layer_parameters(m), moe_layer_parameters(m))


def layer_expert_parameters(m: ModelSpec):
    """Mean per layer of the routed-expert parameters (:func:`expert_layer_parameters`); 0 for a dense model."""
    return _layer_mean(m, 0, expert_layer_parameters(m))


def embedding_parameters(m: ModelSpec) -> int:
    """Input embedding (V x h) plus a learned position table (P x h) if the model has one."""
    return (m.vocab_size + m.learned_positions) * m.hidden_size


def head_parameters(m: ModelSpec) -> int:
    """Final norm plus the output projection (V x h) when it is not tied to the input embedding."""
    return norm_parameters(m) + (0 if m.tied_embeddings else m.vocab_size * m.hidden_size)


def total_parameters(m: ModelSpec) -> int:
    """All parameters: L layers + embedding + head (tied weights counted once)."""
    n_moe = m.num_moe_layers
    layers = (m.num_layers - n_moe) * dense_layer_parameters(m) + n_moe * moe_layer_parameters(m)
    return layers + embedding_parameters(m) + head_parameters(m)


def active_parameters(m: ModelSpec, input_embedding: bool = True) -> int:
    """Parameters one token uses (the "activated parameters" of MoE model cards): every layer with only the
    router's top-k routed experts, plus the embedding and head. ``input_embedding=False`` leaves out the input
    embedding table, of which a token reads one row (OpenAI's GPT-OSS model card counts active parameters so);
    Mixtral, DeepSeek and Qwen count it. Equals :func:`total_parameters` for a dense model."""
    n_moe = m.num_moe_layers
    layers = (m.num_layers - n_moe) * dense_layer_parameters(m) + n_moe * moe_layer_parameters(m, active=True)
    emb = embedding_parameters(m) if input_embedding else 0
    return layers + emb + head_parameters(m)


def attended_keys(m: ModelSpec, s, causal=False):
    """Mean over layers of the keys each query is scored against: ``s`` (the full s x s product, no causal
    discount, as Megatron-LM counted it until 2025 and NeMo's FLOP formulas still do), or ``min(s, w)`` on the
    ``sliding_window_layers`` layers of window w. ``causal``: the keys a causal mask leaves, ``s/2`` (Megatron-LM
    ``num_floating_point_operations`` since 2025, ``/ 2  # causal mask``), ``w - w²/(2s)`` on window layers."""
    s = as_float(s)
    full = s / 2 if causal else s
    if not m.sliding_window_layers:
        return full
    n_sw, w = m.sliding_window_layers, np.minimum(s, m.sliding_window)
    window = w - w * w / (2 * s) if causal else w
    return ((m.num_layers - n_sw) * full + n_sw * window) / m.num_layers


def mlp_forward_flops(m: ModelSpec, tokens):
    """Forward FLOPs of the MLPs of one layer (mean over layers) for ``tokens`` tokens: a dense MLP
    ``2·T·h·f`` per matrix (2 matrices, 3 for SwiGLU); a MoE layer the router ``2·T·h·E``, ``k`` routed experts
    and the shared experts per token (Megatron-LM ``num_floating_point_operations``' MoE terms plus the router)."""
    h, mats = m.hidden_size, (3 if m.gated_mlp else 2)
    dense = 2 * tokens * h * m.ffn_hidden_size * mats
    if not m.is_moe:
        return dense
    ffn = m.experts_per_token * m.expert_ffn_hidden_size + m.shared_expert_ffn_hidden_size
    moe = 2 * tokens * h * ffn * mats + 2 * tokens * h * m.num_experts
    return _layer_mean(m, dense, moe)


def layer_forward_flops(m: ModelSpec, b, s, causal=False):
    """Forward FLOPs of one transformer layer for ``b`` sequences of length ``s`` (multiply-add = 2 FLOPs); for a
    MoE model the mean over its layers of the *active* FLOPs (top-k experts).

    Per layer: the projections ``2·b·s·Σ in·out`` of :func:`attention_linears` (Q, K, V, O: 2bs·h·(2q + 2g·d));
    attention scores QKᵀ and attention-over-values ``2·b·s·keys·a·(d_qk + d_v)`` with ``keys`` =
    :func:`attended_keys` (4·b·s²·(a·d) for a standard model: the full s x s product, no causal discount, as
    Megatron-LM counts it); MLP :func:`mlp_forward_flops`. Source: Narayanan et al. SC'21 Sec. 5.1 (Eq. 3
    without recompute), generalised to GQA, SwiGLU, MLA and MoE as in Megatron-LM ``num_floating_point_operations``.
    Norms, softmax and element-wise work are not counted (as in those formulas).
    """
    b, s = as_float(b), as_float(s)
    tokens = b * s
    proj = 2 * tokens * sum(i * o for i, o in attention_linears(m))
    attn = 2 * tokens * attended_keys(m, s, causal) * (m.q_dim + m.attn_out_dim)
    return proj + attn + mlp_forward_flops(m, tokens)


def head_forward_flops(m: ModelSpec, b, s):
    """Forward FLOPs of the logits (output projection): 2·b·s·h·V (Narayanan et al. SC'21, Eq. 3, last term)."""
    b, s = as_float(b), as_float(s)
    return 2 * b * s * m.hidden_size * m.padded_vocab_size()


def model_flops_per_iteration(m: ModelSpec, global_batch, s, causal=False):
    """Model FLOPs of one training iteration (forward + backward = 3 x forward), no recomputation; ``causal``
    counts the attention scores a causal mask leaves (:func:`attended_keys`) instead of the full ``s x s``.

    This is the numerator of MFU (Chowdhery et al. 2022, PaLM, App. B). With full recomputation hardware does
    one more forward of every layer (HFU counts it; Narayanan et al. Eq. 3 uses 4 x forward).
    """
    global_batch, s = as_float(global_batch), as_float(s)
    return 3 * (m.num_layers * layer_forward_flops(m, global_batch, s, causal) + head_forward_flops(m, global_batch, s))


def layer_activation_bytes(m: ModelSpec, b, s, t=1, sequence_parallel=False, recompute="none", attention="standard",
                           moe_recompute=False, expert_tp=1):
    """Activation bytes one transformer layer keeps for its backward pass, per GPU, for one micro-batch.

    Term by term after Korthikanti et al. MLSys'23, Sec. 4.1 (2-byte activations, 1-byte dropout masks):

    * kept whole on every TP rank unless sequence parallelism splits them: the two norm inputs (4sbh; 8sbh for
      the four of ``post_norms``, whose extra two take the attention and MLP outputs), the
      attention and MLP inputs after the norms (2sbh each), two dropout masks (sbh each, if the model uses
      dropout) — 10sbh for GPT;
    * split across TP ranks: Q (2sb·q), K and V (2sb·g·d each), output-projection input (2sb·q); MLP: the two
      inputs of a GeLU MLP's activation/second GEMM (2sbf each), or for SwiGLU the gate and up outputs and their
      product (2sbf each, three tensors) — 24sbh for GPT with f = 4h;
    * the s² attention terms, split across TP ranks: softmax output 2as²b, plus its dropout mask as²b and the
      dropout output 2as²b when the model uses dropout — 5as²b for GPT; ``eager`` attention with
      ``softmax_fp32`` also keeps the fp32 softmax output, 4as²b (Hugging Face ``BloomAttention``: the softmax
      saves its fp32 output, the context GEMM the bf16 cast of it).

    For GPT this reproduces the paper's sbh(10 + 24/t + 5as/(ht)) (Table 2, TP), sbh(34/t + 5as/(ht)) (TP+SP)
    and 34sbh/t (TP + SP + selective recompute, which drops the s² terms). Full recompute keeps only the layer
    input, 2sbh (/t with SP) (Table 2, last row); the recomputed layer's working set is added separately.

    With ``attention="flash"`` (FlashAttention, Dao et al. 2022 Sec. 3.1) no s² tensor is stored: the kernel
    keeps Q, K, V and its output (counted above) plus the fp32 log-sum-exp of each query row and head,
    ``4·a·s·b`` bytes (split across TP ranks), and regenerates the dropout mask from the RNG state. Selective
    recompute then stores the same bytes as none (Megatron-LM does not checkpoint the flash core either).

    Generalised: K and V are ``2sb·g·d_qk`` and ``2sb·g·d_v``, the output-projection input ``2sb·a·d_v``; MLA
    adds its Q and KV latents before and after their norms, ``4sb·(r_q + r_kv + d_rope)``, kept whole (the
    down-projections are replicated across TP ranks); a MoE layer's MLP term is
    :func:`moe_mlp_activation_bytes` (a MoE model: the mean over its dense and MoE layers); sliding-window
    layers store ``s·min(s, w)`` scores per head (:func:`attended_keys`).

    Args:
        recompute: ``"none"``, ``"selective"`` (attention core recomputed) or ``"full"``.
        attention: ``"standard"`` or ``"flash"`` (:data:`ATTENTION_KINDS`).
        moe_recompute: MoE layers are checkpointed around their MLP (Megatron-Core ``--recompute-modules moe``):
            their MLP term is 0 (its input, the norm output, is counted above).
        expert_tp: expert-TP degree of the routed experts (:func:`moe_mlp_activation_bytes`).
    Returns:
        bytes (float, or an array broadcast from the inputs).
    Raises:
        HetplanError: unknown ``attention``.
    """
    b, s = as_float(b), as_float(s)
    h, q, kv, f, a = m.hidden_size, m.q_dim, m.kv_dim, m.ffn_hidden_size, m.num_attention_heads
    sbh = s * b * h
    if recompute == "full":
        return 2 * sbh / (t if sequence_parallel else 1)
    masks = 2 * sbh if m.dropout else 0  # two 1-byte dropout masks of s*b*h elements
    replicated = 2 * layer_norms(m) * sbh + 2 * sbh + 2 * sbh + masks
    if m.is_mla:  # the Q and KV latents before and after their norms (down-projections are not TP-split)
        replicated = replicated + 4 * s * b * (m.q_lora_rank + m.kv_lora_rank + m.qk_rope_head_dim)
    mlp = (3 if m.gated_mlp else 2) * 2 * s * b * f
    if m.is_moe:
        mlp = _layer_mean(m, mlp, np.where(moe_recompute, 0.0, moe_mlp_activation_bytes(m, b, s, expert_tp)))
    tp_split = 2 * s * b * q + 2 * s * b * (kv + m.v_dim) + 2 * s * b * m.attn_out_dim + mlp
    if check_attention(attention) == "flash":
        quadratic = FLASH_LSE_BYTES * a * s * b
    else:
        per_score = (5 if m.dropout else 2) + (4 if attention == "eager" and m.softmax_fp32 else 0)
        quadratic = 0 if recompute == "selective" else per_score * a * s * attended_keys(m, s) * b
    if sequence_parallel:
        return (replicated + tp_split + quadratic) / t
    return replicated + (tp_split + quadratic) / t


#: Bytes per token and expert of the router's saved fp32 scores (the softmax / sigmoid input of top-k routing).
ROUTER_SCORE_BYTES = 4


def moe_mlp_activation_bytes(m: ModelSpec, b, s, expert_tp=1):
    """Activation bytes the MLP of one MoE layer keeps for backward, for ``b·s`` tokens at perfect balance
    (before TP / EP splitting): per routed copy of a token (``k`` per token) the expert's input, 2h (the
    permuted token, input of its first GEMM), and, like a dense MLP, its gate and up outputs and their product
    (``2·f_e`` bytes each, 3 tensors; 2 for a non-gated MLP); the shared experts as a dense MLP of their total
    size; and the router's fp32 scores (:data:`ROUTER_SCORE_BYTES` per token and expert). Derived the way
    Korthikanti et al. 2023 Sec. 4.1 count a dense MLP. With expert-TP ``expert_tp`` each of the ``expert_tp``
    ranks of an expert holds the whole input of every copy routed to it (gathered over the group, Megatron-Core's
    ``gather_from_sequence_parallel_region`` over ``expt_tp``; torchtitan's all-gathered tokens at EP 1,
    :func:`hetplan.estimate.moe.experts_split_like_mlp`) and a ``1/expert_tp`` slice of its outputs: the inputs
    count ``expert_tp`` times (the caller divides all by TP)."""
    mats = 3 if m.gated_mlp else 2
    tokens = s * b
    routed = m.experts_per_token * tokens * (2 * m.hidden_size * np.asarray(expert_tp, dtype=float)
                                             + mats * 2 * m.expert_ffn_hidden_size)
    shared = mats * 2 * tokens * m.shared_expert_ffn_hidden_size
    return routed + shared + ROUTER_SCORE_BYTES * tokens * m.num_experts
