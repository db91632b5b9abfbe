"""How long it takes to swap a model's weights between host and GPU memory under model parallelism.

Computron (Zou et al. 2023, "Computron: Serving Distributed Deep Learning Models with Model Parallel Swapping",
Sec. 3) shards every model TP x PP over the GPUs; on a swap each worker copies *only its own shard* over its own
host link, all workers in parallel, so the load time is that of the slowest worker:

    t_load = t_0 + max_w  B_w / b_w ,       b_w = η · min(B_link, B_switch / k_s(w))

* ``B_w``: bytes of worker w's shard (:func:`shard_bytes`, exact for :mod:`hetplan.model.torch_transformer`'s
  partition: vocabulary-parallel embedding/head, column/row-parallel layers, replicated norms; the last pipeline
  stage holds its own copy of a tied output matrix).
* ``B_link``: the GPU's unidirectional host-link bandwidth (catalog ``host_link_bandwidth_bytes_per_s``; PCIe 4.0
  x16 = 32 GB/s, PCI-SIG PCIe 4.0 base specification: 16 GT/s x 16 lanes, 128b/130b coding ≈ 31.5 GB/s).
* GPUs sit behind PCIe switches, ``gpus_per_switch`` each, whose uplink to the host carries ``B_switch``
  (unidirectional); ``k_s(w)`` is the number of workers moving data behind worker w's switch at the same time.
  Workers are placed on GPUs 0, 1, 2, ... in rank order (rank = pp_rank · TP + tp_rank).
* ``η``: fraction of the link rate a pinned ``cudaMemcpyAsync`` reaches, and ``t_0`` a fixed cost per swap
  (synchronisation, allocation). Both are calibrations (see :data:`COMPUTRON_A100_PCIE4`).

Swap-out and swap-in are overlapped (PCIe is full duplex: device->host and host->device use separate directions
and copy engines), so a swap that evicts ``B_out`` and loads ``B_in`` takes ``max(t(B_out), t(B_in))``.

This module does not import torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from hetplan.errors import HetplanError
from hetplan.model.spec import ModelSpec
from hetplan.plan import layer_ranges

DTYPE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2}


def layer_shard_parameters(m: ModelSpec, tp: int) -> int:
    """Parameters one TP rank holds of one layer (column-parallel Q/K/V/up/gate, row-parallel O/down, replicated
    norms and row-parallel biases; Shoeybi et al. 2019, Sec. 3)."""
    for what, n in (("num_attention_heads", m.num_attention_heads), ("num_kv_heads", m.num_kv_heads),
                    ("ffn_hidden_size", m.ffn_hidden_size)):
        if n % tp:
            raise HetplanError(f"{what} = {n} of model {m.name} is not divisible by TP = {tp}", field="tp",
                               fix=f"choose a TP degree that divides {n}")
    h, q, kv, f = m.hidden_size, m.q_dim // tp, m.kv_dim // tp, m.ffn_hidden_size // tp
    n_mlp = 3 if m.gated_mlp else 2
    p = h * (q + 2 * kv) + q * h + n_mlp * h * f
    if m.linear_bias:
        p += q + 2 * kv + h + (2 * f if m.gated_mlp else f) + h
    p += 2 * (2 * h if m.norm == "layernorm" else h)
    return p


def shard_parameters(m: ModelSpec, tp: int, pp: int) -> list[list[int]]:
    """Parameters held by each worker, ``[pp_rank][tp_rank]``.

    Raises:
        HetplanError: TP does not divide heads/MLP width, or PP exceeds the number of layers.
    """
    v_shard = m.padded_vocab_size(128 * tp) // tp
    h = m.hidden_size
    norm = 2 * h if m.norm == "layernorm" else h
    per_layer = layer_shard_parameters(m, tp)
    out = []
    stages = layer_ranges(m.num_layers, pp)
    for i, (a, b) in enumerate(stages):
        first, last = i == 0, i == pp - 1
        p = (b - a) * per_layer
        if first:
            p += v_shard * h + m.learned_positions * h
        if last:
            p += norm
            if not (first and m.tied_embeddings):
                p += v_shard * h
        out.append([p] * tp)
    return out


def shard_bytes(m: ModelSpec, tp: int, pp: int, dtype: str = "fp16") -> list[int]:
    """Bytes of each worker's shard, in rank order (rank = pp_rank · TP + tp_rank)."""
    if dtype not in DTYPE_BYTES:
        raise HetplanError(f"unknown dtype {dtype!r}", field="dtype", fix=f"use one of {', '.join(DTYPE_BYTES)}")
    return [p * DTYPE_BYTES[dtype] for stage in shard_parameters(m, tp, pp) for p in stage]


