"""Mixture-of-experts layers and multi-head latent attention: the GEMMs, all-to-all and parameter sharding of
expert parallelism (EP).

**Layout** (Megatron-Core's MoE "parallel folding", Liu et al. 2025, arXiv 2504.14960, Sec. 3; torchtitan's
``ParallelDims``): attention and dense layers are split over TP (and CP, DP); the routed experts of a MoE layer are
split over ``ep`` expert-parallel ranks (``E / ep`` whole experts each) times ``etp`` expert-TP ranks (each
expert's matrices split like TP), and replicated over the *expert data-parallel* degree
``edp = tp·cp·dp / (ep·etp)`` (:attr:`hetplan.degrees.Degrees.expert_dp`): expert gradients are reduced, and with the
distributed optimizer their states sharded, over ``edp`` ranks, the other parameters over ``dp·cp``.

**Tokens.** A rank enters the MoE layer with its ``T = b·s / t`` tokens (Megatron-LM requires sequence
parallelism with TP and experts; ``s`` is the local sequence of a CP rank). The router picks ``k`` experts per
token; each copy goes to the rank holding that expert (*dispatch*, an all-to-all over the EP group) and comes back
weighted (*combine*, a second all-to-all); backward does both again (Lepikhin et al., GShard, ICLR 2021 Sec. 2.2;
Fedus et al., Switch Transformer, JMLR 2022 Sec. 2). At perfect balance every rank receives ``k·T`` copies and
each of its experts ``M_e = k·T·ep·etp / E`` tokens; the busiest rank receives ``imbalance`` times that
(:data:`DEFAULT_LOAD_IMBALANCE`; 1 for the "forced balance" routers of published benchmarks).

**Grouped GEMM.** The local experts run as one grouped GEMM (CUTLASS grouped GEMM, Megatron-LM
``moe_grouped_gemm``; MegaBlocks, Gale et al. MLSys 2023): each expert's rows are padded to the kernel's row tile
(:data:`GROUPED_GEMM_ROW_TILE`, MegaBlocks' 128-row blocks, Sec. 5.1), so an expert with few tokens wastes
the rest of its tile (:func:`grouped_gemm_row_efficiency`); and the weights of all local experts are read once per
pass whatever the token count, which makes small-``M_e`` expert GEMMs memory-bound (the roofline's bytes term).

**All-to-all** (:func:`alltoall_time_s`): EP members ``stride`` GPUs apart (1: Megatron-Core's expert rank
order puts an EP group on consecutive GPUs, ``parallel_state`` with expert-TP 1); those in the same node
exchange over NVLink, the others through the node's NICs, shared by all the node's GPUs (all run their own
all-to-all at once). The two parts proceed concurrently (NCCL posts all sends and receives of an all-to-all
together): time = the slower part + one latency. What crosses depends on the dispatcher (:class:`MoEOptions`):

* ``alltoall`` (Megatron-Core ``MoEAlltoAllTokenDispatcher``, the default): every one of a token's ``k``
  routed copies is sent to its expert's rank, ``(ep - n)/ep`` of them through the NICs (``n`` EP ranks per node);
* ``deepep`` (DeepEP / HybridEP, Megatron-Core's ``flex`` dispatcher; DeepSeek-V3 report, arXiv 2412.19437,
  Sec. 3.2.2; DeepEP README "normal kernels"): a token goes once to each *node* that holds one of its experts
  (RDMA to the same-index GPU there, then forwarded over NVLink) and once to each *rank*: the bytes scale with
  the expected distinct destination nodes and ranks of a token (:func:`distinct_destinations`), not with ``k``.
  Those depend on the routing: ``random`` (each token picks ``k`` distinct experts uniformly: learned routers
  in expectation, Megatron-Core's ``--moe-router-force-load-balancing``) or ``contiguous`` (token ``i`` takes
  experts ``i·k … i·k + k - 1``: NeMo AutoModel's ``FakeBalancedGate`` benchmark router, ``moe/layers.py``),
  whose ``k`` experts sit on ``⌈k / (E/ep)⌉`` neighbouring ranks of one node. DeepEP's NVLink part spans one
  host of at most :data:`DEEPEP_NVLINK_PEERS` GPUs (its ``NUM_MAX_NVL_PEERS``): on a GB200 NVL72 everything
  beyond goes through the NICs; ``hybridep`` (NVIDIA's HybridEP, "native MNNVL support", Megatron-LM
  ``transformer/moe/README.md``) is the same deduplication over the pool's whole NVLink domain.

**MLA** (DeepSeek-V2, arXiv 2405.04434, Sec. 2.1): :func:`mla_gemms`.

All functions broadcast over numpy arrays. Seconds, bytes, bytes/s.
"""

from __future__ import annotations

from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

from hetplan.estimate import compute, fp8
from hetplan.estimate.comm import group_collective_time_s, overlap_contention
from hetplan.estimate.stagework import Link
from hetplan.hardware.catalog import Architecture, GPUSpec
from hetplan.model import counts
from hetplan.model.spec import ModelSpec
from hetplan.estimate.arrays import Array
from hetplan.degrees import Degrees

#: Tokens the busiest expert-parallel rank receives, relative to perfect balance, for plans of real training:
#: the expert capacity factor 1.25 of Switch Transformer (Fedus et al. JMLR 2022, Sec. 2.2 and Table 1), the most
#: an expert takes when routing is capacity-limited. Published benchmark rows that force balanced routing use 1.
DEFAULT_LOAD_IMBALANCE = 1.25
#: Row tile of the grouped expert GEMM: MegaBlocks' 128 x 128 blocks (Gale et al. MLSys 2023, Sec. 5.1), also the
#: M tile of the CUTLASS grouped GEMM Megatron-LM uses for bf16 on Hopper.
GROUPED_GEMM_ROW_TILE = 128
#: Large-GEMM efficiency ``e_max`` (fraction of the dtype's dense peak, before the shape factor of
#: :func:`hetplan.estimate.compute.gemm_efficiency`) of PyTorch's grouped GEMM on Blackwell: the routed experts of
#: torchtitan (``torch._grouped_mm`` in bf16; torchao's ``_to_mxfp8_then_scaled_grouped_mm``, i.e.
#: ``torch._scaled_grouped_mm``, in MXFP8). From torchao's forward + backward benchmark of one grouped GEMM on B200
#: (pytorch/ao ``torchao/prototype/moe_training/README.md``, "Autograd function", torch 2.10.0a0 / torchao 0.14,
#: the software of late 2025; 3 x 2MNK FLOPs per pass pair): Llama 4 Scout shapes (M 128,000, N 8,192, K 5,120,
#: 1-8 experts per GPU) bf16 37.7-43.1 ms = 747-854 TFLOP/s, DeepSeek-V3 shapes (N 2,048, K 7,168) 13.1-15.8 ms =
#: 712-863 TFLOP/s: a mean 0.376 / 0.372 of the 2,250 peak after the shape factor (0.958 / 0.920) -> 0.37, against
#: 0.52-0.55 that cuBLAS / Transformer Engine GEMMs reach on the same GPUs. MXFP8 22.2-23.9 / 9.9-11.3 ms, less the
#: MXFP8 casts that :mod:`hetplan.estimate.fp8` charges apart (0.9 / 0.6 ms at 7.7 TB/s): 0.333 / 0.271 of the
#: 4,500 FP8 peak -> 0.30. Transformer Engine's grouped GEMM (Megatron-Core) keeps the dense ceiling.
TORCH_GROUPED_MM_BLACKWELL = {"bf16": 0.37, "fp8": 0.30}
#: Bytes per element a token copy carries through dispatch and combine (bf16). DeepSeek-V3 dispatches in FP8
#: (1 byte, Sec. 3.3) and combines in bf16.
DISPATCH_BYTES = 2
#: Kernels a MoE layer's forward launches besides its expert GEMMs, less the dense MLP's two GEMMs and activation
#: it replaces (Megatron-Core ``MoELayer``, counted from its forward): the router (gating GEMM, score function,
#: top-k, routing-map and probability scatters: 5), the load-balancing loss (6), the dispatcher's bookkeeping
#: (tokens per expert and their device-to-host copy: 2), permute, sort by expert and their inverses (4), two
#: all-to-alls (2) and the activation (1): 20 - 3.
MOE_EXTRA_KERNELS = 17


