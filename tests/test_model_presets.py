"""Model presets (src/hetplan/model/presets/*.json): every preset loads, and its parameter count matches the
figure its authors publish."""

from __future__ import annotations

import json
from importlib import resources

import pytest

from hetplan.errors import HetplanError
from hetplan.model.counts import total_parameters
from hetplan.model.spec import list_presets, load_model

REQUIRED = [
    "megatron-gpt-1.7b", "megatron-gpt-3.6b", "megatron-gpt-7.5b", "megatron-gpt-18b", "megatron-gpt-39b",
    "megatron-gpt-76b", "megatron-gpt-145b", "megatron-gpt-310b", "megatron-gpt-530b", "megatron-gpt-1t",
    "gpt3-1.3b", "gpt3-2.7b", "gpt3-6.7b", "gpt3-13b", "gpt3-175b",
    "llama2-7b", "llama2-13b", "llama2-70b", "llama3-8b", "llama3-70b", "llama3-405b", "mistral-7b",
    "open-llama-3b-v2", "opt-125m", "opt-1.3b", "opt-13b", "opt-175b", "gpt2-xl", "gpt-neox-20b",
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
    assert raw["model_type"] in ("llama", "mistral", "gpt2", "gpt_neox", "opt", "megatron_gpt")
    assert isinstance(raw["published_parameters"], int)
    assert raw["source"].strip()


@pytest.mark.parametrize("name", list_presets())
def test_total_parameters_match_published(name):
    """Within 0.5 % of the published figure. Where the authors print only a rounded figure ("1.7B", "13B"), the
    preset says so in ``source`` and gives the rounding unit in ``published_parameters_precision``; the count must
    then round to the printed figure (half a unit either way) if that is looser than 0.5 %."""
    m = load_model(name)
    raw = _raw(name)
    assert m.name == name
    assert m.published_parameters == raw["published_parameters"]
    total = total_parameters(m)
    precision = raw.get("published_parameters_precision", 0)
    if precision:
        assert "round" in m.source
    tolerance = max(0.005 * m.published_parameters, precision / 2)
    assert abs(total - m.published_parameters) <= tolerance, (
        f"{name}: counted {total:,}, published {m.published_parameters:,} ({total / m.published_parameters - 1:+.3%})"
    )


@pytest.mark.parametrize("name", [n for n in list_presets() if "published_parameters_precision" not in _raw(n)])
def test_exact_counts_where_published_exactly(name):
    """Presets with an exact published count (checkpoint totals) are matched to the parameter."""
    m = load_model(name)
    if m.published_parameters % 1_000_000 == 0:
        pytest.skip("published figure is a rounded number")
    assert total_parameters(m) == m.published_parameters


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


def test_lookup_is_case_insensitive_and_suggests():
    assert load_model("Llama2-7B").name == "llama2-7b"
    with pytest.raises(HetplanError) as info:
        load_model("llama2-7")
    assert "llama2-7b" in info.value.fix
