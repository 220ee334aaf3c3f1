"""What a chaos run found, per scenario: a table for people and JSON for machines."""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

from rich.table import Table


@dataclass
class ScenarioResult:
    """Counts of one scenario. `lost`, `duplicate_terminals`, `executed_twice` and
    `unexpected_exits` must all be 0 for the run to pass."""

    scenario: str
    faults: int = 0
    sent: int = 0
    not_delivered: int = 0  # the client's own produce failed (not the app's doing)
    answered: int = 0
    lost: int = 0
    duplicate_terminals: int = 0
    executed_twice: int = 0
    unexpected_exits: int = 0
    gpu_lost: int = 0
    recovery_s: list[float] = field(default_factory=list)  # fault -> app ready again
    first_decision_s: list[float] = field(default_factory=list)  # fault -> a new decision
    sigterm_exit_s: float | None = None
    peak_rss_mb: float = 0.0
    client_p99_s: float | None = None  # sent -> terminal reply read
    reported_p99_s: float | None = None  # latency_ms in completed replies
    max_decision_gap_s: float | None = None  # poison: longest pause while it flowed
    # side groups (poison, removed/added tenant, forgeries): name -> counts, each with
    # `sent` and `unaccounted` (must be 0) and, where ids exist, `duplicates` (must be 0)
    groups: dict[str, dict[str, int]] = field(default_factory=dict)
    lost_ids: list[str] = field(default_factory=list)
    duplicate_ids: list[str] = field(default_factory=list)  # first 20 with terminal > 1
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return (self.lost == 0 and self.duplicate_terminals == 0 and self.executed_twice == 0
                and self.unexpected_exits == 0 and self.sent > 0
                and (self.sigterm_exit_s is not None or self.scenario != "sigterm")
                and all(g.get("unaccounted", 0) == 0 and g.get("duplicates", 0) == 0
                        for g in self.groups.values()))


@dataclass
class ChaosReport:
    results: list[ScenarioResult] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return bool(self.results) and all(r.ok for r in self.results)

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "scenarios": [{**asdict(r), "ok": r.ok} for r in self.results]}

    def table(self) -> Table:
        t = Table(title="triage chaos")
        for col in ("scenario", "faults", "sent", "answered", "lost", "terminal>1",
                    "exec twice", "app exits", "gpu_lost", "recovery s (max)",
                    "1st decision s (max)", "peak MB", "p99 client/app s", "max gap s",
                    "side groups", "ok"):
            t.add_column(col, justify="left" if col == "scenario" else "right")
        for r in self.results:
            t.add_row(
                r.scenario, str(r.faults), str(r.sent), str(r.answered), str(r.lost),
                str(r.duplicate_terminals), str(r.executed_twice), str(r.unexpected_exits),
                str(r.gpu_lost), _fmt_max(r.recovery_s), _fmt_max(r.first_decision_s),
                f"{r.peak_rss_mb:.0f}",
                f"{_f(r.client_p99_s)}/{_f(r.reported_p99_s)}", _f(r.max_decision_gap_s),
                _groups(r.groups),
                "yes" if r.ok else "[bold red]NO[/]",
            )
        return t


def p99(xs: list[float]) -> float | None:
    if not xs:
        return None
    if len(xs) < 2:
        return xs[0]
    return statistics.quantiles(xs, n=100, method="inclusive")[98]


def _fmt_max(xs: list[float]) -> str:
    return "-" if not xs else f"{max(xs):.1f}"


def _f(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def _groups(groups: dict[str, dict[str, int]]) -> str:
    """`name: k=v ...` per group, one line each (`sent` first, zeros of checks left out)."""
    lines = []
    for name, counts in groups.items():
        parts = [f"{k}={v}" for k, v in counts.items()
                 if v or k not in ("unaccounted", "duplicates", "not_delivered")]
        lines.append(f"{name}: {' '.join(parts)}")
    return "\n".join(lines) or "-"
