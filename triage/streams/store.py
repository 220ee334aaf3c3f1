"""The admission app's state, behind one small interface with two backends: Faust tables
on RocksDB (production, recovered from changelogs) and plain dicts (unit tests). Same
shape, same names, so the service never knows which it has.

A request record may travel in an *envelope* that also holds the outputs it caused that
were not yet known committed (replayed on recovery, see outbox.py) and its tenant's
bucket right after the decision (so bucket consumption is durable at the same point as
the decision that drained it). Bucket table entries carry the same stamp, and recovery
keeps the newest of the two."""

from __future__ import annotations

import json
import struct
from collections.abc import Callable, Iterable, Iterator, MutableMapping
from typing import Any, NamedTuple, Protocol

import orjson

from triage.topics.messages import BucketState, LiveRequest
from triage.topics.shards import Shard

REQUESTS = "requests"  # request_id -> LiveRequest (queued, running, done for dedupe)
BUCKETS = "buckets"  # tenant -> BucketState
LEARNED = "learned"  # "predictor" -> the predictor's snapshot (JSON object)
TABLES = (REQUESTS, BUCKETS, LEARNED)

ENVELOPE = b"TX1"  # a record JSON starts with "{": the prefix cannot be mistaken
ENVELOPE2 = b"TX2"  # the same, its outputs and bucket framed in binary (wrap)
_COUNTS = struct.Struct(">I?")  # outputs, whether a bucket follows
_BUCKET = struct.Struct(">ddqq")  # level, updated, stamp
_OUTPUT = struct.Struct(">qHI")  # batch, topic length, value length (then both)
Stamp = tuple[int, int]  # (outbox batch, operation within the process): newer is larger
PendingOut = tuple[int, str, bytes]


class Bucket(NamedTuple):
    """A tenant's bucket as of `stamp`."""

    level: float
    updated: float
    stamp: Stamp


class Envelope(NamedTuple):
    """A stored request record with what travels beside it."""

    record: bytes
    outputs: list[PendingOut]
    tenant_bucket: Bucket | None


def wrap(record: bytes, outputs: Iterable[PendingOut] = (), bucket: Bucket | None = None,
         ) -> bytes:
    """Record bytes, in an envelope when there is something to carry beside them: the
    outputs and the bucket framed in binary (ENVELOPE2), so the outputs' JSON is copied
    as it is, not escaped into a JSON string (which cost ~9% of the handlers' CPU)."""
    outs = outputs if isinstance(outputs, list) else list(outputs)
    if not outs and bucket is None:
        return record
    parts = [ENVELOPE2, _COUNTS.pack(len(outs), bucket is not None)]
    if bucket is not None:
        parts.append(_BUCKET.pack(bucket.level, bucket.updated, *bucket.stamp))
    for seq, topic, value in outs:
        t = topic.encode()
        parts += (_OUTPUT.pack(seq, len(t), len(value)), t, value)
    parts.append(record)
    return b"".join(parts)


def unwrap(raw: bytes) -> Envelope:
    if raw.startswith(ENVELOPE2):
        return _unwrap_binary(raw)
    if not raw.startswith(ENVELOPE):
        return Envelope(raw, [], None)
    # the JSON envelope written before ENVELOPE2 (records and changelogs kept from then)
    n = struct.unpack_from(">I", raw, len(ENVELOPE))[0]
    start = len(ENVELOPE) + 4
    meta = orjson.loads(raw[start:start + n])
    outs = [(int(s), str(t), str(v).encode("latin-1")) for s, t, v in meta.get("o") or ()]
    b = meta.get("b")
    bucket = None if not b else Bucket(float(b[0]), float(b[1]), (int(b[2]), int(b[3])))
    return Envelope(raw[start + n:], outs, bucket)


def _unwrap_binary(raw: bytes) -> Envelope:
    at = len(ENVELOPE2)
    n, has_bucket = _COUNTS.unpack_from(raw, at)
    at += _COUNTS.size
    bucket = None
    if has_bucket:
        level, updated, s0, s1 = _BUCKET.unpack_from(raw, at)
        bucket = Bucket(level, updated, (s0, s1))
        at += _BUCKET.size
    outs: list[PendingOut] = []
    for _ in range(n):
        seq, tlen, vlen = _OUTPUT.unpack_from(raw, at)
        at += _OUTPUT.size
        topic = raw[at:at + tlen].decode()
        at += tlen
        outs.append((seq, topic, raw[at:at + vlen]))
        at += vlen
    if at > len(raw):
        raise ValueError(f"a record envelope cut short: {len(raw)} bytes, framing names {at}")
    return Envelope(raw[at:], outs, bucket)


class StateStore(Protocol):
    """Typed access to the three tables."""

    def get_request(self, request_id: str) -> LiveRequest | None: ...

    def put_request(self, rec: LiveRequest) -> None: ...

    def get_request_raw(self, request_id: str) -> bytes | None: ...

    def put_request_raw(self, request_id: str, raw: bytes,
                        outputs: Iterable[PendingOut] | None = None,
                        bucket: Bucket | None = None) -> None: ...

    def carry_outputs(self, outputs_for: Callable[[str], list[PendingOut]]) -> None: ...

    def envelopes(self) -> Iterator[tuple[str, Envelope]]: ...

    def has_request(self, request_id: str) -> bool: ...

    def delete_request(self, request_id: str) -> None: ...

    def requests(self) -> Iterator[LiveRequest]: ...

    def put_bucket(self, tenant: str, state: BucketState, stamp: Stamp = (0, 0)) -> None: ...

    def buckets(self) -> Iterator[tuple[str, Bucket]]: ...

    def put_learned(self, key: str, value: dict[str, Any]) -> None: ...

    def get_learned(self, key: str) -> dict[str, Any] | None: ...


