"""Every command, given bad input, says one clear thing and exits with the CLI's code.

In process (typer's CliRunner) for speed; as a real subprocess where what matters is
the process's own stderr (librdkafka writes to fd 2, rich wraps at 80 columns when
piped) or the entry point's handling. No broker: unreachable means 127.0.0.1:1.
"""

from __future__ import annotations

import json
import logging
import re
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from triage.cli.admission_cmd import prepare_datadir
from triage.cli.common import ExitCode
from triage.cli.main import app
from triage.config import EXAMPLE_CONFIG
from triage.kafka.clients import LIBRDKAFKA_LOGGER, LibrdkafkaLog, make_consumer

DOCS = Path(__file__).resolve().parents[2] / "docs" / "operations.md"
NOWHERE = "127.0.0.1:1"  # nothing listens there
PATTERN = "^[a-z0-9][a-z0-9_-]*$"
runner = CliRunner()


def _example() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(EXAMPLE_CONFIG.read_text())
    return data


def _write(tmp: Path, name: str, data: Any) -> Path:
    p = tmp / name
    p.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
    return p


@pytest.fixture
def configs(tmp_path: Path) -> dict[str, Path]:
    bad_name = _example()
    bad_name["tenants"][0]["name"] = "Rag!"
    parts = _example()
    parts.setdefault("kafka", {})["request_partitions"] = 4
    return {
        "missing": tmp_path / "nope.yaml",
        "yaml": _write(tmp_path, "broken.yaml", "tenants: [\n"),
        "scalar": _write(tmp_path, "scalar.yaml", "just words\n"),
        "bad_name": _write(tmp_path, "bad-name.yaml", bad_name),
        "partitions": _write(tmp_path, "parts.yaml", parts),
    }


def _check(res: Any, code: int, *needles: str) -> str:
    err = res.stderr
    assert res.exit_code == code, (res.exit_code, res.stdout, err)
    assert "Traceback" not in err + res.stdout
    assert not isinstance(res.exception, Exception) or isinstance(res.exception, SystemExit), (
        res.exception
    )
    for n in needles:
        assert n in err, (n, err)
    return str(err)


# --------------------------------------------------------------------------- bad configs

CONFIG_COMMANDS = [
    ["topics", "create", "-c"],
    ["topics", "list", "-c"],
    ["admission", "-c"],
    ["worker", "--gpu", "gpu-0", "-c"],
    ["submit", "--tenant", "rag", "--model", "m", "--prompt-tokens", "1", "--max-tokens", "1",
     "-c"],
    ["audit", "some-id", "-c"],
    ["replay", "-c"],
    ["config", "check"],
]  # fmt: skip


@pytest.mark.parametrize("cmd", CONFIG_COMMANDS, ids=lambda c: " ".join(c[:2]))
@pytest.mark.parametrize("kind", ["missing", "yaml", "scalar", "bad_name"])
def test_bad_config_is_exit_2_and_names_the_problem(
    cmd: list[str], kind: str, configs: dict[str, Path]
) -> None:
    res = runner.invoke(app, [*cmd, str(configs[kind])])
    err = _check(res, ExitCode.USAGE, str(configs[kind]))
    expected = {"missing": "cannot read", "yaml": "not valid YAML: line 2",
                "scalar": "must be a mapping", "bad_name": "tenants[0:Rag!].name"}[kind]
    assert expected in err
    if kind == "bad_name":  # rich markup must not eat the brackets
        assert PATTERN in err
    if kind in ("missing", "yaml", "scalar"):
        assert len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("cmd", [["topics", "create", "-c"], ["admission", "-c"]])
def test_partitions_the_app_cannot_run_are_refused_before_anything_is_created(
    cmd: list[str], configs: dict[str, Path]
) -> None:
    res = runner.invoke(app, [*cmd, str(configs["partitions"]), "-b", NOWHERE])
    _check(res, ExitCode.USAGE, "kafka.request_partitions (4)",
           "must equal kafka.admission_partitions (1)")


