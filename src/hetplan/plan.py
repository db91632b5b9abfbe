"""The job, the GPU inventory and the plan schema (pydantic), shared by the estimator, the searches and the runtime.

One schema serves homogeneous and heterogeneous plans: a :class:`Plan` is a list of pipeline :class:`Stage` s in
order, each on one GPU type with its own TP and DP degree and its own number of layers; the first stage also holds
the embedding, the last stage the final norm and output head.

Glossary (DESIGN.md): TP/PP/DP degrees, micro-batch size (``mbs``, sequences), global batch (``global_batch``,
sequences per iteration), number of micro-batches per pipeline (``global_batch / (dp * mbs)``), ZeRO stage,
activation recomputation ``none`` / ``selective`` / ``full``, sequence parallelism.
"""

from __future__ import annotations

import math
from fractions import Fraction
from functools import lru_cache
from typing import Annotated, Literal

import numpy as np

from pydantic import BeforeValidator, ConfigDict, Field, ValidationError, field_validator, model_validator

from hetplan.degrees import ParallelLayout  # noqa: F401  (re-exported: the plan schema's layout)
from hetplan.errors import HetplanError
from hetplan.hardware.stacks import FRAMEWORK_STACK, StackSpec, default_stack, resolve_stack
from hetplan.inputs import UserInput, bounded

def _no_text_bool(value):
    """Refuse text where a boolean is meant: pydantic's lax mode reads "yes", "on", "1" as true, so a typo or a
    quoted value in a job file or plan would silently switch an option (issue 27). TOML and JSON have real
    booleans; Python and numpy booleans and 0/1 pass."""
    if isinstance(value, (str, bytes)):
        raise ValueError("must be a boolean, not text; fix: write true or false without quotes")
    return value


#: A boolean that text cannot set (:func:`_no_text_bool`).
Bool = Annotated[bool, BeforeValidator(_no_text_bool)]

Recompute = Literal["none", "selective", "full"]
Schedule = Literal["1f1b", "gpipe"]

#: Default inter-node bandwidth per node (bytes/s, unidirectional): 200 Gb/s, one HDR InfiniBand NIC.
DEFAULT_INTER_NODE_BANDWIDTH_BYTES_PER_S = 25e9


#: Stacks that train multi-token prediction (``Job.mtp_layers``), from the month Megatron-Core's
#: ``megatron/core/transformer/multi_token_prediction.py`` landed (ADLR/megatron-lm!2628, 2025-03-22, first in tag
#: core_v0.12.0); NeMo runs Megatron-Core.
MTP_STACKS = ("megatron-lm", "nemo")
MTP_RELEASED = "2025-03"


