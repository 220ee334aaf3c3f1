"""The admission service against poison input, duplicates and config changes, over a dict
store and a list outbox (tests/integration/test_poison_admission.py runs the same corpus
through the real app on the real broker)."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pytest
from _core_factory import config, tenant
from prometheus_client import CollectorRegistry

from triage.chaos.poison import Expect, poison_corpus
from triage.config.load import tenant_change
from triage.config.models import TriageConfig
from triage.streams.metrics import AdmissionMetrics
from triage.streams.outbox import ListOutbox
from triage.streams.service import AdmissionService
from triage.streams.store import MappingStore
from triage.topics.messages import (
    Completion,
    CompletionStatus,
    ControlKind,
    ControlMessage,
    DeadLetter,
    DecisionRecord,
    InferenceRequest,
    LiveState,
    Reply,
    WorkItem,
)
from triage.topics.names import TopicNames
from triage.topics.reasons import Outcome, ReasonCode, ReplyStatus

NAMES = TopicNames("t")
PRODUCER_LIMIT = 1_000_000  # confluent-kafka's default message.max.bytes
CONTEXT = 32768


def _service(cfg: TriageConfig | None = None,
             store: MappingStore | None = None) -> tuple[AdmissionService, ListOutbox]:
    cfg = cfg or config(tenants=[tenant("a", max_concurrency=1)], gpus=1, kv_budget_gib=0.2)
    out = ListOutbox()
    svc = AdmissionService(cfg, names=NAMES, outbox=out, store=store or MappingStore.in_memory(),
                           metrics=AdmissionMetrics(CollectorRegistry()), expect_heartbeats=False)
    svc.restore(0.0)
    return svc, out


def _send(svc: AdmissionService, value: bytes | None, now: float, *, key: bytes = b"k",
          offset: int = 0, tenant_name: str = "a") -> None:
    svc.on_request(topic=NAMES.requests(tenant_name), key=key, value=value, partition=0,
                   offset=offset, now=now)


def _req(rid: str, tenant_name: str = "a", **kw: Any) -> bytes:
    data: dict[str, Any] = {"request_id": rid, "tenant": tenant_name, "model": "m8",
                            "prompt_tokens": 100, "max_tokens": 20, "prompt": "hi", **kw}
    return InferenceRequest.model_validate(data).to_bytes()


def _replies(out: ListOutbox, tenant_name: str = "a") -> list[Reply]:
    return [Reply.from_bytes(v) for v in out.on(NAMES.replies(tenant_name))]


def _terminals(out: ListOutbox, tenant_name: str = "a") -> Counter[str]:
    return Counter(r.request_id for r in _replies(out, tenant_name) if r.terminal)


def _dead(out: ListOutbox) -> list[DeadLetter]:
    return [DeadLetter.from_bytes(v) for v in out.on(NAMES.deadletter)]


def _complete_all(svc: AdmissionService, out: ListOutbox, now: float) -> float:
    """Play the worker: finish every work item sent so far, until no new one comes."""
    done: set[str] = set()
    while True:
        items = [WorkItem.from_bytes(v) for t, _, v in out.messages if t.endswith(".work")]
        todo = [i for i in items if i.work_id not in done]
        if not todo:
            return now
        for i in todo:
            done.add(i.work_id)
            now += 0.01
            svc.on_completion(Completion(
                request_id=i.request_id, attempt=i.attempt, tenant=i.tenant, model=i.model,
                pool=i.pool, gpu_id=i.gpu_id, gpu_type="g", status=CompletionStatus.COMPLETED,
                prompt_tokens=i.prompt_tokens, output_tokens=5, max_tokens=i.max_tokens,
                prefill_s=0.001, decode_s=0.005, started_at_ms=int(now * 1000),
                finished_at_ms=int(now * 1000) + 6).to_bytes(), now=now)
            svc.on_tick(now)


# --- poison input ----------------------------------------------------------------------
def test_every_poison_entry_gets_one_terminal_reply_or_a_dead_letter() -> None:
    svc, out = _service()
    entries = list(poison_corpus(tenant="a", model="m8", other_tenant="b",
                                 context_tokens=CONTEXT))
    assert len(entries) >= 60 and len({e.name for e in entries}) == len(entries)
    now = 1.0
    for offset, e in enumerate(entries):
        before = len(out.messages)
        now += 0.01
        _send(svc, e.value, now, key=e.key, offset=offset)
        svc.on_tick(now)
        for topic, key, value in out.messages[before:]:  # everything fits the producer
            assert len(value) + len((key or "").encode()) < PRODUCER_LIMIT, (e.name, topic)
    _complete_all(svc, out, now)

    terminals = _terminals(out)
    statuses = {r.request_id: r.status for r in _replies(out) if r.terminal}
    dead_at = Counter(dl.offset for dl in _dead(out))
    for offset, e in enumerate(entries):
        rid = e.key.decode(errors="replace")
        if e.expect is Expect.INVALID:
            assert terminals[rid] == 1 and statuses[rid] is ReplyStatus.INVALID, e.name
        elif e.expect is Expect.SERVED:
            assert terminals[rid] == 1 and statuses[rid] is ReplyStatus.COMPLETED, e.name
        elif e.expect is Expect.DEAD_LETTER:
            assert dead_at[offset] == 1 and terminals[rid] == 0, e.name
        else:
            assert terminals[rid] == 1, e.name
    # only bodies that are not copies of the first are dead-lettered among duplicates
    dup_dead = [e.name for i, e in enumerate(entries)
                if e.expect is Expect.DUPLICATE and dead_at[i]]
    assert dup_dead == ["invalid-body-under-finished-id", "other-tenant-body-under-finished-id",
                        "invalid-copy"]
    assert all(len(dl.value_b64) <= 4 * 65_536 // 3 + 4 for dl in _dead(out))
    assert svc.metrics.handler_errors._metrics == {}  # handled by design, not by the guard
    # and the service still serves
    _send(svc, _req("after-the-corpus"), now + 1)
    assert _replies(out)[-1].request_id == "after-the-corpus"
    assert _replies(out)[-1].status is ReplyStatus.ACCEPTED


def test_a_dead_letter_keeps_a_bounded_prefix_the_size_and_the_hash() -> None:
    svc, out = _service()
    value = b"\x00garbage" * 300_000  # 2.4 MB
    _send(svc, value, 1.0, key=b"k" * 100_000)
    (dl,) = _dead(out)
    assert dl.truncated and dl.value_bytes == len(value)
    assert dl.value_sha256 is not None and len(dl.value_sha256) == 64
    assert dl.key is not None and len(dl.key) <= 256
    (_topic, key, raw) = out.messages[-1]
    assert len(raw) < 100_000 and key is not None and len(key) <= 1024


def test_a_near_limit_prompt_that_queues_fits_every_record() -> None:
    svc, out = _service()
    store = svc.store
    big = "q" * 390_000  # near admission.max_prompt_bytes (400,000)
    for i in range(3):  # max_concurrency=1: the second and third wait in the queue
        _send(svc, InferenceRequest(request_id=f"big{i}", tenant="a", model="m8",
                                    prompt_tokens=100, max_tokens=20, prompt=big).to_bytes(),
              1.0)
    rec = store.get_request("big2")
    assert rec is not None and rec.state is LiveState.QUEUED and rec.prompt == big
    raw = store.get_request_raw("big2")
    assert raw is not None and len(raw) < PRODUCER_LIMIT
    _complete_all(svc, out, 1.0)
    assert _terminals(out) == Counter({"big0": 1, "big1": 1, "big2": 1})
    items = [WorkItem.from_bytes(v) for t, _, v in out.messages if t.endswith(".work")]
    assert {i.request_id for i in items} == {"big0", "big1", "big2"}
    assert all(i.prompt == big for i in items)


class _Broken:
    """A core that fails whatever is asked of it."""

    def __getattr__(self, name: str) -> Any:
        raise RuntimeError(f"core exploded at {name}")


def test_a_failing_handler_dead_letters_answers_and_the_next_request_is_served(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    svc, out = _service()

    def boom(*_a: object, **_k: object) -> None:
        raise RuntimeError("checks exploded")

    with monkeypatch.context() as m:
        m.setattr("triage.streams.service.check_request", boom)
        _send(svc, _req("r1"), 1.0, offset=7)
    (reply,) = _replies(out)
    assert reply.request_id == "r1" and reply.status is ReplyStatus.INVALID
    assert reply.detail is not None and "internal error" in reply.detail
    (dl,) = _dead(out)
    assert dl.offset == 7 and "RuntimeError: checks exploded" in dl.error
    assert svc.metrics.handler_errors.labels("request")._value.get() == 1
    _send(svc, _req("r1"), 1.1)  # its id is taken now: nothing new
    _send(svc, _req("r2"), 1.2)
    assert [(r.request_id, r.status) for r in _replies(out)] == [
        ("r1", ReplyStatus.INVALID), ("r2", ReplyStatus.ACCEPTED)]


def test_no_handler_raises_even_over_a_broken_core() -> None:
    svc, out = _service()
    working = svc.core
    svc.core = _Broken()  # type: ignore[assignment]
    svc.on_tick(1.0)
    _send(svc, _req("r1"), 1.0)
    completion = Completion(
        request_id="r1", tenant="a", model="m8", pool="p", gpu_id="g0", gpu_type="g",
        status=CompletionStatus.COMPLETED, prompt_tokens=1, output_tokens=1, max_tokens=1,
        prefill_s=0.0, decode_s=0.0, started_at_ms=1, finished_at_ms=2)
    svc.on_completion(completion.to_bytes(), now=1.0)
    status = (b'{"gpu_id":"g0","pool":"p","gpu_type":"g","name":"x","simulated":true,'
              b'"memory_total_bytes":1,"kv_budget_bytes":1,"utilization":0.5,"at_ms":1}')
    svc.on_status(status, now=1.0)
    assert [dl.stage for dl in _dead(out)] == ["gate", "completions", "status"]
    assert _replies(out) == []  # nothing could tell whether r1 was taken: not answered
    errors = svc.metrics.handler_errors
    assert [errors.labels(h)._value.get() for h in ("tick", "request", "completion",
                                                     "status")] == [1, 1, 1, 1]
    svc.core = working
    _send(svc, _req("r2"), 1.1)
    assert _replies(out)[-1].status is ReplyStatus.ACCEPTED


# --- duplicates ------------------------------------------------------------------------
def test_a_finished_request_redelivered_gets_no_second_terminal_reply() -> None:
    svc, out = _service()
    _send(svc, _req("r1"), 1.0)
    _complete_all(svc, out, 1.0)
    assert _terminals(out) == Counter({"r1": 1})
    sent = len(out.messages)
    _send(svc, _req("r1"), 3.0)
    assert out.messages[sent:] == []  # nothing at all: no reply, no decision, no work
    assert svc.metrics.duplicates.labels("a")._value.get() == 1


def test_a_live_request_redelivered_gets_its_last_status_again_not_a_terminal_one() -> None:
    svc, out = _service()
    _send(svc, _req("r1"), 1.0)
    _send(svc, _req("r1"), 1.1)
    assert [r.status for r in _replies(out)] == [ReplyStatus.ACCEPTED, ReplyStatus.ACCEPTED]
    assert len([1 for t, _, _ in out.messages if t.endswith(".work")]) == 1


@pytest.mark.parametrize("state", ["live", "finished"])
def test_an_invalid_body_under_a_taken_id_is_dead_lettered_not_answered(state: str) -> None:
    svc, out = _service()
    _send(svc, _req("r1"), 1.0)
    if state == "finished":
        _complete_all(svc, out, 1.0)
    replies = _replies(out)
    bad = json.dumps({"request_id": "r1", "tenant": "a", "model": "m8", "prompt_tokens": -1,
                      "max_tokens": 1}).encode()
    _send(svc, bad, 5.0, offset=3)
    _send(svc, _req("r1", tenant_name="b"), 5.1, offset=4)  # tenant mismatch under r1
    _send(svc, _req("r1", model="no-such"), 5.2, offset=5)
    assert _replies(out) == replies  # no false `invalid`
    dls = _dead(out)
    assert [dl.offset for dl in dls] == [3, 4, 5]
    assert all("already" in dl.error for dl in dls)
    decisions = [DecisionRecord.from_bytes(v) for v in out.on(NAMES.decisions)]
    assert all(d.outcome is not Outcome.INVALID for d in decisions)


def test_an_id_answered_invalid_stays_taken() -> None:
    svc, out = _service()
    bad = json.dumps({"request_id": "r1", "tenant": "a", "model": "m8", "prompt_tokens": 0,
                      "max_tokens": 1}).encode()
    _send(svc, bad, 1.0)
    _send(svc, bad, 1.1)  # redelivered
    _send(svc, _req("r1"), 1.2)  # fixed, but under the same id
    assert _terminals(out) == Counter({"r1": 1})
    assert [r.status for r in _replies(out)] == [ReplyStatus.INVALID]
    rec = svc.store.get_request("r1")
    assert rec is not None and rec.state is LiveState.DONE
    svc.on_tick(1.0 + svc.dedupe_ttl_s + 1)  # the record expires like any done one
    assert not svc.store.has_request("r1")


# --- config changes --------------------------------------------------------------------
def _two_tenants() -> TriageConfig:
    return config(tenants=[tenant("a"), tenant("b", max_concurrency=1)], gpus=1,
                  kv_budget_gib=0.2)


def _check_removed_b(svc: AdmissionService, out: ListOutbox, now: float) -> None:
    """b had r-run (running on g0) and r-wait (queued): both are rejected, r-run is
    cancelled on its GPU, and b's next request is answered `invalid`."""
    svc.on_tick(now)
    ends = {r.request_id: r for r in _replies(out, "b") if r.terminal}
    assert set(ends) == {"r-run", "r-wait"}
    assert all(r.status is ReplyStatus.REJECTED and r.reason is ReasonCode.UNKNOWN_TENANT
               for r in ends.values())
    (cancel,) = [ControlMessage.from_bytes(v) for v in out.on(NAMES.gpu_control("g0"))]
    assert cancel.kind is ControlKind.CANCEL and cancel.request_id == "r-run"
    for rid in ("r-run", "r-wait"):
        rec = svc.store.get_request(rid)
        assert rec is not None and rec.state is LiveState.DONE
    _send(svc, _req("r-new", tenant_name="b"), now + 0.1, tenant_name="b")
    last = _replies(out, "b")[-1]
    assert (last.request_id, last.status, last.reason) == (
        "r-new", ReplyStatus.INVALID, ReasonCode.UNKNOWN_TENANT)
    svc.on_tick(now + 0.2)  # answered once: nothing more for the withdrawn ones
    assert _terminals(out, "b") == Counter({"r-run": 1, "r-wait": 1, "r-new": 1})
    _send(svc, _req("a1"), now + 0.3)  # the others are still served
    assert _replies(out, "a")[-1].status is ReplyStatus.ACCEPTED


