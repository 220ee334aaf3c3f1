"""The operator's view agrees with the code: the Grafana dashboard, docs/operations.md
and ops/prometheus.yml against the metrics, config fields, commands and topics that
triage really has.

Pure: metrics are read from fresh registries, nothing is served or scraped.
(tests/unit/test_compose.py checks docker-compose.yml and the Prometheus targets.)

`python tests/unit/test_ops_docs.py config|metrics` prints the generated columns of
the reference tables in docs/operations.md, to paste when the config or metrics change.
"""

from __future__ import annotations

import enum
import json
import re
import sys
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, get_args, get_origin

import pytest
import typer.main
import yaml
from prometheus_client import CollectorRegistry
from prometheus_client.metrics import MetricWrapperBase
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

import triage.cli.main as cli_main
from triage.config import EXAMPLE_CONFIG, TriageConfig, load_config
from triage.gateway.metrics import GatewayMetrics
from triage.streams.metrics import AdmissionMetrics
from triage.streams.tallies import TallyCounter, TallyHistogram
from triage.topics.admin import topic_layout
from triage.topics.names import TopicKind, TopicNames
from triage.workers.metrics import WorkerMetrics

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD_PATH = ROOT / "ops" / "grafana" / "dashboards" / "triage.json"
DATASOURCES_PATH = ROOT / "ops" / "grafana" / "provisioning" / "datasources" / "prometheus.yml"
PROMETHEUS_PATH = ROOT / "ops" / "prometheus.yml"
COMPOSE_CONFIG = ROOT / "ops" / "compose" / "triage.yaml"
DOC_PATH = ROOT / "docs" / "operations.md"

ROWS = ["Admissions", "Queue", "SLA", "GPUs", "Predictor", "Core"]


# --------------------------------------------------------------------------- metrics


@dataclass(frozen=True)
class Metric:
    name: str  # the family name, as registered (a counter without `_total`)
    type: str  # counter, gauge, histogram
    labels: tuple[str, ...]
    help: str
    process: str  # admission or worker

    @property
    def doc_name(self) -> str:
        """The name an operator types: counters with `_total`, histograms as the family."""
        return f"{self.name}_total" if self.type == "counter" else self.name

    @property
    def series(self) -> set[str]:
        """Every series name Prometheus stores for it."""
        if self.type == "counter":
            return {f"{self.name}_total", f"{self.name}_created"}
        if self.type == "histogram":
            return {f"{self.name}_{s}" for s in ("bucket", "sum", "count", "created")}
        return {self.name}


def _metrics_of(owner: object, process: str) -> list[Metric]:
    out = []
    for wrapper in vars(owner).values():
        if isinstance(wrapper, MetricWrapperBase):
            labels = tuple(wrapper._labelnames)
        elif isinstance(wrapper, TallyCounter | TallyHistogram):  # the per-decision series
            labels = wrapper.labelnames
        else:
            continue
        (family,) = wrapper.describe()
        out.append(Metric(family.name, family.type, labels, family.documentation, process))
    return out


def _registries() -> list[tuple[str, object, CollectorRegistry]]:
    """(process, metrics object, its fresh registry) for the admission app, a worker and
    the gateway."""
    a, w, g = CollectorRegistry(), CollectorRegistry(), CollectorRegistry()
    return [("admission", AdmissionMetrics(a), a),
            ("worker", WorkerMetrics("gpu-0", registry=w), w),
            ("gateway", GatewayMetrics(g), g)]  # fmt: skip


def registered_metrics() -> dict[str, Metric]:
    """Every metric the admission app and a worker export, by family name."""
    metrics = [m for process, owner, _ in _registries() for m in _metrics_of(owner, process)]
    return {m.name: m for m in metrics}


METRICS = registered_metrics()
SERIES = {s: m for m in METRICS.values() for s in m.series}


# --------------------------------------------------------------------------- config


def _type_text(a: Any) -> str:
    origin = get_origin(a)
    if origin is typing.Annotated:
        return _type_text(get_args(a)[0])
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_text(x) for x in get_args(a))
    if origin is typing.Literal:
        return "one of " + ", ".join(str(x) for x in get_args(a))
    if origin is list:
        (item,) = get_args(a)
        is_model = isinstance(item, type) and issubclass(item, BaseModel)
        return f"list of {item.__name__ if is_model else _type_text(item)}"
    if origin is dict:
        k, v = get_args(a)
        return f"map {_type_text(k)} to {_type_text(v)}"
    if a is type(None):
        return "null"
    if isinstance(a, type) and issubclass(a, enum.Enum):
        return "one of " + ", ".join(str(m.value) for m in a)
    if isinstance(a, type) and issubclass(a, BaseModel):
        return f"section ({a.__name__})"
    return a.__name__ if isinstance(a, type) else str(a)


