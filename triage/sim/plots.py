"""The report's figures over whole runs (bars, tails, distributions), drawn with
matplotlib's object API (Agg, no pyplot state), so reports can be written from tests,
worker processes and headless CI alike. Figures over time are in plots_time.py.

Every figure with one line per policy draws the `full` policy (or, without one, the
first) thick and black on top, and the others thinner in distinct colours and dash
patterns, with one legend outside the axes: eight overlapping lines stay readable.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from triage.sim.compare import Comparison

DPI = 110
HIGHLIGHT = "full"
MAX_BAR_TENANTS = 5  # more tenants: the SLA figure is a labelled grid instead of bars
_COLORS = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown",
           "tab:pink", "tab:olive", "tab:cyan", "tab:gray")
_DASHES = ("-", "--", "-.", ":")


def highlighted(policies: list[str]) -> str:
    """The policy drawn on top: `full` where it ran, else the first."""
    return HIGHLIGHT if HIGHLIGHT in policies else policies[0]


def line_styles(policies: list[str]) -> dict[str, dict[str, Any]]:
    """matplotlib line keywords per policy (the highlighted one thick and black)."""
    top = highlighted(policies)
    out: dict[str, dict[str, Any]] = {}
    k = 0
    for p in policies:
        if p == top:
            out[p] = {"color": "black", "linewidth": 2.4, "linestyle": "-", "zorder": 10}
            continue
        out[p] = {"color": _COLORS[k % len(_COLORS)], "linewidth": 1.2,
                  "linestyle": _DASHES[(k // 2) % len(_DASHES)], "alpha": 0.9, "zorder": 3}
        k += 1
    return out


def tenants_of(cmp: Comparison) -> list[str]:
    return [t.name for t in cmp.scenario.config.tenants]


def save(fig: Figure, path: Path) -> Path:
    fig.savefig(path, dpi=DPI)
    return path


def zoomed_floor(values: list[float]) -> float:
    """Lower y limit for bars whose differences a zero-based axis would hide: 0 unless
    the smallest is above 60% of the largest, then a round number below the smallest."""
    lo, hi = min(values), max(values)
    if hi <= 0 or lo < 0.6 * hi or hi == lo:
        return 0.0
    span = hi - lo
    step = 10 ** math.floor(math.log10(span))
    return max(0.0, float(math.floor((lo - 0.6 * span) / step) * step))


def sla_goodput(cmp: Comparison, path: Path) -> Path:
    """SLA attainment per policy (overall, weight-normalized and per tenant, labelled)
    above goodput per policy; each axis zoomed (and saying so) where a zero base would
    hide the differences."""
    policies = cmp.policies
    tenants = tenants_of(cmp)
    if len(tenants) > MAX_BAR_TENANTS:
        return _sla_grid(cmp, path)
    weights = {t.name: t.weight for t in cmp.scenario.config.tenants}
    groups = ["all", "weighted", *tenants]
    fig = Figure(figsize=(min(18.0, max(10.0, 0.3 * len(policies) * len(groups) + 3.0)), 8.0),
                 layout="constrained")
    ax1, ax2 = fig.subplots(2, 1, height_ratios=[3, 2])
    width = 0.84 / len(groups)
    every: list[float] = []
    for j, g in enumerate(groups):
        vals = []
        for p in policies:
            o = cmp.results[p].overall
            v = (o.get("sla_attainment") if g == "all" else
                 o.get("sla_attainment_weighted") if g == "weighted" else
                 cmp.results[p].tenants[g].get("sla_attainment"))
            vals.append(v or 0.0)
        every += vals
        xs = [i + (j - (len(groups) - 1) / 2) * width for i in range(len(policies))]
        label = ("all requests" if g == "all" else "weight-normalized" if g == "weighted"
                 else f"{g} (weight {weights[g]:g})")
        style: dict[str, Any] = (
            {"color": "0.25"} if g == "all" else
            {"color": "white", "edgecolor": "0.25", "hatch": "///"} if g == "weighted" else
            {"color": _COLORS[(j - 2) % len(_COLORS)]}
        )
        bars = ax1.bar(xs, vals, width=width, label=label, **style)
        ax1.bar_label(bars, labels=[f"{100 * v:.0f}" for v in vals],
                      fontsize=6 if len(groups) * len(policies) > 30 else 7, padding=1)
    floor = zoomed_floor(every) if every else 0.0
    ax1.set_ylim(floor, 1.0 + (1.0 - floor) * 0.08)
    ax1.set_xticks(range(len(policies)), policies, fontsize=8)
    ylabel = "SLA attainment (met / arrived)"
    if floor > 0:
        ylabel += f"\naxis starts at {100 * floor:.0f}%, not 0"
    ax1.set_ylabel(ylabel, fontsize=9)
    ax1.yaxis.set_major_formatter(FuncFormatter(lambda v, _p: f"{100 * v:.0f}%"))
    ax1.set_title("SLA attainment: all requests, weight-normalized, per tenant (labels in %)",
                  fontsize=10)
    ax1.grid(True, axis="y", alpha=0.3)
    ax1.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    _goodput_bars(cmp, ax2)
    return save(fig, path)


def _goodput_bars(cmp: Comparison, ax: Axes) -> None:
    policies = cmp.policies
    good = [cmp.results[p].overall["goodput_tokens_per_gpu_s"] for p in policies]
    top = highlighted(policies)
    bars = ax.bar(range(len(policies)), good, width=0.6,
                  color=["black" if p == top else "tab:green" for p in policies])
    ax.bar_label(bars, labels=[f"{v:,.0f}" for v in good], fontsize=8, padding=1)
    floor = zoomed_floor(good) if good else 0.0
    hi = max(good) if good else 1.0
    ax.set_ylim(floor, hi + (hi - floor) * 0.12 + 1e-9)
    ax.set_xticks(range(len(policies)), policies, fontsize=8, rotation=20, ha="right")
    ylabel = "goodput\n(tokens in SLA / GPU-s)"
    if floor > 0:
        ylabel += f"\naxis starts at {floor:,.0f}, not 0"
    ax.set_ylabel(ylabel, fontsize=9)
    ax.set_title(f"goodput ({top} in black)", fontsize=10)
    ax.grid(True, axis="y", alpha=0.3)


def _or_nan(v: float | None) -> float:
    return math.nan if v is None else float(v)


def _sla_grid(cmp: Comparison, path: Path) -> Path:
    """Many tenants: SLA attainment as a labelled grid (tenants x policies) above the
    goodput bars; bars for every tenant and policy would be unreadable."""
    policies = cmp.policies
    cfg = cmp.scenario.config
    rows = ["all requests", "weight-normalized",
            *(f"{t.name} (w{t.weight:g}, {t.sla_ms / 1000:g} s)" for t in cfg.tenants)]
    grid: list[list[float | None]] = []
    for p in policies:
        o = cmp.results[p].overall
        grid.append([o.get("sla_attainment"), o.get("sla_attainment_weighted"),
                     *(cmp.results[p].tenants[t.name].get("sla_attainment")
                       for t in cfg.tenants)])
    values: list[list[float]] = [
        [_or_nan(col[i]) for col in grid] for i in range(len(rows))
    ]
    fig = Figure(figsize=(max(9.0, 1.3 * len(policies) + 4.0), 0.38 * len(rows) + 5.5),
                 layout="constrained")
    ax1, ax2 = fig.subplots(2, 1, height_ratios=[0.38 * len(rows) + 0.6, 2.6])
    im = ax1.imshow(values, cmap="RdYlGn", vmin=0.5, vmax=1.0, aspect="auto")
    for i, row in enumerate(values):
        for j, v in enumerate(row):
            ax1.text(j, i, "n/a" if v != v else f"{100 * v:.1f}", ha="center", va="center",
                     fontsize=7, fontweight="bold" if i < 2 else "normal")
    ax1.set_xticks(range(len(policies)), policies, fontsize=8)
    ax1.xaxis.tick_top()
    ax1.set_yticks(range(len(rows)), rows, fontsize=8)
    ax1.axhline(1.5, color="black", linewidth=1.0)
    fig.colorbar(im, ax=ax1, label="SLA met / arrived (colour floor 50%)", shrink=0.8)
    ax1.set_title("SLA attainment (%) per tenant and policy", fontsize=10)
    _goodput_bars(cmp, ax2)
    return save(fig, path)


def _survival(cmp: Comparison, policy: str, tenant: str) -> tuple[list[float], list[float]]:
    """P(latency > x) over every arrival, refusals and timeouts as infinite latency."""
    r = cmp.results[policy]
    row = r.overall if tenant == "all" else r.tenants[tenant]
    n = row["requests"]
    xs, cum = r.latency[tenant].cdf()
    done = r.latency[tenant].count
    if not n:
        return [], []
    ys = [1.0 - c * done / n for c in cum]
    return [min(xs) if xs else 1e-3, *xs], [1.0, *ys]


def latency_cdf(cmp: Comparison, path: Path) -> Path:
    """The latency tail per tenant: 1 - CDF on log-log axes over every arrival, a
    refused or timed-out request counted as infinite latency (a curve's floor is the
    share that never completed), SLA marked."""
    tenants = ["all", *tenants_of(cmp)]
    sla = {t.name: t.sla_ms / 1000.0 for t in cmp.scenario.config.tenants}
    styles = line_styles(cmp.policies)
    cols = 2 if len(tenants) in (2, 4) else min(3, len(tenants))
    rows = math.ceil(len(tenants) / cols)
    fig = Figure(figsize=(4.8 * cols + 2.2, 3.4 * rows + 0.4), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False)
    floor = 1.0
    for k, tenant in enumerate(tenants):
        ax: Axes = axes[k // cols][k % cols]
        curves = {p: _survival(cmp, p, tenant) for p in cmp.policies}
        right = 2.0 * max((xs[-1] for xs, _ in curves.values() if xs), default=1.0)
        for policy, (xs, ys) in curves.items():
            pos = [(x, y) for x, y in zip(xs, ys, strict=True) if y > 0]
            if not pos:
                continue
            if ys[-1] > 1e-12:  # some never completed: their tail runs on to "infinity"
                pos.append((right, pos[-1][1]))
            floor = min(floor, min(y for _, y in pos))
            ax.step([x for x, _ in pos], [y for _, y in pos], where="post",
                    label=policy, **styles[policy])
        if tenant in sla:
            ax.axvline(sla[tenant], color="tab:red", linestyle=":", linewidth=1.2,
                       label="SLA")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_title(f"{tenant}: P(latency > x), refusals = infinite", fontsize=9)
        ax.set_xlabel("seconds (arrival to completion)", fontsize=8)
        ax.set_ylabel("fraction of arrivals", fontsize=8)
        ax.grid(True, which="both", alpha=0.25)
    for ax_row in axes:
        for ax in ax_row:
            ax.set_ylim(max(1e-5, floor * 0.5), 1.3)
    for k in range(len(tenants), rows * cols):
        axes[k // cols][k % cols].set_visible(False)
    handles, labels = axes[0][0].get_legend_handles_labels()
    seen = dict(zip(labels, handles, strict=True))
    for tenant_ax in axes.flat[1:]:
        for h, lab in zip(*tenant_ax.get_legend_handles_labels(), strict=True):
            seen.setdefault(lab, h)
    fig.legend(list(seen.values()), list(seen), loc="outside right upper", fontsize=8,
               title="policy (flat tail: never completed)", title_fontsize=7)
    return save(fig, path)


def retry_hints(cmp: Comparison, path: Path) -> Path:
    """The distribution of retry_after_s over refusals and timeouts, per policy, with
    the share of refusals that carried no hint (final)."""
    styles = line_styles(cmp.policies)
    fig = Figure(figsize=(11.0, 4.2), layout="constrained")
    ax, bx = fig.subplots(1, 2, width_ratios=[2, 1])
    finals = []
    for policy in cmp.policies:
        r = cmp.results[policy]
        h = r.retry_hint.get("all")
        final = r.overall.get("refusals_without_hint", 0)
        refused = r.overall["rejected"] + r.overall["timed_out"]
        finals.append(final / refused if refused else 0.0)
        if h is None or not h.count:
            continue
        xs, ys = h.cdf()
        ax.step(xs, ys, where="post", label=f"{policy} ({h.count:,} hints)", **styles[policy])
    ax.set_xscale("log")
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("retry_after_s (seconds)")
    ax.set_ylabel("fraction of hinted refusals <= x")
    ax.set_title("retry hints of refusals and timeouts (CDF)", fontsize=10)
    ax.grid(True, which="both", alpha=0.25)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    else:
        ax.text(0.5, 0.5, "no policy gave a retry hint", ha="center", transform=ax.transAxes)
    bars = bx.bar(range(len(cmp.policies)), finals, color="tab:gray")
    bx.bar_label(bars, labels=[f"{100 * v:.0f}%" for v in finals], fontsize=7)
    bx.set_xticks(range(len(cmp.policies)), cmp.policies, rotation=25, ha="right", fontsize=8)
    bx.set_ylim(0, max(0.05, 1.25 * max(finals, default=0.0)))
    bx.yaxis.set_major_formatter(FuncFormatter(lambda v, _p: f"{100 * v:.0f}%"))
    bx.set_title("refusals without a hint (final)", fontsize=10)
    bx.grid(True, axis="y", alpha=0.3)
    return save(fig, path)
