"""LapseGuard (triage/streams/lapse.py): a freeze longer than half the session timeout is
checked against the broker before anything more is decided; a lapsed member decides
nothing more (the app exits it), and a check that a rebalance overtook changes nothing."""

from __future__ import annotations

import asyncio

from triage.streams.lapse import LapseGuard, SendCheck


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def _guard(answers: list[bool], clock: Clock) -> tuple[LapseGuard, list[int]]:
    lapses: list[int] = []

    async def still_member() -> bool:
        await asyncio.sleep(0)
        return answers.pop(0)

    return LapseGuard(6.0, still_member, lambda: lapses.append(1), clock), lapses


def test_short_gaps_decide_without_asking_the_broker() -> None:
    clock = Clock()
    guard, lapses = _guard([], clock)

    async def run() -> list[bool]:
        out = []
        for _ in range(5):
            clock.t += 2.9  # under half the 6 s session timeout
            out.append(await guard.deciding())
        return out

    assert asyncio.run(run()) == [True] * 5
    assert guard.checks == 0 and not lapses


def test_a_freeze_is_checked_once_and_a_member_carries_on() -> None:
    clock = Clock()
    guard, lapses = _guard([True], clock)

    async def run() -> list[bool]:
        clock.t += 20.0  # frozen
        # the timer, an agent and the committer all wake at once: one check for all
        return list(await asyncio.gather(guard.deciding(), guard.deciding(),
                                         guard.deciding()))

    assert asyncio.run(run()) == [True, True, True]
    assert guard.checks == 1 and not lapses and not guard.lapsed


def test_a_lapsed_member_decides_nothing_more() -> None:
    clock = Clock()
    guard, lapses = _guard([False], clock)

    async def run() -> list[bool]:
        clock.t += 20.0
        out = [await guard.deciding(), await guard.deciding()]
        clock.t += 1.0
        out.append(await guard.deciding())  # still lapsed: no second check
        return out

    assert asyncio.run(run()) == [False, False, False]
    assert lapses == [1] and guard.checks == 1


def test_a_check_that_fails_carries_on() -> None:
    """The broker cannot be asked (say it is restarting): the process carries on, as it
    would have without the check; the broker still fences a stale member's commits."""
    clock = Clock()
    lapses: list[int] = []

    async def still_member() -> bool:
        raise RuntimeError("broker unreachable")

    guard = LapseGuard(6.0, still_member, lambda: lapses.append(1), clock)

    async def run() -> bool:
        clock.t += 20.0
        return await guard.deciding()

    assert asyncio.run(run()) is True
    assert not lapses


def test_a_check_overtaken_by_a_rebalance_drops_nothing() -> None:
    """The consumer rejoined and the shards were rebuilt while the broker was asked about
    the old member id: the answer (not a member) is stale and must not drop them."""
    clock = Clock()
    lapses: list[int] = []
    guard: LapseGuard

    async def still_member() -> bool:
        guard.rebalanced()  # completes while the question is in flight
        return False

    guard = LapseGuard(6.0, still_member, lambda: lapses.append(1), clock)

    async def run() -> bool:
        clock.t += 20.0
        return await guard.deciding()

    assert asyncio.run(run()) is True
    assert not lapses and not guard.lapsed


def _send_check(clock: Clock, listed: set[str], asked: list[str],
                member_id: str | None = "m-1") -> SendCheck:
    def is_member(member: str) -> bool:
        asked.append(member)
        if member == "unreachable":
            raise RuntimeError("broker unreachable")
        return member in listed

    return SendCheck(member_id, clock(), 3.0, is_member, clock)


def test_a_batch_sent_soon_after_the_check_asks_nothing() -> None:
    clock, asked = Clock(), []
    check = _send_check(clock, set(), asked)
    clock.t += 2.9  # within half the session timeout: the marks were written promptly
    assert check() is True and asked == []


def test_a_freeze_before_the_marks_asks_the_broker_with_the_member_id_held_before_it() -> None:
    """Frozen between the check and the marks: the group removed this member (a takeover
    re-sent the batch), so the thread must not commit it; still listed, it goes on."""
    clock, asked = Clock(), []
    gone = _send_check(clock, {"m-2"}, asked)  # rejoined as m-2 since: m-1 is gone
    kept = _send_check(clock, {"m-1"}, asked)
    clock.t += 20.0
    assert gone() is False and kept() is True
    assert asked == ["m-1", "m-1"]


def test_a_send_check_that_cannot_tell_carries_on() -> None:
    clock, asked = Clock(), []
    unknown = _send_check(clock, set(), asked, member_id=None)  # no consumer yet
    unreachable = _send_check(clock, set(), asked, member_id="unreachable")
    clock.t += 20.0
    assert unknown() is True and unreachable() is True
    assert asked == ["unreachable"]
