"""The body of a streamed answer: OpenAI's server-sent events from triage's replies."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from triage.client.errors import ClientError, ReplyTimeoutError
from triage.client.stream import StreamAssembler
from triage.gateway.metrics import GatewayMetrics
from triage.gateway.replies import (
    Shape,
    chunk_body,
    error_for,
    finish_reason,
    timeout_error,
    unavailable,
    usage,
)
from triage.topics.messages import Reply
from triage.topics.reasons import ReplyStatus

DONE = b"data: [DONE]\n\n"


def sse(data: dict[str, Any]) -> bytes:
    """One event: ``data: <compact JSON>`` and a blank line."""
    return b"data: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"


async def sse_events(
    updates: AsyncGenerator[Reply, None], asm: StreamAssembler, first: list[str],
    terminal: Reply | None, shape: Shape, *, include_usage: bool, metrics: GatewayMetrics,
    tenant: str, t0: float,
) -> AsyncIterator[bytes]:
    """The SSE body: a role chunk (chat), text chunks, the finish, usage, [DONE]."""
    endpoint = "chat" if shape.chat else "completions"
    gauge = metrics.in_flight.labels(tenant)
    gauge.inc()
    try:
        if shape.chat:
            yield sse(chunk_body(shape, role=True, text=""))
        if first:
            metrics.ttft.labels(tenant, shape.model).observe(time.monotonic() - t0)
            yield sse(chunk_body(shape, text="".join(first)))
        while terminal is None:
            try:
                reply = await updates.__anext__()
            except ReplyTimeoutError as exc:
                yield sse(timeout_error(exc.request_id, exc.timeout_s, 1).body())
                yield DONE
                return
            except ClientError as exc:
                yield sse(unavailable(str(exc)).body())
                yield DONE
                return
            pieces = asm.feed(reply)
            if pieces:
                if asm.tokens == len(pieces):
                    metrics.ttft.labels(tenant, shape.model).observe(
                        time.monotonic() - t0)
                yield sse(chunk_body(shape, text="".join(pieces)))
            if reply.terminal:
                terminal = reply
        if terminal.status is not ReplyStatus.COMPLETED:
            problem = error_for(terminal)
            if problem is not None:
                yield sse(problem.body())
            yield DONE
            return
        if asm.tokens == 0 and terminal.text:  # nothing was streamed (e.g. no chunks)
            yield sse(chunk_body(shape, text=terminal.text))
        yield sse(chunk_body(shape, finish=finish_reason(terminal.output_tokens,
                                                          shape.max_tokens)))  # fmt: skip
        if include_usage:
            yield sse(chunk_body(shape, usage_of=usage(shape.prompt_tokens,
                                                        terminal.output_tokens)))  # fmt: skip
        yield DONE
    finally:
        gauge.dec()
        await updates.aclose()
        metrics.latency.labels(tenant, endpoint).observe(time.monotonic() - t0)
