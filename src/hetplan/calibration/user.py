"""Calibration to a user's own runs (``hetplan calibrate RUNS -o calibration.toml``, ``--calibration FILE``).

A user who has measured their stack on their machines knows something hetplan's public rows do not. This module
reads those measured steps, fits the residual factors of the stack that the runs identify, and carries them (and
the user's own residuals, for the prediction intervals) into ``plan`` and ``estimate``.

The runs: a CSV whose columns are named after ``hetplan plan``'s flags (:data:`COLUMNS`; missing columns take the
defaults) plus the measured ``step_time_s`` (seconds per iteration) and optionally ``memory_gib``; or a column
``plan`` naming a plan JSON (relative to the CSV's folder). Each row becomes the plan ``hetplan plan`` proposes for
that row's pins (the search's best among what the pins leave open; pin every degree to price exactly one plan).

The factors (both multiply what the catalog and the node say, for the GPU types of the runs only):

* ``compute_factor`` on the GEMM efficiency of the GPU (``compute_efficiency``, ``fp8_compute_efficiency``): what a
  stack's GEMMs reach below the tuned recipes hetplan is fitted on (e.g. cuBLAS through eager PyTorch instead of
  Transformer Engine).
* ``attention_factor`` on the fused-attention rates (``attention_kernels``, ``attention_efficiency``): a stack's
  attention kernel (e.g. Triton FlashAttention instead of FA2/FA3/cuDNN), whose share of the step grows with the
  sequence length, so one factor on all compute cannot stand for it.
* ``comm_factor`` on the bandwidth of every link (GPU-GPU inside a node, the node's network): the collective
  efficiency of the stack's NCCL use (bucket sizes, channels, overlap it loses).

Fit: least squares on ``log(predicted / measured)`` over ``log`` of the factors (``scipy.optimize.least_squares``,
bounded to [:data:`FACTOR_MIN`, :data:`FACTOR_MAX`]). Identification: a factor is fitted only when the runs move
with it: fitted together, its standard error from the Gauss-Newton covariance ``s²·(JᵀJ)⁻¹`` (``J`` the
sensitivities ``∂ log t / ∂ log f``, ``s²`` the residual variance; Seber & Wild 1989, "Nonlinear Regression",
Sec. 2.1) is at most :data:`MAX_LOG_SE` and the fit is inside the bounds; otherwise it stays 1, the reason is
written, and the others are refitted without it. Leave-one-out: each run predicted by the factors fitted on the others; its residuals
are the calibration's error and, through :mod:`hetplan.calibration.intervals`, the interval of every plan on the
runs' GPUs and stack.
"""

from __future__ import annotations

import datetime
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from hetplan.calibration.intervals import LEVEL, MIN_ROWS, Interval, conformal_factors, stack_name
from hetplan.errors import HetplanError
from hetplan.hardware.catalog import ATTENTION_KERNELS, FLASH_TO_GEMM_RATIO, Catalog, GPUSpec
from hetplan.model.spec import ModelSpec
from hetplan.plan import GPUPool, Plan

#: CSV columns -> (table, field, type): ``job`` fields, the one ``pool``, ``pin`` fields — the names of
#: ``hetplan plan``'s flags (``--seq-len`` is ``seq_len``; ``gpus`` the pool's count; ``inter_node_gbit`` in Gb/s) —
#: and ``plan`` fields no search enumerates, set on the plan the pins give (``fsdp_shard``: HSDP's shard group,
#: :attr:`hetplan.plan.Plan.fsdp_shard`).
COLUMNS: dict[str, tuple[str, str, type]] = {
    "model": ("job", "model", str), "seq_len": ("job", "seq_len", int), "global_batch": ("job", "global_batch", int),
    "dtype": ("job", "dtype", str), "attention": ("job", "attention", str), "framework": ("job", "framework", str),
    "stack": ("job", "stack", str), "attention_kernel": ("job", "attention_kernel", str),
    "torch_compile": ("job", "torch_compile", bool), "fp8_recipe": ("job", "fp8_recipe", str),
    "moe_capacity_factor": ("job", "moe_capacity_factor", float),
    "moe_pad_to_capacity": ("job", "moe_pad_to_capacity", bool), "mtp_layers": ("job", "mtp_layers", int),
    "gpu": ("pool", "gpu", str), "gpus": ("pool", "count", int), "node": ("pool", "node", str),
    "gpus_per_node": ("pool", "gpus_per_node", int), "inter_node_gbit": ("pool", "inter_node_bandwidth_bytes_per_s", float),
    "network": ("pool", "network", str),
    "tp": ("pin", "tp", int), "pp": ("pin", "pp", int), "dp": ("pin", "dp", int), "cp": ("pin", "cp", int),
    "ep": ("pin", "ep", int), "mbs": ("pin", "mbs", int), "zero": ("pin", "zero", int),
    "recompute": ("pin", "recompute", str), "virtual_stages": ("pin", "virtual_stages", int),
    "fsdp_shard": ("plan", "fsdp_shard", int),
}
MEASURED = ("step_time_s", "memory_gib")
FACTOR_MIN, FACTOR_MAX = 0.2, 2.0
#: Largest |log(measured / predicted)| a calibration file may hold: a run 100x away from its prediction is a wrong
#: row (a unit slip, ms for s), not a residual, and exp() of the 1e300 a damaged file held overflowed the interval
#: to Infinity / NaN in `plan --json` (fuzz).
MAX_ABS_LOG_RATIO = math.log(100.0)
_RATIO_WHY = "a run 100x off its prediction is a wrong row (units), not a residual"
#: Largest standard error (of ``log f``) at which the runs identify a factor: ±10 %.
MAX_LOG_SE = 0.1
#: Largest ``|∂ log t / ∂ log f|`` over the runs below which no run depends on a factor (:func:`identified`): a
#: 1 % change of the factor moves no step by 1e-6 of itself.
ZERO_SENSITIVITY = 1e-4


