"""Explain one request's decisions in plain words, and as JSON.

Pure: takes the DecisionRecords of one request (any order, duplicates allowed,
since the decisions topic is at-least-once) and returns an Explanation. The
headline is the decision that settled the request; the steps are its history
(queued, dispatched, preempted, completed...) with each step's sentence.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Self

from pydantic import BaseModel, ConfigDict

from triage.audit.errors import NoDecisionsError
from triage.audit.sentences import sentence
from triage.audit.units import millis
from triage.topics.messages import DecisionRecord
from triage.topics.reasons import Outcome, ReasonCode

TERMINAL_OUTCOMES: frozenset[Outcome] = frozenset(
    {Outcome.REJECT, Outcome.TIMEOUT, Outcome.COMPLETE, Outcome.INVALID}
)


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ExplainedDecision(_Frozen):
    """One decision of the history, with its sentence."""

    offset_ms: int  # since the request's first decision
    sentence: str
    record: DecisionRecord


class Explanation(_Frozen):
    """Why a request went the way it did: the JSON form of ``triage audit``."""

    request_id: str
    tenant: str
    model: str
    outcome: Outcome  # of the headline decision
    reason: ReasonCode
    settled: bool  # a terminal decision (reject, timeout, complete, invalid) was recorded
    retry_after_ms: int | None
    summary: str  # the headline sentence, plus the wait when the request was queued first
    steps: list[ExplainedDecision]

    def to_json(self, *, indent: int | None = None) -> str:
        return self.model_dump_json(indent=indent)

    @classmethod
    def from_json(cls, text: str | bytes) -> Self:
        return cls.model_validate_json(text)


def ordered(records: Iterable[DecisionRecord]) -> list[DecisionRecord]:
    """Time order, stable for equal times (topic order), identical redeliveries dropped."""
    seen: set[bytes] = set()
    unique = []
    for r in records:
        key = r.to_bytes()
        if key not in seen:
            seen.add(key)
            unique.append(r)
    return sorted(unique, key=lambda r: r.at_ms)


def headline(records: list[DecisionRecord]) -> DecisionRecord:
    """The decision that settled the request: its last terminal one, else its latest.

    A DUPLICATE record (a redelivery answered with the first decision) never
    replaces the real outcome as the headline.
    """
    real = [r for r in records if r.reason != ReasonCode.DUPLICATE] or records
    terminal = [r for r in real if r.outcome in TERMINAL_OUTCOMES]
    return (terminal or real)[-1]


def explain(records: Iterable[DecisionRecord]) -> Explanation:
    """Explain one request's history. Raises NoDecisionsError on an empty history."""
    history = ordered(records)
    if not history:
        raise NoDecisionsError("no decisions to explain")
    ids = {r.request_id for r in history}
    if len(ids) > 1:
        raise ValueError(f"records of several requests given: {sorted(ids)}")
    head = headline(history)
    first_ms = history[0].at_ms
    steps = [
        ExplainedDecision(offset_ms=r.at_ms - first_ms, sentence=sentence(r), record=r)
        for r in history
    ]
    summary = sentence(head)
    if head.outcome in TERMINAL_OUTCOMES and len(history) > 1:
        took = millis(head.at_ms - first_ms)
        summary += f" That came {took} after its first decision ({len(history)} decisions in all)."
    elif head.outcome not in TERMINAL_OUTCOMES:
        summary += " No final decision is recorded yet."
    return Explanation(
        request_id=head.request_id,
        tenant=head.tenant,
        model=head.model,
        outcome=head.outcome,
        reason=head.reason,
        settled=head.outcome in TERMINAL_OUTCOMES,
        retry_after_ms=head.retry_after_ms,
        summary=summary,
        steps=steps,
    )
