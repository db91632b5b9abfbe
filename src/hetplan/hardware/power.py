"""GPU power under DVFS: supported SM clocks, power limit and a static + dynamic power model, from
``data/gpu_power.toml`` (dated, sourced, user-overridable like the GPU catalog).

Model (CMOS dynamic power ``P = C·V²·f``; the voltage–frequency curve of a DVFS table, e.g. Mei et al. 2017,
"A survey and measurement study of GPU DVFS on energy conservation", Sec. 2):

    r(f)       = v_floor + (1 - v_floor) · clip((f - f_knee) / (f_max - f_knee), 0, 1)   voltage / V(f_max)
    P_busy(f)  = P_idle + P_dyn · r(f)² · f / f_max                                       (W, while computing)
    f_eff(f)   = min(f, f_cap),  f_cap = the highest clock with P_busy ≤ power_limit_w    (the board caps power)

``P_idle`` is the catalog's :attr:`~hetplan.hardware.catalog.GPUSpec.idle_power_w` (the blocking power Perseus
measures), so a GPU that waits draws ``P_idle`` and one that computes draws ``P_busy``. Below the knee the
voltage is at its floor and power falls linearly with the clock; above it, quadratically faster. A clock whose
``P_busy`` exceeds the power limit is not sustained: the GPU runs at ``f_cap`` (why the A40's top 20 clocks of
Perseus' profiles run at one speed, ~295 W of its 300 W).

Entries are *fitted* (``fitted = true``: the coefficients are least-squares fits to measured stage profiles,
:mod:`hetplan.energy.calibrate`, with the held-out error in ``source``) or *not listed*: a GPU without an entry
has no DVFS model (:func:`get_power` raises; callers say so).
"""

from __future__ import annotations

import math
import sys
from functools import lru_cache
from importlib import resources
from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from hetplan.errors import HetplanError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