class Job(UserInput):
    """What to train.

    Attributes:
        model: preset name (``hetplan catalog models``) or path to a Hugging Face ``config.json``.
        seq_len: tokens per sequence.
        global_batch: sequences per iteration (all data-parallel replicas together).
        train_tokens: total training tokens (the job length); or give ``train_iterations``.
        train_iterations: number of iterations (used if ``train_tokens`` is not given).
        dtype: compute dtype of weights and activations: ``bf16``, ``fp16``, or ``fp8`` (FP8 training as
            Transformer Engine / torchao float8 run it: the linear layers' GEMMs in FP8, everything else in bf16,
            bf16 weights with fp32 master weights and optimizer states; :mod:`hetplan.estimate.fp8`).
        fp8_recipe: the FP8 scaling recipe under ``dtype = "fp8"``. Transformer Engine's (megatron, deepspeed):
            ``delayed`` (scales from an amax history; Megatron-Core's default on Hopper) or ``current`` (TE
            ``Float8CurrentScaling``, Megatron-Core ``--fp8-recipe tensorwise``, NeMo / Megatron-Bridge "FP8-CS":
            an amax pass over each tensor before its cast, :data:`hetplan.estimate.fp8.CAST_BYTES_PER_ELEMENT`).
            torchao float8's (fsdp, torchtitan's ``recipe_name``): ``tensorwise`` (with the FSDP2 / TP float8
            all-gathers), ``rowwise`` or ``rowwise_with_gw_hp`` (bf16 communication; the latter's weight-gradient
            GEMMs in bf16). ``mxfp8`` (Blackwell only): TE's ``MXFP8BlockScaling`` under megatron / deepspeed,
            torchao's ``MXFP8Linear`` under fsdp (torchtitan's ``MXFP8LinearConverter``; bf16 communication).
            None: the stack's default (:func:`hetplan.estimate.fp8.recipe`: MXFP8 on Blackwell under TE; the
            torchtitan release's ``fp8_recipe``, rowwise for 0.3.0).
        optimizer: ``adam`` (mixed precision: fp32 master weights, fp32 momentum and variance; Megatron-LM's
            fp32 gradient accumulation buffer).
        attention: ``flash`` (the default: FlashAttention, Dao et al. 2022, causal: no s x s tensor stored, scores
            recomputed in backward, about half the s x s work; what Megatron-Core (Transformer Engine fused
            attention), torchtitan and NeMo run) or ``standard`` (the s x s attention scores are materialised and
            stored for backward: Megatron-LM without ``--use-flash-attn``, what Korthikanti et al. 2023 count) or
            ``eager`` (materialised like ``standard``, but every element-wise step on the scores is its own kernel:
            Hugging Face models' ``attn_implementation="eager"``, :func:`hetplan.estimate.compute.eager_score_bytes`).
            With ``flash``, ``selective`` recomputation stores and
            computes what ``none`` does (Megatron-LM skips the core-attention checkpoint under flash).
        framework: the training framework whose memory behaviour the estimate assumes. ``megatron``: states as in
            Megatron-LM's theoretical memory (fp32 main-gradient buffer used directly by the optimizer).
            ``deepspeed``: DeepSpeed's FP16_Optimizer also keeps the 16-bit ``.grad`` tensors and makes fp32
            copies of the gradients during the optimizer step (docs/estimator.md, Memory). ``fsdp``: PyTorch FSDP2
            / FSDP1 — parameters, gradients and optimizer states sharded (``Plan.zero`` 3: FSDP; 1 / 2: not
            resharded after forward, torchtitan's ``fsdp_reshard_after_forward = "never"``; 0: DDP, torchtitan's
            ``data_parallel_replicate_degree``, FSDP2 over one-rank shards, the whole states on every rank:
            :func:`hetplan.estimate.memory.fsdp_shard_ranks`; Megatron-FSDP is ``megatron`` with ``Plan.zero`` 2 / 3), one all-gather per layer in forward and backward and one reduce-scatter per layer, every
            micro-batch (:func:`hetplan.estimate.stage.zero3_exposed_s`); see ``Plan.fsdp_shard``,
            ``Plan.reshard_after_forward``, ``Plan.grad_reduce_dtype``.
        torch_compile: under ``framework = "fsdp"``, the transformer blocks and the loss run under
            ``torch.compile`` (True, the default: Inductor fuses the element-wise ops, as the estimate's
            element-wise term assumes; torchtitan ``[compile] enable``), or in eager PyTorch (False: every
            element-wise op its own kernel, :mod:`hetplan.estimate.elementwise`). Megatron-LM and DeepSpeed run
            fused kernels: False is refused for them.
        attention_kernel: the fused attention kernel under ``attention = "flash"``: ``fa2`` (FlashAttention-2),
            ``fa3`` (FlashAttention-3, Hopper), ``cudnn`` (cuDNN fused attention) or ``triton`` (llm-foundry's
            Triton FlashAttention of 2023), each at its own measured rate
            per GPU type (``attention_kernels`` in the GPU catalog). Default: what the framework runs on the
            pool's GPU (:data:`hetplan.hardware.catalog.DEFAULT_ATTENTION_KERNEL`: cuDNN on Hopper and Blackwell
            for Megatron-Core / Transformer Engine and for PyTorch SDPA as torchtitan and PyTorch >= 2.11 order
            it, FlashAttention-2 otherwise); set ``fa2`` for PyTorch SDPA before those (its flash backend).
        async_tp: PyTorch's async tensor parallelism under ``framework = "fsdp"`` with ``torch_compile`` (torchtitan
            ``[parallelism] enable_async_tensor_parallel``): Inductor's micro-pipeline pass fuses every TP all-gather
            and reduce-scatter of sequence parallelism with the matmul it feeds or drains, pulling peers' shards over
            NVLink with the copy engines while the GEMM works on chunks already there
            (:func:`hetplan.estimate.compute.async_tp_exposed_s`). Default False: the collectives exposed, with
            DTensor's layout copies.
        moe_load_imbalance: tokens the busiest expert-parallel rank receives relative to perfect balance (MoE
            models; :data:`hetplan.estimate.moe.DEFAULT_LOAD_IMBALANCE` = 1.25, Switch Transformer's capacity
            factor; 1 for benchmarks that force balanced routing), at most what routing can send one rank
            (:func:`hetplan.estimate.moe.bounded_imbalance`: 1 at ``ep = 1``).
        moe_dispatcher, moe_routing: how tokens reach their experts (:class:`hetplan.estimate.moe.MoEOptions`):
            ``alltoall`` (Megatron-Core's default dispatcher: every routed copy sent), ``deepep`` (DeepEP: one
            copy per destination node and rank, NVLink within 8-GPU hosts) or ``hybridep`` (the same over the
            whole NVLink domain, e.g. GB200 NVL72); routing ``random`` (learned or forced-balance
            routers) or ``contiguous`` (NeMo AutoModel's fake balanced gate: a token's experts are neighbours).
        moe_recompute: recompute every MoE layer's MLP in backward (Megatron-Core ``--recompute-modules moe``).
        recompute_modules: Megatron-Core's output-discarding recomputation of element-wise modules
            (``--recompute-granularity selective --recompute-modules``): ``layernorm`` (the two norm outputs of every
            layer), ``moe_act`` (the expert activation's output), ``mla_up_proj`` (MLA's up-projections and RoPE:
            the queries, keys and values, rebuilt from the latents before the attention core's backward);
            ``moe`` is :attr:`moe_recompute`.
        offload_modules: Megatron-Core's fine-grained activation offloading (``--fine-grained-activation-offloading
            --offload-modules``): the inputs of ``expert_fc1`` and / or ``moe_act`` go to host memory after their
            forward and come back before their backward, over the GPU's host link behind the layer's compute
            (:func:`hetplan.estimate.memory.module_activation_bytes`).
        moe_a2a_overlap: the dispatch and combine all-to-alls of one micro-batch run behind the other
            micro-batch's compute in 1F1B's paired forward and backward (Megatron-Core
            ``--overlap-moe-expert-parallel-comm``, :class:`hetplan.estimate.moe.MoEOptions`).
        moe_capacity_factor, moe_pad_to_capacity: token dropping (Megatron-Core ``--moe-expert-capacity-factor``,
            ``--moe-pad-expert-input-to-capacity``; NeMo's ``MegatronTokenDropCallback``: 1.0 and padded): each
            expert takes at most ``capacity_factor`` times its even share of the routed tokens, the rest dropped,
            and with padding exactly that many rows (:func:`hetplan.estimate.moe.capacity_imbalance`). None:
            dropless (Megatron-Core's default). Runs with the ``alltoall`` dispatcher only.
        mtp_layers: multi-token-prediction modules trained after the last layer (Megatron-Core
            ``--mtp-num-layers``, ``megatron/core/transformer/multi_token_prediction.py``, core_v0.12.0; DeepSeek-V3,
            arXiv 2412.19437 Sec. 2.2; NeMo's DeepSeek-V3 recipe trains one): on the last pipeline stage, per
            module and micro-batch, one more transformer layer, the projection of ``[norm(h); norm(embedding)]``
            (``2h -> h``), the embedding of the shifted tokens and the shared output head and loss
            (:func:`hetplan.estimate.stage.stage_costs`). Megatron only.
        cp_load_balance: context parallelism splits each sequence into ``2·cp`` chunks so that every rank has the
            same causal attention work (True: Megatron-Core, Llama 3, PyTorch's ``context_parallel`` with load
            balancing), or into ``cp`` contiguous chunks (False: the last rank attends to every earlier block,
            :func:`hetplan.estimate.context.attention_blocks`).
        cp_kv_exchange: how context parallelism exchanges K/V: ``ring`` (Megatron-Core p2p, overlapped with
            attention) or ``allgather`` (Llama 3, torchtitan) (:mod:`hetplan.estimate.context`); default ``ring``,
            ``allgather`` under ``fsdp`` (what torchtitan launches, :meth:`_cp_exchange_default`).
        stack: the software stack and release that runs the job (:mod:`hetplan.hardware.stacks`, ``hetplan
            catalog stacks``): ``NAME``, ``NAME@VERSION`` or ``NAME@YYYY-MM`` (the release in force that month),
            stored as ``NAME@VERSION``. It sets the defaults of ``framework``, ``attention`` and, under ``fsdp``,
            ``torch_compile`` (a field given that contradicts it is refused), the attention kernel on each GPU
            family and which plan options exist (:func:`hetplan.plan_rules.check_plan`). None: the framework's
            default stack, what ``hetplan export`` writes (:func:`stack_spec`).
    """

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    model: str
    seq_len: int = bounded(2**20, "1,048,576 tokens is longer than any model's context", gt=0)
    global_batch: int = bounded(65536, "65,536 sequences is LAMB's record batch (You et al. 2020) and 32x Llama 3 "
                                "405B's 2,048", gt=0)
    train_tokens: float | None = bounded(1e15, "1e15 tokens is 64x Llama 3's 15.6e12", default=None, gt=0)
    train_iterations: int | None = bounded(10**9, "a billion iterations is 1,000x any published run", default=None,
                                           gt=0)
    dtype: Literal["bf16", "fp16", "fp8"] = "bf16"
    fp8_recipe: Literal["delayed", "current", "tensorwise", "rowwise", "rowwise_with_gw_hp", "mxfp8"] | None = None
    optimizer: Literal["adam"] = "adam"
    attention: Literal["standard", "flash", "eager"] = "flash"
    framework: Literal["megatron", "deepspeed", "fsdp"] = "megatron"
    moe_load_imbalance: float = Field(default=1.25, ge=1.0, le=8.0, allow_inf_nan=False)
    moe_dispatcher: Literal["alltoall", "deepep", "hybridep"] = "alltoall"
    moe_routing: Literal["random", "contiguous"] = "random"
    moe_recompute: Bool = False
    recompute_modules: list[Literal["layernorm", "moe_act", "mla_up_proj"]] = Field(default_factory=list)
    offload_modules: list[Literal["expert_fc1", "moe_act"]] = Field(default_factory=list)
    moe_a2a_overlap: Bool = False
    moe_capacity_factor: float | None = Field(default=None, gt=0.0, le=8.0, allow_inf_nan=False)
    moe_pad_to_capacity: Bool = False
    mtp_layers: int = bounded(8, "8 prediction depths is 8x DeepSeek-V3's one", default=0, ge=0)
    cp_kv_exchange: Literal["ring", "allgather"] = "ring"
    cp_load_balance: Bool = True
    torch_compile: Bool = True
    attention_kernel: Literal["fa2", "fa3", "cudnn", "triton"] | None = None
    async_tp: Bool = False
    stack: str | None = None

    @field_validator("framework", mode="before")
    @classmethod
    def _framework_family(cls, value):
        """The family in any case (``DeepSpeed``); a stack's name where the family belongs (``torchtitan``,
        ``Megatron-LM``) is refused with the family it runs and the ``stack`` that names it."""
        if not isinstance(value, str):
            return value
        if value.strip().lower() in FRAMEWORK_STACK:  # the families (megatron, deepspeed, fsdp)
            return value.strip().lower()
        try:
            st = resolve_stack(value)
        except HetplanError:
            return value
        raise ValueError(f"{value!r} is a software stack, not a framework family; fix: write stack = "
                         f"{st.name!r} (it runs framework {st.framework!r}; --stack {st.name} on the command "
                         f"line), or framework = {st.framework!r} for that family's default stack")

    @model_validator(mode="before")
    @classmethod
    def _cp_exchange_default(cls, data):
        """``cp_kv_exchange`` where not given: ``allgather`` under ``fsdp``, what torchtitan launches — 0.3.0
        all-gathers K/V only, 0.2's ``context_parallel_rotate_method`` defaults to ``allgather``
        (``torchtitan/config/job_config.py``), and PyTorch's ``context_parallel`` behind NeMo AutoModel defaults to
        it too (``torch/distributed/tensor/experimental/_context_parallel/_attention.py`` ``rotate_method =
        _RotateMethod.ALL_GATHER``, torch 2.13) — else ``ring`` (Megatron-Core's ``--cp-comm-type p2p``). Defined
        before :meth:`_stack_defaults`, so it runs after it (pydantic runs "before" validators last-defined first)
        and sees the framework a named stack fills in."""
        if not isinstance(data, dict) or "cp_kv_exchange" in data:
            return data
        framework = data.get("framework")
        if isinstance(framework, str) and framework.strip().lower() == "fsdp":
            return {**data, "cp_kv_exchange": "allgather"}
        return data

    @model_validator(mode="before")
    @classmethod
    def _stack_defaults(cls, data):
        """Fill ``framework``, ``attention`` and ``torch_compile`` from the named stack where not given, and
        refuse a given one that the stack contradicts (an unknown stack is left to :meth:`_resolve_stack`)."""
        if not isinstance(data, dict) or not isinstance(data.get("stack"), str):
            return data
        try:
            st = resolve_stack(data["stack"])
        except HetplanError:
            return data
        out = dict(data)
        given = out.get("framework")
        if given is not None and given != st.framework:
            raise ValueError(f"stack {st.id} runs framework {st.framework!r}, not {given!r}: remove framework "
                             f"or pick a stack of framework {given!r} (hetplan catalog stacks)")
        out["framework"] = st.framework
        if out.get("attention") == "flash" and st.attention != "flash":
            raise ValueError(f"stack {st.id} has no fused (flash) attention kernel; it runs {st.attention!r}: "
                             "remove attention or pick a later release")
        out.setdefault("attention", st.attention)
        if st.framework == "fsdp":
            out.setdefault("torch_compile", st.launch == "compiled")
        return out

    @field_validator("stack")
    @classmethod
    def _resolve_stack(cls, value: str | None) -> str | None:
        if value is None:
            return None
        try:
            return resolve_stack(value).id
        except HetplanError as exc:
            raise ValueError(f"{exc.message}; fix: {exc.fix}") from None

    def stack_spec(self) -> StackSpec:
        """The stack that runs the job: :attr:`stack` resolved, else the framework's default
        (:func:`hetplan.hardware.stacks.default_stack`, what ``hetplan export`` writes)."""
        return resolve_stack(self.stack) if self.stack else default_stack(self.framework)


    @field_validator("train_tokens")
    @classmethod
    def _at_least_one_iteration(cls, value, info):
        """A job shorter than one iteration would plan 0 iterations (1e-300 tokens: $0, 0 s)."""
        batch = info.data.get("global_batch", 0) * info.data.get("seq_len", 0)
        if value is not None and batch and value < batch:
            raise ValueError(f"{value:g} tokens is less than one iteration's {batch:,} (global_batch x seq_len); "
                             "fix: give at least that, or train_iterations")
        return value

    @field_validator("train_iterations")
    @classmethod
    def _not_both_lengths(cls, value, info):
        """Both lengths given: one would be dropped without a word (train_tokens wins in :meth:`iterations`)."""
        if value is not None and info.data.get("train_tokens") is not None:
            raise ValueError("give train_tokens or train_iterations, not both; fix: remove one")
        return value

    @model_validator(mode="after")
    def _check_compile(self) -> "Job":
        if not self.torch_compile and self.framework != "fsdp":
            raise ValueError(f"torch_compile = false applies to framework 'fsdp' (torchtitan, eager PyTorch); "
                             f"{self.framework} runs fused kernels: remove torch_compile or set framework = 'fsdp'")
        if self.async_tp and (self.framework != "fsdp" or not self.torch_compile):
            raise ValueError("async_tp is PyTorch's async TP, an Inductor pass (torchtitan "
                             "enable_async_tensor_parallel): it needs framework = 'fsdp' and torch_compile = true; "
                             "remove async_tp, or for Megatron set the plan's tp_comm_overlap")
        if (self.recompute_modules or self.offload_modules) and self.framework != "megatron":
            raise ValueError(f"recompute_modules and offload_modules are Megatron-Core options; framework "
                             f"{self.framework!r} has neither: remove them or set framework = 'megatron'")
        if self.moe_pad_to_capacity and self.moe_capacity_factor is None:
            raise ValueError("moe_pad_to_capacity pads each expert's input to its capacity: it needs "
                             "moe_capacity_factor (Megatron-Core: 'moe_expert_capacity_factor must be set to use "
                             "moe_pad_expert_input_to_capacity'); fix: set moe_capacity_factor (e.g. 1.0) or remove "
                             "moe_pad_to_capacity")
        if self.moe_capacity_factor is not None and self.framework != "megatron":
            raise ValueError(f"token dropping (moe_capacity_factor) is Megatron-Core's; framework "
                             f"{self.framework!r} routes dropless (torchtitan's router; DeepSpeed's pipeline engine "
                             "has no experts): remove moe_capacity_factor or set framework = 'megatron'")
        if self.moe_capacity_factor is not None and self.moe_dispatcher != "alltoall":
            raise ValueError(f"token dropping (moe_capacity_factor) runs with the alltoall dispatcher only, not "
                             f"{self.moe_dispatcher!r} (NeMo's MegatronTokenDropCallback asserts the alltoall "
                             "dispatcher; Megatron-Core refuses padding to capacity under DeepEP); fix: set "
                             "moe_dispatcher = 'alltoall' or remove moe_capacity_factor")
        if self.mtp_layers and self.framework != "megatron":
            raise ValueError(f"multi-token prediction (mtp_layers) is priced and exported as Megatron-Core runs it "
                             f"(--mtp-num-layers); framework {self.framework!r} has no launch for it here (torchtitan's "
                             "DeepSeek-V3 MTP, pytorch/torchtitan#3392 of 2026-08, is a model-registry argument its "
                             "export does not write; DeepSpeed's pipeline engine has none): remove mtp_layers or set "
                             "framework = 'megatron'")
        st = self.stack_spec() if self.mtp_layers else None
        if st is not None and (st.name not in MTP_STACKS or st.released < MTP_RELEASED):
            raise ValueError(f"multi-token prediction (mtp_layers) arrived in Megatron-Core core_v0.12.0 "
                             f"({MTP_RELEASED}); stack {st.name}@{st.version} ({st.released}) has none: remove "
                             "mtp_layers or pick a later megatron-lm or nemo release")
        if self.fp8_recipe is not None and self.dtype != "fp8":
            raise ValueError(f"fp8_recipe is an FP8 scaling recipe: it needs dtype = 'fp8' (got {self.dtype!r}); "
                             "fix: remove fp8_recipe (--fp8-recipe) or set dtype = 'fp8' (--dtype fp8)")
        torchao = self.fp8_recipe in ("tensorwise", "rowwise", "rowwise_with_gw_hp")
        if self.fp8_recipe not in (None, "mxfp8") and torchao != (self.framework == "fsdp"):  # mxfp8: both
            raise ValueError(f"fp8_recipe {self.fp8_recipe!r} is " + (
                "torchao float8's (torchtitan): it needs framework 'fsdp'" if torchao else
                "Transformer Engine's: it needs framework 'megatron' or 'deepspeed'") +
                f" (got {self.framework!r}); fix: use " + ("delayed or current" if torchao else
                                                             "tensorwise, rowwise or rowwise_with_gw_hp") +
                " for this framework, or remove fp8_recipe")
        if self.attention_kernel is not None and self.attention != "flash":
            raise ValueError(f"attention_kernel applies to attention = 'flash' (a fused kernel); attention = "
                             f"{self.attention!r} materialises the scores: remove attention_kernel or set attention = 'flash'")
        return self

    def iterations(self) -> float:
        """Iterations in the whole job: ``train_tokens / (global_batch * seq_len)`` or ``train_iterations``; 1 if neither."""
        if self.train_tokens is not None:
            return self.train_tokens / (self.global_batch * self.seq_len)
        if self.train_iterations is not None:
            return float(self.train_iterations)
        return 1.0

    def launch_iterations(self) -> int:
        """Iterations a launch of this job runs (``hetplan export``): :meth:`iterations` rounded up, so that it
        trains at least ``train_tokens`` (exact: the tokens as a fraction, no float error rounds 1000 up to 1001).
        Rounding down launched 238,418 iterations for Llama 2's 1e12 tokens at 4,194,304 per iteration, 2.4 M tokens
        short of the job, while ``plan`` printed 238,419."""
        if self.train_tokens is None:
            return self.train_iterations or 1
        return math.ceil(Fraction(self.train_tokens) / (self.global_batch * self.seq_len))


