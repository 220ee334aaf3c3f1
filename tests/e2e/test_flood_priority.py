"""Heartbeats and completions are never starved by a request flood (issue 12, item 7).

On the real broker: the admission app as a process, the test playing both GPUs' workers
(it produces their heartbeats and a completion itself). A flood of requests is produced
at once; once the app is deciding it, a completion for a request running on g0 and a
"down" heartbeat for g1 are produced. Each one's effect is a decision record (the
completed request's `complete`, g1's running requests' `gpu_lost`), and the decisions
topic has one partition, so its order is the app's processing order. The test counts
the flood requests the app decided after the control message was produced and before
its effect: those whose decision's `at_ms` (the app's clock, on this host) is at or
after the moment of producing. That count shows whether the message waited behind the
flood. It is a count, not a wall time: counting instead what the test's own reader had
seen at produce time added the reader's and the outbox's lag (hundreds to ~7,000
decisions on a loaded machine) and made the test flaky.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, TopicPartition
from harness import fast_config, running, wait_until

from triage.kafka.clients import make_consumer, make_producer
from triage.topics.messages import (
    Completion,
    CompletionStatus,
    GpuState,
    GpuStatus,
    InferenceRequest,
)
from triage.topics.names import TopicNames

pytestmark = [pytest.mark.broker, pytest.mark.slow]

FLOOD = 16_000
STARTED = 300  # flood decisions seen before the control messages are produced
# At most this share of the flood still unread when a control message is produced may
# be decided before it takes effect. Before the fix the completion waited behind nearly
# all of it (15,077 of ~15,100; 13,558 with the priority fetch alone; issue 12 saw
# 10,226). With it, 58-560 measured by the app's clock (the most with two CPU hogs
# running beside the test on this 2-core machine).
SHARE = 1 / 8
GIB = 1 << 30


class DecisionLog:
    """The decisions topic in order: (request_id, outcome, reason, gpu_id) per record."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self._c = make_consumer(bootstrap, f"flood-{topic}-{time.time()}")
        self._c.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        self.records: list[tuple[str, str, str, str | None]] = []
        self.at_ms: list[int] = []  # each record's decision time
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            for m in self._c.consume(num_messages=2000, timeout=0.2):
                if m.error() is None:
                    d = json.loads(m.value() or b"{}")
                    self.records.append((d["request_id"], d["outcome"], d["reason"],
                                         d.get("gpu_id")))
                    self.at_ms.append(d["at_ms"])

    def flood_decided(self, upto: int | None = None) -> int:
        """First decisions of flood requests among the first `upto` records."""
        seen: set[str] = set()
        for rid, _, _, _ in self.records[:upto]:
            if rid.startswith("flood-"):
                seen.add(rid)
        return len(seen)

    def flood_decided_since(self, since_ms: int, upto: int) -> int:
        """Flood requests whose first decision is among the first `upto` records and was
        made at or after `since_ms`."""
        first_at: dict[str, int] = {}
        for (rid, _, _, _), at_ms in zip(self.records[:upto], self.at_ms, strict=False):
            if rid.startswith("flood-"):
                first_at.setdefault(rid, at_ms)
        return sum(1 for at_ms in first_at.values() if at_ms >= since_ms)

    def first(self, pred: Any) -> int | None:
        return next((i for i, r in enumerate(self.records) if pred(r)), None)

    def stop(self) -> None:
        self._stop.set()
        self._t.join(timeout=5)
        self._c.close()


def _status(gpu: str, state: GpuState) -> GpuStatus:
    return GpuStatus(gpu_id=gpu, pool="p", gpu_type="H200", name=gpu, state=state,
                     simulated=True, memory_total_bytes=141 * GIB, kv_budget_bytes=40 * GIB,
                     utilization=0.5, at_ms=int(time.time() * 1000))


