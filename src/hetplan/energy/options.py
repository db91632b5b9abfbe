"""Execution options of one instruction and the continuous energy model fit to them.

Every forward or backward can run at any profiled SM frequency; each frequency is an *option* with a time
and an energy. Before planning (Perseus, SOSP'24, §4.3; Lowtime's operation model) we

1. keep the Pareto-optimal options in (time, energy): an option is dropped when another one is strictly
   faster AND strictly cheaper (this is done on the *measured* energy, before removing idle power; see below);
2. quantize time to the unit time ``u``: ``q = floor(time_s / u)``; when several options share a ``q`` we
   keep the one with the largest energy (the slowest of them, whose real time is closest to ``q·u``);
3. turn energy into *effective* energy ``e' = e - P_idle · q · u``: the energy above what the GPU would burn
   idling (blocking on communication) for the same time. Minimising the sum of effective energies plus
   ``num_stages · P_idle · T`` is minimising the iteration energy including blocking energy (Perseus §4.1);
4. fit ``e'(q) = a · exp(b · q) + c`` (b < 0, a ≥ 0: decreasing and convex, as Phillips–Dessouky needs).

The Pareto filter runs on measured energy, before idle power is removed: removing ``P_idle·t`` lowers slow
options more than fast ones, so filtering afterwards would keep slow options that are worse in real energy
and change the frontier; the published frontiers (``frontier_reference``) were computed this way and we match
them. We do NOT trim the slow end where effective energy rises again (rare on these profiles): step 2 keeps
the largest-energy option per quantum exactly as the reference planner does.

The fit is ours (variable projection): for a fixed ``b`` the best ``a, c`` are linear least squares, so we
scan ``b`` on a log grid and refine it with a bounded scalar search; this finds the global least-squares fit
instead of depending on an initial guess.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from hetplan.energy.profile import InstructionProfile
from hetplan.errors import HetplanError


def pareto_mask(time_s: np.ndarray, energy_j: np.ndarray) -> np.ndarray:
    """Boolean mask of options not strictly dominated in both time and energy.

    Args:
        time_s: shape (k,). energy_j: shape (k,).

    Returns:
        shape (k,) bool; ``mask[i]`` is False iff some ``j`` has ``time[j] < time[i]`` and ``energy[j] < energy[i]``.
    """
    t = np.asarray(time_s, dtype=float)
    e = np.asarray(energy_j, dtype=float)
    dominated = ((t[None, :] < t[:, None]) & (e[None, :] < e[:, None])).any(axis=1)
    return ~dominated


_INV_PHI = (math.sqrt(5.0) - 1.0) / 2.0


def _golden_min(f, lo: float, hi: float, xatol: float, maxiter: int = 500) -> tuple[float, float]:
    """``(x, f(x))`` minimising a unimodal ``f`` on ``[lo, hi]`` by golden-section search (Kiefer 1953) to
    ``xatol``. (SciPy's bounded Brent does the same job; importing ``scipy.optimize`` alone costs more CPU than
    a whole 8 x 12 frontier, so the energy CLI does without it.)"""
    a, b = lo, hi
    c, d = b - _INV_PHI * (b - a), a + _INV_PHI * (b - a)
    fc, fd = f(c), f(d)
    for _ in range(maxiter):
        if b - a <= xatol:
            break
        if fc <= fd:
            b, d, fd = d, c, fc
            c = b - _INV_PHI * (b - a)
            fc = f(c)
        else:
            a, c, fc = c, d, fd
            d = a + _INV_PHI * (b - a)
            fd = f(d)
    return (c, fc) if fc <= fd else (d, fd)


def _fit_exponential(q: np.ndarray, y: np.ndarray) -> tuple[float, float, float]:
    """Least-squares fit of ``y ≈ a·exp(b·q) + c`` with ``b < 0``, ``a ≥ 0``.

    Variable projection: ``a, c`` solved linearly for each ``b``; ``b`` by grid + golden-section refinement
    between the grid neighbours of the best grid point (:func:`_golden_min`).
    Degenerate inputs (one or two points, flat data) return an exact, still convex, model.
    """
    q = np.asarray(q, dtype=float)
    y = np.asarray(y, dtype=float)
    if q.size == 1 or np.ptp(y) == 0.0:
        return 0.0, -1.0, float(y.mean())
    q0 = float(q.min())
    span = max(float(np.ptp(q)), 1.0)
    x = q - q0  # shift for conditioning; a is rescaled at the end

    def solve(b: float) -> tuple[float, float, float]:
        z = np.exp(b * x)
        zm, ym = z.mean(), y.mean()
        dz = z - zm
        var = float(dz @ dz)
        a = float(dz @ (y - ym)) / var if var > 0 else 0.0
        a = max(a, 0.0)  # convexity: a >= 0
        c = ym - a * zm
        r = a * z + c - y
        return float(r @ r), a, c

    grid = -np.logspace(-4, 1.5, 120) / span
    errs = np.array([solve(b)[0] for b in grid])
    k = int(np.argmin(errs))
    lo = grid[min(k + 1, grid.size - 1)]
    hi = grid[max(k - 1, 0)]
    if lo > hi:
        lo, hi = hi, lo
    best_b = float(grid[k])
    if hi > lo:
        b, err = _golden_min(lambda b: solve(b)[0], lo, hi, 1e-12 / span)
        if err <= errs[k]:
            best_b = b
    _, a, c = solve(best_b)
    # back to the unshifted variable: a·exp(b(q-q0)) = (a·exp(-b q0))·exp(b q)
    return a * math.exp(-best_b * q0), best_b, c


@dataclass(frozen=True)
class OperationOptions:
    """The candidate options of one instruction type on one stage, quantized, with their energy model.

    Attributes:
        stage, instruction: which instruction.
        unit_time_s: the time quantum ``u`` (s).
        quant_time: shape (k,), ``floor(time_s / u)``, strictly descending (slowest first).
        time_s, energy_j, frequency_mhz: shape (k,), the measured option kept for each quantum.
        effective_energy_j: shape (k,), ``energy_j - P_idle · quant_time · u`` (J).
        coefficients: ``(a, b, c)`` of the model ``a·exp(b·q) + c`` (J, 1/quantum, J).
    """

    stage: int
    instruction: str
    unit_time_s: float
    quant_time: np.ndarray
    time_s: np.ndarray
    energy_j: np.ndarray
    frequency_mhz: np.ndarray
    effective_energy_j: np.ndarray
    coefficients: tuple[float, float, float]

    @property
    def min_quant(self) -> int:
        """Fastest duration, in quanta."""
        return int(self.quant_time[-1])

    @property
    def max_quant(self) -> int:
        """Slowest duration, in quanta."""
        return int(self.quant_time[0])

    def model_energy_j(self, quant_time: np.ndarray | int) -> np.ndarray | float:
        """Effective energy predicted by the fitted model at duration ``quant_time`` (quanta), in J."""
        a, b, c = self.coefficients
        return a * np.exp(b * np.asarray(quant_time, dtype=float)) + c

    def frequency_for(self, quant_time: int) -> int:
        """The slowest kept option whose quantized time is ≤ ``quant_time`` (the fastest if none), in MHz."""
        idx = np.nonzero(self.quant_time <= quant_time)[0]
        i = int(idx[0]) if idx.size else self.quant_time.size - 1
        return int(self.frequency_mhz[i])


def build_options(profile: InstructionProfile, unit_time_s: float, idle_power_w: float) -> OperationOptions:
    """Pareto-filter, quantize, convert to effective energy and fit one instruction's options.

    Args:
        profile: the measured options of one (stage, instruction).
        unit_time_s: time quantum (s), > 0; Perseus uses 1 ms.
        idle_power_w: GPU power while blocked on communication (W), ≥ 0.

    Returns:
        The :class:`OperationOptions`.

    Raises:
        HetplanError: non-positive unit time, negative idle power, or every option shorter than one quantum.
    """
    if not (unit_time_s > 0 and math.isfinite(unit_time_s)):
        raise HetplanError(f"unit time must be positive, got {unit_time_s}", field="unit_time_s",
                           fix="use e.g. 0.001 (1 ms)")
    if not (idle_power_w >= 0 and math.isfinite(idle_power_w)):
        raise HetplanError(f"idle power must be ≥ 0 W, got {idle_power_w}", field="idle_power_w",
                           fix="use the GPU's power while blocking on communication, e.g. 83.64 for A100-SXM")
    t, e, f = profile.time_s, profile.energy_j, profile.frequency_mhz
    keep = pareto_mask(t, e)
    t, e, f = t[keep], e[keep], f[keep]
    q = np.array([int(float(x) // unit_time_s) for x in t], dtype=np.int64)
    # one option per quantum: the largest energy (stable on ties, like a sort by energy descending)
    order = np.argsort(-e, kind="stable")
    chosen: dict[int, int] = {}
    for i in order:
        chosen.setdefault(int(q[i]), int(i))
    idx = np.array(sorted(chosen.values(), key=lambda i: -q[i]), dtype=np.int64)
    q, t, e, f = q[idx], t[idx], e[idx], f[idx]
    if q[-1] < 1:
        raise HetplanError(
            f"stage {profile.stage} {profile.instruction} takes {t[-1]:.3g} s, less than one unit time {unit_time_s} s",
            field="unit_time_s", fix="use a smaller --unit-time-s",
        )
    eff = e - idle_power_w * q * unit_time_s
    coef = _fit_exponential(q, eff)
    return OperationOptions(profile.stage, profile.instruction, float(unit_time_s), q, t, e, f, eff, coef)
