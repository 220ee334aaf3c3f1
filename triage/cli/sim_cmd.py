"""`triage sim`: compare admission policies on a scenario or a trace, in virtual time.

    triage sim seed-morning --report reports/seed
    triage sim seed-morning --policies full,admit_all --scale 0.2 --json
    triage sim tenants13@120 --scale 0.1        # 120% of the pool's measured capacity
    triage sim tenants13 --load 0.85 -j 2
    triage sim --trace conv.csv --columns timestamp=TIMESTAMP,prompt=ContextTokens,\\
        output=GeneratedTokens,model=const:llama-3.1-8b --tenant rag --speed 10

Everything is checked before anything runs: a bad option, scenario field or trace
mapping gets one line and exit code 2.
"""

from __future__ import annotations

import json
import logging
import shlex
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

from triage.cli.common import ExitCode, fail
from triage.config import load_config
from triage.config.errors import ConfigError
from triage.sim.capacity import with_offered_load
from triage.sim.compare import Comparison, compare, resolve
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
    duration: float | None, limit: int | None, tenant_name: str | None,
) -> Scenario:
    cfg = load_config(config)
    spec = columns or "timestamp=TIMESTAMP,prompt=ContextTokens,output=GeneratedTokens"
    keys = {part.split("=", 1)[0].strip() for part in spec.split(",") if "=" in part}
    if "tenant" in keys and tenant_name is not None:
        raise SimError("give --tenant or tenant= in --columns, not both")
    if "tenant" not in keys:
        if tenant_name is None:
            known = ", ".join(t.name for t in cfg.tenants)
            raise SimError(
                f"--trace: whose requests are these? give --tenant NAME or tenant=const:NAME "
                f"(or tenant=COLUMN) in --columns; tenants of the config: {known}"
            )
        spec += f",tenant=const:{tenant_name}"
    tenant = cfg.tenant(tenant_name) if tenant_name is not None else None
    if tenant_name is not None and tenant is None:
        raise SimError(f"--tenant: {tenant_name!r} is not a tenant of the config")
    if "model" not in keys:
        if tenant is not None and tenant.models:
            model = tenant.models[0]
        elif len(cfg.models) == 1:
            model = cfg.models[0].name
        else:
            known = ", ".join(m.name for m in cfg.models)
            raise SimError(f"--trace: give model=const:NAME in --columns (models: {known})")
        spec += f",model=const:{model}"
    return Scenario(
        name=trace.stem, description=f"Trace replay of {trace} at {speed}x speed.",
        config=cfg, traces=(TraceSpec(trace, parse_columns(spec), speed=speed, limit=limit),),
        duration_s=duration,
    )


def _scenario(
    name: str | None, *, trace: Path | None, columns: str | None, config: Path | None,
    speed: float | None, duration: float | None, limit: int | None, tenant: str | None,
) -> Scenario:
    """The scenario the options describe; options that would be ignored are refused."""
    if trace is not None:
        if name is not None:
            raise SimError("give a scenario or --trace, not both")
        if speed is not None and not speed > 0:
            raise SimError(f"--speed must be positive, got {speed:g}")
        return _trace_scenario(
            trace, columns, config=config, speed=speed or 1.0, duration=duration, limit=limit,
            tenant_name=tenant,
        )
    if name is None:
        raise SimError("give a scenario (see --list) or --trace FILE.csv")
    given = [opt for opt, v in (("--speed", speed), ("--limit", limit), ("--columns", columns),
                                ("--tenant", tenant), ("--config", config)) if v is not None]
    if given:
        raise SimError(
            f"{', '.join(given)} only apply to --trace; a scenario file sets them per trace "
            "(speed, limit and columns of each entry of traces:) and --load scales its rates"
        )
    sc = load_scenario(name)
    if duration is not None:
        sc = replace(sc, duration_s=duration)
    return sc


def _invalid_note(cmp: Comparison) -> None:
    """One line when requests were refused as invalid before admission (not simulated)."""
    r = next(iter(cmp.results.values()))
    n = sum(sum(by.values()) for by in r.invalid.values())
    if n:
        reasons = sorted({k for by in r.invalid.values() for k in by})
        err.print(
            f"{n:,} requests invalid ({', '.join(reasons)}: prompt + max_tokens beyond the "
            "model's context), refused before admission as the live app does; not simulated",
            soft_wrap=True,
        )


