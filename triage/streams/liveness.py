"""Do not declare a GPU lost for silence the app caused itself.

The dispatcher takes a GPU out of its pool when no heartbeat arrived for
`policy.gpu_timeout_s`. Two things make a live GPU look silent: the app was not reading
at all (a broker outage, a long pause), or its heartbeats sit unread on the status topic
behind a flood of requests (they share one consumer). In both cases the GPU did speak;
the app did not listen. So before each tick, while the app is behind on the status topic
or has just come back from a stall, every GPU's last heartbeat is applied again at
`now`. Once the app has read everything there is, a GPU that is still silent is really
silent and is declared lost as before.
"""

from __future__ import annotations

from collections.abc import Callable

STALL_S = 1.0  # a gap this long between two ticks means the app was not listening
GRACE_S = 5.0  # after a stall, until fresh fetches have told us where the topic ends


class HeartbeatGuard:
    """Remembers the last heartbeat of every GPU and says when to apply them again."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self.last: dict[bytes, bytes] = {}  # status key (gpu id) -> its last heartbeat
        self.offset = -1  # offset of the last status message handled
        self._last_tick: float | None = None
        self._grace_until = 0.0
        self.refreshes = 0

    def seen(self, key: bytes | None, value: bytes | None, offset: int | None) -> None:
        if key is not None and value is not None:
            self.last[key] = value
        if offset is not None:
            self.offset = max(self.offset, offset)

    def should_refresh(self, highwater: int | None) -> bool:
        """Call once per tick: True when the GPUs' silence may be the app's own."""
        now = self._clock()
        last, self._last_tick = self._last_tick, now
        if last is not None and now - last > STALL_S:
            self._grace_until = now + GRACE_S
        behind = highwater is not None and highwater > self.offset + 1
        refresh = bool(self.last) and (behind or now < self._grace_until)
        self.refreshes += refresh
        return refresh
