"""Hugging Face eager attention (``attention="eager"``): the s x s element-wise work op by op."""

from __future__ import annotations

from pathlib import Path

import pytest

import hetplan.energy
from hetplan.estimate.compute import eager_score_bytes, layer_time_s
from hetplan.hardware.catalog import load_catalog
from hetplan.model import counts
from hetplan.model.spec import load_model
from hetplan.estimate.stagework import LayerTerms, Link

BLOOM = str(Path(hetplan.energy.__file__).parent / "data" / "bloom-176b.json")


def test_score_bytes_per_model():
    gpt3, bloom = load_model("gpt3-175b"), load_model(BLOOM)
    assert bloom.softmax_fp32 and not bloom.dropout and not gpt3.softmax_fp32 and gpt3.dropout
    # GPT-2: scale 4 + where 4 + bf16 softmax 4 + dropout 5 forward; 4 + 4 + 6 + 5 backward
    assert eager_score_bytes(gpt3) == (17, 19)
    # BLOOM: ALiBi/scale 4 + masked_fill 4 + upcast 6, fp32 softmax 8, cast back 6 forward; 4 + 4 + 24 backward
    assert eager_score_bytes(bloom) == (28, 32)


@pytest.mark.parametrize("name", ["gpt3-175b", BLOOM])
def test_eager_layer_time_against_standard(name):
    """Without the host floor (CUDA graphs) and without TP, eager and standard differ only by the s x s
    element-wise bytes: standard charges 2 passes over the stored 5 (dropout) or 2 bytes per score, 2x that in
    backward; eager the op-by-op bytes."""
    m, gpu = load_model(name), load_catalog().get("A100-SXM-80GB")
    b, s, t = 1, 2048, 8
    kw = dict(cuda_graphs=True)
    fs, bs, _ = layer_time_s(m, gpu, "bf16", b, s, t, 0, LayerTerms(Link.one_node(3e11), attention="standard", **kw))
    fe, be, _ = layer_time_s(m, gpu, "bf16", b, s, t, 0, LayerTerms(Link.one_node(3e11), attention="eager", **kw))
    scores = m.num_attention_heads * s * s * b / t / gpu.hbm_bandwidth_bytes_per_s
    stored = 5 if m.dropout else 2
    fwd, bwd = eager_score_bytes(m)
    assert float(fe - fs) == pytest.approx((fwd - 2 * stored) * scores, rel=1e-9)
    assert float(be - bs) == pytest.approx((bwd - 4 * stored) * scores, rel=1e-9)


def test_eager_memory_keeps_fp32_softmax_output():
    bloom, gpt3 = load_model(BLOOM), load_model("gpt3-175b")
    b, s, t = 1, 2048, 8
    extra = 4 * bloom.num_attention_heads * s * s * b / t
    assert counts.layer_activation_bytes(bloom, b, s, t, attention="eager") == pytest.approx(
        counts.layer_activation_bytes(bloom, b, s, t, attention="standard") + extra)
    assert counts.layer_activation_bytes(gpt3, b, s, t, attention="eager") == \
        counts.layer_activation_bytes(gpt3, b, s, t, attention="standard")
