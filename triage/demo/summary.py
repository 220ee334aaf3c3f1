"""The demo's per-tenant summary: counts, latency percentiles, SLA violations by cause."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from prometheus_client.parser import text_string_to_metric_families
from rich.table import Table

from triage.demo.driver import Track

TERMINAL = ("completed", "rejected", "timed_out", "invalid", "failed")


def percentile(sorted_values: list[float], q: float) -> float | None:
    if not sorted_values:
        return None
    k = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[k]


def sla_violations(metrics_text: str | None) -> dict[str, dict[str, int]]:
    """tenant -> cause -> count, from the admission app's Prometheus text."""
    out: dict[str, dict[str, int]] = defaultdict(dict)
    if not metrics_text:
        return {}
    for family in text_string_to_metric_families(metrics_text):
        if family.name != "triage_sla_violations":
            continue
        for s in family.samples:
            if s.name.endswith("_total"):
                t, cause = s.labels["tenant"], s.labels["cause"]
                out[t][cause] = out[t].get(cause, 0) + int(s.value)
    return dict(out)


def summarize(
    tracks: list[Track], sla_s: dict[str, float], metrics_text: str | None
) -> dict[str, Any]:
    by_tenant: dict[str, list[Track]] = defaultdict(list)
    for t in tracks:
        by_tenant[t.tenant].append(t)
    violations = sla_violations(metrics_text)
    tenants: dict[str, Any] = {}
    for name in sorted(by_tenant):
        ts = by_tenant[name]
        lat = sorted(t.latency_s for t in ts if t.terminal == "completed" and t.latency_s)
        row: dict[str, Any] = {
            "sent": len(ts),
            "accepted": sum(1 for t in ts if "accepted" in t.statuses),
            "queued": sum(1 for t in ts if "queued" in t.statuses),
            "preempted": sum(1 for t in ts if "preempted" in t.statuses),
            **{k: sum(1 for t in ts if t.terminal == k) for k in TERMINAL},
            "no_reply": sum(1 for t in ts if t.terminal is None),
            "duplicate_terminal_replies": sum(1 for t in ts if t.terminals > 1),
            "p50_s": percentile(lat, 0.50),
            "p95_s": percentile(lat, 0.95),
            "p99_s": percentile(lat, 0.99),
            "sla_s": sla_s.get(name),
            "met_sla": sum(1 for x in lat if x <= sla_s.get(name, float("inf"))),
            "sla_violations": violations.get(name, {}),
        }
        # one definition with the simulator (triage/sim/metrics.py): over every request
        # sent, a refusal or timeout is a miss; the completed-only figure beside it
        row["sla_attainment"] = row["met_sla"] / row["sent"] if row["sent"] else None
        row["sla_attainment_completed"] = (
            row["met_sla"] / row["completed"] if row["completed"] else None
        )
        tenants[name] = row
    total_sent = sum(r["sent"] for r in tenants.values())
    total_end = sum(r[k] for r in tenants.values() for k in TERMINAL)
    met = sum(r["met_sla"] for r in tenants.values())
    done = sum(r["completed"] for r in tenants.values())
    return {"tenants": tenants, "sent": total_sent, "ended": total_end,
            "sla_attainment": met / total_sent if total_sent else None,
            "sla_attainment_completed": met / done if done else None,
            "reconciles": total_sent == total_end
            and all(r["duplicate_terminal_replies"] == 0 for r in tenants.values())}


def table(summary: dict[str, Any]) -> Table:
    t = Table(title="triage demo: per tenant (latency in seconds, as the tenant saw it)")
    cols = ["tenant", "sent", "accepted", "queued", "rejected", "timed out", "completed",
            "p50", "p95", "p99", "SLA met / sent", "SLA met (completed only)",
            "SLA violations by cause"]
    for c in cols:
        left = c in ("tenant", "SLA violations by cause")
        t.add_column(c, justify="left" if left else "right", overflow="fold")

    def s(x: float | None) -> str:
        return "-" if x is None else f"{x:.2f}"

    def pct(x: float | None) -> str:
        return "-" if x is None else f"{100 * x:.1f}%"

    for name, r in summary["tenants"].items():
        causes = ", ".join(f"{k} {v}" for k, v in sorted(r["sla_violations"].items())) or "none"
        met = f"{r['met_sla']}/{r['sent']} ({pct(r['sla_attainment'])})" if r["sent"] else "-"
        done = (f"{r['met_sla']}/{r['completed']} ({pct(r['sla_attainment_completed'])})"
                if r["completed"] else "-")
        t.add_row(name, str(r["sent"]), str(r["accepted"]), str(r["queued"]), str(r["rejected"]),
                  str(r["timed_out"]), str(r["completed"]), s(r["p50_s"]), s(r["p95_s"]),
                  s(r["p99_s"]), met, done, causes)
    return t