@dataclass
class Run:
    """One measured run: its number, plan, model, measurements (s, bytes) and where it came from (``row 3``,
    ``train.log``)."""

    row: int
    plan: Plan
    model: ModelSpec
    step_time_s: float
    memory_bytes: float | None = None
    label: str = ""


def _cell(raw: str, col: str, typ: type, row: str):
    if typ is bool:
        if raw.lower() not in ("true", "false", "1", "0"):
            raise HetplanError(f"{row}: {raw!r} is not true or false", field=f"runs.{col}", fix="write true or false")
        return raw.lower() in ("true", "1")
    kind = {int: "an integer", float: "a number", str: "text"}[typ]
    try:
        value = typ(float(raw)) if typ is int and raw.strip().replace(".", "", 1).isdigit() else typ(raw)
    except ValueError:
        raise HetplanError(f"{row}: {raw!r} is not {kind}", field=f"runs.{col}",
                           fix=f"write {kind} in column {col}") from None
    if typ is int and (value != float(raw)):
        raise HetplanError(f"{row}: {raw!r} is not a whole number", field=f"runs.{col}", fix="write an integer")
    return value


def _positive(raw: str | None, col: str, row: str) -> float | None:
    if raw is None or not raw.strip():
        return None
    try:
        x = float(raw)
    except ValueError:
        raise HetplanError(f"{row}: {raw!r} is not a number", field=f"runs.{col}",
                           fix=f"write the measured {col} as a number") from None
    if not (math.isfinite(x) and x > 0):
        raise HetplanError(f"{row}: {col} = {raw} is not a positive, finite measurement", field=f"runs.{col}",
                           fix="remove the row or give the measured value")
    return x


def _rows(path: Path, defaults: dict[str, str]) -> list[tuple[str, dict[str, str], set[str]]]:
    """``(label, row, columns the flags filled)`` of each run in a RUNS CSV or a training log
    (:mod:`hetplan.calibration.logs`), with ``defaults`` (``hetplan calibrate``'s flags) filling the columns a row
    leaves empty.

    Raises:
        HetplanError: unreadable or empty file, unknown columns, no ``step_time_s`` column.
    """
    from hetplan.calibration.logs import finish_row, is_log, log_row
    from hetplan.inputs import read_csv, read_text

    text = read_text(path, "RUNS")
    if is_log(text):
        row = log_row(text, str(path))
        return [(f"{path.name}", finish_row({**defaults, **row}, str(path)), set(defaults) - set(row))]
    header, rows = read_csv(text, str(path), "RUNS")
    if not header or not rows:
        raise HetplanError(f"{path} has no runs", field="RUNS",
                           fix="give a CSV with a header line and one row per run, or a Megatron-LM / torchtitan log")
    unknown = [c for c in header if c not in COLUMNS and c not in MEASURED and c != "plan"]
    if unknown:
        raise HetplanError(f"unknown column(s) {', '.join(unknown)}", field="RUNS",
                           fix=f"use the columns {', '.join([*COLUMNS, 'plan', *MEASURED])}")
    if "step_time_s" not in header:
        raise HetplanError("no step_time_s column", field="RUNS.step_time_s",
                           fix="add the measured seconds per iteration as column step_time_s")
    out = []
    for i, r in enumerate(rows, start=2):
        given = {k: v for k, v in r.items() if v is not None and v.strip()}
        extra = [c for c in given if c in COLUMNS] if "plan" in given else []
        if extra:
            raise HetplanError(f"row {i} names a plan file and gives {', '.join(extra)} too", field=f"runs.{extra[0]}",
                               fix="a plan file describes the whole run: leave its row's other columns empty, or "
                                   "drop the plan cell")
        flags = set() if "plan" in given else set(defaults) - set(given)
        out.append((f"row {i}", given if "plan" in given else {**defaults, **given}, flags))
    return out