def _bounds(meta: list[Any], *, is_list: bool = False) -> list[str]:
    out: list[str] = []
    for m in meta:
        for attr, sym in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<")):
            v = getattr(m, attr, None)
            if v is not None:
                out.append(f"{sym} {v}")
    lo = next((m.min_length for m in meta if getattr(m, "min_length", None) is not None), None)
    hi = next((m.max_length for m in meta if getattr(m, "max_length", None) is not None), None)
    if is_list:
        if lo:
            out.append(f"at least {lo} item" + ("s" if lo > 1 else ""))
        if hi is not None:
            out.append(f"at most {hi} items")
    elif lo is not None or hi is not None:
        out.append(f"length {lo or 0}..{hi}" if hi is not None else f"length >= {lo}")
    for m in meta:
        pattern = getattr(m, "pattern", None)
        if pattern is not None:
            out.append(f"pattern `{pattern}`")
    return out


def _annotated_meta(a: Any) -> tuple[list[Any], list[Any]]:
    """(metadata of the value itself, metadata of list items) inside an annotation."""
    own: list[Any] = []
    items: list[Any] = []
    origin = get_origin(a)
    if origin is typing.Annotated:
        base, *meta = get_args(a)
        for m in meta:
            own.extend(m.metadata if isinstance(m, FieldInfo) else [m])
        o2, i2 = _annotated_meta(base)
        own += o2
        items += i2
    elif origin in (typing.Union, types.UnionType):
        for x in get_args(a):
            o2, i2 = _annotated_meta(x)
            own += o2
            items += i2
    elif origin is list:
        o2, i2 = _annotated_meta(get_args(a)[0])
        items += o2 + i2
    return own, items


def _is_list(a: Any) -> bool:
    return get_origin(a) is list or any(
        _is_list(x) for x in get_args(a) if get_origin(a) is not typing.Literal
    )


def _constraints(fi: FieldInfo) -> str:
    own, items = _annotated_meta(fi.annotation)
    parts = _bounds(list(fi.metadata) + own, is_list=_is_list(fi.annotation))
    item_parts = _bounds(items)
    if item_parts:
        parts.append("each: " + ", ".join(item_parts))
    return ", ".join(parts) if parts else "-"


def _default_text(fi: FieldInfo) -> str:
    if fi.default_factory is not None:
        value: Any = fi.default_factory()  # type: ignore[call-arg]
    elif fi.default is PydanticUndefined:
        return "required"
    else:
        value = fi.default
    if isinstance(value, BaseModel):
        return "see below"
    if isinstance(value, enum.Enum):
        value = value.value
    return f"`{json.dumps(value)}`"


def _models(a: Any) -> list[type[BaseModel]]:
    origin = get_origin(a)
    if origin is None:
        return [a] if isinstance(a, type) and issubclass(a, BaseModel) else []
    return [m for x in get_args(a) for m in _models(x)]


def config_rows(
    model: type[BaseModel] = TriageConfig, prefix: str = ""
) -> list[tuple[str, str, str, str, str]]:
    """(path, type, default, constraints, description) for every field, depth first by
    section: `tenants[].rate_tokens_per_s`, `policy.tick_ms`, ..."""
    rows: list[tuple[str, str, str, str, str]] = []
    nested: list[tuple[type[BaseModel], str]] = []
    for name, fi in model.model_fields.items():
        path = f"{prefix}{name}"
        rows.append((path, _type_text(fi.annotation), _default_text(fi), _constraints(fi),
                     fi.description or ""))  # fmt: skip
        for sub in _models(fi.annotation):
            is_list = get_origin(fi.annotation) is list
            nested.append((sub, f"{path}[]." if is_list else f"{path}."))
    for sub, sub_prefix in nested:
        rows += config_rows(sub, sub_prefix)
    return rows


# --------------------------------------------------------------------------- documents


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def doc_table_rows(text: str) -> dict[str, list[str]]:
    """Markdown table rows whose first cell is one backticked name, by that name."""
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        if not line.startswith("| `"):
            continue
        cells = _cells(line)
        m = re.fullmatch(r"`([^`]+)`", cells[0])
        if m:
            out.setdefault(m.group(1), cells)
    return out


