"""The bench's child processes: started into one fleet, measured by their CPU time, and
stopped by pid whatever ends the run (an error, a failed start, SIGINT or SIGTERM)."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from triage.demo.processes import ChildProcess

log = logging.getLogger(__name__)

STOP_S = 20.0  # SIGTERM, then SIGKILL for whatever still runs after this
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_TICKS = os.sysconf("SC_CLK_TCK")


class BenchInterrupted(BaseException):  # like KeyboardInterrupt, not an error
    """The bench got SIGINT or SIGTERM: unwinds the run so its `finally` stops children."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class BenchStartError(RuntimeError):
    """A child (the admission app, a worker, a ceiling app) did not come up."""


@contextlib.contextmanager
def signals_unwind() -> Iterator[None]:
    """SIGINT and SIGTERM raise BenchInterrupted in the main thread while the run lasts
    (Python's default for SIGTERM exits at once and skips every `finally`)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def raise_(signum: int, _frame: object) -> None:
        raise BenchInterrupted(signum)

    old = {s: signal.signal(s, raise_) for s in _STOP_SIGNALS}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


class Fleet:
    """Every child process of one run. `stop_all` runs with SIGINT/SIGTERM held back, so a
    second Ctrl-C cannot cut the cleanup short; they are delivered when it is done."""

    def __init__(self) -> None:
        self.children: list[ChildProcess] = []

    def start(self, child: ChildProcess) -> ChildProcess:
        self.children.append(child)  # before start(): a signal in between still stops it
        child.start()
        return child

    def pids(self) -> list[int]:
        return [c.proc.pid for c in self.children if c.proc is not None]

    def stop(self, *children: ChildProcess, timeout_s: float = STOP_S) -> None:
        """SIGTERM to all of them at once, wait, then SIGKILL those still running."""
        masked = threading.current_thread() is threading.main_thread()
        if masked:
            signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
        try:
            _stop(list(children), timeout_s)
        finally:
            for c in children:
                if c in self.children and not c.alive():
                    self.children.remove(c)
            if masked:
                signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS)

    def stop_all(self, timeout_s: float = STOP_S) -> None:
        self.stop(*self.children, timeout_s=timeout_s)


def _stop(children: list[ChildProcess], timeout_s: float) -> None:
    live = [c for c in children if c.alive()]
    for c in live:
        assert c.proc is not None
        with contextlib.suppress(ProcessLookupError):
            c.proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    for c in live:
        assert c.proc is not None
        try:
            c.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except Exception:  # subprocess.TimeoutExpired: it ignored SIGTERM
            log.warning("%s (pid %d) ignored SIGTERM for %.0f s: killing it", c.name,
                        c.proc.pid, timeout_s)
            with contextlib.suppress(ProcessLookupError):
                c.proc.kill()
            c.proc.wait(timeout=10)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process, all its threads (/proc/PID/stat)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2:].split()  # the name may hold spaces
    return (int(fields[11]) + int(fields[12])) / _TICKS  # utime, stime (fields 14, 15)
