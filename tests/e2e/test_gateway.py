"""`triage gateway` with the official `openai` client, on the real broker, with the real
admission app and a sim worker as processes: completions, chat, streaming (in order,
then [DONE]), 429 with Retry-After, 400 for an invalid request, 401 for a bad key. The
client library's streaming (TriageClient.stream) runs against the same system."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import openai
import pytest
from harness import QUOTA_BINDS, System, fast_config, gateway_running, running

from triage.client import InferenceRequest, TriageClient
from triage.demo.processes import ChildProcess, scrape
from triage.gateway.auth import digest
from triage.topics.admin import delete_topics
from triage.topics.names import TopicNames
from triage.topics.reasons import ReplyStatus
from triage.workers.backends.sim import synthetic_tokens

pytestmark = [pytest.mark.broker, pytest.mark.slow]

KEY = "sk-triage-test-acme-" + uuid.uuid4().hex
TINY_KEY = "sk-triage-test-tiny-" + uuid.uuid4().hex
TINY_BURST = 100.0
TINY_RATE = 1.0  # tokens/s: after a 95-token request, the next waits about a minute


@dataclass
class Stack:
    system: System
    gateway: ChildProcess
    url: str  # http://127.0.0.1:<port>/v1
    names: TopicNames
    bootstrap: str

    def client(self, key: str = KEY) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url, api_key=key, max_retries=0, timeout=120)


def _tenant(name: str, **kw: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"name": name, "rate_tokens_per_s": 1e9, "burst_tokens": 1e9,
                            "queue_max": 500, "max_queue_wait_ms": 5000, "sla_ms": 30_000}
    base.update(kw)
    return base


@pytest.fixture(scope="module")
def stack(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("gateway")
    names = TopicNames(f"t{uuid.uuid4().hex[:8]}")
    cfg = fast_config(kafka_bootstrap, names, tmp, gpus=1, tenants=[
        _tenant("acme"),
        _tenant("tiny", rate_tokens_per_s=TINY_RATE, burst_tokens=TINY_BURST),
    ], worker={"stream_chunk_tokens": 4, "stream_chunk_ms": 20}, policy=QUOTA_BINDS)
    keys = tmp / "keys.yaml"
    keys.write_text(
        "keys:\n"
        f"  - tenant: acme\n    sha256: {digest(KEY).hex()}\n"
        f"  - tenant: tiny\n    sha256: {digest(TINY_KEY).hex()}\n    name: tiny-test\n"
    )
    try:
        with running(cfg, tmp) as system, gateway_running(tmp, keys) as (gw, url):
            yield Stack(system, gw, url, names, kafka_bootstrap)
    finally:
        delete_topics(kafka_bootstrap, names.prefix)


def test_completion(stack: Stack) -> None:
    out = stack.client().completions.create(model="small", prompt="Once upon a time",
                                            max_tokens=20)
    assert out.object == "text_completion" and out.id.startswith("cmpl-")
    n = out.usage.completion_tokens if out.usage else 0
    assert 1 <= n <= 20
    assert out.choices[0].text == "".join(synthetic_tokens(out.id, 0, n))
    assert out.usage is not None and out.usage.prompt_tokens == 4  # 16 bytes / 4
    assert out.choices[0].finish_reason in ("stop", "length")


def test_chat_completion(stack: Stack) -> None:
    out = stack.client().chat.completions.create(
        model="small", max_tokens=30,
        messages=[{"role": "system", "content": "Be brief."},
                  {"role": "user", "content": "What is admission control?"}],
    )
    assert out.object == "chat.completion" and out.id.startswith("chatcmpl-")
    msg = out.choices[0].message
    assert msg.role == "assistant"
    n = out.usage.completion_tokens if out.usage else 0
    assert n >= 1 and msg.content == "".join(synthetic_tokens(out.id, 0, n))


def test_streamed_chat_arrives_in_order(stack: Stack) -> None:
    stream = stack.client().chat.completions.create(
        model="small", max_tokens=200, stream=True, stream_options={"include_usage": True},
        messages=[{"role": "user", "content": "Tell me a long story."}],
    )
    pieces: list[str] = []
    ids, usage, finish = set(), None, None
    for chunk in stream:
        ids.add(chunk.id)
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            if choice.delta.content:
                pieces.append(choice.delta.content)
            finish = choice.finish_reason or finish
    assert len(ids) == 1 and usage is not None and finish in ("stop", "length")
    rid = ids.pop()
    n = usage.completion_tokens
    assert n >= 40  # at least 20% of max_tokens (the sim's draw)
    assert len(pieces) >= 3, pieces  # streamed in several chunks, not one blob
    assert "".join(pieces) == "".join(synthetic_tokens(rid, 0, n))  # in order, none lost
    metrics = scrape(stack.url.removesuffix("/v1") + "/metrics") or ""
    assert 'triage_gateway_ttft_seconds_count{model="small",tenant="acme"}' in metrics


def test_raw_sse_ends_with_done(stack: Stack) -> None:
    body = json.dumps({"model": "small", "prompt": "hello", "max_tokens": 50, "stream": True})
    req = urllib.request.Request(stack.url + "/completions", data=body.encode(), headers={
        "Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        lines = [ln.decode().strip() for ln in resp if ln.strip()]
    assert all(ln.startswith("data: ") for ln in lines)
    assert lines[-1] == "data: [DONE]" and lines.count("data: [DONE]") == 1
    chunks = [json.loads(ln[6:]) for ln in lines[:-1]]
    assert chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length")
    text = "".join(c["choices"][0]["text"] for c in chunks)
    rid = chunks[0]["id"]
    assert text == "".join(synthetic_tokens(rid, 0, len(text.split())))


def test_quota_refusal_is_429_with_retry_after(stack: Stack) -> None:
    client = stack.client(TINY_KEY)
    # a 95-token prompt (380 bytes / 4) and one output token: it uses what it is charged,
    # so settling the charge to the tokens used gives nothing back to the 100-token burst
    client.completions.create(model="small", prompt="word " * 76, max_tokens=1)
    with pytest.raises(openai.RateLimitError) as info:  # costs >= 4 + 0.2 x 80 = 20
        client.completions.create(model="small", prompt="Once upon a time", max_tokens=80)
    resp = info.value.response
    assert resp.status_code == 429
    retry_after = int(resp.headers["retry-after"])
    assert 1 <= retry_after <= 120  # the tokens missing, at 1 token/s
    remaining = int(resp.headers["x-ratelimit-remaining-tokens"])
    assert 0 <= remaining < 20
    assert resp.headers["x-ratelimit-limit-tokens"] == str(int(TINY_BURST))
    assert resp.headers["x-ratelimit-reset-tokens"].endswith("s")
    err = resp.json()["error"]
    assert err["type"] == "rate_limit_exceeded" and err["code"] == "tenant_quota_exceeded"
    assert resp.headers["x-request-id"].startswith("cmpl-")


def test_invalid_request_is_400_with_the_reason(stack: Stack) -> None:
    with pytest.raises(openai.BadRequestError) as info:  # beyond the 8192-token context
        stack.client().completions.create(model="small", prompt="hi", max_tokens=9000)
    err = info.value.response.json()["error"]
    assert err["code"] == "context_overflow" and "context" in err["message"]
    with pytest.raises(openai.NotFoundError):
        stack.client().completions.create(model="no-such-model", prompt="hi", max_tokens=5)
    with pytest.raises(openai.BadRequestError) as info:  # refused by the gateway itself
        stack.client().completions.create(model="small", prompt="hi", max_tokens=5, n=2)
    assert info.value.response.json()["error"]["param"] == "n"


def test_bad_key_is_401(stack: Stack) -> None:
    with pytest.raises(openai.AuthenticationError) as info:
        stack.client("sk-triage-wrong").completions.create(model="small", prompt="hi",
                                                           max_tokens=5)
    assert info.value.response.json()["error"]["code"] == "invalid_api_key"
    req = urllib.request.Request(stack.url + "/models")  # no key at all
    with pytest.raises(urllib.error.HTTPError) as http:
        urllib.request.urlopen(req, timeout=30)
    assert http.value.code == 401
    models = stack.client().models.list()
    assert [m.id for m in models.data] == ["small"]


def test_client_library_streams_with_time_to_first_token(stack: Stack) -> None:
    with TriageClient(bootstrap=stack.bootstrap, tenant="acme",
                      topic_prefix=stack.names.prefix) as client:
        req = InferenceRequest(tenant="acme", model="small", prompt_tokens=10, max_tokens=120)
        t0 = int(time.time() * 1000)
        stream = client.stream(req, timeout_s=60)
        pieces = list(stream)
    assert stream.reply is not None and stream.reply.status is ReplyStatus.COMPLETED
    n = stream.reply.output_tokens or 0
    assert n >= 24 and pieces == synthetic_tokens(req.request_id, 0, n)
    assert stream.reply.text == "".join(pieces)
    first = stream.assembler.first_token_at_ms
    assert first is not None and first >= t0 - 1000
    worker = stack.system.cfg.metrics.worker_port_base
    text = scrape(f"http://127.0.0.1:{worker}/metrics") or ""
    assert "triage_worker_ttft_seconds_count" in text
    assert "triage_worker_stream_chunks_total" in text


def test_ready_and_metrics(stack: Stack) -> None:
    root = stack.url.removesuffix("/v1")
    with urllib.request.urlopen(root + "/ready", timeout=30) as resp:
        assert resp.status == 200
    text = scrape(root + "/metrics") or ""
    assert 'triage_gateway_requests_total{code="200",endpoint="completions",tenant="acme"}' in text

