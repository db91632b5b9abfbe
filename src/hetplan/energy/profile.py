"""Stage time/energy profiles: what one forward or backward costs at each GPU SM frequency.

A *stage profile* is the input of the energy planner. Each row measures ONE forward or ONE backward of ONE
micro-batch on ONE GPU of pipeline stage ``stage`` with the GPU's SM clock locked at ``frequency`` (MHz):
its wall-clock ``time`` (s) and the GPU ``energy`` (J) it drew. This is the CSV format of Perseus (Chung et
al., SOSP'24, §5 "profiling") as published in ``../shared/data/energy/stage_profile``::

    stage,instruction,frequency,time,energy
    0,forward,1410,0.0501,23.81

Loading validates everything and raises :class:`hetplan.errors.HetplanError` naming the row and column.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np

from hetplan.errors import HetplanError
from hetplan.inputs import read_csv, read_text

INSTRUCTIONS = ("forward", "backward")
REQUIRED_COLUMNS = ("stage", "instruction", "frequency", "time", "energy")


@dataclass(frozen=True)
class InstructionProfile:
    """All measured options of one instruction type on one stage.

    Attributes:
        stage: zero-based pipeline stage.
        instruction: ``"forward"`` or ``"backward"``.
        frequency_mhz: shape (k,), SM frequencies, descending.
        time_s: shape (k,), time of one instruction at each frequency (s).
        energy_j: shape (k,), GPU energy of one instruction at each frequency (J).
    """

    stage: int
    instruction: str
    frequency_mhz: np.ndarray
    time_s: np.ndarray
    energy_j: np.ndarray

    @property
    def max_frequency_mhz(self) -> int:
        """The fastest profiled SM frequency (MHz)."""
        return int(self.frequency_mhz.max())

    def at_frequency(self, frequency_mhz: int) -> tuple[float, float]:
        """``(time_s, energy_j)`` measured at exactly ``frequency_mhz``.

        Raises:
            HetplanError: the frequency was not profiled for this stage and instruction.
        """
        hits = np.nonzero(self.frequency_mhz == int(frequency_mhz))[0]
        if hits.size == 0:
            raise HetplanError(
                f"frequency {frequency_mhz} MHz was not profiled for stage {self.stage} {self.instruction}",
                field="frequency_mhz",
                fix=f"use one of {sorted(int(f) for f in self.frequency_mhz)}",
            )
        i = int(hits[0])
        return float(self.time_s[i]), float(self.energy_j[i])


@dataclass(frozen=True)
class StageProfile:
    """Profiles of every (stage, instruction) pair of a pipeline.

    Attributes:
        entries: ``(stage, instruction) -> InstructionProfile``; stages are ``0..num_stages-1`` and every stage has
            both a forward and a backward entry.
        source: where the profile came from (path or ``"<memory>"``), for messages.
    """

    entries: dict[tuple[int, str], InstructionProfile]
    source: str = "<memory>"
    frequencies_mhz: tuple[int, ...] = field(default=())

    @property
    def num_stages(self) -> int:
        """Number of pipeline stages in the profile."""
        return 1 + max(s for s, _ in self.entries)

    def get(self, stage: int, instruction: str) -> InstructionProfile:
        """The profile of ``instruction`` on ``stage``.

        Raises:
            HetplanError: unknown stage or instruction.
        """
        key = (int(stage), str(instruction))
        if key not in self.entries:
            raise HetplanError(
                f"no profile for stage {stage} instruction {instruction!r}",
                field="stage",
                fix=f"stages are 0..{self.num_stages - 1}; instructions are {', '.join(INSTRUCTIONS)}",
            )
        return self.entries[key]

    def to_csv(self) -> str:
        """The profile back in the ``stage,instruction,frequency,time,energy`` CSV format."""
        out = io.StringIO()
        out.write(",".join(REQUIRED_COLUMNS) + "\n")
        for (stage, inst), p in sorted(self.entries.items(), key=lambda kv: (kv[0][0], INSTRUCTIONS.index(kv[0][1]))):
            for f, t, e in zip(p.frequency_mhz, p.time_s, p.energy_j):
                out.write(f"{stage},{inst},{int(f)},{float(t)!r},{float(e)!r}\n")
        return out.getvalue()


#: Largest value accepted per column, with the reason: the frontier solver works in time quanta (``unit_time_s``,
#: 1 ms by default), so a stage time of hours would make it run for hours, and values near the float limit
#: overflow its sums to inf/NaN. One micro-batch's forward or backward on one stage of GPT-3 175B takes ~0.1 s.
MAX_VALUE = {"stage": (1e4, "10,000 pipeline stages"), "frequency": (1e4, "10 GHz"),
             "time": (100.0, "100 s for one micro-batch's forward or backward of one stage"),
             "energy": (1e5, "100 kJ for one micro-batch's forward or backward of one stage")}


#: Shortest instruction time accepted (s), with the reason: the frontier's time unit is at least 1/1000 of the
#: shortest instruction, so a time of 1e-300 s let a unit quantize the others into ~1e300 quanta (an overflow).
MIN_TIME_S = (1e-6, "one micro-batch's forward or backward of one stage launches kernels of ~5 us each")


def _number(value: str, column: str, line: int, source: str, *, integer: bool = False) -> float:
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise HetplanError(
            f"{source} line {line}: column {column!r} is {value!r}, not a number",
            field=column,
            fix="every row needs numeric stage, frequency, time and energy",
        ) from None
    if not math.isfinite(x):
        raise HetplanError(f"{source} line {line}: column {column!r} is {value!r}", field=column,
                           fix="use finite numbers")
    if integer and x != int(x):
        raise HetplanError(f"{source} line {line}: column {column!r} must be an integer, got {value!r}",
                           field=column, fix="stages and frequencies are integers")
    limit, what = MAX_VALUE.get(column, (math.inf, ""))
    if abs(x) > limit:
        raise HetplanError(f"{source} line {line}: column {column!r} is {value!r}, above {limit:g} ({what} is more "
                           "than any real profile)", field=column, fix="check the units (seconds, joules, MHz)")
    return x


def parse_stage_profile(text: str, source: str = "<memory>") -> StageProfile:
    """Parse a stage profile from CSV text (see the module docstring for the format).

    Args:
        text: the CSV content, header first; extra columns are ignored.
        source: name used in error messages.

    Returns:
        The validated :class:`StageProfile`.

    Raises:
        HetplanError: missing columns, non-numeric or non-positive values, negative stage, unknown instruction,
            duplicate (stage, instruction, frequency) rows, missing stages, or a stage lacking forward/backward.
    """
    fieldnames, records = read_csv(text, source, "profile")
    if fieldnames is None:
        raise HetplanError(f"{source} is empty", field="profile", fix="give a CSV with header " + ",".join(REQUIRED_COLUMNS))
    header = [h.strip() for h in fieldnames]
    missing = [c for c in REQUIRED_COLUMNS if c not in header]
    if missing:
        raise HetplanError(
            f"{source}: missing column(s) {', '.join(missing)} (found {', '.join(header) or 'none'})",
            field="profile",
            fix="the header must be " + ",".join(REQUIRED_COLUMNS),
        )
    rows: dict[tuple[int, str], list[tuple[int, float, float]]] = {}
    seen: set[tuple[int, str, int]] = set()
    for line, raw in enumerate(records, start=2):
        row = {(k or "").strip(): (v or "").strip() for k, v in raw.items() if k is not None}
        if not any(row.values()):
            continue
        stage = int(_number(row["stage"], "stage", line, source, integer=True))
        if stage < 0:
            raise HetplanError(f"{source} line {line}: stage {stage} is negative", field="stage",
                               fix="stages are numbered from 0")
        inst = row["instruction"].lower()
        if inst not in INSTRUCTIONS:
            raise HetplanError(f"{source} line {line}: unknown instruction {row['instruction']!r}",
                               field="instruction", fix="use 'forward' or 'backward'")
        freq = int(_number(row["frequency"], "frequency", line, source, integer=True))
        time_s = _number(row["time"], "time", line, source)
        energy_j = _number(row["energy"], "energy", line, source)
        for name, val in (("frequency", freq), ("time", time_s), ("energy", energy_j)):
            if val <= 0:
                raise HetplanError(f"{source} line {line}: {name} must be positive, got {val}", field=name,
                                   fix="time (s), energy (J) and frequency (MHz) are positive measurements")
        if time_s < MIN_TIME_S[0]:
            raise HetplanError(f"{source} line {line}: time {time_s:g} s is below {MIN_TIME_S[0]:g} s ({MIN_TIME_S[1]})",
                               field="time", fix="check the units (seconds, joules, MHz)")
        if (stage, inst, freq) in seen:
            raise HetplanError(f"{source} line {line}: duplicate row for stage {stage} {inst} at {freq} MHz",
                               field="profile", fix="keep one measurement per stage, instruction and frequency")
        seen.add((stage, inst, freq))
        rows.setdefault((stage, inst), []).append((freq, time_s, energy_j))
    if not rows:
        raise HetplanError(f"{source} has no data rows", field="profile", fix="profile at least one frequency")
    num_stages = 1 + max(s for s, _ in rows)
    for s in range(num_stages):
        for inst in INSTRUCTIONS:
            if (s, inst) not in rows:
                raise HetplanError(f"{source}: stage {s} has no {inst} rows", field="profile",
                                   fix=f"stages must be 0..{num_stages - 1}, each with forward and backward rows")
    entries = {}
    for key, vals in rows.items():
        vals.sort(key=lambda r: -r[0])
        arr = np.array(vals, dtype=float)
        entries[key] = InstructionProfile(key[0], key[1], arr[:, 0].astype(np.int64), arr[:, 1].copy(), arr[:, 2].copy())
    freqs = tuple(sorted({f for v in rows.values() for f, _, _ in v}, reverse=True))
    return StageProfile(entries=entries, source=source, frequencies_mhz=freqs)


def check_profile_gpus(profile: StageProfile, stage_gpus: Sequence[tuple[str, int] | None], field: str,
                       fix: str) -> None:
    """Refuse a profile that cannot have been measured on the GPUs said to run it: ``stage_gpus`` gives, per
    pipeline stage, the GPU type and its top SM clock (MHz; ``nvidia-smi -q -d SUPPORTED_CLOCKS``, the power
    catalog's :attr:`~hetplan.hardware.power.GPUPower.max_frequency_mhz`), or None where it is unknown. A
    frequency plan locks the clocks it was planned at (NVML ``nvmlDeviceSetGpuLockedClocks``), so a clock above
    the GPU's top clock is one the GPU cannot run, and the catalog idle power taken for the wrong GPU was silently
    wrong too (an A40 profile, clocks to 1,740 MHz, planned as an A100's, top 1,410 MHz).

    Raises:
        HetplanError: (``field``, ``fix``) the profile has another number of stages than ``stage_gpus``, or a stage
            was profiled above its GPU's top clock.
    """
    if profile.num_stages != len(stage_gpus):
        raise HetplanError(f"{profile.source} profiles {profile.num_stages} pipeline stages, the pipeline has "
                           f"{len(stage_gpus)}", field=field, fix=fix)
    for s, gpu in enumerate(stage_gpus):
        if gpu is None:
            continue
        name, top = gpu
        f = max(profile.get(s, i).max_frequency_mhz for i in INSTRUCTIONS)
        if f > top:
            raise HetplanError(f"{profile.source}: stage {s} was profiled at {f} MHz, above the top SM clock of "
                               f"{name} ({top} MHz): not a profile of that GPU", field=field, fix=fix)


def load_stage_profile(path: str | Path) -> StageProfile:
    """Read and validate a stage profile CSV file.

    Raises:
        HetplanError: the file cannot be read or is malformed (see :func:`parse_stage_profile`).
    """
    p = Path(path)
    return parse_stage_profile(read_text(p, "profile"), source=str(p))
