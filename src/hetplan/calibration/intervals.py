"""Prediction intervals: how far to trust an estimate, from the measured residuals of its regime.

Every iteration time hetplan prints is a point prediction of a cost model whose error has been measured on public
runs (``hetplan validate``). This module turns those measured errors into an 80 % prediction interval for a new
plan, by the regime the plan belongs to — (software stack, GPU generation, dense or MoE, scale band) — and states
how many rows stand behind it; a regime without enough rows says "unvalidated" instead of a number.

Method: split-conformal prediction on log residuals (Vovk et al. 2005; Lei et al. 2018, "Distribution-Free
Predictive Inference for Regression", JASA 113(523), Sec. 2.2). Each held-out validation row gives
``r = log(measured_time / predicted_time)``; for the ``n`` residuals of a regime, sorted ``r_(1) ≤ … ≤ r_(n)``, the
interval of a new prediction ``t`` is ``[t·exp(r_(k)), t·exp(r_(n+1-k))]`` with ``k = ⌊(1-level)/2·(n+1)⌋``, which
covers the measured value with probability ≥ ``level`` when the new run is exchangeable with the rows (each tail
holds at most ``(1-level)/2``). It needs ``k ≥ 1``, i.e. ``n ≥ 9`` rows for an 80 % interval
(:data:`MIN_ROWS`); below that the regime is widened (scale band dropped, then dense/MoE, then GPU generation),
and a stack with fewer than :data:`MIN_ROWS` rows is "unvalidated". The interval is asymmetric: a stack the
model predicts too fast has it above the prediction, which is the signed bias made visible.

A new user's runs are a new *source* (their cluster, their build, their release), and the rows of one source share
a bias: the residuals of a regime say how the sources hetplan has seen scatter, not how far the next one sits from
them. So the interval is that of a two-layer model (a source's shift, then the row's own residual; Dunn, Wasserman
& Ramdas 2023, "Distribution-Free Prediction Sets for Two-Layer Hierarchical Models", JASA 118(544), which predict
for a new group from the groups seen): the conformal rule runs on every sum ``r_i + δ_j`` of a regime row's log
residual and a *source shift* (:func:`source_shifts`: each validation set's median offset from the regime built
without it). Checked on the validation sets themselves (:func:`coverage`, each set judged by intervals built
without it): 64.9 % of rows held with the regime rows alone, 76.6 % with the shifts (the per-set mean 60.3 → 78.3
%), at a median width of ×1.26 → ×1.36 (high / low factor); in sample the share rises from 80.6 to 91.6 %, the
price of honesty towards a new source. As the model's terms remove the visible sets' biases their shifts shrink,
so the rule runs at :data:`CONFORMAL_LEVEL`, fitted so that the sets left out get the nominal coverage.

Only rows that no constant was fitted on (``is_calibration`` false) and that compare a whole iteration (a plan,
not one layer) enter: the residual table is written by :func:`build_residuals` (``hetplan validate
--write-residuals``) into ``validation_data/residuals.csv`` and read here, so planning costs no validation run;
a test keeps the file equal to what the current cost model gives.

Throughput, MFU, job time and $ follow the iteration time exactly (tokens/s and MFU are inverse to it, job time and
$ proportional), so their intervals are the same factors; energy carries the time factor only (the power model's
own error is not in it).
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Iterable

import numpy as np

from hetplan.hardware.catalog import Catalog, GPUSpec
from hetplan.calibration.validation import RATE_QUANTITIES  # rates (TFLOP/s, tokens/s): the time ratio inverts
from hetplan.hardware.stacks import FRAMEWORK_STACK  # the stack a framework runs by default (what export writes)

#: Nominal coverage of the intervals.
LEVEL = 0.8
#: Fewest rows for a conformal interval at :data:`LEVEL`: ``k = ⌊(1 - LEVEL)/2 · (n + 1)⌋ ≥ 1`` needs ``n ≥ 9``.
MIN_ROWS = 9
#: The level the conformal rule runs at on the residual + shift sums of the validation rows, so that the printed
#: :data:`LEVEL` holds for a new source: the smallest of :data:`CONFORMAL_LEVELS` whose leave-set-out coverage,
#: averaged over the validation sets (each set a source, :func:`coverage`), reaches :data:`LEVEL`
#: (:func:`fit_conformal_level`). Thirteen sources estimate the between-source spread too narrowly, the more so as
#: the model's terms remove each visible set's bias: at 0.80 the sets held out saw 78.6 % of their rows covered
#: (row-weighted 73.6 %), at 0.82 82.1 % (76.0 %). Checked nested (the level chosen without the set judged, 0.80-0.84
#: by set): 78.6 → 81.5 % per-set mean (docs/estimator.md, Intervals). With Megatron-Bridge's Blackwell rows (a
#: fourteenth source, GB300 20-26 % faster than priced) 0.82 gives 79.6 % per set and 0.84 82.5 % (row-weighted
#: 82.6 %). With the Grok-1 rows at the expert-TP their NeMo launches ran (``run_facts.toml``
#: ``[[dgxc.expert_tp_is_tp]]``), which removes that source's largest bias, 0.82 gives 80.0 % per set again (0.84:
#: 82.0 %; row-weighted 81.7 / 83.1 %). A user's own runs (:mod:`hetplan.calibration.user`) are one source,
#: exchangeable: they keep :data:`LEVEL`.
CONFORMAL_LEVEL = 0.82
#: The levels :func:`fit_conformal_level` tries, smallest first.
CONFORMAL_LEVELS = (0.80, 0.82, 0.84, 0.86, 0.88, 0.90)
#: Upper edges (GPUs) of the scale bands: one node, a rack-scale job, hundreds, beyond.
SCALE_BANDS = ((8, "≤8 GPUs"), (64, "9-64 GPUs"), (512, "65-512 GPUs"), (math.inf, ">512 GPUs"))
#: The stack each validation set's runs used, where the plan does not name one (sources: each set's README in
#: ``validation_data``): vTrain measured Megatron-DeepSpeed; SC'21 and Korthikanti Megatron-LM; DGX Cloud
#: benchmarking and NeMo's long-sequence tables NeMo; Espresso's traces DeepSpeed's pipeline engine; the Llama 3
#: paper Meta's own stack; the MoE model zoo Megatron-LM (Megatron-Core).
SET_STACK = {
    "vtrain_single_node": "megatron-deepspeed", "vtrain_multi_node": "megatron-deepspeed",
    "megatron_sc21_table1": "megatron-lm", "korthikanti_table5": "megatron-lm", "espresso_hetero": "deepspeed",
    "dgxc_h100": "nemo", "dgxc_gb200": "nemo", "long_context_cp": "nemo", "torchtitan": "torchtitan",
    "llama3_405b": "meta-llama3", "megatron_lm_h100": "megatron-lm", "moe_h100": "megatron-lm",
}

RESIDUALS_FILE = "residuals.csv"
COLUMNS = ("set", "key", "stack", "gpu", "generation", "moe", "num_gpus", "dtype", "predicted_time_s",
           "measured_time_s", "measured_mfu", "release", "recompute", "attention")


def stack_name(job) -> str:
    """The stack a job (a :class:`~hetplan.plan.Job` or its JSON dict) runs: its ``stack`` field
    (``NAME[@VERSION]``, the name only) where it has one, else its framework's default stack
    (:data:`FRAMEWORK_STACK`)."""
    get = job.get if isinstance(job, dict) else lambda k, d=None: getattr(job, k, d)
    stack = get("stack")
    if stack:
        return str(stack.get("name") if isinstance(stack, dict) else getattr(stack, "name", stack)).split("@")[0]
    framework = get("framework", "megatron")
    return FRAMEWORK_STACK.get(framework, framework)


def gpu_generation(gpu: GPUSpec) -> str:
    """GPU generation of a catalog GPU: its :attr:`~hetplan.hardware.catalog.GPUSpec.family` (``Ampere``,
    ``Hopper``, ``Blackwell`` …), or the first word of its ``architecture`` for a family the catalog does not know
    (e.g. ``hetplan verify``'s host CPU)."""
    return gpu.family.value if gpu.family is not None else gpu.architecture.split()[0]


def scale_band(num_gpus: int) -> str:
    """The label of the scale band (:data:`SCALE_BANDS`) ``num_gpus`` falls in."""
    return next(label for edge, label in SCALE_BANDS if num_gpus <= edge)


@dataclass(frozen=True)
class Residual:
    """One held-out validation row: its regime and measured vs predicted iteration time (s).

    Attributes:
        measured_mfu: the row's measured MFU (predicted MFU × predicted / measured time), hetplan's convention.
        release, recompute, attention: :func:`run_setup` of the row's plan.
    """

    set: str
    key: str
    stack: str
    gpu: str
    generation: str
    moe: bool
    num_gpus: int
    dtype: str
    predicted_time_s: float
    measured_time_s: float
    measured_mfu: float
    #: What the run ran (:func:`run_setup`): the stack release that priced it, its recomputation and attention.
    release: str = ""
    recompute: str = ""
    attention: str = ""
    #: :func:`scale_band` of ``num_gpus``, computed once: regimes are looked up over every row, per plan.
    band: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "band", scale_band(self.num_gpus))

    @property
    def log_ratio(self) -> float:
        """``log(measured / predicted)``: > 0 where the model predicts too fast."""
        return math.log(self.measured_time_s / self.predicted_time_s)


