"""Run chaos scenarios: traffic in, faults injected at a steady pace, answers counted.

Each scenario: fresh topics, the app and two sim workers started, a sender at `rate`
for `duration_s` while the faults fire at evenly spaced times, then a drain until every
request has its terminal reply (or `drain_s` passes). The runner plays the supervisor
that restarts what it killed; it never restarts an app that exited on its own without
counting it.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from triage.chaos.observe import Observer, Sender
from triage.chaos.plan import ChaosPlan, Scenario
from triage.chaos.report import ChaosReport, ScenarioResult, p99
from triage.chaos.side import REMOVED, ConfigFlow, PoisonFlow, config_tenants
from triage.chaos.system import TENANTS, System, chaos_config
from triage.kafka.local import LocalBroker
from triage.topics.names import TopicNames

log = logging.getLogger(__name__)

Progress = Callable[[str], None]
DRAIN_CAP_S = 1200.0


def run(plan: ChaosPlan, out_dir: Path, progress: Progress | None = None) -> ChaosReport:
    """Every scenario of the plan on a broker of its own (started here, stopped after)."""
    say = progress or (lambda _m: None)
    out_dir.mkdir(parents=True, exist_ok=True)
    broker = LocalBroker(port=plan.port, controller_port=plan.port + 1,
                         data_dir=out_dir / "broker")
    say(f"starting Kafka on {broker.bootstrap}")
    broker.start()
    report = ChaosReport()
    try:
        for sc in plan.scenarios:
            say(f"scenario {sc.value}")
            run_dir = out_dir / f"{sc.value}-{time.strftime('%H%M%S')}"
            report.results.append(run_scenario(sc, plan, broker, run_dir, say))
    finally:
        broker.stop()
    return report


def run_scenario(sc: Scenario, plan: ChaosPlan, broker: LocalBroker, run_dir: Path,
                 say: Progress) -> ScenarioResult:
    if sc is Scenario.FORGERY:  # its own secured broker, no traffic
        from triage.chaos.forgery import run_forgery

        return run_forgery(plan, say)
    run_dir.mkdir(parents=True, exist_ok=True)
    tag = uuid.uuid4().hex[:8]
    names = TopicNames.of(f"chaos{tag}", plan.tenant_topics)
    extra = config_tenants() if sc is Scenario.CONFIG else []
    cfg = chaos_config(broker.bootstrap, names, run_dir, {
        "static_membership": plan.static_membership, "session_timeout_s": plan.session_timeout_s},
        extra)
    system = System(cfg, run_dir, broker, plan.app_loglevel)
    res = ScenarioResult(scenario=sc.value)
    system.start_admission()
    system.start_workers()
    obs = Observer(broker.bootstrap, names, [*TENANTS, *(t["name"] for t in extra)])
    obs.start()
    side: PoisonFlow | ConfigFlow | None = None
    if sc is Scenario.POISON:
        side = PoisonFlow(broker.bootstrap, names, obs, tag)
    elif sc is Scenario.CONFIG:
        side = ConfigFlow(broker.bootstrap, names, obs, system, tag=tag,
                          live=plan.config_live, added=plan.config_added, say=say)
    d = plan.duration_s
    over_at = d / 3.0

    def rate(t: float) -> float:
        if sc is Scenario.OVERLOAD and over_at <= t < over_at + plan.overload_s:
            return plan.rate * plan.overload_factor
        return plan.rate

    duration = max(d, over_at + plan.overload_s + 5.0) if sc is Scenario.OVERLOAD else d
    sender = Sender(broker.bootstrap, names, list(TENANTS), obs, rate=rate,
                    duration_s=duration, tag=tag, output_tokens=plan.output_tokens)
    n = {Scenario.APP_KILL: plan.kills, Scenario.DATADIR_WIPE: plan.kills,
         Scenario.WORKER_KILL: plan.worker_kills, Scenario.POISON: plan.poison_rounds,
         }.get(sc, 1)
    fault_at = [duration * (i + 1) / (n + 1) for i in range(n)]
    t0 = time.time()
    sender.start()
    try:
        while fault_at or sender.is_alive():
            _watch(system, res)
            if fault_at and time.time() - t0 >= fault_at[0]:
                fault_at.pop(0)
                res.faults += 1
                if side is not None:
                    _inject_side(side, say, res.faults)
                else:
                    _inject(sc, system, plan, res, obs, say, res.faults)
            time.sleep(0.1)
        sender.join()
        res.sent, res.not_delivered = sender.sent, sender.failed
        say(f"  {res.sent} sent; draining")
        _drain(system, res, obs, plan.drain_s)
        time.sleep(2.0)  # late duplicates, if any, arrive now
        _watch(system, res)
    finally:
        sender.stop()
        obs.stop()
        system.stop()
    _count(res, obs, system)
    if side is not None:
        res.groups = side.count()
        if isinstance(side, PoisonFlow):
            res.max_decision_gap_s = side.max_gap_s()
        else:
            res.notes += side.notes
        res.notes += _log_errors(system)
    say(f"  {res.answered}/{res.sent} answered, {res.lost} lost, "
        f"{res.duplicate_terminals} terminal>1, {res.executed_twice} executed twice")
    return res


def _inject_side(side: PoisonFlow | ConfigFlow, say: Progress, i: int) -> None:
    if isinstance(side, PoisonFlow):
        n = side.inject()
        say(f"  poison round #{i}: {n} entries sent")
    else:
        side.inject()
        say(f"  config: {REMOVED} removed, a tenant hot-added; "
            + ", ".join(f"{k} {len(v)} sent" for k, v in side.ids.items()))


def _log_errors(system: System) -> list[str]:
    """Tracebacks in the app's log (a handler that let an exception through)."""
    try:
        text = system.admission.log_path.read_text(errors="replace")
    except OSError:
        return []
    n = text.count("Traceback")
    return [f"{n} tracebacks in the app's log"] if n else []


