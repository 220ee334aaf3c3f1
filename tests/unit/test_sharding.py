"""Shards of the admission app without Kafka: which partition owns which pool, each
shard's slice of the tables, inputs read on the wrong shard sent on, and each shard's
recovery seeing only its own state (the Faust wiring runs in tests/integration)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from _core_factory import model, tenant
from prometheus_client import CollectorRegistry
from pydantic import ValidationError

from triage.config.models import TriageConfig
from triage.streams.metrics import AdmissionMetrics
from triage.streams.outbox import ListOutbox
from triage.streams.sharding import ShardedServices
from triage.streams.store import ShardKeys
from triage.topics.messages import (
    Completion,
    CompletionStatus,
    DeadLetter,
    InferenceRequest,
    LiveState,
    Reply,
    ReplyStatus,
)
from triage.topics.names import TopicNames
from triage.topics.shards import Shard, shard_of_model, shard_of_pool

NAMES = TopicNames("t")


def _config(partitions: int = 2, **pool_kw: Any) -> TriageConfig:
    pool = {"gpu_type": "g", "kv_budget_gib": 1.0, "queue_max": 100}
    return TriageConfig.model_validate({
        "tenants": [tenant("a", rate_tokens_per_s=100.0, burst_tokens=50_000.0)],
        "models": [model("m1", pool="p1"), model("m2", pool="p2")],
        "gpu_types": [{"name": "g", "memory_gib": 80, "speed": 1.0}],
        "pools": [{"name": "p1", "gpus": ["g0"], "partition": 0, **pool, **pool_kw},
                  {"name": "p2", "gpus": ["g1"], "partition": 1 % partitions, **pool}],
        "kafka": {"request_partitions": partitions, "admission_partitions": partitions},
    })


def _req(rid: str, m: str) -> bytes:
    return InferenceRequest(request_id=rid, tenant="a", model=m, prompt_tokens=500,
                            max_tokens=100).to_bytes()


def _sharded(cfg: TriageConfig, tables: tuple[dict[str, Any], ...] | None = None,
             ) -> tuple[ShardedServices, ListOutbox]:
    out = ListOutbox()
    t = tables if tables is not None else ({}, {}, {})
    s = ShardedServices(cfg, names=NAMES, outbox=out, tables=(t[0], t[1], t[2]),
                        metrics=AdmissionMetrics(CollectorRegistry()), expect_heartbeats=False)
    return s, out


def test_pools_map_to_their_configured_partition_or_a_stable_hash() -> None:
    cfg = _config()
    assert shard_of_pool(cfg, "p1") == 0 and shard_of_pool(cfg, "p2") == 1
    assert shard_of_model(cfg, "m2") == 1 and shard_of_model(cfg, "nobody") == 0
    # a pool with no partition of its own, or no longer configured, hashes the same way
    # every time (its records are found where they were written)
    assert shard_of_pool(cfg, "gone") == shard_of_pool(_config(), "gone") in (0, 1)
    assert shard_of_pool(_config(partitions=1), "p2") == 0


def test_a_partition_beyond_the_shards_is_refused() -> None:
    with pytest.raises(ValidationError, match=r"pools\[0\].partition: 5 is not below"):
        _config(partition=5)


def test_a_shard_sees_only_its_own_keys_and_shard_zero_keeps_the_plain_layout() -> None:
    table: dict[str, Any] = {}
    zero, one = ShardKeys(table, Shard(0, frozenset())), ShardKeys(table, Shard(1, frozenset()))
    zero["r1"] = b"x"
    one["r1"] = b"y"
    one["r2"] = b"z"
    assert table == {"r1": b"x", "1/r1": b"y", "1/r2": b"z"}
    assert list(zero) == ["r1"] and sorted(one) == ["r1", "r2"]
    assert zero["r1"] == b"x" and one.get("r1") == b"y" and "r2" not in zero
    del one["r2"]
    assert len(one) == 1 and len(zero) == 1


def test_each_shard_decides_for_its_own_pools_and_sends_the_others_on() -> None:
    cfg = _config()
    shards, out = _sharded(cfg)
    shards.adopt(0, 0.0, committed=0)
    s0 = shards.get(0)
    assert s0 is not None and set(s0.core.dispatchers) == {"p1"}
    s0.on_request(topic="t.requests.a", key=b"r1", value=_req("r1", "m1"), partition=0,
                  offset=0, now=1.0)
    s0.on_request(topic="t.requests.a", key=b"r2", value=_req("r2", "m2"), partition=0,
                  offset=1, now=1.0)
    # it names where it was read: a dead letter made on shard 1 points at that record
    assert out.forwarded == [("t.requests.a", 1, _req("r2", "m2"), [("triage-origin", b"0:1")])]
    assert s0.store.get_request("r2") is None  # the owner of p2 records it, not shard 0
    rec = s0.store.get_request("r1")
    assert rec is not None and rec.state is LiveState.RUNNING and rec.pool == "p1"
    # a completion from a worker that did not route by pool goes the same way
    c = Completion(request_id="x", attempt=0, tenant="a", model="m2", pool="p2", gpu_id="g1",
                   gpu_type="g", status=CompletionStatus.COMPLETED, prompt_tokens=1,
                   output_tokens=1, max_tokens=1, prefill_s=0.0, decode_s=0.0,
                   started_at_ms=0, finished_at_ms=1)
    s0.on_completion(c.to_bytes(), now=2.0)
    assert out.forwarded[-1][:2] == ("t.completions", 1)


def _two_shards_with_r9_served() -> tuple[Any, Any, ListOutbox]:
    """Both shards held by one process; r9 (model m2) served by its owner, shard 1."""
    shards, out = _sharded(_config())
    for n in (0, 1):
        shards.adopt(n, 0.0, committed=0)
    s0, s1 = shards.get(0), shards.get(1)
    assert s0 is not None and s1 is not None
    s1.on_request(topic="t.requests.a", key=b"r9", value=_req("r9", "m2"), partition=1,
                  offset=0, now=1.0)
    return s0, s1, out


def test_an_invalid_copy_of_an_id_served_on_another_shard_gets_no_second_reply() -> None:
    """Found by the two-instance poison run: an invalid message reusing an id that the
    model's shard served was answered `invalid` on the shard it landed on, which did not
    know the id. It is forwarded like a valid one; the owner knows the id and stays
    silent, and what it dead-letters names the record the producer wrote."""
    s0, s1, out = _two_shards_with_r9_served()
    bad = _req("r9", "m2").replace(b'"prompt_tokens":500', b'"prompt_tokens":-1')
    assert bad != _req("r9", "m2")
    replies = len(out.on("t.replies.a"))
    s0.on_request(topic="t.requests.a", key=b"r9", value=bad, partition=0, offset=5, now=1.5)
    assert out.forwarded[-1] == ("t.requests.a", 1, bad, [("triage-origin", b"0:5")])
    assert len(out.on("t.replies.a")) == replies  # shard 0 answered nothing itself
    s1.on_request(topic="t.requests.a", key=b"r9", value=bad, partition=1, offset=3,
                  now=1.6, headers=out.forwarded[-1][3])
    assert len(out.on("t.replies.a")) == replies  # the owner knows r9: no second terminal
    dead = [DeadLetter.model_validate_json(v) for v in out.on("t.deadletter")]
    assert [(d.partition, d.offset) for d in dead] == [(0, 5)]
    # a fresh id is answered `invalid` by the owner, once
    fresh = bad.replace(b"r9", b"r10")
    s0.on_request(topic="t.requests.a", key=b"r10", value=fresh, partition=0, offset=6,
                  now=2.0)
    s1.on_request(topic="t.requests.a", key=b"r10", value=fresh, partition=1, offset=4,
                  now=2.0, headers=out.forwarded[-1][3])
    assert [r.status for r in map(Reply.model_validate_json, out.on("t.replies.a")[replies:])] \
        == [ReplyStatus.INVALID]


def test_an_invalid_request_too_large_to_forward_sends_its_verdict_on() -> None:
    """Forwarding a 600 KB invalid message stalled the outbox (the broker refused the
    batch); the shard it lands on keeps it as a dead letter and forwards a verdict."""
    s0, s1, out = _two_shards_with_r9_served()
    replies = len(out.on("t.replies.a"))

    def big(rid: str) -> bytes:
        return json.dumps({"request_id": rid, "tenant": "a", "model": "m2",
                           "prompt_tokens": 5, "max_tokens": 5, "prompt": "x" * 600_000}).encode()

    for n, rid in enumerate(("r9", "r11")):  # a copy of an id served on shard 1, a fresh one
        value = big(rid)
        s0.on_request(topic="t.requests.a", key=rid.encode(), value=value, partition=0,
                      offset=7 + n, now=2.0)
        topic, part, fwd, headers = out.forwarded[-1]
        assert (topic, part) == ("t.requests.a", 1) and len(fwd) < 5_000
        assert headers == [("triage-origin", f"0:{7 + n}".encode()), ("triage-verdict", b"invalid")]
        s1.on_request(topic="t.requests.a", key=rid.encode(), value=fwd, partition=1,
                      offset=3 + n, now=2.0, headers=headers)
    dead = [DeadLetter.model_validate_json(v) for v in out.on("t.deadletter")]
    assert [(d.partition, d.offset, d.value_bytes) for d in dead] == [
        (0, 7, len(big("r9"))), (0, 8, len(big("r11")))]  # once each, where it was written
    answers = [Reply.model_validate_json(v) for v in out.on("t.replies.a")[replies:]]
    assert [(r.request_id, r.status) for r in answers] == [("r11", ReplyStatus.INVALID)]
    assert answers[0].detail is not None and "above the" in answers[0].detail


def test_a_shard_taken_over_restores_only_its_records_and_buckets() -> None:
    cfg = _config()
    tables: tuple[dict[str, Any], ...] = ({}, {}, {})
    first, _out = _sharded(cfg, tables)
    for n in (0, 1):
        first.adopt(n, 0.0, committed=0)
    for n, (rid, m) in enumerate((("r1", "m1"), ("r2", "m2"))):
        svc = first.get(n)
        assert svc is not None
        svc.on_request(topic="t.requests.a", key=rid.encode(), value=_req(rid, m),
                       partition=n, offset=0, now=1.0)
        svc.on_tick(1.1)  # writes its shard's bucket
    assert set(tables[0]) == {"r1", "1/r2"}
    assert set(tables[1]) == {"a", "1/a"}
    # another process takes shard 1 over, from the same tables, past batch 7 committed
    second, out2 = _sharded(cfg, tables)
    counts = second.adopt(1, 2.0, committed=7)
    svc = second.get(1)
    assert svc is not None and counts["running"] == 1 and counts["buckets"] == 1
    assert set(svc.core.dispatchers) == {"p2"} and svc.core.live("r2") and not svc.core.live("r1")
    assert out2.seq > 7  # its batches are numbered above the shard's last committed one
    assert second.get(0) is None


def test_a_batch_number_only_moves_up_and_replay_reads_the_shards_own_mark() -> None:
    out = ListOutbox()
    out.resume_after(10)
    out.advance_past(4)
    assert out.seq == 11
    out.send_raw("t.x", b"k", b"v")
    out.advance_past(20)  # the staged output moves with its batch
    assert out.seq == 21 and out.sealed == 10
    seq, batch = out.seal()
    assert seq == 21 and batch == [("t.x", b"k", b"v", -1, None)] and out.sealed == 21
    # outputs of batches above the shard's last committed batch are sent again
    assert out.replay("r", [(5, "t.y", b"a"), (9, "t.y", b"b")], after=6) == 1


def test_config_check_warns_of_a_shard_without_pools() -> None:
    from triage.config.checks import Severity, findings

    crowded = _config()
    data = crowded.model_dump(mode="json")
    data["pools"][0]["partition"] = 1  # both pools on shard 1
    (f,) = [f for f in findings(TriageConfig.model_validate(data)) if "hold no pool" in f.message]
    assert f.severity is Severity.WARNING and "shard(s) 0 of 2" in f.message
    assert not [f for f in findings(crowded) if "hold no pool" in f.message]


def test_config_check_warns_that_a_quota_applies_on_each_shard() -> None:
    from triage.config.checks import findings

    cfg = _config()  # tenant a may call m1 (shard 0) and m2 (shard 1)
    (f,) = [f for f in findings(cfg) if "quota applies on each" in f.message]
    assert f.where == "tenants[0:a]" and "2 x rate_tokens_per_s" in f.message
    data = cfg.model_dump(mode="json")
    data["tenants"][0]["models"] = ["m1"]
    assert not [f for f in findings(TriageConfig.model_validate(data))
                if "quota applies on each" in f.message]


def test_routes_name_each_models_partition_and_none_unsharded() -> None:
    from triage.topics.shards import request_routes

    assert request_routes(_config()) == {"m1": 0, "m2": 1}
    assert request_routes(_config(partitions=1)) == {}


def test_a_rebalance_missed_while_frozen_is_told_from_consecutive_ones() -> None:
    """The generation of each completed rebalance: consecutive ones keep the shards'
    state; a gap means the group went on without this process (frozen past its session
    timeout, its shards given to another), so the shards it got back are rebuilt."""
    from triage.streams.lapse import missed_a_rebalance

    seen: list[int] = []
    assert not missed_a_rebalance(seen, 1)  # the first: nothing to compare
    assert not missed_a_rebalance(seen, 2)
    assert not missed_a_rebalance(seen, 3)
    assert missed_a_rebalance(seen, 5)  # generation 4 completed without us
    assert not missed_a_rebalance(seen, 6)
    assert seen == [5, 6]  # only the last two are kept
