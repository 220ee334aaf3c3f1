"""What every `triage` command shares: exit codes, one-line errors, common options.

One exit-code scheme for the whole CLI (docs/operations.md, "Exit codes"):

    0  OK           the command did what it was asked
    1  FAILED       it ran, and the outcome is a failure (not found, not all completed,
                    findings in `config check`, a broker that would not start)
    2  USAGE        bad input: options, arguments, a config file that is missing or invalid
    3  UNAVAILABLE  something it must reach or read is not there: the broker, a topic,
                    an export file
    4  INTERNAL     an unexpected error (a bug: rerun with -v for the traceback)
    130             interrupted (Ctrl-C)

Errors are one line on stderr, printed without rich markup (a pattern like
``^[a-z0-9]...`` prints intact) and never wrapped, so a pipe or a log gets it whole.
With ``--json`` the error is also a JSON object on stdout: ``{"error": ..., "code": N}``.
"""

from __future__ import annotations

import json
import logging
import sys
import traceback
from collections.abc import Sequence
from enum import IntEnum, StrEnum
from importlib import metadata
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.text import Text
from typer.core import TyperGroup

from triage.config import ConfigError, TriageConfig, load_config


class TenantTopics(StrEnum):
    """`kafka.tenant_topics` as an option (`--tenant-topics`): the layout a command's own
    system runs with (the bench's, the chaos suite's)."""

    PER_TENANT = "per_tenant"
    SHARED = "shared"


class ExitCode(IntEnum):
    """The exit status of every command (see the module docstring)."""

    OK = 0
    FAILED = 1
    USAGE = 2
    UNAVAILABLE = 3
    INTERNAL = 4
    INTERRUPTED = 130


def stderr_console() -> Console:
    """stderr without wrapping: a long error stays one line when piped."""
    return Console(stderr=True, soft_wrap=True)


def print_error(message: str, *, prefix: str = "error") -> None:
    """One line on stderr: a red prefix and the message as plain text (no markup)."""
    line = Text(f"{prefix}: ", style="red")
    line.append(message)
    stderr_console().print(line, highlight=False)


def fail(
    message: str, code: ExitCode = ExitCode.FAILED, *, json_out: bool = False,
    prefix: str = "error",
) -> typer.Exit:
    """Print an error (and, with --json, a JSON error object on stdout); return the Exit
    to raise: ``raise fail("...", ExitCode.USAGE) from None``."""
    print_error(message, prefix=prefix)
    if json_out:
        typer.echo(json.dumps({"error": message, "code": int(code)}))
    return typer.Exit(int(code))


def load_or_exit(
    path: Path | None, *, bootstrap: str | None = None, json_out: bool = False
) -> TriageConfig:
    """Load the config (the shipped example when None), apply a --bootstrap override and
    declare its Kafka security settings (kafka.security) for every client this process
    builds, or exit 2 with the loader's message (it names the field)."""
    from triage.kafka.security import use_kafka_security

    try:
        cfg = with_bootstrap(load_config(path), bootstrap)
        use_kafka_security(cfg.kafka)  # reads the password now, not at the first send
    except ConfigError as exc:
        raise fail(str(exc), ExitCode.USAGE, json_out=json_out) from None
    return cfg


def with_bootstrap(cfg: TriageConfig, bootstrap: str | None) -> TriageConfig:
    """The config with kafka.bootstrap_servers replaced (the -b/--bootstrap option)."""
    if not bootstrap:
        return cfg
    kafka = cfg.kafka.model_copy(update={"bootstrap_servers": bootstrap})
    return cfg.model_copy(update={"kafka": kafka})


def require_broker(bootstrap: str, *, json_out: bool = False, timeout_s: float = 5.0) -> None:
    """Exit 3 with one clear line when no broker answers a metadata request."""
    from triage.kafka.clients import broker_reachable

    if not broker_reachable(bootstrap, timeout_s=timeout_s):
        raise fail(
            f"no Kafka broker answers on {bootstrap} (start one with `triage kafka up`, "
            "or point -b/--bootstrap at yours)",
            ExitCode.UNAVAILABLE, json_out=json_out,
        )


