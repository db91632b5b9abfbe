"""Single-process greedy generation with the full model: the reference the engine must reproduce."""

from functools import lru_cache

from hetplan.model.spec import load_model


@lru_cache(maxsize=None)
def _stage(model: str, seed: int, num_layers):
    from hetplan.model.torch_transformer import TransformerStage

    spec = load_model(model)
    if num_layers is not None:
        spec = spec.model_copy(update={"num_layers": num_layers})
    return TransformerStage(spec, seed=seed).eval()


def greedy(model: str, seed: int, prompt, n: int, num_layers=None) -> list[int]:
    return list(_greedy(str(model), seed, tuple(prompt), n, num_layers))


@lru_cache(maxsize=4096)
def _greedy(model: str, seed: int, prompt: tuple, n: int, num_layers) -> tuple:
    import torch

    st = _stage(model, seed, num_layers)
    seq = list(prompt)
    with torch.inference_mode():
        for _ in range(n):
            seq.append(int(st(torch.tensor([seq]))[0, -1].argmax()))
    return tuple(seq[len(prompt):])
