"""Shards of the admission app: which partition owns which pool.

One shard is one partition number of every admission input (each tenant's request
topic, completions, GPU heartbeats, ticks) and of every table: the consumer group
gives partition *n* of all of them to one instance (Faust's co-partitioned
assignment), which then holds the pools of shard *n* alone: their queue, ledger,
runners, predictor and the tenants' buckets for those pools (a tenant's quota applies
per shard). Pure functions of the config, so workers, clients and the app agree.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from triage.config.models import TriageConfig


def shard_of_pool(config: TriageConfig, pool: str) -> int:
    """The partition that owns `pool`: its configured `partition`, else CRC-32 of its
    name modulo the partitions (also for a pool no longer configured, so its old
    records are found where they were written)."""
    parts = config.kafka.admission_partitions
    cfg = config.pools_by_name.get(pool)
    if cfg is not None and cfg.partition is not None:
        return cfg.partition
    return zlib.crc32(pool.encode()) % parts if parts > 1 else 0


def shard_of_model(config: TriageConfig, model: str) -> int:
    """The partition a request for `model` belongs on (0 for a model no pool serves:
    its owner answers it `invalid`)."""
    m = config.models_by_name.get(model)
    return 0 if m is None else shard_of_pool(config, m.pool)


def request_routes(config: TriageConfig) -> dict[str, int]:
    """model -> the request-topic partition producers should use (empty unsharded:
    every request goes by key to the one partition)."""
    if config.kafka.admission_partitions == 1:
        return {}
    return {m.name: shard_of_pool(config, m.pool) for m in config.models}


def pools_of_shard(config: TriageConfig, shard: int) -> frozenset[str]:
    return frozenset(p.name for p in config.pools if shard_of_pool(config, p.name) == shard)


@dataclass(frozen=True, slots=True)
class Shard:
    """One partition's slice of the app: its pools, and its keys in the shared tables.
    Shard 0's keys are the plain keys (one partition: exactly the unsharded layout);
    shard n's carry an `n/` prefix, which no request id, tenant or table key contains."""

    index: int
    pools: frozenset[str]

    @property
    def prefix(self) -> str:
        return "" if self.index == 0 else f"{self.index}/"

    def key(self, key: str) -> str:
        return self.prefix + key

    def owns_key(self, key: str) -> bool:
        """Is `key` (a table key) this shard's?"""
        if self.index == 0:
            return "/" not in key
        return key.startswith(self.prefix)

    def local(self, key: str) -> str:
        """`key` without this shard's prefix."""
        return key[len(self.prefix):]


def shard(config: TriageConfig, index: int) -> Shard:
    return Shard(index, pools_of_shard(config, index))


# A forward names where its input was first read, so that a dead letter or an `invalid`
# reply made on the receiving shard points at the record its producer wrote.
ORIGIN_HEADER = "triage-origin"
VERDICT_HEADER = "triage-verdict"  # the value is an InvalidVerdict, not a request
Origin = tuple[int, int]  # partition, offset (the topic is the forward's own)


def origin_header(origin: Origin) -> tuple[str, bytes]:
    return ORIGIN_HEADER, f"{origin[0]}:{origin[1]}".encode()


def _header(headers: object, name: str) -> bytes | None:
    """One header's value from headers as a Kafka client hands them (a dict, or
    (name, value) pairs)."""
    if not headers:
        return None
    items = headers.items() if isinstance(headers, Mapping) else headers
    if not isinstance(items, Iterable):
        return None
    for item in items:
        if isinstance(item, tuple) and len(item) == 2 and item[0] == name:
            raw = item[1]
            return raw if isinstance(raw, bytes) else str(raw).encode()
    return None


def is_verdict(headers: object) -> bool:
    return _header(headers, VERDICT_HEADER) is not None


def origin_of(headers: object) -> Origin | None:
    """The origin a forward carries; None for a record its producer wrote, or for a
    header that does not read as an origin (the record is then named where it lies)."""
    raw = _header(headers, ORIGIN_HEADER)
    if raw is None:
        return None
    part, _, off = raw.decode("ascii", "replace").partition(":")
    return (int(part), int(off)) if part.isdigit() and off.isdigit() else None