def experts_split_like_mlp(framework: str, ep: Array):
    """Whether the routed experts are split over the TP ranks the way a dense MLP is (arrays broadcast):
    PyTorch's TP of torchtitan (``framework="fsdp"``, what ``hetplan export`` launches) at EP 1 shards each
    expert's hidden dimension over the TP group (column-wise ``w1`` / ``w3``, row-wise ``w2``) and feeds the MoE
    block the all-gathered tokens, its output reduce-scattered back to the sequence shards: the dense family of
    ``set_moe_sharding_config`` (``torchtitan/models/common/moe_sharding.py``, ``expert_param_placement_dense``,
    pytorch/torchtitan@b5bcd76, the code of 0.3.0) and ``apply_moe_ep_tp``'s ``TensorParallel()`` plan when
    ``ep_mesh is None`` (``torchtitan/models/llama4/infra/parallelize.py`` of 0.2.2). With EP > 1 torchtitan
    folds EP over the TP ranks and the tokens stay sequence-sharded (0.3.0 has no expert-TP degree: it was removed
    by pytorch/torchtitan#3167, c4b409a, 2026-04-30). Megatron-Core splits experts over their own
    ``--expert-tensor-parallel-size`` (:class:`hetplan.degrees.Degrees` ``expert_tp``), never like this."""
    return (framework == "fsdp") & (np.asarray(ep) == 1)


def launched_degrees(degrees: Degrees, framework: str) -> Degrees:
    """``degrees`` as the framework launches the experts: where they are split like a dense MLP
    (:func:`experts_split_like_mlp`) their expert-TP degree is the TP degree (each expert's matrices over the
    ``tp`` ranks, the expert data-parallel ranks the ``dp·cp`` of the dense weights); otherwise unchanged."""
    like_mlp = experts_split_like_mlp(framework, degrees.ep)
    if not np.any(like_mlp):
        return degrees
    return degrees.with_(expert_tp=np.where(like_mlp, degrees.tp, degrees.expert_tp))


def mlp_tp_collective_share(m: ModelSpec, ep: Array, framework: str = "megatron"):
    """Share of the model's layers whose MLP side runs sequence parallelism's TP all-gather (before) and
    reduce-scatter (after) of the ``b·s·h`` activation (:func:`hetplan.estimate.compute.layer_time_s`): every
    dense layer; a MoE layer when it has shared experts (Megatron-Core ``SharedExpertMLP`` gathers its input and
    reduce-scatters its output under sequence parallelism, ``transformer/moe/shared_experts.py``) or when its
    routed experts are split like a dense MLP (:func:`experts_split_like_mlp`). Megatron-Core's routed experts
    take the rank's own sequence shard through the dispatcher, gathering only over the expert-TP group
    (``MoEAlltoAllTokenDispatcher``: ``gather_from_sequence_parallel_region(..., group=self.tp_group)`` with
    ``tp_group = pg_collection.expt_tp``, ``transformer/moe/token_dispatcher.py``, NVIDIA/Megatron-LM d98e8a64;
    that gather is :func:`moe_alltoall_time_s`'s), and torchtitan's at EP > 1 likewise. 1 for a dense model.
    Arrays broadcast."""
    if not m.is_moe:
        return 1.0
    runs = np.where(experts_split_like_mlp(framework, ep) | bool(m.shared_expert_ffn_hidden_size), 1.0, 0.0)
    return (m.num_layers - m.num_moe_layers + runs * m.num_moe_layers) / m.num_layers


def extra_kernels(m: ModelSpec, ep: Array, framework: str = "megatron", dispatcher: str = "alltoall"):
    """Kernels one layer's forward launches beyond a dense layer's (mean over the model's layers; counted in the
    host floor of :func:`hetplan.estimate.compute.layer_time_s`): :data:`MOE_EXTRA_KERNELS` plus the expert GEMM
    launches — Megatron-Core's ``TEGroupedMLP`` runs Transformer Engine's ``GroupedLinear``, which issues one
    cuBLAS GEMM per local expert and matrix (``nvte_multi_stream_cublas_gemm``, TransformerEngine
    ``common/gemm/cublaslt_gemm.cu``): ``2·E/ep``; PyTorch's ``torch._grouped_mm`` (torchtitan, NeMo AutoModel
    ``experts: torch_mm``) and the ``grouped_gemm`` kernel (``gmm``) launch one per matrix (``framework="fsdp"``):
    2 — a shared expert's two GEMMs and activation (3), and the bias kernels of biased experts
    (:func:`expert_bias_kernels`, which depend on ``dispatcher``). 0 for a dense model."""
    if not m.is_moe:
        return 0.0
    gemms = 2.0 if framework == "fsdp" else 2.0 * m.num_experts / np.asarray(ep, dtype=float)
    shared = 3.0 if m.shared_expert_ffn_hidden_size else 0.0
    bias = expert_bias_kernels(m, ep, framework, dispatcher)
    return (MOE_EXTRA_KERNELS + gemms + shared + bias) * m.num_moe_layers / m.num_layers


#: How a framework adds the per-expert biases of a routed expert GEMM's output (2-byte elements, each kernel one
#: read of its inputs and one write of its output), by code path (:func:`expert_bias_path`):
#:
#: * ``megatron`` — Megatron-Core's ``TEGroupedMLP._apply_bias`` (``megatron/core/transformer/moe/experts.py``,
#:   "Enable bias in expert mlp [gpt-oss 5/5]", September 2025, until the packed path of August 2026): the FC1 bias
#:   in Transformer Engine's GEMM epilogue (0); the FC2 bias, weighted by the router probability, in an eager loop
#:   over the local experts (``torch.split``; per expert ``b * p``: write 2, ``t + b * p``: read 2 + 2, write 2;
#:   one ``torch.cat``: read 2, write 2): 12 bytes per element, ``2·E/ep + 1`` kernels;
#: * ``loop`` — NeMo AutoModel's ``GroupedExpertsDeepEP._apply_bias`` (``nemo_automodel/components/moe/layers.py``,
#:   October 2025 - January 2026; its DeepEP experts, ``framework="fsdp"`` with the ``deepep`` / ``hybridep``
#:   dispatcher): the same FC2 loop, and the FC1 bias in one without the probability (``t + b``, ``cat``): 8
#:   bytes per element of the ``2·f_e`` outputs, ``E/ep + 1`` more kernels;
#: * ``vectorised`` — torchtitan's ``GptOssGroupedExperts`` (``torchtitan/models/gpt_oss/moe.py``;
#:   ``framework="fsdp"`` with its own all-to-all): per GEMM the bias ``repeat_interleave``-d to one row per token
#:   (write 2) and added (read 2 + 2, write 2): 8 bytes per element, and a few kernels whatever the experts
#:   (``cat`` of the tail row, ``repeat_interleave``, the add: :data:`VECTORISED_BIAS_KERNELS` per GEMM).
#:
#: Backward: the split's and the products' gradients, about as many bytes again
#: (:attr:`hetplan.estimate.stagework.LayerTerms.extra_gpu_s`).
EXPERT_BIAS_BYTES_PER_ELEMENT = {"fc1": {"megatron": 0.0, "loop": 8.0, "vectorised": 8.0},
                                 "fc2": {"megatron": 12.0, "loop": 12.0, "vectorised": 8.0}}
