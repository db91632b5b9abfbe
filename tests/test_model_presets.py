"""Model presets (src/hetplan/model/presets/*.json): every preset loads, and its parameter count matches the
figure its authors publish."""

from __future__ import annotations

import json
from importlib import resources

import pytest

from hetplan.errors import HetplanError
from hetplan.model.counts import active_parameters, total_parameters
from hetplan.model.spec import from_hf_config, list_presets, load_model

REQUIRED = [
    "megatron-gpt-1.7b", "megatron-gpt-3.6b", "megatron-gpt-7.5b", "megatron-gpt-18b", "megatron-gpt-39b",
    "megatron-gpt-76b", "megatron-gpt-145b", "megatron-gpt-310b", "megatron-gpt-530b", "megatron-gpt-1t",
    "gpt3-1.3b", "gpt3-2.7b", "gpt3-6.7b", "gpt3-13b", "gpt3-175b",
    "llama2-7b", "llama2-13b", "llama2-70b", "llama3-8b", "llama3-70b", "llama3-405b", "llama3.2-1b", "llama3.2-3b",
    "mistral-7b",
    "open-llama-3b-v2", "opt-125m", "opt-1.3b", "opt-13b", "opt-175b", "gpt2-xl", "gpt-neox-20b",
    "mixtral-8x7b", "mixtral-8x22b", "qwen3-30b-a3b", "qwen3-235b-a22b", "deepseek-v3", "deepseek-v2-lite", "gpt-oss-120b", "gpt-oss-20b",
    "llama4-scout", "qwen2.5-7b", "qwen2.5-72b", "qwen3-0.6b", "qwen3-1.7b", "qwen3-4b", "qwen3-8b", "qwen3-14b", "qwen3-32b", "mpt-125m", "mpt-350m", "mpt-760m", "mpt-1b", "mpt-3b",
    "mpt-7b", "mpt-13b", "mpt-30b", "mpt-70b", "gemma2-9b", "gemma2-27b", "gemma3-1b", "gemma3-4b", "gemma3-12b",
    "gemma3-27b", "phi3-mini", "phi4",
]

# Narayanan et al., SC'21, Table 1: (billions as printed, heads, hidden, layers)
MEGATRON_TABLE1 = {
    "megatron-gpt-1.7b": (1.7, 24, 2304, 24),
    "megatron-gpt-3.6b": (3.6, 32, 3072, 30),
    "megatron-gpt-7.5b": (7.5, 32, 4096, 36),
    "megatron-gpt-18b": (18.4, 48, 6144, 40),
    "megatron-gpt-39b": (39.1, 64, 8192, 48),
    "megatron-gpt-76b": (76.1, 80, 10240, 60),
    "megatron-gpt-145b": (145.6, 96, 12288, 80),
    "megatron-gpt-310b": (310.1, 128, 16384, 96),
    "megatron-gpt-530b": (529.6, 128, 20480, 105),
    "megatron-gpt-1t": (1008.0, 160, 25600, 128),
}


def _raw(name: str) -> dict:
    return json.loads(resources.files("hetplan.model").joinpath(f"presets/{name}.json").read_text())


def test_required_presets_exist():
    missing = set(REQUIRED) - set(list_presets())
    assert not missing


@pytest.mark.parametrize("name", list_presets())
def test_preset_file_is_well_formed(name):
    assert name == name.lower()
    raw = _raw(name)
    assert raw["model_type"] in ("llama", "mistral", "gpt2", "gpt_neox", "opt", "megatron_gpt", "bloom", "mixtral",
                                 "qwen3_moe", "deepseek_v2", "deepseek_v3", "gpt_oss", "llama4", "qwen2", "qwen3", "mpt", "gemma2",
                                 "gemma3_text", "gemma3", "phi3")
    assert isinstance(raw["published_parameters"], int)
    assert raw["source"].strip()


@pytest.mark.parametrize("name", list_presets())
def test_total_parameters_match_published(name):
    """Within 0.5 % of the published figure. Where the authors print only a rounded figure ("1.7B", "13B"), the
    preset says so in ``source`` and gives the rounding unit in ``published_parameters_precision``; the count must
    then round to the printed figure (half a unit either way) if that is looser than 0.5 %. Parts of a published
    model hetplan does not model (Llama 4's vision encoder) are given in ``published_parameters_not_modelled``."""
    m = load_model(name)
    raw = _raw(name)
    assert m.name == name
    assert m.published_parameters == raw["published_parameters"]
    total = total_parameters(m) + raw.get("published_parameters_not_modelled", 0)
    precision = raw.get("published_parameters_precision", 0)
    if precision:
        assert "round" in m.source
    tolerance = max(0.005 * m.published_parameters, precision / 2)
    assert abs(total - m.published_parameters) <= tolerance, (
        f"{name}: counted {total:,}, published {m.published_parameters:,} ({total / m.published_parameters - 1:+.3%})"
    )


