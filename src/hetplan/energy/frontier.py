"""High-level energy planning: profile in, iteration time–energy frontier and frequency plans out.

:func:`compute_frontier` runs the Perseus planner (Chung et al., SOSP'24) end to end:
options (:mod:`~hetplan.energy.options`) → DAG (:mod:`~hetplan.energy.dag`) → Phillips–Dessouky
(:mod:`~hetplan.energy.solver`). Each frontier point becomes a :class:`FrequencyPlan`: for every instruction
the slowest kept frequency whose quantized time fits the duration the solver assigned (Perseus §4.4).

Energies on the frontier are the planner's model energies (fitted effective energy + idle power, exactly
what the published ``frontier_reference`` files contain). :meth:`Frontier.simulate` replays a plan on the
measured profile instead.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from functools import cached_property
from pathlib import Path

import numpy as np

from hetplan.energy.dag import PipelineDAG, build_pipeline_dag, instruction_name
from hetplan.energy.options import OperationOptions, build_options, pareto_mask
from hetplan.energy.profile import INSTRUCTIONS, StageProfile
from hetplan.energy.simulate import simulate_plan
from hetplan.energy.solver import PhillipsDessoukySolver, SolverResult
from hetplan.errors import HetplanError


@dataclass
class FrequencyPlan:
    """One frequency per instruction, per stage, in the stage's schedule order.

    Attributes:
        time_s: planned iteration time (quantized, s). energy_j: planned iteration energy (model, J).
        frequencies_mhz: ``[stage][position]`` SM frequency (MHz).
        instructions: ``[stage][position]`` like ``"forward:3"`` (instruction:micro-batch; ``"forward:3:1"``
            with model chunks).
        schedule, num_stages, num_microbatches, unit_time_s, idle_power_w: the pipeline it was planned for.
        index: position of the point on the frontier (0 = slowest).
        virtual_stages: model chunks per stage (interleaved 1F1B), 1 otherwise.
    """

    time_s: float
    energy_j: float
    frequencies_mhz: list[list[int]]
    instructions: list[list[str]]
    schedule: str
    num_stages: int
    num_microbatches: int
    unit_time_s: float
    idle_power_w: float
    index: int = 0
    extra: dict = field(default_factory=dict)
    virtual_stages: int = 1

    def to_dict(self) -> dict:
        """The plan as a JSON-able dict (all fields above; lists are shared, not copied)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def to_json(self) -> str:
        """The plan as JSON text (all fields above)."""
        return json.dumps(self.to_dict(), indent=1)

    @classmethod
    def from_json(cls, text: str) -> FrequencyPlan:
        """Parse :meth:`to_json` output.

        Raises:
            HetplanError: malformed JSON or missing fields.
        """
        try:
            data = json.loads(text)
            return cls(**data)
        except (ValueError, TypeError) as exc:
            raise HetplanError(f"not a frequency plan: {exc}", field="plan",
                               fix="give a plan JSON written by 'hetplan energy frontier'") from None


