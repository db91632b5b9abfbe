"""The homogeneous plan space of one GPU pool, enumerated as numpy arrays (one row per configuration).

Dimensions (DESIGN.md vocabulary): TP (a power of two, at most the GPUs per node, dividing the attention heads
and the key/value heads, as Megatron-LM requires), PP (1..L stages, balanced split
:func:`hetplan.plan.balanced_split`), DP (tp·pp·dp ≤ GPUs available, global batch divisible by dp), micro-batch
size (divides global_batch / dp), recomputation (none / selective / full), ZeRO stage (0-3; 2 and 3 only without
pipeline parallelism, as in DeepSpeed, whose ZeRO-2/3 cannot be combined with its pipeline engine, and
Megatron-LM, which implements only the distributed optimizer = ZeRO-1 — except under PyTorch's FSDP2 stacks
(``framework = "fsdp"``), which shard each pipeline stage's module: torchtitan since pytorch/torchtitan@aafe0e8,
"Add Pipeline Parallel (and 2D PP+FSDP) support", NeMo AutoModel since its pipelining, #371; with DP = 1 only ZeRO-0,
since ZeRO then shards nothing and ZeRO-3 would only add its prefetch buffer), sequence parallelism on whenever TP > 1
(it lowers activation memory at equal communication volume, Korthikanti et al. 2023 Sec. 4.2.2).
CP (context parallelism, :mod:`hetplan.estimate.context`): powers of two dividing the sequence into 2·CP equal
chunks and leaving each rank at least :data:`MIN_TOKENS_PER_CP_RANK` tokens; a stage uses tp·cp·dp GPUs.
EP (expert parallelism, MoE models, :mod:`hetplan.estimate.moe`): divisors of the expert count that divide
tp·cp·dp (MoE parallel folding, with expert-TP where the framework has it), or dp·cp where the job's framework
keeps EP inside DP x CP (``hardware/data/frameworks.toml`` ``ep_beyond_dp``).

The job's stack bounds the space: only the parallel dimensions its launcher runs (``parallel`` in
``hardware/data/stacks.toml``: llm-foundry 0.3 runs FSDP alone, DeepSpeed's engine no TP, NeMo AutoModel 25.07 no
PP) and interleaving only where it has that schedule (``interleaved``), :func:`stack_has`.

Any dimension can be pinned. Nothing is pruned: the search evaluates every row, so it is exact over this space.
Size: O(#tp · L · #dp · #mbs · 3 · #zero) rows, e.g. ~10^5 for GPT-3 175B on 1,024 GPUs.
"""

from __future__ import annotations

from typing import Literal, get_args, get_origin

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, PositiveInt

from hetplan.model.spec import ModelSpec
from hetplan.plan import fills_whole_nodes, selective_is_none

RECOMPUTE_NAMES = ("none", "selective", "full")


def _pin(help_text: str, flag: str | None = None):
    """A :class:`Pins` field: ``None`` (searched), its ``hetplan plan`` flag's help and the flag's name when it is
    not the field's (``--`` and the name with dashes)."""
    return Field(None, description=help_text, json_schema_extra={"flag": flag} if flag else None)


