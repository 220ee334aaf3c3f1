"""The GPU worker against the real broker, with the sim backend at a fast time scale.

Absence ("no second completion", "no reply") is checked with a sentinel: a later
work item on the same partition whose result proves the earlier input was handled.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml

from triage.config import EXAMPLE_CONFIG, TriageConfig
from triage.config.models import GIB
from triage.kafka.clients import make_consumer, make_producer
from triage.topics.admin import create_topics
from triage.topics.messages import (
    Completion,
    CompletionStatus,
    ControlKind,
    ControlMessage,
    GpuState,
    GpuStatus,
    Message,
    Reply,
    WorkItem,
    completions_in,
)
from triage.topics.names import TopicNames
from triage.topics.reasons import ReasonCode, ReplyStatus
from triage.workers.backends.sim import SimBackend
from triage.workers.worker import Worker, WorkerOptions

pytestmark = pytest.mark.broker

GPU = "gpu-0"
SCALE = 0.02  # 50 simulated seconds per wall second


def work(
    rid: str, *, out: int = 20, prompt: int = 200, tenant: str = "rag", max_tokens: int = 30_000
) -> WorkItem:
    return WorkItem(
        request_id=rid, attempt=0, tenant=tenant, model="llama-3.1-8b", pool="shared",
        gpu_id=GPU, prompt_tokens=prompt, max_tokens=max_tokens, reserved_kv_bytes=1,
        predicted_s=1.0, dispatched_at_ms=int(time.time() * 1000),
        deadline_ms=int(time.time() * 1000) + 60_000, arrived_at_ms=int(time.time() * 1000),
        metadata={"sim_output_tokens": str(out)},
    )  # fmt: skip


class Tail:
    """Reads topics from the beginning (assigned, no group join), decoding as it goes
    (a CompletionBatch into its completions)."""

    def __init__(self, bootstrap: str, topic: str, model: type[Message]) -> None:
        from confluent_kafka import OFFSET_BEGINNING, TopicPartition

        self.model = model
        self.items: list[tuple[str, Any]] = []  # (key, message)
        self.messages = 0  # records read (a batch is one)
        self.c = make_consumer(bootstrap, f"test-{uuid.uuid4().hex[:8]}")
        parts = self.c.list_topics(topic, timeout=10).topics[topic].partitions
        self.c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in parts])

    def until(self, pred: Callable[[list[Any]], bool], timeout_s: float = 60.0) -> list[Any]:
        deadline = time.monotonic() + timeout_s
        while not pred([m for _, m in self.items]):
            assert time.monotonic() < deadline, f"timed out; have {len(self.items)} messages"
            for msg in self.c.consume(100, 0.2):
                if msg.error() is None:
                    key = (msg.key() or b"").decode()
                    value = msg.value() or b""
                    self.messages += 1
                    decoded = (completions_in(value) if self.model is Completion
                               else [self.model.from_bytes(value)])  # a batch: each completion
                    self.items.extend((key, m) for m in decoded)
        return [m for _, m in self.items]

    def close(self) -> None:
        self.c.close()


def send(bootstrap: str, topic: str, key: str, messages: list[Message]) -> None:
    p = make_producer(bootstrap)
    for m in messages:
        p.produce(topic, key=key.encode() if key else None, value=m.to_bytes())
    assert p.flush(30) == 0


def ids_of(items: list[Any], rid: str) -> list[Any]:
    return [m for m in items if m.request_id == rid]


@contextmanager
def running_worker(config: TriageConfig, bootstrap: str, names: TopicNames,
                   **opts: Any) -> Iterator[Worker]:  # fmt: skip
    backend = SimBackend(config=config, gpu_id=GPU, time_scale=SCALE, noise=0.0)
    options = WorkerOptions(bootstrap=bootstrap, topics=names, metrics_port=0, drain_s=5.0,
                            **opts)  # fmt: skip
    worker = Worker(config=config, gpu_id=GPU, backend=backend, options=options)
    errors: list[BaseException] = []

    def main() -> None:
        try:
            asyncio.run(worker.run())
        except BaseException as exc:  # surfaced in the test thread
            errors.append(exc)

    thread = threading.Thread(target=main, name="worker-under-test", daemon=True)
    thread.start()
    assert worker.ready.wait(60), f"worker did not start: {errors}"
    try:
        yield worker
    finally:
        worker.stop()
        thread.join(60)
        assert not thread.is_alive(), "worker did not stop"
        assert not errors, errors


@pytest.fixture
def topics(
    kafka_bootstrap: str, topic_names: TopicNames, triage_config: TriageConfig
) -> TopicNames:
    create_topics(kafka_bootstrap, topic_names, triage_config)
    return topic_names


def test_worker_runs_items_heartbeats_dedupes_preempts_and_serves_metrics(
    kafka_bootstrap: str, topics: TopicNames, triage_config: TriageConfig
) -> None:
    b = kafka_bootstrap
    completions = Tail(b, topics.completions, Completion)
    replies = Tail(b, topics.replies("rag"), Reply)
    status = Tail(b, topics.gpu_status, GpuStatus)
    model = triage_config.model("llama-3.1-8b")
    assert model is not None
    with running_worker(triage_config, b, topics, send_replies=True) as worker:
        # 1. A batch of work items: one completion and one completed reply each.
        items = [work(f"r{i}", out=10 + 3 * i) for i in range(12)]
        send(b, topics.gpu_work(GPU), "", list(items))
        done = completions.until(lambda cs: len(cs) >= 12)
        assert sorted(c.request_id for c in done) == sorted(i.request_id for i in items)
        keys = {k for k, _ in completions.items}
        assert keys == {"shared"}  # completions are keyed by pool
        assert completions.messages < 12  # finishing within the linger, they share messages
        for c in done:
            want = items[int(c.request_id[1:])]
            assert c.status is CompletionStatus.COMPLETED
            assert c.output_tokens == int(want.metadata["sim_output_tokens"])
            assert c.gpu_id == GPU and c.gpu_type == "H200" and c.attempt == 0
            # Simulated seconds, not wall seconds (the wall clock runs 50x faster):
            assert c.decode_s >= c.output_tokens * model.decode_s_per_token * 0.999
            assert c.prefill_s >= c.prompt_tokens * model.prefill_s_per_token * 0.999
            assert c.mean_concurrency >= 1.0
        got = replies.until(lambda rs: len(rs) >= 12)
        assert all(r.status is ReplyStatus.COMPLETED and r.reason is ReasonCode.COMPLETED
                   for r in got)  # fmt: skip
        assert {r.request_id for r in got} == {i.request_id for i in items}
        assert all(r.latency_ms is not None and r.output_tokens for r in got)

        # 2. Heartbeats: keyed by GPU, simulated, with the declared capacity.
        beats = status.until(lambda ss: len(ss) >= 2)
        assert {k for k, _ in status.items} == {GPU}
        hb = beats[-1]
        assert hb.simulated and hb.name == "simulated H200" and hb.state is GpuState.UP
        assert hb.memory_total_bytes == int(141 * GIB)
        assert hb.kv_budget_bytes == int(40 * GIB) and hb.pool == "shared"
        assert 0.0 <= hb.utilization <= 1.0

        # 3. A redelivered item is not run twice.
        send(b, topics.gpu_work(GPU), "", [items[0], work("sentinel-1", out=400)])
        completions.until(lambda cs: bool(ids_of(cs, "sentinel-1")))
        assert len(ids_of(completions.items and [m for _, m in completions.items], "r0")) == 1
        assert worker.counts["duplicates"] == 1

        # 4. Preempt a long attempt while it runs: preempted completion, no reply.
        send(b, topics.gpu_work(GPU), "", [work("long", out=20_000)])
        deadline = time.monotonic() + 30
        while "long#0" not in worker.backend.gpu:  # type: ignore[attr-defined]
            assert time.monotonic() < deadline
            time.sleep(0.02)
        time.sleep(0.2)  # let it generate some tokens (10 simulated seconds)
        preempt = ControlMessage(kind=ControlKind.PREEMPT, request_id="long", attempt=0,
                                 gpu_id=GPU, reason=ReasonCode.PREEMPTED_FOR_PRIORITY,
                                 at_ms=int(time.time() * 1000))  # fmt: skip
        send(b, topics.gpu_control(GPU), "long", [preempt])
        [long_c] = ids_of(completions.until(lambda cs: bool(ids_of(cs, "long"))), "long")
        assert long_c.status is CompletionStatus.PREEMPTED
        assert 0 < long_c.output_tokens < 20_000

        # 5. A cancel that arrives before its work item: reported, never run.
        cancel = ControlMessage(kind=ControlKind.CANCEL, request_id="early", attempt=0,
                                gpu_id=GPU, reason=ReasonCode.QUEUE_TIMEOUT,
                                at_ms=int(time.time() * 1000))  # fmt: skip
        send(b, topics.gpu_control(GPU), "early", [cancel])
        deadline = time.monotonic() + 30  # separate topics: wait until the worker holds it
        while "early#0" not in worker._early:
            assert time.monotonic() < deadline, "the cancel never reached the worker"
            time.sleep(0.02)
        send(b, topics.gpu_work(GPU), "", [work("early", out=50)])
        [early] = ids_of(completions.until(lambda cs: bool(ids_of(cs, "early"))), "early")
        assert early.status is CompletionStatus.CANCELLED and early.output_tokens == 0

        # 6. A request the GPU can never hold fails with a reason, and the tenant hears it.
        send(b, topics.gpu_work(GPU), "", [work("huge", prompt=400_000, max_tokens=10, out=5),
                                           work("sentinel-2", out=5)])  # fmt: skip
        [huge] = ids_of(completions.until(lambda cs: bool(ids_of(cs, "huge"))), "huge")
        assert huge.status is CompletionStatus.FAILED and huge.error and "budget" in huge.error
        rs = replies.until(lambda rs: bool(ids_of(rs, "sentinel-2")) and bool(ids_of(rs, "huge")))
        [huge_r] = ids_of(rs, "huge")
        assert huge_r.status is ReplyStatus.FAILED and huge_r.detail and "budget" in huge_r.detail
        assert ids_of(rs, "long") == [] and ids_of(rs, "early") == []  # dispatcher's to tell

        # 7. Metrics over real HTTP.
        url = f"http://127.0.0.1:{worker.metrics_port}/metrics"
        text = urllib.request.urlopen(url, timeout=10).read().decode()
        for series in (
            "triage_worker_running_sequences",
            "triage_worker_waiting_sequences",
            "triage_worker_gpu_utilization",
            "triage_worker_kv_bytes_in_use",
            "triage_worker_kv_budget_bytes",
            "triage_worker_prefill_seconds_bucket",
            "triage_worker_decode_seconds_count",
            "triage_worker_heartbeats_total",
        ):
            assert series in text, series
        assert 'triage_worker_simulated{gpu="gpu-0"} 1.0' in text
        assert 'triage_worker_duplicates_skipped_total{gpu="gpu-0"} 1.0' in text
        completed = (
            'triage_worker_attempts_total{gpu="gpu-0",model="llama-3.1-8b",'
            'status="completed",tenant="rag"} '
        )
        line = next(ln for ln in text.splitlines() if ln.startswith(completed))
        assert float(line.rsplit(" ", 1)[1]) == 14.0  # 12 + two sentinels
        assert 'status="preempted",tenant="rag"} 1.0' in text
        assert 'status="cancelled",tenant="rag"} 1.0' in text
        assert 'status="failed",tenant="rag"} 1.0' in text
    # Stopped cleanly: the last heartbeat says so.
    final = status.until(lambda ss: ss[-1].state is GpuState.DOWN, timeout_s=30)
    assert final[-1].state is GpuState.DOWN
    for t in (completions, replies, status):
        t.close()


def test_restarted_worker_does_not_rerun_redelivered_items(
    kafka_bootstrap: str, topics: TopicNames, triage_config: TriageConfig
) -> None:
    b = kafka_bootstrap
    completions = Tail(b, topics.completions, Completion)
    items = [work(f"a{i}", out=5) for i in range(3)]
    with running_worker(triage_config, b, topics):
        send(b, topics.gpu_work(GPU), "", list(items))
        completions.until(lambda cs: len(cs) >= 3)
    assert completions.messages < 3  # finished together: batched, so the seed reads batches
    # The same items again, as a redelivery after a crash would bring them, to a new
    # worker process (empty memory) whose only clue is the completions topic.
    send(b, topics.gpu_work(GPU), "", [*items, work("after", out=50)])
    with running_worker(triage_config, b, topics) as second:
        cs = completions.until(lambda cs: bool(ids_of(cs, "after")))
        assert second.counts["duplicates"] == 3
    assert sorted(c.request_id for c in cs) == ["a0", "a1", "a2", "after"]
    completions.close()


def test_cli_worker_stops_on_sigterm_and_reports_in_flight_work(
    kafka_bootstrap: str, topics: TopicNames, tmp_path: Path
) -> None:
    b = kafka_bootstrap
    data = yaml.safe_load(EXAMPLE_CONFIG.read_text())
    data["kafka"]["topic_prefix"] = topics.prefix
    data["kafka"]["bootstrap_servers"] = b
    cfg = tmp_path / "triage.yaml"
    cfg.write_text(yaml.safe_dump(data))
    status = Tail(b, topics.gpu_status, GpuStatus)
    completions = Tail(b, topics.completions, Completion)
    exe = Path(sys.executable).with_name("triage")
    proc = subprocess.Popen(
        [str(exe), "worker", "--gpu", GPU, "--backend", "sim", "--config", str(cfg),
         "--time-scale", "0.05", "--metrics-port", "0", "--drain-s", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env={**os.environ},
    )  # fmt: skip
    try:
        status.until(lambda ss: len(ss) >= 1, timeout_s=60)  # up: it heartbeats
        send(b, topics.gpu_work(GPU), "", [work("inflight", out=20_000)])
        status.until(lambda ss: ss[-1].running >= 1, timeout_s=30)  # it reports it running
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    log_text = out.decode(errors="replace")
    assert proc.returncode == 0, log_text[-3000:]
    assert "SIMULATED" in log_text  # no NVML here: it says so
    [c] = ids_of(completions.until(lambda cs: bool(ids_of(cs, "inflight"))), "inflight")
    assert c.status is CompletionStatus.PREEMPTED and c.error == "worker shutting down"
    assert status.until(lambda ss: ss[-1].state is GpuState.DOWN, timeout_s=30)
    json.dumps(log_text)  # the log is text, not binary garbage
    status.close()
    completions.close()
