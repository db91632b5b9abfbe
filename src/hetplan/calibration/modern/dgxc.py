"""NVIDIA DGX Cloud benchmarking recipes (``dgxc_benchmarking_h100_gb200.csv``; sets ``dgxc_h100`` and
``dgxc_gb200``): NeMo / Megatron-Core step times on H100 and GB200, with the launch-script facts the tables leave
out in ``run_facts.toml`` ``[dgxc]``."""

from __future__ import annotations

from collections import Counter

from hetplan.calibration.modern.mapping import Layout, catalog_gpu, collect, expert_tp_of, row_case, row_dtype
from hetplan.calibration.modern.models import row_model
from hetplan.calibration.modern.rows import NotExpressibleError, cell_float, cell_int, read_rows, run_facts
from hetplan.calibration.modern.sets import FILES
from hetplan.hardware.catalog import Catalog, GPUSpec, load_catalog
from hetplan.model.spec import ModelSpec

#: CP degree that a release's launch script sets where its table gives none, by (row source, dtype)
#: (``run_facts.toml`` ``[[dgxc.launch_cp]]``: the Nemotron-4 340B bf16 recipe's ``CP=2``).
DGXC_LAUNCH_CP = {(f["source"], f["dtype"]): f["cp"] for f in run_facts()["dgxc"]["launch_cp"]}

#: Recipes whose launch script captures CUDA graphs on a GPU type, by (row source, GPU label start)
#: (``[[dgxc.cuda_graphs]]``: Grok-1 on GB200).
DGXC_CUDA_GRAPHS = {(f["source"], f["gpu"]) for f in run_facts()["dgxc"]["cuda_graphs"]}

#: Modules a recipe's launch script recomputes (``--recompute_modules``), by (row source, GPU label start)
#: (``[[dgxc.recompute_modules]]``: DeepSeek-V3, ``core_attn`` on GB200 — Megatron's selective recomputation,
#: ``recompute = "selective"`` — and ``mla_up_proj`` on H100, :attr:`hetplan.plan.Job.recompute_modules`).
DGXC_RECOMPUTE_MODULES = {(f["source"], f["gpu"]): tuple(f["modules"]) for f in run_facts()["dgxc"]["recompute_modules"]}

#: Row sources whose recipe leaves the expert-TP degree to its default, the TP degree (``[[dgxc.expert_tp_is_tp]]``:
#: the Grok-1 NeMo launcher configs of releases v24.11.1-v25.04.01). Other rows run the ``ETP=n`` of their notes,
#: else 1 (:func:`hetplan.calibration.modern.mapping.expert_tp_of`).
DGXC_EXPERT_TP_IS_TP = {f["source"] for f in run_facts()["dgxc"]["expert_tp_is_tp"]}

#: Recipes that drop tokens, by row source: ``(capacity factor, padded)`` (``[[dgxc.token_drop]]``: NeMo's
#: ``MegatronTokenDropCallback`` or the launcher config's ``moe_expert_capacity_factor``; Grok-1, DeepSeek-V3,
#: Llama 4 Maverick).
DGXC_TOKEN_DROP = {f["source"]: (f["capacity_factor"], f["pad"]) for f in run_facts()["dgxc"]["token_drop"]}


#: Row sources whose NeMo 1.x YAML leaves the fused cross-entropy off (``[[dgxc.unfused_cross_entropy]]``: Grok-1
#: and GPT-3 175B of the 2024-25 releases): Megatron-Core's unfused loss on fp32 logits, ``Plan.cross_entropy =
#: "fp32"``.
DGXC_UNFUSED_CROSS_ENTROPY = {f["source"] for f in run_facts()["dgxc"]["unfused_cross_entropy"]}


#: Fused attention kernel of row sources whose launch script turns cuDNN's off (``[[dgxc.attention_kernel]]``:
#: ``NVTE_FUSED_ATTN=0``, Transformer Engine then runs FlashAttention-2), ``Job.attention_kernel``.
DGXC_ATTENTION_KERNEL = {f["source"]: f["kernel"] for f in run_facts()["dgxc"]["attention_kernel"]}


#: Recipes that train multi-token prediction, by row source: ``(MTP modules, virtual layers)``
#: (``[[dgxc.mtp]]``: DeepSeek-V3's NeMo recipe, one module, its layers laid out as 64 around the embedding, the
#: MTP module and the loss).
DGXC_MTP = {f["source"]: (f["mtp_layers"], f["virtual_layers"]) for f in run_facts()["dgxc"]["mtp"]}


