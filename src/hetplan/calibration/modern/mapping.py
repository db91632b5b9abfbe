"""Mapping a published row to a :class:`~hetplan.plan.Plan` and a :class:`ModernCase`, shared by every source.

A source module reads its rows (:mod:`~hetplan.calibration.modern.rows`), states each row's published layout as a
:class:`Layout` — the stage degrees, and every other setting by its own name in the plan schema — and calls
:func:`row_case`, which checks the GPU count, builds the plan (:func:`build_plan`: a balanced split of the run's
layers over ``pp`` stages of ``tp x dp`` GPUs, one pool of the nodes of :func:`node_pool`) and the case that
:meth:`ModernCase.evaluate` predicts with :func:`hetplan.estimate.estimator.estimate`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from hetplan.calibration.modern.models import row_model
from hetplan.calibration.modern.rows import NotExpressible, NotExpressibleError, cell_int
from hetplan.calibration.validation import Case, _is_calibration
from hetplan.errors import HetplanError
from hetplan.hardware.catalog import Catalog
from hetplan.model import counts
from hetplan.model.spec import ModelSpec
from hetplan.plan import GPUPool, Job, Plan, Stage, balanced_split

#: Seeded fraction of every modern set used to fit GPU efficiencies (:mod:`hetplan.calibration.modern_fit`);
#: the same hash of the row key as the A100 split (:func:`hetplan.calibration.validation._is_calibration`).
CALIBRATION_FRACTION = 0.25

#: Node of the DGX/HGX H100, H200 and B200: 8 GPUs, 8 ConnectX-7 NICs of 400 Gb/s = 400 GB/s per node
#: (NVIDIA DGX H100 / B200 user guides). Used unless the pool model names nodes itself.
DGX_NODE_BYTES_PER_S = 400e9

#: GB200 NVL72: one NVLink domain of 72 GPUs; one 400 Gb/s ConnectX-7 per GPU (4 per compute tray;
#: NVIDIA GB200 NVL72 reference architecture): 72 x 50 GB/s leaves the domain.
NVL72_GPUS = 72

NVL72_NODE_BYTES_PER_S = NVL72_GPUS * 50e9


@dataclass
class ModernCase(Case):
    """A :class:`~hetplan.calibration.validation.Case` of a modern set.

    Attributes:
        quantity: ``iteration_time_s``, ``tokens_per_s_per_gpu`` or ``tflops_per_gpu`` (what ``measured`` is).
        gpu, dtype: catalog GPU type and compute dtype of the plan.
        measured_memory_bytes: peak memory per GPU the source reports (None if it gives none).
        predicted_memory_bytes, fits: the estimate's largest stage, as the allocator's reserved bytes that the
            sources report (its total less its CUDA context, :func:`hetplan.estimate.memory.context_bytes`), and
            whether every stage fits (the fit test, :attr:`hetplan.estimate.memory.StageMemory.required`).
        notes: approximations the mapping had to make (e.g. ZeRO-3 for FSDP2 before ``framework = "fsdp"``).
        causal_flops: the source's TFLOP/s count the causal half of the attention scores
            (:func:`hetplan.model.counts.model_flops_per_iteration`), not the full ``s x s``.
        memory_includes_context: the source's memory is what ``nvidia-smi`` shows (the CUDA context included),
            so ``predicted_memory_bytes`` is the largest stage total itself.
    """

    quantity: str = "iteration_time_s"
    gpu: str = ""
    dtype: str = "bf16"
    measured_memory_bytes: float | None = None
    predicted_memory_bytes: float = math.nan
    fits: bool = True
    dense_cp1: bool = False
    notes: list[str] = field(default_factory=list)
    causal_flops: bool = False
    memory_includes_context: bool = False

    def evaluate(self, catalog: Catalog | None = None, comm_constants=None) -> float:
        """Estimate the plan with ``catalog`` (default: the package catalog) and ``comm_constants`` (default: the
        reviewed :class:`~hetplan.estimate.comm.CommConstants`); set ``predicted``, ``predicted_memory_bytes`` and
        ``fits``; return ``predicted``."""
        from hetplan.estimate.estimator import estimate

        est = estimate(self.plan, catalog=catalog, model=self.model, virtual_stages=self.virtual_stages,
                       comm_constants=comm_constants)
        self.predicted = quantity_of(est, self.quantity, self.plan, self.model, self.causal_flops)
        self.predicted_memory_bytes = max(s.memory.total - (0.0 if self.memory_includes_context else s.memory.context)
                                          for s in est.stages)
        self.fits = bool(est.fits)
        return self.predicted


def quantity_of(est, quantity: str, plan: Plan, m: ModelSpec, causal_flops: bool = False) -> float:
    """The measured kind ``quantity`` of an :class:`~hetplan.estimate.estimator.Estimate` (TFLOP/s with the
    source's attention count, ``causal_flops``)."""
    n = plan.num_gpus
    if quantity == "iteration_time_s":
        return est.iteration_time_s
    if quantity == "tokens_per_s_per_gpu":
        return est.tokens_per_s / n
    if quantity == "tflops_per_gpu":
        flops = float(counts.model_flops_per_iteration(m, float(plan.job.global_batch), float(plan.job.seq_len),
                                                       causal=causal_flops))
        return flops / est.iteration_time_s / n / 1e12
    raise ValueError(f"unknown quantity {quantity!r}")


def catalog_gpu(label: str, catalog: Catalog) -> str:
    """Catalog name of the GPU a row names.

    The 96 GB HBM2e H100 capped at 500 W of torchtitan's rows is its own catalog entry (found by its 500 W
    power limit), never the 700 W H100 SXM. Raises :class:`NotExpressibleError` when the catalog has no entry.
    """
    low = label.lower()
    if "h100" in low and ("500w" in low.replace(" ", "") or "hbm2e" in low):
        for g in catalog.gpus.values():
            if "H100" in g.name and g.tdp_w == 500:
                return g.name
        raise NotExpressibleError("the 500 W HBM2e H100 (96 GB) has no catalog entry yet")
    for key, name in (("gb300", "GB300"), ("gb200", "GB200"), ("h200", "H200"), ("b200", "B200"),
                      ("h100", "H100-SXM"), ("a100_40gb", "A100-SXM-40GB"), ("a100", "A100-SXM-80GB")):
        if key in low:
            try:
                return catalog.get(name).name
            except HetplanError:
                raise NotExpressibleError(f"GPU {name} has no catalog entry yet") from None
    raise NotExpressibleError(f"GPU {label!r} is not in the catalog")


def probe_job(**kw) -> Job:
    """A :class:`Job` with ``kw``, or :class:`NotExpressibleError` naming the field the schema rejects."""
    try:
        return Job(**kw)
    except ValueError as exc:
        bad = [k for k in ("dtype", "framework", "attention") if k in str(exc)]
        raise NotExpressibleError(f"the plan schema rejects {', '.join(f'{k} = {kw.get(k)!r}' for k in bad) or kw}"
                                  ) from None


def row_dtype(r: dict) -> str:
    """``fp8`` (Transformer Engine's delayed / current / MXFP8 recipes, torchao's tensor-wise and row-wise float8:
    :func:`row_fp8_recipe`) or ``bf16``."""
    d = r["dtype"].lower()
    return "fp8" if ("fp8" in d or "float8" in d) else "bf16"


def row_fp8_recipe(r: dict) -> str | None:
    """``current`` where the row's dtype names Transformer Engine's current scaling (Megatron-Bridge / NeMo
    "FP8-CS", their ``fp8_cs`` recipes: ``Float8CurrentScaling``, :attr:`hetplan.plan.Job.fp8_recipe`); ``rowwise``
    / ``rowwise_with_gw_hp`` where it names torchao's row-wise float8 recipes (``float8 rowwise``: torchtitan's
    ``recipe_name``); ``mxfp8`` where a torchtitan row names MXFP8 (torchao's ``MXFP8Linear``); else None (the
    stack's default recipe)."""
    d = re.sub(r"[-_ ]", "", r["dtype"].lower())
    if "rowwise" in d:
        return "rowwise_with_gw_hp" if "gwhp" in d else "rowwise"
    if d.startswith("mxfp8") and "torchtitan" in r.get("framework", "").lower():  # torchao's MXFP8Linear
        return "mxfp8"
    return "current" if re.search(r"fp8cs\b|currentscaling", d) else None


#: Plan settings of every row unless its :class:`Layout` says otherwise: the distributed optimizer (ZeRO-1) of
#: Megatron-Core and NeMo, the 1F1B schedule and the overlapped gradient reduction every source's engine runs.
PLAN_DEFAULTS = {"zero": 1, "schedule": "1f1b", "overlap_grad_reduce": True}


@dataclass
class Layout:
    """The published layout of a row: what :func:`build_plan` lays out in stages — TP, PP and DP (each stage
    ``tp x dp`` GPUs), the stages' recomputation and the fraction of their layers it covers — and every other
    setting under its own name in the plan schema, validated by the schema itself: ``job``, fields of
    :class:`~hetplan.plan.Job` (``seq_len`` and ``global_batch`` always; e.g. ``framework``, ``attention``,
    ``attention_kernel``, ``torch_compile``, ``cp_kv_exchange``, ``moe_dispatcher``, ``recompute_modules``), and
    ``plan``, fields of :class:`~hetplan.plan.Plan` (``mbs`` always; e.g. ``zero``, ``cp``, ``ep``,
    ``expert_tp``, ``virtual_stages``, ``sequence_parallel`` (with TP > 1 only), ``grad_reduce_dtype``,
    ``tp_comm_overlap``, ``cuda_graphs``, ``cross_entropy``), over :data:`PLAN_DEFAULTS`. The model and dtype
    come from the row (:func:`row_case`). ``stage_layers``: the framework's own split of the layers over the
    stages where the source fixes it (DeepSpeed's partition); None: a balanced split."""

    tp: int
    pp: int
    dp: int
    job: dict
    plan: dict
    recompute: str = "none"
    recompute_fraction: float = 1.0
    stage_layers: list[int] | None = None

    @property
    def cp(self) -> int:
        """Context-parallel degree (``plan["cp"]``, default 1)."""
        return self.plan.get("cp", 1)

    @property
    def ep(self) -> int:
        """Expert-parallel degree (``plan["ep"]``, default 1)."""
        return self.plan.get("ep", 1)

    @property
    def vp(self) -> int:
        """Virtual stages per pipeline stage (``plan["virtual_stages"]``, default 1)."""
        return self.plan.get("virtual_stages", 1)

    @property
    def mbs(self) -> int:
        """Micro-batch size (sequences)."""
        return self.plan["mbs"]

    @property
    def gbs(self) -> int:
        """Global batch (sequences)."""
        return self.job["global_batch"]

    @property
    def seq(self) -> int:
        """Sequence length (tokens)."""
        return self.job["seq_len"]

    @property
    def num_gpus(self) -> int:
        """GPUs of the layout: TP x PP x DP x CP."""
        return self.tp * self.pp * self.dp * self.cp


def build_plan(m: ModelSpec, lay: Layout, gpu: str, dtype: str, pool: GPUPool | None = None) -> Plan:
    """The :class:`Plan` of a row's layout: ``pp`` stages of ``tp x dp`` GPUs (balanced split of the run's layers,
    or the layout's ``stage_layers``), one pool of the nodes of :func:`node_pool` (or ``pool``). Raises
    :class:`NotExpressibleError` for what the schema rejects."""
    if lay.pp > m.num_layers:
        raise NotExpressibleError(f"PP {lay.pp} exceeds the {m.num_layers} layers")
    if lay.gbs % (lay.dp * lay.mbs):
        raise NotExpressibleError(f"global batch {lay.gbs} is not a multiple of DP {lay.dp} x micro-batch {lay.mbs}")
    job = probe_job(model=m.name, dtype=dtype, **lay.job)
    pool = pool or node_pool(gpu, lay.num_gpus)
    stages = []
    for k in lay.stage_layers or balanced_split(m.num_layers, lay.pp):
        rl = None if lay.recompute_fraction >= 1 else round(k * lay.recompute_fraction)
        stages.append(Stage(pool=0, num_layers=k, tp=lay.tp, dp=lay.dp, recompute=lay.recompute, recompute_layers=rl))
    plan = PLAN_DEFAULTS | lay.plan
    plan["sequence_parallel"] = plan.get("sequence_parallel", False) and lay.tp > 1
    try:
        return Plan(job=job, pools=[pool], stages=stages, **plan)
    except ValueError as exc:
        raise NotExpressibleError(f"plan rejected: {str(exc).splitlines()[-1]}") from None


def node_pool(gpu: str, n: int) -> GPUPool:
    """``n`` GPUs of type ``gpu`` in the nodes the sources ran on: the GPU type's reference node where the pool
    model has one (DGX H100 / H200 / B200, GB200 NVL72); otherwise 8 GPUs per node with 8 NICs of 400 Gb/s
    (:data:`DGX_NODE_BYTES_PER_S`; Meta's Grand Teton hosts of the 500 W H100 have one 400 Gb/s RoCE NIC per GPU,
    Llama 3 paper Sec. 3.3.1), or the NVL72 domain for GB200 (:data:`NVL72_NODE_BYTES_PER_S`)."""
    pool = GPUPool(gpu=gpu, count=n)
    if pool.node is not None:
        return pool
    nvl72 = gpu.startswith("GB")
    return GPUPool(gpu=gpu, count=n, gpus_per_node=NVL72_GPUS if nvl72 else 8,
                   inter_node_bandwidth_bytes_per_s=NVL72_NODE_BYTES_PER_S if nvl72 else DGX_NODE_BYTES_PER_S)


def _check_gpus(r: dict, lay: Layout) -> None:
    n = cell_int(r, "num_gpus")
    if n != lay.num_gpus:
        raise NotExpressibleError(f"TP {lay.tp} x PP {lay.pp} x DP {lay.dp} x CP {lay.cp} != {n} GPUs as published")


def row_case(set_name: str, key: str, r: dict, lay: Layout, quantity: str, measured: float, *, catalog: Catalog,
             group: str | None = None, memory_gib: float | None = None, causal_flops: bool = False,
             model: ModelSpec | None = None, dtype: str | None = None, pool: GPUPool | None = None) -> ModernCase:
    """The case of row ``r`` of set ``set_name`` in layout ``lay``: ``quantity`` measured at ``measured`` (and
    ``memory_gib`` GiB per GPU where the source gives it), the model of the row (:func:`row_model`) unless
    ``model``, the row's dtype (:func:`row_dtype`) unless ``dtype``, the pool of :func:`node_pool` unless ``pool``, Kendall τ within ``group`` (default: same model, GPU, GPU count, global batch and sequence).
    Raises :class:`NotExpressibleError`."""
    m = model or row_model(r)
    gpu = catalog_gpu(r["gpu"], catalog)
    dtype = dtype or row_dtype(r)
    _check_gpus(r, lay)
    plan = build_plan(m, lay, gpu, dtype, pool)
    c = ModernCase(set=set_name, key=key, group=group or f"{r['model']}|{gpu}|n{r['num_gpus']}|g{lay.gbs}|s{lay.seq}",
                   measured=measured, predict=lambda: math.nan,
                   is_calibration=_is_calibration(key, CALIBRATION_FRACTION),
                   info=dict(model=r["model"], gpu=gpu, n=int(r["num_gpus"]), tp=lay.tp, pp=lay.pp, dp=lay.dp,
                             cp=lay.cp, ep=lay.ep, vp=lay.vp, mbs=lay.mbs, gbs=lay.gbs, seq=lay.seq, dtype=dtype,
                             recompute=lay.recompute),
                   plan=plan, model=m, virtual_stages=lay.vp, quantity=quantity, gpu=gpu, dtype=dtype,
                   measured_memory_bytes=None if memory_gib is None else memory_gib * 2**30,
                   dense_cp1=lay.cp == 1 and lay.ep == 1, notes=[], causal_flops=causal_flops)
    c.predict = c.evaluate
    return c


def collect(set_name: str, items: Iterable[tuple[str, Callable[[], ModernCase]]]
            ) -> tuple[list[ModernCase], list[NotExpressible]]:
    """Build each ``(key, make)`` of ``items``: the cases, and the rows not expressible with their reasons."""
    cases, skipped = [], []
    for key, make in items:
        try:
            cases.append(make())
        except NotExpressibleError as exc:
            skipped.append(NotExpressible(set_name, key, str(exc)))
    return cases, skipped


def expert_tp_of(r: dict) -> int:
    """Expert-TP of a row: the ``ETP=n`` its notes carry (DGX Cloud, ModelZoo), else 1."""
    found = re.search(r"\bETP=(\d+)", r.get("notes", ""))
    return int(found.group(1)) if found else 1
