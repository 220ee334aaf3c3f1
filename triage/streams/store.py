"""The admission app's state, behind one small interface with two backends: Faust tables
on RocksDB (production, recovered from changelogs) and plain dicts (unit tests). Same
shape, same names, so the service never knows which it has."""

from __future__ import annotations

import json
from collections.abc import Iterator, MutableMapping
from typing import Any, Protocol

from triage.topics.messages import BucketState, LiveRequest

REQUESTS = "requests"  # request_id -> LiveRequest (queued, running, done for dedupe)
BUCKETS = "buckets"  # tenant -> BucketState
LEARNED = "learned"  # "predictor" -> the predictor's snapshot (JSON object)
TABLES = (REQUESTS, BUCKETS, LEARNED)


class StateStore(Protocol):
    """Typed access to the three tables."""

    def get_request(self, request_id: str) -> LiveRequest | None: ...

    def put_request(self, rec: LiveRequest) -> None: ...

    def get_request_raw(self, request_id: str) -> bytes | None: ...

    def put_request_raw(self, request_id: str, raw: bytes) -> None: ...

    def has_request(self, request_id: str) -> bool: ...

    def delete_request(self, request_id: str) -> None: ...

    def requests(self) -> Iterator[LiveRequest]: ...

    def put_bucket(self, tenant: str, state: BucketState) -> None: ...

    def buckets(self) -> Iterator[tuple[str, BucketState]]: ...

    def put_learned(self, key: str, value: dict[str, Any]) -> None: ...

    def get_learned(self, key: str) -> dict[str, Any] | None: ...


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

    @classmethod
    def in_memory(cls) -> MappingStore:
        return cls({}, {}, {})

    def get_request(self, request_id: str) -> LiveRequest | None:
        raw = self._requests.get(request_id)
        return None if raw is None else LiveRequest.from_bytes(raw)

    def put_request(self, rec: LiveRequest) -> None:
        self._requests[rec.request_id] = rec.to_bytes()

    def get_request_raw(self, request_id: str) -> bytes | None:
        raw = self._requests.get(request_id)
        return None if raw is None else bytes(raw)

    def put_request_raw(self, request_id: str, raw: bytes) -> None:
        self._requests[request_id] = raw

    def has_request(self, request_id: str) -> bool:
        return request_id in self._requests

    def delete_request(self, request_id: str) -> None:
        if request_id in self._requests:
            del self._requests[request_id]

    def requests(self) -> Iterator[LiveRequest]:
        for raw in list(self._requests.values()):
            if raw is not None:
                yield LiveRequest.from_bytes(raw)

    def put_bucket(self, tenant: str, state: BucketState) -> None:
        self._buckets[tenant] = state.to_bytes()

    def buckets(self) -> Iterator[tuple[str, BucketState]]:
        for tenant, raw in list(self._buckets.items()):
            if raw is not None:
                yield str(tenant), BucketState.from_bytes(raw)

    def put_learned(self, key: str, value: dict[str, Any]) -> None:
        self._learned[key] = json.dumps(value).encode()

    def get_learned(self, key: str) -> dict[str, Any] | None:
        raw = self._learned.get(key)
        if raw is None:
            return None
        value = json.loads(raw)
        return value if isinstance(value, dict) else None
