"""What the local broker reports and raises (kept apart from the process handling)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


class LocalBrokerError(RuntimeError):
    """The local broker could not be installed, started or stopped."""


class ToolMissingError(LocalBrokerError):
    """java or mvn is not installed."""


class PortInUseError(LocalBrokerError):
    """Something that is not a Kafka broker listens on one of our ports."""


class ForeignBrokerError(LocalBrokerError):
    """A Kafka broker that triage did not start already serves the port."""

    def __init__(self, bootstrap: str) -> None:
        super().__init__(
            f"a Kafka broker that triage did not start already answers on {bootstrap}; "
            "triage leaves it alone (use it, stop it yourself, or pick another --port)"
        )
        self.bootstrap = bootstrap


class BrokerStartError(LocalBrokerError):
    """The broker process exited or never answered a metadata request."""


@dataclass(frozen=True, slots=True)
class BrokerStatus:
    """What `triage kafka status` reports."""

    bootstrap: str  # host:port clients connect to
    port: int
    controller_port: int
    pid: int | None  # pid of the broker we started, None when ours is not running
    managed: bool  # True when the broker on the port is the one we started
    reachable: bool  # a metadata request succeeded (an open port is not enough)
    version: str | None  # Kafka version of our broker; None for a foreign one
    data_dir: str
    log_path: str
    secure: bool = False  # SASL/SCRAM + ACLs (the data dir was formatted with --secure)
    credentials: str | None = None  # credentials.yaml of a secured broker

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class StartResult:
    """What `start` did, and how long the broker took to answer."""

    status: BrokerStatus
    started: bool  # False when it was already running (nothing was done)
    formatted: bool  # storage was formatted on this start (first run of a data dir)
    ready_s: float  # launch to first answered metadata request (0 when not started)
    total_s: float  # including install and storage format
