"""From triage's replies to OpenAI's HTTP answers. Pure: status codes, headers, bodies.

    terminal reply                                 HTTP   error type (code: the reason)
    completed                                      200    (the completion)
    rejected: tenant quota, rate, queue, conc.     429    rate_limit_exceeded
    rejected: pool queue full, no GPU              503    server_overloaded
    rejected: never fits (quota_never_fits,        400    invalid_request_error
              sla_infeasible)
    timed_out (waited its max queue time)          503    server_overloaded
    invalid: unknown or forbidden model            404    invalid_request_error
                                                          (code model_not_found)
    invalid: anything else                         400    invalid_request_error
    failed                                         500    server_error
    no terminal reply within the gateway's wait    408    timeout (code reply_timeout)

Retry-After is the server's hint in whole seconds, rounded up (a client that waits it is
never early). x-ratelimit-remaining-tokens is what the tenant's bucket holds (0 in debt),
x-ratelimit-limit-tokens its capacity, x-ratelimit-reset-tokens how long until it is
full again at the tenant's refill rate, written as OpenAI writes durations ("1.5s",
"2m30s", "120ms").
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

from triage.topics.messages import Reply
from triage.topics.reasons import ReasonCode, ReplyStatus

_RATE_LIMIT = frozenset({
    ReasonCode.TENANT_QUOTA_EXCEEDED, ReasonCode.TENANT_RATE_LIMITED,
    ReasonCode.TENANT_QUEUE_FULL, ReasonCode.TENANT_CONCURRENCY,
})  # fmt: skip
_NEVER = frozenset({ReasonCode.QUOTA_NEVER_FITS, ReasonCode.SLA_INFEASIBLE})
_NO_MODEL = frozenset({ReasonCode.UNKNOWN_MODEL, ReasonCode.MODEL_NOT_ALLOWED})


@dataclass(frozen=True, slots=True)
class HttpError:
    """An OpenAI-style error answer."""

    status: int
    message: str
    type: str
    code: str | None = None
    param: str | None = None
    headers: dict[str, str] = field(default_factory=dict)

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}  # fmt: skip


def retry_after_header(retry_after_ms: int | None) -> str | None:
    """Whole seconds, rounded up; None without a hint."""
    if retry_after_ms is None:
        return None
    return str(max(0, math.ceil(retry_after_ms / 1000.0)))


def duration_text(seconds: float) -> str:
    """OpenAI's duration style: ``120ms``, ``1.5s``, ``2m30s``, ``1h0m0s``."""
    seconds = max(0.0, seconds)
    if seconds < 1.0:
        return f"{math.ceil(seconds * 1000)}ms"
    if seconds < 60.0:
        return f"{math.ceil(seconds * 10) / 10:g}s"
    whole = math.ceil(seconds)
    h, rest = divmod(whole, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m}m{s}s" if h else f"{m}m{s}s"


def ratelimit_headers(reply: Reply, rate_tokens_per_s: float | None) -> dict[str, str]:
    """x-ratelimit-* from the bucket numbers a refusal carries (empty when it has none)."""
    out: dict[str, str] = {}
    level, burst = reply.bucket_level, reply.bucket_burst
    if level is not None:
        out["x-ratelimit-remaining-tokens"] = str(max(0, math.floor(level)))
    if burst is not None:
        out["x-ratelimit-limit-tokens"] = str(math.floor(burst))
    if level is not None and burst is not None and rate_tokens_per_s:
        out["x-ratelimit-reset-tokens"] = duration_text(
            max(0.0, burst - level) / rate_tokens_per_s
        )
    return out


