"""Handing a fetched record to its stream without four asyncio tasks per record.

faust-streaming's drain loop (`Consumer._drain_messages`) delivers each record with
`await self.wait_first(callback(message), self.suspend_flow.wait())`: mode's
`wait_first` wraps the delivery and three events (the flow's suspension, the service's
stop and crash) in four tasks, waits for the first, and cancels the other three. That is
paid per record, on request, completion, heartbeat and standby changelog records alike,
while a delivery almost never waits: it puts the event on a stream's or the changelog
reader's queue, which has room. With a standby replica every request's ~3 changelog
records cross this loop on the other instance too (docs/architecture.md, "Delivery
without four tasks per record").

Here the delivery runs eagerly first, as Python 3.12's eager tasks do: its coroutine is
stepped once on the spot, and when it finishes without suspending (the queue had room)
nothing else is needed. When it does suspend (a full queue), the rest of it, from the
very future it is waiting on, becomes an awaitable (`Resumed`) that `wait_first` races
against the flow's suspension exactly as before. The loop is otherwise Faust's own,
line for line.

Installed once per process (idempotent), by `engine.install_patches`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Generator
from typing import Any, cast

from faust.tables import recovery as faust_recovery
from faust.transport import consumer as faust_consumer

# Faust's loop, taken at import (before `install` can replace it): the tests compare ours to it
FAUST_DRAIN: Any = faust_consumer.Consumer._drain_messages


class Resumed:
    """The rest of a coroutine that suspended on `waiting` when it was stepped eagerly:
    awaiting this passes `waiting` up to the task (which waits for it exactly as it would
    have) and then drives the coroutine on, forwarding values and exceptions."""

    __slots__ = ("_coro", "_waiting")

    def __init__(self, coro: Coroutine[Any, Any, Any], waiting: Any) -> None:
        self._coro = coro
        self._waiting = waiting

    def __await__(self) -> Generator[Any, Any, Any]:
        coro, waiting = self._coro, self._waiting
        while True:
            try:
                sent = yield waiting
            except BaseException as exc:  # cancellation included: the coroutine decides
                try:
                    waiting = coro.throw(exc)
                except StopIteration as stop:
                    return stop.value
            else:
                try:
                    waiting = coro.send(sent)
                except StopIteration as stop:
                    return stop.value


def step_eagerly(coro: Coroutine[Any, Any, Any]) -> tuple[Any, Resumed | None]:
    """Run `coro` up to its first suspension: (its result, None) when it finished (an
    exception it raised propagates), else (None, what is left of it, to be awaited)."""
    try:
        waiting = coro.send(None)
    except StopIteration as stop:
        return stop.value, None
    return None, Resumed(coro, waiting)


async def _drain_messages(self: Any, fetcher: Any) -> None:  # pragma: no cover
    # faust-streaming 0.15.3's Consumer._drain_messages, but for the delivery below
    callback = self.callback
    getmany = self.getmany
    consumer_should_stop = self._stopped.is_set
    fetcher_should_stop = fetcher._stopped.is_set

    get_read_offset = self._read_offset.__getitem__
    set_read_offset = self._read_offset.__setitem__
    flag_consumer_fetching = faust_consumer.CONSUMER_FETCHING
    set_flag = self.diag.set_flag
    unset_flag = self.diag.unset_flag
    commit_every = self._commit_every
    acks_enabled_for = self.app.topics.acks_enabled_for

    yield_every = 100
    num_since_yield = 0
    sleep = asyncio.sleep

    try:
        while not (consumer_should_stop() or fetcher_should_stop()):
            set_flag(flag_consumer_fetching)
            ait = getmany(timeout=1.0)

            # Sleeping because sometimes getmany is called in a loop
            # never releasing to the event loop
            await self.sleep(0)
            if not self.should_stop:
                async for tp, message in ait:
                    num_since_yield += 1
                    if num_since_yield > yield_every:
                        await sleep(0)
                        num_since_yield = 0

                    offset = message.offset
                    r_offset = get_read_offset(tp)
                    if r_offset is None or offset >= r_offset:
                        gap = offset - (r_offset or 0)
                        # We have a gap in income messages
                        if gap > 1 and r_offset:
                            acks_enabled = acks_enabled_for(message.topic)
                            if acks_enabled:
                                await self._add_gap(tp, r_offset + 1, offset)
                        if commit_every is not None and self._n_acked >= commit_every:
                            self._n_acked = 0
                            await self.commit()
                        _, rest = step_eagerly(callback(message))
                        if rest is not None:  # it waits (a full queue): as Faust does
                            await self.wait_first(rest, self.suspend_flow.wait())
                        set_read_offset(tp, offset)
                    else:
                        self.log.dev(
                            "DROPPED MESSAGE ROFF %r: k=%r v=%r",
                            offset,
                            message.key,
                            message.value,
                        )
                unset_flag(flag_consumer_fetching)

    except self.consumer_stopped_errors:
        if self.transport.app.should_stop:
            # we're already stopping so ignore
            self.log.info("Broker stopped consumer, shutting down...")
            return
        raise
    except asyncio.CancelledError:
        if self.transport.app.should_stop:
            # we're already stopping so ignore
            self.log.info("Consumer shutting down for user cancel.")
            return
        raise
    except Exception as exc:
        self.log.exception("Drain messages raised: %r", exc)
        raise
    finally:
        unset_flag(flag_consumer_fetching)


class _RecoveryAsyncio:
    """`asyncio` as faust's table recovery sees it, but for `wait_for`: its changelog
    reader awaits `wait_for(changelog_queue.get(), timeout=5.0)` per changelog record,
    one task and one timer each, though the queue almost always holds the next record.
    The get is stepped eagerly; only a get that waits is raced against the timeout."""

    def __getattr__(self, name: str) -> Any:
        return getattr(asyncio, name)

    @staticmethod
    async def wait_for(aw: Any, timeout: float | None) -> Any:
        if asyncio.iscoroutine(aw):
            value, rest = step_eagerly(aw)
            if rest is None:
                return value
            aw = rest
        return await asyncio.wait_for(aw, timeout)


def install() -> None:
    cls = cast(Any, faust_consumer.Consumer)
    if getattr(cls, "_triage_eager_delivery", False):
        return
    cls._drain_messages = _drain_messages
    cast(Any, faust_recovery).asyncio = _RecoveryAsyncio()
    cls._triage_eager_delivery = True
