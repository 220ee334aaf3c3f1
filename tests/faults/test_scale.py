"""The scale test (issue 11, part 4), reduced for CI: the admission app sharded over two
partitions, on the real broker, as processes. Two instances split the two pools' shards;
one is killed with SIGKILL mid-run and the other takes its shard over; a third joins and
the shards rebalance; a fourth, one more than the shards, holds none and answers /ready
503 as a standby. The second test gives two instances the rest of the fault suite's
faults, on a broker of its own: the poison corpus spread over both shards, the broker
stopped and started mid-run, and an instance stopped with SIGTERM and restarted under
its name. Through all of it every request ends in exactly one terminal reply and runs once.
Requests are produced with the request id as key (no routing), so about half reach the
wrong shard and are forwarded."""

from __future__ import annotations

import contextlib
import re
import signal
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from confluent_kafka import OFFSET_BEGINNING, TopicPartition
from confluent_kafka.admin import AdminClient

from triage.chaos.observe import Observer, Sender
from triage.chaos.side import PoisonFlow
from triage.config.models import TriageConfig
from triage.demo.processes import ChildProcess, wait_for_metric
from triage.kafka.clients import make_consumer, make_producer
from triage.kafka.local import LocalBroker
from triage.ports import free_port, free_run
from triage.streams.committer import EXIT_FENCED
from triage.topics.admin import create_topics
from triage.topics.messages import CompletionStatus, InferenceRequest, Reply, completions_in
from triage.topics.names import TopicNames

pytestmark = [pytest.mark.faults, pytest.mark.slow]

SHARDS = 2
TENANTS = ("a", "b")
MODELS = {"m1": "p1", "m2": "p2"}


def _config(bootstrap: str, names: TopicNames) -> dict[str, Any]:
    model = {"layers": 32, "kv_heads": 8, "head_dim": 128, "dtype": "bf16",
             "context_tokens": 8192, "prefill_s_per_token": 1e-5, "decode_s_per_token": 0.002,
             "batch_slowdown": 0.01}
    return {
        "tenants": [{"name": t, "rate_tokens_per_s": 1e7, "burst_tokens": 1e7,
                     "max_debt_tokens": 0, "queue_max": 1000, "max_queue_wait_ms": 60_000,
                     "sla_ms": 120_000} for t in TENANTS],
        "models": [{"name": m, "pool": p, **model} for m, p in MODELS.items()],
        "gpu_types": [{"name": "H200", "memory_gib": 141}],
        "pools": [{"name": p, "gpu_type": "H200", "gpus": [f"g{i}"], "kv_budget_gib": 40.0,
                   "queue_max": 2000, "partition": i} for i, p in enumerate(MODELS.values())],
        "policy": {"preset": "full"},
        "kafka": {"bootstrap_servers": bootstrap, "topic_prefix": names.prefix,
                  "request_partitions": SHARDS, "admission_partitions": SHARDS},
        "metrics": {"admission_port": 0, "worker_port_base": free_run(2)},
        "admission": {"session_timeout_s": 6.0},
        "worker": {"heartbeat_s": 0.5},
    }


