"""Answers the shell gives without the core: dead letters, `invalid` replies, and the
rejection of live requests whose tenant or pool left the configuration.

Each keeps the service's promise for odd input: a message is answered or
dead-lettered, never both silently dropped, and a request id gets at most one
terminal reply. An `invalid` answer writes a done record for its id (as a decision
does), so a redelivery, or another body under the same id, gets nothing new; a body
under the id of a request that is live or done is dead-lettered, not answered, so it
cannot end that request with a false `invalid`.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from triage.streams import codec
from triage.streams.metrics import AdmissionMetrics
from triage.streams.outbox import Outbox
from triage.streams.store import StateStore
from triage.topics.jsonsafe import safe_text
from triage.topics.messages import (
    ControlKind,
    ControlMessage,
    DeadLetter,
    DeadLetterStage,
    DecisionInputs,
    DecisionRecord,
    LiveRequest,
    LiveState,
    Reply,
)
from triage.topics.names import TopicNames
from triage.topics.reasons import Outcome, ReasonCode, ReplyStatus
from triage.topics.validation import DETAIL_MAX, Invalid, answerable_id

log = logging.getLogger(__name__)

KEY_MAX_BYTES = 1024  # a dead letter's Kafka key: the original key, cut
FAILURE_LOG_EVERY_S = 10.0  # a handler that keeps failing logs its traceback this often


class Refusals:
    """Writes refusals to the outbox and their dedupe records to the store."""

    def __init__(
        self, *, names: TopicNames, outbox: Outbox, store: StateStore,
        metrics: AdmissionMetrics, done: deque[tuple[float, str]], keep_bytes: int,
    ) -> None:
        self.names = names
        self.outbox = outbox
        self.store = store
        self.metrics = metrics
        self.done = done  # the service's expiry index of done records
        self.keep_bytes = keep_bytes

    def dead_letter(
        self, topic: str, partition: int | None, offset: int | None, key: bytes | None,
        value: bytes | None, error: str, stage: DeadLetterStage, now: float,
    ) -> None:
        dl = DeadLetter.of(source_topic=topic, partition=partition, offset=offset, key=key,
                           value=value, error=error, stage=stage, at_ms=codec.ms(now),
                           keep_bytes=self.keep_bytes)
        self.outbox.send_raw(self.names.deadletter, key[:KEY_MAX_BYTES] if key else None,
                             dl.to_bytes())

    def prior_state(self, request_id: str, live_in_core: bool) -> str | None:
        """How far a request id already got (`queued`, `running`, `done`), or None."""
        rec = self.store.get_request(request_id) if self.store.has_request(request_id) else None
        if rec is not None:
            return rec.state.value
        return "live" if live_in_core else None

    def invalid(
        self, tenant: str, problem: Invalid, *, live_in_core: bool, policy: tuple[str, str],
        topic: str, partition: int | None, offset: int | None, key: bytes | None,
        value: bytes | None, now: float, kept: bool = False,
    ) -> None:
        """Answer `invalid` on the topic's tenant's reply topic, keep the bytes as a dead
        letter, record the decision; or, for an id already taken, only the dead letter.
        `kept`: the shard that forwarded this verdict dead-lettered the bytes already."""
        rid = problem.request_id
        prior = self.prior_state(rid, live_in_core)
        if prior is not None:
            self.metrics.duplicates.labels(tenant).inc()
            if not kept:
                self.dead_letter(topic, partition, offset, key, value,
                                 f"request id {rid!r} is already {prior}: this message is "
                                 f"not answered, the first request's answer stands "
                                 f"({problem.detail})", "gate", now)
            return
        self.metrics.invalid.labels(tenant, problem.reason.value).inc()
        if not kept:
            self.dead_letter(topic, partition, offset, key, value, problem.detail, "gate", now)
        if not self.names.is_request_topic(topic):
            return  # not a request topic: nobody to answer
        model = problem.model or "unknown"
        reply = Reply(request_id=rid, tenant=tenant, status=ReplyStatus.INVALID,
                      reason=problem.reason, detail=problem.detail[:DETAIL_MAX],
                      at_ms=codec.ms(now))
        self.outbox.send(self.names.replies(tenant), rid, reply)
        self.outbox.send(self.names.decisions, rid, DecisionRecord(
            request_id=rid, tenant=tenant, model=model, outcome=Outcome.INVALID,
            reason=problem.reason, policy=policy[0], policy_version=policy[1],
            at_ms=codec.ms(now), inputs=DecisionInputs(detail=problem.detail[:DETAIL_MAX]),
        ))
        self.metrics.admissions.labels(tenant, model, Outcome.INVALID.value,
                                       problem.reason.value).inc()
        self._done(rid, codec.answered_record(rid, tenant, model, _plain(reply), now), now)

    def withdraw(
        self, rec: LiveRequest, reason: ReasonCode, detail: str, *, policy: tuple[str, str],
        now: float,
    ) -> None:
        """End a live request the configuration no longer serves: `rejected` with the
        reason, a cancel to its GPU if it runs, and a done record."""
        rid = rec.request_id
        reply = Reply(request_id=rid, tenant=rec.tenant, status=ReplyStatus.REJECTED,
                      reason=reason, detail=detail[:DETAIL_MAX], at_ms=codec.ms(now))
        if rec.state is LiveState.RUNNING and rec.gpu_id:
            self.outbox.send(self.names.gpu_control(rec.gpu_id), rid, ControlMessage(
                kind=ControlKind.CANCEL, request_id=rid, attempt=rec.attempt,
                gpu_id=rec.gpu_id, reason=reason, at_ms=codec.ms(now)))
        self.outbox.send(self.names.replies(rec.tenant), rid, reply)
        self.outbox.send(self.names.decisions, rid, DecisionRecord(
            request_id=rid, tenant=rec.tenant, model=rec.model, pool=rec.pool,
            outcome=Outcome.REJECT, reason=reason, gpu_id=rec.gpu_id, policy=policy[0],
            policy_version=policy[1], at_ms=codec.ms(now),
            inputs=DecisionInputs(detail=detail[:DETAIL_MAX]),
        ))
        self.metrics.admissions.labels(rec.tenant, rec.model, Outcome.REJECT.value,
                                       reason.value).inc()
        raw = self.store.get_request_raw(rid)
        if raw is not None:
            self._done(rid, codec.finished_record(raw, _plain(reply), now), now)
        log.warning("withdrew %s request %s of tenant %s: %s", rec.state.value, rid,
                    rec.tenant, detail)

    def failed(
        self, exc: Exception, *, topic: str, partition: int | None, offset: int | None,
        key: bytes | None, value: bytes | None, stage: DeadLetterStage, now: float,
        live_in_core: Callable[[str], bool] | None = None,
        policy: Callable[[], tuple[str, str]] | None = None,
    ) -> None:
        """After a handler raised on a message: dead-letter it; a request that names an
        id not taken yet is also answered `invalid` (retrying it would fail the same
        way). Never raises."""
        detail = (f"internal error handling this message ({type(exc).__name__}: "
                  f"{safe_text(str(exc), 300)})")
        tenant = self.names.tenant_to_answer(topic) if stage == "gate" else None
        if tenant is not None and live_in_core is not None and policy is not None:
            try:
                rid = answerable_id(value)
                if rid is not None:
                    self.invalid(tenant, Invalid(rid, ReasonCode.INVALID_REQUEST, detail),
                                 live_in_core=live_in_core(rid), policy=policy(), topic=topic,
                                 partition=partition, offset=offset, key=key, value=value,
                                 now=now)
                    return
            except Exception:
                log.exception("could not answer %s[%s]@%s after its handler failed", topic,
                              partition, offset)
        try:
            self.dead_letter(topic, partition, offset, key, value, detail, stage, now)
        except Exception:
            log.exception("could not dead-letter %s[%s]@%s after its handler failed", topic,
                          partition, offset)

    def _done(self, rid: str, record: bytes, now: float) -> None:
        self.store.put_request_raw(rid, record)
        self.done.append((now, rid))


def _plain(reply: Reply) -> dict[str, Any]:
    return reply.model_dump(mode="json", exclude_none=True)


class FailureLog:
    """Counts handler failures and logs each one; a handler that keeps failing (a tick,
    every 50 ms) logs its traceback at most every 10 s."""

    def __init__(self, metrics: AdmissionMetrics) -> None:
        self.metrics = metrics
        self._logged: dict[str, float] = {}

    def log(self, handler: str, exc: Exception, topic: str, partition: int | None,
            offset: int | None) -> None:
        self.metrics.handler_errors.labels(handler).inc()
        mono = time.monotonic()
        if mono - self._logged.get(handler, -FAILURE_LOG_EVERY_S) >= FAILURE_LOG_EVERY_S:
            self._logged[handler] = mono
            log.error("%s handler failed on %s[%s]@%s; the agent goes on", handler, topic,
                      partition, offset, exc_info=exc)
        else:
            log.error("%s handler failed on %s[%s]@%s: %s: %s", handler, topic, partition,
                      offset, type(exc).__name__, safe_text(str(exc), 300))