class GPUPower(BaseModel):
    """DVFS and power model of one GPU type (module doc for the formulas).

    Attributes:
        gpu: catalog name of the GPU type (aliases resolve through the GPU catalog).
        frequencies_mhz: supported SM clocks (MHz), descending (``nvidia-smi -q -d SUPPORTED_CLOCKS``).
        power_limit_w: sustained board power the clock is capped at (W).
        dynamic_power_w: ``P_dyn``, power above ``P_idle`` when computing at the top clock uncapped (W).
        voltage_floor: ``v_floor``, voltage at and below the knee over the voltage at the top clock (0, 1].
        voltage_knee_mhz: ``f_knee`` (MHz).
        date, source: when and from what the numbers come; fitted: coefficients fitted to measurements.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    gpu: str
    frequencies_mhz: tuple[int, ...] = Field(min_length=1)
    power_limit_w: float = Field(gt=0, allow_inf_nan=False)
    dynamic_power_w: float = Field(gt=0, allow_inf_nan=False)
    voltage_floor: float = Field(gt=0, le=1, allow_inf_nan=False)
    voltage_knee_mhz: float = Field(gt=0, allow_inf_nan=False)
    date: str
    source: str
    fitted: bool = False

    @model_validator(mode="after")
    def _descending(self) -> GPUPower:
        f = self.frequencies_mhz
        if any(b >= a for a, b in zip(f, f[1:])) or f[-1] <= 0:
            raise ValueError("frequencies_mhz must be positive and strictly descending")
        return self

    @property
    def max_frequency_mhz(self) -> int:
        """The top supported SM clock (MHz)."""
        return self.frequencies_mhz[0]

    def busy_power_w(self, frequency_mhz, idle_power_w: float):
        """``P_busy`` at ``frequency_mhz`` (uncapped; arrays broadcast), in W."""
        f = np.asarray(frequency_mhz, dtype=float)
        fmax = self.max_frequency_mhz
        span = max(fmax - self.voltage_knee_mhz, 1e-9)
        r = self.voltage_floor + (1 - self.voltage_floor) * np.clip((f - self.voltage_knee_mhz) / span, 0.0, 1.0)
        return idle_power_w + self.dynamic_power_w * r * r * f / fmax

    def cap_frequency_mhz(self, idle_power_w: float) -> float:
        """``f_cap``: the highest clock (MHz, continuous) whose busy power stays within the power limit."""
        fmax = float(self.max_frequency_mhz)
        if self.busy_power_w(fmax, idle_power_w) <= self.power_limit_w:
            return fmax
        lo, hi = 1.0, fmax  # busy power rises with the clock: bisection
        for _ in range(60):
            mid = 0.5 * (lo + hi)
            lo, hi = (mid, hi) if self.busy_power_w(mid, idle_power_w) <= self.power_limit_w else (lo, mid)
        return lo

    def effective_frequency_mhz(self, frequency_mhz, idle_power_w: float):
        """``f_eff = min(f, f_cap)`` (MHz; arrays broadcast): the clock a compute-bound kernel sustains."""
        return np.minimum(np.asarray(frequency_mhz, dtype=float), self.cap_frequency_mhz(idle_power_w))


def _read(text: str, origin: str) -> dict:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise HetplanError(f"{origin}: invalid TOML ({exc})", field="power catalog", fix="fix the TOML syntax") from None


@lru_cache(maxsize=8)
def _load(user_file: str | None) -> dict[str, GPUPower]:
    data = _read(resources.files("hetplan.hardware").joinpath("data/gpu_power.toml").read_text(), "gpu_power.toml")
    entries = dict(data.get("gpus", {}))
    if user_file is not None:
        p = Path(user_file)
        try:
            text = p.read_bytes().decode("utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise HetplanError(f"cannot read power catalog {p}: {exc}", field="--power-catalog",
                               fix="give a readable UTF-8 TOML file") from None
        user = _read(text, str(p)).get("gpus", {})
        if not isinstance(user, dict):
            raise HetplanError(f"{p}: [gpus] must be a table", field="--power-catalog", fix="see gpu_power.toml")
        for name, raw in user.items():
            entries[name] = {**entries.get(name, {}), **raw} if isinstance(raw, dict) else raw
    out = {}
    for name, raw in entries.items():
        if not isinstance(raw, dict):
            raise HetplanError(f"power catalog entry {name!r} must be a table", field=f"gpus.{name}",
                               fix="see gpu_power.toml")
        try:
            out[name.lower()] = GPUPower(gpu=name, **raw)
        except ValidationError as exc:
            err = exc.errors()[0]
            loc = ".".join(str(x) for x in err["loc"])
            raise HetplanError(f"power catalog entry {name}: {err['msg']}", field=f"gpus.{name}.{loc}",
                               fix="see gpu_power.toml for the fields and units") from None
    return out


def get_power(gpu_name: str, user_file: str | Path | None = None, field: str = "gpu") -> GPUPower:
    """The DVFS/power model of catalog GPU ``gpu_name`` (its canonical catalog name); ``field`` is the input field
    that named the GPU, for the error.

    Raises:
        HetplanError: the GPU has no entry (no measured DVFS data), or a bad user file.
    """
    table = _load(None if user_file is None else str(user_file))
    try:
        return table[gpu_name.lower()]
    except KeyError:
        raise HetplanError(
            f"no DVFS/power model for GPU {gpu_name} (have: {', '.join(p.gpu for p in table.values())})",
            field=field, fix="add an entry for it to a user power catalog (--power-catalog, see gpu_power.toml)",
        ) from None


def board_limited(power: GPUPower, tdp_w: float, idle_power_w: float,
                  power_limit_w: float | str | None = None, field: str = "power_limit_w") -> GPUPower:
    """``power`` under the board's power limit (``nvidia-smi -pl``), so that ``idle ≤ P_busy(f_eff) ≤ limit ≤ TDP``.

    Args:
        power: the DVFS model. tdp_w, idle_power_w: the GPU catalog's TDP (the highest limit a board takes, its
            default) and blocking power (W).
        power_limit_w: watts from what the lowest supported clock draws (a board's minimum limit: below it
            no clock keeps within it) to the TDP; None: the lower of the model's own limit and the TDP (a fitted
            limit above the TDP describes another board SKU, e.g. Perseus' ~480 W A100); ``"model"``: the model's
            own limit unchanged (calibration on the board it was fitted on).
        field: the input field named in errors.

    Raises:
        HetplanError: a limit outside that range or an unknown word; a model whose own default limit (the lower of
            its ``power_limit_w`` and the TDP) is below what its lowest clock draws (a user power catalog's: a
            limit under the idle power, or one clock only that draws more than the TDP), naming the catalog
            entry's field. No clock keeps within such a limit: the cap fell below every supported clock and
            ``energy frontier`` printed energies of a busy GPU drawing less than an idle one.
    """
    if power_limit_w == "model":
        return power
    if isinstance(power_limit_w, str):
        raise HetplanError(f"unknown power limit {power_limit_w!r}", field=field,
                           fix="give watts, or leave it out for the TDP")
    floor = float(power.busy_power_w(min(power.frequencies_mhz), idle_power_w))
    if power_limit_w is None:
        limit = min(power.power_limit_w, tdp_w)
        if limit < floor * (1 - 1e-9):
            lowest = min(power.frequencies_mhz)
            fix = (f"add lower clocks to gpus.{power.gpu}.frequencies_mhz (at {lowest} MHz it draws {floor:.0f} W, "
                   f"above the {tdp_w:g} W TDP)" if floor > tdp_w else
                   f"give gpus.{power.gpu}.power_limit_w ≥ {math.ceil(floor)} W (at most the {tdp_w:g} W TDP)")
            raise HetplanError(f"{power.gpu}'s power limit {limit:g} W (the lower of its power_limit_w and its "
                               f"{tdp_w:g} W TDP) is below the {floor:.0f} W its lowest clock ({lowest} MHz) draws "
                               f"with {idle_power_w:g} W idle: no clock keeps within it",
                               field=f"gpus.{power.gpu}.{'frequencies_mhz' if floor > tdp_w else 'power_limit_w'}",
                               fix=fix)
        return power.model_copy(update={"power_limit_w": limit})
    if not (np.isfinite(power_limit_w) and floor <= power_limit_w <= tdp_w * (1 + 1e-9)):
        raise HetplanError(f"power limit {power_limit_w} W is outside {power.gpu}'s range (at least the "
                           f"{floor:.0f} W its lowest clock draws, at most its {tdp_w:g} W TDP)", field=field,
                           fix=f"give a limit in [{math.ceil(floor)}, {tdp_w:g}] W")
    return power.model_copy(update={"power_limit_w": float(power_limit_w)})