# --------------------------------------------------------------------------- bad values


BAD_VALUES = [
    (["kafka", "up", "--port", "70000"], "--port"),
    (["kafka", "status", "--port", "0"], "--port"),
    (["bench", "pipeline", "--port", "65535"], "--port"),
    (["bench", "sim", "--gpus", "0"], "--gpus"),
    (["bench", "sim", "--policy", "fastest", "-n", "10"], "unknown policy 'fastest'"),
    (["audit", "x", "--since", "yesterday"], "--since 'yesterday'"),
    (["replay", "--since", "2h", "--until", "3h"], "is after --until"),
    (["replay", "--policy", "fastest", "--from-file", "-"], "unknown policy"),
    (["replay", "--from-file", "a", "--file", "b"], "--from-file once"),
    (["worker", "--gpu", "gpu-9"], "unknown GPU 'gpu-9'"),
    (["admission", "--loglevel", "loud"], "--loglevel"),
    (["admission", "--metrics-port", "-1"], "--metrics-port"),
    (["submit", "--tenant", "rag", "--model", "no-such-model", "--prompt-tokens", "1",
      "--max-tokens", "1"], "unknown_model"),
    (["submit", "--tenant", "Rag!", "--model", "m", "--prompt-tokens", "1",
      "--max-tokens", "1"], PATTERN),
    (["submit", "--tenant", "rag"], "Missing option"),
    (["schema", "Nope"], "unknown message 'Nope'"),
    (["sim", "no-such-scenario"], "no such scenario"),
    (["experiments", "nope"], "unknown nope"),
    (["demo", "--scenario", "/nonexistent/scenario.yaml"], "no such scenario"),
    (["topics", "bogus"], "No such command 'bogus'"),
    (["nosuch"], "No such command 'nosuch'"),
]  # fmt: skip


@pytest.mark.parametrize(("args", "needle"), BAD_VALUES, ids=lambda a: " ".join(a)
                         if isinstance(a, list) else "")  # fmt: skip
def test_bad_values_are_exit_2_and_one_line(args: list[str], needle: str) -> None:
    res = runner.invoke(app, args)
    err = _check(res, ExitCode.USAGE, needle)
    assert len(err.strip().splitlines()) == 1, err
    assert "╭" not in err  # no rich error panel


def test_missing_input_files_are_exit_3(tmp_path: Path) -> None:
    for args in (["audit", "x", "--from-file", str(tmp_path / "none.jsonl")],
                 ["replay", "--from-file", str(tmp_path / "none.jsonl")]):  # fmt: skip
        _check(runner.invoke(app, args), ExitCode.UNAVAILABLE, "cannot read")