DOC = DOC_PATH.read_text() if DOC_PATH.exists() else ""  # generation runs without it
DOC_ROWS = doc_table_rows(DOC)
BOARD: dict[str, Any] = json.loads(DASHBOARD_PATH.read_text())
PROM: dict[str, Any] = yaml.safe_load(PROMETHEUS_PATH.read_text())
DATASOURCE: dict[str, Any] = yaml.safe_load(DATASOURCES_PATH.read_text())["datasources"][0]
JOBS = [job["job_name"] for job in PROM["scrape_configs"]]
# Labels Prometheus adds at scrape time: job, instance and the static targets' labels.
SCRAPE_LABELS = {"job", "instance"} | {
    label for job in PROM["scrape_configs"] for sc in job["static_configs"]
    for label in sc.get("labels", {})
}  # fmt: skip


def _panels(panels: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """Every panel, rows' nested panels included (collapsed rows keep theirs inside)."""
    out: list[dict[str, Any]] = []
    for p in BOARD["panels"] if panels is None else panels:
        out.append(p)
        out += _panels(p.get("panels", []))
    return out


def _queries() -> list[tuple[str, str, str]]:
    """(panel title, expr, legend) of every target."""
    return [(p["title"], t["expr"], t.get("legendFormat", ""))
            for p in _panels() for t in p.get("targets", [])]  # fmt: skip


def _variable_queries() -> list[str]:
    out = []
    for v in BOARD["templating"]["list"]:
        if v["type"] == "query":
            q = v["query"]
            out.append(q["query"] if isinstance(q, dict) else q)
    return out


NAME_RE = re.compile(r"\b(triage_[a-z0-9_]+)\b")
SELECTOR_RE = re.compile(r"\b([a-zA-Z_:][a-zA-Z0-9_:]*)\{([^}]*)\}")
MATCHER_RE = re.compile(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*\"([^\"]*)\"")
BY_RE = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")
LEGEND_RE = re.compile(r"\{\{\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\}\}")


def _series_labels(series: str) -> set[str]:
    m = SERIES[series]
    extra = {"le"} if series.endswith("_bucket") else set()
    return set(m.labels) | extra | SCRAPE_LABELS


# --------------------------------------------------------------------------- dashboard


def test_metric_classes_hold_every_registered_metric_once() -> None:
    names: list[str] = []
    for process, owner, registry in _registries():
        attrs = {m.name for m in _metrics_of(owner, process)}
        assert {m.name for m in registry.collect()} == attrs, f"{process}: off-class metric"
        names += attrs
    assert len(names) == len(set(names)), "one metric name in two processes"


def test_dashboard_is_a_provisionable_grafana_dashboard() -> None:
    assert BOARD["uid"] == "triage" and BOARD["title"]
    assert 36 <= BOARD["schemaVersion"] <= 41
    panels = _panels()
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    rows = [p["title"] for p in panels if p["type"] == "row"]
    assert [r for r in rows if r in ROWS] == ROWS
    for p in panels:
        pos = p["gridPos"]
        assert pos["x"] >= 0 and pos["x"] + pos["w"] <= 24 and pos["h"] > 0, p["title"]


def test_every_panel_queries_the_provisioned_prometheus() -> None:
    expected = {"type": DATASOURCE["type"], "uid": DATASOURCE["uid"]}
    for p in _panels():
        if p["type"] == "row":
            assert not p.get("targets"), f"row {p['title']!r} has queries"
            continue
        assert p.get("datasource") == expected, p["title"]
        targets = p.get("targets", [])
        assert targets, f"panel {p['title']!r} has no query"
        assert len({t["refId"] for t in targets}) == len(targets), p["title"]
        for t in targets:
            assert t.get("datasource", expected) == expected, p["title"]
            assert t["expr"].strip(), p["title"]
    for v in BOARD["templating"]["list"]:
        assert v.get("datasource") == expected, v["name"]


def test_template_variables_filter_on_real_labels() -> None:
    variables = {v["name"]: v for v in BOARD["templating"]["list"]}
    assert {"tenant", "model"} <= set(variables)
    for q in _variable_queries():
        m = re.fullmatch(r"label_values\((\w+),\s*(\w+)\)", q)
        assert m, q
        series, label = m.groups()
        assert series in SERIES, f"{q}: no such series"
        assert label in SERIES[series].labels, f"{q}: {series} has no label {label}"
    used = " ".join(expr for _, expr, _ in _queries())
    for name in variables:
        assert f"${name}" in used, f"variable ${name} filters nothing"


def test_every_metric_the_dashboard_queries_is_registered() -> None:
    for title, expr, _ in _queries():
        for name in NAME_RE.findall(expr):
            assert name in SERIES, f"{title!r}: {name} is not exported by triage"
    for q in _variable_queries():
        for name in NAME_RE.findall(q):
            assert name in SERIES, f"variable {q!r}: {name} is not exported by triage"


def test_counters_are_rated_and_histograms_read_through_quantiles() -> None:
    for title, expr, _ in _queries():
        for m in NAME_RE.finditer(expr):
            series, metric = m.group(1), SERIES[m.group(1)]
            inside_rate = re.search(r"\b(rate|irate|increase)\(\s*$", expr[: m.start()])
            if metric.type == "gauge":
                assert not inside_rate, f"{title!r}: rate() of the gauge {series}"
                continue
            assert inside_rate, f"{title!r}: {series} is cumulative; use rate()"
            if series.endswith("_bucket"):
                assert "histogram_quantile(" in expr, f"{title!r}: {series} without quantile"
                groups = [[x.strip() for x in g.split(",")] for g in BY_RE.findall(expr)]
                assert groups and all("le" in g for g in groups), f"{title!r}: sum by (le, ...)"


def test_selectors_groupings_and_legends_use_the_metrics_labels() -> None:
    for title, expr, legend in _queries():
        names = NAME_RE.findall(expr)
        for series, matchers in SELECTOR_RE.findall(expr):
            labels = _series_labels(series) if series in SERIES else SCRAPE_LABELS
            for label, op, value in MATCHER_RE.findall(matchers):
                assert label in labels, f"{title!r}: {series} has no label {label!r}"
                if label == "job" and op == "=~":
                    assert any(re.fullmatch(value, j) for j in JOBS), f"{title!r}: {value}"
        common = set.intersection(*(_series_labels(n) for n in names)) if names else SCRAPE_LABELS
        groups = [{x.strip() for x in g.split(",") if x.strip()} for g in BY_RE.findall(expr)]
        for g in groups:
            assert g <= common, f"{title!r}: grouping by {sorted(g - common)} not on every metric"
        outer = groups[0] - {"le"} if groups else common
        for label in LEGEND_RE.findall(legend):
            assert label in outer, f"{title!r}: legend {{{{{label}}}}} is not a result label"


def test_dashboard_rows_chart_the_requested_series() -> None:
    by_row: dict[str, str] = {}
    row = ""
    for p in _panels():
        if p["type"] == "row":
            row = p["title"]
            continue
        by_row[row] = by_row.get(row, "") + " ".join(t["expr"] for t in p["targets"])
    wanted = {
        "Admissions": ["triage_admissions_total", "by (reason)", "by (outcome)",
                       "by (tenant)"],
        "Queue": ["triage_queue_depth", "triage_queue_wait_seconds_bucket",
                  "triage_queue_timeouts_total", "histogram_quantile(0.5,",
                  "histogram_quantile(0.95,", "histogram_quantile(0.99,"],
        "SLA": ["triage_sla_violations_total", "by (cause)"],
        "GPUs": ["triage_gpu_utilization", "triage_kv_reserved_bytes", "triage_kv_budget_bytes",
                 "triage_worker_"],
        "Predictor": ["triage_predictor_relative_error_bucket", "triage_variance_buffer"],
        "Core": ["triage_decision_latency_seconds_bucket", "histogram_quantile(0.5,",
                 "histogram_quantile(0.99,", "triage_preemption_rate"],
    }  # fmt: skip
    for name, needles in wanted.items():
        for needle in needles:
            assert needle in by_row.get(name, ""), f"row {name!r} lacks {needle}"


def test_every_registered_metric_is_charted_or_documented() -> None:
    charted = " ".join(expr for _, expr, _ in _queries())
    for m in METRICS.values():
        assert any(s in charted for s in m.series) or f"`{m.doc_name}`" in DOC, m.name


# --------------------------------------------------------------------------- docs


def test_metrics_table_lists_every_metric_with_its_type_labels_and_process() -> None:
    for m in METRICS.values():
        row = DOC_ROWS.get(m.doc_name)
        assert row is not None, f"docs/operations.md: no row for `{m.doc_name}`"
        assert row[1] == m.type, f"{m.doc_name}: type {row[1]!r}, code says {m.type}"
        labels = [x.strip(" `") for x in row[2].split(",") if x.strip(" `-")]
        assert labels == list(m.labels), f"{m.doc_name}: labels {labels}, code {m.labels}"
        assert row[3] == m.process, f"{m.doc_name}: process {row[3]!r}, code {m.process}"
        assert row[4], f"{m.doc_name}: no meaning"
    documented = {n for n in DOC_ROWS if n.startswith("triage_")}
    assert documented <= {m.doc_name for m in METRICS.values()}, "a documented metric is gone"


def test_config_reference_covers_every_field_as_the_models_declare_it() -> None:
    for path, type_text, default, constraints, _ in config_rows():
        row = DOC_ROWS.get(path)
        assert row is not None, f"docs/operations.md: no row for config field `{path}`"
        assert row[1:4] == [type_text, default, constraints], (
            f"`{path}`: doc says {row[1:4]}, models say {[type_text, default, constraints]} "
            "(regenerate: python tests/unit/test_ops_docs.py config)"
        )
        assert len(row) >= 5 and row[4], f"`{path}`: no meaning"


def _command_paths() -> list[str]:
    out: list[str] = []

    def walk(cmd: Any, path: list[str]) -> None:
        for name, sub in getattr(cmd, "commands", {}).items():
            out.append(" ".join([*path, name]))
            walk(sub, [*path, name])

    walk(typer.main.get_command(cli_main.app), ["triage"])
    return out


def test_every_cli_command_is_documented() -> None:
    for path in _command_paths():
        assert f"`{path}" in DOC, f"docs/operations.md does not mention `{path}`"


def test_every_topic_is_documented(triage_config: TriageConfig) -> None:
    names = TopicNames(triage_config.kafka.topic_prefix)
    kinds = {s.kind for s in topic_layout(triage_config, names)}
    assert kinds == set(TopicKind)
    generic = {
        names.requests("<tenant>"), names.replies("<tenant>"), names.gpu_work("<gpu>"),
        names.gpu_control("<gpu>"), names.admission, names.gpu_status, names.completions,
        names.decisions, names.deadletter, names.autoscale,
    }  # fmt: skip
    for topic in generic:
        assert f"`{topic}`" in DOC, f"docs/operations.md does not list the topic {topic}"


# --------------------------------------------------------------------------- prometheus


@pytest.mark.parametrize(
    "config_path", [EXAMPLE_CONFIG, COMPOSE_CONFIG], ids=["example", "compose"]
)
def test_scrape_ports_and_gpu_labels_match_the_config(config_path: Path) -> None:
    config = load_config(config_path)
    gpus = config.all_gpus()
    jobs = {job["job_name"]: job for job in PROM["scrape_configs"]}
    (admission,) = [t for sc in jobs["triage-admission"]["static_configs"] for t in sc["targets"]]
    assert int(admission.rsplit(":", 1)[1]) == config.metrics.admission_port
    seen = []
    for sc in jobs["triage-workers"]["static_configs"]:
        gpu = sc["labels"]["gpu"]
        for target in sc["targets"]:
            port = int(target.rsplit(":", 1)[1])
            assert port == config.metrics.worker_port_base + gpus.index(gpu), target
            seen.append(gpu)
    assert sorted(seen) == sorted(gpus)
    # A worker's series carry their own gpu label; keep it rather than `exported_gpu`.
    assert jobs["triage-workers"].get("honor_labels") is True


# --------------------------------------------------------------------------- generation


def _print_config() -> None:
    print("| field | type | default | constraints | meaning |")
    print("|---|---|---|---|---|")
    for path, type_text, default, constraints, desc in config_rows():
        print(f"| `{path}` | {type_text} | {default} | {constraints} | {desc} |")


def _print_metrics() -> None:
    print("| metric | type | labels | process | meaning |")
    print("|---|---|---|---|---|")
    for m in METRICS.values():
        labels = ", ".join(f"`{x}`" for x in m.labels) or "-"
        print(f"| `{m.doc_name}` | {m.type} | {labels} | {m.process} | {m.help} |")


if __name__ == "__main__":
    {"config": _print_config, "metrics": _print_metrics}[sys.argv[1]]()
