"""Load as offered tokens/s over measured capacity, and the scenarios built on it
(tenants13, long-context, two-services). Reduced scales: counts, never wall time."""

from __future__ import annotations

import csv
import pickle
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest

from triage.sim import capacity
from triage.sim.capacity import at_load, measure_capacity, offered_tokens_per_s
from triage.sim.compare import compare, run_policy
from triage.sim.errors import ScenarioError
from triage.sim.paths import builtin_scenarios, resolve_path
from triage.sim.scenario import Scenario, load_scenario, merge_config, scenario_from_dict

NEW = ("tenants13", "long-context", "two-services")


@pytest.fixture(autouse=True)
def _own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test measures for itself: its own disk cache, an empty memo."""
    monkeypatch.setenv("TRIAGE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(capacity, "_MEMO", {})


def _small(name: str, k: float = 0.05) -> Scenario:
    return load_scenario(name).scaled(k)


def test_new_scenarios_are_shipped_with_a_load_and_validate() -> None:
    names = set(builtin_scenarios())
    for name in NEW:
        assert name in names
        sc = load_scenario(name)
        assert sc.load == 1.0 and sc.offered_load is None
        sc.check()
        for pct in (85, 100, 120):
            v = load_scenario(f"{name}@{pct}")
            assert v.load == pytest.approx(pct / 100) and v.name == f"{name}@{pct}"
    with pytest.raises(ScenarioError, match="percentage"):
        load_scenario("tenants13@lots")


def test_capacity_is_deterministic_cached_and_doubles_with_the_gpus() -> None:
    sc = _small("tenants13")
    first = measure_capacity(sc)
    capacity._MEMO.clear()  # from the disk cache now
    assert measure_capacity(sc) == first
    capacity._MEMO.clear()
    for p in (capacity.cache_dir() / "capacity").glob("*.json"):
        p.unlink()
    assert measure_capacity(sc) == first  # measured again: the same figure
    pools = [{"name": "shared", "gpus": [f"gpu-{i}" for i in range(8)]}]
    raw = sc.config.model_dump(mode="json")
    doubled = replace(sc, config=type(sc.config).model_validate(
        merge_config(raw, {"pools": pools})))
    ratio = measure_capacity(doubled) / first
    assert 1.8 < ratio < 2.2, ratio
    assert replace(sc, capacity_tokens_per_s=1234.0).capacity_tokens_per_s == 1234.0
    assert measure_capacity(replace(sc, capacity_tokens_per_s=1234.0)) == 1234.0


@pytest.mark.parametrize("name", NEW)
def test_load_scaling_hits_the_offered_load_on_the_generated_arrivals(name: str) -> None:
    sc = _small(name, 0.1 if name == "long-context" else 0.05)
    cap = measure_capacity(sc)
    for rho in (0.85, 1.0, 1.2):
        at = at_load(sc, rho)
        assert at.capacity_tokens_per_s == cap and at.load == rho
        # counted again here, independently, over the run's own arrivals
        window = at.expected_duration()
        assert window
        tokens = sum(a.prompt_tokens + a.output_tokens for a in at.arrivals())
        assert tokens / window / cap == pytest.approx(rho, rel=0.03)
        assert at.offered_load == pytest.approx(tokens / window / cap)
    lo, hi = at_load(sc, 0.85), at_load(sc, 1.2)
    assert hi.rate_scale > lo.rate_scale  # more load: higher rates (or a faster trace)


def test_the_result_carries_the_offered_load() -> None:
    sc = replace(_small("tenants13", 0.03), load=1.2)
    r = run_policy(sc, "admit_all")
    assert r.offered_load == pytest.approx(1.2, rel=0.03)
    assert r.capacity_tokens_per_s and r.to_dict()["offered_load"] == r.offered_load
    cmp = compare(replace(sc, load=0.85), ["admit_all"])
    assert cmp["admit_all"].offered_load == pytest.approx(0.85, rel=0.03)
    assert cmp.to_dict()["scenario"]["offered_load"] == cmp["admit_all"].offered_load
    plain = compare(replace(sc, load=None), ["admit_all"], measure_load=True)
    assert plain["admit_all"].offered_load is not None  # rates as written, measured


def test_the_on_off_tenant_alternates_twice_its_quota_and_nothing() -> None:
    sc = load_scenario("tenants13")
    quota = sc.config.tenant("burst")
    assert quota is not None
    (w,) = [w for w in sc.workloads if w.tenant == "burst"]
    only = replace(sc, workloads=(w,))
    window = 600.0
    tokens: Counter[int] = Counter()
    for a in only.arrivals():
        tokens[int(a.t // window)] += a.prompt_tokens + a.output_tokens
    assert sc.duration_s is not None
    n = int(sc.duration_s // window)
    ratios = [tokens[i] / window / quota.rate_tokens_per_s for i in range(n)]
    assert all(r == pytest.approx(2.0, rel=0.12) for r in ratios[0::2]), ratios  # on
    assert all(r < 0.02 for r in ratios[1::2]), ratios  # off: ~0
    # and the other tenants' contracts never bind: >= 2.5 x what they send at 120%
    for t in sc.config.tenants:
        if t.name == "burst":
            continue
        (wt,) = [x for x in sc.workloads if x.tenant == t.name]
        sent = offered_tokens_per_s(replace(sc, workloads=(wt,)))
        assert t.rate_tokens_per_s >= 2.5 * 1.2 * sent, t.name


def test_tenants13_shape() -> None:
    sc = _small("tenants13", 0.1)
    n: Counter[str] = Counter()
    long_prompts = 0
    for a in sc.arrivals():
        n[a.tenant] += 1
        long_prompts += a.prompt_tokens >= 8000
    total = sum(n.values())
    assert len(sc.config.tenants) == 13 and set(n) == {t.name for t in sc.config.tenants}
    assert 0.45 < n["assistant"] / total < 0.51
    slas = {t.name: t.sla_ms for t in sc.config.tenants}
    assert set(slas.values()) == {10_000, 60_000}
    assert long_prompts > 0.02 * total


def test_long_context_has_prompts_past_64k_and_nothing_clamped() -> None:
    sc = _small("long-context", 0.25)
    (model,) = sc.config.models
    assert model.context_tokens >= 131072 and len(sc.config.all_gpus()) == 8
    invalid: dict[str, dict[str, int]] = {}
    prompts = [a.prompt_tokens for a in sc.arrivals(invalid)]
    assert invalid == {}  # no request refused as context_overflow
    assert sum(p > 64_000 for p in prompts) >= 10 and max(prompts) > 100_000
    assert sorted(prompts)[len(prompts) // 2] < 20_000  # a heavy tail, not a long median
    # the same traffic on the 8B's 32k context: refused as the live app would, counted
    short = replace(sc, config=sc.config.model_copy(update={
        "models": [model.model_copy(update={"context_tokens": 32768})]}))
    short_invalid: dict[str, dict[str, int]] = {}
    kept = sum(1 for _ in short.arrivals(short_invalid))
    refused = sum(by["context_overflow"] for by in short_invalid.values())
    assert refused > 0 and kept + refused == len(prompts)


def test_two_services_tenants_are_the_traces_two_services() -> None:
    sc = load_scenario("two-services")
    code = next(t for t in sc.traces if "code" in t.path.name)
    rows = {}
    for svc in ("code", "conv"):
        path = resolve_path(f"traces/azure2023/azure2023_{svc}.csv")
        with path.open(newline="") as f:
            rows[svc] = [(int(r["ContextTokens"]), int(r["GeneratedTokens"]))
                         for r in csv.DictReader(f)]
    got: dict[str, list[int]] = {"code": [], "conv": []}
    for a in sc.arrivals():
        got[a.tenant].append(a.prompt_tokens)
    assert {t.name for t in sc.config.tenants} == {"code", "conv"} and code.columns
    for svc in ("code", "conv"):
        assert len(got[svc]) == len(rows[svc])
        assert sum(got[svc]) == sum(max(1, p) for p, _ in rows[svc])
    tight, loose = sc.config.tenant("code"), sc.config.tenant("conv")
    assert tight is not None and loose is not None
    assert tight.sla_ms * 5 <= loose.sla_ms and tight.weight > loose.weight
    assert len(sc.config.all_gpus()) == 1
    faster = at_load(replace(sc.scaled(0.1), load=None), 1.2)
    assert faster.traces[0].speed > 1.0  # load on a trace: its clock runs faster


def test_scenarios_and_results_pickle_for_worker_processes() -> None:
    for name in builtin_scenarios():
        sc = load_scenario(name).scaled(0.02)
        back = pickle.loads(pickle.dumps(sc))
        a = [x.astuple() for _, x in zip(range(300), sc.arrivals(), strict=False)]
        b = [x.astuple() for _, x in zip(range(300), back.arrivals(), strict=False)]
        assert a == b and a, name
    r = run_policy(_small("tenants13", 0.02), "admit_all")
    back = pickle.loads(pickle.dumps(r))
    assert back.to_dict(series=True) == r.to_dict(series=True)


def _w(arrivals: dict[str, object], **kw: object) -> dict[str, object]:
    return {"tenant": "burst", "model": "llama-3.1-8b", "arrivals": arrivals, **kw}


@pytest.mark.parametrize(("patch", "field"), [
    ({"duration_s": -5}, "duration_s"),
    ({"duration_s": "long"}, "duration_s"),
    ({"seed": 1.5}, "seed"),
    ({"gpu_noise": -0.1}, "gpu_noise"),
    ({"sample_s": 0}, "sample_s"),
    ({"max_num_seqs": 0}, "max_num_seqs"),
    ({"drain_limit_s": -1}, "drain_limit_s"),
    ({"load": 0}, "load"),
    ({"capacity_tokens_per_s": -3}, "capacity_tokens_per_s"),
    ({"policies": "full"}, "policies"),
    ({"policy_variants": {"x": 3}}, "policy_variants"),
    ({"workloads": [_w({"process": "onoff", "on_rate": 1, "on_s": -600, "off_s": 600})]},
     "on_s"),
    ({"workloads": [_w({"process": "poisson", "rate": "fast"})]}, "rate"),
    ({"workloads": [_w({"process": "steady", "rate": 1, "jitter": 2})]}, "jitter"),
    ({"workloads": [_w({"process": "poisson", "rate": 1}, sla_ms=0)]}, "sla_ms"),
    ({"workloads": [_w({"process": "poisson", "rate": 1}, max_cap=0.5)]}, "max_cap"),
    ({"workloads": [_w({"process": "poisson", "rate": 1}, prompt={"dist": "lognormal",
                                                                  "median": -3})]}, "median"),
])
def test_every_scenario_field_is_checked(patch: dict[str, object], field: str) -> None:
    import yaml

    path = builtin_scenarios()["tenants13"]
    data = {**yaml.safe_load(path.read_text()), **patch}
    with pytest.raises(ScenarioError, match=field) as info:
        scenario_from_dict(data, source=path)
    assert "\n" not in str(info.value)


def test_trace_fields_are_checked() -> None:
    import yaml

    path = builtin_scenarios()["two-services"]
    data = yaml.safe_load(path.read_text())
    for bad, field in (({"speed": 0}, "speed"), ({"limit": -1}, "limit"),
                       ({"sped": 2}, "unknown keys")):
        t = {**data["traces"][0], **bad}
        with pytest.raises(ScenarioError, match=field):
            scenario_from_dict({**data, "traces": [t]}, source=path)
