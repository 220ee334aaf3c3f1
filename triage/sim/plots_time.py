"""The report's figures over time, on the scenario's own clock: queue and utilization,
shares of service with the fair share, refusals by reason, SLA per tenant.

The x axis reads in the scenario's clock: the time of day where a workload follows a
daily curve with a start hour (seed-morning runs 8:30 to 9:30), else seconds,
minutes or hours from the start, labelled; a daily spike is shaded in every panel.
Panels of different policies share their y axes, so heights compare at a glance.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter, MultipleLocator

from triage.sim.arrivals import Daily
from triage.sim.compare import Comparison
from triage.sim.errors import TraceError
from triage.sim.fairshare import fair_allocations
from triage.sim.plots import _COLORS, line_styles, save, tenants_of
from triage.sim.scenario import Scenario
from triage.sim.trace import TraceSource

MAX_BINS = 120  # slots are merged (summed) down to about this many per panel
SPIKE_COLOR = "goldenrod"
_TICK_MINUTES = (1, 2, 5, 10, 15, 30, 60, 120, 180, 360)


@dataclass(frozen=True, slots=True)
class Clock:
    """Maps simulation seconds to the x axis."""

    label: str
    per_unit_s: float  # simulation seconds per x unit
    origin: float = 0.0  # x of t = 0 (the start hour, on a time-of-day clock)
    time_of_day: bool = False
    spikes: list[tuple[float, float, str]] = field(default_factory=list)  # (t0, t1, label)

    def x(self, t: float) -> float:
        return self.origin + t / self.per_unit_s

    def xs(self, ts: list[float]) -> list[float]:
        return [self.x(t) for t in ts]

    def apply(self, ax: Axes, *, label: bool) -> None:
        """Format the x axis (round times of day), shade the spikes."""
        if self.time_of_day:
            lo, hi = ax.get_xlim()
            minutes = next((m for m in _TICK_MINUTES if (hi - lo) * 60.0 / m <= 8), 360)
            ax.xaxis.set_major_locator(MultipleLocator(minutes / 60.0))
            ax.xaxis.set_major_formatter(FuncFormatter(_hhmm))
        for t0, t1, _text in self.spikes:
            ax.axvspan(self.x(t0), self.x(t1), color=SPIKE_COLOR, alpha=0.15, zorder=0)
        if label:
            ax.set_xlabel(self.label, fontsize=8)


def _hhmm(x: float, _pos: object = None) -> str:
    minutes = round(x * 60.0) % (24 * 60)
    return f"{minutes // 60:02d}:{minutes % 60:02d}"


def clock(scenario: Scenario, span_s: float) -> Clock:
    """The scenario's clock: time of day from a daily workload's start hour, else
    elapsed time in a unit that suits `span_s`."""
    daily = [(w.tenant, w.arrivals) for w in scenario.workloads if isinstance(w.arrivals, Daily)]
    spikes: list[tuple[float, float, str]] = []
    for tenant, d in daily:
        if d.spike_rate <= 0:
            continue
        t0 = ((d.spike_hour - d.start_hour) % 24.0) * d.day_s / 24.0
        while t0 < span_s:
            spikes.append((t0, t0 + d.spike_h * d.day_s / 24.0, f"{tenant} spike"))
            t0 += d.day_s
    if daily and any(d.start_hour for _, d in daily):
        d = next(d for _, d in daily if d.start_hour)
        return Clock("time of day (scenario clock)", d.day_s / 24.0, d.start_hour, True, spikes)
    wall = _trace_clock(scenario, spikes)
    if wall is not None:
        return wall
    if span_s <= 900:
        return Clock("seconds from start", 1.0, spikes=spikes)
    if span_s <= 3 * 3600:
        return Clock("minutes from start", 60.0, spikes=spikes)
    return Clock("hours from start", 3600.0, spikes=spikes)


def _trace_clock(scenario: Scenario, spikes: list[tuple[float, float, str]]) -> Clock | None:
    """Time of day in the traces' own clock, where their timestamps are wall-clock
    times (ISO, or epoch values after 2001) and they replay at one speed."""
    speeds = {t.speed for t in scenario.traces}
    if len(speeds) != 1:
        return None
    try:
        first = min(
            TraceSource(t.path, t.columns, config=scenario.config, speed=t.speed).first_timestamp()
            for t in scenario.traces
        )
    except (TraceError, OSError, ValueError):
        return None
    if first < 1e9:  # relative seconds, not a wall clock
        return None
    speed = speeds.pop()
    label = "time of day in the trace" + (f" (replayed at {speed:g}x)" if speed != 1 else "")
    return Clock(label, 3600.0 / speed, (first % 86400.0) / 3600.0, True, spikes)


def _clock(cmp: Comparison) -> Clock:
    span = max((r.makespan_s for r in cmp.results.values()), default=0.0)
    return clock(cmp.scenario, cmp.scenario.expected_duration() or span)


def rebin(values: list[float], k: int) -> list[float]:
    """Sums of k adjacent slots."""
    return [sum(values[i:i + k]) for i in range(0, len(values), k)]


def _bins(n: int) -> int:
    return max(1, math.ceil(n / MAX_BINS))


def _legend(ax: Axes, ck: Clock, **kw: Any) -> None:
    """The axes' legend, plus the spike's shading where there is one."""
    handles, labels = ax.get_legend_handles_labels()
    if ck.spikes:
        handles.append(Patch(color=SPIKE_COLOR, alpha=0.15))
        labels.append(ck.spikes[0][2])
    ax.legend(handles, labels, **kw)


def timelines(cmp: Comparison, path: Path) -> Path:
    """Per policy: queue depths (left) and KV / busy fractions with the hysteresis
    thresholds and tightened periods (right); y axes shared across policies, KV
    above 1.0 (engine overcommit) shown, not clipped."""
    n = len(cmp.results)
    ck = _clock(cmp)
    fig = Figure(figsize=(13.0, 2.3 * n + 1.0), layout="constrained")
    axes = fig.subplots(n, 2, squeeze=False, sharex=True, sharey="col")
    top = 1.1
    for k, (policy, r) in enumerate(cmp.results.items()):
        s = r.series
        t = ck.xs(s.times())
        qa, ua = axes[k][0], axes[k][1]
        for pool in r.pools:
            qa.plot(t, s.gauge(f"queue:{pool}"), label=f"{pool}: front-door queue",
                    color="tab:blue")
            qa.plot(t, s.gauge(f"engine_queue:{pool}"), label=f"{pool}: engine queue",
                    linestyle="--", color="tab:orange")
            kv_r, kv_u = s.gauge(f"kv_reserved:{pool}"), s.gauge(f"kv_used:{pool}")
            top = max([top, *(v + 0.05 for v in kv_r + kv_u if v == v)])
            ua.plot(t, kv_r, label=f"{pool}: KV reserved (ledger)", color="tab:purple")
            ua.plot(t, kv_u, label=f"{pool}: KV used (engine)", linestyle="--",
                    color="tab:green")
            ua.plot(t, s.gauge(f"busy:{pool}"), label=f"{pool}: busy (any kernel)",
                    alpha=0.5, linewidth=0.8, color="tab:gray")
            tight = s.gauge(f"tightened:{pool}")
            ua.fill_between(t, 0, 1, where=[v == v and v > 0.5 for v in tight],
                            color="tab:red", alpha=0.12, step="post",
                            transform=ua.get_xaxis_transform(), label="tightened")
            p = r.pools[pool]
            ua.axhline(p["hysteresis_high"], color="tab:red", linestyle=":", linewidth=1)
            ua.axhline(p["hysteresis_low"], color="tab:orange", linestyle=":", linewidth=1)
            ua.axhline(1.0, color="black", linewidth=0.6, alpha=0.5)
        qa.set_ylabel(f"{policy}\nrequests", fontsize=8)
        ua.set_ylabel("fraction", fontsize=8)
        for ax in (qa, ua):
            ax.grid(True, alpha=0.3)
            ck.apply(ax, label=k == n - 1)
        if k == 0:
            qa.set_title("queue depth (shared y axis)", fontsize=10)
            ua.set_title("KV and busy fraction (dotted: hysteresis low / high; above 1: "
                         "engine overcommit)", fontsize=10)
            _legend(qa, ck, fontsize=7, loc="upper left")
            ua.legend(fontsize=7, loc="upper left", ncol=2)
    ua = axes[0][1]
    if top > 1.5:  # engine overcommit: linear up to 1, logarithmic above, so both read
        ua.set_yscale("function", functions=(_lin_log, _lin_log_inv))
        ticks = [0.0, 0.25, 0.5, 0.75, 1.0]
        while ticks[-1] * 2 <= top * 1.2:
            ticks.append(ticks[-1] * 2)
        ua.set_yticks(ticks, [f"{v:g}" for v in ticks])
        for row in axes:
            row[1].set_ylabel("fraction (log above 1)", fontsize=8)
    ua.set_ylim(0, top)
    return save(fig, path)


def _lin_log(y: Any) -> Any:
    y = np.asarray(y, dtype=float)
    return np.where(y <= 1.0, y, 1.0 + np.log2(np.maximum(y, 1.0)))


def _lin_log_inv(v: Any) -> Any:
    v = np.asarray(v, dtype=float)
    return np.where(v <= 1.0, v, np.exp2(np.maximum(v, 1.0) - 1.0))


def shares(cmp: Comparison, path: Path) -> Path:
    """Per policy: each tenant's share of the tokens served over time (stacked), with
    the weighted max-min fair share (dashed boundaries) it would get."""
    tenants = tenants_of(cmp)
    weights = {t.name: t.weight for t in cmp.scenario.config.tenants}
    rates = {t.name: t.rate_tokens_per_s for t in cmp.scenario.config.tenants}
    n = len(cmp.results)
    ck = _clock(cmp)
    fig = Figure(figsize=(12.0, 1.9 * n + 1.0), layout="constrained")
    axes = fig.subplots(n, 1, squeeze=False, sharex=True)
    for k, (policy, r) in enumerate(cmp.results.items()):
        s = r.series
        kb = _bins(s.n)
        t = ck.xs(s.times()[::kb])
        served = [rebin(s.counter("served:" + name), kb) for name in tenants]
        alloc, _ = fair_allocations(s, weights, rates)
        fair = [rebin(alloc[name], kb) for name in tenants]
        ax = axes[k][0]
        if t:
            ax.stackplot(t, _fractions(served), labels=tenants, step="post",
                         colors=_COLORS[:len(tenants)], alpha=0.8)
            acc = [0.0] * len(t)
            for j, row in enumerate(_fractions(fair)[:-1]):
                acc = [a + v for a, v in zip(acc, row, strict=True)]
                ax.step(t, acc, where="post", color="black", linestyle="--", linewidth=1.0,
                        label="fair share" if j == 0 else None)
        ax.set_ylim(0, 1)
        ax.set_ylabel(f"{policy}\nshare", fontsize=8)
        ck.apply(ax, label=k == n - 1)
        if k == 0:
            ax.set_title("share of served tokens per tenant; dashed: weighted max-min fair "
                         "share of the same total (demand capped at the contract)", fontsize=10)
            ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    return save(fig, path)


def _fractions(rows: list[list[float]]) -> list[list[float]]:
    totals = [sum(col) for col in zip(*rows, strict=True)]
    return [[v / tot if tot > 0 else 0.0 for v, tot in zip(row, totals, strict=True)]
            for row in rows]


def refusals(cmp: Comparison, path: Path) -> Path:
    """Per policy: refusals and timeouts per second over time, stacked by reason
    (same colours and y axis in every panel)."""
    n = len(cmp.results)
    ck = _clock(cmp)
    reasons = sorted({name.split(":", 1)[1] for r in cmp.results.values()
                      for name in r.series.counters if name.startswith("refused:")})
    colors = {reason: _COLORS[i % len(_COLORS)] for i, reason in enumerate(reasons)}
    fig = Figure(figsize=(12.0, 1.9 * n + 1.0), layout="constrained")
    axes = fig.subplots(n, 1, squeeze=False, sharex=True, sharey=True)
    for k, (policy, r) in enumerate(cmp.results.items()):
        s = r.series
        kb = _bins(s.n)
        t = ck.xs(s.times()[::kb])
        ax = axes[k][0]
        mine = [x for x in reasons if ("refused:" + x) in s.counters]
        if mine and t:
            per_s = kb * s.interval
            ax.stackplot(t, [[v / per_s for v in rebin(s.counter("refused:" + x), kb)]
                             for x in mine],
                         labels=mine, colors=[colors[x] for x in mine], step="post")
        else:
            ax.text(0.5, 0.5, "no refusals, no timeouts", ha="center", va="center",
                    transform=ax.transAxes, fontsize=8)
        ax.set_ylabel(f"{policy}\nper s", fontsize=8)
        ax.grid(True, alpha=0.3)
        ck.apply(ax, label=k == n - 1)
        if k == 0:
            ax.set_title("refusals and timeouts per second, by reason", fontsize=10)
    if reasons:
        handles = [Patch(color=colors[x]) for x in reasons]
        fig.legend(handles, reasons, loc="outside right upper", fontsize=7, title="reason",
                   title_fontsize=7)
    return save(fig, path)


def sla_over_time(cmp: Comparison, path: Path) -> Path:
    """Per tenant: SLA attainment of the requests that arrived in each interval (refusals
    count as misses), one line per policy."""
    tenants = tenants_of(cmp)
    styles = line_styles(cmp.policies)
    ck = _clock(cmp)
    cols = 2 if len(tenants) > 6 else 1
    rows = math.ceil(len(tenants) / cols)
    fig = Figure(figsize=(12.0 if cols == 1 else 16.0, 2.2 * rows + 1.0), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False, sharex=True, sharey=True)
    for k in range(len(tenants), rows * cols):
        axes[k // cols][k % cols].set_visible(False)
    for k, tenant in enumerate(tenants):
        ax = axes[k // cols][k % cols]
        for policy, r in cmp.results.items():
            s = r.series
            kb = _bins(s.n)
            arrived = rebin(s.counter("arrived:" + tenant), kb)
            met = rebin(s.counter("met:" + tenant), kb)
            ys = [m / a if a > 0 else math.nan for m, a in zip(met, arrived, strict=True)]
            ax.step(ck.xs(s.times()[::kb]), ys, where="post", label=policy, **styles[policy])
        ax.set_ylim(0, 1.05)
        ax.set_ylabel(f"{tenant}\nSLA met", fontsize=8)
        ax.grid(True, alpha=0.3)
        if k >= len(tenants) - cols:  # the last of its column: its own tick labels
            ax.tick_params(labelbottom=True)
        ck.apply(ax, label=k >= len(tenants) - cols)
        if k == 0:
            ax.set_title("SLA attainment by arrival time (met / arrived in each interval)",
                         fontsize=10)
    handles, labels = axes[0][0].get_legend_handles_labels()
    if ck.spikes:
        handles.append(Patch(color=SPIKE_COLOR, alpha=0.15))
        labels.append(ck.spikes[0][2])
    fig.legend(handles, labels, loc="outside right upper", fontsize=8, title="policy",
               title_fontsize=7)
    return save(fig, path)
