"""Errors of the tenant client.

A refusal from admission is not an error here: it comes back as a Reply with a
status. These exceptions are for what the client itself could not do.
"""

from __future__ import annotations

from collections.abc import Sequence

from triage.topics.messages import Reply


class ClientError(Exception):
    """Base for the tenant client's errors."""


class ClientClosedError(ClientError):
    """The client was closed (or its reply reader died) before the reply came."""


class WrongTenantError(ClientError, ValueError):
    """The request names another tenant than the client's; admission would refuse it."""


class DuplicateRequestError(ClientError, ValueError):
    """A request with this id is already awaiting its reply on this client."""


class DeliveryError(ClientError):
    """The broker did not accept the request (after the producer's own retries)."""


class ReplyTopicError(ClientError):
    """The tenant's reply topic is missing or unreadable, so no reply could be awaited."""


class ReplyTimeoutError(ClientError, TimeoutError):
    """No terminal reply within the timeout. The request may still run: do not resend blindly."""

    def __init__(self, request_id: str, timeout_s: float, history: Sequence[Reply] = ()) -> None:
        self.request_id = request_id
        self.timeout_s = timeout_s
        self.history: tuple[Reply, ...] = tuple(history)
        last = f"; last status {history[-1].status.value}" if history else ""
        super().__init__(f"no terminal reply for {request_id} within {timeout_s:g} s{last}")