@dataclass(frozen=True)
class Interval:
    """An interval on the iteration time: ``[low_factor, high_factor] × predicted``.

    Attributes:
        level: nominal coverage (0.8). n: rows behind it. regime: what they share, e.g. ``torchtitan · Hopper ·
            dense``. source: ``validation`` (hetplan's held-out rows) or ``calibration`` (the user's runs).
        signed_median: median of ``measured / predicted - 1`` over those rows (the signed bias).
    """

    low_factor: float
    high_factor: float
    n: int
    regime: str
    level: float = LEVEL
    source: str = "validation"
    signed_median: float = 0.0

    def of(self, value: float) -> list[float]:
        """``[low, high]`` of a quantity proportional to the iteration time."""
        return [value * self.low_factor, value * self.high_factor]

    def of_inverse(self, value: float) -> list[float]:
        """``[low, high]`` of a quantity inverse to the iteration time (tokens/s, MFU)."""
        return [value / self.high_factor, value / self.low_factor]


def conformal_factors(log_ratios: Iterable[float], level: float = LEVEL) -> tuple[float, float] | None:
    """Split-conformal ``(low, high)`` multiplicative factors from log residuals (module doc), or None below the
    ``n`` that ``level`` needs."""
    r = np.sort(np.asarray(list(log_ratios), dtype=float))
    k = math.floor((1 - level) / 2 * (len(r) + 1) + 1e-9)  # 1e-9: (1 - 0.8) / 2 is 0.0999… in binary
    if k < 1:
        return None
    return float(np.exp(r[k - 1])), float(np.exp(r[len(r) - k]))