def _pct(v: Any) -> str:
    return "n/a" if v is None else f"{100 * v:.1f}%"


def _num(v: Any, d: int = 2) -> str:
    return "n/a" if v is None else f"{v:,.{d}f}"


def _per_tenant(cmp: Comparison, rows: list[dict[str, Any]]) -> Table:
    """SLA met per tenant: a row per policy, or, with many tenants, a row per tenant."""
    tenants = cmp.scenario.config.tenants
    per = Table(title="SLA met per tenant (within SLA / arrived)")
    if len(tenants) <= 6:
        per.add_column("policy")
        for col in ("all", "weighted",
                    *(f"{t.name}\nw{t.weight:g}, {t.sla_ms / 1000:g} s" for t in tenants)):
            per.add_column(col, justify="right")
        for row in rows:
            r = cmp.results[row["policy"]]
            per.add_row(
                row["policy"], _pct(row["sla_attainment"]), _pct(row["sla_attainment_weighted"]),
                *(_pct(r.tenants[t.name]["sla_attainment"]) for t in tenants),
            )
        return per
    per.add_column("tenant")
    per.add_column("weight, SLA", justify="right")
    for row in rows:
        per.add_column(row["policy"], justify="right")
    per.add_row("all", "", *(_pct(row["sla_attainment"]) for row in rows))
    per.add_row("weighted", "", *(_pct(row["sla_attainment_weighted"]) for row in rows),
                end_section=True)
    for t in tenants:
        per.add_row(t.name, f"w{t.weight:g}, {t.sla_ms / 1000:g} s",
                    *(_pct(row["tenant_sla_attainment"][t.name]) for row in rows))
    return per


