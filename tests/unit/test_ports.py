"""Free ports for child processes: free when probed, consecutive for a run, and never
the same port twice in one process (two listeners picked a moment apart collided in CI),
and never one the kernel could give an outgoing connection meanwhile."""

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
    # a run nothing holds, for the third offer: earlier tests of this process handed
    # out random ports, and one once sat at first + 40 (a CI failure)
    fresh = next(q for q in range(first + 40, first + 1000)
                 if not {q, q + 1} & ports._handed_out and ports._free(q) and ports._free(q + 1))
    offered = iter([first, first - 1, fresh])  # the kernel offers repeats
    monkeypatch.setattr(ports, "_candidate", lambda n=1: next(offered))
    got = free_run(2)
    assert got == fresh  # runs from first and first - 1 both hold first, already out
    assert first not in range(got, got + 2)


def test_many_picks_never_overlap() -> None:
    taken: list[int] = []
    for _ in range(30):
        base = free_run(4)
        taken.extend(range(base, base + 4))
    taken.extend(free_port() for _ in range(30))
    assert len(taken) == len(set(taken))


def test_ports_are_drawn_below_the_kernels_ephemeral_range() -> None:
    low = ports.ephemeral_low()
    picks = [free_run(2) for _ in range(50)]
    # a whole run lies below, even one drawn at the range's last port (a CI failure)
    assert all(ports._candidate(2) + 1 < low for _ in range(20_000)) or low - ports.LOWEST < 1000
    if low - ports.LOWEST >= 1000:
        assert all(p >= ports.LOWEST and p + 1 < low for p in picks)
    assert len(set(picks)) == len(picks)


def test_a_port_something_listens_on_is_never_handed_out(
        monkeypatch: pytest.MonkeyPatch) -> None:
    draw = ports._candidate
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        offered = iter([taken, taken])
        monkeypatch.setattr(ports, "_candidate", lambda n=1: next(offered, None) or draw())
        got = free_port()
        assert got != taken
        assert next(offered, None) is None  # both offers of the busy port were turned down
