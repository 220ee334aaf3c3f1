"""Who may do what on a secured broker: the ACL table, as data, and its application.

One principal per role. `app` is the admission app, `worker` every GPU worker,
`tenant-<name>` one tenant's clients (or, with one topic pair for every tenant,
`kafka.tenant_topics: shared`, `gateway`: the front door that speaks for them all),
and `admin` the operator (a super user: topic
creation, audit, replay, user and ACL management). The table is a pure function of
the config (its topic prefix, tenants and GPUs), so docs/security.md, the tests and
the broker read the same thing. Everything not granted here is refused
(`allow.everyone.if.no.acl.found=false`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

from confluent_kafka.admin import (  # type: ignore[attr-defined]  # public, not in __all__
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
)

from triage.config.models import TriageConfig
from triage.kafka.clients import poll_until_done
from triage.topics.names import TopicNames

ADMIN = "admin"
APP = "app"
WORKER = "worker"
GATEWAY = "gateway"
TENANT_PREFIX = "tenant-"
# The consumer groups of a client that sends for any tenant (shared topics only). Tenant
# clients' groups start "triage-client.", so a tenant can never take this prefix.
FRONT_DOOR_GROUP_PREFIX = "triage-gateway."

# Consumer groups, as the clients name them (client.py, worker.py and delivery.py).
WORKER_GROUP_PREFIX = "triage-worker-"
_TIMEOUT_S = 30.0

Resource = Literal["topic", "group", "transactional_id"]
Op = Literal["READ", "WRITE", "CREATE", "DESCRIBE", "DESCRIBE_CONFIGS"]


def tenant_user(tenant: str) -> str:
    """The SASL user of a tenant's clients; the `tenant-` prefix keeps a tenant from
    taking a role's name (a tenant called `app` is `tenant-app`)."""
    return f"{TENANT_PREFIX}{tenant}"


def client_group_prefix(tenant: str) -> str:
    """The prefix of a tenant client's consumer groups (triage/client/client.py). Tenant
    names have no '.', so one tenant's prefix never matches another tenant's groups."""
    return f"triage-client.{tenant}."


def app_group_prefix(names: TopicNames) -> str:
    """The Faust app's id, group and internal topics all start with this (streams/app.py)."""
    return f"{names.prefix}.app."


@dataclass(frozen=True, slots=True)
class Grant:
    """ALLOW `operations` on one resource name (or every name with that prefix)."""

    user: str
    resource: Resource
    name: str
    prefixed: bool
    operations: tuple[Op, ...]

    @property
    def principal(self) -> str:
        return f"User:{self.user}"


def acl_table(config: TriageConfig, names: TopicNames | None = None) -> list[Grant]:
    """Every grant of the secured setup for `config`'s tenants, GPUs and topic prefix."""
    k = config.kafka
    n = names if names is not None else TopicNames.of(k.topic_prefix, k.tenant_topics)
    gpus = config.all_gpus()
    gpu_work = [n.gpu_work(g) for g in gpus]
    gpu_control = [n.gpu_control(g) for g in gpus]
    grants: list[Grant] = []

    def lit(user: str, topics: Iterable[str], *ops: Op) -> None:
        grants.extend(Grant(user, "topic", t, False, ops) for t in topics)

    def pre(user: str, resource: Resource, prefix: str, *ops: Op) -> None:
        grants.append(Grant(user, resource, prefix, True, ops))

    # The admission app: reads what clients and workers send, writes everything it decides.
    pre(APP, "topic", f"{n.prefix}.requests.", "READ")
    lit(APP, [n.completions, n.gpu_status], "READ")
    lit(APP, [n.admission, n.routes], "READ", "WRITE")
    pre(APP, "topic", f"{n.prefix}.replies.", "WRITE")
    lit(APP, [*gpu_work, *gpu_control, n.decisions, n.autoscale, n.deadletter], "WRITE")
    # It creates the topics of its config (and of hot-added tenants) at start-up.
    pre(APP, "topic", f"{n.prefix}.", "CREATE", "DESCRIBE", "DESCRIBE_CONFIGS")
    pre(APP, "topic", app_group_prefix(n), "READ", "WRITE", "CREATE", "DESCRIBE",
        "DESCRIBE_CONFIGS")  # fmt: skip  # Faust's table changelogs and leader topic
    pre(APP, "group", app_group_prefix(n), "READ", "DESCRIBE")
    pre(APP, "transactional_id", f"{n.prefix}.", "WRITE", "DESCRIBE")

    # GPU workers: read their work and control, report completions and status. No reply
    # topic: the app answers every request (a worker's `--replies` shortcut is refused).
    lit(WORKER, [*gpu_work, *gpu_control], "READ")
    lit(WORKER, [n.completions], "READ", "WRITE")  # read: skip work finished before a restart
    lit(WORKER, [n.gpu_status, n.deadletter], "WRITE")
    pre(WORKER, "group", WORKER_GROUP_PREFIX, "READ", "DESCRIBE")

    if n.shared:
        # One request and one reply topic for every tenant: the app reads and answers
        # them, and one front door writes for every tenant (it authenticates them).
        lit(APP, [n.requests("")], "READ")
        lit(APP, [n.replies("")], "WRITE")
        lit(GATEWAY, [n.requests("")], "WRITE")
        lit(GATEWAY, [n.replies(""), n.routes], "READ")
        pre(GATEWAY, "group", FRONT_DOOR_GROUP_PREFIX, "READ", "DESCRIBE")
        return grants

    # Tenants: write their request topic, read their reply topic and the routes (which
    # partition serves which model: no tenant's data), nothing else.
    for t in config.tenants:
        user = tenant_user(t.name)
        lit(user, [n.requests(t.name)], "WRITE")
        lit(user, [n.replies(t.name), n.routes], "READ")
        pre(user, "group", client_group_prefix(t.name), "READ", "DESCRIBE")
    return grants


