"""`triage replay` against the real broker: requests on the tenants' topics, decisions and
completions as the app writes them, read back for a time range and replayed.

The recording is made by the simulator (tests/unit/test_replay.py) and placed 10 minutes
in the past, with each message's timestamp set to when it happened, so the range
selection (offsets_for_times) is what decides what is replayed.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from confluent_kafka import Producer
from typer.testing import CliRunner

from tests.unit.test_replay import DURATION_S, arrivals, overloaded, record
from triage.cli.main import app
from triage.config.models import TriageConfig
from triage.kafka.clients import make_producer
from triage.replay import compare, read_export, read_kafka, replay
from triage.sim.policies import policy_config
from triage.sim.workload import Arrival
from triage.topics.admin import ensure_topics, topic_layout
from triage.topics.messages import (
    Completion,
    CompletionStatus,
    DecisionRecord,
    InferenceRequest,
)
from triage.topics.names import TopicNames
from triage.topics.reasons import ReasonCode

pytestmark = pytest.mark.broker

PARTITIONS = 3


def _config(names: TopicNames, bootstrap: str) -> TriageConfig:
    data = overloaded().model_dump(mode="json")
    data["kafka"] = {"bootstrap_servers": bootstrap, "topic_prefix": names.prefix,
                     "request_partitions": PARTITIONS,
                     "tenant_topics": "shared" if names.shared else "per_tenant"}
    return TriageConfig.model_validate(data)


def _send(p: Producer, topic: str, key: str, value: bytes, at_ms: int) -> None:
    p.produce(topic, key=key.encode(), value=value, timestamp=at_ms)
    p.poll(0)


@pytest.fixture(scope="module")
def recorded() -> tuple[list[Arrival], list[DecisionRecord]]:
    arrs = arrivals()
    return arrs, [DecisionRecord.from_bytes(line) for line in record(overloaded(), arrs)]


@pytest.fixture(params=[False, True], ids=["per_tenant", "shared"])
def names(topic_names: TopicNames, request: pytest.FixtureRequest) -> TopicNames:
    """The test's prefix with a topic pair per tenant, or one pair for every tenant."""
    return TopicNames(topic_names.prefix, shared=request.param)


@pytest.fixture
def topics(
    kafka_bootstrap: str, names: TopicNames,
    recorded: tuple[list[Arrival], list[DecisionRecord]],
) -> int:
    """Produce the recording at t0 (10 minutes ago, on a whole second); return t0.

    The decisions are written as an app that does not record request shapes or output
    tokens would write them: the shapes come from the request topics, what completions
    generated from the completions topic."""
    arrs, decisions = recorded
    cfg = _config(names, kafka_bootstrap)
    # Requests spread over partitions; decisions on one, in the order the core made them
    # (the app runs with one: docs/architecture.md). Across partitions, two decisions of
    # the same millisecond could not be put back in their order.
    ensure_topics(kafka_bootstrap, [
        replace(s, partitions=1) if s.name == names.decisions else s
        for s in topic_layout(cfg, names)
    ])
    t0 = (int(time.time() * 1000) - 600_000) // 1000 * 1000
    shapes = {a.request_id: a for a in arrs}
    p = make_producer(kafka_bootstrap)
    for a in arrs:
        assert a.request_id is not None
        req = InferenceRequest(request_id=a.request_id, tenant=a.tenant, model=a.model,
                               prompt_tokens=a.prompt_tokens, max_tokens=a.max_tokens,
                               created_at_ms=t0 + round(a.t * 1000))
        _send(p, names.requests(a.tenant), a.request_id, req.to_bytes(),
              t0 + round(a.t * 1000))
    for d in decisions:
        at = t0 + d.at_ms
        inputs = d.inputs.model_copy(update={"output_tokens": None, "prompt_tokens": None,
                                             "max_tokens": None})
        rec = d.model_copy(update={"at_ms": at, "inputs": inputs})
        _send(p, names.decisions, d.request_id, rec.to_bytes(), at)
        if d.reason is ReasonCode.COMPLETED:
            a = shapes[d.request_id]
            done = Completion(
                request_id=d.request_id, tenant=d.tenant, model=d.model, pool="p",
                gpu_id=d.gpu_id or "g0", gpu_type="g", status=CompletionStatus.COMPLETED,
                prompt_tokens=a.prompt_tokens, output_tokens=d.inputs.output_tokens or 1,
                max_tokens=a.max_tokens, prefill_s=0.1, decode_s=0.5, started_at_ms=at - 600,
                finished_at_ms=at,
            )
            _send(p, names.completions, "p", done.to_bytes(), at)
    assert p.flush(30) == 0
    return t0


