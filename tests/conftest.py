"""Shared fixtures: a real local Kafka broker, per-test topic prefixes, the example config.

Broker tests talk to a real Apache Kafka (never a mock). The session fixture
reuses a broker that already answers (`make test` and `.ci/run` start one),
starts the local one otherwise, and honours TRIAGE_TEST_BOOTSTRAP for any
other broker. Each test gets its own topic prefix, so tests never read each
other's data, and its topics are deleted afterwards.
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Iterator

import pytest

from triage.config import TriageConfig, load_config
from triage.kafka.clients import broker_reachable
from triage.kafka.local import LocalBroker, LocalBrokerError
from triage.topics.admin import delete_topics
from triage.topics.names import TopicNames

log = logging.getLogger(__name__)

BROKER_FIXTURE = "kafka_bootstrap"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test that needs the broker carries the `broker` marker (`-m "not broker"` skips)."""
    for item in items:
        if BROKER_FIXTURE in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.broker)


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    """host:port of a running Kafka broker for this test session."""
    override = os.environ.get("TRIAGE_TEST_BOOTSTRAP")
    if override:
        if not broker_reachable(override, timeout_s=10.0):
            pytest.fail(f"TRIAGE_TEST_BOOTSTRAP={override} but no broker answers there")
        yield override
        return
    broker = LocalBroker()
    if broker_reachable(broker.bootstrap, timeout_s=3.0):
        yield broker.bootstrap  # started by `make test`, `.ci/run` or a developer: reuse
        return
    try:
        result = broker.start()
    except LocalBrokerError as exc:
        pytest.fail(f"cannot start the local Kafka broker: {exc}")
    log.info("test session started Kafka on %s in %.1fs", broker.bootstrap, result.ready_s)
    try:
        yield broker.bootstrap
    finally:
        if result.started:
            broker.stop()


@pytest.fixture
def topic_names(request: pytest.FixtureRequest) -> Iterator[TopicNames]:
    """TopicNames with a prefix unique to this test (``t<8 hex>``); its topics are dropped after."""
    names = TopicNames(f"t{uuid.uuid4().hex[:8]}")
    yield names
    if BROKER_FIXTURE in request.fixturenames:
        bootstrap = request.getfixturevalue(BROKER_FIXTURE)
        try:
            delete_topics(bootstrap, names.prefix)
        except Exception as exc:  # cleanup must never fail a test
            log.warning("could not delete topics of %s: %s", names.prefix, exc)


@pytest.fixture(scope="session")
def triage_config() -> TriageConfig:
    """The shipped example config (three tenants, two models, gpu-0 and gpu-1)."""
    return load_config()
