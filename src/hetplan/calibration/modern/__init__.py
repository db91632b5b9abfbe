"""Validation on modern training measurements (H100 / H200 / B200 / GB200, 2024-2026): ``hetplan validate`` sets
``dgxc_h100``, ``dgxc_gb200``, ``torchtitan``, ``llama3_405b``, ``megatron_lm_h100``, ``moe_h100`` and
``long_context_cp``, and one A100 set of DeepSpeed's pipeline engine, ``bigscience_a100``
(:mod:`~hetplan.calibration.modern.bigscience`).

The rows are the published measurements of ``validation_data/modern/`` (copied from the project's shared data;
every row names its source ``repo@commit:path`` or arXiv table, see the README there). Each row is mapped to a
full :class:`~hetplan.plan.Plan` with its published layout (TP / PP / DP / micro-batch / global batch / sequence /
recomputation / framework / dtype / GPU / node / CP / EP) and the model of the run (proxy runs with their own,
reduced, layer count), and predicted by :func:`hetplan.estimate.estimator.estimate`. Rows the estimator or the
plan schema cannot express are never dropped: they are counted and listed with the reason
(:class:`NotExpressible`), with the plan schema's own reason where it rejects the row.

Measured quantity per source (compared directly, never through MFU, whose convention differs between sources;
:data:`CONVENTIONS`): step time (DGX Cloud, NeMo AutoModel, Megatron MoE ModelZoo where given), tokens/s per GPU
(torchtitan) or TFLOP/s per GPU (Llama 3 paper, Megatron-LM README, NeMo long-sequence), converted with the model
FLOPs of :func:`hetplan.model.counts.model_flops_per_iteration` (no recomputation, the full s² attention product;
NeMo's formula and Megatron-LM's until 2025, and the one that gives the Llama 3 paper's 400 TFLOP/s at 6.7 s per
16M-token step; the Megatron MoE ModelZoo's rows count the causal half, ``causal_flops``, as Megatron-LM's
``num_floating_point_operations`` has since 2025). Memory per GPU (torchtitan: ``reserved_bytes.all.peak`` of
``torch.cuda.memory_stats``, its ``DeviceMemoryMonitor`` in ``torchtitan/metrics.py`` at 9dec370: the caching
allocator's reserved peak, not ``active_bytes``) is compared with the estimate's largest stage total less
:func:`hetplan.estimate.memory.context_bytes` (the CUDA context, outside the allocator, which its reserved bytes
leave out; :attr:`ModernCase.predicted_memory_bytes`).

Metrics per set: as :func:`hetplan.calibration.validation.metrics` (MAPE, max |error|, Kendall τ within one job:
same model, GPU type, GPU count, global batch and sequence), the held-out part (rows outside the seeded
calibration fraction :data:`CALIBRATION_FRACTION`), memory error, and the rows predicted not to fit.

One module a concern: :mod:`~hetplan.calibration.modern.rows` (reading the CSVs and ``run_facts.toml``, the facts
of the runs the tables leave out, each with its evidence), :mod:`~hetplan.calibration.modern.models` (the model of
a row), :mod:`~hetplan.calibration.modern.mapping` (a row's :class:`Layout` to a plan and a case), one module per
source (:mod:`~hetplan.calibration.modern.dgxc`, :mod:`~hetplan.calibration.modern.torchtitan`,
:mod:`~hetplan.calibration.modern.llama3`, :mod:`~hetplan.calibration.modern.megatron_lm`,
:mod:`~hetplan.calibration.modern.moe`, :mod:`~hetplan.calibration.modern.long_context`), the sets
(:mod:`~hetplan.calibration.modern.sets`) and their metrics (:mod:`~hetplan.calibration.modern.metrics`).
"""

from hetplan.calibration.modern.bigscience import bigscience_cases, oom_check
from hetplan.calibration.modern.dgxc import DGXC_LAUNCH_CP, dgxc_cases, unfused_mla_on_blackwell
from hetplan.calibration.modern.llama3 import llama3_cases
from hetplan.calibration.modern.long_context import long_context_cases
from hetplan.calibration.modern.mapping import (CALIBRATION_FRACTION, Layout, ModernCase, build_plan, catalog_gpu,
                                                collect, node_pool, quantity_of, row_case)
from hetplan.calibration.modern.megatron_lm import megatron_lm_cases, megatron_lm_layout, megatron_lm_model
from hetplan.calibration.modern.metrics import LOADERS, load_sets, memory_metrics, per_info, run_modern, set_metrics
from hetplan.calibration.modern.models import MOE_CONFIGS, MOE_PRESETS, moe_model, row_model
from hetplan.calibration.modern.moe import moe_cases
from hetplan.calibration.modern.rows import NotExpressible, NotExpressibleError, read_rows, run_facts
from hetplan.calibration.modern.sets import CONVENTIONS, FILES, NOT_FITTED, SET_NAMES, TARGETS
from hetplan.calibration.modern.torchtitan import ASYNC_TP_NOTE, TORCHTITAN_LOCAL_BATCH, torchtitan_cases

__all__ = [
    "ASYNC_TP_NOTE", "CALIBRATION_FRACTION", "NOT_FITTED", "bigscience_cases", "oom_check", "CONVENTIONS", "DGXC_LAUNCH_CP", "FILES", "LOADERS", "Layout",
    "MOE_CONFIGS", "MOE_PRESETS", "ModernCase", "NotExpressible", "NotExpressibleError", "SET_NAMES", "TARGETS",
    "TORCHTITAN_LOCAL_BATCH", "build_plan", "catalog_gpu", "collect", "dgxc_cases", "llama3_cases",
    "load_sets", "long_context_cases", "megatron_lm_cases", "megatron_lm_layout", "megatron_lm_model",
    "memory_metrics", "moe_cases", "per_info", "moe_model", "node_pool", "quantity_of", "read_rows", "row_case", "row_model",
    "run_facts", "run_modern", "set_metrics", "torchtitan_cases", "unfused_mla_on_blackwell",
]
