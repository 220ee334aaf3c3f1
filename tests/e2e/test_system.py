"""End to end on the real broker: the Faust admission app and simulated GPU workers as
processes, tenants' requests in, replies and decisions out."""

from __future__ import annotations

import random
import shutil
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, TopicPartition
from harness import QUOTA_BINDS, fast_config, running, wait_until
from typer.testing import CliRunner

from triage.cli.main import app
from triage.demo.driver import LoadDriver, ReplyTracker
from triage.kafka.clients import make_consumer, make_producer
from triage.sim.workload import Arrival
from triage.topics.messages import DeadLetter, DecisionRecord, InferenceRequest, Reply
from triage.topics.names import TopicNames
from triage.topics.reasons import Outcome, ReasonCode, ReplyStatus

pytestmark = [pytest.mark.broker, pytest.mark.slow]

TERMINAL = {"completed", "rejected", "timed_out", "invalid", "failed"}
OUTCOME_OF = {"completed": Outcome.COMPLETE, "failed": Outcome.COMPLETE,
              "rejected": Outcome.REJECT, "timed_out": Outcome.TIMEOUT,
              "invalid": Outcome.INVALID}


def tenant(name: str, **kw: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"name": name, "rate_tokens_per_s": 1e9, "burst_tokens": 1e9,
                            "queue_max": 500, "max_queue_wait_ms": 5000, "sla_ms": 30_000}
    base.update(kw)
    return base


def read_all(bootstrap: str, topic: str, parse: Any) -> list[Any]:
    """Every message of a one-partition topic, from the beginning to its current end.
    The app writes in transactions, so offsets include commit markers that are never
    delivered: read until the consumer's position reaches the end, not a count."""
    c = make_consumer(bootstrap, f"read-{topic}-{time.time()}")
    tp = TopicPartition(topic, 0)
    try:
        _, high = c.get_watermark_offsets(tp, timeout=10)
        c.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        out: list[Any] = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            for msg in c.consume(num_messages=1000, timeout=1.0):
                if msg.error() is None:
                    out.append(parse(msg.value()))
            pos = c.position([tp])[0].offset
            if high == 0 or pos >= high:
                break
        return out
    finally:
        c.close()


def test_five_thousand_requests_each_end_in_exactly_one_terminal_reply(
    kafka_bootstrap: str, topic_names: TopicNames, tmp_path: Path
) -> None:
    cfg = fast_config(kafka_bootstrap, topic_names, tmp_path, tenants=[
        tenant("steady"),
        # ~50 req/s x ~250 tokens is ~2.5x this rate: refusals whatever the machine's pace
        tenant("bursty", rate_tokens_per_s=5_000, burst_tokens=10_000, max_debt_tokens=2_000),
        tenant("batch", rate_tokens_per_s=4_000, burst_tokens=8_000, allow_overage=True,
               max_queue_wait_ms=20_000),
    ], policy=QUOTA_BINDS)
    rng = random.Random(5)
    arrivals = []
    for i in range(5000):
        t = rng.choice(["steady", "bursty", "batch"])
        prompt = rng.randint(50, 400)
        if i % 100 == 7:  # 50 requests beyond the model's context: answered `invalid`
            prompt = 8190
        mx = rng.randint(4, 48)
        arrivals.append(Arrival(i / 150.0, t, "small", prompt, mx, rng.randint(1, mx)))
    with running(cfg, tmp_path) as system:
        tracker = ReplyTracker(kafka_bootstrap, topic_names, ["steady", "bursty", "batch"])
        tracker.start()
        try:
            garbage = make_producer(kafka_bootstrap)
            for i in range(10):  # unparseable bytes: dead-lettered, never answered
                garbage.produce(topic_names.requests("steady"), key=f"junk{i}".encode(),
                                value=b"\x00 not json")
            garbage.flush(10)
            sent = LoadDriver(kafka_bootstrap, topic_names, tracker).run(arrivals, speed=1.0)
            assert sent == 5000
            wait_until(lambda: tracker.outstanding() == 0, 180, "every request to end")
            time.sleep(1.0)  # late duplicates, if any, would arrive now
            tracks = tracker.snapshot()
            metrics_text = system.metrics()
        finally:
            tracker.stop()
    ends = Counter(t.terminal for t in tracks)
    assert len(tracks) == 5000
    assert all(t.terminals == 1 for t in tracks), [t for t in tracks if t.terminals != 1][:3]
    assert sum(ends[k] for k in TERMINAL) == 5000  # sent = completed + rejected + ...
    assert ends["invalid"] == 50
    assert ends["completed"] > 2500 and ends["rejected"] > 0  # the bursty tenant hit its quota
    assert tracker.unknown == 0
    # every reply went to its own tenant's topic
    for t in ("steady", "bursty", "batch"):
        replies = read_all(kafka_bootstrap, topic_names.replies(t), Reply.from_bytes)
        assert {r.tenant for r in replies} == {t}
        assert all(r.request_id.startswith(f"{t}-") for r in replies)
    # every decision is on the decisions topic, and each terminal reply has its decision
    decisions = read_all(kafka_bootstrap, topic_names.decisions, DecisionRecord.from_bytes)
    by_id: dict[str, set[Outcome]] = {}
    for d in decisions:
        by_id.setdefault(d.request_id, set()).add(d.outcome)
    rid_tracks = tracker.tracks
    assert set(rid_tracks) <= set(by_id)
    for rid, t in rid_tracks.items():
        assert t.terminal is not None and OUTCOME_OF[t.terminal] in by_id[rid], (rid, t)
    dead = read_all(kafka_bootstrap, topic_names.deadletter, DeadLetter.from_bytes)
    assert sum(1 for d in dead if "not JSON" in d.error) == 10
    assert sum(1 for d in dead if "context" in d.error) == 50
    for name in ("triage_admissions_total", "triage_request_latency_seconds_bucket",
                 "triage_decision_latency_seconds_bucket"):
        assert name in metrics_text