@dataclass
class Client:
    """Sends requests (keyed by id, unrouted) and follows every partition of the replies
    and completions topics from the beginning."""

    bootstrap: str
    names: TopicNames
    terminals: dict[str, list[str]] = field(default_factory=dict)
    runs: dict[str, set[tuple[int, int]]] = field(default_factory=dict)
    sent: int = 0

    def __post_init__(self) -> None:
        self._p: Any = make_producer(self.bootstrap, **{"message.timeout.ms": 300_000})
        self._c: Any = make_consumer(self.bootstrap, f"{self.names.prefix}-scale-client")
        topics = [self.names.replies(t) for t in TENANTS] + [self.names.completions]
        self._c.assign([TopicPartition(t, n, OFFSET_BEGINNING) for t in topics
                        for n in range(SHARDS)])
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._follow, daemon=True)
        self._thread.start()

    def send(self, n: int, tag: str, rate: float) -> None:
        for i in range(n):
            tenant, model = TENANTS[i % 2], list(MODELS)[(i // 2) % 2]
            rid = f"{tag}-{i}"
            req = InferenceRequest(request_id=rid, tenant=tenant, model=model,
                                   prompt_tokens=64, max_tokens=32,
                                   metadata={"sim_output_tokens": "16"})
            with self._lock:
                self.terminals[rid] = []
            self._p.produce(self.names.requests(tenant), key=rid.encode(), value=req.to_bytes())
            self._p.poll(0)
            self.sent += 1
            time.sleep(1.0 / rate)
        assert self._p.flush(60) == 0

    def _follow(self) -> None:
        while not self._stop.is_set():
            for msg in self._c.consume(num_messages=500, timeout=0.2):
                if msg.error() is not None:
                    continue
                with self._lock:
                    if msg.topic() == self.names.completions:
                        for c in completions_in(msg.value() or b""):
                            if c.status is CompletionStatus.COMPLETED:
                                self.runs.setdefault(c.request_id, set()).add(
                                    (c.attempt, c.started_at_ms))
                        continue
                    r = Reply.from_bytes(msg.value() or b"")
                    if r.status.terminal and r.request_id in self.terminals:
                        self.terminals[r.request_id].append(r.status.value)

    def outstanding(self) -> int:
        with self._lock:
            return sum(1 for v in self.terminals.values() if not v)

    def wait_answered(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while self.outstanding() and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(1.0)  # a second terminal reply, if one were coming, would be in by now

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._c.close()


def _owners(bootstrap: str, group: str, topic: str) -> dict[int, str]:
    """Partition of `topic` -> the group.instance.id of the member that holds it."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    desc = admin.describe_consumer_groups([group])[group].result(timeout=10)
    out: dict[int, str] = {}
    for m in desc.members:
        for tp in m.assignment.topic_partitions:
            if tp.topic == topic:
                assert tp.partition not in out, f"partition {tp.partition} held twice"
                out[tp.partition] = m.group_instance_id or m.member_id
    return out


def _held(log: Path) -> set[int]:
    """The shards an instance's log says it holds now (adopted and not handed over), as
    its latest process wrote it: an instance restarted under its name appends to the same
    log, and what the process before it held (it need not log a hand-over on the way
    out) is not held by the new one, which the group may give another shard."""
    held: set[int] = set()
    last_pid = None
    for pid, n, what in re.findall(r"\[(\d+)\] \[INFO\] shard (\d+) (adopted|handed over)",
                                   log.read_text()):
        if pid != last_pid:
            held, last_pid = set(), pid
        (held.add if what == "adopted" else held.discard)(int(n))
    return held


def _wait(cond: Any, timeout_s: float, what: str) -> float:
    t0 = time.monotonic()
    while True:
        try:
            if cond():
                return time.monotonic() - t0
        except Exception:  # the group is rebalancing
            pass
        if time.monotonic() - t0 > timeout_s:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


class Cluster:
    """Admission instances (each with its own config file, data dir and metrics port) and
    one sim worker per GPU, as processes of one test."""

    def __init__(self, base: dict[str, Any], run_dir: Path, bootstrap: str,
                 names: TopicNames) -> None:
        self.base, self.run_dir, self.bootstrap = base, run_dir, bootstrap
        self.group = f"{names.prefix}.app.triage-admission"
        self.admission_topic = names.admission
        self.procs: dict[str, ChildProcess] = {}
        self.ports: dict[str, int] = {}
        (run_dir / "triage.yaml").write_text(yaml.safe_dump(base))

    def start_instance(self, name: str) -> None:
        self.ports.setdefault(name, free_port())  # a restart keeps its port
        data = {**self.base, "admission": {**self.base["admission"], "instance": name,
                                           "datadir": str(self.run_dir / f"data-{name}")},
                "metrics": {**self.base["metrics"], "admission_port": self.ports[name]}}
        path = self.run_dir / f"{name}.yaml"
        path.write_text(yaml.safe_dump(data))
        p = self.procs[name] = ChildProcess(name, ["admission", "--config", str(path),
                                                   "--loglevel", "info"],
                                            self.run_dir / f"{name}.log")
        p.start()

    def start_workers(self) -> None:
        for gpu in ("g0", "g1"):
            w = self.procs[gpu] = ChildProcess(
                gpu, ["worker", "--gpu", gpu, "--backend", "sim",
                      "--config", str(self.run_dir / "triage.yaml")], self.run_dir / f"{gpu}.log")
            w.start()

    def owners(self) -> dict[int, str]:
        return _owners(self.bootstrap, self.group, self.admission_topic)

    def ready(self, name: str) -> bool:
        return wait_for_metric(f"http://127.0.0.1:{self.ports[name]}/metrics",
                               "triage_admission_ready 1.0", timeout_s=90, proc=self.procs[name])

    def held_as_assigned(self, names: list[str]) -> bool:
        """Each instance holds the services of the shards the group gave it, only."""
        own = self.owners()
        return all(_held(self.run_dir / f"{n}.log") == {p for p, m in own.items()
                                                         if m.endswith(f".instance-{n}")}
                   for n in names)

    def split(self, names: list[str]) -> None:
        """Wait until the shards are spread over two of `names`, each held as assigned."""
        _wait(lambda: len(set(self.owners().values())) == 2 and len(self.owners()) == SHARDS,
              120, "two instances holding one shard each")
        _wait(lambda: self.held_as_assigned(names), 60, "each shard held by its owner only")

    def up(self) -> None:
        """Two instances and the workers started, the shards split between i0 and i1."""
        self.start_instance("i0")
        self.start_instance("i1")
        self.start_workers()
        self.split(["i0", "i1"])
        assert self.ready("i0") and self.ready("i1"), self.tails()

    def state(self, name: str) -> str:
        """The instance's decision metrics (for a failing test's message)."""
        keep = ("triage_queue_depth{", "triage_gpus_up", "triage_admissions_total",
                "triage_requests_total", "triage_forwarded_total", "triage_kv_reserved",
                "triage_queue_timeouts_total", "triage_admission_tightened")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.ports[name]}/metrics",
                                        timeout=5) as r:
                text = r.read().decode()
        except OSError as exc:
            return f"(no metrics from {name}: {exc})"
        return "\n".join(ln for ln in text.splitlines() if ln.startswith(keep)) + "\n"

    def readiness(self, name: str) -> tuple[int, str]:
        """(status, reason) of the instance's /ready."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.ports[name]}/ready",
                                        timeout=5) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    def tails(self, lines: int = 40) -> str:
        return "".join(p.tail(lines) for n, p in self.procs.items() if n.startswith("i"))

    def stop(self) -> None:
        for p in self.procs.values():
            p.stop()


def test_shards_split_fail_over_and_rebalance_with_every_request_answered_once(
    kafka_bootstrap: str, topic_names: TopicNames, tmp_path: Path
) -> None:
    base = _config(kafka_bootstrap, topic_names)
    create_topics(kafka_bootstrap, topic_names, TriageConfig.model_validate(base))
    cluster = Cluster(base, tmp_path, kafka_bootstrap, topic_names)
    procs, owners = cluster.procs, cluster.owners
    client = Client(kafka_bootstrap, topic_names)
    try:
        cluster.up()
        split = owners()

        client.send(200, "split", rate=100.0)
        client.wait_answered(120)
        assert client.outstanding() == 0, cluster.tails()

        # kill -9 the owner of shard 0 mid-run; the other takes its shard over
        victim = "i0" if split[0].endswith(".instance-i0") else "i1"
        survivor = "i1" if victim == "i0" else "i0"
        sender = threading.Thread(target=client.send, args=(300, "kill", 60.0), daemon=True)
        sender.start()
        time.sleep(2.0)
        killed = procs[victim].proc
        assert killed is not None
        killed.kill()  # SIGKILL
        killed.wait(timeout=10)
        takeover_s = _wait(lambda: set(owners()) == {0, 1} and len(set(owners().values())) == 1,
                           60, f"{survivor} holding both shards")
        _wait(lambda: _held(tmp_path / f"{survivor}.log") == {0, 1}, 60, "the shard adopted")
        sender.join(timeout=120)
        client.wait_answered(180)
        assert client.outstanding() == 0, cluster.state(survivor) + procs[survivor].tail(150)
        print(f"takeover after kill -9: {takeover_s:.1f}s")

        # a third instance joins: the shards are spread again, nothing is lost
        cluster.start_instance("i2")
        cluster.split([survivor, "i2"])
        client.send(200, "join", rate=100.0)
        client.wait_answered(120)
        assert client.outstanding() == 0, procs["i2"].tail(60)

        # a third live instance, more than the two shards: the group gives it none, so
        # it decides nothing and says so on /ready, while the two owners stay ready
        cluster.start_instance("i3")
        live = [survivor, "i2", "i3"]

        def one_standby() -> bool:
            answers = sorted((cluster.readiness(n) for n in live), key=lambda a: a[0])
            return (len(set(cluster.owners().values())) == 2
                    and cluster.held_as_assigned(live)
                    and [a[0] for a in answers] == [200, 200, 503]
                    # joined, and given nothing (not still starting: "recovering state")
                    and answers[2][1].startswith("no shard assigned"))

        _wait(one_standby, 120, "two owners ready and one standby")
        client.send(100, "standby", rate=100.0)
        client.wait_answered(120)
        assert client.outstanding() == 0, cluster.tails()

        assert client.sent == 800
        twice = {rid: t for rid, t in client.terminals.items() if len(t) != 1}
        assert not twice, f"{len(twice)} requests without exactly one terminal reply"
        assert all(t == ["completed"] for t in client.terminals.values()), {
            s for t in client.terminals.values() for s in t}
        ran_twice = [rid for rid, runs in client.runs.items() if len(runs) > 1]
        assert not ran_twice, ran_twice[:10]
    finally:
        client.close()
        cluster.stop()


def _steady(bootstrap: str, names: TopicNames, obs: Observer, tag: str, seconds: float) -> Sender:
    """Requests of both tenants to both models (so both shards) at 40/s, started."""
    sender = Sender(bootstrap, names, list(TENANTS), obs, rate=lambda _t: 40.0,
                    duration_s=seconds, tag=tag, output_tokens=16, models=tuple(MODELS))
    sender.start()
    return sender


def _settled(obs: Observer, timeout_s: float) -> None:
    try:
        _wait(lambda: obs.outstanding() == 0, timeout_s, "every request answered")
    except AssertionError as exc:  # say whether the app answered and a transaction holds it
        try:
            why = obs.explain_outstanding()
        except Exception as failed:  # the broker may be the trouble: keep the first failure
            why = f"(no account: {failed!r})"
        raise AssertionError(f"{exc}: {why}") from None
    time.sleep(1.0)  # a second terminal reply, if one were coming, would be in by now


def test_two_instances_ride_out_a_broker_restart_and_a_graceful_restart(
    topic_names: TopicNames, tmp_path: Path
) -> None:
    port = free_run(2)
    broker = LocalBroker(port=port, controller_port=port + 1, data_dir=tmp_path / "broker")
    broker.start()
    bootstrap = broker.bootstrap
    base = _config(bootstrap, topic_names)
    create_topics(bootstrap, topic_names, TriageConfig.model_validate(base))
    cluster = Cluster(base, tmp_path, bootstrap, topic_names)
    obs = Observer(bootstrap, topic_names, list(TENANTS), partitions=SHARDS)
    obs.start()
    try:
        cluster.up()

        # the poison corpus over both shards (keyed by id: about half lands on the shard
        # that does not own m2 and is forwarded, invalid messages too): every entry is
        # answered once or dead-lettered under the offset it was written at
        poison = PoisonFlow(bootstrap, topic_names, obs, "s", tenant="a", model="m2")
        assert poison.inject() >= 60
        with contextlib.suppress(AssertionError):
            _wait(lambda: poison.count()["poison"]["unaccounted"] == 0, 120, "the corpus")
        assert not poison.unaccounted(), (poison.unaccounted(), sorted(obs.dead)[:40])
        time.sleep(1.0)  # a second terminal reply, if one were coming, would be in by now
        g = poison.count()["poison"]
        assert g["answered"] > 0 and g["dead_lettered"] > 0 and g["duplicates"] == 0, g
        assert {slot[0] for _e, slot, _errs in poison.sent} == {0, 1}  # both shards got some

        # the broker goes away for 5 s while requests flow, and comes back
        sender = _steady(bootstrap, topic_names, obs, "broker", 10.0)
        time.sleep(3.0)
        broker.stop()
        time.sleep(5.0)
        broker.start()
        sender.join(timeout=300)
        _settled(obs, 240)
        assert sender.failed == 0
        assert all(cluster.procs[n].alive() for n in ("i0", "i1")), cluster.tails()

        # SIGTERM one instance mid-run and start it again under the same name
        sender = _steady(bootstrap, topic_names, obs, "term", 10.0)
        time.sleep(2.0)
        assert cluster.procs["i1"].stop(timeout_s=30.0) is not None
        cluster.start_instance("i1")
        sender.join(timeout=120)
        cluster.split(["i0", "i1"])
        _settled(obs, 180)

        steady = obs.seen
        assert len(steady) >= 700, len(steady)  # 10 s + 10 s at 40/s
        wrong = {rid: (s.terminals, s.terminal) for rid, s in steady.items()
                 if s.terminals != 1 or s.terminal != "completed"}
        assert not wrong, list(wrong.items())[:10]
        ran_twice = [rid for rid, runs in obs.completed_runs.items() if len(runs) > 1]
        assert not ran_twice, ran_twice[:10]
    finally:
        obs.stop()
        cluster.stop()
        broker.stop()


def test_a_frozen_owner_that_wakes_after_its_shard_moved_answers_nothing_twice(
    kafka_bootstrap: str, topic_names: TopicNames, tmp_path: Path
) -> None:
    """A zombie: the owner of shard 0 is frozen (SIGSTOP) past its session timeout while
    requests flow, the other instance takes the shard over, then the frozen one wakes
    (SIGCONT) with its fetched records, staged outputs and open state of a shard it no
    longer owns: it must decide and send nothing more, and leave (exit 75); restarted,
    it takes a shard again. Every request ends in exactly one terminal reply and runs
    once. Before the lapse guard, 4 of 900 requests got no reply (the woken instance kept
    its stale state when the group gave the shard back) or, with a rebuild from its local
    tables instead, 1 of 6 runs answered a request twice."""
    base = _config(kafka_bootstrap, topic_names)
    create_topics(kafka_bootstrap, topic_names, TriageConfig.model_validate(base))
    cluster = Cluster(base, tmp_path, kafka_bootstrap, topic_names)
    procs, owners = cluster.procs, cluster.owners
    client = Client(kafka_bootstrap, topic_names)
    try:
        cluster.up()
        split = owners()
        frozen = "i0" if split[0].endswith(".instance-i0") else "i1"
        survivor = "i1" if frozen == "i0" else "i0"
        sender = threading.Thread(target=client.send, args=(900, "zombie", 50.0), daemon=True)
        sender.start()
        time.sleep(2.0)
        proc = procs[frozen].proc
        assert proc is not None
        proc.send_signal(signal.SIGSTOP)
        try:
            _wait(lambda: set(owners()) == {0, 1} and len(set(owners().values())) == 1,
                  60, f"{survivor} holding both shards")
            _wait(lambda: _held(tmp_path / f"{survivor}.log") == {0, 1}, 60, "the shard adopted")
            time.sleep(3.0)  # the survivor decides for the frozen one's shard a while
        finally:
            proc.send_signal(signal.SIGCONT)
        sender.join(timeout=120)
        client.wait_answered(180)
        assert client.outstanding() == 0, cluster.state(survivor) + procs[survivor].tail(100)
        # the woken one saw it was no longer a member, decided nothing and left (75)
        assert proc.wait(timeout=60) == EXIT_FENCED, procs[frozen].tail(60)
        # restarted under its name, it rejoins, recovers its tables and decides again
        cluster.start_instance(frozen)
        cluster.split([frozen, survivor])
        client.send(100, "after", rate=50.0)
        client.wait_answered(120)
        assert client.outstanding() == 0, cluster.tails()
        assert client.sent == 1000
        twice = {rid: t for rid, t in client.terminals.items() if len(t) != 1}
        assert not twice, (f"{len(twice)} requests without exactly one terminal reply: "
                           f"{list(twice.items())[:5]}\n" + procs[frozen].tail(80))
        assert all(t == ["completed"] for t in client.terminals.values()), {
            s for t in client.terminals.values() for s in t}
        ran_twice = [rid for rid, runs in client.runs.items() if len(runs) > 1]
        assert not ran_twice, (len(ran_twice), ran_twice[:10])
    finally:
        client.close()
        cluster.stop()
