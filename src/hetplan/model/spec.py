"""Decoder-only transformer shapes, and reading them from Hugging Face ``config.json`` files.

A :class:`ModelSpec` holds only shapes; parameter, FLOP and activation counts live in
:mod:`hetplan.model.counts`. Supported ``model_type`` values: ``llama``, ``mistral``, ``gpt2``, ``gpt_neox``,
``opt``, ``bloom``, plus ``megatron_gpt`` (the GPT shapes of Megatron-LM papers: learned positions, 4h GeLU MLP,
vocab 51200), the dense ``qwen2`` (Qwen2 / Qwen2.5), ``qwen3`` (Qwen3), ``phi3`` (Phi-3, Phi-4-mini), ``gemma2``,
``gemma3_text`` (and ``gemma3``'s ``text_config``; the vision tower is not modelled) and ``mpt``
(MosaicML MPT, llm-foundry's ``MPTConfig`` names) of :func:`_dense_fields` and :func:`_mpt_fields`,
and the mixture-of-experts families ``mixtral``, ``qwen2_moe``, ``qwen3_moe``, ``deepseek_v2``, ``deepseek_v3``
(multi-head latent attention, MLA), ``gpt_oss`` and ``llama4`` / ``llama4_text``.
Presets are ``config.json`` files shipped in ``hetplan/model/presets/`` (``hetplan catalog models`` lists them).

**Mixture of experts** (Shazeer et al. 2017; Fedus et al., Switch Transformer, JMLR 2022). A MoE layer replaces
the MLP by ``num_experts`` routed experts (each a gated MLP of ``expert_ffn_hidden_size``), of which a linear
router picks ``experts_per_token`` (top-k) per token, plus optional shared experts that every token goes through
(DeepSeekMoE, Dai et al. 2024; Qwen2-MoE; Llama 4). Which layers are MoE: layer ``i`` (0-based) is a MoE layer if
``i >= first_dense_layers`` and ``(i + 1) % moe_layer_step == 0`` — DeepSeek's ``first_k_dense_replace``, Llama 4's
``interleave_moe_layer_step`` and Qwen's ``decoder_sparse_step``, as in their ``transformers`` modelling files;
the other layers keep a dense MLP of ``ffn_hidden_size``.

**Multi-head latent attention** (MLA; DeepSeek-V2, arXiv 2405.04434, Sec. 2.1): queries go through a rank
``q_lora_rank`` bottleneck (none when 0), keys and values are up-projected from a ``kv_lora_rank`` latent plus a
shared ``qk_rope_head_dim`` rotary key; per head, Q and K have ``head_dim = qk_nope_head_dim + qk_rope_head_dim``
and V has ``v_head_dim``.
"""

from __future__ import annotations

import json
import re

from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal, Mapping

from pydantic import BaseModel, ConfigDict, Field, Strict, StrictBool, StrictInt, ValidationError, model_validator

from hetplan.errors import HetplanError
from hetplan.inputs import bounded, parse_json, read_text, validation_message


#: Reasons of :class:`ModelSpec`'s bounds shared by several fields.
_LARGEST_HEAD = "4,096 is 16x the largest head of any preset (Gemma 2: 256)"
_WIDEST_MLP = "1,048,576 is 10x the widest MLP of any preset (Megatron-LM's 1T GPT: 102,400)"
_WIDEST_RANK = "a rank above 131,072 is wider than the widest hidden size hetplan takes"


