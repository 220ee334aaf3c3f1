"""The NVML probe: the real no-driver fallback, the reading -> heartbeat mapping, and
the read path against a stand-in NVML (no GPU on CI)."""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest

from triage.config import TriageConfig
from triage.config.models import GIB
from triage.topics.messages import GpuState
from triage.workers.backends.base import EngineLoad
from triage.workers.errors import UnknownGpuError
from triage.workers.nvml import GpuReading, NvmlProbe, gpu_status, open_probe

LOAD = EngineLoad(running=3, waiting=1, kv_used_bytes=5 * GIB, utilization=0.25)


def _nvml_present() -> bool:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return True


def test_no_driver_falls_back_to_the_declared_gpu(
    triage_config: TriageConfig, caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if _nvml_present():  # a GPU machine: take the driver away, as a CPU-only host has none
        def no_library() -> None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

        monkeypatch.setattr(pynvml, "nvmlInit", no_library)
    with caplog.at_level(logging.INFO, logger="triage.workers.nvml"):
        probe = open_probe(triage_config, "gpu-1")
    assert probe is None
    assert "SIMULATED H200" in caplog.text and "gpu-1" in caplog.text
    status = gpu_status(config=triage_config, gpu_id="gpu-1", reading=probe, load=LOAD,
                        at_ms=123)  # fmt: skip
    assert status.simulated is True
    assert status.name == "simulated H200"
    assert status.memory_total_bytes == int(141 * GIB)  # gpu_types[H200].memory_gib
    assert status.memory_used_bytes == 5 * GIB  # the engine's KV in use
    assert status.kv_budget_bytes == int(40 * GIB)  # pools[shared].kv_budget_gib
    assert status.utilization == 0.25 and status.running == 3
    assert status.pool == "shared" and status.gpu_type == "H200"
    assert status.healthy and status.driver is None and status.at_ms == 123


def test_fabricated_reading_maps_to_a_real_gpu_heartbeat(triage_config: TriageConfig) -> None:
    reading = GpuReading(
        name="NVIDIA H200",
        memory_total_bytes=150_000_000_000,
        memory_used_bytes=120_000_000_000,
        utilization=0.9,
        ecc_uncorrected=0,
        temperature_c=61.0,
        driver="570.86.15",
    )
    status = gpu_status(config=triage_config, gpu_id="gpu-0", reading=reading, load=LOAD,
                        at_ms=7, state=GpuState.DRAINING)  # fmt: skip
    assert status.simulated is False
    assert status.name == "NVIDIA H200"
    assert status.memory_total_bytes == 150_000_000_000
    assert status.memory_used_bytes == 120_000_000_000
    assert status.utilization == 0.9  # NVML's sample wins over the backend's estimate
    assert status.healthy and status.ecc_errors == 0
    assert status.temperature_c == 61.0 and status.driver == "570.86.15"
    assert status.state is GpuState.DRAINING and status.kv_budget_bytes == int(40 * GIB)


def test_uncorrected_ecc_errors_mark_the_gpu_unhealthy(triage_config: TriageConfig) -> None:
    reading = GpuReading(name="g", memory_total_bytes=1, memory_used_bytes=None,
                         utilization=None, ecc_uncorrected=2, temperature_c=None,
                         driver=None)  # fmt: skip
    status = gpu_status(config=triage_config, gpu_id="gpu-0", reading=reading, load=LOAD,
                        at_ms=0)  # fmt: skip
    assert not status.healthy and status.ecc_errors == 2
    assert status.utilization == 0.25  # no NVML sample: the backend's busy share


def test_unknown_gpu_names_the_configured_ones(triage_config: TriageConfig) -> None:
    with pytest.raises(UnknownGpuError, match="gpu-0, gpu-1"):
        gpu_status(config=triage_config, gpu_id="gpu-9", reading=None, load=LOAD, at_ms=0)
    with pytest.raises(UnknownGpuError, match="gpu-9"):
        open_probe(triage_config, "gpu-9")


class FakeNvml:
    """Stands in for libnvidia-ml: one device; ECC unsupported, like consumer cards."""

    def __init__(self) -> None:
        self.shutdowns = 0

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        def not_supported(*_a: Any) -> Any:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

        def shutdown() -> None:
            self.shutdowns += 1

        fakes: dict[str, Any] = {
            "nvmlInit": lambda: None,
            "nvmlShutdown": shutdown,
            "nvmlDeviceGetCount": lambda: 1,
            "nvmlDeviceGetHandleByIndex": lambda i: f"handle-{i}",
            "nvmlDeviceGetMemoryInfo": lambda h: SimpleNamespace(total=80 * GIB, used=3 * GIB),
            "nvmlDeviceGetUtilizationRates": lambda h: SimpleNamespace(gpu=42, memory=10),
            "nvmlDeviceGetName": lambda h: b"NVIDIA A100-SXM4-80GB",
            "nvmlSystemGetDriverVersion": lambda: "550.54.15",
            "nvmlDeviceGetTotalEccErrors": not_supported,
            "nvmlDeviceGetTemperature": lambda h, sensor: 55,
        }
        for name, fn in fakes.items():
            monkeypatch.setattr(pynvml, name, fn)


def test_probe_reads_a_device_and_tolerates_unsupported_queries(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = FakeNvml()
    fake.install(monkeypatch)
    probe = NvmlProbe.open(0)
    assert probe is not None
    r = probe.read()
    assert r.name == "NVIDIA A100-SXM4-80GB"  # bytes from old bindings decoded
    assert r.memory_total_bytes == 80 * GIB and r.memory_used_bytes == 3 * GIB
    assert r.utilization == pytest.approx(0.42)
    assert r.ecc_uncorrected is None and r.healthy  # unsupported is not unhealthy
    assert r.temperature_c == 55.0 and r.driver == "550.54.15"
    probe.close()
    assert fake.shutdowns == 1


def test_probe_of_a_missing_device_index_is_none(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeNvml()
    fake.install(monkeypatch)
    assert NvmlProbe.open(3) is None
    assert fake.shutdowns == 1
