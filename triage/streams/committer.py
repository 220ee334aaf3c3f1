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
from triage.streams.outbox import KafkaOutbox, OutboxFencedError, OutboxStoppedError

log = logging.getLogger(__name__)

CYCLE_S = 0.02  # how often staged outputs are committed (the latency a batch adds)
# A commit that took long waits proportionally longer before the next (at most
# MAX_CYCLE_S): a transaction costs a registration and an end marker per partition it
# wrote, and with 1,000 tenants each batch's replies touch hundreds of reply partitions.
# Committing every 20 ms then spent the app's CPU on transactions; spacing commits by
# their own cost keeps that overhead bounded (docs/architecture.md, "Commits spaced by their cost").
COMMIT_SPACING = 3.0
MAX_CYCLE_S = 0.1


def next_cycle_s(last_commit_s: float) -> float:
    """The pause before the next commit: CYCLE_S, or COMMIT_SPACING x the last commit's
    duration when that is longer, capped at MAX_CYCLE_S."""
    spaced = COMMIT_SPACING * last_commit_s
    return CYCLE_S if spaced <= CYCLE_S else min(MAX_CYCLE_S, spaced)


class Committer:
    """Commits staged outputs (outbox.py) and holds Faust's offset commits behind them.

    One batch at a time: seal it, flush Faust's producer (the changelog writes of the
    batch are then durable), commit its transaction. Faust flushes its producer right
    before it commits input offsets; the wrapper installed here commits every batch
    staged until then first, so offsets never pass an input whose outputs are not out."""

    def __init__(self, app: faust.App, outbox: KafkaOutbox, health: Health,
                 changelog: ChangelogProducer) -> None:
        self.app = app
        self.outbox = outbox
        self.health = health
        self.changelog = changelog  # the tables' changelog writer (changelog.py)
        self.lock = asyncio.Lock()
        self._faust_flush: Callable[[], Awaitable[None]] | None = None
        self.last_commit_s = 0.0  # how long the last batch's transaction took
        # False while this process may not decide (lapse.py): nothing staged is sent
        self.deciding: Callable[[], Awaitable[bool]] | None = None

    def install(self) -> None:
        if self._faust_flush is not None:
            return
        producer = self.app.producer
        self._faust_flush = producer.flush
        committer = self

        async def flush() -> None:
            await committer.drain()

        producer.flush = flush  # type: ignore[method-assign]  # wrap, keep Faust's own flush

    async def drain(self) -> None:
        """Commit every output staged before this call (raises if the outbox stopped)."""
        outbox = self.outbox
        if self.deciding is not None and not await self.deciding():
            return  # a lapsed member: the process is leaving (lapse.py)
        target = outbox.seq
        async with self.lock:
            if outbox.confirmed >= target:
                # no outputs since the last batch, but table writes without outputs (a
                # bucket, the predictor) must be durable before Faust commits offsets
                await self._flush_changelog()
                return
            if outbox.sealed >= target:  # sealed by a drain that failed
                raise OutboxStoppedError(f"batch {target} was not committed")
            seq, batch = outbox.seal()
            assert self._faust_flush is not None
            self.health.publishing_since = time.monotonic()
            try:
                await self._flush_changelog()
                if batch:
                    started = time.monotonic()
                    try:
                        await asyncio.to_thread(outbox.publish, seq, batch)
                    except OutboxFencedError as exc:
                        exit_as_zombie(f"fenced by a newer owner of its shards ({exc})")
                    self.last_commit_s = time.monotonic() - started
                outbox.confirm(seq)
            finally:
                self.health.publishing_since = None

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
        changelog = self.changelog
        if changelog.pending():
            while not await asyncio.to_thread(changelog.flush, 1.0):
                if self.outbox.stopping:
                    raise OutboxStoppedError("changelog flush")
                log.warning("changelog writes not delivered within 1 s; still trying")
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
    the commit's cost, `next_cycle_s`)."""
    while not outbox.stopping:
        await asyncio.sleep(next_cycle_s(committer.last_commit_s))
        if not ready():
            continue
        try:
            await committer.drain()
        except Exception as exc:  # the commit hook raises too: offsets stay behind
            log.error("output batch not committed: %s", exc)
