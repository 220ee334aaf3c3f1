"""A KafkaOutbox in a child process that kill -9s itself once a given output is on the
broker with its transaction still open: a writer killed mid-batch, for takeover tests."""

from __future__ import annotations

import signal
import subprocess
import sys

_CHILD = """
import os, signal, sys
from triage.streams import lanes
from triage.streams.outbox import KafkaOutbox

produce = lanes.produce
bootstrap, txn_id, marks, work, replies, last = sys.argv[1:7]

def dies_after(p, topic, value, key=None, partition=-1, **kw):
    produce(p, topic, value, key, partition, **kw)
    if value == last.encode():  # on the broker, its transaction open: kill -9
        p.flush(30)
        os.kill(os.getpid(), signal.SIGKILL)

lanes.produce = dies_after
outbox = KafkaOutbox(bootstrap, transactional_id=txn_id, marks_topic=marks, shards=2,
                     is_reply=replies.__eq__ if replies else None)
outbox.start()
outbox.mark_partitions.add(1)
for seq, lane, topic, value in BATCHES:
    topic = work if topic == "work" else replies
    outbox.publish(seq, [(topic, b"k", v.encode(), 1, None) for v in value.split(",")],
                   lane=lane, marks=outbox.mark_partitions)
"""

Batch = tuple[int, str, str, str]  # seq, lane, "work" or "replies", comma-separated values


def run_until_killed(bootstrap: str, txn_id: str, marks: str, work: str, replies: str,
                     batches: list[Batch], last: str) -> None:
    """Publish `batches` in a child that dies right after writing `last`."""
    code = _CHILD.replace("BATCHES", repr(batches))
    child = subprocess.run([sys.executable, "-c", code, bootstrap, txn_id, marks, work,
                            replies, last], capture_output=True, text=True, timeout=120)
    assert child.returncode == -signal.SIGKILL, child.stderr[-2000:]
