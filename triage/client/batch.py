"""Batches for summarization pipelines: a bounded number in flight, results as they finish.

The bound counts requests that are outstanding *or* backing off before a retry.
A refusal with a hint means the tenant is over quota or the pool is full; filling
the freed slot with fresh work would only collect more refusals, so a request
keeps its slot until it is final.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import queue
import time
from collections.abc import AsyncIterator, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from triage.client.errors import ClientError, ReplyTimeoutError
from triage.client.retry import RetryPlan
from triage.client.router import Submission
from triage.topics.messages import InferenceRequest, Reply
from triage.topics.reasons import ReplyStatus

if TYPE_CHECKING:
    from triage.client.client import TriageClient

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class BatchResult:
    """How one request of a batch ended."""

    request: InferenceRequest  # the original, as given
    reply: Reply | None  # terminal reply of the last attempt; None when `error` is set
    attempts: int  # attempts sent (1 without retries)
    error: ClientError | None = None  # what the client could not do (timeout, delivery)

    @property
    def ok(self) -> bool:
        return self.reply is not None and self.reply.status == ReplyStatus.COMPLETED


@dataclass(slots=True)
class _Job:
    original: InferenceRequest
    attempts: int = 0
    sub: Submission | None = None
    deadline: float = 0.0  # monotonic: give up on the current attempt's reply here
    plan: RetryPlan | None = field(default=None)


def _check_bound(max_in_flight: int) -> None:
    if max_in_flight < 1:
        raise ValueError(f"max_in_flight must be >= 1, got {max_in_flight}")


def run_batch(
    client: TriageClient,
    requests: Iterable[InferenceRequest],
    *,
    max_in_flight: int,
    retry: bool,
    timeout_s: float,
) -> Iterator[BatchResult]:
    """Drive ``requests`` (consumed lazily) through ``client``; yield in completion order.

    One thread: completions arrive on a queue fed by the futures' callbacks, and the
    loop sleeps until the next completion, retry due time, or reply deadline.
    """
    _check_bound(max_in_flight)
    source = iter(requests)
    exhausted = False
    active: dict[str, _Job] = {}  # by the current attempt's request id
    backing_off: list[tuple[float, int, _Job]] = []  # heap by due time
    seq = itertools.count()
    done_q: queue.SimpleQueue[str] = queue.SimpleQueue()

    def launch(job: _Job, request: InferenceRequest) -> BatchResult | None:
        try:
            sub = client.send(request)
        except ClientError as exc:
            return BatchResult(job.original, None, job.attempts, exc)
        job.attempts += 1
        job.sub, job.plan = sub, None
        job.deadline = time.monotonic() + timeout_s
        active[sub.request_id] = job
        rid = sub.request_id
        sub.future.add_done_callback(lambda _f: done_q.put(rid))
        return None

    def finish(job: _Job) -> BatchResult | None:
        """Settle a completed attempt: a final result, or None when a retry was planned."""
        assert job.sub is not None
        exc = job.sub.future.exception()
        if exc is not None:
            err = exc if isinstance(exc, ClientError) else ClientError(str(exc))
            return BatchResult(job.original, None, job.attempts, err)
        reply = job.sub.future.result()
        plan = client.plan_retry(job.original, reply, job.attempts) if retry else None
        if plan is None:
            return BatchResult(job.original, reply, job.attempts)
        job.plan = plan
        heapq.heappush(backing_off, (plan.due_monotonic, next(seq), job))
        return None

    try:
        while True:
            while not exhausted and len(active) + len(backing_off) < max_in_flight:
                nxt = next(source, None)
                if nxt is None:
                    exhausted = True
                    break
                if (res := launch(_Job(nxt), nxt)) is not None:
                    yield res
            now = time.monotonic()
            while backing_off:
                _, _, job = backing_off[0]
                assert job.plan is not None
                if job.plan.remaining_s(now, time.time() * 1000) > 0:
                    break
                heapq.heappop(backing_off)
                if (res := launch(job, job.plan.request)) is not None:
                    yield res
            if not active and not backing_off:
                if exhausted:
                    return
                continue
            wake = [j.deadline for j in active.values()]
            if backing_off:
                _, _, first = backing_off[0]
                assert first.plan is not None
                wake.append(now + first.plan.remaining_s(now, time.time() * 1000))
            try:
                rid: str | None = done_q.get(timeout=max(0.0, min(wake) - now))
            except queue.Empty:
                rid = None
            if rid is not None and rid in active:
                client.forget(rid)
                if (res := finish(active.pop(rid))) is not None:
                    yield res
            now = time.monotonic()
            for rid_, job in [(r, j) for r, j in active.items() if j.deadline <= now]:
                if job.sub is not None and job.sub.done():
                    continue  # settled meanwhile: its id is on the queue
                del active[rid_]
                client.forget(rid_)
                history = job.sub.history if job.sub is not None else ()
                yield BatchResult(
                    job.original, None, job.attempts, ReplyTimeoutError(rid_, timeout_s, history)
                )
    finally:
        for rid_ in active:
            client.forget(rid_)


async def arun_batch(
    client: TriageClient,
    requests: Iterable[InferenceRequest],
    *,
    max_in_flight: int,
    retry: bool,
    timeout_s: float,
) -> AsyncIterator[BatchResult]:
    """``run_batch`` for asyncio: one task per outstanding request, at most ``max_in_flight``."""
    _check_bound(max_in_flight)

    async def one(req: InferenceRequest) -> BatchResult:
        try:
            if retry:
                reply, attempts = await client.asubmit_with_retry_counted(req, timeout_s=timeout_s)
            else:
                reply, attempts = await client.asubmit(req, timeout_s=timeout_s), 1
        except ClientError as exc:
            return BatchResult(req, None, 0, exc)
        return BatchResult(req, reply, attempts)

    source = iter(requests)
    pending: set[asyncio.Future[BatchResult]] = set()
    try:
        while True:
            while len(pending) < max_in_flight and (nxt := next(source, None)) is not None:
                pending.add(asyncio.ensure_future(one(nxt)))
            if not pending:
                return
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for fut in done:
                yield fut.result()
    finally:
        for fut in pending:
            fut.cancel()
