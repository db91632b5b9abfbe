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
from hetplan.estimate.inference import chunk_context_time_s, step_time_s
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

    def step_time_s(self, prefill_lens, decode_contexts, prefill_contexts=None) -> float:
        # the time depends only on the joining count and longest prompt, on the running count and their cached
        # tokens, and on the chunks' cached contexts: memoised on those (a simulation asks for the same
        # iterations again and again)
        chunks = tuple(zip(prefill_lens, prefill_contexts)) if prefill_contexts else ()
        key = (len(prefill_lens), max(prefill_lens, default=0), len(decode_contexts), sum(decode_contexts), chunks)
        cache = self.__dict__.setdefault("_memo", {})
        if key not in cache:
            cache[key] = step_time_s(self.spec, self.gpu, self.dtype, [key[1]] * key[0],
                                     [key[3] / key[2]] * key[2] if key[2] else [], tp=self.tp, pp=self.pp,
                                     engine=self.engine, weights=self.weights, kv_dtype=self.kv_dtype,
                                     prefill_contexts=None)
            if chunks:
                cache[key] += chunk_context_time_s(self.spec, self.gpu, self.dtype, [c for c, _ in chunks],
                                                   [p for _, p in chunks], tp=self.tp, engine=self.engine,
                                                   kv_dtype=self.kv_dtype)
        return cache[key]


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