def test_a_time_range_replays_from_the_topics(
    kafka_bootstrap: str, names: TopicNames, topics: int,
    recorded: tuple[list[Arrival], list[DecisionRecord]], tmp_path: Path,
) -> None:
    t0 = topics
    arrs, _ = recorded
    cfg = _config(names, kafka_bootstrap)
    rec = read_kafka(bootstrap=kafka_bootstrap, names=names, tenants=["a", "b"],
                     since_ms=t0, until_ms=t0 + DURATION_S * 1000)
    assert len(rec.requests) == len(arrs)
    assert all(r.first is not None for r in rec.requests)
    assert sum(r.output_tokens is not None for r in rec.requests) > 0  # from completions

    same = compare(rec, replay(rec, cfg))
    assert same.compared == len(arrs)
    assert same.first_changed == same.final_changed == 0

    loose = compare(rec, replay(rec, cfg, policy_config("admit_all", base=cfg.policy)))
    assert loose.outcome_transitions.get("reject -> accept", 0) > 0
    assert all(k.endswith("-> accept") for k in loose.outcome_transitions)

    part = read_kafka(bootstrap=kafka_bootstrap, names=names, tenants=["a", "b"],
                      since_ms=t0 + 10_000, until_ms=t0 + 19_999)
    assert len(part.requests) == sum(10.0 <= a.t < 20.0 for a in arrs)

    # --save, then the same replay offline
    saved = tmp_path / "saved.jsonl"
    cfg_file = tmp_path / "candidate.yaml"
    cfg_file.write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    res = CliRunner().invoke(app, [
        "replay", "-c", str(cfg_file), "--since", str(t0), "--until",
        str(t0 + DURATION_S * 1000), "--policy", "admit_all", "--save", str(saved), "--json",
    ])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["requests"] == len(arrs)
    assert data["first_changed"] == loose.first_changed
    assert data["outcome_transitions"] == loose.outcome_transitions
    offline = read_export(saved)
    assert len(offline.requests) == len(arrs)
    again = compare(offline, replay(offline, cfg, policy_config("admit_all", base=cfg.policy)))
    assert again.outcome_transitions == loose.outcome_transitions


def test_a_range_without_requests_replays_nothing(
    kafka_bootstrap: str, names: TopicNames, topics: int, tmp_path: Path,
) -> None:
    t0 = topics
    before = read_kafka(bootstrap=kafka_bootstrap, names=names, tenants=["a", "b"],
                        since_ms=t0 - 7_200_000, until_ms=t0 - 3_600_000)
    assert before.requests == [] and before.scanned == 0
    cfg_file = tmp_path / "candidate.yaml"
    cfg_file.write_text(yaml.safe_dump(
        _config(names, kafka_bootstrap).model_dump(mode="json")))
    res = CliRunner().invoke(app, ["replay", "-c", str(cfg_file), "--since", "2h",
                                   "--until", "1h"])
    assert res.exit_code == 1, res.output
    assert "nothing to replay" in res.output


def test_missing_topics_are_a_clear_error(kafka_bootstrap: str, topic_names: TopicNames,
                                          tmp_path: Path) -> None:
    cfg_file = tmp_path / "candidate.yaml"
    cfg_file.write_text(yaml.safe_dump(
        _config(topic_names, kafka_bootstrap).model_dump(mode="json")))
    res = CliRunner().invoke(app, ["replay", "-c", str(cfg_file), "--since", "1h"])
    assert res.exit_code == 3, res.output
    assert "no request topics" in " ".join(res.output.split())
