"""Every reply of one request as an iterator (sync or asyncio), and streamed text on top.

The client's reader thread hands each reply of a request to its ``on_update`` callback;
these helpers queue them for the caller's thread or event loop, and end with the
terminal reply. A delivery failure or a closed client ends the iteration with its
error; no terminal reply within the timeout raises ReplyTimeoutError.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import time
from collections.abc import AsyncGenerator, AsyncIterator, Iterator
from concurrent.futures import Future
from typing import TYPE_CHECKING

from triage.client.errors import ClientError, ReplyTimeoutError
from triage.client.router import Submission
from triage.client.stream import StreamAssembler
from triage.topics.messages import InferenceRequest, Reply

if TYPE_CHECKING:
    from triage.client.client import TriageClient

_DONE = None  # queued when the submission's future settles (terminal, or failed)


def _raise_failure(sub: Submission) -> None:
    fut = sub.future
    if fut.done() and not fut.cancelled():
        exc = fut.exception()
        if exc is not None:
            raise exc if isinstance(exc, ClientError) else ClientError(str(exc))


def iter_updates(
    client: TriageClient, request: InferenceRequest, timeout_s: float
) -> Iterator[Reply]:
    """Send ``request``; yield its replies as they come, the terminal one last."""
    q: queue.SimpleQueue[Reply | None] = queue.SimpleQueue()
    sub = client.send(request, on_update=q.put)
    sub.future.add_done_callback(lambda _f: q.put(_DONE))
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            try:
                reply = q.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise ReplyTimeoutError(sub.request_id, timeout_s, sub.history) from None
            if reply is _DONE:
                _raise_failure(sub)
                continue  # settled by the terminal reply, which is queued before this
            yield reply
            if reply.terminal:
                return
    finally:
        client.forget(sub.request_id)


async def aiter_updates(
    client: TriageClient, request: InferenceRequest, timeout_s: float
) -> AsyncGenerator[Reply, None]:
    """``iter_updates`` for asyncio: the waits do not block the event loop."""
    loop = asyncio.get_running_loop()
    q: asyncio.Queue[Reply | None] = asyncio.Queue()

    def push(item: Reply | None) -> None:
        with contextlib.suppress(RuntimeError):  # the loop closed: nobody is listening
            loop.call_soon_threadsafe(q.put_nowait, item)

    def settled(_f: Future[Reply]) -> None:
        push(_DONE)

    sub = client.send(request, on_update=push)
    sub.future.add_done_callback(settled)
    deadline = loop.time() + timeout_s
    try:
        while True:
            try:
                async with asyncio.timeout_at(deadline):
                    reply = await q.get()
            except TimeoutError:
                raise ReplyTimeoutError(sub.request_id, timeout_s, sub.history) from None
            if reply is _DONE:
                _raise_failure(sub)
                continue
            yield reply
            if reply.terminal:
                return
    finally:
        client.forget(sub.request_id)


class TextStream:
    """Streamed text of one request: iterate for the pieces as they are generated; then
    ``reply`` holds the terminal reply (``completed``, or why there was no text)."""

    def __init__(self, updates: Iterator[Reply]) -> None:
        self._updates = updates
        self.assembler = StreamAssembler()
        self.reply: Reply | None = None

    def __iter__(self) -> Iterator[str]:
        for reply in self._updates:
            yield from self.assembler.feed(reply)
            if reply.terminal:
                self.reply = reply

    @property
    def text(self) -> str:
        return self.assembler.text


class AsyncTextStream:
    """``TextStream`` for asyncio (``async for piece in client.astream(request)``)."""

    def __init__(self, updates: AsyncIterator[Reply]) -> None:
        self._updates = updates
        self.assembler = StreamAssembler()
        self.reply: Reply | None = None

    async def __aiter__(self) -> AsyncIterator[str]:
        async for reply in self._updates:
            for piece in self.assembler.feed(reply):
                yield piece
            if reply.terminal:
                self.reply = reply

    @property
    def text(self) -> str:
        return self.assembler.text