def read_runs(paths: list[Path], catalog: Catalog, defaults: dict[str, str] | None = None, progress=None) -> list[Run]:
    """The runs of RUNS CSVs and training logs (module doc), each built into the plan ``hetplan plan`` gives for
    its pins; ``defaults`` fill the columns a run does not give (``hetplan calibrate``'s flags).

    Raises:
        HetplanError: unreadable or empty file, no ``step_time_s`` column, an unknown column, a value that is not
            of its column's type, a NaN / negative / zero measurement, a memory above the GPU's, a row that names a
            plan file and other run columns, or a row whose job or plan is invalid (the message names the row and
            the column).
    """
    from hetplan.inputs import read_table
    from hetplan.jobfile import validated
    from hetplan.model.spec import load_model

    out = []
    for path in paths:
        for label, r, flags in _rows(path, defaults or {}):
            step = _positive(r.get("step_time_s"), "step_time_s", label)
            if step is None:
                raise HetplanError(f"{label}: step_time_s is empty", field="runs.step_time_s",
                                   fix="give every run its measured seconds per iteration")
            mem = _positive(r.get("memory_gib"), "memory_gib", label)
            if r.get("plan"):
                try:  # named by the column, not by the plan file's path
                    data = read_table(path.parent / r["plan"], "runs.plan")
                except HetplanError as exc:
                    raise HetplanError(f"{label}: {exc.message}", field="runs.plan", fix=exc.fix) from None
                plan = validated(Plan, data, f"runs.plan ({label})")
            else:
                try:
                    plan = _plan_of(r, label, catalog)
                except HetplanError as exc:  # a value a flag filled in is named by the flag: the file has no column
                    col = (exc.field or "").removeprefix("runs.")
                    if col in flags:
                        exc.field = f"--{col}"
                    raise
            _check_memory(plan, mem, label, catalog)
            out.append(Run(len(out) + 1, plan, load_model(plan.job.model), step, None if mem is None else mem * 2**30,
                           f"{path.name} {label}" if len(paths) > 1 and label != path.name else label))
            if progress is not None:
                progress()
    return out


def _check_memory(plan: Plan, memory_gib: float | None, label: str, catalog: Catalog) -> None:
    """A measured footprint no GPU of the run holds (more than its device memory) is a wrong unit or column.

    Raises:
        HetplanError: ``memory_gib`` above the largest device memory among the run's GPUs (field runs.memory_gib)."""
    if memory_gib is None:
        return
    cap = max(catalog.get(p.gpu).memory_bytes for p in plan.pools) / 2**30
    if memory_gib > cap:
        raise HetplanError(f"{label}: memory_gib = {memory_gib:g} is more than a {plan.pools[0].gpu} holds "
                           f"({cap:.0f} GiB)", field="runs.memory_gib",
                           fix="give the peak memory of one GPU in GiB (nvidia-smi's MiB / 1024, or "
                               "torch.cuda.max_memory_reserved() / 2**30), or leave it empty")


def _column_of(field: str | None) -> str | None:
    """The column of :data:`COLUMNS` that sets the field an error names (``inventory[0].gpu`` -> ``gpu``,
    ``pools.0.count`` -> ``gpus``, ``pin.tp`` -> ``tp``): the one setting the field's last name; None when no
    column sets it. The pins' ``num_gpus`` is the ``gpus`` column too (:func:`_plan_of`)."""
    names = re.findall(r"[A-Za-z_][A-Za-z0-9_]*", field or "")  # fp8_recipe, not fp and _recipe
    last = "count" if names[-1:] == ["num_gpus"] else names[-1] if names else None
    return next((col for col, (_, name, _) in COLUMNS.items() if name == last), None)


def _plan_of(r: dict[str, str], label: str, catalog: Catalog) -> Plan:
    """The plan ``hetplan plan`` proposes for a run's columns (its pins fixed)."""
    from hetplan.hardware.catalog import load_nodes
    from hetplan.jobfile import validated
    from hetplan.plan import Inventory, Job
    from hetplan.search.objective import Objective
    from hetplan.search.planner import search_plans
    from hetplan.search.space import Pins

    parts: dict[str, dict] = {"job": {}, "pool": {}, "pin": {}, "plan": {}}
    for col, raw in r.items():
        if col in COLUMNS:
            table, name, typ = COLUMNS[col]
            value = _cell(raw.strip(), col, typ, label)
            parts[table][name] = value * 1e9 / 8 if col == "inter_node_gbit" else value
    for need in ("model", "seq_len", "global_batch"):
        if need not in parts["job"]:
            raise HetplanError(f"{label}: no {need}", field=f"runs.{need}",
                               fix=f"add column {need} (or pass --{need.replace('_', '-')})")
    if "gpu" not in parts["pool"] or "count" not in parts["pool"]:
        raise HetplanError(f"{label}: no gpu / gpus", field="runs.gpu", fix="add columns gpu and gpus (or pass --gpu, --gpus)")
    try:
        job = validated(Job, parts["job"], "job")
        if "node" in parts["pool"]:  # the pool's own check names its error pools.0, not the node
            load_nodes().get(parts["pool"]["node"], field="node")
        inv = validated(Inventory, {"pools": [parts["pool"]]}, "inventory")
        pins = validated(Pins, {"num_gpus": parts["pool"]["count"], **parts["pin"]}, "pin")
        plan = search_plans(job, inv, Objective(), pins, top_k=1, catalog=catalog, heterogeneous=False).plans[0].plan
        if parts["plan"]:
            plan = validated(Plan, {**plan.model_dump(), **parts["plan"]}, "plan")
    except HetplanError as exc:  # named by the run's column (runs.gpus), not the plan's field (pools.0.count)
        col = _column_of(exc.field)
        raise HetplanError(f"{label}: {_in_columns(exc.message)}",
                           field=f"runs.{col}" if col else f"runs ({label}) {exc.field}",
                           fix=exc.fix and _in_columns(exc.fix)) from None
    return plan


