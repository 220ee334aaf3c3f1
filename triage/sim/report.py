"""The comparison report: Markdown with the tables and figures, plus a JSON summary.

One directory per report: report.md (open it on GitHub or any viewer), the PNGs
it embeds, summary.json (every figure of every policy, no series), series.json (the
time series, for anyone who wants other plots) and config.yaml (the effective
configuration). The report ends with the configuration and the command that
reproduces it.
"""

from __future__ import annotations

import importlib
import json
import logging
import math
from pathlib import Path
from typing import Any

import yaml

from triage import __version__
from triage.sim.compare import Comparison
from triage.sim.metrics import PROMPT_LABELS

log = logging.getLogger(__name__)

# file -> (title, module of triage.sim, function): the plotting modules (matplotlib, ~0.4 s)
# are imported when a report is drawn, not by every `triage` command that imports this one
FIGURES = {
    "sla_goodput.png": ("SLA attainment and goodput", "plots", "sla_goodput"),
    "latency_cdf.png": ("Latency tail per tenant (refusals as infinite latency)",
                        "plots", "latency_cdf"),
    "sla_over_time.png": ("SLA attainment per tenant over time", "plots_time",
                          "sla_over_time"),
    "timeline.png": ("Queue depth, KV and busy fraction over time", "plots_time",
                     "timelines"),
    "share.png": ("Per-tenant share of service over time, with the fair share",
                  "plots_time", "shares"),
    "refusals.png": ("Refusals and timeouts over time, by reason", "plots_time", "refusals"),
    "retry_hints.png": ("Retry hints", "plots", "retry_hints"),
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


def _section(title: str, header: list[str], rows: list[list[str]], intro: str = "") -> list[str]:
    """A Markdown section: heading, an optional sentence, a table."""
    out = [f"## {title}", ""]
    if intro:
        out += [intro, ""]
    return [*out, *_table(header, rows), ""]


def markdown(cmp: Comparison, figures: list[str], *, command: str | None = None) -> str:
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
        f"- offered load: {_load(cmp)}",
        f"- policies: {', '.join(cmp.policies)}",
        "",
    ]
    lines += _overall(cmp) + _per_tenant_sla(cmp) + _per_tenant(cmp) + _by_prompt(cmp)
    lines += _predictor(cmp) + _refusals(cmp)
    lines += ["## Figures", ""]
    for name in figures:
        title = FIGURES[name][0]
        lines += [f"### {title}", "", f"![{title}]({name})", ""]
    lines += DEFINITIONS + _reproduce(cmp, command)
    return "\n".join(lines)


def _load(cmp: Comparison) -> str:
    loads = sorted({v for v in (row["offered_load"] for row in cmp.table()) if v is not None})
    if not loads:
        return "not measured for this run (offered tokens/s over measured capacity)"
    return " / ".join(_pct(v) for v in loads) + " of capacity (offered tokens/s over capacity)"


def _overall(cmp: Comparison) -> list[str]:
    rows = []
    for p, r in cmp.results.items():
        o = r.overall
        rows.append([
            p, _pct(o["sla_attainment"]), _pct(o["sla_attainment_weighted"]),
            _pct(o["sla_attainment_completed"]), _num(o["goodput_tokens_per_gpu_s"], 0),
            _pct(o["acceptance"]), _pct(o["timeout_rate"]), _num(o["latency_s"]["p50"]),
            _num(o["latency_s"]["p99"]), _num(o["queue_wait_s"]["p99"]),
            _pct(o["preemption_rate"]),
            _num(o["recompute_tokens_core"] + o["recompute_tokens_engine"]),
            _pct(o["gpu_utilization"]), _num(o["fairness_jain_backlogged"]),
            _num(o["fairness_jain"]), _num(o["fairness_max_gap"]),
        ])
    return _section(
        "Overall",
        ["policy", "SLA met", "SLA weighted", "SLA met (completed only)", "goodput tok/GPU-s",
         "accepted", "timed out", "p50 s", "p99 s", "p99 wait s", "preempt",
         "recomputed tok", "GPU busy", "Jain (backlogged)", "Jain (all)", "max gap"],
        rows,
    )


