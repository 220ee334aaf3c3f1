"""A killed `triage bench pipeline` leaves its topics: the next run on the same --out
deletes those of every earlier run whose owner is gone, and nothing of a run whose owner
is alive (a bench beside it) or whose owner is on another host (real broker)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import uuid
from pathlib import Path

from confluent_kafka.admin import NewTopic

from triage.bench.leftovers import OWNER_FILE, claim, sweep
from triage.kafka.clients import make_admin


def _run(out: Path, owner: dict[str, object] | None, bootstrap: str) -> tuple[str, list[str]]:
    """A run directory named like a bench's, its owner file, and two of its topics."""
    name = f"bench{uuid.uuid4().int % 10**14:014d}{uuid.uuid4().hex[:4]}"
    run_dir = out / name
    run_dir.mkdir(parents=True)
    if owner is None:
        claim(run_dir)
    else:
        (run_dir / OWNER_FILE).write_text(json.dumps(owner))
    topics = [f"{name}-r1.triage.requests.a", f"{name}-b1.broker"]
    admin = make_admin(bootstrap)
    for fut in admin.create_topics([NewTopic(t, 1, 1) for t in topics]).values():
        fut.result(timeout=30)
    return name, topics


def _on_broker(bootstrap: str, topics: list[str]) -> set[str]:
    names = set(make_admin(bootstrap).list_topics(timeout=10).topics)
    return {t for t in topics if t in names}


def test_the_next_run_deletes_what_killed_runs_left_and_nothing_else(
    kafka_bootstrap: str, tmp_path: Path,
) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # a pid that no longer runs: the bench killed with SIGKILL
    host = socket.gethostname()
    dead, dead_topics = _run(tmp_path, {"pid": gone.pid, "host": host}, kafka_bootstrap)
    _alive, alive_topics = _run(tmp_path, None, kafka_bootstrap)  # this process: running
    _far, far_topics = _run(tmp_path, {"pid": gone.pid, "host": host + "-other"},
                            kafka_bootstrap)
    try:
        deleted = sweep(kafka_bootstrap, tmp_path)
        assert sorted(deleted) == sorted(dead_topics)
        assert _on_broker(kafka_bootstrap, dead_topics) == set()
        kept = alive_topics + far_topics
        assert _on_broker(kafka_bootstrap, kept) == set(kept)
        assert not (tmp_path / dead / OWNER_FILE).exists()  # swept: not looked at again
        assert sweep(kafka_bootstrap, tmp_path) == []
    finally:
        left = _on_broker(kafka_bootstrap, alive_topics + far_topics)
        if left:
            admin = make_admin(kafka_bootstrap)  # held until the results
            for fut in admin.delete_topics(sorted(left)).values():
                fut.result(timeout=30)
