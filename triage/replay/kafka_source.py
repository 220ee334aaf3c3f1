"""Recorded traffic from the Kafka topics: the tenants' request topics, the decisions topic
and the completions topic, for a time range.

Requests are selected by their message timestamp in [since, until] (offsets_for_times
finds where the range starts and ends on every partition, so a long retention costs
nothing outside it). Their decisions are read from a little before `since` (clock skew)
to `until + grace` (a request that arrived just before `until` is decided, and completes,
after it); completions over the same window give what each request really generated.

Every partition is scanned, up to its end as of the scan's start (triage/kafka/scan.py,
shared with audit). A scan that runs out of time is an
error, not a partial replay: a diff over part of the traffic would mislead.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass

from confluent_kafka import Consumer, KafkaException
from pydantic import ValidationError

from triage.kafka.clients import make_consumer
from triage.kafka.scan import ScanTimeoutError, left, scan_range
from triage.replay.errors import ReplaySourceError
from triage.replay.recording import ARRIVAL_OUTCOMES, DecisionLog, RecordedRequest, Recording
from triage.topics.messages import (
    CompletionStatus,
    DecisionRecord,
    InferenceRequest,
    completions_in,
)
from triage.topics.names import TopicNames
from triage.topics.validation import Invalid, Unparseable, parse_request

log = logging.getLogger(__name__)

TIMED_OUT = "reading the topics ran out of time (use a narrower range or a longer --timeout)"
CLOCK_SKEW_MS = 60_000  # decisions are read from this long before `since`
_NO_DECISION_RANK = 1 << 30  # requests with no recorded decision sort after those with one


@dataclass(frozen=True, slots=True)
class _Request:
    req: InferenceRequest
    timestamp_ms: int
    rank: int  # topic, partition: a deterministic tie-break
    offset: int


def read_kafka(
    *, bootstrap: str, names: TopicNames, tenants: Iterable[str] = (),
    since_ms: int | None, until_ms: int | None, grace_s: float = 600.0,
    timeout_s: float = 60.0,
) -> Recording:
    """The requests produced in [since_ms, until_ms] to the request topics of `tenants`
    and of every tenant whose topic exists under the prefix, with their decisions."""
    consumer = make_consumer(
        bootstrap, group_id=f"triage-replay-{uuid.uuid4().hex[:12]}",  # never commits
        **{"enable.partition.eof": True},
    )
    deadline = time.monotonic() + timeout_s
    try:
        return _read(consumer, bootstrap, names, tenants, since_ms, until_ms, grace_s, deadline)
    except ScanTimeoutError:
        raise ReplaySourceError(TIMED_OUT) from None
    except KafkaException as exc:
        raise ReplaySourceError(f"reading topics from {bootstrap} failed: {exc}") from exc
    finally:
        consumer.close()


def _read(
    consumer: Consumer, bootstrap: str, names: TopicNames, tenants: Iterable[str],
    since_ms: int | None, until_ms: int | None, grace_s: float, deadline: float,
) -> Recording:
    md = consumer.list_topics(timeout=left(deadline))  # one metadata request for all
    parts: dict[str, list[int]] = {}
    for name, tmd in md.topics.items():
        if tmd.error is None:
            parts[name] = sorted(tmd.partitions)
        else:
            log.warning("topic %s is not readable: %s", name, tmd.error.str())
    present = set(parts)
    wanted = {names.requests(t) for t in tenants}
    wanted |= {t for t in present if names.is_request_topic(t)}
    topics = sorted(t for t in wanted if t in present)
    if not topics:
        raise ReplaySourceError(
            f"no request topics {names.requests('<tenant>')} on {bootstrap}"
        )
    if names.decisions not in present:
        raise ReplaySourceError(f"decisions topic {names.decisions} is not on {bootstrap}")
    src = f"{names.decisions} and {len(topics)} request topic(s) on {bootstrap}"
    recording = Recording(source=src, since_ms=since_ms, until_ms=until_ms)

    requests: list[_Request] = []
    for i, topic in enumerate(topics):
        tenant = names.tenant_of_request_topic(topic)
        for m in scan_range(consumer, topic, parts[topic], since_ms=since_ms,
                            until_ms=until_ms, deadline=deadline):
            recording.scanned += 1
            parsed = parse_request(m.value)
            if isinstance(parsed, Unparseable):
                recording.skipped["unparseable request"] += 1
            elif isinstance(parsed, Invalid):
                recording.skipped["invalid request (schema)"] += 1
            elif tenant is not None and parsed.tenant != tenant:  # shared: as named
                recording.skipped["tenant differs from its topic's (invalid)"] += 1
            else:
                requests.append(_Request(parsed, m.timestamp_ms, i * 10_000 + m.partition,
                                         m.offset))
    if not requests:
        return recording
    ids = {r.req.request_id for r in requests}

    lo = None if since_ms is None else max(0, since_ms - CLOCK_SKEW_MS)
    hi = None if until_ms is None else until_ms + int(grace_s * 1000)
    decisions = DecisionLog()
    for m in scan_range(consumer, names.decisions, parts[names.decisions], since_ms=lo,
                        until_ms=hi, deadline=deadline):
        recording.scanned += 1
        try:
            rec = DecisionRecord.from_bytes(m.value or b"")
        except ValidationError:
            recording.skipped["unparseable decision"] += 1
            continue
        if rec.request_id in ids:
            decisions.add(rec, m.partition, m.offset)
    outputs: dict[str, int] = {}
    if names.completions in present:
        for m in scan_range(consumer, names.completions, parts[names.completions],
                            since_ms=lo, until_ms=hi, deadline=deadline):
            recording.scanned += 1
            try:
                done = completions_in(m.value or b"")
            except ValidationError:
                continue
            for c in done:
                if c.status is CompletionStatus.COMPLETED and c.request_id in ids:
                    outputs[c.request_id] = c.output_tokens

    for r in requests:
        req = r.req
        rid = req.request_id
        h = decisions.get(rid)
        first = h.first if h is not None and h.first.outcome in ARRIVAL_OUTCOMES else None
        if h is not None and first is not None:
            arrived, order = first.at_ms, h.first_pos
        else:
            arrived = r.timestamp_ms
            order = (arrived, _NO_DECISION_RANK + r.rank, r.offset)
        out = h.output_tokens if h is not None else None
        recording.requests.append(RecordedRequest(
            request_id=rid, tenant=req.tenant, model=req.model,
            prompt_tokens=req.prompt_tokens, max_tokens=req.max_tokens, arrived_ms=arrived,
            sla_s=None if req.sla_ms is None else req.sla_ms / 1000.0, first=first,
            final=h.final if h is not None and first is not None else None,
            output_tokens=out if out is not None else outputs.get(rid), order=order,
        ))
    return recording.finish()
