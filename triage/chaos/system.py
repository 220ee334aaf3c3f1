"""The system under test: the chaos run's own broker, the admission app and two sim
workers as child processes, on loopback, with faults as methods (kill -9, restart, wipe
the data dir, stop and start the broker)."""

from __future__ import annotations

import logging
import os
import shutil
import signal
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import psutil
import yaml

from triage.config.models import TriageConfig
from triage.demo.processes import ChildProcess, wait_for_metric
from triage.kafka.local import LocalBroker
from triage.ports import free_port, free_run
from triage.topics.admin import create_topics
from triage.topics.names import TopicNames

log = logging.getLogger(__name__)

TENANTS = ("alpha", "beta")


TENANT: dict[str, Any] = {"rate_tokens_per_s": 1e9, "burst_tokens": 1e9, "queue_max": 20_000,
                          "max_queue_wait_ms": 600_000, "sla_ms": 900_000}


def chaos_config(bootstrap: str, names: TopicNames, run_dir: Path,
                 admission: dict[str, Any] | None = None,
                 extra_tenants: list[dict[str, Any]] | None = None) -> TriageConfig:
    """Two tenants with room to spare (and `extra_tenants`, whole tenant entries), a pool
    of two quick simulated GPUs."""
    data: dict[str, Any] = {
        "tenants": [{"name": t, **TENANT} for t in TENANTS] + list(extra_tenants or []),
        "models": [{
            "name": "small", "pool": "p", "layers": 32, "kv_heads": 8, "head_dim": 128,
            "dtype": "bf16", "context_tokens": 8192, "prefill_s_per_token": 1e-5,
            "decode_s_per_token": 0.002, "batch_slowdown": 0.01,
        }],
        "gpu_types": [{"name": "H200", "memory_gib": 141}],
        "pools": [{"name": "p", "gpu_type": "H200", "gpus": ["g0", "g1"],
                   "kv_budget_gib": 40.0, "queue_max": 50_000}],
        "policy": {"preset": "full"},
        "kafka": {"bootstrap_servers": bootstrap, "topic_prefix": names.prefix,
                  "tenant_topics": "shared" if names.shared else "per_tenant"},
        "metrics": {"admission_port": free_port(), "worker_port_base": free_run(2)},
        "admission": {"datadir": str(run_dir / "admission-data"), **(admission or {})},
        "worker": {"heartbeat_s": 0.5},
    }
    cfg = TriageConfig.model_validate(data)
    (run_dir / "triage.yaml").write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    create_topics(bootstrap, names, cfg)
    return cfg


class System:
    """Handles on the running processes; every fault is a method."""

    def __init__(self, cfg: TriageConfig, run_dir: Path, broker: LocalBroker,
                 loglevel: str = "warn") -> None:
        self.cfg = cfg
        self.loglevel = loglevel
        self.run_dir = run_dir
        self.broker = broker
        self.cfg_path = run_dir / "triage.yaml"
        self.admission = self._admission_proc()
        self.workers: dict[str, ChildProcess] = {}
        self.expected_exit = False  # set while we kill or stop the app ourselves
        self.unexpected_exits = 0
        self.peak_rss = 0

    @property
    def http(self) -> str:
        m = self.cfg.metrics
        return f"http://{m.host}:{m.admission_port}"

    def _admission_proc(self) -> ChildProcess:
        return ChildProcess("admission", ["admission", "--config", str(self.cfg_path),
                                          "--loglevel", self.loglevel],
                            self.run_dir / "admission.log")

    # --- start ----------------------------------------------------------------------
    def start_admission(self, timeout_s: float = 180.0) -> float:
        """Start the app; returns seconds until /ready answered 200."""
        t0 = time.monotonic()
        self.admission = self._admission_proc()
        self.admission.start()
        self.expected_exit = False
        if not self.wait_ready(timeout_s):
            raise RuntimeError(f"admission app not ready:\n{self.admission.tail(40)}")
        return time.monotonic() - t0

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.http}/ready", timeout=2.0) as resp:
                return bool(resp.status == 200)
        except (OSError, urllib.error.URLError):
            return False

    def wait_ready(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.admission.alive():
                return False
            if self.ready():
                return True
            time.sleep(0.1)
        return False

    def start_worker(self, gpu: str) -> None:
        i = self.cfg.all_gpus().index(gpu)
        m = self.cfg.metrics
        w = ChildProcess(f"worker-{gpu}", ["worker", "--gpu", gpu, "--backend", "sim",
                                           "--config", str(self.cfg_path)],
                         self.run_dir / f"worker-{gpu}.log")
        w.start()
        self.workers[gpu] = w
        url = f"http://{m.host}:{m.worker_port_base + i}/metrics"
        if not wait_for_metric(url, "triage_worker", timeout_s=90, proc=w):
            raise RuntimeError(f"worker {gpu} did not come up:\n{w.tail(40)}")

    def start_workers(self) -> None:
        for gpu in self.cfg.all_gpus():
            self.start_worker(gpu)

    # --- faults ---------------------------------------------------------------------
    def kill_admission(self, *, wipe_datadir: bool = False) -> None:
        """kill -9 the app (and delete its RocksDB directory when asked)."""
        self.expected_exit = True
        _kill9(self.admission)
        if wipe_datadir:
            shutil.rmtree(self.cfg.admission.datadir, ignore_errors=True)

    def edit_tenants(self, tenants: list[dict[str, Any]]) -> None:
        """Rewrite the config file's tenants (the app's reload timer picks it up)."""
        data = yaml.safe_load(self.cfg_path.read_text())
        data["tenants"] = tenants
        tmp = self.cfg_path.with_suffix(".tmp")
        tmp.write_text(yaml.safe_dump(data))
        tmp.replace(self.cfg_path)  # never a half-written file

    def kill_worker(self, gpu: str) -> None:
        _kill9(self.workers[gpu])

    def stop_broker(self) -> None:
        self.broker.stop()

    def start_broker(self) -> float:
        return self.broker.start().ready_s

    def sigterm_admission(self, limit_s: float) -> float | None:
        """SIGTERM the app; seconds until it exited, None if it outlived `limit_s`."""
        p = self.admission.proc
        if p is None or p.poll() is not None:
            return 0.0
        self.expected_exit = True
        t0 = time.monotonic()
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(timeout=limit_s)
        except Exception:  # subprocess.TimeoutExpired
            _kill9(self.admission)
            return None
        return time.monotonic() - t0

    # --- watching -------------------------------------------------------------------
    def watch(self) -> None:
        """Sample the app's memory; restart it if it exited on its own (and count it)."""
        p = self.admission.proc
        if p is not None and p.poll() is None:
            try:
                rss = psutil.Process(p.pid).memory_info().rss
                self.peak_rss = max(self.peak_rss, rss)
            except psutil.Error:
                pass
        elif not self.expected_exit:
            self.unexpected_exits += 1
            log.error("admission app exited on its own:\n%s", self.admission.tail(30))
            self.expected_exit = True  # restarted by the runner

    def stop(self) -> None:
        for w in self.workers.values():
            w.stop()
        self.expected_exit = True
        self.admission.stop()


def _kill9(proc: ChildProcess) -> None:
    p = proc.proc
    if p is not None and p.poll() is None:
        os.kill(p.pid, signal.SIGKILL)
        p.wait(timeout=10)
