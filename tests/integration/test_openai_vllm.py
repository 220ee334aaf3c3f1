"""The openai backend against a fake vLLM: a real HTTP server (Starlette on uvicorn, in a
thread, on a free loopback port) that wants an API key, streams /v1/completions and
/v1/chat/completions, and exports vLLM's load series on /metrics. There are no model
weights here; the server's answers are scripted, the HTTP is real.

With the worker on the real broker: the engine's load reaches the heartbeat, and a
streaming work item's chunks reach the tenant's reply topic, whole and in order."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route
from test_worker import Tail, send  # the sim worker's tests' helpers

from triage.cli.worker_cmd import BackendKind, _backend
from triage.config import TriageConfig
from triage.topics.admin import create_topics
from triage.topics.messages import ChatMessage, Completion, GpuStatus, Reply, WorkItem
from triage.topics.names import TopicNames
from triage.topics.reasons import ReplyStatus
from triage.workers.backends.base import AttemptStatus
from triage.workers.backends.openai import OpenAIBackend
from triage.workers.worker import Worker, WorkerOptions

SECRET = "vllm-test-key"
GPU = "gpu-0"


@dataclass
class FakeVllm:
    """What the fake server answers, and what it was asked."""

    tokens: int = 6
    gap_s: float = 0.01
    running: int = 3
    waiting: int = 7
    kv: float = 0.42
    kv_name: str = "vllm:kv_cache_usage_perc"
    bodies: list[dict[str, Any]] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)
    metrics_auth: list[str | None] = field(default_factory=list)

    def app(self) -> Starlette:
        async def generate(request: Request) -> Response:
            if request.headers.get("authorization") != f"Bearer {SECRET}":
                return JSONResponse({"error": {"message": "Unauthorized"}}, status_code=401)
            body = await request.json()
            self.bodies.append(body)
            self.paths.append(request.url.path)
            chat = request.url.path.endswith("/chat/completions")

            async def events() -> AsyncIterator[bytes]:
                for i in range(self.tokens):
                    await asyncio.sleep(self.gap_s)
                    last = i == self.tokens - 1
                    choice: dict[str, Any] = (
                        {"index": 0, "delta": {"content": f" w{i}"},
                         "finish_reason": "length" if last else None}
                        if chat else
                        {"index": 0, "text": f" w{i}", "finish_reason": "length" if last else None}
                    )  # fmt: skip
                    chunk = json.dumps({"id": "x", "choices": [choice]}).encode()
                    yield b"data: " + chunk + b"\n\n"
                usage = {"prompt_tokens": 3, "completion_tokens": self.tokens}
                yield b"data: " + json.dumps({"id": "x", "choices": [], "usage": usage}).encode()
                yield b"\n\ndata: [DONE]\n\n"

            return StreamingResponse(events(), media_type="text/event-stream")

        async def metrics(request: Request) -> Response:
            self.metrics_auth.append(request.headers.get("authorization"))
            m = 'model_name="served"'
            text = (
                "# HELP vllm:num_requests_running Number of requests in the running batch.\n"
                "# TYPE vllm:num_requests_running gauge\n"
                f"vllm:num_requests_running{{{m}}} {self.running}.0\n"
                "# HELP vllm:num_requests_waiting Number of requests waiting.\n"
                "# TYPE vllm:num_requests_waiting gauge\n"
                f"vllm:num_requests_waiting{{{m}}} {self.waiting}.0\n"
                f"# HELP {self.kv_name} KV-cache usage. 1 means 100 percent usage.\n"
                f"# TYPE {self.kv_name} gauge\n"
                f"{self.kv_name}{{{m}}} {self.kv}\n"
                "# HELP vllm:prompt_tokens_total Prefill tokens processed.\n"
                "# TYPE vllm:prompt_tokens_total counter\n"
                f"vllm:prompt_tokens_total{{{m}}} 1234.0\n"
            )
            return PlainTextResponse(text)

        return Starlette(routes=[
            Route("/v1/completions", generate, methods=["POST"]),
            Route("/v1/chat/completions", generate, methods=["POST"]),
            Route("/metrics", metrics, methods=["GET"]),
        ])  # fmt: skip


@pytest.fixture
def vllm() -> Iterator[tuple[FakeVllm, str]]:
    fake = FakeVllm()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(fake.app(), log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline, "fake vLLM did not start"
        time.sleep(0.05)
    try:
        yield fake, f"http://127.0.0.1:{port}/v1"
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


def item(rid: str = "r1", *, messages: list[ChatMessage] | None = None,
         stream: bool = False, tenant: str = "rag") -> WorkItem:  # fmt: skip
    now = int(time.time() * 1000)
    return WorkItem(
        request_id=rid, attempt=0, tenant=tenant, model="llama-3.1-8b", pool="shared",
        gpu_id=GPU, prompt_tokens=4, max_tokens=64, prompt=None if messages else "hi",
        messages=messages, reserved_kv_bytes=1, predicted_s=0.1, dispatched_at_ms=now,
        deadline_ms=now + 60_000, arrived_at_ms=now, stream=stream,
    )  # fmt: skip


class Sink:
    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def tokens(self, pieces: Any) -> None:
        self.calls.append(list(pieces))


def test_chat_with_api_key_relays_the_stream(vllm: tuple[FakeVllm, str]) -> None:
    fake, url = vllm
    msgs = [ChatMessage(role="system", content="Be brief."), ChatMessage(role="user", content="Hi")]
    sink = Sink()

    async def scenario() -> Any:
        backend = OpenAIBackend(base_url=url, api_key=SECRET, model_map={"llama-3.1-8b": "served"})
        await backend.start()
        try:
            return await backend.run(item(messages=msgs, stream=True), sink)
        finally:
            await backend.close()

    res = asyncio.run(scenario())
    assert res.status is AttemptStatus.COMPLETED, res.error
    assert fake.paths == ["/v1/chat/completions"]
    body = fake.bodies[0]
    assert body["messages"] == [{"role": "system", "content": "Be brief."},
                                {"role": "user", "content": "Hi"}]  # fmt: skip
    assert "prompt" not in body and body["model"] == "served" and body["stream"] is True
    assert res.text == "".join(f" w{i}" for i in range(6)) and res.output_tokens == 6
    assert sink.calls == [[f" w{i}"] for i in range(6)]  # relayed chunk by chunk, in order
    assert res.first_token_at_ms is not None and res.started_at_ms <= res.first_token_at_ms


def test_completions_without_the_key_fail_with_401(vllm: tuple[FakeVllm, str]) -> None:
    _, url = vllm

    async def scenario() -> Any:
        backend = OpenAIBackend(base_url=url, metrics_url=None)
        try:
            return await backend.run(item())
        finally:
            await backend.close()

    res = asyncio.run(scenario())
    assert res.status is AttemptStatus.FAILED and res.error and "HTTP 401" in res.error


def test_the_worker_command_reads_the_key_and_the_metrics_url_from_config(
    vllm: tuple[FakeVllm, str], triage_config: TriageConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake, url = vllm
    cfg = triage_config.model_copy(update={"worker": triage_config.worker.model_copy(
        update={"openai_api_key_env": "MY_VLLM_KEY"})})  # fmt: skip
    monkeypatch.setenv("MY_VLLM_KEY", SECRET)
    backend = _backend(cfg, GPU, BackendKind.OPENAI, openai_url=url, time_scale=None,
                       sim_noise=0.0)  # fmt: skip
    assert isinstance(backend, OpenAIBackend)
    assert backend.poller is not None and backend.poller.url == url.removesuffix("/v1") + "/metrics"

    async def scenario() -> Any:
        try:
            return await backend.run(item())
        finally:
            await backend.close()

    res = asyncio.run(scenario())
    assert res.status is AttemptStatus.COMPLETED, res.error  # the key reached the server
    assert fake.metrics_auth and fake.metrics_auth[0] == f"Bearer {SECRET}"


@pytest.mark.broker
def test_worker_heartbeat_carries_vllm_load_and_streams_chunks_to_the_tenant(
    vllm: tuple[FakeVllm, str], kafka_bootstrap: str, topic_names: TopicNames,
    triage_config: TriageConfig,
) -> None:
    fake, url = vllm
    fake.kv_name = "vllm:gpu_cache_usage_perc"  # the older name is read too
    fake.tokens = 40
    create_topics(kafka_bootstrap, topic_names, triage_config)
    backend = OpenAIBackend(base_url=url, api_key=SECRET, metrics_url=url[:-3] + "/metrics",
                            metrics_interval_s=0.2)  # fmt: skip
    worker = Worker(config=triage_config, gpu_id=GPU, backend=backend,
                    options=WorkerOptions(bootstrap=kafka_bootstrap, topics=topic_names,
                                          metrics_port=0, drain_s=5.0))  # fmt: skip
    errors: list[BaseException] = []

    def main() -> None:
        try:
            asyncio.run(worker.run())
        except BaseException as exc:
            errors.append(exc)

    status = Tail(kafka_bootstrap, topic_names.gpu_status, GpuStatus)
    replies = Tail(kafka_bootstrap, topic_names.replies("rag"), Reply)
    completions = Tail(kafka_bootstrap, topic_names.completions, Completion)
    thread = threading.Thread(target=main, daemon=True)
    thread.start()
    try:
        assert worker.ready.wait(60), errors
        beats = status.until(lambda ms: any(m.waiting_seqs is not None for m in ms), 60)
        beat = next(m for m in beats if m.waiting_seqs is not None)
        assert (beat.running_seqs, beat.waiting_seqs, beat.kv_usage) == (3, 7, 0.42)
        send(kafka_bootstrap, topic_names.gpu_work(GPU), "s1", [item("s1", stream=True)])
        completions.until(lambda cs: any(c.request_id == "s1" for c in cs), 60)
        got = replies.until(lambda rs: sum(len(r.tokens or []) for r in rs) >= 40, 30)
    finally:
        worker.stop()
        thread.join(60)
        for t in (status, replies, completions):
            t.close()
    assert not errors, errors
    chunks = [r for r in got if r.request_id == "s1"]
    assert all(r.status is ReplyStatus.STREAMING for r in chunks)
    assert [r.token_offset for r in chunks] == sorted(r.token_offset or 0 for r in chunks)
    assert [p for r in chunks for p in r.tokens or []] == [f" w{i}" for i in range(40)]
    assert len({r.first_token_at_ms for r in chunks}) == 1
    text = worker.metrics.registry.get_sample_value(
        "triage_worker_ttft_seconds_count", {"gpu": GPU, "model": "llama-3.1-8b"})
    assert text == 1.0
