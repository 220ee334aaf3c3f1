"""The comparison report: Markdown with the tables and figures, plus a JSON summary.

One directory per report: report.md (open it on GitHub or any viewer), the PNGs
it embeds, summary.json (every figure of every policy, no series) and
series.json (the time series, for anyone who wants other plots).
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any

from triage.sim import plots
from triage.sim.compare import Comparison

log = logging.getLogger(__name__)

FIGURES = {
    "sla_goodput.png": ("SLA attainment and goodput", plots.sla_goodput),
    "latency_cdf.png": ("Latency CDF per tenant", plots.latency_cdf),
    "timeline.png": ("Queue depth and utilization over time", plots.timelines),
    "share.png": ("Per-tenant share of service over time", plots.shares),
}


def _pct(v: Any) -> str:
    return "n/a" if v is None else f"{100.0 * v:.1f}%"


def _num(v: Any, digits: int = 2) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "n/a"
    if isinstance(v, float) and math.isinf(v):
        return "inf"
    if isinstance(v, int):
        return f"{v:,}"
    return f"{v:,.{digits}f}"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return out


def markdown(cmp: Comparison, figures: list[str]) -> str:
    s = cmp.scenario
    cfg = s.config
    lines = [f"# Simulation report: {s.name}", ""]
    if s.description:
        lines += [s.description, ""]
    gpus = ", ".join(f"{p.name}: {len(p.gpus)} x {p.gpu_type}" for p in cfg.pools)
    first = next(iter(cmp.results.values()), None)
    lines += [
        f"- seed {s.seed}, GPU timing noise {s.gpu_noise}, arrivals for "
        f"{_num(s.expected_duration() or 0.0, 0)} s, pools {gpus}",
        f"- {first.arrivals:,} requests, the same for every policy" if first else "",
        f"- policies: {', '.join(cmp.policies)}",
        "",
        "## Overall",
        "",
    ]
    rows = []
    for p, r in cmp.results.items():
        o = r.overall
        rows.append([
            p, _pct(o["sla_attainment"]), _num(o["goodput_tokens_per_gpu_s"], 0),
            _pct(o["acceptance"]), _pct(o["timeout_rate"]), _num(o["latency_s"]["p50"]),
            _num(o["latency_s"]["p99"]), _num(o["queue_wait_s"]["p99"]),
            _pct(o["preemption_rate"]),
            _num(o["recompute_tokens_core"] + o["recompute_tokens_engine"]),
            _pct(o["gpu_utilization"]), _num(o["fairness_jain"]), _num(o["fairness_max_gap"]),
        ])
    lines += _table(
        ["policy", "SLA met", "goodput tok/GPU-s", "accepted", "timed out", "p50 s", "p99 s",
         "p99 wait s", "preempt", "recomputed tok", "GPU busy", "Jain", "max gap"],
        rows,
    )
    lines += ["", "## Per tenant", ""]
    rows = []
    for t in cfg.tenants:
        for p, r in cmp.results.items():
            m = r.tenants[t.name]
            refused = ", ".join(
                f"{k} {v:,}" for k, v in sorted(m["rejected_by_reason"].items(),
                                                 key=lambda kv: -kv[1])[:3]
            ) or "-"
            rows.append([
                t.name, p, f"{m['requests']:,}", _pct(m["sla_attainment"]),
                _pct(m["acceptance"]), _num(m["latency_s"]["p50"]), _num(m["latency_s"]["p99"]),
                _num(m["queue_wait_s"]["p99"]), f"{m['timed_out']:,}", refused,
            ])
    lines += _table(
        ["tenant", "policy", "requests", "SLA met", "accepted", "p50 s", "p99 s",
         "p99 wait s", "timed out", "top refusals"],
        rows,
    )
    lines += ["", "## Figures", ""]
    for name in figures:
        title = FIGURES[name][0]
        lines += [f"### {title}", "", f"![{title}]({name})", ""]
    lines += [
        "## Definitions",
        "",
        "SLA met: completed within the SLA / arrived (refusals and timeouts count as misses).",
        "Goodput: prompt + output tokens of requests that met their SLA per GPU-second.",
        "p99 wait: arrival to the start of the run that completed (front-door queue and the",
        "engine's own queue). Preempt: core + engine (KV overflow) preemptions per admitted",
        "request. Jain / max gap: served over weighted max-min fair share (demand capped at",
        "the contract) in contended intervals; 1.0 / 0.0 are perfectly fair.",
        "See `triage/sim/metrics.py` for the exact definitions.",
        "",
    ]
    return "\n".join(line for line in lines if line is not None)


def write_report(cmp: Comparison, out_dir: str | Path) -> dict[str, Path]:
    """Write report.md, the figures, summary.json and series.json into out_dir."""
    d = Path(out_dir)
    d.mkdir(parents=True, exist_ok=True)
    written: dict[str, Path] = {}
    figures = []
    for name, (_title, draw) in FIGURES.items():
        written[name] = draw(cmp, d / name)
        figures.append(name)
    summary = d / "summary.json"
    summary.write_text(json.dumps(cmp.to_dict(), indent=1, default=_json_default) + "\n")
    written["summary.json"] = summary
    series = d / "series.json"
    series.write_text(json.dumps(
        {p: r.series.to_dict() for p, r in cmp.results.items()}, default=_json_default
    ) + "\n")
    written["series.json"] = series
    md = d / "report.md"
    md.write_text(markdown(cmp, figures), encoding="utf-8")
    written["report.md"] = md
    log.info("report written to %s", d)
    return written


def _json_default(o: Any) -> Any:
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serializable: {type(o).__name__}")
