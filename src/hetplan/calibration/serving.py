"""The ``serving`` validation set: published serving measurements against the engine-aware inference cost model.

Rows (``validation_data/serving/*.csv``, sources in the README there): engine release, GPU, model, weight / KV
dtypes, TP, how the benchmark drove the engine (``mode``), batch or concurrency, input and output lengths, and one
measured metric. Each row is predicted with :mod:`hetplan.estimate.inference` under its engine
(:mod:`hetplan.hardware.engines`); nothing here has a formula of its own beyond how a benchmark strings the
engine's steps together:

* ``static`` (TensorRT-LLM's ``gptSessionBenchmark``, vLLM's ``benchmark_latency``: one batch of ``B`` requests
  prefilled together, then decoded to the end): TTFT = one prefill of ``B`` prompts; end-to-end latency = the
  prefill plus ``out - 1`` decode steps; throughput = ``B · out`` over the prefill plus ``out - 1``
  decode steps whose cache grows from ``B · in`` to ``B · (in + out)`` tokens (the decode time is sampled at
  :data:`DECODE_SAMPLES` points of that growth and averaged: it is linear in the cached tokens);
* ``offline`` (all requests queued at once, ``trtllm-bench throughput``): ``B`` = the sequences of ``in + out``
  tokens the engine's KV budget holds, capped by its ``max_num_seqs`` (:func:`~hetplan.estimate.inference.max_num_seqs`);
  in steady state each step decodes ``B`` sequences at mean context ``in + out / 2`` and prefills the ``B / out``
  requests that replace the finished ones; throughput = ``B`` tokens per step. The requests are of one length
  (TensorRT-LLM ``perf-overview.md``, "Preparing a Dataset": ``--input-stdev=0 --output-stdev=0``), so a wave of
  ``B`` ends together and its successors prefill together, ``⌊max_num_batched_tokens / in⌋`` prompts to a pass
  (at least one, at most ``B``): a pass's kernel launches are shared by the prompts in it;
* ``concurrency`` (closed loop, ``vllm bench serve --max-concurrency C``): TPOT = one decode step of ``C``
  sequences plus the prefills of the other ``C - 1`` requests spread over their ``out`` steps, one prompt to a
  pass (each arrives when a request finishes).

Metrics (the project's convention, :mod:`hetplan.calibration.validation`): errors of time — predicted time /
measured time - 1, for a throughput row the time per output token — as MAPE, median and max |error|; the signed
median (bias) of predicted speed / measured speed - 1 (+ = predicted too fast).

Fitting (:func:`fit_engine_constants`, on a seeded half of the rows, :func:`is_calibration`, a hash of the row
key; the other half is held out and reported apart): ``hbm_efficiency`` (the fraction of the HBM peak the
engines' memory-bound kernels reach) and the ``step_overhead_s`` of releases with enough rows. Both fits end at
their grid bounds on today's rows (the sources pull apart: docs/serving.md), so ``engines.toml`` keeps
``hbm_efficiency`` = 1.0 (the fit) and the step overheads as unvalidated first guesses.

This module does not import torch.
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass, field
from typing import Mapping
from importlib import resources

import numpy as np

from hetplan.calibration.validation import _is_calibration, kendall_tau
from hetplan.estimate import inference
from hetplan.hardware.catalog import Catalog, load_catalog
from hetplan.hardware.engines import EngineCatalog, load_engines
from hetplan.model.spec import load_model

SET_NAME = "serving"
#: Target of issue 25 (MAPE, fraction).
TARGET = {"mape": 0.15}
#: Points of the cache's growth at which a static batch's decode step is costed.
DECODE_SAMPLES = 8
#: Share of the rows that fit ``hbm_efficiency``.
CALIBRATION_FRACTION = 0.5
CONVENTION = ("published serving benchmarks (TensorRT-LLM v0.6.1 and v1.0 perf tables, vLLM community sweep); "
              "throughput in output tokens/s, TTFT/TPOT in seconds; hbm_efficiency fitted on a seeded half")


def is_calibration(key: str) -> bool:
    """The row fits ``hbm_efficiency`` (a seeded hash of its key, :data:`CALIBRATION_FRACTION` of the rows)."""
    return _is_calibration(key, CALIBRATION_FRACTION)
_METRICS = ("ttft_s", "tpot_s", "e2e_s", "output_tokens_per_s", "output_tokens_per_s_per_gpu")
_MODES = ("static", "offline", "concurrency")
_TIME_METRICS = ("ttft_s", "tpot_s", "e2e_s")


@dataclass
class ServingCase:
    """One published serving measurement and its prediction (module docstring)."""

    key: str
    source: str
    row: dict
    measured: float
    predicted: float = math.nan
    info: dict = field(default_factory=dict)

    @property
    def error(self) -> float:
        """Time error, the project's convention: predicted time / measured time - 1 (for a throughput row, the
        time per token: measured / predicted - 1)."""
        ratio = self.predicted / self.measured
        return (ratio if self.row["metric"] in _TIME_METRICS else 1.0 / ratio) - 1.0

    @property
    def speed_error(self) -> float:
        """Predicted speed / measured speed - 1 (+ = predicted too fast)."""
        return 1.0 / (1.0 + self.error) - 1.0


def load_rows() -> list[dict]:
    """Every row of ``validation_data/serving/*.csv`` (file name in ``file``)."""
    root = resources.files("hetplan.calibration").joinpath("validation_data", "serving")
    rows = []
    for f in sorted((p for p in root.iterdir() if p.name.endswith(".csv")), key=lambda p: p.name):
        for r in csv.DictReader(io.StringIO(f.read_text())):
            r["file"] = f.name
            rows.append(r)
    return rows


def predict_row(r: dict, catalog: Catalog, engines: EngineCatalog, hbm_efficiency: float | None = None,
                step_overhead_s: Mapping[str, float] | None = None) -> tuple[float, dict]:
    """The row's metric under the cost model (module docstring) and what was assumed (``batch`` for offline);
    ``hbm_efficiency`` and ``step_overhead_s`` (``{engine label: seconds}``): trial values instead of the
    engine's (a fit)."""
    engine = engines.get(r["engine"])
    update: dict = {}
    if hbm_efficiency is not None:
        update["hbm_efficiency"] = hbm_efficiency
    if step_overhead_s and engine.label in step_overhead_s:
        update["step_overhead_s"] = step_overhead_s[engine.label]
    if update:
        engine = engine.model_copy(update=update)
    gpu = catalog.get(r["gpu"])
    m = load_model(r["model"])
    tp, i, o = int(r["tp"]), int(r["input_len"]), int(r["output_len"])
    kw = dict(tp=tp, engine=engine, weights=r["weights"])
    dt, kv = r["dtype"], r["kv_dtype"]
    mode, metric = r["mode"], r["metric"]
    if mode not in _MODES or metric not in _METRICS:
        raise ValueError(f"row {r['key']}: mode {mode!r} / metric {metric!r}")
    info: dict = {}
    if metric == "ttft_s":
        return inference.prefill_time_s(m, gpu, dt, i, batch=int(r["batch"]), **kw), info

    def decode_s(b: int, context: float) -> float:
        return inference.decode_step_time_s(m, gpu, dt, b, int(b * context), kv_dtype=kv, **kw)

    def prefill_gpu_s(n: float, per_pass: int = 1) -> float:
        """``n`` prompts' share of prefill passes that hold ``per_pass`` prompts each (no step overhead): a
        pass's kernel launches are paid once for every prompt in it."""
        if n <= 0:
            return 0.0
        whole = max(per_pass, math.ceil(n))
        return (inference.prefill_time_s(m, gpu, dt, i, batch=whole, **kw) - engine.step_overhead_s) * n / whole

    if mode == "static":
        b = int(r["batch"])
        ks = np.linspace(1, max(1, o - 1), DECODE_SAMPLES)
        decode = (o - 1) * float(np.mean([decode_s(b, i + k) for k in ks])) if o > 1 else 0.0
        total = inference.prefill_time_s(m, gpu, dt, i, batch=b, **kw) + decode
        if metric == "e2e_s":
            return total, info
        tput = b * o / total
    else:
        if mode == "offline":
            b = inference.max_num_seqs(m, gpu, engine, i + o, tp=tp, dtype=dt, weights=r["weights"], kv_dtype=kv)
            info["batch"] = b
            if b == 0:
                return math.nan, {"reason": "one sequence does not fit the KV budget"}
            others = b / o
            # equal lengths: a wave of b requests ends together and the next b prompts prefill together, as
            # many per pass as the engine's token budget holds
            per_pass = max(1, min(b, engine.max_num_batched_tokens // i)) if engine.max_num_batched_tokens else b
        else:
            b = int(r["batch"])
            others = (b - 1) / o
            per_pass = 1  # closed loop: each prompt arrives alone, when a request finishes
        step = decode_s(b, i + o / 2) + prefill_gpu_s(others, per_pass)
        if metric == "tpot_s":
            return step, info
        tput = b / step
    if metric == "output_tokens_per_s_per_gpu":
        tput /= tp
    return tput, info


def serving_cases(catalog: Catalog | None = None, engines: EngineCatalog | None = None,
                  hbm_efficiency: float | None = None, rows: list[dict] | None = None,
                  step_overhead_s: Mapping[str, float] | None = None) -> list[ServingCase]:
    """Every row (or ``rows``), predicted (trial constants: :func:`predict_row`)."""
    catalog = catalog or load_catalog()
    engines = engines or load_engines()
    out = []
    for r in load_rows() if rows is None else rows:
        c = ServingCase(r["key"], r["source"], r, float(r["measured"]))
        c.predicted, c.info = predict_row(r, catalog, engines, hbm_efficiency, step_overhead_s)
        out.append(c)
    return out


#: Least calibration rows of an engine release for its ``step_overhead_s`` to be fitted.
MIN_ROWS_TO_FIT = 8


def fit_engine_constants(rounds: int = 2, fit_overheads: bool = False) -> dict:
    """Fit ``hbm_efficiency`` (one value, in [0.5, 1], grid 0.01) by least calibration-half MAPE; with
    ``fit_overheads`` also the ``step_overhead_s`` of every engine release with at least :data:`MIN_ROWS_TO_FIT`
    calibration rows (in [0, 3 ms], grid 0.1 ms), coordinate by coordinate, ``rounds`` times. Returns
    ``{"hbm_efficiency": e, "step_overhead_s": {label: s}, "mape": m}`` (seconds to a minute of CPU: run by hand,
    not by the tests; the results are data in ``engines.toml``). The overheads are not stored: their fit runs to
    its grid bound (docs/serving.md)."""
    rows = [r for r in load_rows() if is_calibration(r["key"])]
    engines = load_engines()
    counts: dict[str, int] = {}
    for r in rows:
        label = engines.get(r["engine"]).label
        counts[label] = counts.get(label, 0) + 1
    fitted = {k: engines.get(k).step_overhead_s for k, n in counts.items() if n >= MIN_ROWS_TO_FIT}
    eff = engines.all()[0].hbm_efficiency

    def mape(e: float, over: Mapping[str, float]) -> float:
        return set_metrics(serving_cases(hbm_efficiency=float(e), rows=rows, step_overhead_s=over))["mape"]

    for _ in range(rounds if fit_overheads else 1):
        eff = float(min(np.arange(0.5, 1.0001, 0.01), key=lambda e: mape(e, fitted)))
        for label in fitted if fit_overheads else ():
            grid = np.arange(0.0, 3.0001e-3, 1e-4)
            fitted[label] = float(min(grid, key=lambda x: mape(eff, {**fitted, label: float(x)})))
    return {"hbm_efficiency": eff, "step_overhead_s": fitted, "mape": mape(eff, fitted)}


def _group(c: ServingCase) -> tuple:
    r = c.row
    return (r["source"], r["engine"], r["gpu"], r["model"], r["weights"], r["tp"], r["mode"], r["metric"])


def set_metrics(cases: list[ServingCase]) -> dict:
    """``n``, ``mape``, ``signed_median``, ``median_abs_error``, ``max_abs_error`` of the expressible rows, the
    count left out, and ``kendall_tau``: the pair-weighted mean rank agreement within groups of rows that differ
    only in lengths and batch (same source, engine, GPU, model, dtype, TP, mode, metric)."""
    ok = [c for c in cases if math.isfinite(c.predicted)]
    if not ok:
        return {"n": 0, "mape": math.nan, "signed_median": math.nan, "median_abs_error": math.nan,
                "max_abs_error": math.nan, "kendall_tau": math.nan, "not_expressible": len(cases)}
    err = np.array([c.error for c in ok])
    groups: dict[tuple, list[ServingCase]] = {}
    for c in ok:
        groups.setdefault(_group(c), []).append(c)
    num = den = 0.0
    for g in groups.values():
        tau, pairs = kendall_tau([c.predicted for c in g], [c.measured for c in g])
        if pairs and math.isfinite(tau):
            num, den = num + tau * pairs, den + pairs
    speed = np.array([c.speed_error for c in ok])
    return {"n": len(ok), "mape": float(np.mean(np.abs(err))), "signed_median": float(np.median(speed)),
            "median_abs_error": float(np.median(np.abs(err))), "max_abs_error": float(np.max(np.abs(err))),
            "kendall_tau": num / den if den else math.nan, "not_expressible": len(cases) - len(ok)}


def per_engine(cases: list[ServingCase]) -> dict:
    """The serving rows' error per engine release, in the shape of ``hetplan validate``'s per-stack table
    (:func:`hetplan.calibration.intervals.per_stack`): ``{engine: {n, mape, max_abs_error, signed_median, sets}}``."""
    out = {}
    for name in sorted({c.row["engine"] for c in cases}):
        m = set_metrics([c for c in cases if c.row["engine"] == name])
        out[name] = {k: m[k] for k in ("n", "mape", "max_abs_error", "signed_median")} | {"sets": [SET_NAME]}
    return out


def run_serving(catalog: Catalog | None = None) -> tuple[dict, list[ServingCase]]:
    """``({SET_NAME: metrics + held_out + per-source + rows worst first}, cases)``."""
    cases = serving_cases(catalog)
    for c in cases:
        c.info["calibration"] = is_calibration(c.key)
    res = set_metrics(cases)
    res["calibration"] = set_metrics([c for c in cases if c.info["calibration"]])
    res["held_out"] = set_metrics([c for c in cases if not c.info["calibration"]])
    res["convention"] = CONVENTION
    res["target"] = TARGET
    res["per_source"] = {s: set_metrics([c for c in cases if c.source == s]) for s in sorted({c.source for c in cases})}
    res["per_metric"] = {k: set_metrics([c for c in cases if c.row["metric"] == k])
                         for k in sorted({c.row["metric"] for c in cases})}
    res["rows"] = [{"key": c.key, "metric": c.row["metric"], "measured": c.measured, "predicted": c.predicted,
                    "error": c.error, "speed_error": c.speed_error, **c.info}
                   for c in sorted(cases, key=lambda c: -abs(c.error) if math.isfinite(c.predicted) else 0)]
    return {SET_NAME: res}, cases
