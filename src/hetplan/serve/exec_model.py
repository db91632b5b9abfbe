"""Step-time models: how long one engine iteration (prefills of joining requests + one decode step) takes.

* :class:`EstimatedStepModel` — the cost model of :mod:`hetplan.estimate.inference` (compute-bound prefill,
  memory-bound decode over weights and KV bytes, TP all-reduces and PP p2p from :mod:`hetplan.estimate.comm`) for a
  model on a catalog GPU partitioned TP x PP, as a serving engine runs it when ``engine`` is given (its launches,
  attention kernel, weight dtype ``weights``, KV dtype ``kv_dtype`` and per-step overhead;
  :mod:`hetplan.hardware.engines`). No formula of its own.
* :class:`LinearStepModel` — ``t = base + per_prefill · joins + per_prefill_token · prompt tokens + per_decode_seq ·
  running + per_kv_token · cached tokens`` with non-negative coefficients fitted by least squares on the iterations
  an engine measured (:meth:`LinearStepModel.fit`); used to check the simulator's queueing and batching against the
  real engine on a machine the catalog does not describe (a CPU).

This module does not import torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from hetplan.errors import HetplanError
from hetplan.estimate.inference import chunk_context_time_s, step_time_s, window_read_s, window_tokens
from hetplan.hardware.catalog import GPUSpec
from hetplan.hardware.engines import EngineSpec
from hetplan.model.spec import ModelSpec


class StepModel:
    """Interface: ``step_time_s(prefill_lens, decode_contexts[, prefill_contexts])`` -> seconds for one iteration
    (``prefill_contexts``: tokens cached before each prefill chunk; models that do not price it ignore it)."""

    def step_time_s(self, prefill_lens: Sequence[int], decode_contexts: Sequence[int],
                    prefill_contexts: Sequence[int] | None = None) -> float:  # pragma: no cover
        raise NotImplementedError


@dataclass(frozen=True)
class EstimatedStepModel(StepModel):
    """Iteration time of ``spec`` on ``gpu`` partitioned TP x PP, from :func:`hetplan.estimate.inference.step_time_s`
    (``engine`` None: the training forward; else that engine's costs with ``weights`` / ``kv_dtype``, default
    ``dtype``)."""

    spec: ModelSpec
    gpu: GPUSpec
    tp: int = 1
    pp: int = 1
    dtype: str = "fp16"
    engine: EngineSpec | None = None
    weights: str | None = None
    kv_dtype: str | None = None

    def _exact(self, n_prefill: int, longest: int, n_decode: int, kv_tokens: int) -> float:
        return step_time_s(self.spec, self.gpu, self.dtype, [longest] * n_prefill,
                           [kv_tokens / n_decode] * n_decode if n_decode else [], tp=self.tp, pp=self.pp,
                           engine=self.engine, weights=self.weights, kv_dtype=self.kv_dtype, prefill_contexts=None)

    def step_time_s(self, prefill_lens, decode_contexts, prefill_contexts=None) -> float:
        # The time depends only on the joining count and longest prompt, on the running count and their cached
        # tokens in all, on the chunks' cached contexts (an additive term, memoised on its own) and, for a model
        # with sliding-window layers, on the tokens those read (Σ min(c, w): an additive, linear term). For a given
        # shape the cost model is linear in the cached tokens (the decode attention reads their K/V, or computes
        # over them, at a fixed rate: estimate/inference.py kv_read_time_s), so each shape is evaluated at two
        # token counts and the line used for all others, after a third point has confirmed it to 1e-9; a shape
        # where it does not is evaluated exactly at every count (memoised).
        chunks = tuple(zip(prefill_lens, prefill_contexts)) if prefill_contexts else ()
        extra = 0.0
        if chunks:
            ccache = self.__dict__.setdefault("_chunks", {})
            if chunks not in ccache:
                ccache[chunks] = chunk_context_time_s(self.spec, self.gpu, self.dtype, [c for c, _ in chunks],
                                                      [p for _, p in chunks], tp=self.tp, engine=self.engine,
                                                      kv_dtype=self.kv_dtype)
            extra = ccache[chunks]
        n_pre, longest, n_dec = len(prefill_lens), max(prefill_lens, default=0), len(decode_contexts)
        kv = int(sum(decode_contexts))
        lines = self.__dict__.setdefault("_lines", {})
        shape = (n_pre, longest, n_dec)
        # sliding-window layers read min(context, w) per sequence (inference.window_tokens): the time has a kink
        # where the mean context reaches the window, and is linear on either side (equal contexts, as _exact)
        kink = n_dec * self.spec.sliding_window if self.spec.sliding_window_layers else None
        if n_dec and shape not in lines:
            if kink is None or kink <= n_dec:
                lines[shape] = [self._line(shape, n_dec, n_dec * 4096)]
            else:
                lines[shape] = [self._line(shape, n_dec, kink), self._line(shape, kink, max(2 * kink, n_dec * 4096))]
        segments = lines.get(shape)
        line = (segments[0] if len(segments) == 1 or kv <= kink else segments[1]) if segments else None
        if kink is not None and n_dec:  # the window layers read Σ min(c, w), not n·min(mean, w): linear in it
            if "_window_s_per_token" not in self.__dict__:
                self.__dict__["_window_s_per_token"] = window_read_s(self.spec, self.gpu, self.dtype, 1.0, tp=self.tp,
                                                                      engine=self.engine, kv_dtype=self.kv_dtype)
            extra += self.__dict__["_window_s_per_token"] * (
                window_tokens(self.spec, decode_contexts) - n_dec * min(kv / n_dec, self.spec.sliding_window))
        if line is not None:
            return line[0] + line[1] * (kv - line[2]) + extra
        cache = self.__dict__.setdefault("_memo", {})
        key = (n_pre, longest, n_dec, kv)
        if key not in cache:
            cache[key] = self._exact(*key)
        return cache[key] + extra

    def _line(self, shape: tuple[int, int, int], lo: float, hi: float) -> tuple[float, float, float] | None:
        """``(f(lo), slope, lo)`` of the time over cached tokens in ``[lo, hi]`` for ``shape``, if a third point
        inside confirms the line to 1e-9; else None (that shape is evaluated exactly)."""
        mid = (lo + hi) // 2  # whole tokens, as step_time_s counts them
        f_lo, f_hi, f_mid = (self._exact(*shape, x) for x in (lo, hi, mid))
        slope = (f_hi - f_lo) / (hi - lo)
        return (f_lo, slope, lo) if abs(f_lo + slope * (mid - lo) - f_mid) <= 1e-9 * max(f_mid, 1e-12) else None


@dataclass(frozen=True)
class LinearStepModel(StepModel):
    """Linear iteration time (module docstring); all coefficients in seconds per unit."""

    base_s: float = 0.0
    per_prefill_s: float = 0.0
    per_prefill_token_s: float = 0.0
    per_decode_seq_s: float = 0.0
    per_kv_token_s: float = 0.0

    @staticmethod
    def features(prefill_lens: Sequence[int], decode_contexts: Sequence[int]) -> list[float]:
        return [1.0, len(prefill_lens), float(sum(prefill_lens)), len(decode_contexts), float(sum(decode_contexts))]

    def step_time_s(self, prefill_lens, decode_contexts, prefill_contexts=None) -> float:
        c = (self.base_s, self.per_prefill_s, self.per_prefill_token_s, self.per_decode_seq_s, self.per_kv_token_s)
        return float(np.dot(c, self.features(prefill_lens, decode_contexts)))

    @classmethod
    def fit(cls, steps: Sequence[tuple[Sequence[int], Sequence[int], float]]) -> "LinearStepModel":
        """Non-negative least squares over measured ``(prefill_lens, decode_contexts, seconds)`` iterations.

        Raises:
            HetplanError: no measured iteration.
        """
        from scipy.optimize import nnls

        if not steps:
            raise HetplanError("no measured iterations to fit a step model", field="steps",
                               fix="run some requests on the engine first")
        a = np.array([cls.features(p, d) for p, d, _ in steps])
        y = np.array([t for _, _, t in steps])
        coef, _ = nnls(a, y)
        return cls(*map(float, coef))
