"""Trace replay: column mappings, clocks, time scaling, streaming, the Azure files."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from tests.unit._sim_factory import sim_config
from triage.sim.errors import TraceError
from triage.sim.paths import resolve_path
from triage.sim.scenario import TraceSpec, trace_span
from triage.sim.trace import TraceSource, parse_columns

AZURE = "TIMESTAMP,ContextTokens,GeneratedTokens,svc\n"
ROWS = [
    "2023-11-16 18:17:03.9799600,4808,10,x",
    "2023-11-16 18:17:04.0319600,3180,8,y",
    "2023-11-16 18:17:05.9799600,100,300,x",
    "2023-11-16 18:17:05.5000000,50,3,y",  # out of order by half a second
    "2023-11-16 18:17:13.9799600,20,2,z",
]
COLS = (
    "timestamp=TIMESTAMP,prompt=ContextTokens,output=GeneratedTokens,tenant=const:a,"
    "model=const:m8"
)


def _write(tmp_path: Path, text: str, name: str = "t.csv") -> Path:
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    return p


def test_column_mapping_parses_and_names_what_is_wrong() -> None:
    m = parse_columns(COLS + ",max_tokens=output*2,max_cap=100,time_format=iso")
    assert (m.timestamp, m.prompt, m.tenant, m.max_tokens, m.max_cap) == (
        "TIMESTAMP", "ContextTokens", "const:a", "output*2", 100)
    with pytest.raises(TraceError, match="timestamp"):
        parse_columns("prompt=a,output=b,tenant=const:a,model=const:m")
    with pytest.raises(TraceError, match="unknown keys"):
        parse_columns(COLS + ",colour=blue")
    with pytest.raises(TraceError, match="time_format"):
        parse_columns(COLS + ",time_format=fortnights")
    assert parse_columns({"timestamp": "t", "prompt": "p", "output": "o", "tenant": "const:a",
                          "model": "const:m8"}).timestamp == "t"


def test_azure_clock_speed_and_derived_fields(tmp_path: Path) -> None:
    path = _write(tmp_path, AZURE + "\n".join(ROWS) + "\n")
    cols = parse_columns(COLS.replace("const:a", "map:svc:x=a;y=b;*=a") + ",max_cap=400")
    src = TraceSource(path, cols, config=sim_config(), speed=10.0)
    got = list(src.arrivals())
    assert [a.tenant for a in got] == ["a", "b", "a", "b", "a"]
    assert got[0].t == 0.0
    assert got[1].t == pytest.approx(0.0052, abs=1e-6)  # 52 ms of trace time at 10x
    assert got[2].t == pytest.approx(0.2)
    assert got[3].t == got[2].t and src.reordered == 1  # never back in time
    assert got[4].t == pytest.approx(1.0)
    assert (got[0].prompt_tokens, got[0].output_tokens, got[0].max_tokens) == (4808, 10, 15)
    assert got[2].max_tokens == 400  # ceil(300 x 1.5) = 450, capped
    assert src.rows == 5


def test_epoch_clocks_and_constants(tmp_path: Path) -> None:
    ms = _write(tmp_path, "ts,p,o\n1700000000000,10,5\n1700000002500,20,6\n", "ms.csv")
    cols = parse_columns("timestamp=ts,prompt=p,output=o,tenant=const:b,model=const:m8,"
                         "max_tokens=const:64")
    got = list(TraceSource(ms, cols, config=sim_config(), speed=0.5).arrivals())
    assert [a.t for a in got] == [0.0, 5.0]  # auto-detected ms, half speed
    assert all(a.max_tokens == 64 and a.tenant == "b" for a in got)
    sec = _write(tmp_path, "ts,p,o\n10.5,10,5\n12.0,20,6\n", "s.csv")
    got = list(TraceSource(sec, cols, config=sim_config()).arrivals(origin=10.0))
    assert [a.t for a in got] == [0.5, 2.0]


def test_bad_rows_and_unknown_names_fail_with_the_line(tmp_path: Path) -> None:
    cols = parse_columns(COLS)
    bad = _write(tmp_path, AZURE + ROWS[0] + "\n2023-11-16 18:17:04.0,lots,8,x\n", "bad.csv")
    with pytest.raises(TraceError, match=r"bad\.csv:3"):
        list(TraceSource(bad, cols, config=sim_config()).arrivals())
    who = parse_columns(COLS.replace("const:a", "const:nobody"))
    with pytest.raises(TraceError, match="nobody"):
        list(TraceSource(_write(tmp_path, AZURE + ROWS[0] + "\n"), who,
                         config=sim_config()).arrivals())
    missing = parse_columns(COLS.replace("ContextTokens", "Prompt"))
    with pytest.raises(TraceError, match="Prompt"):
        list(TraceSource(_write(tmp_path, AZURE + ROWS[0] + "\n"), missing,
                         config=sim_config()).arrivals())


def test_trace_is_streamed_not_loaded(tmp_path: Path) -> None:
    lines = [f"{i * 0.01:.2f},100,10" for i in range(200_000)]
    path = _write(tmp_path, "ts,p,o\n" + "\n".join(lines) + "\n", "big.csv")
    cols = parse_columns("timestamp=ts,prompt=p,output=o,tenant=const:a,model=const:m8")
    src = TraceSource(path, cols, config=sim_config(), duration_s=100.0)
    first = list(itertools.islice(src.arrivals(), 3))
    assert len(first) == 3
    assert src.bytes_read < src.total_bytes / 10
    assert sum(1 for _ in src.arrivals()) == 10_000  # duration_s cut the replay


def _azure(name: str) -> Path:
    return resolve_path(f"traces/azure2023/azure2023_{name}.csv")  # shipped in data/


def test_real_azure_files_replay_with_time_scaling() -> None:
    conv = _azure("conv")
    cfg = sim_config()
    cols = parse_columns(COLS)
    src = TraceSource(conv, cols, config=cfg, speed=10.0)
    n = 0
    last = None
    for a in src.arrivals():
        if n == 0:
            assert (a.t, a.prompt_tokens, a.output_tokens) == (0.0, 374, 44)
        n += 1
        last = a
    assert n == 19_366 and last is not None
    # 18:15:46.68 to 19:14:08.40 is 3,501.7 s of trace time: 350.2 s at 10x
    assert last.t == pytest.approx(350.17, abs=0.01)
    assert trace_span(TraceSpec(conv, cols, speed=10.0)) == pytest.approx(last.t)
    code = _azure("code")
    first = next(iter(TraceSource(code, cols, config=cfg).arrivals()))
    assert (first.prompt_tokens, first.output_tokens) == (4808, 10)


def test_iso_clock_with_zones_and_long_fractions() -> None:
    from triage.sim.trace import _IsoClock

    clock = _IsoClock()
    base = clock("2023-11-16 18:17:03.9799600")
    assert clock("2023-11-16T18:17:04.9799600Z") == pytest.approx(base + 1.0, abs=1e-6)
    assert clock("2023-11-16T19:17:03.97996+01:00") == pytest.approx(base, abs=1e-6)
    assert clock("2023-11-17 00:00:00") - clock("2023-11-16 00:00:00") == 86_400.0
