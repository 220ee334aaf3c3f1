"""Retry timing: never before the server's hint, bounded above, reproducible."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from triage.client.backoff import (
    MAX_ID_LEN,
    RetryPolicy,
    is_retryable,
    retry_delay_s,
    retry_request_id,
    spread_s,
)
from triage.client.retry import RETRY_OF_KEY, plan_retry
from triage.topics.messages import InferenceRequest, Reply
from triage.topics.reasons import ReasonCode, ReplyStatus

POLICY = RetryPolicy(max_attempts=4, base_s=0.1, cap_s=5.0, jitter_ratio=0.5)


def _reply(status: ReplyStatus, reason: ReasonCode | None = None, hint: int | None = None) -> Reply:
    return Reply(
        request_id="req-1",
        tenant="rag",
        status=status,
        reason=reason,
        retry_after_ms=hint,
        at_ms=1_000,
    )


def _request(**kw: object) -> InferenceRequest:
    data: dict[str, object] = {
        "request_id": "req-1", "tenant": "rag", "model": "llama-3.1-8b",
        "prompt_tokens": 100, "max_tokens": 50,
    }  # fmt: skip
    data.update(kw)
    return InferenceRequest.model_validate(data)


@given(
    hint_ms=st.integers(min_value=0, max_value=600_000),
    retry_number=st.integers(min_value=1, max_value=30),
    seed=st.integers(min_value=0, max_value=2**32),
)
def test_delay_is_never_below_the_hint_and_bounded_above(
    hint_ms: int, retry_number: int, seed: int
) -> None:
    delay = retry_delay_s(hint_ms, retry_number, policy=POLICY, rng=random.Random(seed))
    assert delay >= hint_ms / 1000
    assert delay <= hint_ms / 1000 + POLICY.cap_s
    assert delay <= hint_ms / 1000 + spread_s(hint_ms, retry_number, POLICY)


@given(
    retry_number=st.integers(min_value=1, max_value=30),
    seed=st.integers(min_value=0, max_value=2**32),
)
def test_delay_without_hint_is_full_jitter_up_to_the_exponential_cap(
    retry_number: int, seed: int
) -> None:
    delay = retry_delay_s(None, retry_number, policy=POLICY, rng=random.Random(seed))
    assert 0.0 <= delay <= min(POLICY.cap_s, POLICY.base_s * 2 ** (retry_number - 1))


def test_jitter_spreads_above_the_hint() -> None:
    """Many clients told the same hint do not all come back at the same instant."""
    rng = random.Random(7)
    delays = [retry_delay_s(1_200, 1, policy=POLICY, rng=rng) for _ in range(200)]
    assert min(delays) >= 1.2
    assert max(delays) <= 1.2 + 0.6  # jitter_ratio 0.5 of the hint
    assert max(delays) - min(delays) > 0.3  # actually spread, not a constant


def test_same_seed_same_schedule() -> None:
    a = [retry_delay_s(500, n, policy=POLICY, rng=random.Random(42)) for n in range(1, 6)]
    b = [retry_delay_s(500, n, policy=POLICY, rng=random.Random(42)) for n in range(1, 6)]
    c = [retry_delay_s(500, n, policy=POLICY, rng=random.Random(43)) for n in range(1, 6)]
    assert a == b
    assert a != c


def test_retry_number_is_one_based() -> None:
    with pytest.raises(ValueError, match="1-based"):
        retry_delay_s(100, 0, policy=POLICY, rng=random.Random(0))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"max_attempts": 0}, "max_attempts"),
        ({"base_s": 0.0}, "base_s"),
        ({"jitter_ratio": -1.0}, "jitter"),
    ],
)
def test_policy_rejects_nonsense(kwargs: dict[str, float], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        RetryPolicy(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("status", "reason", "expected"),
    [
        (ReplyStatus.REJECTED, ReasonCode.TENANT_QUOTA_EXCEEDED, True),
        (ReplyStatus.REJECTED, ReasonCode.QUEUE_FULL, True),
        (ReplyStatus.TIMED_OUT, ReasonCode.QUEUE_TIMEOUT, True),
        (ReplyStatus.REJECTED, ReasonCode.QUOTA_NEVER_FITS, False),
        (ReplyStatus.REJECTED, ReasonCode.SLA_INFEASIBLE, False),
        (ReplyStatus.INVALID, ReasonCode.INVALID_REQUEST, False),
        (ReplyStatus.INVALID, ReasonCode.CONTEXT_OVERFLOW, False),
        (ReplyStatus.FAILED, ReasonCode.FAILED, False),
        (ReplyStatus.COMPLETED, ReasonCode.COMPLETED, False),
    ],
)
def test_what_is_retried(status: ReplyStatus, reason: ReasonCode, expected: bool) -> None:
    assert is_retryable(_reply(status, reason, 100)) is expected


def test_retry_ids_derive_from_the_original() -> None:
    assert retry_request_id("req-1", 1) == "req-1.r1"
    assert retry_request_id("req-1", 2) == "req-1.r2"
    long_a, long_b = "a" * 127 + "x", "a" * 127 + "y"
    ra, rb = retry_request_id(long_a, 1), retry_request_id(long_b, 1)
    assert len(ra) <= MAX_ID_LEN and ra.endswith(".r1")
    assert ra != rb
    _request(request_id=ra)  # still a valid wire id


def test_plan_retry_builds_the_next_attempt() -> None:
    original = _request(attempt=0, metadata={"job": "s1"})
    reply = _reply(ReplyStatus.REJECTED, ReasonCode.TENANT_QUOTA_EXCEEDED, 300)
    plan = plan_retry(original, reply, 1, policy=POLICY, rng=random.Random(1), mono_now=100.0)
    assert plan is not None
    assert plan.request.request_id == "req-1.r1"
    assert plan.request.attempt == 1
    assert plan.request.metadata == {"job": "s1", RETRY_OF_KEY: "req-1"}
    assert plan.not_before_ms == reply.at_ms + 300
    assert plan.due_monotonic >= 100.3
    second = plan_retry(original, reply, 2, policy=POLICY, rng=random.Random(1), mono_now=0.0)
    assert second is not None and second.request.request_id == "req-1.r2"
    assert second.request.attempt == 2


def test_plan_retry_stops_when_final_or_spent() -> None:
    original = _request()
    rng = random.Random(0)
    invalid = _reply(ReplyStatus.INVALID, ReasonCode.INVALID_REQUEST)
    assert plan_retry(original, invalid, 1, policy=POLICY, rng=rng, mono_now=0.0) is None
    rejected = _reply(ReplyStatus.REJECTED, ReasonCode.QUEUE_FULL, 10)
    assert (
        plan_retry(original, rejected, POLICY.max_attempts, policy=POLICY, rng=rng, mono_now=0.0)
        is None
    )


def test_remaining_wait_honours_the_wall_clock_hint() -> None:
    reply = _reply(ReplyStatus.REJECTED, ReasonCode.TENANT_QUOTA_EXCEEDED, 300)
    plan = plan_retry(_request(), reply, 1, policy=POLICY, rng=random.Random(3), mono_now=0.0)
    assert plan is not None
    # the monotonic wait is over, but the wall clock says the hint has 50 ms to go
    assert plan.remaining_s(plan.due_monotonic, reply.at_ms + 250) == pytest.approx(0.05)
    assert plan.remaining_s(plan.due_monotonic, reply.at_ms + 300) == 0.0
    # a server clock far ahead of ours cannot stall the retry forever
    assert plan.remaining_s(plan.due_monotonic, reply.at_ms - 10_000) == 0.0
