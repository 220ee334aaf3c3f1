"""SASL/SCRAM and ACLs on a real secured broker: who may write and read what.

The module starts its own secured broker (`LocalBroker(secure=True)`, port
TRIAGE_TEST_SECURE_PORT or 9292, data dir under pytest's tmp) and stops it by pid at
the end. Each forgery from issue 12 is attempted with a real client and must be
refused by the broker itself (an authorization error on delivery or fetch), and the
whole system (admission app, one sim worker, a tenant client; each its own principal)
must still answer requests end to end.
"""

from __future__ import annotations

import gc
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from confluent_kafka import KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import (  # type: ignore[attr-defined]  # public, not in __all__
    AclBinding,
    AclOperation,
    AclPermissionType,
    ResourcePatternType,
    ResourceType,
)
from typer.testing import CliRunner

from triage.cli.main import app as cli_app
from triage.client import TriageClient
from triage.client.errors import ReplyTopicError
from triage.config.models import TriageConfig
from triage.demo.processes import ChildProcess, wait_for_metric
from triage.kafka.acls import APP, FRONT_DOOR_GROUP_PREFIX, GATEWAY, WORKER, tenant_user
from triage.kafka.clients import (
    make_admin,
    make_consumer,
    make_producer,
    wait_for_group_coordinator,
)
from triage.kafka.local import LocalBroker, LocalBrokerError, port_open
from triage.kafka.security import librdkafka_settings, register_settings
from triage.ports import free_port, free_run
from triage.topics.admin import create_topics
from triage.topics.messages import InferenceRequest
from triage.topics.names import TopicNames
from triage.topics.routing import read_routes, routes_of

pytestmark = [pytest.mark.broker]

PORT = int(os.environ.get("TRIAGE_TEST_SECURE_PORT", "9292"))
DENIED = {KafkaError.TOPIC_AUTHORIZATION_FAILED, KafkaError.GROUP_AUTHORIZATION_FAILED}


@pytest.fixture(scope="module")
def secure_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalBroker]:
    if port_open(PORT) or port_open(PORT + 1):
        pytest.fail(f"ports {PORT}/{PORT + 1} are taken: the secured broker test needs them "
                    "(set TRIAGE_TEST_SECURE_PORT to another free pair)")
    broker = LocalBroker(port=PORT, data_dir=tmp_path_factory.mktemp("secure-kafka"),
                         secure=True, heap_opts="-Xms256m -Xmx512m")  # fmt: skip
    try:
        broker.start()
    except LocalBrokerError as exc:
        pytest.fail(f"cannot start the secured broker: {exc}")
    # This test process is the operator: topic creation in it speaks as admin.
    register_settings(broker.bootstrap, broker.client_settings())
    wait_for_group_coordinator(broker.bootstrap)
    try:
        yield broker
    finally:
        register_settings(broker.bootstrap, {})
        gc.collect()  # tests' clients go before their broker (no reconnect noise)
        broker.stop()


def _config(bootstrap: str, names: TopicNames, tmp: Path) -> TriageConfig:
    tenant = {"rate_tokens_per_s": 1e9, "burst_tokens": 1e9, "sla_ms": 30_000,
              "max_queue_wait_ms": 10_000}  # fmt: skip
    return TriageConfig.model_validate({
        "tenants": [{"name": "a", **tenant}, {"name": "b", **tenant}],
        "models": [{"name": "small", "pool": "p", "layers": 32, "kv_heads": 8, "head_dim": 128,
                    "prefill_s_per_token": 1e-5, "decode_s_per_token": 0.002}],
        "gpu_types": [{"name": "H200", "memory_gib": 141}],
        "pools": [{"name": "p", "gpu_type": "H200", "gpus": ["g0"], "kv_budget_gib": 40}],
        "kafka": {"bootstrap_servers": bootstrap, "topic_prefix": names.prefix},
        "metrics": {"admission_port": free_port(), "worker_port_base": free_run(4)},
        "admission": {"datadir": str(tmp / "admission-data")},
        "worker": {"heartbeat_s": 0.5},
    })  # fmt: skip