def _regime_keys(stack: str, generation: str, moe: bool, band: str) -> list[tuple[str, tuple]]:
    kind = "MoE" if moe else "dense"
    return [
        (f"{stack} · {generation} · {kind} · {band}", (stack, generation, moe, band)),
        (f"{stack} · {generation} · {kind}", (stack, generation, moe)),
        (f"{stack} · {generation}", (stack, generation)),
        (f"{stack}", (stack,)),
    ]


def _row_key(r: Residual, width: int) -> tuple:
    return (r.stack, r.generation, r.moe, r.band)[:width]


def _regime_rows(residuals: Iterable[Residual], stack: str, generation: str, moe: bool,
                 num_gpus: int) -> tuple[str, list[Residual]] | None:
    """The narrowest regime (module doc) with at least :data:`MIN_ROWS` rows of ``residuals``: its label and
    rows, or None."""
    for label, key in _regime_keys(stack, generation, moe, scale_band(num_gpus)):
        rows = [r for r in residuals if _row_key(r, len(key)) == key]
        if len(rows) >= MIN_ROWS:
            return label, rows
    return None


def _regime_center(rows: list[Residual]) -> float:
    """The median over the regime's sets of each set's median log residual (every source one vote)."""
    by_set: dict[str, list[float]] = {}
    for r in rows:
        by_set.setdefault(r.set, []).append(r.log_ratio)
    return float(np.median([np.median(v) for v in by_set.values()]))


