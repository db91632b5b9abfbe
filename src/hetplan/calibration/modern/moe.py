"""MoE training (set ``moe_h100``): NeMo AutoModel (``nemo_automodel_h100_bf16.csv``: PyTorch FSDP2 + EP, step
time) and the Megatron MoE ModelZoo (``megatron_moe_modelzoo_qwen3.csv``: Qwen3 with Megatron-Core, step time or
TFLOP/s) and Megatron-Bridge's performance summaries (``megatron_bridge_moe_h100.csv``: GPT-OSS 120B, Qwen3-30B-A3B
and Qwen3-235B-A22B on DGX-H100, NeMo containers 26.02-26.06, Megatron-Core with forced-balance dropless routing;
tokens/s per GPU as step time). The recipe facts the tables leave out are in ``run_facts.toml`` ``[automodel]`` and
``[modelzoo]``, and for the Megatron-Bridge rows in each row's notes (its H100 recipe file)."""

from __future__ import annotations

import re

from hetplan.calibration.modern.mapping import Layout, collect, expert_tp_of, row_case, row_fp8_recipe
from hetplan.calibration.modern.rows import NotExpressibleError, cell_float, cell_int, fact_table, read_rows, run_facts
from hetplan.calibration.modern.sets import FILES
from hetplan.hardware.catalog import Catalog, load_catalog

#: Expert-parallel degree of NeMo AutoModel rows whose table leaves it out, by model, from the benchmark's recipe
#: (``run_facts.toml`` ``[automodel.ep]``: GPT-OSS 120B and 20B, ``ep_size`` 64 and 8).
AUTOMODEL_EP: dict[str, int] = fact_table("automodel", "ep")

#: NeMo AutoModel's FSDP2 as its benchmark recipes run it, as :class:`~hetplan.plan.Plan` fields (bf16 resident
#: parameters, bf16 loss; ``[automodel.plan]``).
AUTOMODEL_FSDP: dict[str, str] = fact_table("automodel", "plan")

#: Micro-batches per call of NeMo AutoModel's pipeline schedule (:attr:`hetplan.plan.Plan.
#: pipeline_step_microbatches`), by model (``[automodel.pipeline_step_microbatches]``).
AUTOMODEL_PP_STEP: dict[str, int] = fact_table("automodel", "pipeline_step_microbatches")

#: The Megatron MoE ModelZoo's GB200 MXFP8 commands: the modules they recompute and (the 4K-token row whose notes say
#: "activation offloading required") offload (``[modelzoo]``).
MODELZOO_MXFP8_RECOMPUTE_MODULES = tuple(run_facts()["modelzoo"]["mxfp8_recompute_modules"])
MODELZOO_OFFLOAD_MODULES = tuple(run_facts()["modelzoo"]["offload_modules"])
#: The ModelZoo's TP where its launch command differs from its table, by the row's ``zero_or_fsdp`` cell
#: (``[modelzoo.launch_tp]``: the Megatron-FSDP layout ran TP 1, DP 256, two micro-batches of 4).
MODELZOO_LAUNCH_TP: dict[str, int] = fact_table("modelzoo", "launch_tp")
#: The busiest EP rank's tokens relative to perfect balance in the ModelZoo's dropless runs, which route with the
#: learned router of the Qwen3-235B-A22B checkpoint they load (``[modelzoo] dropless_load_imbalance``, fitted by
#: :func:`hetplan.calibration.modern_fit.fit_dropless_imbalance`).
MODELZOO_DROPLESS_IMBALANCE: float = float(run_facts()["modelzoo"]["dropless_load_imbalance"])


def routing_of(r: dict, src: str) -> str:
    """How the router of a MoE row from source ``src`` ran: ``forced`` (balanced routing forced by the benchmark:
    NeMo AutoModel's fake balanced gate, Megatron-Core's ``--moe-router-force-load-balancing`` where the row's
    notes say so), ``dropless`` (the ModelZoo's learned-router twins of its forced rows, whose table cell says
    "dropless") or ``learned`` (the rest: :data:`hetplan.estimate.moe.DEFAULT_LOAD_IMBALANCE`)."""
    notes = r["notes"].lower()
    if src == "automodel" or "forced" in notes:
        return "forced"
    return "dropless" if src == "modelzoo" and "dropless routing" in notes else "learned"


