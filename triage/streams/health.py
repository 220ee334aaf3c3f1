"""Liveness and readiness of the admission app, from what it does, not from a flag.

Ready means "deciding": state recovered, partitions assigned, clock ticks flowing through
Kafka into the tick agent (which proves the broker, the consumer and the event loop
all work), and output batches committing. Any of these stalling for `stall_s` makes
the app unready; `/ready`, `/live` and the `triage_admission_ready` gauge all read the
same `check()`. Live means the event loop runs (a broker outage makes the app unready,
not dead: restarting it would not help). The HTTP server runs on its own thread, so a
stuck event loop still gets an honest answer.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

STALL_S = 5.0
LIVE_STALL_S = 30.0


@dataclass
class Health:
    """Progress marks set by the app; `check()` turns them into ready / not ready."""

    stall_s: float = STALL_S
    live_stall_s: float = LIVE_STALL_S
    restored: bool = False
    last_tick: float | None = None  # monotonic time the tick agent last ran
    last_beat: float | None = None  # monotonic time the event loop last ran a timer
    publishing_since: float | None = None  # an output batch is being committed
    replying_since: float | None = None  # the same on the reply lane (lanes.py)
    # shards the group gave this instance at its last rebalance; None until the first.
    # Set by the event loop: the HTTP thread must never touch the consumer (Faust builds
    # it lazily, and one built on this thread waits on another loop: the app never starts)
    held: int | None = None
    clock: Callable[[], float] = field(default=time.monotonic)
    started: float = field(default_factory=time.monotonic)

    def ticked(self) -> None:
        self.last_tick = self.clock()

    def beat(self) -> None:
        self.last_beat = self.clock()

    def check(self) -> tuple[bool, str]:
        """(ready, why): why names the first thing that is wrong, or says "deciding"."""
        now = self.clock()
        if self.held == 0:  # (before recovery too: an instance given nothing never recovers)
            return False, "no shard assigned (a standby until the group gives it one)"
        if not self.restored:
            return False, "recovering state"
        since = now - (self.last_tick if self.last_tick is not None else self.started)
        if since > self.stall_s:
            return False, f"not deciding: no tick handled for {since:.1f}s"
        for since_s, what in ((self.publishing_since, "outputs"),
                              (self.replying_since, "replies")):
            if since_s is not None and now - since_s > self.stall_s:
                return False, (f"{what} not committed for {now - since_s:.1f}s "
                               "(broker unreachable?)")
        return True, "deciding"

    def live(self) -> tuple[bool, str]:
        """Alive while the event loop runs (a broker outage is not a reason to restart)."""
        last = self.last_beat if self.last_beat is not None else self.started
        since = self.clock() - last
        if since > self.live_stall_s:
            return False, f"event loop stalled for {since:.1f}s"
        return True, "alive"
