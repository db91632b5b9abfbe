"""Fast cost model of fine-grained plans for the bottleneck-alleviation search (:mod:`hetplan.search.fine`).

A fine-grained state is a pipeline of stages, each with its own number of layers, TP degree and DP degree, one
pipeline micro-batch of ``B`` sequences (stage ``i`` runs ``B / dp_i`` per replica) and one ZeRO stage. Each
stage's activation recomputation is not a search dimension: it is *repaired* to the lightest setting that fits in
memory (:meth:`FineCostModel.repair`; more recomputation only adds backward time, hetplan.search.hetero argues the
same), chosen among none, selective on ``r`` layers and full on ``r`` layers (``r`` = 1..n, per-layer
recomputation, Aceso EuroSys'24 Sec. 4.2).

Numbers are the estimator's, term for term (a test checks ``iteration_time_s`` against
:func:`hetplan.estimate.estimator.estimate` with the event-simulated 1F1B schedule):

* per-stage costs from :func:`hetplan.estimate.stage.stage_costs`, evaluated once per stage context (position
  kind, TP, DP, per-replica micro-batch, micro-batches, ZeRO, recomputation) on arrays over
  (micro-batches in flight 1..P) x (layers 0..L) and then looked up;
* boundary transfers and the iteration assembled as in the estimator
  (:func:`hetplan.estimate.iteration.boundary_time_s`, resharding included, and
  :func:`hetplan.estimate.iteration.assemble_iteration`);
* the 1F1B pipeline by :func:`simulate_1f1b`, an exact event simulation (same semantics as
  :func:`hetplan.estimate.schedule.simulate`) organised in rounds, that stops simulating once the steady state
  repeats itself exactly (every stage's clock advances by the same cycle time in one round) and shifts the
  clocks over the remaining steady rounds: O(p·(transient + p)) instead of O(p·m).

Cost of one state evaluation: O(p) table look-ups plus the simulation; a new stage context costs one vectorised
:func:`stage_costs` call (~1 ms).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from hetplan.degrees import Degrees
from hetplan.estimate.compute import RECOMPUTE_CODES
from hetplan.estimate.estimator import LayerTimeSource, p2p_model, pool_link
from hetplan.estimate.options import TrainingOptions
from hetplan.estimate.iteration import assemble_iteration, boundary_time_s
from hetplan.estimate.schedule import simulate
from hetplan.estimate.stage import stage_costs
from hetplan.estimate.stagework import StageHardware, StageWork
from hetplan.hardware.catalog import GPUSpec
from hetplan.model.spec import ModelSpec
from hetplan.plan import GPUPool, Job, Plan, Stage, boundary_is_intra_node, stage_chunks


class StageContext(NamedTuple):
    """What a stage's costs depend on besides its layers and recomputation (the key of the cost tables): its
    position (first / last / only stage), TP and DP degrees, micro-batch per replica (sequences), micro-batches per
    iteration, ZeRO stage, the CP, EP and expert-TP degrees, and under interleaved 1F1B its virtual stages and the
    pipeline's stage count (which the in-flight count then depends on; 0 without interleaving)."""

    has_embedding: bool
    has_head: bool
    single_stage: bool
    tp: int
    dp: int
    mbs: int
    num_microbatches: int
    zero: int
    cp: int = 1
    ep: int = 1
    expert_tp: int = 1
    virtual_stages: int = 1
    pp: int = 0


@dataclass(frozen=True)
class FineStage:
    """One stage of a state: layers, TP and DP degree (``tp·dp`` GPUs per CP rank; ``tp·cp·dp`` in all)."""

    num_layers: int
    tp: int
    dp: int

    @property
    def gpus(self) -> int:
        return self.tp * self.dp


@dataclass(frozen=True)
class FineState:
    """A point of the fine-grained space: stages in order, pipeline micro-batch ``micro_batch`` (sequences; stage i
    runs ``micro_batch / dp_i`` per replica), the ZeRO stage (0 or 1 with pipelining), and the context- and
    expert-parallel degrees of every stage (each sequence split over ``cp`` ranks; the experts over ``ep`` x
    ``expert_tp`` of a stage's ``tp·cp·dp`` ranks: MoE parallel folding, :class:`hetplan.degrees.Degrees`)."""

    stages: tuple[FineStage, ...]
    micro_batch: int
    zero: int = 0
    cp: int = 1
    ep: int = 1
    expert_tp: int = 1
    virtual_stages: int = 1

    @property
    def pp(self) -> int:
        return len(self.stages)

    @property
    def num_gpus(self) -> int:
        return self.cp * sum(s.gpus for s in self.stages)


