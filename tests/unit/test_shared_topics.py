"""One request and one reply topic for every tenant (`kafka.tenant_topics: shared`):
the names, the layout, the ACLs and the client's guard, pure (no broker)."""

from __future__ import annotations

import re

import pytest
from pydantic import ValidationError

from triage.chaos.plan import ChaosPlan, Scenario
from triage.client import TriageClient
from triage.config.models import TriageConfig
from triage.kafka.acls import (
    APP,
    FRONT_DOOR_GROUP_PREFIX,
    GATEWAY,
    Grant,
    acl_table,
    client_group_prefix,
    principals,
)
from triage.topics.admin import topic_layout
from triage.topics.names import TopicKind, TopicNames


def _shared(config: TriageConfig) -> TriageConfig:
    data = config.model_dump(mode="json")
    data["kafka"]["tenant_topics"] = "shared"
    return TriageConfig.model_validate(data)


def test_shared_names_are_one_pair_whatever_the_tenant() -> None:
    n = TopicNames.of("triage", "shared")
    assert n.shared and n.requests("acme") == n.requests("beta") == "triage.requests"
    assert n.replies("acme") == n.replies("beta") == "triage.replies"
    assert re.match(n.requests_pattern, "triage.requests")
    assert not re.match(n.requests_pattern, "triage.requests.acme")
    # the topic names no tenant: the request does, and a bad message is answered as
    # `unknown` on the shared topic, and not at all elsewhere
    assert n.tenant_of_request_topic("triage.requests") is None
    assert n.tenant_of_request_topic("triage.requests.acme") is None
    assert n.is_request_topic("triage.requests")
    assert not n.is_request_topic("triage.completions")
    assert n.tenant_to_answer("triage.requests") == "unknown"
    assert n.tenant_to_answer("triage.completions") is None


def test_per_tenant_names_are_unchanged() -> None:
    n = TopicNames.of("triage", "per_tenant")
    assert not n.shared and n.requests("acme") == "triage.requests.acme"
    assert n.replies("acme") == "triage.replies.acme"
    assert not re.match(n.requests_pattern, "triage.requests")
    assert n.tenant_of_request_topic("triage.requests.acme") == "acme"
    assert n.is_request_topic("triage.requests.acme")
    assert not n.is_request_topic("triage.requests")
    # the topic's own tenant (a payload naming another is answered `invalid`)
    assert n.tenant_to_answer("triage.requests.acme") == "acme"


def test_a_shared_layout_has_one_request_and_one_reply_topic(
        triage_config: TriageConfig) -> None:
    assert len(triage_config.tenants) > 1
    per = topic_layout(triage_config)
    shared = topic_layout(_shared(triage_config))
    for kind in (TopicKind.REQUESTS, TopicKind.REPLIES):
        assert len([s for s in per if s.kind is kind]) == len(triage_config.tenants)
        assert [s.name for s in shared if s.kind is kind] == [
            "triage.requests" if kind is TopicKind.REQUESTS else "triage.replies"]
    # everything else is the same
    rest = {TopicKind.REQUESTS, TopicKind.REPLIES}
    assert [s for s in per if s.kind not in rest] == [s for s in shared if s.kind not in rest]


def _ops(grants: list[Grant], user: str, topic: str) -> set[str]:
    return {op for g in grants if g.user == user and g.resource == "topic"
            and (topic.startswith(g.name) if g.prefixed else topic == g.name)
            for op in g.operations}  # fmt: skip


def test_shared_acls_give_the_front_door_the_one_pair_and_tenants_nothing(
        triage_config: TriageConfig) -> None:
    cfg = _shared(triage_config)
    n = TopicNames.of(cfg.kafka.topic_prefix, cfg.kafka.tenant_topics)
    grants = acl_table(cfg)
    assert principals(cfg) == ["admin", "app", "worker", GATEWAY]
    assert {g.user for g in grants} == {APP, "worker", GATEWAY}
    assert _ops(grants, GATEWAY, n.requests("")) == {"WRITE"}
    assert _ops(grants, GATEWAY, n.replies("")) == {"READ"}
    assert _ops(grants, GATEWAY, n.routes) == {"READ"}
    assert "READ" in _ops(grants, APP, n.requests("")) and "WRITE" not in _ops(
        grants, APP, n.requests(""))
    assert "WRITE" in _ops(grants, APP, n.replies(""))
    groups = [g for g in grants if g.user == GATEWAY and g.resource == "group"]
    assert [(g.name, g.prefixed) for g in groups] == [(FRONT_DOOR_GROUP_PREFIX, True)]
    # not even a tenant called `gateway` has its groups under the front door's prefix
    assert not client_group_prefix("gateway").startswith(FRONT_DOOR_GROUP_PREFIX)


def test_a_client_for_any_tenant_needs_shared_topics() -> None:
    with pytest.raises(ValueError, match="tenant_topics: shared"):
        TriageClient(bootstrap="127.0.0.1:1", tenant=None)


def test_the_chaos_suite_runs_shared_topics_without_the_forgery_scenario() -> None:
    plan = ChaosPlan.reduced(scenarios=[Scenario.APP_KILL], tenant_topics="shared")
    assert plan.tenant_topics == "shared"
    with pytest.raises(ValidationError, match="forgery scenario"):
        ChaosPlan.reduced(scenarios=[Scenario.FORGERY], tenant_topics="shared")
