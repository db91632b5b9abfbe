"""Request workloads: Gamma-process arrivals per model, skewed popularity, request lengths from a distribution or
a dataset file, offline batches (all at t = 0), replay of a trace.

A workload is a list of :class:`Request` sorted by arrival time; it is a pure function of its spec and seed, so
the simulator and the real engine can be fed the very same requests.

* Arrivals of one model form a Gamma renewal process: inter-arrival times ~ Gamma(shape k = 1/CV², scale
  θ = CV²/λ), mean 1/λ, coefficient of variation CV (CV = 1 is Poisson; CV > 1 burstier). This is the
  workload of AlpaServe (Li et al., OSDI'23, Sec. 6.1) and Computron (Zou et al. 2023, Sec. 5).
* Popularity: model i (1-based rank) gets a share ∝ i^(-s) of the total rate (Zipf / power law, exponent s;
  s = 0 is uniform), unless the model states its own rate.
* Request lengths (:func:`draw_lengths`): ``fixed``; ``uniform`` integers in [min, max] (vLLM's
  ``benchmark_serving.py --dataset-name random`` draws its input/output lengths so); ``normal`` (mean, std);
  ``lognormal`` with the given mean and std of the length (``σ² = ln(1 + std²/mean²)``, ``μ = ln mean - σ²/2``,
  the moments of the log-normal law); the last two rounded and clipped to [min, max]. Or a dataset file
  (:func:`read_lengths`, JSONL or CSV of ``prompt_len,output_len`` rows, as ShareGPT-style datasets are
  summarised), used row by row in file order, wrapping around.
* Offline (throughput) mode (:func:`offline_arrivals`): ``n`` requests all arriving at t = 0, as
  ``vllm bench throughput`` submits them; throughput is then counted over the makespan.
* Trace replay: a CSV (header ``arrival_s,model`` and optional ``prompt_len,max_new_tokens`` columns) or JSONL
  file (one object per line with those keys).

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


#: Latest simulated time (s), 2^30 s (34 years): a float64 time there still resolves 2.4e-7 s, far below one decode
#: step; at a trace arrival of 1e20 s a step of 30 ms vanished in rounding (ulp 16,384 s), every latency read 0.00
#: and the idle energy 1.7e16 kJ (fuzz)
MAX_TIME_S = float(2**30)
MAX_TIME_WHY = ("the simulator's float64 clock resolves a decode step only below 2^30 s (34 years; "
                "ulp 2.4e-7 s there)")

# below this CV the gaps' std (CV/λ) is under a millionth of their mean: Gamma(k = 1e12) draws are the mean to
# float precision, and 1/CV² leaves the float range near CV = 1e-154
_CV_DETERMINISTIC = 1e-6


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
    if cv < _CV_DETERMINISTIC:
        # the CV -> 0 limit of the Gamma renewal process: every gap is its mean 1/λ (1/CV² would overflow or
        # divide by an underflowed 0 for a CV of 1e-300)
        times = np.arange(1, math.ceil(rate_per_s * duration_s) + 1) / rate_per_s
        return times[times < duration_s]
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


#: Longest request length accepted from a file (tokens): longer than any model's context (Llama 4 Scout: 10 M
#: is the one exception, beyond what a KV-cache slot here is bounded to, 1,048,576).
MAX_LENGTH_TOKENS = 2**20


def _rows(path: str | Path, field: str) -> tuple[set[str], list[tuple[int, dict]]]:
    """Columns and ``(line, row)`` of a CSV file with a header, or of a JSONL file (``.jsonl``/``.json`` or a first
    character ``{``: one JSON object per line; blank lines skipped).

    Raises:
        HetplanError: unreadable file, malformed CSV or JSON (with the line), a JSON line that is no object.
    """
    from hetplan.inputs import parse_json

    text = read_text(path, field)
    if str(path).endswith((".jsonl", ".json")) or text.lstrip().startswith("{"):
        out, cols = [], set()
        for line, raw in enumerate(text.splitlines(), start=1):
            if not raw.strip():
                continue
            row = parse_json(raw, f"{path} line {line}", field)
            if not isinstance(row, dict):
                raise HetplanError(f"{path} line {line}: a JSON {type(row).__name__}, not an object", field=field,
                                   fix='write one object per line, e.g. {"prompt_len": 128, "output_len": 64}')
            cols |= set(row)
            out.append((line, {k: ("" if v is None else str(v)) for k, v in row.items()}))
        return cols, out
    fieldnames, records = read_csv(text, str(path), field)
    return set(fieldnames or []), list(enumerate(records, start=2))


def _length(row: dict, key: str, default: int | None, path, line: int, field: str) -> int:
    """The positive integer in column ``key`` of a trace/dataset row (``default`` when empty).

    Raises:
        HetplanError: not an integer, below 1 or above :data:`MAX_LENGTH_TOKENS`, naming ``field.key`` and the line.
    """
    raw = (row.get(key) or "").strip()
    if not raw:
        if default is None:
            raise HetplanError(f"{path} line {line}: no {key}", field=f"{field}.{key}", fix=f"give {key} on every line")
        return default
    try:
        value = int(raw)
    except ValueError:
        raise HetplanError(f"{path} line {line}: {key} = {raw!r} is not an integer", field=f"{field}.{key}",
                           fix=f"write {key} as a whole number of tokens") from None
    if not 1 <= value <= MAX_LENGTH_TOKENS:
        what = "negative" if value < 0 else "zero" if value == 0 else "longer than any model's context"
        raise HetplanError(f"{path} line {line}: {key} = {value:,} is {what}", field=f"{field}.{key}",
                           fix=f"give {key} in 1..{MAX_LENGTH_TOKENS:,} tokens on that line")
    return value


def read_lengths(path: str | Path, field: str = "workload.dataset") -> list[tuple[int, int]]:
    """``(prompt_len, output_len)`` rows of a dataset file (JSONL objects or CSV with a header; ``input_len`` and
    ``max_new_tokens`` are accepted for the two columns).

    Raises:
        HetplanError: bad file, missing column, a length that is not a positive integer (naming the column and
            line), or no rows.
    """
    cols, rows = _rows(path, field)
    pk = "prompt_len" if "prompt_len" in cols else "input_len"
    ok = "output_len" if "output_len" in cols else "max_new_tokens"
    if pk not in cols or ok not in cols:
        raise HetplanError(f"{path} lacks columns prompt_len and output_len (has {sorted(cols)})", field=field,
                           fix="give every row prompt_len and output_len (tokens)")
    out = [(_length(r, pk, None, path, line, field), _length(r, ok, None, path, line, field)) for line, r in rows]
    if not out:
        raise HetplanError(f"{path} has no rows", field=field, fix="add rows of prompt_len,output_len")
    return out


LENGTH_DISTS = ("fixed", "uniform", "normal", "lognormal")


def draw_lengths(dist: str, n: int, rng: np.random.Generator, *, mean: float | None = None, std: float | None = None,
                 lo: int = 1, hi: int | None = None) -> np.ndarray:
    """``n`` request lengths (integers in [lo, hi]) from ``dist`` (module docstring).

    Raises:
        HetplanError: unknown distribution, or a parameter it needs missing.
    """
    if dist not in LENGTH_DISTS:
        raise HetplanError(f"unknown length distribution {dist!r}", field="dist", fix=f"use one of {', '.join(LENGTH_DISTS)}")
    if dist == "fixed":
        if mean is None:
            raise HetplanError("a fixed length needs its mean", field="mean", fix="give mean (tokens)")
        return np.full(n, int(round(mean)), dtype=int)
    if hi is None:
        raise HetplanError(f"a {dist} length needs its max", field="max", fix="give max (tokens)")
    if dist == "uniform":
        return rng.integers(lo, hi + 1, size=n)
    if mean is None or std is None:
        raise HetplanError(f"a {dist} length needs mean and std", field="mean", fix="give mean and std (tokens)")
    if dist == "normal":
        x = rng.normal(mean, std, size=n)
    else:
        s2 = math.log1p((std / mean) ** 2)
        x = rng.lognormal(math.log(mean) - s2 / 2, math.sqrt(s2), size=n)
    return np.clip(np.rint(x), lo, hi).astype(int)


def offline_arrivals(shares: dict[str, float], n: int) -> list[Request]:
    """``n`` requests all at t = 0 split over models by ``shares`` (largest remainder, so counts sum to ``n``), in
    model order then by id."""
    names = list(shares)
    w = np.array([shares[m] for m in names], dtype=float)
    w = w / w.sum() if w.sum() > 0 else np.full(len(names), 1.0 / len(names))
    raw = w * n
    counts = np.floor(raw).astype(int)
    for i in np.argsort(-(raw - counts), kind="stable")[: n - counts.sum()]:
        counts[i] += 1
    out: list[Request] = []
    for name, c in zip(names, counts):
        out += [Request(len(out) + j, name, 0.0) for j in range(int(c))]
    return out


def read_trace(path: str | Path, models: Sequence[str], *, prompt_len: int = 16, max_new_tokens: int = 1) -> list[Request]:
    """Requests replayed from a CSV trace (header ``arrival_s,model[,prompt_len,max_new_tokens]``) or a JSONL one
    (objects with those keys), sorted by arrival.

    Raises:
        HetplanError: missing file or column, a bad number, a negative time or length (naming the column), an
            unknown model (with the line), or no request at all (a header alone: the report would say 100 % of no
            request met its SLO, at 0 requests/s).
    """
    known = set(models)
    out: list[Request] = []
    cols, records = _rows(path, "workload.trace")
    if not {"arrival_s", "model"} <= cols:
        raise HetplanError(f"trace {path} lacks columns arrival_s and model (has {sorted(cols)})",
                           field="workload.trace", fix="add a header line: arrival_s,model")
    if not records:
        raise HetplanError(f"trace {path} has no requests (a header and no rows)", field="workload.trace",
                           fix="add rows of arrival_s,model[,prompt_len,max_new_tokens], one per request")
    for line, row in records:
        try:
            t = float(row["arrival_s"])
        except (TypeError, ValueError, KeyError) as exc:
            raise HetplanError(f"{path} line {line}: {exc}", field="workload.trace", fix="fix the number on that line") from None
        pl = _length(row, "prompt_len", prompt_len, path, line, "workload.trace")
        nt = _length(row, "max_new_tokens", max_new_tokens, path, line, "workload.trace")
        if not 0 <= t <= MAX_TIME_S:
            raise HetplanError(f"{path} line {line}: arrival_s = {t:g} must be >= 0 and at most "
                               f"{MAX_TIME_S:,.0f} s: {MAX_TIME_WHY}",
                               field="workload.trace", fix="fix the values on that line")
        if row.get("model") not in known:
            raise HetplanError(f"{path} line {line}: unknown model {row['model']!r}", field="workload.trace",
                               fix=f"use one of {', '.join(models)}")
        out.append(Request(0, row["model"], t, pl, nt))
    out.sort(key=lambda r: r.arrival_s)
    for i, r in enumerate(out):
        r.id = i
    return out


def trace_window_s(requests: Sequence[Request]) -> float:
    """The time (s) a trace's n arrivals stand for: their span T (last minus first arrival) plus one mean gap,
    T·n/(n-1), so that n over it is (n-1)/T, the arrival rate of n points over their span (n points bound n-1
    gaps; n/T overstated the rate by n/(n-1), 11 % for 10 requests). 0 when they all arrive at one instant.
    """
    times = [r.arrival_s for r in requests]
    span = max(times, default=0.0) - min(times, default=0.0)
    return span * len(times) / (len(times) - 1) if span > 0 else 0.0


def attach_prompts(requests: Sequence[Request], vocab_sizes: dict[str, int], seed: int) -> None:
    """Fill ``prompt`` of each request with seeded random token ids below its model's vocabulary size."""
    for r in requests:
        rng = np.random.default_rng([seed, r.id])
        r.prompt = rng.integers(0, vocab_sizes[r.model], size=r.prompt_len).tolist()
