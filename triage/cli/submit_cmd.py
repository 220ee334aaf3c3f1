"""`triage submit`: send requests as a tenant and print each terminal reply.

Requests are checked locally first (the wire model, then the configured tenant,
model and context window) so a typo is a clear error here, not an `invalid`
reply after a round trip. Exit status: 0 when every request completed, 1 when
any ended otherwise, 2 for bad input, 3 when the broker or topics are unusable.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.table import Table

from triage.client import BatchResult, ClientError, RetryPolicy, TriageClient
from triage.config import ConfigError, load_config
from triage.config.models import TriageConfig
from triage.kafka.security import use_kafka_security
from triage.topics.messages import InferenceRequest
from triage.topics.validation import check_request, describe_validation_error

log = logging.getLogger(__name__)

EXIT_NOT_ALL_COMPLETED = 1
EXIT_BAD_INPUT = 2
EXIT_UNAVAILABLE = 3


def register(app: typer.Typer) -> None:
    """Attach this module's commands to the root app."""
    app.command("submit")(submit)


def submit(
    tenant: str = typer.Option(..., "--tenant", help="Tenant to submit as."),
    model: str = typer.Option(..., "--model", help="Model to call."),
    prompt_tokens: int = typer.Option(..., "--prompt-tokens", help="Prompt length in tokens."),
    max_tokens: int = typer.Option(..., "--max-tokens", help="Most output tokens."),
    sla_ms: int | None = typer.Option(None, "--sla-ms", help="Latency target (tenant default)."),
    count: int = typer.Option(1, "--count", min=1, help="How many requests to send."),
    concurrency: int = typer.Option(1, "--concurrency", min=1, help="Most in flight at once."),
    retry: bool = typer.Option(
        True, "--retry/--no-retry", help="Resubmit rejected/timed-out requests after the hint."
    ),
    max_attempts: int = typer.Option(5, "--max-attempts", min=1, help="Attempts per request."),
    timeout_s: float = typer.Option(
        120.0, "--timeout", min=0.1, help="Seconds to await each attempt's terminal reply."
    ),
    prompt: str | None = typer.Option(None, "--prompt", help="Prompt text (for real backends)."),
    id_prefix: str | None = typer.Option(
        None, "--id-prefix", help="Request ids are <prefix>-<n> (default: cli-<random>)."
    ),
    config_file: Path | None = typer.Option(
        None, "--config", help="triage.yaml (default: the shipped example)."
    ),
    bootstrap: str | None = typer.Option(
        None, "--bootstrap", help="Override kafka.bootstrap_servers."
    ),
    topic_prefix: str | None = typer.Option(
        None, "--topic-prefix", help="Override kafka.topic_prefix."
    ),
    json_out: bool = typer.Option(False, "--json", help="One JSON object per terminal reply."),
) -> None:
    """Submit inference requests and print each terminal reply."""
    err = Console(stderr=True)
    config = _load(config_file, err)
    try:
        use_kafka_security(config.kafka, bootstrap=bootstrap)
    except ConfigError as exc:
        err.print(f"[red]error:[/] {exc}")
        raise typer.Exit(EXIT_BAD_INPUT) from None
    prefix = id_prefix or f"cli-{uuid.uuid4().hex[:10]}"
    requests = [
        _build(
            err,
            config,
            request_id=prefix if count == 1 else f"{prefix}-{i:05d}",
            tenant=tenant,
            model=model,
            prompt_tokens=prompt_tokens,
            max_tokens=max_tokens,
            sla_ms=sla_ms,
            prompt=prompt,
        )
        for i in range(count)
    ]
    try:
        client = TriageClient(
            bootstrap=bootstrap or config.kafka.bootstrap_servers,
            topic_prefix=topic_prefix or config.kafka.topic_prefix,
            tenant=tenant,
            reply_timeout_s=timeout_s,
            retry=RetryPolicy(max_attempts=max_attempts),
        )
    except ClientError as exc:
        err.print(f"[red]error:[/] {exc}")
        raise typer.Exit(EXIT_UNAVAILABLE) from None
    with client:
        results = client.run_batch(requests, max_in_flight=concurrency, retry=retry)
        statuses = _print(results, json_out=json_out, out=Console(), err=err)
    if not json_out:
        _summary(statuses, Console())
    if set(statuses) != {"completed"}:
        raise typer.Exit(EXIT_NOT_ALL_COMPLETED)


def _load(config_file: Path | None, err: Console) -> TriageConfig:
    try:
        return load_config(config_file)
    except ConfigError as exc:
        err.print(f"[red]error:[/] {exc}")
        raise typer.Exit(EXIT_BAD_INPUT) from None


def _build(err: Console, config: TriageConfig, **fields: object) -> InferenceRequest:
    """Validate one request as admission will: the wire model, then the configuration."""
    data = {k: v for k, v in fields.items() if v is not None}
    try:
        req = InferenceRequest.model_validate(data)
    except ValidationError as exc:
        err.print(f"[red]error:[/] invalid request: {describe_validation_error(exc)}")
        raise typer.Exit(EXIT_BAD_INPUT) from None
    problem = check_request(req, config, topic_tenant=req.tenant)
    if problem is not None:
        err.print(f"[red]error:[/] {problem.reason.value}: {problem.detail}")
        raise typer.Exit(EXIT_BAD_INPUT)
    return req


def _status(res: BatchResult) -> str:
    if res.reply is not None:
        return res.reply.status.value
    return "client_timeout" if isinstance(res.error, TimeoutError) else "client_error"


def _print(
    results: Iterator[BatchResult], *, json_out: bool, out: Console, err: Console
) -> Counter[str]:
    statuses: Counter[str] = Counter()
    for res in results:
        status = _status(res)
        statuses[status] += 1
        if json_out:
            line: dict[str, object] = {
                "request_id": res.request.request_id,
                "status": status,
                "attempts": res.attempts,
            }
            if res.reply is not None:
                line["reply"] = res.reply.model_dump(mode="json", exclude_none=True)
            if res.error is not None:
                line["error"] = str(res.error)
            typer.echo(json.dumps(line))  # plain: no wrapping or colour in machine output
            continue
        out.print(_line(res, status), highlight=False)
    return statuses


def _line(res: BatchResult, status: str) -> str:
    rid = res.request.request_id
    tries = f" after {res.attempts} attempts" if res.attempts > 1 else ""
    r = res.reply
    if r is None:
        return f"[red]{rid}[/] {status}{tries}: {res.error}"
    color = "green" if status == "completed" else "yellow" if r.retry_after_ms else "red"
    bits = [f"[{color}]{r.request_id}[/] {status}{tries}"]
    if r.reason is not None:
        bits.append(f"reason={r.reason.value}")
    if r.gpu_id:
        bits.append(f"gpu={r.gpu_id}")
    if r.latency_ms is not None:
        bits.append(f"latency={r.latency_ms / 1000:.2f}s")
    if r.output_tokens is not None:
        bits.append(f"output_tokens={r.output_tokens}")
    if r.retry_after_ms is not None:
        bits.append(f"retry_after={r.retry_after_ms / 1000:.2f}s")
    if r.detail:
        bits.append(f"({r.detail})")
    return " ".join(bits)


def _summary(statuses: Counter[str], out: Console) -> None:
    if sum(statuses.values()) <= 1:
        return
    table = Table(title="terminal replies")
    table.add_column("status")
    table.add_column("requests", justify="right")
    for status, n in sorted(statuses.items()):
        table.add_row(status, str(n))
    out.print(table)
