"""`triage bench handlers`: CPU per request of the admission app's own code, without
Kafka, Faust or RocksDB.

`triage bench pipeline` compares the whole app with a Faust skeleton that does the same
events, writes and outputs (docs/architecture.md, "A skeleton matched to triage's own
path"); what separates the two is triage's own per-request work: the handlers, the
compiled core, the records, replies and audit lines they build. This drives that code
alone, the way the pipeline's flat-out phase does: the pipeline's config (pipeline.py
`bench_config`) and requests (ceilings.py `request_bytes`), `requests` offered at
once (most of them queue), then completions ten to a message, as the workers send them,
until every request has ended; the outbox keeps its bookkeeping and is sealed and
confirmed every `COMMIT_EVERY` inputs, as the committer's batches are, and the store is
the in-memory one. Process CPU time, so the neighbours of a noisy machine move it less
than they move wall-clock rates.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from triage.bench.ceilings import request_bytes
from triage.bench.pipeline import bench_config
from triage.streams.metrics import AdmissionMetrics
from triage.streams.outbox import BatchedOutbox
from triage.streams.service import AdmissionService
from triage.streams.store import MappingStore
from triage.topics.messages import (
    Completion,
    CompletionBatch,
    CompletionStatus,
    LiveState,
    WorkItem,
)
from triage.topics.names import TopicNames

COMMIT_EVERY = 100  # inputs per sealed batch (a flat-out committer's batches hold ~100-300)
COMPLETIONS_PER_MESSAGE = 10  # the workers' completion_batch_max
TICK_EVERY = 50  # completion messages between ticks


class _WorkOutbox(BatchedOutbox):
    """The outbox's bookkeeping, keeping the work items for the bench's stand-in worker."""

    def __init__(self) -> None:
        super().__init__(None)
        self.work: list[bytes] = []
        self.terminal = 0  # final replies (completed, refused, timed out)

    def send_raw(self, topic: str, key: bytes | None, value: bytes) -> None:
        super().send_raw(topic, key, value)
        if topic.endswith(".work"):
            self.work.append(value)

    def commit(self) -> None:
        seq, _ = self.seal()
        self.confirm(seq)

    def flush(self, timeout_s: float = 10.0) -> int:
        return 0


def _completion_batch(items: list[WorkItem]) -> bytes:
    """What a worker sends when the attempts of `items` end: one CompletionBatch."""
    return CompletionBatch(completions=[
        Completion(request_id=w.request_id, attempt=w.attempt, tenant=w.tenant, model=w.model,
                   pool=w.pool, gpu_id=w.gpu_id, gpu_type="H200",
                   status=CompletionStatus.COMPLETED, prompt_tokens=w.prompt_tokens,
                   output_tokens=2, max_tokens=w.max_tokens, prefill_s=0.001, decode_s=0.002,
                   started_at_ms=1000, finished_at_ms=1003, text="ok")
        for w in items]).to_bytes()


def run(*, requests: int = 10_000, tenants: int = 4, prompt_bytes: int = 150) -> dict[str, Any]:
    """CPU µs per request of the handlers, and where the requests ended."""
    cfg = bench_config("127.0.0.1:1", "bench", Path("."), gpus=2, tenants=tenants)
    names = TopicNames.of(cfg.kafka.topic_prefix, cfg.kafka.tenant_topics)
    out = _WorkOutbox()
    store = MappingStore.in_memory()
    svc = AdmissionService(cfg, names=names, outbox=out, store=store,
                           metrics=AdmissionMetrics(CollectorRegistry()),
                           expect_heartbeats=False)
    svc.restore(0.0)
    tenant_list = [t.name for t in cfg.tenants]
    pad = b"x" * 150
    bodies = [request_bytes(f"r{i}", tenant_list[i % tenants], cfg.models[0].name, 1000)
              .replace(pad, b"x" * prompt_bytes) for i in range(requests)]
    topics = [names.requests(tenant_list[i % tenants]) for i in range(requests)]
    now = 1.0
    handler_s = 0.0
    started = time.process_time()
    for i, body in enumerate(bodies):
        svc.on_request(topic=topics[i], key=f"r{i}".encode(), value=body, partition=0,
                       offset=i, now=now)
        now += 1e-5
        if (i + 1) % COMMIT_EVERY == 0:
            out.commit()
    queued = requests - len(out.work)
    handler_s += time.process_time() - started
    messages = 0
    while out.work:
        items = [WorkItem.from_bytes(v) for v in out.work[:COMPLETIONS_PER_MESSAGE]]
        del out.work[:COMPLETIONS_PER_MESSAGE]
        batch = _completion_batch(items)  # the worker's side: not timed
        now += 0.003
        started = time.process_time()
        svc.on_completion(batch, key=b"p0", partition=0, offset=messages, now=now)
        messages += 1
        if messages % (COMMIT_EVERY // COMPLETIONS_PER_MESSAGE) == 0:
            out.commit()
        if messages % TICK_EVERY == 0:
            svc.on_tick(now)
        handler_s += time.process_time() - started
    done = sum(1 for r in store.requests() if r.state is LiveState.DONE)
    return {"requests": requests, "tenants": tenants, "prompt_bytes": prompt_bytes,
            "completed": done, "queued_first": queued, "completion_messages": messages,
            "outputs": out.sent, "outputs_per_request": out.sent / requests,
            "cpu_us_per_request": round(handler_s / requests * 1e6, 1)}
