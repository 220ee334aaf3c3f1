"""Inputs a sharded app read on the wrong shard, sent on to their pool's partition.

A producer that does not route by pool (topics/shards.py) writes some requests,
completions and heartbeats to a partition whose shard does not own their pool; that
shard forwards them, in its current output batch, to the owner. A forward names where
its input was first read (header `triage-origin`), so a dead letter or log line made by
the owner points at the record its producer wrote. Invalid requests go on too: only
the owner knows whether their id is fresh, and one id gets one terminal reply.
"""

from __future__ import annotations

from collections.abc import Callable

from triage.config.models import TriageConfig
from triage.streams.metrics import AdmissionMetrics
from triage.streams.outbox import Headers, Outbox
from triage.streams.refusals import Refusals
from triage.topics.messages import InferenceRequest, InvalidVerdict
from triage.topics.shards import VERDICT_HEADER, Origin, Shard, origin_header, shard_of_pool
from triage.topics.validation import Invalid


class Forwarder:
    """Sends one shard's misrouted inputs on (a no-op for an unsharded app)."""

    def __init__(self, outbox: Outbox, metrics: AdmissionMetrics, refusals: Refusals) -> None:
        self.outbox = outbox
        self.metrics = metrics
        self.refusals = refusals

    def request(self, config: TriageConfig, shard: Shard | None, topic: str,
                partition: int | None, key: bytes | None, value: bytes,
                parsed: InferenceRequest | Invalid, origin: Origin | None, now: float) -> bool:
        """Forward a request, valid or not, to its model's shard. An invalid one too large
        to forward (above admission.max_message_bytes: the broker may refuse it, and a
        refused batch would stall every output) is dead-lettered here and its verdict
        goes on instead, for the owner to answer."""
        if parsed.model is None:
            return False
        m = config.models_by_name.get(parsed.model)
        pool = None if m is None else m.pool
        if not isinstance(parsed, Invalid) or len(value) <= config.admission.max_message_bytes:
            return self.send(config, shard, topic, partition, key, value, pool, origin)
        verdict = InvalidVerdict(request_id=parsed.request_id, model=parsed.model,
                                 reason=parsed.reason, detail=parsed.detail[:4000])
        if not self.send(config, shard, topic, partition, key, verdict.to_bytes(), pool,
                         origin, verdict=True):
            return False
        where = origin or (partition, None)
        self.refusals.dead_letter(topic, where[0], where[1], key, value, parsed.detail,
                                  "gate", now)
        return True

    def send(self, config: TriageConfig, shard: Shard | None, topic: str,
             partition: int | None, key: bytes | None, value: bytes, pool: str | None,
             origin: Origin | None = None, verdict: bool = False) -> bool:
        """Send an input for a configured pool of another shard on to that shard's
        partition, in this batch; False when it is this shard's to handle."""
        if shard is None or pool is None or pool in shard.pools \
                or pool not in config.pools_by_name:
            return False
        target = shard_of_pool(config, pool)
        if target == partition:
            return False  # on its own partition already: the config changed under it
        headers: Headers = [] if origin is None else [origin_header(origin)]
        if verdict:
            headers.append((VERDICT_HEADER, b"invalid"))
        self.outbox.forward(topic, target, key, value, headers or None)
        self.metrics.forwarded.labels(topic).inc()
        return True

    def answer_verdict(self, topic: str, key: bytes | None, value: bytes | None,
                       origin: Origin | None, now: float, live: Callable[[str], bool],
                       policy: tuple[str, str]) -> bool:
        """A verdict another shard sent on: answered as the invalid request it stands for
        (its bytes are dead-lettered already). False when it does not read as one."""
        try:
            v = InvalidVerdict.from_bytes(value or b"")
        except ValueError:
            return False  # a forged header on some message: it is read as a request
        tenant = self.refusals.names.tenant_of_request_topic(topic) or "unknown"
        self.metrics.child(self.metrics.requests, tenant).inc()
        partition, offset = origin or (None, None)
        self.refusals.invalid(tenant, Invalid(v.request_id, v.reason, v.detail, v.model),
                              live_in_core=live(v.request_id), policy=policy, topic=topic,
                              partition=partition, offset=offset, key=key, value=value,
                              now=now, kept=True)
        return True
