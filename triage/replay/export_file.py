"""Recorded traffic from a decisions export, and the export replay writes for later.

An export is JSON lines of DecisionRecord, as the decisions topic holds and `triage
audit --from-file` reads. A request can be replayed from it when its arrival decision
is in the file and carries the request's shape (inputs.prompt_tokens and max_tokens,
which the admission app records on the decision made at arrival). `triage replay
--save` writes such a file from the Kafka topics, so a range can be replayed offline.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path
from typing import IO

from pydantic import ValidationError

from triage.audit.reader import export_lines
from triage.replay.errors import ReplaySourceError
from triage.replay.recording import ARRIVAL_OUTCOMES, DecisionLog, RecordedRequest, Recording
from triage.topics.messages import DecisionRecord
from triage.topics.reasons import Outcome, ReasonCode

log = logging.getLogger(__name__)

NO_ARRIVAL = "arrival decision not in the source"
INVALID_WHEN_RECORDED = "invalid when recorded (nothing to replay)"
NO_SHAPE = "request shape not recorded (prompt/max tokens)"


def in_range(at_ms: int, since_ms: int | None, until_ms: int | None) -> bool:
    return (since_ms is None or at_ms >= since_ms) and (until_ms is None or at_ms <= until_ms)


def read_export(
    path: str | Path, *, since_ms: int | None = None, until_ms: int | None = None
) -> Recording:
    """The requests whose first decision falls in [since_ms, until_ms] (``-``: stdin)."""
    with export_lines(path, ReplaySourceError) as (lines, name):
        return _read(lines, name, since_ms, until_ms)


def _read(
    stream: Iterable[bytes], name: str, since_ms: int | None, until_ms: int | None
) -> Recording:
    decisions = DecisionLog()
    scanned = bad = 0
    for lineno, line in enumerate(stream, start=1):
        if not line.strip():
            continue
        scanned += 1
        try:
            rec = DecisionRecord.from_bytes(line)
        except ValidationError as exc:
            bad += 1
            if bad <= 3:
                e = exc.errors()[0]
                where = ".".join(map(str, e["loc"])) or "line"
                log.warning("%s:%d: not a DecisionRecord: %s: %s", name, lineno, where, e["msg"])
            continue
        decisions.add(rec, 0, lineno)
    if bad and not decisions.records:
        raise ReplaySourceError(
            f"{name}: none of its {bad:,} line(s) is a DecisionRecord "
            "(expected JSON lines as the decisions topic holds them)"
        )
    recording = Recording(source=name, since_ms=since_ms, until_ms=until_ms, scanned=scanned)
    if bad:
        recording.skipped["unparseable line"] = bad
    for rid, h in decisions.items():
        first = h.first
        if not in_range(first.at_ms, since_ms, until_ms):
            continue
        if first.outcome not in ARRIVAL_OUTCOMES:
            recording.skipped[NO_ARRIVAL] += 1
            continue
        if first.outcome is Outcome.INVALID:
            recording.skipped[INVALID_WHEN_RECORDED] += 1
            continue
        if not h.prompt_tokens or not h.max_tokens:
            recording.skipped[NO_SHAPE] += 1
            continue
        recording.requests.append(RecordedRequest(
            request_id=rid, tenant=first.tenant, model=first.model,
            prompt_tokens=h.prompt_tokens, max_tokens=h.max_tokens, arrived_ms=first.at_ms,
            sla_s=first.inputs.sla_s, first=first, final=h.final, output_tokens=h.output_tokens,
            order=h.first_pos,
        ))
    return recording.finish()


def write_export(recording: Recording, stream: IO[bytes]) -> int:
    """Write each request's arrival decision (with its shape) and final decision (with
    what it generated) as DecisionRecord lines; `read_export` replays them as they were.
    Returns the number of lines. Requests with no recorded decision are left out."""
    lines = 0
    for r in recording.requests:
        if r.first is None:
            continue
        first = r.first.model_copy(update={"inputs": r.first.inputs.model_copy(update={
            "prompt_tokens": r.prompt_tokens, "max_tokens": r.max_tokens,
            "sla_s": r.first.inputs.sla_s if r.sla_s is None else r.sla_s,
        })})
        stream.write(first.to_bytes() + b"\n")
        lines += 1
        final = r.final
        if final is None or final is r.first:
            continue
        if final.reason is ReasonCode.COMPLETED and r.output_tokens is not None:
            final = final.model_copy(update={"inputs": final.inputs.model_copy(update={
                "output_tokens": r.output_tokens,
            })})
        stream.write(final.to_bytes() + b"\n")
        lines += 1
    return lines
