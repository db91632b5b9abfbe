"""Shared paths and constants of the energy tests."""

from __future__ import annotations

from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "energy"
IDLE_A100_W = 83.64  # W, Perseus' blocking power of A100-SXM (../shared/data/energy/README.md)
IDLE_A40_W = 70.38  # W, A40


def profile_path(model: str, device: str = "a100_sxm") -> Path:
    return FIXTURES / f"{model}+{device}_bf16.csv"
