"""Execution-time models: how long one batch of requests of one model takes on the cluster.

Two models, both torch-free:

* :class:`AnalyticExecModel` — roofline per forward pass (Williams et al. 2009, "Roofline"): a pass over
  ``b`` sequences of ``s`` new tokens costs ``max(FLOPs / (t · peak · eff), weight bytes / (t · HBM bandwidth))``
  (the t TP ranks of a stage work in parallel; the PP stages of one batch run one after another, so PP does not
  shorten a single batch), plus two all-reduces per layer of ``b·s·h`` activations under TP and a p2p send between
  stages, costed as the training estimator costs them (:func:`hetplan.estimate.comm.allreduce_time_s` over the
  GPU link, NCCL's faster of ring and tree; :func:`hetplan.estimate.comm.p2p_time_s`). FLOPs from
  :func:`hetplan.model.counts.layer_forward_flops`. A request of prompt length s and n new tokens is one prefill
  pass (b·s tokens) plus n-1 decode passes of one token per sequence (KV cache assumed).
* :class:`TableExecModel` — measured times per batch size (e.g. from :meth:`hetplan.serve.engine.Engine.profile`),
  linearly interpolated, used to check the simulator against the real engine.
* :class:`EmpiricalExecModel` — draws each batch time from the times observed for that batch size (seeded), so the
  simulation keeps the variance of real service times (queueing delay grows with it: Pollaczek–Khinchine).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np

from hetplan.errors import HetplanError
from hetplan.estimate.comm import ALPHA_INTRA_NODE_S, allreduce_time_s, p2p_time_s
from hetplan.hardware.catalog import GPUSpec
from hetplan.model.counts import head_forward_flops, layer_forward_flops, total_parameters
from hetplan.model.spec import ModelSpec
from hetplan.serve.swap_model import DTYPE_BYTES

class ExecModel:
    """Interface: ``batch_time_s(batch_size, prompt_len, max_new_tokens)`` -> seconds for one batch."""

    def batch_time_s(self, batch_size: int, prompt_len: int, max_new_tokens: int) -> float:  # pragma: no cover
        raise NotImplementedError


@dataclass(frozen=True)
class AnalyticExecModel(ExecModel):
    """Roofline execution time of ``spec`` on ``gpu`` partitioned TP x PP (see the module docstring)."""

    spec: ModelSpec
    gpu: GPUSpec
    tp: int = 1
    pp: int = 1
    dtype: str = "fp16"

    def pass_time_s(self, batch_size: int, new_tokens_per_seq: int, context_len: int) -> float:
        """One forward pass over ``batch_size`` x ``new_tokens_per_seq`` tokens (attention over ``context_len``)."""
        m, t = self.spec, self.tp
        b, s = batch_size, new_tokens_per_seq
        flops = m.num_layers * layer_forward_flops(m, b, s) + head_forward_flops(m, b, s)
        # attention-over-context beyond the new tokens (decode): 4·b·s·ctx·q per layer
        flops += m.num_layers * 4 * b * s * max(context_len - s, 0) * m.q_dim
        weight_bytes = total_parameters(m) * DTYPE_BYTES[self.dtype]
        peak = self.gpu.peak_flops_per_s(self.dtype) * self.gpu.compute_efficiency
        compute = max(flops / (t * peak), weight_bytes / (t * self.gpu.hbm_bandwidth_bytes_per_s))
        act_bytes = b * s * m.hidden_size * DTYPE_BYTES[self.dtype]
        link = self.gpu.gpu_link_bandwidth_bytes_per_s
        comm = 2 * m.num_layers * float(allreduce_time_s(act_bytes, t, link, algorithm="auto"))
        if self.pp > 1:
            comm += (self.pp - 1) * float(p2p_time_s(act_bytes, link, ALPHA_INTRA_NODE_S))
        return compute + comm

    def batch_time_s(self, batch_size: int, prompt_len: int, max_new_tokens: int) -> float:
        """One prefill pass over the prompts plus ``max_new_tokens - 1`` one-token decode passes (s)."""
        total = self.pass_time_s(batch_size, prompt_len, prompt_len)
        for i in range(1, max_new_tokens):
            total += self.pass_time_s(batch_size, 1, prompt_len + i)
        return total


@dataclass(frozen=True)
class TableExecModel(ExecModel):
    """Measured batch times (s) keyed by batch size, linearly interpolated/extrapolated (prompt shape fixed)."""

    times_s: Mapping[int, float]

    def __post_init__(self):
        if not self.times_s or any(v < 0 for v in self.times_s.values()):
            raise HetplanError("execution-time table is empty or has negative times", field="profile",
                               fix="give at least one non-negative time per batch size")

    def batch_time_s(self, batch_size: int, prompt_len: int, max_new_tokens: int) -> float:
        xs = sorted(self.times_s)
        ys = [self.times_s[x] for x in xs]
        if len(xs) == 1:
            return ys[0]
        if batch_size > xs[-1]:
            slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
            return ys[-1] + slope * (batch_size - xs[-1])
        return float(np.interp(batch_size, xs, ys))


class EmpiricalExecModel(ExecModel):
    """Batch times (s) sampled from observed ones per batch size, seeded; unseen sizes use ``fallback``."""

    def __init__(self, samples: Mapping[int, list[float]], fallback: ExecModel, seed: int = 0):
        self.samples = {b: list(v) for b, v in samples.items() if v}
        self.fallback = fallback
        self.rng = np.random.default_rng(seed)

    def batch_time_s(self, batch_size: int, prompt_len: int, max_new_tokens: int) -> float:
        v = self.samples.get(batch_size)
        if not v:
            return self.fallback.batch_time_s(batch_size, prompt_len, max_new_tokens)
        return float(v[int(self.rng.integers(len(v)))])
