"""`triage chaos`: the fault suite (kill -9, broker outage, overload, SIGTERM, poison
input, config changes, forgeries) on brokers of its own, with a table of what was sent,
answered, lost and duplicated."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import typer
from pydantic import ValidationError
from rich.console import Console

from triage.chaos.plan import ALL, ChaosPlan, Scenario
from triage.cli.common import TenantTopics


def register(app: typer.Typer) -> None:
    app.command("chaos")(chaos)


def chaos(
    scenario: list[Scenario] = typer.Option(
        None, "--scenario", "-s", help="Run only these (repeatable; default: all)."),
    reduced: bool = typer.Option(False, help="CI sizes: a few minutes in all."),
    rate: float = typer.Option(None, help="Requests per second (full: 80)."),
    duration: float = typer.Option(None, help="Seconds of traffic per scenario (full: 180)."),
    kills: int = typer.Option(None, help="kill -9s of the app per kill scenario (full: 5)."),
    broker_down: float = typer.Option(None, help="Seconds the broker stays down (full: 60)."),
    overload_s: float = typer.Option(None, help="Seconds of 10x overload (full: 60)."),
    static_membership: bool = typer.Option(True, help="Run the app with static group "
                                           "membership (the default; off to measure)."),
    session_timeout: float = typer.Option(None, help="The app's consumer-group session "
                                          "timeout in s (default 10)."),
    app_loglevel: str = typer.Option(None, help="--loglevel of the admission app (warn)."),
    port: int = typer.Option(9392, help="Port of the broker the suite starts and stops "
                             "(never a broker someone else uses)."),
    secure_port: int = typer.Option(9394, help="Port of the secured broker the forgery "
                                    "scenario starts (controller on the next one)."),
    poison_rounds: int = typer.Option(None, help="Times the poison corpus is sent (full: 5)."),
    tenant_topics: TenantTopics = typer.Option(
        TenantTopics.PER_TENANT, "--tenant-topics", help="The app's kafka.tenant_topics: a "
        "topic pair per tenant, or one pair for every tenant (then no forgery scenario: it "
        "checks tenants' own principals)."),
    out: Path = typer.Option(Path("chaos-out"), help="Logs and the JSON report go here."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
) -> None:
    """Run the fault suite; exits 1 when anything was lost, duplicated or crashed.

    Starts its own Kafka on --port, then per scenario: the admission app and two sim
    workers, tenants' requests at a steady rate, faults at evenly spaced times, and a
    drain until every request has its terminal reply. The forgery scenario starts a
    secured broker on --secure-port. Loopback only, bounded in time."""
    shared = tenant_topics is TenantTopics.SHARED
    every = [s for s in ALL if not (shared and s is Scenario.FORGERY)]
    overrides = {k: v for k, v in {
        "scenarios": scenario or every, "tenant_topics": tenant_topics.value, "rate": rate,
        "duration_s": duration,
        "kills": kills, "broker_down_s": broker_down, "overload_s": overload_s, "port": port,
        "secure_port": secure_port, "poison_rounds": poison_rounds,
        "static_membership": static_membership, "session_timeout_s": session_timeout,
        "app_loglevel": app_loglevel,
    }.items() if v is not None}
    try:
        plan = ChaosPlan.reduced(**overrides) if reduced else ChaosPlan.model_validate(overrides)
    except ValidationError as exc:
        typer.echo(f"invalid chaos settings: {exc.errors()[0]['msg']}", err=True)
        raise typer.Exit(2) from None
    from triage.chaos.runner import run
    from triage.kafka.local import LocalBrokerError

    console = Console(stderr=as_json, width=220)
    logging.getLogger("triage").setLevel(logging.WARNING)
    try:
        report = run(plan, out, progress=lambda m: console.print(m))
    except (LocalBrokerError, RuntimeError) as exc:
        typer.echo(f"chaos: {str(exc).splitlines()[0]}", err=True)
        raise typer.Exit(2) from None
    (out / "report.json").write_text(json.dumps(report.to_dict(), indent=2))
    if as_json:
        typer.echo(json.dumps(report.to_dict(), indent=2))
    else:
        console.print(report.table())
    raise typer.Exit(0 if report.ok else 1)
