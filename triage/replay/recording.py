"""Recorded traffic, reduced to what replay needs: per request its shape, when it arrived,
its first decision and its final one.

Both sources (the Kafka topics, an export file) feed a DecisionLog with DecisionRecords
in read order. It keeps a constant number of records per request, so a long range costs
memory per request, not per decision. Records are ordered by (at_ms, read position): a
redelivered duplicate or interleaved partitions cannot change which record is first.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

from triage.audit.explain import TERMINAL_OUTCOMES
from triage.topics.messages import DecisionRecord
from triage.topics.reasons import Outcome, ReasonCode, reply_status

# Outcomes a request's first decision can have: the core answers an arrival with one.
ARRIVAL_OUTCOMES: frozenset[Outcome] = frozenset(
    {Outcome.ACCEPT, Outcome.QUEUE, Outcome.REJECT, Outcome.INVALID}
)
UNSETTLED = "unsettled"

Position = tuple[int, int, int]  # (at_ms, partition or 0, offset or line number)


def final_label(outcome: Outcome | None, reason: ReasonCode | None) -> str:
    """How a request ended, in one word: completed, failed, rejected, timed_out, invalid,
    or unsettled (no terminal decision)."""
    if outcome is None or reason is None:
        return UNSETTLED
    status = reply_status(outcome, reason)
    return status.value if status.terminal else UNSETTLED


@dataclass(slots=True)
class History:
    """What the log keeps of one request's records."""

    first: DecisionRecord
    first_pos: Position
    final: DecisionRecord | None = None  # the latest terminal record
    final_pos: Position = (-1, 0, 0)
    prompt_tokens: int | None = None  # the shape, from whichever record carries it
    max_tokens: int | None = None
    output_tokens: int | None = None  # from a completed COMPLETE record


class DecisionLog:
    """DecisionRecords folded per request as they are read."""

    def __init__(self) -> None:
        self._by_id: dict[str, History] = {}
        self.records = 0

    def add(self, rec: DecisionRecord, partition: int, offset: int) -> None:
        self.records += 1
        pos: Position = (rec.at_ms, partition, offset)
        h = self._by_id.get(rec.request_id)
        if h is None:
            h = self._by_id[rec.request_id] = History(rec, pos)
        elif pos < h.first_pos:
            h.first, h.first_pos = rec, pos
        if rec.outcome in TERMINAL_OUTCOMES and pos >= h.final_pos:
            h.final, h.final_pos = rec, pos
        i = rec.inputs
        if i.prompt_tokens is not None and i.max_tokens is not None:
            h.prompt_tokens, h.max_tokens = i.prompt_tokens, i.max_tokens
        if rec.reason is ReasonCode.COMPLETED and i.output_tokens is not None:
            h.output_tokens = i.output_tokens

    def get(self, request_id: str) -> History | None:
        return self._by_id.get(request_id)

    def items(self) -> Iterator[tuple[str, History]]:
        return iter(self._by_id.items())

    def __len__(self) -> int:
        return len(self._by_id)


@dataclass(frozen=True, slots=True)
class RecordedRequest:
    """One recorded request, ready to replay, with what was decided about it."""

    request_id: str
    tenant: str
    model: str
    prompt_tokens: int
    max_tokens: int
    arrived_ms: int  # when the core first decided about it (else the request's timestamp)
    sla_s: float | None  # its SLA (None: the tenant's, as configured for the replay)
    first: DecisionRecord | None  # the recorded arrival decision (None: none recorded)
    final: DecisionRecord | None  # the recorded terminal decision (None: unsettled)
    output_tokens: int | None  # what a recorded completion generated (None: unknown)
    order: Position  # replay order: arrival time, then the read position

    @property
    def recorded_final(self) -> str:
        f = self.final
        return final_label(f.outcome, f.reason) if f is not None else UNSETTLED


@dataclass(slots=True)
class Recording:
    """The requests of one time range, in arrival order, and what could not be used."""

    source: str  # where they were read, for the report
    since_ms: int | None
    until_ms: int | None
    requests: list[RecordedRequest] = field(default_factory=list)
    skipped: Counter[str] = field(default_factory=Counter)  # reason -> requests left out
    scanned: int = 0  # messages or lines read

    def finish(self) -> Recording:
        """Sort into replay order and drop repeated request ids (the first one stands)."""
        self.requests.sort(key=lambda r: r.order)
        seen: set[str] = set()
        unique = []
        for r in self.requests:
            if r.request_id in seen:
                self.skipped["duplicate request id"] += 1
                continue
            seen.add(r.request_id)
            unique.append(r)
        self.requests = unique
        return self

    def recorded_policies(self) -> Counter[str]:
        """`name vVERSION` of the policies that made the recorded first decisions."""
        return Counter(
            f"{r.first.policy} v{r.first.policy_version}" for r in self.requests
            if r.first is not None
        )