def _in_columns(text: str) -> str:
    """A ``hetplan plan`` message about its pins in a RUNS row's terms: its flags as the row's columns
    (``--use-gpus 6`` -> ``gpus = 6``, ``pin --tp to 4`` -> ``set tp to 4``, ``unpin zero`` -> ``leave zero
    empty``): the fix "pin --use-gpus to a multiple of 4" named a flag calibrate does not have."""
    text = re.sub(r"--use-gpus\b", "--gpus", text)
    text = re.sub(r"--([a-z][a-z0-9-]*)( \d+\b)?", lambda m: m.group(1).replace("-", "_") + (
        f" ={m.group(2)}" if m.group(2) else ""), text)
    text = re.sub(r"\bunpin ((?:\w+ ?/ ?)*\w+)", r"leave \1 empty",
                  text.replace("unpin a degree", "leave a degree column empty"))
    return re.sub(r"\bpin\b", "set", text)


@dataclass(frozen=True)
class Calibration:
    """Fitted factors and the residuals behind them (a ``calibration.toml``).

    Attributes:
        compute_factor, attention_factor, comm_factor: module doc (1 = not fitted). gpus: the GPU types they
            apply to.
        stacks: the stacks of the runs (intervals use the calibration for plans of these stacks and GPUs).
        loo_log_ratios: leave-one-out ``log(measured / predicted)`` per run (the intervals' residuals).
        not_identified: factor -> why the runs could not fit it.
    """

    compute_factor: float = 1.0
    comm_factor: float = 1.0
    gpus: tuple[str, ...] = ()
    stacks: tuple[str, ...] = ()
    loo_log_ratios: tuple[float, ...] = ()
    not_identified: dict = field(default_factory=dict)
    memory_signed_median: float | None = None
    attention_factor: float = 1.0

    def factors(self) -> tuple[float, float, float]:
        """The factors in :data:`FACTORS` order."""
        return self.compute_factor, self.attention_factor, self.comm_factor

    def _gpu(self, gpu: GPUSpec) -> GPUSpec:
        f, fa = self.compute_factor, self.attention_factor
        ce = min(1.0, gpu.compute_efficiency * f)
        # a kernel the catalog has no rate for runs at the GEMM efficiency x FLASH_TO_GEMM_RATIO
        # (GPUSpec.flash_attention_efficiency): written out here, so that the attention factor scales it too —
        # without it the factor moved no run on such a GPU (GB200) and was never identified
        # (Triton without a rate of its own takes FlashAttention-2's, rate and causal efficiency: left to that rule)
        kernels = {k: gpu.attention_kernels.get(k, (ce * FLASH_TO_GEMM_RATIO[0], ce * FLASH_TO_GEMM_RATIO[1]))
                   for k in (*ATTENTION_KERNELS, *gpu.attention_kernels) if k != "triton" or k in gpu.attention_kernels}
        update = {"compute_efficiency": ce,
                  "gpu_link_bandwidth_bytes_per_s": gpu.gpu_link_bandwidth_bytes_per_s * self.comm_factor,
                  "attention_kernels": {k: (min(1.0, a * fa), min(1.0, b * fa)) for k, (a, b) in kernels.items()}}
        if gpu.fp8_compute_efficiency is not None:
            update["fp8_compute_efficiency"] = min(1.0, gpu.fp8_compute_efficiency * f)
        if gpu.attention_efficiency is not None:
            update["attention_efficiency"] = tuple(min(1.0, a * fa) for a in gpu.attention_efficiency)
        return gpu.model_copy(update=update)

    def apply_catalog(self, catalog: Catalog) -> Catalog:
        """``catalog`` with the factors applied to the calibrated GPU types."""
        gpus = {name: self._gpu(spec) if name in self.gpus else spec for name, spec in catalog.gpus.items()}
        return Catalog(gpus, catalog.date)

    def apply_pools(self, pools: list[GPUPool], catalog: Catalog) -> list[GPUPool]:
        """``pools`` with their links' bandwidth × ``comm_factor`` where the pool's GPU is calibrated."""
        out = []
        for p in pools:
            if catalog.get(p.gpu).name in self.gpus and self.comm_factor != 1.0:
                upd = {"inter_node_bandwidth_bytes_per_s": p.inter_node_bandwidth_bytes_per_s * self.comm_factor}
                if getattr(p, "intra_node_bandwidth_bytes_per_s", None) is not None:
                    upd["intra_node_bandwidth_bytes_per_s"] = p.intra_node_bandwidth_bytes_per_s * self.comm_factor
                p = p.model_copy(update=upd)
            out.append(p)
        return out

    def interval_for(self, gpus: set[str], stack: str) -> Interval | None:
        """The interval from the user's leave-one-out residuals for a plan on ``gpus`` (catalog names) of
        ``stack`` when they are the calibrated GPUs and stack; None for any other plan. Below :data:`MIN_ROWS` runs: the range of the residuals (coverage not guaranteed,
        the regime label says so)."""
        if stack not in self.stacks or not gpus <= set(self.gpus) or not self.loo_log_ratios:
            return None
        r = np.asarray(self.loo_log_ratios)
        f = conformal_factors(r)
        label = f"your {len(r)} runs ({', '.join(self.stacks)} on {', '.join(self.gpus)})"
        if f is None:
            f = (float(np.exp(r.min())), float(np.exp(r.max())))
            label += f"; range of {len(r)} residuals (< {MIN_ROWS}: no {LEVEL:.0%} guarantee)"
        return Interval(f[0], f[1], len(r), label, source="calibration",
                        signed_median=float(np.median(np.exp(r) - 1)))

    def to_toml(self, runs_path: str, loo: dict) -> str:
        """The calibration as TOML text (:func:`load_calibration` reads it back)."""
        def arr(xs) -> str:
            return "[" + ", ".join(f'"{x}"' if isinstance(x, str) else f"{x:.9g}" for x in xs) + "]"
        lines = ["# hetplan calibration: factors fitted to measured runs (hetplan calibrate; docs/calibration.md)",
                 "[calibration]", f'created = "{datetime.date.today().isoformat()}"', f'runs = "{runs_path}"',
                 f"gpus = {arr(self.gpus)}", f"stacks = {arr(self.stacks)}",
                 f"compute_factor = {self.compute_factor:.9g}", f"attention_factor = {self.attention_factor:.9g}",
                 f"comm_factor = {self.comm_factor:.9g}",
                 f"loo_log_ratios = {arr(self.loo_log_ratios)}"]
        if self.memory_signed_median is not None:
            lines.append(f"memory_signed_median = {self.memory_signed_median:.9g}")
        lines += ["", "[calibration.not_identified]"] + [f'{k} = "{v}"' for k, v in self.not_identified.items()]
        lines += ["", "[calibration.leave_one_out]"] + [f"{k} = {v:.9g}" for k, v in loo.items()]
        return "\n".join(lines) + "\n"


