"""`triage kafka ...` commands."""

from __future__ import annotations

import typer

app = typer.Typer(help="kafka commands", no_args_is_help=True)