def source_shifts(residuals: Iterable[Residual]) -> np.ndarray:
    """How far each source sits from the others: per validation set, the median over its rows of ``log(measured /
    predicted)`` minus the center (:func:`_regime_center`) of the row's regime built without that set; a set none
    of whose rows finds a regime without it (the only source of its stack) gives none. Shape ``(n_sets,)``, log
    units; ``[0.0]`` when no set gives one (one source: nothing is known of the next). Cost: O(sets · rows ·
    regimes)."""
    rows = list(residuals)
    out = []
    for name in sorted({r.set for r in rows}):
        rest = [r for r in rows if r.set != name]
        centers: dict[tuple, float | None] = {}
        d = []
        for r in rows:
            if r.set != name:
                continue
            key = (r.stack, r.generation, r.moe, scale_band(r.num_gpus))
            if key not in centers:
                found = _regime_rows(rest, *key[:3], r.num_gpus)
                centers[key] = None if found is None else _regime_center(found[1])
            if centers[key] is not None:
                d.append(r.log_ratio - centers[key])
        if d:
            out.append(float(np.median(d)))
    return np.asarray(out or [0.0])


def interval_from(residuals: list[Residual], stack: str, generation: str, moe: bool, num_gpus: int,
                  shifts: np.ndarray | None = None, level: float = CONFORMAL_LEVEL) -> Interval | str:
    """The interval of a plan of this regime from ``residuals``: the conformal rule (:func:`conformal_factors`, at
    ``level``: :data:`CONFORMAL_LEVEL`, for a nominal :data:`LEVEL`) on every sum of a row's log residual in the
    narrowest regime with at least :data:`MIN_ROWS` rows and a source shift (``shifts``, default
    :func:`source_shifts` of ``residuals``; module doc); or the reason it is unvalidated (a string)."""
    found = _regime_rows(residuals, stack, generation, moe, num_gpus)
    if found is None:
        n = sum(r.stack == stack for r in residuals)
        return (f"unvalidated: {n} held-out measured run{'s' if n != 1 else ''} of stack {stack} "
                f"(an {LEVEL:.0%} interval needs {MIN_ROWS})")
    label, rows = found
    shifts = source_shifts(residuals) if shifts is None else shifts
    f = conformal_factors((np.array([r.log_ratio for r in rows])[:, None] + shifts[None, :]).ravel(), level)
    assert f is not None  # n >= MIN_ROWS rows
    med = float(np.median([r.measured_time_s / r.predicted_time_s - 1 for r in rows]))
    return Interval(f[0], f[1], len(rows), label, signed_median=med)


@lru_cache(maxsize=1)
def load_residuals() -> tuple[Residual, ...]:
    """The package's residual table (``validation_data/residuals.csv``)."""
    text = resources.files("hetplan.calibration").joinpath("validation_data", RESIDUALS_FILE).read_text()
    return tuple(_parse(text))


@lru_cache(maxsize=1)
def package_shifts() -> np.ndarray:
    """:func:`source_shifts` of the package's residual table (computed once per process)."""
    return source_shifts(load_residuals())


