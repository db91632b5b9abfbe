"""A small, general torch decoder-only transformer built from a :class:`~hetplan.model.spec.ModelSpec`.

Used by the serving engine (:mod:`hetplan.serve.engine`) and meant for reuse by the training runtime and the
profiler. Only torch-using code imports this module.

What it covers (the families of :mod:`hetplan.model.spec`):

* positions: learned table (GPT-2, OPT with its offset of 2, Megatron GPT) or rotary (Llama, Mistral, GPT-NeoX;
  Su et al. 2021, "RoFormer", Eq. 34, applied to the whole head dimension);
* norms: LayerNorm (weight + bias) or RMSNorm (weight only; Zhang & Sennrich 2019), pre-norm blocks; optional
  RMSNorm of each head's query and key (Qwen3) and Q/K/V biases without an output bias (Qwen2);
* MLP: GeLU (2 matrices) or SwiGLU (3 matrices; Shazeer 2020); in the MoE layers of a mixture-of-experts model
  (``mixtral``, ``qwen3_moe`` shapes) routed SwiGLU experts with optional shared expert, split over expert-parallel
  ranks (:mod:`hetplan.model.torch_moe`);
* attention: multi-head or grouped-query (GQA; Ainslie et al. 2023), causal, via
  ``torch.nn.functional.scaled_dot_product_attention``.

Pipeline stages: :class:`TransformerStage` builds only layers ``[start, end)``, with or without the input
embedding (first stage) and the final norm + output head (last stage). When a stage is both first and last and
the model ties its embeddings, the head reuses the embedding matrix; otherwise the last stage holds its own copy
of the output matrix (as Megatron-LM does for tied embeddings under pipeline parallelism).

Tensor parallelism (Megatron-LM; Shoeybi et al. 2019, Sec. 3, Fig. 3): Q/K/V and the MLP up/gate projections are
column-parallel (each rank holds ``a/t`` query heads, ``g/t`` key/value heads, ``f/t`` MLP columns); the attention
output and MLP down projections are row-parallel and followed by an all-reduce over the TP process group; the
input embedding and the output head are vocabulary-parallel (``V_pad/t`` rows each; embedding all-reduce, logits
all-gather). Row-parallel biases are added once, after the all-reduce.

The TP collectives are autograd-aware (Megatron's ``f``/``g`` operators: identity forward and all-reduce backward
at the input of column-parallel layers, the reverse after row-parallel ones; the logits all-gather gives each rank
its slice of the gradient), so the same module trains under TP. Dropout is not applied.

Random weights are seeded *per full tensor* (seed and parameter name), and a rank keeps its slice, so a model
gives the same outputs whatever its TP x PP partition (up to floating-point reduction order).

KV cache (serving): :class:`KVCache` keeps each layer's keys and values of this rank's ``g/t`` key/value heads
in slots of ``max_len`` tokens, one slot per running sequence; a forward pass given a :class:`CacheRows` writes the
new tokens' K/V into its rows' slots and attends over the cached ones, so a decode step costs one token's work
whatever the context length (Pope et al. 2023, "Efficiently Scaling Transformer Inference", Sec. 2).

Shapes: token ids ``[b, s]`` (int64), hidden states ``[b, s, h]``, logits ``[b, s, V]`` (the unpadded vocabulary).
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from hetplan.errors import HetplanError
from hetplan.model.reference import unsupported_features
from hetplan.model.spec import ModelSpec
from hetplan.model.torch_moe import ExpertGroup, MoE, init_moe_weights

OPT_POSITION_OFFSET = 2  # OPTLearnedPositionalEmbedding adds 2 to positions (HF transformers)


@dataclass(frozen=True)
class Partition:
    """Which part of the model a rank builds.

    Attributes:
        start_layer, end_layer: layers ``[start_layer, end_layer)`` of this pipeline stage.
        first: the stage holds the input embedding (and position table).
        last: the stage holds the final norm and the output head.
        tp_rank, tp_size: this rank's index in its tensor-parallel group and the group size t.
        tp_group: the torch.distributed process group of the TP ranks (``None`` when ``tp_size == 1``).
        ep: this rank's expert-parallel group (MoE models; :class:`~hetplan.model.torch_moe.ExpertGroup`). The
            MoE layers are not TP-sharded: each TP rank runs them whole on its (replicated) hidden states.
    """

    start_layer: int
    end_layer: int
    first: bool
    last: bool
    tp_rank: int = 0
    tp_size: int = 1
    tp_group: object = None
    ep: ExpertGroup = ExpertGroup()


def check_tp(spec: ModelSpec, tp: int) -> None:
    """Check that ``spec`` can be split over ``tp`` tensor-parallel ranks.

    Raises:
        HetplanError: heads, key/value heads or MLP width not divisible by ``tp``.
    """
    for what, n in (("num_attention_heads", spec.num_attention_heads), ("num_kv_heads", spec.num_kv_heads),
                    ("ffn_hidden_size", spec.ffn_hidden_size)):
        if n % tp:
            raise HetplanError(f"{what} = {n} of model {spec.name} is not divisible by TP = {tp}", field="tp",
                               fix=f"choose a TP degree that divides {n}")


def padded_vocab(spec: ModelSpec, tp: int) -> int:
    """Vocabulary padded to a multiple of 128 x t (Megatron-LM ``--make-vocab-size-divisible-by``)."""
    return spec.padded_vocab_size(128 * tp)


def _seeded_normal(shape: tuple[int, ...], seed: int, name: str, std: float) -> torch.Tensor:
    g = torch.Generator().manual_seed((seed * 1_000_003 + zlib.crc32(name.encode())) % (2**63))
    return torch.randn(shape, generator=g) * std


class _Norm(nn.Module):
    def __init__(self, spec: ModelSpec, eps: float = 1e-5, size: int | None = None):
        super().__init__()
        self.rms = spec.norm == "rmsnorm"
        self.eps = eps
        size = size or spec.hidden_size
        self.weight = nn.Parameter(torch.ones(size))
        self.bias = None if self.rms or not spec.norm_bias else nn.Parameter(torch.zeros(size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.rms:
            var = x.float().pow(2).mean(-1, keepdim=True)
            return (x.float() * torch.rsqrt(var + self.eps)).to(x.dtype) * self.weight
        return F.layer_norm(x, (x.shape[-1],), self.weight, self.bias, self.eps)


class _CopyToTP(torch.autograd.Function):
    """Megatron's ``f``: identity forward, all-reduce of the gradient backward (input of column-parallel layers)."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class _ReduceFromTP(torch.autograd.Function):
    """Megatron's ``g``: all-reduce forward, identity backward (output of row-parallel layers)."""

    @staticmethod
    def forward(ctx, x, group):
        x = x.contiguous().clone()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class _GatherFromTP(torch.autograd.Function):
    """All-gather along the last dimension forward; this rank's slice of the gradient backward."""

    @staticmethod
    def forward(ctx, x, group, rank, size):
        ctx.rank, ctx.size = rank, size
        chunks = [torch.empty_like(x) for _ in range(size)]
        dist.all_gather(chunks, x.contiguous(), group=group)
        return torch.cat(chunks, dim=-1)

    @staticmethod
    def backward(ctx, grad):
        return grad.chunk(ctx.size, dim=-1)[ctx.rank].contiguous(), None, None, None


