"""`triage bench ...` commands."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import typer

from triage.cli.common import (
    ExitCode,
    TenantTopics,
    bootstrap_option,
    fail,
    load_or_exit,
    require_broker,
)

app = typer.Typer(
    help=(
        "Benchmarks: `core` times the admission core alone (no I/O), `sim` the simulator's "
        "throughput and memory, `policies` each policy's simulation cost on a scenario, "
        "`pipeline` the whole app on a broker beside the broker's and "
        "the Faust engine's ceilings (latency, decisions and completions/s, CPU per "
        "request, ratios). Each prints a short report, or one JSON object with --json. "
        "Figures in README.md were taken with these."
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


@app.command("policies")
def policies(
    scenario: str = typer.Argument(..., help="Shipped scenario name (NAME@LOAD too) or a "
                                   "scenario YAML file."),
    policy_list: str = typer.Option(
        "admit_all,full", "--policies", "-p",
        help="Comma-separated policies; ratios are to the first."),
    repetitions: int = typer.Option(2, "--repetitions", min=1,
                                    help="Interleaved runs of each policy; the best counts."),
    scale: float = typer.Option(1.0, "--scale", min=0.001, max=1.0,
                                help="Run this fraction of the scenario's length."),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """What each policy costs to simulate on one scenario: process CPU seconds of a run,
    interleaved, and the ratio to the first policy (issue 9: full within 1.5x of
    admit_all on tenants13)."""
    from triage.bench.policy_time import run
    from triage.sim.errors import SimError

    names = [p.strip() for p in policy_list.split(",") if p.strip()]
    if not names:
        raise fail("--policies names no policy", ExitCode.USAGE, json_out=json_out)
    try:
        out = run(scenario, names, repetitions=repetitions, scale=scale)
    except SimError as exc:
        raise fail(str(exc), ExitCode.USAGE, json_out=json_out) from None
    if json_out:
        typer.echo(json.dumps(out))
        return
    for name, row in out["policies"].items():
        typer.echo(f"{out['scenario']:<16} {name:<20} {row['cpu_s']:6.2f} CPU s "
                   f"({row['ratio']:.2f}x {names[0]}), {row['requests']:,} requests")


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


@app.command("handlers")
def handlers(
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object."),
    requests: int = typer.Option(10_000, min=100, max=1_000_000,
                                 help="Requests offered at once (each completes)."),
    tenants: int = typer.Option(4, min=1, max=2_000, help="Tenants they are spread over."),
    prompt_bytes: int = typer.Option(150, min=1, max=400_000,
                                     help="Prompt text per request."),
) -> None:
    """CPU per request of the admission app's own code (handlers, core, records,
    replies, audit) without Kafka, Faust or RocksDB: the pipeline bench's flat-out
    phase over the in-memory store, completions ten to a message."""
    from triage.bench.handlers import run

    out = run(requests=requests, tenants=tenants, prompt_bytes=prompt_bytes)
    if json_out:
        typer.echo(json.dumps(out))
        return
    typer.echo(f"{out['cpu_us_per_request']} us CPU per request over {out['requests']:,} "
               f"requests ({out['queued_first']:,} queued first, {out['completed']:,} "
               f"completed, {out['outputs_per_request']:.2f} outputs each), "
               f"{out['tenants']} tenants, {out['prompt_bytes']}-byte prompts")


@app.command("pipeline")
def pipeline(
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object."),
    latency_rate: float = typer.Option(500.0, help="Offered requests/s in the latency phase."),
    latency_requests: int = typer.Option(5_000, min=100, help="Requests in the latency phase."),
    warmup_requests: int = typer.Option(
        500, min=0, help="Requests at --latency-rate before the latency phase, measured "
        "apart (warmup_p99_ms): a freshly started app's first second is slower."
    ),
    burst_requests: int = typer.Option(
        10_000, min=100, help="Requests offered flat out (each one completes)."
    ),
    gpus: int = typer.Option(2, min=1, help="Simulated GPUs in all (one worker process each)."),
    pools: int = typer.Option(1, min=1, help="Pools the GPUs are spread over (one model each)."),
    tenants: int = typer.Option(
        4, min=1, max=2_000, help="Tenants the requests are spread over (a request topic "
        "each, unless --tenant-topics shared), to see the CPU per request stay flat as they "
        "grow."
    ),
    tenant_topics: TenantTopics = typer.Option(
        TenantTopics.PER_TENANT, "--tenant-topics",
        help="The app's kafka.tenant_topics: a request and a reply topic per tenant, or one "
        "pair for every tenant."
    ),
    instances: int = typer.Option(
        1, min=1, help="Admission processes in one consumer group, sharing the app's shards "
        "(at most --pools: one shard per pool)."
    ),
    shards: int | None = typer.Option(
        None, min=1, help="Partitions the app is sharded over, pool j on j mod shards "
        "(default: --pools with several instances, else 1), to compare one instance and "
        "several on the same layout."
    ),
    repetitions: int = typer.Option(3, min=1, help="Interleaved repetitions (medians)."),
    broker_messages: int = typer.Option(
        100_000, min=100, help="Messages produced and consumed for the broker's ceiling."
    ),
    ceiling_messages: int = typer.Option(
        10_000, min=100, help="Messages (requests for the skeleton) per Faust ceiling."
    ),
    out: Path = typer.Option(
        Path("reports/bench-pipeline"), "--out", help="Where each run writes its logs, "
        "configs and result.json (a folder per run)."
    ),
    port: int = typer.Option(
        9092, "--port", "-p", min=1, max=65534,
        help="Port of the local broker (started if none answers, stopped after).",
    ),
    bootstrap: str | None = bootstrap_option(
        "Run on this Kafka host:port instead (it must already answer; nothing is started)."
    ),
) -> None:
    """Triage beside its ceilings, interleaved on one broker (medians of --repetitions):
    the broker's produce and consume, a Faust relay, relay plus a table write, and a
    skeleton of triage's events per request, against the admission app with simulated
    workers (p50/p99 produce-to-decision at a steady rate; decisions, completions and
    admission CPU per request flat out), with the ratios between them."""
    from triage.bench.children import BenchInterrupted, BenchStartError
    from triage.bench.pipeline import instances_problem, run
    from triage.kafka.local import LocalBrokerError

    problem = instances_problem(instances, pools)
    if problem is None and shards is not None and shards > pools:
        problem = f"--shards {shards} is more than --pools {pools}: a shard holds a pool"
    if problem is None and gpus < pools:
        problem = f"--gpus {gpus} is fewer than --pools {pools}: each pool needs a GPU"
    if problem is not None:
        raise fail(problem, ExitCode.USAGE, json_out=json_out)
    if bootstrap:
        require_broker(bootstrap, json_out=json_out)
    try:
        res = run(latency_rate=latency_rate, latency_requests=latency_requests,
                  warmup_requests=warmup_requests,
                  burst_requests=burst_requests, gpus=gpus, pools=pools, tenants=tenants,
                  instances=instances, shards=shards,
                  repetitions=repetitions, broker_messages=broker_messages,
                  ceiling_messages=ceiling_messages, port=port, bootstrap=bootstrap,
                  out_dir=out, overrides={"kafka": {"tenant_topics": tenant_topics.value}})
    except LocalBrokerError as exc:
        raise fail(f"cannot start Kafka: {str(exc).splitlines()[0]}", ExitCode.UNAVAILABLE,
                   json_out=json_out) from None
    except (BenchStartError, RuntimeError) as exc:  # a child did not come up (its log says why)
        raise fail(str(exc).splitlines()[0], ExitCode.FAILED, json_out=json_out) from None
    except BenchInterrupted as exc:
        raise fail(f"interrupted ({exc}): every child process was stopped",
                   ExitCode.INTERRUPTED, json_out=json_out) from None
    if json_out:
        typer.echo(json.dumps(res))
        return
    for line in _pipeline_lines(res):
        typer.echo(line)


def _pipeline_lines(r: dict[str, Any]) -> list[str]:
    def f(key: str) -> str:
        v = r.get(key)
        return "n/a" if v is None else f"{v:,.0f}" if abs(v) >= 100 else f"{v:g}"

    return [
        f"medians of {r['repetitions']} interleaved repetitions, {r['tenants']} "
        f"tenants, {r['pools']} pool(s) ({r['run_dir']}):",
        f"  broker          produce {f('broker_produce_per_s')}/s, consume "
        f"{f('broker_consume_per_s')}/s",
        f"  faust relay     {f('faust_relay_ceiling_per_s')} msgs/s, "
        f"{f('faust_relay_cpu_us_per_msg')} us CPU each",
        f"  faust table     {f('faust_table_ceiling_per_s')} msgs/s, "
        f"{f('faust_table_cpu_us_per_msg')} us CPU each",
        f"  faust skeleton  {f('faust_skeleton_ceiling_per_s')} requests/s, "
        f"{f('faust_skeleton_cpu_us_per_request')} us CPU each (2 events, 2 writes, 5 "
        f"outputs)",
        f"  faust matched   {f('faust_matched_skeleton_ceiling_per_s')} requests/s, "
        f"{f('faust_matched_skeleton_cpu_us_per_request')} us CPU each (triage's path: "
        f"{f('burst_queued_share')} queued first, "
        f"{f('matched_items_per_message')} completions per message)",
        f"  triage          {f('completed_per_s')} completed/s, {f('decisions_per_s')} "
        f"first decisions/s, {f('admission_cpu_us_per_request')} us admission CPU per "
        f"completed request ({f('admission_cpu_s_per_1000_requests')} s per 1,000); "
        f"p50 {f('p50_ms')} ms, p99 {f('p99_ms')} ms at {f('latency_offered_per_s')}/s "
        f"({f('paced_cpu_us_per_request')} us CPU per request at that rate) "
        f"(visible to a client: p99 {f('visible_p99_ms')} ms); "
        f"{f('completions_per_message')} completions per message",
        f"  ratios          triage/skeleton {f('triage_vs_skeleton')}, triage/matched "
        f"skeleton {f('triage_vs_matched_skeleton')}, skeleton/table "
        f"{f('skeleton_vs_table')}, table/relay {f('table_vs_relay')}, relay/broker "
        f"{f('relay_vs_broker')}",
    ]


@app.command("ceiling-app", hidden=True)
def ceiling_app(
    config: Path = typer.Option(..., "--config", help="The bench run's config."),
    kind: str = typer.Option(..., help="relay, table, skeleton or matched."),
    base: str = typer.Option(..., help="The app's topics are <base>.in, <base>.out, ..."),
    datadir: Path = typer.Option(..., help="RocksDB directory of this app."),
    queued_share: float = typer.Option(0.0, min=0.0, max=1.0,
                                       help="matched: the share of requests queued first."),
) -> None:
    """One ceiling app of `bench pipeline` (the bench runs it as a child process)."""
    import faust

    from triage.bench.ceiling_app import CeilingKind, build_ceiling_app

    cfg = load_or_exit(config)
    logging.getLogger("faust").setLevel(logging.WARNING)  # as `triage admission` does
    datadir.mkdir(parents=True, exist_ok=True)
    built = build_ceiling_app(cfg, CeilingKind(kind), base, datadir=str(datadir),
                              queued_share=queued_share)
    faust.Worker(built, loglevel="warn", quiet=True).execute_from_commandline()
