"""A child process of ours dies with the process that started it.

The demo, the benchmarks and the chaos suite start their processes in new sessions
(so a Ctrl-C in the terminal reaches only the parent, which then stops them in order).
That also means a parent killed with SIGKILL, which runs no cleanup, left every child
running: an admission app and workers holding ports and the broker's consumer groups
until someone found them. So the parent names itself in `TRIAGE_DIE_WITH` and the child,
first thing, asks Linux to send it SIGTERM when that parent goes
(`prctl(PR_SET_PDEATHSIG)`); SIGTERM is every command's graceful stop. Elsewhere (no
prctl) nothing changes.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading

ENV = "TRIAGE_DIE_WITH"
_PR_SET_PDEATHSIG = 1


def child_env() -> dict[str, str]:
    """What a parent adds to a child's environment. Only from the main thread: Linux
    sends the signal when the *thread* that started the child ends, and a helper thread
    ending would stop a child that should live on."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    return {ENV: str(os.getpid())}


def die_with_parent() -> None:
    """In the child: SIGTERM when the parent named in TRIAGE_DIE_WITH dies; exit at
    once if it is already gone (the signal would never come)."""
    parent = os.environ.pop(ENV, None)  # not inherited by this process's own children
    if parent is None or not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0) != 0:
            return
    except (OSError, AttributeError):
        return
    if str(os.getppid()) != parent:
        sys.stderr.write(f"triage: the process that started this one (pid {parent}) is "
                         "gone; exiting\n")
        raise SystemExit(1)
