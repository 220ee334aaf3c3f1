"""`triage admission`: run the Faust admission app until SIGTERM."""

from __future__ import annotations

import logging
import os
import threading
import time
from enum import StrEnum
from pathlib import Path
from typing import Any

import typer
from pydantic import ValidationError

from triage.cli.common import (
    ExitCode,
    bootstrap_option,
    config_option,
    fail,
    load_or_exit,
    require_broker,
)
from triage.config import ConfigError
from triage.config.checks import runnable_problem
from triage.config.models import TriageConfig


class LogLevel(StrEnum):
    CRIT = "crit"
    ERROR = "error"
    WARN = "warn"
    INFO = "info"
    DEBUG = "debug"

    @property
    def number(self) -> int:
        return {"crit": logging.CRITICAL, "error": logging.ERROR, "warn": logging.WARNING,
                "info": logging.INFO, "debug": logging.DEBUG}[self.value]


log = logging.getLogger(__name__)
STOP_GRACE_S = 20.0  # SIGTERM must stop the app within 30 s, whatever state it is in


def register(app: typer.Typer) -> None:
    app.command("admission")(admission)


def prepare_datadir(datadir: str) -> Path:
    """Create the RocksDB directory and its missing parents (a fresh clone has no var/);
    an unusable path is one line and exit 2."""
    path = Path(datadir).expanduser()
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise fail(f"admission.datadir {str(path)!r}: cannot create it: "
                   f"{exc.strerror or exc}", ExitCode.USAGE) from None  # fmt: skip
    if not path.is_dir():
        raise fail(f"admission.datadir {str(path)!r} is not a directory", ExitCode.USAGE)
    return path


def _as_instance(cfg: TriageConfig, name: str) -> TriageConfig:
    """The config with admission.instance set to `name` (checked like the file's)."""
    data = cfg.model_dump()
    data["admission"]["instance"] = name
    try:
        return TriageConfig.model_validate(data)
    except ValidationError as exc:
        msgs = "; ".join(e["msg"] for e in exc.errors())
        raise fail(f"--instance {name!r}: {msgs}", ExitCode.USAGE) from None


def admission(
    config: Path | None = config_option("triage.yaml (default: the shipped example)."),
    bootstrap: str | None = bootstrap_option(),
    datadir: str | None = typer.Option(
        None, help="RocksDB directory of this process (default from config: admission.datadir; "
        "created with its parents). One per process."
    ),
    metrics_port: int | None = typer.Option(
        None, min=0, max=65535, help="Prometheus port (default from config; 0 disables)."
    ),
    instance: str | None = typer.Option(
        None, help="This process's name among the app's instances (default from config: "
        "admission.instance). Several instances of one config share its shards: give each "
        "its own name and --datadir."
    ),
    loglevel: LogLevel = typer.Option(LogLevel.INFO, help="Log level of the app."),
) -> None:
    """Run the admission app (the Faust stream processor).

    Reads every tenant's request topic, completions and GPU heartbeats; decides,
    replies, dispatches and records every decision. Stop with SIGTERM or Ctrl-C; state
    is recovered from the changelogs on the next start."""
    cfg = load_or_exit(config, bootstrap=bootstrap)
    if instance is not None:
        cfg = _as_instance(cfg, instance)
    problem = runnable_problem(cfg)
    if problem is not None:
        raise fail(problem, ExitCode.USAGE)
    data = prepare_datadir(datadir or cfg.admission.datadir)
    require_broker(cfg.kafka.bootstrap_servers)
    import faust  # heavy import, only for this command

    from triage.streams.app import build_app

    quiet_library_loggers(loglevel.number)
    # The app re-reads the file for added tenants only; a -b override stays in force.
    try:
        built = build_app(cfg, config_path=config, datadir=str(data), metrics_port=metrics_port)
    except ConfigError as exc:  # e.g. kafka.security names an unset password variable
        raise fail(str(exc), ExitCode.USAGE) from None
    except OSError as exc:  # the metrics port taken, an unwritable datadir
        raise fail(f"cannot start the admission app: {exc}", ExitCode.FAILED) from None

    class Worker(faust.Worker):
        def on_setup_root_logger(self, logger: logging.Logger, level: int) -> None:
            super().on_setup_root_logger(logger, level)
            logger.setLevel(level or logging.INFO)  # mode leaves the root at DEBUG
            quiet_library_loggers(level)

        def _schedule_shutdown(self, signal: Any) -> None:
            _exit_after(STOP_GRACE_S)
            super()._schedule_shutdown(signal)

        def on_worker_shutdown(self) -> None:
            # reached on every way out, a failed start too: mode then stops the services
            # it started, and a stop that hangs there kept a dead app alive for good
            _exit_after(STOP_GRACE_S)

    worker = Worker(built.app, loglevel=loglevel.value, quiet=True)
    worker.execute_from_commandline()


LIBRARY_LOGGERS = ("aiokafka", "faust", "mode", "kafka")


def quiet_library_loggers(level: int) -> None:
    """aiokafka, Faust and mode log at WARNING unless the app runs at debug level.
    mode's worker leaves the root logger at DEBUG, and then aiokafka builds a debug
    record for every message it produces or fetches: ~4-6% of the app's CPU under load
    (docs/architecture.md, "The admission app's per-request cost")."""
    for name in LIBRARY_LOGGERS:
        logging.getLogger(name).setLevel(level if level == logging.DEBUG
                                         else max(level or logging.INFO, logging.WARNING))


def _exit_after(grace_s: float) -> None:
    """A graceful stop that hangs (its broker gone, a stuck handler) must not keep the
    process alive: exit after `grace_s`. Nothing is lost by it: outputs not yet committed
    are replayed and inputs not yet committed are read again on the next start
    (docs/reliability.md, "Shutdown")."""

    def watchdog() -> None:
        time.sleep(grace_s)
        log.error("graceful stop still running after %.0fs: exiting now (uncommitted "
                  "work is replayed on the next start)", grace_s)
        logging.shutdown()
        os._exit(int(ExitCode.UNAVAILABLE))  # 3: the stop was cut short

    threading.Thread(target=watchdog, name="stop-watchdog", daemon=True).start()
