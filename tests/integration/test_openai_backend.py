"""The openai backend against a real HTTP server that streams like vLLM's /v1/completions.

The server is aiohttp.web on 127.0.0.1 with an ephemeral port: SSE ``data: {...}``
chunks carrying ``choices[0].text``, a final usage chunk with empty choices (what vLLM
sends for ``stream_options.include_usage``), then ``data: [DONE]``. Timing asserts are
lower bounds the server imposes (it sleeps), never upper bounds on the wall clock.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from triage.topics.messages import WorkItem
from triage.workers.backends.base import AttemptStatus
from triage.workers.backends.openai import FILLER, OpenAIBackend


@dataclass
class Script:
    """How the fake server answers."""

    tokens: int = 5
    ttft_s: float = 0.0
    gap_s: float = 0.0
    usage: int | None = -1  # -1: report the true count; None: no usage chunk
    status: int = 200
    error_chunk: bool = False
    requests: list[dict[str, Any]] = field(default_factory=list)
    sent: int = 0
    disconnected: asyncio.Event = field(default_factory=asyncio.Event)


def _chunk(text: str, finish: str | None = None) -> bytes:
    body = {
        "id": "cmpl-test",
        "object": "text_completion",
        "created": 0,
        "model": "m",
        "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}],
        "usage": None,
    }
    return b"data: " + json.dumps(body).encode() + b"\n\n"


def _handler(script: Script) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    async def completions(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        script.requests.append(body)
        if script.status != 200:
            return web.Response(status=script.status, text='{"error": "model overloaded"}')
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        try:
            await asyncio.sleep(script.ttft_s)
            if script.error_chunk:
                await resp.write(b'data: {"error": {"message": "KV cache exhausted"}}\n\n')
                return resp
            for i in range(script.tokens):
                if i:
                    await asyncio.sleep(script.gap_s)
                last = i == script.tokens - 1
                await resp.write(_chunk(f" t{i}", "length" if last else None))
                script.sent += 1
            if script.usage is not None:
                n = script.tokens if script.usage == -1 else script.usage
                usage = {"prompt_tokens": 3, "completion_tokens": n, "total_tokens": 3 + n}
                usage_chunk = {"id": "cmpl-test", "choices": [], "usage": usage}
                await resp.write(b"data: " + json.dumps(usage_chunk).encode() + b"\n\n")
            await resp.write(b"data: [DONE]\n\n")
        except (ConnectionResetError, asyncio.CancelledError):
            script.disconnected.set()
            raise
        return resp

    return completions


@asynccontextmanager
async def serve(script: Script) -> AsyncIterator[str]:
    app = web.Application()
    app.router.add_post("/v1/completions", _handler(script))
    runner = web.AppRunner(app, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        await runner.cleanup()


def item(request_id: str = "r1", *, prompt: str | None = None, max_tokens: int = 64) -> WorkItem:
    return WorkItem(
        request_id=request_id,
        attempt=0,
        tenant="rag",
        model="llama-3.1-8b",
        pool="shared",
        gpu_id="gpu-0",
        prompt_tokens=4,
        max_tokens=max_tokens,
        prompt=prompt,
        reserved_kv_bytes=1,
        predicted_s=0.1,
        dispatched_at_ms=0,
        deadline_ms=1,
        arrived_at_ms=0,
    )


async def _run_one(script: Script, work: WorkItem, **kw: Any) -> Any:
    async with serve(script) as url:
        backend = OpenAIBackend(base_url=url, **kw)
        await backend.start()
        try:
            return await backend.run(work)
        finally:
            await backend.close()


def test_measures_ttft_and_decode_and_counts_usage_tokens() -> None:
    script = Script(tokens=6, ttft_s=0.3, gap_s=0.05)
    res = asyncio.run(_run_one(script, item(prompt="Once upon a time")))
    assert res.status is AttemptStatus.COMPLETED, res.error
    assert res.output_tokens == 6
    assert res.text == "".join(f" t{i}" for i in range(6))
    assert res.prefill_s >= 0.3  # the server withheld the first token this long
    assert res.decode_s >= 5 * 0.05  # five gaps between six tokens
    assert res.prefill_s > res.decode_s / 2  # TTFT is measured apart from decode
    assert res.started_at_ms <= res.finished_at_ms


def test_ttft_tracks_the_server_not_a_constant() -> None:
    fast = asyncio.run(_run_one(Script(tokens=2, ttft_s=0.0), item()))
    slow = asyncio.run(_run_one(Script(tokens=2, ttft_s=0.4), item()))
    assert slow.prefill_s >= 0.4
    assert slow.prefill_s > fast.prefill_s


def test_usage_overrides_chunk_count_and_chunks_count_without_usage() -> None:
    with_usage = asyncio.run(_run_one(Script(tokens=4, usage=9), item()))
    assert with_usage.status is AttemptStatus.COMPLETED and with_usage.output_tokens == 9
    without = asyncio.run(_run_one(Script(tokens=4, usage=None), item()))
    assert without.status is AttemptStatus.COMPLETED and without.output_tokens == 4


def test_model_map_and_request_body() -> None:
    script = Script(tokens=1)
    served = "meta-llama/Llama-3.1-8B-Instruct"
    res = asyncio.run(_run_one(script, item(max_tokens=17), model_map={"llama-3.1-8b": served}))
    assert res.status is AttemptStatus.COMPLETED
    [body] = script.requests
    assert body["model"] == served
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert body["max_tokens"] == 17
    assert body["prompt"] == FILLER * 4  # no prompt text: filler of prompt_tokens
    unmapped = Script(tokens=1)
    asyncio.run(_run_one(unmapped, item(prompt="hi")))
    assert unmapped.requests[0]["model"] == "llama-3.1-8b"
    assert unmapped.requests[0]["prompt"] == "hi"


def test_abort_mid_stream_returns_partial_tokens_and_closes_the_stream() -> None:
    async def scenario() -> tuple[Any, Script, bool, bool]:
        script = Script(tokens=1000, gap_s=0.01)
        async with serve(script) as url:
            backend = OpenAIBackend(base_url=url)
            await backend.start()
            run = asyncio.create_task(backend.run(item()))
            while script.sent < 5:
                await asyncio.sleep(0.01)
            assert backend.load().running == 1
            aborted = await backend.abort("r1#0")
            res = await run
            await asyncio.wait_for(script.disconnected.wait(), 5.0)
            again = await backend.abort("r1#0")
            await backend.close()
            return res, script, aborted, again

    res, script, aborted, again = asyncio.run(scenario())
    assert aborted and not again
    assert res.status is AttemptStatus.ABORTED
    assert 1 <= res.output_tokens < 1000
    assert script.sent < 1000  # the server stopped: the client hung up
    assert script.disconnected.is_set()


def test_http_error_is_a_failed_result() -> None:
    res = asyncio.run(_run_one(Script(status=503), item()))
    assert res.status is AttemptStatus.FAILED
    assert res.error is not None and "HTTP 503" in res.error and "overloaded" in res.error
    assert res.output_tokens == 0


def test_error_chunk_is_a_failed_result() -> None:
    res = asyncio.run(_run_one(Script(error_chunk=True), item()))
    assert res.status is AttemptStatus.FAILED
    assert res.error is not None and "KV cache exhausted" in res.error


def test_unreachable_server_is_a_failed_result() -> None:
    async def scenario() -> Any:
        async with serve(Script()) as url:
            pass  # the server is gone once the block exits: its port refuses
        backend = OpenAIBackend(base_url=url)
        try:
            return await backend.run(item())
        finally:
            await backend.close()

    res = asyncio.run(scenario())
    assert res.status is AttemptStatus.FAILED
    assert res.error and "Connect" in res.error


def test_concurrent_streams_report_concurrency() -> None:
    async def scenario() -> list[Any]:
        script = Script(tokens=20, gap_s=0.01)
        async with serve(script) as url:
            backend = OpenAIBackend(base_url=url)
            await backend.start()
            try:
                return await asyncio.gather(*(backend.run(item(f"r{i}")) for i in range(5)))
            finally:
                await backend.close()

    results = asyncio.run(scenario())
    assert all(r.status is AttemptStatus.COMPLETED and r.output_tokens == 20 for r in results)
    assert max(r.mean_concurrency for r in results) > 1.0
