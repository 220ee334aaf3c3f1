"""Free loopback ports, taken at run time, so two runs on one machine do not collide
(the demo, the bench, the chaos suite and the tests all start processes that listen)."""

from __future__ import annotations

import socket


class NoFreePortsError(RuntimeError):
    """No run of free loopback ports was found."""


def free_port() -> int:
    """A loopback port free now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def free_run(n: int) -> int:
    """A port p with p+1 ... p+n-1 free too (workers listen on consecutive ports)."""
    for _ in range(200):
        base = free_port()
        if base + n > 65535:
            continue
        if all(_free(base + i) for i in range(1, n)):
            return base
    raise NoFreePortsError(f"no run of {n} free ports on 127.0.0.1")


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True
