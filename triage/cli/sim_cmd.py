"""`triage sim`: not built yet."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Attach this module's commands to the root app."""
