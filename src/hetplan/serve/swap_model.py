"""How long it takes to swap a model's weights between host and GPU memory under model parallelism.

Computron (Zou et al. 2023, "Computron: Serving Distributed Deep Learning Models with Model Parallel Swapping",
Sec. 3) shards every model TP x PP over the GPUs; on a swap each worker copies *only its own shard* over its own
host link, all workers in parallel, so the load time is that of the slowest worker:

    t_load = t_0 + max_w  B_w / b_w ,       b_w = η · min(B_link, B_switch / k_s(w))

* ``B_w``: weight bytes of worker w (:func:`hetplan.estimate.inference.weight_bytes_per_worker`: the training
  memory model's parameters of its stage over TP — one count of parameters for training and serving). KV caches
  are not moved: a model is evicted only when it has no running sequence, so its cache is dropped.
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
from hetplan.estimate.inference import weight_bytes_per_worker
from hetplan.model.spec import ModelSpec

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
        return self.transfer_time_s(weight_bytes_per_worker(m, tp, pp, dtype))

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
