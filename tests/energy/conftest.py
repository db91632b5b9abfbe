from __future__ import annotations

from pathlib import Path

import pytest

from .energy_testutil import FIXTURES, IDLE_A100_W, profile_path


@pytest.fixture(scope="session")
def fixtures() -> Path:
    return FIXTURES


@pytest.fixture(scope="session")
def gpt_profile():
    from hetplan.energy.profile import load_stage_profile

    return load_stage_profile(profile_path("gpt3-175b"))


@pytest.fixture(scope="session")
def gpt_frontier_12(gpt_profile):
    from hetplan.energy.frontier import compute_frontier

    return compute_frontier(gpt_profile, 12, IDLE_A100_W, 0.001)
