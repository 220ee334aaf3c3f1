"""Fairness of a simulated run, from its time series (after the run, not on the hot path).

Weighted max-min (water-filling) per series slot. A tenant's demand in a
slot is the tokens that arrived for it, capped at its contracted rate (traffic over
quota is not owed service); where demand exceeded what the pool served, the served
tokens are the capacity to share, and each tenant's fair allocation is
min(demand, weight x level) with the level filling the capacity. Over those
contended slots, each tenant's served / allocated tokens: Jain's index over these
ratios (`fairness_jain`, all tenants), and the max gap (largest minus smallest
ratio, 0 = perfectly fair) among the tenants whose demand exceeded their
allocation (the backlogged ones).
Fairness among backlogged tenants (`fairness_jain_backlogged`, the headline): a
tenant is backlogged in a contended slot when its capped demand exceeded its fair
allocation there (it wanted more than its share). Each tenant's served / allocated
tokens summed over only the slots where it was backlogged; Jain's index over the
tenants backlogged at least once (None when fewer than two were). A tenant that
asks for less than its share is served what it asks for under any sane policy and
pulls the all-tenant index towards 1; this one compares only the tenants that
competed, as VTC's fairness does.
"""

from __future__ import annotations

from triage.sim.series import TimeSeries


def water_fill(
    demand: dict[str, float], weights: dict[str, float], capacity: float
) -> dict[str, float]:
    """Weighted max-min shares of `capacity`: min(demand, weight x level), filled."""
    alloc = dict.fromkeys(demand, 0.0)
    left = capacity
    open_ = {t for t, d in demand.items() if d > 0}
    while open_ and left > 1e-9:
        wsum = sum(weights[t] for t in open_)
        level = left / wsum
        done = {t for t in open_ if demand[t] - alloc[t] <= weights[t] * level}
        if not done:
            for t in open_:
                alloc[t] += weights[t] * level
            break
        for t in done:
            left -= demand[t] - alloc[t]
            alloc[t] = demand[t]
        open_ -= done
    return alloc


class Fairness:
    """Fairness of one run (see the module docstring): Nones when not measurable."""

    __slots__ = ("backlogged", "gap", "jain", "jain_backlogged", "ratios", "ratios_backlogged")

    def __init__(
        self, jain: float | None, gap: float | None, ratios: dict[str, float],
        jain_backlogged: float | None, ratios_backlogged: dict[str, float],
    ) -> None:
        self.jain = jain  # all tenants with an allocation in a contended slot
        self.gap = gap  # max - min whole-run ratio among the backlogged tenants
        self.ratios = ratios  # served / allocated over the contended slots
        self.jain_backlogged = jain_backlogged  # over ratios_backlogged
        self.ratios_backlogged = ratios_backlogged  # served / allocated while backlogged
        self.backlogged = sorted(ratios_backlogged)


def _jain(xs: list[float]) -> float | None:
    if len(xs) < 2:
        return None
    sq = sum(x * x for x in xs)
    return (sum(xs) ** 2) / (len(xs) * sq) if sq > 0 else 1.0


def fair_allocations(
    series: TimeSeries, weights: dict[str, float], rates: dict[str, float]
) -> tuple[dict[str, list[float]], list[bool]]:
    """Per slot, each tenant's fair allocation of what the pool served (water-filled
    over demand capped at the contract; its capped demand where the slot was not
    contended), and whether the slot was contended."""
    dt = series.interval
    demand = {t: series.counter("demand:" + t) for t in weights}
    served = {t: series.counter("served:" + t) for t in weights}
    alloc: dict[str, list[float]] = {t: [0.0] * series.n for t in weights}
    contended = [False] * series.n
    for i in range(series.n):
        want = {t: min(demand[t][i], rates[t] * dt) for t in weights}
        capacity = sum(served[t][i] for t in weights)
        if capacity > 0 and sum(want.values()) > capacity:
            contended[i] = True
            share = water_fill(want, weights, capacity)
        else:
            share = want
        for t in weights:
            alloc[t][i] = share[t]
    return alloc, contended


def fairness_detail(
    series: TimeSeries, weights: dict[str, float], rates: dict[str, float]
) -> Fairness:
    """Both fairness figures over the contended slots (see the module docstring)."""
    dt = series.interval
    demand = {t: series.counter("demand:" + t) for t in weights}
    served = {t: series.counter("served:" + t) for t in weights}
    alloc, contended = fair_allocations(series, weights, rates)
    got = dict.fromkeys(weights, 0.0)
    owed = dict.fromkeys(weights, 0.0)
    got_b = dict.fromkeys(weights, 0.0)
    owed_b = dict.fromkeys(weights, 0.0)
    for i in range(series.n):
        if not contended[i]:
            continue
        for t in weights:
            a = alloc[t][i]
            if a <= 0:
                continue
            got[t] += served[t][i]
            owed[t] += a
            if min(demand[t][i], rates[t] * dt) > a + 1e-9:  # wanted more than its share
                got_b[t] += served[t][i]
                owed_b[t] += a
    ratios = {t: got[t] / owed[t] for t in weights if owed[t] > 0}
    ratios_b = {t: got_b[t] / owed_b[t] for t in weights if owed_b[t] > 0}
    jain = _jain(list(ratios.values()))
    if jain is None:
        return Fairness(None, None, ratios, None, ratios_b)
    hungry = [ratios[t] for t in ratios_b if t in ratios]
    gap = max(hungry) - min(hungry) if len(hungry) >= 2 else 0.0
    return Fairness(jain, gap, ratios, _jain(list(ratios_b.values())), ratios_b)


def fairness(
    series: TimeSeries, weights: dict[str, float], rates: dict[str, float]
) -> tuple[float | None, float | None, dict[str, float]]:
    """(Jain's index, max gap among backlogged tenants, served/allocated per tenant)
    over the contended slots (see the module docstring); Nones when none."""
    f = fairness_detail(series, weights, rates)
    return f.jain, f.gap, f.ratios
