"""Vectorised evaluation of every homogeneous configuration of one GPU pool.

Each configuration's p stages (balanced split, :func:`hetplan.plan.balanced_split`, or under interleaving the
short-ends split :func:`hetplan.plan.ends_split`) fall into at most four kinds that share costs: the first stage (embedding), the middle stages with one extra layer, the other middle
stages, and the last stage (head). :func:`evaluate_pool` calls :func:`hetplan.estimate.stage.stage_costs` once on
arrays of shape (configurations, 4) and assembles the kinds with their multiplicities into an iteration with
:func:`hetplan.estimate.iteration.assemble_iteration` (closed-form pipeline) — the assembly
:func:`hetplan.estimate.estimator.estimate` applies to one plan (a test checks they agree).

Cost: O(rows) numpy work with a small constant; no pruning.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from hetplan.degrees import Degrees
from hetplan.estimate import fp8
from hetplan.estimate.estimator import in_flight_microbatches, pool_link, pool_price_usd_per_hour
from hetplan.estimate.iteration import assemble_iteration, boundary_time_s
from hetplan.estimate.options import TrainingOptions
from hetplan.estimate.stage import stage_costs, stage_memory
from hetplan.estimate.stagework import StageHardware, StageWork
from hetplan.hardware.catalog import GPUSpec
from hetplan.model import counts
from hetplan.model.spec import ModelSpec
from hetplan.plan import GPUPool, Job
from hetplan.search.space import Pins, enumerate_space, fsdp_zero_stages

#: Configurations needing more than this multiple of the GPU memory are not timed (they cannot run, and are too
#: far from fitting to be worth mentioning as "stopped by memory").
NEAR_MISS_MEMORY_FACTOR = 2.0

#: Names of the time components reported per configuration (seconds per iteration).
COMPONENTS = ("compute_s", "tp_comm_s", "bubble_s", "p2p_s", "dp_exposed_s", "optimizer_s")


@dataclass
class PoolResult:
    """Arrays over the configurations of one pool (all of the same length).

    ``config``: tp, pp, dp, mbs, zero, recompute (codes), virtual_stages, cp, ep; ``num_gpus``; ``iteration_time_s`` (closed-form
    pipeline, :func:`hetplan.estimate.pipeline.pipeline_time_s`) and its :data:`COMPONENTS`;
    ``lower_bound_time_s`` (a bound no schedule can beat, :func:`pipeline_lower_bound_s`); ``memory`` (peak stage, bytes per GPU: weights, gradients, optimizer, activations,
    overhead, total); ``fits``; ``usd_per_hour``; ``mfu``.
    """

    pool_index: int
    gpu: GPUSpec
    config: dict[str, np.ndarray]
    configurations_evaluated: int
    num_gpus: np.ndarray
    iteration_time_s: np.ndarray
    lower_bound_time_s: np.ndarray
    components: dict[str, np.ndarray]
    memory: dict[str, np.ndarray]
    fits: np.ndarray
    usd_per_hour: np.ndarray
    mfu: np.ndarray

    def __len__(self) -> int:
        return len(self.num_gpus)


def _stage_kinds(L: int, pp: np.ndarray, mb: np.ndarray, v: np.ndarray, split: np.ndarray | None = None):
    """Layers, multiplicity, embedding/head flags and in-flight micro-batches of the 4 stage kinds, (n, 4).

    Split 0 is :func:`hetplan.plan.balanced_split`; split 1 :func:`hetplan.plan.ends_split` (the middle stages
    ``v·c`` layers, the first and the last ``d - ceil(d/2)`` and ``ceil(d/2)`` fewer). In-flight counts are those
    of the first stage of each kind (the largest), per :func:`hetplan.estimate.estimator.in_flight_microbatches`
    (1F1B, or interleaved with v virtual stages)."""
    q, r = L // pp, L % pp
    mids = np.maximum(pp - 2, 0)
    r_mid = np.minimum(r, mids)
    r_rest = r - r_mid
    single = pp == 1
    layers = np.stack([q + (r_rest >= 1), q + 1, q, q + (r_rest >= 2)], axis=1)
    layers[single, 0] = L
    if split is not None and np.any(split == 1):  # ends_split: r_mid = mids middle stages of v·c layers
        ends = split == 1
        c = -(-L // (pp * v))
        d = pp * v * c - L
        loss = np.minimum(c, -(-d // 2))
        full = v * c
        layers = np.where(ends[:, None], np.stack([full - (d - loss), full, full, full - loss], axis=1), layers)
        r_mid = np.where(ends, mids, r_mid)
    count = np.stack([np.ones_like(pp), r_mid, mids - r_mid, (~single).astype(np.int64)], axis=1)
    first_index = np.stack([np.zeros_like(pp), np.ones_like(pp), 1 + r_mid, pp - 1], axis=1)
    in_flight = in_flight_microbatches("1f1b", pp[:, None], first_index, mb[:, None], v[:, None])
    has_emb = np.zeros((len(pp), 4), dtype=bool)
    has_emb[:, 0] = True
    has_head = np.zeros((len(pp), 4), dtype=bool)
    has_head[:, 3] = True
    has_head[single, 0] = True
    return layers, count, has_emb, has_head, in_flight


def _intra_boundaries(stage_gpus: np.ndarray, pp: np.ndarray, gpus_per_node: int) -> np.ndarray:
    """Number of intra-node stage boundaries per configuration of equal stages of ``stage_gpus`` GPUs.

    The rule of :func:`hetplan.plan.boundary_is_intra_node` (stages on consecutive GPUs; boundary i is intra-node
    when stages i and i+1 lie in one node), counted on arrays: boundary i spans GPUs ``[i S, (i+2) S - 1]``.
    """
    if len(pp) == 0:
        return np.zeros(0, dtype=np.int64)
    # per distinct stage size, how many of the first k boundaries are intra-node (a configuration x boundary
    # table was configurations x max(pp) large: 35 GiB for a 10,000-layer model on 1,024 GPUs)
    sizes, which = np.unique(stage_gpus, return_inverse=True)
    i = np.arange(int(pp.max()) - 1)[None, :]
    size = sizes[:, None]
    same = (i * size) // gpus_per_node == ((i + 2) * size - 1) // gpus_per_node
    first_k = np.concatenate([np.zeros((len(sizes), 1), dtype=np.int64), np.cumsum(same, axis=1)], axis=1)
    return first_k[which.reshape(-1), pp - 1]


def pipeline_lower_bound_s(per_stage_s, count, p2p_s, num_microbatches, virtual_stages=1):
    """A lower bound on the pipeline time of any schedule, per configuration.

    Stage i processes all m micro-batches one operation at a time (``m · (f_i + b_i)`` of work); its first operation
    cannot start before micro-batch 1's forward has crossed stages 0..i-1 (``Σ_{j<i} f_j`` plus i transfers), and
    after its last operation (a backward) that micro-batch's backward still has to cross stages i-1..0
    (``Σ_{j<i} b_j`` plus i transfers). Hence ``T ≥ max_i [ Σ_{j<i} (f_j + b_j) + 2 i c + m (f_i + b_i) ]`` with c
    the cheapest transfer. With interleaving (v virtual stages) the chain runs through the first model chunk only,
    ``1/v`` of each earlier stage: the prefix is divided by v. For each stage kind the last stage of that kind has the largest prefix, so the bound is
    evaluated on those four stages. Arrays (n, 4) as in :func:`_stage_kinds`; ``p2p_s`` and ``num_microbatches``
    shape (n,).
    """
    n1, n2 = count[:, 1], count[:, 2]
    p0, p1, p2 = per_stage_s[:, 0], per_stage_s[:, 1], per_stage_s[:, 2]
    m = num_microbatches
    before = np.stack([
        np.zeros_like(p0),
        p0 + np.maximum(n1 - 1, 0) * p1,
        p0 + n1 * p1 + np.maximum(n2 - 1, 0) * p2,
        p0 + n1 * p1 + n2 * p2,
    ], axis=1)
    index = np.stack([np.zeros_like(n1), n1, n1 + n2, n1 + n2 + 1], axis=1)
    v = np.broadcast_to(np.asarray(virtual_stages, dtype=float), m.shape)
    bound = before / v[:, None] + 2 * index * p2p_s[:, None] + m[:, None] * per_stage_s
    return np.max(np.where(count > 0, bound, 0.0), axis=1)


def stage_chain_lower_bound_s(per_stage_s, p2p_s, num_microbatches, dp_exposed_s=None, optimizer_s=None,
                              virtual_stages=1) -> float:
    """The bound of :func:`pipeline_lower_bound_s` for one pipeline given stage by stage (heterogeneous plans), plus
    the data-parallel and optimizer terms, in seconds per iteration; no schedule can beat it.

    With ``a_i`` = forward+backward of stage ``i`` per micro-batch, ``c_j`` the one-way transfer time of boundary
    ``j``, ``e_i`` the exposed DP time and ``o_i`` the optimizer time of stage ``i`` (all s)::

        T >= max( max_i [Σ_{j<i} a_j / v + 2 Σ_{j<i} c_j + m a_i] + e_0 ,  max_i [m a_i + e_i] ) + max_i o_i

    The first term is the chain of :func:`pipeline_lower_bound_s` (with each boundary's own transfer time): it ends
    with the last backward on stage 0, after which stage 0 still reduces its gradients (``e_0``); every stage
    finishes no earlier than its own ``m a_i`` of work and then reduces its gradients (the estimator's iteration is
    ``max_i (end_i + e_i) + max_i o_i``, :func:`hetplan.estimate.estimator.estimate`). A transfer that also
    occupies the stages (blocking send/recv) only lengthens the schedule, so the bound stays valid.

    Args:
        per_stage_s, dp_exposed_s, optimizer_s: length p (defaults: zeros). p2p_s: length p - 1.
    """
    a = np.asarray(per_stage_s, dtype=float)
    p = len(a)
    c = np.asarray(p2p_s, dtype=float)
    e = np.zeros(p) if dp_exposed_s is None else np.asarray(dp_exposed_s, dtype=float)
    o = np.zeros(p) if optimizer_s is None else np.asarray(optimizer_s, dtype=float)
    prefix = np.concatenate([[0.0], np.cumsum(a[:-1] / virtual_stages + 2 * c)])
    m = float(num_microbatches)
    return float(max(np.max(prefix + m * a) + e[0], np.max(m * a + e)) + np.max(o))


def window_lower_bound_s(stage_sum_s, p2p_one_way_s, pp, num_microbatches, virtual_stages=1, wrap_s=0.0):
    """A lower bound (s) on the pipeline time of 1F1B and interleaved 1F1B from stage 0's in-flight window
    (arrays or scalars; ``stage_sum_s`` = Σ_i a_i, forward+backward of every stage per micro-batch;
    ``p2p_one_way_s`` = Σ_j c_j over the p-1 boundaries).

    Stage 0 runs ``w`` warm-up forwards, then one forward per backward (:mod:`hetplan.estimate.schedule`: 1F1B
    ``w = p - 1``; interleaved ``w = 2(p - 1) + (v - 1)p`` virtual micro-batches, Megatron-LM), so at most
    ``W = w + 1`` micro-batches are in flight: forward ``k`` starts after backward ``k - W`` has ended on stage 0.
    A (virtual) micro-batch's round trip from its forward on stage 0 back to its backward there crosses every
    stage of its last model chunk and every boundary twice: ``R >= Σ_i a_i / v + 2 Σ_j c_j``. Hence
    ``T >= ceil(m v / W) · R``. When transfers are slow against the compute (a 10 Gb/s network) this is the
    binding bound: the pipeline waits on its window, which the closed form's single ``2 Σ c`` misses.

    Interleaved (v > 1), the chunks of one micro-batch are not independent: chunk ``c + 1`` starts on stage 0 only
    after chunk ``c`` has crossed every stage and the wrap-around transfer ``c_w`` (``wrap_s``, default 0; the
    cheapest transfer keeps the bound valid). So forward ``(j, c)`` on stage 0 waits for its backward there at
    least ``R_c = (v - c) (Σ a / v + 2 Σ c) + 2 (v - 1 - c) c_w``. The number of forwards started minus
    backwards ended on stage 0 never exceeds ``W`` (the count rule above, whatever order the backwards take), so
    integrated over the iteration ``Σ_{j,c} R_c <= W T``, i.e. ``T >= m [v(v+1)/2 (Σ a / v + 2 Σ c) +
    v(v-1) c_w] / W`` — for v = 2, 1.5x the per-chunk bound; on 10 Gb/s Ethernet it is what keeps an
    interleaved wide pipeline from looking 4x faster than its estimate (issue 27)."""
    p = np.asarray(pp, dtype=float)
    v = np.asarray(virtual_stages, dtype=float)
    m = np.asarray(num_microbatches, dtype=float)
    window = np.where(v > 1, 2 * (p - 1) + (v - 1) * p + 1, p)
    rounds = np.ceil(m * v / np.maximum(np.minimum(window, m * v), 1))
    chunk = np.asarray(stage_sum_s, dtype=float) / v + 2 * np.asarray(p2p_one_way_s, dtype=float)
    chained = m * (v * (v + 1) / 2 * chunk + v * (v - 1) * np.asarray(wrap_s, dtype=float)) / np.maximum(window, 1)
    return np.maximum(rounds * chunk, np.where(v > 1, chained, 0.0))


def one_f_one_b_cycle_lower_bound_s(stage_min_s, p2p_max_s, pp, num_microbatches, virtual_stages=1):
    """A lower bound (s) on the pipeline time of (non-interleaved) 1F1B from the cycle across one boundary
    (arrays or scalars; ``stage_min_s`` = the least ``a_i`` = forward+backward of a stage per micro-batch,
    ``p2p_max_s`` = the slowest boundary's one-way transfer ``c``).

    Stage ``i`` runs ``w_i = p - i - 1`` warm-up forwards, then forward ``w_i + k``, backward ``k`` in turn
    (Megatron-LM ``forward_backward_pipelining_without_interleaving``; DeepSpeed's ``TrainSchedule`` keeps the same
    per-stage order; :mod:`hetplan.estimate.schedule`). Across boundary ``i`` (transfer ``c``), forward ``x`` of
    stage ``i`` feeds forward ``x`` of stage ``i + 1``, which is followed there by backward ``x - w_{i+1}``, which
    feeds backward ``x - w_{i+1}`` of stage ``i``, which is followed there by forward ``x + 2``
    (``w_i = w_{i+1} + 1``). So forward ``x + 2`` starts at least ``a_i + a_{i+1} + 2c`` after forward ``x`` for
    every ``x`` from ``w_i`` to ``m - 3``: ``T >= floor((m - p) / 2) (2 a_min + 2 c_max)``. A blocking transfer
    only lengthens the cycle. On a 10 Gb/s network this is the binding bound: Llama-2-7B on 32 one-GPU stages
    with 512 micro-batches and 105 ms transfers between nodes cannot beat 60 s per iteration (its estimate 64 s),
    where the in-flight window allows 17 s (issue 27).

    Interleaved (v > 1, Megatron-LM ``forward_backward_pipelining_with_interleaving``): stage ``i`` runs
    ``w_i = 2(p - i - 1) + (v - 1)p`` warm-up forwards of virtual micro-batches, then forward ``w_i + k``,
    backward ``k``; a virtual micro-batch's ordinal names the same (chunk, micro-batch) on every stage, so the same
    cycle holds with ``w_i = w_{i+1} + 2``: it advances three ordinals per ``a_i / v + a_{i+1} / v + 2c`` (a
    stage's chunk takes ``a / v``), ``T >= floor((m v - W) / 3) (2 a_min / v + 2 c_max)`` with ``W = w_0 + 1``."""
    p = np.asarray(pp, dtype=float)
    m = np.asarray(num_microbatches, dtype=float)
    v = np.asarray(virtual_stages, dtype=float)
    window = np.where(v > 1, 2 * (p - 1) + (v - 1) * p + 1, p)
    steps = np.floor(np.maximum(m * v - window, 0.0) / np.where(v > 1, 3.0, 2.0))
    per_cycle = 2 * (np.asarray(stage_min_s, dtype=float) / v + np.asarray(p2p_max_s, dtype=float))
    return np.where(p > 1, steps * per_cycle, 0.0)


def _stage_inputs(m: ModelSpec, job: Job, cfg: dict[str, np.ndarray]) -> tuple[Degrees, StageWork, np.ndarray]:
    """The :class:`Degrees` and :class:`StageWork` of the 4 stage kinds of every configuration, arrays (n, 1) and
    (n, 4), and each kind's multiplicity (:func:`_stage_kinds`)."""
    tp, pp, dp, mbs, v = cfg["tp"], cfg["pp"], cfg["dp"], cfg["mbs"], cfg["virtual_stages"]
    mb = job.global_batch // (dp * mbs)
    layers, count, has_emb, has_head, in_flight = _stage_kinds(m.num_layers, pp, mb, v, cfg.get("split"))
    col = lambda a: a[:, None]  # noqa: E731
    degrees = Degrees.of(tp=col(tp), cp=col(cfg["cp"]), dp=col(dp), zero=col(cfg["zero"]), ep=col(cfg["ep"]),
                         expert_tp=col(cfg["expert_tp"]), virtual_stages=col(v))
    work = StageWork(s=job.seq_len, b=col(mbs), num_layers=layers, has_embedding=has_emb, has_head=has_head,
                     single_stage=col(pp == 1), in_flight=in_flight, num_microbatches=col(mb),
                     recompute=col(cfg["recompute"]), zero=col(cfg["zero"]), sequence_parallel=col(tp > 1))
    return degrees, work, count


def _peak_memory_bytes(m: ModelSpec, job: Job, cfg: dict[str, np.ndarray], hardware: StageHardware,
                       options: TrainingOptions) -> np.ndarray:
    """Peak memory per GPU over the stages of each configuration (bytes), as the estimator computes it."""
    degrees, work, count = _stage_inputs(m, job, cfg)
    mem = stage_memory(m, hardware, degrees, work, options)
    return np.max(np.where(count > 0, mem.total, -1.0), axis=1)


def _pruned_peak_memory_bytes(m: ModelSpec, job: Job, cfg: dict[str, np.ndarray], hardware: StageHardware,
                              options: TrainingOptions, base: np.ndarray, pins: Pins, limit: float) -> np.ndarray:
    """:func:`_peak_memory_bytes` of every row, except interleaved rows on the balanced split whose plain-1F1B
    sibling (row ``base``) already needs more than ``limit``: those get ``inf`` without being computed. Exact
    for the cut: on the same layers, interleaving holds at least as many micro-batches in flight on every stage
    (``min(2(k-1) + (v-1)p + 1, m v) / v >= min(k, m)`` with ``k = p - i``, as ``(v-1)(p-k) + k - 1 >= 0``) and
    the stage memory grows with them (:func:`hetplan.estimate.memory.stage_memory_bytes`: activations ``in_flight``
    times non-negative per-micro-batch bytes) — except PyTorch pipelining's receive buffers (``framework =
    "fsdp"``, :func:`hetplan.estimate.memory.pipeline_buffer_bytes`), which shrink as more micro-batches are in
    flight: there, and when v is pinned (no v = 1 rows), every row is computed."""
    v, split = cfg["virtual_stages"], cfg["split"]
    if job.framework == "fsdp" or pins.virtual_stages is not None or not np.any(v > 1):
        return _peak_memory_bytes(m, job, cfg, hardware, options)
    plain = v == 1
    peak = np.full(len(v), np.inf)
    peak[plain] = _peak_memory_bytes(m, job, {k: a[plain] for k, a in cfg.items()}, hardware, options)
    todo = ~plain & ((split != 0) | (peak[base] <= limit))  # rows 0..n-1 are the v = 1 block (space.py)
    if np.any(todo):
        peak[todo] = _peak_memory_bytes(m, job, {k: a[todo] for k, a in cfg.items()}, hardware, options)
    return peak


def evaluate_pool(m: ModelSpec, job: Job, pool: GPUPool, gpu: GPUSpec, pins: Pins, pool_index: int = 0) -> PoolResult:
    """Evaluate every configuration of ``pool`` for ``job`` (see module doc).

    Memory is computed for every configuration first; times only for those needing at most
    :data:`NEAR_MISS_MEMORY_FACTOR` x the GPU's memory (the others can never run; the smallest footprint is
    kept so that an infeasible request can say how far off it is). ``configurations_evaluated`` counts all.
    """
    from hetplan.hardware.frameworks import job_framework

    # expert-TP, EP folding and interleaving only where the job's framework runs them
    # (hardware/data/frameworks.toml, its default export release): the search proposes only what it can launch
    fw = job_framework(job.framework)
    cfg = enumerate_space(m, job.global_batch, pool.count, pool.gpus_per_node, pins, job.attention,
                          expert_tp=fw is None or fw.expert_tp, interleave=fw is None or fw.interleaved,
                          seq_len=job.seq_len, stack=job.stack_spec(), ep_fold=fw is None or fw.ep_beyond_dp,
                          uneven=fw is not None and fw.interleaved and "any" in fw.splits, dtype=job.dtype,
                          gpus_per_host=pool.launch_gpus)
    if job.framework == "fsdp" and len(cfg["tp"]):
        # FSDP2 (ZeRO-3) once per layout, and DDP (ZeRO-0 over DP > 1: torchtitan's data_parallel_replicate_degree,
        # hetplan.estimate.memory.fsdp_shard_ranks) where the stack runs it (the enumeration kept ZeRO-0 only
        # then) without experts parallel over DP, which torchtitan folds into the FSDP shard ranks (the export
        # refuses EP with DDP)
        top = np.where(cfg["dp"] > 1, 3, 0)  # the space offers ZeRO-3 under a pipeline too (FSDP2 + PP)
        ddp = (cfg["dp"] > 1) & (cfg["zero"] == 0) & (cfg["ep"] == 1)
        if job.stack_spec().ddp == "reducer":  # torch DDP on 1-D meshes only (stacks.toml ddp)
            ddp &= (cfg["tp"] == 1) & (cfg["pp"] == 1) & (cfg["cp"] == 1)
        # ZeRO-2 (FSDP2 never resharding after forward) at the pipeline depths fsdp_zero_stages has it, or pinned
        searched = [p for p in np.unique(cfg["pp"]) if 2 in fsdp_zero_stages(int(p))]
        kept = (cfg["zero"] == 2) & ((pins.zero == 2) | np.isin(cfg["pp"], searched))
        cfg = {k: v[(cfg["zero"] == top) | ddp | kept] for k, v in cfg.items()}
        cfg["zero"] = np.where((cfg["dp"] > 1) & (cfg["zero"] != 0), np.where(cfg["zero"] == 2, 2, 3), 0)
        if m.is_moe and fp8.is_fp8(job.dtype) and fp8.recipe(gpu, "fsdp", job.fp8_recipe, job.stack_spec()) == "mxfp8":
            # torchao's MXFP8 grouped experts run only with expert parallelism (its padded token dispatchers;
            # the torchtitan export refuses EP 1): what the export launches
            cfg = {k: v[cfg["ep"] > 1] for k, v in cfg.items()}
    base = cfg.pop("base")
    n_all = len(cfg["tp"])
    hardware, options = StageHardware(gpu, pool_link(pool, gpu, job=job)), TrainingOptions.from_job(job)
    if n_all:
        peak = _pruned_peak_memory_bytes(m, job, cfg, hardware, options, base, pins,
                                         NEAR_MISS_MEMORY_FACTOR * gpu.memory_bytes)
        keep = peak <= NEAR_MISS_MEMORY_FACTOR * gpu.memory_bytes
        keep[int(np.argmin(peak))] = True
        cfg = {k: v[keep] for k, v in cfg.items()}
    tp, pp, dp, mbs, zero, v, cp, ep, etp = (cfg[k] for k in ("tp", "pp", "dp", "mbs", "zero", "virtual_stages",
                                                             "cp", "ep", "expert_tp"))
    mb = job.global_batch // (dp * mbs)
    link = hardware.link
    degrees, work, count = _stage_inputs(m, job, cfg)
    c = stage_costs(m, hardware, degrees, work, options)
    deg = Degrees.of(tp=tp, cp=cp, dp=dp, zero=zero, ep=ep, expert_tp=etp, pp=pp, virtual_stages=v)
    n_intra = _intra_boundaries(deg.gpus_per_stage, pp, pool.gpus_per_node)
    lay = (tp, cp, dp, mbs)
    p2p_one_intra = boundary_time_s(m, job.seq_len, lay, lay, link, link, True)
    p2p_one_inter = boundary_time_s(m, job.seq_len, lay, lay, link, link, False)
    p2p_total = n_intra * p2p_one_intra + (pp - 1 - n_intra) * p2p_one_inter
    it = assemble_iteration(c.forward_s, c.backward_s, c.dp_exposed_s, c.optimizer_s, p2p_total, mb,
                            count=count, virtual_stages=v, memory_bytes=c.memory.total,
                            capacity_bytes=gpu.memory_bytes)
    present = count > 0
    per = c.forward_s + c.backward_s
    c_min = np.where(n_intra > 0, np.minimum(p2p_one_intra, p2p_one_inter), p2p_one_inter)
    # As stage_chain_lower_bound_s: the chain ends with stage 0's last backward, after which only stage 0's own
    # exposed DP time is certain; every stage also ends no earlier than its own work plus its DP time.
    own_work = np.max(np.where(present, mb[:, None] * per + c.dp_exposed_s, 0.0), axis=1)
    window = window_lower_bound_s(np.sum(np.where(present, count * per, 0.0), axis=1), p2p_total, pp, mb, v,
                                  wrap_s=c_min)
    a_min = np.min(np.where(present, per, np.inf), axis=1)
    c_max = np.where(pp - 1 - n_intra > 0, p2p_one_inter, p2p_one_intra)
    cycle = one_f_one_b_cycle_lower_bound_s(a_min, c_max, pp, mb, v)
    lower = (np.maximum(np.maximum(np.maximum(pipeline_lower_bound_s(per, count, c_min, mb, v), window), cycle)
                        + c.dp_exposed_s[:, 0], own_work) + it.optimizer_s)

    slowest = np.argmax(np.where(present, per, -1.0), axis=1)
    rows = np.arange(len(pp))
    tp_comm = mb * np.broadcast_to(c.tp_comm_s, per.shape)[rows, slowest]
    components = {
        "compute_s": mb * it.bottleneck_s - tp_comm,
        "tp_comm_s": tp_comm,
        "bubble_s": it.bubble_s,
        "p2p_s": it.p2p_s,
        "dp_exposed_s": it.dp_exposed_s,
        "optimizer_s": it.optimizer_s,
    }
    memory = {f.name: np.broadcast_to(getattr(c.memory, f.name), per.shape)[rows, it.peak_stage]
              for f in fields(c.memory)}
    num_gpus = deg.world_size
    price = pool_price_usd_per_hour(pool, gpu)
    model_flops = counts.model_flops_per_iteration(m, job.global_batch, job.seq_len)
    assert it.fits is not None  # the memory was given
    return PoolResult(
        pool_index=pool_index,
        gpu=gpu,
        config=cfg,
        configurations_evaluated=n_all,
        num_gpus=num_gpus,
        iteration_time_s=it.iteration_s,
        lower_bound_time_s=lower,
        components=components,
        memory=memory,
        fits=it.fits,
        usd_per_hour=num_gpus * price,
        mfu=model_flops / (it.iteration_s * num_gpus * gpu.peak_flops_per_s(job.dtype)),
    )