@dataclass
class Frontier:
    """The iteration time–energy frontier of a pipeline and the plan of each point.

    Attributes:
        profile: the stage profile. dag: the instruction DAG. options: per ``2*stage + kind``.
        idle_power_w, unit_time_s: planner inputs. result: raw solver output.
        time_s: shape (p,), iteration times, slowest first (s). energy_j: shape (p,), energies (J).
    """

    profile: StageProfile
    dag: PipelineDAG
    options: list[OperationOptions]
    idle_power_w: float
    unit_time_s: float
    result: SolverResult

    @property
    def time_s(self) -> np.ndarray:
        return self.result.quant_time * self.unit_time_s

    @property
    def energy_j(self) -> np.ndarray:
        return self.result.energy_j

    def __len__(self) -> int:
        return int(self.result.quant_time.size)

    @cached_property
    def _frequency_table(self) -> tuple[np.ndarray, np.ndarray]:
        """``(table, last)``: ``table[k, q]`` the frequency (MHz) option set ``k`` runs at duration ``q`` (quanta,
        0..max_quant; padded with its last column), ``last[k]`` its largest valid ``q``."""
        width = max(o.max_quant for o in self.options) + 1
        table = np.zeros((len(self.options), width), np.int64)
        last = np.empty(len(self.options), np.int64)
        for k, o in enumerate(self.options):
            q = np.arange(o.max_quant + 1)
            # slowest kept option with quant_time ≤ q (quant_time descends); the fastest when none fits
            i = np.searchsorted(-o.quant_time, -q, side="left")
            table[k, : q.size] = o.frequency_mhz[np.minimum(i, o.quant_time.size - 1)]
            table[k, q.size:] = table[k, q.size - 1]
            last[k] = o.max_quant
        return table, last

    def _frequencies_at(self, durations: np.ndarray) -> np.ndarray:
        """Frequencies (MHz) of durations ``durations`` (quanta; shape (n,) or (p, n)), same shape."""
        table, last = self._frequency_table
        spec = 2 * self.dag.stage + self.dag.kind
        return table[spec, np.minimum(durations, last[spec])]

    def frequencies(self, index: int) -> np.ndarray:
        """shape (n,): frequency (MHz) of every DAG instruction at frontier point ``index``."""
        return self._frequencies_at(self.result.durations[index])

    @cached_property
    def _instruction_names(self) -> list[list[str]]:
        dag = self.dag
        chunk = dag.chunk if dag.chunk is not None else np.zeros_like(dag.kind)
        return [[instruction_name(int(dag.kind[i]), int(dag.microbatch[i]), int(chunk[i]), dag.virtual_stages)
                 for i in ids] for ids in dag.stage_ops]

    def plan(self, index: int) -> FrequencyPlan:
        """The :class:`FrequencyPlan` of frontier point ``index`` (0 = slowest; negative counts from the end).

        Raises:
            HetplanError: index out of range.
        """
        p = len(self)
        if not -p <= index < p:
            raise HetplanError(f"frontier point {index} does not exist (there are {p})", field="index",
                               fix=f"use 0..{p - 1}")
        index %= p
        f = self.frequencies(index)
        dag = self.dag
        return FrequencyPlan(
            time_s=float(self.time_s[index]),
            energy_j=float(self.energy_j[index]),
            frequencies_mhz=[f[ids].tolist() for ids in dag.stage_ops],
            instructions=self._instruction_names,
            schedule=dag.schedule,
            num_stages=dag.num_stages,
            num_microbatches=dag.num_microbatches,
            unit_time_s=self.unit_time_s,
            idle_power_w=self.idle_power_w,
            index=index,
            virtual_stages=dag.virtual_stages,
        )

    def simulate(self, index: int) -> tuple[float, float]:
        """Measured-profile ``(time_s, energy_j)`` of point ``index`` (see :mod:`~hetplan.energy.simulate`)."""
        return simulate_plan(self.profile, self.dag, self.frequencies(index), self.idle_power_w)

    def pareto_indices(self) -> np.ndarray:
        """Indices of points no other point beats in both time and energy (slow non-Pareto end trimmed)."""
        order = np.argsort(self.time_s, kind="stable")
        best = math.inf
        keep = []
        for i in order:
            if self.energy_j[i] < best:
                keep.append(i)
                best = self.energy_j[i]
        return np.array(sorted(keep, key=lambda i: -self.time_s[i]), dtype=np.int64)

    def index_for_time(self, deadline_s: float) -> int:
        """Point of least energy, counting idle power up to ``deadline_s``, among those finishing by it.

        Raises:
            HetplanError: the deadline is faster than the fastest point.
        """
        t, e = self.time_s, self.energy_j
        ok = np.nonzero(t <= deadline_s + 1e-12)[0]
        if ok.size == 0:
            raise HetplanError(f"no plan finishes within {deadline_s:.6g} s (fastest is {t.min():.6g} s)",
                               field="target_time_s", fix=f"use a target time ≥ {t.min():.6g} s")
        padded = e[ok] + self.dag.num_stages * self.idle_power_w * (deadline_s - t[ok])
        return int(ok[int(np.argmin(padded))])

    def write_csv(self, path: str | Path) -> None:
        """Write ``time,energy`` (s, J per iteration; slowest first) like ``frontier_reference``."""
        with open(path, "w", newline="") as fh:
            w = csv.writer(fh)
            w.writerow(["time", "energy"])
            for t, e in zip(self.time_s, self.energy_j):
                w.writerow([repr(float(t)), repr(float(e))])

    def write_plans(self, directory: str | Path) -> list[Path]:
        """Write ``plan_00000.json`` … (one file per point) into ``directory``; returns the paths."""
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        paths = []
        for i in range(len(self)):
            p = d / f"plan_{i:05d}.json"
            p.write_text(self.plan(i).to_json())
            paths.append(p)
        return paths

    def write_plans_file(self, path: str | Path) -> Path:
        """Write every point's plan into ONE JSON file (what the pipeline shares written once, then one
        ``{index, time_s, energy_j, frequencies_mhz}`` per point); :func:`read_plan` takes one back out."""
        head = self.plan(0).to_dict()
        head.pop("index"), head.pop("time_s"), head.pop("energy_j"), head.pop("frequencies_mhz")
        freqs = self._frequencies_at(self.result.durations)  # (points, n), one lookup for all points
        # the frequencies as text: a few distinct values, each written once, then looked up (16 x 64: 5.5 M
        # numbers; json.dumps of nested lists took 1 s, this 0.2 s)
        text = np.array([str(f) for f in range(int(freqs.max(initial=0)) + 1)], dtype=object)
        order = np.concatenate(self.dag.stage_ops)
        bounds = np.cumsum([0] + [ids.size for ids in self.dag.stage_ops]).tolist()
        table = text[freqs[:, order]]
        times, energies = self.time_s.tolist(), self.energy_j.tolist()
        rows = []
        for i in range(len(self)):
            row = table[i].tolist()
            stages = "],[".join(",".join(row[a:b]) for a, b in zip(bounds, bounds[1:]))
            rows.append(f'{{"index": {i}, "time_s": {json.dumps(times[i])}, "energy_j": {json.dumps(energies[i])}, '
                        f'"frequencies_mhz": [[{stages}]]}}')
        p = Path(path)
        p.write_text(json.dumps(head)[:-1] + ', "plans": [\n' + ",\n".join(rows) + "\n]}\n")
        return p


