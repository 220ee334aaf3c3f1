"""One request and one reply topic for every tenant (`kafka.tenant_topics: shared`), on
the real broker with the admission app, a sim worker and the gateway as processes: the
gateway serves two tenants through one client, each tenant's quota still binds (the
tenant is the one the request names), workers stream to the shared reply topic, and a
client that sends for any tenant gets each request's answer, an unknown tenant's too."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from harness import QUOTA_BINDS, System, fast_config, gateway_running, running

from triage.client import InferenceRequest, TriageClient
from triage.demo.processes import scrape
from triage.gateway.auth import digest
from triage.kafka.clients import make_admin
from triage.topics.admin import delete_topics
from triage.topics.names import TopicNames
from triage.topics.reasons import ReasonCode, ReplyStatus
from triage.workers.backends.sim import synthetic_tokens

pytestmark = [pytest.mark.broker, pytest.mark.slow]

KEY = "sk-triage-test-acme-" + uuid.uuid4().hex
TINY_KEY = "sk-triage-test-tiny-" + uuid.uuid4().hex


def _tenant(name: str, **kw: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"name": name, "rate_tokens_per_s": 1e9, "burst_tokens": 1e9,
                            "queue_max": 500, "max_queue_wait_ms": 5000, "sla_ms": 30_000}
    return {**base, **kw}


class Stack:
    def __init__(self, system: System, url: str, names: TopicNames, bootstrap: str) -> None:
        self.system, self.url, self.names, self.bootstrap = system, url, names, bootstrap

    def client(self, key: str = KEY) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url, api_key=key, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def stack(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp: Path = tmp_path_factory.mktemp("shared")
    names = TopicNames(f"t{uuid.uuid4().hex[:8]}", shared=True)
    cfg = fast_config(kafka_bootstrap, names, tmp, gpus=1, tenants=[
        _tenant("acme"), _tenant("tiny", rate_tokens_per_s=1.0, burst_tokens=100.0),
    ], worker={"stream_chunk_tokens": 4, "stream_chunk_ms": 20}, policy=QUOTA_BINDS,
        kafka={"tenant_topics": "shared"})
    keys = tmp / "keys.yaml"
    keys.write_text("keys:\n"
                    f"  - tenant: acme\n    sha256: {digest(KEY).hex()}\n"
                    f"  - tenant: tiny\n    sha256: {digest(TINY_KEY).hex()}\n")
    try:
        with running(cfg, tmp) as system, gateway_running(tmp, keys) as (_, url):
            yield Stack(system, url, names, kafka_bootstrap)
    finally:
        delete_topics(kafka_bootstrap, names.prefix)


def test_every_tenant_shares_one_request_and_one_reply_topic(stack: Stack) -> None:
    md = make_admin(stack.bootstrap).list_topics(timeout=10)
    mine = {t for t in md.topics if t.startswith(stack.names.prefix + ".re")}
    assert mine == {f"{stack.names.prefix}.requests", f"{stack.names.prefix}.replies"}


def test_the_gateway_serves_each_tenant_and_keeps_each_quota(stack: Stack) -> None:
    out = stack.client().completions.create(model="small", prompt="Once upon a time",
                                            max_tokens=20)
    n = out.usage.completion_tokens if out.usage else 0
    assert n >= 1 and out.choices[0].text == "".join(synthetic_tokens(out.id, 0, n))
    tiny = stack.client(TINY_KEY)
    tiny.completions.create(model="small", prompt="word " * 76, max_tokens=1)
    with pytest.raises(openai.RateLimitError) as info:  # tiny's own bucket, not acme's
        tiny.completions.create(model="small", prompt="Once upon a time", max_tokens=80)
    assert info.value.response.json()["error"]["code"] == "tenant_quota_exceeded"
    again = stack.client().completions.create(model="small", prompt="hello", max_tokens=5)
    assert again.choices[0].finish_reason in ("stop", "length")
    metrics = scrape(stack.url.removesuffix("/v1") + "/metrics") or ""
    for tenant, code in (("acme", "200"), ("tiny", "200"), ("tiny", "429")):
        assert (f'triage_gateway_requests_total{{code="{code}",endpoint="completions",'
                f'tenant="{tenant}"}}') in metrics


def test_a_streamed_chat_arrives_in_order_on_the_shared_reply_topic(stack: Stack) -> None:
    stream = stack.client().chat.completions.create(
        model="small", max_tokens=120, stream=True, stream_options={"include_usage": True},
        messages=[{"role": "user", "content": "Tell me a story."}])
    pieces, ids, usage = [], set(), None
    for chunk in stream:
        ids.add(chunk.id)
        usage = chunk.usage or usage
        pieces += [c.delta.content for c in chunk.choices if c.delta.content]
    assert len(ids) == 1 and usage is not None and len(pieces) >= 3
    assert "".join(pieces) == "".join(synthetic_tokens(ids.pop(), 0, usage.completion_tokens))


def test_one_client_sends_for_any_tenant(stack: Stack) -> None:
    with TriageClient(bootstrap=stack.bootstrap, tenant=None, shared_topics=True,
                      topic_prefix=stack.names.prefix) as client:
        subs = [client.send(InferenceRequest(tenant=t, model="small", prompt_tokens=10,
                                             max_tokens=8))
                for t in ("acme", "tiny", "nobody")]
        replies = [s.result(60) for s in subs]
    assert [r.tenant for r in replies[:2]] == ["acme", "tiny"]
    assert replies[0].status is ReplyStatus.COMPLETED
    # tiny's bucket may be empty after the test above: served or refused, but its own
    assert replies[1].status in (ReplyStatus.COMPLETED, ReplyStatus.REJECTED)
    assert replies[2].status is ReplyStatus.INVALID
    assert replies[2].reason is ReasonCode.UNKNOWN_TENANT