def _submit(bootstrap: str, names: TopicNames, req: InferenceRequest) -> None:
    p = make_producer(bootstrap)
    p.produce(names.requests(req.tenant), key=req.request_id.encode(), value=req.to_bytes())
    p.flush(10)


def _reply(bootstrap: str, names: TopicNames, tenant: str, rid: str,
           terminal: bool = True, timeout_s: float = 30) -> Reply:
    c = make_consumer(bootstrap, f"wait-{rid}-{time.time()}")
    try:
        c.assign([TopicPartition(names.replies(tenant), 0, OFFSET_BEGINNING)])
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for msg in c.consume(num_messages=200, timeout=0.5):
                if msg.error() is not None:
                    continue
                r = Reply.from_bytes(msg.value() or b"")
                if r.request_id == rid and (r.terminal or not terminal):
                    return r
        raise AssertionError(f"no reply for {rid}")
    finally:
        c.close()


def test_quota_hints_are_right_queues_time_out_audit_explains_and_metrics_are_served(
    kafka_bootstrap: str, topic_names: TopicNames, tmp_path: Path
) -> None:
    cfg = fast_config(kafka_bootstrap, topic_names, tmp_path, gpus=1, kv_budget_gib=0.25,
                      tenants=[
                          tenant("quota", rate_tokens_per_s=200, burst_tokens=2000,
                                 output_ratio_prior=1.0),
                          tenant("waits", max_queue_wait_ms=1000, output_ratio_prior=1.0),
                      ], policy=QUOTA_BINDS)
    names = topic_names
    with running(cfg, tmp_path, workers=False) as system:  # no worker: nothing ever frees
        def req(rid: str, t: str, prompt: int, mx: int) -> InferenceRequest:
            return InferenceRequest(request_id=rid, tenant=t, model="small",
                                    prompt_tokens=prompt, max_tokens=mx)

        # quota: 2,000 tokens of burst; the first takes 1,500, the second must wait (the
        # bucket refills 1,000 tokens in 5 s: a slow reply to q1 cannot let q2 in)
        _submit(kafka_bootstrap, names, req("q1", "quota", 1400, 100))
        assert _reply(kafka_bootstrap, names, "quota", "q1", terminal=False).status \
            is ReplyStatus.ACCEPTED
        _submit(kafka_bootstrap, names, req("q2", "quota", 1400, 100))
        refused = _reply(kafka_bootstrap, names, "quota", "q2")
        assert refused.status is ReplyStatus.REJECTED
        assert refused.reason is ReasonCode.TENANT_QUOTA_EXCEEDED
        assert refused.retry_after_ms is not None and 0 < refused.retry_after_ms <= 5100
        # come back exactly at the hint: admitted
        wait_s = (refused.at_ms + refused.retry_after_ms) / 1000.0 - time.time()
        time.sleep(max(0.0, wait_s))
        _submit(kafka_bootstrap, names, req("q3", "quota", 1400, 100))
        again = _reply(kafka_bootstrap, names, "quota", "q3", terminal=False)
        assert again.status in (ReplyStatus.ACCEPTED, ReplyStatus.QUEUED), again
        # memory: the GPU is held (no worker), so the next request waits, then times out
        _submit(kafka_bootstrap, names, req("w1", "waits", 1500, 100))
        _submit(kafka_bootstrap, names, req("w2", "waits", 1500, 100))
        queued = _reply(kafka_bootstrap, names, "waits", "w2", terminal=False)
        assert queued.status is ReplyStatus.QUEUED
        out = _reply(kafka_bootstrap, names, "waits", "w2")
        assert out.status is ReplyStatus.TIMED_OUT and out.reason is ReasonCode.QUEUE_TIMEOUT
        assert out.retry_after_ms is not None and out.retry_after_ms > 0
        # the audit log explains the refusal, in words and numbers
        result = CliRunner().invoke(app, ["audit", "q2", "--config", str(system.cfg_path)])
        assert result.exit_code == 0, result.output
        assert "quota" in result.output.lower() and "retry" in result.output.lower()
        # the named series are served over HTTP
        text = system.metrics()
        for name in (
            "triage_admissions_total", "triage_queue_depth", "triage_queue_depth_observed",
            "triage_queue_wait_seconds", "triage_queue_timeouts_total",
            "triage_sla_violations_total", "triage_preemptions_total",
            "triage_preemption_rate", "triage_predictor_relative_error",
            "triage_decision_latency_seconds", "triage_gpu_utilization",
            "triage_kv_reserved_bytes", "triage_bucket_tokens", "triage_admission_tightened",
        ):
            assert f"# HELP {name}" in text or f"# HELP {name.removesuffix('_total')}" in text
        assert 'triage_queue_timeouts_total{model="small",reason="queue_timeout",tenant="waits"}' \
            in text