@pytest.mark.parametrize("name", [n for n in list_presets() if "published_parameters_precision" not in _raw(n)])
def test_exact_counts_where_published_exactly(name):
    """Presets with an exact published count (checkpoint totals) are matched to the parameter (with the parts
    hetplan does not model that the preset names: BLOOM's embedding LayerNorm)."""
    m = load_model(name)
    if m.published_parameters % 1_000_000 == 0:
        pytest.skip("published figure is a rounded number")
    assert total_parameters(m) + _raw(name).get("published_parameters_not_modelled", 0) == m.published_parameters


@pytest.mark.parametrize("name", sorted(MEGATRON_TABLE1))
def test_megatron_table1_shapes_and_paper_formula(name):
    billions, heads, hidden, layers = MEGATRON_TABLE1[name]
    m = load_model(name)
    assert (m.num_attention_heads, m.hidden_size, m.num_layers) == (heads, hidden, layers)
    assert (m.vocab_size, m.max_seq_len, m.learned_positions, m.ffn_hidden_size) == (51200, 2048, 2048, 4 * hidden)
    # SC'21 Sec. 5.1: P = 12 l h^2 (1 + 13/(12h) + (V+s)/(12lh)) = 12lh^2 + 13lh + (V+s)h; the paper leaves out
    # the final LayerNorm (2h), which we count.
    paper = 12 * layers * hidden**2 + 13 * layers * hidden + (51200 + 2048) * hidden
    assert total_parameters(m) == paper + 2 * hidden
    assert round(total_parameters(m) / 1e9, 1) == billions


def test_gpt3_175b_shape():
    m = load_model("gpt3-175b")
    assert (m.num_layers, m.hidden_size, m.num_attention_heads, m.head_dim) == (96, 12288, 96, 128)
    assert (m.vocab_size, m.max_seq_len) == (50257, 2048)


def test_family_details():
    opt = load_model("opt-125m")
    assert opt.learned_positions == 2048 + 2  # OPTLearnedPositionalEmbedding offset
    assert opt.tied_embeddings and opt.linear_bias
    neox = load_model("gpt-neox-20b")
    assert neox.learned_positions == 0 and not neox.tied_embeddings and neox.linear_bias
    for name in ("llama2-70b", "llama3-8b", "llama3-70b", "llama3-405b", "mistral-7b"):
        m = load_model(name)
        assert m.num_kv_heads == 8 and m.gated_mlp and not m.linear_bias and m.norm == "rmsnorm"
    assert load_model("llama2-13b").num_kv_heads == 40
    gpt2 = load_model("gpt2-xl")
    assert (gpt2.num_layers, gpt2.hidden_size, gpt2.num_attention_heads, gpt2.head_dim) == (48, 1600, 25, 64)
    assert gpt2.tied_embeddings and gpt2.learned_positions == 1024
    ol = load_model("open-llama-3b-v2")
    assert (ol.num_layers, ol.hidden_size, ol.num_attention_heads, ol.ffn_hidden_size, ol.vocab_size) == (
        26, 3200, 32, 8640, 32000)
    # BLOOM: Megatron's GPT block with ALiBi (no position table, any length), tied embeddings, dropout as configured
    bloom = load_model("bloom-176b")
    assert (bloom.family, bloom.learned_positions, bloom.ffn_hidden_size, bloom.head_dim) == ("megatron_gpt", 0,
                                                                                                4 * 14336, 128)
    assert bloom.tied_embeddings and bloom.linear_bias and not bloom.gated_mlp and not bloom.dropout
    assert bloom.max_seq_len >= 1 << 20 and bloom.alibi and bloom.softmax_fp32
    from hetplan.model.reference import unsupported_features
    assert unsupported_features(bloom) == ["ALiBi positions"]  # the torch reference would run rotary instead


