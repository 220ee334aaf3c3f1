"""`triage bench ...` commands."""

from __future__ import annotations

import json

import typer

app = typer.Typer(help="bench commands", no_args_is_help=True)


@app.command("sim")
def sim(
    requests: int = typer.Option(1_000_000, "--requests", "-n", help="Requests to stream."),
    gpus: int = typer.Option(8, "--gpus", help="GPUs in the pool."),
    tenants: int = typer.Option(4, "--tenants", help="Tenants sending."),
    policy: str = typer.Option("full", "--policy", help="Policy (a `triage sim` name)."),
    seed: int = typer.Option(1, "--seed"),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object."),
    profile: bool = typer.Option(False, "--profile", help="cProfile the run (slower)."),
) -> None:
    """Simulator throughput: requests per wall second and peak memory on a streamed run."""
    from triage.bench.sim import run

    out = run(
        requests=requests, gpus=gpus, tenants=tenants, policy=policy, seed=seed,
        profile=profile,
    )
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