def mtp_stage_layers(num_layers: int, pp: int, virtual_layers: int) -> list[int]:
    """Layers per stage of a NeMo recipe that counts ``virtual_layers`` around the embedding (one on the first
    stage) and the MTP module and loss (two on the last): ``v/pp - 1``, ``v/pp`` ..., ``v/pp - 2``
    (``pretrain_deepseek_v3.py``: ``num_layers_in_first_pipeline_stage`` / ``num_layers_in_last_pipeline_stage``).

    Raises:
        NotExpressibleError: ``pp`` does not divide ``virtual_layers`` or the split does not add up to
            ``num_layers`` (the recipe asserts both)."""
    per = virtual_layers // pp
    split = [per - 1] + [per] * (pp - 2) + [per - 2] if pp > 1 else [num_layers]
    if virtual_layers % pp or sum(split) != num_layers:
        raise NotExpressibleError(f"the recipe's MTP layout of {virtual_layers} virtual layers does not split over "
                                  f"PP {pp} into {num_layers} layers")
    return split


def _token_drop(r: dict) -> dict:
    """The job fields of a row whose recipe drops tokens (:data:`DGXC_TOKEN_DROP`), else none."""
    if r["source"] not in DGXC_TOKEN_DROP:
        return {}
    factor, pad = DGXC_TOKEN_DROP[r["source"]]
    return {"moe_capacity_factor": factor, "moe_pad_to_capacity": pad}


def _is_jax(r: dict) -> bool:
    """Whether a row ran on JAX (MaxText, Paxml)."""
    return "jax" in r["framework"].lower()


def unfused_mla_on_blackwell(m: ModelSpec, gpu: GPUSpec) -> bool:
    """Whether Transformer Engine runs the attention of ``m`` on ``gpu`` unfused (``attention = "standard"``):
    MLA's query/key head dimension differs from its value head dimension (DeepSeek-V3: 192 vs 128), which rules
    out FlashAttention ("does not support MLA"), and on Blackwell Transformer Engine v2.1-v2.4 (2025-03 to
    2025-06) also rule out cuDNN's fused attention for head dimensions above 128 (``nvte_get_fused_attn_backend``,
    "special conditions for blackwell": ``!(sm_arch_ >= 100 && (head_dim_qk > 128 || head_dim_v > 128))``,
    ``transformer_engine/common/fused_attn/fused_attn.cpp``; gone in v2.5). The DGX Cloud GB200 rows ran the NeMo
    25.04 containers of that window. That leaves ``UnfusedDotProductAttention``: the two batched GEMMs over all ``s x s`` scores and the
    softmax between them, which the GB200 recipe recomputes (:data:`DGXC_RECOMPUTE_MODULES`; without it the
    scores would take 274 GiB on a 173 GiB GPU). Hopper keeps cuDNN (head dimensions up to 256)."""
    return m.is_mla and m.head_dim != (m.v_head_dim or m.head_dim) and gpu.architecture.startswith("Blackwell")