def load_calibration(path: Path) -> Calibration:
    """A ``calibration.toml`` written by ``hetplan calibrate``.

    Raises:
        HetplanError: unreadable, not TOML, no ``[calibration]`` table, or factors that are not positive numbers.
    """
    from hetplan.inputs import parse_toml, read_text

    data = parse_toml(read_text(path, "--calibration"), str(path), "--calibration").get("calibration")
    if not isinstance(data, dict):
        raise HetplanError(f"{path} has no [calibration] table", field="--calibration",
                           fix="give a file written by `hetplan calibrate RUNS -o FILE`")
    try:
        c = Calibration(float(data["compute_factor"]), float(data["comm_factor"]), tuple(map(str, data["gpus"])),
                        tuple(str(x).split("@")[0] for x in data["stacks"]),  # plans match by stack name
                        tuple(float(x) for x in data.get("loo_log_ratios", ())),
                        dict(data.get("not_identified", {})), data.get("memory_signed_median"),
                        float(data.get("attention_factor", 1.0)))
    except (KeyError, TypeError, ValueError) as exc:
        raise HetplanError(f"{path}: missing or invalid field {exc}", field="--calibration",
                           fix="regenerate it with `hetplan calibrate RUNS -o FILE`") from None
    for name in ("gpus", "stacks", "loo_log_ratios"):
        if not isinstance(data.get(name, []), list):
            raise HetplanError(f"{name} = {data[name]!r} is not a list", field=f"calibration.{name}",
                               fix="regenerate the file with `hetplan calibrate`")
    bad = [r for r in c.loo_log_ratios if not abs(r) <= MAX_ABS_LOG_RATIO]
    if bad:
        raise HetplanError(f"loo_log_ratios holds {bad[0]}: a run's log(measured / predicted) must be finite and "
                           f"within ±{MAX_ABS_LOG_RATIO:.2f} (100x): {_RATIO_WHY}",
                           field="calibration.loo_log_ratios", fix="regenerate the file with `hetplan calibrate`")
    m = c.memory_signed_median
    if m is not None and not (isinstance(m, (int, float)) and -1 < m <= 99):
        raise HetplanError(f"memory_signed_median = {m!r} must be a number in (-1, 99] (a relative error: "
                           "predicted / measured - 1 of a positive memory)", field="calibration.memory_signed_median",
                           fix="regenerate the file with `hetplan calibrate`")
    for name in FACTORS:
        x = getattr(c, name)
        if not (math.isfinite(x) and FACTOR_MIN <= x <= FACTOR_MAX):
            raise HetplanError(f"{name} = {x} is outside [{FACTOR_MIN}, {FACTOR_MAX}]", field=f"calibration.{name}",
                               fix="regenerate the file with `hetplan calibrate`")
    return c


def _predict(runs: list[Run], catalog: Catalog, c: Calibration) -> np.ndarray:
    """Each run's predicted step time under ``c``'s factors where ``c`` covers the run's stack, else without them
    (``plan --calibration`` refuses a job of another stack)."""
    from hetplan.estimate.estimator import estimate

    cat = c.apply_catalog(catalog)
    return np.array([estimate(r.plan.model_copy(update={"pools": c.apply_pools(r.plan.pools, catalog)}),
                              catalog=cat, model=r.model).iteration_time_s if stack_name(r.plan.job) in c.stacks
                     else estimate(r.plan, catalog=catalog, model=r.model).iteration_time_s for r in runs])


