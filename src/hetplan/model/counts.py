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
#: the output and the fp32 softmax log-sum-exp and recomputes the scores in backward.
ATTENTION_KINDS = ("standard", "flash")
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
                           fix="use 'standard' (s x s scores stored) or 'flash' (FlashAttention)")
    return attention


def layer_parameters(m: ModelSpec) -> int:
    """Parameters of one transformer layer (attention + MLP + two norms), biases included.

    Attention: Q and O are h x (a*d), K and V are h x (g*d). MLP: 2 h f matrices, 3 for a gated (SwiGLU) MLP
    (Shazeer 2020, "GLU Variants Improve Transformer"). LayerNorm has weight and bias (2h), RMSNorm weight only (h).
    """
    h, q, kv, f = m.hidden_size, m.q_dim, m.kv_dim, m.ffn_hidden_size
    attn = h * q + 2 * h * kv + q * h
    mlp = (3 if m.gated_mlp else 2) * h * f
    if m.linear_bias:
        attn += q + 2 * kv + h
        mlp += (2 * f if m.gated_mlp else f) + h
    norms = 2 * (2 * h if m.norm == "layernorm" else h)
    return attn + mlp + norms


def embedding_parameters(m: ModelSpec) -> int:
    """Input embedding (V x h) plus a learned position table (P x h) if the model has one."""
    return (m.vocab_size + m.learned_positions) * m.hidden_size


def head_parameters(m: ModelSpec) -> int:
    """Final norm plus the output projection (V x h) when it is not tied to the input embedding."""
    final_norm = 2 * m.hidden_size if m.norm == "layernorm" else m.hidden_size
    return final_norm + (0 if m.tied_embeddings else m.vocab_size * m.hidden_size)


def total_parameters(m: ModelSpec) -> int:
    """All parameters: L layers + embedding + head (tied weights counted once)."""
    return m.num_layers * layer_parameters(m) + embedding_parameters(m) + head_parameters(m)


def layer_forward_flops(m: ModelSpec, b, s):
    """Forward FLOPs of one transformer layer for ``b`` sequences of length ``s`` (multiply-add = 2 FLOPs).

    Per layer: Q, K, V, O projections 2bs·h·(2q + 2g·d); attention scores QKᵀ and attention-over-values
    2·2·b·s²·(a·d) (the full s x s product, no causal discount, as Megatron-LM counts it); MLP 2·b·s·h·f per
    matrix (2 matrices, 3 for SwiGLU). Source: Narayanan et al. SC'21 Sec. 5.1 (Eq. 3 without recompute),
    generalised to GQA and SwiGLU as in Megatron-LM ``num_floating_point_operations``. Norms, softmax and
    element-wise work are not counted (as in those formulas).
    """
    b, s = as_float(b), as_float(s)
    h, q, kv, f = m.hidden_size, m.q_dim, m.kv_dim, m.ffn_hidden_size
    tokens = b * s
    proj = 2 * tokens * h * (2 * q + 2 * kv)
    attn = 4 * tokens * s * q
    mlp = 2 * tokens * h * f * (3 if m.gated_mlp else 2)
    return proj + attn + mlp


def head_forward_flops(m: ModelSpec, b, s):
    """Forward FLOPs of the logits (output projection): 2·b·s·h·V (Narayanan et al. SC'21, Eq. 3, last term)."""
    b, s = as_float(b), as_float(s)
    return 2 * b * s * m.hidden_size * m.padded_vocab_size()


def model_flops_per_iteration(m: ModelSpec, global_batch, s):
    """Model FLOPs of one training iteration (forward + backward = 3 x forward), no recomputation.

    This is the numerator of MFU (Chowdhery et al. 2022, PaLM, App. B). With full recomputation hardware does
    one more forward of every layer (HFU counts it; Narayanan et al. Eq. 3 uses 4 x forward).
    """
    global_batch, s = as_float(global_batch), as_float(s)
    return 3 * (m.num_layers * layer_forward_flops(m, global_batch, s) + head_forward_flops(m, global_batch, s))


def layer_activation_bytes(m: ModelSpec, b, s, t=1, sequence_parallel=False, recompute="none", attention="standard"):
    """Activation bytes one transformer layer keeps for its backward pass, per GPU, for one micro-batch.

    Term by term after Korthikanti et al. MLSys'23, Sec. 4.1 (2-byte activations, 1-byte dropout masks):

    * kept whole on every TP rank unless sequence parallelism splits them: the two norm inputs (4sbh), the
      attention and MLP inputs after the norms (2sbh each), two dropout masks (sbh each, if the model uses
      dropout) — 10sbh for GPT;
    * split across TP ranks: Q (2sb·q), K and V (2sb·g·d each), output-projection input (2sb·q); MLP: the two
      inputs of a GeLU MLP's activation/second GEMM (2sbf each), or for SwiGLU the gate and up outputs and their
      product (2sbf each, three tensors) — 24sbh for GPT with f = 4h;
    * the s² attention terms, split across TP ranks: softmax output 2as²b, plus its dropout mask as²b and the
      dropout output 2as²b when the model uses dropout — 5as²b for GPT.

    For GPT this reproduces the paper's sbh(10 + 24/t + 5as/(ht)) (Table 2, TP), sbh(34/t + 5as/(ht)) (TP+SP)
    and 34sbh/t (TP + SP + selective recompute, which drops the s² terms). Full recompute keeps only the layer
    input, 2sbh (/t with SP) (Table 2, last row); the recomputed layer's working set is added separately.

    With ``attention="flash"`` (FlashAttention, Dao et al. 2022 Sec. 3.1) no s² tensor is stored: the kernel
    keeps Q, K, V and its output (counted above) plus the fp32 log-sum-exp of each query row and head,
    ``4·a·s·b`` bytes (split across TP ranks), and regenerates the dropout mask from the RNG state. Selective
    recompute then stores the same bytes as none (Megatron-LM does not checkpoint the flash core either).

    Args:
        recompute: ``"none"``, ``"selective"`` (attention core recomputed) or ``"full"``.
        attention: ``"standard"`` or ``"flash"`` (:data:`ATTENTION_KINDS`).
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
    replicated = 4 * sbh + 2 * sbh + 2 * sbh + masks
    mlp = (3 if m.gated_mlp else 2) * 2 * s * b * f
    tp_split = 2 * s * b * q + 4 * s * b * kv + 2 * s * b * q + mlp
    if check_attention(attention) == "flash":
        quadratic = FLASH_LSE_BYTES * a * s * b
    else:
        quadratic = 0 if recompute == "selective" else (5 if m.dropout else 2) * a * s * s * b
    if sequence_parallel:
        return (replicated + tp_split + quadratic) / t
    return replicated + (tp_split + quadratic) / t
