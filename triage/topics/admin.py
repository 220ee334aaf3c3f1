"""Topic layout (a pure function of the config) and idempotent topic creation.

The layout is data so that tests, docs and the CLI read the same thing. Creation
only adds what is missing: an existing topic is never altered, only reported
(with a note when its partition count differs from the layout).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import (  # type: ignore[attr-defined]  # public, not in __all__
    AdminClient,
    ConfigResource,
    NewTopic,
)

from triage.config.models import TriageConfig
from triage.kafka.clients import make_admin, poll_until_done
from triage.topics.errors import TopicAdminError
from triage.topics.names import TopicKind, TopicNames

log = logging.getLogger(__name__)

_TIMEOUT_S = 30.0
# Compacted status topic: roll segments hourly so old heartbeats are actually compacted away.
_STATUS_SEGMENT_MS = 3_600_000


@dataclass(frozen=True, slots=True)
class TopicSpec:
    """One topic as triage wants it on the broker."""

    name: str
    kind: TopicKind
    partitions: int
    replication_factor: int
    config: Mapping[str, str] = field(default_factory=dict)  # topic-level Kafka configs

    @property
    def compacted(self) -> bool:
        return self.config.get("cleanup.policy") == "compact"


@dataclass(frozen=True, slots=True)
class ExistingTopic:
    """A topic that was already on the broker."""

    name: str
    partitions: int
    mismatch: str | None  # why it differs from the layout, None when it matches


@dataclass(frozen=True, slots=True)
class CreateResult:
    """What create_topics did."""

    created: list[str]
    existing: list[ExistingTopic]


def topic_layout(config: TriageConfig, names: TopicNames | None = None) -> list[TopicSpec]:
    """Every topic for the configured tenants and GPUs, with partitions and configs.

    Every input of the admission app (requests, admission ticks, completions, GPU
    status) has `admission_partitions` partitions (`request_partitions` equals it):
    partition n of each is shard n, the pools of topics/shards.py (Faust tables need
    co-partitioned inputs). Replies and decisions are keyed by request id. Per-GPU
    topics have one partition: one worker per GPU, in order.
    """
    k = config.kafka
    tn = names if names is not None else TopicNames.of(k.topic_prefix, k.tenant_topics)
    rf = k.replication_factor
    keep = {"cleanup.policy": "delete", "retention.ms": str(k.default_retention_ms)}
    specs: list[TopicSpec] = []
    # one pair per tenant, or one pair for every tenant (`kafka.tenant_topics: shared`)
    pairs = {(tn.requests(t.name), tn.replies(t.name)): None for t in config.tenants}
    for requests, replies in pairs:
        specs.append(TopicSpec(requests, TopicKind.REQUESTS, k.request_partitions, rf, keep))
        specs.append(TopicSpec(replies, TopicKind.REPLIES, k.request_partitions, rf, keep))
    specs.append(TopicSpec(tn.admission, TopicKind.ADMISSION, k.admission_partitions, rf, keep))
    for gpu in config.all_gpus():
        specs.append(TopicSpec(tn.gpu_work(gpu), TopicKind.GPU_WORK, 1, rf, keep))
        specs.append(TopicSpec(tn.gpu_control(gpu), TopicKind.GPU_CONTROL, 1, rf, keep))
    compact = {"cleanup.policy": "compact", "segment.ms": str(_STATUS_SEGMENT_MS)}
    specs.append(TopicSpec(tn.gpu_status, TopicKind.GPU_STATUS, k.admission_partitions, rf,
                           compact))
    specs.append(TopicSpec(tn.completions, TopicKind.COMPLETIONS, k.admission_partitions, rf, keep))
    audit = {"cleanup.policy": "delete", "retention.ms": str(k.decisions_retention_ms)}
    specs.append(TopicSpec(tn.decisions, TopicKind.DECISIONS, k.request_partitions, rf, audit))
    specs.append(TopicSpec(tn.deadletter, TopicKind.DEADLETTER, 1, rf, keep))
    specs.append(TopicSpec(tn.autoscale, TopicKind.AUTOSCALE, 1, rf, keep))
    specs.append(TopicSpec(tn.routes, TopicKind.ROUTES, 1, rf, {"cleanup.policy": "compact"}))
    return specs


def create_topics(bootstrap: str, names: TopicNames, config: TriageConfig) -> CreateResult:
    """Create the missing topics of the layout; leave existing ones alone and report them."""
    return ensure_topics(bootstrap, topic_layout(config, names))


def ensure_topics(bootstrap: str, specs: Iterable[TopicSpec]) -> CreateResult:
    """Create whichever of `specs` is missing and wait until every one has a leader."""
    wanted = {s.name: s for s in specs}
    admin = make_admin(bootstrap, log_level=4)  # no info-level chatter on stderr
    present = _partition_counts(admin, _TIMEOUT_S)
    existing = [
        ExistingTopic(n, present[n], _mismatch(wanted[n], present[n]))
        for n in wanted
        if n in present
    ]
    missing = [s for n, s in wanted.items() if n not in present]
    created: list[str] = []
    if missing:
        new = [
            NewTopic(s.name, num_partitions=s.partitions, replication_factor=s.replication_factor,
                     config=dict(s.config))
            for s in missing
        ]  # fmt: skip
        futures = admin.create_topics(new, operation_timeout=_TIMEOUT_S, request_timeout=_TIMEOUT_S)
        for name, fut in futures.items():
            try:
                fut.result()
                created.append(name)
            except KafkaException as exc:
                err = exc.args[0]
                if isinstance(err, KafkaError) and err.code() == KafkaError.TOPIC_ALREADY_EXISTS:
                    existing.append(ExistingTopic(name, wanted[name].partitions, None))  # a race
                    continue
                raise TopicAdminError(f"creating topic {name!r} failed: {exc}") from exc
        _wait_for_leaders(admin, set(created), _TIMEOUT_S)
    for e in existing:
        if e.mismatch:
            log.warning("topic %s exists but %s; left unchanged", e.name, e.mismatch)
    log.info("topics: %d created, %d already existed", len(created), len(existing))
    return CreateResult(created=sorted(created), existing=sorted(existing, key=lambda e: e.name))


@dataclass(frozen=True, slots=True)
class TopicInfo:
    """A topic as the broker describes it (for `triage topics list`)."""

    name: str
    partitions: int
    cleanup_policy: str | None
    retention_ms: str | None


def describe_topics(bootstrap: str, prefix: str | None = None) -> list[TopicInfo]:
    """Topics on the broker (those starting with `prefix.` when given), with key configs."""
    admin = make_admin(bootstrap, log_level=4)  # no info-level chatter on stderr
    counts = _partition_counts(admin, _TIMEOUT_S)
    names = sorted(
        n for n in counts if (prefix is None and not n.startswith("__")) or _under(n, prefix)
    )
    if not names:
        return []
    resources = [ConfigResource(ConfigResource.Type.TOPIC, n) for n in names]
    infos: list[TopicInfo] = []
    try:
        described = admin.describe_configs(resources, request_timeout=_TIMEOUT_S)
        for res, fut in described.items():
            cfg = fut.result()
            policy, retention = cfg.get("cleanup.policy"), cfg.get("retention.ms")
            infos.append(
                TopicInfo(res.name, counts[res.name], policy.value if policy else None,
                          retention.value if retention else None)
            )  # fmt: skip
    except KafkaException as exc:
        raise TopicAdminError(f"describing topics on {bootstrap} failed: {exc}") from exc
    return sorted(infos, key=lambda i: i.name)


def delete_topics(bootstrap: str, prefix: str) -> list[str]:
    """Delete every topic named `prefix.*` or `prefix-*` (test cleanup); returns their names."""
    admin = make_admin(bootstrap, log_level=4)  # no info-level chatter on stderr
    doomed = sorted(n for n in _partition_counts(admin, _TIMEOUT_S) if _under(n, prefix))
    if not doomed:
        return []
    futures = admin.delete_topics(doomed, operation_timeout=_TIMEOUT_S, request_timeout=_TIMEOUT_S)
    for name, fut in futures.items():
        try:
            fut.result()
        except KafkaException as exc:
            log.warning("deleting topic %s failed: %s", name, exc)
    return doomed


def _under(name: str, prefix: str | None) -> bool:
    return prefix is not None and name.startswith((prefix + ".", prefix + "-"))


def _mismatch(spec: TopicSpec, partitions: int) -> str | None:
    if partitions != spec.partitions:
        return f"has {partitions} partitions, config says {spec.partitions}"
    return None


# The app's inputs: partition n of each is shard n (topic_layout), so each must have
# exactly `kafka.admission_partitions` partitions.
SHARDED_KINDS = frozenset(
    {TopicKind.REQUESTS, TopicKind.ADMISSION, TopicKind.GPU_STATUS, TopicKind.COMPLETIONS}
)


def shard_layout_problem(bootstrap: str, topics: Iterable[str], partitions: int) -> str | None:
    """Why the admission app cannot run on these existing topics, or None.

    Every input topic, changelog and the marks topic must have `partitions` partitions
    (one per shard). Kafka keeps a topic's partition count, so a deployment whose
    `kafka.admission_partitions` changed would otherwise start, and sit there, with a
    shard that has no partition (its pools never served), or with a changelog whose
    records sit on another shard's partition than the one that owns them now."""
    admin = make_admin(bootstrap, log_level=4)
    present = _partition_counts(admin, _TIMEOUT_S)
    wrong = sorted((n, present[n]) for n in set(topics) if present.get(n, partitions) != partitions)
    if not wrong:
        return None
    name, count = wrong[0]
    more = f" (and {len(wrong) - 1} more)" if len(wrong) > 1 else ""
    return (
        f"topic {name} has {count} partition{'s' if count != 1 else ''}{more} but "
        f"kafka.admission_partitions is {partitions}: an existing topic keeps its partition "
        "count; change the number of shards as docs/operations.md says (\"Changing the "
        "number of shards\")"
    )


def _partition_counts(admin: AdminClient, timeout_s: float) -> dict[str, int]:
    try:
        md = admin.list_topics(timeout=timeout_s)
    except KafkaException as exc:
        raise TopicAdminError(f"cannot list topics: {exc}") from exc
    return {name: len(t.partitions) for name, t in md.topics.items() if t.error is None}


def _wait_for_leaders(admin: AdminClient, topics: set[str], timeout_s: float) -> None:
    """A freshly created topic may not have a leader yet; producers would fail on it."""
    if not topics:
        return

    def leaderless() -> set[str]:
        md = admin.list_topics(timeout=timeout_s)
        return {
            name for name in topics
            if (t := md.topics.get(name)) is None or t.error is not None or not t.partitions
            or any(p.leader < 0 for p in t.partitions.values())
        }

    pending = poll_until_done(leaderless, timeout_s)
    if pending:
        raise TopicAdminError(f"topics without a leader after {timeout_s:.0f}s: {sorted(pending)}")
