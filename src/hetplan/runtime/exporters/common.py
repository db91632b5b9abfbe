"""What every export shares: the targets and the framework releases they write for, the :class:`Export` result,
and the checks and figures of a plan every target needs — its one device mesh (:func:`_mesh`), nodes, virtual
stages, the interleaved split and the ranks of mixed GPU types (helpers private to this package)."""

from __future__ import annotations

from dataclasses import dataclass, field

from hetplan.errors import HetplanError
from hetplan.model.spec import ModelSpec
from hetplan.plan import Plan, fills_whole_nodes, pools_fill_whole_hosts
from hetplan.plan_rules import degree, embedding_loss_split


TARGETS = ("megatron", "deepspeed", "torchtitan")
#: the framework releases each target writes for, the default first (``hetplan export --framework-version``):
#: Megatron-LM's arguments of 2026-08-22 (:mod:`hetplan.runtime.argspec`), DeepSpeed 0.19's config, torchtitan
#: 0.3.x (``--module/--config`` + overrides) or 0.2.x (TOML job config, ``--job.config_file``).
VERSIONS: dict[str, tuple[str, ...]] = {"megatron": ("2026-08-22",), "deepspeed": ("0.19",),
                                        "torchtitan": ("0.3", "0.2")}


def release(target: str, version: str | None) -> str:
    """The release of ``target`` an export writes for: ``version`` (``0.3.0`` matches ``0.3``) or the default.

    Raises:
        HetplanError: a release the target's export does not write.
    """
    known = VERSIONS[target]
    if version is None or not version.strip():
        return known[0]
    v = version.strip().lstrip("v")
    for k in known:
        if v == k or v.startswith(k + "."):
            return k
    raise HetplanError(f"hetplan exports {target} for releases {', '.join(known)}, not {version!r}",
                       field="--framework-version", fix=f"use one of {', '.join(known)} (or leave it out)")
#: The framework family (``Job.framework``) each target launches; its default stack is what the export writes
#: (:func:`hetplan.hardware.stacks.default_stack`).
TARGET_FRAMEWORK = {"megatron": "megatron", "deepspeed": "deepspeed", "torchtitan": "fsdp"}


@dataclass
class Export:
    """An export: ``files`` (name -> text) and ``notes`` (what was approximated, one sentence each)."""

    target: str
    files: dict[str, str]
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class _Mesh:
    """The one set of degrees a framework runs on all stages, and the one recomputation setting."""

    tp: int
    dp: int
    cp: int
    ep: int
    recompute: str
    recompute_layers: int | None  # layers per stage recomputed; None = all


def _mesh(plan: Plan, what: str) -> _Mesh:
    """The plan's degrees if every stage has the same ones (else the error says what differs and why no
    framework runs it)."""
    per = {(st.tp, st.dp, degree(plan, i, "cp"), degree(plan, i, "ep")) for i, st in enumerate(plan.stages)}
    if len(per) > 1:
        shown = ", ".join(f"stage {i}: TP {st.tp} DP {st.dp}" for i, st in enumerate(plan.stages))
        raise HetplanError(
            f"{what} builds one device mesh, so every pipeline stage has the same TP, DP, CP and EP degree; this "
            f"heterogeneous plan has {shown}. Megatron-LM, DeepSpeed, torchtitan and `hetplan run` all send "
            "activations between matching data-parallel replicas of one mesh, so none runs it",
            field="plan.stages[].tp/dp",
            fix="plan again without --per-stage-tp (the default search gives every stage one TP and DP), or pin "
                "them (hetplan plan --tp T --dp D); stages may still differ in GPU type and layer count")
    # (mode, layers recomputed when not all of the stage's, else None) per stage
    recs = {(st.recompute, None if st.recompute == "none" or st.recomputed_layers() == st.num_layers
             else st.recomputed_layers()) for st in plan.stages}
    if len({r[0] for r in recs}) > 1:
        raise HetplanError(f"{what} applies one activation-recomputation mode to all stages; the plan has "
                           f"{sorted({r[0] for r in recs})}", field="plan.stages[].recompute",
                           fix="use one recompute mode")
    if len(recs) > 1:
        raise HetplanError(f"{what} recomputes the same number of layers on every stage; the plan recomputes "
                           f"{[st.recomputed_layers() for st in plan.stages]}", field="plan.stages[].recompute_layers",
                           fix="recompute all layers, or the same number on every stage")
    mode, k = recs.pop()
    tp, dp, cp, ep = per.pop()
    return _Mesh(tp, dp, cp, ep, mode, k)