def _recompute_modules(r: dict) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Megatron-Core's per-module recomputation and offloading of a ModelZoo row, ``(recompute_modules,
    offload_modules)``: the table's recompute column names ``norm`` / ``layernorm`` and ``act`` / ``moe_act``
    (``moe``, the whole MoE layer, is :func:`_moe_recompute`; ``shared_expert`` is not modelled); the GB200 MXFP8
    rows carry them in their commands (:data:`MODELZOO_MXFP8_RECOMPUTE_MODULES`, :data:`MODELZOO_OFFLOAD_MODULES`)."""
    low = r["recompute"].lower()
    modules = tuple(x for x, words in (("layernorm", ("norm",)), ("moe_act", ("act",)))
                    if any(re.search(rf"\b(?:layer)?{w}\b|\bmoe_{w}\b", low) for w in words))
    notes = r["notes"].lower()
    if r["dtype"].lower() == "mxfp8" and "selective recompute" in notes:
        modules = MODELZOO_MXFP8_RECOMPUTE_MODULES
    offload = MODELZOO_OFFLOAD_MODULES if "activation offloading" in notes else ()
    return modules, offload


def _moe_recompute(label: str) -> tuple[str, bool]:
    """Recomputation of a MoE row, ``(stage recompute, MoE-layer recompute)``: NeMo AutoModel's
    ``activation_checkpointing: true`` checkpoints every transformer block (full); Megatron's ``full``;
    Megatron's per-module selective recomputation recomputes the MoE layer where its modules name ``moe``
    (``--recompute-modules moe``), and otherwise cheap element-wise work only (``layernorm``, ``moe_act``: none)."""
    low = label.lower()
    if "full" in low or "activation_checkpointing: true" in low:
        return "full", False
    return "none", bool(re.search(r"\bmoe\b", low))


def _dispatcher(r: dict) -> str:
    """``hybridep`` or ``deepep`` where the row names it (Megatron-Core's flex dispatcher; NeMo AutoModel's
    ``dispatcher: deepep`` / ``hybridep``), else Megatron-Core's default ``alltoall``."""
    text = (r.get("attention", "") + " " + r.get("framework", "")).lower()
    return "hybridep" if "hybridep" in text else "deepep" if "deepep" in text else "alltoall"


#: Release rows whose same layout (model, GPUs, precision, batch and parallel layout) a later patch release of the
#: same source re-measured at 1.5 times the throughput or more: a regression of that release's software, which no
#: term of the estimator describes. Megatron-Bridge 26.02's Qwen3-30B-A3B (5,113 tokens/s per GPU against 26.02.01's
#: 9,058 on the same PP 2 x VP 12 x EP 8 layout; ``docs/performance-summary-archive.md``).
REGRESSED_RELEASE_ROWS = {("Qwen3 MoE 30B-A3B", "26.02 NeMo Container")}


def _regressed(r: dict) -> bool:
    return any(m == r["model"] and f"({rel}," in r["source"] for m, rel in REGRESSED_RELEASE_ROWS)