#: The fitted factors, in the order of :meth:`Calibration.factors` and of every factor vector here.
FACTORS = ("compute_factor", "attention_factor", "comm_factor")
#: What each factor's share of the step is, for the message when the runs do not identify it.
SHARES = {"compute_factor": "GEMM", "attention_factor": "attention (sequence length)",
          "comm_factor": "communication (TP, DP, node count)"}


def _with(base: Calibration, f: tuple[float, ...] | list[float]) -> Calibration:
    return Calibration(compute_factor=f[0], attention_factor=f[1], comm_factor=f[2], gpus=base.gpus,
                       stacks=base.stacks)


def _fit_factors(runs: list[Run], catalog: Catalog, base: Calibration, free: tuple[bool, ...]) -> list[float]:
    from scipy.optimize import least_squares

    meas = np.log([r.step_time_s for r in runs])
    idx = [i for i, f in enumerate(free) if f]
    if not idx:
        return [1.0] * len(FACTORS)

    def full(x: np.ndarray) -> list[float]:
        f = [1.0] * len(FACTORS)
        for j, i in enumerate(idx):
            f[i] = float(np.exp(x[j]))
        return f

    def resid(x: np.ndarray) -> np.ndarray:
        return np.log(_predict(runs, catalog, _with(base, full(x)))) - meas

    lo, hi = math.log(FACTOR_MIN), math.log(FACTOR_MAX)
    sol = least_squares(resid, np.zeros(len(idx)), bounds=([lo] * len(idx), [hi] * len(idx)), diff_step=1e-3)
    return full(sol.x)


def sensitivities(runs: list[Run], catalog: Catalog, base: Calibration, step: float = 0.01) -> np.ndarray:
    """``∂ log t / ∂ log f`` of every run for each factor (n × 3, :data:`FACTORS` order), by central differences."""
    cols = []
    f0 = list(base.factors())
    for k in range(len(FACTORS)):
        up, dn = list(f0), list(f0)
        up[k], dn[k] = f0[k] * math.exp(step), f0[k] * math.exp(-step)
        cols.append((np.log(_predict(runs, catalog, _with(base, up)))
                     - np.log(_predict(runs, catalog, _with(base, dn)))) / (2 * step))
    return np.stack(cols, axis=1)


def layouts(runs: list[Run]) -> list[int]:
    """Each run's layout: the index of the first run with the same plan. A run measured again is one more
    measurement of one layout, not one more equation: three copies of one row fitted two factors exactly (residual
    variance 0, so standard errors 0) and predicted each copy "left out" from the others to 1e-12."""
    plans: list[Plan] = []
    out = []
    for r in runs:
        out.append(next((i for i, p in enumerate(plans) if p == r.plan), len(plans)))
        if out[-1] == len(plans):
            plans.append(r.plan)
    return out


def identified(runs: list[Run], catalog: Catalog, base: Calibration) -> tuple[tuple[bool, ...], dict[str, str]]:
    """Which factors the runs identify (module doc) and, for the others, why not. At most one factor fewer than
    the runs' distinct layouts (:func:`layouts`) is fitted (one degree of freedom is left to judge them). A factor no run's step moves with (e.g. the
    attention factor where every run's attention is unfused, ``attention = "standard"``, whose kernels it does not
    scale) is set aside first: left in, it makes ``JᵀJ`` singular and every factor's standard error unbounded, and
    the factor that does move the runs would be the one dropped. Among factors the runs cannot tell apart, the one
    they move least with is dropped."""
    free = [True] * len(FACTORS)
    why: dict[str, str] = {}
    n = len(set(layouts(runs)))
    moves = np.abs(sensitivities(runs, catalog, base)).max(axis=0)
    for k in range(len(FACTORS)):
        if moves[k] < ZERO_SENSITIVITY:
            free[k] = False
            why[FACTORS[k]] = (f"no run's step depends on it (the {SHARES[FACTORS[k]]} share is 0 in every run): "
                               f"it stays 1; give runs that have that share if your plans will")
    while any(free):
        f = _fit_factors(runs, catalog, base, tuple(free))
        idx = [k for k in range(len(FACTORS)) if free[k]]
        J = sensitivities(runs, catalog, _with(base, f))[:, idx]
        r = np.log(_predict(runs, catalog, _with(base, f)) / np.array([x.step_time_s for x in runs]))
        dof = n - len(idx)
        try:  # a near-singular JᵀJ can give a negative variance: NaN, read below as not identified (no warning)
            with np.errstate(invalid="ignore"):
                se = np.sqrt(np.diag(float(r @ r) / max(dof, 1) * np.linalg.inv(J.T @ J)))
        except np.linalg.LinAlgError:
            se = np.full(len(idx), np.inf)
        if dof < 1:  # no degree of freedom left to judge them: drop the factor the runs move least with
            k = idx[int(np.argmin(np.linalg.norm(J, axis=0)))]
            free[k] = False
            runs_text = f"{len(runs)} runs" if n == len(runs) else f"{len(runs)} runs of {n} distinct layouts"
            why[FACTORS[k]] = (f"{runs_text} fit at most {n - 1} factor(s) and the runs move least with "
                               f"this one; give more runs that differ in the {SHARES[FACTORS[k]]} share of the step")
            continue
        bad = [(k, x) for k, x in zip(idx, se)
               if not (x <= MAX_LOG_SE) or not (FACTOR_MIN * 1.001 < f[k] < FACTOR_MAX / 1.001)]
        if not bad:
            break
        norms = np.linalg.norm(J, axis=0)
        k, x = max(bad, key=lambda b: (b[1] if math.isfinite(b[1]) else math.inf, -norms[idx.index(b[0])]))
        free[k] = False
        se_text = f"±{min(x, 99):.0%} in log" if math.isfinite(x) else "unbounded: the runs move with it as with another"
        why[FACTORS[k]] = (f"the runs do not pin it down (standard error {se_text}, fit {f[k]:.2f}): "
                           f"vary what changes the {SHARES[FACTORS[k]]} share of the step")
    return tuple(free), why


