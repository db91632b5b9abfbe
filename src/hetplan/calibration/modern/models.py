"""The model of a published row: dense families by name with the run's own shape (proxy runs keep their reduced
layer count), MoE models from a preset or from their ``config.json`` (``run_facts.toml``, ``[moe_models]``)."""

from __future__ import annotations

import re

from hetplan.calibration.modern.rows import NotExpressibleError, cell_int, run_facts
from hetplan.calibration.validation import gpt_model
from hetplan.errors import HetplanError
from hetplan.model.spec import ModelSpec, load_model


def row_model(r: dict) -> ModelSpec:
    """The model of a row, with the run's own layer count (proxy runs keep their reduced count).

    Families by name: Llama 2/3 (SwiGLU, RMSNorm, rotary, untied, no bias or dropout; Llama 2 vocabulary 32,000),
    Nemotron-4 (squared-ReLU MLP of 4h, no gate, LayerNorm, rotary, untied, vocabulary 256,000: Nemotron-4 15B
    report, arXiv 2402.16819 Sec. 2), GPT-3 175B as NeMo runs it (Megatron GPT: GeLU 4h MLP, learned positions,
    tied embeddings, vocabulary 50,257 padded, dropout 0.1: NeMo-Framework-Launcher ``gpt3/175b.yaml``), and the
    Megatron-LM README's GPT family (vocabulary 131,072, 4h MLP). Raises :class:`NotExpressibleError` for MoE,
    hybrid (Mamba) and models whose shape the source does not give.
    """
    name = r["model"]
    low = name.lower()
    if cell_int(r, "num_experts", 0) or "moe" in low or "mixture" in low or "a22b" in low or "gpt-oss" in low:
        return moe_model(r)
    if "mamba" in low or "nemotron-h" in low:
        raise NotExpressibleError("hybrid Mamba-Transformer: no Mamba layers in the estimator")
    L, h, a = cell_int(r, "layers"), cell_int(r, "hidden"), cell_int(r, "heads")
    s = cell_int(r, "seq_len")
    if not (L and h and a and s):
        raise NotExpressibleError("the source does not give the model's shape (layers, hidden, heads)")
    g = cell_int(r, "kv_heads", a)
    f = cell_int(r, "ffn_hidden")
    V = cell_int(r, "vocab")
    tag = re.sub(r"[^a-z0-9.]+", "-", low).strip("-")
    if "llama" in low:
        return ModelSpec(name=f"{tag}-L{L}", family="llama", num_layers=L, hidden_size=h, num_attention_heads=a,
                         num_kv_heads=g, head_dim=h // a, ffn_hidden_size=f, vocab_size=V or 32000,
                         max_seq_len=max(s, 8192), gated_mlp=True, norm="rmsnorm", linear_bias=False,
                         learned_positions=0, tied_embeddings=False, dropout=False, source=r["arch_source"])
    if "nemotron-4" in low:
        return ModelSpec(name=f"{tag}-L{L}", family="gpt_neox", num_layers=L, hidden_size=h, num_attention_heads=a,
                         num_kv_heads=g, head_dim=h // a, ffn_hidden_size=f or 4 * h, vocab_size=V or 256000,
                         max_seq_len=s, gated_mlp=False, norm="layernorm", linear_bias=False, learned_positions=0,
                         tied_embeddings=False, dropout=False, source=r["arch_source"])
    if "gpt" in low:
        return gpt_model(L, h, a, s, vocab=V or 50257)
    if low.startswith("qwen3 "):  # Qwen3 dense: its preset (QK-norm, untied above 4B), checked against the row
        spec = load_model(tag)
        if (spec.num_layers, spec.hidden_size, spec.num_attention_heads) != (L, h, a):
            raise NotExpressibleError(f"the row's shape (L {L}, h {h}, heads {a}) is not the {tag} preset's")
        return spec
    raise NotExpressibleError(f"model {name!r} has no mapping to a model spec")


#: MoE models of the rows -> model presets (``hetplan catalog models``), by a lower-case substring of the row's
#: model (``run_facts.toml`` ``[moe_models.presets]``).
MOE_PRESETS: dict[str, str] = run_facts()["moe_models"]["presets"]

#: MoE models without a preset, as ``config.json`` dictionaries (read by :func:`hetplan.model.spec.from_hf_config`;
#: ``run_facts.toml`` ``[moe_models.configs]``, each with its source: Grok-1, Llama 4 Maverick, GPT-OSS 20B).
MOE_CONFIGS: dict[str, dict] = run_facts()["moe_models"]["configs"]


def moe_model(r: dict) -> ModelSpec:
    """The preset of a MoE row (:data:`MOE_PRESETS`, else :data:`MOE_CONFIGS`) with the run's layer count;
    :class:`NotExpressibleError` when the model has no preset or the estimator has no MoE layers yet."""
    from hetplan.model.spec import from_hf_config

    low = r["model"].lower()
    preset = next((v for k, v in MOE_PRESETS.items() if k in low), None)
    config = next((k for k in MOE_CONFIGS if k in low), None)
    if preset is None and config is None:
        raise NotExpressibleError(f"MoE model {r['model']!r} has no model preset")
    try:
        m = load_model(preset) if preset else from_hf_config(MOE_CONFIGS[config], config.replace(" ", "-"))
    except HetplanError:
        raise NotExpressibleError("MoE model: the estimator has no mixture-of-experts layers yet") from None
    L = cell_int(r, "layers")
    return m if not L or L == m.num_layers else m.model_copy(update={"num_layers": L, "name": f"{m.name}-L{L}"})