class GPUPool(UserInput):
    """GPUs of one type that the user can rent.

    Attributes:
        gpu: catalog name.
        count: how many are available.
        node: node preset the GPUs sit in (``hetplan catalog nodes``; :mod:`hetplan.hardware.catalog`): it gives
            ``gpus_per_node``, ``inter_node_bandwidth_bytes_per_s`` (NICs x rate), ``network`` and the intra-node
            link; fields given here override it. Default: the GPU type's reference node (DGX A100 / H100 / H200
            / B200, GB200 NVL72), else the generic defaults below.
        gpus_per_node: GPUs in one server or NVLink domain (they share the intra-node link and the node's NICs).
            Default 8.
        gpus_per_host: GPUs of one host where a node (an NVLink domain) spans several: GB200 / GB300 NVL72 racks of
            18 compute trays of 4 GPUs. A launch starts the same number of processes on every host
            (:attr:`launch_gpus`, :func:`fills_whole_nodes`). Default: the node's, else ``gpus_per_node``.
        intra_node_bandwidth_bytes_per_s: unidirectional GPU-GPU bandwidth inside a node (default: the catalog link).
        inter_node_bandwidth_bytes_per_s: unidirectional network bandwidth of one node (all its NICs). Default:
            the node's; 25 GB/s (one 200 Gb/s NIC) for GPU types without a reference node.
        network: what connects the nodes: ``infiniband``, ``roce`` or ``efa`` (RDMA with GPUDirect; NCCL's IB
            transport or AWS's OFI plugin, the default) or ``ethernet`` (no RDMA: NCCL over TCP sockets, ≈ 2/3 of
            RDMA's usable bandwidth and 5× its per-step latency; :data:`hetplan.estimate.comm.NETWORKS`).
        price_usd_per_hour: $ per GPU-hour (default: the catalog price).
        kernel_overhead_s: host time per GPU kernel launch on these machines (seconds; CPU, driver and framework
            cost), a property of the host, not of the model. Default: the GPU type's catalog value, calibrated on
            the host named in its ``calibration_source`` (A100: DGX A100, 44.3 µs). Set it for a slower or faster
            host, e.g. 73.8 µs for AWS p4d as fitted on FASOP's profiles (docs/estimator.md, Calibration).
        attention_efficiency: ``(forward, backward)`` fraction of the dense peak the fused attention kernel of these
            machines' software reaches, where it was measured. Default: the GPU catalog's rate of the kernel the
            job runs (``Job.attention_kernel``; e.g. on H100 cuDNN 0.61 / 0.52, FlashAttention-2 0.37 / 0.32, Shah
            et al. 2024, FlashAttention-3, Fig. 5 and 7).
    """

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    gpu: str
    count: int = bounded(10**6, "a million GPUs is 5x the largest cluster built", gt=0)
    node: str | None = None
    gpus_per_node: int = bounded(576, "576 GPUs is the largest NVLink domain sold (GB200 NVL576)", default=8, gt=0)
    gpus_per_host: int | None = Field(default=None, gt=0)
    intra_node_bandwidth_bytes_per_s: float | None = bounded(1e13, "from 0.1 GB/s to 10 TB/s (5x NVLink 5's 1.8 "
                                                             "TB/s)", units=("bytes/s", "GB/s", 1e-9),
                                                             default=None, ge=1e8)
    inter_node_bandwidth_bytes_per_s: float = bounded(1e13, "from 1 Gb/s (slower is no training network) to 80 Tb/s "
                                                      "(10x the NICs of any node)", units=("bytes/s", "Gb/s", 8e-9),
                                                      default=DEFAULT_INTER_NODE_BANDWIDTH_BYTES_PER_S, ge=1.25e8)
    network: Literal["infiniband", "roce", "efa", "ethernet"] = "infiniband"
    price_usd_per_hour: float | None = bounded(1000.0, "no GPU rents for $1,000 an hour", default=None, ge=0)
    kernel_overhead_s: float | None = Field(default=None, ge=0, le=0.01)
    attention_efficiency: tuple[Annotated[float, Field(gt=0, le=1)], Annotated[float, Field(gt=0, le=1)]] | None = None

    @model_validator(mode="before")
    @classmethod
    def _node_defaults(cls, data):
        """Fill the fields the pool does not give from its node (named, or the GPU type's reference node)."""
        if not isinstance(data, dict) or "gpu" not in data:
            return data
        from hetplan.errors import HetplanError
        from hetplan.hardware.catalog import load_catalog, load_nodes

        nodes = load_nodes()
        if data.get("node") is not None:
            try:
                node = nodes.get(str(data["node"]))
            except HetplanError as exc:
                raise ValueError(f"{exc.message}; fix: {exc.fix}") from None
            try:
                gpu = load_catalog().get(str(data["gpu"]))
            except HetplanError:
                gpu = None
            if gpu is not None and gpu.name != node.gpu:
                raise ValueError(f"node {node.name} holds {node.gpu} GPUs, not {gpu.name}: name a node of "
                                 f"{gpu.name} (`hetplan catalog nodes`) or give its numbers")
        else:
            try:
                node = nodes.reference(load_catalog().get(str(data["gpu"])))
            except HetplanError:  # a GPU type the package catalog does not know (a user catalog's)
                node = None
        if node is None:
            return data
        filled = {"node": node.name, "gpus_per_node": node.gpus_per_node, "gpus_per_host": node.gpus_per_host,
                  "inter_node_bandwidth_bytes_per_s": node.inter_node_bandwidth_bytes_per_s, "network": node.network}
        if node.gpu_link_bandwidth_bytes_per_s is not None:
            filled["intra_node_bandwidth_bytes_per_s"] = node.gpu_link_bandwidth_bytes_per_s
        return {**data, **filled, **{k: v for k, v in data.items() if v is not None and k != "node"}}

    @model_validator(mode="after")
    def _hosts_tile_the_node(self) -> "GPUPool":
        """Hosts tile the NVLink domain: a host of 5 GPUs in a 72-GPU rack (or the rack's trays of 4 in a node of 6)
        would span two domains, and the launch and the cost model would disagree on which GPUs share NVLink."""
        if self.gpus_per_node % self.launch_gpus:
            from hetplan.hardware.catalog import load_nodes

            host = load_nodes().get(self.node).gpus_per_host if self.node else None
            preset = f" (node {self.node} has hosts of {host})" if host else ""
            raise ValueError(f"gpus_per_host = {self.launch_gpus} does not divide gpus_per_node = "
                             f"{self.gpus_per_node}{preset}: hosts must tile the NVLink domain; fix: give a gpus_per_host that "
                             "divides gpus_per_node")
        return self

    @property
    def launch_gpus(self) -> int:
        """GPUs a launch starts processes on per host (``torchrun --nproc-per-node``, the DeepSpeed launcher's
        ``--num_gpus``): :attr:`gpus_per_host`, at most :attr:`gpus_per_node`."""
        return min(self.gpus_per_host or self.gpus_per_node, self.gpus_per_node)