@dataclass
class FitReport:
    """What :func:`fit` found: the calibration, per-run predictions before / after / leave-one-out, and summary
    errors (fractions, ``predicted / measured - 1``)."""

    calibration: Calibration
    rows: list[dict]
    before: dict
    after: dict
    leave_one_out: dict


def _refuse_wrong_rows(runs: list[Run], predicted_s: np.ndarray) -> None:
    """Refuse a run measured more than 100 times off hetplan's prediction (:data:`MAX_ABS_LOG_RATIO`): a unit slip
    (milliseconds given as seconds) or a wrong row, not a residual to fit or to widen every interval with.

    Raises:
        HetplanError: naming the first such run, its measurement and the prediction."""
    for r, p in zip(runs, predicted_s):
        if abs(math.log(r.step_time_s / p)) > MAX_ABS_LOG_RATIO:
            where = r.label or f"row {r.row}"
            raise HetplanError(f"{where}: step_time_s = {r.step_time_s:.4g} s is {r.step_time_s / p:.3g} times "
                               f"hetplan's {p:.4g} s for that plan — {_RATIO_WHY}", field="runs.step_time_s",
                               fix="give seconds per iteration (not ms or tokens/s), or remove the row")


def _errors(pred: np.ndarray, meas: np.ndarray) -> dict:
    e = pred / meas - 1
    return {"n": len(e), "mape": float(np.mean(np.abs(e))), "signed_median": float(np.median(e)),
            "max_abs_error": float(np.max(np.abs(e)))}


def _leave_one_out(runs: list[Run], catalog: Catalog, base: Calibration, free: tuple[bool, ...]) -> np.ndarray:
    """Each run's step time (s) predicted by the ``free`` factors fitted on the runs of the other layouts (its
    repeats, :func:`layouts`, are left out with it)."""
    loo = np.empty(len(runs))
    group = layouts(runs)
    for i in range(len(runs)):
        rest = [r for r, g in zip(runs, group) if g != group[i]]
        loo[i] = _predict([runs[i]], catalog, _with(base, _fit_factors(rest, catalog, base, free)))[0]
    return loo


