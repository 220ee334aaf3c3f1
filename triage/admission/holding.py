"""Which GPU an aged, memory-blocked queue head holds (EASY-backfilling's reservation).

A head that has waited `backfill_s` short of KV memory must not be starved by smaller
requests slipping into every byte that frees. Holding the whole pool for it (what the
dispatcher did first) leaves every GPU draining at once: on an 8-GPU pool, seven idle
their freed memory while one would do. So the head holds one GPU, the one predicted to
free enough for it soonest, and the others go on serving. Work that is predicted to
end before the head fits may still start on the held GPU (EASY backfilling).
"""

from __future__ import annotations

from collections.abc import Iterable

from triage.admission.kvcache import GpuSlot
from triage.admission.pending import Pending


def soonest_fit(
    p: Pending, slots: list[GpuSlot], running: Iterable[Pending], now: float
) -> tuple[GpuSlot | None, float]:
    """The up GPU where `p` is predicted to fit first (its room now plus the memory its
    runners free as they end, by their predicted end), and when. None if no GPU ever
    holds it."""
    ends: dict[int, list[tuple[float, int]]] = {}
    for r in running:
        s = r.gpu
        if isinstance(s, GpuSlot):
            ends.setdefault(s.index, []).append((r.predicted_end, r.kv_bytes))
    best: GpuSlot | None = None
    best_at = 0.0
    for s in slots:
        if not s.up:
            continue
        need = p.kv_bytes - s.avail(p.model, p.tenant)
        at = now
        if need > 0:
            for end, nbytes in sorted(ends.get(s.index, [])):
                need -= nbytes
                at = end if end > now else now
                if need <= 0:
                    break
            if need > 0:
                continue  # floors of others keep it from ever fitting here
        if best is None or at < best_at:
            best, best_at = s, at
    return best, best_at
