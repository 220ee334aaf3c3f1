"""Audit explanations: a sentence for every reason code, with the numbers behind it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from triage.audit import (
    SENTENCES,
    Explanation,
    NoDecisionsError,
    explain,
    parse_since,
    read_decisions_file,
    sentence,
)
from triage.audit.units import human_bytes, seconds
from triage.cli.main import app
from triage.topics.messages import DecisionInputs, DecisionRecord
from triage.topics.reasons import Outcome, ReasonCode

GIB = 1024**3

FULL_INPUTS = DecisionInputs(
    request_tokens=2_400,
    bucket_level=-29_690,
    bucket_burst=30_000,
    bucket_debt_ceiling=30_000,
    kv_bytes_needed=3 * GIB,
    kv_bytes_available=GIB + GIB // 2,
    predicted_s=5.2,
    variance_buffer=1.3,
    sla_s=4.0,
    slack_s=3.1,
    queue_position=12,
    queue_depth=40,
    tenant_queue_depth=7,
    tenant_service=123_456.0,
    utilization=0.82,
    recompute_tokens=800,
    detail="some detail",
)

# The outcome each reason is normally recorded under.
OUTCOME_OF: dict[ReasonCode, Outcome] = {
    ReasonCode.ADMITTED: Outcome.ACCEPT,
    ReasonCode.DISPATCHED_FROM_QUEUE: Outcome.ACCEPT,
    ReasonCode.ADMITTED_OVERAGE: Outcome.ACCEPT,
    ReasonCode.QUEUE_TIMEOUT: Outcome.TIMEOUT,
    ReasonCode.DEADLINE_UNREACHABLE: Outcome.TIMEOUT,
    ReasonCode.PREEMPTED_FOR_PRIORITY: Outcome.PREEMPT,
    ReasonCode.COMPLETED: Outcome.COMPLETE,
    ReasonCode.FAILED: Outcome.COMPLETE,
}


def record(
    reason: ReasonCode,
    *,
    outcome: Outcome | None = None,
    at_ms: int = 1_000,
    inputs: DecisionInputs = FULL_INPUTS,
    request_id: str = "req-1",
    **kw: object,
) -> DecisionRecord:
    data: dict[str, object] = {
        "request_id": request_id,
        "tenant": "rag",
        "model": "llama-3.1-8b",
        "pool": "shared",
        "outcome": outcome or OUTCOME_OF.get(reason, Outcome.REJECT),
        "reason": reason,
        "policy": "full",
        "policy_version": "1",
        "at_ms": at_ms,
        "inputs": inputs,
    }
    data.update(kw)
    return DecisionRecord.model_validate(data)


def test_every_reason_code_has_a_sentence() -> None:
    missing = set(ReasonCode) - set(SENTENCES)
    assert not missing, f"no sentence template for {sorted(missing)}: add one in audit/sentences.py"


@pytest.mark.parametrize("reason", list(ReasonCode))
def test_each_sentence_reads_and_is_specific(reason: ReasonCode) -> None:
    full = sentence(record(reason, retry_after_ms=1_200))
    bare = sentence(record(reason, inputs=DecisionInputs()))
    for text in (full, bare):
        assert text.endswith(".")
        assert "None" not in text  # an unrecorded number is left out, never printed as None
    assert "retry in 1.2 s" in full
    # every template says something of its own, not a generic line
    others = {sentence(record(r, inputs=DecisionInputs())) for r in ReasonCode if r != reason}
    assert bare not in others


def test_quota_rejection_names_its_numbers() -> None:
    text = sentence(record(ReasonCode.TENANT_QUOTA_EXCEEDED, retry_after_ms=1_200))
    assert text.startswith("Rejected: tenant rag was over quota")
    assert "2,400 tokens" in text  # asked for
    assert "310 tokens" in text  # could draw: level -29,690 + ceiling 30,000
    assert "29,690 tokens in debt" in text
    assert "burst 30,000" in text
    assert "borrowing ceiling 30,000" in text
    assert "retry in 1.2 s" in text


def test_positive_bucket_reads_as_tokens_held() -> None:
    inputs = DecisionInputs(
        request_tokens=5_000, bucket_level=310, bucket_burst=8_000, bucket_debt_ceiling=0
    )
    text = sentence(record(ReasonCode.TENANT_QUOTA_EXCEEDED, inputs=inputs))
    assert "could draw only 310 tokens" in text
    assert "its bucket held 310 tokens" in text


def test_memory_fit_in_human_units() -> None:
    text = sentence(record(ReasonCode.GPU_MEMORY_INSUFFICIENT, outcome=Outcome.QUEUE))
    assert text.startswith("Queued:")
    assert "3.0 GiB" in text and "1.5 GiB" in text
    assert "position 12 of 40" in text


def test_predicted_time_against_sla() -> None:
    text = sentence(record(ReasonCode.COMPUTE_SATURATION, outcome=Outcome.QUEUE))
    assert "predicted 5.2 s" in text
    assert "1.30x variance buffer" in text
    assert "4.0 s SLA" in text
    assert "82%" in text


def test_never_fits_says_waiting_does_not_help() -> None:
    text = sentence(record(ReasonCode.QUOTA_NEVER_FITS))
    assert "60,000 tokens" in text  # burst + ceiling
    assert "no wait" in text


def test_failed_completion_reads_as_failed() -> None:
    assert sentence(record(ReasonCode.FAILED)).startswith("Failed:")
    assert sentence(record(ReasonCode.COMPLETED)).startswith("Completed:")


@pytest.mark.parametrize(
    ("n", "text"),
    [(512, "512 B"), (1536, "1.5 KiB"), (3 * GIB, "3.0 GiB"), (5 * 1024**4, "5.0 TiB")],
)
def test_human_bytes(n: int, text: str) -> None:
    assert human_bytes(n) == text


@pytest.mark.parametrize(("s", "text"), [(0.35, "350 ms"), (1.2, "1.2 s"), (150.0, "2.5 min")])
def test_seconds(s: float, text: str) -> None:
    assert seconds(s) == text


def history() -> list[DecisionRecord]:
    queued = record(
        ReasonCode.GPU_MEMORY_INSUFFICIENT,
        outcome=Outcome.QUEUE,
        at_ms=10_000,
        inputs=DecisionInputs(
            kv_bytes_needed=3 * GIB, kv_bytes_available=GIB, queue_position=4, queue_depth=9
        ),
    )
    timed_out = record(
        ReasonCode.QUEUE_TIMEOUT,
        at_ms=11_500,
        queue_wait_ms=1_500,
        retry_after_ms=2_300,
        inputs=DecisionInputs(queue_position=1, queue_depth=9),
    )
    return [timed_out, queued, timed_out]  # out of order, with a redelivery


def test_history_is_ordered_deduplicated_and_headlined_by_the_terminal_decision() -> None:
    e = explain(history())
    assert [s.record.outcome for s in e.steps] == [Outcome.QUEUE, Outcome.TIMEOUT]
    assert [s.offset_ms for s in e.steps] == [0, 1_500]
    assert e.outcome == Outcome.TIMEOUT and e.reason == ReasonCode.QUEUE_TIMEOUT
    assert e.settled is True
    assert e.retry_after_ms == 2_300
    assert e.summary.startswith("Timed out:")
    assert "waited 1.5 s in the queue" in e.summary
    assert "retry in 2.3 s" in e.summary
    assert "3.0 GiB" in e.steps[0].sentence


def test_duplicate_never_hides_the_real_outcome() -> None:
    dup = record(ReasonCode.DUPLICATE, outcome=Outcome.INVALID, at_ms=99_000)
    e = explain([*history(), dup])
    assert e.reason == ReasonCode.QUEUE_TIMEOUT
    assert len(e.steps) == 3


def test_unsettled_history_says_so() -> None:
    e = explain([record(ReasonCode.QUEUED_BEHIND, outcome=Outcome.QUEUE)])
    assert e.settled is False
    assert "No final decision" in e.summary


def test_json_form_round_trips() -> None:
    e = explain(history())
    text = e.to_json()
    back = Explanation.from_json(text)
    assert back == e
    data = json.loads(text)
    assert data["reason"] == "queue_timeout"
    assert data["steps"][0]["record"]["inputs"]["kv_bytes_needed"] == 3 * GIB


def test_explain_refuses_empty_and_mixed_histories() -> None:
    with pytest.raises(NoDecisionsError):
        explain([])
    with pytest.raises(ValueError, match="several requests"):
        explain([record(ReasonCode.ADMITTED), record(ReasonCode.ADMITTED, request_id="req-10")])


def test_parse_since() -> None:
    now = 1_700_000_000_000
    assert parse_since("15m", now_ms=now) == now - 15 * 60_000
    assert parse_since("2h", now_ms=now) == now - 7_200_000
    assert parse_since("1699999999000", now_ms=now) == 1_699_999_999_000
    assert parse_since("2023-11-14T22:13:20+00:00", now_ms=now) == now
    assert parse_since("2023-11-14T22:13:20", now_ms=now) == now  # naive = UTC
    assert parse_since("2023-11-14T22:13:20Z", now_ms=now) == now
    assert parse_since("1h30m", now_ms=now) == now - 5_400_000
    assert parse_since("1d 12h", now_ms=now) == now - 36 * 3_600_000
    assert parse_since("250ms", now_ms=now) == now - 250
    for bad in ("yesterday-ish", "1h30", "h", "2 hours ago"):
        with pytest.raises(ValueError, match="--since"):
            parse_since(bad, now_ms=now)


def _export(tmp_path: Path) -> Path:
    path = tmp_path / "decisions.jsonl"
    lines = [r.to_bytes().decode() for r in history()]
    lines.append(record(ReasonCode.ADMITTED, request_id="req-10", at_ms=10_500).to_bytes().decode())
    lines.extend(["", "not json mentioning req-1"])
    path.write_text("\n".join(lines) + "\n")
    return path


def test_file_reader_finds_exactly_the_requested_id(tmp_path: Path) -> None:
    scan = read_decisions_file(_export(tmp_path), request_id="req-1")
    assert {r.request_id for r in scan.records} == {"req-1"}
    assert len(scan.records) == 3  # the redelivery is still there; explain() drops it
    assert scan.unparseable == 1
    since = read_decisions_file(_export(tmp_path), request_id="req-1", since_ms=11_000)
    assert [r.outcome for r in since.records] == [Outcome.TIMEOUT, Outcome.TIMEOUT]


def test_cli_audit_from_file(tmp_path: Path) -> None:
    runner = CliRunner()
    path = _export(tmp_path)
    res = runner.invoke(app, ["audit", "req-1", "--from-file", str(path), "--json"])
    assert res.exit_code == 0, res.output
    e = Explanation.from_json(res.stdout)
    assert e.reason == ReasonCode.QUEUE_TIMEOUT
    res = runner.invoke(app, ["audit", "req-1", "--from-file", str(path)])
    assert res.exit_code == 0, res.output
    assert "Timed out" in res.stdout
    res = runner.invoke(app, ["audit", "req-404", "--from-file", str(path)])
    assert res.exit_code == 1
    assert "no decisions recorded for request req-404" in res.stderr
    res = runner.invoke(app, ["audit", "req-1", "--from-file", str(tmp_path / "nope.jsonl")])
    assert res.exit_code == 3


def test_a_runner_stopped_past_its_deadline_reads_as_stopped_on_its_gpu() -> None:
    """`policy.cancel_late`: the same reason as a queued request that can no longer make
    it, told apart by the GPU it ran on."""
    stopped = sentence(record(ReasonCode.DEADLINE_UNREACHABLE, gpu_id="gpu-1"))
    assert "still running on gpu-1 past its SLA deadline" in stopped and "stopped" in stopped
    queued = sentence(record(ReasonCode.DEADLINE_UNREACHABLE))
    assert "could no longer finish" in queued and "gpu" not in queued