def fit(runs: list[Run], catalog: Catalog, residuals_only: bool = False) -> FitReport:
    """Fit the identified factors to ``runs`` and measure them by leave-one-out (module doc).

    Factors the runs identify (:func:`identified`) are kept only when they carry to runs they were not fitted on:
    their leave-one-out MAPE (each run predicted by the factors fitted on the others) must be below hetplan's own
    error on the runs; otherwise every factor stays 1 and the reason is written (cross-validation as model
    selection; Hastie, Tibshirani & Friedman 2009, "The Elements of Statistical Learning", Sec. 7.10). Few
    runs of one layout family fit a factor their own spread does not support: five NeMo 2022 A100 runs
    fitted a GEMM factor that took the other thirty from 1.7 % to 7.6 % median error.

    ``residuals_only``: accept runs that identify no factor, for a calibration that carries only their residuals
    (the intervals of ``plan --calibration``) with every factor at 1.

    Raises:
        HetplanError: fewer than 2 runs, or of fewer than 2 layouts (:func:`layouts`); runs of more than one
            software stack (``runs.stack``: a stack's factors are fitted on its own runs only); runs that identify no factor (unless ``residuals_only``; the message
            gives each factor's reason); a run 100x off its prediction (:func:`_refuse_wrong_rows`); runs whose
            plans do not fit in memory as predicted (the factors change time, not memory; the message names the
            row).
    """
    if len(runs) < 2:
        raise HetplanError(f"{len(runs)} run: nothing to fit and nothing to check it on", field="RUNS",
                           fix="give at least 2 runs (a quarter of your runs identifies a factor, the rest check it)")
    if len(set(layouts(runs))) < 2:
        raise HetplanError(f"the {len(runs)} runs are one layout measured {len(runs)} times: nothing to fit and "
                           "nothing to check it on", field="RUNS",
                           fix="give runs of at least 2 layouts (GPU count, TP/PP/DP, batch, sequence length)")
    gpus = tuple(sorted({r.plan.pools[s.pool].gpu for r in runs for s in r.plan.stages}))
    stacks = tuple(sorted({stack_name(r.plan.job) for r in runs}))
    if len(stacks) > 1:  # a stack's factors come from its own runs (issue 29: "fitted only on its own rows")
        first = {name: next(r.label for r in runs if stack_name(r.plan.job) == name) for name in stacks}
        raise HetplanError(f"the runs are of {len(stacks)} software stacks ("
                           + ", ".join(f"{n}: e.g. {first[n]}" for n in stacks)
                           + "); one calibration holds the factors of one stack", field="runs.stack",
                           fix="calibrate each stack's runs on their own (one RUNS file or set of logs per stack, "
                               "or a `stack` / `framework` column that says the stack each run ran) and pass each "
                               "calibration to the plans of its stack")
    base = Calibration(gpus=gpus, stacks=stacks)
    meas = np.array([r.step_time_s for r in runs])
    before = _predict(runs, catalog, base)
    _refuse_wrong_rows(runs, before)
    free, why = identified(runs, catalog, base)
    loo = _leave_one_out(runs, catalog, base, free) if any(free) else before
    e_loo, e_before = _errors(loo, meas)["mape"], _errors(before, meas)["mape"]
    if any(free) and e_loo >= e_before:
        for k in (k for k in range(len(FACTORS)) if free[k]):
            why[FACTORS[k]] = (f"fitted, but each run predicted from the others with it was worse (leave-one-out "
                               f"MAPE {e_loo:.1%}) than hetplan without it ({e_before:.1%}): the fit does not carry "
                               "to other runs; give more runs")
        free, loo = (False,) * len(FACTORS), before
    if not any(free) and not residuals_only:
        raise HetplanError(f"the {len(runs)} runs identify no factor:"
                           + "".join(f"\n  - {k}: {v}" for k, v in why.items()), field="RUNS",
                           fix="add runs that differ in what the reasons name, or pass --residuals-only to write "
                               "a calibration of your residuals alone (intervals, every factor 1)")
    fitted = _fit_factors(runs, catalog, base, free)
    after = _predict(runs, catalog, _with(base, fitted))
    mem = [(r, r.memory_bytes) for r in runs if r.memory_bytes]
    mem_med = None
    if mem:
        from hetplan.estimate.estimator import estimate

        mem_med = float(np.median([estimate(r.plan, catalog=catalog, model=r.model).memory_bytes_per_gpu.total / m - 1
                                   for r, m in mem]))
    cal = Calibration(compute_factor=fitted[0], attention_factor=fitted[1], comm_factor=fitted[2], gpus=gpus,
                      stacks=stacks, loo_log_ratios=tuple(float(x) for x in np.log(meas / loo)), not_identified=why,
                      memory_signed_median=mem_med)
    rows = [{"row": r.row, "label": r.label, "measured_s": float(m), "before_s": float(b), "after_s": float(a), "loo_s": float(lv)}
            for r, m, b, a, lv in zip(runs, meas, before, after, loo)]
    return FitReport(cal, rows, _errors(before, meas), _errors(after, meas), _errors(loo, meas))


@dataclass
class CheckReport:
    """What :func:`check` found on runs a calibration was not fitted on: per run the measured, uncalibrated and
    calibrated step times (s) and the 80 % interval ``[low, high]`` (s; None where unvalidated), and summary errors
    (:func:`_errors`) before and after the calibration, with the share of runs inside their interval."""

    rows: list[dict]
    before: dict
    after: dict
    coverage: dict
    not_covered: int


def check(runs: list[Run], catalog: Catalog, calibration: Calibration) -> CheckReport:
    """Price ``runs`` with and without ``calibration`` and say how far each lands from its measured step: the
    held-out check of a calibration (fit on some runs with :func:`fit`, check the rest here). A run whose GPUs or
    stack the calibration does not cover is priced without its factors and takes hetplan's own interval
    (:func:`hetplan.calibration.intervals.plan_interval`), as ``plan`` / ``estimate --calibration`` would;
    ``not_covered`` counts them.

    Raises:
        HetplanError: no runs.
    """
    from hetplan.calibration.intervals import plan_interval

    if not runs:
        raise HetplanError("no runs to check the calibration on", field="RUNS",
                           fix="give the runs the calibration was not fitted on")
    meas = np.array([r.step_time_s for r in runs])
    before = _predict(runs, catalog, Calibration(gpus=calibration.gpus, stacks=calibration.stacks))
    _refuse_wrong_rows(runs, before)
    after = _predict(runs, catalog, calibration)
    rows, inside, not_covered = [], [], 0
    for r, m, b, a in zip(runs, meas, before, after):
        gpus = [catalog.get(r.plan.pools[s.pool].gpu) for s in r.plan.stages]
        iv = plan_interval(r.plan.job, gpus, r.model.is_moe, r.plan.num_gpus, calibration)
        not_covered += isinstance(iv, str) or iv.source != "calibration"
        bounds = None if isinstance(iv, str) else iv.of(float(a))
        if bounds is not None:
            slack = 1e-9 * m  # a run of the calibration's own fit sits on its interval's edge: not rounding out
            inside.append(bool(bounds[0] - slack <= m <= bounds[1] + slack))
        rows.append({"row": r.row, "label": r.label, "measured_s": float(m), "before_s": float(b),
                     "after_s": float(a), "interval_s": bounds, "inside": None if bounds is None else inside[-1]})
    coverage = {"n": len(inside), "inside": float(np.mean(inside)) if inside else None, "level": LEVEL}
    return CheckReport(rows, _errors(before, meas), _errors(after, meas), coverage, not_covered)