def dgxc_cases(set_name: str = "dgxc_h100", catalog: Catalog | None = None):
    """NVIDIA DGX Cloud benchmarking recipes (NeMo / Megatron-Core): measured step time.

    Layout as published (TP, PP, CP, VP, EP, micro-batch, global batch); DP = GPUs / (TP·PP·CP). Megatron-Core as
    NeMo's recipes run it: distributed optimizer (ZeRO-1), sequence parallelism with TP, gradient reduction
    overlapped, gradients reduced and buffered in bf16 (the performance recipes' ``plugins.grad_reduce_in_fp32 =
    False``, NeMo ``nemo/collections/llm/recipes/*``), TP communication overlapped (their
    ``MegatronCommOverlapCallback(tp_comm_overlap=True)`` with a userbuffers config per model), FP8 rows in per-tensor delayed scaling (the
    launches pass no recipe: NeMo's ``scripts/performance`` ``--fp8_recipe`` defaults to ``ds``, NVIDIA/NeMo@023b82de, and
    ``bf16_with_fp8_mixed`` before it; not the MXFP8 that hetplan plans on Blackwell by default), FlashAttention (cuDNN / TE fused attention), no
    recomputation (the recipes' default for these rows; not restated in the tables), CUDA graphs where the launch
    script captures them (:data:`DGXC_CUDA_GRAPHS`), the unfused loss where the config leaves it off
    (:data:`DGXC_UNFUSED_CROSS_ENTROPY`), FlashAttention-2 where the launch turns cuDNN's fused attention off
    (:data:`DGXC_ATTENTION_KERNEL`), token dropping where the recipe drops tokens
    (:data:`DGXC_TOKEN_DROP`), multi-token prediction and the layer split around it where the recipe trains it
    (:data:`DGXC_MTP`, :func:`mtp_stage_layers`), MLA unfused on Blackwell (:func:`unfused_mla_on_blackwell`) with
    the per-module recomputation its recipe sets (:data:`DGXC_RECOMPUTE_MODULES`). JAX rows (MaxText, Paxml) are not expressible (XLA's sharding and fusion
    are another runtime); LoRA rows neither (frozen base weights: no estimator support); Nemotron-H (Mamba layers)
    and the MoE models until the estimator has them. ``set_name``: ``dgxc_h100`` (H100 rows) or ``dgxc_gb200``.
    """
    catalog = catalog or load_catalog()
    want = "gb200" if set_name == "dgxc_gb200" else "h100"
    rows = read_rows(FILES["dgxc_h100"])
    published_vp: dict[tuple, Counter] = {}
    for r in rows:
        if r["vp"]:
            published_vp.setdefault((r["model"], r["gpu"], r["tp"], r["pp"]), Counter())[int(r["vp"])] += 1
    items = []
    for i, r in enumerate(rows):
        if want not in r["gpu"].lower():
            continue
        key = f"{set_name}:{i}:{r['model']}:n{r['num_gpus']}:{r['dtype']}:tp{r['tp']}pp{r['pp']}cp{r['cp'] or 1}vp{r['vp'] or 1}"

        def make(r=r, key=key):
            if _is_jax(r):
                raise NotExpressibleError("JAX (MaxText / Paxml): XLA's sharding and fusion are not modelled")
            if "lora" in r["model"].lower():
                raise NotExpressibleError("LoRA fine-tuning: frozen base weights and adapters are not modelled")
            tp, pp, cp = cell_int(r, "tp", 1), cell_int(r, "pp", 1), cell_int(r, "cp", 1)
            cp = DGXC_LAUNCH_CP.get((r["source"], r["dtype"]), cp) if not r["cp"] else cp
            vp, note = cell_int(r, "vp", 1), None
            siblings = published_vp.get((r["model"], r["gpu"], r["tp"], r["pp"]))
            if not r["vp"] and pp > 1 and siblings:
                vp = siblings.most_common(1)[0][0]
                note = f"VP not stated; {vp} as the other releases of this layout publish"
            unfused = unfused_mla_on_blackwell(row_model(r), catalog.get(catalog_gpu(r["gpu"], catalog)))
            modules = DGXC_RECOMPUTE_MODULES.get((r["source"], r["gpu"][:5]), ())
            core_attn = "core_attn" in modules
            mtp, virtual = DGXC_MTP.get(r["source"], (0, 0))
            lay = Layout(tp=tp, pp=pp, dp=cell_int(r, "num_gpus") // (tp * pp * cp),
                         job=dict(seq_len=cell_int(r, "seq_len"), global_batch=cell_int(r, "global_batch"),
                                  attention="standard" if unfused else "flash", mtp_layers=mtp, **_token_drop(r),
                                  recompute_modules=[x for x in modules if x != "core_attn"],
                                  fp8_recipe="delayed" if row_dtype(r) == "fp8" else None,
                                  attention_kernel=DGXC_ATTENTION_KERNEL.get(r["source"])),
                         plan=dict(mbs=cell_int(r, "micro_batch", 1), cp=cp, ep=cell_int(r, "ep", 1),
                                   expert_tp=tp if r["source"] in DGXC_EXPERT_TP_IS_TP else expert_tp_of(r), virtual_stages=vp, sequence_parallel=True,
                                   grad_reduce_dtype="bf16", tp_comm_overlap=True,
                                   cuda_graphs=(r["source"], r["gpu"][:5]) in DGXC_CUDA_GRAPHS,
                                   cross_entropy="fp32" if r["source"] in DGXC_UNFUSED_CROSS_ENTROPY else None),
                         recompute="selective" if core_attn else "none",
                         stage_layers=mtp_stage_layers(row_model(r).num_layers, pp, virtual) if mtp else None)
            t = cell_float(r, "iteration_time_s")
            if t is None:
                raise NotExpressibleError("no step time published")
            c = row_case(set_name, key, r, lay, "iteration_time_s", t, catalog=catalog)
            c.notes += [note] if note else []
            return c

        items.append((key, make))
    return collect(set_name, items)
