"""A single-node Apache Kafka broker (KRaft) run from Maven-resolved jars.

There is no Docker engine on our machines, so the broker is Apache Kafka's own
`kafka.Kafka` main class on a classpath that Maven copies into a cache outside
the repository (ops/kafka/pom.xml). Everything here is idempotent: `install`
runs Maven once, storage is formatted once, `start` on a running broker
returns at once, and a pid file left by a dead broker is cleaned up.

A data dir is formatted either plaintext (the default) or secured (SASL/SCRAM and
ACLs, triage/kafka/secure.py); it keeps that mode for good.
"""

from __future__ import annotations

import base64
import contextlib
import logging
import os
import shlex
import shutil
import signal
import socket
import string
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import psutil

from triage.config.models import TriageConfig
from triage.kafka.clients import broker_reachable
from triage.kafka.jars import (  # re-exported: KAFKA_VERSION, kafka_home
    KAFKA_VERSION,
    OPS_DIR,
    REPO_ROOT,
    install_jars,
    jars_installed,
    kafka_home,
    locked,
    require_tool,
)
from triage.kafka.local_types import (
    BrokerStartError,
    BrokerStatus,
    ForeignBrokerError,
    LocalBrokerError,
    PortInUseError,
    StartResult,
    ToolMissingError,
)
from triage.kafka.secure import (
    CredentialStore,
    ProvisionResult,
    broker_security_properties,
    format_scram_args,
    provision,
)
from triage.topics.names import TopicNames

__all__ = [
    "DEFAULT_HEAP", "DEFAULT_PORT", "KAFKA_VERSION", "BrokerStartError", "BrokerStatus",
    "ForeignBrokerError", "LocalBroker", "LocalBrokerError", "PortInUseError", "StartResult",
    "ToolMissingError", "default_data_dir", "kafka_home", "port_open",
]

log = logging.getLogger(__name__)

DEFAULT_PORT = 9092
DEFAULT_HEAP = "-Xms512m -Xmx1g"  # enough for tests and the demo on a 2-core, 24 GB machine
_MAIN_CLASS = "kafka.Kafka"


def default_data_dir(port: int) -> Path:
    return Path.home() / ".cache" / "triage" / "kafka-data" / str(port)