def read_plan(path: str | Path, index: int) -> FrequencyPlan:
    """Plan ``index`` (0 = slowest; negative counts from the end) of a file written by
    :meth:`Frontier.write_plans_file`.

    Raises:
        HetplanError: unreadable or malformed file, or no such point.
    """
    try:
        data = json.loads(Path(path).read_text())
        plans = data.pop("plans")
    except (OSError, UnicodeDecodeError, ValueError, KeyError, AttributeError) as exc:
        raise HetplanError(f"{path} is not a plans file: {exc}", field="plans",
                           fix="give the plans.json written by 'hetplan energy frontier'") from None
    if not -len(plans) <= index < len(plans):
        raise HetplanError(f"frontier point {index} does not exist (there are {len(plans)})", field="index",
                           fix=f"use 0..{len(plans) - 1}")
    return FrequencyPlan.from_json(json.dumps({**data, **plans[index]}))


#: Finest time unit, as a share of the shortest instruction (:func:`compute_frontier`).
MAX_QUANTA_PER_INSTRUCTION = 1000
#: Most solver steps (quanta between the all-slowest and the all-fastest iteration) and option-ladder quanta (the
#: solver tabulates every instruction's energy at each quantum between its slowest and fastest option) a frontier
#: may take, and most steps x instructions: a step costs ~0.4 ms plus ~1.5 us per instruction (measured: 8 x 12,
#: 641 steps, 0.3 s; GPT-3 175B plan, 2,485 steps of 3,840 instructions, 7 s), so these are a few minutes. A unit
#: within 1/1000 of the shortest instruction still ran for hours when another instruction was 10,000x longer
#: (one stage's 1 ms forward next to another's 5 s; a 1e-300 s time overflowed the quantization instead).
MAX_FRONTIER_STEPS = 200_000
MAX_FRONTIER_WORK = 2e8


def _longest_path_s(dag: PipelineDAG, durations: np.ndarray) -> float:
    """Iteration time (s) of ``dag`` with per-instruction ``durations`` (s): its longest path."""
    n = dag.num_ops
    pred = dag.pred_matrix()
    ef = np.zeros(n + 1)
    for idx in dag.levels:
        ef[idx] = ef[pred[idx]].max(axis=1) + durations[idx]
    return float(ef[:n].max())


def _check_solver_work(profile: StageProfile, dag: PipelineDAG, unit_time_s: float) -> None:
    """Refuse a unit time that gives the solver more than :data:`MAX_FRONTIER_STEPS` steps or ladder quanta, or more
    than :data:`MAX_FRONTIER_WORK` steps x instructions (each step is one unit faster, from the all-slowest to at
    most the all-fastest iteration, both over the Pareto-optimal options as :func:`build_options` keeps them).

    Raises:
        HetplanError: naming ``unit_time_s`` and the smallest unit within the bounds.
    """
    slow, fast = [], []
    for s in range(profile.num_stages):
        for inst in INSTRUCTIONS:
            p = profile.get(s, inst)
            t = p.time_s[pareto_mask(p.time_s, p.energy_j)]
            slow.append(float(t.max()))
            fast.append(float(t.min()))
    kinds = 2 * dag.stage + dag.kind
    span_s = _longest_path_s(dag, np.array(slow)[kinds]) - _longest_path_s(dag, np.array(fast)[kinds])
    ladder_s = sum(a - b for a, b in zip(slow, fast))
    finest = max(span_s / MAX_FRONTIER_STEPS, ladder_s / MAX_FRONTIER_STEPS, span_s * dag.num_ops / MAX_FRONTIER_WORK)
    if unit_time_s < finest:
        raise HetplanError(f"unit time {unit_time_s:.3g} s gives the solver ~{span_s / unit_time_s:.3g} steps over "
                           f"{dag.num_ops:,} instructions (the iteration time spans {span_s:.3g} s from all-slowest to "
                           f"all-fastest; the options' ranges add up to {ladder_s:.3g} s): hours of CPU",
                           field="unit_time_s",
                           fix=f"use --unit-time-s ≥ {finest:.3g} (at most {MAX_FRONTIER_STEPS:,} steps and "
                               f"{MAX_FRONTIER_WORK:.0e} steps x instructions)")


