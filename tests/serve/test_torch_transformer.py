"""The reusable torch transformer: pipeline stages compose to the full model; TP shards tile the full weights."""

import pytest

torch = pytest.importorskip("torch")

from hetplan.errors import HetplanError  # noqa: E402
from hetplan.model.spec import from_hf_config, load_model  # noqa: E402
from hetplan.model.torch_transformer import Partition, TransformerStage, parameter_bytes  # noqa: E402
from hetplan.plan import layer_ranges  # noqa: E402

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
        for i, (lo, hi) in enumerate(layer_ranges(spec.num_layers, pp)):
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
        layer_ranges(4, 5)
    assert layer_ranges(5, 2) == [(0, 3), (3, 5)]


@pytest.mark.parametrize("name", ["tiny-llama.json"])
def test_tp2_forward_and_backward_equal_full_model(fixtures, tmp_path, name):
    import multiprocessing as mp

    from hetplan.serve.engine import free_port

    from .tp_helper import tp_forward_backward

    spec = load_model(fixtures / name)
    ctx = mp.get_context("spawn")
    port = free_port()
    procs = [ctx.Process(target=tp_forward_backward, args=(r, 2, port, str(fixtures / name), str(tmp_path)))
             for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0, 0]
    full = TransformerStage(spec, seed=11)
    toks = torch.randint(0, spec.vocab_size, (2, 6), generator=torch.Generator().manual_seed(3))
    ref = full(toks)
    ref.float().square().mean().backward()
    outs = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    for o in outs:
        torch.testing.assert_close(o["logits"], ref.detach(), rtol=1e-4, atol=1e-5)
    g = {n: p.grad for n, p in full.named_parameters()}
    cat0 = lambda k: torch.cat([o["grads"][k] for o in outs], 0)  # noqa: E731
    tol = dict(rtol=1e-3, atol=1e-6)
    torch.testing.assert_close(cat0("layers.1.q.weight"), g["layers.1.q.weight"], **tol)
    torch.testing.assert_close(cat0("layers.0.gate.weight"), g["layers.0.gate.weight"], **tol)
    torch.testing.assert_close(torch.cat([o["grads"]["layers.2.down.weight"] for o in outs], 1), g["layers.2.down.weight"], **tol)
    v = spec.vocab_size
    torch.testing.assert_close(cat0("embed.weight")[:v], g["embed.weight"][:v], **tol)
    torch.testing.assert_close(cat0("head")[:v], g["head"][:v], **tol)
    for o in outs:  # replicated parameters get the full gradient on every rank
        torch.testing.assert_close(o["grads"]["layers.0.norm1.weight"], g["layers.0.norm1.weight"], **tol)
