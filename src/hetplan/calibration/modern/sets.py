"""The modern validation sets: their names, source files, what each compares (its MFU convention) and the
done-when targets of issues 13 and 14."""

from __future__ import annotations

SET_NAMES = ("dgxc_h100", "dgxc_gb200", "torchtitan", "llama3_405b", "megatron_lm_h100", "moe_h100",
             "long_context_cp", "bigscience_a100", "megatron_bridge")

#: Sets left out of the GPU-efficiency fit (:mod:`hetplan.calibration.modern_fit`): the A100's constants are
#: fitted on the A100 sets of :mod:`hetplan.calibration.validation`; ``bigscience_a100`` validates a stack on them;
#: ``megatron_bridge`` checks the H100 / Blackwell constants on recipes never fitted on.
NOT_FITTED = ("bigscience_a100", "megatron_bridge")

#: Source file of each set (``validation_data/modern/``) and what is compared.
FILES = {
    "dgxc_h100": "dgxc_benchmarking_h100_gb200.csv",
    "dgxc_gb200": "dgxc_benchmarking_h100_gb200.csv",
    "torchtitan": "torchtitan_benchmarks.csv",
    "llama3_405b": "llama3_paper_table4_h100.csv",
    "megatron_lm_h100": "megatron_lm_weak_scaling_h100.csv",
    "moe_h100": ("nemo_automodel_h100_bf16.csv", "megatron_moe_modelzoo_qwen3.csv", "megatron_bridge_moe_h100.csv"),
    "long_context_cp": ("nemo_long_sequence_cp.csv", "torchtitan_benchmarks.csv", "llama3_paper_table4_h100.csv"),
    "bigscience_a100": "bigscience_a100.csv",
    "megatron_bridge": "megatron_bridge_llama.csv",
}

#: What each set compares and the MFU convention its source states (printed by ``hetplan validate``).
CONVENTIONS = {
    "dgxc_h100": "step time; published MFU is vs the run dtype's dense peak (H100 989 bf16 / 1,979 fp8)",
    "dgxc_gb200": "step time; published MFU is vs the run dtype's dense peak (GB200 2,450 bf16 / 4,900 fp8)",
    "torchtitan": "tokens/s per GPU and memory (GiB); published MFU divides by the 700 W SXM's bf16 989 (float8 "
                  "rows too) although most rows ran on 500 W HBM2e H100s (not used)",
    "llama3_405b": "TFLOP/s per GPU, model FLOPs with the full s^2 attention (6.7 s per 16M-token step at 400); "
                   "MFU vs bf16 989",
    "megatron_lm_h100": "TFLOP/s per GPU as Megatron-LM counts (no recompute, full s^2); MFU vs bf16 989",
    "moe_h100": "step time (TFLOP/s per GPU where no step time is given, Megatron-LM's causal s^2/2 count); "
                "MFU vs bf16 989",
    "long_context_cp": "TFLOP/s per GPU (NeMo's FLOP formula: full s^2, no causal halving), tokens/s per GPU "
                       "(torchtitan), TFLOP/s (Llama 3); MFU not compared",
    "bigscience_a100": "step time (Megatron-DeepSpeed log, iteration 2 or later); memory is nvidia-smi's, CUDA "
                       "context included; published TFLOP/s count the recomputation forward (SC'21 Eq. 3)",
    "megatron_bridge": "step time (global batch x 8,192 over the published tokens/s per GPU x GPUs); published "
                       "model TFLOP/s per GPU vs the FP8 peak not compared",
}

#: Done-when targets (issues 13 and 14), fractions; ``kendall_tau`` is a lower bound, the others upper bounds.
#: ``subset`` names the rows the target is stated for.
TARGETS = {
    "dgxc_h100": {"subset": "dense_cp1", "mape": 0.10, "kendall_tau": 0.8},
    "torchtitan": {"mape": 0.12, "memory_max_abs_error": 0.10},
    "llama3_405b": {"max_abs_error": 0.10},
    "megatron_lm_h100": {"max_abs_error": 0.10},
    "moe_h100": {"mape": 0.15},
    "long_context_cp": {"mape": 0.15},
}
