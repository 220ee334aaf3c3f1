"""When to retry a refused request, and after how long.

Pure functions over a seeded RNG so the schedule can be tested exactly.

The server computes ``retry_after_ms`` (the time until the tenant's bucket holds
enough tokens, or the predicted drain time of the queue ahead), so retrying
sooner is wasted work: it is refused again. The client therefore waits *at
least* the hint and adds full jitter *above* it, so that many clients told the
same hint at the same moment do not come back in one synchronized wave.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass

from triage.topics.messages import Reply
from triage.topics.reasons import ReasonCode, ReplyStatus

# Refusals that no amount of waiting fixes: the request as written can never be served.
PERMANENT_REASONS: frozenset[ReasonCode] = frozenset(
    {ReasonCode.QUOTA_NEVER_FITS, ReasonCode.SLA_INFEASIBLE}
)
RETRYABLE_STATUSES: frozenset[ReplyStatus] = frozenset(
    {ReplyStatus.REJECTED, ReplyStatus.TIMED_OUT}
)
MAX_ID_LEN = 128  # same bound as messages.RequestId


@dataclass(frozen=True, slots=True, kw_only=True)
class RetryPolicy:
    """How many attempts, and how the wait between them is drawn."""

    max_attempts: int = 5  # total attempts including the first; 1 disables retries
    base_s: float = 0.1  # first no-hint backoff ceiling; doubles per retry
    cap_s: float = 30.0  # the jitter spread never exceeds this (the hint itself may)
    jitter_ratio: float = 0.5  # spread above a hint, as a fraction of the hint

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {self.max_attempts}")
        if not 0 < self.base_s <= self.cap_s:
            raise ValueError(f"need 0 < base_s <= cap_s, got {self.base_s} and {self.cap_s}")
        if self.jitter_ratio < 0:
            raise ValueError(f"jitter_ratio must be >= 0, got {self.jitter_ratio}")


def is_retryable(reply: Reply) -> bool:
    """Rejected and timed-out replies are retried, unless their reason is permanent.

    ``invalid`` is never retried (the request is wrong as written), nor ``failed``
    (the work ran and broke; resending could run it twice).
    """
    return reply.status in RETRYABLE_STATUSES and reply.reason not in PERMANENT_REASONS


def spread_s(hint_ms: int | None, retry_number: int, policy: RetryPolicy) -> float:
    """Width of the jitter window for the n-th retry (1-based)."""
    exponential = min(policy.cap_s, policy.base_s * 2.0 ** max(0, retry_number - 1))
    if hint_ms is None:
        return exponential
    return min(policy.cap_s, max(policy.jitter_ratio * hint_ms / 1000.0, exponential))


def retry_delay_s(
    hint_ms: int | None, retry_number: int, *, policy: RetryPolicy, rng: random.Random
) -> float:
    """Seconds to wait before the n-th retry (1-based).

    With a hint: uniform in ``[hint, hint + spread]``, never below the hint.
    Without one: classic full jitter, uniform in ``[0, base * 2^(n-1)]`` capped.
    """
    if retry_number < 1:
        raise ValueError(f"retry_number is 1-based, got {retry_number}")
    hint_s = 0.0 if hint_ms is None else max(0, hint_ms) / 1000.0
    return hint_s + rng.uniform(0.0, spread_s(hint_ms, retry_number, policy))


def retry_request_id(original_id: str, retry_number: int) -> str:
    """``<id>.r<n>``, derived from the original (not chained), within the 128-char id bound.

    A too-long original is shortened and tagged with a hash of the full id so two
    long ids sharing a prefix do not collide.
    """
    suffix = f".r{retry_number}"
    if len(original_id) + len(suffix) <= MAX_ID_LEN:
        return original_id + suffix
    tag = "=" + hashlib.sha1(original_id.encode()).hexdigest()[:8]
    keep = MAX_ID_LEN - len(suffix) - len(tag)
    return original_id[:keep] + tag + suffix