def _per_tenant_sla(cmp: Comparison) -> list[str]:
    tenants = cmp.scenario.config.tenants
    rows = []
    for p, r in cmp.results.items():
        o = r.overall
        rows.append([p, _pct(o["sla_attainment"]), _pct(o["sla_attainment_weighted"]),
                     *(_pct(r.tenants[t.name]["sla_attainment"]) for t in tenants)])
    header = ["policy", "all requests", "weight-normalized",
              *(f"{t.name} (weight {t.weight:g}, SLA {t.sla_ms / 1000:g} s)" for t in tenants)]
    return _section(
        "SLA attainment per tenant", header, rows,
        "Met / arrived per tenant; weight-normalized = sum of weight x attainment / sum of "
        "weights.",
    )


def _per_tenant(cmp: Comparison) -> list[str]:
    rows = []
    for t in cmp.scenario.config.tenants:
        for p, r in cmp.results.items():
            m = r.tenants[t.name]
            refused = ", ".join(
                f"{k} {v:,}" for k, v in sorted(m["rejected_by_reason"].items(),
                                                 key=lambda kv: -kv[1])[:3]
            ) or "-"
            rows.append([
                t.name, p, f"{m['requests']:,}", _pct(m["sla_attainment"]),
                _pct(m["sla_attainment_completed"]), _pct(m["acceptance"]),
                _num(m["latency_s"]["p50"]), _num(m["latency_s"]["p99"]),
                _num(m["queue_wait_s"]["p99"]), f"{m['timed_out']:,}", refused,
            ])
    return _section(
        "Per tenant",
        ["tenant", "policy", "requests", "SLA met", "SLA met (completed only)", "accepted",
         "p50 s", "p99 s", "p99 wait s", "timed out", "top refusals"],
        rows,
    )


def _by_prompt(cmp: Comparison) -> list[str]:
    first = next(iter(cmp.results.values()), None)
    if first is None:
        return []
    counts = first.overall["sla_by_prompt"]
    labels = [b for b in PROMPT_LABELS if b in counts]
    rows = [[p, *(_pct(r.overall["sla_by_prompt"].get(b, {}).get("sla_attainment"))
                  for b in labels)] for p, r in cmp.results.items()]
    header = ["policy", *(f"{b} ({counts[b]['requests']:,} req)" for b in labels)]
    return _section("SLA attainment by prompt length (tokens)", header, rows)


def _predictor(cmp: Comparison) -> list[str]:
    rows = []
    for p, r in cmp.results.items():
        e = r.overall["predictor_error"]
        rows.append([p, _num(e["count"]), _num(e["p50"]), _num(e["p95"]), _num(e["p99"]),
                     _num(e["max"]), _pct(e["under_predicted"])])
    return _section(
        "Predictor error (actual / predicted execution time)",
        ["policy", "completions", "p50", "p95", "p99", "max", "under-predicted (> 1)"], rows,
        "Predicted: the dispatch decision's buffered prediction (what the SLA check used); "
        "actual: the time the GPU reported. Above 1: the check was optimistic.",
    )


def _refusals(cmp: Comparison) -> list[str]:
    rows = []
    for p, r in cmp.results.items():
        o = r.overall
        h = o["retry_after_s"]
        reasons = {**o["rejected_by_reason"], **o["timed_out_by_reason"]}
        top = ", ".join(f"{k} {v:,}" for k, v in
                        sorted(reasons.items(), key=lambda kv: -kv[1])[:4]) or "-"
        rows.append([p, _num(o["rejected"]), _num(o["timed_out"]),
                     _num(o["refusals_without_hint"]), _num(h["p50"]), _num(h["p95"]),
                     _num(h["p99"]), top])
    return _section(
        "Refusals and retry hints",
        ["policy", "refused", "timed out", "final (no hint)", "hint p50 s", "hint p95 s",
         "hint p99 s", "top reasons"], rows,
    )