def _tables(cmp: Comparison) -> list[Table]:
    """The headline per policy, SLA met per tenant and by prompt length, predictor error."""
    rows = cmp.table()
    first = next(iter(cmp.results.values()))
    title = f"{cmp.scenario.name}: {first.arrivals:,} requests"
    loads = {row["offered_load"] for row in rows} - {None}
    if loads:
        title += ", offered load " + " / ".join(f"{100 * v:.0f}%" for v in sorted(loads))
        title += " of capacity (tokens/s)"
    head = Table(title=title, caption="SLA met: within SLA / arrived (refusals count as "
                 "misses); weighted: by tenant weight; completed: within SLA / completed")
    for col in ("policy", "SLA met", "weighted", "completed", "goodput", "accepted",
                "timed out", "p99 s", "p99 wait s", "preempt", "Jain backlogged", "wall s"):
        head.add_column(col, justify="left" if col == "policy" else "right")
    for row in rows:
        head.add_row(
            row["policy"], _pct(row["sla_attainment"]), _pct(row["sla_attainment_weighted"]),
            _pct(row["sla_attainment_completed"]), _num(row["goodput_tokens_per_gpu_s"], 0),
            _pct(row["acceptance"]), _pct(row["timeout_rate"]), _num(row["latency_p99_s"]),
            _num(row["queue_wait_p99_s"]), _pct(row["preemption_rate"]),
            _num(row["fairness_jain_backlogged"]), _num(row["wall_s"], 1),
        )
    per = _per_tenant(cmp, rows)
    buckets: dict[str, int] = {}
    for label, b in first.overall["sla_by_prompt"].items():
        buckets[label] = b["requests"]
    by_len = Table(title="SLA met by prompt length (tokens)")
    by_len.add_column("policy")
    for label, n in buckets.items():
        by_len.add_column(f"{label}\n{n:,} req", justify="right")
    for row in rows:
        o = cmp.results[row["policy"]].overall["sla_by_prompt"]
        by_len.add_row(row["policy"], *(_pct(o.get(label, {}).get("sla_attainment"))
                                        for label in buckets))
    pred = Table(title="predictor error: actual / predicted execution time (> 1: optimistic)")
    for col in ("policy", "completions", "p50", "p95", "p99", "under-predicted"):
        pred.add_column(col, justify="left" if col == "policy" else "right")
    for row in rows:
        e = cmp.results[row["policy"]].overall["predictor_error"]
        pred.add_row(row["policy"], f"{e['count']:,}", _num(e["p50"]), _num(e["p95"]),
                     _num(e["p99"]), _pct(e["under_predicted"]))
    return [head, per, by_len, pred]


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
    ctx: typer.Context,
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
    speed: float | None = typer.Option(
        None, "--speed", help="With --trace: replay speed (k times faster; default 1)."
    ),
    tenant: str | None = typer.Option(
        None, "--tenant", help="With --trace: the tenant every row belongs to (tenant=const:NAME)."
    ),
    load: float | None = typer.Option(
        None, "--load",
        help="Scale arrival rates so offered tokens/s is this fraction of the pool's measured "
        "capacity (1.0 = saturation; also NAME@85 for a shipped scenario).",
    ),
    config: Path | None = typer.Option(
        None, "--config", "-c", help="Config for --trace (default: the shipped example)."
    ),
    duration: float | None = typer.Option(
        None, "--duration", help="Stop arrivals after this many virtual seconds."
    ),
    limit: int | None = typer.Option(
        None, "--limit", min=1, help="With --trace: replay at most this many rows."
    ),
    gpu_noise: float | None = typer.Option(
        None, "--gpu-noise", min=0.0, help="GPU timing noise sigma."
    ),
    jobs: int = typer.Option(1, "--jobs", "-j", min=1, help="Policies simulated in parallel."),
    list_scenarios: bool = typer.Option(False, "--list", help="List shipped scenarios."),
) -> None:
    """Compare admission policies on a scenario or a trace, in virtual time."""
    if list_scenarios:
        for name, path in builtin_scenarios().items():
            typer.echo(f"{name:24s} {path}")
        typer.echo("NAME@PCT runs a scenario at PCT% of its measured capacity (tenants13@120)")
        return
    try:
        sc = _scenario(
            scenario, trace=trace, columns=columns, config=config, speed=speed,
            duration=duration, limit=limit, tenant=tenant,
        )
        for name, value in (("--duration", duration), ("--scale", scale), ("--load", load)):
            if value is not None and not value > 0:
                raise SimError(f"{name} must be positive, got {value:g}")
        changes: dict[str, Any] = {}
        if seed is not None:
            changes["seed"] = seed
        if gpu_noise is not None:
            changes["gpu_noise"] = gpu_noise
        if load is not None:
            changes["load"] = load
        if changes:
            sc = replace(sc, **changes)
        if scale is not None:
            sc = sc.scaled(scale)
        names = parse_policies(policies) if policies else list(sc.policies)
        for name in names:
            resolve(sc, name)  # variants of the scenario checked before anything runs
        sc.check()  # trace mappings read their first row
        sc = with_offered_load(sc, measure=True)  # capacity (cached): before any progress bar
        cmp = _run(sc, names, jobs, quiet=False)
    except (SimError, ConfigError, OSError) as exc:
        raise fail(str(exc), ExitCode.USAGE, json_out=json_out) from None
    _invalid_note(cmp)
    if report is not None:
        written = write_report(cmp, report, command=_command(ctx))
        err.print(f"report: {written['report.md']}")
    if json_out:
        sys.stdout.write(json.dumps(cmp.to_dict(), indent=1, default=str) + "\n")
    else:
        out = Console()
        if not out.is_terminal:
            out = Console(width=160)
        for table in _tables(cmp):
            out.print(table)


def _command(ctx: typer.Context) -> str:
    """This invocation as a command line that reproduces it: every option that differs
    from its default, paths made absolute (for the report's last section)."""
    words = ["triage", ctx.info_name or "sim"]
    for param in ctx.command.params:
        value = ctx.params.get(param.name or "")
        if value is None or value is False or value == param.default:
            continue
        positional = param.param_type_name == "argument"
        if isinstance(value, Path) or (positional and Path(str(value)).is_file()):
            value = Path(value).resolve()
        if positional:
            words.append(str(value))
        else:
            name = max(param.opts, key=len)
            words += [name] if getattr(param, "is_flag", False) else [name, str(value)]
    return shlex.join(words)


def register(app: typer.Typer) -> None:
    """Attach `triage sim` to the root app."""
    app.command("sim")(sim)
