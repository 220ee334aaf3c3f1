"""Streamed output: join a request's ``streaming`` replies into text, once per token.

Workers publish a streaming request's tokens as non-terminal ``streaming`` replies on
the tenant's reply topic (triage.workers.stream), each carrying pieces of text (one per
token) and the index of its first token. The assembler is pure: feed it every reply of
a request in arrival order and it returns the pieces not shown yet.

After a preemption the request runs again as a new attempt, from its first token. The
assembler follows the newest attempt, ignores chunks of older ones, and skips the
tokens it has already returned, so the joined text never repeats. With greedy decoding
(and always on the sim backend) the new attempt says the same thing; with sampling, the
text after the restart continues a different draw, and the terminal reply's ``text`` (the
last attempt's whole output) may differ from the streamed concatenation.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from triage.topics.messages import Reply
from triage.topics.reasons import ReplyStatus

log = logging.getLogger(__name__)


@dataclass(slots=True)
class StreamAssembler:
    """Joins one request's streaming replies (see the module docstring)."""

    tokens: int = 0  # pieces returned so far
    attempt: int = -1  # the newest attempt seen
    first_token_at_ms: int | None = None  # the worker's clock at the first token
    gaps: int = 0  # tokens lost between chunks (a chunk that never arrived)
    pieces: list[str] = field(default_factory=list)

    def feed(self, reply: Reply) -> list[str]:
        """The new pieces of text that ``reply`` brings (empty for any other reply)."""
        if reply.status is not ReplyStatus.STREAMING or not reply.tokens:
            return []
        attempt = reply.attempt or 0
        if attempt < self.attempt:
            return []  # the tail of an attempt that was preempted after the new one began
        self.attempt = attempt
        if self.first_token_at_ms is None:
            self.first_token_at_ms = reply.first_token_at_ms
        offset = reply.token_offset or 0
        if offset > self.tokens:
            self.gaps += offset - self.tokens
            log.warning("%s: %d streamed token(s) missing before token %d", reply.request_id,
                        offset - self.tokens, offset)  # fmt: skip
            self.tokens = offset
        new = reply.tokens[self.tokens - offset :]
        self.tokens += len(new)
        self.pieces.extend(new)
        return new

    @property
    def text(self) -> str:
        return "".join(self.pieces)