VECTORISED_BIAS_KERNELS = 4.0


def expert_bias_path(framework: str, dispatcher: str = "alltoall") -> str:
    """The code path that adds the expert biases (:data:`EXPERT_BIAS_BYTES_PER_ELEMENT`): ``megatron`` under
    Megatron-Core; under ``framework="fsdp"`` NeMo AutoModel's DeepEP experts (``loop``) where the dispatcher is
    DeepEP / HybridEP, else torchtitan's (``vectorised``)."""
    if framework != "fsdp":
        return "megatron"
    return "loop" if dispatcher in ("deepep", "hybridep") else "vectorised"


def expert_bias_kernels(m: ModelSpec, ep: Array, framework: str = "megatron", dispatcher: str = "alltoall"):
    """Kernels that add one MoE layer's expert biases in its forward (:data:`EXPERT_BIAS_BYTES_PER_ELEMENT`):
    ``megatron`` ``2·E/ep + 1``, ``loop`` ``3·E/ep + 2``, ``vectorised`` ``2 x`` :data:`VECTORISED_BIAS_KERNELS`;
    0 for experts without biases (``linear_bias`` off: every MoE preset but GPT-OSS)."""
    if not (m.is_moe and m.linear_bias):
        return 0.0
    local = m.num_experts / np.asarray(ep, dtype=float)
    path = expert_bias_path(framework, dispatcher)
    if path == "vectorised":
        return np.full_like(local, 2.0 * VECTORISED_BIAS_KERNELS)
    return 2.0 * local + 1.0 + (local + 1.0 if path == "loop" else 0.0)


def expert_bias_time_s(m: ModelSpec, gpu: GPUSpec, b: Array, s: Array, t: Array, ep: Array, etp: Array = 1,
                       imbalance: Array = 1.0, framework: str = "megatron", dispatcher: str = "alltoall"):
    """Memory-bound time of adding one MoE layer's expert biases in its forward (mean over the model's layers;
    backward the same again, :attr:`hetplan.estimate.stagework.LayerTerms.extra_gpu_s`): the busiest rank's
    ``imbalance · k · T · etp`` routed copies (``T = b·s/t``), each with ``h`` FC2 outputs and ``2·f_e/etp``
    (gated) FC1 outputs, at :data:`EXPERT_BIAS_BYTES_PER_ELEMENT` bytes each for the path of ``framework`` and
    ``dispatcher`` (:func:`expert_bias_path`), at the HBM bandwidth. 0 for experts without biases. For GPT-OSS
    120B at EP 8 (4,096 tokens, top-4, h 2,880) under Megatron-Core: 16,384 copies x 2,880 x 12 B = 0.57 GB,
    0.17 ms per layer forward on an H100."""
    if not (m.is_moe and m.linear_bias):
        return 0.0
    path = expert_bias_path(framework, dispatcher)
    copies = imbalance * m.experts_per_token * np.asarray(b, dtype=float) * s / t * np.asarray(etp, dtype=float)
    fc1_out = (2 if m.gated_mlp else 1) * m.expert_ffn_hidden_size / np.asarray(etp, dtype=float)
    per_copy = (EXPERT_BIAS_BYTES_PER_ELEMENT["fc2"][path] * m.hidden_size
                + EXPERT_BIAS_BYTES_PER_ELEMENT["fc1"][path] * fc1_out)
    return copies * per_copy / gpu.hbm_bandwidth_bytes_per_s * m.num_moe_layers / m.num_layers


DISPATCHERS = ("alltoall", "deepep", "hybridep")
#: GPUs DeepEP's normal kernels reach over NVLink (``NUM_MAX_NVL_PEERS = 8`` in DeepEP's ``csrc/kernels/configs.cuh``;
#: one host's GPUs, CUDA IPC): the NVLink domain of its ``deepep`` dispatch whatever the pool's.
DEEPEP_NVLINK_PEERS = 8
#: SMs DeepEP's normal dispatch and combine kernels occupy while they run: ``Buffer.num_sms = 20``
#: (deepseek-ai/DeepEP ``deep_ep/buffer.py``), the default Megatron-Core keeps ("Number of SMs to use for DeepEP
#: (historical default 20)", ``moe_deepep_num_sms``, ``transformer/transformer_config.py``).
DEEPEP_NUM_SMS = 20
ROUTINGS = ("random", "contiguous")


@dataclass(frozen=True)
class MoEOptions:
    """How a job runs its MoE layers: how tokens reach their experts (module doc, All-to-all: ``dispatcher`` of
    :data:`DISPATCHERS`, the router's ``routing`` of :data:`ROUTINGS`), and ``recompute``: the MoE layer is
    checkpointed and run again in backward (Megatron-Core ``--recompute-modules moe``: router, dispatch, experts
    and combine recomputed, ``transformer/moe/moe_layer.py``), storing only its input
    (:func:`hetplan.model.counts.layer_activation_bytes`); ``a2a_overlap``: the all-to-alls hide behind the
    paired micro-batch's compute (:func:`exposed_alltoall_s`)."""

    dispatcher: str = "alltoall"
    routing: str = "random"
    recompute: bool = False
    a2a_overlap: bool = False


def distinct_destinations(m: ModelSpec, groups: Array, routing: str = "random"):
    """Expected number of distinct groups a token's ``k`` routed experts fall into, when the ``E`` experts are
    split evenly into ``groups`` groups of consecutive experts (EP ranks, or the nodes holding them).

    ``random``: ``k`` distinct experts drawn uniformly, ``groups · (1 - C(E - E/groups, k) / C(E, k))``
    (inclusion of each group, hypergeometric). ``contiguous``: ``max(1, k / (E/groups))`` (aligned blocks of
    ``k`` experts; module doc). Arrays broadcast."""
    g = np.asarray(groups, dtype=float)
    e, k = float(m.num_experts), int(m.experts_per_token)
    if routing == "contiguous":
        return np.maximum(1.0, k * g / e)
    per = e / g
    miss = np.ones_like(g)
    for i in range(k):  # P(no expert of one group among the k) = prod (E - E/g - i) / (E - i)
        miss = miss * np.maximum(e - per - i, 0.0) / (e - i)
    return g * (1.0 - miss)


def _expected_max_standard_normal(n: Array):
    """Expected largest of ``n`` independent standard normals, by Blom's approximation of normal order statistics
    (Blom 1958, *Statistical Estimates and Transformed Beta-Variables*; ``E[X_(n:n)] ≈ Φ⁻¹((n - 0.375) /
    (n + 0.25))``, within 1 % of the exact values for n = 2-1,000, e.g. 1.539 against 1.539 at n = 5, 3.258
    against 3.241 at n = 1,000); 0 for ``n = 1``."""
    inv = np.vectorize(lambda x: NormalDist().inv_cdf(x), otypes=[float])
    n = np.maximum(np.asarray(n, dtype=float), 1.0)
    return inv((n - 0.375) / (n + 0.25))


