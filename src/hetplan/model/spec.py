"""Decoder-only transformer shapes, and reading them from Hugging Face ``config.json`` files.

A :class:`ModelSpec` holds only shapes; parameter, FLOP and activation counts live in
:mod:`hetplan.model.counts`. Supported ``model_type`` values: ``llama``, ``mistral``, ``gpt2``, ``gpt_neox``,
``opt``, plus ``megatron_gpt`` (the GPT shapes of Megatron-LM papers: learned positions, 4h GeLU MLP, vocab 51200).
Presets are ``config.json`` files shipped in ``hetplan/model/presets/`` (``hetplan catalog models`` lists them).
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any, Literal, Mapping

from pydantic import BaseModel, ConfigDict, Field, model_validator

from hetplan.errors import HetplanError
from hetplan.inputs import parse_json, read_text


class ModelSpec(BaseModel):
    """Shapes of a decoder-only transformer.

    Attributes:
        name: preset name or file stem.
        family: ``llama`` | ``mistral`` | ``gpt2`` | ``gpt_neox`` | ``opt`` | ``megatron_gpt``.
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
        linear_bias: linear layers have biases (GPT-2, OPT, GPT-NeoX) or not (Llama, Mistral).
        learned_positions: number of rows in a learned position-embedding table (0 for rotary).
        tied_embeddings: the output head shares the input embedding matrix.
        dropout: the model applies dropout (stores dropout masks, Korthikanti et al. 2023, Sec. 4.1).
        published_parameters: parameter count quoted by the model's authors, if any (for checks).
        source: where the shape comes from.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    family: Literal["llama", "mistral", "gpt2", "gpt_neox", "opt", "megatron_gpt"]
    num_layers: int = Field(gt=0)
    hidden_size: int = Field(gt=0)
    num_attention_heads: int = Field(gt=0)
    num_kv_heads: int = Field(gt=0)
    head_dim: int = Field(gt=0)
    ffn_hidden_size: int = Field(gt=0)
    vocab_size: int = Field(gt=0)
    max_seq_len: int = Field(gt=0)
    gated_mlp: bool
    norm: Literal["layernorm", "rmsnorm"]
    linear_bias: bool
    learned_positions: int = Field(ge=0)
    tied_embeddings: bool
    dropout: bool
    published_parameters: int | None = None
    source: str = ""

    @model_validator(mode="after")
    def _check(self) -> "ModelSpec":
        if self.num_attention_heads % self.num_kv_heads:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})"
            )
        return self

    @property
    def kv_dim(self) -> int:
        """Width of the K (and of the V) projection output: g x head_dim."""
        return self.num_kv_heads * self.head_dim

    @property
    def q_dim(self) -> int:
        """Width of the Q projection output: a x head_dim (= h for standard models)."""
        return self.num_attention_heads * self.head_dim

    def padded_vocab_size(self, multiple: int = 128) -> int:
        """Vocabulary padded up to a multiple of ``multiple`` (Megatron-LM pads to 128 x TP; we pad to 128)."""
        return -(-self.vocab_size // multiple) * multiple


def _get(cfg: Mapping[str, Any], *keys: str, default: Any = None) -> Any:
    for key in keys:
        if key in cfg and cfg[key] is not None:
            return cfg[key]
    if default is not None:
        return default
    raise HetplanError(
        f"config.json lacks {' / '.join(keys)}", field=f"model.{keys[0]}", fix="add the field to the config file"
    )


def _common_shape(cfg: Mapping[str, Any], family: str, gpt2_names: bool = False) -> dict:
    """Fields every family reads the same way: layers, hidden size, heads, KV heads (GQA; default = heads),
    head dimension (default h / a) and vocabulary. GPT-2 configs name the first three ``n_layer``, ``n_embd``,
    ``n_head`` (the HF generic names are accepted too)."""
    def alt(gpt2: str, generic: str) -> tuple[str, ...]:
        return (gpt2, generic) if gpt2_names else (generic,)

    h = _get(cfg, *alt("n_embd", "hidden_size"))
    a = _get(cfg, *alt("n_head", "num_attention_heads"))
    return dict(
        family=family,
        num_layers=_get(cfg, *alt("n_layer", "num_hidden_layers")),
        hidden_size=h,
        num_attention_heads=a,
        num_kv_heads=_get(cfg, "num_key_value_heads", default=a),
        head_dim=_get(cfg, "head_dim", default=h // a),
        vocab_size=_get(cfg, "vocab_size"),
    )


def from_hf_config(cfg: Mapping[str, Any], name: str) -> ModelSpec:
    """Build a :class:`ModelSpec` from a Hugging Face ``config.json`` dictionary.

    Field names follow the ``transformers`` configuration classes of each family (LlamaConfig, MistralConfig,
    GPT2Config, GPTNeoXConfig, OPTConfig). Extra keys ``published_parameters`` and ``source`` are read if present.

    Raises:
        HetplanError: unsupported ``model_type`` or a missing/invalid field.
    """
    model_type = cfg.get("model_type")
    extra = {
        "published_parameters": cfg.get("published_parameters"),
        "source": cfg.get("source", ""),
    }
    if model_type in ("llama", "mistral"):
        fields = dict(
            _common_shape(cfg, model_type),
            ffn_hidden_size=_get(cfg, "intermediate_size"),
            max_seq_len=_get(cfg, "max_position_embeddings"),
            gated_mlp=True,
            norm="rmsnorm",
            linear_bias=bool(cfg.get("attention_bias", False)),
            learned_positions=0,
            tied_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            dropout=float(cfg.get("attention_dropout", 0.0) or 0.0) > 0,
        )
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
            fix="use one of llama, mistral, gpt2, gpt_neox, opt, megatron_gpt",
        )
    try:
        return ModelSpec(name=name, **fields, **extra)
    except ValueError as exc:
        raise HetplanError(str(exc).splitlines()[-1] if "\n" in str(exc) else str(exc), field="model",
                           fix="check the config.json shapes") from None


def _presets_dir():
    return resources.files("hetplan.model").joinpath("presets")


@lru_cache(maxsize=None)
def list_presets() -> tuple[str, ...]:
    """Names of the bundled model presets (file stems of ``presets/*.json``), sorted."""
    return tuple(sorted(p.name[:-5] for p in _presets_dir().iterdir() if p.name.endswith(".json")))


@lru_cache(maxsize=256)
def _load_cached(name_or_path: str) -> ModelSpec:
    path = Path(name_or_path)
    if name_or_path.endswith(".json") or path.is_file():
        if not path.is_file():
            raise HetplanError(f"model file {name_or_path} does not exist", field="model", fix="give a path to a config.json or a preset name")
        text, name = read_text(path, "model"), path.stem if path.stem != "config" else path.parent.name or "model"
    else:
        key = name_or_path.strip().lower().replace("_", "-")
        if key not in list_presets():
            import difflib

            close = difflib.get_close_matches(key, list_presets(), n=3, cutoff=0.4)
            hint = f"did you mean {', '.join(close)}?" if close else "run `hetplan catalog models` for the list"
            raise HetplanError(f"unknown model {name_or_path!r}", field="model", fix=hint)
        text, name = _presets_dir().joinpath(f"{key}.json").read_text(), key
    cfg = parse_json(text, name_or_path, "model")
    if not isinstance(cfg, dict):
        raise HetplanError(f"{name_or_path} holds a JSON {type(cfg).__name__}, not a config object", field="model",
                           fix="give a Hugging Face config.json (an object of named fields)")
    return from_hf_config(cfg, name)


def load_model(name_or_path: str | Path) -> ModelSpec:
    """A bundled preset by name (case-insensitive, e.g. ``"llama2-7b"``) or a ``config.json`` path.

    Raises:
        HetplanError: unknown preset (with suggestions), missing file, malformed JSON (with line), bad fields.
    """
    return _load_cached(str(name_or_path))