def test_bloom_config_as_bigscience_ran_it():
    """A BLOOM ``config.json`` of one of BigScience's layouts (``n_embed`` spelling, the training's dropout and
    sequence length) reads as the model ``bigscience_a100`` prices, and its ``seq_length`` bounds the job."""
    from hetplan.calibration.modern import bigscience
    from hetplan.model.spec import from_hf_config

    cfg = {"model_type": "bloom", "n_layer": 72, "n_embed": 14336, "n_head": 64, "vocab_size": 250880,
           "hidden_dropout": 0.1, "attention_dropout": 0.1, "seq_length": 2048}
    m = from_hf_config(cfg, "bloom-like")
    row = {"layers": "72", "hidden": "14336", "heads": "64", "tokenizer_vocab": "250680", "tp": "4", "seq_len": "2048"}
    ref = bigscience.bigscience_model(row)
    assert m.model_dump(exclude={"name", "source"}) == ref.model_dump(exclude={"name", "source"})
    assert m.max_seq_len == 2048 and m.dropout
    with pytest.raises(HetplanError, match="n_layer"):
        from_hf_config({"model_type": "bloom", "hidden_size": 64, "n_head": 4, "vocab_size": 100}, "x")


def test_lookup_is_case_insensitive_and_suggests():
    assert load_model("Llama2-7B").name == "llama2-7b"
    with pytest.raises(HetplanError) as info:
        load_model("llama2-7")
    assert "llama2-7b" in info.value.fix


# Published total and activated parameters of the MoE presets (the figures of their presets' ``source``), and
# whether the publisher counts the input embedding among the active parameters.
MOE_PUBLISHED = {
    "mixtral-8x7b": (46.7e9, 12.9e9, True),
    "mixtral-8x22b": (141e9, 39e9, True),
    "qwen3-30b-a3b": (30.5e9, 3.3e9, True),
    "qwen3-235b-a22b": (235e9, 22e9, True),
    "deepseek-v3": (671e9, 37e9, True),
    "gpt-oss-120b": (116.83e9, 5.13e9, False),
    "gpt-oss-20b": (20.91e9, 3.61e9, False),
    "llama4-scout": (109e9, 17e9, True),
}


@pytest.mark.parametrize("name", sorted(MOE_PUBLISHED))
def test_moe_active_parameters_match_published(name):
    """Active parameters within 2 % of the published figure: the figures are rounded (3.3B to ±0.05B is ±1.5 %)
    and publishers differ on the input embedding (GPT-OSS leaves it out; the preset says so)."""
    total, active, with_embedding = MOE_PUBLISHED[name]
    m = load_model(name)
    assert m.is_moe and m.published_active_parameters == active
    assert m.published_parameters == total
    counted = active_parameters(m, input_embedding=with_embedding)
    assert counted == pytest.approx(active, rel=0.02), f"{name}: {counted:,} vs {active:,.0f}"
    assert counted < total_parameters(m)


def test_mixtral_8x7b_worked_example():
    """Mixtral 8x7B by hand: per layer GQA attention 2·h² + 2·h·(g·d), 8 SwiGLU experts 3·h·f, router h·8,
    two RMSNorms 2h; untied V·h embedding and head, final norm h."""
    h, f, L, V, kv = 4096, 14336, 32, 32000, 8 * 128
    layer = 2 * h * h + 2 * h * kv + 8 * 3 * h * f + 8 * h + 2 * h
    m = load_model("mixtral-8x7b")
    assert total_parameters(m) == L * layer + 2 * V * h + h == 46_702_792_704
    active_layer = layer - 6 * 3 * h * f
    assert active_parameters(m) == L * active_layer + 2 * V * h + h


def test_deepseek_v3_mla_and_dense_layers():
    """DeepSeek-V3: 3 dense layers (first_k_dense_replace) then 58 MoE layers of 256 routed + 1 shared expert;
    MLA projections (DeepSeek-V2 Sec. 2.1): q 7168->1536->128·192, kv 7168->512+64, 512->128·(128+128), o 128·128->7168."""
    m = load_model("deepseek-v3")
    assert (m.num_moe_layers, m.first_dense_layers, m.is_mla) == (58, 3, True)
    assert [m.is_moe_layer(i) for i in range(4)] == [False, False, False, True]
    h, a = 7168, 128
    mla = h * 1536 + 1536 * a * 192 + h * 576 + 512 * a * 256 + a * 128 * h + 1536 + 512
    dense = mla + 3 * h * 18432 + 2 * h
    moe = mla + 257 * 3 * h * 2048 + 256 * h + 2 * h
    assert total_parameters(m) == 3 * dense + 58 * moe + 2 * 129280 * h + h


def test_moe_layer_placement():
    """Llama 4's interleave step and Qwen's sparse step: layer i is MoE iff (i + 1) % step == 0."""
    cfg = json.loads(resources.files("hetplan.model").joinpath("presets/llama4-scout.json").read_text())
    cfg["text_config"]["interleave_moe_layer_step"] = 2
    m = from_hf_config(cfg, "maverick-like")
    assert m.num_moe_layers == 24 and not m.is_moe_layer(0) and m.is_moe_layer(1)
    assert m.ffn_hidden_size == 16384 and m.shared_expert_ffn_hidden_size == 8192