def _with_b_live() -> tuple[AdmissionService, ListOutbox]:
    svc, out = _service(_two_tenants())
    _send(svc, _req("r-run", tenant_name="b"), 1.0, tenant_name="b")
    _send(svc, _req("r-wait", tenant_name="b"), 1.0, tenant_name="b")  # max_concurrency=1
    assert [r.status for r in _replies(out, "b")] == [ReplyStatus.ACCEPTED, ReplyStatus.QUEUED]
    return svc, out


def test_a_tenant_removed_while_down_has_its_live_requests_rejected_at_restart() -> None:
    svc, _ = _with_b_live()
    only_a = config(tenants=[tenant("a")], gpus=1, kv_budget_gib=0.2)
    restarted, out = _service(only_a, store=svc.store)  # a new process, the same tables
    _check_removed_b(restarted, out, 2.0)


def test_a_tenant_removed_from_the_running_config_has_its_live_requests_rejected() -> None:
    svc, out = _with_b_live()
    running = svc.config
    fresh = config(tenants=[tenant("a")], gpus=1, kv_budget_gib=0.2)
    changed = tenant_change(running, fresh)
    assert changed is not None and [t.name for t in changed.tenants] == ["a"]
    svc.reconfigure(changed)
    _check_removed_b(svc, out, 2.0)


