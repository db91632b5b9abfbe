"""The reusable torch transformer: pipeline stages compose to the full model; TP shards tile the full weights."""

import pytest

torch = pytest.importorskip("torch")

from hetplan.errors import HetplanError  # noqa: E402
from hetplan.model.spec import from_hf_config, load_model  # noqa: E402
from hetplan.model.torch_transformer import (Partition, TransformerStage, parameter_bytes,  # noqa: E402
                                             split_layers)

GPT2 = {"model_type": "gpt2", "n_embd": 32, "n_head": 4, "n_layer": 3, "vocab_size": 100, "n_positions": 64}
NEOX = {"model_type": "gpt_neox", "hidden_size": 32, "num_attention_heads": 4,
        "vocab_size": 90, "max_position_embeddings": 64, "intermediate_size": 64, "num_hidden_layers": 3}


def _specs(fixtures):
    return [load_model(fixtures / "tiny-opt.json"), load_model(fixtures / "tiny-llama.json"),
            from_hf_config(GPT2, "gpt2-toy"), from_hf_config(NEOX, "neox-toy")]


@pytest.mark.parametrize("pp", [2, 3])
def test_pipeline_stages_compose_to_the_full_model(fixtures, pp):
    for spec in _specs(fixtures):
        full = TransformerStage(spec, seed=5)
        toks = torch.randint(0, spec.vocab_size, (2, 9), generator=torch.Generator().manual_seed(0))
        ref = full(toks)
        x = toks
        for i, (lo, hi) in enumerate(split_layers(spec.num_layers, pp)):
            x = TransformerStage(spec, Partition(lo, hi, i == 0, i == pp - 1), seed=5)(x)
        assert ref.shape == (2, 9, spec.vocab_size)
        torch.testing.assert_close(x, ref)


def test_tp_shards_tile_the_full_weights(fixtures):
    spec = load_model(fixtures / "tiny-llama.json")  # GQA: 4 heads, 2 kv heads
    full = dict(TransformerStage(spec, seed=1).named_parameters())
    shards = [dict(TransformerStage(spec, Partition(0, spec.num_layers, True, True, r, 2), seed=1).named_parameters())
              for r in range(2)]
    cat0 = lambda k: torch.cat([s[k] for s in shards], 0)  # noqa: E731
    for k in ("layers.0.q.weight", "layers.1.k.weight", "layers.2.v.weight", "layers.0.up.weight", "layers.0.gate.weight"):
        torch.testing.assert_close(cat0(k), full[k])  # column-parallel: output rows
    torch.testing.assert_close(torch.cat([s["layers.1.down.weight"] for s in shards], 1), full["layers.1.down.weight"])
    torch.testing.assert_close(torch.cat([s["layers.0.o.weight"] for s in shards], 1), full["layers.0.o.weight"])
    v = spec.vocab_size  # vocabulary-parallel; padding differs (128 x TP rows), the real rows agree
    torch.testing.assert_close(cat0("embed.weight")[:v], full["embed.weight"][:v])
    torch.testing.assert_close(cat0("head")[:v], full["head"][:v])
    torch.testing.assert_close(shards[1]["layers.0.norm1.weight"], full["layers.0.norm1.weight"])  # replicated
    assert sum(parameter_bytes(TransformerStage(spec, Partition(0, 3, True, True, r, 2))) for r in range(2)) < 2 * parameter_bytes(
        TransformerStage(spec))


def test_seeded_and_partition_independent_weights(fixtures):
    spec = load_model(fixtures / "tiny-opt.json")
    a = TransformerStage(spec, seed=3)
    b = TransformerStage(spec, seed=3)
    c = TransformerStage(spec, seed=4)
    last = TransformerStage(spec, Partition(2, 4, False, True), seed=3)
    torch.testing.assert_close(a.layers[0].q.weight, b.layers[0].q.weight)
    assert not torch.equal(a.layers[0].q.weight, c.layers[0].q.weight)
    torch.testing.assert_close(last.layers[0].up.weight, a.layers[2].up.weight)
    torch.testing.assert_close(last.head, a.embed.weight)  # tied output matrix copied on the last stage


def test_bad_partitions(fixtures):
    spec = load_model(fixtures / "tiny-opt.json")
    with pytest.raises(HetplanError) as e:
        TransformerStage(spec, Partition(0, 4, True, True, 0, 3))
    assert e.value.field == "tp"
    with pytest.raises(HetplanError):
        split_layers(4, 5)
    assert split_layers(5, 2) == [(0, 3), (3, 5)]
