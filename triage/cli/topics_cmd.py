"""`triage topics ...`: create and list triage's topics on the broker."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from triage.config import ConfigError, TriageConfig, load_config
from triage.kafka.clients import broker_reachable
from triage.kafka.security import use_kafka_security
from triage.topics.admin import create_topics, describe_topics, topic_layout
from triage.topics.errors import TopicAdminError
from triage.topics.names import TopicNames

app = typer.Typer(
    help="Create and list triage's Kafka topics (names, partitions, retention from config).",
    no_args_is_help=True,
)
console = Console()
err = Console(stderr=True)

CONFIG = typer.Option(
    None, "--config", "-c", help="triage YAML config [default: the shipped example]."
)
BOOTSTRAP = typer.Option(
    None, "--bootstrap", "-b", help="Broker host:port [default: kafka.bootstrap_servers]."
)


def _load(config: Path | None) -> TriageConfig:
    try:
        return load_config(config)
    except ConfigError as exc:
        err.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from None


def _server(cfg: TriageConfig, bootstrap: str | None) -> str:
    """The broker to talk to, with the config's SASL/TLS settings declared for it."""
    server = bootstrap or cfg.kafka.bootstrap_servers
    try:
        use_kafka_security(cfg.kafka, bootstrap=server)
    except ConfigError as exc:
        err.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from None
    return server


def _reachable_or_exit(bootstrap: str) -> None:
    if not broker_reachable(bootstrap, timeout_s=5.0):
        err.print(
            f"[red]error:[/red] no Kafka broker answers on {bootstrap} "
            "(start one with `triage kafka up`)"
        )
        raise typer.Exit(1)


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
    cfg = _load(config)
    names = TopicNames(cfg.kafka.topic_prefix)
    if dry_run:
        table = Table("topic", "partitions", "config", title="topic layout")
        for spec in topic_layout(cfg, names):
            conf = ", ".join(f"{k}={v}" for k, v in spec.config.items())
            table.add_row(spec.name, str(spec.partitions), conf)
        console.print(table)
        return
    server = _server(cfg, bootstrap)
    _reachable_or_exit(server)
    try:
        result = create_topics(server, names, cfg)
    except TopicAdminError as exc:
        err.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(1) from None
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
    cfg = _load(config)
    server = _server(cfg, bootstrap)
    _reachable_or_exit(server)
    prefix = None if all_topics else cfg.kafka.topic_prefix
    try:
        infos = describe_topics(server, prefix)
    except TopicAdminError as exc:
        err.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(1) from None
    table = Table("topic", "partitions", "cleanup.policy", "retention.ms", title=server)
    for i in infos:
        table.add_row(i.name, str(i.partitions), i.cleanup_policy or "", i.retention_ms or "")
    console.print(table)
    if not infos:
        console.print("no topics yet: run `triage topics create`")
