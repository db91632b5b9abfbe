"""Which models the torch reference transformer (:mod:`hetplan.model.torch_transformer`) builds. No torch.

``hetplan run``, ``verify``, ``profile`` and ``serve`` check a model with :func:`unsupported_features` before any
process starts, and the torch model refuses the same list when built.
"""

from __future__ import annotations

from hetplan.model.spec import ModelSpec

#: MoE families whose router is the softmax top-k that :mod:`hetplan.model.torch_moe` implements (DeepSeek-V2/V3
#: route with group-limited softmax / sigmoid scores plus a bias, Llama 4 with a sigmoid of the top-1 logit).
SOFTMAX_TOPK_FAMILIES = ("mixtral", "qwen2_moe", "qwen3_moe", "gpt_oss")


def unsupported_features(spec: ModelSpec) -> list[str]:
    """What ``spec`` has that the reference transformer does not build (empty when it builds it), e.g.
    ``["MLA (multi-head latent attention)", "attention sinks"]``."""
    out = []
    if spec.is_moe and spec.family not in SOFTMAX_TOPK_FAMILIES:
        out.append(f"a {spec.family} router (not softmax top-k)")
    for on, what in ((spec.is_mla, "MLA (multi-head latent attention)"), (spec.attention_sinks, "attention sinks"),
                     (spec.alibi, "ALiBi positions"),  # it would run rotary positions instead
                     (spec.sliding_window_layers > 0, "sliding-window attention"),  # it attends every key
                     (spec.post_norms, "post-attention / post-MLP norms")):  # Gemma's four norms per layer
        if on:
            out.append(what)
    return out
