"""Trace replay: requests from a CSV file, streamed row by row, never loaded whole.

Public LLM-serving traces differ in columns and clocks, so a column mapping says
where each field comes from; written on the command line as
``timestamp=TIMESTAMP,prompt=ContextTokens,output=GeneratedTokens,tenant=const:conv``:

- ``timestamp``: a column; the clock is ISO wall time (``2023-11-16 18:17:03.9799600``,
  no zone), or epoch seconds / ms / us (``time_format``: auto|iso|s|ms|us).
- ``prompt``, ``output``: a column or ``const:N``.
- ``max_tokens``: a column, ``const:N``, or ``output*K`` (rounded up; capped at
  ``max_cap``, default 4096, and fitted into the model's context). Default: a column
  named max_tokens (or MaxTokens, max_new_tokens) when the trace has one, else
  ``output*1.5``: most traces record what was generated, not what was asked for.
  A row whose prompt + max_tokens exceeds its model's context is what the live app
  refuses as invalid (`context_overflow`): the simulator counts and reports it and
  does not simulate it (see workload.shape).
- ``tenant``, ``model``: ``const:NAME``, a column (``col:NAME`` or the bare name),
  or ``map:COLUMN:value=name;value=name;*=default``.
- ``sla_ms``: optional, a column or ``const:N``.

Time starts at the first row (or a given origin) and runs ``speed`` times faster.
"""

from __future__ import annotations

import csv
import logging
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import date, datetime
from pathlib import Path
from typing import Any

from triage.config.models import TriageConfig
from triage.sim.errors import TraceError
from triage.sim.workload import Arrival, shape

log = logging.getLogger(__name__)

_FIELDS = {
    "timestamp", "prompt", "output", "max_tokens", "max_cap", "tenant", "model", "sla_ms",
    "time_format",
}
_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6}
DEFAULT_MAX_TOKENS = "output*1.5"
MAX_TOKENS_COLUMNS = ("max_tokens", "maxtokens", "max_new_tokens", "maxnewtokens")
_EPOCH_DAY = date(1970, 1, 1).toordinal()  # ISO times become Unix seconds (zone-less = UTC)


@dataclass(frozen=True, slots=True)
class ColumnMapping:
    """Where each request field comes from (see the module docstring)."""

    timestamp: str
    prompt: str
    output: str
    tenant: str
    model: str
    max_tokens: str | None = None  # None: a max_tokens column if any, else output*1.5
    max_cap: int = 4096
    sla_ms: str | None = None
    time_format: str = "auto"
    extra: dict[str, str] = field(default_factory=dict)


def parse_columns(spec: str | dict[str, Any]) -> ColumnMapping:
    """`a=b,c=d` (command line) or a mapping (scenario file) to a ColumnMapping."""
    if isinstance(spec, str):
        items: dict[str, str] = {}
        for part in filter(None, (p.strip() for p in spec.split(","))):
            key, sep, value = part.partition("=")
            if not sep or not value:
                raise TraceError(f"--columns: {part!r} is not key=value")
            items[key.strip()] = value.strip()
    elif isinstance(spec, dict):
        items = {str(k): str(v) for k, v in spec.items()}
    else:
        raise TraceError(f"columns: expected key=value pairs, got {spec!r}")
    unknown = set(items) - _FIELDS
    if unknown:
        raise TraceError(f"columns: unknown keys {sorted(unknown)} (known: {sorted(_FIELDS)})")
    for required in ("timestamp", "prompt", "output", "tenant", "model"):
        if required not in items:
            raise TraceError(f"columns: {required}=... is required")
    fmt = items.get("time_format", "auto")
    if fmt not in ("auto", "iso", *_UNITS):
        raise TraceError(f"columns: time_format {fmt!r} is not auto, iso, s, ms or us")
    try:
        cap = int(items.get("max_cap", 4096))
    except ValueError:
        raise TraceError(f"columns: max_cap {items['max_cap']!r} is not an integer") from None
    return ColumnMapping(
        timestamp=items["timestamp"], prompt=items["prompt"], output=items["output"],
        tenant=items["tenant"], model=items["model"],
        max_tokens=items.get("max_tokens"), max_cap=cap,
        sla_ms=items.get("sla_ms"), time_format=fmt,
    )


