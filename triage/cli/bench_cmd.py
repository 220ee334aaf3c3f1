"""`triage bench ...` commands."""

from __future__ import annotations

import json

import typer

from triage.cli.common import ExitCode, bootstrap_option, fail, require_broker

app = typer.Typer(
    help=(
        "Benchmarks: `core` times the admission core alone (no I/O), `sim` the simulator's "
        "throughput and memory, `pipeline` the whole app on a broker (produce-to-decision "
        "latency and sustained decisions/s). Each prints one line, or one JSON object with "
        "--json. Figures in README.md were taken with these."
    ),
    no_args_is_help=True,
)


@app.command("sim")
def sim(
    requests: int = typer.Option(
        1_000_000, "--requests", "-n", min=1, help="Requests to stream."
    ),
    gpus: int = typer.Option(8, "--gpus", min=1, help="GPUs in the pool."),
    tenants: int = typer.Option(4, "--tenants", min=1, help="Tenants sending."),
    policy: str = typer.Option("full", "--policy", help="Policy (a `triage sim` name)."),
    seed: int = typer.Option(1, "--seed"),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object."),
    profile: bool = typer.Option(False, "--profile", help="cProfile the run (slower)."),
) -> None:
    """Simulator throughput: requests per wall second and peak memory on a streamed run."""
    from triage.bench.sim import run
    from triage.sim.errors import SimError

    try:
        out = run(
            requests=requests, gpus=gpus, tenants=tenants, policy=policy, seed=seed,
            profile=profile,
        )
    except SimError as exc:
        raise fail(str(exc), ExitCode.USAGE, json_out=json_out) from None
    prof = out.pop("profile", None)
    if json_out:
        typer.echo(json.dumps(out))
    else:
        typer.echo(
            f"{out['requests']:,} requests in {out['wall_s']:.1f} s: "
            f"{out['requests_per_s']:,.0f} requests/s, {out['decisions_per_s']:,.0f} "
            f"decisions/s, peak RSS {out['peak_rss_mb']:.0f} MB "
            f"({out['virtual_s']:,.0f} virtual s, SLA met {100 * out['sla_attainment']:.1f}%)"
        )
    if prof:
        typer.echo(prof, err=True)


@app.command("core")
def core(
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object."),
    decisions: int = typer.Option(50_000, min=1000, help="Decisions timed at 100x64x500."),
    scaling_decisions: int = typer.Option(10_000, min=1000, help="Decisions per scaling point."),
) -> None:
    """Decisions per second and per-decision latency of the admission core (one core, no
    I/O): 100 tenants x 64 GPUs with 500 queued, then the cost as GPUs, tenants and queue
    length grow."""
    from triage.bench.core import report

    out = report(decisions=decisions, scaling_decisions=scaling_decisions)
    if json_out:
        typer.echo(json.dumps(out))
        return
    typer.echo(
        f"{out['decisions_per_s']:,} decisions/s, median {out['median_us']} us, p99 "
        f"{out['p99_us']} us at {out['gpus']} GPUs x {out['tenants']} tenants x "
        f"{out['queue']} queued (compiled: {out['compiled']})"
    )
    for row in out["scaling"]:
        typer.echo(f"  {row['gpus']:>4} GPUs {row['tenants']:>5} tenants {row['queue']:>5} "
                   f"queued: median {row['median_us']} us, p99 {row['p99_us']} us")


@app.command("pipeline")
def pipeline(
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object."),
    latency_rate: float = typer.Option(1000.0, help="Offered requests/s in the latency phase."),
    latency_requests: int = typer.Option(15_000, min=100, help="Requests in the latency phase."),
    burst_requests: int = typer.Option(30_000, min=100, help="Requests offered flat out."),
    gpus: int = typer.Option(2, min=1, help="Simulated GPUs (one worker process each)."),
    port: int = typer.Option(
        9092, "--port", "-p", min=1, max=65534,
        help="Port of the local broker (started if none answers, stopped after).",
    ),
    bootstrap: str | None = bootstrap_option(
        "Run on this Kafka host:port instead (it must already answer; nothing is started)."
    ),
) -> None:
    """The admission app on the local broker with simulated workers: p50/p99 from a
    request's produce to its decision record at a steady offered rate, then the decisions
    per second it sustains when requests are offered flat out."""
    from triage.bench.pipeline import run
    from triage.kafka.local import LocalBrokerError

    if bootstrap:
        require_broker(bootstrap, json_out=json_out)
    try:
        out = run(latency_rate=latency_rate, latency_requests=latency_requests,
                  burst_requests=burst_requests, gpus=gpus, port=port, bootstrap=bootstrap)
    except LocalBrokerError as exc:
        raise fail(f"cannot start Kafka: {str(exc).splitlines()[0]}", ExitCode.UNAVAILABLE,
                   json_out=json_out) from None
    except RuntimeError as exc:  # the app or a worker did not come up (its log says why)
        raise fail(str(exc).splitlines()[0], ExitCode.FAILED, json_out=json_out) from None
    if json_out:
        typer.echo(json.dumps(out))
        return
    typer.echo(
        f"sustained {out['requests_per_s']} requests/s (offered {out['offered_per_s']}/s); "
        f"at {out['latency_offered_per_s']}/s offered: p50 {out['p50_ms']} ms, "
        f"p99 {out['p99_ms']} ms (produce to decision record)"
    )
