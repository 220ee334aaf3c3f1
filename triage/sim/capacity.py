"""Capacity and offered load: what "85% load" means for a scenario.

A GPU running a continuous-batching engine is "busy" (NVML's utilization: some
kernel running) whenever one sequence runs, so busy time reads 95-100% long before
the pool runs out of throughput. Load is therefore set as queueing theory sets it:

    offered load = offered tokens/s / capacity

* **offered tokens/s**: prompt + output tokens of the run's own arrivals, over the
  arrival window (the scenario's duration, or its traces' span at their speed);
* **capacity**: the tokens/s the pool completes on the same request mix when
  saturated: the scenario's own traffic at `OVERLOAD` x (then 2x more, until the
  engine completes less than 80% of what arrives) under `admit_all` (no front door:
  the engine's FIFO and KV management) on the same simulated GPUs, counted over the
  last two thirds of a window of at most `WINDOW_S` virtual seconds. A longer
  generated scenario is compressed into the window (`scaled(k)`: its periods and
  day shrink, its rates stay), so the window holds the whole run's mix; a trace is
  measured on its first `WINDOW_S` seconds at the saturating speed.

The measurement is a simulation with the scenario's seed, so it is deterministic; it is
cached per scenario (in memory, and on disk under the user's cache directory, keyed by
the scenario's traffic, pool and the simulator's sources), so a scenario's variants at
85/100/120% measure it once. A scenario may also pin `capacity_tokens_per_s`.

`at_load(sc, rho)` scales the scenario's arrival rates (Scenario.scaled's `rate`:
workload rates, trace speeds) until its offered tokens/s is rho x capacity.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import pickle
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from functools import cache
from pathlib import Path

from triage.sim.errors import ScenarioError
from triage.sim.scenario import Scenario

log = logging.getLogger(__name__)

OVERLOAD = 3.0  # first rate multiplier of the saturation run
WINDOW_S = 600.0  # longest arrival window of a capacity run (virtual seconds)
_VERSION = "1"  # bump when the measurement itself changes


def offered_tokens_per_s(sc: Scenario) -> float:
    """Prompt + output tokens per second the scenario's arrivals ask for (no simulation)."""
    window = sc.expected_duration()
    if not window:
        raise ScenarioError(f"{sc.name}: no arrival window (give duration_s)")
    return sum(a.prompt_tokens + a.output_tokens for a in sc.arrivals()) / window


@contextmanager
def _quiet(name: str) -> Iterator[None]:
    logger = logging.getLogger(name)
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def _saturated(sc: Scenario) -> tuple[float, float, float]:
    """(served, demand, span) tokens of an admit_all run over its last two thirds."""
    sc = replace(sc, drain_limit_s=1.0)  # what is left at the end is abandoned: no drain
    duration = sc.expected_duration()
    assert duration
    from triage.sim.compare import run_policy  # one way to run; compare imports this module

    with _quiet("triage.sim.engine"), _quiet("triage.sim.compare"):
        r = run_policy(sc, "admit_all")
    s = r.series
    dt = s.interval
    i0, i1 = int(duration / 3.0 / dt), int(duration / dt)
    served = sum(sum(v[i0:i1]) for k, v in s.counters.items() if k.startswith("served:"))
    demand = sum(sum(v[i0:i1]) for k, v in s.counters.items() if k.startswith("demand:"))
    return served, demand, (i1 - i0) * dt


def saturated_throughput(
    build: Callable[[float], Scenario], *, overload: float = OVERLOAD
) -> tuple[float, bool]:
    """(tokens/s completed, whether the engine was saturated) on `build`'s mix.

    `build(m)` must scale every arrival rate by m. The bare engine is driven at
    `overload` x the rates and the load doubles (at most 3 times) until the engine is
    saturated: it completes less than 80% of what arrives."""
    m = overload
    served = demand = span = 0.0
    for _ in range(4):
        served, demand, span = _saturated(build(m))
        if served < 0.8 * demand:
            break
        m *= 2.0
    return (served / span if span > 0 else 0.0), served < 0.8 * demand


def capacity_tokens_per_s(
    build: Callable[[float], Scenario], *, overload: float = OVERLOAD
) -> float:
    """Tokens per second the pool completes on `build`'s traffic mix when saturated
    (the experiments' entry point; see saturated_throughput)."""
    return saturated_throughput(build, overload=overload)[0]


def load_for(build: Callable[[float], Scenario], rho: float, capacity: float) -> float:
    """The rate multiplier at which `build`'s offered tokens/s is `rho` x capacity.

    Offered tokens are counted on the arrivals themselves (same seed), which do not
    scale exactly with the rates over a short run, so the multiplier is corrected a few
    times until the count is within 1% of the target."""
    target = rho * capacity
    base = offered_tokens_per_s(build(1.0))
    if base <= 0 or target <= 0:
        return 1.0
    m = target / base
    for _ in range(6):
        got = offered_tokens_per_s(build(m))
        if got <= 0 or abs(got / target - 1.0) < 0.01:
            break
        m *= target / got
    return m


