"""Topics a killed `triage bench pipeline` left on the broker.

A bench deletes its run's topics when it ends, on errors, SIGINT and SIGTERM too. Killed
with SIGKILL (or its machine lost), it cannot: each repetition leaves a few hundred
topics behind, and at 1,000 tenants thousands, which later runs then share the broker
with (docs/architecture.md measured a 1,000-tenant run beside ~4,000 of them). So each
run writes who owns it into its run directory, and the next run on the same `--out`
deletes the topics of every earlier run there whose owner is gone. A run whose owner
is alive (a bench running beside this one), or whose directory is elsewhere, is left
alone: nothing here deletes what it cannot prove is dead.
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
from pathlib import Path

import psutil

from triage.topics.admin import delete_topics

log = logging.getLogger(__name__)

OWNER_FILE = "owner.json"
RUN_NAME = re.compile(r"^bench\d{14}[0-9a-f]{4}$")  # pipeline.run's run prefix


def claim(run_dir: Path) -> None:
    """Record this process as the owner of the run in `run_dir`."""
    (run_dir / OWNER_FILE).write_text(json.dumps({"pid": os.getpid(),
                                                  "host": socket.gethostname()}))


def release(run_dir: Path) -> None:
    """The run deleted its own topics: nothing is left for a sweep to look at."""
    owner = run_dir / OWNER_FILE
    if owner.exists():
        owner.rename(run_dir / f"{OWNER_FILE}.swept")


def dead_runs(out_dir: Path) -> list[str]:
    """Run prefixes under `out_dir` whose owner, on this host, is no longer running."""
    dead = []
    for owner in sorted(out_dir.glob(f"*/{OWNER_FILE}")):
        name = owner.parent.name
        if not RUN_NAME.match(name):
            continue
        try:
            who = json.loads(owner.read_text())
            pid, host = int(who["pid"]), str(who["host"])
        except (OSError, ValueError, KeyError, TypeError):
            continue  # half-written or foreign: not provably dead
        if host == socket.gethostname() and not psutil.pid_exists(pid):
            dead.append(name)
    return dead


def sweep(bootstrap: str, out_dir: Path) -> list[str]:
    """Delete the topics of dead runs under `out_dir`; returns the topics deleted. A run
    swept (or holding no topics) is marked so the next sweep skips it."""
    deleted: list[str] = []
    for name in dead_runs(out_dir):
        gone = delete_topics(bootstrap, name)
        if gone:
            log.warning("deleted %d topics a killed bench run (%s) left behind", len(gone), name)
        deleted += gone
        release(out_dir / name)
    return deleted

