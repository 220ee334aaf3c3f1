"""`triage kafka ...`: the local single-node Kafka broker (KRaft, no Docker)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import typer
from rich.console import Console

from triage.cli.common import ExitCode, fail, print_error
from triage.kafka.local import (
    DEFAULT_HEAP,
    DEFAULT_PORT,
    KAFKA_VERSION,
    BrokerStatus,
    ForeignBrokerError,
    LocalBroker,
    LocalBrokerError,
    kafka_home,
)

app = typer.Typer(
    help=(
        f"Run a local Apache Kafka {KAFKA_VERSION} broker (single node, KRaft, 127.0.0.1) from "
        "Maven-resolved jars. Jars are cached in ~/.cache/triage/kafka/ (or $TRIAGE_KAFKA_HOME), "
        "data and logs in ~/.cache/triage/kafka-data/<port>/."
    ),
    no_args_is_help=True,
)
console = Console()

PORT = typer.Option(
    DEFAULT_PORT, "--port", "-p", min=1, max=65534,
    help="Client port; the controller uses port+1.",
)
DATA_DIR = typer.Option(
    None, "--data-dir", help="Data, logs and pid file (default: ~/.cache/triage/kafka-data/PORT)."
)


def _broker(port: int, data_dir: Path | None, heap: str = DEFAULT_HEAP) -> LocalBroker:
    try:
        return LocalBroker(port=port, data_dir=data_dir, heap_opts=heap)
    except LocalBrokerError as exc:
        raise fail(str(exc), ExitCode.USAGE) from None


def _fail(exc: Exception, broker: LocalBroker | None = None) -> typer.Exit:
    """One line: a start failure's message carries log tails; point at the log instead."""
    lines = [ln for ln in str(exc).splitlines() if ln.strip()]
    first = lines[0].rstrip(":") if lines else type(exc).__name__
    if len(lines) > 1 and broker is not None and broker.log_path.exists():
        first += f" (details in {broker.log_path})"
    return fail(first, ExitCode.FAILED)


@app.command()
def install(
    force: bool = typer.Option(False, "--force", help="Resolve the jars again even if cached."),
) -> None:
    """Resolve Kafka's jars with Maven into the cache (once; later calls return at once)."""
    t0 = time.monotonic()
    broker = LocalBroker()
    try:
        ran = broker.install(force=force)
    except LocalBrokerError as exc:
        raise _fail(exc, broker) from None
    took = time.monotonic() - t0
    verb = "installed" if ran else "already installed"
    console.print(f"Kafka {KAFKA_VERSION} {verb} in {broker.lib_dir} ({took:.1f}s)")


@app.command()
def up(
    port: int = PORT,
    data_dir: Path | None = DATA_DIR,
    heap: str = typer.Option(DEFAULT_HEAP, "--heap", help="JVM heap options."),
) -> None:
    """Start the broker and wait until it answers a metadata request.

    Idempotent: installs the jars and formats storage the first time only; if our
    broker already runs, says so and returns. A broker on the port that triage did
    not start is reported and left alone.
    """
    broker = _broker(port, data_dir, heap)
    try:
        result = broker.start()
    except ForeignBrokerError as exc:
        print_error(str(exc), prefix="warning")
        return
    except LocalBrokerError as exc:
        raise _fail(exc, broker) from None
    st = result.status
    if not result.started:
        console.print(f"Kafka {KAFKA_VERSION} already running on {st.bootstrap} (pid {st.pid})")
        return
    fmt = ", storage formatted" if result.formatted else ""
    console.print(
        f"[green]Kafka {KAFKA_VERSION} up[/green] on {st.bootstrap} (pid {st.pid}): "
        f"answered metadata {result.ready_s:.1f}s after launch "
        f"({result.total_s:.1f}s in all{fmt}); log {st.log_path}"
    )


@app.command()
def down(port: int = PORT, data_dir: Path | None = DATA_DIR) -> None:
    """Stop the broker that triage started (SIGTERM, then SIGKILL after 30 s)."""
    broker = _broker(port, data_dir)
    t0 = time.monotonic()
    try:
        stopped = broker.stop()
    except LocalBrokerError as exc:
        raise _fail(exc, broker) from None
    if stopped:
        console.print(f"Kafka on {broker.bootstrap} stopped ({time.monotonic() - t0:.1f}s)")
        return
    st = broker.status()
    if st.reachable:
        print_error(f"a broker triage did not start answers on {st.bootstrap}; left alone",
                    prefix="warning")
    else:
        console.print(f"Kafka on {broker.bootstrap} is not running")


@app.command()
def status(
    port: int = PORT,
    data_dir: Path | None = DATA_DIR,
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object (for scripts)."),
) -> None:
    """Show whether the broker runs and answers (pid, port, version, log path).

    Exits 0 either way; scripts read `reachable` from `--json`.
    """
    st = _broker(port, data_dir).status()
    if as_json:
        typer.echo(json.dumps({**st.to_dict(), "kafka_home": str(kafka_home())}))
        return
    _print_status(st)


def _print_status(st: BrokerStatus) -> None:
    if st.reachable and st.managed:
        state = f"[green]running[/green] (pid {st.pid}, Kafka {st.version})"
    elif st.reachable:
        state = "[yellow]running, not started by triage[/yellow]"
    elif st.managed:
        state = f"[yellow]process up (pid {st.pid}) but not answering[/yellow]"
    else:
        state = "[red]not running[/red]"
    console.print(f"Kafka on {st.bootstrap}: {state}")
    console.print(f"  data dir: {st.data_dir}")
    console.print(f"  log:      {st.log_path}")
    console.print(f"  jars:     {kafka_home() / 'lib'}")
