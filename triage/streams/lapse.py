"""A process that was frozen past its session timeout decides nothing until the group
has settled who owns what (docs/reliability.md, "A frozen owner").

Frozen (SIGSTOP, a stalled VM, a long swap) for longer than
`admission.session_timeout_s`, an instance loses its shards to another member without
knowing it. When it wakes, its event loop hands it records it fetched before the freeze
and its committer holds outputs staged before it: deciding them with its in-memory
state, or sending them, answers requests twice (the new owner has replayed them from
the tables). Offsets it commits are refused by the broker (its generation is stale), so
what it skips is read again by the owner; what it sends is not undone.

So every event and every commit first asks `LapseGuard.deciding`: a gap in the process's
own clock longer than half the session timeout (the event loop did not run) is checked
against the broker (is this member still in the group, under the same id?). Still a
member: carry on. Not: the process exits at once (committer.py, `exit_as_zombie`),
deciding and sending nothing more, as a fenced one does; restarted, it rejoins and
Faust recovers its tables from the changelogs, as after kill -9. (Dropping the shards'
state and rebuilding them from the local tables when the group handed them back was
tried first: the local tables then lacked some of the other owner's writes, and a
finished request was decided again in 1 of 6 runs of the zombie test.)
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from triage.kafka.clients import make_admin

log = logging.getLogger(__name__)

GAP_SHARE = 0.5  # a gap of this share of the session timeout is checked


class LapseGuard:
    """Watches the process's own clock for freezes; see the module docstring."""

    def __init__(self, session_timeout_s: float, still_member: Callable[[], Awaitable[bool]],
                 on_lapse: Callable[[], None], clock: Callable[[], float] = time.monotonic,
                 ) -> None:
        self.gap_s = GAP_SHARE * session_timeout_s
        self._still_member = still_member
        self._on_lapse = on_lapse
        self._clock = clock
        self._last = clock()
        self._check: asyncio.Task[bool] | None = None
        self.lapsed = False  # confirmed (the app then exits)
        self._epoch = 0  # rebalances completed
        self.checks = 0  # gaps checked against the broker

    async def deciding(self) -> bool:
        """False when this process may not decide: its membership lapsed (and `on_lapse`,
        which in the app exits the process, has been called)."""
        if self.lapsed:
            return False
        now = self._clock()
        gap, self._last = now - self._last, now
        if self._check is None and gap > self.gap_s:
            self.checks += 1
            log.warning("the event loop did not run for %.1f s: checking that this instance "
                        "is still a member of its group before deciding more", gap)
            self._check = asyncio.ensure_future(self._confirm())
        if self._check is not None:
            return await asyncio.shield(self._check)
        return True

    async def _confirm(self) -> bool:
        epoch = self._epoch
        try:
            member = await self._still_member()
        except Exception as exc:  # cannot tell: carry on (the broker fences what it must)
            log.warning("could not check the group membership (%s): carrying on", exc)
            member = True
        if epoch != self._epoch:  # a rebalance completed meanwhile and rebuilt the shards
            member = True
        self._check = None
        self._last = self._clock()
        if not member:
            self.lapsed = True
            self._on_lapse()
        return member

    def rebalanced(self) -> None:
        """A rebalance completed: this process is a member again, with fresh shards."""
        self._epoch += 1
        self.lapsed = False
        self._last = self._clock()


@dataclass(frozen=True)
class SendCheck:
    """Made in the event loop as the committer hands a batch to the outbox's thread, right
    after the guard said this process may decide; asked by that thread once the batch's
    marks are on the broker (lanes.py, `TxnLane.publish_once`).

    Why: a freeze between the guard's check and the marks is not seen by either fence. A
    takeover during it finds no open transaction on the marks partition, so it fences
    nobody and re-sends the batch from the tables itself; the woken thread would then
    commit the same batch again (4 of 900 requests answered twice, once in CI). So when
    more than the guard's gap has passed since the check, the member id held then must
    still be listed by the broker. Once the marks are on the broker, a later takeover
    sees the transaction open and fences it, so no later question is needed. A check the
    broker cannot answer carries on, as the guard's does."""

    member_id: str | None
    since: float
    gap_s: float
    is_member: Callable[[str], bool]
    clock: Callable[[], float] = time.monotonic

    def __call__(self) -> bool:
        gap = self.clock() - self.since
        if not self.member_id or gap <= self.gap_s:
            return True
        log.warning("a batch reached the broker %.1f s after the last check that this "
                    "instance is a member of its group: checking again before committing", gap)
        try:
            return self.is_member(self.member_id)
        except Exception as exc:
            log.warning("could not check the group membership (%s): carrying on", exc)
            return True


def coordinator_member_id(app: Any) -> str | None:
    """This process's member id in its group as its Kafka consumer holds it ("" after
    the consumer reset it: the broker no longer knew it; None: no consumer yet)."""
    try:
        member = app.consumer._thread._consumer._coordinator.member_id
    except AttributeError:
        return None
    return member if isinstance(member, str) else None


def member_of_group(bootstrap: str, group: str, member_id: str | None) -> bool:
    """Does the broker list `member_id` in `group` now (blocking)?"""
    if not member_id:
        return False
    admin = make_admin(bootstrap)
    desc = admin.describe_consumer_groups([group])[group].result(timeout=10)
    return any(m.member_id == member_id for m in desc.members)


def missed_a_rebalance(generations: list[int], generation: int) -> bool:
    """Record `generation` (the group's, as a rebalance completes here) and say whether
    one completed without this process since the last: it was frozen or cut off past its
    session timeout, the group gave its partitions to others, and it got them back on
    rejoining. Its in-memory state for them is then stale: the tables (their changelogs
    replayed by Faust before this signal) hold what the others decided. Faust may signal
    once for two quick rebalances: that reads as a miss too, and costs a rebuild only."""
    missed = bool(generations) and generation > generations[-1] + 1
    generations.append(generation)
    del generations[:-2]
    return missed
