"""`triage config check FILE`: validate a config and flag what can never work."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from triage.cli.common import ExitCode, fail
from triage.config import ConfigError, load_config
from triage.config.checks import Severity, findings

app = typer.Typer(
    help="Check triage configuration files before the processes read them.",
    no_args_is_help=True,
)


@app.command("check")
def check(
    file: Path = typer.Argument(..., help="The triage YAML config to check."),
    strict: bool = typer.Option(False, "--strict", help="Exit 1 on warnings too."),
    json_out: bool = typer.Option(
        False, "--json", help='Print {"file", "valid", "findings": [...]} on stdout.'
    ),
) -> None:
    """Validate FILE (every field, as the processes load it), then flag what a valid config
    can still never do: a model whose full context's KV exceeds every GPU's budget, a
    tenant whose burst (+ debt) is below the smallest request, a tenant with no pool for
    any model, processes that would bind one port, partitions the app cannot run.

    One line per finding. Exit 0 when nothing is wrong (warnings allowed unless
    --strict), 1 on findings, 2 when the file is unreadable or invalid."""
    try:
        cfg = load_config(file)
    except ConfigError as exc:
        raise fail(str(exc), ExitCode.USAGE, json_out=json_out) from None
    found = findings(cfg)
    bad = [f for f in found if strict or f.severity is Severity.ERROR]
    if json_out:
        typer.echo(json.dumps({
            "file": str(file), "valid": True,
            "findings": [{"severity": f.severity.value, "where": f.where, "message": f.message}
                         for f in found],
        }))  # fmt: skip
    else:
        for f in found:
            typer.echo(f"{file}: {f.line()}", err=True)
        errors = sum(f.severity is Severity.ERROR for f in found)
        summary = (f"{file}: valid; {errors} error(s), {len(found) - errors} warning(s)"
                   if found else f"{file}: valid, nothing found that can never work")  # fmt: skip
        typer.echo(summary)
    if bad:
        raise typer.Exit(ExitCode.FAILED)
