"""The mixture-of-experts MLP of :mod:`hetplan.model.torch_transformer`, with expert parallelism (EP) over
``torch.distributed``. Imports torch.

Routing (Mixtral, Qwen2/3-MoE as in their ``transformers`` modelling files, ``MixtralSparseMoeBlock`` /
``Qwen3MoeSparseMoeBlock``): a linear router without bias gives ``E`` logits per token; their softmax (in fp32)
picks the ``k`` most probable experts; the ``k`` probabilities are renormalised to sum to 1 when
``ModelSpec.router_renormalize`` (Mixtral always; Qwen's ``norm_topk_prob``). Each routed expert is a
SwiGLU MLP (``down(silu(gate(x)) * up(x))``, Shazeer 2020) of ``expert_ffn_hidden_size``; the token's output is the
probability-weighted sum of its ``k`` experts' outputs, plus a shared expert of ``shared_expert_ffn_hidden_size``
that every token goes through (Qwen2-MoE scales it by ``sigmoid(shared_gate(x))``). Dropless: every expert takes
every token routed to it (no capacity factor; Megatron-Core's ``--moe-token-dispatcher-type alltoall`` without
``--moe-expert-capacity-factor``, torchtitan's default). No load-balancing loss is added to the training loss.

Expert parallelism (GShard, Lepikhin et al. 2021, Sec. 2.2; Megatron-Core ``MoEAlltoAllTokenDispatcher``): the
``E`` experts are split over the ``ep`` ranks of an EP group, rank ``r`` holding experts
``[r·E/ep, (r+1)·E/ep)``; each rank routes its own tokens, then

1. *dispatch*: the (token, expert) pairs, sorted by expert and so by the rank owning it, are exchanged with one
   ``all_to_all_single`` (uneven splits; the per-expert counts go first, in an all-to-all of ``E`` integers);
2. each rank runs its local experts on the rows it received (regrouped by local expert);
3. *combine*: a second ``all_to_all_single`` with the splits swapped returns every row to the rank that sent it,
   where the rows are weighted by their routing probability and summed per token.

Both all-to-alls are autograd functions whose backward is the reverse all-to-all, so the model trains under EP.
The single-rank model (``ep = 1``) runs the same code without the exchanges, which is why the EP model's outputs
equal it up to floating-point summation order (``tests/runtime/test_moe_ep_equivalence.py``).

Weights are seeded per expert (``layers.{i}.moe.w_up.{e}`` for global expert ``e``), so an EP rank builds only its
own experts and gets the same values as the single-rank model.

Shapes: input ``[b, s, h]`` -> output ``[b, s, h]``; expert weights ``w_gate``, ``w_up`` ``[E/ep, f_e, h]`` and
``w_down`` ``[E/ep, h, f_e]``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from hetplan.errors import HetplanError
from hetplan.model.spec import ModelSpec

#: Names of the expert weight tensors of :class:`MoE` (stacked over this rank's experts).
EXPERT_WEIGHTS = ("w_gate", "w_up", "w_down")


@dataclass(frozen=True)
class ExpertGroup:
    """This rank's place in its expert-parallel group.

    Attributes:
        rank, size: index in the EP group and the group size ``ep``.
        group: the torch.distributed process group of the EP ranks (``None`` when ``size == 1``).
    """

    rank: int = 0
    size: int = 1
    group: object = None


def check_ep(spec: ModelSpec, ep: int) -> None:
    """Check that ``spec``'s experts split over ``ep`` ranks.

    Raises:
        HetplanError: ``ep`` does not divide the number of experts, or the model has none while ``ep > 1``.
    """
    if ep > 1 and (not spec.is_moe or spec.num_experts % ep):
        raise HetplanError(f"EP {ep} does not divide the {spec.num_experts} experts of {spec.name}", field="ep",
                           fix="choose an EP degree that divides the number of experts")


class _AllToAll(torch.autograd.Function):
    """``all_to_all_single`` with uneven splits; backward is the all-to-all with the splits swapped."""

    @staticmethod
    def forward(ctx, x, send: list[int], recv: list[int], group):
        ctx.send, ctx.recv, ctx.group = send, recv, group
        out = x.new_empty((sum(recv),) + tuple(x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), output_split_sizes=recv, input_split_sizes=send, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        out = grad.new_empty((sum(ctx.send),) + tuple(grad.shape[1:]))
        dist.all_to_all_single(out, grad.contiguous(), output_split_sizes=ctx.send, input_split_sizes=ctx.recv,
                               group=ctx.group)
        return out, None, None, None


class MoE(nn.Module):
    """The routed experts (this rank's ``E/ep`` of them) plus the shared expert of one MoE layer (module doc).

    Args:
        spec: model shapes (``num_experts``, ``experts_per_token``, ``expert_ffn_hidden_size``, shared expert).
        ep: this rank's :class:`ExpertGroup` (default: all experts on this rank).

    Raises:
        HetplanError: the EP degree does not divide the experts (:func:`check_ep`).
    """

    def __init__(self, spec: ModelSpec, ep: ExpertGroup | None = None):
        super().__init__()
        ep = ep or ExpertGroup()
        check_ep(spec, ep.size)
        self.spec, self.ep = spec, ep
        h, f, e = spec.hidden_size, spec.expert_ffn_hidden_size, spec.num_experts
        self.num_local = e // ep.size
        self.first_expert = ep.rank * self.num_local
        self.top_k = spec.experts_per_token
        self.renormalize = spec.router_renormalize
        self.router = nn.Linear(h, e, bias=False)
        self.w_gate = nn.Parameter(torch.empty(self.num_local, f, h))
        self.w_up = nn.Parameter(torch.empty(self.num_local, f, h))
        self.w_down = nn.Parameter(torch.empty(self.num_local, h, f))
        fs = spec.shared_expert_ffn_hidden_size
        self.shared_gate_proj = nn.Linear(h, fs, bias=False) if fs else None
        self.shared_up = nn.Linear(h, fs, bias=False) if fs else None
        self.shared_down = nn.Linear(fs, h, bias=False) if fs else None
        self.shared_gate = nn.Linear(h, 1, bias=False) if fs and spec.shared_expert_gate else None

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Top-k experts ``[T, k]`` (int64) and their weights ``[T, k]`` (x's dtype) of tokens ``x`` ``[T, h]``."""
        probs = F.softmax(self.router(x).float(), dim=-1)
        weight, expert = torch.topk(probs, self.top_k, dim=-1)
        if self.renormalize:
            weight = weight / weight.sum(dim=-1, keepdim=True)
        return expert, weight.to(x.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        expert, weight = self.route(x)
        flat = expert.reshape(-1)
        order = torch.argsort(flat, stable=True)  # (token, choice) pairs grouped by expert, so by owning rank
        token = order // self.top_k
        counts = torch.bincount(flat, minlength=self.spec.num_experts)  # [E] pairs per global expert
        rows = x.index_select(0, token)
        if self.ep.size > 1:
            recv_counts = torch.empty_like(counts)
            dist.all_to_all_single(recv_counts, counts, group=self.ep.group)
            send = counts.view(self.ep.size, self.num_local).sum(1).tolist()
            per_source = recv_counts.view(self.ep.size, self.num_local)  # [source rank, local expert]
            recv = per_source.sum(1).tolist()
            rows = _AllToAll.apply(rows, send, recv, self.ep.group)
            # rows arrive grouped by source rank, then by local expert: regroup by local expert
            local = torch.repeat_interleave(torch.arange(self.num_local, device=x.device).repeat(self.ep.size),
                                            per_source.reshape(-1))
            regroup = torch.argsort(local, stable=True)
            out = self._experts(rows.index_select(0, regroup), per_source.sum(0).tolist())
            out = torch.empty_like(out).index_copy(0, regroup, out)
            out = _AllToAll.apply(out, recv, send, self.ep.group)
        else:
            out = self._experts(rows, counts.tolist())
        out = out * weight.reshape(-1, 1).index_select(0, order)
        y = torch.zeros_like(x).index_add(0, token, out)
        if self.shared_up is not None:
            s = self.shared_down(F.silu(self.shared_gate_proj(x)) * self.shared_up(x))
            if self.shared_gate is not None:
                s = torch.sigmoid(self.shared_gate(x)) * s
            y = y + s
        return y.reshape(shape)

    def _experts(self, rows: torch.Tensor, counts: list[int]) -> torch.Tensor:
        """This rank's experts on ``rows`` grouped by local expert (``counts[j]`` rows for expert ``j``)."""
        outs, start = [], 0
        for j, n in enumerate(counts):
            r = rows[start:start + n]
            outs.append((F.silu(r @ self.w_gate[j].t()) * (r @ self.w_up[j].t())) @ self.w_down[j].t())
            start += n
        return torch.cat(outs) if outs else rows[:0]

    def expert_parameters(self) -> list[nn.Parameter]:
        """The parameters split over EP ranks (reduced over expert-DP, not DP)."""
        return [self.w_gate, self.w_up, self.w_down]


def init_moe_weights(moe: MoE, prefix: str, seed: int, num_layers: int, normal) -> None:
    """Seed ``moe``'s weights by name (``prefix`` = ``layers.{i}.moe``, the layer's global index): router and shared
    expert as whole tensors, each routed expert on its own (module doc); ``normal(shape, seed, name, std)`` draws
    them. Down projections use std 0.02 / sqrt(2L) as the dense MLP's (GPT-2 init)."""
    std, down_std = 0.02, 0.02 / (2 * num_layers) ** 0.5
    with torch.no_grad():
        for name in EXPERT_WEIGHTS:
            p = getattr(moe, name)
            for j in range(moe.num_local):
                e = moe.first_expert + j
                p[j].copy_(normal(tuple(p.shape[1:]), seed, f"{prefix}.{name}.{e}",
                                  down_std if name == "w_down" else std))
        for name in ("router", "shared_gate_proj", "shared_up", "shared_down", "shared_gate"):
            lin = getattr(moe, name)
            if lin is not None:
                lin.weight.copy_(normal(tuple(lin.weight.shape), seed, f"{prefix}.{name}.weight",
                                        down_std if name == "shared_down" else std))