def _parse(text: str) -> list[Residual]:
    out = []
    for row in csv.DictReader(io.StringIO(text)):
        out.append(Residual(row["set"], row["key"], row["stack"], row["gpu"], row["generation"], row["moe"] == "1",
                            int(row["num_gpus"]), row["dtype"], float(row["predicted_time_s"]),
                            float(row["measured_time_s"]), float(row["measured_mfu"]), row["release"],
                            row["recompute"], row["attention"]))
    return out


def residuals_csv(rows: Iterable[Residual]) -> str:
    """The residual table as CSV text (:data:`COLUMNS`; times to 9 significant digits)."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(COLUMNS)
    for r in rows:
        w.writerow([r.set, r.key, r.stack, r.gpu, r.generation, int(r.moe), r.num_gpus, r.dtype,
                    f"{r.predicted_time_s:.9g}", f"{r.measured_time_s:.9g}", f"{r.measured_mfu:.6g}", r.release,
                    r.recompute, r.attention])
    return buf.getvalue()


def case_stack(case) -> str:
    """The stack of a validation case: its plan's ``stack`` where set, else its set's (:data:`SET_STACK`); the
    independent set by source (fms-fsdp, NeMo 24.07, llm-foundry), ``moe_h100``'s AutoModel rows NeMo AutoModel,
    ``long_context_cp``'s torchtitan and Llama 3 rows theirs."""
    if getattr(case.plan.job, "stack", None):
        return stack_name(case.plan.job)
    if case.set == "independent_h100":
        return "fms-fsdp" if ":fms:" in case.key else "nemo" if ":nemo:" in case.key else "llm-foundry"
    if case.set == "moe_h100" and ":automodel:" in case.key:  # NeMo AutoModel's FSDP2 runs, not Megatron-Core's
        return "nemo-automodel"
    if case.set == "long_context_cp" and ":nemo:" not in case.key:  # torchtitan's CP rows, Llama 3's 128K row
        return "torchtitan" if case.plan.job.framework == "fsdp" else "meta-llama3"
    return SET_STACK.get(case.set, stack_name(case.plan.job))


def per_stack(cases) -> dict:
    """The validation error per stack (:func:`case_stack`; a case without a plan, a per-layer profile, by its
    set): ``{stack: {n, mape, max_abs_error, signed_median, sets}}`` over every row of the given cases (errors
    as :func:`hetplan.calibration.validation.metrics` counts them; ``signed_median``: predicted speed / measured
    speed - 1, positive = too fast), largest stack first."""
    from hetplan.calibration.validation import speed_error

    groups: dict[str, list] = {}
    for c in cases:
        if not (c.predicted > 0 and c.measured > 0):
            continue
        groups.setdefault(case_stack(c) if c.plan is not None else f"({c.set})", []).append(c)
    out = {}
    for stack, cs in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        err = np.array([c.predicted / c.measured - 1 for c in cs])
        out[stack] = {"n": len(cs), "mape": float(np.mean(np.abs(err))), "max_abs_error": float(np.max(np.abs(err))),
                      "signed_median": float(np.median([speed_error(c) for c in cs])),
                      "sets": sorted({c.set for c in cs})}
    return out


