"""`triage demo` (placeholder until the admission app exists).

Brings up the local broker, creates the topics of the config, publishes one
sample InferenceRequest to the rag tenant's request topic and reads it back:
the smallest proof that the wire contract and the broker work end to end.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from urllib.parse import urlsplit

import typer
from confluent_kafka import KafkaError, KafkaException, Message, TopicPartition
from rich.console import Console
from rich.panel import Panel

from triage.config import ConfigError, TriageConfig, load_config
from triage.kafka.clients import broker_reachable, make_consumer, make_producer
from triage.kafka.local import ForeignBrokerError, LocalBroker, LocalBrokerError
from triage.topics.admin import create_topics
from triage.topics.messages import InferenceRequest
from triage.topics.names import TopicNames
from triage.topics.validation import check_request

console = Console()
_LOCAL_HOSTS = {"127.0.0.1", "localhost"}
_TENANT = "rag"


def register(app: typer.Typer) -> None:
    """Attach this module's commands to the root app."""
    app.command("demo")(demo)


def demo(
    config: Path | None = typer.Option(
        None, "--config", "-c", help="triage YAML config [default: the shipped example]."
    ),
) -> None:
    """Bring up the local broker and topics, then round-trip a sample request.

    (A placeholder: it will grow into the full demo with the admission app and
    two simulated GPUs.)
    """
    try:
        cfg = load_config(config)
    except ConfigError as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from None
    bootstrap = cfg.kafka.bootstrap_servers
    console.rule("[bold]triage demo")
    _ensure_broker(bootstrap)
    names = TopicNames(cfg.kafka.topic_prefix)
    result = create_topics(bootstrap, names, cfg)
    console.print(
        f"[green]topics[/green]  {len(result.created)} created, "
        f"{len(result.existing)} already there (prefix {names.prefix!r})"
    )
    _round_trip(bootstrap, names, cfg)


def _ensure_broker(bootstrap: str) -> None:
    """Start the local broker when the config points at this machine; else just check it."""
    parts = urlsplit(f"//{bootstrap.split(',')[0]}")
    if parts.hostname not in _LOCAL_HOSTS or parts.port is None:
        if not broker_reachable(bootstrap, timeout_s=5.0):
            console.print(f"[red]error:[/red] no broker answers on {bootstrap}")
            raise typer.Exit(1)
        console.print(f"[green]broker[/green]  using {bootstrap}")
        return
    try:
        res = LocalBroker(port=parts.port).start()
    except ForeignBrokerError:
        console.print(f"[green]broker[/green]  using the broker already on {bootstrap}")
        return
    except LocalBrokerError as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(1) from None
    how = f"started in {res.ready_s:.1f}s" if res.started else "already running"
    console.print(f"[green]broker[/green]  Kafka {res.status.version} on {bootstrap}: {how}")


def _round_trip(bootstrap: str, names: TopicNames, cfg: TriageConfig) -> None:
    model = (cfg.tenants_by_name[_TENANT].models or [cfg.models[0].name])[0]
    req = InferenceRequest(
        request_id=f"demo-{uuid.uuid4().hex[:12]}",
        tenant=_TENANT,
        model=model,
        prompt_tokens=512,
        max_tokens=128,
        created_at_ms=int(time.time() * 1000),
        metadata={"source": "triage demo"},
    )
    problem = check_request(req, cfg, _TENANT)
    if problem is not None:
        console.print(f"[red]error:[/red] the sample request is invalid: {problem.detail}")
        raise typer.Exit(1)
    topic = names.requests(_TENANT)
    where = _publish(bootstrap, topic, req)
    console.print(f"[green]publish[/green] {req.request_id} -> {topic} [{where[0]}] @ {where[1]}")
    back = _read_back(bootstrap, topic, where)
    same = back == req
    console.print(Panel(back.model_dump_json(indent=2), title=f"read back from {topic}"))
    if not same:
        console.print("[red]the message read back differs from the one sent[/red]")
        raise typer.Exit(1)
    console.print("[bold green]round trip ok[/bold green]: the broker, topics and schema work.")


def _publish(bootstrap: str, topic: str, req: InferenceRequest) -> tuple[int, int]:
    """Send one request; return the (partition, offset) the broker acknowledged."""
    acked: list[tuple[int, int]] = []
    failed: list[str] = []

    def on_delivery(error: KafkaError | None, msg: Message) -> None:
        if error is not None:
            failed.append(str(error))
        else:
            acked.append((msg.partition() or 0, msg.offset() or 0))

    producer = make_producer(bootstrap)
    producer.produce(topic, key=req.request_id, value=req.to_bytes(), on_delivery=on_delivery)
    producer.flush(30)
    if failed or not acked:
        console.print(f"[red]error:[/red] publish failed: {failed or 'no acknowledgement'}")
        raise typer.Exit(1)
    return acked[0]


def _read_back(bootstrap: str, topic: str, where: tuple[int, int]) -> InferenceRequest:
    consumer = make_consumer(bootstrap, group_id=f"triage-demo-{uuid.uuid4().hex[:8]}")
    try:
        consumer.assign([TopicPartition(topic, where[0], where[1])])
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            msg = consumer.poll(1.0)
            if msg is None:
                continue
            if msg.error():
                raise KafkaException(msg.error())
            return InferenceRequest.from_bytes(msg.value() or b"")
    finally:
        consumer.close()
    console.print("[red]error:[/red] the request did not come back within 30 s")
    raise typer.Exit(1)
