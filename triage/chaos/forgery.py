"""The forgery scenario: issue 12's forgeries, each tried by a tenant's own principal
against a secured broker (SASL/SCRAM + ACLs, `triage kafka up --secure` machinery) that
this scenario starts on a port of its own and stops after. Every forgery must be refused
by the broker itself; two allowed actions (the tenant's own request topic and replies)
are the control that shows the logins work, so a refusal is an ACL's doing.

The app and workers do not run here: the secured system end to end, each its own
principal, is tests/integration/test_security.py.
"""

from __future__ import annotations

import shutil
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaError, TopicPartition

from triage.chaos.plan import ChaosPlan
from triage.chaos.report import ScenarioResult
from triage.chaos.system import TENANT, TENANTS
from triage.config.models import TriageConfig
from triage.kafka.acls import APP, tenant_user
from triage.kafka.clients import make_consumer, make_producer, wait_for_group_coordinator
from triage.kafka.local import LocalBroker
from triage.kafka.security import register_settings
from triage.topics.admin import create_topics
from triage.topics.names import TopicNames

DENIED = {KafkaError.TOPIC_AUTHORIZATION_FAILED, KafkaError.GROUP_AUTHORIZATION_FAILED}


def _config(bootstrap: str, names: TopicNames) -> TriageConfig:
    return TriageConfig.model_validate({
        "tenants": [{"name": t, **TENANT} for t in TENANTS],
        "models": [{"name": "small", "pool": "p", "layers": 32, "kv_heads": 8, "head_dim": 128,
                    "prefill_s_per_token": 1e-5, "decode_s_per_token": 0.002}],
        "gpu_types": [{"name": "H200", "memory_gib": 141}],
        "pools": [{"name": "p", "gpu_type": "H200", "gpus": ["g0", "g1"], "kv_budget_gib": 40}],
        "kafka": {"bootstrap_servers": bootstrap, "topic_prefix": names.prefix},
    })


def _produce(broker: LocalBroker, user: str, topic: str) -> KafkaError | None:
    """One message as `user`; its delivery error (None: the broker took it)."""
    p = make_producer(broker.bootstrap, **broker.credentials.settings(user), log_level=0,
                      **{"message.timeout.ms": 8000, "linger.ms": 0})
    result: list[KafkaError | None] = []
    p.produce(topic, key=b"forged", value=b'{"forged":true}',
              on_delivery=lambda e, _m: result.append(e))
    deadline = time.monotonic() + 30
    while not result and time.monotonic() < deadline:
        p.poll(0.2)
    return result[0] if result else KafkaError(KafkaError._MSG_TIMED_OUT)


def _fetch(broker: LocalBroker, user: str, group: str, topic: str,
           wait_s: float = 30.0) -> KafkaError | list[bytes]:
    """Read `topic` from its start as `user` in `group`: the refusal, or what was read."""
    c = make_consumer(broker.bootstrap, group, **broker.credentials.settings(user), log_level=0,
                      **{"auto.offset.reset": "earliest"})
    try:
        c.assign([TopicPartition(topic, 0)])  # the committed-offset fetch is checked too
        deadline = time.monotonic() + wait_s  # a fresh broker's first group waits longer
        while time.monotonic() < deadline:
            msg = c.poll(0.5)
            if msg is None:
                continue
            err = msg.error()
            if err is not None:
                if err.code() in DENIED:
                    return err
                continue
            return [msg.value() or b""]
        return []
    finally:
        c.close()


def _refused(got: KafkaError | list[bytes] | None) -> bool:
    return isinstance(got, KafkaError) and got.code() in DENIED


def run_forgery(plan: ChaosPlan, say: Callable[[str], None]) -> ScenarioResult:
    """Start the secured broker, provision a config's principals, try each forgery."""
    res = ScenarioResult(scenario="forgery")
    data_dir = Path(tempfile.mkdtemp(prefix="triage-chaos-secure-"))  # holds passwords
    broker = LocalBroker(port=plan.secure_port, controller_port=plan.secure_port + 1,
                         data_dir=data_dir, secure=True, heap_opts="-Xms256m -Xmx512m")
    say(f"  starting the secured Kafka on {broker.bootstrap}")
    broker.start()
    register_settings(broker.bootstrap, broker.client_settings())  # we are the operator
    try:
        names = TopicNames(f"chaosf{uuid.uuid4().hex[:8]}")
        cfg = _config(broker.bootstrap, names)
        create_topics(broker.bootstrap, names, cfg)
        broker.provision(cfg, names)
        wait_for_group_coordinator(broker.bootstrap)
        a, b = TENANTS[0], TENANTS[1]
        me = tenant_user(a)
        # the controls: what tenant `a` and the app may do, they can
        control = {
            "own request topic": _produce(broker, me, names.requests(a)) is None,
            "app answers b": _produce(broker, APP, names.replies(b)) is None,
            "own replies": _produce(broker, APP, names.replies(a)) is None
            and _fetch(broker, me, f"triage-client.{a}.{uuid.uuid4().hex[:6]}",
                       names.replies(a), wait_s=90.0) == [b'{"forged":true}'],
        }
        forged: dict[str, Any] = {
            "submit as another tenant": _produce(broker, me, names.requests(b)),
            "read another tenant's replies": _fetch(
                broker, me, f"triage-client.{a}.{uuid.uuid4().hex[:6]}", names.replies(b)),
            "read own replies in another tenant's group": _fetch(
                broker, me, f"triage-client.{b}.{uuid.uuid4().hex[:6]}", names.replies(a)),
            "forge a reply": _produce(broker, me, names.replies(b)),
            "forged completion": _produce(broker, me, names.completions),
            "forged heartbeat": _produce(broker, me, names.gpu_status),
            "forged preempt": _produce(broker, me, names.gpu_control("g0")),
            "forged work item": _produce(broker, me, names.gpu_work("g0")),
        }
        refused = {k for k, v in forged.items() if _refused(v)}
        for k in forged:
            say(f"  {k}: {'refused' if k in refused else 'NOT REFUSED'}")
        res.faults = res.sent = res.answered = len(forged)
        res.groups = {
            "forgery": {"sent": len(forged), "refused": len(refused),
                        "unaccounted": len(forged) - len(refused)},
            "control": {"sent": len(control), "allowed": sum(control.values()),
                        "unaccounted": len(control) - sum(control.values())},
        }
        res.notes += [f"not refused: {k}" for k in forged if k not in refused]
        res.notes += [f"control failed: {k}" for k, ok in control.items() if not ok]
    finally:
        register_settings(broker.bootstrap, {})
        broker.stop()
        shutil.rmtree(data_dir, ignore_errors=True)
    return res
