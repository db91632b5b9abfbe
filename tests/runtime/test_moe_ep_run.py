"""MoE with expert parallelism in the reference runtime, for real on CPU (gloo): the EP model equals the
single-process model, ``hetplan run`` trains a tiny MoE plan with EP 2, and what it cannot run (CP on CPU) it refuses
naming what torch lacks."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

from hetplan.errors import HetplanError
from hetplan.model import counts
from hetplan.model.spec import load_model
from hetplan.plan_rules import PlanRuleError
from hetplan.runtime import planio
from hetplan.runtime.launcher import RunOptions, run_plan

ROOT = Path(__file__).parents[2]
EP_PLAN = ROOT / "examples" / "tiny-moe-ep2.json"
MODELS = [ROOT / "examples" / "tiny-moe.json", ROOT / "tests" / "fixtures" / "models" / "tiny-qwen2-moe.json",
          ROOT / "tests" / "fixtures" / "models" / "tiny-qwen3-moe.json"]


@pytest.mark.parametrize("path", MODELS, ids=lambda p: p.stem)
def test_torch_moe_has_the_planners_parameter_count(path):
    """The torch MoE model (routed experts, router, shared expert and its gate, Q/K norms, QKV biases) holds exactly
    the parameters hetplan.model.counts prices."""
    from hetplan.model.torch_transformer import TransformerStage

    spec = load_model(path)
    model = TransformerStage(spec)
    assert sum(p.numel() for p in model.parameters()) == counts.total_parameters(spec)


def test_ep_model_equals_single_process_model(tmp_path):
    """4 gloo ranks, DP 4 with EP 2 (two EP groups, expert-DP 2), three MoE shapes (Mixtral; Qwen2-MoE with shared
    expert and unnormalised top-k; Qwen3-MoE with Q/K norms and a dense first layer): each rank's logits, the mean
    loss and every gradient (dense averaged over DP, experts summed over expert-DP / DP) equal those of the
    single-process model on the whole batch. Expert gradients include every rank's tokens only if the all-to-all
    dispatch and its backward carry them."""
    worker = Path(__file__).with_name("moe_ep_equivalence_worker.py")
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4",
                        str(worker), str(tmp_path), "2", *map(str, MODELS)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = [json.loads(f.read_text()) for f in sorted(tmp_path.glob("rank*.json"))]
    assert [row["ep_rank"] for row in rows] == [0, 1, 0, 1]
    for path in MODELS:
        spec = load_model(path)
        res = [row["models"][spec.name] for row in rows]
        for m in res:
            assert m["local_experts"] * 2 == spec.num_experts
            assert m["loss_ep"] == pytest.approx(m["loss_full"], rel=1e-6)
            assert m["logits_diff"] <= 1e-5 * m["logits_max"]
            assert m["grad_diff"] <= 1e-5 * m["grad_max"]
        # the ranks of an expert-DP group hold the same experts and gradients; the two EP ranks different ones
        assert res[0]["expert_grad_norm"] == pytest.approx(res[2]["expert_grad_norm"], rel=1e-6)
        assert res[0]["expert_grad_norm"] != pytest.approx(res[1]["expert_grad_norm"], rel=1e-3)


def test_hetplan_run_moe_ep2_trains_as_without_ep(tmp_path):
    """``hetplan run`` on the tiny Mixtral-shaped plan: DP 2 with EP 2 (two experts per rank) under DDP, and the two
    layers on two pipeline stages (PP 2 x DP 2 x EP 2, an all-to-all inside each stage of 1F1B) under FSDP (which
    leaves the experts to the expert-DP reduction), keep the weights equal over DP and after 3 AdamW steps have the
    loss of the same plan without EP (DDP over whole replicas): the dispatch, the gradient reduction and the updates
    of the real trainer are those of the unsplit model. (DDP with PP is run by tests/runtime/test_run_verify.py.)"""
    opts = dict(iterations=2, warmup=1, stage_repeats=1)
    no_ep = tmp_path / "no-ep.json"
    no_ep.write_text(_plan(EP_PLAN, ep=1).model_dump_json())
    ref = run_plan(no_ep, RunOptions(**opts))
    assert ref["ep"] == 1
    spec = load_model(ROOT / "examples" / "tiny-moe.json")
    experts = spec.num_layers * 4 * 3 * 64 * 128  # 2 layers x 4 experts x 3 matrices of 64 x 128
    dense = counts.total_parameters(spec) - experts
    pp = tmp_path / "pp2.json"
    pp.write_text(_plan(EP_PLAN, pools=[{"gpu": "cpu", "count": 4, "gpus_per_node": 4}],
                        stages=[{"num_layers": 1, "dp": 2}, {"num_layers": 1, "dp": 2}]).model_dump_json())
    # fp32 weights of one DP replica (its ranks over the stages): half of the experts; FSDP also halves the rest
    for plan, mode, weights in ((EP_PLAN, "ddp", dense + experts // 2), (pp, "fsdp", dense // 2 + experts // 2)):
        res = run_plan(plan, RunOptions(dp_mode=mode, **opts))
        assert (res["dp"], res["ep"], res["dp_mode"]) == (2, 2, mode)
        assert res["dp_replicas_in_sync"] is True
        assert res["loss"] == pytest.approx(math.log(256), abs=0.3)  # random weights and tokens
        assert res["loss"] == pytest.approx(ref["loss"], rel=1e-6), mode
        for d in range(2):
            assert sum(r["weights_bytes"] for r in res["ranks"] if r["dp_rank"] == d) == 4 * weights, mode
        assert all(r["forward_s"] > 0 and r["backward_s"] > 0 for r in res["ranks"])
    assert (res["world_size"], res["pp"]) == (4, 2)


def _plan(path: Path, **update):
    raw = json.loads(path.read_text())
    raw.update(update)
    raw["job"]["model"] = str(path.parent / raw["job"]["model"])
    return planio.Plan.model_validate(raw)


def test_run_refusals_name_what_is_missing():
    """Refused before any process starts: CP (torch's ring attention has no CPU kernel), EP not dividing DP, and
    models whose attention or router the reference transformer does not build."""
    spec = load_model(ROOT / "examples" / "tiny-moe.json")
    with pytest.raises(HetplanError, match="CP 2.*_scaled_dot_product_flash_attention_for_cpu") as e:
        planio.layout(_plan(EP_PLAN, cp=2, ep=1, stages=[{"num_layers": 2, "dp": 1}]), spec)
    assert e.value.field == "plan.cp"
    pools = [{"gpu": "cpu", "count": 4, "gpus_per_node": 4}]
    for ep, etp in ((4, 1), (2, 2)):  # EP folded over TP x DP, and expert-TP: named, with the way out
        with pytest.raises(PlanRuleError, match=f"EP {ep} x expert-TP {etp} over DP 2 is MoE parallel folding") as e:
            planio.layout(_plan(EP_PLAN, ep=ep, expert_tp=etp, pools=pools,
                                stages=[{"num_layers": 2, "tp": 2, "dp": 2}]), spec)
        assert e.value.rule == "framework-can-launch" and "expert_tp = 1" in e.value.fix
    with pytest.raises(HetplanError, match="deepseek_v3 router .*MLA"):
        planio.layout(_plan(EP_PLAN), load_model("deepseek-v3").model_copy(update={"num_layers": 2}))


def test_cp_refusal_matches_torch(tmp_path):
    """The CP refusal's reason is what torch 2.13 does: context_parallel on CPU fails on the CPU attention kernel.
    When a torch version runs it, this test fails and the refusal should be replaced by a CP run."""
    code = ("import torch, torch.distributed as dist, torch.nn.functional as F\n"
            "from torch.distributed.device_mesh import init_device_mesh\n"
            "from torch.distributed.tensor.experimental import context_parallel\n"
            f"dist.init_process_group('gloo', init_method='file://{tmp_path}/store', rank=0, world_size=1)\n"
            "mesh = init_device_mesh('cpu', (1,), mesh_dim_names=('cp',))\n"
            "q = torch.randn(1, 2, 16, 8)\n"
            "try:\n"
            "    with context_parallel(mesh, buffers=[q], buffer_seq_dims=[2]):\n"
            "        F.scaled_dot_product_attention(q, q, q, is_causal=True)\n"
            "    print('ran')\n"
            "except NotImplementedError as e:\n"
            "    print('refused:', e)\n"
            "dist.destroy_process_group()\n"
            "from hetplan.profile.torchparts import exit_rank\n"
            "exit_rank(0)\n")  # as the trainer's ranks leave (see exit_rank)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "refused: Operator aten._scaled_dot_product_flash_attention_for_cpu" in r.stdout
    assert "aten._scaled_dot_product_flash_attention_for_cpu" in planio.CP_MISSING