class Pins(BaseModel):
    """Dimensions fixed by the user (``None`` = searched): the ``[pin]`` section of a job file and the pin flags of
    ``hetplan plan``, which are generated from these fields (:meth:`flag`, the field's description as help), so
    a pin is added here only."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    tp: PositiveInt | None = _pin("Pin the tensor-parallel degree.")
    pp: PositiveInt | None = _pin("Pin the pipeline-parallel degree.")
    dp: PositiveInt | None = _pin("Pin the data-parallel degree.")
    mbs: PositiveInt | None = _pin("Pin the micro-batch size.")
    zero: Literal[0, 1, 2, 3] | None = _pin("Pin the ZeRO stage (0-3).")
    recompute: Literal["none", "selective", "full"] | None = _pin("Pin recomputation: none|selective|full.")
    num_gpus: PositiveInt | None = _pin("Pin the number of GPUs the plan uses.", flag="--use-gpus")
    virtual_stages: PositiveInt | None = _pin("Pin interleaved 1F1B's virtual stages per stage (1 = plain 1F1B).")
    cp: PositiveInt | None = _pin("Pin the context-parallel degree (sequence split).")
    ep: PositiveInt | None = _pin("Pin the expert-parallel degree (MoE models).")

    @classmethod
    def flag(cls, name: str) -> str:
        """The ``hetplan plan`` flag of pin ``name`` (``--tp``, ``--use-gpus`` …)."""
        extra = cls.model_fields[name].json_schema_extra
        return str(extra["flag"]) if isinstance(extra, dict) else "--" + name.replace("_", "-")

    @classmethod
    def choices(cls, name: str) -> tuple | None:
        """The values pin ``name`` takes when they are a fixed list (ZeRO stage, recomputation), else None (a
        positive integer)."""
        args = [a for a in get_args(cls.model_fields[name].annotation) if a is not type(None)]
        return get_args(args[0]) if get_origin(args[0]) is Literal else None


#: Fewest tokens of a sequence per CP rank the search considers: NeMo's long-context recipes start CP at 16K
#: tokens with CP 2 (8K per rank) and Llama 3 trains 128K with CP 16 (8K per rank, Dubey et al. 2024 Sec. 3.3.2);
#: below a few thousand tokens per rank the K/V exchange is exposed and the GEMMs short. A search bound (stated).
MIN_TOKENS_PER_CP_RANK = 4096


def stack_has(stack, dim: str) -> bool:
    """Whether ``stack`` (a :class:`hetplan.hardware.stacks.StackSpec`, None: any) runs parallel dimension ``dim``
    (``tp`` / ``pp`` / ``cp`` / ``ep``, or ``vp``: interleaved 1F1B), as ``stacks.toml`` records it (``parallel``,
    ``interleaved``); every search enumerates a dimension only where this holds, rule ``stack-has-option``
    refuses the rest."""
    return stack is None or stack.has(dim)


def cp_degrees(seq_len: int | None, available: int, stack=None) -> list[int]:
    """CP degrees searched: 1, and powers of two ``c ≤ available`` with ``seq_len`` divisible by ``2c`` and
    ``seq_len / c ≥`` :data:`MIN_TOKENS_PER_CP_RANK` (only 1 where ``stack`` lacks CP, :func:`stack_has`)."""
    if not stack_has(stack, "cp"):
        return [1]
    out, c = [1], 2
    while seq_len and c <= available and seq_len % (2 * c) == 0 and seq_len // c >= MIN_TOKENS_PER_CP_RANK:
        out.append(c)
        c *= 2
    return out


def divisors(n: int) -> list[int]:
    """Positive divisors of ``n``, ascending."""
    small = [d for d in range(1, int(n**0.5) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def tp_degrees(m: ModelSpec, gpus_per_node: int, available: int, stack=None) -> list[int]:
    """TP degrees allowed: powers of two ≤ min(GPUs per node, available) dividing heads and KV heads, and the node
    (so that no TP group straddles two nodes, :mod:`hetplan.plan_rules` ``tp-within-node``: a stage's groups start
    at multiples of its TP degree; on nodes of 6 GPUs TP 4 would); only 1 where ``stack`` lacks TP
    (:func:`stack_has`)."""
    out, t = [], 1
    while t <= min(gpus_per_node, available) and (t == 1 or stack_has(stack, "tp")):
        if m.num_attention_heads % t == 0 and m.num_kv_heads % t == 0 and gpus_per_node % t == 0:
            out.append(t)
        t *= 2
    return out


def stack_allows(stack, zero: int | None = None, recompute: str | None = None, attention: str = "flash",
                 dtype: str | None = None, pp: int = 1) -> bool:
    """Whether ``stack`` (a :class:`hetplan.hardware.stacks.StackSpec`, None: any) offers ZeRO stage ``zero``
    (for a ``dtype`` of ``bf16`` over ``pp`` pipeline stages, also the release's bf16 rules,
    :meth:`~hetplan.hardware.stacks.StackSpec.allows_bf16`) and recomputation ``recompute``. Under FSDP stacks ``zero`` is the sharding mode the launch names (the
    estimate prices ZeRO-0 as torchtitan's DDP replication and ZeRO-3 as FSDP2, as the export writes them): llm-foundry,
    HF Accelerate's FSDP plugin and NeMo AutoModel run FULL_SHARD only (``zero = [3]``), so no ZeRO-0 label; selective recomputation under flash attention is the plan without recomputation (:class:`hetplan.plan.Job`),
    which every stack runs — except under an FSDP stack, where it is torchtitan's per-op SAC
    (:func:`hetplan.plan.selective_is_none`), which only the stacks that list it run."""
    if stack is None:
        return True
    if zero is not None and (zero not in stack.zero or dtype == "bf16" and not stack.allows_bf16(zero, pp)):
        return False
    if recompute is not None and recompute not in stack.recompute:
        return recompute == "selective" and selective_is_none(attention, stack.framework)
    return True


def fsdp_zero_stages(pp: int) -> tuple[int, ...]:
    """ZeRO stages a search proposes under ``framework = "fsdp"`` over DP > 1, for a plan of ``pp`` pipeline
    stages, before the stack's own (:func:`stack_allows`): 0 (DDP replication, where the stack runs it), 3 (FSDP2)
    and, without a pipeline, 2 (FSDP2 never resharding after forward, torchtitan ``fsdp_reshard_after_forward =
    "never"``: one all-gather per unit and micro-batch instead of two, for the gathered parameters' memory). Under a
    pipeline torchtitan's ``"default"`` policy already never reshards (``reshard_after_forward = not pp_enabled``,
    pytorch/torchtitan@b5bcd76 ``torchtitan/distributed/fsdp.py`` ``get_fsdp_reshard_after_forward_policy``), so
    ZeRO-2 would launch the plan ZeRO-3 already is; torchtitan has no ZeRO-1 mode (``hetplan export``)."""
    return (0, 2, 3) if pp == 1 else (0, 3)


def free_recompute_codes(m: ModelSpec, attention: str, framework: str) -> list[int]:
    """Recomputation codes (:data:`RECOMPUTE_NAMES`) a search chooses among, before the stack's own
    (:func:`stack_allows`): none and full, and selective where it is a plan of its own
    (:func:`hetplan.plan.selective_is_none`: always without flash; under flash only as torchtitan's per-op SAC,
    ``framework = "fsdp"``) and priced as one — a dense model without MLA (per-op SAC of MoE and MLA layers is
    priced with halves of their matmuls, :func:`hetplan.estimate.moe.op_sac_recompute_s`, and no published run
    checks it, so the search proposes it only when pinned)."""
    if not selective_is_none(attention, framework) and not (framework == "fsdp" and (m.is_moe or m.is_mla)):
        return [0, 1, 2]
    return [0, 2]


def enumerate_space(m: ModelSpec, global_batch: int, available: int, gpus_per_node: int, pins: Pins,
                    attention: str = "standard", seq_len: int | None = None, stack=None,
                    expert_tp: bool = True, interleave: bool = True, ep_fold: bool = True,
                    uneven: bool = False, dtype: str | None = None,
                    gpus_per_host: int | None = None) -> dict[str, np.ndarray]:
    """All configurations as parallel integer arrays ``tp, pp, dp, mbs, zero, recompute, virtual_stages, cp,
    ep, expert_tp, split`` (recompute as codes 0/1/2, split as :data:`hetplan.plan.SPLITS` indices), honouring
    ``pins``. What the job's framework runs (``hardware/data/frameworks.toml``): ``expert_tp``, whether it splits
    experts over their own TP degree (else expert-TP 1); ``ep_fold``, whether EP may span TP x CP x DP (MoE
    parallel folding; else EP divides DP x CP); ``interleave``, whether it runs interleaved 1F1B (DeepSpeed's
    pipeline engine does not: only v = 1 is enumerated); ``uneven``, interleaved splits that need a layer list
    per chunk (:func:`_with_virtual_stages`). Empty arrays if nothing matches. Under ``attention = "flash"``
    selective recomputation is the same plan as none (:class:`hetplan.plan.Job`), so it is left out unless
    pinned. ``seq_len``: the job's sequence (CP needs it; without it CP is 1). ``stack``: the job's
    :class:`hetplan.hardware.stacks.StackSpec`; only the ZeRO stages and recomputation modes it offers are
    enumerated (:func:`stack_allows`, with its bf16 rules for a ``dtype`` of ``bf16``; Megatron-LM 2.5 has neither
    the distributed optimizer nor selective recomputation), and only the parallel dimensions and interleaving its launcher runs (:func:`stack_has`:
    llm-foundry 0.3 gets TP = PP = CP = EP = 1). A configuration on more than one host uses whole hosts of
    ``gpus_per_host`` GPUs (default ``gpus_per_node``; :attr:`hetplan.plan.GPUPool.launch_gpus`,
    :func:`hetplan.plan.fills_whole_nodes`: what ``hetplan export``'s launch starts)."""
    tps = tp_degrees(m, gpus_per_node, available, stack)
    if pins.tp is not None:
        tps = [t for t in tps if t == pins.tp]
    cps = cp_degrees(seq_len, available, stack)
    cps = cps if pins.cp is None else [pins.cp] if pins.cp in cps or stack_has(stack, "cp") else []
    dps = divisors(global_batch)
    triples, mbs_lists = [], []
    max_pp = m.num_layers if stack_has(stack, "pp") else 1
    for t in tps:
        for p in range(1, min(max_pp, available // t) + 1) if pins.pp is None else [pins.pp] if pins.pp <= max_pp else []:
            for c in cps:
                for d in dps:
                    n = t * p * c * d
                    if n > available:
                        break
                    if (pins.dp is not None and d != pins.dp) or (pins.num_gpus is not None and n != pins.num_gpus):
                        continue
                    if not fills_whole_nodes(n, gpus_per_host or gpus_per_node):  # what a launch starts (docstring)
                        continue
                    sizes = divisors(global_batch // d) if pins.mbs is None else [pins.mbs] if (global_batch // d) % pins.mbs == 0 else []
                    if sizes:
                        triples.append((t, p, d, c))
                        mbs_lists.append(sizes)
    names = ("tp", "pp", "dp", "mbs", "zero", "recompute")
    if not triples:
        return {k: np.zeros(0, dtype=np.int64)
                for k in (*names, "virtual_stages", "cp", "ep", "expert_tp", "split", "base")}
    quads = np.array(triples, dtype=np.int64)
    tri, cp_of = quads[:, :3], quads[:, 3]
    counts = np.array([len(x) for x in mbs_lists])
    base = np.repeat(tri, counts, axis=0)
    base_cp = np.repeat(cp_of, counts)
    mbs = np.concatenate([np.asarray(x, dtype=np.int64) for x in mbs_lists])
    free = free_recompute_codes(m, attention, stack.framework if stack is not None else "megatron")
    free = [r for r in free if stack_allows(stack, recompute=RECOMPUTE_NAMES[r], attention=attention)]
    rcs = np.array([RECOMPUTE_NAMES.index(pins.recompute)] if pins.recompute is not None else free, dtype=np.int64)
    parts = []
    base = np.column_stack([base, base_cp])  # cp rides along as a last column
    no_dp = base[:, 2] == 1
    no_pp = base[:, 1] == 1
    piped = [0, 1, 2, 3] if stack is not None and stack.framework == "fsdp" else [0, 1]  # module doc: FSDP2 + PP
    for sel, zeros, pp in ((no_dp, [0], 1), (~no_dp & no_pp, [0, 1, 2, 3], 1), (~no_dp & ~no_pp, piped, 2)):
        zeros = [z for z in zeros if sel is no_dp or stack_allows(stack, zero=z, dtype=dtype, pp=pp)]
        if pins.zero is not None:
            # a pinned ZeRO-1 with DP = 1 is a harmless what-if; ZeRO-2/3 still need pp = 1
            ok = pins.zero in zeros or (sel is no_dp and pins.zero == 1)
            zeros = [pins.zero] if ok else []
        if not zeros or not sel.any():
            continue
        zr = np.array([(z, r) for z in zeros for r in rcs], dtype=np.int64)
        rows = np.repeat(np.column_stack([base[sel, :3], mbs[sel], base[sel, 3]]), len(zr), axis=0)
        parts.append(np.column_stack([rows[:, :4], np.tile(zr, (int(sel.sum()), 1)), rows[:, 4]]))
    arr = np.concatenate(parts) if parts else np.zeros((0, 7), dtype=np.int64)
    out = {k: arr[:, i] for i, k in enumerate((*names, "cp"))}
    out = _with_expert_parallel(out, m, pins.ep, expert_tp, ep_fold, stack)
    return _with_virtual_stages(out, m.num_layers, global_batch, pins.virtual_stages,
                                interleave and stack_has(stack, "vp"), uneven)


def ep_degrees(m: ModelSpec, ranks: int, pin: int | None = None, stack=None) -> list[int]:
    """EP degrees of a stage whose expert layers may spread over ``ranks`` ranks (``tp·cp·dp / expert_tp`` with
    MoE parallel folding, :func:`_with_expert_parallel`; ``dp·cp`` without): 1 for a dense model or a ``stack``
    without EP (:func:`stack_has`); for a MoE model the divisors of the expert count that divide ``ranks`` (or
    only ``pin``, if it does)."""
    if not m.is_moe or not stack_has(stack, "ep"):
        return [1] if pin in (None, 1) else []
    return [e for e in (divisors(m.num_experts) if pin is None else [pin]) if ranks % e == 0 and m.num_experts % e == 0]


def _with_expert_parallel(cfg: dict[str, np.ndarray], m: ModelSpec, pin: int | None, expert_tp: bool = True,
                          ep_fold: bool = True, stack=None):
    """Add the ``ep`` and ``expert_tp`` dimensions: 1 and 1 for a dense model; for a MoE model every divisor of the
    expert count that divides tp·cp·dp, or only ``pin``, times every expert-TP degree ``etp`` dividing TP with
    ``ep·etp`` dividing tp·cp·dp (only 1 unless ``expert_tp``). EP may exceed dp·cp: Megatron-Core's MoE parallel
    folding lays the expert mesh EP x expert-TP x expert-DP over the attention's TP x CP x DP ranks (Liu et al.
    2025, arXiv 2504.14960, Sec. 3; ``--expert-tensor-parallel-size``), and torchtitan 0.3 shards experts over
    ``dp_shard x cp x tp / ep`` with expert-TP 1 (``parallel_dims.py``, efsdp). Without ``ep_fold`` (a framework
    whose EP lives inside DP x CP) EP divides dp·cp and expert-TP is 1. A ``stack`` without EP: as a dense model."""
    n = len(cfg["tp"])
    if not m.is_moe or not stack_has(stack, "ep"):
        keep = np.ones(n, dtype=bool) if pin in (None, 1) else np.zeros(n, dtype=bool)
        ones = np.ones(int(keep.sum()), dtype=np.int64)
        return {k: a[keep] for k, a in cfg.items()} | {"ep": ones, "expert_tp": ones.copy()}
    group = cfg["tp"] * cfg["dp"] * cfg["cp"] if ep_fold else cfg["dp"] * cfg["cp"]
    blocks = []
    etps = divisors(int(cfg["tp"].max())) if expert_tp and ep_fold and n else [1]
    for e in divisors(m.num_experts) if pin is None else [pin]:
        for d in etps:
            rows = (group % (e * d) == 0) & (m.num_experts % e == 0) & (cfg["tp"] % d == 0)
            k = int(rows.sum())
            blocks.append({**{key: a[rows] for key, a in cfg.items()}, "ep": np.full(k, e, dtype=np.int64),
                           "expert_tp": np.full(k, d, dtype=np.int64)})
    return {k: np.concatenate([b[k] for b in blocks]) for k in blocks[0]}


def _with_virtual_stages(cfg: dict[str, np.ndarray], num_layers: int, global_batch: int, pin: int | None,
                         interleave: bool = True, uneven: bool = False):
    """Add the ``virtual_stages`` and ``split`` dimensions (interleaved 1F1B, Narayanan et al. SC'21 Sec. 2.2.2;
    ``split`` indexes :data:`hetplan.plan.SPLITS`).

    Every configuration gets v = 1 on :func:`hetplan.plan.balanced_split`; those Megatron-LM can interleave — pp >
    1, pp·v dividing the layers (equal chunks) and the micro-batch count a multiple of pp — are repeated for each
    v > 1 dividing L/pp. Uneven pipelines like Llama 3's also interleave: with the embedding and the loss each
    counted as one layer of the split (Megatron-Core ``account_for_embedding_in_pipeline_split`` /
    ``account_for_loss_in_pipeline_split``; Llama 3, arXiv 2407.21783 Sec. 3.3.2: one fewer layer on the first
    and the last stage), ``L + 2`` layer slots are divided into pp·v equal chunks — which is
    :func:`hetplan.plan.balanced_split` when pp divides ``L + 2``. With ``uneven`` (a framework that takes any
    layer list per chunk: Megatron-Core's ``--pipeline-model-parallel-layout``, torchtitan's
    ``module_fqns_per_model_part``; ``frameworks.toml`` ``splits = any``) every other v from 2 to L/pp is
    enumerated too, on two splits: the balanced split with each stage's layers in v near-equal chunks
    (:func:`hetplan.plan.balanced_chunks`, split 0) and equal chunks with the first and the last chunk short
    (:func:`hetplan.plan.ends_split`, split 1: DeepSeek-V3's 61 layers at PP 8 x VP 4 as NVIDIA runs them).
    Without ``interleave`` (a framework with no interleaved schedule) every configuration keeps v = 1. ``base``:
    the row of each configuration's v = 1 sibling (rows ``0..n-1`` are the v = 1 block unless v is pinned).
    """
    from hetplan.plan import balanced_split, ends_split

    pp = cfg["pp"]
    mb = global_batch // (cfg["dp"] * cfg["mbs"])
    ones = np.ones(len(pp), dtype=np.int64)
    cfg = {**cfg, "base": np.arange(len(pp))}  # each row's plain-1F1B sibling (the first block, when unpinned)
    blocks = [{**cfg, "virtual_stages": ones, "split": ones * 0}] if pin in (None, 1) else []

    def add(rows: np.ndarray, v: int, split: int) -> None:
        k = int(rows.sum())
        blocks.append({**{key: a[rows] for key, a in cfg.items()}, "virtual_stages": np.full(k, v),
                       "split": np.full(k, split)})

    even = num_layers % pp == 0
    eligible = (pp > 2) & (even | ((num_layers + 2) % pp == 0)) | (pp == 2) & even
    ok_mb = (mb % pp == 0) & interleave
    eligible &= ok_mb
    done: set[tuple[int, int]] = set()
    for p in sorted(set(pp[eligible].tolist())):  # (not np.unique: it imports numpy.ma, 10 ms)
        rows = eligible & (pp == p)
        slots = num_layers if num_layers % int(p) == 0 else num_layers + 2
        for v in divisors(slots // int(p))[1:]:
            if pin is None or v == pin:
                add(rows, v, 0)
                done.add((int(p), v))
    for p in sorted(set(pp[ok_mb & (pp > 1)].tolist())) if uneven else []:
        rows = ok_mb & (pp == p)
        for v in range(2, num_layers // p + 1) if pin is None else [pin] if 2 <= pin <= num_layers // p else []:
            if (p, v) in done:
                continue
            add(rows, v, 0)  # balanced_chunks exist: every stage holds at least L // p >= v layers
            ends = ends_split(num_layers, p, v)
            if ends is not None and [sum(c) for c in ends] != balanced_split(num_layers, p):
                add(rows, v, 1)
    if not blocks:
        return {k: a[:0] for k, a in cfg.items()} | {"virtual_stages": np.zeros(0, dtype=np.int64),
                                                     "split": np.zeros(0, dtype=np.int64)}
    return {k: np.concatenate([b[k] for b in blocks]) for k in blocks[0]}