def build_residuals() -> list[Residual]:
    """Run every validation set with whole-iteration rows under the current cost model and return the held-out
    rows as residuals (several seconds: the whole of ``hetplan validate``)."""
    from hetplan.calibration import independent, modern
    from hetplan.calibration import validation as v
    from hetplan.estimate.estimator import estimate
    from hetplan.hardware.catalog import load_catalog

    _, cases = v.run_validation(v.SET_NAMES)
    cases += modern.run_modern(modern.SET_NAMES)[1]
    cases += independent.run_independent()[1]
    cases += independent.run_a100()[1]
    cat = load_catalog()
    out = []
    for c in cases:
        if c.plan is None or c.is_calibration or not (c.predicted > 0 and c.measured > 0):
            continue
        quantity = getattr(c, "quantity", "tflops_per_gpu" if c.set == "megatron_sc21_table1" else "iteration_time_s")
        est = estimate(c.plan, model=c.model, virtual_stages=c.virtual_stages)
        ratio = c.measured / c.predicted if quantity not in RATE_QUANTITIES else c.predicted / c.measured
        gpu = cat.get(c.plan.pools[c.plan.stages[0].pool].gpu)
        out.append(Residual(c.set, c.key, case_stack(c), gpu.name, gpu_generation(gpu), bool(c.model.is_moe),
                            c.plan.num_gpus, c.plan.job.dtype, est.iteration_time_s, est.iteration_time_s * ratio,
                            est.mfu / ratio, *run_setup(c.plan, stated_only=True)))
    return out


def write_residuals(path: Path | None = None) -> Path:
    """Write :func:`build_residuals` to ``path`` (default: the package's table) and return the path."""
    path = path or Path(str(resources.files("hetplan.calibration").joinpath("validation_data", RESIDUALS_FILE)))
    path.write_text(residuals_csv(build_residuals()))
    load_residuals.cache_clear()
    package_shifts.cache_clear()
    return path


def coverage(residuals: list[Residual], level: float = CONFORMAL_LEVEL) -> dict:
    """How often the 80 % intervals hold the measured time, per validation set: ``{set: {n, in_sample,
    leave_set_out, unvalidated_leave_set_out}}`` and ``"all"`` over every row (with ``leave_set_out_per_set``,
    the sets' mean: :func:`per_set_coverage`).

    ``in_sample``: share of the set's rows inside the interval of their regime built from every residual (what a
    plan like that row prints). ``leave_set_out``: the same with the set's own rows removed first — the coverage
    a new source of runs would see, the honest check of the intervals (Lei et al. 2018 assume exchangeable rows; a
    set from another lab or release is not); rows whose regime then has too few rows count as
    ``unvalidated_leave_set_out`` and are left out of the share; the source shifts are rebuilt without the set
    too. Cost: the shifts once per set (:func:`source_shifts`), then one regime lookup per distinct regime and
    set, so O(sets² · regimes · n_rows). ``level``: the conformal rule's (:func:`interval_from`)."""
    def share(rows, pool, shifts):
        hit = unval = 0
        memo: dict = {}  # the interval depends only on the regime: one lookup per distinct one
        for r in rows:
            key = (r.stack, r.generation, r.moe, scale_band(r.num_gpus))
            if key not in memo:
                memo[key] = interval_from(pool, r.stack, r.generation, r.moe, r.num_gpus, shifts, level)
            it = memo[key]
            if isinstance(it, str):
                unval += 1
                continue
            low, high = it.of(r.predicted_time_s)
            hit += low <= r.measured_time_s <= high
        return hit, len(rows) - unval, unval

    out: dict = {}
    totals = np.zeros(5)
    shifts = source_shifts(residuals)
    for name in sorted({r.set for r in residuals}):
        rows = [r for r in residuals if r.set == name]
        rest = [r for r in residuals if r.set != name]
        h_in, n_in, _ = share(rows, residuals, shifts)
        h_out, n_out, unval = share(rows, rest, source_shifts(rest))
        out[name] = {"n": len(rows), "in_sample": h_in / n_in if n_in else math.nan,
                     "leave_set_out": h_out / n_out if n_out else math.nan, "unvalidated_leave_set_out": unval}
        totals += (h_in, n_in, h_out, n_out, unval)
    out["all"] = {"n": len(residuals), "in_sample": totals[0] / max(totals[1], 1),
                  "leave_set_out": totals[2] / max(totals[3], 1), "unvalidated_leave_set_out": int(totals[4]),
                  "leave_set_out_per_set": per_set_coverage(out)}
    return out


