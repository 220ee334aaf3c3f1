"""The `triage` command line. Each command group lives in its own module."""

from __future__ import annotations

import logging

import typer

from triage.cli import (
    admission_cmd,
    audit_cmd,
    bench_cmd,
    chaos_cmd,
    config_cmd,
    demo_cmd,
    experiments_cmd,
    gateway_cmd,
    kafka_cmd,
    replay_cmd,
    schema_cmd,
    sim_cmd,
    submit_cmd,
    topics_cmd,
    worker_cmd,
)
from triage.cli.common import TriageGroup, version

app = typer.Typer(
    name="triage",
    help=(
        "Admission control for multi-tenant GPU inference, as a Kafka stream processor.\n\n"
        "Start with `triage demo` (local broker, admission app, two simulated GPUs, three "
        "tenants), or `triage sim` to compare policies in virtual time."
    ),
    no_args_is_help=True,
    cls=TriageGroup,
    pretty_exceptions_enable=False,
    add_completion=False,
)

app.add_typer(kafka_cmd.app, name="kafka")
app.add_typer(topics_cmd.app, name="topics")
app.add_typer(bench_cmd.app, name="bench")
app.add_typer(config_cmd.app, name="config")
for module in (
    schema_cmd, admission_cmd, worker_cmd, submit_cmd, audit_cmd, demo_cmd, sim_cmd, replay_cmd,
    experiments_cmd, gateway_cmd, chaos_cmd,
):
    module.register(app)


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"triage {version()}")
        raise typer.Exit()


@app.callback()
def _root(
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Debug logging (and the "
                                 "traceback of an unexpected error)."),
    _version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True,
                                  help="Print the version and exit."),
) -> None:
    """Exit codes (every command): 0 ok, 1 failed, 2 bad input or config, 3 broker or
    source unavailable, 4 internal error, 130 interrupted."""
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


def main() -> None:
    app()