def principals(config: TriageConfig) -> list[str]:
    """Every user the secured setup needs for `config` (admin first)."""
    if config.kafka.tenant_topics == "shared":
        return [ADMIN, APP, WORKER, GATEWAY]
    return [ADMIN, APP, WORKER, *(tenant_user(t.name) for t in config.tenants)]


_RESOURCE = {
    "topic": ResourceType.TOPIC,
    "group": ResourceType.GROUP,
    "transactional_id": ResourceType.TRANSACTIONAL_ID,
}


def to_bindings(grants: Iterable[Grant]) -> list[AclBinding]:
    """One AclBinding per (grant, operation), from any host."""
    out: list[AclBinding] = []
    for g in grants:
        pattern = ResourcePatternType.PREFIXED if g.prefixed else ResourcePatternType.LITERAL
        for op in g.operations:
            out.append(AclBinding(_RESOURCE[g.resource], g.name, pattern, g.principal, "*",
                                  AclOperation[op], AclPermissionType.ALLOW))
    return out


def apply_acls(admin: AdminClient, grants: Iterable[Grant]) -> int:
    """Create the bindings (creating one that exists is a no-op) and wait until the broker
    enforces them; returns how many."""
    bindings = to_bindings(grants)
    if not bindings:
        return 0
    futures = admin.create_acls(bindings, request_timeout=_TIMEOUT_S)
    for future in futures.values():
        future.result()
    _await_enforced(admin, bindings)
    return len(bindings)


# None matches any name, principal and host (the stubs type them as str only).
_ANY: Any = None
_ANY_BINDING = AclBindingFilter(ResourceType.ANY, _ANY, ResourcePatternType.ANY, _ANY, _ANY,
                                AclOperation.ANY, AclPermissionType.ANY)  # fmt: skip


class AclError(RuntimeError):
    """The broker did not come to enforce the ACLs asked for."""


def _await_enforced(admin: AdminClient, bindings: list[AclBinding]) -> None:
    """Block until the broker lists every binding. In KRaft `create_acls` returns once the
    controller has the record; the broker's authorizer applies it from the metadata log a
    moment later (seconds on a loaded machine), and a client that writes in between is
    refused. The broker answers DescribeAcls from that same authorizer."""
    wanted = set(bindings)

    def missing() -> set[AclBinding]:
        return wanted.difference(admin.describe_acls(_ANY_BINDING,
                                                     request_timeout=_TIMEOUT_S).result())

    left = poll_until_done(missing, _TIMEOUT_S)
    if left:
        raise AclError(f"{len(left)} of {len(wanted)} ACLs not enforced by the broker after "
                       f"{_TIMEOUT_S:.0f} s, e.g. {next(iter(left))}")
