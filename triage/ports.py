"""Free loopback ports, taken at run time, so two runs on one machine do not collide
(the demo, the bench, the chaos suite and the tests all start processes that listen).

A port is free when we probe it but nothing holds it until the child binds it. Two
things could take it in between, and both are ruled out:

- this process handing it out again: every port handed out is remembered for the life
  of the process and never handed out twice;
- the kernel giving it to an outgoing connection as its local port: ports are drawn
  below the kernel's ephemeral range (`net.ipv4.ip_local_port_range`), which it never
  assigns on its own. A worker picked from that range once failed to bind its metrics
  port (EADDRINUSE) seconds later, after the broker's clients had opened dozens of
  connections."""

from __future__ import annotations

import random
import socket
import threading
from pathlib import Path

_handed_out: set[int] = set()
_lock = threading.Lock()
_random = random.SystemRandom()  # two processes must not draw the same sequence
LOWEST = 20000  # below: ports services commonly listen on
_EPHEMERAL = Path("/proc/sys/net/ipv4/ip_local_port_range")


class NoFreePortsError(RuntimeError):
    """No run of free loopback ports was found."""


def free_port() -> int:
    """A loopback port free now and not handed out before in this process."""
    return free_run(1)


def free_run(n: int) -> int:
    """A port p with p+1 ... p+n-1 free too (workers listen on consecutive ports)."""
    with _lock:
        for _ in range(200):
            base = _candidate(n)
            run = range(base, base + n)
            if base + n > 65535 or any(p in _handed_out for p in run):
                continue
            if all(_free(p) for p in run):
                _handed_out.update(run)
                return base
    raise NoFreePortsError(f"no run of {n} free ports on 127.0.0.1")


def ephemeral_low() -> int:
    """The lowest port the kernel assigns to outgoing connections (32768 if unknown)."""
    try:
        return int(_EPHEMERAL.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _candidate(n: int = 1) -> int:
    """The first of n ports all below the ephemeral range (a run starting at its last
    port reached into it: 1 pick in ~13,000 here); the kernel's own pick if that range
    is tiny."""
    high = ephemeral_low()
    if high - LOWEST < 1000:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return int(s.getsockname()[1])
    return _random.randrange(LOWEST, high - n + 1)


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True