def config_option(help_text: str = "triage YAML config (default: the shipped example).") -> Any:
    return typer.Option(None, "--config", "-c", help=help_text)


def bootstrap_option(
    help_text: str = "Kafka host:port, overriding kafka.bootstrap_servers.",
) -> Any:
    return typer.Option(None, "--bootstrap", "-b", help=help_text)


def version() -> str:
    try:
        return metadata.version("gpu-triage")
    except metadata.PackageNotFoundError:  # running from a source tree without install
        return "unknown"


def _wants_json(args: Sequence[str]) -> bool:
    return "--json" in args


def _drop_flag_metavar() -> None:
    """Typer 0.2x prints a ``<bool>`` type beside every flag in --help; a flag takes no
    value, so show none (older typer shows none already and lacks the hook)."""
    from typer import core

    original = getattr(core.TyperOption, "display_type_rich", None)
    if original is None or getattr(original, "_triage", False):
        return

    def display_type_rich(self: Any, ctx: Any) -> str | None:
        if getattr(self, "is_flag", False) and self.metavar is None:
            return None
        return original(self, ctx)  # type: ignore[no-any-return]

    display_type_rich._triage = True  # type: ignore[attr-defined]
    core.TyperOption.display_type_rich = display_type_rich  # type: ignore[method-assign]


_drop_flag_metavar()


def _is_click_error(exc: BaseException) -> bool:
    """Click's exceptions (typer vendors its own copy of click, so match by shape)."""
    return hasattr(exc, "format_message") and isinstance(getattr(exc, "exit_code", None), int)


def _kinds(exc: BaseException) -> set[str]:
    return {c.__name__ for c in type(exc).__mro__}


def _report(exc: Exception, *, json_out: bool) -> int:
    """One line for an exception that reached the top; returns the exit code."""
    if "NoArgsIsHelpError" in _kinds(exc):  # the help has been printed
        return int(getattr(exc, "exit_code", ExitCode.USAGE))
    if _is_click_error(exc):
        ctx = getattr(exc, "ctx", None)
        where = ctx.command_path if ctx is not None else "triage"
        hint = f" (see `{where} --help`)" if "UsageError" in _kinds(exc) else ""
        raw = int(getattr(exc, "exit_code", ExitCode.USAGE))
        code = ExitCode(raw) if raw in {c.value for c in ExitCode} else ExitCode.USAGE
        message = exc.format_message()  # type: ignore[attr-defined]
        fail(f"{message}{hint}", code, json_out=json_out, prefix=f"{where}: error")
        return int(code)
    if logging.getLogger().isEnabledFor(logging.DEBUG):
        traceback.print_exc()
    fail(f"unexpected {type(exc).__name__}: {exc} (a bug; rerun with -v for the traceback)",
         ExitCode.INTERNAL, json_out=json_out, prefix="triage")
    return int(ExitCode.INTERNAL)


class TriageGroup(TyperGroup):
    """The root command: every error the command line can produce ends as one line and an
    exit code of the scheme above, never a traceback (unless -v asks for it)."""

    def main(  # type: ignore[override]
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        argv = list(sys.argv[1:] if args is None else args)
        try:
            rv = super().main(args=argv, prog_name=prog_name, complete_var=complete_var,
                              standalone_mode=False, **extra)  # fmt: skip
            code = rv if isinstance(rv, int) else 0
        except (typer.Abort, KeyboardInterrupt):
            print_error("interrupted", prefix="triage")
            code = ExitCode.INTERRUPTED
        except Exception as exc:
            code = _report(exc, json_out=_wants_json(argv))
        if standalone_mode:
            sys.exit(int(code))
        return int(code)