DEFINITIONS = [
    "## Definitions",
    "",
    "SLA met: completed within the SLA / arrived (refusals, timeouts, failures count as",
    "misses); the completed-only figure divides by completed requests instead (a policy",
    "that refuses more looks better by it). SLA weighted: sum over tenants of weight x",
    "SLA met / sum of their weights. Goodput: prompt + output tokens of requests that met",
    "their SLA per GPU-second. p99 wait: arrival to the start of the run that completed",
    "(front-door queue and the engine's own queue). Preempt: core + engine (KV overflow)",
    "preemptions per admitted request. Jain (backlogged): Jain's index over the",
    "served / fair-share ratios of the tenants that wanted more than their weighted",
    "max-min fair share, counted in the intervals where they did (demand capped at the",
    "contract); Jain (all) and max gap: the same over all tenants in contended intervals;",
    "1.0 / 0.0 are perfectly fair. Offered load: offered tokens/s over the pool's measured",
    "capacity. See `triage/sim/metrics.py` and `triage/sim/fairshare.py` for the exact",
    "definitions.",
    "",
]


def _reproduce(cmp: Comparison, command: str | None) -> list[str]:
    s = cmp.scenario
    if command is None:
        target = str(s.source) if s.source else s.name
        command = f"triage sim {target} --policies {','.join(cmp.policies)} --seed {s.seed}"
        if s.source is None:
            command += "  # an in-code scenario: build it as its caller did"
    out = ["## Reproduce", "", f"The command (triage {__version__}):", "",
           "```bash", command, "```", ""]
    if s.source is not None and s.source.is_file():
        out += [f"Scenario file `{s.source}`:", "", "```yaml",
                s.source.read_text(encoding="utf-8").rstrip(), "```", ""]
    elif s.workloads or s.traces:
        out += ["Scenario (built in code):", ""]
        out += [f"- {w.tenant} on {w.model}: {w.arrivals!r}, prompt mean "
                f"{w.prompt.mean():,.0f}, output mean {w.output.mean():,.0f}"
                for w in s.workloads]
        out += [f"- trace {t.path} at {t.speed}x" for t in s.traces]
        out += [""]
    out += [
        f"Effective configuration (fields left at their defaults omitted; all of it in "
        f"`config.yaml`), duration {_num(s.duration_s, 0)} s, seed {s.seed}, GPU noise "
        f"{s.gpu_noise}:", "", "```yaml",
        yaml.safe_dump(s.config.model_dump(mode="json", exclude_defaults=True),
                       sort_keys=False).rstrip(),
        "```", "",
    ]
    return out


def write_report(
    cmp: Comparison, out_dir: str | Path, *, command: str | None = None
) -> dict[str, Path]:
    """Write report.md, the figures, summary.json, series.json and config.yaml into
    out_dir. `command`: the command line that produced it (the report ends with it)."""
    d = Path(out_dir)
    d.mkdir(parents=True, exist_ok=True)
    written: dict[str, Path] = {}
    figures = []
    for name, (_title, module, function) in FIGURES.items():
        draw = getattr(importlib.import_module(f"triage.sim.{module}"), function)
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
    config = d / "config.yaml"
    config.write_text(yaml.safe_dump(cmp.scenario.config.model_dump(mode="json"),
                                     sort_keys=False))
    written["config.yaml"] = config
    md = d / "report.md"
    md.write_text(markdown(cmp, figures, command=command), encoding="utf-8")
    written["report.md"] = md
    log.info("report written to %s", d)
    return written


def _json_default(o: Any) -> Any:
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serializable: {type(o).__name__}")