def test_gpt_oss_sliding_window_layers():
    m = load_model("gpt-oss-120b")
    assert (m.sliding_window, m.sliding_window_layers, m.attention_sinks, m.linear_bias) == (128, 18, True, True)


QWEN15_MOE = {  # Qwen/Qwen1.5-MoE-A2.7B config.json (qwen2_moe): 14.3B total, 2.7B activated (model card)
    "model_type": "qwen2_moe", "hidden_size": 2048, "intermediate_size": 5632, "moe_intermediate_size": 1408,
    "shared_expert_intermediate_size": 5632, "num_attention_heads": 16, "num_key_value_heads": 16,
    "num_hidden_layers": 24, "num_experts": 60, "num_experts_per_tok": 4, "decoder_sparse_step": 1,
    "vocab_size": 151936, "max_position_embeddings": 8192, "tie_word_embeddings": False,
}


def test_qwen2_moe_shared_expert_and_qkv_bias():
    m = from_hf_config(QWEN15_MOE, "qwen1.5-moe-a2.7b")
    assert m.qkv_bias and m.shared_expert_gate and not m.linear_bias
    assert total_parameters(m) == pytest.approx(14.3e9, rel=0.005)
    assert active_parameters(m) == pytest.approx(2.7e9, rel=0.02)


@pytest.mark.parametrize("cfg,field,words", [
    ([1, 2], "model", "must be a JSON object"),
    (dict(QWEN15_MOE, hidden_size="4096"), "model.hidden_size", "expected an integer, got '4096' (str)"),
    (dict(QWEN15_MOE, num_experts=60.0), "model.num_experts", "expected an integer"),
    (dict(QWEN15_MOE, tie_word_embeddings="no"), "model.tie_word_embeddings", "expected true or false"),
    (dict(QWEN15_MOE, num_experts_per_tok=61), "model", "experts_per_token (61) must be in 1..num_experts (60)"),
    ({"model_type": "llama4", "text_config": [1]}, "model.text_config", "expected a JSON object"),
    # shapes beyond any preset: 10^9 layers looped the search for hours, a hidden size of 10^12 overflowed int64
    (dict(QWEN15_MOE, num_hidden_layers=10**9), "model.num_hidden_layers", "less than or equal to 1024"),
    (dict(QWEN15_MOE, hidden_size=10**12), "model.hidden_size", "less than or equal to 131072"),
    (dict(QWEN15_MOE, vocab_size=10**12), "model.vocab_size", "less than or equal to 16777216"),
    # a shape hetplan renames is named by its config.json key (the field was model.ffn_hidden_size)
    (dict(QWEN15_MOE, intermediate_size=0), "model.intermediate_size", "greater than 0"),
    (dict(QWEN15_MOE, moe_intermediate_size=10**9), "model.moe_intermediate_size", "less than or equal to 1048576"),
    (dict(QWEN15_MOE, max_position_embeddings=0), "model.max_position_embeddings", "greater than 0"),
])
def test_config_errors_name_field_and_type(cfg, field, words):
    with pytest.raises(HetplanError) as info:
        from_hf_config(cfg, "bad")
    assert info.value.field == field and words in info.value.message
    assert "pydantic" not in info.value.render()


def test_non_utf8_and_directory_config(tmp_path):
    bad = tmp_path / "config.json"
    bad.write_bytes(b'{"model_type": "llama", "hidden_size": 4096\xff}')
    with pytest.raises(HetplanError, match=r"not UTF-8 text \(byte 43: 0xff\)"):
        load_model(str(bad))
    with pytest.raises(HetplanError, match="is a directory"):
        load_model(str(tmp_path))


@pytest.mark.parametrize("name, preset", [
    ("llama3.1-70b", "llama3-70b"), ("meta-llama/Llama-3.1-8B", "llama3-8b"), ("Llama-3.1-405B", "llama3-405b"),
    ("mistralai/Mixtral-8x7B-v0.1", "mixtral-8x7b"), ("Qwen/Qwen3-30B-A3B", "qwen3-30b-a3b"),
    ("meta-llama/Llama-2-7b-hf", "llama2-7b"), ("bigscience/bloom", "bloom-176b"), ("llama3-8b", "llama3-8b"),
])
def test_a_preset_answers_to_its_hugging_face_id_and_release_name(name, preset):
    """The names users type: the Hugging Face id whose config.json a preset is (its ``source``), that id without
    its organisation, and Llama 3.1's release names (the llama3 presets are the 3.1 configs); the spec is the
    preset's, under the preset's name."""
    from hetplan.model.spec import list_presets, preset_aliases

    assert load_model(name).name == preset and load_model(name) == load_model(preset)
    assert set(preset_aliases().values()) <= set(list_presets())
    assert not set(preset_aliases()) & set(list_presets())  # no alias shadows a preset


