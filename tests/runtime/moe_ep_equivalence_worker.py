"""Worker for test_moe_ep_equivalence (under torchrun, DP = world size, EP = argv[2]): for each model config in
argv[3:], the expert-parallel model on this rank's share of the batch gives the single-process model's logits, loss
and gradients on the whole batch (gradients reduced as the trainer does: dense over DP, experts over expert-DP / DP).
Writes rank{r}.json into the folder argv[1]."""

import json
import sys

import torch
import torch.distributed as dist

from hetplan.model.spec import load_model
from hetplan.plan import ParallelLayout
from hetplan.profile import torchparts
from hetplan.runtime import expert_parallel
from hetplan.runtime.planio import Layout
from hetplan.runtime.trainer import _allreduce_grads

if __name__ == "__main__":
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world, ep = dist.get_rank(), dist.get_world_size(), int(sys.argv[2])
    lay = Layout(parallel=ParallelLayout.of(dp=world, ep=ep), stage_layers=((0, 2),), num_microbatches=1,
                 schedule="1f1b", virtual_stages=1, chunk_layers=((0, 2),))
    group, expert_dp = expert_parallel.process_groups(lay, rank)
    out = {"rank": rank, "ep_rank": group.rank, "models": {}}
    b, s = 2, 16
    for path in sys.argv[3:]:
        spec = load_model(path)
        n = spec.num_layers
        full = torchparts.build_stage(spec, 0, n, True, True, seed=7)
        part = torchparts.build_stage(spec, 0, n, True, True, seed=7, ep=group)
        g = torch.Generator().manual_seed(11)
        tokens = torch.randint(0, spec.vocab_size, (world * b, s), generator=g)
        target = torch.randint(0, spec.vocab_size, (world * b, s), generator=g)
        mine = slice(rank * b, (rank + 1) * b)
        logits_full = full(tokens)
        loss_full = torchparts.loss_fn(logits_full, target)
        loss_full.backward()
        logits = part(tokens[mine])
        loss = torchparts.loss_fn(logits, target[mine])
        loss.backward()
        dense, experts = expert_parallel.split_parameters([part])
        _allreduce_grads(dense, dist.group.WORLD, world)
        _allreduce_grads(experts, expert_dp, world)
        mean_loss = loss.detach().clone()
        dist.all_reduce(mean_loss)
        full_params = dict(full.named_parameters())
        grad_diff = grad_max = 0.0
        for name, p in part.named_parameters():
            ref = full_params[name].grad
            if p.shape != ref.shape:  # this rank's experts of the full tensor
                moe = part.get_submodule(name.rsplit(".", 1)[0])
                ref = ref[moe.first_expert: moe.first_expert + moe.num_local]
            grad_diff = max(grad_diff, float((p.grad - ref).abs().max()))
            grad_max = max(grad_max, float(ref.abs().max()))
        moe = next(m for m in part.modules() if hasattr(m, "num_local"))
        out["models"][spec.name] = {
            "loss_full": float(loss_full), "loss_ep": float(mean_loss) / world,
            "logits_diff": float((logits - logits_full[mine]).abs().max()),
            "logits_max": float(logits_full.abs().max()), "grad_diff": grad_diff, "grad_max": grad_max,
            "local_experts": moe.num_local, "expert_grad_norm": float(sum(p.grad.norm() for p in experts)),
        }
    with open(f"{sys.argv[1]}/rank{rank}.json", "w") as fh:
        json.dump(out, fh)
    torchparts.finish_process_group(True)
    torchparts.exit_rank(0)
