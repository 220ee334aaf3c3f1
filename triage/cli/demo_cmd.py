"""`triage demo`: the whole system on the local broker, in a minute and a half.

Starts the broker (if none runs), creates a fresh set of topics, starts the Faust
admission app and one simulated worker per GPU of the config, drives the seed's
three tenants at it with a progress display, waits for every request to end, then
prints and writes a per-tenant summary and stops what it started.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import typer
import yaml
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from triage.cli.common import ExitCode, bootstrap_option, fail, require_broker, stderr_console
from triage.config.errors import ConfigError
from triage.config.models import TriageConfig
from triage.demo.driver import LoadDriver, ReplyTracker
from triage.demo.processes import ChildProcess, scrape, wait_for_metric
from triage.demo.summary import summarize, table
from triage.kafka.clients import broker_reachable
from triage.kafka.local import LocalBroker, LocalBrokerError
from triage.sim.errors import SimError
from triage.sim.scenario import load_scenario
from triage.topics.admin import create_topics
from triage.topics.errors import TopicAdminError
from triage.topics.names import TopicNames

log = logging.getLogger(__name__)
DEMO_SCENARIO = Path(__file__).resolve().parent.parent / "demo" / "scenario.yaml"


def register(app: typer.Typer) -> None:
    app.command("demo")(demo)


def demo(
    duration: float = typer.Option(90.0, min=5.0, help="Seconds of traffic to send."),
    scenario: Path = typer.Option(DEMO_SCENARIO, help="Scenario file (tenants' traffic and the "
                                  "config it runs on)."),
    out: Path = typer.Option(Path("demo-out"), help="Where the run's config, logs and summary go."),
    drain: float = typer.Option(120.0, help="Most seconds to wait for outstanding requests."),
    keep_broker: bool = typer.Option(False, help="Leave a broker the demo started running."),
    port: int = typer.Option(
        9092, "--port", "-p", min=1, max=65534,
        help="Port of the local broker (started if none answers).",
    ),
    bootstrap: str | None = bootstrap_option(
        "Use this Kafka host:port instead of a local broker (it must already answer)."
    ),
) -> None:
    """Run the demo: broker, topics, admission app, two simulated GPUs, three tenants."""
    console = Console(width=max(Console().width, 150))
    try:
        sc = load_scenario(scenario)
    except (SimError, ConfigError, OSError) as exc:
        raise fail(str(exc), ExitCode.USAGE) from None
    if bootstrap:
        require_broker(bootstrap)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    run_dir = out / stamp
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise fail(f"--out {out}: cannot create {run_dir}: {exc.strerror or exc}",
                   ExitCode.USAGE) from None  # fmt: skip
    broker = LocalBroker(port=port)
    server = bootstrap or broker.bootstrap
    started_broker = False
    children: list[ChildProcess] = []
    tracker: ReplyTracker | None = None
    try:
        if not bootstrap and not broker_reachable(server, timeout_s=3.0):
            console.print(f"[bold]starting Kafka[/] on {server} ...")
            result = broker.start()
            started_broker = result.started
            console.print(f"Kafka answered after {result.ready_s:.1f} s")
        cfg = _run_config(sc.config, prefix=f"demo{stamp.replace('-', '')}",
                          bootstrap=server, run_dir=run_dir)
        cfg_path = run_dir / "triage.yaml"
        cfg_path.write_text(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False))
        names = TopicNames.of(cfg.kafka.topic_prefix, cfg.kafka.tenant_topics)
        created = create_topics(server, names, cfg)
        console.print(f"created {len(created.created)} topics under [bold]{names.prefix}.*[/]")

        admission = ChildProcess("admission", ["admission", "--config", str(cfg_path),
                                               "--loglevel", "warn"],
                                 run_dir / "admission.log")
        children.append(admission)
        gpus = cfg.all_gpus()
        for gpu in gpus:
            children.append(ChildProcess(f"worker {gpu}", [
                "worker", "--gpu", gpu, "--backend", "sim", "--config", str(cfg_path)],
                run_dir / f"worker-{gpu}.log"))
        for c in children:
            c.start()
        m = cfg.metrics
        adm_url = f"http://{m.host}:{m.admission_port}/metrics"
        with console.status("waiting for the admission app and the workers ..."):
            if not wait_for_metric(adm_url, "triage_admission_ready 1.0", timeout_s=120,
                                   proc=admission):
                raise _failed(admission)
            for i, c in enumerate(children[1:]):
                url = f"http://{m.host}:{m.worker_port_base + i}/metrics"
                if not wait_for_metric(url, "triage_worker", timeout_s=60, proc=c):
                    raise _failed(c)
        console.print(f"admission app ready; {len(gpus)} simulated GPUs reporting")

        tracker = ReplyTracker(server, names, [t.name for t in cfg.tenants])
        tracker.start()
        driver = LoadDriver(server, names, tracker)
        arrivals = (a for a in sc.arrivals() if a.t < duration)
        with Progress(TextColumn("[bold]{task.description}"), BarColumn(),
                      TextColumn("{task.fields[info]}"), TimeElapsedColumn(),
                      console=console) as progress:
            task = progress.add_task("traffic", total=duration, info="")

            def report(elapsed: float, sent: int) -> None:
                progress.update(task, completed=min(elapsed, duration),
                                info=f"sent {sent}, waiting {tracker.outstanding()}")

            driver.run(arrivals, on_progress=report,
                       should_stop=lambda: not all(c.alive() for c in children))
            driver.close()
            drain_task = progress.add_task("draining", total=None, info="")
            deadline = time.monotonic() + drain
            while tracker.outstanding() and time.monotonic() < deadline:
                if not all(c.alive() for c in children):
                    break
                progress.update(drain_task, info=f"{tracker.outstanding()} not ended yet")
                time.sleep(0.5)
        for c in children:
            if not c.alive():
                console.print(f"[red]{c.name} exited early[/]; its log:\n{c.tail()}")
        summary = summarize(tracker.snapshot(), {t.name: t.sla_ms / 1000 for t in cfg.tenants},
                            scrape(adm_url))
        summary["run_dir"] = str(run_dir)
        summary["topic_prefix"] = names.prefix
        summary["unknown_replies"] = tracker.unknown
        (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
        console.print(table(summary))
        _epilogue(console, summary, cfg, cfg_path, adm_url)
        if not summary["reconciles"]:
            raise typer.Exit(1)
    except LocalBrokerError as exc:
        raise fail(f"cannot start Kafka: {str(exc).splitlines()[0]}",
                   ExitCode.UNAVAILABLE) from None  # fmt: skip
    except TopicAdminError as exc:
        raise fail(str(exc), ExitCode.UNAVAILABLE) from None
    finally:
        if tracker is not None:
            tracker.stop()
        for c in reversed(children):
            c.stop()
        if started_broker and not keep_broker:
            broker.stop()


def _run_config(base: TriageConfig, *, prefix: str, bootstrap: str, run_dir: Path) -> TriageConfig:
    data: dict[str, Any] = base.model_dump(mode="json")
    data["kafka"]["topic_prefix"] = prefix
    data["kafka"]["bootstrap_servers"] = bootstrap
    data["admission"]["datadir"] = str(run_dir / "admission-data")
    return TriageConfig.model_validate(data)


def _failed(c: ChildProcess) -> typer.Exit:
    stderr_console().print(f"{c.name} did not come up; its log:\n{c.tail()}", markup=False,
                           highlight=False)  # fmt: skip
    return fail(f"{c.name} did not come up (log above and in {c.log_path})", ExitCode.FAILED)


def _epilogue(console: Console, summary: dict[str, Any], cfg: TriageConfig, cfg_path: Path,
              adm_url: str) -> None:
    ok = "[green]yes[/]" if summary["reconciles"] else "[red]NO[/]"
    console.print(f"sent {summary['sent']}, ended {summary['ended']}; every request ended in "
                  f"exactly one terminal reply: {ok}")
    console.print(f"summary: {summary['run_dir']}/summary.json (logs beside it)")
    m = cfg.metrics
    workers = ", ".join(f"http://{m.host}:{m.worker_port_base + i}/metrics"
                        for i in range(len(cfg.all_gpus())))
    console.print(f"metrics (while running): admission {adm_url}; workers {workers}. "
                  "Grafana: `docker compose up` with ops/grafana (see docs/operations.md).")
    console.print(f"why was a request refused? `triage audit <request-id> --config {cfg_path}`"
                  " (ids look like rag-12)")