def routing_imbalance(m: ModelSpec, tokens_per_rank: Array, ep: Array):
    """Tokens the busiest of ``ep`` expert-parallel ranks receives, relative to perfect balance, when each of the
    group's ``ep · T`` tokens picks ``k`` distinct experts of ``E`` uniformly at random (Megatron-Core's
    ``--moe-router-force-load-balancing`` draws random router logits, ``moe_utils.py``
    ``apply_random_logits``; a learned router at best): the copies rank ``r`` (``E / ep`` experts) receives from
    one token are hypergeometric, mean ``k / ep`` and variance ``k (1/ep)(1 - 1/ep)(E - k)/(E - 1)``; summed over
    the ``ep · T`` tokens, mean ``μ = k·T`` and ``σ² = k·T (1 - 1/ep)(E - k)/(E - 1)`` (normal by the central
    limit theorem for ``k·T`` in the hundreds and more). The busiest rank takes about the expected largest of
    ``ep`` such loads: ``1 + σ · z_ep / μ`` (:func:`_expected_max_standard_normal`), 1 for ``ep = 1``. For
    Qwen3-30B-A3B (E 128, k 8) at EP 16 and 4,096 tokens per rank: 1.0095. The multinomial spread is small
    next to the skew of learned routers (the fixed :data:`DEFAULT_LOAD_IMBALANCE` of real training)."""
    e, k = float(m.num_experts), float(m.experts_per_token)
    ep = np.asarray(ep, dtype=float)
    mu = k * np.maximum(np.asarray(tokens_per_rank, dtype=float), 1.0)
    var = mu * (1.0 - 1.0 / ep) * (e - k) / max(e - 1.0, 1.0)
    return 1.0 + np.sqrt(var) * _expected_max_standard_normal(ep) / mu


def bounded_imbalance(m: ModelSpec, imbalance: Array, ep: Array):
    """``imbalance`` (tokens the busiest EP rank receives relative to perfect balance) within what routing allows:
    a token's ``k`` routed copies go to ``k`` distinct experts, so one rank holding ``E/ep`` of them receives at most
    ``min(E/ep, k)`` copies of it, against ``k/ep`` on average — at most ``ep·min(E/ep, k)/k`` times its share. At
    ``ep = 1`` that is 1: the one rank holds every expert and multiplies all ``k·T`` copies whatever the router
    picks, so a learned router's skew (:data:`DEFAULT_LOAD_IMBALANCE`) costs it nothing. Arrays broadcast."""
    ep = np.asarray(ep, dtype=float)
    k = float(m.experts_per_token)
    return np.minimum(imbalance, ep * np.minimum(m.num_experts / ep, k) / k)


def capacity_imbalance(imbalance: Array, capacity_factor: float | None, pad: bool = False):
    """Rows the busiest expert processes relative to its even share once token dropping caps them
    (:attr:`hetplan.plan.Job.moe_capacity_factor`). Megatron-Core gives each expert a capacity of
    ``ceil(T·k / E · c)`` of a rank's ``T`` tokens (``moe_utils.py`` ``get_capacity``; the router's
    ``apply_router_token_dropping`` keeps the top ``capacity`` by probability and drops the rest), so an expert
    receives at most ``c`` times its share from the ``ep`` ranks: ``min(imbalance, c)``; padded to capacity
    (``--moe-pad-expert-input-to-capacity``: ``MoEAlltoAllTokenDispatcher`` sets every local expert's tokens to
    ``capacity · tp · ep``, ``token_dispatcher.py``) exactly ``c`` — the padding rows are sent and multiplied
    too. ``imbalance`` unchanged for a dropless run (``capacity_factor`` None). Arrays broadcast."""
    if capacity_factor is None:
        return imbalance
    if pad:
        return np.full_like(np.asarray(imbalance, dtype=float), float(capacity_factor))
    return np.minimum(imbalance, float(capacity_factor))


#: Passes over the ``k·T·h`` routed-token tensor (2-byte elements, read or written once each) that Megatron-Core's
#: all-to-all dispatcher makes per MoE layer and pass beyond the write of the permuted tokens (counted with the
#: layer's activations, :func:`hetplan.model.counts.moe_mlp_activation_bytes`) and the GEMMs' own reads and writes
#: (``megatron/core/transformer/moe/token_dispatcher.py`` ``MoEAlltoAllTokenDispatcher`` and ``moe_utils.py``):
#: the expert outputs read by ``unpermute`` (which weights them by the router probabilities and sums each token's
#: ``k`` copies, writing ``T·h``), and, with more than one local expert, ``sort_chunks_by_idxs`` after the
#: dispatch all-to-all (regroup the received chunks from source-rank order to local-expert order: read and write)
#: and its inverse before the combine (read and write): 1 + 4. The ``T·h`` token tensor is read once by
#: ``permute`` and written once by ``unpermute`` (:data:`PERMUTE_TOKEN_PASSES`). Counted for the fused kernels
#: (``--moe-permute-fusion``, Transformer Engine ``moe_permute`` / ``moe_unpermute`` /
#: ``moe_sort_chunks_by_index``: one read of each input, one write of each output); the unfused PyTorch path
#: (``index_select``, ``scatter_add``, and a separate multiply by the probabilities) moves more. Backward runs
#: each kernel's inverse on the gradients: the same bytes again.
PERMUTE_COPY_PASSES = 1.0
SORT_CHUNKS_PASSES = 4.0
PERMUTE_TOKEN_PASSES = 2.0
#: Passes over the routed-token tensor that FP8 adds to Megatron-Core's experts (:func:`fp8_pads_experts`): FP8
#: GEMMs need every expert's row count a multiple of 16, so ``TEGroupedMLP`` (FP8 since ADLR/megatron-lm!1865,
#: 2024-10; ``megatron/core/transformer/moe/experts.py``) pads each local expert's segment into a new tensor before
#: FC1 (Transformer Engine ``Fp8Padding``: read and write) and drops the padding rows of FC2's output
#: (``Fp8Unpadding``: read and write); ``SequentialMLP`` pads its one expert's input likewise
#: (``_pad_tensor_for_fp8``). Their backward moves the gradients the same way. 2 + 2 per pass.
FP8_PADDING_PASSES = 4.0


def fp8_pads_experts(dtype: str, framework: str, dispatcher: str) -> bool:
    """Whether Megatron-Core pads the expert inputs for FP8 in a pass of its own (:data:`FP8_PADDING_PASSES`): FP8
    (or MXFP8) under Megatron-Core, unless the dispatcher pads the segments in its own fused permutation — HybridEP
    (``moe_utils.py`` ``skip_routed_expert_padding``: the HybridEP / NCCL-EP dispatch writes padded segments). The
    alternative, ``--moe-router-padding-for-fp8`` (padding the routing map, ADLR/megatron-lm!3170, 2025-06, off by
    default), is not what ``hetplan export`` writes. torchtitan aligns each expert's rows in its permutation indices
    (``generate_permute_indices``), no pass of its own."""
    return fp8.is_fp8(dtype) and framework != "fsdp" and dispatcher != "hybridep"


def permute_time_s(m: ModelSpec, gpu: GPUSpec, b: Array, s: Array, t: Array, ep: Array, etp: Array = 1,
                   imbalance: Array = 1.0, fp8_padding: bool = False):
    """Memory-bound time of one MoE layer's token permutation, sort and unpermutation in one pass (forward, and
    the same again in backward), mean over the model's layers (:data:`PERMUTE_COPY_PASSES`,
    :data:`SORT_CHUNKS_PASSES`, :data:`PERMUTE_TOKEN_PASSES`, and with ``fp8_padding`` Megatron-Core's FP8
    padding of the expert segments, :data:`FP8_PADDING_PASSES`): the busiest rank's ``imbalance · k · T · etp``
    routed copies (each expert-TP rank works on the copies all-gathered over its ``etp`` group) and its ``T =
    b·s/t`` tokens, ``h`` elements of 2 bytes, at the HBM bandwidth. 0 for a dense model."""
    if not m.is_moe:
        return 0.0
    tokens = np.asarray(b, dtype=float) * s / t
    copies = imbalance * m.experts_per_token * tokens * np.asarray(etp, dtype=float)
    local = m.num_experts / np.asarray(ep, dtype=float)
    passes = (PERMUTE_COPY_PASSES + np.where(local > 1, SORT_CHUNKS_PASSES, 0.0)
              + (FP8_PADDING_PASSES if fp8_padding else 0.0))
    row = m.hidden_size * counts.BYTES_PER_ACTIVATION
    moved = (passes * copies + PERMUTE_TOKEN_PASSES * tokens) * row
    return moved / gpu.hbm_bandwidth_bytes_per_s * m.num_moe_layers / m.num_layers


