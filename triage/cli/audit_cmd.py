"""`triage audit REQUEST_ID`: why a request went the way it did, from the decisions log.

Exit status: 0 when decisions were found and explained, 1 when the id has none,
2 for bad input, 3 when the decisions topic or file cannot be read.
"""

from __future__ import annotations

import time
from pathlib import Path

import typer
from rich.console import Console
from rich.panel import Panel
from rich.table import Table

from triage.audit import (
    AuditError,
    DecisionSourceError,
    Explanation,
    ScanResult,
    explain,
    parse_since,
    read_decisions,
    read_decisions_file,
)
from triage.audit.units import millis
from triage.config import ConfigError, load_config
from triage.kafka.security import use_kafka_security
from triage.topics.names import TopicNames
from triage.topics.reasons import ReasonCode

EXIT_NOT_FOUND = 1
EXIT_BAD_INPUT = 2
EXIT_UNAVAILABLE = 3


def register(app: typer.Typer) -> None:
    """Attach this module's commands to the root app."""
    app.command("audit")(audit)


def audit(
    request_id: str = typer.Argument(..., help="The request id to explain."),
    config_file: Path | None = typer.Option(
        None, "--config", help="triage.yaml (default: the shipped example)."
    ),
    from_file: str | None = typer.Option(
        None, "--from-file", help="Read a decisions export (JSON lines; - for stdin), not Kafka."
    ),
    since: str | None = typer.Option(
        None, "--since", help="Only decisions since: epoch ms, an age (15m, 2h, 3d), or ISO time."
    ),
    json_out: bool = typer.Option(False, "--json", help="Print the explanation as JSON."),
    timeout_s: float = typer.Option(
        30.0, "--timeout", min=0.1, help="Seconds the topic scan may take."
    ),
    bootstrap: str | None = typer.Option(
        None, "--bootstrap", help="Override kafka.bootstrap_servers."
    ),
    topic_prefix: str | None = typer.Option(
        None, "--topic-prefix", help="Override kafka.topic_prefix."
    ),
) -> None:
    """Explain a request's decisions: outcome, reason and the numbers behind it."""
    err = Console(stderr=True)
    try:
        since_ms = parse_since(since, now_ms=int(time.time() * 1000)) if since else None
    except AuditError as exc:
        err.print(f"[red]error:[/] {exc}")
        raise typer.Exit(EXIT_BAD_INPUT) from None
    try:
        if from_file is not None:
            source = from_file
            scan = read_decisions_file(from_file, request_id=request_id, since_ms=since_ms)
        else:
            config = load_config(config_file)
            use_kafka_security(config.kafka, bootstrap=bootstrap)
            topic = TopicNames(topic_prefix or config.kafka.topic_prefix).decisions
            source = topic
            scan = read_decisions(
                bootstrap=bootstrap or config.kafka.bootstrap_servers,
                topic=topic,
                request_id=request_id,
                since_ms=since_ms,
                timeout_s=timeout_s,
            )
    except ConfigError as exc:
        err.print(f"[red]error:[/] {exc}")
        raise typer.Exit(EXIT_BAD_INPUT) from None
    except DecisionSourceError as exc:
        err.print(f"[red]error:[/] {exc}")
        raise typer.Exit(EXIT_UNAVAILABLE) from None
    if not scan.complete:
        err.print(f"[yellow]warning:[/] the scan stopped at its {timeout_s:g} s timeout; "
                  "results may be partial (use --since or a longer --timeout)")  # fmt: skip
    if not scan.records:
        err.print(_not_found(request_id, source, scan, since))
        raise typer.Exit(EXIT_NOT_FOUND)
    explanation = explain(scan.records)
    if json_out:
        typer.echo(explanation.to_json(indent=2))
    else:
        _render(explanation, Console())


def _not_found(request_id: str, source: str, scan: ScanResult, since: str | None) -> str:
    where = f"{scan.partitions} partition(s) of {source}" if scan.partitions else source
    window = f" since {since}" if since else ""
    lines = [
        f"[red]no decisions recorded for request {request_id}[/] "
        f"(scanned {scan.scanned:,} record(s) in {where}{window})."
    ]
    if scan.unparseable:
        lines.append(f"{scan.unparseable} record(s) mentioning it could not be parsed.")
    lines.append(
        f"Check the id and tenant; a retried request's later attempts are {request_id}.r1, "
        f"{request_id}.r2, ..."
    )
    return "\n".join(lines)


def _render(e: Explanation, out: Console) -> None:
    color = {"accept": "green", "complete": "green", "queue": "yellow", "preempt": "yellow"}.get(
        e.outcome.value, "red"
    )
    if e.reason == ReasonCode.FAILED:
        color = "red"
    title = f"{e.request_id} - tenant {e.tenant}, model {e.model}"
    out.print(Panel(e.summary, title=title, border_style=color, expand=False))
    table = Table(title="decisions", show_lines=False)
    table.add_column("at", justify="right", no_wrap=True)
    table.add_column("outcome", no_wrap=True)
    table.add_column("reason", no_wrap=True)
    table.add_column("explanation")
    for step in e.steps:
        table.add_row(
            f"+{millis(step.offset_ms)}",
            step.record.outcome.value,
            step.record.reason.value,
            step.sentence,
        )
    out.print(table)
