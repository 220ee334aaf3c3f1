"""The demo's summary counts SLA attainment as the simulator does: over every request
sent (refusals and timeouts are misses), with the completed-only figure beside it."""

from __future__ import annotations

import io

from rich.console import Console

from triage.demo.driver import Track
from triage.demo.summary import summarize, table


def _track(tenant: str, terminal: str | None, latency: float | None = None) -> Track:
    t = Track(tenant=tenant, sent_at=100.0, statuses=["accepted"] if terminal else [])
    if terminal is not None:
        t.terminal, t.terminals = terminal, 1
        t.terminal_at = 100.0 + (latency if latency is not None else 0.5)
    return t


def test_sla_over_sent_with_completed_only_beside_it() -> None:
    tracks = [
        _track("rag", "completed", 1.0),  # within its 4 s SLA
        _track("rag", "completed", 9.0),  # late
        _track("rag", "rejected"),
        _track("rag", "timed_out"),
        _track("emb", "completed", 0.5),
    ]
    out = summarize(tracks, {"rag": 4.0, "emb": 2.0}, None)
    rag = out["tenants"]["rag"]
    assert rag["met_sla"] == 1
    assert rag["sla_attainment"] == 0.25  # 1 of 4 sent
    assert rag["sla_attainment_completed"] == 0.5  # 1 of 2 completed
    assert out["sla_attainment"] == 2 / 5 and out["sla_attainment_completed"] == 2 / 3
    console = Console(file=io.StringIO(), width=250)
    console.print(table(out))
    text = console.file.getvalue()  # type: ignore[attr-defined]
    assert "SLA met / sent" in text and "SLA met (completed only)" in text
    assert "1/4 (25.0%)" in text and "1/2 (50.0%)" in text
