"""Adding a topic to a running Faust app: what faust-streaming 0.15.3 and aiokafka 0.14
get wrong, and the smallest fixes that make it work (docs/reliability.md, "Config
changes", tells the story; tests/e2e/test_robust_input.py proves it).

The class-level patches are installed once per process and are idempotent.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Iterable
from typing import Any

from faust.transport.drivers import aiokafka as faust_aiokafka

log = logging.getLogger(__name__)

# Faust's conductor waits this long after a subscription change before it resubscribes
# (45 s by default, to batch agents restarting together); ours come one timer at a time.
RESUBSCRIBE_WAIT_S = 1.0
RESUBSCRIBE_AGAIN_S = 10.0  # a new topic still not assigned after this is flagged again


def extend_subscription(app: Any, declared: Any, reading: set[str], topics: list[str]) -> None:
    """Add `topics` to the agent that reads the topics `reading` (declared as `declared`).
    The agent iterates a clone of the declared topic, made when it started, and the clone
    is what the conductor subscribes: setting `topics` on the declared one alone never
    reached it (new tenants' topics were never read). Clones keep no reference to their
    original, so every channel that reads only those topics is updated."""
    conductor = app.topics
    readers = [c for c in conductor if c.topics and set(c.topics) <= reading]
    for channel in [declared, *readers]:
        channel.topics = [*channel.topics, *(t for t in topics if t not in channel.topics)]
    conductor._resubscribe_sleep_lock_seconds = RESUBSCRIBE_WAIT_S
    conductor._flag_changes()


def flag_again_if_unassigned(app: Any, unassigned_since: dict[str, float]) -> None:
    """The conductor drops a subscription change flagged while a rebalance runs: a new
    topic still not assigned after RESUBSCRIBE_AGAIN_S is flagged again."""
    if not unassigned_since:
        return
    assigned = {tp.topic for tp in app.consumer.assignment()}
    for t in [t for t in unassigned_since if t in assigned]:
        del unassigned_since[t]
    now = time.monotonic()
    late = sorted(t for t, since in unassigned_since.items() if now - since > RESUBSCRIBE_AGAIN_S)
    if late and not app.rebalancing:
        log.warning("topics subscribed but not assigned, resubscribing: %s", ", ".join(late))
        unassigned_since.update((t, now) for t in late)
        app.topics._flag_changes()


def commit_against_one_assignment() -> None:
    """Faust's `AIOKafkaConsumerThread._commit` keeps the offsets of assigned partitions
    with `tp in self.assignment()` per offset, and `assignment()` builds a new set of
    every assigned partition each time: O(partitions x offsets) per commit, 8% of the
    admission process's samples at 1,000 tenants (docs/architecture.md). The same
    method, with the assignment taken once per commit; otherwise line for line Faust
    0.15's (a failed commit still crashes the consumer as Faust's does)."""
    cls: Any = faust_aiokafka.AIOKafkaConsumerThread
    if getattr(cls, "_triage_commit_once_assigned", False):
        return
    m: Any = faust_aiokafka

    async def _commit(self: Any, offsets: Any) -> bool:
        consumer = self._ensure_consumer()
        now = time.monotonic()
        assigned = self.assignment()
        commitable = {tp: offset for tp, offset in offsets.items() if tp in assigned}
        try:
            aiokafka_offsets = {
                m.ensure_aiokafka_TP(tp): m.OffsetAndMetadata(offset, "")
                for tp, offset in commitable.items()
            }
            self.tp_last_committed_at.update(dict.fromkeys(commitable, now))
            await consumer.commit(aiokafka_offsets)
        except m.CommitFailedError as exc:
            if "already rebalanced" in str(exc):
                return False
            self.log.exception("Committing raised exception: %r", exc)
            await self.crash(exc)
            return False
        except Exception as exc:  # IllegalStateError included, as in Faust
            self.log.exception("Got exception: %r\nCurrent assignment: %r", exc,
                               self.assignment())
            await self.crash(exc)
            return False
        return True

    cls._commit = _commit
    cls._triage_commit_once_assigned = _commit  # kept: wrappers installed later call it


def current_assignment(thread: Any) -> Any:
    """aiokafka's assignment as Faust's consumer thread holds it now, read once (the
    thread replaces it on a resubscription); None while a rebalance is under way."""
    sub = thread._ensure_consumer()._subscription.subscription
    return None if sub is None else sub.assignment


def skip_commits_while_resubscribing() -> None:
    """A resubscription leaves aiokafka without an assignment until the rebalance ends; a
    commit in that window raises IllegalStateError, which Faust treats as fatal (the app
    exited; faust-streaming issue #94 is the same race). Skip the commit instead: the next
    one, after the rebalance, commits the same offsets."""
    cls: Any = faust_aiokafka.AIOKafkaConsumerThread
    if getattr(cls, "_triage_commit_after_resubscribe", False):
        return
    commit = cls._commit

    async def _commit(self: Any, offsets: Any) -> bool:
        if current_assignment(self) is None:  # checked on the consumer's own loop
            log.info("commit skipped while the consumer group rebalances")
            return False
        return bool(await commit(self, offsets))

    cls._commit = _commit
    cls._triage_commit_after_resubscribe = True


def highwater_while_resubscribing() -> None:
    """Faust's getmany asks the consumer for each record's partition highwater, and
    aiokafka asserts that the partition is assigned. A resubscription on the consumer's
    thread (a tenant added or removed) replaces the assignment at once, while the main
    loop is still delivering the batch fetched before it: the assertion then crashed the
    app (CI, the chaos `config` scenario; faust-streaming PRs #506/#507 met the same race).
    The highwater is only a lag figure and aiokafka already answers None when it is
    unknown, so a partition no longer assigned answers None too. The assignment is read
    once, so the thread cannot replace it between the check and the read."""
    cls: Any = faust_aiokafka.AIOKafkaConsumerThread
    if getattr(cls, "_triage_highwater_unassigned", False):
        return
    highwater = cls.highwater

    def highwater_or_none(self: Any, tp: Any) -> int | None:
        if self.consumer.in_transaction:  # Faust's own path (not ours): unchanged
            return highwater(self, tp)  # type: ignore[no-any-return]
        assignment = current_assignment(self)
        state = None if assignment is None else assignment.state_value(tp)
        return None if state is None else state.highwater

    cls.highwater = highwater_or_none
    cls._triage_highwater_unassigned = True


def read_fresh_partitions_from_the_start(pattern: str) -> None:
    """After every rebalance Faust drops the records it fetched before its streams resumed
    and rewinds each partition to its committed offset. aiokafka's seek_to_committed skips
    a partition that has none (or 0), so its dropped records were lost: a new tenant's
    first requests, and a fresh app's. Partitions of topics matching `pattern` without a
    committed offset are sought to their beginning, as `auto.offset.reset=earliest`
    promises."""
    cls: Any = faust_aiokafka.AIOKafkaConsumerThread
    patterns: set[str] = cls.__dict__.get("_triage_fresh_patterns", set())
    patterns.add(pattern)
    if "_triage_fresh_patterns" in cls.__dict__:
        return
    cls._triage_fresh_patterns = patterns
    seek = cls.seek_to_committed

    async def seek_to_committed(self: Any) -> Any:
        offsets = await seek(self)
        fresh = [tp for tp, off in offsets.items() if not off and _matches(tp.topic, patterns)]
        if fresh:
            await self.call_thread(self._ensure_consumer().seek_to_beginning, *fresh)
            log.info("read from their beginning (no committed offset): %s",
                     ", ".join(sorted(tp.topic for tp in fresh)))
        return offsets

    cls.seek_to_committed = seek_to_committed


def _matches(topic: str, patterns: Iterable[str]) -> bool:
    return any(re.match(p, topic) for p in patterns)