def _window(sc: Scenario, window_s: float) -> Scenario:
    d = sc.expected_duration()
    if d is None:
        raise ScenarioError(f"{sc.name}: no arrival window (give duration_s)")
    return replace(sc, duration_s=min(d, window_s), load=None)


@cache
def _code_version() -> str:
    """A digest of the simulator's and the core's sources: capacity is a function of them."""
    h = hashlib.sha256(_VERSION.encode())
    root = Path(__file__).resolve().parent.parent
    for sub in ("sim", "admission"):
        for p in sorted((root / sub).glob("*.py")):
            h.update(p.name.encode())
            h.update(p.read_bytes())
    return h.hexdigest()[:16]


def fingerprint(sc: Scenario, window_s: float = WINDOW_S) -> str:
    """What a capacity measurement depends on: pool, traffic, seed, window, code."""
    h = hashlib.sha256()
    h.update(sc.config.model_dump_json().encode())
    h.update(pickle.dumps(sc.workloads, protocol=4))
    for t in sc.traces:
        st = t.path.stat()
        h.update(f"{t.path.resolve()}|{st.st_size}|{st.st_mtime_ns}|{t.speed}|{t.limit}".encode())
        h.update(repr(t.columns).encode())
    h.update(json.dumps([
        sc.seed, sc.gpu_noise, sc.max_num_seqs, sc.duration_s, window_s, OVERLOAD,
        _code_version(),
    ]).encode())
    return h.hexdigest()[:32]


def cache_dir() -> Path:
    """$TRIAGE_CACHE_DIR, else $XDG_CACHE_HOME/triage, else ~/.cache/triage."""
    env = os.environ.get("TRIAGE_CACHE_DIR")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "triage"


_MEMO: dict[str, float] = {}


def measure_capacity(sc: Scenario, *, window_s: float = WINDOW_S) -> float:
    """The scenario's capacity in tokens/s (pinned, cached, or measured now)."""
    if sc.capacity_tokens_per_s is not None:
        return sc.capacity_tokens_per_s
    key = fingerprint(sc, window_s)
    if key in _MEMO:
        return _MEMO[key]
    path = cache_dir() / "capacity" / f"{key}.json"
    try:
        cap = float(json.loads(path.read_text(encoding="utf-8"))["capacity_tokens_per_s"])
    except (OSError, ValueError, KeyError, TypeError):
        log.info("measuring the capacity of %s (admit_all at saturation)", sc.name)
        base = replace(sc, load=None, offered_load=None)
        d = base.expected_duration() or window_s
        # generated traffic: the whole run's shape compressed into the window (periods
        # and day length x k, rates kept), so the mix is the run's, not its first minutes
        k = min(1.0, window_s / d) if base.workloads and not base.traces else 1.0
        cap, full = saturated_throughput(
            lambda m: _window(base.scaled(k, rate=m), window_s)
        )
        if cap <= 0 or not full:
            why = "nothing completed" if cap <= 0 else f"not saturated at {OVERLOAD * 8:g}x"
            raise ScenarioError(
                f"{sc.name}: cannot measure its capacity ({why} in a "
                f"{min(window_s, sc.expected_duration() or 0):g} s window)"
            ) from None
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps({"scenario": sc.name, "capacity_tokens_per_s": cap}))
            tmp.replace(path)
        except OSError as exc:  # a read-only home: measure again next time
            log.debug("capacity cache not written: %s", exc)
    _MEMO[key] = cap
    return cap


def at_load(sc: Scenario, rho: float) -> Scenario:
    """The scenario with arrival rates scaled so offered tokens/s = rho x capacity."""
    if not rho > 0:
        raise ScenarioError(f"load must be positive, got {rho}")
    base = replace(sc, load=None, offered_load=None)
    cap = measure_capacity(base)
    m = load_for(lambda x: base.scaled(1.0, rate=x), rho, cap)
    out = base.scaled(1.0, rate=m)
    return replace(
        out, load=rho, capacity_tokens_per_s=cap,
        offered_load=offered_tokens_per_s(out) / cap, rate_scale=sc.rate_scale * m,
    )


def with_offered_load(sc: Scenario, *, measure: bool = False) -> Scenario:
    """Apply the scenario's requested `load`; with `measure`, report the offered load of
    a scenario without one too (rates as written). Idempotent."""
    if sc.offered_load is not None:
        return sc
    if sc.load is not None:
        return at_load(sc, sc.load)
    if not measure:
        return sc
    try:
        cap = measure_capacity(sc)
    except ScenarioError as exc:  # too short to saturate: run it, without the figure
        log.warning("offered load not measured: %s", exc)
        return sc
    return replace(sc, capacity_tokens_per_s=cap, offered_load=offered_tokens_per_s(sc) / cap)
