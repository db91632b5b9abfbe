"""Fine-grained plans by iterative bottleneck alleviation (Aceso: Liu et al., "Efficient Parallelism Optimization
for Large Model Training with Bottleneck Alleviation", EuroSys'24, Sec. 4).

**Space.** One GPU pool, a fixed number of GPUs (the start plan's). Stages with their own GPU count, TP and DP
degree (:class:`hetplan.search.fine_cost.FineStage`), uneven layer splits, one pipeline micro-batch of ``B``
sequences that stage ``i`` splits over its ``dp_i`` replicas (``B / dp_i`` each; Aceso Sec. 3), one CP and one EP
degree for all stages (a stage uses ``tp_i·cp·dp_i`` GPUs; EP x expert-TP divides every ``tp_i·cp·dp_i``, MoE
parallel folding, or EP every ``dp_i·cp`` where the job's framework keeps EP inside DP, ``frameworks.toml``;
the start's expert-TP is kept or dropped to 1), 1F1B or interleaved 1F1B with v virtual stages (each stage's layers
in v near-equal chunks, :func:`hetplan.plan.stage_chunks`, where the job's framework interleaves and takes a layer
list per chunk, ``frameworks.toml``), ZeRO 0 or 1,
per-layer recomputation (repaired to the lightest that fits, :meth:`FineCostModel.repair`; a ``recompute`` pin
limits it to that mode, ``none`` to no recomputation), and resharding
between stages whose layouts differ (:mod:`hetplan.estimate.reshard`). Uniform Megatron-style plans are points of
this space. Because the GPUs are fixed, $/hour is fixed too: a faster plan is also a cheaper job, so minimising the
iteration time serves every objective of :mod:`hetplan.search.objective` (a deadline or budget met by the start
stays met).

**Search.** Start from the best plan of the exhaustive uniform search
(:func:`hetplan.search.planner.search_plans`, re-ranked with the measured profiles when given). Repeat:

1. find the bottleneck: the stage most over memory, else the stage with the largest per-micro-batch time;
2. generate the moves that target it (Aceso Sec. 4.2, Table 2): move layers to a neighbour (the amount that
   balances the two, and powers of two), change its TP/DP at the same GPU count, take GPUs from another stage
   (halving it, or doubling the bottleneck), split it in two, merge the two lightest neighbours (and split the
   bottleneck), change the pipeline micro-batch, toggle ZeRO-1, CP x2 with every DP halved (or back), another EP
   degree; structural moves are also tried followed by a
   re-balancing of all layers (fluid balance of per-layer times); recomputation follows every move (repair);
3. take the best move; if none improves, take the best move to a state not visited yet anyway (a *hop*, Aceso's
   multi-hop escape from local optima) — at most ``max_hops`` hops in a row; stop when they are spent;
4. then hill-climb the best state's interleaving (:meth:`FineSearch.tune_interleaving`).

Then restart from the next uniform start points while the budget lasts. Order: (memory excess, iteration time).

**Budget and determinism.** Work is counted in state evaluations (cost-model calls, cached states excluded),
never in wall-clock time, and moves are generated in a fixed order with ties broken by that order, so the
answer is the same on any machine and under any load. The reported plan is estimated again with
:func:`hetplan.estimate.estimator.estimate`; if (it never should) that is worse than the start, the start is
returned: the result is never worse than the uniform search.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field

from hetplan.errors import HetplanError
from hetplan.estimate.compute import pool_gpu
from hetplan.estimate.estimator import Estimate, LayerTimeSource, estimate, estimate_many
from hetplan.hardware.catalog import Catalog, load_catalog
from hetplan.hardware.frameworks import job_framework
from hetplan.model.spec import ModelSpec, load_model
from hetplan.plan import Inventory, Job, Plan
from hetplan.search.fine_cost import FineCostModel, FineStage, FineState, StateCost, state_from_plan
from hetplan.search.objective import Objective, estimate_keys
from hetplan.search.space import (RECOMPUTE_NAMES, Pins, cp_degrees, ep_degrees, free_recompute_codes, fsdp_zero_stages,
                                  stack_allows, stack_has, tp_degrees)

#: Default work budget: state evaluations (cost-model calls) over all start points.
DEFAULT_BUDGET_EVALUATIONS = 4000
#: Worse moves accepted in a row before a start point is given up (Aceso's ``--max-num-hops 7``).
DEFAULT_MAX_HOPS = 7
#: Uniform plans tried as start points (best first) while budget remains.
DEFAULT_START_POINTS = 3


@dataclass
class TraceStep:
    """One step of the search: the bottleneck found, what dominated it and the move applied."""

    step: int
    start_point: int
    bottleneck_stage: int
    reason: str
    bottleneck_time_s: float
    dominant: str
    move: str
    kind: str
    iteration_time_s_before: float
    iteration_time_s_after: float

    def text(self) -> str:
        arrow = {"improve": "->", "hop": "-> (hop, worse)"}.get(self.kind, "->")
        where = f"start {self.start_point + 1}, " if self.start_point else ""
        return (f"[{where}{self.step}] bottleneck stage {self.bottleneck_stage} ({self.reason}: "
                f"{self.bottleneck_time_s * 1e3:.1f} ms per micro-batch; {self.dominant}); {self.move}; "
                f"iteration {self.iteration_time_s_before:.3f} s {arrow} {self.iteration_time_s_after:.3f} s")


@dataclass
class FineResult:
    """Outcome of :func:`fine_search`.

    Attributes:
        plan, estimate: the best plan found and its estimate (:func:`estimate`, the reported numbers).
        start_plan, start_estimate: the uniform plan the search started from (best uniform plan).
        trace: accepted steps (bottleneck, dominant cost, move), in order.
        evaluations: cost-model calls spent (the work budget's unit).
        start_points: uniform start points searched.
        search_time_s: wall-clock time (informational; the search never looks at it).
    """

    plan: Plan
    estimate: Estimate
    start_plan: Plan
    start_estimate: Estimate
    trace: list[TraceStep] = field(default_factory=list)
    evaluations: int = 0
    start_points: int = 0
    search_time_s: float = 0.0

    @property
    def speedup(self) -> float:
        """Start iteration time / found iteration time (>= 1)."""
        return self.start_estimate.iteration_time_s / self.estimate.iteration_time_s

    def explanation(self) -> list[str]:
        """The trace as text lines plus a summary line."""
        lines = [s.text() for s in self.trace]
        # with a profile database the fine search prices layers by their measured times, the ranked table above it
        # by the cost model: say which, or the two "uniform" times read as a contradiction
        measured = any(st.time_source == "profiled" for st in self.start_estimate.stages)
        lines.append(
            f"fine search: {self.start_estimate.iteration_time_s:.3f} s (uniform start) -> "
            f"{self.estimate.iteration_time_s:.3f} s per iteration ({self.speedup:.3f}x) after {self.evaluations} "
            f"evaluations from {self.start_points} start point(s)"
            + ("; priced on the profile's measured layer times (the table above: the cost model)" if measured else ""))
        return lines


class FineSearch:
    """The search of one pool (module doc). Use :func:`fine_search`; this class is exposed for tests.

    Args:
        model: the cost model (its ``evaluations`` counter is the budget's unit).
        budget_evaluations: total work budget; max_hops: worse moves in a row allowed.
    """

    def __init__(self, model: FineCostModel, budget_evaluations: int = DEFAULT_BUDGET_EVALUATIONS,
                 max_hops: int = DEFAULT_MAX_HOPS, pins: Pins | None = None):
        self.cm = model
        self.budget = budget_evaluations
        self.max_hops = max_hops
        self.pins = pins or Pins()
        # only the ZeRO stages, parallel dimensions and interleaving the job's stack offers (as the uniform space)
        self.stack = model.job.stack_spec()
        self.tps = tp_degrees(model.m, model.pool.gpus_per_node, model.pool.count, self.stack)
        if self.pins.tp is not None:
            self.tps = [t for t in self.tps if t == self.pins.tp]
        self.cps = cp_degrees(model.job.seq_len, model.pool.count, self.stack)
        # EP folding (EP over tp·cp·dp) and expert-TP where the job's framework runs them, as the uniform space
        fw = job_framework(model.job.framework)
        self.ep_fold, self.expert_tp = fw is None or fw.ep_beyond_dp, fw is None or fw.expert_tp
        # interleaved 1F1B where the framework runs it; uneven chunks where it takes a layer list per chunk
        self.interleave = fw is not None and fw.interleaved and stack_has(self.stack, "vp")
        self.layer_lists = fw is not None and "any" in fw.splits
        self.trace: list[TraceStep] = []
        self.visited: set[FineState] = set()

    # -- helpers ----------------------------------------------------------------------------------------------
    def layouts(self, gpus: int, B: int) -> list[tuple[int, int]]:
        """Valid (tp, dp) for ``gpus`` GPUs with pipeline micro-batch ``B``: tp allowed by the model and node, dp
        dividing ``B``."""
        if gpus < 1:
            return []
        return [(t, gpus // t) for t in self.tps if gpus % t == 0 and B % (gpus // t) == 0
                and (self.pins.dp is None or gpus // t == self.pins.dp)]

    def valid(self, s: FineState) -> bool:
        g = self.cm.job.global_batch
        pins = self.pins
        if ((pins.pp is not None and s.pp != pins.pp) or (pins.zero is not None and s.zero != pins.zero)
                or (pins.mbs is not None and any(s.micro_batch != pins.mbs * st.dp for st in s.stages))):
            return False
        if (pins.cp is not None and s.cp != pins.cp) or s.cp not in self.cps:
            return False
        if s.pp > 1 and not stack_has(self.stack, "pp"):
            return False
        v = s.virtual_stages
        if (pins.virtual_stages is not None and v != pins.virtual_stages) or v > 1 and not (
                self.interleave and s.pp > 1 and (g // s.micro_batch) % s.pp == 0
                and all(st.num_layers >= v and (self.layer_lists or st.num_layers % v == 0) for st in s.stages)):
            return False
        if any(st.dp > 1 for st in s.stages) and not stack_allows(self.stack, zero=s.zero, dtype=self.cm.job.dtype,
                                                                  pp=s.pp):
            return False
        fsdp = self.cm.job.framework == "fsdp"  # DDP (0) or FSDP2 (3, and 2 without a pipeline); no EP with DDP
        replicated = s.zero == 0 and any(st.dp > 1 for st in s.stages)
        one_d = s.pp == 1 and s.cp == 1 and all(st.tp == 1 for st in s.stages)  # torch DDP's only mesh
        if fsdp and (s.zero not in (*fsdp_zero_stages(s.pp), pins.zero) or replicated and (
                s.ep > 1 or self.stack.ddp == "reducer" and not one_d)):
            return False
        return ((s.pp == 1 or s.zero <= 1 or fsdp) and all(st.num_layers >= 1 and s.micro_batch % st.dp == 0 and st.tp in self.tps for st in s.stages)
                and g % s.micro_batch == 0 and sum(st.num_layers for st in s.stages) == self.cm.L
                and (s.expert_tp == 1 or self.expert_tp and all(st.tp % s.expert_tp == 0 for st in s.stages))
                and all(s.ep in ep_degrees(self.cm.m, self._expert_ranks(st, s), pins.ep, self.stack)
                        for st in s.stages))

    def _expert_ranks(self, st: FineStage, s: FineState) -> int:
        """Ranks stage ``st``'s experts may spread over: ``tp·cp·dp / expert_tp`` with EP folding (0 when
        expert-TP does not divide them), ``dp·cp`` without (:func:`hetplan.search.space.ep_degrees`)."""
        if not self.ep_fold:
            return st.dp * s.cp
        ranks = st.tp * s.cp * st.dp
        return ranks // s.expert_tp if ranks % s.expert_tp == 0 else 0

    def rebalance(self, s: FineState) -> FineState:
        """Re-split all layers for the state's stages: per-stage time ``a_i + λ_i·n`` (from the cost tables at the
        current recomputation), the smallest bottleneck ``T`` with ``Σ floor((T - a_i)/λ_i) >= L`` (bisection),
        then excess layers removed from the slowest stages."""
        L, p = self.cm.L, s.pp
        if p == 1:
            return s
        a, lam = [], []
        for i, st in enumerate(s.stages):
            ctx, inflight = self.cm.stage_context(s, i)
            mode, r = self.cm.repair(ctx, inflight, st.num_layers)
            n = st.num_layers
            f1, b1, *_ = self.cm._lookup(ctx, inflight, n, mode, r)
            f0, b0, *_ = self.cm._lookup(ctx, inflight, 0, "none", 0)
            a.append(float(f0 + b0))
            lam.append(max(float(f1 + b1 - f0 - b0) / n, 1e-12))
        lo, hi = 0.0, max(a) + max(lam) * L

        def count(T):
            return sum(max(1, int((T - ai) // li)) if T > ai else 1 for ai, li in zip(a, lam))

        for _ in range(60):
            mid = (lo + hi) / 2
            if count(mid) >= L:
                hi = mid
            else:
                lo = mid
        layers = [max(1, int((hi - ai) // li)) if hi > ai else 1 for ai, li in zip(a, lam)]
        while sum(layers) > L:
            k = max((i for i in range(p) if layers[i] > 1), key=lambda i: a[i] + lam[i] * layers[i])
            layers[k] -= 1
        while sum(layers) < L:
            k = min(range(p), key=lambda i: a[i] + lam[i] * (layers[i] + 1))
            layers[k] += 1
        return FineState(tuple(FineStage(k, st.tp, st.dp) for k, st in zip(layers, s.stages)), s.micro_batch, s.zero,
                         s.cp, s.ep, s.expert_tp, s.virtual_stages)

    def bottleneck(self, c: StateCost) -> tuple[int, str]:
        over = [x - self.cm.capacity for x in c.memory_bytes]
        if max(over) > 0:
            return max(range(len(over)), key=lambda i: over[i]), "memory"
        t = c.stage_time_s
        return max(range(len(t)), key=lambda i: t[i]), "time"

    def dominant(self, s: FineState, c: StateCost, j: int) -> str:
        """What the bottleneck stage's time is made of, and its memory."""
        total = c.forward_s[j] + c.backward_s[j]
        rc, tpc = c.recompute_s[j], c.tp_comm_s[j]
        comp = total - rc - tpc
        mode, r = c.recompute[j]
        st = s.stages[j]
        parts = [f"compute {comp / total:.0%}"]
        if rc > 0:
            parts.append(f"recompute {rc / total:.0%} ({mode} on {r}/{st.num_layers} layers)")
        if tpc > 0:
            parts.append(f"TP comm {tpc / total:.0%}")
        return (", ".join(parts) + f"; {st.num_layers} layers on tp{st.tp}xdp{st.dp}, memory "
                f"{c.memory_bytes[j] / 2**30:.1f}/{self.cm.capacity / 2**30:.1f} GiB")

    # -- moves ------------------------------------------------------------------------------------------------
    def moves(self, s: FineState, c: StateCost, j: int, reason: str) -> list[tuple[str, FineState]]:
        """Candidate moves for bottleneck stage ``j``, in a fixed order (module doc)."""
        out: list[tuple[str, FineState]] = []
        S = list(s.stages)
        p, B = s.pp, s.micro_batch
        t = c.stage_time_s
        cj = S[j]

        fsdp = self.cm.job.framework == "fsdp"  # DDP (0) or FSDP2 (3) at any pipeline depth

        def mk(stages, B=B, zero=s.zero, cp=s.cp, ep=s.ep, etp=s.expert_tp, v=s.virtual_stages):
            # ZeRO-2/3 only without pipelining (DeepSpeed / Megatron-LM, hetplan.search.space); one stage runs no
            # interleaving
            return FineState(tuple(stages), B, min(zero, 1) if len(stages) > 1 and not fsdp else zero, cp, ep, etp,
                             v if len(stages) > 1 else 1)

        # 1. layers to a neighbour
        for nb in (j - 1, j + 1):
            if not 0 <= nb < p or cj.num_layers <= 1:
                continue
            per_j = t[j] / cj.num_layers
            per_nb = t[nb] / max(S[nb].num_layers, 1)
            k_bal = (t[j] - t[nb]) / (per_j + per_nb)
            amounts = {1, max(1, round(k_bal)), max(1, int(k_bal)), max(1, round(k_bal / 2))}
            if reason == "memory":
                amounts |= {2 ** e for e in range(12)}
            for k in sorted(a for a in amounts if 1 <= a < cj.num_layers):
                new = list(S)
                new[j] = FineStage(cj.num_layers - k, cj.tp, cj.dp)
                new[nb] = FineStage(S[nb].num_layers + k, S[nb].tp, S[nb].dp)
                out.append((f"move {k} layer(s) from stage {j} to stage {nb}", mk(new)))
        structural: list[tuple[str, FineState]] = []
        # 2. TP/DP of the bottleneck at the same GPU count
        for tp, dp in self.layouts(cj.gpus, B):
            if (tp, dp) != (cj.tp, cj.dp):
                new = list(S)
                new[j] = FineStage(cj.num_layers, tp, dp)
                structural.append((f"stage {j}: tp{cj.tp}xdp{cj.dp} -> tp{tp}xdp{dp}", mk(new)))
        # 3. GPUs from another stage (least loaded first)
        for i in sorted((i for i in range(p) if i != j), key=lambda i: (t[i] / S[i].gpus, i)):
            gi = S[i].gpus
            gives = sorted({gi // 2, cj.gpus} & set(range(1, gi)))
            for give in gives:
                lay_i = self.layouts(gi - give, B)
                lay_j = self.layouts(cj.gpus + give, B)
                if not lay_i or not lay_j:
                    continue
                keep = next((x for x in lay_i if x[0] == S[i].tp), lay_i[0])
                for tp, dp in lay_j:
                    new = list(S)
                    new[i] = FineStage(S[i].num_layers, *keep)
                    new[j] = FineStage(cj.num_layers, tp, dp)
                    structural.append((f"stage {j} takes {give} GPU(s) from stage {i} (stage {j} -> tp{tp}xdp{dp}, "
                                       f"stage {i} -> tp{keep[0]}xdp{keep[1]})", mk(new)))
        # 4. split the bottleneck in two
        if cj.gpus >= 2 and cj.num_layers >= 2:
            half = cj.gpus // 2
            lay = self.layouts(half, B)
            if lay and cj.gpus % 2 == 0:
                keep = next((x for x in lay if x[0] == cj.tp), lay[-1])
                n1 = cj.num_layers // 2
                new = S[:j] + [FineStage(cj.num_layers - n1, *keep), FineStage(n1, *keep)] + S[j + 1:]
                structural.append((f"split stage {j} into two stages of {half} GPU(s)", mk(new)))
        # 5. merge the lightest adjacent pair (other than the bottleneck), optionally splitting the bottleneck
        if p >= 2:
            pairs = sorted((t[i] + t[i + 1], i) for i in range(p - 1) if j not in (i, i + 1))
            for _, i in pairs[:1]:
                g = S[i].gpus + S[i + 1].gpus
                lay = self.layouts(g, B)
                if lay:
                    keep = next((x for x in lay if x[0] == S[i].tp), lay[0])
                    merged = FineStage(S[i].num_layers + S[i + 1].num_layers, *keep)
                    new = S[:i] + [merged] + S[i + 2:]
                    structural.append((f"merge stages {i} and {i + 1}", mk(new)))
            if p >= 1:
                for _, i in pairs[:1]:
                    g = S[i].gpus + S[i + 1].gpus
                    lay, lay2 = self.layouts(g, B), self.layouts(cj.gpus // 2, B)
                    if lay and lay2 and cj.gpus % 2 == 0 and cj.gpus >= 2 and cj.num_layers >= 2:
                        keep = next((x for x in lay if x[0] == S[i].tp), lay[0])
                        k2 = next((x for x in lay2 if x[0] == cj.tp), lay2[-1])
                        n1 = cj.num_layers // 2
                        new = []
                        for q, st in enumerate(S):
                            if q == i:
                                new.append(FineStage(S[i].num_layers + S[i + 1].num_layers, *keep))
                            elif q == i + 1:
                                continue
                            elif q == j:
                                new += [FineStage(cj.num_layers - n1, *k2), FineStage(n1, *k2)]
                            else:
                                new.append(st)
                        structural.append((f"merge stages {i} and {i + 1}, split stage {j}", mk(new)))
        # 6. pipeline micro-batch
        g = self.cm.job.global_batch
        for B2 in (B // 2, B * 2):
            if B2 >= 1 and g % B2 == 0 and all(B2 % st.dp == 0 for st in S) and B2 != B:
                structural.append((f"pipeline micro-batch {B} -> {B2} sequences", mk(S, B=B2)))
        # 7. ZeRO stage (sharding over each stage's DP group): 0/1 with pipelining, 0-3 without
        if any(st.dp > 1 for st in S):
            for z in (fsdp_zero_stages(p) if fsdp else (0, 1) if p > 1 else (0, 1, 2, 3)):
                if z != s.zero:
                    structural.append((f"ZeRO {s.zero} -> {z}", mk(S, zero=z)))
        # 8. CP x2 with every stage's DP halved (same GPUs; each rank holds half the sequence), or back; EP over
        # the divisors of the experts that divide every stage's tp·cp·dp / expert-TP
        if all(st.dp % 2 == 0 for st in S):
            structural.append((f"CP {s.cp} -> {2 * s.cp}, DP halved",
                               mk([FineStage(st.num_layers, st.tp, st.dp // 2) for st in S], cp=2 * s.cp)))
        if s.cp > 1:
            structural.append((f"CP {s.cp} -> {s.cp // 2}, DP doubled",
                               mk([FineStage(st.num_layers, st.tp, st.dp * 2) for st in S], cp=s.cp // 2)))
        # (folded over tp·cp·dp: MoE parallel folding, as the uniform space, hetplan.search.space)
        for e in ep_degrees(self.cm.m, math.gcd(*(self._expert_ranks(st, s) for st in S)), self.pins.ep,
                                self.stack):
            if e != s.ep:
                structural.append((f"EP {s.ep} -> {e}", mk(S, ep=e)))
        if s.expert_tp > 1:
            structural.append((f"expert-TP {s.expert_tp} -> 1", mk(S, etp=1)))
        for desc, moved in structural:
            out.append((desc, moved))
            rb = self.rebalance(moved) if self.valid(moved) else moved
            if rb != moved:
                out.append((desc + " + re-balance layers", rb))
        if p >= 2:
            rb = self.rebalance(s)
            if rb != s:
                out.append(("re-balance layers", rb))
        return [(d, st) for d, st in out if self.valid(st)]

    # -- driver -----------------------------------------------------------------------------------------------
    def run(self, start: FineState, start_index: int = 0) -> FineState:
        """Search from ``start`` until stalled or out of budget; returns the best state seen."""
        cur = start
        cc = self.cm.cost(cur)
        best, bc = cur, cc
        hops = 0
        self.visited.add(cur)
        while self.cm.evaluations < self.budget:
            j, reason = self.bottleneck(cc)
            cands = self.moves(cur, cc, j, reason)
            scored = []
            for order, (desc, st) in enumerate(cands):
                if st in self.visited:  # tabu: never return to a state already searched from
                    continue
                if self.cm.evaluations >= self.budget and st not in self.cm._costs:
                    break
                scored.append((self.cm.cost(st).key, order, desc, st))
            if not scored:
                break
            scored.sort(key=lambda x: (x[0], x[1]))
            key, _, desc, st = scored[0]
            if key[0] < cc.key[0] or (key[0] == cc.key[0] and key[1] < cc.key[1] * (1 - 1e-12)):
                kind = "improve"
            elif hops >= self.max_hops:
                break
            else:
                kind = "hop"
            nc = self.cm.cost(st)
            self.trace.append(TraceStep(
                step=len(self.trace) + 1, start_point=start_index, bottleneck_stage=j, reason=reason,
                bottleneck_time_s=cc.stage_time_s[j], dominant=self.dominant(cur, cc, j),
                move=desc + _recompute_change(cc, nc, cur, st), kind=kind,
                iteration_time_s_before=cc.iteration_time_s, iteration_time_s_after=nc.iteration_time_s))
            cur, cc = st, nc
            self.visited.add(cur)
            if cc.key < bc.key:
                best, bc, hops = cur, cc, 0
            elif kind == "hop":
                hops += 1
        return self.tune_interleaving(best, start_index)

    def tune_interleaving(self, s: FineState, start_index: int = 0) -> FineState:
        """Hill-climb the interleaving of a found state: v to 1, v ± 1, 2v and v / 2 (each stage's layers in v
        near-equal chunks, with and without re-balancing the layers), while the iteration gets shorter and the
        budget lasts. A pass after the bottleneck search rather than a move of it, so that its hops are not
        spent on schedule changes that do not relieve a bottleneck."""
        if s.pp == 1 or not self.interleave:
            return s
        cc = self.cm.cost(s)
        while self.cm.evaluations < self.budget:
            v = s.virtual_stages
            cands = []
            for v2 in sorted({1, v - 1, v + 1, 2 * v, v // 2} - {0, v}):
                moved = FineState(s.stages, s.micro_batch, s.zero, s.cp, s.ep, s.expert_tp, v2)
                if self.valid(moved):
                    cands += [(f"virtual stages {v} -> {v2}", moved)]
                    rb = self.rebalance(moved)
                    if rb != moved and self.valid(rb):
                        cands.append((f"virtual stages {v} -> {v2} + re-balance layers", rb))
            scored = sorted(((self.cm.cost(st).key, k, d, st) for k, (d, st) in enumerate(cands)
                             if self.cm.evaluations < self.budget or st in self.cm._costs),
                            key=lambda x: (x[0], x[1]))
            if not scored:
                return s
            key, _, desc, st = scored[0]
            if not (key[0] < cc.key[0] or (key[0] == cc.key[0] and key[1] < cc.key[1] * (1 - 1e-12))):
                return s
            nc = self.cm.cost(st)
            j, reason = self.bottleneck(cc)
            self.trace.append(TraceStep(
                step=len(self.trace) + 1, start_point=start_index, bottleneck_stage=j, reason=reason,
                bottleneck_time_s=cc.stage_time_s[j], dominant=self.dominant(s, cc, j), move=desc, kind="improve",
                iteration_time_s_before=cc.iteration_time_s, iteration_time_s_after=nc.iteration_time_s))
            s, cc = st, nc
        return s


def _recompute_change(a: StateCost, b: StateCost, sa: FineState, sb: FineState) -> str:
    """Text of the recomputation changes between two states with the same stage count (else empty)."""
    if sa.pp != sb.pp:
        return ""
    ch = [f"stage {i} recompute {m}x{r}" if r else f"stage {i} recompute none"
          for i, ((m0, r0), (m, r)) in enumerate(zip(a.recompute, b.recompute)) if (m0, r0) != (m, r)]
    return ("; " + ", ".join(ch)) if ch else ""


def fine_search(
    job: Job,
    inventory: Inventory,
    objective: Objective | None = None,
    pins: Pins | None = None,
    *,
    catalog: Catalog | None = None,
    model: ModelSpec | None = None,
    profiles: LayerTimeSource | None = None,
    budget_evaluations: int = DEFAULT_BUDGET_EVALUATIONS,
    max_hops: int = DEFAULT_MAX_HOPS,
    start_points: int = DEFAULT_START_POINTS,
    start: Plan | None = None,
    uniform=None,
) -> FineResult:
    """Find a fine-grained plan by bottleneck alleviation, starting from the best uniform plan (module doc).

    Args:
        job, inventory, objective, pins: as :func:`hetplan.search.planner.search_plans` (the start point's search).
        catalog: GPU catalog; model: the model spec (default ``load_model(job.model)``).
        profiles: measured layer times (e.g. a :class:`hetplan.profile.db.ProfileDB`); used by the cost model and
            to re-rank the uniform start points.
        budget_evaluations: work budget in cost-model calls (deterministic; no wall-clock limit).
        max_hops: worse moves allowed in a row (multi-hop). start_points: uniform plans to start from.
        start: start from this plan instead (single pool, 1F1B).
        uniform: a :class:`hetplan.search.planner.SearchResult` already computed for the same arguments (its
            plans are the start points; saves running the uniform search again).
    Returns:
        :class:`FineResult`; its plan is never slower than the start plan (both estimated by :func:`estimate`).
    Raises:
        HetplanError: bad budget, a start plan on several pools or with GPipe; the errors of ``search_plans``.
        InfeasibleError: nothing fits (from ``search_plans``).
    """
    t0 = time.perf_counter()
    if budget_evaluations < 1:
        raise HetplanError(f"must be at least 1, got {budget_evaluations}", field="budget_evaluations",
                           fix="give a positive number of cost-model evaluations (default 4000)")
    catalog = catalog or load_catalog()
    m = model or load_model(job.model)
    if start is not None:
        starts = [start]
    else:
        from hetplan.search.planner import search_plans

        top = max(start_points, 8 if profiles else 1)
        res = uniform or search_plans(job, inventory, objective, pins, top_k=top, catalog=catalog)
        starts = [rp.plan for rp in res.plans]
        if (pins is None or pins.virtual_stages is None) and any(sp.virtual_stages > 1 for sp in starts):
            # the best plans differ mostly in their interleaving, which every start point's search tunes at its
            # end: start also from the best plain-1F1B layouts, as many and as different as without interleaving
            plain = (pins or Pins()).model_copy(update={"virtual_stages": 1})
            starts += [rp.plan for rp in search_plans(job, inventory, objective, plain, top_k=top,
                                                      catalog=catalog).plans]
    def one_pool_1f1b(sp: Plan) -> bool:
        return len({st.pool for st in sp.stages}) == 1 and sp.schedule == "1f1b"

    if start is not None and not one_pool_1f1b(start):
        raise HetplanError("fine-grained search starts from a one-pool 1F1B plan", field="start",
                           fix="give a plan whose stages share one pool and use schedule 1f1b")
    if not one_pool_1f1b(starts[0]):  # it said "start: ... fix: give a plan whose stages share one pool"
        raise HetplanError("the best uniform plan mixes GPU pools, and the fine-grained search works on one pool",
                           field="--search", fix="add --no-hetero (the fine search then starts from the best plan "
                                                 "on one GPU type), or use --search uniform")
    # a mixed-pool runner-up was refused too, with the best on one pool; it is no start point of this pool
    starts = [sp for sp in starts if one_pool_1f1b(sp)]
    pool = starts[0].pools[starts[0].stages[0].pool]
    starts = [sp for sp in starts if sp.pools[sp.stages[0].pool] == pool]
    # The baseline: the best uniform plan under the same cost model (re-ranked with the profiles when given), by
    # the objective: the fastest of them was taken under --objective cheapest too (16 GPUs at $0.2534 per job
    # over 8 at $0.2504), and the search keeps the start's GPUs.
    if profiles is not None or start is not None:
        ests = estimate_many(starts, catalog, m, profiles)
        keys = [estimate_keys(objective or Objective(), e) for e in ests]  # None: breaks memory or a constraint
        order = sorted(range(len(starts)), key=lambda i: (keys[i] is None, not ests[i].fits,
                                                          keys[i] or (ests[i].iteration_time_s,), i))
        starts = [starts[i] for i in order]
        start_plan, start_est = starts[0], ests[order[0]]
    else:
        start_plan, start_est = starts[0], res.plans[0].estimate
    gpu = pool_gpu(catalog, pool, field="inventory.gpu", job=job)
    n_gpus = max(sp.num_gpus for sp in starts)
    # the recomputing modes among the search's choices (under flash selective is none, except under fsdp)
    free = tuple(RECOMPUTE_NAMES[r] for r in free_recompute_codes(m, job.attention, job.framework)
                 if r and stack_allows(job.stack_spec(), recompute=RECOMPUTE_NAMES[r], attention=job.attention))
    modes = free if pins is None or pins.recompute is None else \
        {"none": (), "selective": ("selective",), "full": ("full",)}[pins.recompute]
    cm = FineCostModel(m, job, pool, gpu, profiles, max_stages=max(n_gpus, pool.count), recompute_modes=modes)
    states: list[FineState] = []
    layouts: set[FineState] = set()  # start points differ in layout, not only in interleaving (tuned at the end)
    for sp in starts:  # same GPUs as the best uniform plan: $/hour stays fixed (module doc)
        s = state_from_plan(sp)
        layout = dataclasses.replace(s, virtual_stages=1)
        if layout not in layouts and sp.num_gpus == start_plan.num_gpus:
            states.append(s)
            layouts.add(layout)
    states = states[:start_points]
    search = FineSearch(cm, budget_evaluations, max_hops, pins)
    best = states[0]
    used = 0
    for k, s in enumerate(states):
        if cm.evaluations >= budget_evaluations:
            break
        used += 1
        found = search.run(s, k)
        if cm.cost(found).key < cm.cost(best).key:
            best = found
    plan = cm.to_plan(best)
    est = estimate(plan, catalog, m, profiles)
    if (not est.fits and start_est.fits) or est.iteration_time_s > start_est.iteration_time_s:
        plan, est = start_plan, start_est
    return FineResult(plan=plan, estimate=est, start_plan=start_plan, start_estimate=start_est, trace=search.trace,
                      evaluations=cm.evaluations, start_points=used, search_time_s=time.perf_counter() - t0)


def enumerate_states(search: FineSearch, num_gpus: int, max_states: int = 200_000):
    """Every valid state of the fine-grained space with ``num_gpus`` GPUs (for checks on small instances): all
    CP and EP degrees, stage counts, GPU compositions, (tp, dp) layouts per stage, layer compositions, pipeline
    micro-batches and ZeRO stages allowed by :meth:`FineSearch.valid`.

    Raises:
        HetplanError: more than ``max_states`` states (the instance is too large to enumerate).
    """
    import itertools

    from hetplan.search.space import divisors

    L, g = search.cm.L, search.cm.job.global_batch
    out = []

    def compositions(total, parts):
        for cuts in itertools.combinations(range(1, total), parts - 1):
            yield [b - a for a, b in zip((0,) + cuts, cuts + (total,))]

    experts = divisors(search.cm.m.num_experts) if search.cm.m.is_moe else [1]
    for cp, ep in itertools.product(search.cps, experts):
        if num_gpus % cp:
            continue
        for p in range(1, min(num_gpus // cp, L) + 1):
            for B in divisors(g):
                for gpus in compositions(num_gpus // cp, p):
                    lays = [search.layouts(x, B) for x in gpus]
                    if not all(lays):
                        continue
                    for combo in itertools.product(*lays):
                        for ns in compositions(L, p):
                            for z in ((0, 1) if p > 1 else (0, 1, 2, 3)):
                                st = FineState(tuple(FineStage(n, t, d) for n, (t, d) in zip(ns, combo)), B, z, cp, ep)
                                if search.valid(st):
                                    out.append(st)
                                    if len(out) > max_states:
                                        raise HetplanError(f"more than {max_states} states", field="num_gpus",
                                                           fix="enumerate a smaller instance")
    return out


def with_gpu_memory(catalog: Catalog, gpu: str, memory_bytes: float) -> Catalog:
    """A copy of ``catalog`` in which ``gpu`` has ``memory_bytes`` of usable memory (e.g. Aceso's experiments cap
    V100-32GB at 12,000 MB and 28,000 MB, ``scripts/aceso_gpt_search.sh --memory-limit``).

    Raises:
        HetplanError: unknown GPU; memory not positive.
    """
    if memory_bytes <= 0:
        raise HetplanError(f"must be positive, got {memory_bytes}", field="memory_bytes", fix="give bytes > 0")
    spec = catalog.get(gpu)
    gpus = dict(catalog.gpus)
    gpus[spec.name] = spec.model_copy(update={"memory_bytes": float(memory_bytes)})
    return Catalog(gpus, catalog.date)


__all__ = ["fine_search", "FineResult", "FineSearch", "TraceStep", "with_gpu_memory", "enumerate_states", "DEFAULT_BUDGET_EVALUATIONS"]
