"""heapq's functions as Final names: the compiled build reads a Final module name from a
C static, while `heapq.heappush(...)` costs a module attribute lookup on every call, and
the queue, the ledger, the runners and the simulator push and pop millions of times."""

from __future__ import annotations

import heapq
from typing import Final

heappush: Final = heapq.heappush
heappop: Final = heapq.heappop
heapify: Final = heapq.heapify
heapreplace: Final = heapq.heapreplace