@dataclass
class StateCost:
    """Cost of one state (seconds, bytes); lists have one entry per stage (per boundary for ``p2p_s``).

    ``recompute``: (mode, layers) chosen per stage by the repair; ``over_memory_bytes``: total excess over the
    capacity (0 when everything fits); ``key``: (excess, iteration time), the search's order."""

    iteration_time_s: float
    forward_s: list[float]
    backward_s: list[float]
    recompute_s: list[float]
    tp_comm_s: list[float]
    dp_exposed_s: list[float]
    optimizer_s: list[float]
    memory_bytes: list[float]
    p2p_s: list[float]
    recompute: list[tuple[str, int]]
    over_memory_bytes: float

    @property
    def stage_time_s(self) -> list[float]:
        """Forward + backward of one micro-batch per stage (s)."""
        return [f + b for f, b in zip(self.forward_s, self.backward_s)]

    @property
    def key(self) -> tuple[float, float]:
        """Sort key: bytes over GPU memory first (0 when it fits), then iteration time (s)."""
        return (self.over_memory_bytes, self.iteration_time_s)


def simulate_1f1b(forward_s, backward_s, p2p_s, num_microbatches: int) -> tuple[float, list[float]]:
    """Exact 1F1B pipeline (module doc): ``(makespan_s, stage_end_s)``, equal to
    ``hetplan.estimate.schedule.simulate(..., "1f1b")``.

    Round ``r`` (from ``-(p-1)`` to ``m-1``): stage ``i`` runs the forward of micro-batch ``r + p - 1 - i`` (if it
    exists; it needs that micro-batch's forward on stage ``i-1``, run in round ``r-1``), then the backward of
    micro-batch ``r`` (if ``r >= 0``; it needs that backward on stage ``i+1``, same round, so stages are swept
    last to first). Falls back to the generic simulation when ``m < p``.
    """
    p, m = len(forward_s), int(num_microbatches)
    f = [float(x) for x in forward_s]
    b = [float(x) for x in backward_s]
    c = [float(x) for x in p2p_s]
    if p == 1:
        end = m * (f[0] + b[0])
        return end, [end]
    if m < p:
        res = simulate(f, b, c, m, "1f1b")
        return res.makespan_s, list(res.stage_end_s)
    free = [0.0] * p
    fprev = [0.0] * p
    fcur = [0.0] * p
    last_steady = m - p  # rounds 0..m-p: every stage runs one forward and one backward
    prev_free = None
    prev_f = None
    r = -(p - 1)
    while r <= m - 1:
        for i in range(p):
            j = r + p - 1 - i
            if 0 <= j < m:
                ready = 0.0 if i == 0 else fprev[i - 1] + c[i - 1]
                s = free[i] if free[i] > ready else ready
                free[i] = fcur[i] = s + f[i]
        if r >= 0:
            nxt = 0.0
            for i in range(p - 1, -1, -1):
                ready = fcur[i] if i == p - 1 else nxt + c[i]
                s = free[i] if free[i] > ready else ready
                free[i] = nxt = s + b[i]
        if 1 <= r < last_steady and prev_free is not None and prev_f is not None:
            lam = free[0] - prev_free[0]
            tol = 1e-12 * (abs(free[0]) + 1.0)
            if all(abs(free[i] - prev_free[i] - lam) <= tol and abs(fcur[i] - prev_f[i] - lam) <= tol
                   for i in range(p)):
                k = last_steady - r
                free = [x + k * lam for x in free]
                fcur = [x + k * lam for x in fcur]
                r += k
        prev_free, prev_f = list(free), list(fcur)
        fprev, fcur = fcur, fprev
        fcur[:] = fprev
        r += 1
    return max(free), free


