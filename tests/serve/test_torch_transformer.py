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

    from .tp_helper import tp_forward_backward

    spec = load_model(fixtures / name)
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=tp_forward_backward, args=(r, 2, str(fixtures / name), str(tmp_path)))
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


@pytest.mark.parametrize("name", ["tiny-opt.json", "tiny-llama.json"])
def test_kv_cache_generation_equals_recompute(fixtures, name):
    """Prefill into slots + batched decode steps over rows of different lengths give the tokens of re-running
    the whole sequence each step."""
    from hetplan.model.torch_transformer import CacheRows, KVCache, TransformerStage

    spec = load_model(fixtures / name)
    st = TransformerStage(spec, seed=3).eval()
    prompts, n = [[3, 1, 4, 1, 5], [9, 2], [7] * 9], 6
    with torch.inference_mode():
        ref = []
        for p in prompts:
            seq = list(p)
            for _ in range(n):
                seq.append(int(st(torch.tensor([seq]))[0, -1].argmax()))
            ref.append(seq[len(p):])
        cache = KVCache(st, slots=4, max_len=32)
        slots = [2, 0, 3]  # any free slots
        out = [[int(st(torch.tensor([p]), rows=CacheRows(cache, torch.tensor([k]), torch.tensor([0])))[0, -1].argmax())]
               for p, k in zip(prompts, slots)]
        for _ in range(n - 1):
            start = torch.tensor([len(p) + len(o) - 1 for p, o in zip(prompts, out)])
            logits = st(torch.tensor([[o[-1]] for o in out]), rows=CacheRows(cache, torch.tensor(slots), start))
            for o, t in zip(out, logits[:, 0].argmax(-1).tolist()):
                o.append(t)
    assert out == ref
    assert cache.nbytes() == 2 * spec.num_layers * 4 * spec.num_kv_heads * 32 * spec.head_dim * 4


def test_decode_cost_per_token_is_flat_in_context_length(fixtures):
    """With the KV cache a decode step costs the same at context 8 and at context 200 (cache of 256); re-running
    the sequence (no cache) costs ~25x more at 200 than at 8 tokens."""
    import time

    from hetplan.model.torch_transformer import CacheRows, KVCache, TransformerStage

    torch.set_num_threads(1)
    spec = load_model(fixtures / "small-opt.json")  # h = 256, 4 layers
    st = TransformerStage(spec, seed=0).eval()
    cache = KVCache(st, slots=1, max_len=256)
    slot = torch.tensor([0])

    def cpu_s(fn) -> float:  # CPU time of this thread (torch runs on it): other jobs on the machine do not count
        t0 = time.thread_time()
        fn()
        return time.thread_time() - t0

    cached, full = {8: [], 200: []}, {8: [], 200: []}
    with torch.inference_mode():
        st(torch.randint(0, 100, (1, 200)), rows=CacheRows(cache, slot, torch.tensor([0])))  # fill 200 positions
        tok = torch.tensor([[5]])
        for _ in range(12):  # interleaved, so both contexts see the same conditions
            for c in (8, 200):
                cached[c].append(cpu_s(lambda: st(tok, rows=CacheRows(cache, slot, torch.tensor([c])))))
                full[c].append(cpu_s(lambda: st(torch.randint(0, 100, (1, c + 1)))))
    cached, full = {c: min(v) for c, v in cached.items()}, {c: min(v) for c, v in full.items()}
    assert cached[200] < 1.5 * cached[8]
    assert full[200] > 4 * full[8]
