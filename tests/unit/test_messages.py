"""The wire contract: every message round-trips; every malformed input gets a specific reason."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from triage.config import TriageConfig, load_config
from triage.topics.messages import (
    ALL_MESSAGES,
    MAX_TOKENS,
    AdmittedRequest,
    BucketState,
    Completion,
    CompletionBatch,
    CompletionStatus,
    ControlKind,
    ControlMessage,
    DeadLetter,
    DecisionInputs,
    DecisionRecord,
    GpuStatus,
    InferenceRequest,
    LiveRequest,
    LiveState,
    Message,
    OutboxMark,
    Reply,
    Route,
    ScaleDirection,
    ScaleSignal,
    Tick,
    WorkItem,
    json_schemas,
)
from triage.topics.reasons import Outcome, ReasonCode, ReplyStatus
from triage.topics.validation import Invalid, Unparseable, check_request, parse_request

NOW = 1_760_000_000_000
CONFIG = load_config()  # hypothesis tests cannot take function-scoped fixtures

REQUEST = InferenceRequest(
    request_id="req-1",
    tenant="rag",
    model="llama-3.1-8b",
    prompt_tokens=1200,
    max_tokens=300,
    sla_ms=4000,
    created_at_ms=NOW,
    prompt="What is KV cache?",
    metadata={"trace": "abc"},
)

SAMPLES: dict[str, Message] = {
    "InferenceRequest": REQUEST,
    "AdmittedRequest": AdmittedRequest(
        request=REQUEST,
        pool="shared",
        arrived_at_ms=NOW,
        deadline_ms=NOW + 4000,
        expected_tokens=1350.0,
        overage=True,
        quota_pressure=0.4,
        bucket_level=-120.5,
    ),
    "Reply": Reply(
        request_id="req-1",
        tenant="rag",
        status=ReplyStatus.REJECTED,
        reason=ReasonCode.TENANT_QUOTA_EXCEEDED,
        detail="bucket 200 < 1350",
        retry_after_ms=190,
        at_ms=NOW,
    ),
    "DecisionRecord": DecisionRecord(
        request_id="req-1",
        tenant="rag",
        model="llama-3.1-8b",
        pool="shared",
        outcome=Outcome.ACCEPT,
        reason=ReasonCode.ADMITTED,
        gpu_id="gpu-0",
        predicted_s=2.5,
        queue_wait_ms=0.0,
        policy="full",
        policy_version="1",
        at_ms=NOW,
        inputs=DecisionInputs(request_tokens=1350.0, kv_bytes_needed=196_608_000, slack_s=1.5),
    ),
    "WorkItem": WorkItem(
        request_id="req-1",
        attempt=1,
        tenant="rag",
        model="llama-3.1-8b",
        pool="shared",
        gpu_id="gpu-1",
        prompt_tokens=1200,
        max_tokens=300,
        reserved_kv_bytes=196_608_000,
        predicted_s=2.5,
        dispatched_at_ms=NOW,
        deadline_ms=NOW + 4000,
        arrived_at_ms=NOW - 5,
        metadata={"trace": "abc"},
    ),
    "Completion": Completion(
        request_id="req-1",
        tenant="rag",
        model="llama-3.1-8b",
        pool="shared",
        gpu_id="gpu-1",
        gpu_type="H200",
        status=CompletionStatus.COMPLETED,
        prompt_tokens=1200,
        output_tokens=180,
        max_tokens=300,
        prefill_s=0.024,
        decode_s=1.44,
        mean_concurrency=3.5,
        started_at_ms=NOW,
        finished_at_ms=NOW + 1464,
    ),
    "CompletionBatch": CompletionBatch(completions=[
        Completion(request_id=f"req-{i}", tenant="rag", model="llama-3.1-8b", pool="shared",
                   gpu_id="gpu-1", gpu_type="H200", status=CompletionStatus.COMPLETED,
                   prompt_tokens=1200, output_tokens=180, max_tokens=300, prefill_s=0.024,
                   decode_s=1.44, started_at_ms=NOW, finished_at_ms=NOW + 1464)
        for i in range(2)
    ]),
    "GpuStatus": GpuStatus(
        gpu_id="gpu-0",
        pool="shared",
        gpu_type="H200",
        name="NVIDIA H200",
        simulated=True,
        memory_total_bytes=141 * 1024**3,
        kv_budget_bytes=40 * 1024**3,
        utilization=0.42,
        running=3,
        at_ms=NOW,
    ),
    "ControlMessage": ControlMessage(
        kind=ControlKind.PREEMPT,
        request_id="req-1",
        attempt=0,
        gpu_id="gpu-0",
        reason=ReasonCode.PREEMPTED_FOR_PRIORITY,
        at_ms=NOW,
    ),
    "ScaleSignal": ScaleSignal(
        pool="shared",
        direction=ScaleDirection.UP,
        tightened=True,
        utilization=0.81,
        gpus=2,
        reason="above high threshold for 30s",
        at_ms=NOW,
    ),
    "DeadLetter": DeadLetter(
        source_topic="triage.requests.rag",
        partition=0,
        offset=17,
        key="k",
        value_b64="bm90IGpzb24=",
        error="not JSON",
        at_ms=NOW,
    ),
    "Tick": Tick(at_ms=NOW),
    "OutboxMark": OutboxMark(seq=42),
    "Route": Route(model="llama-3.1-8b", partition=1, partitions=4),
    "LiveRequest": LiveRequest(
        request_id="req-1",
        tenant="rag",
        model="llama-3.1-8b",
        pool="shared",
        state=LiveState.RUNNING,
        prompt_tokens=1200,
        max_tokens=300,
        arrived=NOW / 1000,
        sla_s=4.0,
        expected_out=150.0,
        expected_tokens=1350.0,
        gpu_id="gpu-0",
        metadata={"trace": "abc"},
        last_reply=Reply(
            request_id="req-1", tenant="rag", status=ReplyStatus.ACCEPTED, gpu_id="gpu-0", at_ms=NOW
        ),
    ),
    "BucketState": BucketState(level=-1250.5, updated=NOW / 1000),
}


def test_every_message_has_a_sample() -> None:
    assert set(SAMPLES) == set(ALL_MESSAGES)
    for name, sample in SAMPLES.items():
        assert type(sample) is ALL_MESSAGES[name]


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_round_trip_bytes_and_python(name: str) -> None:
    msg = SAMPLES[name]
    cls = ALL_MESSAGES[name]
    assert cls.from_bytes(msg.to_bytes()) == msg
    assert cls.from_bytes(msg.to_bytes().decode()) == msg
    assert cls.model_validate(msg.model_dump()) == msg
    assert cls.model_validate_json(msg.model_dump_json()) == msg


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_sample_satisfies_its_json_schema_required_fields(name: str) -> None:
    schema = json_schemas()[name]
    json.dumps(schema)  # serializable for other languages
    assert schema.get("additionalProperties") is False
    wire = json.loads(SAMPLES[name].to_bytes())
    assert set(schema.get("required", [])) <= set(wire)
    assert set(wire) <= set(schema["properties"])


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_messages_are_frozen_and_refuse_unknown_fields(name: str) -> None:
    msg = SAMPLES[name]
    field = next(iter(type(msg).model_fields))
    with pytest.raises(ValidationError):
        setattr(msg, field, getattr(msg, field))
    with pytest.raises(ValidationError, match="extra"):
        type(msg).model_validate({**msg.model_dump(), "surprise": 1})


ids = st.from_regex(r"\A[A-Za-z0-9][A-Za-z0-9._:@+=-]{0,40}\Z")
tenants = st.from_regex(r"\A[a-z0-9][a-z0-9_-]{0,20}\Z")


@given(
    rid=ids,
    tenant=tenants,
    prompt=st.integers(1, MAX_TOKENS // 2),
    out=st.integers(1, MAX_TOKENS // 2),
    sla=st.none() | st.integers(1, 24 * 3600 * 1000),
    text=st.none() | st.text(max_size=200),
    meta=st.dictionaries(st.text(max_size=10), st.text(max_size=10), max_size=5),
)
def test_any_valid_request_round_trips(
    rid: str, tenant: str, prompt: int, out: int, sla: int | None, text: str | None,
    meta: dict[str, str],
) -> None:  # fmt: skip
    req = InferenceRequest(
        request_id=rid, tenant=tenant, model="m", prompt_tokens=prompt, max_tokens=out,
        sla_ms=sla, prompt=text, metadata=meta,
    )  # fmt: skip
    assert InferenceRequest.from_bytes(req.to_bytes()) == req
    assert parse_request(req.to_bytes()) == req


def _raw(**changes: Any) -> bytes:
    data: dict[str, Any] = json.loads(REQUEST.to_bytes())
    for k, v in changes.items():
        if v is _DROP:
            data.pop(k)
        else:
            data[k] = v
    return json.dumps(data).encode()


_DROP = object()


def _invalid(raw: bytes) -> Invalid:
    result = parse_request(raw)
    assert isinstance(result, Invalid), result
    assert result.request_id == "req-1"
    assert result.reason is ReasonCode.INVALID_REQUEST
    return result


@given(field=st.sampled_from(["prompt_tokens", "max_tokens"]), value=st.integers(max_value=0))
def test_non_positive_token_counts_are_invalid(field: str, value: int) -> None:
    assert _invalid(_raw(**{field: value})).detail.startswith(f"{field}: ")


@given(
    field=st.sampled_from(["prompt_tokens", "max_tokens"]),
    value=st.integers(min_value=MAX_TOKENS + 1),
)
def test_absurd_token_counts_are_invalid(field: str, value: int) -> None:
    detail = _invalid(_raw(**{field: value})).detail
    assert detail.startswith(f"{field}: ") and "less than or equal" in detail


def test_token_sum_beyond_any_context_is_invalid() -> None:
    detail = _invalid(_raw(prompt_tokens=MAX_TOKENS - 1, max_tokens=10)).detail
    assert "prompt_tokens + max_tokens" in detail and "exceeds" in detail


@pytest.mark.parametrize("value", [1.5, 1.0, "12", True, None, [1]])
def test_wrong_types_for_token_counts_are_invalid(value: object) -> None:
    detail = _invalid(_raw(prompt_tokens=value)).detail
    assert detail.startswith("prompt_tokens: ")


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_nan_and_inf_are_invalid(value: float) -> None:
    # json.dumps writes NaN/Infinity, which Python's json accepts: the model must not.
    assert _invalid(_raw(max_tokens=value)).detail.startswith("max_tokens: ")
    base = SAMPLES["Completion"].model_dump()
    for field in ("prefill_s", "decode_s", "mean_concurrency"):
        with pytest.raises(ValidationError, match=field):
            Completion.model_validate({**base, field: value})
    with pytest.raises(ValidationError, match="utilization"):
        GpuStatus.model_validate({**SAMPLES["GpuStatus"].model_dump(), "utilization": value})


@pytest.mark.parametrize("field", ["tenant", "model"])
def test_empty_names_are_invalid(field: str) -> None:
    assert _invalid(_raw(**{field: ""})).detail.startswith(f"{field}: ")


@pytest.mark.parametrize("rid", ["", " ", "-leading-dash", "has space", "x" * 129, 17, None])
def test_request_without_usable_id_is_dead_lettered(rid: object) -> None:
    result = parse_request(_raw(request_id=rid))
    assert isinstance(result, Unparseable)
    assert "request_id" in result.error


def test_missing_and_unknown_fields_are_invalid() -> None:
    assert _invalid(_raw(model=_DROP)).detail.startswith("model: ")
    assert "extra" in _invalid(_raw(priority=1)).detail.lower()


@pytest.mark.parametrize("raw", [None, b"", b"not json", b"[1, 2]", b'"str"', b"\xff\xfe"])
def test_unparseable_input_is_dead_lettered(raw: bytes | None) -> None:
    assert isinstance(parse_request(raw), Unparseable)


def test_other_messages_refuse_negative_values() -> None:
    with pytest.raises(ValidationError, match="retry_after_ms"):
        Reply.model_validate({**SAMPLES["Reply"].model_dump(), "retry_after_ms": -1})
    with pytest.raises(ValidationError, match="output_tokens"):
        Completion.model_validate({**SAMPLES["Completion"].model_dump(), "output_tokens": -3})
    with pytest.raises(ValidationError, match="stage"):
        DeadLetter.model_validate({**SAMPLES["DeadLetter"].model_dump(), "stage": "nowhere"})
    with pytest.raises(ValidationError, match="status"):
        Reply.model_validate({**SAMPLES["Reply"].model_dump(), "status": "maybe"})


# --- checks that need the configuration -------------------------------------------


def _req(**changes: Any) -> InferenceRequest:
    return REQUEST.model_copy(update=changes)


def test_valid_request_passes_config_checks(triage_config: TriageConfig) -> None:
    assert check_request(REQUEST, triage_config, "rag") is None
    context = triage_config.model("llama-3.1-8b")
    assert context is not None
    exact = _req(prompt_tokens=context.context_tokens - 100, max_tokens=100)
    assert check_request(exact, triage_config, "rag") is None  # exactly fills the context


@pytest.mark.parametrize(
    ("changes", "topic_tenant", "reason", "needle"),
    [
        (
            {"prompt_tokens": 32_000, "max_tokens": 1000},
            "rag",
            ReasonCode.CONTEXT_OVERFLOW,
            "32768",
        ),
        ({"model": "gpt-17"}, "rag", ReasonCode.UNKNOWN_MODEL, "gpt-17"),
        ({}, "batch", ReasonCode.TENANT_MISMATCH, "'batch'"),
        ({"tenant": "ghost"}, "ghost", ReasonCode.UNKNOWN_TENANT, "ghost"),
        ({"tenant": "ghost"}, None, ReasonCode.UNKNOWN_TENANT, "ghost"),
        ({"model": "llama-3.1-70b"}, "rag", ReasonCode.MODEL_NOT_ALLOWED, "llama-3.1-70b"),
    ],
)
def test_config_checks_give_specific_reasons(
    triage_config: TriageConfig,
    changes: dict[str, Any],
    topic_tenant: str | None,
    reason: ReasonCode,
    needle: str,
) -> None:
    result = check_request(_req(**changes), triage_config, topic_tenant)
    assert isinstance(result, Invalid)
    assert result.reason is reason
    assert result.request_id == "req-1"
    assert needle in result.detail


@given(prompt=st.integers(1, 40_000), out=st.integers(1, 40_000))
def test_context_check_matches_the_arithmetic(prompt: int, out: int) -> None:
    result = check_request(_req(prompt_tokens=prompt, max_tokens=out), CONFIG, "rag")
    overflow = prompt + out > 32_768
    assert (result is not None and result.reason is ReasonCode.CONTEXT_OVERFLOW) == overflow


def test_a_route_names_a_partition_inside_the_app_s_partitions() -> None:
    from triage.topics.messages import Route

    r = Route(model="m", partition=1, partitions=2)
    assert Route.from_bytes(r.to_bytes()) == r
    with pytest.raises(ValidationError, match="partition 2 of 2"):
        Route(model="m", partition=2, partitions=2)
    with pytest.raises(ValidationError):
        Route.from_bytes(b'{"model": "m", "partition": "0", "partitions": 1}')  # strict