def expert_tokens(m: ModelSpec, tokens_per_rank: Array, ep: Array, etp: Array = 1, imbalance: Array = 1.0):
    """Tokens each local expert processes on the busiest rank: ``imbalance · k · T · ep · etp / E``."""
    return imbalance * m.experts_per_token * np.asarray(tokens_per_rank, dtype=float) * ep * etp / m.num_experts


def grouped_gemm_row_efficiency(rows: Array):
    """Useful fraction of the row tiles of one expert's GEMM: ``M / (⌈M / tile⌉ · tile)`` (module doc); 1 for
    ``M = 0``."""
    rows = np.asarray(rows, dtype=float)
    tiles = np.maximum(np.ceil(rows / GROUPED_GEMM_ROW_TILE), 1.0)
    return np.where(rows > 0, rows / (tiles * GROUPED_GEMM_ROW_TILE), 1.0)


def grouped_gemm_ceiling(gpu: GPUSpec, dtype: str, framework: str = "megatron") -> float:
    """``e_max`` of the routed experts' grouped GEMM: :data:`TORCH_GROUPED_MM_BLACKWELL` for PyTorch's grouped GEMM
    (``framework="fsdp"``: torchtitan) on a Blackwell GPU, else the dense GEMMs' (:func:`hetplan.estimate.fp8.gemm_ceiling`)."""
    if framework == "fsdp" and gpu.family is Architecture.BLACKWELL:
        return TORCH_GROUPED_MM_BLACKWELL["fp8" if fp8.is_fp8(dtype) else "bf16"]
    return fp8.gemm_ceiling(gpu, dtype)


def moe_mlp_gemms(m: ModelSpec, b: Array, s: Array, t: Array, ep: Array, etp: Array = 1, imbalance: Array = 1.0):
    """GEMMs of one MoE layer's MLP per rank, forward: ``[(M, N, K, batch, row_efficiency), ...]`` for the router
    ``(T, E, h)`` on the rank's ``T = b·s/t`` tokens, the grouped experts ``E/ep`` x (``M_e``, ``2f_e/etp``, h) and
    (``M_e``, h, ``f_e/etp``) (one ``f_e`` for a non-gated MLP), and the shared experts as a TP-split dense MLP
    on all ``b·s`` tokens. ``row_efficiency`` is :func:`grouped_gemm_row_efficiency` (1 for plain GEMMs)."""
    h, f_e, e = m.hidden_size, m.expert_ffn_hidden_size, m.num_experts
    up = 2 if m.gated_mlp else 1
    T = np.asarray(b, dtype=float) * s
    m_e = expert_tokens(m, T / t, ep, etp, imbalance)
    local = e / np.asarray(ep, dtype=float)
    eff = grouped_gemm_row_efficiency(m_e)
    out = [(T / t, e, h, 1.0, 1.0), (m_e, up * f_e / etp, h, local, eff), (m_e, h, f_e / etp, local, eff)]
    if m.shared_expert_ffn_hidden_size:
        f_s = m.shared_expert_ffn_hidden_size
        out += [(T, up * f_s / t, h, 1.0, 1.0), (T, h, f_s / t, 1.0, 1.0)]
    return out


def mla_gemms(m: ModelSpec, b: Array, s: Array, t: Array):
    """Forward GEMMs of one MLA block per TP rank (DeepSeek-V2 Sec. 2.1; Megatron-Core ``MLASelfAttention``):
    ``(linear, core)``, each a list of ``(M, N, K, batch)``. Linear: the Q and KV down-projections on all
    ``T = b·s`` tokens, replicated on every TP rank; the up-projections column-parallel (``N/t``); the output
    projection row-parallel (``K/t``). Core, per head (``b·a/t`` of them): scores ``(s, s, d_qk)`` and
    attention over values ``(s, d_v, s)``."""
    T = np.asarray(b, dtype=float) * s
    *q, (kv_in, kv_out), (up_in, up_out), (o_in, o_out) = counts.attention_linears(m)
    q_gemms = [(T, q[0][1], q[0][0], 1.0), (T, q[1][1] / t, q[1][0], 1.0)] if len(q) == 2 else \
        [(T, q[0][1] / t, q[0][0], 1.0)]
    linear = q_gemms + [(T, kv_out, kv_in, 1.0), (T, up_out / t, up_in, 1.0), (T, o_out, o_in / t, 1.0)]
    heads = np.asarray(b, dtype=float) * m.num_attention_heads / t
    d_v = m.v_head_dim or m.head_dim
    core = [(s, s, m.head_dim, heads), (s, d_v, s, heads)]
    return linear, core


def ep_ranks_per_node(ep: Array, stride: Array, gpus_per_node: Array):
    """EP ranks that share a node: ``min(ep, max(1, G // stride))``."""
    g = np.asarray(gpus_per_node, dtype=float)
    return np.minimum(np.asarray(ep, dtype=float), np.maximum(1.0, np.floor(g / np.asarray(stride, dtype=float))))


def alltoall_time_s(message_bytes: Array, ep: Array, stride: Array, link: Link):
    """One all-to-all in which each of ``ep`` ranks (``stride`` GPUs apart) sends ``message_bytes`` in total,
    ``1/ep`` of it to each rank (itself included). Of its ``ep`` peers ``k = min(ep, max(1, G // stride))`` share
    its node: ``(k-1)/ep`` of the bytes go over NVLink, ``(ep-k)/ep`` through the node's NICs at ``1/G`` of their
    bandwidth each. Time = the slower part + one latency (module doc); 0 for ``ep = 1``.

    Args:
        link: the stage's :class:`~hetplan.estimate.stagework.Link` (G GPUs per node; its NIC bandwidth is the
            node's, all NICs together).
    """
    ep = np.asarray(ep, dtype=float)
    k = ep_ranks_per_node(ep, stride, link.gpus_per_node)
    return exchange_time_s(message_bytes * (k - 1.0) / ep, message_bytes * (ep - k) / ep, ep, k, link)


def exchange_time_s(intra_bytes: Array, inter_bytes: Array, ep: Array, ranks_per_node: Array, link: Link):
    """An all-to-all that moves ``intra_bytes`` over NVLink and ``inter_bytes`` through the node's NICs (at
    ``1/G`` of their bandwidth per GPU) concurrently, each at the fraction of its bandwidth NCCL reaches: the
    slower part + one latency (between nodes when the group spans nodes, else inside one: the stage link's,
    :class:`hetplan.estimate.stagework.Link`); 0 for ``ep = 1``."""
    ep = np.asarray(ep, dtype=float)
    g = np.asarray(link.gpus_per_node, dtype=float)
    intra = intra_bytes / (link.intra_node_bandwidth_bytes_per_s * link.intra_link_efficiency)
    inter = inter_bytes / (link.inter_node_bandwidth_bytes_per_s / g * link.inter_link_efficiency)
    alpha = np.where(ep > ranks_per_node, link.inter_node_alpha_s, link.intra_node_alpha_s)
    return np.where(ep > 1, np.maximum(intra, inter) + alpha, 0.0)


