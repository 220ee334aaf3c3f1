"""Token streaming from a worker: backends hand generated text to a sink, which batches
it into ``streaming`` replies on the tenant's reply topic.

Why the reply topic (and not a topic of its own): a tenant already reads exactly its
own reply topic (the ACLs need nothing new), and order comes for free. A chunk and the
terminal reply share the key (request_id), hence the partition; the worker waits for
every chunk of an attempt to be acknowledged before it publishes the attempt's
``Completion``, and the admission app sends the terminal reply only after reading that
completion, so on the partition every chunk of a finished attempt precedes its terminal
reply. Readers see chunks as non-terminal replies (``status: streaming``).

A chunk carries its pieces of text, one per token, and the index of its first token in
the attempt (``token_offset``), so a reader can join chunks exactly, skip a redelivered
one, and, after a preemption restarts the request as a new attempt, skip the tokens it
has already shown (triage.client.stream.StreamAssembler).

Batching: a chunk is published when it holds ``chunk_tokens`` pieces, or ``chunk_ms``
after its first piece, whichever comes first (one message per token would multiply the
broker's load by the output length).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from triage.topics.messages import Reply, WorkItem
from triage.topics.reasons import ReplyStatus
from triage.workers.backends.base import epoch_ms
from triage.workers.publish import AsyncProducer

log = logging.getLogger(__name__)


class ChunkPublisher:
    """A ``TokenSink`` (backends.base) that batches one attempt's tokens into
    ``streaming`` replies (see the module docstring)."""

    def __init__(
        self,
        *,
        item: WorkItem,
        producer: AsyncProducer,
        topic: str,
        gpu_id: str,
        chunk_tokens: int,
        chunk_ms: int,
    ) -> None:
        if chunk_tokens < 1 or chunk_ms < 1:
            raise ValueError("chunk_tokens and chunk_ms must be >= 1")
        self.item = item
        self._producer = producer
        self._topic = topic
        self._gpu_id = gpu_id
        self._chunk_tokens = chunk_tokens
        self._chunk_s = chunk_ms / 1000.0
        self._buf: list[str] = []
        self._offset = 0  # index of the first buffered token in the attempt
        self._timer: asyncio.TimerHandle | None = None
        self._sent: list[asyncio.Future[None]] = []
        self.first_token_at_ms: int | None = None
        self.chunks = 0
        self._closed = False

    def tokens(self, pieces: Sequence[str]) -> None:
        if self._closed or not pieces:
            return
        if self.first_token_at_ms is None:
            self.first_token_at_ms = epoch_ms()
        self._buf.extend(pieces)
        while len(self._buf) >= self._chunk_tokens:
            self._flush(self._chunk_tokens)
        if self._buf and self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self._chunk_s, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        if self._buf:
            self._flush(len(self._buf))

    def _flush(self, n: int) -> None:
        if self._timer is not None and len(self._buf) <= n:
            self._timer.cancel()
            self._timer = None
        pieces, self._buf = self._buf[:n], self._buf[n:]
        item = self.item
        reply = Reply(
            request_id=item.request_id, tenant=item.tenant, status=ReplyStatus.STREAMING,
            gpu_id=self._gpu_id, tokens=pieces, token_offset=self._offset,
            attempt=item.attempt, first_token_at_ms=self.first_token_at_ms,
            output_tokens=self._offset + len(pieces), at_ms=epoch_ms(),
        )  # fmt: skip
        self._offset += len(pieces)
        self.chunks += 1
        self._sent.append(self._producer.send(self._topic, item.request_id, reply))

    async def close(self) -> int:
        """Publish what is buffered and wait until every chunk is acknowledged (so the
        completion, sent next, lands after them). Returns the chunks not delivered."""
        if self._closed:
            return 0
        if self._buf:
            self._flush(len(self._buf))
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        results = await asyncio.gather(*self._sent, return_exceptions=True)
        lost = sum(1 for r in results if isinstance(r, BaseException))
        if lost:
            log.warning("%s: %d stream chunk(s) of %s not delivered", self._gpu_id, lost,
                        self.item.work_id)  # fmt: skip
        return lost