def test_a_restarted_admission_app_recovers_its_buckets_from_the_changelog(
    kafka_bootstrap: str, topic_names: TopicNames, tmp_path: Path
) -> None:
    cfg = fast_config(kafka_bootstrap, topic_names, tmp_path, tenants=[
        tenant("slow", rate_tokens_per_s=5, burst_tokens=3000, output_ratio_prior=1.0)],
        policy=QUOTA_BINDS)
    names = topic_names

    def req(rid: str) -> InferenceRequest:
        return InferenceRequest(request_id=rid, tenant="slow", model="small",
                                prompt_tokens=900, max_tokens=100)

    with running(cfg, tmp_path, workers=False) as system:
        for i in range(3):  # 3 x 1,000 tokens: the burst is spent
            _submit(kafka_bootstrap, names, req(f"a{i}"))
            assert _reply(kafka_bootstrap, names, "slow", f"a{i}", terminal=False).status \
                is ReplyStatus.ACCEPTED
        time.sleep(3.0)  # buckets are written behind (each tick) and offsets committed
        system.admission.stop()
        shutil.rmtree(cfg.admission.datadir)  # no local RocksDB: only the changelog remains
        system.start_admission()
        _submit(kafka_bootstrap, names, req("after"))
        after = _reply(kafka_bootstrap, names, "slow", "after")
        assert after.status is ReplyStatus.REJECTED, after  # no fresh burst
        assert after.reason is ReasonCode.TENANT_QUOTA_EXCEEDED
        assert after.retry_after_ms is not None and after.retry_after_ms > 100_000


def test_a_work_item_no_worker_ran_is_taken_back_and_ends_in_one_completed_reply(
    kafka_bootstrap: str, topic_names: TopicNames, tmp_path: Path
) -> None:
    """The app dispatches to a GPU whose worker is not running (its work item waits
    unread): after policy.result_timeout_s it takes the request back and runs it again
    (`result_overdue`), again and again while no result comes; once the worker starts and
    reads every attempt and cancel, the request ends in exactly one `completed` reply."""
    cfg = fast_config(kafka_bootstrap, topic_names, tmp_path, gpus=1,
                      tenants=[tenant("a")], policy={"preset": "full", "result_timeout_s": 2.0})
    names = topic_names
    with running(cfg, tmp_path, workers=False) as system:
        _submit(kafka_bootstrap, names, InferenceRequest(
            request_id="r1", tenant="a", model="small", prompt_tokens=64, max_tokens=32))
        assert _reply(kafka_bootstrap, names, "a", "r1", terminal=False).status \
            is ReplyStatus.ACCEPTED
        time.sleep(5.0)  # two limits at least: taken back, run again, taken back again
        system.start_workers()
        assert _reply(kafka_bootstrap, names, "a", "r1").status is ReplyStatus.COMPLETED
        time.sleep(3.0)  # a second terminal reply, if one were coming, would be in by now
    replies = [r for r in read_all(kafka_bootstrap, names.replies("a"), Reply.from_bytes)
               if r.request_id == "r1"]
    assert [r.status for r in replies if r.terminal] == [ReplyStatus.COMPLETED]
    taken_back = [r for r in replies if r.reason is ReasonCode.RESULT_OVERDUE]
    assert len(taken_back) >= 2 and all(r.status is ReplyStatus.PREEMPTED for r in taken_back)
    decisions = [d for d in read_all(kafka_bootstrap, names.decisions,
                                     DecisionRecord.from_bytes) if d.request_id == "r1"]
    assert [d.outcome for d in decisions].count(Outcome.COMPLETE) == 1