def deepep_traffic_bytes(m: ModelSpec, tokens: Array, ep: Array, stride: Array, gpus_per_node: Array,
                         routing: str = "random"):
    """``(nvlink_bytes, nic_bytes)`` one rank sends in one DeepEP dispatch of ``tokens`` tokens (``h`` elements
    of :data:`DISPATCH_BYTES` each; module doc): through the NICs one copy per distinct *remote* node of a token
    (the destination node is any of the ``n`` nodes of the EP group alike, so ``(n-1)/n`` of the distinct nodes
    are remote); over NVLink one copy per distinct destination rank, less the ``1/r`` that land on the GPU that
    receives the RDMA copy or on the sender (``r`` EP ranks per node) — sent directly inside the node or forwarded
    from the RDMA landing GPU, which by symmetry every rank does as much as it receives."""
    r = ep_ranks_per_node(ep, stride, gpus_per_node)
    nodes = np.asarray(ep, dtype=float) / r
    token = np.asarray(tokens, dtype=float) * m.hidden_size * DISPATCH_BYTES
    remote = distinct_destinations(m, nodes, routing) * (nodes - 1.0) / nodes
    return token * distinct_destinations(m, ep, routing) * (1.0 - 1.0 / r), token * remote


def dispatch_bytes(m: ModelSpec, b: Array, s: Array, t: Array, imbalance: Array = 1.0):
    """Bytes one rank sends (and receives, on the busiest rank ``imbalance`` times) in one dispatch or combine:
    ``k`` copies of each of its ``b·s/t`` tokens, ``h`` elements of :data:`DISPATCH_BYTES`."""
    return imbalance * m.experts_per_token * np.asarray(b, dtype=float) * s / t * m.hidden_size * DISPATCH_BYTES


def moe_alltoall_time_s(m: ModelSpec, b: Array, s: Array, t: Array, ep: Array, stride: Array, link: Link,
                        imbalance: Array = 1.0, dispatch: MoEOptions = MoEOptions(), etp: Array = 1):
    """Dispatch + combine of one MoE layer's forward (backward: the same again), mean over the model's layers
    (dense layers have none), with ``dispatch``'s dispatcher and routing (module doc; the busiest rank moves
    ``imbalance`` times the balanced bytes). Not overlapped with compute (Megatron-LM's default; its 1F1B
    all-to-all overlap is an option, :func:`exposed_alltoall_s`). With expert-TP ``etp`` > 1 the EP group's members are ``etp`` apart
    (``stride``) and the tokens a rank receives are all-gathered over its ``etp`` consecutive expert-TP ranks
    before the experts and reduce-scattered after them (Megatron-Core ``MoEAlltoAllTokenDispatcher``:
    ``gather_from_sequence_parallel_region`` over the expert-TP group), ``k·T·h`` elements per rank each way."""
    if dispatch.dispatcher in ("deepep", "hybridep"):
        g = link.gpus_per_node
        domain = np.minimum(g, DEEPEP_NVLINK_PEERS) if dispatch.dispatcher == "deepep" else g
        intra, inter = deepep_traffic_bytes(m, np.asarray(b, dtype=float) * s / t, ep, stride, domain,
                                            dispatch.routing)
        one = exchange_time_s(imbalance * intra, imbalance * inter, ep, ep_ranks_per_node(ep, stride, domain), link)
    else:
        one = alltoall_time_s(dispatch_bytes(m, b, s, t, imbalance), ep, stride, link)
    if np.any(np.asarray(etp) > 1):
        gathered = dispatch_bytes(m, b, s, t, imbalance) * np.asarray(etp, dtype=float)
        one = one + np.where(np.asarray(etp) > 1, group_collective_time_s(gathered, "allgather", etp, 1, link), 0.0)
    return 2 * one * m.num_moe_layers / m.num_layers


def exposed_alltoall_s(alltoall_s: Array, forward_s: Array, backward_s: Array, contention: Array,
                       mlp_forward_s: Array = 0.0):
    """Exposed part of one pass's dispatch + combine ``alltoall_s`` (:func:`moe_alltoall_time_s`) when the
    all-to-alls of one micro-batch overlap the other's compute: Megatron-Core's ``--overlap-moe-expert-parallel-comm``
    runs the forward of micro-batch ``i + 1`` and the backward of micro-batch ``i`` of the same layer together in
    1F1B's steady state (``combined_1f1b``; Megatron-LM ``megatron/core/transformer/moe/README.md``, "EP A2A
    overlap"), the all-to-alls on a communication stream, the rest on the compute stream, in the fixed order of
    ``TransformerLayerSchedulePlan.run`` (Megatron-LM ``megatron/core/models/common/model_chunk_schedule_plan.py``)::

        comm stream:    combine_bwd      | dispatch_fwd -> dispatch_bwd      | combine_fwd
        compute stream: pre_dispatch_fwd | mlp_bwd -> mlp_bwd_dw -> mlp_fwd  | pre_dispatch_bwd

    each node waiting for its inputs (:func:`overlap_pair_time_s`): a communication hides only behind the compute
    it is paired with — the backward combine behind the forward's attention and router (``pre_dispatch``), the
    dispatches behind the experts' backward (``mlp_bwd`` and its weight gradients), the forward combine behind the
    attention's backward — not behind the whole ``(forward_s + backward_s)``. ``mlp_forward_s``: the routed and
    shared experts' forward (:func:`moe_mlp_time_s`; its backward is taken as twice it, data and weight gradients,
    as :func:`hetplan.estimate.compute.layer_time_s` takes every GEMM's); the rest of ``forward_s`` and
    ``backward_s`` is the ``pre_dispatch`` part. As any overlap (:func:`hetplan.estimate.comm.overlap_contention`)
    the all-to-alls take ``contention`` of the SMs while they run (:func:`alltoall_contention`), which slows the
    compute beside them inside the pair (:func:`overlap_pair_time_s`): exposed per pass ``max((pair − forward_s −
    backward_s) / 2, contention · alltoall_s)``. ``mlp_forward_s = 0`` puts all compute in ``pre_dispatch``. The
    warm-up forwards and cool-down backwards of the pipeline have no partner (:func:`unpaired_pass_share`, applied
    by the stage). Seconds; arrays broadcast."""
    a = np.asarray(alltoall_s, dtype=float)
    f, b = np.asarray(forward_s, dtype=float), np.asarray(backward_s, dtype=float)
    mlp = np.minimum(np.asarray(mlp_forward_s, dtype=float), f)
    pair = overlap_pair_time_s(a / 2, f - mlp, b - 2 * mlp, mlp, contention)
    return np.maximum((pair - f - b) / 2, contention * a)


def alltoall_contention(gpu: GPUSpec, dispatcher: str, nccl_ctas: int):
    """Share of the SMs the dispatch and combine kernels take from the compute they overlap
    (:func:`hetplan.estimate.comm.overlap_contention`): DeepEP's :data:`DEEPEP_NUM_SMS` for ``deepep``, NCCL's
    ``nccl_ctas`` thread blocks for the ``alltoall`` dispatcher and HybridEP (whose SM count is not examined)."""
    return overlap_contention(gpu, DEEPEP_NUM_SMS if dispatcher == "deepep" else nccl_ctas)