@dataclass(frozen=True)
class SwapModel:
    """Host<->GPU swap time of sharded weights (see the module docstring for the formula).

    Attributes:
        link_bandwidth_bytes_per_s: unidirectional host link of one GPU (B_link).
        efficiency: η, fraction of the link rate reached by pinned copies (0..1].
        gpus_per_switch: GPUs behind one PCIe switch (1 = no sharing).
        switch_bandwidth_bytes_per_s: unidirectional uplink of one switch (B_switch); ``None`` = B_link.
        overhead_s: t_0, fixed time per swap (s).
    """

    link_bandwidth_bytes_per_s: float
    efficiency: float = 1.0
    gpus_per_switch: int = 1
    switch_bandwidth_bytes_per_s: float | None = None
    overhead_s: float = 0.0

    def __post_init__(self):
        if self.link_bandwidth_bytes_per_s <= 0:
            raise HetplanError("link bandwidth must be > 0", field="swap.link_bandwidth_bytes_per_s", fix="give a positive bandwidth")
        if not 0 < self.efficiency <= 1:
            raise HetplanError(f"efficiency {self.efficiency} outside (0, 1]", field="swap.efficiency", fix="give a fraction in (0, 1]")
        if self.gpus_per_switch < 1:
            raise HetplanError("gpus_per_switch must be >= 1", field="swap.gpus_per_switch", fix="use 1 for no shared switch")
        if self.overhead_s < 0:
            raise HetplanError("overhead_s must be >= 0", field="swap.overhead_s", fix="give a time >= 0")

    def worker_bandwidths(self, n_workers: int) -> list[float]:
        """Effective bandwidth b_w (bytes/s) of each of ``n_workers`` workers copying at once (GPUs 0..n-1)."""
        switch_bw = self.switch_bandwidth_bytes_per_s or self.link_bandwidth_bytes_per_s
        out = []
        for w in range(n_workers):
            s = w // self.gpus_per_switch
            k = min(self.gpus_per_switch, n_workers - s * self.gpus_per_switch)
            out.append(self.efficiency * min(self.link_bandwidth_bytes_per_s, switch_bw / k))
        return out

    def transfer_time_s(self, worker_bytes: Sequence[int]) -> float:
        """Time (s) for every worker to move its bytes in one direction, all in parallel: t_0 + max_w B_w / b_w."""
        if not worker_bytes or max(worker_bytes) == 0:
            return 0.0
        bws = self.worker_bandwidths(len(worker_bytes))
        return self.overhead_s + max(b / bw for b, bw in zip(worker_bytes, bws))

    def load_time_s(self, m: ModelSpec, tp: int, pp: int, dtype: str = "fp16") -> float:
        """Host-to-GPU load time (s) of model ``m`` partitioned TP x PP."""
        return self.transfer_time_s(shard_bytes(m, tp, pp, dtype))

    def swap_time_s(self, in_bytes: Sequence[int], out_bytes: Sequence[int]) -> float:
        """Swap that writes ``out_bytes`` back and loads ``in_bytes`` per worker, overlapped: max of the two."""
        return max(self.transfer_time_s(in_bytes), self.transfer_time_s(out_bytes))


# Computron's testbed (Zou et al. 2023, Sec. 5): A100 GPUs on PCIe 4.0 x16 (32 GB/s unidirectional per GPU).
# η = 0.743 and t_0 = 0.251 s are fitted by least squares (relative errors) on the six published OPT-13B fp16
# load times below. The published (2,2) point moves 62 GB/s in aggregate over 4 GPUs, so no PCIe-switch
# bottleneck shows in that testbed: the fit uses no shared switch (gpus_per_switch = 1). Errors per point are in
# docs/serving.md ("Validation") and tests/serve/test_swap_model.py.
COMPUTRON_A100_PCIE4 = SwapModel(
    link_bandwidth_bytes_per_s=32e9,
    efficiency=0.743,
    gpus_per_switch=1,
    switch_bandwidth_bytes_per_s=None,
    overhead_s=0.251,
)

#: Load times (s) of OPT-13B fp16 published by Computron (Zou et al. 2023, Table 2), keyed by (TP, PP).
COMPUTRON_OPT13B_LOAD_TIME_S = {(1, 1): 1.350, (2, 1): 0.732, (4, 1): 0.689, (1, 2): 0.858, (1, 4): 0.645, (2, 2): 0.423}
