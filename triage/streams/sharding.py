"""The shards one admission process owns: one AdmissionService per assigned partition.

Unsharded (`kafka.admission_partitions: 1`) there is one service, over the plain tables,
for every pool: the layout the app always had. Sharded, partition n's service decides
for the pools of shard n only (topics/shards.py), over its slice of the tables, and is
built when the consumer group assigns n to this process and dropped when n moves away
(docs/architecture.md, "Partitioning the app"). No Faust here: app.py feeds it.
"""

from __future__ import annotations

import logging
from collections.abc import MutableMapping
from typing import Any

from triage.config.models import TriageConfig
from triage.streams.metrics import AdmissionMetrics
from triage.streams.outbox import Committed, Outbox
from triage.streams.service import AdmissionService
from triage.streams.store import MappingStore
from triage.topics.names import TopicNames
from triage.topics.shards import shard

log = logging.getLogger(__name__)

Tables = tuple[MutableMapping[str, Any], MutableMapping[str, Any], MutableMapping[str, Any]]


class ShardedServices:
    """The services of the shards this process holds, by partition."""

    def __init__(
        self, config: TriageConfig, *, names: TopicNames, outbox: Outbox, tables: Tables,
        metrics: AdmissionMetrics, expect_heartbeats: bool = True,
    ) -> None:
        self.config = config
        self.names = names
        self.outbox = outbox
        self.tables = tables
        self.metrics = metrics
        self.expect_heartbeats = expect_heartbeats
        self.partitions = config.kafka.admission_partitions
        self.services: dict[int, AdmissionService] = {}

    def get(self, partition: int | None) -> AdmissionService | None:
        return self.services.get(0 if partition is None or self.partitions == 1 else partition)

    def build(self, partition: int) -> AdmissionService:
        """A service for `partition` (not restored yet: call its restore)."""
        if self.partitions == 1:
            return AdmissionService(self.config, names=self.names, outbox=self.outbox,
                                    store=MappingStore(*self.tables), metrics=self.metrics,
                                    expect_heartbeats=self.expect_heartbeats)
        sh = shard(self.config, partition)
        return AdmissionService(self.config, names=self.names, outbox=self.outbox,
                                store=MappingStore.for_shard(self.tables, sh),
                                metrics=self.metrics, expect_heartbeats=self.expect_heartbeats,
                                shard=sh)

    def adopt(self, partition: int, now: float,
              committed: Committed | None = None) -> dict[str, int]:
        """Take `partition` on: its service, rebuilt from its slice of the tables.
        `committed`: the last batches committed for it, per lane (None: unsharded, the
        outbox's own)."""
        svc = self.build(partition)
        counts = svc.restore(now, committed=committed)
        self.services[partition] = svc
        log.info("shard %d adopted: pools %s", partition,
                 ", ".join(sorted(svc.core.dispatchers)) or "(none)")
        return counts

    def drop(self, partition: int) -> None:
        """`partition` moved to another process: forget its state (its outputs are
        committed: Faust flushes, and so commits the outbox, before it lets go)."""
        if self.services.pop(partition, None) is not None:
            self.metrics.forget_shard(partition)
            log.info("shard %d handed over", partition)

    def reconfigure(self, config: TriageConfig) -> None:
        """A tenant change: every held shard applies it at its next tick; shards adopted
        later start from it."""
        self.config = config
        for svc in self.services.values():
            svc.reconfigure(config)