def compute_frontier(profile: StageProfile, num_microbatches: int, idle_power_w: float,
                     unit_time_s: float = 0.001, schedule: str = "1f1b", *, virtual_stages: int = 1,
                     maxflow_backend: str = "auto", max_points: int | None = None,
                     progress: Callable[[float], None] | None = None) -> Frontier:
    """Compute the iteration time–energy frontier of a pipeline (Perseus, SOSP'24, §4).

    Args:
        profile: per-stage forward/backward time and energy at each frequency.
        num_microbatches: micro-batches per iteration (≥ 1).
        idle_power_w: GPU power while blocked on communication (W, ≥ 0), e.g. 83.64 for A100-SXM.
        unit_time_s: time quantum (s, > 0); 0.001 reproduces the published frontiers.
        schedule: ``"1f1b"``, ``"gpipe"`` or ``"interleaved"``.
        virtual_stages: model chunks per stage (interleaved 1F1B); the profile then gives one chunk's
            instruction (a model-derived profile does: :func:`hetplan.energy.model.plan_stage_profile`).
        maxflow_backend: see :func:`hetplan.energy.maxflow.min_cut_source_side`.
        max_points: stop after this many points (None: the whole frontier).
        progress: called with the share of the way done after each step (:meth:`PhillipsDessoukySolver.run`).

    Returns:
        The :class:`Frontier`, slowest point first.

    Raises:
        HetplanError: bad counts, idle power, unit time or schedule; a unit time under 1/:data:`MAX_QUANTA_PER_INSTRUCTION`
            of the shortest instruction (the solver takes up to one step per quantum of iteration time, so the
            cost grows as 1/unit: 1e-9 s ran for minutes without end in sight), or one that gives the solver more
            steps, option-ladder quanta or steps x instructions than :data:`MAX_FRONTIER_STEPS` /
            :data:`MAX_FRONTIER_WORK` allow (:func:`_check_solver_work`).
    """
    shortest = min(float(profile.get(s, i).time_s.min()) for s in range(profile.num_stages) for i in INSTRUCTIONS)
    if isinstance(unit_time_s, (int, float)) and 0 < unit_time_s < shortest / MAX_QUANTA_PER_INSTRUCTION:
        raise HetplanError(f"unit time {unit_time_s:.3g} s is under 1/{MAX_QUANTA_PER_INSTRUCTION} of the shortest "
                           f"instruction ({shortest:.3g} s): the frontier would take ~{shortest / unit_time_s:,.0f}x "
                           "more steps than needed", field="unit_time_s",
                           fix=f"use --unit-time-s ≥ {shortest / MAX_QUANTA_PER_INSTRUCTION:.3g} (Perseus: 1 ms for "
                               "~50 ms instructions)")
    if isinstance(num_microbatches, bool) or int(num_microbatches) != num_microbatches or num_microbatches < 1:
        raise HetplanError(f"number of micro-batches must be a positive integer, got {num_microbatches}",
                           field="num_microbatches", fix="use e.g. --num-microbatches 12")
    dag = build_pipeline_dag(profile.num_stages, int(num_microbatches), schedule, virtual_stages)
    if isinstance(unit_time_s, (int, float)) and unit_time_s > 0:
        _check_solver_work(profile, dag, unit_time_s)
    options = [build_options(profile.get(s, inst), unit_time_s, idle_power_w)
               for s in range(profile.num_stages) for inst in INSTRUCTIONS]
    solver = PhillipsDessoukySolver(dag, options, idle_power_w, maxflow_backend=maxflow_backend)
    result = solver.run(max_points=max_points, progress=progress)
    return Frontier(profile, dag, options, float(idle_power_w), float(unit_time_s), result)