@pytest.fixture
def secured(secure_broker: LocalBroker, tmp_path: Path) -> tuple[TriageConfig, TopicNames]:
    """A config with its own topic prefix, its topics, users and ACLs on the secured broker."""
    names = TopicNames(f"s{uuid.uuid4().hex[:8]}")
    cfg = _config(secure_broker.bootstrap, names, tmp_path)
    create_topics(secure_broker.bootstrap, names, cfg)
    secure_broker.provision(cfg, names)
    return cfg, names


def _as(broker: LocalBroker, user: str) -> dict[str, Any]:
    return broker.credentials.settings(user)


def _produce(broker: LocalBroker, user: str | None, topic: str) -> KafkaError | None:
    """Produce one message as `user` (None: no credentials); the delivery error, if any."""
    quick: dict[str, Any] = {"message.timeout.ms": 8000, "log_level": 0}
    if user is None:  # a bare client (make_producer would add this process's admin login)
        p = Producer({"bootstrap.servers": broker.bootstrap, **quick})
    else:
        p = make_producer(broker.bootstrap, **_as(broker, user), **quick, **{"linger.ms": 0})
    result: list[KafkaError | None] = []
    p.produce(topic, key=b"k", value=b'{"forged":true}', on_delivery=lambda e, _m: result.append(e))
    deadline = time.monotonic() + 30
    while not result and time.monotonic() < deadline:
        p.poll(0.2)
    assert result, f"no delivery report for {topic}"
    return result[0]


def _refused(err: KafkaError | None) -> bool:
    return err is not None and err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED


def _fetch(broker: LocalBroker, user: str, group: str, topic: str) -> KafkaError | list[bytes]:
    """Read `topic` from the start as `user`: its error, or the first values found."""
    c = make_consumer(broker.bootstrap, group, **_as(broker, user), log_level=0,
                      **{"auto.offset.reset": "earliest"})
    try:
        # No explicit offset: the consumer asks the broker for the group's committed offset
        # first, and a refusal comes back as an error event (a fetch refusal does not).
        c.assign([TopicPartition(topic, 0)])
        values: list[bytes] = []
        deadline = time.monotonic() + 30  # the first group ever waits for __consumer_offsets
        while time.monotonic() < deadline and not values:
            msg = c.poll(0.5)
            if msg is None:
                continue
            if msg.error() is not None:
                if msg.error().code() in DENIED:
                    return msg.error()
                continue
            values.append(msg.value())
        return values
    finally:
        c.close()


def test_a_client_without_valid_credentials_is_refused(secure_broker: LocalBroker,
                                                       secured: Any) -> None:  # fmt: skip
    _, names = secured
    topic = names.requests("a")
    assert _produce(secure_broker, None, topic) is not None  # plaintext: never delivered
    wrong = {**_as(secure_broker, tenant_user("a")), "sasl.password": "not-the-password"}
    errors: list[KafkaError] = []
    p = Producer({"bootstrap.servers": secure_broker.bootstrap, **wrong, "log_level": 0,
                  "message.timeout.ms": 5000, "error_cb": errors.append})  # fmt: skip
    delivered: list[KafkaError | None] = []
    p.produce(topic, b"x", on_delivery=lambda e, _m: delivered.append(e))
    p.flush(20)
    assert len(delivered) == 1 and delivered[0] is not None  # timed out, never written
    assert KafkaError._AUTHENTICATION in {e.code() for e in errors}
    with pytest.raises(KafkaException):
        make_admin(secure_broker.bootstrap, **wrong, log_level=0).list_topics(timeout=5)


def test_the_controller_port_admits_no_client(secure_broker: LocalBroker) -> None:
    """The controller listener is PLAIN with one static user: neither an anonymous client
    nor a tenant's SCRAM login gets a metadata answer (or anything else) there."""
    ctl = f"127.0.0.1:{secure_broker.controller_port}"
    for conf in ({"security.protocol": "PLAINTEXT"}, _as(secure_broker, tenant_user("a"))):
        admin = make_admin(ctl, **conf, log_level=0)
        with pytest.raises(KafkaException):
            admin.list_topics(timeout=5)


