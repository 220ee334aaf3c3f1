"""The report's metrics: weight-normalized SLA, SLA by prompt length, predictor error,
retry hints and refusals over time, fairness among backlogged tenants; each on values
built by hand, then checked against the decisions of a small simulation."""

from __future__ import annotations

import pytest

from tests.unit._sim_factory import scenario
from triage.admission.decision import ACCEPT, COMPLETE, REJECT, TIMEOUT, Decision
from triage.sim.engine import Simulator
from triage.sim.fairshare import fairness_detail
from triage.sim.histogram import LogHistogram
from triage.sim.metrics import PROMPT_LABELS, TenantStats, combine, prompt_bucket, weighted_sla
from triage.sim.series import TimeSeries


def _stats(name: str, weight: float = 1.0, series: TimeSeries | None = None) -> TenantStats:
    return TenantStats(name, weight, series or TimeSeries(interval=1.0))


def _complete(st: TenantStats, *, prompt: int, latency: float, sla: float = 4.0,
              predicted: float | None = 1.0, run: float = 1.0, arrived: float = 0.0) -> None:
    st.complete(arrived=arrived, sla_s=sla, tokens=prompt + 10, started=arrived,
                first_token=arrived, finished=arrived + latency, prompt=prompt,
                predicted_s=predicted, run_s=run)


def test_prompt_buckets_have_the_documented_edges() -> None:
    cases = {1: 0, 511: 0, 512: 1, 2047: 1, 2048: 2, 8191: 2, 8192: 3, 32767: 3, 32768: 4,
             200_000: 4}
    assert {p: prompt_bucket(p) for p in cases} == cases
    assert PROMPT_LABELS == ("<512", "512-2k", "2k-8k", "8k-32k", "32k+")


def test_weighted_sla_is_not_the_request_count_figure() -> None:
    small = _stats("small", weight=2.0)  # 10 requests, half met
    big = _stats("big", weight=1.0)  # 100 requests, all met
    idle = _stats("idle", weight=5.0)  # sent nothing: not in the average
    for i in range(10):
        small.arrive(float(i), 100, 10)
        _complete(small, prompt=100, latency=1.0 if i < 5 else 9.0)
    for i in range(100):
        big.arrive(float(i), 100, 10)
        _complete(big, prompt=100, latency=1.0)
    total = combine([small, big, idle], TimeSeries(interval=1.0))
    assert total.sla_met / total.requests == pytest.approx(105 / 110)
    assert weighted_sla([small, big, idle]) == pytest.approx((2 * 0.5 + 1 * 1.0) / 3)
    assert weighted_sla([idle]) is None


def test_sla_by_prompt_length_counts_every_arrival() -> None:
    st = _stats("a")
    for prompt in (100, 100, 100, 3000, 3000):
        st.arrive(0.0, prompt, 10)
    _complete(st, prompt=100, latency=1.0)  # met
    _complete(st, prompt=100, latency=6.0)  # late
    st.reject("tenant_quota_exceeded", 0.5, 2.0)  # a short one refused
    _complete(st, prompt=3000, latency=2.0)  # met
    st.timeout("queue_timeout", 2.0, None)  # a long one timed out
    got = st.by_prompt()
    assert set(got) == {"<512", "2k-8k"}  # empty buckets are left out
    assert got["<512"] == {"requests": 3, "completed": 2, "sla_met": 1,
                           "sla_attainment": pytest.approx(1 / 3),
                           "sla_attainment_completed": 0.5}
    assert got["2k-8k"]["sla_attainment"] == 0.5
    assert got["2k-8k"]["sla_attainment_completed"] == 1.0
    total = combine([st, _stats("b")], TimeSeries(interval=1.0)).by_prompt()
    assert total == got


def test_predictor_error_is_actual_over_predicted() -> None:
    st = _stats("a")
    _complete(st, prompt=10, latency=1.0, predicted=1.0, run=2.0)  # under-predicted: 2.0
    _complete(st, prompt=10, latency=1.0, predicted=2.0, run=1.0)  # 0.5
    _complete(st, prompt=10, latency=1.0, predicted=4.0, run=1.0)  # 0.25
    _complete(st, prompt=10, latency=1.0, predicted=None, run=1.0)  # no prediction: not counted
    e = st.predictor_summary()
    assert e["count"] == 3
    assert e["p50"] == pytest.approx(0.5, rel=0.021)
    assert e["max"] == pytest.approx(2.0)
    assert e["under_predicted"] == pytest.approx(1 / 3)
    assert st.summary(1.0)["predictor_error"]["count"] == 3


def test_refusals_keep_their_reason_time_and_hint() -> None:
    series = TimeSeries(interval=1.0)
    st = _stats("a", series=series)
    st.reject("tenant_quota_exceeded", 0.5, 3.0)
    st.reject("sla_infeasible", 2.5, None)  # final: no hint
    st.timeout("queue_timeout", 2.7, 1.0)
    assert series.counter("refused:tenant_quota_exceeded") == [1.0, 0.0, 0.0]
    assert series.counter("refused:queue_timeout") == [0.0, 0.0, 1.0]
    assert st.retry_hint.count == 2 and st.final_refusals == 1
    assert st.retry_hint.max == 3.0
    s = st.summary(1.0)
    assert s["refusals_without_hint"] == 1 and s["timed_out_by_reason"] == {"queue_timeout": 1}
    assert s["rejected_by_reason"] == {"sla_infeasible": 1, "tenant_quota_exceeded": 1}


