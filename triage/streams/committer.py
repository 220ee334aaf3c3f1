"""Commits the outbox's staged outputs and holds Faust's offset commits behind them
(docs/reliability.md, "Crash safety")."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Awaitable, Callable
from typing import NoReturn

import faust

from triage.streams.changelog import ChangelogLostError, ChangelogProducer
from triage.streams.health import Health
from triage.streams.outbox import (
    KafkaOutbox,
    Lane,
    OutboxFencedError,
    OutboxStoppedError,
    Output,
)

log = logging.getLogger(__name__)

CYCLE_S = 0.02  # how often staged outputs are committed (the latency a batch adds)
# A commit that took long waits proportionally longer before the next (at most
# MAX_CYCLE_S): a transaction costs a registration and an end marker per partition it
# wrote, and with 1,000 tenants each batch's replies touch hundreds of reply partitions.
# Committing every 20 ms then spent the app's CPU on transactions; spacing commits by
# their own cost keeps that overhead bounded (docs/architecture.md, "Commits spaced by their cost").
COMMIT_SPACING = 3.0
MAX_CYCLE_S = 0.1
# A batch whose replies touch at most this many partitions commits them with its work in
# one transaction while the reply lane is idle: with a few tenants a second transaction
# per batch only adds the broker's per-transaction work (lanes.py).
COMBINE_MAX_PARTITIONS = 16
SETTLE_POLL_S = 0.002  # between looks at the changelog's delivery reports while flushing


def combine(replies: list[Output], partitions_per_topic: int = 1) -> bool:
    """Whether these replies are few enough to ride with their batch's work: they touch
    at most COMBINE_MAX_PARTITIONS partitions. A keyed reply (partition -1) goes where
    the partitioner puts its key: partition 0 of a one-partition topic; on more, each
    distinct key counts, up to the topic's partitions (an upper bound)."""
    touched: dict[str, set[object]] = {}  # topic -> partitions (or keys) it touches
    count = 0
    for topic, key, _value, partition, _headers in replies:
        unit: object = partition if partition >= 0 else (0 if partitions_per_topic == 1 else key)
        units = touched.setdefault(topic, set())
        if unit in units or (partition < 0 and len(units) >= partitions_per_topic):
            continue
        units.add(unit)
        count += 1
        if count > COMBINE_MAX_PARTITIONS:
            return False
    return True


def next_cycle_s(last_commit_s: float) -> float:
    """The pause before the next commit: CYCLE_S, or COMMIT_SPACING x the last commit's
    duration when that is longer, capped at MAX_CYCLE_S."""
    spaced = COMMIT_SPACING * last_commit_s
    return CYCLE_S if spaced <= CYCLE_S else min(MAX_CYCLE_S, spaced)


