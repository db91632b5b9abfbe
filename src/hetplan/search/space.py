"""The homogeneous plan space of one GPU pool, enumerated as numpy arrays (one row per configuration).

Dimensions (DESIGN.md vocabulary): TP (a power of two, at most the GPUs per node, dividing the attention heads
and the key/value heads, as Megatron-LM requires), PP (1..L stages, balanced split
:func:`hetplan.plan.balanced_split`), DP (tp·pp·dp ≤ GPUs available, global batch divisible by dp), micro-batch
size (divides global_batch / dp), recomputation (none / selective / full), ZeRO stage (0-3; 2 and 3 only without
pipeline parallelism, as in DeepSpeed, whose ZeRO-2/3 cannot be combined with its pipeline engine, and
Megatron-LM, which implements only the distributed optimizer = ZeRO-1), sequence parallelism on whenever TP > 1
(it lowers activation memory at equal communication volume, Korthikanti et al. 2023 Sec. 4.2.2).

Any dimension can be pinned. Nothing is pruned: the search evaluates every row, so it is exact over this space.
Size: O(#tp · L · #dp · #mbs · 3 · #zero) rows, e.g. ~10^5 for GPT-3 175B on 1,024 GPUs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hetplan.model.spec import ModelSpec

RECOMPUTE_NAMES = ("none", "selective", "full")


@dataclass(frozen=True)
class Pins:
    """Dimensions fixed by the user (``None`` = searched)."""

    tp: int | None = None
    pp: int | None = None
    dp: int | None = None
    mbs: int | None = None
    zero: int | None = None
    recompute: str | None = None
    num_gpus: int | None = None


def divisors(n: int) -> list[int]:
    """Positive divisors of ``n``, ascending."""
    small = [d for d in range(1, int(n**0.5) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def tp_degrees(m: ModelSpec, gpus_per_node: int, available: int) -> list[int]:
    """TP degrees allowed: powers of two ≤ min(GPUs per node, available) dividing heads and KV heads."""
    out, t = [], 1
    while t <= min(gpus_per_node, available):
        if m.num_attention_heads % t == 0 and m.num_kv_heads % t == 0:
            out.append(t)
        t *= 2
    return out


def enumerate_space(m: ModelSpec, global_batch: int, available: int, gpus_per_node: int, pins: Pins) -> dict[str, np.ndarray]:
    """All configurations as parallel integer arrays ``tp, pp, dp, mbs, zero, recompute`` (recompute as codes
    0/1/2), honouring ``pins``. Empty arrays if nothing matches."""
    rows = []
    tps = tp_degrees(m, gpus_per_node, available)
    if pins.tp is not None:
        tps = [t for t in tps if t == pins.tp]
    rcs = [RECOMPUTE_NAMES.index(pins.recompute)] if pins.recompute is not None else [0, 1, 2]
    for t in tps:
        pps = range(1, min(m.num_layers, available // t) + 1)
        for p in pps if pins.pp is None else [pins.pp]:
            if t * p > available:
                continue
            for d in divisors(global_batch):
                n = t * p * d
                if n > available:
                    break
                if (pins.dp is not None and d != pins.dp) or (pins.num_gpus is not None and n != pins.num_gpus):
                    continue
                zeros = [0, 1] if p > 1 else [0, 1, 2, 3]
                if pins.zero is not None:
                    zeros = [z for z in zeros if z == pins.zero]
                for b in divisors(global_batch // d):
                    if pins.mbs is not None and b != pins.mbs:
                        continue
                    for z in zeros:
                        for rc in rcs:
                            rows.append((t, p, d, b, z, rc))
    arr = np.array(rows, dtype=np.int64).reshape(-1, 6)
    return {k: arr[:, i] for i, k in enumerate(("tp", "pp", "dp", "mbs", "zero", "recompute"))}
