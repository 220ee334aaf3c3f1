"""`triage gateway`: an OpenAI-compatible HTTP front door (Starlette on uvicorn).

A request authenticates with a Bearer API key, which names its tenant (auth.py). The
gateway turns the OpenAI body into an InferenceRequest (schema.py), produces it to the
tenant's request topic and waits on the tenant's reply topic for the terminal reply,
then answers as OpenAI would (replies.py). One TriageClient per tenant, created at the
tenant's first request: one producer and one reply reader (a consumer on the tenant's
reply topic) that hands each reply to the request waiting for it, by request_id, so
the number of consumers is the number of tenants, not of requests. With one topic pair
for every tenant (`kafka.tenant_topics: shared`), one client serves every tenant.

``stream: true``: the request streams (workers publish token chunks as ``streaming``
replies); the gateway holds the HTTP answer until the first token or the terminal reply,
so a refusal is still a 429 (or 400, 503...), never an error inside a 200 stream; then
it relays chunks as server-sent events and ends with ``data: [DONE]``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from triage.client.client import TriageClient
from triage.client.errors import ClientClosedError, ClientError, ReplyTimeoutError
from triage.client.stream import StreamAssembler
from triage.client.updates import aiter_updates
from triage.config.models import TenantConfig, TriageConfig
from triage.gateway.auth import KeyStore
from triage.gateway.metrics import GatewayMetrics
from triage.gateway.replies import (
    HttpError,
    Shape,
    auth_error,
    bad_request,
    completion_body,
    error_for,
    timeout_error,
    unavailable,
)
from triage.gateway.schema import ChatBody, CompletionBody, estimate_chat_tokens, estimate_tokens
from triage.gateway.sse import sse_events
from triage.kafka.clients import broker_reachable
from triage.topics.messages import InferenceRequest, Reply
from triage.topics.shards import request_routes

log = logging.getLogger(__name__)

READY_CACHE_S = 2.0  # how long a broker check answers /ready
TIMEOUT_MARGIN_S = 10.0  # beyond the tenant's SLA and queue wait, for the default wait
Body = CompletionBody | ChatBody


def error_response(err: HttpError, request_id: str | None = None) -> JSONResponse:
    headers = dict(err.headers)
    if request_id is not None:
        headers["x-request-id"] = request_id
    return JSONResponse(err.body(), status_code=err.status, headers=headers)


def _first_error(exc: ValidationError) -> tuple[str, str | None]:
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err["loc"] if p != "body")
    return (f"{loc}: {err['msg']}" if loc else str(err["msg"])), (loc or None)


class Gateway:
    """The state behind the routes: config, keys, one client per tenant, metrics."""

    def __init__(
        self,
        config: TriageConfig,
        keys: KeyStore,
        *,
        bootstrap: str | None = None,
        metrics: GatewayMetrics | None = None,
    ) -> None:
        self.config = config
        self.keys = keys
        self.bootstrap = bootstrap or config.kafka.bootstrap_servers
        self.metrics = metrics or GatewayMetrics()
        self._shared = config.kafka.tenant_topics == "shared"
        self._clients: dict[str, TriageClient] = {}  # by tenant; shared topics: one, ""
        self._locks: dict[str, asyncio.Lock] = {}
        self._ready: tuple[float, bool] = (-READY_CACHE_S, False)

    # ------------------------------------------------------------------ plumbing

    async def client_for(self, tenant: str) -> TriageClient:
        """The tenant's client, made at its first request (its constructor blocks on the
        broker's metadata, so it runs in a thread)."""
        key = self._key(tenant)
        client = self._clients.get(key)
        if client is not None:
            return client
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock:
            client = self._clients.get(key)
            if client is None:
                client = await asyncio.to_thread(
                    TriageClient, bootstrap=self.bootstrap, tenant=key or None,
                    topic_prefix=self.config.kafka.topic_prefix,
                    shared_topics=self._shared, routes=request_routes(self.config),
                )  # fmt: skip
                self._clients[key] = client
        return client

    def _key(self, tenant: str) -> str:
        """The client of `tenant`: its own, or with shared topics the one for all ("")."""
        return "" if self._shared else tenant

    def _evict(self, tenant: str, client: TriageClient) -> None:
        """A client whose reader died is replaced at the tenant's next request."""
        key = self._key(tenant)
        if self._clients.get(key) is client:
            del self._clients[key]
            asyncio.get_running_loop().run_in_executor(None, client.close)

    async def close(self) -> None:
        clients, self._clients = list(self._clients.values()), {}
        for c in clients:
            await asyncio.to_thread(c.close)

    async def ready(self) -> bool:
        at, ok = self._ready
        now = time.monotonic()
        if now - at >= READY_CACHE_S:
            ok = await asyncio.to_thread(broker_reachable, self.bootstrap, 2.0)
            self._ready = (time.monotonic(), ok)
        return ok

    def authenticate(self, request: Request) -> str | None:
        """The tenant of the request's Bearer key, or None."""
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return None
        key = self.keys.lookup(token.strip())
        return None if key is None else key.tenant

    def reply_timeout_s(self, tenant: TenantConfig) -> float:
        t = self.config.gateway.reply_timeout_s
        if t is not None:
            return t
        return (tenant.sla_ms + tenant.max_queue_wait_ms) / 1000.0 + TIMEOUT_MARGIN_S

    # ------------------------------------------------------------------ requests

    def build(
        self, tenant: TenantConfig, body: Body, chat: bool
    ) -> tuple[InferenceRequest, Shape] | HttpError:
        """The InferenceRequest and the response's shape, or the 4xx that refuses it."""
        model = self.config.model(body.model)
        if model is None or (tenant.models is not None and body.model not in tenant.models):
            return HttpError(404, f"The model `{body.model}` does not exist or you do not "
                             "have access to it.", "invalid_request_error", "model_not_found",
                             "model")  # fmt: skip
        ext = body.triage
        messages = None
        prompt: str | None = None
        try:
            if isinstance(body, ChatBody):
                messages = body.chat_messages()
                estimate = estimate_chat_tokens(messages)
                wanted = body.wanted_max_tokens
            else:
                prompt = body.text
                estimate = estimate_tokens(prompt)
                wanted = body.max_tokens
        except (ValueError, ValidationError) as exc:
            msg = _first_error(exc)[0] if isinstance(exc, ValidationError) else str(exc)
            return bad_request(f"messages: {msg}", "messages")
        prompt_tokens = ext.prompt_tokens if ext and ext.prompt_tokens else estimate
        max_tokens = wanted or max(1, min(self.config.gateway.default_max_tokens,
                                          model.context_tokens - prompt_tokens))  # fmt: skip
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        try:
            req = InferenceRequest(
                request_id=rid, tenant=tenant.name, model=body.model,
                prompt_tokens=prompt_tokens, max_tokens=max_tokens,
                sla_ms=ext.sla_ms if ext else None, prompt=prompt, messages=messages,
                stream=body.stream, metadata={"via": "gateway"},
            )  # fmt: skip
        except ValidationError as exc:
            msg, param = _first_error(exc)
            return bad_request(msg, param)
        return req, Shape(id=rid, model=body.model, chat=chat, prompt_tokens=prompt_tokens,
                          max_tokens=max_tokens)  # fmt: skip

    async def handle(self, request: Request, *, chat: bool) -> Response:
        t0 = time.monotonic()
        endpoint = "chat" if chat else "completions"
        name = self.authenticate(request)
        if name is None:
            self.metrics.auth_failures.inc()
            return self._count(error_response(auth_error()), "-", endpoint, t0)
        tenant = self.config.tenant(name)
        if tenant is None:
            err = HttpError(403, f"tenant {name!r} of this key is not configured",
                            "permission_denied", "unknown_tenant")  # fmt: skip
            return self._count(error_response(err), name, endpoint, t0)
        try:
            raw = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            return self._count(error_response(bad_request("the body is not JSON")), name,
                               endpoint, t0)  # fmt: skip
        try:
            body: Body = (ChatBody if chat else CompletionBody).model_validate(raw)
        except ValidationError as exc:
            msg, param = _first_error(exc)
            return self._count(error_response(bad_request(msg, param)), name, endpoint, t0)
        built = self.build(tenant, body, chat)
        if isinstance(built, HttpError):
            return self._count(error_response(built), name, endpoint, t0)
        req, shape = built
        try:
            client = await self.client_for(name)
        except ClientError as exc:
            return self._count(error_response(unavailable(f"cannot reach triage: {exc}"),
                                              shape.id), name, endpoint, t0)  # fmt: skip
        timeout = self.reply_timeout_s(tenant)
        if body.stream:
            return await self._streamed(client, tenant, req, shape, body, timeout, t0)
        gauge = self.metrics.in_flight.labels(name)
        gauge.inc()
        try:
            final = await self._terminal(aiter_updates(client, req, timeout))
        except ReplyTimeoutError:
            err = timeout_error(req.request_id, timeout, self.config.gateway.timeout_retry_after_s)
            return self._count(error_response(err, shape.id), name, endpoint, t0)
        except ClientError as exc:
            if isinstance(exc, ClientClosedError):
                self._evict(name, client)
            return self._count(error_response(unavailable(str(exc)), shape.id), name,
                               endpoint, t0)  # fmt: skip
        finally:
            gauge.dec()
        problem = error_for(final, rate_tokens_per_s=tenant.rate_tokens_per_s)
        if problem is not None:
            return self._count(error_response(problem, shape.id), name, endpoint, t0)
        resp = JSONResponse(completion_body(shape, final), headers={"x-request-id": shape.id})
        return self._count(resp, name, endpoint, t0)

    @staticmethod
    async def _terminal(updates: AsyncIterator[Reply]) -> Reply:
        final: Reply | None = None
        async for reply in updates:
            if reply.terminal:
                final = reply
        assert final is not None  # the iteration ends only with a terminal reply or an error
        return final

    async def _streamed(
        self, client: TriageClient, tenant: TenantConfig, req: InferenceRequest, shape: Shape,
        body: Body, timeout: float, t0: float,
    ) -> Response:
        """Wait for the first token or the terminal reply, then answer: an error, or SSE."""
        endpoint = "chat" if shape.chat else "completions"
        updates = aiter_updates(client, req, timeout)
        asm = StreamAssembler()
        first: list[str] = []
        terminal: Reply | None = None
        try:
            while not first and terminal is None:
                reply = await updates.__anext__()
                first = asm.feed(reply)
                if reply.terminal:
                    terminal = reply
        except ReplyTimeoutError:
            await updates.aclose()
            err = timeout_error(req.request_id, timeout, self.config.gateway.timeout_retry_after_s)
            return self._count(error_response(err, shape.id), tenant.name, endpoint, t0)
        except (ClientError, StopAsyncIteration) as exc:
            await updates.aclose()
            if isinstance(exc, ClientClosedError):
                self._evict(tenant.name, client)
            return self._count(error_response(unavailable(str(exc)), shape.id), tenant.name,
                               endpoint, t0)  # fmt: skip
        if terminal is not None:
            problem = error_for(terminal, rate_tokens_per_s=tenant.rate_tokens_per_s)
            if problem is not None:
                await updates.aclose()
                return self._count(error_response(problem, shape.id), tenant.name, endpoint,
                                   t0)  # fmt: skip
        events = sse_events(updates, asm, first, terminal, shape, include_usage=body.include_usage,
                            metrics=self.metrics, tenant=tenant.name, t0=t0)
        resp = StreamingResponse(
            events, media_type="text/event-stream",
            headers={"x-request-id": shape.id, "Cache-Control": "no-cache"},
        )  # fmt: skip
        return self._count(resp, tenant.name, endpoint, t0, done=False)

    def _count(
        self, resp: Response, tenant: str, endpoint: str, t0: float, *, done: bool = True
    ) -> Response:
        self.metrics.requests.labels(tenant, endpoint, str(resp.status_code)).inc()
        if done:
            self.metrics.latency.labels(tenant, endpoint).observe(time.monotonic() - t0)
        return resp

    # ------------------------------------------------------------------ other routes

    async def models(self, request: Request) -> Response:
        name = self.authenticate(request)
        if name is None:
            self.metrics.auth_failures.inc()
            return error_response(auth_error())
        tenant = self.config.tenant(name)
        allowed = [m.name for m in self.config.models
                   if tenant is not None and (tenant.models is None or m.name in tenant.models)]
        data = [{"id": m, "object": "model", "created": 0, "owned_by": "triage"}
                for m in allowed]  # fmt: skip
        return JSONResponse({"object": "list", "data": data})


def create_app(gateway: Gateway) -> Starlette:
    """The ASGI app: /v1/completions, /v1/chat/completions, /v1/models, /live, /ready,
    /metrics."""

    async def completions(request: Request) -> Response:
        return await gateway.handle(request, chat=False)

    async def chat(request: Request) -> Response:
        return await gateway.handle(request, chat=True)

    async def live(_request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def ready(_request: Request) -> Response:
        ok = await gateway.ready()
        return JSONResponse({"status": "ready" if ok else "broker unreachable"},
                            status_code=200 if ok else 503)  # fmt: skip

    async def metrics(_request: Request) -> Response:
        return Response(generate_latest(gateway.metrics.registry),
                        media_type=CONTENT_TYPE_LATEST)  # fmt: skip

    @asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            await gateway.close()

    routes: list[Route] = [
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/v1/models", gateway.models, methods=["GET"]),
        Route("/live", live, methods=["GET"]),
        Route("/ready", ready, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
    ]
    return Starlette(routes=routes, lifespan=lifespan)