# Dense families beyond Llama's (hetplan.model.spec._dense_fields / _mpt_fields), each against a published
# checkpoint total (the Hugging Face safetensors count of the released weights, which the model cards round).
QWEN25_05B = {  # Qwen/Qwen2.5-0.5B config.json: tied embeddings; 494,032,768 parameters (safetensors; card 0.49B)
    "model_type": "qwen2", "hidden_size": 896, "intermediate_size": 4864, "num_attention_heads": 14,
    "num_key_value_heads": 2, "num_hidden_layers": 24, "vocab_size": 151936, "max_position_embeddings": 32768,
    "tie_word_embeddings": True, "use_sliding_window": False, "sliding_window": 32768, "max_window_layers": 24,
}
PHI3_MINI = {  # microsoft/Phi-3-mini-4k-instruct config.json: 3,821,079,552 parameters (safetensors; card 3.8B)
    "model_type": "phi3", "hidden_size": 3072, "intermediate_size": 8192, "num_attention_heads": 32,
    "num_key_value_heads": 32, "num_hidden_layers": 32, "vocab_size": 32064, "max_position_embeddings": 4096,
    "sliding_window": 2047, "tie_word_embeddings": False, "resid_pdrop": 0.0, "attention_dropout": 0.0,
}
MPT_7B_RELEASED = {  # mosaicml/mpt-7b config.json: ALiBi, no biases anywhere (its card: "6.7B")
    "model_type": "mpt", "d_model": 4096, "n_heads": 32, "n_layers": 32, "expansion_ratio": 4, "max_seq_len": 2048,
    "vocab_size": 50432, "no_bias": True, "learned_pos_emb": True, "norm_type": "low_precision_layernorm",
    "attn_config": {"alibi": True, "attn_impl": "torch", "attn_pdrop": 0, "qk_ln": False, "clip_qkv": None},
    "resid_pdrop": 0, "emb_pdrop": 0,
}


def test_qwen2_block_by_hand():
    """Qwen2.5-7B: per layer Q and O h x h, K and V h x (4·128), biases on Q, K, V only (Qwen2Attention), SwiGLU
    3·h·f, two RMSNorms; untied V x h embedding and head, final norm h."""
    m = load_model("qwen2.5-7b")
    h, f, kv, V = 3584, 18944, 4 * 128, 152064
    assert m.qkv_bias and not m.linear_bias and not m.qk_norm and m.gated_mlp and m.norm == "rmsnorm"
    assert not m.tied_embeddings and m.sliding_window_layers == 0  # use_sliding_window false in the release
    layer = 2 * h * h + 2 * h * kv + (h + 2 * kv) + 3 * h * f + 2 * h
    assert total_parameters(m) == 28 * layer + 2 * V * h + h == 7_615_616_512
    small = from_hf_config(QWEN25_05B, "qwen2.5-0.5b")
    assert small.tied_embeddings and total_parameters(small) == 494_032_768


def test_qwen3_head_dim_and_qk_norm():
    """Qwen3-32B: 64 heads of head_dim 128 on a 5,120 hidden size (Q and O are 5,120 x 8,192), RMSNorm of 128
    weights on each head's Q and K, no biases; without head_dim a qwen3 config gets Qwen3Config's 128."""
    m = load_model("qwen3-32b")
    assert (m.head_dim, m.q_dim, m.hidden_size) == (128, 8192, 5120) and m.qk_norm and not m.qkv_bias
    h, q, kv, f = 5120, 8192, 8 * 128, 25600
    layer = 2 * h * q + 2 * h * kv + 2 * 128 + 3 * h * f + 2 * h
    assert total_parameters(m) == 64 * layer + 2 * 151936 * h + h
    cfg = json.loads(resources.files("hetplan.model").joinpath("presets/qwen3-32b.json").read_text())
    del cfg["head_dim"]
    assert from_hf_config(cfg, "x").head_dim == 128
    # a window that use_sliding_window turns on covers the layers from max_window_layers on (Qwen3Config)
    on = from_hf_config(dict(cfg, use_sliding_window=True, sliding_window=4096, max_window_layers=60), "x")
    assert (on.sliding_window, on.sliding_window_layers) == (4096, 4)


