"""A minimal Faust app with a RocksDB table, run as a subprocess by test_faust_rocksdb.py.

It proves faust-streaming + aiokafka + rocksdict + our Kafka version work
together: the agent stores every item of the input topic in a RocksDB-backed
Table (idempotent assignment by key, as triage's tables do), and answers a
dump request with the table's full contents on the output topic, so the test
can see what survived a restart.

Settings come from the environment (one app id, topics and datadir per test):
FAUST_TEST_BROKER, FAUST_TEST_APP_ID, FAUST_TEST_INPUT, FAUST_TEST_OUTPUT,
FAUST_TEST_DATADIR, FAUST_TEST_WEB_PORT, FAUST_TEST_PARTITIONS.

Input messages: key = item id, value = JSON {"value": int}; a message with key
DUMP_KEY and value {"nonce": str} asks for a dump.
"""

from __future__ import annotations

import logging
import os

import faust

log = logging.getLogger(__name__)

DUMP_KEY = "__dump__"
PARTITIONS = int(os.environ.get("FAUST_TEST_PARTITIONS", "2"))

app = faust.App(
    os.environ["FAUST_TEST_APP_ID"],
    broker=f"kafka://{os.environ['FAUST_TEST_BROKER']}",
    store="rocksdb://",
    datadir=os.environ["FAUST_TEST_DATADIR"],
    topic_partitions=PARTITIONS,
    topic_replication_factor=1,
    web_bind="127.0.0.1",
    web_host="127.0.0.1",
    web_port=int(os.environ["FAUST_TEST_WEB_PORT"]),
    consumer_auto_offset_reset="earliest",
    broker_commit_interval=0.5,
)

items_topic = app.topic(
    os.environ["FAUST_TEST_INPUT"],
    key_serializer="raw",
    value_serializer="json",
    partitions=PARTITIONS,
)
dumps_topic = app.topic(
    os.environ["FAUST_TEST_OUTPUT"], key_serializer="raw", value_serializer="json", partitions=1
)

items = app.Table("items", default=None, partitions=PARTITIONS, key_type=str, value_type=int)


def _per_partition() -> dict[str, dict[str, str]]:
    """Raw contents of each partition's RocksDB (diagnostics for a failed assertion)."""
    dbs = getattr(items.data, "_dbs", {})
    return {
        str(p): {k.decode(errors="replace"): v.decode(errors="replace") for k, v in db.items()}
        for p, db in dbs.items()
    }


@app.agent(items_topic, concurrency=1)
async def store_items(stream: faust.StreamT) -> None:
    """Assign whole values (never mutate in place: only assignment reaches the changelog)."""
    async for event in stream.events():
        key = event.key.decode() if isinstance(event.key, bytes) else str(event.key)
        value = event.value
        log.info("event %s=%s from partition %d", key, value, event.message.partition)
        if key == DUMP_KEY:
            await dumps_topic.send(
                key=value["nonce"].encode(),
                value={
                    "nonce": value["nonce"],
                    "pid": os.getpid(),
                    "store": type(items.data).__module__,
                    "rocksdict": getattr(items.data, "use_rocksdict", None),
                    "items": dict(items.items()),
                    "partitions": _per_partition(),
                },
            )
        else:
            items[key] = int(value["value"])


if __name__ == "__main__":
    app.main()
