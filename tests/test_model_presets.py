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
    "llama2-7b", "llama2-13b", "llama2-70b", "llama3-8b", "llama3-70b", "llama3-405b", "mistral-7b",
    "open-llama-3b-v2", "opt-125m", "opt-1.3b", "opt-13b", "opt-175b", "gpt2-xl", "gpt-neox-20b",
    "mixtral-8x7b", "mixtral-8x22b", "qwen3-30b-a3b", "qwen3-235b-a22b", "deepseek-v3", "gpt-oss-120b", "llama4-scout",
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
                                 "qwen3_moe", "deepseek_v3", "gpt_oss", "llama4")
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
