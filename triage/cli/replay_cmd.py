"""`triage replay`: what a candidate policy would have decided about recorded traffic.

    triage replay --since 2h --policy admit_all
    triage replay --since 2025-06-01T09:00 --until 2025-06-01T10:00 -c candidate.yaml --json
    triage replay --since 1h --save last-hour.jsonl       # and later, offline:
    triage replay --from-file last-hour.jsonl --policy full+variance_buffer=1.0

Exit status (the CLI's scheme, triage/cli/common.py): 0 when the replay ran (whether or
not decisions changed), 1 when nothing replayable was recorded in the range, 2 for bad
input (config, policy, times), 3 when the broker, the topics or the file cannot be read.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from triage.audit import AuditError, parse_since
from triage.cli.common import (
    ExitCode,
    bootstrap_option,
    config_option,
    fail,
    print_error,
    require_broker,
    stderr_console,
    with_bootstrap,
)
from triage.config import ConfigError, load_config
from triage.config.models import PolicyConfig, TriageConfig
from triage.kafka.security import use_kafka_security
from triage.replay import (
    ReplayError,
    ReplayReport,
    ReplaySourceError,
    compare,
    read_export,
    read_kafka,
    replay,
    write_export,
)
from triage.replay.recording import Recording
from triage.sim.errors import PolicyNameError
from triage.sim.policies import VARIANTS, policy_config
from triage.topics.names import TopicNames

EXIT_EMPTY = ExitCode.FAILED
EXIT_BAD_INPUT = ExitCode.USAGE
EXIT_UNAVAILABLE = ExitCode.UNAVAILABLE

err = stderr_console()


HELP = (
    "Replay recorded requests under a candidate policy, in virtual time, and count the "
    "decisions that would change: per tenant, per reason, with examples.\n\n"
    "Reads the tenants' request topics and the decisions topic for a time range (or a "
    "decisions export with --from-file), runs the requests through the simulator, which drives "
    "the same admission core as the app, and compares each request's first decision "
    "(outcome and reason) and final outcome with the recorded ones. See docs/replay.md."
)


def register(app: typer.Typer) -> None:
    """Attach `triage replay` to the root app."""
    app.command("replay", help=HELP)(replay_command)


def replay_command(
    config_file: Path | None = config_option(
        "Candidate config (YAML): the fleet, tenants and policy to replay under, and "
        "the Kafka settings (default: the shipped example)."
    ),
    policy: str | None = typer.Option(
        None, "--policy", "-p",
        help=f"Replay under this policy instead of the config's: {', '.join(VARIANTS)}, "
        "or NAME+key=value overrides (full+variance_buffer=1.0).",
    ),
    from_file: str | None = typer.Option(
        None, "--from-file", "-f",
        help="Replay a decisions export (JSON lines of DecisionRecord; - for stdin) "
        "instead of the Kafka topics.",
    ),
    file_alias: str | None = typer.Option(None, "--file", hidden=True),  # its old name
    since: str | None = typer.Option(
        None, "--since",
        help="Requests that arrived from: epoch ms, an age (15m, 2h, 1h30m) or an ISO time "
        "(naive: UTC). Default: the oldest recorded.",
    ),
    until: str | None = typer.Option(
        None, "--until", help="... up to (same forms). Default: now / the newest recorded."
    ),
    grace: float = typer.Option(
        600.0, "--grace", min=0.0,
        help="Seconds after --until in which decisions about the range's requests are "
        "still read (Kafka).",
    ),
    examples: int = typer.Option(
        3, "--examples", "-n", min=0, help="Example requests shown per kind of change."
    ),
    json_out: bool = typer.Option(False, "--json", help="Print the report as JSON."),
    save: Path | None = typer.Option(
        None, "--save",
        help="Also write the recorded requests read as a decisions export (arrival and "
        "final decision of each, with its shape), for offline replay with --from-file.",
    ),
    bootstrap: str | None = bootstrap_option(),
    topic_prefix: str | None = typer.Option(
        None, "--topic-prefix", help="Override kafka.topic_prefix."
    ),
    timeout_s: float = typer.Option(
        60.0, "--timeout", min=0.1, help="Seconds reading the topics may take."
    ),
) -> None:
    """Replay recorded requests under a candidate policy and print the diff (see HELP)."""
    if from_file is not None and file_alias is not None:
        raise fail("give --from-file once (--file is its old name)", EXIT_BAD_INPUT,
                   json_out=json_out)  # fmt: skip
    from_file = from_file if from_file is not None else file_alias
    try:
        now_ms = int(time.time() * 1000)
        since_ms = parse_since(since, now_ms=now_ms) if since else None
        until_ms = parse_since(until, now_ms=now_ms) if until else None
        if since_ms is not None and until_ms is not None and since_ms > until_ms:
            raise ReplayError(f"--since ({_iso(since_ms)}) is after --until ({_iso(until_ms)})")
        config = with_bootstrap(load_config(config_file), bootstrap)
        if from_file is None:
            use_kafka_security(config.kafka)
        pol = policy_config(policy, base=config.policy) if policy else config.policy
    except (AuditError, ConfigError, PolicyNameError, ReplayError) as exc:
        raise fail(str(exc), EXIT_BAD_INPUT, json_out=json_out) from None
    if from_file is None:
        require_broker(config.kafka.bootstrap_servers, json_out=json_out)
    try:
        recording = _read(config, from_file, since_ms, until_ms, grace, topic_prefix, timeout_s)
        if save is not None:
            with save.open("wb") as stream:
                lines = write_export(recording, stream)
            print_error(f"saved {lines:,} decision(s) of {len(recording.requests):,} "
                        f"request(s) to {save}", prefix="note")  # fmt: skip
    except ReplaySourceError as exc:
        raise fail(str(exc), EXIT_UNAVAILABLE, json_out=json_out) from None
    except OSError as exc:
        raise fail(f"{save}: cannot write: {exc.strerror or exc}", EXIT_UNAVAILABLE,
                   json_out=json_out) from None  # fmt: skip
    if not recording.requests:
        raise fail(_empty(recording), EXIT_EMPTY, json_out=json_out)
    report = _replay(recording, config, pol, examples)
    if json_out:
        typer.echo(report.to_json(indent=2))
    else:
        out = Console()
        if not out.is_terminal:
            out = Console(width=160)
        render(report, out)


def _read(
    config: TriageConfig, from_file: str | None, since_ms: int | None, until_ms: int | None,
    grace: float, topic_prefix: str | None, timeout_s: float,
) -> Recording:
    if from_file is not None:
        return read_export(from_file, since_ms=since_ms, until_ms=until_ms)
    return read_kafka(
        bootstrap=config.kafka.bootstrap_servers,
        names=TopicNames.of(topic_prefix or config.kafka.topic_prefix,
                            config.kafka.tenant_topics),
        tenants=[t.name for t in config.tenants], since_ms=since_ms, until_ms=until_ms,
        grace_s=grace, timeout_s=timeout_s,
    )


def _replay(
    recording: Recording, config: TriageConfig, pol: PolicyConfig, examples: int
) -> ReplayReport:
    what = f"replaying {len(recording.requests):,} requests under {pol.name}"
    if err.is_terminal:
        with err.status(what):
            run = replay(recording, config, pol)
    else:
        run = replay(recording, config, pol)
    return compare(recording, run, examples=examples)


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")


def _window(since_ms: int | None, until_ms: int | None) -> str:
    if since_ms is None and until_ms is None:
        return ""
    a = _iso(since_ms) if since_ms is not None else "the start"
    b = _iso(until_ms) if until_ms is not None else "now"
    return f" between {a} and {b}"


def _skipped(skipped: dict[str, int]) -> str:
    return "; ".join(f"{why}: {n:,}" for why, n in skipped.items())


def _empty(rec: Recording) -> str:
    lines = [
        f"nothing to replay: no recorded requests{_window(rec.since_ms, rec.until_ms)} "
        f"in {rec.source} ({rec.scanned:,} record(s) read)."
    ]
    if rec.skipped:
        lines.append(f"Left out: {_skipped(dict(rec.skipped))}.")
    lines.append("Check --since/--until (epoch ms, an age like 2h, or an ISO time in UTC), "
                 "the config's topic prefix, or the file.")
    return " ".join(lines)


def _pct(n: int, of: int) -> str:
    return f"{100.0 * n / of:.1f}%" if of else "n/a"


def render(r: ReplayReport, out: Console) -> None:
    """The human form of a report: a summary, tables, and explained examples."""
    recorded = ", ".join(r.recorded_policies) or "unknown"
    out.print(
        f"Replayed [bold]{r.requests:,}[/] recorded requests from {r.source}"
        f"{_window(r.since_ms, r.until_ms)} under [bold]{r.policy}[/] v{r.policy_version} "
        f"(recorded under {recorded})."
    )
    out.print(
        f"First decision changed for [bold]{r.first_changed:,}[/] of {r.compared:,} "
        f"({_pct(r.first_changed, r.compared)}); outcome changed for {r.outcome_changed:,}; "
        f"final outcome changed for {r.final_changed:,}."
    )
    if r.outcome_transitions:
        out.print("Outcomes: " + ", ".join(f"{k}: {n:,}" for k, n in r.outcome_transitions.items()))
    ot = r.output_tokens
    ratios = ", ".join(f"{t} {v:.2f}" for t, v in ot.ratios.items())
    out.print(f"Output tokens: {ot.recorded:,} from recorded completions, {ot.learned_ratio:,} "
              f"from the tenants' learned output ratios ({ratios}).")
    if r.unrecorded:
        out.print(f"[yellow]{r.unrecorded:,} request(s) had no recorded decision:[/] replayed, "
                  "not compared.")
    if r.skipped:
        out.print(f"[yellow]Left out:[/] {_skipped(r.skipped)}.")

    t = Table(title="per tenant")
    for col in ("tenant", "requests", "first decision changed", "outcome changed",
                "final changed", "recorded finals", "replayed finals"):
        t.add_column(col, justify="left" if col in ("tenant", "recorded finals",
                                                    "replayed finals") else "right")
    for td in r.tenants:
        t.add_row(
            td.tenant, f"{td.requests:,}",
            f"{td.first_changed:,} ({_pct(td.first_changed, td.compared)})",
            f"{td.outcome_changed:,}", f"{td.final_changed:,}",
            _counts(td.recorded_finals), _counts(td.replayed_finals),
        )
    out.print(t)
    if r.transitions:
        t = Table(title="first decision: recorded -> replayed")
        for col in ("recorded", "replayed", "requests", "tenants", "examples"):
            t.add_column(col, justify="right" if col == "requests" else "left")
        for tr in r.transitions:
            t.add_row(tr.recorded, tr.replayed, f"{tr.count:,}", _counts(tr.tenants),
                      ", ".join(e.request_id for e in tr.examples))
        out.print(t)
    if r.final_transitions:
        t = Table(title="final outcome: recorded -> replayed")
        for col in ("recorded", "replayed", "requests", "tenants", "examples"):
            t.add_column(col, justify="right" if col == "requests" else "left")
        for ft in r.final_transitions:
            t.add_row(ft.recorded, ft.replayed, f"{ft.count:,}", _counts(ft.tenants),
                      ", ".join(ft.example_ids))
        out.print(t)
    for tr in r.transitions:
        for e in tr.examples:
            out.print(f"\n[bold]{e.request_id}[/] ({e.tenant}, {e.model}, arrived "
                      f"{_iso(e.arrived_ms)}; final {e.recorded_final} -> {e.replayed_final})")
            out.print(f"  recorded: {e.recorded.sentence}", markup=False, highlight=False)
            out.print(f"  replayed: {e.replayed.sentence}", markup=False, highlight=False)


def _counts(c: dict[str, int]) -> str:
    return ", ".join(f"{k} {n:,}" for k, n in c.items())