def test_phi3_fused_projections_count_as_split_ones():
    """Phi-3-mini: qkv_proj (h -> 3h) and gate_up_proj (h -> 2f) hold what split Q, K, V and gate, up hold; its
    2,047-token window applies on every layer (Phi3Attention)."""
    m = from_hf_config(PHI3_MINI, "phi-3-mini")
    assert total_parameters(m) == 3_821_079_552
    assert (m.sliding_window, m.sliding_window_layers, m.linear_bias) == (2047, 32, False)
    from hetplan.model.counts import attended_keys
    assert attended_keys(m, 4096) == 2047 and attended_keys(m, 1024) == 1024


def test_mpt_released_checkpoint_without_biases():
    """The released MPT-7B: ALiBi (no position table), ``no_bias`` removes linear and LayerNorm biases, tied
    embeddings: 12·L·h² + 2·L·h (LayerNorm weights) + V·h + h, by hand (the release publishes no exact total,
    only "6.7B")."""
    m = from_hf_config(MPT_7B_RELEASED, "mpt-7b-released")
    assert m.alibi and m.learned_positions == 0 and not m.norm_bias and not m.linear_bias and m.tied_embeddings
    h = 4096
    assert total_parameters(m) == 32 * (12 * h * h + 2 * h) + 50432 * h + h == 6_649_286_656


def test_mpt_presets_are_the_benchmarked_models():
    """Each ``mpt-*`` preset is the model :func:`hetplan.calibration.independent.mpt_model` builds for that size's
    2,048-token rows of llm-foundry's benchmark tables (the rows' ``NumParams``), and the same shapes as the
    Megatron GPT block the rows were priced with before the ``mpt`` loader existed."""
    import csv

    from hetplan.calibration.independent import mpt_model
    from hetplan.calibration.validation import gpt_model

    rows = {}
    for name in ("llm_foundry_h100.csv", "llm_foundry_a100.csv"):
        text = resources.files("hetplan.calibration").joinpath("validation_data", "independent", name).read_text()
        rows.update({r["model"].lower(): r for r in csv.DictReader(text.splitlines()) if r["seq_len"] == "2048"})
    assert len(rows) == 9
    shape = {"name", "source", "published_parameters", "family"}
    for model, r in rows.items():
        preset, built = load_model(model), mpt_model(r)
        assert preset.model_dump(exclude=shape) == built.model_dump(exclude=shape), model
        assert built.family == preset.family == "mpt" and int(r["ffn_hidden"]) == preset.ffn_hidden_size
        assert total_parameters(preset) == preset.published_parameters == int(r["notes"].split("NumParams ")[1].split()[0])
        old = gpt_model(int(r["layers"]), int(r["hidden"]), int(r["heads"]), 2048, vocab=int(r["vocab"]))
        assert old.model_copy(update={"dropout": False}).model_dump(exclude=shape) == preset.model_dump(exclude=shape)


def test_gemma_four_norms_head_dim_and_windows():
    """Gemma-2-27B: 32 heads of 128 on a 4,608 hidden size, GeGLU 3·h·f, four RMSNorms per layer, tied
    embeddings; a 4,096-token window on every other layer from the first (23 of 46). Gemma-3-1B adds Q/K norms of
    head_dim and windows 512 on five layers of six (22 of 26)."""
    m = load_model("gemma2-27b")
    h, q, kv, f, V = 4608, 32 * 128, 16 * 128, 36864, 256000
    assert m.post_norms and m.tied_embeddings and m.gated_mlp and not m.qk_norm and m.q_dim == q
    assert total_parameters(m) == 46 * (2 * h * q + 2 * h * kv + 3 * h * f + 4 * h) + V * h + h
    assert (m.sliding_window, m.sliding_window_layers) == (4096, 23)
    g3 = load_model("gemma3-1b")
    assert g3.qk_norm and (g3.sliding_window, g3.sliding_window_layers) == (512, 22)
    from hetplan.model.reference import unsupported_features
    assert unsupported_features(g3) == ["sliding-window attention", "post-attention / post-MLP norms"]


def test_gemma3_vision_config_reads_its_text_model_with_class_defaults():
    """A Gemma 3 vision release's config.json (model_type gemma3) names only the text shapes that differ from
    Gemma3TextConfig's defaults (Gemma-3-4B: 8 heads / 4 KV of 256 and the 262,208 vocabulary left out); the vision
    tower is not modelled."""
    cfg = {"model_type": "gemma3", "text_config": {"model_type": "gemma3_text", "hidden_size": 2560,
                                                   "intermediate_size": 10240, "num_hidden_layers": 34,
                                                   "sliding_window": 1024},
           "vision_config": {"model_type": "siglip_vision_model", "hidden_size": 1152}}
    m = from_hf_config(cfg, "gemma-3-4b-text")
    assert (m.family, m.num_attention_heads, m.num_kv_heads, m.head_dim, m.vocab_size) == ("gemma3", 8, 4, 256, 262208)
    h, q, kv, f = 2560, 8 * 256, 4 * 256, 10240
    layer = 2 * h * q + 2 * h * kv + 2 * 256 + 3 * h * f + 4 * h
    assert total_parameters(m) == 34 * layer + 262208 * h + h
    assert (m.sliding_window, m.sliding_window_layers) == (1024, 29)


