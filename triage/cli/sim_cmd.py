"""`triage sim`: compare admission policies on a scenario or a trace, in virtual time.

    triage sim seed-morning --report reports/seed
    triage sim seed-morning --policies full,admit_all --scale 0.2 --json
    triage sim --trace conv.csv --columns timestamp=TIMESTAMP,prompt=ContextTokens,\\
        output=GeneratedTokens,tenant=const:conv,model=const:llama-3.1-8b --speed 10
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

from triage.cli.common import ExitCode, fail
from triage.config import load_config
from triage.config.errors import ConfigError
from triage.sim.compare import Comparison, compare
from triage.sim.errors import SimError
from triage.sim.paths import builtin_scenarios
from triage.sim.policies import VARIANTS, parse_policies
from triage.sim.report import write_report
from triage.sim.scenario import Scenario, TraceSpec, load_scenario
from triage.sim.trace import parse_columns

log = logging.getLogger(__name__)
err = Console(stderr=True)


def _trace_scenario(
    trace: Path, columns: str | None, *, config: Path | None, speed: float,
    duration: float | None, limit: int | None,
) -> Scenario:
    cfg = load_config(config)
    spec = columns or "timestamp=TIMESTAMP,prompt=ContextTokens,output=GeneratedTokens"
    keys = {part.split("=", 1)[0].strip() for part in spec.split(",") if "=" in part}
    tenant = cfg.tenants[0]
    if "tenant" not in keys:
        spec += f",tenant=const:{tenant.name}"
    if "model" not in keys:
        model = tenant.models[0] if tenant.models else cfg.models[0].name
        spec += f",model=const:{model}"
    return Scenario(
        name=trace.stem, description=f"Trace replay of {trace} at {speed}x speed.",
        config=cfg, traces=(TraceSpec(trace, parse_columns(spec), speed=speed, limit=limit),),
        duration_s=duration,
    )


def _table(cmp: Comparison) -> Table:
    t = Table(title=f"{cmp.scenario.name}: {next(iter(cmp.results.values())).arrivals:,} requests")
    for col in ("policy", "SLA met", "goodput", "accepted", "timed out", "p99 s",
                "p99 wait s", "preempt", "Jain", "wall s"):
        t.add_column(col, justify="left" if col == "policy" else "right")

    def pct(v: Any) -> str:
        return "n/a" if v is None else f"{100 * v:.1f}%"

    def num(v: Any, d: int = 2) -> str:
        return "n/a" if v is None else f"{v:,.{d}f}"

    for row in cmp.table():
        t.add_row(
            row["policy"], pct(row["sla_attainment"]), num(row["goodput_tokens_per_gpu_s"], 0),
            pct(row["acceptance"]), pct(row["timeout_rate"]), num(row["latency_p99_s"]),
            num(row["queue_wait_p99_s"]), pct(row["preemption_rate"]),
            num(row["fairness_jain"]), num(row["wall_s"], 1),
        )
    return t


def _run(sc: Scenario, policies: list[str], jobs: int, quiet: bool) -> Comparison:
    if quiet:
        return compare(sc, policies, jobs=jobs)
    with Progress(
        TextColumn("{task.description:<18}"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"),
        TimeElapsedColumn(), console=err, transient=False,
    ) as bar:
        tasks: dict[str, TaskID] = {p: bar.add_task(p, total=1.0) for p in policies}

        def progress(policy: str, fraction: float) -> None:
            task = tasks.get(policy)
            if task is not None:
                bar.update(task, completed=fraction)

        cmp = compare(sc, policies, progress=progress, jobs=jobs)
        for task in tasks.values():
            bar.update(task, completed=1.0)
    return cmp


def sim(
    scenario: str | None = typer.Argument(
        None, help="Shipped scenario name (see --list) or a scenario YAML file."
    ),
    policies: str | None = typer.Option(
        None, "--policies", "-p",
        help=f"Comma-separated policies ({', '.join(VARIANTS)}; name+key=value overrides). "
        "Default: the scenario's list.",
    ),
    report: Path | None = typer.Option(
        None, "--report", "-r", help="Write report.md, PNG plots and JSON here."
    ),
    json_out: bool = typer.Option(False, "--json", help="Print the JSON summary on stdout."),
    seed: int | None = typer.Option(None, "--seed", help="Override the scenario's seed."),
    scale: float | None = typer.Option(
        None, "--scale", help="Run this fraction of the scenario's length (same shape and load)."
    ),
    trace: Path | None = typer.Option(None, "--trace", help="Replay this CSV trace."),
    columns: str | None = typer.Option(
        None, "--columns",
        help="Trace column mapping: timestamp=COL,prompt=COL,output=COL,tenant=const:NAME,"
        "model=const:NAME[,max_tokens=output*1.5,max_cap=4096,time_format=auto,sla_ms=COL]",
    ),
    speed: float = typer.Option(1.0, "--speed", help="Trace replay speed (k times faster)."),
    config: Path | None = typer.Option(
        None, "--config", "-c", help="Config for --trace (default: the shipped example)."
    ),
    duration: float | None = typer.Option(
        None, "--duration", help="Stop arrivals after this many virtual seconds."
    ),
    limit: int | None = typer.Option(None, "--limit", help="Replay at most this many rows."),
    gpu_noise: float | None = typer.Option(None, "--gpu-noise", help="GPU timing noise sigma."),
    jobs: int = typer.Option(1, "--jobs", "-j", help="Policies simulated in parallel."),
    list_scenarios: bool = typer.Option(False, "--list", help="List shipped scenarios."),
) -> None:
    """Compare admission policies on a scenario or a trace, in virtual time."""
    if list_scenarios:
        for name, path in builtin_scenarios().items():
            typer.echo(f"{name:24s} {path}")
        return
    try:
        if trace is not None:
            if scenario is not None:
                raise SimError("give a scenario or --trace, not both")
            sc = _trace_scenario(
                trace, columns, config=config, speed=speed, duration=duration, limit=limit
            )
        elif scenario is not None:
            sc = load_scenario(scenario)
            if duration is not None:
                sc = Scenario(**{**_fields(sc), "duration_s": duration})
        else:
            raise SimError("give a scenario (see --list) or --trace FILE.csv")
        if seed is not None:
            sc = sc.with_seed(seed)
        if gpu_noise is not None:
            sc = Scenario(**{**_fields(sc), "gpu_noise": gpu_noise})
        if scale is not None:
            sc = sc.scaled(scale)
        names = parse_policies(policies) if policies else list(sc.policies)
        cmp = _run(sc, names, jobs, quiet=False)
    except (SimError, ConfigError, OSError) as exc:
        raise fail(str(exc), ExitCode.USAGE, json_out=json_out) from None
    if report is not None:
        written = write_report(cmp, report)
        err.print(f"report: {written['report.md']}")
    if json_out:
        sys.stdout.write(json.dumps(cmp.to_dict(), indent=1, default=str) + "\n")
    else:
        out = Console()
        if not out.is_terminal:
            out = Console(width=160)
        out.print(_table(cmp))


def _fields(sc: Scenario) -> dict[str, Any]:
    return {name: getattr(sc, name) for name in sc.__dataclass_fields__}


def register(app: typer.Typer) -> None:
    """Attach `triage sim` to the root app."""
    app.command("sim")(sim)