class Inventory(UserInput):
    """All GPU pools available to the job."""

    model_config = ConfigDict(extra="forbid")

    pools: list[GPUPool] = Field(min_length=1, max_length=64)


@lru_cache(maxsize=4096)
def _stage_layout(tp: int, dp: int, zero: int, pp: int, virtual_stages: int, sequence_parallel: bool,
                  fsdp_shard: int | None, cp: int = 1, ep: int = 1, expert_tp: int = 1) -> ParallelLayout:
    """:meth:`Plan.stage_layout`, built once per distinct layout (frozen, so shared; the estimator reads one per
    stage of thousands of plans). ``fsdp_shard``: HSDP's shard group (shard within, replicate across)."""
    degrees = dict(tp=tp, zero_stage=zero, pp=pp, virtual_stages=virtual_stages, sequence_parallel=sequence_parallel,
                   cp=cp, ep=ep, expert_tp=expert_tp)
    if fsdp_shard is not None:
        return ParallelLayout(dp_shard=fsdp_shard, dp_replicate=dp // fsdp_shard, **degrees)
    return ParallelLayout.of(dp=dp, **degrees)


class Stage(UserInput):
    """One pipeline stage: ``num_layers`` consecutive transformer layers on ``tp * dp`` GPUs of one pool.

    Attributes:
        pool: index into :attr:`Plan.pools`.
        num_layers: transformer layers in this stage (the first stage adds the embedding, the last the head).
        tp: tensor-parallel degree; dp: data-parallel degree of this stage.
        recompute: activation recomputation of this stage's layers.
        recompute_layers: how many of this stage's layers use ``recompute``; the others recompute nothing.
            ``None`` (default) = all of them. Per-layer recomputation as chosen by Aceso's search (Liu et al.,
            EuroSys'24, Sec. 4.2, per op there); the cost does not depend on which layers.
        mbs: micro-batch size of each of this stage's data-parallel replicas (sequences); ``None`` (default) =
            :attr:`Plan.mbs`. Stages with different DP degrees split the same pipeline micro-batch of
            ``dp * mbs`` sequences over their replicas (Aceso, Sec. 3), so when any stage sets it, ``dp * mbs``
            must be equal on every stage.
    """

    model_config = ConfigDict(extra="forbid")

    pool: int = Field(default=0, ge=0)
    num_layers: int = bounded(10**5, "100,000 layers is 100x any model", ge=0)
    tp: int = bounded(4096, "TP beyond 4,096 exceeds any model's heads", default=1, gt=0)
    dp: int = bounded(10**6, "a million replicas exceeds any cluster", default=1, gt=0)
    recompute: Recompute = "none"
    recompute_layers: int | None = Field(default=None, ge=0)
    mbs: int | None = bounded(65536, "a micro-batch is at most the largest global batch", default=None, gt=0)

    def recomputed_layers(self) -> int:
        """Layers of this stage that use :attr:`recompute` (0 when it is ``none``)."""
        if self.recompute == "none":
            return 0
        return self.num_layers if self.recompute_layers is None else min(self.recompute_layers, self.num_layers)


class Plan(UserInput):
    """A fully pinned training plan: everything the estimator and the runtime need.

    Attributes:
        job: the job.
        pools: the GPU pools the stages run on (with bandwidths and prices).
        stages: pipeline stages in order.
        mbs: micro-batch size (sequences).
        zero: ZeRO stage 0-3 over each stage's data-parallel group (1 = Megatron-LM's distributed optimizer;
            2 / 3 under ``framework = "megatron"``: Megatron-FSDP, ``--data-parallel-sharding-strategy
            optim_grads`` / ``optim_grads_params``).
        sequence_parallel: Megatron sequence parallelism in TP groups (Korthikanti et al. 2023).
        schedule: pipeline schedule.
        virtual_stages: model chunks per stage for interleaved 1F1B (Narayanan et al. SC'21 Sec. 2.2.2); 1 = plain
            1F1B. Used when the schedule is ``1f1b``, pp > 1 and the micro-batch count is a multiple of pp.
        overlap_grad_reduce: data-parallel gradient reduction overlapped with the backward pass.
        tp_comm_overlap: TP collectives pipelined with the GEMMs they feed (Megatron-Core ``--tp-comm-overlap``,
            Transformer Engine userbuffers; needs sequence parallelism; :func:`hetplan.estimate.compute.layer_time_s`).
        cuda_graphs: the transformer layers run as captured CUDA graphs (Megatron-Core ``--enable-cuda-graph`` /
            ``--cuda-graph-impl``, Transformer Engine ``make_graphed_callables``): their kernels are replayed
            without a host launch each, so no per-kernel host floor (:func:`hetplan.estimate.compute.layer_time_s`).
        fsdp_shard: HSDP — ZeRO-3/FSDP shards within groups of this many DP ranks and replicates across
            ``dp / fsdp_shard`` of them (PyTorch ``fully_shard`` with a 2-D device mesh); None = all of DP.
        reshard_after_forward: ZeRO-3/FSDP frees each layer's gathered parameters after its forward and gathers
            them again in backward (FSDP2's default), or keeps them until the backward (False).
        grad_reduce_dtype: dtype of the data-parallel gradient reduction: ``fp32`` or ``bf16`` / ``fp16``; None =
            the framework default (fp32 for bf16 training: Megatron-LM forces it, torchtitan's default).
        fsdp_param_dtype: ``framework = "fsdp"``: dtype of the resident sharded parameters, ``fp32`` (master
            weights; torchtitan) or ``bf16`` (NeMo AutoModel's default ``torch_dtype``, whose ``torch.optim.Adam``
            then keeps its moments in bf16 too) (:data:`hetplan.estimate.memory.FSDP_STATE_BYTES`).
        cross_entropy: ``framework = "fsdp"``: how the loss runs, which sets its memory peak per logit
            (:data:`hetplan.estimate.memory.CROSS_ENTROPY_BYTES_PER_LOGIT`): ``fp32`` eager on fp32-cast logits
            (torchtitan without compile, or before 2025-04, when compile covered the blocks only), ``bf16`` eager
            without the upcast (NeMo AutoModel's ``MaskedCrossEntropy(fp32_upcast=False)``), ``compiled``
            (torchtitan with ``compile`` since 2025-04); None: ``compiled`` under ``Job.torch_compile``, else ``fp32``.
            ``framework = "megatron"``: ``fp32`` is Megatron-LM's unfused vocab-parallel loss on an fp32 copy of the
            logits (its default without ``--cross-entropy-loss-fusion``, e.g. Megatron-LM r0.8); anything else the fused loss (``--cross-entropy-loss-fusion``, NeMo's recipes). Its time:
            :data:`hetplan.estimate.compute.CROSS_ENTROPY`.
        pipeline_step_microbatches: micro-batches per call of the pipeline schedule, where a framework splits an
            iteration into several calls and accumulates gradients across them (NeMo AutoModel: its recipe's
            ``local_batch_size / pp_microbatch_size``); None: the iteration's micro-batches in one call
            (torchtitan, Megatron-LM). Sizes the receive buffers PyTorch's schedules allocate per micro-batch
            (:func:`hetplan.estimate.memory.pipeline_buffer_bytes`) and flushes the pipeline and reduces the
            gradients once per call (:mod:`hetplan.estimate.iteration`). Ignored on a one-stage plan (no pipeline
            schedule to call, :meth:`pipeline_calls`) and when it is at least the iteration's micro-batches (one call).
            ``framework = "fsdp"`` only (Megatron-LM and DeepSpeed run an iteration in one call). The exports
            refuse a plan of several calls (:func:`hetplan.runtime.exporters.export`).
        pipeline_outputs: ``framework = "fsdp"`` with pp > 1: which stages of PyTorch's pipeline schedule keep
            their output of every micro-batch of a ``step()`` call for its return value (``output_chunks``,
            ``torch/distributed/pipelining/stage.py``): ``last`` (the last stage's logits; PyTorch since
            pytorch/pytorch#153383, 2025-05) or ``all`` (every stage, PyTorch before it)
            (:func:`hetplan.estimate.memory.pipeline_buffer_bytes`).
        cp: context-parallel degree of every stage: each sequence split over ``cp`` GPUs; a stage uses
            ``tp·cp·dp`` GPUs (:mod:`hetplan.estimate.context`).
        ep: expert-parallel degree of every stage (MoE models): the routed experts split over ``ep`` GPUs of the
            stage's ``dp·cp`` ranks (:mod:`hetplan.estimate.moe`).
        expert_tp: tensor-parallel degree inside each expert (``--expert-tensor-parallel-size``); ``ep·expert_tp``
            must divide every stage's ``tp·cp·dp`` (:class:`ParallelLayout`).
        pipeline_chunks: under interleaving, the layers of each virtual stage of each stage, ``[stage][chunk]``
            (chunk ``k`` of stage ``i`` is model chunk ``k·pp + i``), for splits that are not ``v`` equal chunks
            per stage — Megatron-Core's ``--pipeline-model-parallel-layout``, e.g. DeepSeek-V3's 61 layers at PP 8 x
            VP 4 with the loss in a chunk of its own. ``None``: equal chunks. The schedule prices each chunk
            at ``1/v`` of its stage (:func:`hetplan.estimate.schedule.simulate`), so the stage totals are exact and
            only the bubble's shape inside a stage is approximated.
    """

    model_config = ConfigDict(extra="forbid")

    job: Job
    pools: list[GPUPool] = Field(min_length=1)
    stages: list[Stage] = Field(min_length=1, max_length=10**5)
    mbs: int = bounded(65536, "a micro-batch is at most the largest global batch", gt=0)
    zero: int = Field(default=0, ge=0, le=3)
    sequence_parallel: Bool = False
    schedule: Schedule = "1f1b"
    virtual_stages: int = bounded(1024, "more virtual stages than 1,024 is more than layers per GPU", default=1, ge=1)
    overlap_grad_reduce: Bool = True
    tp_comm_overlap: Bool = False
    cuda_graphs: Bool = False
    fsdp_shard: int | None = Field(default=None, gt=0)
    reshard_after_forward: Bool = True
    grad_reduce_dtype: Literal["fp32", "bf16", "fp16"] | None = None
    fsdp_param_dtype: Literal["fp32", "bf16"] = "fp32"
    cross_entropy: Literal["fp32", "bf16", "compiled"] | None = None
    pipeline_step_microbatches: int | None = Field(default=None, gt=0)
    pipeline_outputs: Literal["last", "all"] = "last"
    cp: int = Field(default=1, ge=1)
    ep: int = Field(default=1, ge=1)
    expert_tp: int = Field(default=1, ge=1)
    pipeline_chunks: list[list[Annotated[int, Field(ge=0)]]] | None = None

    @model_validator(mode="after")
    def _check(self) -> "Plan":
        for i, st in enumerate(self.stages):
            if st.pool >= len(self.pools):
                raise ValueError(f"stages[{i}].pool = {st.pool} but only {len(self.pools)} pools are given")
            b = st.mbs or self.mbs
            if self.job.global_batch % (st.dp * b):
                raise ValueError(
                    f"global_batch {self.job.global_batch} is not divisible by dp * mbs = {st.dp} * {b} "
                    f"(stage {i})"
                )
            if self.fsdp_shard is not None and st.dp % self.fsdp_shard:
                raise ValueError(f"fsdp_shard = {self.fsdp_shard} does not divide stages[{i}].dp = {st.dp}")
        if self.fsdp_shard is not None and self.zero < 2:  # it changed nothing: the numbers were those without it
            raise ValueError(f"fsdp_shard = {self.fsdp_shard} sets HSDP's shard groups, but zero = {self.zero} shards no "
                             "parameters or gradients (only ZeRO-2/3 and FSDP do); fix: remove fsdp_shard, or set "
                             "zero = 3 (FSDP)")
        if self.fsdp_shard is not None and self.job.framework != "fsdp":  # the estimate and export dropped it
            raise ValueError(f"fsdp_shard = {self.fsdp_shard} sets HSDP's shard groups of PyTorch FSDP2 (framework "
                             f"'fsdp'); {self.job.framework} shards ZeRO-{self.zero} over all of a stage's DP ranks "
                             "(its estimate and export ignored fsdp_shard): remove fsdp_shard, or set "
                             "job.framework = 'fsdp'")
        for i, st in enumerate(self.stages):
            try:  # the degrees together (CP, EP x expert TP within TP x CP x DP): one message, not a traceback
                self.stage_layout(i)
            except ValidationError as exc:
                raise ValueError(f"stages[{i}]: {exc.errors()[0]['msg'].removeprefix('Value error, ')}") from None
            if st.recompute_layers is not None and st.recompute_layers > st.num_layers:
                raise ValueError(f"stages[{i}].recompute_layers = {st.recompute_layers} exceeds its "
                                 f"num_layers = {st.num_layers}")
        overlap = [f for f, on in (("tp_comm_overlap", self.tp_comm_overlap), ("job.async_tp", self.job.async_tp)) if on]
        if overlap and not self.sequence_parallel and any(st.tp > 1 for st in self.stages):
            # both pipeline sequence parallelism's all-gathers / reduce-scatters with their GEMMs; without it the
            # estimate priced no overlap, and Megatron-LM refuses the launch ('Tensor parallel communication/GEMM
            # overlap can happen only when sequence parallelism is enabled', megatron/training/arguments.py,
            # NVIDIA/Megatron-LM d98e8a64); torchtitan's async TP pass finds no such collective to fuse
            raise ValueError(f"{' and '.join(overlap)} overlaps sequence parallelism's TP collectives with the "
                             "GEMMs, but sequence_parallel = false (TP without it all-reduces, nothing to overlap): "
                             "set sequence_parallel = true, or remove " + " and ".join(overlap))
        if self.pipeline_step_microbatches is not None and self.job.framework != "fsdp":
            raise ValueError(f"pipeline_step_microbatches splits an iteration into calls of PyTorch's pipeline "
                             f"schedule (NeMo AutoModel, framework 'fsdp'); {self.job.framework} runs all its "
                             "micro-batches in one call: remove it or set job.framework = 'fsdp'")
        for key, default in (("fsdp_param_dtype", "fp32"), ("pipeline_outputs", "last")):
            if getattr(self, key) != default and self.job.framework != "fsdp":  # the estimate dropped it
                raise ValueError(f"{key} = {getattr(self, key)!r} describes PyTorch FSDP2 / pipelining (framework "
                                 f"'fsdp'); {self.job.framework} has no such setting: remove it (or give "
                                 f"{default!r}) or set job.framework = 'fsdp'")
        if any(st.mbs is not None for st in self.stages):
            sizes = {st.dp * (st.mbs or self.mbs) for st in self.stages}
            if len(sizes) > 1:
                raise ValueError(f"stages process pipeline micro-batches of different sizes dp * mbs = "
                                 f"{sorted(sizes)}; make dp * mbs equal on every stage")
        return self

    def stage_layout(self, stage: int) -> ParallelLayout:
        """The :class:`ParallelLayout` of ``stage``: its TP and DP degrees (DP sharded when :attr:`zero` >= 1,
        replicated otherwise; HSDP's shard groups of :attr:`fsdp_shard`), the pipeline depth, virtual stages,
        sequence parallelism and ZeRO stage (3 under ``framework = "fsdp"``)."""
        st = self.stages[stage]
        zero = self.zero  # under fsdp: 0 = DDP (replicated), 1-2 = not resharded after forward, 3 = FSDP
        shard = self.fsdp_shard if self.fsdp_shard is not None and zero >= 1 else None
        return _stage_layout(st.tp, st.dp, zero, self.pp, self.virtual_stages, self.sequence_parallel, shard,
                             self.cp, self.ep, self.expert_tp)

    def stage_mbs(self, stage: int) -> int:
        """Micro-batch size of one replica of ``stage`` (sequences): its own ``mbs`` or :attr:`mbs`."""
        return self.stages[stage].mbs or self.mbs

    @property
    def pp(self) -> int:
        """Pipeline-parallel degree (number of stages)."""
        return len(self.stages)

    @property
    def num_gpus(self) -> int:
        """GPUs used: sum over stages of :attr:`hetplan.degrees.Degrees.gpus_per_stage`."""
        return sum(self.stage_layout(i).gpus_per_stage for i in range(self.pp))

    @property
    def processes_per_host(self) -> int:
        """Processes a launch of this plan starts on every host: the least :attr:`GPUPool.launch_gpus` of the pools
        its stages use (:func:`pools_fill_whole_hosts`); a rank's local GPU index is its rank modulo this."""
        return min(self.pools[st.pool].launch_gpus for st in self.stages)

    def num_microbatches(self, stage: int = 0) -> int:
        """Micro-batches per pipeline per iteration for ``stage``: global_batch / (dp * mbs) (the stage's mbs)."""
        return self.job.global_batch // (self.stages[stage].dp * self.stage_mbs(stage))

    def pipeline_calls(self, stage: int = 0) -> int:
        """Calls of the pipeline schedule per iteration: ``ceil(m / pipeline_step_microbatches)`` for a pipeline
        (more than one stage) whose framework splits the iteration (:attr:`pipeline_step_microbatches`), else 1."""
        step = self.pipeline_step_microbatches
        if self.pp == 1 or step is None:
            return 1
        return -(-self.num_microbatches(stage) // step)


def balanced_split(num_layers: int, pp: int) -> list[int]:
    """Layers per stage for a balanced split of ``num_layers`` identical layers over ``pp`` stages.

    Each stage gets ``q = num_layers // pp`` layers; the ``r`` remaining layers go first to the middle stages
    (1 .. pp-2, which carry neither embedding nor head), then to the first stage, then to the last (which carries
    the output head, the heaviest non-layer work). Under 1F1B the middle stages also hold fewer micro-batches in
    flight than the first.

    Raises:
        ValueError: ``pp`` < 1 or ``pp`` > ``num_layers``.
    """
    if not 1 <= pp <= num_layers:
        raise ValueError(f"pp must be in 1..{num_layers}, got {pp}")
    q, r = divmod(num_layers, pp)
    split = [q] * pp
    order = list(range(1, pp - 1)) + [0] + ([pp - 1] if pp > 1 else [])
    for i in order[:r]:
        split[i] += 1
    return split


def ends_split(num_layers: int, pp: int, v: int) -> list[list[int]] | None:
    """Interleaved chunks ``[stage][chunk]`` with every chunk ``c = ceil(L / (pp v))`` layers except the first
    (stage 0's first chunk, beside the embedding) and the last (the last stage's last chunk, beside the loss), which
    together hold ``d = pp v c - L`` fewer — the loss's chunk the more (``ceil(d / 2)``, at most ``c``). NVIDIA's
    DeepSeek-V3 recipe runs its 61 layers at PP 8 x VP 4 so: ``Et|(tt|)*30L`` (Megatron-Core
    ``--pipeline-model-parallel-layout``, ``megatron/core/transformer/pipeline_parallel_layer_layout.py``; c = 2,
    d = 3). None when ``d > 2c`` (the ends cannot absorb it) or ``v < 2``."""
    if v < 2 or pp < 2:
        return None
    c = -(-num_layers // (pp * v))
    d = pp * v * c - num_layers
    if d > 2 * c:
        return None
    loss = min(c, -(-d // 2))
    chunks = [[c] * v for _ in range(pp)]
    chunks[0][0] -= d - loss
    chunks[-1][-1] -= loss
    return chunks


def stage_chunks(n: int, v: int, first: bool = False) -> list[int]:
    """``n`` layers of a stage in ``v`` interleaved chunks differing by at most one layer, the short ones first on
    the first stage (beside the embedding), last elsewhere (the last stage's beside the loss)."""
    q, r = divmod(n, v)
    return [q] * (v - r) + [q + 1] * r if first else [q + 1] * r + [q] * (v - r)


def balanced_chunks(num_layers: int, pp: int, v: int) -> list[list[int]] | None:
    """Interleaved chunks ``[stage][chunk]`` of :func:`balanced_split`'s stages (:func:`stage_chunks`); None when a
    stage has fewer than ``v`` layers."""
    split = balanced_split(num_layers, pp)
    if min(split) < v:
        return None
    return [stage_chunks(n, v, first=i == 0) for i, n in enumerate(split)]


#: :func:`interleaved_chunks` split codes (the search's ``split`` dimension, :mod:`hetplan.search.space`).
SPLITS = ("balanced", "ends")


def interleaved_chunks(num_layers: int, pp: int, v: int, split: str = "balanced") -> list[list[int]] | None:
    """The chunks of split ``split`` (:data:`SPLITS`): :func:`balanced_chunks` or :func:`ends_split`."""
    return balanced_chunks(num_layers, pp, v) if split == "balanced" else ends_split(num_layers, pp, v)


def layer_ranges(num_layers: int, pp: int) -> list[tuple[int, int]]:
    """``[start, end)`` layer indices of each stage of :func:`balanced_split`.

    Raises:
        HetplanError: ``pp`` outside 1..num_layers (field ``pp``).
    """
    from hetplan.errors import HetplanError

    if not 1 <= pp <= num_layers:
        raise HetplanError(f"cannot split {num_layers} layers into {pp} pipeline stages", field="pp",
                           fix=f"use a pipeline degree between 1 and {num_layers}")
    out, start = [], 0
    for n in balanced_split(num_layers, pp):
        out.append((start, start + n))
        start += n
    return out


def selective_is_none(attention: str, framework: str) -> bool:
    """Whether selective recomputation is the plan without recomputation (:attr:`Job.attention`): under flash
    attention with Megatron-LM or DeepSpeed, whose ``ParallelAttention.forward`` skips the core-attention checkpoint
    when FlashAttention runs. Not under ``framework = "fsdp"``: there selective is torchtitan's per-op selective
    checkpointing (``torchtitan/distributed/activation_checkpoint.py`` ``_apply_op_sac``), which the estimate prices
    with its own memory and recomputation (:func:`hetplan.estimate.memory.op_sac_activation_bytes`,
    :func:`hetplan.estimate.compute.op_sac_recompute_s`) and a stack runs only where it has it."""
    return attention == "flash" and framework != "fsdp"


def fills_whole_nodes(num_gpus: int, gpus_per_host: int) -> bool:
    """Whether ``num_gpus`` ranks can be launched on hosts of ``gpus_per_host`` GPUs (:attr:`GPUPool.launch_gpus`:
    a server, or one compute tray of an NVL72 rack): inside one host, or on whole hosts. torchrun (``--nnodes N
    --nproc-per-node P``) and the DeepSpeed launcher (``--num_nodes``, ``--num_gpus``) start the same number of
    processes on every host, so 58 ranks on 8-GPU servers would start 64; 256 GB200 are 64 trays of 4."""
    return num_gpus <= gpus_per_host or num_gpus % gpus_per_host == 0


def pools_fill_whole_hosts(gpus, hosts) -> np.ndarray:
    """Whether ranks on several pools can be launched (:func:`fills_whole_nodes` of a launch on more than one pool):
    ``gpus[..., k]`` ranks on pool ``k``, whose hosts hold ``hosts[k]`` GPUs (:attr:`GPUPool.launch_gpus`), one
    allocation per row. The launch starts the size of the least host used on every host; a plan on one pool fills
    :func:`fills_whole_nodes`, on several each pool's ranks fill whole hosts of that size (a pool's stages are
    contiguous, ranks pipeline-outermost), since no host holds two pools' GPUs: 6 GB200 and 10 H100 were planned
    and exported as 4 hosts of 4, one of them with 2 GB200 and 2 H100."""
    gpus = np.asarray(gpus, dtype=np.int64)
    hosts = np.asarray(hosts, dtype=np.int64)
    used = gpus > 0
    if (hosts == hosts[0]).all():  # one host size (every pool a DGX, say): no per-row least host; cost O(rows x pools)
        h = int(hosts[0])
        rem = gpus & (h - 1) if h & (h - 1) == 0 else gpus % h  # a power of two: a mask, not a division
        return ~rem.any(axis=-1) | ((used.sum(axis=-1) == 1) & (gpus.sum(axis=-1) <= h))
    per = np.where(used, hosts, np.iinfo(np.int64).max).min(axis=-1, keepdims=True)
    one = used.sum(axis=-1) == 1
    return (one & (gpus.sum(axis=-1) <= per[..., 0])) | (gpus % per == 0).all(axis=-1)


def boundary_is_intra_node(stage_sizes: list[int], stage_pools: list[int], gpus_per_node: list[int]) -> list[bool]:
    """For each of the p-1 stage boundaries: do both stages sit in one node?

    Stages take consecutive GPUs of their pool in order (stage i after stage i-1 of the same pool), ``size``
    GPUs each (tp * dp); node k of a pool holds its GPUs ``[k*G, (k+1)*G)``. A boundary is intra-node when the
    two stages share a pool and the GPUs of both lie in one node; stages of different pools never share a node.
    """
    starts: list[int] = []
    used: dict[int, int] = {}
    for size, pool in zip(stage_sizes, stage_pools):
        starts.append(used.get(pool, 0))
        used[pool] = used.get(pool, 0) + size
    out = []
    for i in range(len(stage_sizes) - 1):
        if stage_pools[i] != stage_pools[i + 1]:
            out.append(False)
            continue
        g = gpus_per_node[stage_pools[i]]
        first, last = starts[i], starts[i + 1] + stage_sizes[i + 1] - 1
        out.append(first // g == last // g)
    return out
