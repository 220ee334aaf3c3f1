"""The ``openai`` backend: a streaming ``/v1/completions`` call (``/v1/chat/completions``
for a chat prompt) to vLLM, llama.cpp's server or any OpenAI-compatible endpoint.

Streaming is what lets us measure: the time to the first text chunk is the prefill
(queueing in the server included, as a client sees it), the rest is decode. Output
tokens come from the final ``usage`` chunk (we ask for it with
``stream_options.include_usage``); servers that do not send one get a count of one
token per text chunk, which is what vLLM and llama.cpp stream. Abort (preemption)
cancels the request task, which closes the connection; vLLM then frees the sequence.

A WorkItem without a prompt (synthetic traffic) gets a filler prompt of about
``prompt_tokens`` tokens, so the server does the prefill work admission paid for.

A request that streams has each text chunk relayed to the worker's sink as it arrives
(one piece per chunk: vLLM and llama.cpp stream one token per chunk). The API key (a
server started with ``--api-key``) goes as a Bearer token on every call. The server's
``/metrics`` (vllm_metrics.py) is scraped in the background for the heartbeat's engine
load: sequences running and waiting, KV-cache usage.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from triage.topics.messages import WorkItem
from triage.workers.backends.base import (
    AttemptResult,
    AttemptStatus,
    Backend,
    EngineLoad,
    TokenSink,
    epoch_ms,
)
from triage.workers.backends.vllm_metrics import MetricsPoller
from triage.workers.errors import BackendError

log = logging.getLogger(__name__)

FILLER = " hello"  # about one token per repetition in Llama-family tokenizers
_ERROR_BODY_CHARS = 300


@dataclass(slots=True)
class _Stream:
    """What one in-flight stream has measured so far."""

    t0: float
    started_ms: int
    first_at: float | None = None
    last_at: float | None = None
    chunks: int = 0  # text-carrying chunks: one token each unless usage says otherwise
    usage_tokens: int | None = None
    finish_reason: str | None = None
    concurrency_sum: int = 0  # in-flight streams seen at each chunk
    text: list[str] = field(default_factory=list)
    aborted: bool = False
    first_ms: int | None = None  # wall clock of the first text chunk
    sink: TokenSink | None = None

    @property
    def tokens(self) -> int:
        return self.usage_tokens if self.usage_tokens is not None else self.chunks

    def result(self, status: AttemptStatus, error: str | None = None) -> AttemptResult:
        end = time.perf_counter()
        first = self.first_at if self.first_at is not None else end
        last = self.last_at if self.last_at is not None else first
        if status is AttemptStatus.ABORTED:
            last = end
        return AttemptResult(
            status=status,
            output_tokens=self.tokens,
            prefill_s=first - self.t0,
            decode_s=max(0.0, last - first),
            mean_concurrency=self.concurrency_sum / self.chunks if self.chunks else 1.0,
            started_at_ms=self.started_ms,
            finished_at_ms=epoch_ms(),
            error=error,
            text="".join(self.text) if self.text else None,
            first_token_at_ms=self.first_ms,
        )


class OpenAIBackend(Backend):
    """Streams completions from an OpenAI-compatible server."""

    kind = "openai"

    def __init__(
        self,
        *,
        base_url: str,
        model_map: dict[str, str] | None = None,
        read_timeout_s: float = 300.0,
        api_key: str | None = None,
        metrics_url: str | None = None,
        metrics_interval_s: float = 1.0,
    ) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise BackendError(f"openai base URL must start with http:// or https://: {base_url!r}")
        if metrics_url and not metrics_url.startswith(("http://", "https://")):
            raise BackendError(f"metrics URL must start with http:// or https://: {metrics_url!r}")
        root = base_url.rstrip("/")
        self.url = root + "/completions"
        self.chat_url = root + "/chat/completions"
        self.model_map = dict(model_map or {})
        self._timeout = aiohttp.ClientTimeout(total=None, sock_connect=10.0,
                                              sock_read=read_timeout_s)  # fmt: skip
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._session: aiohttp.ClientSession | None = None
        self._inflight: dict[str, tuple[asyncio.Task[AttemptResult], _Stream]] = {}
        # None or "": no probe (the heartbeat then says only what the worker itself knows)
        self.poller = (MetricsPoller(metrics_url, metrics_interval_s, self._headers)
                       if metrics_url else None)  # fmt: skip

    async def start(self) -> None:
        if self._session is None:
            # No connection limit: continuous batching wants every sequence in flight.
            connector = aiohttp.TCPConnector(limit=0)
            self._session = aiohttp.ClientSession(
                timeout=self._timeout, connector=connector, headers=self._headers
            )
            if self.poller is not None:
                self.poller.start(self._session)

    async def close(self) -> None:
        for wid in list(self._inflight):
            await self.abort(wid)
        if self.poller is not None:
            await self.poller.close()
        if self._session is not None:
            await self._session.close()
            self._session = None

    def served_model(self, model: str) -> str:
        """The server's name for a triage model (``openai_model_map``, else unchanged)."""
        return self.model_map.get(model, model)

    async def run(self, item: WorkItem, sink: TokenSink | None = None) -> AttemptResult:
        if self._session is None:
            await self.start()
        st = _Stream(t0=time.perf_counter(), started_ms=epoch_ms(), sink=sink)
        task = asyncio.create_task(self._stream(item, st), name=f"openai-{item.work_id}")
        self._inflight[item.work_id] = (task, st)
        try:
            return await task
        except asyncio.CancelledError:
            if st.aborted and not _being_cancelled():
                return st.result(AttemptStatus.ABORTED)
            task.cancel()
            raise
        finally:
            self._inflight.pop(item.work_id, None)

    async def abort(self, work_id: str) -> bool:
        entry = self._inflight.get(work_id)
        if entry is None:
            return False
        task, st = entry
        if task.done():
            return False
        st.aborted = True
        task.cancel()
        return True

    def load(self) -> EngineLoad:
        r = self.poller.latest() if self.poller is not None else None
        return EngineLoad(running=len(self._inflight), waiting=0, kv_used_bytes=None,
                          utilization=None, running_seqs=r.running if r else None,
                          waiting_seqs=r.waiting if r else None,
                          kv_usage=r.kv_usage if r else None)  # fmt: skip

    # ------------------------------------------------------------------ the stream

    def _body(self, item: WorkItem) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.served_model(item.model),
            "max_tokens": item.max_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if item.messages is not None:
            body["messages"] = [m.model_dump(exclude_none=True) for m in item.messages]
        else:
            body["prompt"] = (item.prompt if item.prompt is not None
                              else FILLER * item.prompt_tokens)  # fmt: skip
        return body

    async def _stream(self, item: WorkItem, st: _Stream) -> AttemptResult:
        assert self._session is not None
        done = False
        url = self.chat_url if item.messages is not None else self.url
        try:
            async with self._session.post(url, json=self._body(item)) as resp:
                if resp.status >= 400:
                    body = (await resp.text())[:_ERROR_BODY_CHARS]
                    error = f"HTTP {resp.status} from {url}: {body}"
                    return st.result(AttemptStatus.FAILED, error)
                async for raw in resp.content:
                    line = raw.strip()
                    if not line.startswith(b"data:"):
                        continue  # blank separators, ": keep-alive" comments, event: lines
                    data = line[5:].strip()
                    if data == b"[DONE]":
                        done = True
                        break
                    bad = self._on_chunk(json.loads(data), st)
                    if bad is not None:
                        return st.result(AttemptStatus.FAILED, bad)
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            return st.result(AttemptStatus.FAILED, f"{type(exc).__name__}: {exc}"[:500])
        if not done and st.finish_reason is None:
            return st.result(AttemptStatus.FAILED, "stream ended before [DONE]")
        return st.result(AttemptStatus.COMPLETED)

    def _on_chunk(self, chunk: Any, st: _Stream) -> str | None:
        """Account one SSE JSON chunk; return an error message if it reports one."""
        if not isinstance(chunk, dict):
            return f"unexpected chunk: {str(chunk)[:200]}"
        if "error" in chunk:
            err = chunk["error"]
            return f"server error: {err.get('message', err) if isinstance(err, dict) else err}"
        now = time.perf_counter()
        for choice in chunk.get("choices") or ():
            text = _choice_text(choice)
            if text:
                if st.first_at is None:
                    st.first_at = now
                    st.first_ms = epoch_ms()
                st.last_at = now
                st.chunks += 1
                st.concurrency_sum += len(self._inflight)
                st.text.append(text)
                if st.sink is not None:
                    st.sink.tokens((text,))
            if choice.get("finish_reason"):
                st.finish_reason = str(choice["finish_reason"])
        usage = chunk.get("usage")
        if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
            st.usage_tokens = usage["completion_tokens"]
        return None


def _choice_text(choice: Any) -> str:
    """A chunk's text: ``text`` (completions) or ``delta.content`` (chat)."""
    if not isinstance(choice, dict):
        return ""
    text = choice.get("text")
    if text is None:
        delta = choice.get("delta")
        text = delta.get("content") if isinstance(delta, dict) else None
    return text if isinstance(text, str) else ""


def _being_cancelled() -> bool:
    """True when the task awaiting the stream is itself being cancelled (shutdown)."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0