def port_open(port: int, host: str = "127.0.0.1", timeout_s: float = 0.5) -> bool:
    """True when something accepts TCP connections on host:port (quietly, no Kafka client)."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def _java() -> str:
    java_home = os.environ.get("JAVA_HOME")
    if java_home and (Path(java_home) / "bin" / "java").is_file():
        return str(Path(java_home) / "bin" / "java")
    return require_tool(
        "java", "install a JDK or JRE 17 (e.g. apt-get install openjdk-17-jre-headless)"
    )


def _tail(path: Path, lines: int = 25) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join(text[-lines:])


class LocalBroker:
    """One local KRaft broker, identified by its port and data directory."""

    def __init__(
        self,
        *,
        port: int = DEFAULT_PORT,
        controller_port: int | None = None,
        data_dir: str | Path | None = None,
        heap_opts: str = DEFAULT_HEAP,
        home: str | Path | None = None,
        ready_timeout_s: float = 90.0,
        secure: bool | None = None,
    ) -> None:
        """`secure`: True formats a new data dir secured, False plaintext; None (default)
        takes the mode the data dir was formatted with (plaintext for a new one)."""
        self.port = port
        self.controller_port = controller_port if controller_port is not None else port + 1
        for what, value in (("port", self.port), ("controller port", self.controller_port)):
            if not 1 <= value <= 65535:
                raise LocalBrokerError(f"{what} {value} is not a TCP port (1-65535)")
        self.data_dir = Path(data_dir).expanduser() if data_dir else default_data_dir(port)
        self.heap_opts = heap_opts
        self.home = Path(home).expanduser() if home else kafka_home()
        self.ready_timeout_s = ready_timeout_s
        self._secure_wanted = secure

    # --- paths ---------------------------------------------------------------

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def lib_dir(self) -> Path:
        return self.home / "lib"

    @property
    def log_path(self) -> Path:
        return self.data_dir / "logs" / "server.log"

    @property
    def _stdout_path(self) -> Path:
        return self.data_dir / "logs" / "stdout.log"

    @property
    def _pid_file(self) -> Path:
        return self.data_dir / "broker.pid"

    @property
    def _server_properties(self) -> Path:
        return self.data_dir / "server.properties"

    @property
    def _log_dirs(self) -> Path:
        return self.data_dir / "kraft-logs"

    @property
    def _mode_file(self) -> Path:
        return self.data_dir / "security.mode"

    @property
    def credentials(self) -> CredentialStore:
        """Passwords of a secured broker's principals (under the data dir)."""
        return CredentialStore(self.data_dir, self.bootstrap)

    # --- security mode ---------------------------------------------------------

    def _formatted_mode(self) -> str | None:
        """The mode a formatted data dir has (secure, plaintext); None before the first format."""
        if not (self._log_dirs / "meta.properties").is_file():
            return None
        try:
            return self._mode_file.read_text().strip() or "plaintext"
        except OSError:
            return "plaintext"  # formatted before secured mode existed

    @property
    def secure(self) -> bool:
        mode = self._formatted_mode()
        if mode is not None:
            return mode == "secure"
        return bool(self._secure_wanted)

    def _check_mode(self) -> None:
        mode = self._formatted_mode()
        if mode is None or self._secure_wanted is None:
            return
        if (mode == "secure") != self._secure_wanted:
            want = "--secure" if self._secure_wanted else "plaintext"
            raise LocalBrokerError(
                f"{self.data_dir} was formatted {mode}; it cannot start {want} (use another "
                "--port or --data-dir, or delete that data dir)"
            )
        if self._secure_wanted and self.data_dir.resolve().is_relative_to(REPO_ROOT):
            raise LocalBrokerError("a secured broker's data dir holds its credentials and must "
                                   f"be outside the repository, not {self.data_dir}")

    def client_settings(self) -> dict[str, Any]:
        """What a client needs to reach this broker as its operator (admin when secured)."""
        return self.credentials.settings("admin") if self.secure else {}

    def _reachable(self, timeout_s: float) -> bool:
        return broker_reachable(self.bootstrap, timeout_s=timeout_s, **self.client_settings())

    def provision(self, config: TriageConfig, names: TopicNames | None = None) -> ProvisionResult:
        """Users and ACLs for `config` on this secured broker (idempotent)."""
        if not self.secure:
            raise LocalBrokerError(f"the broker on {self.bootstrap} is not secured (--secure)")
        return provision(self.credentials, config, names)

    # --- install -------------------------------------------------------------

    def installed(self) -> bool:
        return jars_installed(self.home)

    def install(self, *, force: bool = False) -> bool:
        """Copy Kafka's runtime jars from Maven into the cache; True when Maven ran."""
        return install_jars(self.home, force=force)

    # --- status --------------------------------------------------------------

    def _our_pid(self) -> int | None:
        """The pid in the pid file if that process is our broker; clears a stale file."""
        try:
            pid = int(self._pid_file.read_text().strip())
        except (OSError, ValueError):
            return None
        if _is_our_broker(pid, self._server_properties):
            return pid
        log.info("removing stale pid file %s (pid %d is not our broker)", self._pid_file, pid)
        self._pid_file.unlink(missing_ok=True)
        return None

    def status(self) -> BrokerStatus:
        pid = self._our_pid()
        secure = self.secure
        reachable = port_open(self.port) and self._reachable(3.0)
        return BrokerStatus(
            bootstrap=self.bootstrap,
            port=self.port,
            controller_port=self.controller_port,
            pid=pid,
            managed=pid is not None,
            reachable=reachable,
            version=KAFKA_VERSION if pid is not None else None,
            data_dir=str(self.data_dir),
            log_path=str(self.log_path),
            secure=secure,
            credentials=str(self.credentials.index) if secure else None,
        )

    # --- start ---------------------------------------------------------------

    def start(self) -> StartResult:
        """Start the broker unless ours already runs; return when it answers metadata."""
        t0 = time.monotonic()
        fresh = not self.data_dir.exists()
        try:
            with locked(self.data_dir / ".lock"):
                pid = self._our_pid()
                if pid is not None:  # ours runs already (maybe still starting): wait for it
                    self._wait_ready(pid, time.monotonic())
                    return StartResult(self.status(), False, False, 0.0, time.monotonic() - t0)
                self._check_mode()
                self._check_ports_free()
                java = _java()
                self.install()
                self._write_properties()
                formatted = self._format_once(java)
                launched = time.monotonic()
                pid = self._launch(java)
                ready_s = self._wait_ready(pid, launched)
        except LocalBrokerError:
            if fresh and not self.log_path.parent.exists():  # never launched: leave nothing
                shutil.rmtree(self.data_dir, ignore_errors=True)
            raise
        log.info("Kafka %s ready on %s after %.1fs (pid %d)", KAFKA_VERSION, self.bootstrap,
                 ready_s, pid)  # fmt: skip
        return StartResult(self.status(), True, formatted, ready_s, time.monotonic() - t0)

    def _check_ports_free(self) -> None:
        if port_open(self.port):
            if broker_reachable(self.bootstrap, timeout_s=3.0):
                raise ForeignBrokerError(self.bootstrap)
            raise PortInUseError(f"port {self.port} is in use by something that is not Kafka")
        if port_open(self.controller_port):
            raise PortInUseError(
                f"controller port {self.controller_port} is in use; pick another --port "
                "(the controller takes port + 1)"
            )

    def _write_properties(self) -> None:
        template = string.Template((OPS_DIR / "server.properties.template").read_text())
        secure = self.secure
        self.data_dir.mkdir(parents=True, exist_ok=True)
        text = template.substitute(
            port=self.port, controller_port=self.controller_port, log_dirs=self._log_dirs,
            listener="SASL_PLAINTEXT" if secure else "PLAINTEXT",
            security=broker_security_properties(self.credentials) if secure else "",
        )
        # Secured, it holds the admin and controller passwords: private from the start.
        fd = os.open(self._server_properties, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.chmod(self._server_properties, 0o600)

    def _format_once(self, java: str) -> bool:
        """Format KRaft storage unless this data dir already has it."""
        if (self._log_dirs / "meta.properties").is_file():
            return False
        cluster_id = _random_cluster_id()
        secure = self.secure
        cmd = [
            java, *self._jvm_opts(heap="-Xmx256m"), "-cp", str(self.lib_dir / "*"),
            "kafka.tools.StorageTool", "format", "-t", cluster_id,
            "-c", str(self._server_properties), "--ignore-formatted",
            *(format_scram_args(self.credentials) if secure else []),
        ]  # fmt: skip
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
        if proc.returncode != 0:
            raise BrokerStartError(
                f"formatting {self._log_dirs} failed:\n{proc.stdout}{proc.stderr}"
            )
        self._mode_file.write_text("secure\n" if secure else "plaintext\n")
        log.info("formatted KRaft storage in %s (cluster id %s)", self._log_dirs, cluster_id)
        return True

    def _jvm_opts(self, heap: str) -> list[str]:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        return [
            *shlex.split(heap),
            "-XX:+UseG1GC",
            "-XX:MaxGCPauseMillis=20",
            "-Djava.awt.headless=true",
            f"-Dlog4j.configuration=file:{OPS_DIR / 'log4j.properties'}",
            f"-Dkafka.logs.dir={self.log_path.parent}",
        ]

    def _launch(self, java: str) -> int:
        """Start java detached (own session, reparented to init) and record its pid."""
        cmd = [
            java, *self._jvm_opts(self.heap_opts), "-cp", str(self.lib_dir / "*"),
            _MAIN_CLASS, str(self._server_properties),
        ]  # fmt: skip
        # sh backgrounds java and exits at once, so java is nobody's child and never a zombie.
        script = '"$@" </dev/null >>"$TRIAGE_KAFKA_STDOUT" 2>&1 & echo $!'
        env = {**os.environ, "TRIAGE_KAFKA_STDOUT": str(self._stdout_path)}
        proc = subprocess.run(
            ["/bin/sh", "-c", script, "sh", *cmd],
            capture_output=True, text=True, env=env, timeout=30, start_new_session=True,
            check=True,
        )  # fmt: skip
        pid = int(proc.stdout.strip())
        self._pid_file.write_text(f"{pid}\n")
        log.info("launched Kafka %s (pid %d), log %s", KAFKA_VERSION, pid, self.log_path)
        return pid

    def _wait_ready(self, pid: int, since: float) -> float:
        deadline = since + self.ready_timeout_s
        while True:
            if not _is_our_broker(pid, self._server_properties):
                self._pid_file.unlink(missing_ok=True)
                raise BrokerStartError(
                    f"the broker (pid {pid}) exited during start-up; last lines of "
                    f"{self.log_path}:\n{_tail(self.log_path)}\n{_tail(self._stdout_path)}"
                )
            if port_open(self.port) and self._reachable(2.0):
                return time.monotonic() - since
            if time.monotonic() > deadline:
                raise BrokerStartError(
                    f"the broker (pid {pid}) did not answer on {self.bootstrap} within "
                    f"{self.ready_timeout_s:.0f}s; see {self.log_path}"
                )
            time.sleep(0.2)

    # --- stop ----------------------------------------------------------------

    def stop(self, *, timeout_s: float = 30.0) -> bool:
        """SIGTERM our broker, wait, SIGKILL if it lingers; False when ours was not running."""
        with locked(self.data_dir / ".lock"):
            pid = self._our_pid()
            if pid is None:
                return False
            log.info("stopping Kafka (pid %d)", pid)
            proc = psutil.Process(pid)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
            try:
                proc.wait(timeout=timeout_s)
            except psutil.TimeoutExpired:
                log.warning("Kafka (pid %d) ignored SIGTERM for %.0fs; killing it", pid, timeout_s)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                with contextlib.suppress(psutil.TimeoutExpired):
                    proc.wait(timeout=10)
            except psutil.NoSuchProcess:
                pass
            self._pid_file.unlink(missing_ok=True)
            return True


def _is_our_broker(pid: int, server_properties: Path) -> bool:
    """True when pid is a live java running kafka.Kafka with our server.properties."""
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        cmdline = proc.cmdline()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return False
    return _MAIN_CLASS in cmdline and str(server_properties) in cmdline


def _random_cluster_id() -> str:
    """Same format as `kafka-storage.sh random-uuid`, without starting a JVM.

    Like Kafka's Uuid.randomUuid, never start with '-' (it would read as a CLI option).
    """
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cid.startswith("-"):
            return cid