def _drain(system: System, res: ScenarioResult, obs: Observer, idle_s: float) -> None:
    """Wait for the outstanding answers while they keep coming: give up after `idle_s`
    without a new one, or after DRAIN_CAP_S in all (a backlog after overload is slow)."""
    cap = time.monotonic() + DRAIN_CAP_S
    left, moved = obs.outstanding(), time.monotonic()
    while left and time.monotonic() < cap and time.monotonic() - moved < idle_s:
        _watch(system, res)
        time.sleep(0.5)
        now_left = obs.outstanding()
        if now_left < left:
            left, moved = now_left, time.monotonic()


def _watch(system: System, res: ScenarioResult) -> None:
    """Count and restart an app that exited on its own (it must never happen)."""
    system.watch()
    if system.unexpected_exits > res.unexpected_exits:
        res.unexpected_exits = system.unexpected_exits
        res.notes.append(f"app exited on its own:\n{system.admission.tail(15)}")
        system.start_admission()


def _inject(sc: Scenario, system: System, plan: ChaosPlan, res: ScenarioResult, obs: Observer,
            say: Progress, i: int) -> None:
    t = time.time()
    if sc in (Scenario.APP_KILL, Scenario.DATADIR_WIPE):
        system.kill_admission(wipe_datadir=sc is Scenario.DATADIR_WIPE)
        system.start_admission()
        res.recovery_s.append(time.time() - t)
        _first_decision(res, obs, t)
        say(f"  kill -9 #{i}: ready again after {res.recovery_s[-1]:.1f}s")
    elif sc is Scenario.WORKER_KILL:
        gpu = system.cfg.all_gpus()[(i - 1) % 2]
        system.kill_worker(gpu)
        system.start_worker(gpu)
        res.recovery_s.append(time.time() - t)
        say(f"  kill -9 worker {gpu}: back after {res.recovery_s[-1]:.1f}s")
    elif sc is Scenario.BROKER:
        system.stop_broker()
        say(f"  broker stopped for {plan.broker_down_s:.0f}s")
        _sleep_watching(system, res, plan.broker_down_s)
        up = time.time()
        system.start_broker()
        ok = system.wait_ready(180.0)
        res.recovery_s.append(time.time() - up)
        _first_decision(res, obs, up)
        say(f"  broker back; app ready after {res.recovery_s[-1]:.1f}s" if ok
            else "  broker back; app NOT ready")
    elif sc is Scenario.OVERLOAD:
        say(f"  {plan.overload_factor:.0f}x overload for {plan.overload_s:.0f}s")
    elif sc is Scenario.SIGTERM:
        system.stop_broker()
        _sleep_watching(system, res, 5.0)
        res.sigterm_exit_s = system.sigterm_admission(plan.sigterm_limit_s)
        say(f"  SIGTERM with the broker gone: exit after {res.sigterm_exit_s}s")
        system.start_broker()
        system.start_admission()  # it must lose nothing it had taken in
        res.recovery_s.append(time.time() - t)


def _first_decision(res: ScenarioResult, obs: Observer, t: float, wait_s: float = 60.0) -> None:
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        x = obs.first_decision_after(t)
        if x is not None:
            res.first_decision_s.append(x)
            return
        time.sleep(0.2)


def _sleep_watching(system: System, res: ScenarioResult, seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        _watch(system, res)
        time.sleep(0.2)


def _count(res: ScenarioResult, obs: Observer, system: System) -> None:
    seen = list(obs.seen.items())
    res.answered = sum(1 for _, s in seen if s.terminal is not None)
    lost = [rid for rid, s in seen if s.terminal is None]
    res.lost = len(lost)
    res.lost_ids = lost[:20]
    dups = [rid for rid, s in seen if s.terminals > 1]
    res.duplicate_terminals = len(dups)
    res.duplicate_ids = dups[:20]
    res.executed_twice = sum(1 for runs in obs.completed_runs.values() if len(runs) > 1)
    res.gpu_lost = obs.gpu_lost
    res.unexpected_exits = max(res.unexpected_exits, system.unexpected_exits)
    res.peak_rss_mb = system.peak_rss / 2**20
    res.client_p99_s = p99([s.terminal_at - s.sent_at for _, s in seen
                            if s.terminal_at is not None and s.terminal == "completed"])
    res.reported_p99_s = p99([s.reported_latency_s for _, s in seen
                              if s.reported_latency_s is not None])
