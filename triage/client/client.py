"""TriageClient: submit inference requests to triage and await their terminal replies.

One producer and one reply-reader thread per client. ``send`` is the primitive
(non-blocking, returns a Submission); ``submit`` waits for the terminal reply;
``submit_with_retry`` honours the server's ``retry_after_ms``; ``run_batch``
keeps a bounded number of requests outstanding. ``asubmit`` and friends are the
same for asyncio code. ``updates``/``aupdates`` yield every reply of one request, and
``stream``/``astream`` its generated text as the worker streams it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import random
import time
import uuid
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping
from types import TracebackType
from typing import Any, Self

from confluent_kafka import KafkaError, KafkaException, Message

from triage.client.backoff import RetryPolicy
from triage.client.batch import BatchResult, arun_batch, run_batch
from triage.client.errors import (
    ClientClosedError,
    DeliveryError,
    ReplyTimeoutError,
    WrongTenantError,
)
from triage.client.retry import RetryPlan, plan_retry
from triage.client.router import ReplyRouter, Submission, UpdateCallback
from triage.client.updates import AsyncTextStream, TextStream, aiter_updates, iter_updates
from triage.config.models import TriageConfig
from triage.kafka.acls import FRONT_DOOR_GROUP_PREFIX, client_group_prefix
from triage.kafka.clients import make_consumer, make_producer, produce_waiting
from triage.kafka.security import librdkafka_settings
from triage.topics.messages import InferenceRequest, Reply
from triage.topics.names import TopicNames
from triage.topics.routing import read_routes
from triage.topics.shards import request_routes

log = logging.getLogger(__name__)

DEFAULT_REPLY_TIMEOUT_S = 120.0  # covers the example config's batch tenant (60 s SLA + 30 s wait)
ROUTES_REFRESH_S = 30.0  # a model the routes do not name: read them again at most this often


def now_ms() -> int:
    return int(time.time() * 1000)


class TriageClient:
    """A tenant's handle on triage: produce requests, route replies back by request_id."""

    def __init__(
        self,
        *,
        bootstrap: str,
        tenant: str | None,
        topic_prefix: str = "triage",
        shared_topics: bool = False,
        reply_timeout_s: float = DEFAULT_REPLY_TIMEOUT_S,
        retry: RetryPolicy | None = None,
        rng: random.Random | None = None,
        start_timeout_s: float = 10.0,
        producer_overrides: Mapping[str, Any] | None = None,
        kafka_settings: Mapping[str, Any] | None = None,
        routes: Mapping[str, int] | None = None,
    ) -> None:
        """`kafka_settings`: librdkafka properties for both clients, such as the SASL/TLS
        settings of this tenant's principal (from_config passes the config's).
        `routes`: model -> the request-topic partition of its pool's shard, for a sharded
        app (from_config derives them). None: read from the routes topic the app writes
        (topics/routing.py), and again, at most every ROUTES_REFRESH_S, for a model it
        does not name. A model with no route goes by key, and the app forwards it to its
        shard (one more hop).
        `shared_topics`: the app runs with `kafka.tenant_topics: shared` (one request and
        one reply topic for every tenant). Only there may `tenant` be None: one client
        that sends for any tenant, as a front door such as the gateway does."""
        if tenant is None and not shared_topics:
            raise ValueError("a client for any tenant (tenant=None) needs the shared topic "
                             "layout (kafka.tenant_topics: shared)")
        names = TopicNames(topic_prefix, shared=shared_topics)
        common = dict(kafka_settings or {})
        self.tenant = tenant
        self._bootstrap = bootstrap
        self._names = names
        self._common = common
        self._routes_from_topic = routes is None
        self._routes_read_at = -ROUTES_REFRESH_S
        self._routes: dict[str, int] = {}
        if routes is None:
            self._read_routes()
        else:
            self._routes = dict(routes)
        self.request_topic = names.requests(tenant or "")  # shared: the one topic
        self.reply_topic = names.replies(tenant or "")
        self.reply_timeout_s = reply_timeout_s
        self.retry_policy = retry or RetryPolicy()
        self._rng = rng or random.Random()
        self._closed = False
        self._producer = make_producer(bootstrap, **{**common, **dict(producer_overrides or {})})
        consumer = make_consumer(
            bootstrap,
            # Never joins (assign, not subscribe) nor commits; unique so nothing is shared.
            # Under the tenant's (or the front door's) group ACL prefix (kafka/acls.py).
            group_id=self._group_id(),
            # Low fetch wait: a reply is latency. "latest" only matters if retention ever deletes
            # the assigned start offset; old replies are never what a waiter wants.
            **{**common, "fetch.wait.max.ms": 50, "auto.offset.reset": "latest"},
        )
        self._router = ReplyRouter(
            consumer=consumer, topic=self.reply_topic, on_idle=lambda: self._producer.poll(0)
        )
        try:
            self._router.start(timeout_s=start_timeout_s)  # before any produce: see router.py
        except BaseException:
            consumer.close()
            self._producer.flush(1.0)
            raise
        log.debug("client for tenant %s ready on %s", tenant or "(any)", self.reply_topic)

    def _group_id(self) -> str:
        """A unique group id under this client's ACL prefix (kafka/acls.py)."""
        prefix = FRONT_DOOR_GROUP_PREFIX if self.tenant is None \
            else client_group_prefix(self.tenant)
        return f"{prefix}{uuid.uuid4().hex[:12]}"

    @classmethod
    def from_config(cls, config: TriageConfig, *, tenant: str | None,
                    **kwargs: Any) -> TriageClient:
        """A client on the broker, topic prefix and topic layout that ``config`` names."""
        return cls(
            bootstrap=config.kafka.bootstrap_servers,
            topic_prefix=config.kafka.topic_prefix,
            shared_topics=config.kafka.tenant_topics == "shared",
            tenant=tenant,
            **{"kafka_settings": librdkafka_settings(config.kafka.security),
               "routes": request_routes(config), **kwargs},
        )

    # -- one attempt -----------------------------------------------------------------

    def send(
        self, request: InferenceRequest, *, on_update: UpdateCallback | None = None
    ) -> Submission:
        """Produce one attempt and return at once; its Submission settles on the terminal reply.

        ``on_update`` sees every reply (accepted, queued, preempted, then the terminal one)
        on the reader thread: keep it short, and hop threads yourself if you need to.
        The request's ``created_at_ms`` is stamped with the send time.
        """
        if self._closed:
            raise ClientClosedError("the client is closed")
        if self.tenant is not None and request.tenant != self.tenant:
            raise WrongTenantError(
                f"request {request.request_id} is for tenant {request.tenant!r}, "
                f"this client sends for {self.tenant!r}"
            )
        stamped = request.model_copy(update={"created_at_ms": now_ms()})
        sub = Submission(stamped, on_update)
        self._router.register(sub)  # registered before producing: no reply can outrun it

        def on_delivery(err: KafkaError | None, _msg: Message) -> None:
            if err is not None:
                self._router.forget(sub.request_id)
                sub.fail(DeliveryError(f"{sub.request_id} was not delivered: {err.str()}"))

        payload = stamped.to_bytes()
        partition = self._route(stamped.model)
        produce_waiting(self._producer, self.request_topic, payload,
                        stamped.request_id.encode(), partition, on_delivery=on_delivery)
        self._producer.poll(0)
        return sub

    def _route(self, model: str) -> int:
        """The partition for `model`'s requests (-1: by key)."""
        partition = self._routes.get(model)
        if partition is None and self._routes_from_topic and (
                time.monotonic() - self._routes_read_at >= ROUTES_REFRESH_S):
            self._read_routes()  # a model added since: the app wrote its route at start
            partition = self._routes.get(model)
        return -1 if partition is None else partition

    def _read_routes(self) -> None:
        self._routes_read_at = time.monotonic()
        try:
            self._routes = read_routes(
                self._bootstrap, self._names, settings=self._common,
                group_id=self._group_id())
        except KafkaException as exc:  # requests go by key meanwhile: forwarded, not lost
            log.warning("could not read the routes (%s); requests go by key", exc)

    def forget(self, request_id: str) -> None:
        """Stop routing replies for ``request_id`` (after giving up on it)."""
        self._router.forget(request_id)

    def submit(
        self,
        request: InferenceRequest,
        *,
        timeout_s: float | None = None,
        on_update: UpdateCallback | None = None,
    ) -> Reply:
        """Send and wait for the terminal reply (ReplyTimeoutError after ``timeout_s``)."""
        sub = self.send(request, on_update=on_update)
        try:
            return sub.result(self._timeout(timeout_s))
        finally:
            self._router.forget(sub.request_id)

    # -- every reply, and streamed text ---------------------------------------------

    def updates(
        self, request: InferenceRequest, *, timeout_s: float | None = None
    ) -> Iterator[Reply]:
        """Send; yield each reply (queued, accepted, streaming chunks...) as it arrives,
        the terminal one last. ReplyTimeoutError when none is terminal within ``timeout_s``."""
        return iter_updates(self, request, self._timeout(timeout_s))

    def aupdates(
        self, request: InferenceRequest, *, timeout_s: float | None = None
    ) -> AsyncIterator[Reply]:
        """``updates`` for asyncio."""
        return aiter_updates(self, request, self._timeout(timeout_s))

    def stream(self, request: InferenceRequest, *, timeout_s: float | None = None) -> TextStream:
        """Send with ``stream=True``; iterate the result for text pieces as they are
        generated; afterwards its ``reply`` is the terminal reply."""
        streaming = request.model_copy(update={"stream": True})
        return TextStream(iter_updates(self, streaming, self._timeout(timeout_s)))

    def astream(
        self, request: InferenceRequest, *, timeout_s: float | None = None
    ) -> AsyncTextStream:
        """``stream`` for asyncio: ``async for piece in client.astream(request)``."""
        streaming = request.model_copy(update={"stream": True})
        return AsyncTextStream(aiter_updates(self, streaming, self._timeout(timeout_s)))

    # -- retries ---------------------------------------------------------------------

    def plan_retry(
        self, original: InferenceRequest, reply: Reply, attempts: int
    ) -> RetryPlan | None:
        """The next attempt after ``reply`` (None: final), drawn from this client's RNG."""
        return plan_retry(
            original,
            reply,
            attempts,
            policy=self._policy(None),
            rng=self._rng,
            mono_now=time.monotonic(),
        )

    def submit_with_retry(
        self,
        request: InferenceRequest,
        *,
        max_attempts: int | None = None,
        timeout_s: float | None = None,
        on_update: UpdateCallback | None = None,
    ) -> Reply:
        """Submit; on a retryable refusal wait the hint plus jitter and resend as ``<id>.r<n>``.

        Returns the last terminal reply (its request_id names the attempt). ``timeout_s``
        bounds each attempt's wait for its reply. Invalid replies are returned at once.
        """
        reply, _ = self.submit_with_retry_counted(
            request, max_attempts=max_attempts, timeout_s=timeout_s, on_update=on_update
        )
        return reply

    def submit_with_retry_counted(
        self,
        request: InferenceRequest,
        *,
        max_attempts: int | None = None,
        timeout_s: float | None = None,
        on_update: UpdateCallback | None = None,
    ) -> tuple[Reply, int]:
        """As submit_with_retry, also returning how many attempts were made."""
        policy = self._policy(max_attempts)
        current, attempts = request, 0
        while True:
            reply = self.submit(current, timeout_s=timeout_s, on_update=on_update)
            attempts += 1
            plan = plan_retry(
                request, reply, attempts, policy=policy, rng=self._rng, mono_now=time.monotonic()
            )
            if plan is None:
                return reply, attempts
            log.info(
                "%s %s (%s); retry %d as %s after the %d ms hint",
                reply.request_id, reply.status.value, reply.reason, plan.retry_number,
                plan.request.request_id, plan.hint_ms,
            )  # fmt: skip
            while (wait := plan.remaining_s(time.monotonic(), time.time() * 1000)) > 0:
                time.sleep(wait)
            current = plan.request

    # -- batches ---------------------------------------------------------------------

    def run_batch(
        self,
        requests: Iterable[InferenceRequest],
        *,
        max_in_flight: int,
        retry: bool = True,
        timeout_s: float | None = None,
    ) -> Iterator[BatchResult]:
        """Yield a BatchResult per request as each finishes, at most ``max_in_flight`` at once."""
        return run_batch(
            self,
            requests,
            max_in_flight=max_in_flight,
            retry=retry,
            timeout_s=self._timeout(timeout_s),
        )

    # -- asyncio ---------------------------------------------------------------------

    async def asubmit(
        self,
        request: InferenceRequest,
        *,
        timeout_s: float | None = None,
        on_update: UpdateCallback | None = None,
    ) -> Reply:
        """``submit`` for asyncio: the wait does not block the event loop."""
        sub = self.send(request, on_update=on_update)
        timeout = self._timeout(timeout_s)
        try:
            return await asyncio.wait_for(asyncio.wrap_future(sub.future), timeout)
        except TimeoutError:
            raise ReplyTimeoutError(sub.request_id, timeout, sub.history) from None
        finally:
            self._router.forget(sub.request_id)

    async def asubmit_with_retry(
        self,
        request: InferenceRequest,
        *,
        max_attempts: int | None = None,
        timeout_s: float | None = None,
        on_update: UpdateCallback | None = None,
    ) -> Reply:
        """``submit_with_retry`` for asyncio."""
        reply, _ = await self.asubmit_with_retry_counted(
            request, max_attempts=max_attempts, timeout_s=timeout_s, on_update=on_update
        )
        return reply

    async def asubmit_with_retry_counted(
        self,
        request: InferenceRequest,
        *,
        max_attempts: int | None = None,
        timeout_s: float | None = None,
        on_update: UpdateCallback | None = None,
    ) -> tuple[Reply, int]:
        policy = self._policy(max_attempts)
        current, attempts = request, 0
        while True:
            reply = await self.asubmit(current, timeout_s=timeout_s, on_update=on_update)
            attempts += 1
            plan = plan_retry(
                request, reply, attempts, policy=policy, rng=self._rng, mono_now=time.monotonic()
            )
            if plan is None:
                return reply, attempts
            while (wait := plan.remaining_s(time.monotonic(), time.time() * 1000)) > 0:
                await asyncio.sleep(wait)
            current = plan.request

    def arun_batch(
        self,
        requests: Iterable[InferenceRequest],
        *,
        max_in_flight: int,
        retry: bool = True,
        timeout_s: float | None = None,
    ) -> AsyncIterator[BatchResult]:
        """``run_batch`` for asyncio: an async iterator of results in completion order."""
        return arun_batch(
            self,
            requests,
            max_in_flight=max_in_flight,
            retry=retry,
            timeout_s=self._timeout(timeout_s),
        )

    # -- lifecycle -------------------------------------------------------------------

    def close(self, timeout_s: float = 10.0) -> None:
        """Flush what was produced, stop the reader, fail anything still waiting. Idempotent."""
        if self._closed:
            return
        self._closed = True
        left = self._producer.flush(timeout_s)
        if left:
            log.warning("%d request(s) still undelivered when the client closed", left)
        self._router.stop()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await asyncio.to_thread(self.close)

    def _timeout(self, timeout_s: float | None) -> float:
        return self.reply_timeout_s if timeout_s is None else timeout_s

    def _policy(self, max_attempts: int | None) -> RetryPolicy:
        if max_attempts is None:
            return self.retry_policy
        return dataclasses.replace(self.retry_policy, max_attempts=max_attempts)
