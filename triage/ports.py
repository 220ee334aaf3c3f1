"""Free loopback ports, taken at run time, so two runs on one machine do not collide
(the demo, the bench, the chaos suite and the tests all start processes that listen).

A port is free when we probe it but nothing holds it until the child binds it, so two
probes in one run could return the same port (the kernel may hand a just-closed
ephemeral port out again). Every port handed out is remembered for the life of the
process and never handed out twice."""

from __future__ import annotations

import socket
import threading

_handed_out: set[int] = set()
_lock = threading.Lock()


class NoFreePortsError(RuntimeError):
    """No run of free loopback ports was found."""


def free_port() -> int:
    """A loopback port free now and not handed out before in this process."""
    return free_run(1)


def free_run(n: int) -> int:
    """A port p with p+1 ... p+n-1 free too (workers listen on consecutive ports)."""
    with _lock:
        for _ in range(200):
            base = _kernel_port()
            run = range(base, base + n)
            if base + n > 65535 or any(p in _handed_out for p in run):
                continue
            if all(_free(p) for p in run[1:]):
                _handed_out.update(run)
                return base
    raise NoFreePortsError(f"no run of {n} free ports on 127.0.0.1")


def _kernel_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True
