"""Issue 27, item 1: every plan ``plan -o`` writes is one that ``estimate`` and ``export`` (each target) accept.

For each GPU type of the catalog: plan a small model on it (fp16 where the type has no BF16 rate), write the plan,
then estimate it and export it to Megatron-LM, DeepSpeed and torchtitan. A pool's node defaults to the GPU type's
reference node, so a reference node that holds another GPU type (``dgx-a100`` once served both A100-SXM sizes)
writes plans that every later command refuses; the catalog check below catches that at the data.
"""

from __future__ import annotations

import pytest

from hetplan.hardware.catalog import load_catalog, load_nodes
from tests.fuzz.inproc import run_cli

GPUS = [g.name for g in load_catalog().gpus.values()]


def test_every_reference_node_holds_its_gpu_type():
    catalog, nodes = load_catalog(), load_nodes()
    for node in nodes.nodes.values():
        for name in node.reference_for:
            assert catalog.get(name).name == catalog.get(node.gpu).name, (node.name, name)


#: Each export target with the framework whose plans it runs (``Job.framework``) and the pins that keep the search
#: to what the target expresses: DeepSpeed's PipelineModule has no TP and no interleaving, and its PipelineEngine
#: asserts ZeRO < 2 (a ``framework = "deepspeed"`` plan with TP is Megatron-DeepSpeed's, exported --to megatron).
TARGETS = {"megatron": ("megatron", ()), "deepspeed": ("deepspeed", ("--tp", "1", "--virtual-stages", "1",
                                                                      "--zero", "1")),
           "torchtitan": ("fsdp", ())}


@pytest.mark.parametrize("gpu", GPUS)
def test_plan_written_then_estimated_and_exported(gpu, tmp_path):
    spec = load_catalog().get(gpu)
    dtype = "bf16" if spec.dense_flops_per_s.get("bf16") else "fp16"
    for target, (framework, pins) in TARGETS.items():
        if target == "torchtitan" and dtype == "fp16":
            continue  # torchtitan's mixed precision has no float16 (a refusal, tested in tests/runtime)
        out = tmp_path / f"{target}.json"
        r = run_cli("plan", "--model", "open-llama-3b-v2", "--seq-len", "1024", "--global-batch", "16",
                    "--iterations", "10", "--gpu", gpu, "--gpus", "8", "--dtype", dtype, "--framework", framework,
                    *pins, "-q", "-o", out)
        assert r.code == 0 and not r.traceback, (framework, r.stdout, r.stderr, r.traceback)
        r = run_cli("estimate", out)
        assert r.code == 0 and not r.traceback, (framework, r.stdout, r.stderr, r.traceback)
        r = run_cli("export", out, "--to", target)
        assert r.code == 0 and not r.traceback, (target, r.stdout, r.stderr, r.traceback)


def test_readme_flow_plan_then_estimate_and_export(tmp_path, monkeypatch):
    """The README's first command followed by estimate / export of the plan it writes (issue 27: every
    A100-SXM-40GB plan was refused), run from outside the repository."""
    from pathlib import Path

    example = Path(__file__).resolve().parents[2] / "examples" / "llama2-7b-mixed-cloud.toml"
    monkeypatch.chdir(tmp_path)
    r = run_cli("plan", example, "-q", "-o", "plan.json")
    assert r.code == 0 and not r.traceback, r.stderr
    assert run_cli("estimate", "plan.json").code == 0
    r = run_cli("export", "plan.json", "--to", "megatron")
    assert r.code == 0 and not r.traceback, r.stderr
