"""Request workloads: Gamma-process arrivals per model, skewed popularity, replay of a CSV trace.

A workload is a list of :class:`Request` sorted by arrival time; it is a pure function of its spec and seed, so
the simulator and the real engine can be fed the very same requests.

* Arrivals of one model form a Gamma renewal process: inter-arrival times ~ Gamma(shape k = 1/CV², scale
  θ = CV²/λ), mean 1/λ, coefficient of variation CV (CV = 1 is Poisson; CV > 1 burstier). This is the
  workload of AlpaServe (Li et al., OSDI'23, Sec. 6.1) and Computron (Zou et al. 2023, Sec. 5).
* Popularity: model i (1-based rank) gets a share ∝ i^(-s) of the total rate (Zipf / power law, exponent s;
  s = 0 is uniform), unless the model states its own rate.
* Trace replay: a CSV with a header ``arrival_s,model`` and optional ``prompt_len,max_new_tokens`` columns.

This module does not import torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np

from hetplan.errors import HetplanError
from hetplan.inputs import read_csv, read_text


@dataclass
class Request:
    """One inference request.

    Attributes:
        id: unique id within the workload.
        model: name of the served model.
        arrival_s: arrival time since the start of the workload (s).
        prompt_len: prompt tokens.
        max_new_tokens: tokens to generate at most (greedy).
        prompt: token ids (filled by :func:`attach_prompts` for the real engine; empty in the simulator).
        stop_token: generation also ends after this token (engine only: the simulator has no token values).
    """

    id: int
    model: str
    arrival_s: float
    prompt_len: int = 16
    max_new_tokens: int = 1
    prompt: list[int] = field(default_factory=list)
    stop_token: int | None = None


def gamma_arrivals(rate_per_s: float, cv: float, duration_s: float, rng: np.random.Generator) -> np.ndarray:
    """Arrival times (s) in ``[0, duration_s)`` of a Gamma renewal process of rate λ and coefficient of variation CV.

    Inter-arrival ~ Gamma(k = 1/CV², θ = CV²/λ): mean kθ = 1/λ, std √k θ = CV/λ.

    Raises:
        HetplanError: negative rate, non-positive CV or duration.
    """
    if rate_per_s < 0:
        raise HetplanError(f"arrival rate {rate_per_s} is negative", field="rate_per_s", fix="give a rate >= 0")
    if cv <= 0:
        raise HetplanError(f"coefficient of variation {cv} must be > 0", field="cv", fix="use 1 for Poisson arrivals")
    if duration_s <= 0:
        raise HetplanError(f"duration {duration_s} s must be > 0", field="workload.duration_s", fix="give a positive duration")
    if rate_per_s == 0:
        return np.empty(0)
    shape, scale = 1.0 / cv**2, cv**2 / rate_per_s
    n_guess = int(rate_per_s * duration_s * 1.5 + 10 * (1 + cv))
    times = np.cumsum(rng.gamma(shape, scale, size=n_guess))
    while times[-1] < duration_s:
        more = np.cumsum(rng.gamma(shape, scale, size=n_guess)) + times[-1]
        times = np.concatenate([times, more])
    return times[times < duration_s]


def zipf_shares(n: int, exponent: float) -> np.ndarray:
    """Popularity shares of ``n`` models, model i (1-based) ∝ i^(-exponent); they sum to 1."""
    if exponent < 0:
        raise HetplanError(f"popularity exponent {exponent} is negative", field="workload.zipf_exponent",
                           fix="use 0 for uniform popularity or a positive exponent for skew")
    w = np.arange(1, n + 1, dtype=float) ** (-exponent)
    return w / w.sum()


@dataclass
class ModelLoad:
    """Arrival parameters of one model: rate λ (requests/s) and coefficient of variation CV."""

    model: str
    rate_per_s: float
    cv: float = 1.0


def model_rates(models: Sequence[str], total_rate_per_s: float, zipf_exponent: float,
                explicit: dict[str, float] | None = None) -> dict[str, float]:
    """Per-model rates: the explicit ones as given, the rest share ``total_rate_per_s`` by Zipf rank (order given).

    Raises:
        HetplanError: a negative rate.
    """
    explicit = dict(explicit or {})
    for name, r in explicit.items():
        if r < 0:
            raise HetplanError(f"rate {r} of model {name} is negative", field=f"models.{name}.rate_per_s",
                               fix="give a rate >= 0")
    if total_rate_per_s < 0:
        raise HetplanError(f"total rate {total_rate_per_s} is negative", field="workload.total_rate_per_s",
                           fix="give a rate >= 0")
    rest = [m for m in models if m not in explicit]
    shares = zipf_shares(len(rest), zipf_exponent) if rest else np.empty(0)
    out = {m: explicit[m] for m in models if m in explicit}
    for m, sh in zip(rest, shares):
        out[m] = float(total_rate_per_s * sh)
    return {m: out[m] for m in models}


def generate(loads: Sequence[ModelLoad], duration_s: float, seed: int, *, prompt_len: int = 16,
             max_new_tokens: int = 1) -> list[Request]:
    """Requests of all models, merged and sorted by arrival (ties by model order), ids 0..n-1.

    Each model draws from its own stream ``SeedSequence(seed).spawn`` so adding a model leaves the others' arrivals
    unchanged.
    """
    streams = np.random.SeedSequence(seed).spawn(len(loads))
    rows: list[tuple[float, int, str]] = []
    for idx, (load, ss) in enumerate(zip(loads, streams)):
        for t in gamma_arrivals(load.rate_per_s, load.cv, duration_s, np.random.default_rng(ss)):
            rows.append((float(t), idx, load.model))
    rows.sort()
    return [Request(i, m, t, prompt_len, max_new_tokens) for i, (t, _, m) in enumerate(rows)]


def read_trace(path: str | Path, models: Sequence[str], *, prompt_len: int = 16, max_new_tokens: int = 1) -> list[Request]:
    """Requests replayed from a CSV trace (header ``arrival_s,model[,prompt_len,max_new_tokens]``), sorted by arrival.

    Raises:
        HetplanError: missing file or column, a bad number, a negative time, or an unknown model (with the line).
    """
    text = read_text(path, "workload.trace")
    known = set(models)
    out: list[Request] = []
    fieldnames, records = read_csv(text, str(path), "workload.trace")
    cols = set(fieldnames or [])
    if not {"arrival_s", "model"} <= cols:
        raise HetplanError(f"trace {path} lacks columns arrival_s and model (has {sorted(cols)})",
                           field="workload.trace", fix="add a header line: arrival_s,model")
    for line, row in enumerate(records, start=2):
        try:
            t = float(row["arrival_s"])
            pl = int(row["prompt_len"]) if row.get("prompt_len") else prompt_len
            nt = int(row["max_new_tokens"]) if row.get("max_new_tokens") else max_new_tokens
        except (TypeError, ValueError) as exc:
            raise HetplanError(f"{path} line {line}: {exc}", field="workload.trace", fix="fix the number on that line") from None
        if not 0 <= t < math.inf or not 1 <= pl <= 2**20 or not 1 <= nt <= 2**20:
            raise HetplanError(f"{path} line {line}: arrival_s must be finite and >= 0, prompt_len and max_new_tokens "
                               f"in 1..1,048,576 (longer than any model's context)",
                               field="workload.trace", fix="fix the values on that line")
        if row["model"] not in known:
            raise HetplanError(f"{path} line {line}: unknown model {row['model']!r}", field="workload.trace",
                               fix=f"use one of {', '.join(models)}")
        out.append(Request(0, row["model"], t, pl, nt))
    out.sort(key=lambda r: r.arrival_s)
    for i, r in enumerate(out):
        r.id = i
    return out


def attach_prompts(requests: Sequence[Request], vocab_sizes: dict[str, int], seed: int) -> None:
    """Fill ``prompt`` of each request with seeded random token ids below its model's vocabulary size."""
    for r in requests:
        rng = np.random.default_rng([seed, r.id])
        r.prompt = rng.integers(0, vocab_sizes[r.model], size=r.prompt_len).tolist()