class _IsoClock:
    """Wall-clock text to seconds, fast for the common `YYYY-MM-DD HH:MM:SS.fff` form."""

    def __init__(self) -> None:
        self._days: dict[str, float] = {}

    def __call__(self, text: str) -> float:
        s = text.strip()
        rest = s[19:]
        if len(s) >= 19 and s[10] in " T" and not any(c in rest for c in "Z+-"):
            day = self._days.get(s[:10])
            if day is None:
                day = self._days[s[:10]] = (
                    date.fromisoformat(s[:10]).toordinal() - _EPOCH_DAY
                ) * 86400.0
            return day + int(s[11:13]) * 3600 + int(s[14:16]) * 60 + float(s[17:])
        head, dot, frac = s.partition(".")
        if dot:  # fromisoformat takes at most 6 fractional digits
            n = len(frac) - len(frac.lstrip("0123456789"))
            s = f"{head}.{frac[:min(n, 6)]}{frac[n:]}"
        dt = datetime.fromisoformat(s)
        base = (dt.toordinal() - _EPOCH_DAY) * 86400.0 + dt.hour * 3600 + dt.minute * 60
        base += dt.second
        off = dt.utcoffset()
        return base + dt.microsecond / 1e6 - (off.total_seconds() if off else 0.0)


def _clock(fmt: str, sample: str) -> Callable[[str], float]:
    if fmt == "auto":
        text = sample.strip()
        if any(c in text for c in "-:T") and not text.lstrip("-").replace(".", "").isdigit():
            fmt = "iso"
        else:
            v = abs(float(text))
            fmt = "us" if v > 1e14 else ("ms" if v > 1e11 else "s")
    if fmt == "iso":
        return _IsoClock()
    unit = _UNITS[fmt]
    return lambda x: float(x) * unit


def _name_getter(spec: str, col: dict[str, int], what: str) -> Callable[[list[str]], str]:
    if spec.startswith("const:"):
        value = spec[6:]
        return lambda row: value
    if spec.startswith("map:"):
        _, _, rest = spec.partition(":")
        column, _, table = rest.partition(":")
        idx = _col(column, col, what)
        mapping = dict(p.split("=", 1) for p in table.split(";") if "=" in p)
        default = mapping.pop("*", None)

        def mapped(row: list[str]) -> str:
            v = row[idx]
            out = mapping.get(v, default)
            if out is None:
                raise TraceError(f"{what}: value {v!r} has no entry in the map (add *=name)")
            return out

        return mapped
    idx = _col(spec.removeprefix("col:"), col, what)
    return lambda row: row[idx]


def _num_getter(spec: str, col: dict[str, int], what: str) -> Callable[[list[str]], int]:
    if spec.startswith("const:"):
        value = int(float(spec[6:]))
        return lambda row: value
    idx = _col(spec.removeprefix("col:"), col, what)
    return lambda row: int(float(row[idx]))


def max_tokens_column(col: dict[str, int]) -> str | None:
    """A trace column that records the client's max_tokens, if the header has one."""
    for name in col:
        if name.lower().replace("-", "_") in MAX_TOKENS_COLUMNS:
            return name
    return None


def _col(name: str, col: dict[str, int], what: str) -> int:
    if name not in col:
        raise TraceError(f"{what}: no column {name!r} in the trace (columns: {sorted(col)})")
    return col[name]