def test_gemma3_vision_releases_leave_the_same_vision_tower():
    """Gemma-3-4B, 12B and 27B share one SigLIP encoder (Gemma 3 report Table 1: 417M each) and project its 1,152
    features into the text model's h: their published totals minus hetplan's count of the language model minus
    that projection leave the same remainder for all three, within half a million of 417M — a check of the three
    text shapes read from ``text_config`` with Gemma3TextConfig's defaults."""
    models = [load_model(n) for n in ("gemma3-4b", "gemma3-12b", "gemma3-27b")]
    rest = {m.published_parameters - total_parameters(m) - 1152 * m.hidden_size for m in models}
    assert len(rest) == 1 and abs(rest.pop() - 417e6) < 0.5e6


@pytest.mark.parametrize("cfg,field,words", [
    (dict(MPT_7B_RELEASED, n_heads=0), "model.n_heads", "n_heads = 0"),
    ({k: v for k, v in MPT_7B_RELEASED.items() if k != "d_model"}, "model.d_model", "lacks d_model"),
    (dict(MPT_7B_RELEASED, d_model=4100), "model.d_model", "d_model 4100 is not divisible by n_heads 32"),
    (dict(MPT_7B_RELEASED, attn_config={"kv_n_heads": "8"}), "model.attn_config.kv_n_heads", "expected an integer"),
    (dict(MPT_7B_RELEASED, attn_config={"attn_type": "grouped_query_attention", "kv_n_heads": 5}),
     "model.attn_config.kv_n_heads", "n_heads 32 is not a multiple of attn_config.kv_n_heads 5"),
    (dict(MPT_7B_RELEASED, attn_config={"attn_type": "grouped_query_attention"}), "model.attn_config.kv_n_heads",
     "needs attn_config.kv_n_heads"),
    (dict(MPT_7B_RELEASED, attn_config={"attn_type": "cross"}), "model.attn_config.attn_type", "'cross'"),
    (dict(MPT_7B_RELEASED, attn_config={"qk_ln": True}), "model.attn_config.qk_ln", "not modelled"),
    (dict(MPT_7B_RELEASED, ffn_config={"ffn_type": "mb_dmoe"}), "model.ffn_config.ffn_type", "'mb_dmoe'"),
    (dict(MPT_7B_RELEASED, norm_type="batchnorm"), "model.norm_type", "'batchnorm'"),
    (dict(MPT_7B_RELEASED, expansion_ratio=1.3), "model.expansion_ratio", "whole MLP width"),
    (dict(MPT_7B_RELEASED, no_bias="yes"), "model.no_bias", "expected true or false"),
    (dict(QWEN25_05B, num_key_value_heads=0), "model.num_key_value_heads", "num_key_value_heads = 0"),
    (dict(QWEN25_05B, num_key_value_heads=4), "model.num_key_value_heads",
     "num_attention_heads 14 is not a multiple of num_key_value_heads 4"),
    (dict(QWEN25_05B, num_hidden_layers=-2), "model.num_hidden_layers", "num_hidden_layers = -2"),
    (dict(QWEN25_05B, head_dim=0), "model.head_dim", "head_dim = 0"),
    (dict(QWEN25_05B, use_sliding_window=True, layer_types=["sliding_attention"]), "model.layer_types",
     "1 entries for 24 layers"),
    (dict(QWEN25_05B, model_type="qwen3", attention_bias=True), "model.attention_bias", "not modelled"),
    (dict(QWEN25_05B, model_type="llama", attention_bias=True), "model.mlp_bias",
     "biases on Q, K, V and O but not the MLP"),
    (dict(QWEN25_05B, model_type="mistral", mlp_bias=True), "model.mlp_bias", "the MLP but not Q, K, V and O"),
    (dict(PHI3_MINI, intermediate_size=None), "model.intermediate_size", "lacks intermediate_size"),
    (dict(PHI3_MINI, model_type="phi4"), "model.model_type", "unsupported model_type 'phi4'"),
    (dict(PHI3_MINI, model_type="gemma2", attention_bias=True), "model.attention_bias", "not modelled for gemma2"),
    (dict(PHI3_MINI, model_type="gemma3_text", sliding_window_pattern=0), "model.sliding_window_pattern",
     "must be a positive integer"),
    (dict(PHI3_MINI, model_type="gemma2", layer_types=["full_attention"] * 31 + ["chunked_attention"]),
     "model.layer_types", "unknown kind 'chunked_attention'"),
])
def test_dense_family_config_errors_name_the_field(cfg, field, words):
    with pytest.raises(HetplanError) as info:
        from_hf_config(cfg, "bad")
    assert info.value.field == field and words in info.value.message, (info.value.field, info.value.message)
    assert info.value.fix