def _nodes(plan: Plan) -> tuple[int, int]:
    """``(hosts, processes per host)`` of the launch: torchrun and the DeepSpeed launcher start the same number of
    processes on every host (:attr:`hetplan.plan.GPUPool.launch_gpus`: a server, or an NVL72 compute tray of 4).

    Raises:
        HetplanError: a plan on more than one host that does not fill whole hosts (the launch would start more
            processes than the plan has ranks)."""
    per_node = plan.processes_per_host
    used = [0] * len(plan.pools)
    for i, st in enumerate(plan.stages):
        used[st.pool] += st.tp * degree(plan, i, "cp") * st.dp
    n = sum(used)
    if not fills_whole_nodes(n, per_node):
        raise HetplanError(f"the plan runs {n} ranks on hosts of {per_node} GPUs: a launch spanning hosts starts the "
                           f"same number of processes on every host, so it would start "
                           f"{-(-n // per_node) * per_node}", field="plan",
                           fix=f"use a multiple of {per_node} GPUs (hetplan plan proposes only such plans)")
    if not pools_fill_whole_hosts(used, [p.launch_gpus for p in plan.pools]):
        k = next(k for k, u in enumerate(used) if u % per_node)
        raise HetplanError(f"the plan runs {used[k]} ranks on pool {k} ({plan.pools[k].gpu}), no multiple of the "
                           f"launch's {per_node} per host: a host would hold two pools' GPUs", field=f"plan.pools[{k}]",
                           fix=f"use a multiple of {per_node} GPUs of each pool (hetplan plan proposes only such plans)")
    return (max(1, -(-n // per_node)), min(n, per_node))


def _virtual(plan: Plan, virtual_stages: int | None) -> int:
    return virtual_stages if virtual_stages is not None else plan.virtual_stages


def _interleaved_units(plan: Plan, spec: ModelSpec, v: int, what: str) -> tuple[int, int, int]:
    """``(e, l, c)`` of an interleaved plan: the embedding (``e`` = 1) and the loss (``l`` = 1) counted as a layer
    of the split (Megatron-Core ``--account-for-embedding/loss-in-pipeline-split``), and ``c`` units per model
    chunk: stage i holds ``v * c`` units, the first ``e`` and the last ``l`` fewer layers.

    Raises:
        HetplanError: the stages fit no such split.
    """
    layers, pp = [st.num_layers for st in plan.stages], plan.pp
    split = embedding_loss_split(layers, spec.num_layers, v)
    if split is not None:
        return split
    raise HetplanError(f"{what}'s interleaved schedule splits the layers (plus, optionally, the embedding and the "
                       f"loss) into {pp} x {v} equal chunks; this plan's stages hold {layers}",
                       field="plan.virtual_stages", fix="use a balanced split or virtual_stages = 1")


def _pools_note(plan: Plan, nproc: int) -> str | None:
    """Which node ranks each stage's pool must supply, when stages sit on different GPU types (ranks are
    pipeline-outermost in all three frameworks, so stage i holds ranks [i*n, (i+1)*n) for n GPUs per stage); and,
    where a pool's hosts hold more GPUs than the launch starts per host (``nproc``, the least
    :attr:`~hetplan.plan.GPUPool.launch_gpus` of the pools used, :attr:`~hetplan.plan.Plan.processes_per_host`), how
    such a host runs several launches."""
    notes, per_host = [], plan.processes_per_host
    for k in sorted({st.pool for st in plan.stages}):
        g = plan.pools[k].launch_gpus
        if g > per_host:  # torchrun / the DeepSpeed launcher start the same process count on every node
            halves = ", ".join(f"CUDA_VISIBLE_DEVICES={','.join(str(d) for d in range(i, i + per_host))}"
                               for i in range(0, g, per_host))
            notes.append(f"pool {k} ({plan.pools[k].gpu}) has hosts of {g} GPUs and the launch starts {per_host} "
                         f"processes per node: start {g // per_host} nodes on each such host, each with its own node "
                         f"rank and {halves}")
    if len({plan.pools[st.pool].gpu for st in plan.stages}) < 2:
        return "; ".join(notes) or None
    parts, rank = [], 0
    for i, st in enumerate(plan.stages):
        size = st.tp * degree(plan, i, "cp") * st.dp
        parts.append(f"stage {i} on {plan.pools[st.pool].gpu}: node ranks {rank // nproc}-{(rank + size - 1) // nproc}")
        rank += size
    return "; ".join(["mixed GPU types: start the nodes so that " + "; ".join(parts), *notes])