def test_a_tenant_added_to_the_running_config_is_served() -> None:
    svc, out = _service(config(tenants=[tenant("a")], gpus=1, kv_budget_gib=0.2))
    _send(svc, _req("early", tenant_name="b"), 1.0, tenant_name="b")
    assert _replies(out, "b")[-1].reason is ReasonCode.UNKNOWN_TENANT
    changed = tenant_change(svc.config, _two_tenants())
    assert changed is not None and changed.tenant("b") is not None  # lookups are fresh
    svc.reconfigure(changed)
    svc.on_tick(2.0)
    _send(svc, _req("later", tenant_name="b"), 2.1, tenant_name="b")
    assert _replies(out, "b")[-1].status is ReplyStatus.ACCEPTED


def test_tenant_change_keeps_running_definitions_and_ignores_other_edits() -> None:
    running = config(tenants=[tenant("a", weight=1.0)], gpus=1)
    assert tenant_change(running, config(tenants=[tenant("a", weight=5.0)], gpus=2)) is None
    changed = tenant_change(running, config(tenants=[tenant("a", weight=5.0), tenant("c")]))
    assert changed is not None
    assert changed.tenants_by_name["a"].weight == 1.0 and "c" in changed.tenants_by_name
    assert changed.all_gpus() == running.all_gpus()


def test_removing_a_tenant_mid_run_sends_no_output_twice() -> None:
    """The removal rebuilds the core from the tables, but the app is running: outputs of
    batches not yet confirmed are still on their way, so nothing is staged again (found
    by `triage chaos -s config`: 2 steady requests got a second terminal reply)."""
    svc, out = _with_b_live()
    _send(svc, _req("a1"), 1.1)
    _complete_all(svc, out, 1.2)
    assert _terminals(out, "a")["a1"] == 1
    before = len(out.messages)
    changed = tenant_change(svc.config, config(tenants=[tenant("a")], gpus=1,
                                               kv_budget_gib=0.2))
    assert changed is not None
    svc.reconfigure(changed)
    svc.on_tick(2.0)
    assert _terminals(out, "a")["a1"] == 1
    # what the tick sent is the removal's answers and cancel, not copies of earlier outputs
    earlier = {v for _, _, v in out.messages[:before]}
    assert not [v for _, _, v in out.messages[before:] if v in earlier]
