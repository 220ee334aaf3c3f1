"""Faust's work per assigned partition on paths that run per fetch or on a timer, made
independent of the number of partitions: with one request topic per tenant, 1,000
tenants are 1,000 partitions, and a pass over them on every fetch is paid on every
request (docs/architecture.md, "CPU per request as pools and tenants grow").

- `Consumer._get_active_partitions` asserts that every active partition is a TP, on
  each of the ~0.3 fetches per request (1,000 isinstance checks a fetch at 1,000
  tenants): the set is built from TPs only, so the check is dropped.
- `Consumer.verify_all_partitions_active` (a livelock diagnostic, every 2.5 s) yields
  to the event loop before each partition: 1,000 loop turns each time. It yields once
  per `VERIFY_CHUNK` partitions instead, so no turn of the loop runs more than that many
  cheap checks.

Both are installed once per process (idempotent).
"""

from __future__ import annotations

from time import monotonic
from typing import Any

from faust.transport import consumer as faust_consumer

VERIFY_CHUNK = 100


def install() -> None:
    cls: Any = faust_consumer.Consumer
    if getattr(cls, "_triage_per_partition", False):
        return

    def _get_active_partitions(self: Any) -> Any:
        tps = self._active_partitions
        if tps is None:
            return self._set_active_tps(self.assignment())
        return tps

    async def verify_all_partitions_active(self: Any) -> None:
        now = monotonic()
        for n, tp in enumerate(self.assignment()):
            if n % VERIFY_CHUNK == 0:
                await self.sleep(0)
            if self.should_stop:
                return
            self.verify_event_path(now, tp)

    cls._get_active_partitions = _get_active_partitions
    cls.verify_all_partitions_active = verify_all_partitions_active
    cls._triage_per_partition = True
