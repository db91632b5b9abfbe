"""Placeholder, filled in by the core planner work."""

import typer


def register(app: typer.Typer) -> None:
    """Add this module's commands to ``app``."""