class ModelSpec(BaseModel):
    """Shapes of a decoder-only transformer.

    Attributes:
        name: preset name or file stem.
        family: the ``model_type`` it was read as (``llama``, ``qwen2``, ``mpt``, ``mixtral`` ...; BLOOM reads as
            ``megatron_gpt``, ``llama4_text`` as ``llama4``).
        num_layers: transformer layers L.
        hidden_size: h.
        num_attention_heads: a.
        num_kv_heads: key/value heads g (GQA; = a for multi-head attention).
        head_dim: per-head size (h / a unless the config says otherwise).
        ffn_hidden_size: MLP inner size f.
        vocab_size: V (as in the config; Megatron pads it, see :attr:`padded_vocab_size`).
        max_seq_len: longest sequence the position encoding allows.
        gated_mlp: SwiGLU-style MLP with three matrices (gate, up, down).
        norm: ``layernorm`` (weight + bias) or ``rmsnorm`` (weight only).
        norm_bias: the LayerNorms have a bias (``norm = "layernorm"`` only); MPT's ``no_bias = true`` removes every
            bias, the LayerNorms' too (llm-foundry ``MPTModel.__init__`` drops each module's ``bias`` parameter).
        post_norms: the attention and MLP outputs pass through norms of their own before the residual add, four
            norms per layer (Gemma 2 / 3: ``post_attention_layernorm`` and ``post_feedforward_layernorm`` of
            transformers ``models/gemma2/modeling_gemma2.py`` ``Gemma2DecoderLayer``).
        linear_bias: linear layers have biases (GPT-2, OPT, GPT-NeoX) or not (Llama, Mistral).
        learned_positions: number of rows in a learned position-embedding table (0 for rotary or ALiBi).
        alibi: positions enter as ALiBi's per-head linear bias on the attention scores, no table and no rotary
            embedding (BLOOM; Press et al. ICLR 2022). The bias's element-wise work on the scores is not priced
            (docs/estimator.md, BigScience section); ``hetplan export --to megatron`` refuses the model (Megatron-LM
            has no ALiBi).
        tied_embeddings: the output head shares the input embedding matrix.
        dropout: the model applies dropout (stores dropout masks, Korthikanti et al. 2023, Sec. 4.1).
        softmax_fp32: the attention softmax runs in fp32 on 16-bit scores (upcast, softmax, cast back): BLOOM's
            ``attention_softmax_in_fp32`` (Megatron-DeepSpeed; Hugging Face ``BloomAttention`` always does it).
            Costs time only under ``eager`` attention (:func:`hetplan.estimate.compute.eager_score_bytes`).
        v_head_dim: per-head size of V (MLA: ``v_head_dim``; 0 = ``head_dim``).
        qkv_bias: Q, K and V projections have biases, the output projection not (Qwen2).
        qk_norm: RMSNorm weights on each head's Q and K (Qwen3; ``head_dim`` each).
        attention_sinks: one learned sink logit per head (GPT-OSS).
        sliding_window, sliding_window_layers: that many layers attend only the last ``sliding_window`` tokens
            (GPT-OSS alternates; 0 = none). Mistral's window is not modelled (it equals its training length).
        q_lora_rank, kv_lora_rank, qk_rope_head_dim: MLA ranks (module doc); ``kv_lora_rank = 0``: no MLA.
        num_experts: routed experts per MoE layer (0 = dense model).
        experts_per_token: top-k of the router.
        router_renormalize: the top-k routing probabilities are renormalised to sum to 1 (Mixtral always; Qwen's
            ``norm_topk_prob``, false by default in transformers and true in Qwen3-MoE's released configs).
        expert_ffn_hidden_size: inner size of one routed expert.
        shared_expert_ffn_hidden_size: inner size of the shared experts together (0 = none).
        shared_expert_gate: a sigmoid gate ``h -> 1`` scales the shared expert (Qwen2-MoE).
        first_dense_layers, moe_layer_step: which layers are MoE (module doc).
        mtp_layers: multi-token-prediction modules the model was released with (DeepSeek-V3
            ``num_nextn_predict_layers``, arXiv 2412.19437 Sec. 2.2). Whether a job trains them is the job's
            :attr:`hetplan.plan.Job.mtp_layers` (priced, exported as ``--mtp-num-layers``); ``hetplan export`` of a
            job that trains none says so.
        published_parameters: parameter count quoted by the model's authors, if any (for checks).
        published_active_parameters: activated parameters per token quoted by the authors (MoE).
        source: where the shape comes from.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    family: Literal["llama", "mistral", "gpt2", "gpt_neox", "opt", "megatron_gpt", "qwen2", "qwen3", "mpt",
                    "phi3", "gemma2", "gemma3", "mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v2", "deepseek_v3",
                    "gpt_oss", "llama4"]
    #: Shapes are bounded far above any preset: a config.json of 10^9 layers made the search loop for hours (it
    #: enumerates pipelines of up to one stage per layer), and a hidden size of 10^12 overflowed the int64
    #: parameter counts (a traceback).
    num_layers: int = bounded(1024, "1,024 layers is 8x the deepest preset (Megatron-LM's 1T GPT: 128) and above "
                                    "DeepNet's 1,000-layer record", gt=0)
    hidden_size: int = bounded(2**17, "131,072 is 5x the widest preset (Megatron-LM's 1T GPT: 25,600)", gt=0)
    num_attention_heads: int = bounded(2**14, "16,384 heads is 100x the most of any preset (Megatron-LM's 1T GPT: "
                                              "160)", gt=0)
    num_kv_heads: int = Field(gt=0)
    head_dim: int = bounded(2**12, _LARGEST_HEAD, gt=0)
    ffn_hidden_size: int = bounded(2**20, _WIDEST_MLP, gt=0)
    vocab_size: int = bounded(2**24, "16,777,216 tokens is 64x the largest vocabulary of any preset (Gemma 3: "
                                     "262,208)", gt=0)
    max_seq_len: int = bounded(2**30, "1,073,741,824 positions is 100x the longest context of any preset (Llama 4 "
                                      "Scout: 10,485,760)", gt=0)
    gated_mlp: bool
    norm: Literal["layernorm", "rmsnorm"]
    norm_bias: bool = True
    post_norms: bool = False
    linear_bias: bool
    learned_positions: int = Field(ge=0)
    alibi: bool = False
    tied_embeddings: bool
    dropout: bool
    softmax_fp32: bool = False
    v_head_dim: int = bounded(2**12, _LARGEST_HEAD, default=0, ge=0)
    qkv_bias: bool = False
    qk_norm: bool = False
    attention_sinks: bool = False
    sliding_window: int = Field(0, ge=0)
    sliding_window_layers: int = Field(0, ge=0)
    q_lora_rank: int = bounded(2**17, _WIDEST_RANK, default=0, ge=0)
    kv_lora_rank: int = bounded(2**17, _WIDEST_RANK, default=0, ge=0)
    qk_rope_head_dim: int = Field(0, ge=0)
    #: At most 2^20: PEER (He 2024, "Mixture of A Million Experts") has 1,048,576; fuzz found 1e15 experts looping
    #: the EP divisor search for minutes.
    num_experts: int = bounded(2**20, "1,048,576 experts is PEER's (He 2024, \"Mixture of A Million Experts\"), "
                                      "the most published", default=0, ge=0)
    experts_per_token: int = Field(0, ge=0)
    router_renormalize: bool = True
    expert_ffn_hidden_size: int = bounded(2**20, _WIDEST_MLP, default=0, ge=0)
    shared_expert_ffn_hidden_size: int = bounded(2**20, _WIDEST_MLP, default=0, ge=0)
    shared_expert_gate: bool = False
    first_dense_layers: int = Field(0, ge=0)
    moe_layer_step: int = Field(1, gt=0)
    mtp_layers: int = Field(0, ge=0)
    published_parameters: int | None = None
    published_active_parameters: int | None = None
    source: str = ""

    @model_validator(mode="after")
    def _check(self) -> "ModelSpec":
        if self.num_attention_heads % self.num_kv_heads:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})"
            )
        if self.num_experts:
            if not 0 < self.experts_per_token <= self.num_experts:
                raise ValueError(f"experts_per_token ({self.experts_per_token}) must be in 1..num_experts "
                                 f"({self.num_experts})")
            if not self.expert_ffn_hidden_size:
                raise ValueError("a MoE model needs expert_ffn_hidden_size > 0")
            if not self.num_moe_layers:
                raise ValueError(f"no MoE layer: first_dense_layers ({self.first_dense_layers}) and moe_layer_step "
                                 f"({self.moe_layer_step}) leave all {self.num_layers} layers dense")
        if self.sliding_window_layers > self.num_layers:
            raise ValueError(f"sliding_window_layers ({self.sliding_window_layers}) > num_layers ({self.num_layers})")
        if self.kv_lora_rank and self.qk_rope_head_dim >= self.head_dim:
            raise ValueError(f"qk_rope_head_dim ({self.qk_rope_head_dim}) must be below head_dim ({self.head_dim})")
        return self

    @property
    def is_moe(self) -> bool:
        """The model has routed experts."""
        return self.num_experts > 0

    @property
    def is_mla(self) -> bool:
        """The model uses multi-head latent attention."""
        return self.kv_lora_rank > 0

    def is_moe_layer(self, i: int) -> bool:
        """Layer ``i`` (0-based) has a MoE MLP (module doc)."""
        return self.is_moe and i >= self.first_dense_layers and (i + 1) % self.moe_layer_step == 0

    @property
    def num_moe_layers(self) -> int:
        """Layers with a MoE MLP; the other ``num_layers - num_moe_layers`` have a dense MLP."""
        return sum(self.is_moe_layer(i) for i in range(self.num_layers))

    @property
    def kv_dim(self) -> int:
        """Width of the K projection output: g x head_dim (also of V unless ``v_head_dim`` differs)."""
        return self.num_kv_heads * self.head_dim

    @property
    def v_dim(self) -> int:
        """Width of the V projection output, and of the attention output: g x v_head_dim."""
        return self.num_kv_heads * (self.v_head_dim or self.head_dim)

    @property
    def attn_out_dim(self) -> int:
        """Width of the attention output, the input of the output projection: a x v_head_dim."""
        return self.num_attention_heads * (self.v_head_dim or self.head_dim)

    @property
    def q_dim(self) -> int:
        """Width of the Q projection output: a x head_dim (= h for standard models)."""
        return self.num_attention_heads * self.head_dim

    def padded_vocab_size(self, multiple: int = 128) -> int:
        """Vocabulary padded up to a multiple of ``multiple`` (Megatron-LM pads to 128 x TP; we pad to 128)."""
        return -(-self.vocab_size // multiple) * multiple


_Int = StrictInt | None
_Float = Annotated[float, Strict()] | None


class _MPTAttnConfig(BaseModel):
    """The keys of an MPT ``attn_config`` that hetplan reads, typed (llm-foundry ``attn_config_defaults``)."""

    model_config = ConfigDict(extra="allow", frozen=True)

    attn_type: str | None = None
    kv_n_heads: _Int = None
    qk_ln: StrictBool | None = None
    alibi: StrictBool | None = None
    attn_pdrop: _Float = None


class _MPTFFNConfig(BaseModel):
    """The keys of an MPT ``ffn_config`` that hetplan reads, typed (llm-foundry ``ffn_config_defaults``)."""

    model_config = ConfigDict(extra="allow", frozen=True)

    ffn_type: str | None = None
    ffn_hidden_size: _Int = None


class HFConfig(BaseModel):
    """The fields of a Hugging Face ``config.json`` that hetplan reads, with their types: the one place a config
    is validated, so that a bad value is reported by field name and expected type (``hidden_size = "4096"``:
    "expected an integer"). Other keys are kept and ignored. ``null`` counts as absent (HF writes ``null`` for
    unset optional fields)."""

    model_config = ConfigDict(extra="allow", frozen=True)

    model_type: str | None = None
    hidden_size: _Int = None
    n_embd: _Int = None
    n_embed: _Int = None
    num_hidden_layers: _Int = None
    n_layer: _Int = None
    num_attention_heads: _Int = None
    n_head: _Int = None
    num_key_value_heads: _Int = None
    head_dim: _Int = None
    vocab_size: _Int = None
    intermediate_size: _Int = None
    intermediate_size_mlp: _Int = None
    n_inner: _Int = None
    ffn_hidden_size: _Int = None
    ffn_dim: _Int = None
    n_positions: _Int = None
    max_position_embeddings: _Int = None
    seq_length: _Int = None
    word_embed_proj_dim: _Int = None
    sliding_window: _Int = None
    use_sliding_window: StrictBool | None = None
    sliding_window_pattern: _Int = None
    max_window_layers: _Int = None
    layer_types: list[str] | None = None
    num_local_experts: _Int = None
    num_experts: _Int = None
    n_routed_experts: _Int = None
    num_experts_per_tok: _Int = None
    norm_topk_prob: StrictBool | None = None
    moe_intermediate_size: _Int = None
    shared_expert_intermediate_size: _Int = None
    n_shared_experts: _Int = None
    first_k_dense_replace: _Int = None
    num_nextn_predict_layers: _Int = None
    moe_layer_freq: _Int = None
    decoder_sparse_step: _Int = None
    interleave_moe_layer_step: _Int = None
    mlp_only_layers: list[StrictInt] | None = None
    q_lora_rank: _Int = None
    kv_lora_rank: _Int = None
    qk_rope_head_dim: _Int = None
    qk_nope_head_dim: _Int = None
    v_head_dim: _Int = None
    tie_word_embeddings: StrictBool | None = None
    attention_bias: StrictBool | None = None
    mlp_bias: StrictBool | None = None
    enable_bias: StrictBool | None = None
    attention_softmax_in_fp32: StrictBool | None = None
    attention_dropout: _Float = None
    hidden_dropout: _Float = None
    attn_pdrop: _Float = None
    dropout: _Float = None
    text_config: dict | None = None
    # MPT (llm-foundry MPTConfig)
    d_model: _Int = None
    n_heads: _Int = None
    n_layers: _Int = None
    expansion_ratio: StrictInt | Annotated[float, Strict()] | None = None
    max_seq_len: _Int = None
    no_bias: StrictBool | None = None
    learned_pos_emb: StrictBool | None = None
    norm_type: str | None = None
    attn_config: _MPTAttnConfig | None = None
    ffn_config: _MPTFFNConfig | None = None
    resid_pdrop: _Float = None
    emb_pdrop: _Float = None
    published_parameters: _Int = None
    published_active_parameters: _Int = None
    source: str | None = None


_EXPECTED = {"int_type": "an integer", "bool_type": "true or false", "float_type": "a number",
             "string_type": "a string", "list_type": "a list", "dict_type": "a JSON object",
             "model_type": "a JSON object"}


def _validated(cfg: Any, where: str = "model") -> dict:
    """``cfg`` checked against :class:`HFConfig`; returns the dict with ``null`` values dropped.

    Raises:
        HetplanError: ``cfg`` is not a JSON object, or a field has the wrong type (named, with the type expected).
    """
    if not isinstance(cfg, Mapping):
        raise HetplanError(f"a config.json must be a JSON object {{...}}, got {type(cfg).__name__}", field=where,
                           fix="give a Hugging Face config.json (an object of named fields)")
    try:
        HFConfig.model_validate(dict(cfg))
    except ValidationError as exc:
        err = exc.errors(include_url=False)[0]
        loc = ".".join(str(x) for x in err["loc"])
        expected = _EXPECTED.get(err["type"], err["msg"])
        got = err.get("input")
        raise HetplanError(f"expected {expected}, got {got!r} ({type(got).__name__})", field=f"{where}.{loc}",
                           fix="write the value as the transformers configuration class types it") from None
    return {k: v for k, v in cfg.items() if v is not None}


def _get(cfg: Mapping[str, Any], *keys: str, default: Any = None) -> Any:
    return _named(cfg, *keys, default=default)[1]


def _named(cfg: Mapping[str, Any], *keys: str, default: Any = None) -> tuple[str, Any]:
    """The first of ``keys`` that ``cfg`` gives, and its value (``keys[0]`` and ``default`` when none is given).

    Raises:
        HetplanError: none of ``keys`` is given and there is no default (field: ``keys[0]``)."""
    for key in keys:
        if key in cfg and cfg[key] is not None:
            return key, cfg[key]
    if default is not None:
        return keys[0], default
    raise HetplanError(
        f"config.json lacks {' / '.join(keys)}", field=f"model.{keys[0]}", fix="add the field to the config file"
    )


#: Config names of (layers, hidden size, heads) by naming convention: the generic ``transformers`` names; GPT-2's
#: (``GPT2Config``, the generic names accepted too); MPT's (llm-foundry ``MPTConfig``).
_SHAPE_NAMES = {
    "generic": (("num_hidden_layers",), ("hidden_size",), ("num_attention_heads",)),
    "gpt2": (("n_layer", "num_hidden_layers"), ("n_embd", "hidden_size"), ("n_head", "num_attention_heads")),
    "mpt": (("n_layers",), ("d_model",), ("n_heads",)),
}


def _common_shape(cfg: Mapping[str, Any], family: str, gpt2_names: bool = False, names: str = "generic",
                  kv_heads: tuple[str, Any] | None = None, head_dim_default: int | None = None) -> dict:
    """Fields every family reads the same way: layers, hidden size, heads, KV heads (GQA; default = heads),
    head dimension (default h / a, or ``head_dim_default``: Qwen3Config's 128) and vocabulary. GPT-2 configs name
    the first three ``n_layer``, ``n_embd``, ``n_head`` (``gpt2_names``), MPT configs ``n_layers``, ``d_model``,
    ``n_heads`` (``names="mpt"``; ``kv_heads``: the config name and value of its KV heads).

    Raises:
        HetplanError: a missing field, a shape that is not positive, a hidden size the heads do not divide (without
            an explicit ``head_dim``), or heads that are not a multiple of the KV heads; named by its config field.
    """
    layer_keys, hidden_keys, head_keys = _SHAPE_NAMES["gpt2" if gpt2_names else names]
    (l_key, n_layers), (h_key, h), (a_key, a) = (_named(cfg, *layer_keys), _named(cfg, *hidden_keys),
                                                 _named(cfg, *head_keys))

    def positive(*pairs: tuple[str, Any]) -> None:
        for key, value in pairs:
            if value <= 0:
                raise HetplanError(f"{key} = {value}: must be a positive integer", field=f"model.{key}",
                                   fix=f"give the model's {key} from its released config.json")

    positive((l_key, n_layers), (h_key, h), (a_key, a))
    if cfg.get("head_dim") is None and head_dim_default is None and h % a:
        # transformers' attention splits hidden_size into heads of hidden_size // num_attention_heads and fails
        # on the rest (LlamaAttention's q_proj is num_heads * head_dim wide): h / a would be a fractional head
        raise HetplanError(f"{h_key} {h} is not divisible by {a_key} {a}", field=f"model.{h_key}",
                           fix="give head_dim explicitly, or a hidden size that is a multiple of the heads")
    g_key, g = kv_heads or _named(cfg, "num_key_value_heads", default=a)
    d_key, d = _named(cfg, "head_dim", default=head_dim_default or h // a)
    v_key, vocab = _named(cfg, "vocab_size")
    positive((g_key, g), (d_key, d), (v_key, vocab))
    if a % g:
        # grouped-query attention shares each K/V head among a / g query heads (Ainslie et al. 2023, GQA)
        raise HetplanError(f"{a_key} {a} is not a multiple of {g_key} {g}", field=f"model.{g_key}",
                           fix=f"give KV heads that divide the {a} query heads (1 = multi-query, {a} = multi-head)")
    return dict(family=family, num_layers=n_layers, hidden_size=h, num_attention_heads=a, num_kv_heads=g,
                head_dim=d, vocab_size=vocab)


def _rms_gated(cfg: Mapping[str, Any], family: str, ffn: int, **shape: Any) -> dict:
    """Shape of a Llama-style decoder (RMSNorm, SwiGLU MLP of ``ffn``, rotary positions), as the Llama, Mistral
    and all MoE families share it (``shape``: options of :func:`_common_shape`)."""
    return dict(
        _common_shape(cfg, family, **shape),
        ffn_hidden_size=ffn,
        max_seq_len=_get(cfg, "max_position_embeddings"),
        gated_mlp=True,
        norm="rmsnorm",
        linear_bias=bool(cfg.get("attention_bias", False)),
        learned_positions=0,
        tied_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        dropout=float(cfg.get("attention_dropout", 0.0) or 0.0) > 0,
    )


def _check_llama_biases(cfg: Mapping[str, Any]) -> None:
    """Refuse a Llama / Mistral config whose attention and MLP biases differ: ``LlamaConfig`` puts biases on Q, K,
    V and O with ``attention_bias`` and on the gate, up and down projections with ``mlp_bias`` (default false;
    transformers ``models/llama/modeling_llama.py``), and :class:`ModelSpec` has one switch for both,
    ``linear_bias``.

    Raises:
        HetplanError: ``attention_bias`` and ``mlp_bias`` differ."""
    attention, mlp = bool(cfg.get("attention_bias", False)), bool(cfg.get("mlp_bias", False))
    if attention != mlp:
        where = "Q, K, V and O but not the MLP" if attention else "the MLP but not Q, K, V and O"
        raise HetplanError(f"attention_bias = {str(attention).lower()} with mlp_bias = {str(mlp).lower()} "
                           f"(biases on {where}) is not modelled", field="model.mlp_bias",
                           fix="set attention_bias and mlp_bias equal (both false in the released Llama and "
                               "Mistral configs)")


def _moe_fields(cfg: Mapping[str, Any], family: str) -> dict:
    """Fields of the MoE families, read with the names of their ``transformers`` configuration classes
    (MixtralConfig, Qwen2MoeConfig, Qwen3MoeConfig, DeepseekV2Config, DeepseekV3Config, GptOssConfig,
    Llama4TextConfig)."""
    if family == "mixtral":
        f = _get(cfg, "intermediate_size")
        return dict(_rms_gated(cfg, family, f), num_experts=_get(cfg, "num_local_experts"),
                    experts_per_token=_get(cfg, "num_experts_per_tok"), expert_ffn_hidden_size=f)
    if family in ("qwen2_moe", "qwen3_moe"):
        if cfg.get("mlp_only_layers"):
            raise HetplanError("mlp_only_layers (dense layers at chosen indices) is not supported",
                               field="model.mlp_only_layers", fix="use an empty list and decoder_sparse_step")
        shared = cfg.get("shared_expert_intermediate_size", 0) if family == "qwen2_moe" else 0
        fields = _rms_gated(cfg, family, _get(cfg, "intermediate_size"))
        return dict(fields, linear_bias=False, qkv_bias=family == "qwen2_moe", qk_norm=family == "qwen3_moe",
                    num_experts=_get(cfg, "num_experts"), experts_per_token=_get(cfg, "num_experts_per_tok"),
                    expert_ffn_hidden_size=_get(cfg, "moe_intermediate_size"),
                    shared_expert_ffn_hidden_size=shared, shared_expert_gate=shared > 0,
                    router_renormalize=cfg.get("norm_topk_prob", False),
                    moe_layer_step=cfg.get("decoder_sparse_step", 1))
    if family in ("deepseek_v2", "deepseek_v3"):
        nope, rope = _get(cfg, "qk_nope_head_dim"), _get(cfg, "qk_rope_head_dim")
        f_e = _get(cfg, "moe_intermediate_size")
        fields = _rms_gated(dict(cfg, head_dim=nope + rope), family, _get(cfg, "intermediate_size"))
        return dict(fields, num_kv_heads=fields["num_attention_heads"], v_head_dim=_get(cfg, "v_head_dim"),
                    q_lora_rank=cfg.get("q_lora_rank", 0), kv_lora_rank=_get(cfg, "kv_lora_rank"),
                    qk_rope_head_dim=rope, num_experts=_get(cfg, "n_routed_experts"),
                    experts_per_token=_get(cfg, "num_experts_per_tok"), expert_ffn_hidden_size=f_e,
                    shared_expert_ffn_hidden_size=cfg.get("n_shared_experts", 0) * f_e,
                    first_dense_layers=cfg.get("first_k_dense_replace", 0),
                    moe_layer_step=cfg.get("moe_layer_freq", 1), mtp_layers=cfg.get("num_nextn_predict_layers") or 0)
    if family == "gpt_oss":
        f = _get(cfg, "intermediate_size")
        types = cfg.get("layer_types") or []
        return dict(_rms_gated(cfg, family, f), num_experts=_get(cfg, "num_local_experts"),
                    experts_per_token=_get(cfg, "num_experts_per_tok", "experts_per_token"),
                    expert_ffn_hidden_size=f, attention_sinks=True,
                    sliding_window=cfg.get("sliding_window", 0) if types else 0,
                    sliding_window_layers=sum(t == "sliding_attention" for t in types))
    # llama4: the text part of Llama4Config (text_config) or a Llama4TextConfig
    f_e = _get(cfg, "intermediate_size")
    return dict(_rms_gated(cfg, "llama4", cfg.get("intermediate_size_mlp", f_e)),
                num_experts=_get(cfg, "num_local_experts"), experts_per_token=_get(cfg, "num_experts_per_tok"),
                expert_ffn_hidden_size=f_e, shared_expert_ffn_hidden_size=f_e,
                moe_layer_step=cfg.get("interleave_moe_layer_step", 1))


def _qwen_window(cfg: Mapping[str, Any], num_layers: int) -> dict:
    """Sliding-window layers of a Qwen2 / Qwen3 dense config: none unless ``use_sliding_window`` (false in the
    released configs) with a ``sliding_window``; then the layers ``layer_types`` marks ``sliding_attention``, or
    without ``layer_types`` the layers from ``max_window_layers`` on (default 28) — transformers
    ``models/qwen2/configuration_qwen2.py`` and ``models/qwen3/configuration_qwen3.py``, which set the window to
    None without ``use_sliding_window``, and ``Qwen2Attention`` / ``Qwen3Attention``, which apply it only on
    ``sliding_attention`` layers."""
    window = cfg.get("sliding_window") or 0
    if not (cfg.get("use_sliding_window") and window):
        return {}
    types = cfg.get("layer_types") or ["sliding_attention" if i >= cfg.get("max_window_layers", 28)
                                       else "full_attention" for i in range(num_layers)]
    n = sum(t == "sliding_attention" for t in types)
    return dict(sliding_window=window, sliding_window_layers=n) if n else {}


#: MPT ``norm_type`` values (llm-foundry ``llmfoundry/models/layers/norm.py`` ``NORM_CLASS_REGISTRY``) by the
#: norm they compute; the low-precision and Triton variants only change the kernel's dtype.
MPT_NORMS = {"layernorm": "layernorm", "low_precision_layernorm": "layernorm", "rmsnorm": "rmsnorm",
             "low_precision_rmsnorm": "rmsnorm", "triton_rmsnorm": "rmsnorm"}
#: MPT ``ffn_config.ffn_type`` values hetplan models: ``mptmlp`` (up, GeLU, down; the default) and
#: ``te_ln_mlp`` (Transformer Engine's LayerNormMLP: the same MLP with the block's second LayerNorm fused in),
#: ``mptglu`` (gate, up, down: a gated MLP; llm-foundry ``llmfoundry/models/layers/ffn.py``).
MPT_FFN_TYPES = ("mptmlp", "te_ln_mlp", "mptglu")


def _mpt_fields(cfg: Mapping[str, Any]) -> dict:
    """An MPT ``config.json`` (llm-foundry ``llmfoundry/models/mpt/configuration_mpt.py`` ``MPTConfig``; the
    blocks of ``llmfoundry/models/mpt/modeling_mpt.py``, ``layers/attention.py``, ``layers/ffn.py``; defaults of
    v0.3.0): ``d_model``, ``n_heads``, ``n_layers``, an MLP of ``expansion_ratio · d_model`` (GeLU, not gated;
    ``ffn_config.ffn_hidden_size`` overrides it), LayerNorm (``norm_type``), biases on every linear and norm unless
    ``no_bias``, a learned position table of ``max_seq_len`` rows (``learned_pos_emb``; none under
    ``attn_config.alibi``, which sets it off), input and output embeddings always tied (``MPTForCausalLM``
    refuses untied ones), fused ``Wqkv`` of ``d_model + 2·kv_n_heads·head_dim`` outputs (``attn_type``
    ``multihead_attention``: ``kv_n_heads = n_heads``, ``multiquery_attention``: 1, ``grouped_query_attention``:
    ``attn_config.kv_n_heads``) — the same FLOPs as separate Q, K, V projections. Dropout: ``attn_pdrop`` or
    ``resid_pdrop`` above 0 (0 by default).

    Raises:
        HetplanError: an ``attn_config`` / ``ffn_config`` that is not an object or names an attention type, FFN
            type or norm hetplan does not model, ``qk_ln`` (a LayerNorm over all of Q and over all of K, not
            per head), or an ``expansion_ratio`` that does not give a whole MLP width.
    """
    attn, ffn = cfg.get("attn_config") or {}, cfg.get("ffn_config") or {}
    attn_type = attn.get("attn_type", "multihead_attention")
    kv = {"multihead_attention": None, "multiquery_attention": ("attn_config.kv_n_heads", 1),
          "grouped_query_attention": ("attn_config.kv_n_heads", attn.get("kv_n_heads"))}
    if attn_type not in kv:
        raise HetplanError(f"attn_config.attn_type {attn_type!r} is not an MPT attention type",
                           field="model.attn_config.attn_type", fix=f"use one of {', '.join(kv)}")
    kv_heads = kv[attn_type]
    if kv_heads is not None and kv_heads[1] is None:
        raise HetplanError("grouped_query_attention needs attn_config.kv_n_heads", field="model.attn_config.kv_n_heads",
                           fix="give the number of key/value heads")
    if attn.get("qk_ln"):
        raise HetplanError("attn_config.qk_ln (a LayerNorm over all of Q and over all of K) is not modelled",
                           field="model.attn_config.qk_ln", fix="set qk_ln to false, or plan a model without it")
    ffn_type = ffn.get("ffn_type", "mptmlp")
    if ffn_type not in MPT_FFN_TYPES:
        raise HetplanError(f"ffn_config.ffn_type {ffn_type!r} is not modelled (MoE FFNs included)",
                           field="model.ffn_config.ffn_type", fix=f"use one of {', '.join(MPT_FFN_TYPES)}")
    norm_type = cfg.get("norm_type", "low_precision_layernorm")
    if norm_type not in MPT_NORMS:
        raise HetplanError(f"norm_type {norm_type!r} is not an MPT norm", field="model.norm_type",
                           fix=f"use one of {', '.join(MPT_NORMS)}")
    shape = _common_shape(cfg, "mpt", names="mpt", kv_heads=kv_heads)
    ratio = _get(cfg, "expansion_ratio", default=4)
    width = ffn.get("ffn_hidden_size") or ratio * shape["hidden_size"]
    if width <= 0 or width != int(width):
        raise HetplanError(f"expansion_ratio {ratio} x d_model {shape['hidden_size']} = {width} is not a positive "
                           "whole MLP width", field="model.expansion_ratio",
                           fix="give an expansion_ratio that makes a whole width, or ffn_config.ffn_hidden_size")
    alibi = bool(attn.get("alibi", False))
    learned = bool(cfg.get("learned_pos_emb", True)) and not alibi
    n_pos = _get(cfg, "max_seq_len", default=2048)
    no_bias = bool(cfg.get("no_bias", False))
    drop = max(float(attn.get("attn_pdrop", 0.0) or 0.0), float(cfg.get("resid_pdrop", 0.0) or 0.0))
    return dict(shape, ffn_hidden_size=int(width), max_seq_len=n_pos,
                gated_mlp=ffn_type == "mptglu", norm=MPT_NORMS[norm_type], norm_bias=not no_bias,
                linear_bias=not no_bias, learned_positions=n_pos if learned else 0, alibi=alibi,
                tied_embeddings=True, dropout=drop > 0)


def _dense_fields(cfg: Mapping[str, Any], model_type: str) -> dict:
    """Fields of the dense families beyond Llama's, each as its ``transformers`` modelling file builds it:

    * ``qwen2`` (Qwen2, Qwen2.5; ``models/qwen2/modeling_qwen2.py``): Llama's block (RMSNorm, SwiGLU, rotary) with
      biases on the Q, K and V projections only (``Qwen2Attention``: ``o_proj`` has none, the MLP has none);
      ``tie_word_embeddings`` as configured (true in the small releases); windows of :func:`_qwen_window`.
    * ``qwen3`` (Qwen3 dense; ``models/qwen3/modeling_qwen3.py``): Llama's attention without biases plus an RMSNorm
      of ``head_dim`` weights on each head's Q and on each head's K (``Qwen3Attention.q_norm`` / ``k_norm``);
      ``head_dim`` explicit (Qwen3Config's default 128, which need not be ``hidden_size / heads``: Qwen3-32B has
      64 heads of 128 on a 5,120 hidden size).
    * ``phi3`` (Phi-3, Phi-4-mini; ``models/phi3/modeling_phi3.py``): Llama's shapes with Q, K, V fused into one
      ``qkv_proj`` and gate and up into one ``gate_up_proj`` (the same parameters and FLOPs as separate ones), no
      biases; a configured ``sliding_window`` applies on every layer (``Phi3Attention`` passes it to each layer's
      attention); dropout ``resid_pdrop`` / ``attention_dropout``.

    * ``gemma2`` (Gemma 2; ``models/gemma2/modeling_gemma2.py``) and ``gemma3`` (Gemma 3's text model,
      ``gemma3_text``; ``models/gemma3/modeling_gemma3.py``): Llama's projections without biases, ``head_dim``
      explicit (default 256; Gemma-2-27B: 32 heads of 128 on a 4,608 hidden size), a gated MLP with a tanh-GeLU
      gate (GeGLU; priced as SwiGLU: the same GEMMs, its element-wise work not told apart), four RMSNorms per layer
      (``post_norms``), embeddings tied by default (the input embedding's ``sqrt(h)`` scale has no parameters);
      Gemma 3 adds per-head Q/K RMSNorms (``qk_norm``). Sliding windows of ``sliding_window`` tokens on the
      layers ``layer_types`` marks ``sliding_attention``, or without it on every layer but each ``pattern``-th
      (Gemma 2: every other layer from the first, pattern 2; Gemma 3: ``sliding_window_pattern``, 6: five local
      layers to one global). Not priced: the attention-score and final-logit ``tanh`` soft-capping (Gemma 2),
      element-wise work on the scores and logits like ALiBi's bias (docs/estimator.md).

    Raises:
        HetplanError: a Qwen3 or Gemma config with ``attention_bias`` (biases on Q, K, V and O but not the MLP:
            not modelled); a ``sliding_window_pattern`` that is not positive.
    """
    if model_type == "qwen2":
        fields = _rms_gated(cfg, "qwen2", _get(cfg, "intermediate_size"))
        return dict(fields, linear_bias=False, qkv_bias=True, **_qwen_window(cfg, fields["num_layers"]))
    if model_type == "qwen3":
        if cfg.get("attention_bias"):
            raise HetplanError("attention_bias = true (biases on Q, K, V and O, none in the MLP) is not modelled "
                               "for qwen3", field="model.attention_bias",
                               fix="set attention_bias to false, as the released Qwen3 configs do")
        fields = _rms_gated(cfg, "qwen3", _get(cfg, "intermediate_size"), head_dim_default=128)
        return dict(fields, qk_norm=True, **_qwen_window(cfg, fields["num_layers"]))
    if model_type in ("gemma2", "gemma3"):
        if cfg.get("attention_bias"):
            raise HetplanError(f"attention_bias = true (biases on Q, K, V and O, none in the MLP) is not modelled "
                               f"for {model_type}", field="model.attention_bias",
                               fix="set attention_bias to false, as the released Gemma configs do")
        fields = _rms_gated(cfg, model_type, _get(cfg, "intermediate_size"), head_dim_default=256)
        pattern = 2 if model_type == "gemma2" else cfg.get("sliding_window_pattern", 6)
        if pattern <= 0:
            raise HetplanError(f"sliding_window_pattern = {pattern}: must be a positive integer",
                               field="model.sliding_window_pattern", fix="give 6, Gemma 3's pattern (5 local : 1 "
                               "global), or list layer_types")
        types = cfg.get("layer_types") or ["sliding_attention" if (i + 1) % pattern else "full_attention"
                                           for i in range(fields["num_layers"])]
        n_sw = sum(t == "sliding_attention" for t in types)
        return dict(fields, tied_embeddings=bool(cfg.get("tie_word_embeddings", True)), post_norms=True,
                    qk_norm=model_type == "gemma3", sliding_window=cfg.get("sliding_window", 4096) if n_sw else 0,
                    sliding_window_layers=n_sw)
    fields = _rms_gated(cfg, "phi3", _get(cfg, "intermediate_size"))
    window = cfg.get("sliding_window") or 0
    drop = max(float(cfg.get("attention_dropout", 0.0) or 0.0), float(cfg.get("resid_pdrop", 0.0) or 0.0))
    return dict(fields, linear_bias=False, dropout=drop > 0, sliding_window=window,
                sliding_window_layers=fields["num_layers"] if window else 0)


def _check_family_fields(cfg: Mapping[str, Any], model_type: str, fields: dict) -> None:
    """Refuse family fields whose 0 or odd value :class:`ModelSpec` would silently read as something else: an
    MoE family with no experts (planned as dense), DeepSeek's MLA without its latent (``kv_lora_rank = 0`` reads as
    no MLA) or with ``v_head_dim = 0`` (reads as ``head_dim``), and gpt-oss ``layer_types`` of unknown kinds or of
    another length than the layers (HF ``GptOssConfig`` lists one type per layer: ``sliding_attention`` or
    ``full_attention``).

    Raises:
        HetplanError: naming the config field and the fix."""
    if model_type in MOE_FAMILIES and not fields.get("num_experts"):
        key = {"deepseek_v2": "n_routed_experts", "deepseek_v3": "n_routed_experts", "qwen2_moe": "num_experts",
               "qwen3_moe": "num_experts"}.get(model_type, "num_local_experts")
        raise HetplanError(f"a {model_type} config with {key} = {fields.get('num_experts')} has no experts: it "
                           "would be planned as a dense model", field=f"model.{key}",
                           fix="give the number of routed experts, or a dense model_type (e.g. llama)")
    if model_type in ("deepseek_v2", "deepseek_v3"):
        for key in ("kv_lora_rank", "v_head_dim"):
            if not fields.get(key):
                raise HetplanError(f"{key} = {fields.get(key)}: DeepSeek's multi-head latent attention needs a "
                                   f"positive {key} (0 would be read as {'no MLA' if key == 'kv_lora_rank' else 'head_dim'})",
                                   field=f"model.{key}", fix=f"give the model's {key} (DeepSeek-V3: "
                                   f"{512 if key == 'kv_lora_rank' else 128})")
    if model_type in ("gpt_oss", "qwen2", "qwen3", "gemma2", "gemma3") and cfg.get("layer_types"):
        types = cfg["layer_types"]
        kinds = ("sliding_attention", "full_attention")
        bad = [t for t in types if t not in kinds]
        if bad or len(types) != fields["num_layers"]:
            what = f"unknown kind {bad[0]!r}" if bad else f"{len(types)} entries for {fields['num_layers']} layers"
            raise HetplanError(f"layer_types has {what}", field="model.layer_types",
                               fix=f"list one of {', '.join(kinds)} per layer, or remove layer_types")


#: Longest sequence of a model with ALiBi positions (BLOOM) whose config names none: ALiBi adds a distance bias to
#: the scores and has no position table to run out of (Press et al. ICLR 2022, "Train Short, Test Long").
ALIBI_MAX_SEQ_LEN = 1 << 20

#: ``Gemma3TextConfig``'s defaults of the shapes (transformers ``models/gemma3/configuration_gemma3.py``): the
#: ``text_config`` of a released Gemma 3 vision model leaves out what equals them (``save_pretrained`` writes the
#: difference to the class defaults), e.g. Gemma-3-4B's 8 heads of 256.
GEMMA3_TEXT_DEFAULTS = {"vocab_size": 262208, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
                        "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256,
                        "max_position_embeddings": 131072, "sliding_window": 4096, "sliding_window_pattern": 6}
#: The dense ``model_type`` values :func:`from_hf_config` reads (``bloom`` reads as ``megatron_gpt``).
DENSE_FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "phi3", "gemma2", "gemma3_text", "gpt2", "gpt_neox", "opt",
                  "megatron_gpt", "bloom", "mpt")
MOE_FAMILIES = ("mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v2", "deepseek_v3", "gpt_oss", "llama4")


def from_hf_config(cfg: Any, name: str) -> ModelSpec:
    """Build a :class:`ModelSpec` from a Hugging Face ``config.json`` dictionary.

    Field names follow the ``transformers`` configuration classes of each family (LlamaConfig, MistralConfig,
    GPT2Config, GPTNeoXConfig, OPTConfig, BloomConfig and the MoE ones of :func:`_moe_fields`); a Llama 4 multimodal config
    is read from its ``text_config``. Extra keys ``published_parameters``, ``published_active_parameters`` and
    ``source`` are read if present.

    Raises:
        HetplanError: not a JSON object, a field of the wrong type, unsupported ``model_type``, a missing or
            invalid field.
    """
    cfg = _validated(cfg)
    model_type = cfg.get("model_type")
    extra = {
        "published_parameters": cfg.get("published_parameters"),
        "published_active_parameters": cfg.get("published_active_parameters"),
        "source": cfg.get("source", ""),
    }
    if model_type == "llama4" and "text_config" in cfg:
        cfg = _validated(cfg["text_config"], "model.text_config")
        model_type = "llama4"
    if model_type == "llama4_text":
        model_type = "llama4"
    if model_type == "gemma3" and "text_config" in cfg:  # Gemma3Config: the language model of a vision release
        cfg = {**GEMMA3_TEXT_DEFAULTS, **_validated(cfg["text_config"], "model.text_config")}
    if model_type == "gemma3_text":
        model_type = "gemma3"
    if model_type in ("llama", "mistral"):
        _check_llama_biases(cfg)
        fields = _rms_gated(cfg, model_type, _get(cfg, "intermediate_size"))
    elif model_type in ("qwen2", "qwen3", "phi3", "gemma2", "gemma3"):
        fields = _dense_fields(cfg, model_type)
    elif model_type == "mpt":
        fields = _mpt_fields(cfg)
    elif model_type in MOE_FAMILIES:
        fields = _moe_fields(cfg, model_type)
    elif model_type in ("gpt2", "megatron_gpt"):
        n_pos = _get(cfg, "n_positions", "max_position_embeddings")
        shape = _common_shape(cfg, model_type, gpt2_names=True)
        fields = dict(
            shape,
            ffn_hidden_size=_get(cfg, "n_inner", "ffn_hidden_size", default=4 * shape["hidden_size"]),
            max_seq_len=n_pos,
            gated_mlp=False,
            norm="layernorm",
            linear_bias=True,
            learned_positions=n_pos,
            tied_embeddings=bool(cfg.get("tie_word_embeddings", True)),
            dropout=float(_get(cfg, "attn_pdrop", "attention_dropout", default=0.1)) > 0,
            softmax_fp32=bool(cfg.get("attention_softmax_in_fp32", False)),
        )
    elif model_type == "bloom":
        # BloomConfig (transformers models/bloom/configuration_bloom.py): n_layer, n_head, hidden_size (n_embed
        # accepted), vocab_size. The block is Megatron's GPT block as BigScience's Megatron-DeepSpeed ran it (4h
        # GeLU MLP, LayerNorm, biases, tied input and output embeddings) with ALiBi instead of a position table
        # (bigscience train/tr11-176B-ml: --position-embedding-type alibi), so any sequence length is allowed
        # unless the config names its seq_length; the embedding LayerNorm (2h parameters) is left out.
        shape = _common_shape(dict(cfg, hidden_size=cfg.get("hidden_size", cfg.get("n_embed"))), "megatron_gpt",
                              gpt2_names=True)
        fields = dict(
            shape,
            ffn_hidden_size=4 * shape["hidden_size"],
            max_seq_len=cfg.get("seq_length", ALIBI_MAX_SEQ_LEN),
            gated_mlp=False,
            norm="layernorm",
            linear_bias=True,
            learned_positions=0,
            alibi=True,
            tied_embeddings=bool(cfg.get("tie_word_embeddings", True)),
            dropout=max(float(cfg.get("hidden_dropout", 0.0)), float(cfg.get("attention_dropout", 0.0))) > 0,
            softmax_fp32=bool(cfg.get("attention_softmax_in_fp32", True)),  # BloomConfig's default
        )
    elif model_type == "gpt_neox":
        shape = _common_shape(cfg, model_type)
        fields = dict(
            shape,
            ffn_hidden_size=_get(cfg, "intermediate_size", default=4 * shape["hidden_size"]),
            max_seq_len=_get(cfg, "max_position_embeddings"),
            gated_mlp=False,
            norm="layernorm",
            linear_bias=True,
            learned_positions=0,
            tied_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            dropout=float(cfg.get("attention_dropout", 0.0) or 0.0) > 0,
        )
    elif model_type == "opt":
        shape = _common_shape(cfg, model_type)
        n_pos = _get(cfg, "max_position_embeddings")
        if cfg.get("word_embed_proj_dim", shape["hidden_size"]) != shape["hidden_size"]:
            raise HetplanError(
                "OPT configs with word_embed_proj_dim != hidden_size (OPT-350m) are not supported",
                field="model.word_embed_proj_dim",
                fix="use another OPT size",
            )
        fields = dict(
            shape,
            ffn_hidden_size=_get(cfg, "ffn_dim"),
            max_seq_len=n_pos,
            gated_mlp=False,
            norm="layernorm",
            linear_bias=bool(cfg.get("enable_bias", True)),
            learned_positions=n_pos + 2,  # OPT's learned positions are offset by 2 (OPTLearnedPositionalEmbedding)
            tied_embeddings=bool(cfg.get("tie_word_embeddings", True)),
            dropout=float(cfg.get("dropout", 0.1) or 0.0) > 0,
        )
    else:
        raise HetplanError(
            f"unsupported model_type {model_type!r}",
            field="model.model_type",
            fix="use one of " + ", ".join(DENSE_FAMILIES + MOE_FAMILIES),
        )
    _check_family_fields(cfg, model_type, fields)
    try:
        return ModelSpec(name=name, **fields, **extra)
    except ValidationError as exc:
        err = exc.errors(include_url=False)[0]
        if not err["loc"]:  # a check across fields: its message names them
            raise HetplanError(err["msg"].removeprefix("Value error, "), field="model",
                               fix="check the config.json shapes") from None
        # one shape: named by the config.json key it was read from (ffn_hidden_size is Llama's intermediate_size),
        # with the reason of its bound
        spec_field = str(err["loc"][0])
        key = next((k for k in _CONFIG_KEYS.get(spec_field, ()) if cfg.get(k) is not None), spec_field)
        raise HetplanError(validation_message(exc, "model", ModelSpec).message, field=f"model.{key}",
                           fix="give the model's shapes from its released config.json") from None


#: The config.json keys each :class:`ModelSpec` shape is read from, by family naming convention (the first one a
#: config gives names the shape in an error); a shape not listed has the config's name.
_CONFIG_KEYS = {
    "num_layers": ("num_hidden_layers", "n_layer", "n_layers"),
    "hidden_size": ("hidden_size", "n_embd", "d_model"),
    "num_attention_heads": ("num_attention_heads", "n_head", "n_heads"),
    "head_dim": ("head_dim", "num_attention_heads", "n_head", "n_heads"),  # hidden_size / heads when not given
    "ffn_hidden_size": ("intermediate_size", "n_inner", "ffn_dim", "ffn_hidden_size", "expansion_ratio"),
    "max_seq_len": ("max_position_embeddings", "n_positions", "seq_length", "max_seq_len"),
    "expert_ffn_hidden_size": ("moe_intermediate_size", "intermediate_size"),
    "shared_expert_ffn_hidden_size": ("shared_expert_intermediate_size", "moe_intermediate_size"),
    "num_experts": ("num_local_experts", "num_experts", "n_routed_experts"),
    "experts_per_token": ("num_experts_per_tok", "experts_per_token"),
}


def _presets_dir():
    return resources.files("hetplan.model").joinpath("presets")


@lru_cache(maxsize=None)
def list_presets() -> tuple[str, ...]:
    """Names of the bundled model presets (file stems of ``presets/*.json``), sorted."""
    return tuple(sorted(p.name[:-5] for p in _presets_dir().iterdir() if p.name.endswith(".json")))


def _load_any(name_or_path: str) -> ModelSpec:
    if not name_or_path.strip():  # Path("") is the current folder: "model: . is a directory"
        raise HetplanError("no model given (the name is empty)", field="model",
                           fix="give a preset name (hetplan catalog models) or the path of a config.json")
    path = Path(name_or_path)
    try:
        exists = path.exists()
    except OSError:  # a name longer than the OS allows for a path (ENAMETOOLONG) is no file: a preset name
        exists = False
    if name_or_path.endswith(".json") or exists:
        if not exists:
            raise HetplanError(f"model file {name_or_path} does not exist", field="model", fix="give a path to a config.json or a preset name")
        # read every time, cached on the text: an edited config.json is read anew
        return _from_text(read_text(path, "model"), name_or_path,
                          path.stem if path.stem != "config" else path.parent.name or "model")
    return _load_preset(name_or_path)


def _preset_key(name: str) -> str:
    return name.strip().lower().replace("_", "-")


#: Llama 3.1's release names: the ``llama3-*`` presets are the Llama 3.1 configs (128K context; their ``source``).
LLAMA31_NAMES = {"llama3.1-8b": "llama3-8b", "llama3.1-70b": "llama3-70b", "llama3.1-405b": "llama3-405b"}


@lru_cache(maxsize=1)
def preset_aliases() -> dict[str, str]:
    """Other names of the presets (normalised like preset names: lower case, ``_`` as ``-``) -> preset: the Hugging
    Face repository id whose ``config.json`` a preset is (the first word of its ``source``, e.g.
    ``meta-llama/llama-3.1-70b``), that id without its organisation (``llama-3.1-70b``), and
    :data:`LLAMA31_NAMES`. A name that is a preset's own stays that preset."""
    out = dict(LLAMA31_NAMES)
    for name in list_presets():
        words = str(json.loads(_presets_dir().joinpath(f"{name}.json").read_text()).get("source", "")).split()
        if len(words) > 1 and words[0].count("/") == 1 and words[1].startswith("config.json"):
            repo = _preset_key(words[0])
            for alias in (repo, repo.split("/")[1]):
                out.setdefault(alias, name)
    return {k: v for k, v in out.items() if k not in list_presets()}


def _compact(name: str) -> str:
    """A preset name without case, spaces, hyphens and underscores: ``Llama 3 8B``, ``llama-3-8b`` and
    ``llama3-8b`` are one name (dots stay: ``1.3b`` is not ``13b``)."""
    return re.sub(r"[\s_\-]", "", name.lower())


@lru_cache(maxsize=1)
def _compact_names() -> dict[str, str]:
    """:func:`_compact` of every preset name and alias -> preset (no two presets share one: tested)."""
    out = {_compact(a): n for a, n in preset_aliases().items()}
    out.update({_compact(n): n for n in list_presets()})
    return out


@lru_cache(maxsize=256)
def _load_preset(name_or_path: str) -> ModelSpec:
    key = _compact_names().get(_compact(name_or_path), _preset_key(name_or_path))
    if key not in list_presets():
        import difflib

        close = difflib.get_close_matches(key, list_presets(), n=3, cutoff=0.4)
        hint = f"did you mean {', '.join(close)}?" if close else "run `hetplan catalog models` for the list"
        raise HetplanError(f"unknown model {name_or_path!r}", field="model", fix=hint)
    return _from_text(_presets_dir().joinpath(f"{key}.json").read_text(), name_or_path, key)


@lru_cache(maxsize=256)
def _from_text(text: str, origin: str, name: str) -> ModelSpec:
    return from_hf_config(parse_json(text, origin, "model"), name)


def load_model(name_or_path: str | Path) -> ModelSpec:
    """A bundled preset by name (case, spaces, hyphens and underscores ignored: ``"llama2-7b"``, ``"Llama 2 7B"``,
    ``"llama-2-7b"``; or its Hugging Face repository id) or a ``config.json`` path.

    Raises:
        HetplanError: an empty name, unknown preset (with suggestions), missing or unreadable file, non-UTF-8
            bytes, malformed JSON (with line), a field of the wrong type, bad fields.
    """
    return _load_any(str(name_or_path))
