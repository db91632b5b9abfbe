"""How durations and dollars read to people, in every table and message (one place, so that a plan table, an
estimate line and an error say the same thing the same way)."""

from __future__ import annotations


def duration_text(seconds: float) -> str:
    """A duration for people: days from a day on, hours from an hour, else seconds (``6.4 s``, ``1.8 d``)."""
    if seconds >= 86400:
        return f"{seconds / 86400:.1f} d"
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds:.1f} s" if seconds >= 0.1 else f"{seconds:.3g} s"


def usd_text(x: float) -> str:
    """Dollars (without the sign) with as many decimals as the amount needs ($0.2019 per iteration, $445,885 per
    job)."""
    return f"{x:,.0f}" if x >= 1000 else f"{x:.2f}" if x >= 1 else f"{x:.4f}"


def kwh_text(x: float) -> str:
    """Energy in kWh with as many digits as the amount needs (``14,159``, ``12.3``, ``0.0014``: a one-iteration
    job's kWh read ``0``)."""
    return f"{x:,.0f}" if x >= 100 else f"{x:.3g}"
