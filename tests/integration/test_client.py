"""The tenant client against the real broker, answered by a tiny fake admission service.

The admission app is not part of this test: a responder thread (a real
confluent-kafka consumer on the request topic and producer on the reply topic)
answers each request the way a test scripts it, and records what it saw, so
assertions use the timestamps carried in the messages, never wall-clock sleeps.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import pytest
from confluent_kafka import Producer, TopicPartition
from typer.testing import CliRunner

from triage.cli.main import app
from triage.client import (
    ClientClosedError,
    ReplyTimeoutError,
    ReplyTopicError,
    TriageClient,
    WrongTenantError,
)
from triage.client.retry import RETRY_OF_KEY
from triage.kafka.clients import make_consumer, make_producer
from triage.topics.admin import TopicSpec, ensure_topics
from triage.topics.messages import InferenceRequest, Reply
from triage.topics.names import TopicKind, TopicNames
from triage.topics.reasons import ReasonCode, ReplyStatus

pytestmark = pytest.mark.broker

TENANT = "rag"
MODEL = "llama-3.1-8b"

Behaviour = Callable[[InferenceRequest], list[Reply]]


def now_ms() -> int:
    return int(time.time() * 1000)


def reply(req: InferenceRequest, status: ReplyStatus, **kw: object) -> Reply:
    data: dict[str, object] = {
        "request_id": req.request_id,
        "tenant": req.tenant,
        "status": status,
        "at_ms": now_ms(),
    }
    data.update(kw)
    return Reply.model_validate(data)


def complete(req: InferenceRequest) -> list[Reply]:
    return [reply(req, ReplyStatus.COMPLETED, reason=ReasonCode.COMPLETED, gpu_id="gpu-0")]


def reject_first_attempt(hint_ms: int) -> Behaviour:
    def behave(req: InferenceRequest) -> list[Reply]:
        if req.attempt == 0:
            return [
                reply(
                    req,
                    ReplyStatus.REJECTED,
                    reason=ReasonCode.TENANT_QUOTA_EXCEEDED,
                    retry_after_ms=hint_ms,
                )
            ]
        return complete(req)

    return behave


@dataclass
class Responder:
    """Fake admission: answers requests per `behaviour`, counting what is outstanding.

    With ``hold`` set, requests are held until ``hold`` are outstanding (or none has
    arrived for ``quiet_s``), then answered oldest first: if the client ever had
    more than ``hold`` outstanding, ``max_outstanding`` shows it.
    """

    bootstrap: str
    names: TopicNames
    behaviour: Behaviour
    hold: int | None = None
    quiet_s: float = 0.5
    received: list[tuple[InferenceRequest, int]] = field(default_factory=list)
    sent: list[Reply] = field(default_factory=list)
    outstanding: int = 0
    max_outstanding: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _error: BaseException | None = None

    def __enter__(self) -> Responder:
        self._thread = threading.Thread(target=self._run, name="fake-admission", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join(10)
        if self._error is not None:
            raise self._error

    def ids(self) -> list[str]:
        return [r.request_id for r, _ in self.received]

    def _run(self) -> None:
        try:
            self._serve()
        except BaseException as exc:  # surfaced in __exit__
            self._error = exc

    def _serve(self) -> None:
        topic = self.names.requests(TENANT)
        consumer = make_consumer(self.bootstrap, group_id=f"fake-admission-{self.names.prefix}")
        producer = make_producer(self.bootstrap, **{"linger.ms": 0})
        md = consumer.list_topics(topic, timeout=10)
        consumer.assign([TopicPartition(topic, p, 0) for p in md.topics[topic].partitions])
        pending: list[InferenceRequest] = []
        last_arrival = time.monotonic()
        try:
            while not self._stop.is_set():
                for msg in consumer.consume(num_messages=100, timeout=0.05):
                    if msg.error() is not None:
                        continue
                    req = InferenceRequest.from_bytes(msg.value() or b"")
                    self.received.append((req, now_ms()))
                    pending.append(req)
                    self.outstanding += 1
                    self.max_outstanding = max(self.max_outstanding, self.outstanding)
                    last_arrival = time.monotonic()
                quiet = time.monotonic() - last_arrival >= self.quiet_s
                while pending and (self.hold is None or len(pending) >= self.hold or quiet):
                    self._answer(pending.pop(0), producer)
        finally:
            producer.flush(10)
            consumer.close()

    def _answer(self, req: InferenceRequest, producer: Producer) -> None:
        for r in self.behaviour(req):
            if r.terminal:
                self.outstanding -= 1  # before the reply leaves: the client may send at once
            self.sent.append(r)
            producer.produce(
                self.names.replies(TENANT), key=r.request_id.encode(), value=r.to_bytes()
            )
        producer.flush(10)


@pytest.fixture
def topics(kafka_bootstrap: str, topic_names: TopicNames) -> TopicNames:
    """One request partition (so a sentinel proves the responder saw everything before it),
    three reply partitions (so routing by request id across partitions is exercised)."""
    ensure_topics(
        kafka_bootstrap,
        [
            TopicSpec(topic_names.requests(TENANT), TopicKind.REQUESTS, 1, 1),
            TopicSpec(topic_names.replies(TENANT), TopicKind.REPLIES, 3, 1),
        ],
    )
    return topic_names


@pytest.fixture
def client(kafka_bootstrap: str, topics: TopicNames) -> Iterator[TriageClient]:
    with TriageClient(
        bootstrap=kafka_bootstrap, tenant=TENANT, topic_prefix=topics.prefix, reply_timeout_s=30
    ) as c:
        yield c


def request(rid: str, **kw: object) -> InferenceRequest:
    data: dict[str, object] = {
        "request_id": rid,
        "tenant": TENANT,
        "model": MODEL,
        "prompt_tokens": 200,
        "max_tokens": 100,
    }
    data.update(kw)
    return InferenceRequest.model_validate(data)


def test_submit_returns_the_terminal_reply_and_ignores_old_replies(
    kafka_bootstrap: str, topics: TopicNames
) -> None:
    # A reply for the same id already on the topic (an earlier run): the client must skip it.
    stale = make_producer(kafka_bootstrap)
    old = reply(request("job-1"), ReplyStatus.COMPLETED, detail="stale")
    for p in range(3):
        stale.produce(topics.replies(TENANT), key=b"job-1", value=old.to_bytes(), partition=p)
    stale.flush(10)

    def staged(req: InferenceRequest) -> list[Reply]:
        return [
            reply(req, ReplyStatus.QUEUED, reason=ReasonCode.QUEUED_BEHIND, queue_position=2),
            reply(
                req, ReplyStatus.ACCEPTED, reason=ReasonCode.DISPATCHED_FROM_QUEUE, gpu_id="gpu-1"
            ),
            reply(req, ReplyStatus.COMPLETED, reason=ReasonCode.COMPLETED, detail="fresh"),
        ]

    seen: list[ReplyStatus] = []
    with (
        Responder(kafka_bootstrap, topics, staged),
        TriageClient(bootstrap=kafka_bootstrap, tenant=TENANT, topic_prefix=topics.prefix) as c,
    ):
        sub = c.send(request("job-1"), on_update=lambda r: seen.append(r.status))
        final = sub.result(30)
    assert final.status == ReplyStatus.COMPLETED
    assert final.detail == "fresh"
    assert [r.status for r in sub.history] == [
        ReplyStatus.QUEUED,
        ReplyStatus.ACCEPTED,
        ReplyStatus.COMPLETED,
    ]
    assert seen == [r.status for r in sub.history]
    assert sub.history[0].queue_position == 2
    assert sub.request.created_at_ms is not None  # stamped at send


def test_submit_with_retry_waits_at_least_the_hint(
    kafka_bootstrap: str, topics: TopicNames, client: TriageClient
) -> None:
    hint_ms = 300
    with Responder(kafka_bootstrap, topics, reject_first_attempt(hint_ms)) as fake:
        final = client.submit_with_retry(request("job-2", metadata={"doc": "a"}), max_attempts=3)
    assert final.status == ReplyStatus.COMPLETED
    assert final.request_id == "job-2.r1"
    assert fake.ids() == ["job-2", "job-2.r1"]
    (first, _), (retry, _) = fake.received
    assert (first.attempt, retry.attempt) == (0, 1)
    assert retry.metadata == {"doc": "a", RETRY_OF_KEY: "job-2"}
    rejection = next(r for r in fake.sent if r.status == ReplyStatus.REJECTED)
    assert retry.created_at_ms is not None
    # the retry left the client no sooner than the server's decision time plus its hint
    assert retry.created_at_ms >= rejection.at_ms + hint_ms


def test_invalid_is_never_retried(
    kafka_bootstrap: str, topics: TopicNames, client: TriageClient
) -> None:
    def invalid_then_ok(req: InferenceRequest) -> list[Reply]:
        if req.request_id.startswith("bad-1"):
            return [
                reply(
                    req,
                    ReplyStatus.INVALID,
                    reason=ReasonCode.CONTEXT_OVERFLOW,
                    detail="too long",
                    retry_after_ms=10,  # even a (nonsensical) hint must not cause a retry
                )
            ]
        return complete(req)

    with Responder(kafka_bootstrap, topics, invalid_then_ok) as fake:
        final = client.submit_with_retry(request("bad-1"), max_attempts=5)
        # one request partition: once the sentinel is answered, everything before it was seen
        assert client.submit(request("sentinel-1")).status == ReplyStatus.COMPLETED
    assert final.status == ReplyStatus.INVALID
    assert final.reason == ReasonCode.CONTEXT_OVERFLOW
    assert [i for i in fake.ids() if i.startswith("bad-1")] == ["bad-1"]


def test_batch_keeps_at_most_max_in_flight(
    kafka_bootstrap: str, topics: TopicNames, client: TriageClient
) -> None:
    """Every third request is refused once with a hint; the rest complete."""

    def behave(req: InferenceRequest) -> list[Reply]:
        n = int(req.request_id.split(".")[0].rsplit("-", 1)[1])
        if n % 3 == 0 and req.attempt == 0:
            return [
                reply(req, ReplyStatus.REJECTED, reason=ReasonCode.QUEUE_FULL, retry_after_ms=100)
            ]
        return complete(req)

    reqs = [request(f"sum-{i}") for i in range(10)]
    with Responder(kafka_bootstrap, topics, behave, hold=3) as fake:
        results = list(client.run_batch(reqs, max_in_flight=3))
    assert sorted(r.request.request_id for r in results) == sorted(r.request_id for r in reqs)
    assert all(r.ok for r in results), [(r.request.request_id, r.reply, r.error) for r in results]
    retried = {r.request.request_id: r for r in results if r.attempts == 2}
    assert set(retried) == {"sum-0", "sum-3", "sum-6", "sum-9"}
    assert all(r.reply is not None and r.reply.request_id.endswith(".r1") for r in retried.values())
    assert fake.max_outstanding == 3  # the responder held replies until 3 were waiting
    assert len(fake.received) == 14


def test_batch_without_retry_returns_the_refusal(
    kafka_bootstrap: str, topics: TopicNames, client: TriageClient
) -> None:
    with Responder(kafka_bootstrap, topics, reject_first_attempt(50)) as fake:
        results = list(
            client.run_batch([request("nr-1"), request("nr-2")], max_in_flight=2, retry=False)
        )
    assert {r.reply.status for r in results if r.reply} == {ReplyStatus.REJECTED}
    assert all(r.attempts == 1 for r in results)
    assert sorted(fake.ids()) == ["nr-1", "nr-2"]


def test_no_reply_times_out_with_the_history(
    kafka_bootstrap: str, topics: TopicNames, client: TriageClient
) -> None:
    def only_queued(req: InferenceRequest) -> list[Reply]:
        return [reply(req, ReplyStatus.QUEUED, reason=ReasonCode.QUEUED_BEHIND)]

    with Responder(kafka_bootstrap, topics, only_queued), pytest.raises(ReplyTimeoutError) as info:
        client.submit(request("slow-1"), timeout_s=2.0)
    assert info.value.request_id == "slow-1"
    # the queued reply may or may not have arrived inside the timeout; if it did, it is kept
    assert all(r.status == ReplyStatus.QUEUED for r in info.value.history)


def test_asyncio_wrappers(kafka_bootstrap: str, topics: TopicNames, client: TriageClient) -> None:
    async def run() -> tuple[Reply, list[str]]:
        final = await client.asubmit_with_retry(request("aio-1"), max_attempts=3)
        ids = [r.request.request_id async for r in client.arun_batch(
            [request(f"aio-b{i}") for i in range(4)], max_in_flight=2
        )]  # fmt: skip
        return final, ids

    with Responder(kafka_bootstrap, topics, reject_first_attempt(100)) as fake:
        final, ids = asyncio.run(run())
    assert final.status == ReplyStatus.COMPLETED and final.request_id == "aio-1.r1"
    assert sorted(ids) == [f"aio-b{i}" for i in range(4)]
    assert fake.ids().count("aio-1.r1") == 1


def test_local_errors(kafka_bootstrap: str, topics: TopicNames, client: TriageClient) -> None:
    with pytest.raises(WrongTenantError):
        client.send(request("x-1", tenant="batch"))
    with pytest.raises(ReplyTopicError, match="create the topics"):
        TriageClient(bootstrap=kafka_bootstrap, tenant="nobody", topic_prefix=topics.prefix)


def test_cli_submit(kafka_bootstrap: str, topics: TopicNames) -> None:
    import json

    runner = CliRunner()
    base = ["submit", "--tenant", TENANT, "--model", MODEL, "--bootstrap", kafka_bootstrap,
            "--topic-prefix", topics.prefix]  # fmt: skip
    with Responder(kafka_bootstrap, topics, reject_first_attempt(100)) as fake:
        res = runner.invoke(
            app,
            [*base, "--prompt-tokens", "100", "--max-tokens", "50", "--count", "4",
             "--concurrency", "2", "--id-prefix", "cli-t", "--json", "--timeout", "20"],
        )  # fmt: skip
        no_retry = runner.invoke(
            app,
            [*base, "--prompt-tokens", "100", "--max-tokens", "50", "--no-retry",
             "--id-prefix", "cli-n", "--timeout", "20"],
        )  # fmt: skip
    assert res.exit_code == 0, res.output
    lines = [json.loads(line) for line in res.stdout.splitlines() if line.strip()]
    assert sorted(d["request_id"] for d in lines) == [f"cli-t-{i:05d}" for i in range(4)]
    assert {d["status"] for d in lines} == {"completed"}
    assert all(d["attempts"] == 2 for d in lines)
    assert len(fake.received) == 9  # 4 x 2 attempts, then the one not retried
    assert no_retry.exit_code == 1, no_retry.output  # rejected, not retried
    assert "rejected" in no_retry.stdout

    bad_model = runner.invoke(app, [*base[:3], "--model", "gpt-9", *base[5:],
                                    "--prompt-tokens", "1", "--max-tokens", "1"])  # fmt: skip
    assert bad_model.exit_code == 2
    assert "unknown_model" in bad_model.stderr
    bad_tokens = runner.invoke(app, [*base, "--prompt-tokens", "0", "--max-tokens", "1"])
    assert bad_tokens.exit_code == 2
    assert "prompt_tokens" in bad_tokens.stderr
    too_long = runner.invoke(app, [*base, "--prompt-tokens", "30000", "--max-tokens", "5000"])
    assert too_long.exit_code == 2
    assert "context_overflow" in too_long.stderr


def test_close_fails_what_still_waits(kafka_bootstrap: str, topics: TopicNames) -> None:
    c = TriageClient(bootstrap=kafka_bootstrap, tenant=TENANT, topic_prefix=topics.prefix)
    sub = c.send(request("orphan-1"))  # nobody answers
    c.close()
    with pytest.raises(ClientClosedError):
        sub.result(10)
    with pytest.raises(ClientClosedError):
        c.send(request("orphan-2"))
    c.close()  # idempotent


def test_a_client_with_routes_sends_each_model_to_its_shards_partition(
    kafka_bootstrap: str, topic_names: TopicNames
) -> None:
    """A sharded app: the client built from the config puts a request on the partition of
    its model's pool (no forward), and a model it has no route for goes by key."""
    ensure_topics(kafka_bootstrap, [
        TopicSpec(topic_names.requests(TENANT), TopicKind.REQUESTS, 3, 1),
        TopicSpec(topic_names.replies(TENANT), TopicKind.REPLIES, 3, 1),
    ])
    with TriageClient(bootstrap=kafka_bootstrap, tenant=TENANT, topic_prefix=topic_names.prefix,
                      routes={MODEL: 2, "other": 1}) as c:
        for i in range(6):
            c.send(request(f"routed-{i}"))
        c.send(request("other-0", model="other"))
    consumer = make_consumer(kafka_bootstrap, f"{topic_names.prefix}-routes")
    consumer.assign([TopicPartition(topic_names.requests(TENANT), n, 0) for n in range(3)])
    where: dict[str, int] = {}
    deadline = time.monotonic() + 30
    while len(where) < 7 and time.monotonic() < deadline:
        for msg in consumer.consume(num_messages=50, timeout=0.5):
            if msg.error() is None:
                where[InferenceRequest.from_bytes(msg.value() or b"").request_id] = \
                    msg.partition()
    consumer.close()
    assert {where[f"routed-{i}"] for i in range(6)} == {2} and where["other-0"] == 1
