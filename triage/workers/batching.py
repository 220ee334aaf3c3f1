"""A worker's completions, sent a few to a message.

Each message on triage.completions costs the admission app one Faust event (two asyncio
tasks, an offset to track and commit), whatever it holds: sending the completions that
finish within a few milliseconds of each other as one CompletionBatch cut the app's CPU
per completed request by about 12% (docs/architecture.md). Each completion still has its own
future, settled when the message holding it is acknowledged (acks=all), so the worker
commits its input only after its output is durable, as before."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

from triage.topics.messages import Completion, CompletionBatch, Message
from triage.workers.publish import AsyncProducer

MAX_BATCH_BYTES = 256 * 1024  # well under the broker's message.max.bytes (1 MB)
_FIXED_BYTES = 450  # a completion's JSON without its text and error


@dataclass(slots=True)
class _Pending:
    items: list[Completion] = field(default_factory=list)
    futures: list[asyncio.Future[None]] = field(default_factory=list)
    size: int = 0
    timer: asyncio.TimerHandle | None = None


class CompletionBatcher:
    """Completions of one key (the pool) wait up to ``linger_s`` for company, at most
    ``max_items`` to a message; one alone goes as a plain Completion."""

    def __init__(self, producer: AsyncProducer, topic: str, loop: asyncio.AbstractEventLoop, *,
                 max_items: int, linger_s: float,
                 on_message: Callable[[], None] | None = None,
                 partition: int = -1) -> None:  # fmt: skip
        self._producer = producer
        self._partition = partition  # the pool's shard (-1: by key)
        self._topic = topic
        self._loop = loop
        self._max_items = max_items
        self._linger_s = linger_s
        self._pending: dict[str, _Pending] = {}
        self._on_message = on_message  # once per message sent (the worker's metric)

    def send(self, key: str, completion: Completion) -> asyncio.Future[None]:
        fut: asyncio.Future[None] = self._loop.create_future()
        p = self._pending.get(key)
        if p is None:
            p = self._pending[key] = _Pending()
            if self._max_items > 1:
                p.timer = self._loop.call_later(self._linger_s, self._flush, key)
        p.items.append(completion)
        p.futures.append(fut)
        p.size += _FIXED_BYTES + len(completion.text or "") + len(completion.error or "")
        if len(p.items) >= self._max_items or p.size >= MAX_BATCH_BYTES:
            self._flush(key)
        return fut

    def flush(self) -> None:
        """Send everything waiting now (at shutdown, before the producer flushes)."""
        for key in list(self._pending):
            self._flush(key)

    def _flush(self, key: str) -> None:
        p = self._pending.pop(key, None)
        if p is None:
            return
        if p.timer is not None:
            p.timer.cancel()
        message: Message = p.items[0] if len(p.items) == 1 else CompletionBatch(completions=p.items)
        if self._on_message is not None:
            self._on_message()
        delivery = self._producer.send(self._topic, key, message, self._partition)
        futures = p.futures
        delivery.add_done_callback(lambda d: _fan_out(d, futures))


def _fan_out(delivery: asyncio.Future[None], futures: list[asyncio.Future[None]]) -> None:
    error = None if delivery.cancelled() else delivery.exception()
    for fut in futures:
        if fut.done():
            continue
        if delivery.cancelled():
            fut.cancel()
        elif error is not None:
            fut.set_exception(error)
        else:
            fut.set_result(None)