class Committer:
    """Commits staged outputs (outbox.py) and holds Faust's offset commits behind them.

    One batch at a time: seal it, flush Faust's producer (the changelog writes of the
    batch are then durable), commit its work outputs on the work lane, and queue its
    replies for the reply lane, which commits every queued batch's replies in one
    transaction (lanes.py). Faust flushes its producer right before it commits input
    offsets; the wrapper installed here commits every batch staged until then first, on
    both lanes, so offsets never pass an input whose outputs are not out."""

    def __init__(self, app: faust.App, outbox: KafkaOutbox, health: Health,
                 changelog: ChangelogProducer, reply_partitions: int = 1) -> None:
        self.app = app
        self.reply_partitions = reply_partitions  # of each reply topic (combine)
        self.outbox = outbox
        self.health = health
        self.changelog = changelog  # the tables' changelog writer (changelog.py)
        self.lock = asyncio.Lock()
        self.reply_lock = asyncio.Lock()
        self.replies_queued = asyncio.Event()
        # sealed, in batch order, each with the shards owned at its seal (`_commit_work`)
        self._reply_parts: list[tuple[int, list[Output], frozenset[int]]] = []
        self._faust_flush: Callable[[], Awaitable[None]] | None = None
        self.last_commit_s = 0.0  # how long the last batch's transaction took
        # False while this process may not decide (lapse.py): nothing staged is sent
        self.deciding: Callable[[], Awaitable[bool]] | None = None
        # made right after `deciding` passed, asked by the outbox once a batch's marks
        # are on the broker (lapse.py, SendCheck)
        self.send_check: Callable[[], Callable[[], bool]] | None = None

    def install(self) -> None:
        if self._faust_flush is not None:
            return
        producer = self.app.producer
        self._faust_flush = producer.flush
        committer = self

        async def flush() -> None:
            await committer.drain()

        producer.flush = flush  # type: ignore[method-assign]  # wrap, keep Faust's own flush

    async def drain(self, *, replies: bool = True) -> None:
        """Commit every output staged before this call (raises if the outbox stopped):
        the work outputs now, and the replies too unless `replies` is False (the commit
        loop's cycle: the reply lane then takes them, `commit_replies`)."""
        outbox = self.outbox
        if self.deciding is not None and not await self.deciding():
            return  # a lapsed member: the process is leaving (lapse.py)
        target = outbox.seq
        async with self.lock:
            if outbox.lane_confirmed.work >= target:
                # no outputs since the last batch, but table writes without outputs (a
                # bucket, the predictor) must be durable before Faust commits offsets
                await self._flush_changelog()
            else:
                await self._commit_work(target)
        if replies:
            await self.commit_replies()

    async def _commit_work(self, target: int) -> None:
        outbox = self.outbox
        if outbox.sealed >= target:  # sealed by a drain that failed
            raise OutboxStoppedError(f"batch {target} was not committed")
        seq, batch = outbox.seal()
        # the shards this batch speaks for are those owned at its seal: a shard adopted
        # before it is published (an await below) has its replayed outputs in a later
        # batch, and a mark of this one there would name them committed
        marks = frozenset(outbox.mark_partitions)
        work, replies = outbox.split(batch)
        # while the reply lane is idle (every earlier reply out), few replies may ride
        # with the work: they still follow every earlier batch's, in order
        both = outbox.replies is not None and combine(replies, self.reply_partitions) and not (
            self._reply_parts or self.reply_lock.locked())
        if both:
            work, replies = batch, []
        self.health.publishing_since = time.monotonic()
        try:
            await self._flush_changelog()
            if work:
                started = time.monotonic()
                try:
                    await self._publish(seq, work, "both" if both else "work", marks)
                except OutboxFencedError as exc:
                    exit_as_zombie(f"fenced by a newer owner of its shards ({exc})")
                self.last_commit_s = time.monotonic() - started
            outbox.confirm(seq, replies=outbox.replies is None or both)
            if outbox.replies is not None and not both:
                self._reply_parts.append((seq, replies, marks))
                self.replies_queued.set()
        finally:
            self.health.publishing_since = None

    async def commit_replies(self) -> None:
        """Commit the replies of every batch whose work is committed, in one transaction
        on the reply lane (nothing when none are queued)."""
        outbox = self.outbox
        async with self.reply_lock:
            if not self._reply_parts:
                return
            if self.deciding is not None and not await self.deciding():
                return  # a lapsed member: its shards' owners replay these (lapse.py)
            parts, self._reply_parts = self._reply_parts, []
            seq, _, marks = parts[-1]
            outputs = [out for _, part, _ in parts for out in part]
            self.health.replying_since = time.monotonic()
            try:
                if outputs:
                    await self._publish(seq, outputs, "replies", marks)
            except OutboxFencedError as exc:
                exit_as_zombie(f"fenced by a newer owner of its shards ({exc})")
            except BaseException:
                self._reply_parts[:0] = parts  # still owed, in order
                raise
            finally:
                self.health.replying_since = None
            outbox.confirm(seq, work=False)

    async def _publish(self, seq: int, outputs: list[Output], lane: Lane,
                       marks: frozenset[int]) -> None:
        """One batch to the outbox's thread, asked once more whether this process may
        still decide, so the check the thread makes later covers only the freeze after
        this point (lapse.py, SendCheck)."""
        still_member = None
        if self.deciding is not None:
            if not await self.deciding():
                raise OutboxFencedError(f"batch {seq}: no longer a member of its group")
            if self.send_check is not None:
                still_member = self.send_check()
        await asyncio.to_thread(self.outbox.publish, seq, outputs, lane, still_member,
                                marks=marks)

    async def _flush_changelog(self) -> None:
        """Faust's own flush and the tables' changelog writer's, retried through broker
        outages (outbox.stop() ends it)."""
        assert self._faust_flush is not None
        attempt = 0
        while True:
            try:
                await self._faust_flush()
                await self._flush_tables()
                return
            except ChangelogLostError as exc:
                exit_as_zombie(f"a table write is not in its changelog ({exc})")
            except Exception as exc:
                if self.outbox.stopping:
                    raise OutboxStoppedError("changelog flush") from exc
                attempt += 1
                log.warning("changelog flush failed (%s); retrying", exc)
                await asyncio.sleep(min(2.0, 0.1 * attempt))

    async def _flush_tables(self) -> None:
        """Wait for the table writes made so far (this batch's, and any made since its
        seal), serving their delivery reports on this thread between short sleeps
        (changelog.py says why not in a helper thread)."""
        changelog = self.changelog
        if changelog.pending():
            upto = changelog.mark()
            started = warned = time.monotonic()
            while not changelog.settle(upto):
                if self.outbox.stopping:
                    raise OutboxStoppedError("changelog flush")
                if time.monotonic() - warned >= 1.0:
                    warned = time.monotonic()
                    log.warning("changelog writes not delivered within %.0f s; still trying",
                                warned - started)
                await asyncio.sleep(SETTLE_POLL_S)
        changelog.persist_offsets()