def error_for(reply: Reply, *, rate_tokens_per_s: float | None = None) -> HttpError | None:
    """The HTTP error for a terminal reply; None for ``completed``."""
    status, reason = reply.status, reply.reason
    code = reason.value if reason is not None else status.value
    what = reply.detail or (reason.value.replace("_", " ") if reason else status.value)
    headers: dict[str, str] = {}
    hint = retry_after_header(reply.retry_after_ms)
    if hint is not None:
        headers["Retry-After"] = hint
        headers["retry-after-ms"] = str(reply.retry_after_ms)
    if status is ReplyStatus.COMPLETED:
        return None
    if status is ReplyStatus.REJECTED:
        if reason in _NEVER:
            return HttpError(400, f"request refused, and no wait would help: {what}",
                             "invalid_request_error", code)  # fmt: skip
        if reason in _RATE_LIMIT:
            headers.update(ratelimit_headers(reply, rate_tokens_per_s))
            return HttpError(429, f"rate limit reached: {what}", "rate_limit_exceeded", code,
                             headers=headers)  # fmt: skip
        return HttpError(503, f"no capacity now: {what}", "server_overloaded", code,
                         headers=headers)  # fmt: skip
    if status is ReplyStatus.TIMED_OUT:
        return HttpError(503, f"the request waited its longest queue time: {what}",
                         "server_overloaded", code, headers=headers)  # fmt: skip
    if status is ReplyStatus.INVALID:
        if reason in _NO_MODEL:
            return HttpError(404, what, "invalid_request_error", "model_not_found", "model")
        return HttpError(400, what, "invalid_request_error", code)
    return HttpError(500, f"the request failed: {what}", "server_error", code)


def timeout_error(request_id: str, timeout_s: float, retry_after_s: int) -> HttpError:
    return HttpError(
        408, f"no answer for {request_id} within {timeout_s:g} s; it may still run",
        "timeout", "reply_timeout", headers={"Retry-After": str(retry_after_s)},
    )  # fmt: skip


def auth_error() -> HttpError:
    return HttpError(401, "Incorrect API key provided.", "invalid_request_error",
                     "invalid_api_key", headers={"WWW-Authenticate": "Bearer"})  # fmt: skip


def bad_request(message: str, param: str | None = None) -> HttpError:
    return HttpError(400, message, "invalid_request_error", "invalid_request", param)


def unavailable(message: str) -> HttpError:
    return HttpError(503, message, "server_error", "unavailable",
                     headers={"Retry-After": "1"})  # fmt: skip


# --------------------------------------------------------------------------- bodies


def finish_reason(output_tokens: int | None, max_tokens: int) -> str:
    return "length" if output_tokens is not None and output_tokens >= max_tokens else "stop"


def usage(prompt_tokens: int, output_tokens: int | None) -> dict[str, int]:
    out = output_tokens or 0
    return {"prompt_tokens": prompt_tokens, "completion_tokens": out,
            "total_tokens": prompt_tokens + out}  # fmt: skip


@dataclass(frozen=True, slots=True)
class Shape:
    """What a response needs to know about its request."""

    id: str
    model: str
    chat: bool
    prompt_tokens: int
    max_tokens: int
    created: int = field(default_factory=lambda: int(time.time()))

    @property
    def object(self) -> str:
        return "chat.completion" if self.chat else "text_completion"


def completion_body(shape: Shape, reply: Reply) -> dict[str, Any]:
    """The 200 body of a finished request (OpenAI completion or chat completion)."""
    text = reply.text or ""
    reason = finish_reason(reply.output_tokens, shape.max_tokens)
    choice: dict[str, Any]
    if shape.chat:
        choice = {"index": 0, "message": {"role": "assistant", "content": text},
                  "logprobs": None, "finish_reason": reason}  # fmt: skip
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": reason}
    return {
        "id": shape.id, "object": shape.object, "created": shape.created,
        "model": shape.model, "choices": [choice],
        "usage": usage(shape.prompt_tokens, reply.output_tokens),
    }  # fmt: skip


def chunk_body(
    shape: Shape, *, text: str | None = None, role: bool = False,
    finish: str | None = None, usage_of: dict[str, int] | None = None,
) -> dict[str, Any]:
    """One SSE chunk (``chat.completion.chunk`` or a ``text_completion`` chunk).

    A usage chunk (``usage_of``) has no choices, as OpenAI sends it with
    ``stream_options.include_usage``."""
    choices: list[dict[str, Any]] = []
    if usage_of is None:
        if shape.chat:
            delta: dict[str, Any] = {}
            if role:
                delta["role"] = "assistant"
            if text is not None:
                delta["content"] = text
            choices = [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]
        else:
            choices = [{"index": 0, "text": text or "", "logprobs": None,
                        "finish_reason": finish}]  # fmt: skip
    return {
        "id": shape.id,
        "object": "chat.completion.chunk" if shape.chat else "text_completion",
        "created": shape.created, "model": shape.model, "choices": choices,
        **({"usage": usage_of} if usage_of is not None else {}),
    }  # fmt: skip