def test_an_unwritable_demo_out_dir_is_exit_2(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    res = runner.invoke(app, ["demo", "--out", str(blocker / "sub")])  # before any broker
    _check(res, ExitCode.USAGE, "--out")


def test_kafka_up_on_a_port_held_by_something_else_leaves_no_data_dir(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        data = tmp_path / "kafka-data"
        res = runner.invoke(app, ["kafka", "up", "--port", str(port), "--data-dir", str(data)])
    err = _check(res, ExitCode.FAILED, "in use")
    assert len(err.strip().splitlines()) == 1
    assert not data.exists()


# --------------------------------------------------------------------------- --json errors


@pytest.mark.parametrize("args", [
    ["audit", "x", "--json", "--since", "nonsense"],
    ["replay", "--json", "--since", "nonsense"],
    ["bench", "sim", "--json", "--policy", "fastest", "-n", "10"],
    ["config", "check", "--json", "/nonexistent.yaml"],
    ["kafka", "status", "--json", "--port", "0"],
])  # fmt: skip
def test_json_errors_are_a_json_object_on_stdout(args: list[str]) -> None:
    res = runner.invoke(app, args)
    assert res.exit_code == ExitCode.USAGE
    body = json.loads(res.stdout)
    assert body["code"] == ExitCode.USAGE and body["error"]


# --------------------------------------------------------------------------- datadir


def test_admission_datadir_parents_are_created(tmp_path: Path) -> None:
    made = prepare_datadir(str(tmp_path / "var" / "deep" / "admission"))
    assert made.is_dir()


def test_an_unusable_datadir_is_one_line(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    data = _example()
    data["admission"] = {"datadir": str(blocker / "admission")}
    cfg = _write(tmp_path, "c.yaml", data)
    res = runner.invoke(app, ["admission", "-c", str(cfg), "-b", NOWHERE])
    err = _check(res, ExitCode.USAGE, "admission.datadir", "cannot create it")
    assert len(err.strip().splitlines()) == 1


# --------------------------------------------------------------------------- version, help


def test_version() -> None:
    res = runner.invoke(app, ["--version"])
    assert res.exit_code == 0 and re.fullmatch(r"triage \S+\n", res.stdout)


def _help(args: list[str]) -> str:
    res = runner.invoke(app, [*args, "--help"], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    return str(res.stdout)


HELP_PAGES = [[], ["kafka", "up"], ["kafka", "status"], ["topics", "create"], ["bench"],
              ["bench", "pipeline"], ["admission"], ["worker"], ["submit"], ["audit"],
              ["replay"], ["demo"], ["config", "check"], ["schema"]]  # fmt: skip


@pytest.mark.parametrize("args", HELP_PAGES, ids=lambda a: " ".join(a) or "root")
def test_help_has_no_eaten_brackets_or_bool_metavar(args: list[str]) -> None:
    text = _help(args)
    assert "<bool>" not in text
    assert not re.search(r"\w \.(\s|$)", text), "a ' .' left where markup ate a [...]"


def test_kafka_commands_take_config_and_bootstrap() -> None:
    for args in (["admission"], ["worker"], ["submit"], ["audit"], ["replay"],
                 ["topics", "create"], ["topics", "list"]):  # fmt: skip
        text = _help(args)
        assert "--config" in text and "-c" in text, args
        assert "--bootstrap" in text and "-b" in text, args
    for args in (["bench", "pipeline"], ["demo"]):
        text = _help(args)
        assert "--bootstrap" in text and "--port" in text, args
    assert "--file" not in _help(["replay"]).replace("--from-file", ""), "hidden alias shown"
    assert "Benchmarks" in _help(["bench"])


# --------------------------------------------------------------------------- exit codes


def test_exit_codes_are_documented_as_the_code_defines_them() -> None:
    doc = DOCS.read_text()
    section = doc[doc.index("## Exit codes"):]
    section = section[: section.index("\n## ", 3)]
    rows = dict(re.findall(r"^\| `(\d+)` \| (\w+) \|", section, flags=re.M))
    assert {int(k): v for k, v in rows.items()} == {int(c): c.name for c in ExitCode}


# --------------------------------------------------------------------------- processes


def _triage(*args: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "triage", *args], capture_output=True,
                          text=True, timeout=timeout, check=False)  # fmt: skip


@pytest.mark.parametrize("args", [
    ["audit", "some-id", "-b", NOWHERE],
    ["submit", "--tenant", "rag", "--model", "llama-3.1-8b", "--prompt-tokens", "10",
     "--max-tokens", "10", "-b", NOWHERE],
    ["topics", "list", "-b", NOWHERE],
])  # fmt: skip
def test_unreachable_broker_is_one_line_and_exit_3_without_librdkafka_spam(
    args: list[str],
) -> None:
    res = _triage(*args)
    assert res.returncode == ExitCode.UNAVAILABLE, res.stderr
    lines = res.stderr.strip().splitlines()
    assert lines == [lines[0]] and f"no Kafka broker answers on {NOWHERE}" in lines[0], lines
    assert "%3|" not in res.stderr and "FAIL" not in res.stderr


@pytest.mark.parametrize("args", [
    ["admission"], ["topics", "create"], ["replay", "--since", "1h"], ["demo"],
    ["bench", "pipeline", "--json"],
], ids=lambda a: " ".join(a))  # fmt: skip
def test_every_kafka_command_refuses_an_unreachable_broker_with_exit_3(
    args: list[str], tmp_path: Path
) -> None:
    extra = ["--out", str(tmp_path / "demo")] if args == ["demo"] else []
    res = runner.invoke(app, [*args, *extra, "-b", NOWHERE])
    err = _check(res, ExitCode.UNAVAILABLE, f"no Kafka broker answers on {NOWHERE}")
    assert len(err.strip().splitlines()) == 1, err
    if "--json" in args:
        assert json.loads(res.stdout)["code"] == ExitCode.UNAVAILABLE
    assert not (tmp_path / "demo").exists(), "nothing written for a run that cannot start"


def test_piped_errors_are_not_wrapped_and_keep_brackets(configs: dict[str, Path]) -> None:
    res = _triage("config", "check", str(configs["bad_name"]))
    assert res.returncode == ExitCode.USAGE
    line = next(ln for ln in res.stderr.splitlines() if "name:" in ln)
    assert PATTERN in line and len(line) > 80
    assert "Traceback" not in res.stderr


def test_entry_point_turns_click_errors_into_one_line() -> None:
    res = _triage("kafka", "up", "--port", "70000")
    assert res.returncode == ExitCode.USAGE
    assert len(res.stderr.strip().splitlines()) == 1 and "--port" in res.stderr
    assert "Exception" not in res.stderr and "java" not in res.stderr.lower()


# --------------------------------------------------------------------------- librdkafka


def test_librdkafka_lines_are_logged_once_per_cause(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger=LIBRDKAFKA_LOGGER)
    fresh = LibrdkafkaLog(logging.getLogger(LIBRDKAFKA_LOGGER))  # not the process-wide one
    consumer = make_consumer(NOWHERE, "t-cli-errors", **{
        "reconnect.backoff.ms": 10, "reconnect.backoff.max.ms": 50, "logger": fresh})
    try:
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline:
            consumer.poll(0.2)
    finally:
        consumer.close()
    fails = [r for r in caplog.records if r.name == LIBRDKAFKA_LOGGER and "FAIL" in r.message]
    assert len(fails) == 1, [r.message for r in fails]
    assert fails[0].levelno == logging.WARNING and "Connection refused" in fails[0].message


def test_dedupe_key_ignores_timings_and_counts_repeats() -> None:
    records: list[str] = []

    class Sink(logging.Logger):
        def warning(self, msg: object, *args: object, **kw: Any) -> None:
            records.append(str(msg) % args)

    log = LibrdkafkaLog(Sink("sink"), window_s=0.2)
    for ms in (0, 3, 12):
        log.log(40, "%s [%s] %s", "FAIL", "c-1", f"[thrd:x]: x: Connect failed: refused "
                f"(after {ms}ms in state CONNECT, {ms} identical error(s) suppressed)")
    log.log(40, "%s [%s] %s", "FAIL", "c-3", "[thrd:y]: x: Connect failed: refused (after "
            "0ms in state CONNECT)")  # fmt: skip
    log.log(40, "%s [%s] %s", "FAIL", "c-2", "x: Connect failed: unknown host")
    log.log(6, "%s [%s] %s", "CONF", "c-1", "informational")
    assert len(records) == 2
    time.sleep(0.25)
    log.log(40, "%s [%s] %s", "FAIL", "c-1", "x: Connect failed: refused (after 1ms in "
            "state CONNECT)")  # fmt: skip
    assert len(records) == 3 and "repeated 3 times" in records[-1]
