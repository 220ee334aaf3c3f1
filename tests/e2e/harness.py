"""The running system for end-to-end tests: the real admission app and sim workers as
child processes on the real broker, with their own topics, datadir and ports."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from triage.config.models import TriageConfig
from triage.demo.processes import ChildProcess, scrape, wait_for_metric
from triage.ports import free_port, free_run
from triage.topics.admin import create_topics
from triage.topics.names import TopicNames

# The admission app's log level in tests (TRIAGE_TEST_LOGLEVEL=debug to chase a failure).
LOGLEVEL = os.environ.get("TRIAGE_TEST_LOGLEVEL", "warn")

# The full policy with work conservation off: for tests of the quota's own mechanics
# (with it on, an idle pool serves over-quota requests as overage instead of refusing).
QUOTA_BINDS: dict[str, Any] = {"preset": "full", "overage_when_idle": False}


def fast_config(
    bootstrap: str, names: TopicNames, tmp: Path, *, tenants: list[dict[str, Any]],
    gpus: int = 2, kv_budget_gib: float = 40.0, policy: dict[str, Any] | None = None,
    worker: dict[str, Any] | None = None, kafka: dict[str, Any] | None = None,
) -> TriageConfig:
    """A small pool whose simulated GPUs are quick in wall time (tests do not wait long).
    `kafka`: more of the config's kafka section (such as `tenant_topics`)."""
    data: dict[str, Any] = {
        "tenants": tenants,
        "models": [{
            "name": "small", "pool": "p", "layers": 32, "kv_heads": 8, "head_dim": 128,
            "dtype": "bf16", "context_tokens": 8192, "prefill_s_per_token": 1e-5,
            "decode_s_per_token": 0.002, "batch_slowdown": 0.01,
        }],
        "gpu_types": [{"name": "H200", "memory_gib": 141}],
        "pools": [{"name": "p", "gpu_type": "H200", "gpus": [f"g{i}" for i in range(gpus)],
                   "kv_budget_gib": kv_budget_gib, "queue_max": 1000}],
        "policy": policy or {"preset": "full"},
        "kafka": {"bootstrap_servers": bootstrap, "topic_prefix": names.prefix,
                  **(kafka or {})},
        "metrics": {"admission_port": free_port(), "worker_port_base": free_run(gpus)},
        "admission": {"datadir": str(tmp / "admission-data")},
        "worker": {"heartbeat_s": 0.5, **(worker or {})},
    }
    cfg = TriageConfig.model_validate(data)
    (tmp / "triage.yaml").write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    create_topics(bootstrap, names, cfg)
    return cfg


class System:
    """Handles on the running processes."""

    def __init__(self, cfg: TriageConfig, tmp: Path) -> None:
        self.cfg = cfg
        self.tmp = tmp
        self.cfg_path = tmp / "triage.yaml"
        self.admission = self._admission_process(tmp / "admission.log")
        self.workers: list[ChildProcess] = []

    @property
    def metrics_url(self) -> str:
        m = self.cfg.metrics
        return f"http://{m.host}:{m.admission_port}/metrics"

    def _admission_process(self, log_path: Path) -> ChildProcess:
        return ChildProcess(
            "admission", ["admission", "--config", str(self.cfg_path), "--loglevel", LOGLEVEL],
            log_path)

    def start_admission(self) -> None:
        self.admission = self._admission_process(self.admission.log_path)
        self.admission.start()
        if not wait_for_metric(self.metrics_url, "triage_admission_ready 1.0", timeout_s=120,
                               proc=self.admission):
            raise AssertionError(f"admission app did not come up:\n{self.admission.tail(60)}")

    def start_workers(self) -> None:
        m = self.cfg.metrics
        for i, gpu in enumerate(self.cfg.all_gpus()):
            w = ChildProcess(f"worker-{gpu}", ["worker", "--gpu", gpu, "--backend", "sim",
                                               "--config", str(self.cfg_path)],
                             self.tmp / f"worker-{gpu}.log")
            w.start()
            self.workers.append(w)
            url = f"http://{m.host}:{m.worker_port_base + i}/metrics"
            if not wait_for_metric(url, "triage_worker", timeout_s=60, proc=w):
                raise AssertionError(f"worker {gpu} did not come up:\n{w.tail(60)}")

    def metrics(self) -> str:
        return scrape(self.metrics_url) or ""

    def stop(self) -> None:
        for w in self.workers:
            w.stop()
        self.admission.stop()


@contextmanager
def running(cfg: TriageConfig, tmp: Path, *, workers: bool = True) -> Iterator[System]:
    system = System(cfg, tmp)
    try:
        system.start_admission()
        if workers:
            system.start_workers()
        yield system
    finally:
        system.stop()


def wait_until(cond: Callable[[], Any], timeout_s: float, what: str,
               poll_s: float = 0.1) -> None:
    """Poll `cond` until it is true; fail naming `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(poll_s)


@contextmanager
def gateway_running(tmp: Path, keys: Path) -> Iterator[tuple[ChildProcess, str]]:
    """`triage gateway` on the config in `tmp` and a free port, answering /live: its
    process and its base URL (http://127.0.0.1:<port>/v1); stopped after, cleanly."""
    port = free_port()
    gw = ChildProcess("gateway", ["gateway", "--config", str(tmp / "triage.yaml"), "--keys",
                                  str(keys), "--port", str(port)], tmp / "gateway.log")
    gw.start()
    try:
        deadline = time.monotonic() + 60
        while scrape(f"http://127.0.0.1:{port}/live") is None:
            if not gw.alive() or time.monotonic() > deadline:
                raise AssertionError(f"gateway did not answer /live:\n{gw.tail(40)}")
            time.sleep(0.25)
        yield gw, f"http://127.0.0.1:{port}/v1"
    finally:
        assert gw.stop() == 0, gw.tail(40)