def _copy_to_tp(x: torch.Tensor, part: Partition) -> torch.Tensor:
    return _CopyToTP.apply(x, part.tp_group) if part.tp_size > 1 else x


def _all_reduce(x: torch.Tensor, part: Partition) -> torch.Tensor:
    return _ReduceFromTP.apply(x, part.tp_group) if part.tp_size > 1 else x


def _rotary(x: torch.Tensor, positions: torch.Tensor, theta: float = 10000.0) -> torch.Tensor:
    """Rotate pairs (i, i + d/2) of ``x`` [b, heads, s, d] by position-dependent angles (RoFormer Eq. 34);
    ``positions`` is ``[s]`` (shared) or ``[b, s]`` (per sequence)."""
    d = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float32, device=x.device) / d))
    ang = positions.to(torch.float32)[..., None] * inv  # [s, d/2] or [b, s, d/2]
    if ang.dim() == 3:
        ang = ang[:, None]  # [b, 1, s, d/2]
    cos, sin = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


class KVCache:
    """Keys and values of one pipeline stage's layers, this TP rank's ``g/t`` heads, in ``slots`` x ``max_len``.

    ``k`` and ``v`` are ``[layers, slots, g/t, max_len, d]``; a running sequence owns one slot. Bytes:
    :meth:`nbytes` = 2 · layers · slots · (g/t) · max_len · d · dtype size (what
    :func:`hetplan.estimate.inference.kv_cache_bytes` counts).
    """

    def __init__(self, stage: "TransformerStage", slots: int, max_len: int, device=None, dtype=None):
        spec, t = stage.spec, stage.part.tp_size
        shape = (len(stage.layers), slots, spec.num_kv_heads // t, max_len, spec.head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.max_len = max_len

    def nbytes(self) -> int:
        return 2 * self.k.numel() * self.k.element_size()


@dataclass
class CacheRows:
    """The cache rows a forward pass uses: sequence i of the batch owns slot ``slots[i]`` and has ``start[i]``
    tokens cached already. A pass is a *prefill* (every ``start`` 0, ``s`` new tokens each), a *prefill chunk*
    (``s`` new tokens after ``start[i]`` cached ones: chunked prefill, Sarathi-Serve, Agrawal et al. OSDI'24) or a
    *decode* step (one new token per sequence, any ``start``)."""

    cache: KVCache
    slots: torch.Tensor  # [b] int64
    start: torch.Tensor  # [b] int64
    #: positions whose logits the last stage computes (``[b]``; e.g. each prompt's last token), all when ``None``
    logits_at: torch.Tensor | None = None


class Block(nn.Module):
    """One pre-norm transformer layer, TP-sharded: ``x + Attn(Norm(x))`` then ``x + MLP(Norm(x))``."""

    def __init__(self, spec: ModelSpec, part: Partition, layer: int = 0):
        super().__init__()
        t = part.tp_size
        self.spec, self.part = spec, part
        self.heads = spec.num_attention_heads // t
        self.kv_heads = spec.num_kv_heads // t
        self.head_dim = spec.head_dim
        h, bias = spec.hidden_size, spec.linear_bias
        self.norm1, self.norm2 = _Norm(spec), _Norm(spec)
        qkv_bias = bias or spec.qkv_bias
        self.q = nn.Linear(h, self.heads * self.head_dim, bias=qkv_bias)
        self.k = nn.Linear(h, self.kv_heads * self.head_dim, bias=qkv_bias)
        self.v = nn.Linear(h, self.kv_heads * self.head_dim, bias=qkv_bias)
        # Qwen3: RMSNorm of each head's query and key before the rotary embedding (Qwen3Attention, transformers)
        self.q_norm = _Norm(spec, size=self.head_dim) if spec.qk_norm else None
        self.k_norm = _Norm(spec, size=self.head_dim) if spec.qk_norm else None
        self.o = nn.Linear(self.heads * self.head_dim, h, bias=False)
        self.o_bias = nn.Parameter(torch.zeros(h)) if bias else None
        f = spec.ffn_hidden_size // t
        moe = spec.is_moe_layer(layer)
        self.moe = MoE(spec, part.ep) if moe else None
        self.up = None if moe else nn.Linear(h, f, bias=bias)
        self.gate = nn.Linear(h, f, bias=bias) if spec.gated_mlp and not moe else None
        self.down = None if moe else nn.Linear(f, h, bias=False)
        self.down_bias = nn.Parameter(torch.zeros(h)) if bias and not moe else None

    def forward(self, x: torch.Tensor, positions: torch.Tensor, rows: CacheRows | None = None,
                layer: int = 0) -> torch.Tensor:
        b, s, _ = x.shape
        y = _copy_to_tp(self.norm1(x), self.part)
        q = self.q(y).view(b, s, self.heads, self.head_dim)
        k = self.k(y).view(b, s, self.kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        v = self.v(y).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        if self.spec.learned_positions == 0:
            q, k = _rotary(q, positions), _rotary(k, positions)
        mask, causal = None, True
        if rows is not None:
            ck, cv = rows.cache.k[layer], rows.cache.v[layer]
            if s > 1 and not bool(rows.start.any()):  # prefill: the rows start empty; write, attend causally
                ck[rows.slots, :, :s] = k
                cv[rows.slots, :, :s] = v
            elif s > 1:  # prefill chunks: write each row's K/V after its cached tokens, attend over all of them
                limit = rows.cache.max_len
                for r in range(b):  # a row padded past its slot writes only what fits (never attended)
                    st = int(rows.start[r])
                    m = min(s, limit - st)
                    ck[rows.slots[r], :, st:st + m] = k[r, :, :m]
                    cv[rows.slots[r], :, st:st + m] = v[r, :, :m]
                n = min(int(rows.start.max()) + s, limit)
                k, v = ck[:, :, :n].index_select(0, rows.slots), cv[:, :, :n].index_select(0, rows.slots)
                qpos = rows.start[:, None] + torch.arange(s, device=x.device)[None]  # [b, s]
                mask = (torch.arange(n, device=x.device)[None, None] <= qpos[:, :, None])[:, None]  # [b, 1, s, n]
                causal = False
            else:  # decode: write the new token at its position, attend over the row's cached tokens
                ck[rows.slots, :, rows.start] = k[:, :, 0]
                cv[rows.slots, :, rows.start] = v[:, :, 0]
                n = int(rows.start.max()) + 1
                k, v = ck[:, :, :n].index_select(0, rows.slots), cv[:, :, :n].index_select(0, rows.slots)
                mask = (torch.arange(n, device=x.device)[None] <= rows.start[:, None])[:, None, None]
                causal = False
        if self.kv_heads != self.heads:
            rep = self.heads // self.kv_heads
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)
        a = _all_reduce(self.o(a.transpose(1, 2).reshape(b, s, -1)), self.part)
        if self.o_bias is not None:
            a = a + self.o_bias
        x = x + a
        if self.moe is not None:
            return x + self.moe(self.norm2(x))
        y = _copy_to_tp(self.norm2(x), self.part)
        u = self.up(y)
        u = F.silu(self.gate(y)) * u if self.gate is not None else F.gelu(u)
        m = _all_reduce(self.down(u), self.part)
        if self.down_bias is not None:
            m = m + self.down_bias
        return x + m


class TransformerStage(nn.Module):
    """Layers ``[start, end)`` of a decoder-only transformer, optionally with embedding and head, TP-sharded.

    Args:
        spec: model shapes.
        part: which stage / TP rank to build (default: the whole model on one rank).
        seed: seed of the random weights (same full weights for every partition).
        dtype: parameter dtype.

    Forward:
        first stage: ``tokens`` int64 ``[b, s]``; other stages: hidden states ``[b, s, h]``.
        Returns hidden states ``[b, s, h]``, or logits ``[b, s, V]`` on the last stage.

    Raises:
        HetplanError: TP degree does not divide heads / MLP width, EP does not divide the experts, a bad layer
            range, or a model this reference cannot build (:func:`hetplan.model.reference.unsupported_features`).
    """

    def __init__(self, spec: ModelSpec, part: Partition | None = None, *, seed: int = 0,
                 dtype: torch.dtype = torch.float32):
        super().__init__()
        missing = unsupported_features(spec)
        if missing:
            raise HetplanError(f"model {spec.name} ({spec.family}) has {', '.join(missing)}, which this reference "
                               "transformer does not build", field="model",
                               fix="run or serve a dense model without sliding windows (llama, mistral, qwen2, "
                                   "qwen3, phi3, gpt2, gpt_neox, opt, mpt) or a Mixtral-shaped MoE")
        part = part or Partition(0, spec.num_layers, True, True)
        if not 0 <= part.start_layer <= part.end_layer <= spec.num_layers:
            raise HetplanError(f"layer range [{part.start_layer}, {part.end_layer}) outside 0..{spec.num_layers}",
                               field="partition", fix="give a range inside the model's layers")
        check_tp(spec, part.tp_size)
        self.spec, self.part = spec, part
        t, h = part.tp_size, spec.hidden_size
        self.vocab_pad = padded_vocab(spec, t)
        self.vocab_shard = self.vocab_pad // t
        self.embed = nn.Embedding(self.vocab_shard, h) if part.first else None
        self.pos = nn.Embedding(spec.learned_positions, h) if part.first and spec.learned_positions else None
        self.layers = nn.ModuleList(Block(spec, part, i) for i in range(part.start_layer, part.end_layer))
        self.final_norm = _Norm(spec) if part.last else None
        share = part.first and part.last and spec.tied_embeddings
        self.head = None if (not part.last or share) else nn.Parameter(torch.empty(self.vocab_shard, h))
        self._init_weights(seed)
        self.to(dtype)

    # -- weights ---------------------------------------------------------------------------------------------
    def full_name(self, local: str) -> str:
        """Name of a local parameter in the unpartitioned model (``layers.3.q.weight`` -> global layer index)."""
        if local.startswith("layers."):
            _, idx, rest = local.split(".", 2)
            return f"layers.{int(idx) + self.part.start_layer}.{rest}"
        if local == "head" and self.spec.tied_embeddings:
            return "embed.weight"
        return local

    def _init_weights(self, seed: int) -> None:
        spec, part = self.spec, self.part
        t, r, std = part.tp_size, part.tp_rank, 0.02
        d = spec.head_dim
        for i, layer in enumerate(self.layers):
            if layer.moe is not None:
                init_moe_weights(layer.moe, f"layers.{self.part.start_layer + i}.moe", seed, spec.num_layers,
                                 _seeded_normal)
        for local, p in self.named_parameters():
            if ".moe." in local:
                continue
            name = self.full_name(local)
            parts = local.split(".")
            kind = parts[-2] if len(parts) >= 2 else parts[-1]
            if "norm" in local:
                full = torch.ones(tuple(p.shape)) if local.endswith("weight") else torch.zeros(tuple(p.shape))
            elif local.endswith("o_bias") or local.endswith("down_bias"):
                full = torch.zeros(spec.hidden_size)
            elif local in ("embed.weight", "head"):
                full = _seeded_normal((spec.vocab_size, spec.hidden_size), seed, name, std)
                full = torch.cat([full, torch.zeros(self.vocab_pad - spec.vocab_size, spec.hidden_size)])
            elif local == "pos.weight":
                full = _seeded_normal(tuple(p.shape), seed, name, std)
            elif local.endswith(".bias"):  # column-parallel bias: full width, seeded, then sliced
                full = _seeded_normal((_full_shape(spec, kind)[0],), seed, name, std)
            else:  # layer weights [out, in]; output projections scaled by 1/sqrt(2L) (GPT-2 init)
                scale = std / math.sqrt(2 * spec.num_layers) if kind in ("o", "down") else std
                full = _seeded_normal(_full_shape(spec, kind), seed, name, scale)
            with torch.no_grad():
                p.copy_(_shard(full, local, t, r, d))

    # -- forward ---------------------------------------------------------------------------------------------
    def forward(self, x: torch.Tensor, positions: torch.Tensor | None = None,
                rows: CacheRows | None = None) -> torch.Tensor:
        """See the class docstring; with ``rows`` the pass reads and writes the KV cache (:class:`CacheRows`) and,
        given ``rows.logits_at``, returns the logits of those positions only (``[b, 1, V]``)."""
        part, spec = self.part, self.spec
        s = x.shape[1]
        if positions is None:
            positions = torch.arange(s, device=x.device)
            if rows is not None and s == 1:
                positions = rows.start[:, None]  # [b, 1]: each sequence's next position
            elif rows is not None and bool(rows.start.any()):  # prefill chunks: positions after the cached tokens
                positions = (rows.start[:, None] + positions[None]).clamp(max=rows.cache.max_len - 1)
        if part.first:
            x = self._embed(x, positions)
        for i, layer in enumerate(self.layers):
            x = layer(x, positions, rows, i)
        if not part.last:
            return x
        if rows is not None and rows.logits_at is not None:  # a server samples from one position per sequence
            x = x[torch.arange(x.shape[0], device=x.device), rows.logits_at][:, None]
        x = _copy_to_tp(self.final_norm(x), part)
        w = self.head if self.head is not None else self.embed.weight
        logits = x @ w.t()  # [b, s, V_pad/t]
        if part.tp_size > 1:
            logits = _GatherFromTP.apply(logits, part.tp_group, part.tp_rank, part.tp_size)
        return logits[..., : spec.vocab_size]

    def _embed(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        part = self.part
        lo = part.tp_rank * self.vocab_shard
        local = tokens - lo
        mask = (local < 0) | (local >= self.vocab_shard)
        x = self.embed(local.masked_fill(mask, 0))
        x = x.masked_fill(mask[..., None], 0.0)
        x = _all_reduce(x, part)
        if self.pos is not None:
            off = OPT_POSITION_OFFSET if self.spec.family == "opt" else 0
            p = self.pos(positions + off)
            x = x + (p if p.dim() == 3 else p[None])
        return x


def _full_shape(spec: ModelSpec, kind: str) -> tuple[int, int]:
    h, d, f = spec.hidden_size, spec.head_dim, spec.ffn_hidden_size
    return {"q": (spec.num_attention_heads * d, h), "k": (spec.num_kv_heads * d, h), "v": (spec.num_kv_heads * d, h),
            "o": (h, spec.num_attention_heads * d), "up": (f, h), "gate": (f, h), "down": (h, f)}[kind]


def _shard(full: torch.Tensor, local: str, t: int, r: int, d: int) -> torch.Tensor:
    """This rank's slice of a full tensor (column-parallel rows, row-parallel columns, vocab rows)."""
    if t == 1:
        return full
    leaf = local.split(".")
    kind = leaf[-2] if len(leaf) >= 2 else leaf[-1]
    if local in ("embed.weight", "head"):
        return full.chunk(t, dim=0)[r]
    if local.startswith("layers.") and kind in ("q", "k", "v", "up", "gate"):
        return full.chunk(t, dim=0)[r]  # column-parallel: output rows (heads are contiguous blocks of d rows)
    if local.startswith("layers.") and kind in ("o", "down") and leaf[-1] == "weight":
        return full.chunk(t, dim=1)[r]  # row-parallel: input columns
    return full  # norms, row-parallel biases, position table: replicated


def parameter_bytes(module: nn.Module) -> int:
    """Bytes of all parameters of ``module`` (shared tensors counted once)."""
    seen, total = set(), 0
    for p in module.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            total += p.numel() * p.element_size()
    return total
