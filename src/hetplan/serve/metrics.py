"""Latency statistics (percentiles, SLO attainment, goodput) and Prometheus text exposition.

* Percentiles: linear interpolation between order statistics (numpy ``percentile`` default, Hyndman & Fan 1996
  definition 7).
* Per request: end-to-end latency (arrival to last token), **TTFT** (time to first token: arrival to the end of the
  iteration that prefilled it, queueing and swapping included) and **TPOT** (time per output token after the first:
  ``(finish - first token) / (tokens - 1)``; undefined for one-token answers), as vLLM's benchmarks and
  DistServe (Zhong et al., OSDI'24, Sec. 2) define them.
* SLO attainment of a model: fraction of its *submitted* requests that completed and met every SLO it has
  (end-to-end latency, TTFT, TPOT; refused and unfinished requests count as misses), as in AlpaServe (Li et al.,
  OSDI'23, Sec. 6) and DistServe.
* Goodput: requests completed within all their SLOs per second of workload duration (DistServe's definition).
* :class:`PromRegistry`: counters, gauges and histograms rendered in the Prometheus text format 0.0.4
  (https://prometheus.io/docs/instrumenting/exposition_formats/), thread-safe, no dependency.

This module does not import torch.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

import numpy as np


@dataclass
class Record:
    """Outcome of one request (times in s since the workload start): ``finish_s`` is ``None`` when it was refused
    or never finished; ``first_token_s`` when its first token was produced; ``output_tokens`` generated;
    ``prompt_tokens`` of its prompt."""

    id: int
    model: str
    arrival_s: float
    finish_s: float | None
    refused: bool = False
    first_token_s: float | None = None
    output_tokens: int = 0
    prompt_tokens: int = 0

    @property
    def latency_s(self) -> float | None:
        return None if self.finish_s is None else self.finish_s - self.arrival_s

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_s is None else self.first_token_s - self.arrival_s

    @property
    def tpot_s(self) -> float | None:
        if self.finish_s is None or self.first_token_s is None or self.output_tokens < 2:
            return None
        return (self.finish_s - self.first_token_s) / (self.output_tokens - 1)


@dataclass(frozen=True)
class SLO:
    """Service-level objectives of one model (s); ``None`` = no objective on that metric."""

    latency_s: float | None = None
    ttft_s: float | None = None
    tpot_s: float | None = None

    def met(self, r: Record) -> bool:
        """The request finished and met every objective (a one-token answer has no TPOT to miss)."""
        if r.finish_s is None:
            return False
        checks = ((self.latency_s, r.latency_s), (self.ttft_s, r.ttft_s), (self.tpot_s, r.tpot_s))
        return all(limit is None or value is None or value <= limit for limit, value in checks)

    def as_dict(self) -> dict:
        return {"latency_s": self.latency_s, "ttft_s": self.ttft_s, "tpot_s": self.tpot_s}


def percentiles(values: Sequence[float], qs: Iterable[float] = (50, 90, 99)) -> dict[str, float | None]:
    """``{"p50": ..., ...}`` of ``values`` (``None`` when empty)."""
    arr = np.asarray(values, dtype=float)
    return {f"p{q:g}": (float(np.percentile(arr, q)) if arr.size else None) for q in qs}


def makespan_s(records: Sequence[Record]) -> float:
    """The duration (s) of a workload without a stated one (a trace, an offline batch): from its start (t = 0, the
    first arrival) to its last answer, or last arrival where none came after it (as vLLM's benchmarks count
    throughput); never 0 for requests that all arrive at t = 0 and are answered."""
    return max((r.arrival_s if r.finish_s is None else max(r.arrival_s, r.finish_s) for r in records), default=0.0)


def summarize(records: Sequence[Record], slos: Mapping[str, SLO], duration_s: float) -> dict:
    """Per-model and overall report: requests, completed, refused; mean and p50/p90/p99 of latency, TTFT and TPOT
    (s); SLO attainment; goodput (requests/s within all SLOs), throughput (completed requests/s), output and total
    (prompt + output of completed requests) tokens/s, all over ``duration_s``."""
    out: dict = {"models": {}, "duration_s": duration_s}
    names = list(dict.fromkeys(list(slos) + [r.model for r in records]))
    for name in names + ["all"]:
        rs = [r for r in records if name == "all" or r.model == name]
        lat = [r.latency_s for r in rs if r.latency_s is not None]
        ok = sum(1 for r in rs if slos.get(r.model, SLO()).met(r))
        entry = {
            "requests": len(rs),
            "completed": len(lat),
            "refused": sum(1 for r in rs if r.refused),
            "mean_latency_s": float(np.mean(lat)) if lat else None,
        }
        for metric in ("latency", "ttft", "tpot"):
            vals = [getattr(r, f"{metric}_s") for r in rs]
            if metric != "latency":
                known = [v for v in vals if v is not None]
                entry[f"mean_{metric}_s"] = float(np.mean(known)) if known else None
            entry.update({f"{k}_{metric}_s": v for k, v in percentiles([v for v in vals if v is not None]).items()})
        entry.update({
            "slo_attainment": ok / len(rs) if rs else None,  # no request: nothing attained or missed
            "goodput_per_s": ok / duration_s if duration_s > 0 else 0.0,
            "throughput_per_s": len(lat) / duration_s if duration_s > 0 else 0.0,
            "output_tokens_per_s": sum(r.output_tokens for r in rs) / duration_s if duration_s > 0 else 0.0,
            "total_tokens_per_s": (sum(r.output_tokens + r.prompt_tokens for r in rs if r.finish_s is not None)
                                   / duration_s if duration_s > 0 else 0.0),
        })
        if name != "all":
            entry["slo"] = slos.get(name, SLO()).as_dict()
            out["models"][name] = entry
        else:
            out["all"] = entry
    return out


DEFAULT_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class PromRegistry:
    """Minimal Prometheus metrics: ``inc`` (counter), ``set`` (gauge), ``observe`` (histogram), ``render``."""

    def __init__(self, buckets_s: Sequence[float] = DEFAULT_BUCKETS_S):
        self._lock = threading.Lock()
        self._help: dict[str, tuple[str, str]] = {}
        self._buckets: dict[str, tuple[float, ...]] = {}
        self._values: dict[tuple[str, tuple], float] = {}
        self._hist: dict[tuple[str, tuple], list] = {}
        self.buckets_s = tuple(buckets_s)

    def describe(self, name: str, kind: str, text: str, buckets: Sequence[float] | None = None) -> None:
        """Declare metric ``name`` of type ``counter`` | ``gauge`` | ``histogram`` with a help text (and, for a
        histogram, its bucket upper bounds; default :data:`DEFAULT_BUCKETS_S`)."""
        self._help[name] = (kind, text)
        if buckets is not None:
            self._buckets[name] = tuple(buckets)

    def inc(self, name: str, value: float = 1.0, **labels: str) -> None:
        key = (name, tuple(sorted(labels.items())))
        with self._lock:
            self._values[key] = self._values.get(key, 0.0) + value

    def set(self, name: str, value: float, **labels: str) -> None:
        with self._lock:
            self._values[(name, tuple(sorted(labels.items())))] = float(value)

    def observe(self, name: str, value: float, **labels: str) -> None:
        key = (name, tuple(sorted(labels.items())))
        buckets = self._buckets.get(name, self.buckets_s)
        with self._lock:
            h = self._hist.setdefault(key, [[0] * len(buckets), 0.0, 0])
            for i, b in enumerate(buckets):
                if value <= b:
                    h[0][i] += 1
            h[1] += value
            h[2] += 1

    def get(self, name: str, **labels: str) -> float:
        """Current value of a counter or gauge (0 when never set)."""
        return self._values.get((name, tuple(sorted(labels.items()))), 0.0)

    def render(self) -> str:
        """All metrics in the Prometheus text format 0.0.4."""
        lines: list[str] = []
        with self._lock:
            names = sorted({k[0] for k in self._values} | {k[0] for k in self._hist} | set(self._help))
            for name in names:
                kind, text = self._help.get(name, ("untyped", name))
                lines.append(f"# HELP {name} {text}")
                lines.append(f"# TYPE {name} {kind}")
                for (n, labels), v in sorted(self._values.items()):
                    if n == name:
                        lines.append(f"{name}{_labels(labels)} {_num(v)}")
                for (n, labels), (counts, total, count) in sorted(self._hist.items()):
                    if n != name:
                        continue
                    for b, c in zip(self._buckets.get(name, self.buckets_s), counts):
                        lines.append(f"{name}_bucket{_labels(labels + (('le', _num(b)),))} {c}")
                    lines.append(f"{name}_bucket{_labels(labels + (('le', '+Inf'),))} {count}")
                    lines.append(f"{name}_sum{_labels(labels)} {_num(total)}")
                    lines.append(f"{name}_count{_labels(labels)} {count}")
        return "\n".join(lines) + "\n"


def _labels(labels: tuple) -> str:
    if not labels:
        return ""
    esc = (str(v).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") for _, v in labels)
    return "{" + ",".join(f'{k}="{v}"' for (k, _), v in zip(labels, esc)) + "}"


def _num(v: float) -> str:
    return repr(float(v)) if not float(v).is_integer() else str(int(v)) if abs(v) < 1e15 else repr(float(v))
