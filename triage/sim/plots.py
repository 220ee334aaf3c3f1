"""The report's figures, drawn with matplotlib's object API (Agg, no pyplot state),
so reports can be written from tests, worker processes and headless CI alike.
"""

from __future__ import annotations

import math
from pathlib import Path

from matplotlib.figure import Figure

from triage.sim.compare import Comparison
from triage.sim.result import SimResult

DPI = 110


def _pools(r: SimResult) -> list[str]:
    return list(r.pools)


def latency_cdf(cmp: Comparison, path: Path) -> Path:
    """Latency CDF per tenant (one panel each), one line per policy, SLA marked."""
    tenants = [t.name for t in cmp.scenario.config.tenants]
    sla = {t.name: t.sla_ms / 1000.0 for t in cmp.scenario.config.tenants}
    cols = min(3, len(tenants))
    rows = math.ceil(len(tenants) / cols)
    fig = Figure(figsize=(5.0 * cols, 3.6 * rows))
    axes = fig.subplots(rows, cols, squeeze=False)
    for k, tenant in enumerate(tenants):
        ax = axes[k // cols][k % cols]
        for policy, r in cmp.results.items():
            xs, ys = r.latency[tenant].cdf()
            if xs:
                ax.step(xs, ys, where="post", label=policy, linewidth=1.2)
        ax.axvline(sla[tenant], color="black", linestyle=":", linewidth=1, label="SLA")
        ax.set_xscale("log")
        ax.set_ylim(0, 1.01)
        ax.set_title(f"{tenant}: latency of completed requests")
        ax.set_xlabel("seconds (arrival to completion)")
        ax.set_ylabel("fraction")
        ax.grid(True, which="both", alpha=0.3)
    for k in range(len(tenants), rows * cols):
        axes[k // cols][k % cols].set_visible(False)
    axes[0][0].legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    return path


def sla_goodput(cmp: Comparison, path: Path) -> Path:
    """SLA attainment per policy (overall and per tenant) and goodput per policy."""
    policies = cmp.policies
    tenants = [t.name for t in cmp.scenario.config.tenants]
    fig = Figure(figsize=(max(8.0, 1.3 * len(policies) + 4), 4.2))
    ax1, ax2 = fig.subplots(1, 2, gridspec_kw={"width_ratios": [2, 1]})
    groups = ["all", *tenants]
    width = 0.8 / len(groups)
    for j, g in enumerate(groups):
        vals = []
        for p in policies:
            r = cmp.results[p]
            row = r.overall if g == "all" else r.tenants[g]
            vals.append(row.get("sla_attainment") or 0.0)
        xs = [i + (j - (len(groups) - 1) / 2) * width for i in range(len(policies))]
        ax1.bar(xs, vals, width=width, label=g)
    ax1.set_xticks(range(len(policies)), policies, rotation=30, ha="right", fontsize=8)
    ax1.set_ylim(0, 1.05)
    ax1.set_ylabel("SLA attainment (met / arrived)")
    ax1.legend(fontsize=7, ncol=len(groups))
    ax1.grid(True, axis="y", alpha=0.3)
    good = [cmp.results[p].overall["goodput_tokens_per_gpu_s"] for p in policies]
    ax2.bar(range(len(policies)), good, color="tab:green")
    ax2.set_xticks(range(len(policies)), policies, rotation=30, ha="right", fontsize=8)
    ax2.set_ylabel("goodput (tokens in SLA / GPU-s)")
    ax2.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    return path


def timelines(cmp: Comparison, path: Path) -> Path:
    """Per policy: queue depths (left) and utilization with the hysteresis
    thresholds and tightened periods (right)."""
    n = len(cmp.results)
    fig = Figure(figsize=(12.0, 2.4 * n + 0.6))
    axes = fig.subplots(n, 2, squeeze=False, sharex=True)
    for k, (policy, r) in enumerate(cmp.results.items()):
        s = r.series
        t = [x / 60.0 for x in s.times()]
        qa, ua = axes[k][0], axes[k][1]
        for pool in _pools(r):
            qa.plot(t, s.gauge(f"queue:{pool}"), label=f"{pool}: front-door queue")
            qa.plot(t, s.gauge(f"engine_queue:{pool}"), label=f"{pool}: engine queue",
                    linestyle="--")
            ua.plot(t, s.gauge(f"kv_reserved:{pool}"), label=f"{pool}: KV reserved (ledger)")
            ua.plot(t, s.gauge(f"kv_used:{pool}"), label=f"{pool}: KV used (engine)",
                    linestyle="--")
            ua.plot(t, s.gauge(f"busy:{pool}"), label=f"{pool}: busy", alpha=0.5,
                    linewidth=0.8)
            tight = s.gauge(f"tightened:{pool}")
            ua.fill_between(t, 0, 1, where=[v == v and v > 0.5 for v in tight],
                            color="tab:red", alpha=0.12, step="post",
                            transform=ua.get_xaxis_transform(), label="tightened")
            p = r.pools[pool]
            ua.axhline(p["hysteresis_high"], color="tab:red", linestyle=":", linewidth=1)
            ua.axhline(p["hysteresis_low"], color="tab:orange", linestyle=":", linewidth=1)
        qa.set_ylabel(f"{policy}\nrequests", fontsize=8)
        ua.set_ylabel("fraction", fontsize=8)
        ua.set_ylim(0, 1.1)
        qa.grid(True, alpha=0.3)
        ua.grid(True, alpha=0.3)
        if k == 0:
            qa.set_title("queue depth")
            ua.set_title("utilization (dotted: hysteresis low / high)")
            qa.legend(fontsize=7, loc="upper left")
            ua.legend(fontsize=7, loc="upper left", ncol=2)
    axes[-1][0].set_xlabel("minutes")
    axes[-1][1].set_xlabel("minutes")
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    return path


def shares(cmp: Comparison, path: Path) -> Path:
    """Per policy: each tenant's share of the tokens served, over time (stacked)."""
    tenants = [t.name for t in cmp.scenario.config.tenants]
    n = len(cmp.results)
    fig = Figure(figsize=(10.0, 1.9 * n + 0.6))
    axes = fig.subplots(n, 1, squeeze=False, sharex=True)
    for k, (policy, r) in enumerate(cmp.results.items()):
        s = r.series
        t = [x / 60.0 for x in s.times()]
        served = [s.counter("served:" + name) for name in tenants]
        totals = [sum(col) for col in zip(*served, strict=True)]
        fracs = [[v / tot if tot > 0 else 0.0 for v, tot in zip(row, totals, strict=True)]
                 for row in served]
        ax = axes[k][0]
        if t:
            ax.stackplot(t, fracs, labels=tenants, step="post")
        ax.set_ylim(0, 1)
        ax.set_ylabel(f"{policy}\nshare", fontsize=8)
        if k == 0:
            ax.set_title("share of served tokens per tenant")
            ax.legend(fontsize=7, loc="upper left", ncol=len(tenants))
    axes[-1][0].set_xlabel("minutes")
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    return path
