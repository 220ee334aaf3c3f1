"""`triage kafka ...`: the local single-node Kafka broker (KRaft, no Docker)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import typer
from confluent_kafka import KafkaException
from rich.console import Console

from triage.cli.common import ExitCode, fail, print_error
from triage.config import ConfigError, load_config
from triage.config.models import TriageConfig
from triage.kafka.acls import AclError
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
from triage.kafka.secure import CredentialError, CredentialStore
from triage.kafka.secure import provision as provision_broker
from triage.kafka.security import librdkafka_settings

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
CONFIG = typer.Option(
    None, "--config", "-c",
    help="triage.yaml whose tenants, GPUs and topic prefix get users and ACLs (secured "
    "broker only) [default: the shipped example].",
)  # fmt: skip


def _broker(
    port: int, data_dir: Path | None, heap: str = DEFAULT_HEAP, secure: bool | None = None
) -> LocalBroker:
    try:
        return LocalBroker(port=port, data_dir=data_dir, heap_opts=heap, secure=secure)
    except LocalBrokerError as exc:
        raise fail(str(exc), ExitCode.USAGE) from None


def _fail(exc: Exception | str, broker: LocalBroker | None = None) -> typer.Exit:
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
    secure: bool = typer.Option(
        False, "--secure",
        help="SASL/SCRAM authentication and ACLs (a data dir keeps the mode it was first "
        "formatted with). Prints where the principals' credentials were written.",
    ),
    config: Path | None = CONFIG,
) -> None:
    """Start the broker and wait until it answers a metadata request.

    Idempotent: installs the jars and formats storage the first time only; if our
    broker already runs, says so and returns. A broker on the port that triage did
    not start is reported and left alone. With --secure, every start also makes sure
    the users and ACLs of --config exist (see docs/security.md).
    """
    cfg = _load(config) if secure else None
    broker = _broker(port, data_dir, heap, secure=True if secure else None)
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
    else:
        fmt = ", storage formatted" if result.formatted else ""
        console.print(
            f"[green]Kafka {KAFKA_VERSION} up[/green] on {st.bootstrap} (pid {st.pid}): "
            f"answered metadata {result.ready_s:.1f}s after launch "
            f"({result.total_s:.1f}s in all{fmt}); log {st.log_path}"
        )
    if cfg is not None:
        _provision(broker, cfg)


@app.command()
def provision(
    port: int = PORT,
    data_dir: Path | None = DATA_DIR,
    config: Path | None = CONFIG,
    secrets_dir: Path | None = typer.Option(
        None, "--secrets-dir",
        help="Any secured broker, not the local one: read each principal's password from "
        "DIR/<user> (e.g. Docker secrets in /run/secrets) and log in as the admin that "
        "--config's kafka.security names, at its kafka.bootstrap_servers.",
    ),
) -> None:
    """Create the users and ACLs of --config on a running secured broker (idempotent).

    Run it after adding a tenant or a GPU to the config: the new tenant's principal gets
    its request and reply topics, the workers and the app the new GPU's topics."""
    cfg = _load(config)
    if secrets_dir is None:
        _provision(_broker(port, data_dir), cfg)
        return
    store = CredentialStore.read_only(secrets_dir, cfg.kafka.bootstrap_servers)
    try:
        login = librdkafka_settings(cfg.kafka.security)
        done = provision_broker(store, cfg, admin_settings=login)
    except (ConfigError, CredentialError) as exc:
        raise _fail(exc) from None
    except (KafkaException, AclError) as exc:
        raise _fail(f"creating users and ACLs on {store.bootstrap} failed: {exc}") from None
    console.print(
        f"secured {store.bootstrap}: {len(done.users)} principals ({', '.join(done.users)}), "
        f"{done.acls} ACL bindings for topic prefix {cfg.kafka.topic_prefix!r}"
    )


def _load(config: Path | None) -> TriageConfig:
    try:
        return load_config(config)
    except ConfigError as exc:
        raise _fail(exc) from None


def _provision(broker: LocalBroker, cfg: TriageConfig) -> None:
    try:
        done = broker.provision(cfg)
    except LocalBrokerError as exc:
        raise _fail(exc) from None
    except (KafkaException, AclError) as exc:
        raise _fail(f"creating users and ACLs on {broker.bootstrap} failed: {exc}") from None
    console.print(
        f"secured: {len(done.users)} principals ({', '.join(done.users)}), "
        f"{done.acls} ACL bindings for topic prefix {cfg.kafka.topic_prefix!r}"
    )
    console.print(f"credentials: {done.credentials} (0600; password files in "
                  f"{broker.credentials.dir}); see docs/security.md")  # fmt: skip


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
    if st.secure:
        console.print(f"  secured:  SASL/SCRAM + ACLs; credentials {st.credentials}")
    console.print(f"  data dir: {st.data_dir}")
    console.print(f"  log:      {st.log_path}")
    console.print(f"  jars:     {kafka_home() / 'lib'}")