def per_set_coverage(cov: dict, kind: str = "leave_set_out") -> float:
    """Mean over the validation sets of :func:`coverage`'s ``kind`` share (each set a source, weighted alike;
    sets without a share left out)."""
    shares = [v[kind] for k, v in cov.items() if k != "all" and v[kind] is not None and not math.isnan(v[kind])]
    return float(np.mean(shares)) if shares else math.nan


def fit_conformal_level(residuals: list[Residual], levels: Iterable[float] = CONFORMAL_LEVELS) -> float:
    """The smallest of ``levels`` at which the sets' mean leave-set-out coverage (:func:`per_set_coverage`) reaches
    :data:`LEVEL` (the last one when none does): :data:`CONFORMAL_LEVEL`. Cost: one :func:`coverage` per level
    tried (about a second each on the package's table)."""
    levels = tuple(levels)
    return next((x for x in levels if per_set_coverage(coverage(residuals, x)) >= LEVEL), levels[-1])


def run_setup(plan, stated_only: bool = False) -> tuple[str, str, str]:
    """``(release, recompute, attention)`` of a plan (a :class:`~hetplan.plan.Plan` or its JSON dict): the stack
    release that prices it (``megatron-lm@3.0``; with ``stated_only``, "" where the plan names no stack: a
    validation row whose source does not say which release ran), its stages' recomputation (``none``,
    ``selective``, ``full``; ``mixed`` where they differ) and its attention (``flash``, ``standard``, ``eager``) —
    what tells an MFU record of 2022 from a plan on today's software (:func:`annotate`)."""
    from hetplan.plan import Plan

    plan = plan if isinstance(plan, Plan) else Plan.model_validate(plan)
    recompute = {st.recompute for st in plan.stages}
    release = plan.job.stack_spec().id if plan.job.stack or not stated_only else ""
    return release, recompute.pop() if len(recompute) == 1 else "mixed", plan.job.attention


def _setup_words(field: str, value: str) -> str:
    """One :func:`run_setup` field in words: ``megatron-lm@3.0 of 2022-07``, ``selective recomputation`` (``no
    recomputation``), ``standard attention``."""
    if field == "release":
        from hetplan.hardware.stacks import resolve_stack

        return f"{value} of {resolve_stack(value).released}"
    if field == "recompute":
        return "no recomputation" if value == "none" else f"{value} recomputation"
    return f"{value} {field}"


def mfu_record(residuals: Iterable[Residual], stack: str, gpu: str, moe: bool | None = None) -> Residual | None:
    """The held-out validation run of ``stack`` on ``gpu`` with the highest measured MFU, or None; with ``moe``,
    among the runs of that kind only (dense or MoE: an MoE run's MFU counts its active parameters and sits well
    below a dense model's on the same GPU, so a dense plan above an MoE record says nothing)."""
    rows = [r for r in residuals if r.stack == stack and r.gpu == gpu and (moe is None or r.moe == moe)]
    return max(rows, key=lambda r: r.measured_mfu) if rows else None