def test_llama_with_attention_and_mlp_biases_counts_both():
    """LlamaConfig's attention_bias (Q, K, V, O) and mlp_bias (gate, up, down) both true: every linear biased."""
    plain = from_hf_config(dict(QWEN25_05B, model_type="llama"), "plain")
    biased = from_hf_config(dict(QWEN25_05B, model_type="llama", attention_bias=True, mlp_bias=True), "biased")
    h, f, a, g, d = 896, 4864, 14, 2, 64
    per_layer = (a * d + 2 * g * d + h) + (2 * f + h)
    assert biased.linear_bias and not plain.linear_bias
    assert total_parameters(biased) - total_parameters(plain) == 24 * per_layer


def test_bad_config_exits_2_from_the_cli(tmp_path):
    import subprocess
    import sys

    path = tmp_path / "config.json"
    path.write_text(json.dumps(dict(MPT_7B_RELEASED, n_heads=0)))
    r = subprocess.run([sys.executable, "-m", "hetplan.cli.main", "plan", "--model", str(path), "--seq-len", "2048",
                        "--global-batch", "64", "--gpu", "h100-sxm-80gb", "--gpus", "8"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "model.n_heads" in r.stderr and "Traceback" not in r.stderr, r.stderr


@pytest.mark.parametrize("cfg", [QWEN25_05B, dict(QWEN25_05B, model_type="qwen3", head_dim=96), PHI3_MINI,
                                 MPT_7B_RELEASED, dict(MPT_7B_RELEASED, no_bias=False, norm_type="rmsnorm", attn_config={})],
                         ids=["qwen2", "qwen3", "phi3", "mpt-no-bias", "mpt-rmsnorm"])
def test_torch_reference_holds_the_counted_parameters(cfg):
    """The torch reference transformer built from a small model of each family (same blocks, fewer and narrower
    layers; a vocabulary the reference need not pad) holds exactly the parameters hetplan.model.counts prices: QKV biases, Q/K norms of head_dim, a
    head_dim other than h / a, bias-free LayerNorms."""
    pytest.importorskip("torch")
    from hetplan.model.torch_transformer import TransformerStage

    small = {"hidden_size": 64, "num_hidden_layers": 2, "intermediate_size": 96, "num_attention_heads": 4,
             "num_key_value_heads": 2, "vocab_size": 128, "d_model": 64, "n_layers": 2, "n_heads": 4}
    m = from_hf_config({**cfg, **{k: v for k, v in small.items() if k in cfg}, "sliding_window": None}, "tiny")
    m = m.model_copy(update={"alibi": False})  # the reference refuses ALiBi; its parameters are none
    model = TransformerStage(m)
    assert sum(p.numel() for p in model.parameters()) == total_parameters(m)


@pytest.mark.parametrize("spelling, preset", [("llama-3-8b", "llama3-8b"), ("Llama 3 8B", "llama3-8b"),
                                               ("llama-2-7b", "llama2-7b"), ("Qwen-2.5-72B", "qwen2.5-72b"),
                                               ("mpt_7b", "mpt-7b"), ("GPT3 1.3B", "gpt3-1.3b")])
def test_a_preset_answers_to_its_spellings(spelling, preset):
    """Case, spaces, hyphens and underscores do not matter in a preset name (dots do: 1.3b is not 13b)."""
    assert load_model(spelling).name == preset


def test_no_two_presets_share_a_spelling():
    from hetplan.model.spec import _compact, list_presets, preset_aliases

    owners: dict[str, set[str]] = {}
    for alias, name in [*preset_aliases().items(), *((n, n) for n in list_presets())]:
        owners.setdefault(_compact(alias), set()).add(name)
    assert all(len(v) == 1 for v in owners.values()), {k: v for k, v in owners.items() if len(v) > 1}
    with pytest.raises(HetplanError, match="unknown model"):
        load_model("gpt3-13.b")
