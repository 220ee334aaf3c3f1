"""Planning the next attempt after a refusal: the new request and when it may go.

Pure: the caller passes both clocks in. The monotonic clock measures the wait
(immune to wall-clock steps); the wall clock guards the contract that the retry
is never sent before ``reply.at_ms + retry_after_ms``, the instant the server
meant (its decision time plus the hint).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from triage.client.backoff import RetryPolicy, is_retryable, retry_delay_s, retry_request_id
from triage.topics.messages import InferenceRequest, Reply

RETRY_OF_KEY = "retry_of"  # metadata key naming the original request id on a retry
_MAX_METADATA = 64  # same bound as InferenceRequest.metadata


@dataclass(frozen=True, slots=True, kw_only=True)
class RetryPlan:
    """The next attempt: what to send, and the earliest moment to send it."""

    request: InferenceRequest  # the retry, with its derived id and attempt number
    retry_number: int  # 1 for the first retry
    due_monotonic: float  # monotonic seconds: the jittered wait ends here
    not_before_ms: int  # wall-clock ms: the server's hint ends here (at_ms + retry_after_ms)
    hint_ms: int  # the server's hint (0 when it gave none)

    def remaining_s(self, mono_now: float, wall_now_ms: float) -> float:
        """Seconds still to wait; 0 when the retry may go.

        The wall-clock floor only counts while the shortfall is within the hint, so a
        server clock far ahead of ours cannot stall the client indefinitely.
        """
        wait = self.due_monotonic - mono_now
        shortfall_ms = self.not_before_ms - wall_now_ms
        if 0 < shortfall_ms <= self.hint_ms:
            wait = max(wait, shortfall_ms / 1000.0)
        return max(0.0, wait)


def plan_retry(
    original: InferenceRequest,
    reply: Reply,
    attempts_so_far: int,
    *,
    policy: RetryPolicy,
    rng: random.Random,
    mono_now: float,
) -> RetryPlan | None:
    """The retry for a terminal ``reply``, or None when it is final (success, permanent, spent)."""
    if not is_retryable(reply) or attempts_so_far >= policy.max_attempts:
        return None
    n = attempts_so_far  # attempts 1..n done; this is retry number n
    hint_ms = max(0, reply.retry_after_ms or 0)
    delay = retry_delay_s(reply.retry_after_ms, n, policy=policy, rng=rng)
    metadata = dict(original.metadata)
    if len(metadata) < _MAX_METADATA or RETRY_OF_KEY in metadata:
        metadata[RETRY_OF_KEY] = original.request_id
    # Validated, not model_copy'd: the derived id and attempt must respect the wire bounds.
    retry = InferenceRequest.model_validate(
        {
            **original.model_dump(),
            "request_id": retry_request_id(original.request_id, n),
            "attempt": original.attempt + n,
            "metadata": metadata,
        }
    )
    return RetryPlan(
        request=retry,
        retry_number=n,
        due_monotonic=mono_now + delay,
        not_before_ms=reply.at_ms + hint_ms,
        hint_ms=hint_ms,
    )