def _moe_row_case(i: int, r: dict, src: str, catalog: Catalog):
    key = f"moe_h100:{src}:{i}:{r['model'][:24]}:n{r['num_gpus']}:s{r['seq_len']}:tp{r['tp']}ep{r['ep']}"

    def make():
        if _regressed(r):
            raise NotExpressibleError("a release regression: the next patch release of the same source measured "
                                      "the same layout at 1.77x the throughput (REGRESSED_RELEASE_ROWS)")
        if "lora" in r["model"].lower():
            raise NotExpressibleError("LoRA fine-tuning: frozen base weights and adapters are not modelled")
        tp, pp, cp = (cell_int(r, k, 1) for k in ("tp", "pp", "cp"))
        if src == "modelzoo":
            tp = MODELZOO_LAUNCH_TP.get(r["zero_or_fsdp"], tp)
        ep = cell_int(r, "ep") or AUTOMODEL_EP.get(r["model"], 1)
        recompute, moe_recompute = _moe_recompute(r["recompute"])
        modules, offload = _recompute_modules(r) if src in ("modelzoo", "bridge") else ((), ())
        n = cell_int(r, "num_gpus")
        fsdp = "fsdp" in r["zero_or_fsdp"].lower()
        # FSDP under Megatron-Core (the ModelZoo, Megatron-Bridge) is Megatron-FSDP (--use-custom-fsdp /
        # --use-megatron-fsdp --data-parallel-sharding-strategy optim_grads_params): Megatron-Core at ZeRO-3, what
        # export writes for it, unless the row names PyTorch's FSDP2 (NeMo AutoModel's: framework "fsdp")
        cell = r["zero_or_fsdp"].lower()
        megatron_fsdp = fsdp and ("megatron" in cell or src in ("modelzoo", "bridge")) and not re.search(
            r"torch|fsdp2", cell)
        mbs = cell_int(r, "micro_batch", 1)
        gbs = cell_int(r, "global_batch")
        job = dict(seq_len=cell_int(r, "seq_len"), global_batch=gbs,
                   framework="fsdp" if fsdp and not megatron_fsdp else "megatron")
        if (recipe := row_fp8_recipe(r)) is not None:
            job["fp8_recipe"] = recipe
        if ep > 1:  # routing and dispatch act on expert-parallel MoE layers (at EP 1 the imbalance is moot)
            routing = routing_of(r, src)
            if routing == "forced":
                job["moe_load_imbalance"] = 1.0
            elif routing == "dropless":
                job["moe_load_imbalance"] = MODELZOO_DROPLESS_IMBALANCE
            job.update(moe_dispatcher=_dispatcher(r), moe_routing="contiguous" if src == "automodel" else "random",
                       moe_recompute=moe_recompute, moe_a2a_overlap="a2a overlap" in r["notes"].lower())
        if modules or offload:
            job.update(recompute_modules=list(modules), offload_modules=list(offload))
        lay = Layout(tp=tp, pp=pp, dp=n // (tp * pp * cp), recompute=recompute, job=job, plan=dict(
            mbs=mbs, zero=3 if fsdp else 1, cp=cp, ep=ep, expert_tp=expert_tp_of(r),
            virtual_stages=cell_int(r, "vp", 1), sequence_parallel=True, cuda_graphs="cuda graph" in r["notes"].lower(),
            pipeline_step_microbatches=AUTOMODEL_PP_STEP.get(r["model"]) if src == "automodel" else None,
            **(AUTOMODEL_FSDP if src == "automodel" else {})))
        t = cell_float(r, "iteration_time_s")
        if t is not None:
            return row_case("moe_h100", key, r, lay, "iteration_time_s", t, catalog=catalog)
        return row_case("moe_h100", key, r, lay, "tflops_per_gpu", cell_float(r, "tflops_per_gpu"), catalog=catalog,
                        causal_flops=src == "modelzoo")

    return key, make


def moe_cases(catalog: Catalog | None = None):
    """NeMo AutoModel (FSDP2 + EP; step time), the Megatron MoE ModelZoo (Qwen3; step time or TFLOP/s) and
    Megatron-Bridge's DGX-H100 MoE rows (step time)."""
    catalog = catalog or load_catalog()
    auto, zoo, bridge = FILES["moe_h100"]
    items = [_moe_row_case(i, r, "automodel", catalog) for i, r in enumerate(read_rows(auto))]
    items += [_moe_row_case(i, r, "modelzoo", catalog) for i, r in enumerate(read_rows(zoo))]
    items += [_moe_row_case(i, r, "bridge", catalog) for i, r in enumerate(read_rows(bridge))]
    return collect("moe_h100", items)
