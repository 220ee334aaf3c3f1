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

Overrides merge into the config: mappings key by key, lists of named items by
name, so one field of one tenant can change without repeating the rest.
"""

from __future__ import annotations

import logging
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
    "traces",
}


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

    def arrivals(self) -> Iterator[Arrival]:
        """The scenario's requests, time-ordered, identical for every policy."""
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

    def _source(self, t: TraceSpec) -> TraceSource:
        return TraceSource(
            t.path, t.columns, config=self.config, speed=t.speed, limit=t.limit,
            duration_s=self.duration_s,
        )

    def expected_duration(self) -> float | None:
        """Virtual seconds of arrivals (for progress bars): duration, or the traces' span."""
        if self.duration_s is not None:
            return self.duration_s
        spans = [trace_span(t) for t in self.traces]
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

    def scaled(self, k: float) -> Scenario:
        """Run k x as long with the same shape: durations and workload periods stretch by
        k, rates and the pool stay (so load and utilization stay)."""
        if k <= 0:
            raise ScenarioError(f"scale must be positive, got {k}")
        duration = self.duration_s
        if duration is None and self.traces:
            duration = self.expected_duration()
        return replace(
            self,
            duration_s=duration * k if duration is not None else None,
            workloads=tuple(w.scaled(k) for w in self.workloads),
            sample_s=self.sample_s * k if self.sample_s else None,
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


def scenario_from_dict(data: Any, *, source: Path | None = None) -> Scenario:
    """Validate a parsed scenario mapping."""
    where = str(source) if source else "<scenario>"
    if not isinstance(data, dict):
        raise ScenarioError(f"{where}: the top level must be a mapping")
    extra = set(data) - _KEYS
    if extra:
        raise ScenarioError(f"{where}: unknown keys {sorted(extra)} (known: {sorted(_KEYS)})")
    base = source.parent if source else None
    config = _config(data, base or Path.cwd(), where)
    workloads = tuple(
        parse_workload(w, f"{where}: workloads[{i}]", config, base=base)
        for i, w in enumerate(data.get("workloads") or [])
    )
    traces = []
    for i, t in enumerate(data.get("traces") or []):
        if not isinstance(t, dict) or "path" not in t or "columns" not in t:
            raise ScenarioError(f"{where}: traces[{i}]: needs path and columns")
        try:
            traces.append(TraceSpec(
                path=resolve_path(str(t["path"]), base=base), columns=parse_columns(t["columns"]),
                speed=float(t.get("speed", 1.0)), limit=t.get("limit"),
            ))
        except TraceError as exc:
            raise ScenarioError(f"{where}: traces[{i}]: {exc}") from None
    if not workloads and not traces:
        raise ScenarioError(f"{where}: no workloads and no traces: nothing would arrive")
    variants = data.get("policy_variants") or {}
    if not isinstance(variants, dict):
        raise ScenarioError(f"{where}: policy_variants must map names to policy fields")
    duration = data.get("duration_s")
    return Scenario(
        name=str(data.get("name") or (source.stem if source else "scenario")),
        description=str(data.get("description", "")).strip(),
        config=config, workloads=workloads, traces=tuple(traces),
        duration_s=float(duration) if duration is not None else None,
        seed=int(data.get("seed", 0)), gpu_noise=float(data.get("gpu_noise", 0.0)),
        sample_s=float(data["sample_s"]) if data.get("sample_s") else None,
        max_num_seqs=int(data.get("max_num_seqs", 256)),
        drain_limit_s=float(data.get("drain_limit_s", 3600.0)),
        policies=tuple(data.get("policies") or DEFAULT_POLICIES),
        policy_variants={str(k): dict(v) for k, v in variants.items()},
        source=source,
    )


def load_scenario(name_or_path: str | Path) -> Scenario:
    """A shipped scenario by name (`seed-morning`) or a scenario file by path."""
    text = str(name_or_path)
    builtin = builtin_scenarios()
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