def test_sla_over_time_is_by_arrival_slot() -> None:
    series = TimeSeries(interval=1.0)
    st = _stats("a", series=series)
    st.arrive(0.5, 100, 10)
    st.arrive(1.5, 100, 10)
    _complete(st, prompt=100, arrived=0.5, latency=3.0)  # met, finishes in slot 3
    _complete(st, prompt=100, arrived=1.5, latency=9.0)  # late
    assert series.counter("arrived:a")[:2] == [1.0, 1.0]
    assert series.counter("met:a") == [1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]


def _fair_series(slots: list[dict[str, tuple[float, float]]]) -> TimeSeries:
    """One slot per entry: tenant -> (demand, served) tokens."""
    s = TimeSeries(interval=1.0)
    for i, slot in enumerate(slots):
        for t, (demand, served) in slot.items():
            s.add("demand:" + t, i + 0.5, demand)
            s.add("served:" + t, i + 0.5, served)
    return s


def test_fairness_among_backlogged_tenants_only() -> None:
    # a and b want far more than the pool serves; c asks for little and gets it. In the
    # first ten slots a gets twice b's service; in the next ten a asks for little.
    first = {"a": (1000.0, 260.0), "b": (1000.0, 130.0), "c": (10.0, 10.0)}
    second = {"a": (10.0, 10.0), "b": (1000.0, 380.0), "c": (10.0, 10.0)}
    series = _fair_series([first] * 10 + [second] * 10)
    weights = dict.fromkeys("abc", 1.0)
    f = fairness_detail(series, weights, dict.fromkeys("abc", 1e9))
    # fair shares: 400 served -> c 10, a and b 195 each; then a 10, c 10, b 380
    a_all, b_all = (2600 + 100) / (1950 + 100), (1300 + 3800) / (1950 + 3800)
    a_back, b_back = 2600 / 1950, (1300 + 3800) / (1950 + 3800)  # a only while backlogged
    assert f.ratios == pytest.approx({"a": a_all, "b": b_all, "c": 1.0})
    assert f.ratios_backlogged == pytest.approx({"a": a_back, "b": b_back})
    assert f.backlogged == ["a", "b"]

    def jain(xs: list[float]) -> float:
        return sum(xs) ** 2 / (len(xs) * sum(x * x for x in xs))

    assert f.jain == pytest.approx(jain([a_all, b_all, 1.0]))
    assert f.jain_backlogged == pytest.approx(jain([a_back, b_back]))
    assert f.jain_backlogged < f.jain  # the satisfied tenant no longer pads the index
    one = fairness_detail(_fair_series([first]), weights, {"a": 1e9, "b": 100.0, "c": 1e9})
    assert one.backlogged == ["a"] and one.jain_backlogged is None  # nothing to compare


def test_a_small_simulation_reports_what_its_decisions_say() -> None:
    sc = scenario(duration_s=30.0, rate_a=10.0, rate_b=5.0)
    decisions: list[Decision] = []
    sim = Simulator(sc.config, list(sc.arrivals()), options=sc.options(), scenario=sc.name,
                    on_decisions=lambda ds, _now: decisions.extend(ds))
    arrivals = list(sc.arrivals())
    r = sim.run()
    o = r.overall
    # predictor error: (completion - last dispatch) / predicted_s of each completion
    dispatched: dict[str, float] = {}
    want = LogHistogram()
    met_by_bucket = [0] * len(PROMPT_LABELS)
    prompt = {f"r{i + 1}": a.prompt_tokens for i, a in enumerate(arrivals)}
    sla = {t.name: t.sla_ms / 1000 for t in sc.config.tenants}
    hints = [d.retry_after_s for d in decisions if d.outcome in (REJECT, TIMEOUT)]
    for d in decisions:
        if d.outcome is ACCEPT:
            dispatched[d.request_id] = d.at
        elif d.outcome is COMPLETE and d.predicted_s:
            want.add((d.at - dispatched[d.request_id]) / d.predicted_s)
            if d.latency_s is not None and d.latency_s <= sla[d.tenant] + 1e-9:
                met_by_bucket[prompt_bucket(prompt[d.request_id])] += 1
    assert hints and any(h is None for h in hints) is (o["refusals_without_hint"] > 0)
    assert want.count == o["predictor_error"]["count"] == o["completed"] > 0
    for q in ("p50", "p95", "p99"):
        assert o["predictor_error"][q] == pytest.approx(want.summary()[q], rel=1e-9)
    # SLA by prompt length over every arrival
    by = o["sla_by_prompt"]
    assert sum(b["requests"] for b in by.values()) == r.arrivals
    assert [by.get(label, {}).get("sla_met", 0) for label in PROMPT_LABELS] == met_by_bucket
    # retry hints and refusals over time
    assert o["retry_after_s"]["count"] == sum(h is not None for h in hints)
    assert o["refusals_without_hint"] == sum(h is None for h in hints)
    refused = sum(sum(v) for k, v in r.series.counters.items() if k.startswith("refused:"))
    assert refused == o["rejected"] + o["timed_out"] == len(hints)
    # weight-normalized SLA from the tenants' own figures and weights
    w = {t.name: t.weight for t in sc.config.tenants}
    expect = sum(w[t] * m["sla_attainment"] for t, m in r.tenants.items()) / sum(w.values())
    assert o["sla_attainment_weighted"] == pytest.approx(expect)
    assert o["sla_attainment_weighted"] != pytest.approx(o["sla_attainment"])
    # SLA over time: met and arrived by arrival slot add up to the totals
    for t, m in r.tenants.items():
        assert sum(r.series.counter("arrived:" + t)) == m["requests"]
        assert sum(r.series.counter("met:" + t)) == m["sla_met"]
