"""Read one request's DecisionRecords: from the decisions topic, or from an export file.

Which partitions to scan: all of them. Decisions are keyed by request_id, but the
key -> partition mapping is not one we can recompute reliably at read time:
the Faust app (aiokafka) partitions keys with murmur2 like Java, while
confluent-kafka/librdkafka defaults to ``consistent_random`` (CRC32) unless
told ``partitioner=murmur2_random``, so two writers can place one key on two
partitions; and a topic whose partition count grew since the write maps the key
elsewhere now. Scanning every partition is always right; ``since_ms`` (seek by
timestamp with offsets_for_times) is what bounds the cost on a long-retention log.

Matching is on the parsed value's request_id, not the key bytes, so a writer that
serializes keys differently (raw vs JSON-quoted) cannot hide records.
"""

from __future__ import annotations

import logging
import re
import sys
import time
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from confluent_kafka import Consumer, KafkaException
from pydantic import ValidationError

from triage.audit.errors import DecisionSourceError, InvalidSinceError
from triage.kafka.clients import make_consumer
from triage.kafka.scan import ScanTimeoutError, scan_range
from triage.topics.messages import DecisionRecord

log = logging.getLogger(__name__)

_AGE_PART = r"(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)"
_RELATIVE = re.compile(rf"^(?:{_AGE_PART}\s*)+$")  # 90s, 15m, 2h, 3d, 1h30m, 1d 12h
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


@dataclass(slots=True)
class ScanResult:
    """What a scan found, and how much it looked at (for a useful 'not found' message)."""

    records: list[DecisionRecord] = field(default_factory=list)
    scanned: int = 0  # messages (or lines) looked at
    partitions: int = 0  # partitions scanned (0 for a file)
    unparseable: int = 0  # candidates that mentioned the id but did not parse
    complete: bool = True  # False when the scan stopped at its timeout


def parse_since(text: str, *, now_ms: int) -> int:
    """``--since``: epoch milliseconds, a relative age (``90s``, ``15m``, ``2h``, ``3d``, or
    compound: ``1h30m``), or an ISO-8601 time (``Z`` or an offset; a naive time is read as
    UTC). Returns epoch milliseconds.

    Hand-written on purpose: the three forms are exact and need 15 lines; dateparser reads
    natural language (locale-dependent, a heavy import) and would accept inputs this
    contract must refuse, and the stdlib's ``fromisoformat`` already takes ISO 8601."""
    t = text.strip()
    if t.isdigit():
        return int(t)
    if _RELATIVE.fullmatch(t):
        age = sum(float(n) * _UNIT_MS[unit] for n, unit in re.findall(_AGE_PART, t))
        return now_ms - int(age)
    try:
        when = datetime.fromisoformat(t)
    except ValueError:
        raise InvalidSinceError(
            f"--since {text!r}: use epoch ms, an age like 15m / 2h / 3d, or an ISO time"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return int(when.timestamp() * 1000)


def _match(raw: bytes | str | None, request_id: str, needle: bytes) -> DecisionRecord | None:
    """Parse only values that mention the id (cheap substring test first)."""
    if raw is None:
        return None
    data = raw.encode() if isinstance(raw, str) else raw
    if needle not in data:
        return None
    rec = DecisionRecord.from_bytes(data)  # ValidationError for the caller to count
    return rec if rec.request_id == request_id else None


def read_decisions(
    *,
    bootstrap: str,
    topic: str,
    request_id: str,
    since_ms: int | None = None,
    timeout_s: float = 30.0,
) -> ScanResult:
    """Scan every partition of ``topic`` up to its end as of now; keep ``request_id``'s records."""
    consumer = make_consumer(
        bootstrap,
        group_id=f"triage-audit-{uuid.uuid4().hex[:12]}",  # never commits: leaves no trace
        **{"enable.partition.eof": True},
    )
    try:
        return _scan(consumer, topic, request_id, since_ms, timeout_s)
    except KafkaException as exc:
        raise DecisionSourceError(f"reading {topic} from {bootstrap} failed: {exc}") from exc
    finally:
        consumer.close()


def _scan(
    consumer: Consumer, topic: str, request_id: str, since_ms: int | None, timeout_s: float
) -> ScanResult:
    deadline = time.monotonic() + timeout_s
    md = consumer.list_topics(topic, timeout=max(1.0, timeout_s))
    tmd = md.topics.get(topic)
    if tmd is None or tmd.error is not None:
        why = tmd.error.str() if tmd is not None and tmd.error is not None else "missing"
        raise DecisionSourceError(f"decisions topic {topic} is not readable ({why})")
    result = ScanResult(partitions=len(tmd.partitions))
    needle = request_id.encode()
    try:
        for m in scan_range(consumer, topic, tmd.partitions, since_ms=since_ms, until_ms=None,
                            deadline=deadline):
            result.scanned += 1
            try:
                rec = _match(m.value, request_id, needle)
            except ValidationError as exc:
                result.unparseable += 1
                log.warning("unparseable decision at %s[%s]@%s: %s", topic, m.partition,
                            m.offset, exc)
                continue
            if rec is not None:
                result.records.append(rec)
    except ScanTimeoutError:
        result.complete = False
        log.warning("scan of %s stopped at its %.0f s timeout", topic, timeout_s)
    result.records.sort(key=lambda r: r.at_ms)  # partitions interleave: restore time order
    return result


@contextmanager
def export_lines(
    path: str | Path, error: type[Exception]
) -> Iterator[tuple[Iterable[bytes], str]]:
    """A decisions export's lines and the name to report them by (``-``: stdin). A file
    that cannot be opened or read raises `error` with the reason (audit and replay both
    read exports, each with its own source error)."""
    try:
        if str(path) == "-":
            yield sys.stdin.buffer, "<stdin>"
            return
        with Path(path).open("rb") as stream:
            yield stream, str(path)
    except OSError as exc:
        raise error(f"{path}: cannot read: {exc.strerror or exc}") from None


def read_decisions_file(
    path: str | Path, *, request_id: str, since_ms: int | None = None
) -> ScanResult:
    """The same from an export: JSON lines of DecisionRecord (``-`` reads stdin)."""
    with export_lines(path, DecisionSourceError) as (lines, name):
        return _scan_lines(lines, name, request_id, since_ms)


def _scan_lines(
    stream: Iterable[bytes], name: str, request_id: str, since_ms: int | None
) -> ScanResult:
    result = ScanResult()
    needle = request_id.encode()
    for lineno, line in enumerate(stream, start=1):
        if not line.strip():
            continue
        result.scanned += 1
        try:
            rec = _match(line, request_id, needle)
        except ValidationError as exc:
            result.unparseable += 1
            e = exc.errors()[0]  # one line: the first bad field (pydantic's text spans many)
            where = ".".join(map(str, e["loc"])) or "line"
            log.warning("%s:%d: not a DecisionRecord: %s: %s", name, lineno, where, e["msg"])
            continue
        if rec is not None and (since_ms is None or rec.at_ms >= since_ms):
            result.records.append(rec)
    return result
