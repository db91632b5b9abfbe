"""The torch MoE layer against the ``transformers`` MoE blocks built from the same config.json with random weights
(MixtralSparseMoeBlock, Qwen2MoeSparseMoeBlock with its gated shared expert, Qwen3MoeSparseMoeBlock): same weights,
same outputs. ``transformers`` is not a hetplan dependency; the test runs where it is installed (checked with
transformers 5.23.0: differences <= 2e-9 against outputs of about 5e-3)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from hetplan.model.spec import load_model
from hetplan.model.torch_transformer import TransformerStage

ROOT = Path(__file__).parents[2]
MODELS = [ROOT / "examples" / "tiny-moe.json", ROOT / "tests" / "fixtures" / "models" / "tiny-qwen2-moe.json",
          ROOT / "tests" / "fixtures" / "models" / "tiny-qwen3-moe.json"]


def _copy_experts(moe, sd: dict, f: int) -> None:
    """HF expert weights into ours: fused ``gate_up_proj`` [E, 2f, h] (gate rows first) and ``down_proj``
    [E, h, f] (transformers 5), or one module per expert (transformers 4: w1/w3/w2 or gate/up/down_proj)."""
    if "experts.gate_up_proj" in sd:
        moe.w_gate.copy_(sd["experts.gate_up_proj"][:, :f])
        moe.w_up.copy_(sd["experts.gate_up_proj"][:, f:])
        moe.w_down.copy_(sd["experts.down_proj"])
        return
    for e in range(moe.num_local):
        def get(*names):
            return next(sd[f"experts.{e}.{n}.weight"] for n in names if f"experts.{e}.{n}.weight" in sd)
        moe.w_gate[e].copy_(get("w1", "gate_proj"))
        moe.w_up[e].copy_(get("w3", "up_proj"))
        moe.w_down[e].copy_(get("w2", "down_proj"))


@pytest.mark.parametrize("path", MODELS, ids=lambda p: p.stem)
def test_moe_layer_equals_transformers_block(path):
    cfg = {k: v for k, v in json.loads(path.read_text()).items() if k != "source"}
    spec = load_model(path)
    torch.manual_seed(0)
    hf = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**cfg)).float().eval()
    layer = next(i for i in range(spec.num_layers) if spec.is_moe_layer(i))
    block = hf.model.layers[layer].mlp
    moe = TransformerStage(spec).layers[layer].moe
    sd = dict(block.named_parameters())
    with torch.no_grad():
        moe.router.weight.copy_(sd["gate.weight"])
        _copy_experts(moe, sd, spec.expert_ffn_hidden_size)
        if moe.shared_up is not None:
            for ours, theirs in (("shared_gate_proj", "gate_proj"), ("shared_up", "up_proj"),
                                 ("shared_down", "down_proj")):
                getattr(moe, ours).weight.copy_(sd[f"shared_expert.{theirs}.weight"])
            moe.shared_gate.weight.copy_(sd["shared_expert_gate.weight"])
        x = torch.randn(2, 7, spec.hidden_size)
        ref = block(x)
        ref = ref[0] if isinstance(ref, tuple) else ref
        assert float((moe(x) - ref).abs().max()) <= 1e-5 * float(ref.abs().max())