def test_heartbeats_and_completions_overtake_a_request_flood(
    kafka_bootstrap: str, topic_names: TopicNames, tmp_path: Path
) -> None:
    tenant = {"name": "f", "rate_tokens_per_s": 1e12, "burst_tokens": 1e12,
              "queue_max": 100_000, "max_queue_wait_ms": 600_000, "sla_ms": 600_000}
    # no GPU is declared lost by silence during the test: only the "down" heartbeat
    cfg = fast_config(kafka_bootstrap, topic_names, tmp_path, tenants=[tenant],
                      policy={"preset": "full", "gpu_timeout_s": 600.0})
    names = topic_names
    producer = make_producer(kafka_bootstrap, **{"linger.ms": 2})

    def produce(topic: str, key: str, value: bytes) -> None:
        producer.produce(topic, key=key.encode(), value=value)

    with running(cfg, tmp_path, workers=False):
        log = DecisionLog(kafka_bootstrap, names.decisions)
        try:
            for gpu in ("g0", "g1"):
                produce(names.gpu_status, gpu, _status(gpu, GpuState.UP).to_bytes())
            producer.flush(10)
            # a few requests run on each GPU before the flood (the pool is idle)
            for i in range(8):
                req = InferenceRequest(request_id=f"warm-{i}", tenant="f", model="small",
                                       prompt_tokens=64, max_tokens=16)
                produce(names.requests("f"), req.request_id, req.to_bytes())
            producer.flush(10)
            wait_until(lambda: log.flood_decided() == 0 and sum(
                1 for r in log.records if r[0].startswith("warm-")) >= 8, 60, "warm-up")
            running_on = {g: [r[0] for r in log.records if r[1] == "accept" and r[3] == g]
                          for g in ("g0", "g1")}
            assert running_on["g0"] and running_on["g1"], log.records
            for i in range(FLOOD):
                req = InferenceRequest(request_id=f"flood-{i}", tenant="f", model="small",
                                       prompt_tokens=64, max_tokens=16)
                produce(names.requests("f"), req.request_id, req.to_bytes())
                if i % 1000 == 0:
                    producer.poll(0)
            producer.flush(30)
            wait_until(lambda: log.flood_decided() >= STARTED, 120, "the flood to start")
            produced_ms = int(time.time() * 1000)
            done = running_on["g0"][0]
            produce(names.completions, "p", Completion(
                request_id=done, attempt=0, tenant="f", model="small", pool="p",
                gpu_id="g0", gpu_type="H200", status=CompletionStatus.COMPLETED,
                prompt_tokens=64, output_tokens=16, max_tokens=16, prefill_s=0.01,
                decode_s=0.05, started_at_ms=1, finished_at_ms=2).to_bytes())
            produce(names.gpu_status, "g1", _status("g1", GpuState.DOWN).to_bytes())
            producer.flush(10)
            lost = set(running_on["g1"])

            def effects() -> tuple[int | None, int | None]:
                return (log.first(lambda r: r[0] == done and r[1] == "complete"),
                        log.first(lambda r: r[0] in lost and r[2] == "gpu_lost"))

            wait_until(lambda: None not in effects(), 300, "the completion and the heartbeat")
        finally:
            log.stop()
    completed_at, lost_at = effects()
    assert completed_at is not None and lost_at is not None
    for name, at in (("completion", completed_at), ("heartbeat", lost_at)):
        behind = log.flood_decided_since(produced_ms, at)
        unread_at_produce = FLOOD - (log.flood_decided(at) - behind)
        unread = FLOOD - log.flood_decided(at)
        print(f"{name}: {behind} flood requests decided after it was produced, "
              f"{unread} still undecided when it was applied")
        # the control message overtook the flood: few requests decided before it, while
        # much of the flood was still waiting. The second bound is the test's own
        # precondition (a backlog to overtake), not the property: how much of the flood the
        # app has read when the reader has seen STARTED decisions depends on the reader's
        # lag, and with CPU hogs beside the test 5,501 were left (a quarter is plenty).
        assert behind <= SHARE * unread_at_produce, (name, behind, unread_at_produce)
        assert unread >= FLOOD // 4, (name, unread)
