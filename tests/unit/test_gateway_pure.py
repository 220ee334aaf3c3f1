"""The gateway's pure parts: status mapping and headers, response bodies, the token
estimate, API keys; the client's stream assembler; the vLLM /metrics parser."""

from __future__ import annotations

from pathlib import Path

import pytest

from triage.client import InferenceRequest, StreamAssembler
from triage.gateway.auth import KeysError, KeyStore, digest, new_key
from triage.gateway.replies import (
    Shape,
    chunk_body,
    completion_body,
    duration_text,
    error_for,
    ratelimit_headers,
    retry_after_header,
)
from triage.gateway.schema import ChatBody, CompletionBody, estimate_chat_tokens, estimate_tokens
from triage.topics import messages
from triage.topics.messages import Reply
from triage.topics.reasons import ReasonCode, ReplyStatus
from triage.workers.backends.vllm_metrics import metrics_url_for, parse_vllm_metrics


def reply(status: ReplyStatus, reason: ReasonCode | None = None, **kw: object) -> Reply:
    return Reply(request_id="r1", tenant="rag", status=status, reason=reason, at_ms=1, **kw)


# --------------------------------------------------------------------------- status mapping


@pytest.mark.parametrize(("status", "reason", "code"), [
    (ReplyStatus.REJECTED, ReasonCode.TENANT_QUOTA_EXCEEDED, 429),
    (ReplyStatus.REJECTED, ReasonCode.TENANT_RATE_LIMITED, 429),
    (ReplyStatus.REJECTED, ReasonCode.TENANT_QUEUE_FULL, 429),
    (ReplyStatus.REJECTED, ReasonCode.QUEUE_FULL, 503),
    (ReplyStatus.REJECTED, ReasonCode.NO_CAPACITY, 503),
    (ReplyStatus.REJECTED, ReasonCode.QUOTA_NEVER_FITS, 400),
    (ReplyStatus.REJECTED, ReasonCode.SLA_INFEASIBLE, 400),
    (ReplyStatus.TIMED_OUT, ReasonCode.QUEUE_TIMEOUT, 503),
    (ReplyStatus.INVALID, ReasonCode.CONTEXT_OVERFLOW, 400),
    (ReplyStatus.INVALID, ReasonCode.UNKNOWN_MODEL, 404),
    (ReplyStatus.FAILED, ReasonCode.FAILED, 500),
])  # fmt: skip
def test_terminal_replies_map_to_openai_statuses(
    status: ReplyStatus, reason: ReasonCode, code: int
) -> None:
    err = error_for(reply(status, reason, retry_after_ms=1500, detail="why"))
    assert err is not None and err.status == code
    body = err.body()["error"]
    assert body["code"] == ("model_not_found" if code == 404 else reason.value)
    assert "why" in body["message"]
    assert ("Retry-After" in err.headers) == (code in (429, 503))


def test_completed_is_no_error() -> None:
    assert error_for(reply(ReplyStatus.COMPLETED, ReasonCode.COMPLETED)) is None


def test_retry_after_rounds_up_to_whole_seconds() -> None:
    assert retry_after_header(None) is None
    assert retry_after_header(0) == "0"
    assert retry_after_header(1) == "1"
    assert retry_after_header(1000) == "1"
    assert retry_after_header(1001) == "2"
    err = error_for(reply(ReplyStatus.REJECTED, ReasonCode.TENANT_QUOTA_EXCEEDED,
                          retry_after_ms=20_001, bucket_level=-12.5, bucket_burst=100.0),
                    rate_tokens_per_s=10.0)  # fmt: skip
    assert err is not None
    assert err.headers["Retry-After"] == "21" and err.headers["retry-after-ms"] == "20001"
    assert err.headers["x-ratelimit-remaining-tokens"] == "0"  # in debt: nothing left
    assert err.headers["x-ratelimit-limit-tokens"] == "100"
    assert err.headers["x-ratelimit-reset-tokens"] == "11.3s"  # 112.5 tokens at 10/s


