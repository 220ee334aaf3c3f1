"""Preemption: stop a running request only when it pays.

The rule, exactly: preempt runner r for queued q only if q has higher priority
than r (a better priority class, or the same class and less weighted service;
never for the same tenant) AND q's remaining time to its deadline is shorter
than `factor` (default 0.5) x r's predicted remaining time. The preempted
request goes back to the queue and pays its prefill again (counted).

Runners are kept in a heap by predicted end, latest first, so the one with the
most remaining time (the only kind the rule can pick) is found in O(log n).
"""

from __future__ import annotations

from triage.admission.heaps import heapify, heappop, heappush
from triage.admission.pending import Pending


def outranks(q_key: tuple[int, float], r_key: tuple[int, float], same_tenant: bool) -> bool:
    """Priority keys are (class, weighted service); smaller is higher priority."""
    return not same_tenant and q_key < r_key


def should_preempt(
    *, queued_outranks: bool, queued_slack_s: float, runner_remaining_s: float, factor: float = 0.5
) -> bool:
    """The preemption rule (see the module docstring)."""
    return queued_outranks and queued_slack_s < factor * runner_remaining_s


class RunnerHeap:
    """Running requests of a pool, the latest predicted end on top."""

    __slots__ = ("_heap",)

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, int, Pending]] = []

    def push(self, p: Pending) -> None:
        heappush(self._heap, (-p.predicted_end, p.seq, p.attempt, p))

    def latest_end(self, inflight: dict[str, Pending]) -> float | None:
        """Predicted end of the runner that will run longest (None when none runs)."""
        heap = self._heap
        while heap:
            negend, _seq, attempt, p = heap[0]
            if inflight.get(p.request_id) is p and p.attempt == attempt:
                return -negend
            heappop(heap)
        return None

    def candidates(
        self, inflight: dict[str, Pending], limit: int
    ) -> list[Pending]:
        """Up to `limit` live runners with the most predicted remaining time, in order."""
        heap = self._heap
        taken: list[tuple[float, int, int, Pending]] = []
        out: list[Pending] = []
        while heap and len(out) < limit:
            entry = heappop(heap)
            p = entry[3]
            if inflight.get(p.request_id) is p and p.attempt == entry[2]:
                out.append(p)
                taken.append(entry)
        for entry in taken:
            heappush(heap, entry)
        return out

    def compact(self, inflight: dict[str, Pending]) -> None:
        """Drop entries of requests that are no longer running."""
        self._heap = [
            e for e in self._heap if inflight.get(e[3].request_id) is e[3] and e[3].attempt == e[2]
        ]
        heapify(self._heap)

    def __len__(self) -> int:
        return len(self._heap)
