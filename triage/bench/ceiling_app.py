"""The ceiling apps of `triage bench pipeline`: Faust apps on the admission app's own
engine (streams/engine.py: its settings and fixes, the 20 ms fetch wait, the
transactional outbox, the changelog flushed before each batch commits) that do no
admission work, so what they sustain is what the engine allows.

- relay: parse each input, stage one output;
- table: the same plus one RocksDB table write per input;
- skeleton: triage's pattern per request. The request is parsed, written to the table
  and answered with three outputs (a reply, a decision record, a work item); the work
  item is read back as the request's completion (no worker in between), written to the
  table again and answered with two more (the final reply, a decision record):
  2 events, 2 table writes, 5 outputs per request (the scale issue's yardstick);
- matched: the path triage's own burst took in the same repetition, so the two compare
  for the same events, writes and outputs per request. The work items go through a
  batcher (batcher.py, in the bench's process, as the workers' completions do) that
  sends them back in messages of up to `completion_batch_max` items, so completions
  cost an event per message, not per request; and the share `queued_share` of the
  requests that triage queued before starting them is also answered `queued` (a reply
  and a decision record) and written to the table as queued first. In triage the
  start comes on a later event (another request's completion), so the events stay
  those of a request and of its completion message: 1 + 1/batch events, 2 + q table
  writes, 5 + 2q outputs per request.

Each request's last output goes to `<base>.out`, which the bench counts.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import faust

from triage.config.models import TriageConfig
from triage.kafka.security import use_kafka_security
from triage.streams.changelog import ChangelogProducer
from triage.streams.committer import Committer, commit_continuously
from triage.streams.engine import RAW_TOPIC, faust_app, install_patches, raw_table, start_outbox
from triage.streams.health import Health
from triage.streams.outbox import KafkaOutbox


class CeilingKind(StrEnum):
    RELAY = "relay"
    TABLE = "table"
    SKELETON = "skeleton"
    MATCHED = "matched"


SKELETONS = frozenset({CeilingKind.SKELETON, CeilingKind.MATCHED})


@dataclass(frozen=True)
class CeilingTopics:
    """The topics of one ceiling app, all under `base`."""

    base: str

    @property
    def inputs(self) -> str:
        return f"{self.base}.in"

    @property
    def out(self) -> str:
        return f"{self.base}.out"

    @property
    def work(self) -> str:
        return f"{self.base}.work"

    @property
    def done(self) -> str:
        """Where the matched skeleton's batcher sends the work items back, batched."""
        return f"{self.base}.done"

    @property
    def replies(self) -> str:
        return f"{self.base}.replies"

    @property
    def decisions(self) -> str:
        return f"{self.base}.decisions"

    def all(self) -> list[str]:
        return [self.inputs, self.out, self.work, self.done, self.replies, self.decisions]


def _reply(rid: str, status: str) -> bytes:
    return json.dumps({"request_id": rid, "status": status, "reason": "admitted"}).encode()


def _decision(rid: str, outcome: str, d: dict[str, Any]) -> bytes:
    return json.dumps({"request_id": rid, "outcome": outcome, "reason": "admitted",
                       "tenant": d.get("tenant"), "model": d.get("model"),
                       "prompt_tokens": d.get("prompt_tokens")}).encode()


def _record(outbox: KafkaOutbox, key: bytes, value: bytes) -> bytes:
    """What the admission app's table records hold: the request and the outputs it
    caused that are not committed yet (outbox.pending_for)."""
    pending = outbox.pending_for(key.decode())
    return b"\n".join([value, *(v for _, _, v in pending)])


class QueuedShare:
    """Which requests of a stream take the queued path: every one that brings the running
    sum of `share` past a whole number, so any prefix of n requests holds share x n
    of them, give or take one."""

    def __init__(self, share: float) -> None:
        if not 0.0 <= share <= 1.0:
            raise ValueError(f"queued share {share} is outside 0..1")
        self._share = share
        self._sum = 0.0

    def next(self) -> bool:
        before = self._sum
        self._sum += self._share
        return int(self._sum + 1e-9) > int(before + 1e-9)


def build_ceiling_app(config: TriageConfig, kind: CeilingKind, base: str, *,
                      datadir: str, queued_share: float = 0.0) -> faust.App:
    """The ceiling app of `kind` on the topics under `base` (created by the bench);
    `queued_share` is the matched skeleton's (above), and only its."""
    if queued_share and kind is not CeilingKind.MATCHED:
        raise ValueError(f"a queued share is the matched skeleton's, not the {kind} app's")
    use_kafka_security(config.kafka)
    topics = CeilingTopics(base)
    app_id = f"{base}.app"
    # the same lanes as the app's: work items on one, what answers the client on the other
    reply_topics = {topics.out, topics.replies, topics.decisions}
    outbox = start_outbox(config, app_id, reply_topics.__contains__)
    install_patches(rf"^{re.escape(base)}\.(in|work|done)$")
    app = faust_app(config, app_id, datadir=datadir)
    inputs = app.topic(topics.inputs, **RAW_TOPIC)
    work = app.topic(topics.done if kind is CeilingKind.MATCHED else topics.work, **RAW_TOPIC)
    queued = QueuedShare(queued_share)
    changelog = ChangelogProducer(config.kafka.bootstrap_servers)
    table = None if kind is CeilingKind.RELAY else raw_table(app, "records", changelog)
    committer = Committer(app, outbox, Health(), changelog)
    ready = [False]

    @app.on_rebalance_complete.connect
    async def _ready(sender: Any, /, *_args: Any, signal: Any, **_kw: Any) -> None:
        committer.install()
        ready[0] = True

    @app.on_before_shutdown.connect
    async def _stopping(sender: Any, /, *_args: Any, **_kw: Any) -> None:
        outbox.stop()

    @app.agent(inputs, concurrency=1)
    async def requests(stream: Any) -> None:
        async for event in stream.events():
            key, value = event.key, event.value
            d = json.loads(value)
            rid = d["request_id"]
            if kind is CeilingKind.MATCHED and queued.next():
                outbox.send_raw(topics.replies, key, _reply(rid, "queued"))
                outbox.send_raw(topics.decisions, key, _decision(rid, "queue", d))
                assert table is not None
                table[key] = _record(outbox, key, value)
            if kind in SKELETONS:
                outbox.send_raw(topics.replies, key, _reply(rid, "accepted"))
                outbox.send_raw(topics.decisions, key, _decision(rid, "accept", d))
                outbox.send_raw(topics.work, key, value)
            else:
                outbox.send_raw(topics.out, key, _reply(rid, "accepted"))
            if table is not None:
                table[key] = _record(outbox, key, value)

    if kind in SKELETONS:
        assert table is not None

        @app.agent(work, concurrency=1)
        async def completions(stream: Any) -> None:
            async for event in stream.events():
                # the matched skeleton's messages are JSON lists of work items (batcher.py)
                items = ([(event.key, event.value, json.loads(event.value))]
                         if kind is CeilingKind.SKELETON else
                         [(d["request_id"].encode(), None, d) for d in json.loads(event.value)])
                for key, value, d in items:
                    rid = d["request_id"]
                    reply = _reply(rid, "completed")
                    outbox.send_raw(topics.out, key, reply)
                    outbox.send_raw(topics.decisions, key, _decision(rid, "complete", d))
                    table[key] = _record(outbox, key, value or reply)

    @app.task
    async def commit_outputs() -> None:
        await commit_continuously(committer, outbox, lambda: ready[0])

    return app