def test_no_anonymous_cluster_change_through_the_controller_port(
    secure_broker: LocalBroker, tmp_path: Path
) -> None:
    """Kafka's own tool, aimed at the controller (KIP-919), with no credentials. Over a
    PLAINTEXT controller listener, whose User:ANONYMOUS must then be a super user, this
    very command changes every topic's retention; here it must fail."""
    java = shutil.which("java")
    assert java is not None
    timeouts = tmp_path / "client.properties"
    timeouts.write_text("default.api.timeout.ms=8000\nrequest.timeout.ms=4000\n")
    proc = subprocess.run(
        [java, "-Xmx128m", "-cp", str(secure_broker.lib_dir / "*"), "kafka.admin.ConfigCommand",
         "--bootstrap-controller", f"127.0.0.1:{secure_broker.controller_port}",
         "--command-config", str(timeouts), "--entity-type", "brokers", "--entity-default",
         "--alter", "--add-config", "log.retention.ms=12345"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode != 0, proc.stdout
    assert "Completed updating" not in proc.stdout


def test_tenant_writes_its_requests_and_reads_its_replies(
    secure_broker: LocalBroker, secured: Any
) -> None:
    _, names = secured
    user = tenant_user("a")
    assert _produce(secure_broker, user, names.requests("a")) is None
    assert _produce(secure_broker, APP, names.replies("a")) is None  # the app answers
    got = _fetch(secure_broker, user, f"triage-client.a.{uuid.uuid4().hex[:8]}", names.replies("a"))
    assert got == [b'{"forged":true}']


def test_with_shared_topics_only_the_front_door_writes_requests_and_reads_replies(
    secure_broker: LocalBroker, tmp_path: Path
) -> None:
    """`kafka.tenant_topics: shared`: no tenant principal; the gateway's writes the one
    request topic and reads the one reply topic, and nothing the app or workers own."""
    names = TopicNames(f"s{uuid.uuid4().hex[:8]}", shared=True)
    data = _config(secure_broker.bootstrap, names, tmp_path).model_dump(mode="json")
    data["kafka"]["tenant_topics"] = "shared"
    cfg = TriageConfig.model_validate(data)
    create_topics(secure_broker.bootstrap, names, cfg)
    secure_broker.provision(cfg, names)
    assert _produce(secure_broker, GATEWAY, names.requests("")) is None
    assert _produce(secure_broker, APP, names.replies("")) is None  # the app answers
    got = _fetch(secure_broker, GATEWAY, f"{FRONT_DOOR_GROUP_PREFIX}{uuid.uuid4().hex[:8]}",
                 names.replies(""))
    assert got == [b'{"forged":true}']
    forged = [names.replies(""), names.completions, names.gpu_status, names.gpu_work("g0"),
              names.gpu_control("g0"), names.decisions, names.admission]
    results = {t: _produce(secure_broker, GATEWAY, t) for t in forged}
    assert {t for t, e in results.items() if not _refused(e)} == set()


def test_every_forgery_from_issue_12_is_refused_by_the_broker(
    secure_broker: LocalBroker, secured: Any
) -> None:
    """Tenant a may not submit as b, answer itself, finish requests, fake a GPU or steer it."""
    _, names = secured
    user = tenant_user("a")
    forged = [
        names.requests("b"),  # submit as another tenant
        names.replies("a"), names.replies("b"),  # forge a reply
        names.completions,  # finish someone's request with its own text
        names.gpu_status,  # a "down" heartbeat that requeues a GPU's work
        names.gpu_control("g0"),  # a forged preempt
        names.gpu_work("g0"), names.decisions, names.admission, names.deadletter,
        names.autoscale,
    ]  # fmt: skip
    results = {t: _produce(secure_broker, user, t) for t in forged}
    assert {t for t, e in results.items() if not _refused(e)} == set()


def test_a_tenant_reads_no_other_topic(secure_broker: LocalBroker, secured: Any) -> None:
    _, names = secured
    user = tenant_user("a")
    assert _produce(secure_broker, APP, names.replies("b")) is None
    group = f"triage-client.a.{uuid.uuid4().hex[:8]}"
    for topic in (names.replies("b"), names.requests("b"), names.completions, names.decisions):
        got = _fetch(secure_broker, user, group, topic)
        assert isinstance(got, KafkaError) and got.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    # Its own replies, but under another tenant's (or no tenant's) consumer group: refused.
    got = _fetch(secure_broker, user, f"triage-client.b.{uuid.uuid4().hex[:8]}",
                 names.replies("a"))  # fmt: skip
    assert isinstance(got, KafkaError) and got.code() == KafkaError.GROUP_AUTHORIZATION_FAILED


def test_a_tenant_cannot_grant_itself_access(secure_broker: LocalBroker, secured: Any) -> None:
    _, names = secured
    admin = make_admin(secure_broker.bootstrap, **_as(secure_broker, tenant_user("a")))
    acl = AclBinding(ResourceType.TOPIC, names.replies("b"), ResourcePatternType.LITERAL,
                     f"User:{tenant_user('a')}", "*", AclOperation.READ,
                     AclPermissionType.ALLOW)  # fmt: skip
    with pytest.raises(KafkaException, match=r"(?i)authoriz"):
        for f in admin.create_acls([acl], request_timeout=15).values():
            f.result()


def test_the_worker_reports_but_neither_answers_nor_dispatches(
    secure_broker: LocalBroker, secured: Any
) -> None:
    _, names = secured
    assert _produce(secure_broker, WORKER, names.completions) is None
    assert _produce(secure_broker, WORKER, names.gpu_status) is None
    for topic in (names.replies("a"), names.requests("a"), names.gpu_work("g0"),
                  names.gpu_control("g0"), names.decisions, names.admission):  # fmt: skip
        assert _refused(_produce(secure_broker, WORKER, topic)), topic
    got = _fetch(secure_broker, WORKER, "triage-worker-g0-probe", names.requests("a"))
    assert isinstance(got, KafkaError)


def test_only_workers_write_completions_and_status(
    secure_broker: LocalBroker, secured: Any
) -> None:
    _, names = secured
    for topic in (names.completions, names.gpu_status, names.requests("a")):
        assert _refused(_produce(secure_broker, APP, topic)), topic
    for topic in (names.gpu_work("g0"), names.gpu_control("g0"), names.decisions):
        assert _produce(secure_broker, APP, topic) is None, topic


def _principal_config(cfg: TriageConfig, broker: LocalBroker, user: str, path: Path) -> Path:
    data = cfg.model_dump(mode="json")
    data["kafka"]["security"] = broker.credentials.security(user).model_dump(mode="json")
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.slow
def test_the_system_answers_end_to_end_on_the_secured_broker(
    secure_broker: LocalBroker, secured: Any, tmp_path: Path
) -> None:
    cfg, _ = secured
    app_cfg = _principal_config(cfg, secure_broker, APP, tmp_path / "app.yaml")
    worker_cfg = _principal_config(cfg, secure_broker, WORKER, tmp_path / "worker.yaml")
    tenant_cfg = TriageConfig.model_validate(
        yaml.safe_load(_principal_config(cfg, secure_broker, tenant_user("a"),
                                         tmp_path / "tenant.yaml").read_text()))  # fmt: skip
    admission = ChildProcess("admission", ["admission", "--config", str(app_cfg),
                                           "--loglevel", "warn"], tmp_path / "admission.log")
    worker = ChildProcess("worker", ["worker", "--gpu", "g0", "--backend", "sim", "--config",
                                     str(worker_cfg)], tmp_path / "worker.log")  # fmt: skip
    m = cfg.metrics
    try:
        admission.start()
        assert wait_for_metric(f"http://{m.host}:{m.admission_port}/metrics",
                               "triage_admission_ready 1.0", timeout_s=120, proc=admission), \
            admission.tail(60)  # fmt: skip
        worker.start()
        assert wait_for_metric(f"http://{m.host}:{m.worker_port_base}/metrics", "triage_worker",
                               timeout_s=60, proc=worker), worker.tail(60)  # fmt: skip
        with TriageClient.from_config(tenant_cfg, tenant="a", reply_timeout_s=90) as client:
            replies = [
                client.submit(InferenceRequest(request_id=f"sec-{i}", tenant="a", model="small",
                                               prompt_tokens=100, max_tokens=20))
                for i in range(5)
            ]  # fmt: skip
        assert [r.status.value for r in replies] == ["completed"] * 5, replies
        assert all(r.gpu_id == "g0" for r in replies)
        # the routes the app wrote at start, read as the tenant (a bare client's first step)
        k = tenant_cfg.kafka
        assert read_routes(k.bootstrap_servers, TopicNames(k.topic_prefix),
                           settings=librdkafka_settings(k.security),
                           group_id=f"triage-client.a.{uuid.uuid4().hex[:8]}",
                           ) == routes_of(tenant_cfg) != {}
        assert admission.alive() and worker.alive()
        # Nothing in either log says the broker refused one of them.
        for proc in (admission, worker):
            text = proc.log_path.read_text(errors="replace")
            assert "AUTHORIZATION_FAILED" not in text and "Authorization failed" not in text, \
                proc.tail(40)  # fmt: skip
    finally:
        worker.stop()
        admission.stop()


def test_provision_cli_for_the_local_broker_and_for_a_secrets_dir(
    secure_broker: LocalBroker, tmp_path: Path
) -> None:
    """`triage kafka provision`: on the local broker it prints where credentials are; with
    --secrets-dir (the compose stack's way) it logs in as the config's admin and gives each
    principal the password in DIR/<user>, which then works."""
    names = TopicNames(f"s{uuid.uuid4().hex[:8]}")
    cfg = _config(secure_broker.bootstrap, names, tmp_path)
    plain_cfg = tmp_path / "plain.yaml"
    plain_cfg.write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    runner = CliRunner()
    local = runner.invoke(cli_app, ["kafka", "provision", "--port", str(secure_broker.port),
                                    "--data-dir", str(secure_broker.data_dir),
                                    "--config", str(plain_cfg)])  # fmt: skip
    assert local.exit_code == 0, local.output
    assert str(secure_broker.credentials.index) in local.output.replace("\n", "")

    secrets_dir = tmp_path / "secrets"
    secrets_dir.mkdir(mode=0o700)
    for user in ("app", "worker", tenant_user("a"), tenant_user("b")):
        (secrets_dir / user).write_text(f"compose-{user}-{uuid.uuid4().hex}\n")
    admin_cfg = _principal_config(cfg, secure_broker, "admin", tmp_path / "admin.yaml")
    try:
        _provision_from(runner, admin_cfg, secrets_dir, secure_broker, names, cfg)
    finally:  # the users are the module's: give them their own passwords back
        secure_broker.provision(cfg, names)


def _provision_from(runner: CliRunner, admin_cfg: Path, secrets_dir: Path,
                    secure_broker: LocalBroker, names: TopicNames, cfg: TriageConfig) -> None:
    result = runner.invoke(cli_app, ["kafka", "provision", "--config", str(admin_cfg),
                                     "--secrets-dir", str(secrets_dir)])  # fmt: skip
    assert result.exit_code == 0, result.output
    create_topics(secure_broker.bootstrap, names, cfg)
    login = {**_as(secure_broker, tenant_user("a")),
             "sasl.password": (secrets_dir / tenant_user("a")).read_text().strip()}
    p = make_producer(secure_broker.bootstrap, **login, log_level=0)
    delivered: list[KafkaError | None] = []
    p.produce(names.requests("a"), b"{}", on_delivery=lambda e, _m: delivered.append(e))
    p.flush(30)
    assert delivered == [None]
    (secrets_dir / "worker").unlink()  # a missing secret: one line, exit 1
    missing = runner.invoke(cli_app, ["kafka", "provision", "--config", str(admin_cfg),
                                      "--secrets-dir", str(secrets_dir)])  # fmt: skip
    assert missing.exit_code == 1
    assert "no password file for principal 'worker'" in missing.output


def test_a_client_for_another_tenant_fails_at_start_with_a_clear_error(
    secure_broker: LocalBroker, secured: Any
) -> None:
    _, names = secured
    with pytest.raises(ReplyTopicError, match="may not read reply topic"):
        TriageClient(bootstrap=secure_broker.bootstrap, tenant="b", topic_prefix=names.prefix,
                     kafka_settings=_as(secure_broker, tenant_user("a")),
                     start_timeout_s=20)  # fmt: skip