EXIT_FENCED = 75  # EX_TEMPFAIL: restart me (docs/reliability.md, "A frozen owner")


def exit_as_zombie(why: str) -> NoReturn:
    """Leave at once, committing nothing more: a newer owner fenced this process's
    transactions, or the group no longer lists it (lapse.py), so it was frozen or cut off
    past its session timeout while another took its shards over, and its in-memory state
    may be stale. Its staged outputs are
    in its table records (replayed by whoever owns each shard) or were never durable
    (their inputs are read again); a restart rejoins the group and rebuilds from the
    changelogs, exactly as after kill -9."""
    log.critical("%s: exiting with code %d, deciding and sending nothing more; restarted, "
                 "it rejoins and recovers from the changelogs", why, EXIT_FENCED)
    logging.shutdown()
    os._exit(EXIT_FENCED)


async def commit_continuously(committer: Committer, outbox: KafkaOutbox,
                              ready: Callable[[], bool]) -> None:
    """Commit staged outputs continuously (a loop, not a timer: a commit can take
    longer than CYCLE_S, and then the next one follows after a pause that grows with
    the commit's cost, `next_cycle_s`), and beside it the reply lane's loop."""
    replies = asyncio.ensure_future(_commit_replies_continuously(committer, outbox))
    try:
        while not outbox.stopping:
            await asyncio.sleep(next_cycle_s(committer.last_commit_s))
            if not ready():
                continue
            try:
                await committer.drain(replies=False)
            except Exception as exc:  # the commit hook raises too: offsets stay behind
                log.error("output batch not committed: %s", exc)
    finally:
        replies.cancel()


async def _commit_replies_continuously(committer: Committer, outbox: KafkaOutbox) -> None:
    """The reply lane: whenever batches' replies are queued, commit them all at once (so
    the busier the lane, the more batches share one transaction's partitions)."""
    while not outbox.stopping:
        await committer.replies_queued.wait()
        committer.replies_queued.clear()
        try:
            await committer.commit_replies()
        except Exception as exc:  # Faust's flush commits them, or raises, before offsets
            log.error("replies not committed: %s", exc)
            await asyncio.sleep(CYCLE_S)
            committer.replies_queued.set()  # still queued (commit_replies put them back)