def unpaired_pass_share(in_flight: Array, num_microbatches: Array):
    """Share of a stage's forward passes (and as many backward passes) that run without a partner under the 1F1B
    all-to-all overlap, their dispatch and combine exposed whole. Megatron-Core's combined 1F1B pairs a forward
    with a backward only in the steady state: with interleaving the warm-up runs ``(pp - i - 1)·2 + (v - 1)·pp + 1``
    model-chunk forwards alone on stage ``i`` — one more than the plain interleaved schedule ("we schedule one
    extra micro-batch forward step before the 1f1b stages", ``get_pp_rank_microbatches``, Megatron-LM
    ``megatron/core/pipeline_parallel/schedules.py``) — and the cool-down as many backwards; without a pipeline
    the first forward and the last backward run alone (``combined_1f1b_schedule_for_no_pipelining``,
    ``pipeline_parallel/combined_1f1b.py``). Over the ``m·v`` chunk passes that is the stage's in-flight
    micro-batches over ``m`` (:func:`hetplan.estimate.estimator.in_flight_microbatches`: ``min(warm-up, m·v)/v``;
    ``min(pp - i, m)`` without interleaving, 1 for one stage): ``min(1, in_flight / m)``. 0 where ``m`` is not
    given. Arrays broadcast."""
    if num_microbatches is None:
        return 0.0
    m = np.maximum(np.asarray(num_microbatches, dtype=float), 1.0)
    return np.minimum(1.0, np.asarray(in_flight, dtype=float) / m)


def overlap_pair_time_s(one_s: Array, attention_forward_s: Array, attention_backward_s: Array, mlp_forward_s: Array,
                        contention: Array = 0.0):
    """Time of one forward and one backward of a MoE layer run together as ``TransformerLayerSchedulePlan.run``
    orders them (:func:`exposed_alltoall_s`): two streams, each running its nodes in order, each node starting
    when its stream is free and its inputs are ready (each node waits on and records its micro-batch's CUDA event,
    ``ScheduleNode.stream_acquire_context``, Megatron-LM ``megatron/core/pipeline_parallel/utils.py``; the
    experts' delayed weight gradients ``mlp_bwd_dw`` record none, so the backward dispatch waits only for
    ``mlp_bwd``). ``one_s``: one dispatch or combine; ``attention_*``: the ``pre_dispatch`` compute;
    ``mlp_forward_s``: the experts' forward (backward: ``mlp_bwd`` and ``mlp_bwd_dw`` as long each).

    ``contention``: the share of the SMs the dispatch and combine kernels hold while they run
    (:func:`alltoall_contention`). Compute beside them runs on the rest, so each compute node is longer by
    ``contention`` times the part of it that the communication paired with it in the schedule covers
    (:func:`hetplan.estimate.comm.overlap_contention`'s ``w + ρ·c`` for ``c ≤ w``, ``w + ρ·w`` when the
    communication outlasts it): ``pre_dispatch_fwd`` beside the backward combine, the three expert nodes beside
    the two dispatches, ``pre_dispatch_bwd`` beside the forward combine. Where the pair is bound by its
    communication chain (dispatch → experts → combine), the slowed compute on that chain lengthens the pair.
    Seconds; arrays broadcast."""
    d = np.asarray(one_s, dtype=float)
    af, ab, mf = (np.asarray(x, dtype=float) for x in (attention_forward_s, attention_backward_s, mlp_forward_s))
    rho = np.asarray(contention, dtype=float)
    af, ab = af + rho * np.minimum(af, d), ab + rho * np.minimum(ab, d)
    mf = mf + rho * np.minimum(mf, 2.0 * d / 3.0)
    combine_bwd = d                                   # comm, first
    pre_fwd = af                                      # compute, first
    mlp_bwd = np.maximum(pre_fwd, combine_bwd) + mf   # needs the backward combine
    dispatch_fwd = np.maximum(combine_bwd, pre_fwd) + d
    mlp_dw = mlp_bwd + mf
    dispatch_bwd = np.maximum(dispatch_fwd, mlp_bwd) + d
    mlp_fwd = np.maximum(mlp_dw, dispatch_fwd) + mf   # needs the forward dispatch
    combine_fwd = np.maximum(dispatch_bwd, mlp_fwd) + d
    pre_bwd = np.maximum(mlp_fwd, dispatch_bwd) + ab  # needs the backward dispatch
    return np.maximum(combine_fwd, pre_bwd)


def expert_parameters(m: ModelSpec, num_layers: Array):
    """Routed-expert parameters of ``num_layers`` layers (the mean per layer: :func:`counts.layer_expert_parameters`)."""
    return np.asarray(num_layers) * counts.layer_expert_parameters(m)


def parameters_per_gpu(stage_parameters: Array, expert_params: Array, t: Array, ep: Array, etp: Array = 1):
    """Parameters one GPU holds: the non-expert part split over TP, the experts over ``ep·etp``; returns
    ``(dense, expert)``."""
    return (stage_parameters - expert_params) / t, expert_params / (np.asarray(ep) * etp)


def linear_gemm_shapes(m: ModelSpec, b: Array, s: Array, t: Array, ep: Array = 1, imbalance: Array = 1.0,
                       etp: Array = 1, projections: str = compute.FUSED):
    """The linear GEMMs of one layer on one rank, forward, mean over the model's layers (what FP8 runs in FP8,
    :mod:`hetplan.estimate.fp8`): ``[(M, N, K, batch), ...]`` — the attention projections (MLA's or the standard
    ones, QKV fused or separate as the stack's ``projections`` says), the dense MLP and the routed (unpadded rows)
    and shared experts weighted by the share of dense and MoE layers; the router is left out (it stays bf16). The
    shapes of :func:`layer_gemm_times_s`."""
    T = np.asarray(b, dtype=float) * s
    attn = mla_gemms(m, b, s, t)[0] if m.is_mla else [
        (M, N, K, 1.0) for M, N, K in compute.attention_linear_shapes(m, T, t, projections)]
    dense = [(M, N, K, 1.0) for M, N, K in compute.mlp_linear_shapes(m, T, m.ffn_hidden_size, t, projections)]
    if not m.is_moe:
        return attn + dense
    w_dense = (m.num_layers - m.num_moe_layers) / m.num_layers
    experts = [(M, N, K, n * (1.0 - w_dense)) for M, N, K, n, _ in moe_mlp_gemms(m, b, s, t, ep, etp, imbalance)[1:]]
    return attn + [(M, N, K, n * w_dense) for M, N, K, n in dense] + experts


def layer_gemm_times_s(m: ModelSpec, gpu: GPUSpec, dtype: str, b: Array, s: Array, t: Array, ep: Array = 1,
                       etp: Array = 1, imbalance: Array = 1.0, framework: str = "megatron",
                       projections: str = compute.FUSED):
    """``(linear_s, core_s)`` forward GEMM time of one layer (mean over the model's layers) of a MoE and/or MLA
    model on one rank, as :func:`hetplan.estimate.compute.layer_gemm_times_s` gives it for dense layers.

    Attention: MLA's GEMMs (:func:`mla_gemms`) or the standard ones. MLP: dense layers as a TP-split MLP; MoE
    layers the router, the grouped experts on the busiest rank — each expert's rows padded to the row tile
    (:func:`grouped_gemm_row_efficiency`), the GEMM efficiency taken on all local experts' rows together (one
    grouped kernel fills the GPU with the tiles of every expert), the weights of every local expert read — and
    the shared experts (:func:`moe_mlp_gemms`); ``framework`` picks the grouped GEMM's kernel
    (:func:`grouped_gemm_ceiling`). ``projections``: how the stack runs the standard attention's and the dense
    MLP's projections (:func:`hetplan.estimate.compute.layer_gemm_times_s`); the experts are left as they are."""
    if m.is_mla:
        lin_shapes, core_shapes = mla_gemms(m, b, s, t)
        attn = sum(compute.gemm_time_s(gpu, dtype, M, N, K, n) for M, N, K, n in lin_shapes)
        core = sum(compute.gemm_time_s(gpu, fp8.high_precision(dtype), M, N, K, n) for M, N, K, n in core_shapes)
    else:
        attn, core = compute.attention_gemm_times_s(m, gpu, dtype, b, s, t, projections)
    dense = compute.mlp_gemm_time_s(m, gpu, dtype, np.asarray(b, dtype=float) * s, m.ffn_hidden_size, t, projections)
    if not m.is_moe:
        return attn + dense, core
    n_moe = m.num_moe_layers
    moe_s = moe_mlp_time_s(m, gpu, dtype, b, s, t, ep, etp, imbalance, framework) * m.num_layers / n_moe
    return attn + ((m.num_layers - n_moe) * dense + n_moe * moe_s) / m.num_layers, core