class TraceSource:
    """A CSV trace with its mapping; `arrivals()` streams it as simulator requests."""

    def __init__(
        self, path: str | Path, mapping: ColumnMapping, *, config: TriageConfig,
        speed: float = 1.0, limit: int | None = None, duration_s: float | None = None,
    ) -> None:
        if speed <= 0:
            raise TraceError(f"speed must be positive, got {speed}")
        self.path = Path(path)
        self.mapping = mapping
        self.config = config
        self.speed = speed
        self.limit = limit
        self.duration_s = duration_s
        self.total_bytes = self.path.stat().st_size if self.path.exists() else 0
        self.bytes_read = 0
        self.rows = 0
        self.reordered = 0  # rows whose time went backwards (replayed at the previous time)

    def first_timestamp(self) -> float:
        """Clock value of the first data row (for a shared origin of several traces)."""
        with self._open() as f:
            reader = csv.reader(f)
            header = next(reader, None)
            row = next(reader, None)
            if header is None or row is None:
                raise TraceError(f"{self.path}: no data rows")
            col = {name.strip(): i for i, name in enumerate(header)}
            raw = row[_col(self.mapping.timestamp, col, "timestamp")]
            return _clock(self.mapping.time_format, raw)(raw)

    def _open(self) -> Any:
        try:
            return self.path.open(newline="", encoding="utf-8")
        except OSError as exc:
            raise TraceError(f"{self.path}: cannot read: {exc.strerror or exc}") from None

    def arrivals(self, origin: float | None = None) -> Iterator[Arrival]:
        """Rows as Arrivals, time (clock - origin) / speed; origin defaults to row 1."""
        m = self.mapping
        with self._open() as f:
            reader = csv.reader(self._counted(f))
            header = next(reader, None)
            if header is None:
                return
            col = {name.strip(): i for i, name in enumerate(header)}
            ts_i = _col(m.timestamp, col, "timestamp")
            get_prompt = _num_getter(m.prompt, col, "prompt")
            get_out = _num_getter(m.output, col, "output")
            get_tenant = _name_getter(m.tenant, col, "tenant")
            get_model = _name_getter(m.model, col, "model")
            get_sla = _num_getter(m.sla_ms, col, "sla_ms") if m.sla_ms else None
            factor = 0.0
            get_max: Callable[[list[str]], int] | None = None
            found = max_tokens_column(col) if m.max_tokens is None else None
            if found is not None:
                log.warning("%s: max_tokens from its column %r", self.path.name, found)
            max_spec = m.max_tokens or found or DEFAULT_MAX_TOKENS
            if max_spec.startswith("output*"):
                try:
                    factor = float(max_spec[7:])
                except ValueError:
                    raise TraceError(f"max_tokens: {max_spec!r} is not output*K") from None
                if not factor >= 1.0:
                    raise TraceError(f"max_tokens: {max_spec!r}: K must be >= 1")
            else:
                get_max = _num_getter(max_spec, col, "max_tokens")
            contexts: dict[str, int] = {}
            tenants: set[str] = set()
            clock: Callable[[str], float] | None = None
            t0 = origin
            last = 0.0
            inv_speed = 1.0 / self.speed
            cap = m.max_cap
            limit, end = self.limit, self.duration_s
            for line_no, row in enumerate(reader, start=2):
                if not row:
                    continue
                if limit is not None and self.rows >= limit:
                    return
                try:
                    if clock is None:
                        clock = _clock(m.time_format, row[ts_i])
                    ts = clock(row[ts_i])
                    if t0 is None:
                        t0 = ts
                    t = (ts - t0) * inv_speed
                    if end is not None and t >= end:
                        return
                    if t < last:
                        self.reordered += 1
                        t = last
                    last = t
                    tenant, model = get_tenant(row), get_model(row)
                    prompt, out = get_prompt(row), get_out(row)
                    mt = get_max(row) if get_max is not None else math.ceil(out * factor)
                    sla = get_sla(row) / 1000.0 if get_sla is not None else None
                    if prompt < 1 or out < 0 or mt < 1 or (sla is not None and sla <= 0):
                        raise ValueError("token counts must be positive")
                except (ValueError, IndexError) as exc:
                    raise TraceError(f"{self.path}:{line_no}: bad row {row!r}: {exc}") from None
                context = contexts.get(model)
                if context is None:
                    context = contexts[model] = self._context(model, line_no)
                if tenant not in tenants:
                    if self.config.tenant(tenant) is None:
                        raise TraceError(
                            f"{self.path}:{line_no}: tenant {tenant!r} is not in the config"
                        )
                    tenants.add(tenant)
                if get_max is None:
                    p, mx, o = shape(prompt, min(mt, cap), out, context, True)
                else:
                    p, mx, o = shape(prompt, mt, out, context, False)
                self.rows += 1
                yield Arrival(t, tenant, model, p, mx, o, sla)

    def _counted(self, f: Any) -> Iterator[str]:
        """Lines of `f`, counting characters read (progress for a streamed file)."""
        for line in f:
            self.bytes_read += len(line)
            yield line

    def _context(self, model: str, line_no: int) -> int:
        mc = self.config.model(model)
        if mc is None:
            raise TraceError(f"{self.path}:{line_no}: model {model!r} is not in the config")
        return mc.context_tokens
