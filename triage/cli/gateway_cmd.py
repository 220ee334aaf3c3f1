"""`triage gateway`: the OpenAI-compatible HTTP front door; `triage gateway-key`: a new key.

Exit status: 0 after a clean stop, 2 for bad input (config, keys, port).
"""

from __future__ import annotations

import logging
import signal
from pathlib import Path

import typer

from triage.config import ConfigError, load_config

log = logging.getLogger(__name__)

EXIT_BAD_INPUT = 2


def register(app: typer.Typer) -> None:
    """Attach this module's commands to the root app."""
    app.command("gateway")(gateway)
    app.command("gateway-key")(gateway_key)


def _fail(message: str) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(EXIT_BAD_INPUT)


def gateway(
    config: Path | None = typer.Option(
        None, "--config", "-c", help="triage.yaml (default: the shipped example)."
    ),
    keys: Path | None = typer.Option(
        None, "--keys", metavar="FILE",
        help="API keys file (default: gateway.keys_file); keys in $TRIAGE_GATEWAY_KEYS "
        "(gateway.keys_env) are added.",
    ),
    host: str | None = typer.Option(None, "--host", help="Listen address (default: gateway.host)."),
    port: int | None = typer.Option(
        None, "--port", min=0, max=65535, help="Listen port (default: gateway.port)."
    ),
    bootstrap: str | None = typer.Option(
        None, "--bootstrap", help="Kafka bootstrap servers (default: kafka.bootstrap_servers)."
    ),
) -> None:
    """Serve the OpenAI API (/v1/completions, /v1/chat/completions, /v1/models) in front of
    triage: a Bearer key names the tenant; refusals are 429 with Retry-After.

    Also /live, /ready (the broker answers) and /metrics. Stop with SIGTERM or Ctrl-C.
    See docs/gateway.md."""
    import uvicorn

    from triage.gateway.app import Gateway, create_app
    from triage.gateway.auth import KeysError, KeyStore
    from triage.kafka.security import use_kafka_security

    try:
        cfg = load_config(config)
        # its clients speak as kafka.security says (with shared topics: User:gateway)
        use_kafka_security(cfg.kafka, bootstrap=bootstrap or None)
    except ConfigError as exc:
        raise _fail(str(exc)) from None
    g = cfg.gateway
    keys_path = keys if keys is not None else (Path(g.keys_file) if g.keys_file else None)
    try:
        store = KeyStore.load(path=keys_path, env_var=g.keys_env)
    except KeysError as exc:
        raise _fail(str(exc)) from None
    if not len(store):
        raise _fail(f"no API keys: give --keys FILE (or gateway.keys_file) or set ${g.keys_env}")
    unknown = sorted(store.tenants() - {t.name for t in cfg.tenants})
    if unknown:
        log.warning("keys name tenants the config does not have (refused with 403): %s",
                    ", ".join(unknown))  # fmt: skip
    app = create_app(Gateway(cfg, store, bootstrap=bootstrap))
    server = uvicorn.Server(uvicorn.Config(
        app, host=host or g.host, port=g.port if port is None else port, log_level="warning",
        access_log=False, lifespan="on",
    ))  # fmt: skip
    log.info("gateway for %d key(s) of %d tenant(s) on http://%s:%d", len(store),
             len(store.tenants()), host or g.host, g.port if port is None else port)  # fmt: skip
    # uvicorn shuts down gracefully on SIGTERM/SIGINT, then re-raises the signal to the
    # handler that was there before it: make that a no-op, so a clean stop exits 0.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: None)
    server.run()
    if not server.started:  # uvicorn logged why (e.g. the port is taken)
        raise typer.Exit(EXIT_BAD_INPUT)


def gateway_key(
    tenant: str = typer.Option(..., "--tenant", help="The tenant the key authenticates."),
    name: str | None = typer.Option(None, "--name", help="A label for logs (not secret)."),
) -> None:
    """Make a new API key: prints the key (give it to the tenant; it is not stored) and
    the line for the keys file (its SHA-256)."""
    import re

    from triage.gateway.auth import digest, new_key

    if not re.fullmatch(r"[a-z0-9][a-z0-9_-]*", tenant):
        raise _fail(f"bad tenant name {tenant!r} (expected [a-z0-9][a-z0-9_-]*)")
    key = new_key()
    typer.echo(f"key: {key}")
    typer.echo("keys file entry:")
    typer.echo(f"  - tenant: {tenant}")
    typer.echo(f"    sha256: {digest(key).hex()}")
    if name:
        typer.echo(f"    name: {name}")