class FineCostModel:
    """Costs of fine-grained states of one GPU pool (module doc).

    Args:
        m: the model; job: the job (sequence length, global batch, dtype); pool, gpu: the GPUs.
        profiles: measured layer times (the estimator's ``profiles``), optional.
        memory_capacity_bytes: usable memory per GPU (default the GPU's memory).
        max_stages: the most stages a state may have (sizes the tables; default the pool's GPU count).
        recompute_modes: the recomputation modes the repair may use on some layers (``()`` = none at all).
    Attributes:
        evaluations: states costed so far (cache misses of :meth:`cost`), the search's work counter.
    """

    def __init__(self, m: ModelSpec, job: Job, pool: GPUPool, gpu: GPUSpec, profiles: LayerTimeSource | None = None,
                 memory_capacity_bytes: float | None = None, max_stages: int | None = None,
                 recompute_modes: tuple[str, ...] = ("selective", "full")):
        self.m, self.job, self.pool, self.gpu = m, job, pool, gpu
        self.options = TrainingOptions.from_job(job)
        self.recompute_modes = tuple(recompute_modes)
        self.profiles = profiles
        self.link = pool_link(pool, gpu, job=job)
        self.hardware = StageHardware(gpu, self.link)
        self.capacity = float(gpu.memory_bytes if memory_capacity_bytes is None
                              else min(memory_capacity_bytes, gpu.memory_bytes))
        self.L = m.num_layers
        self.P = max(1, max_stages or pool.count)
        self.evaluations = 0
        self._tables: dict = {}
        self._measured: dict = {}
        self._p2p: dict = {}
        self._repair: dict = {}
        self._costs: dict = {}

    # -- per-stage tables --------------------------------------------------------------------------------------
    def _measured_time(self, b: int, tp: int):
        key = (b, tp)
        if key not in self._measured:
            self._measured[key] = (None if self.profiles is None else
                                   self.profiles.layer_time_s(self.gpu.name, self.m, self.job.dtype, b,
                                                              self.job.seq_len, tp))
        return self._measured[key]

    def _call(self, ctx: StageContext, n, in_flight, code, r):
        emb, head, single, tp, dp, b, mb, zero, cp, ep, etp, v, _ = ctx
        degrees = Degrees.of(tp=tp, cp=cp, dp=dp, zero=zero, ep=ep, expert_tp=etp, virtual_stages=v)
        work = StageWork(s=self.job.seq_len, b=b, num_layers=n, has_embedding=emb, has_head=head, single_stage=single,
                         in_flight=self._in_flight(ctx, in_flight), num_microbatches=mb, recompute=code, zero=zero,
                         sequence_parallel=tp > 1, recompute_layers=r)
        return stage_costs(self.m, self.hardware, degrees, work, self.options, self._measured_time(b, tp))

    @staticmethod
    def _in_flight(ctx: StageContext, k):
        """Micro-batches in flight of a stage ``k = p - i`` from the pipeline's end (the tables' index 1..P): ``k``
        under 1F1B (clipped to the micro-batches by :meth:`stage_context`), interleaved 1F1B's
        ``min(2(k-1) + (v-1)p + 1, m v) / v`` (:func:`hetplan.estimate.estimator.in_flight_microbatches`)."""
        v = ctx.virtual_stages
        if v == 1:
            return k
        return np.minimum(2 * (np.asarray(k) - 1) + (v - 1) * ctx.pp + 1, ctx.num_microbatches * v) / v

    @staticmethod
    def _unpack(c, shape):
        keys = ("forward_s", "backward_s", "tp_comm_s", "dp_exposed_s", "optimizer_s")
        out = [np.broadcast_to(np.asarray(getattr(c, k), dtype=float), shape) for k in keys]
        out.append(np.broadcast_to(np.asarray(c.memory.total, dtype=float), shape))
        return out

    def table(self, ctx):
        """Stage costs without recomputation over (in flight 1..P) x (layers 0..L): list of six arrays (forward,
        backward, TP comm, exposed DP, optimizer, memory) of shape (P, L+1)."""
        t = self._tables.get(ctx)
        if t is None:
            n = np.arange(self.L + 1)[None, :]
            inflight = np.arange(1, self.P + 1)[:, None]
            t = self._unpack(self._call(ctx, n, inflight, 0, None), (self.P, self.L + 1))
            self._tables[ctx] = t
        return t

    #: Models with at most this many layers get one recomputation table per (context, in flight) over all
    #: (layers, recomputed layers) pairs; larger ones one per layer count.
    DENSE_LAYERS = 64

    def recompute_options(self, ctx, in_flight: int, n: int):
        """Stage costs of ``n`` layers with r = 0..n of them recomputed, selective (row 0) or full (row 1): six
        arrays of shape (2, n+1)."""
        code = np.array([[RECOMPUTE_CODES["selective"]], [RECOMPUTE_CODES["full"]]])
        key: tuple
        if self.L <= self.DENSE_LAYERS:
            key = (ctx, in_flight)
            t = self._tables.get(key)
            if t is None:
                L = self.L
                nn = np.arange(L + 1)[None, :, None]
                r = np.minimum(np.arange(L + 1)[None, None, :], nn)
                t = self._unpack(self._call(ctx, nn, in_flight, code[:, :, None], r), (2, L + 1, L + 1))
                self._tables[key] = t
            return [a[:, n, : n + 1] for a in t]
        key = (ctx, in_flight, n)
        t = self._tables.get(key)
        if t is None:
            r = np.arange(n + 1)[None, :]
            t = self._unpack(self._call(ctx, n, in_flight, code, r), (2, n + 1))
            self._tables[key] = t
        return t

    def _lookup(self, ctx, in_flight: int, n: int, mode: str, r: int):
        """(forward, backward, tp_comm, dp_exposed, optimizer, memory) of a stage context with (mode, r)."""
        if mode == "none" or r == 0:
            t, k = self.table(ctx), (in_flight - 1, n)
        else:
            t, k = self.recompute_options(ctx, in_flight, n), (0 if mode == "selective" else 1, min(r, n))
        return tuple(float(a[k]) for a in t)

    def repair(self, ctx, in_flight: int, n: int) -> tuple[str, int]:
        """The lightest recomputation ``(mode, layers)`` with which a stage fits in memory: among none, selective
        on r layers and full on r layers (r minimal for each mode), the one with the least stage time; when none
        fits, full recomputation of every layer (the least memory). Memory is non-increasing in r."""
        key = (ctx, in_flight, n)
        hit = self._repair.get(key)
        if hit is not None:
            return hit
        cap = self.capacity
        best = ("none", 0)
        if n > 0 and self.table(ctx)[5][in_flight - 1, n] > cap:
            f, b, _, _, _, mem = self.recompute_options(ctx, in_flight, n)
            options = []
            for row, mode in ((0, "selective"), (1, "full")):
                if mode not in self.recompute_modes:
                    continue
                ok = np.nonzero(mem[row] <= cap)[0]
                ok = ok[ok >= 1]
                if len(ok):
                    r = int(ok[0])
                    options.append((float(f[row, r] + b[row, r]), row, mode, r))
            fallback = (self.recompute_modes[-1], n) if self.recompute_modes else ("none", 0)
            best = min(options)[2:] if options else fallback
        self._repair[key] = best
        return best

    # -- states -----------------------------------------------------------------------------------------------
    def stage_context(self, state: FineState, i: int) -> tuple[StageContext, int]:
        """The :class:`StageContext` of stage ``i`` and its table index of micro-batches in flight (1F1B:
        ``min(p - i, m)``; interleaved: ``p - i``, :meth:`_in_flight`)."""
        p, v = state.pp, state.virtual_stages
        st = state.stages[i]
        mb = self.job.global_batch // state.micro_batch
        ctx = StageContext(i == 0, i == p - 1, p == 1, st.tp, st.dp, state.micro_batch // st.dp, mb, state.zero,
                           state.cp, state.ep, state.expert_tp, v, p if v > 1 else 0)
        return ctx, min(p - i, mb) if v == 1 else p - i

    def _boundary(self, a: FineStage, nb: FineStage, B: int, cp: int, intra: bool) -> float:
        key = (a, nb, B, cp, intra)
        v = self._p2p.get(key)
        if v is None:
            v = self._p2p[key] = boundary_time_s(self.m, self.job.seq_len, (a.tp, cp, a.dp, B // a.dp),
                                                 (nb.tp, cp, nb.dp, B // nb.dp), self.link, self.link, intra)
        return v

    def cost(self, state: FineState) -> StateCost:
        """Cost of ``state`` (cached; each miss counts one evaluation)."""
        hit = self._costs.get(state)
        if hit is not None:
            return hit
        self.evaluations += 1
        p = state.pp
        mb = self.job.global_batch // state.micro_batch
        fw, bw, rc_s, tpc, dpx, opt, mem, rcs = [], [], [], [], [], [], [], []
        for i, st in enumerate(state.stages):
            ctx, inflight = self.stage_context(state, i)
            mode, r = self.repair(ctx, inflight, st.num_layers)
            f, b, tc, dx, op, me = self._lookup(ctx, inflight, st.num_layers, mode, r)
            b0 = self._lookup(ctx, inflight, st.num_layers, "none", 0)[1] if r else b
            fw.append(float(f)); bw.append(float(b)); rc_s.append(float(b - b0)); tpc.append(float(tc))
            dpx.append(float(dx)); opt.append(float(op)); mem.append(float(me)); rcs.append((mode, r))
        intra = boundary_is_intra_node([s.gpus * state.cp for s in state.stages], [0] * p, [self.pool.gpus_per_node])
        c = [self._boundary(state.stages[i], state.stages[i + 1], state.micro_batch, state.cp, intra[i])
             for i in range(p - 1)]
        blocking = p2p_model(self.options.framework)  # DeepSpeed's blocking transfers, as estimate() simulates
        v = state.virtual_stages
        simulated: tuple[float, list[float]]
        if v > 1 or blocking:  # interleaved 1F1B: each chunk 1/v of its stage (hetplan.estimate.schedule.simulate)
            sim = simulate(fw, bw, c, mb, "interleaved" if v > 1 else "1f1b", v, blocking_p2p=blocking)
            simulated = (sim.makespan_s, list(sim.stage_end_s))
        else:
            simulated = simulate_1f1b(fw, bw, c, mb)
        iteration = float(assemble_iteration(fw, bw, dpx, opt, sum(c), mb, virtual_stages=v,
                                             simulated=simulated).iteration_s)
        over = sum(max(0.0, x - self.capacity) for x in mem)
        res = StateCost(iteration, fw, bw, rc_s, tpc, dpx, opt, mem, c, rcs, over)
        self._costs[state] = res
        return res

    # -- conversion -------------------------------------------------------------------------------------------
    def to_plan(self, state: FineState) -> Plan:
        """The :class:`~hetplan.plan.Plan` of ``state`` (recomputation as repaired; per-stage ``mbs`` only when
        the DP degrees differ)."""
        cost = self.cost(state)
        uniform = len({s.dp for s in state.stages}) == 1
        stages = []
        for st, (mode, r) in zip(state.stages, cost.recompute):
            stages.append(Stage(
                pool=0, num_layers=st.num_layers, tp=st.tp, dp=st.dp,
                recompute=mode if r else "none",
                recompute_layers=None if (r == 0 or r >= st.num_layers) else r,
                mbs=None if uniform else state.micro_batch // st.dp,
            ))
        v = state.virtual_stages
        chunks = [stage_chunks(st.num_layers, v, first=i == 0) for i, st in enumerate(state.stages)] if v > 1 else None
        if chunks is not None and len({n for c in chunks for n in c}) == 1:
            chunks = None  # v equal chunks per stage
        return Plan(job=self.job, pools=[self.pool], stages=stages, mbs=state.micro_batch // state.stages[0].dp,
                    zero=state.zero, cp=state.cp, ep=state.ep,
                    sequence_parallel=any(s.tp > 1 for s in state.stages) and self.job.stack_spec().sequence_parallel,
                    expert_tp=state.expert_tp, virtual_stages=v, pipeline_chunks=chunks)


def state_from_plan(plan: Plan) -> FineState:
    """The :class:`FineState` of a single-pool 1F1B plan (its recomputation is dropped: states repair it).

    Raises:
        ValueError: the plan uses more than one pool.
    """
    if len({st.pool for st in plan.stages}) > 1:
        raise ValueError("fine-grained search works on one GPU pool")
    B = plan.stages[0].dp * plan.stage_mbs(0)
    return FineState(tuple(FineStage(st.num_layers, st.tp, st.dp) for st in plan.stages), B, plan.zero, plan.cp,
                     plan.ep, plan.expert_tp, plan.virtual_stages if plan.pp > 1 else 1)


__all__ = ["FineStage", "FineState", "StateCost", "FineCostModel", "simulate_1f1b", "state_from_plan"]