#: Streams Transformer Engine's grouped GEMM spreads its per-expert cuBLAS GEMMs over
#: (``get_num_compute_streams``: ``static constexpr int num_compute_streams = 4``,
#: ``transformer_engine/common/util/multi_stream.cpp``; ``multi_stream_cublas_gemm`` issues GEMM ``i`` on stream
#: ``i % 4``, ``common/gemm/cublaslt_gemm.cpp``): at most 4 experts' GEMMs share the GPU at a time.
TE_COMPUTE_STREAMS = 4


def grouped_gemm_rows(rows: Array, groups: Array, framework: str = "megatron"):
    """Rows of the routed experts' GEMMs that run at once, the ``M`` of their shape efficiency
    (:func:`hetplan.estimate.compute.gemm_efficiency`, the one GEMM shape model): Megatron-Core's
    ``TEGroupedMLP`` runs one cuBLAS GEMM per local expert, :data:`TE_COMPUTE_STREAMS` at a time, so ``rows`` (one
    expert's padded rows) times ``min(groups, 4)``; PyTorch's ``torch._grouped_mm`` (``framework="fsdp"``:
    torchtitan, NeMo AutoModel) is one kernel over every local expert's tiles: ``rows · groups``. Arrays
    broadcast."""
    rows, groups = np.asarray(rows, dtype=float), np.asarray(groups, dtype=float)
    if framework == "fsdp":
        return rows * groups
    return rows * np.minimum(groups, TE_COMPUTE_STREAMS)


def moe_mlp_gemm_times_s(m: ModelSpec, gpu: GPUSpec, dtype: str, b: Array, s: Array, t: Array, ep: Array = 1,
                         etp: Array = 1, imbalance: Array = 1.0, framework: str = "megatron") -> list:
    """Forward time of each GEMM of :func:`moe_mlp_gemms` (router, the routed experts' two grouped GEMMs, the
    shared experts') in one MoE layer on one rank. The routed experts' grouped GEMM runs at
    :func:`grouped_gemm_ceiling` of ``framework``'s kernel, its shape efficiency on the rows that run at once
    (:func:`grouped_gemm_rows`)."""
    out = []
    for i, (M, N, K, groups, eff) in enumerate(moe_mlp_gemms(m, b, s, t, ep, etp, imbalance)):
        rows = M / eff  # padded rows per group
        d = fp8.high_precision(dtype) if i == 0 else dtype  # the router stays bf16 under FP8
        flops = 2.0 * groups * rows * N * K
        operand = fp8.OPERAND_BYTES if fp8.is_fp8(d) else compute.OPERAND_BYTES
        bytes_ = groups * (operand * (rows * K + K * N) + compute.OPERAND_BYTES * rows * N)
        e = compute.gemm_efficiency(gpu, grouped_gemm_rows(rows, groups, framework), N, K, d)
        if i in (1, 2):  # the routed experts' grouped GEMM
            e = e * grouped_gemm_ceiling(gpu, d, framework) / fp8.gemm_ceiling(gpu, d)
        out.append(np.maximum(flops / (gpu.peak_flops_per_s(d) * e), bytes_ / gpu.hbm_bandwidth_bytes_per_s))
    return out


def op_sac_recompute_s(m: ModelSpec, gpu: GPUSpec, dtype: str, b: Array, s: Array, t: Array,
                       sequence_parallel: Array = False, attention: str = "flash", extra_elementwise_bytes: Array = 0.0,
                       projections: str = compute.FUSED, ep: Array = 1, etp: Array = 1, imbalance: Array = 1.0,
                       framework: str = "fsdp"):
    """Backward recomputation of one layer (mean over the model's layers) under torchtitan's per-op selective
    activation checkpointing: a dense model's is :func:`hetplan.estimate.compute.op_sac_recompute_s`. MoE and MLA
    layers: every element-wise kernel (:func:`hetplan.estimate.compute.op_sac_elementwise_s`), half the time of
    their matmuls (attention projections, MLA's down- and up-projections, the router and the shared experts; every
    other one, whose shapes differ: half their time, stated), all of the routed experts' grouped GEMMs
    (:func:`moe_mlp_gemm_times_s`) and the token permutation (:func:`permute_time_s`): ``aten._grouped_mm`` is on
    no save list — not torchtitan's ops (pytorch/torchtitan@b5bcd76 ``_get_default_save_ops``, nor the per-model
    lists before #2357) nor PyTorch's compute-intensive ops (``torch/_functorch/partitioners.py``
    ``get_default_op_list`` at torch 2.13) — while the dispatch and combine all-to-alls are, so nothing is
    communicated again. ``ep``, ``etp``, ``imbalance``, ``framework``: the MoE layer's. Seconds; arrays
    broadcast."""
    if not (m.is_moe or m.is_mla):
        return compute.op_sac_recompute_s(m, gpu, dtype, b, s, t, sequence_parallel, attention,
                                          extra_elementwise_bytes, projections)
    if m.is_mla:
        attn = sum(compute.gemm_time_s(gpu, dtype, M, N, K, n) for M, N, K, n in mla_gemms(m, b, s, t)[0])
    else:
        attn = compute.attention_gemm_times_s(m, gpu, dtype, b, s, t, projections)[0]
    dense = compute.mlp_gemm_time_s(m, gpu, dtype, np.asarray(b, dtype=float) * s, m.ffn_hidden_size, t, projections)
    n_moe = m.num_moe_layers
    mlp = (m.num_layers - n_moe) * 0.5 * dense / m.num_layers
    if n_moe:
        router, up, down, *shared = moe_mlp_gemm_times_s(m, gpu, dtype, b, s, t, ep, etp, imbalance, framework)
        mlp = mlp + n_moe * (0.5 * (router + sum(shared)) + up + down) / m.num_layers \
            + permute_time_s(m, gpu, b, s, t, ep, etp, imbalance)
    return 0.5 * attn + mlp + compute.op_sac_elementwise_s(m, gpu, b, s, t, sequence_parallel, attention,
                                                           extra_elementwise_bytes)


def moe_mlp_time_s(m: ModelSpec, gpu: GPUSpec, dtype: str, b: Array, s: Array, t: Array, ep: Array = 1,
                   etp: Array = 1, imbalance: Array = 1.0, framework: str = "megatron"):
    """Forward GEMM time of the MoE MLPs (:func:`moe_mlp_gemm_times_s`) on one rank, mean over the model's layers
    (dense layers count 0); what ``--recompute-modules moe`` runs again."""
    return sum(moe_mlp_gemm_times_s(m, gpu, dtype, b, s, t, ep, etp, imbalance, framework)) \
        * m.num_moe_layers / m.num_layers