def annotate(summary: dict, interval: Interval | str, record: Residual | None) -> None:
    """Add the interval fields to one plan summary (``hetplan plan --json``'s dict): ``interval`` (level, n,
    regime, source, signed median; or ``{"unvalidated": reason}``), ``iteration_time_s_interval``,
    ``tokens_per_s_interval``, ``mfu_interval``, ``job_time_s_interval``, ``job_usd_interval`` (and
    ``job_energy_kwh_interval`` when energy is there), each ``[low, high]``; ``mfu_record`` when the predicted
    MFU exceeds the best measured MFU of that stack on that GPU, with what the plan runs that the record did not
    (``differs``: release, recomputation, attention, :func:`run_setup`; empty where it runs the record's setup,
    which the note then says)."""
    if isinstance(interval, str):
        summary["interval"] = {"unvalidated": interval}
    else:
        summary["interval"] = {"level": interval.level, "n": interval.n, "regime": interval.regime,
                               "source": interval.source, "signed_median_error": interval.signed_median}
        for name in ("iteration_time_s", "job_time_s", "job_usd", "job_energy_kwh"):
            if name in summary:
                summary[f"{name}_interval"] = interval.of(summary[name])
        for name in ("tokens_per_s", "mfu"):
            summary[f"{name}_interval"] = interval.of_inverse(summary[name])
    if record is not None and summary["mfu"] > record.measured_mfu:
        ran = {"release": record.release, "recompute": record.recompute, "attention": record.attention}
        plan = dict(zip(ran, run_setup(summary["plan"]))) if "plan" in summary else {}
        differs = {k: v for k, v in plan.items() if ran[k] and v != ran[k]}
        record_setup = ", ".join(_setup_words(k, v) for k, v in ran.items() if v)
        why = ("; this plan runs " + ", ".join(_setup_words(k, v) for k, v in differs.items())
               if differs else "; this plan runs the same release, recomputation and attention" if plan else "")
        summary["mfu_record"] = {"mfu": record.measured_mfu, "set": record.set, "key": record.key, "run": ran,
                                 "differs": differs,
                                 "note": f"predicted MFU {summary['mfu']:.1%} is above the best measured for "
                                         f"{record.stack} on {record.gpu}: {record.measured_mfu:.1%} "
                                         f"({_closed_parts(record.key)}"
                                         + (f": {record_setup}" if record_setup else "") + ")" + why}


def _closed_parts(key: str) -> str:
    """A validation row key (``set:index:model:...``) for a sentence: a part cut inside a parenthesis (the model
    name cut at 20 characters, ``GPT 16B (Megatron we``) closed with ``…)``, so the note's own parentheses pair."""
    return ":".join(part + "…)" * (part.count("(") - part.count(")")) for part in key.split(":"))


def add_intervals(summaries: list[dict], catalog: Catalog, calibration=None) -> None:
    """Annotate every plan summary in place (:func:`annotate`): from the user's calibration (its residuals, for
    plans on the GPUs and stack it was fitted on) or from hetplan's held-out validation rows."""
    from hetplan.model.spec import load_model

    for s in summaries:
        job = s["plan"]["job"]
        gpus = [catalog.get(st["gpu"]) for st in s["stages"]]
        moe = load_model(job["model"]).is_moe
        interval = plan_interval(job, gpus, moe, s["num_gpus"], calibration)
        annotate(s, interval, package_mfu_record(stack_name(job), gpus[0].name, moe))


@lru_cache(maxsize=256)
def package_mfu_record(stack: str, gpu: str, moe: bool) -> Residual | None:
    """:func:`mfu_record` of the package's residual table (once per stack, GPU and kind: a search annotates every
    plan it shows)."""
    return mfu_record(load_residuals(), stack, gpu, moe)


@lru_cache(maxsize=256)
def package_interval(stack: str, generation: str, moe: bool, num_gpus: int) -> Interval | str:
    """:func:`interval_from` the package's residual table and shifts (once per regime and GPU count)."""
    return interval_from(list(load_residuals()), stack, generation, moe, num_gpus, package_shifts())


def plan_interval(job, gpus: list[GPUSpec], moe: bool, num_gpus: int, calibration=None) -> Interval | str:
    """The 80 % interval of a plan of ``job`` (a :class:`~hetplan.plan.Job` or its JSON dict) on ``gpus`` (its
    stages' GPU specs) over ``num_gpus``: from the user's ``calibration``
    (:meth:`hetplan.calibration.user.Calibration.interval_for`) where it covers the plan's GPUs and stack, else
    from hetplan's held-out validation rows of its regime (:func:`interval_from`); a string where unvalidated."""
    stack = stack_name(job)
    covered = calibration.interval_for({g.name for g in gpus}, stack) if calibration is not None else None
    if covered is not None:
        return covered
    return package_interval(stack, gpu_generation(gpus[0]), moe, num_gpus)