class StrKeys(MutableMapping[str, Any]):
    """A Faust table seen through str keys (the raw key serializer hands back bytes)."""

    def __init__(self, table: Any) -> None:
        self._t = table

    def get(self, key: str, default: Any = None) -> Any:
        return self._t.get(key.encode(), default)

    def __getitem__(self, key: str) -> Any:
        return self._t[key.encode()]

    def __setitem__(self, key: str, value: Any) -> None:
        self._t[key.encode()] = value

    def __delitem__(self, key: str) -> None:
        del self._t[key.encode()]

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and key.encode() in self._t

    def __iter__(self) -> Iterator[str]:
        return (k.decode() if isinstance(k, bytes) else str(k) for k in self._t)

    def __len__(self) -> int:
        return len(self._t)


class ShardKeys(MutableMapping[str, Any]):
    """One shard's slice of a table shared by the shards of this process: its keys carry
    the shard's prefix, and iteration sees only them (Shard.key)."""

    def __init__(self, table: MutableMapping[str, Any], shard: Shard) -> None:
        self._t = table
        self._shard = shard

    def get(self, key: str, default: Any = None) -> Any:
        return self._t.get(self._shard.key(key), default)

    def __getitem__(self, key: str) -> Any:
        return self._t[self._shard.key(key)]

    def __setitem__(self, key: str, value: Any) -> None:
        self._t[self._shard.key(key)] = value

    def __delitem__(self, key: str) -> None:
        del self._t[self._shard.key(key)]

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self._shard.key(key) in self._t

    def __iter__(self) -> Iterator[str]:
        shard = self._shard
        return (shard.local(k) for k in list(self._t) if shard.owns_key(k))

    def __len__(self) -> int:
        return sum(1 for _ in self)


class MappingStore:
    """A StateStore over three str->bytes mappings: dicts, or Faust tables (whose
    assignment `table[k] = v` is what reaches the changelog)."""

    def __init__(
        self, requests: MutableMapping[str, Any], buckets: MutableMapping[str, Any],
        learned: MutableMapping[str, Any],
    ) -> None:
        self._requests = requests
        self._buckets = buckets
        self._learned = learned
        self._outputs_for: Callable[[str], list[PendingOut]] | None = None

    def carry_outputs(self, outputs_for: Callable[[str], list[PendingOut]]) -> None:
        """Every record written from now on carries what `outputs_for(request_id)` says
        is not committed yet (the outbox's pending outputs): whoever writes a record,
        its outputs are durable with it."""
        self._outputs_for = outputs_for

    @classmethod
    def in_memory(cls) -> MappingStore:
        return cls({}, {}, {})

    @classmethod
    def for_shard(cls, tables: tuple[MutableMapping[str, Any], MutableMapping[str, Any],
                                     MutableMapping[str, Any]], shard: Shard) -> MappingStore:
        """The store of one shard over the (requests, buckets, learned) tables."""
        requests, buckets, learned = tables
        return cls(ShardKeys(requests, shard), ShardKeys(buckets, shard),
                   ShardKeys(learned, shard))

    def get_request(self, request_id: str) -> LiveRequest | None:
        raw = self.get_request_raw(request_id)
        return None if raw is None else LiveRequest.from_bytes(raw)

    def put_request(self, rec: LiveRequest) -> None:
        self.put_request_raw(rec.request_id, rec.to_bytes())

    def get_request_raw(self, request_id: str) -> bytes | None:
        raw = self._requests.get(request_id)
        return None if raw is None else unwrap(bytes(raw)).record

    def put_request_raw(self, request_id: str, raw: bytes,
                        outputs: Iterable[PendingOut] | None = None,
                        bucket: Bucket | None = None) -> None:
        if outputs is None:
            outputs = self._outputs_for(request_id) if self._outputs_for is not None else ()
        self._requests[request_id] = wrap(raw, outputs, bucket)

    def envelopes(self) -> Iterator[tuple[str, Envelope]]:
        for rid, raw in list(self._requests.items()):
            if raw is not None:
                yield str(rid), unwrap(bytes(raw))

    def has_request(self, request_id: str) -> bool:
        return request_id in self._requests

    def delete_request(self, request_id: str) -> None:
        if request_id in self._requests:
            del self._requests[request_id]

    def requests(self) -> Iterator[LiveRequest]:
        for raw in list(self._requests.values()):
            if raw is not None:
                yield LiveRequest.from_bytes(unwrap(bytes(raw)).record)

    def put_bucket(self, tenant: str, state: BucketState, stamp: Stamp = (0, 0)) -> None:
        data = state.model_dump()
        data["stamp"] = list(stamp)
        self._buckets[tenant] = orjson.dumps(data)

    def buckets(self) -> Iterator[tuple[str, Bucket]]:
        for tenant, raw in list(self._buckets.items()):
            if raw is not None:
                data = orjson.loads(raw)
                s = data.pop("stamp", None) or (0, 0)
                st = BucketState.model_validate(data)
                yield str(tenant), Bucket(st.level, st.updated, (int(s[0]), int(s[1])))

    def put_learned(self, key: str, value: dict[str, Any]) -> None:
        self._learned[key] = json.dumps(value).encode()

    def get_learned(self, key: str) -> dict[str, Any] | None:
        raw = self._learned.get(key)
        if raw is None:
            return None
        value = json.loads(raw)
        return value if isinstance(value, dict) else None
