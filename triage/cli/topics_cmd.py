"""`triage topics ...` commands."""

from __future__ import annotations

import typer

app = typer.Typer(help="topics commands", no_args_is_help=True)
