"""Child processes of the demo and benchmarks: started with a log file, stopped cleanly."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from triage.lifeline import child_env

log = logging.getLogger(__name__)


# The directory this process imported `triage` from: a child imports the same code.
_TREE = str(Path(__file__).resolve().parents[2])


def same_code_env(env: dict[str, str]) -> dict[str, str]:
    """`env` with this process's tree first on PYTHONPATH. Children start with `-P`, so
    their working directory is not put ahead of it: with `-m` alone, a bench run from one
    checkout with PYTHONPATH naming another measured the first checkout's code in every
    child (docs/architecture.md, "Measuring two builds")."""
    if Path(_TREE).name in ("site-packages", "dist-packages"):
        return env  # an installed package: the child finds the same one there
    path = env.get("PYTHONPATH")
    return {**env, "PYTHONPATH": _TREE if not path else f"{_TREE}{os.pathsep}{path}"}


class ChildProcess:
    """One `python -P -m triage ...` process running this process's own code (same_code_env),
    with its output in a log file, in a session of its own, stopped with SIGTERM should
    this process die without stopping it (triage/lifeline.py)."""

    def __init__(self, name: str, args: list[str], log_path: Path) -> None:
        self.name = name
        self.args = args
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = same_code_env({**os.environ, "PYTHONUNBUFFERED": "1", **child_env()})
        with self.log_path.open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-P", "-m", "triage", *self.args],
                stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True,
            )
        log.info("started %s (pid %d), log %s", self.name, self.proc.pid, self.log_path)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout_s: float = 30.0) -> int | None:
        """SIGTERM, wait, then SIGKILL. Returns the exit code."""
        p = self.proc
        if p is None:
            return None
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                log.warning("%s ignored SIGTERM for %.0f s: killing it", self.name, timeout_s)
                p.kill()
                p.wait(timeout=10)
        return p.returncode

    def tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(text[-lines:])


def scrape(url: str, timeout_s: float = 2.0) -> str | None:
    """The text of a Prometheus endpoint, or None when it does not answer."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:  # a local URL
            return str(resp.read().decode())
    except OSError:
        return None


def wait_for_metric(
    url: str, line_prefix: str, *, timeout_s: float, proc: ChildProcess | None = None
) -> bool:
    """Poll a metrics endpoint until a line starting with `line_prefix` shows up."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and not proc.alive():
            return False
        text = scrape(url)
        if text is not None and any(line.startswith(line_prefix) for line in text.splitlines()):
            return True
        time.sleep(0.5)
    return False
