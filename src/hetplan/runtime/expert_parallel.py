"""Expert parallelism in the reference trainer: the EP and expert-DP process groups of a
:class:`~hetplan.runtime.planio.Layout`, and which parameters each reduces. Imports torch.

With EP, the experts of a MoE layer differ between the DP ranks of an EP group, so DDP's all-reduce over DP would
mix different experts, and FSDP would shard them as if they were equal. The dense parameters (attention, norms,
router, shared expert, embeddings) are averaged over DP (by FSDP, or by the trainer after the backward in place of
DDP); the expert weights, left out of FSDP, are summed over expert-DP after the backward and divided by DP — the
gradient of the mean loss over the global batch, as Megatron-Core scales expert gradients
(``megatron/core/distributed/distributed_data_parallel.py``: ``expert_gradient_scaling_factor =
1 / data_parallel_world_size``).
"""

from __future__ import annotations

import torch.distributed as dist
from torch import nn

from hetplan.model.torch_moe import ExpertGroup, MoE
from hetplan.runtime.planio import Layout


def process_groups(lay: Layout, rank: int) -> tuple[ExpertGroup, object]:
    """This rank's :class:`ExpertGroup` and its expert-DP process group. Collective: every rank creates every
    group, in :meth:`Layout.ep_groups` / :meth:`Layout.expert_dp_groups` order."""
    ep = ExpertGroup()
    expert_dp = None
    for ranks in lay.ep_groups():
        group = dist.new_group(ranks)
        if rank in ranks:
            ep = ExpertGroup(ranks.index(rank), len(ranks), group)
    for ranks in lay.expert_dp_groups():
        group = dist.new_group(ranks)
        if rank in ranks:
            expert_dp = group
    return ep, expert_dp


def split_parameters(modules: list[nn.Module]) -> tuple[list[nn.Parameter], list[nn.Parameter]]:
    """``(dense, expert)`` parameters of ``modules``: expert = the routed experts' weights of their MoE layers."""
    expert = [p for m in modules for sub in m.modules() if isinstance(sub, MoE) for p in sub.expert_parameters()]
    ids = {id(p) for p in expert}
    return [p for m in modules for p in m.parameters() if id(p) not in ids], expert

