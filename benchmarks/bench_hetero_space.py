"""What the heterogeneous space leaves out, measured by brute force on small random instances: stage orders that
interleave pools (A, B, A) and any mix of TP degrees inside one pool, against the searched space (each pool's
stages one contiguous block, blocks in any order; one TP degree per pool, or two where the second takes exactly
the GPUs the first leaves over). Objective: the estimator's closed-form iteration
time (what the search optimises), fastest plan and cheapest plan ($ per iteration); every sequence of stage types
is enumerated and its layer partition solved exactly (:func:`hetplan.search.partition.solve_partition`).

    python benchmarks/bench_hetero_space.py [first_seed] [count]
"""

from __future__ import annotations

import sys
import time
from collections import Counter

import numpy as np

from hetplan.hardware.catalog import load_catalog
from hetplan.model.spec import ModelSpec
from hetplan.plan import GPUPool, Inventory, Job
from hetplan.search import hetero
from hetplan.search.hetero.group import Group
from hetplan.search.space import Pins, divisors

CAT = load_catalog()
GPUS = ["T4", "RTX-3090", "RTX-A6000", "A100-SXM-40GB", "A10G", "V100-SXM-32GB", "RTX-A4000"]


def instance(seed: int):
    rng = np.random.default_rng(seed)
    L = int(rng.integers(4, 9))
    h = int(rng.choice([2048, 3072, 4096]))
    a = int(rng.choice([16, 32]))
    m = ModelSpec(name=f"toy-L{L}-h{h}", family="llama", num_layers=L, hidden_size=h, num_attention_heads=a,
                  num_kv_heads=a, head_dim=h // a, ffn_hidden_size=int(rng.choice([2, 3, 4])) * h, vocab_size=32000,
                  max_seq_len=8192, gated_mlp=True, norm="rmsnorm", linear_bias=False, learned_positions=0,
                  tied_embeddings=False, dropout=False)
    k = int(rng.integers(2, 4))
    gpus = list(rng.choice(GPUS, size=k, replace=False))
    counts = [int(rng.integers(1, 5)) for _ in range(k)]
    pools = [GPUPool(gpu=g, count=c, gpus_per_node=int(rng.choice([2, 4])), price_usd_per_hour=float(rng.uniform(0.5, 5)),
                     inter_node_bandwidth_bytes_per_s=float(rng.choice([1.25e9, 3.125e9, 12.5e9])))
             for g, c in zip(gpus, counts)]
    job = Job(model=m.name, seq_len=int(rng.choice([1024, 2048, 4096])), global_batch=int(rng.choice([4, 8, 16])),
              dtype="fp16")
    return m, job, Inventory(pools=pools)


def sequences(types, inv, d, L):
    """Every sequence of stage types (any order, any TP mix) within the pools' GPU counts, length 1..L."""
    out = []

    def rec(seq, used):
        if seq:
            out.append(list(seq))
        if len(seq) == L:
            return
        for st in types:
            g = st.tp * d
            if used[st.pool] + g <= inv.pools[st.pool].count:
                used[st.pool] += g
                seq.append(st)
                rec(seq, used)
                seq.pop()
                used[st.pool] -= g

    rec([], Counter())
    return out


def in_space(seq, inv, d) -> bool:
    """Is the sequence in the searched space: each pool's stages contiguous, one TP degree per pool, or two where
    the larger has as many stages as fit and the smaller takes exactly the GPUs left over (in either order)?"""
    seen, last = set(), None
    for st in seq:
        if st.pool != last and st.pool in seen:
            return False
        seen.add(st.pool)
        last = st.pool
    for k in seen:
        tps = [st.tp for st in seq if st.pool == k]
        runs = [t for i, t in enumerate(tps) if i == 0 or tps[i - 1] != t]
        if len(runs) == 1:
            continue
        if len(runs) > 2:
            return False
        ta, tb = max(runs), min(runs)
        per_replica = inv.pools[k].count // d
        sa, sb = tps.count(ta), tps.count(tb)
        if per_replica - sa * ta >= ta or sb * tb != per_replica - sa * ta:
            return False
    return True


def best_plans(m, job, inv):
    """(fastest T, cheapest $/iteration) over the searched space and over the extended space."""
    types = hetero.stage_types(m, inv, CAT, job.dtype, Pins())
    res = {"space": [np.inf, np.inf], "extended": [np.inf, np.inf]}
    why = {"fastest": None, "cheapest": None}
    for d in divisors(job.global_batch):
        for b in divisors(job.global_batch // d):
            for z in (0, 1):
                if z == 1 and d == 1:
                    continue
                g = Group(m, job, inv, types, b, d, z, [0, 1, 2], m.num_layers)
                for seq in sequences(g.types, inv, d, m.num_layers):
                    r = g.solve_order(seq, np.inf)
                    if r is None:
                        continue
                    t = r[0]
                    usd = t * sum(st.tp * d * st.price_usd_per_hour for st in seq) / 3600
                    for name in (["space", "extended"] if in_space(seq, inv, d) else ["extended"]):
                        if name == "extended" and not in_space(seq, inv, d):
                            kind = "mixed TP" if any(len({s.tp for s in seq if s.pool == k}) > 1
                                                     for k in {s.pool for s in seq}) else "interleaved"
                            if t < res["extended"][0] and t < res["space"][0]:
                                why["fastest"] = kind
                            if usd < res["extended"][1] and usd < res["space"][1]:
                                why["cheapest"] = kind
                        res[name][0] = min(res[name][0], t)
                        res[name][1] = min(res[name][1], usd)
    return res, why


def main() -> None:
    first = int(sys.argv[1]) if len(sys.argv) > 1 else 0
    count = int(sys.argv[2]) if len(sys.argv) > 2 else 40
    c0 = time.process_time()
    wins = {"fastest": [], "cheapest": []}
    kinds = Counter()
    n = 0
    for seed in range(first, first + count):
        m, job, inv = instance(seed)
        res, why = best_plans(m, job, inv)
        if not np.isfinite(res["extended"][0]):
            continue
        n += 1
        for i, goal in enumerate(("fastest", "cheapest")):
            gain = 1 - res["extended"][i] / res["space"][i]
            if gain > 1e-9:
                wins[goal].append(gain)
                kinds[(goal, why[goal])] += 1
    print(f"{n} instances with a plan ({count} seeds from {first}; {time.process_time() - c0:.1f} s CPU)")
    for goal, g in wins.items():
        print(f"  {goal}: the extended space is better on {len(g)} of {n}"
              + (f" (median gain {np.median(g):.1%}, max {max(g):.1%})" if g else ""))
    for (goal, kind), c in sorted(kinds.items()):
        print(f"    {goal}, best extended plan uses {kind}: {c}")


if __name__ == "__main__":
    main()
