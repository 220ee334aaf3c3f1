"""`triage topics ...`: create and list triage's topics on the broker."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from triage.cli.common import (
    ExitCode,
    bootstrap_option,
    config_option,
    fail,
    load_or_exit,
    require_broker,
)
from triage.config.checks import runnable_problem
from triage.topics.admin import create_topics, describe_topics, topic_layout
from triage.topics.errors import TopicAdminError
from triage.topics.names import TopicNames

app = typer.Typer(
    help="Create and list triage's Kafka topics (names, partitions, retention from config).",
    no_args_is_help=True,
)
console = Console()

CONFIG = config_option()
BOOTSTRAP = bootstrap_option()


@app.command()
def create(
    config: Path | None = CONFIG,
    bootstrap: str | None = BOOTSTRAP,
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the layout; touch nothing."),
) -> None:
    """Create every topic for the configured tenants and GPUs; idempotent.

    Topics that already exist are left alone and listed (with a warning when
    their partition count differs from the config).
    """
    cfg = load_or_exit(config, bootstrap=bootstrap)
    problem = runnable_problem(cfg)
    if problem is not None:  # topics the app could not run on would outlive the mistake
        raise fail(problem, ExitCode.USAGE)
    names = TopicNames.of(cfg.kafka.topic_prefix, cfg.kafka.tenant_topics)
    if dry_run:
        table = Table("topic", "partitions", "config", title="topic layout")
        for spec in topic_layout(cfg, names):
            conf = ", ".join(f"{k}={v}" for k, v in spec.config.items())
            table.add_row(spec.name, str(spec.partitions), conf)
        console.print(table)
        return
    server = cfg.kafka.bootstrap_servers
    require_broker(server)
    try:
        result = create_topics(server, names, cfg)
    except TopicAdminError as exc:
        raise fail(str(exc), ExitCode.FAILED) from None
    for name in result.created:
        console.print(f"[green]created[/green]  {name}")
    for e in result.existing:
        note = f" [yellow]({e.mismatch}; left unchanged)[/yellow]" if e.mismatch else ""
        console.print(f"[dim]exists[/dim]   {e.name}{note}")
    console.print(
        f"{len(result.created)} created, {len(result.existing)} already existed on {server}"
    )


@app.command("list")
def list_(
    config: Path | None = CONFIG,
    bootstrap: str | None = BOOTSTRAP,
    all_topics: bool = typer.Option(
        False, "--all", help="Every topic on the broker, not only those under the prefix."
    ),
) -> None:
    """List triage's topics on the broker with partitions, cleanup policy and retention."""
    cfg = load_or_exit(config, bootstrap=bootstrap)
    server = cfg.kafka.bootstrap_servers
    require_broker(server)
    prefix = None if all_topics else cfg.kafka.topic_prefix
    try:
        infos = describe_topics(server, prefix)
    except TopicAdminError as exc:
        raise fail(str(exc), ExitCode.FAILED) from None
    table = Table("topic", "partitions", "cleanup.policy", "retention.ms", title=server)
    for i in infos:
        table.add_row(i.name, str(i.partitions), i.cleanup_policy or "", i.retention_ms or "")
    console.print(table)
    if not infos:
        console.print("no topics yet: run `triage topics create`")
