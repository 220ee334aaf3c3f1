"""Scenario files: which config, which traffic, for how long, with which seed.

A scenario is YAML::

    name: seed-morning
    description: what it shows
    config: ../../examples/triage.yaml    # a path (relative to this file), or inline
    config_overrides: {pools: [{name: shared, gpus: [g0, g1, g2]}]}
    duration_s: 1800        # arrivals stop here; the run drains afterwards
    seed: 7
    gpu_noise: 0.1          # lognormal sigma of GPU timing noise
    sample_s: 5             # time-series interval of the report
    policies: [full, admit_all]           # default for `triage sim`
    policy_variants: {full-13: {preset: full, variance_buffer: 1.3}}
    workloads: [...]        # see workload.parse_workload
    traces: [{path: ..., columns: {...}, speed: 1.0}]
    load: 0.85              # scale arrival rates to 85% of measured capacity (capacity.py)
    capacity_tokens_per_s: 52000   # pin the capacity instead of measuring it

A shipped scenario's name may carry a load: `tenants13@120` is `tenants13` with
`load: 1.2`. Every field is checked on load, with one line naming the field.

Overrides merge into the config: mappings key by key, lists of named items by
name, so one field of one tenant can change without repeating the rest.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from triage.config import config_from_dict
from triage.config.errors import ConfigError
from triage.config.models import TriageConfig
from triage.sim.engine import SimOptions
from triage.sim.errors import ScenarioError, TraceError
from triage.sim.paths import builtin_scenarios, resolve_path
from triage.sim.policies import DEFAULT_POLICIES
from triage.sim.trace import ColumnMapping, TraceSource, parse_columns
from triage.sim.workload import Arrival, Workload, generate, merge_streams, parse_workload

log = logging.getLogger(__name__)

_KEYS = {
    "name", "description", "config", "config_overrides", "duration_s", "seed", "gpu_noise",
    "sample_s", "max_num_seqs", "drain_limit_s", "policies", "policy_variants", "workloads",
    "traces", "load", "capacity_tokens_per_s",
}
_TRACE_KEYS = {"path", "columns", "speed", "limit"}


@dataclass(frozen=True, slots=True)
class TraceSpec:
    """One trace file of a scenario."""

    path: Path
    columns: ColumnMapping
    speed: float = 1.0
    limit: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Scenario:
    """Everything that defines the traffic of a run (the policy is chosen apart)."""

    name: str
    config: TriageConfig
    description: str = ""
    workloads: tuple[Workload, ...] = ()
    traces: tuple[TraceSpec, ...] = ()
    duration_s: float | None = None  # None: a trace's full length
    seed: int = 0
    gpu_noise: float = 0.0
    sample_s: float | None = None  # None: duration / 300, at least 1 s
    max_num_seqs: int = 256
    drain_limit_s: float = 3600.0
    policies: tuple[str, ...] = DEFAULT_POLICIES
    policy_variants: dict[str, dict[str, Any]] = field(default_factory=dict)
    source: Path | None = None
    # load (capacity.py): the requested offered load (None: rates as written); once
    # applied, the capacity it was measured against, the achieved offered load and the
    # multiplier the rates were scaled by
    load: float | None = None
    capacity_tokens_per_s: float | None = None
    offered_load: float | None = None
    rate_scale: float = 1.0

    def arrivals(self, invalid: dict[str, dict[str, int]] | None = None) -> Iterator[Arrival]:
        """The scenario's requests, time-ordered, identical for every policy.

        A request the live app would refuse as invalid (prompt + max_tokens beyond its
        model's context: `context_overflow`) never reaches the core there, so it is not
        simulated here either; it is counted in `invalid` ({tenant: {reason: n}})."""
        contexts = {m.name: m.context_tokens for m in self.config.models}
        for a in self._arrivals():
            if a.prompt_tokens + a.max_tokens > contexts[a.model]:
                if invalid is not None:
                    by = invalid.setdefault(a.tenant, {})
                    by["context_overflow"] = by.get("context_overflow", 0) + 1
                continue
            yield a

    def _arrivals(self) -> Iterator[Arrival]:
        streams: list[Iterator[Arrival]] = []
        if self.workloads:
            if self.duration_s is None:
                raise ScenarioError(f"{self.name}: workloads need duration_s")
            streams.append(
                generate(list(self.workloads), self.config, seed=self.seed,
                         duration_s=self.duration_s)
            )
        if self.traces:
            sources = [self._source(t) for t in self.traces]
            origin = min(s.first_timestamp() for s in sources)  # one clock for all files
            streams += [s.arrivals(origin) for s in sources]
        return merge_streams(streams)

    def check(self) -> None:
        """Read each trace's first row through its mapping (columns, tenant, model), so a
        mapping error is one line before a run starts rather than in the middle of it."""
        for t in self.traces:
            try:
                first = next(iter(self._source(t).arrivals()), None)
            except TraceError as exc:
                raise ScenarioError(f"{self.name}: {exc}") from None
            if first is None:
                raise ScenarioError(f"{self.name}: {t.path}: no data rows")

    def _source(self, t: TraceSpec) -> TraceSource:
        return TraceSource(
            t.path, t.columns, config=self.config, speed=t.speed, limit=t.limit,
            duration_s=self.duration_s,
        )

    def expected_duration(self) -> float | None:
        """Virtual seconds of arrivals: the duration, or the traces' span (at their speed)
        where that is shorter and nothing else arrives."""
        spans = [trace_span(t) for t in self.traces]
        if self.duration_s is not None:
            if spans and not self.workloads:
                return min(self.duration_s, max(spans))
            return self.duration_s
        return max(spans) if spans else None

    def options(self) -> SimOptions:
        d = self.expected_duration() or 3600.0
        sample = self.sample_s if self.sample_s else max(1.0, d / 300.0)
        return SimOptions(
            seed=self.seed, gpu_noise=self.gpu_noise, sample_s=sample,
            max_num_seqs=self.max_num_seqs, drain_limit_s=self.drain_limit_s,
        )

    def with_seed(self, seed: int) -> Scenario:
        return replace(self, seed=seed)

    def scaled(self, k: float, rate: float = 1.0) -> Scenario:
        """Run k x as long with the same shape, with arrival rates x `rate`.

        k: durations and workload periods stretch by k, rates and the pool stay (so
        load and utilization stay): `--scale`. rate: every workload's rates and every
        trace's speed are multiplied by it (the offered load with them): what
        capacity.at_load uses to set `--load`."""
        if not k > 0:
            raise ScenarioError(f"scale must be positive, got {k}")
        if not rate > 0:
            raise ScenarioError(f"rate scale must be positive, got {rate}")
        duration = self.duration_s
        if duration is None and self.traces and k != 1.0:
            duration = self.expected_duration()
        return replace(
            self,
            duration_s=duration * k if duration is not None else None,
            workloads=tuple(w.scaled(k, rate) for w in self.workloads),
            traces=tuple(replace(t, speed=t.speed * rate) for t in self.traces),
            sample_s=self.sample_s * k if self.sample_s else None,
            offered_load=self.offered_load if rate == 1.0 else None,
        )


def trace_span(t: TraceSpec) -> float:
    """Seconds between a trace's first and last rows at its speed (reads only its ends)."""
    from triage.sim.trace import _clock

    with t.path.open("rb") as f:
        header = f.readline().decode().strip().split(",")
        first = f.readline().decode().strip().split(",")
        f.seek(0, 2)
        size = f.tell()
        f.seek(max(0, size - 4096))
        tail = f.read().decode(errors="replace").strip().splitlines()
    if not tail or len(first) != len(header):
        return 0.0
    last = tail[-1].split(",")
    col = {h.strip(): i for i, h in enumerate(header)}
    i = col.get(t.columns.timestamp)
    if i is None or len(last) != len(header):
        return 0.0
    clock = _clock(t.columns.time_format, first[i])
    return max(0.0, (clock(last[i]) - clock(first[i])) / t.speed)


def merge_config(base: Any, patch: Any) -> Any:
    """Deep merge for config overrides (named list items merge by name)."""
    if isinstance(base, dict) and isinstance(patch, dict):
        out = dict(base)
        for k, v in patch.items():
            out[k] = merge_config(base[k], v) if k in base else v
        return out
    if (
        isinstance(base, list) and isinstance(patch, list)
        and all(isinstance(x, dict) and "name" in x for x in base + patch)
    ):
        items = {x["name"]: x for x in base}
        for x in patch:
            items[x["name"]] = merge_config(items[x["name"]], x) if x["name"] in items else x
        return list(items.values())
    return patch


def _load_yaml(path: Path) -> Any:
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ScenarioError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise ScenarioError(f"{path}: not valid YAML: {exc}") from None


def _config(data: dict[str, Any], base: Path, where: str) -> TriageConfig:
    raw = data.get("config", "triage/examples/triage.yaml")
    if isinstance(raw, str):
        path = resolve_path(raw, base=base)
        raw = _load_yaml(path)
        where = str(path)
    if not isinstance(raw, dict):
        raise ScenarioError(f"{where}: config must be a mapping or a path")
    overrides = data.get("config_overrides")
    if overrides is not None:
        raw = merge_config(raw, overrides)
    try:
        return config_from_dict(raw, source=where)
    except ConfigError as exc:
        raise ScenarioError(str(exc)) from None


def _number(
    data: dict[str, Any], key: str, where: str, *, default: Any = None, integer: bool = False,
    minimum: float | None = None, positive: bool = False,
) -> Any:
    """data[key] checked: a finite number (an integer if asked), within its bounds."""
    v = data.get(key, default)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        raise ScenarioError(f"{where}.{key}: expected a number, got {v!r}")
    if integer and int(v) != v:
        raise ScenarioError(f"{where}.{key}: expected an integer, got {v!r}")
    if positive and v <= 0:
        raise ScenarioError(f"{where}.{key}: must be positive, got {v!r}")
    if minimum is not None and v < minimum:
        raise ScenarioError(f"{where}.{key}: must be >= {minimum:g}, got {v!r}")
    return int(v) if integer else float(v)


def _trace(t: Any, where: str, base: Path | None) -> TraceSpec:
    if not isinstance(t, dict) or "path" not in t or "columns" not in t:
        raise ScenarioError(f"{where}: needs path and columns")
    extra = set(t) - _TRACE_KEYS
    if extra:
        raise ScenarioError(f"{where}: unknown keys {sorted(extra)} (known: {sorted(_TRACE_KEYS)})")
    try:
        return TraceSpec(
            path=resolve_path(str(t["path"]), base=base), columns=parse_columns(t["columns"]),
            speed=_number(t, "speed", where, default=1.0, positive=True),
            limit=_number(t, "limit", where, integer=True, minimum=1),
        )
    except TraceError as exc:
        raise ScenarioError(f"{where}: {exc}") from None


def _policies(data: dict[str, Any], where: str) -> tuple[tuple[str, ...], dict[str, Any]]:
    names = data.get("policies") or list(DEFAULT_POLICIES)
    if not isinstance(names, list) or not all(isinstance(n, str) and n for n in names):
        raise ScenarioError(f"{where}.policies: expected a list of policy names, got {names!r}")
    variants = data.get("policy_variants") or {}
    if not isinstance(variants, dict) or not all(isinstance(v, dict) for v in variants.values()):
        raise ScenarioError(f"{where}.policy_variants: must map names to policy fields")
    return tuple(names), {str(k): dict(v) for k, v in variants.items()}


def scenario_from_dict(data: Any, *, source: Path | None = None) -> Scenario:
    """Validate a parsed scenario mapping: every field, one line naming a bad one."""
    where = str(source) if source else "<scenario>"
    if not isinstance(data, dict):
        raise ScenarioError(f"{where}: the top level must be a mapping")
    extra = set(data) - _KEYS
    if extra:
        raise ScenarioError(f"{where}: unknown keys {sorted(extra)} (known: {sorted(_KEYS)})")
    for key in ("name", "description"):
        if data.get(key) is not None and not isinstance(data[key], str):
            raise ScenarioError(f"{where}.{key}: expected text, got {data[key]!r}")
    for key in ("workloads", "traces"):
        if data.get(key) is not None and not isinstance(data[key], list):
            raise ScenarioError(f"{where}.{key}: expected a list, got {data[key]!r}")
    duration = _number(data, "duration_s", where, positive=True)
    seed = _number(data, "seed", where, default=0, integer=True)
    gpu_noise = _number(data, "gpu_noise", where, default=0.0, minimum=0.0)
    sample_s = _number(data, "sample_s", where, positive=True)
    max_num_seqs = _number(data, "max_num_seqs", where, default=256, integer=True, minimum=1)
    drain = _number(data, "drain_limit_s", where, default=3600.0, positive=True)
    load = _number(data, "load", where, positive=True)
    capacity = _number(data, "capacity_tokens_per_s", where, positive=True)
    policies, variants = _policies(data, where)
    base = source.parent if source else None
    config = _config(data, base or Path.cwd(), where)
    workloads = tuple(
        parse_workload(w, f"{where}: workloads[{i}]", config, base=base)
        for i, w in enumerate(data.get("workloads") or [])
    )
    traces = [
        _trace(t, f"{where}: traces[{i}]", base) for i, t in enumerate(data.get("traces") or [])
    ]
    if not workloads and not traces:
        raise ScenarioError(f"{where}: no workloads and no traces: nothing would arrive")
    if workloads and duration is None:
        raise ScenarioError(f"{where}.duration_s: required with workloads")
    return Scenario(
        name=str(data.get("name") or (source.stem if source else "scenario")),
        description=str(data.get("description") or "").strip(),
        config=config, workloads=workloads, traces=tuple(traces), duration_s=duration,
        seed=seed, gpu_noise=gpu_noise, sample_s=sample_s, max_num_seqs=max_num_seqs,
        drain_limit_s=drain, policies=policies, policy_variants=variants, source=source,
        load=load, capacity_tokens_per_s=capacity,
    )


def split_load(text: str) -> tuple[str, float | None]:
    """`tenants13@120` -> ("tenants13", 1.2); a name without @ -> (name, None)."""
    name, sep, pct = text.rpartition("@")
    if not sep or not name:
        return text, None
    try:
        v = float(pct)
    except ValueError:
        raise ScenarioError(f"{text}: the load after @ must be a percentage, e.g. @85") from None
    if not (v > 0 and math.isfinite(v)):
        raise ScenarioError(f"{text}: the load after @ must be a positive percentage")
    return name, v / 100.0


def load_scenario(name_or_path: str | Path) -> Scenario:
    """A shipped scenario by name (`seed-morning`, `tenants13@120`) or a file by path."""
    text = str(name_or_path)
    builtin = builtin_scenarios()
    if text not in builtin and not Path(text).exists():
        name, load = split_load(text)
        if load is not None:
            sc = load_scenario(name)
            return replace(sc, name=f"{sc.name}@{text.rpartition('@')[2]}", load=load)
    if text in builtin:
        path = builtin[text]
    else:
        try:
            path = resolve_path(text)
        except ScenarioError:
            raise ScenarioError(
                f"{text}: no such scenario file; shipped scenarios: {', '.join(builtin)}"
            ) from None
    return scenario_from_dict(_load_yaml(path), source=path.resolve())
