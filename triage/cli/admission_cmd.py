"""`triage admission`: run the Faust admission app until SIGTERM."""

from __future__ import annotations

import logging
from pathlib import Path

import typer

from triage.config import ConfigError, load_config


def register(app: typer.Typer) -> None:
    app.command("admission")(admission)


def admission(
    config: Path = typer.Option(None, "--config", "-c", help="triage.yaml (default: the "
                                "shipped example)."),
    datadir: str = typer.Option(None, help="RocksDB directory of this process (default from "
                                "config: admission.datadir). One per process."),
    metrics_port: int = typer.Option(None, help="Prometheus port (default from config; 0 "
                                     "disables)."),
    loglevel: str = typer.Option("info", help="crit, error, warn, info or debug."),
) -> None:
    """Run the admission app (the Faust stream processor).

    Reads every tenant's request topic, completions and GPU heartbeats; decides,
    replies, dispatches and records every decision. Stop with SIGTERM or Ctrl-C; state
    is recovered from the changelogs on the next start."""
    try:
        cfg = load_config(config)
    except ConfigError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(2) from None
    import faust  # heavy import, only for this command

    from triage.streams.app import build_app

    logging.getLogger("faust").setLevel(logging.WARNING)
    try:
        built = build_app(cfg, config_path=config, datadir=datadir, metrics_port=metrics_port)
    except ConfigError as exc:  # e.g. kafka.security names an unset password variable
        typer.echo(str(exc), err=True)
        raise typer.Exit(2) from None
    worker = faust.Worker(built.app, loglevel=loglevel, quiet=True)
    worker.execute_from_commandline()