def test_ratelimit_headers_need_the_bucket() -> None:
    assert ratelimit_headers(reply(ReplyStatus.REJECTED), 10.0) == {}
    h = ratelimit_headers(reply(ReplyStatus.REJECTED, bucket_level=40.9, bucket_burst=100.0),
                          None)  # fmt: skip
    assert h == {"x-ratelimit-remaining-tokens": "40", "x-ratelimit-limit-tokens": "100"}


def test_durations_as_openai_writes_them() -> None:
    assert duration_text(0.12) == "120ms"
    assert duration_text(1.5) == "1.5s"
    assert duration_text(150) == "2m30s"
    assert duration_text(3600) == "1h0m0s"
    assert duration_text(-1) == "0ms"


# --------------------------------------------------------------------------- bodies


def test_completion_and_chunk_bodies() -> None:
    done = reply(ReplyStatus.COMPLETED, ReasonCode.COMPLETED, text=" a b", output_tokens=2)
    text = completion_body(Shape("cmpl-1", "m", False, 3, 2), done)
    assert text["object"] == "text_completion" and text["choices"][0]["text"] == " a b"
    assert text["choices"][0]["finish_reason"] == "length"  # hit max_tokens
    assert text["usage"] == {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
    chat = completion_body(Shape("chatcmpl-1", "m", True, 3, 10), done)
    assert chat["choices"][0]["message"] == {"role": "assistant", "content": " a b"}
    assert chat["choices"][0]["finish_reason"] == "stop"
    shape = Shape("chatcmpl-1", "m", True, 3, 10)
    assert chunk_body(shape, role=True, text="")["choices"][0]["delta"] == {
        "role": "assistant", "content": ""}
    usage = chunk_body(shape, usage_of={"prompt_tokens": 1})
    assert usage["choices"] == [] and usage["usage"] == {"prompt_tokens": 1}


def test_request_bodies_and_token_estimate() -> None:
    assert estimate_tokens("") == 1
    assert estimate_tokens("abcd") == 1 and estimate_tokens("abcde") == 2
    assert estimate_tokens("é" * 4) == 2  # UTF-8 bytes, not characters
    body = CompletionBody.model_validate({"model": "m", "prompt": ["one"], "temperature": 0.2})
    assert body.text == "one" and body.max_tokens is None
    with pytest.raises(ValueError, match="one prompt"):
        CompletionBody.model_validate({"model": "m", "prompt": ["a", "b"]})
    with pytest.raises(ValueError, match="n"):
        CompletionBody.model_validate({"model": "m", "prompt": "a", "n": 2})
    chat = ChatBody.model_validate({"model": "m", "max_completion_tokens": 7, "messages": [
        {"role": "user", "content": [{"type": "text", "text": "hi "}, {"type": "text",
                                                                      "text": "there"}]}]})
    msgs = chat.chat_messages()
    assert msgs[0].content == "hi there" and chat.wanted_max_tokens == 7
    assert estimate_chat_tokens(msgs) == 2 + 4
    image = ChatBody.model_validate({"model": "m", "messages": [
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]})
    with pytest.raises(ValueError, match="text"):
        image.chat_messages()


# --------------------------------------------------------------------------- keys


def test_keys_file_and_env(tmp_path: Path) -> None:
    a, b = new_key(), new_key()
    assert a != b and a.startswith("sk-triage-") and len(a) > 40
    path = tmp_path / "keys.yaml"
    path.write_text(f"keys:\n  - tenant: rag\n    sha256: {digest(a).hex()}\n")
    store = KeyStore.load(path=path, env_var="K", environ={"K": f"batch:{b}, "})
    assert len(store) == 2 and store.tenants() == {"rag", "batch"}
    hit = store.lookup(a)
    assert hit is not None and hit.tenant == "rag"
    assert (store.lookup(b) or hit).tenant == "batch"
    assert store.lookup("sk-triage-nope") is None and store.lookup("") is None
    assert a not in path.read_text()  # only the digest is stored


@pytest.mark.parametrize(("text", "env", "msg"), [
    ("keys: [{tenant: rag, sha256: abc}]", "", "sha256"),
    ("keys: [{tenant: Rag, sha256: " + "0" * 64 + "}]", "", "tenant"),
    ("keys: [{tenant: rag, sha256: " + "0" * 64 + ", key: x}]", "", "key"),
    (": : :", "", "not YAML"),
    ("", "justakey", "tenant:key"),
    ("", "BAD:key", "bad tenant"),
    ("", "rag:k,batch:k", "twice"),
])  # fmt: skip
def test_bad_keys_are_one_line_errors(tmp_path: Path, text: str, env: str, msg: str) -> None:
    path = tmp_path / "keys.yaml"
    path.write_text(text)
    with pytest.raises(KeysError, match=msg) as info:
        KeyStore.load(path=path, env_var="K", environ={"K": env})
    assert "\n" not in str(info.value)
    with pytest.raises(KeysError, match="cannot read"):
        KeyStore.load(path=tmp_path / "missing.yaml", env_var="K", environ={})


# --------------------------------------------------------------------------- client side


def test_client_request_gets_a_fresh_id_and_is_the_wire_model() -> None:
    a = InferenceRequest(tenant="rag", model="m", prompt_tokens=1, max_tokens=1)
    b = InferenceRequest(tenant="rag", model="m", prompt_tokens=1, max_tokens=1)
    assert a.request_id != b.request_id and len(a.request_id) == 32
    assert isinstance(a, messages.InferenceRequest)
    assert messages.InferenceRequest.from_bytes(a.to_bytes()).request_id == a.request_id
    with pytest.raises(ValueError, match="request_id"):  # the wire model still needs one
        messages.InferenceRequest.from_bytes(b'{"tenant":"rag","model":"m","prompt_tokens":1,'
                                             b'"max_tokens":1}')  # fmt: skip


def chunk(offset: int, pieces: list[str], attempt: int = 0) -> Reply:
    return reply(ReplyStatus.STREAMING, tokens=pieces, token_offset=offset, attempt=attempt,
                 first_token_at_ms=5 + attempt)  # fmt: skip


def test_assembler_joins_skips_repeats_and_follows_a_restarted_attempt() -> None:
    asm = StreamAssembler()
    assert asm.feed(reply(ReplyStatus.ACCEPTED)) == []
    assert asm.feed(chunk(0, ["a", "b"])) == ["a", "b"]
    assert asm.feed(chunk(0, ["a", "b"])) == []  # redelivered
    assert asm.feed(chunk(2, ["c"])) == ["c"]
    # preempted after 3 tokens: attempt 1 starts over; its first 3 tokens are not repeated
    assert asm.feed(chunk(0, ["a", "b"], attempt=1)) == []
    assert asm.feed(chunk(2, ["c", "d"], attempt=1)) == ["d"]
    assert asm.feed(chunk(3, ["x"], attempt=0)) == []  # the old attempt's tail: ignored
    assert asm.feed(chunk(6, ["g"], attempt=1)) == ["g"]  # tokens 4-5 were lost
    assert asm.gaps == 2 and asm.text == "abcdg" and asm.first_token_at_ms == 5


# --------------------------------------------------------------------------- vLLM metrics


VLLM = """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="a"} 2.0
vllm:num_requests_running{engine="1",model_name="a"} 3.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="a"} 4.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="a"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="a"} 0.5
# TYPE vllm:generation_tokens counter
vllm:generation_tokens_total{model_name="a"} 99.0
"""


def test_vllm_metrics_are_summed_and_kv_is_the_fullest_engine() -> None:
    r = parse_vllm_metrics(VLLM, at=1.0)
    assert r is not None and (r.running, r.waiting, r.kv_usage, r.at) == (5, 4, 0.5, 1.0)
    old = parse_vllm_metrics('vllm:gpu_cache_usage_perc{model_name="a"} 0.9\n')
    assert old is not None and old.kv_usage == 0.9 and old.running is None
    assert parse_vllm_metrics("# nothing of vLLM\nprocess_cpu_seconds_total 1.0\n") is None
    assert metrics_url_for("http://h:8000/v1") == "http://h:8000/metrics"
    assert metrics_url_for("http://h:8000/v1/") == "http://h:8000/metrics"
    assert metrics_url_for("http://h:8000/openai") == "http://h:8000/openai/metrics"
