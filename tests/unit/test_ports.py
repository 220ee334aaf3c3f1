"""Free ports for child processes: free when probed, consecutive for a run, and never
the same port twice in one process (two listeners picked a moment apart collided in CI)."""

from __future__ import annotations

import socket

import pytest

from triage import ports
from triage.ports import free_port, free_run


def test_a_run_is_consecutive_free_ports() -> None:
    base = free_run(3)
    for port in range(base, base + 3):
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_no_port_is_handed_out_twice_even_when_the_kernel_repeats(
        monkeypatch: pytest.MonkeyPatch) -> None:
    first = free_port()
    offered = iter([first, first - 1, first + 40])  # the kernel offers repeats
    monkeypatch.setattr(ports, "_kernel_port", lambda: next(offered))
    got = free_run(2)
    assert got == first + 40  # runs from first and first - 1 both hold first, already out
    assert first not in range(got, got + 2)


def test_many_picks_never_overlap() -> None:
    taken: list[int] = []
    for _ in range(30):
        base = free_run(4)
        taken.extend(range(base, base + 4))
    taken.extend(free_port() for _ in range(30))
    assert len(taken) == len(set(taken))
