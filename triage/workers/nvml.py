"""What the GPU is: an NVML probe, and the pure mapping from readings to a heartbeat.

NVML is not the ledger (serving engines preallocate the KV cache, so "free memory"
says little); it tells capacity, health and utilization. Where NVML is missing (no
driver, as on CI machines) the worker runs as the declared simulated GPU from the
config and says so, in the log and with ``simulated=True`` in every heartbeat.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import pynvml

from triage.config.models import GIB, TriageConfig
from triage.topics.messages import GpuState, GpuStatus
from triage.workers.backends.base import EngineLoad
from triage.workers.errors import UnknownGpuError

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class GpuReading:
    """One NVML sample of a device. Fields NVML does not support on a device are None."""

    name: str
    memory_total_bytes: int
    memory_used_bytes: int | None
    utilization: float | None  # 0..1, fraction of time a kernel ran (NVML's sample)
    ecc_uncorrected: int | None  # volatile uncorrected ECC errors since boot
    temperature_c: float | None
    driver: str | None

    @property
    def healthy(self) -> bool:
        """Uncorrected ECC errors mean the GPU's memory cannot be trusted."""
        return not self.ecc_uncorrected


class NvmlProbe:
    """An open NVML handle on one device. ``open`` returns None where NVML is absent."""

    def __init__(self, handle: Any, index: int) -> None:
        self._handle = handle
        self.index = index

    @classmethod
    def open(cls, index: int = 0) -> NvmlProbe | None:
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            log.info("NVML unavailable (%s)", exc)
            return None
        try:
            count = pynvml.nvmlDeviceGetCount()
            if index >= count:
                log.warning("NVML sees %d device(s); index %d is not one of them", count, index)
                pynvml.nvmlShutdown()
                return None
            return cls(pynvml.nvmlDeviceGetHandleByIndex(index), index)
        except pynvml.NVMLError as exc:
            log.warning("NVML initialized but device %d is unreadable: %s", index, exc)
            _quiet(pynvml.nvmlShutdown)
            return None

    def read(self) -> GpuReading:
        h = self._handle
        mem = _quiet(lambda: pynvml.nvmlDeviceGetMemoryInfo(h))
        util = _quiet(lambda: pynvml.nvmlDeviceGetUtilizationRates(h))
        name = _quiet(lambda: pynvml.nvmlDeviceGetName(h))
        driver = _quiet(pynvml.nvmlSystemGetDriverVersion)
        return GpuReading(
            name=_text(name) or f"GPU {self.index}",
            memory_total_bytes=int(mem.total) if mem is not None else 0,
            memory_used_bytes=int(mem.used) if mem is not None else None,
            utilization=min(1.0, util.gpu / 100.0) if util is not None else None,
            ecc_uncorrected=_quiet(
                lambda: int(
                    pynvml.nvmlDeviceGetTotalEccErrors(
                        h, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC
                    )
                )
            ),
            temperature_c=_quiet(
                lambda: float(pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU))
            ),
            driver=_text(driver),
        )

    def close(self) -> None:
        _quiet(pynvml.nvmlShutdown)


def open_probe(config: TriageConfig, gpu_id: str, index: int = 0) -> NvmlProbe | None:
    """Open NVML for this worker, or log that it runs as the declared simulated GPU."""
    pool = config.pool_of_gpu(gpu_id)
    if pool is None:
        raise UnknownGpuError(_unknown(config, gpu_id))
    probe = NvmlProbe.open(index)
    gtype = config.gpu_type(pool.gpu_type)
    if probe is None:
        log.warning(
            "%s: no NVML driver here; running as a SIMULATED %s (%.0f GiB, speed %.2f) "
            "declared in the config; heartbeats say simulated=true",
            gpu_id, gtype.name, gtype.memory_gib, gtype.speed,
        )  # fmt: skip
    else:
        r = probe.read()
        log.info(
            "%s: NVML device %d is %s, %.1f GiB, driver %s (config declares %s)",
            gpu_id, index, r.name, r.memory_total_bytes / GIB, r.driver, gtype.name,
        )  # fmt: skip
    return probe


def gpu_status(
    *,
    config: TriageConfig,
    gpu_id: str,
    reading: GpuReading | None,
    load: EngineLoad,
    at_ms: int,
    state: GpuState = GpuState.UP,
) -> GpuStatus:
    """The heartbeat for a GPU: NVML's reading where there is one, else the declared GPU.

    Utilization is NVML's where it has a sample, else the backend's busy fraction.
    Memory used is NVML's (whole device) or, simulated, the KV the engine holds.
    """
    pool = config.pool_of_gpu(gpu_id)
    if pool is None:
        raise UnknownGpuError(_unknown(config, gpu_id))
    gtype = config.gpu_type(pool.gpu_type)
    util = load.utilization
    if reading is not None and reading.utilization is not None:
        util = reading.utilization
    common: dict[str, Any] = {
        "gpu_id": gpu_id,
        "pool": pool.name,
        "gpu_type": gtype.name,
        "state": state,
        "kv_budget_bytes": int(pool.kv_budget_gib * GIB),
        "utilization": min(1.0, max(0.0, util or 0.0)),
        "running": load.running,
        "running_seqs": load.running_seqs,
        "waiting_seqs": load.waiting_seqs,
        "kv_usage": None if load.kv_usage is None else min(1.0, max(0.0, load.kv_usage)),
        "at_ms": at_ms,
    }
    if reading is None:
        return GpuStatus(
            **common,
            name=f"simulated {gtype.name}",
            simulated=True,
            memory_total_bytes=int(gtype.memory_gib * GIB),
            memory_used_bytes=load.kv_used_bytes,
        )
    return GpuStatus(
        **common,
        name=reading.name,
        simulated=False,
        memory_total_bytes=reading.memory_total_bytes,
        memory_used_bytes=reading.memory_used_bytes,
        healthy=reading.healthy,
        ecc_errors=reading.ecc_uncorrected,
        temperature_c=reading.temperature_c,
        driver=reading.driver,
    )


def _unknown(config: TriageConfig, gpu_id: str) -> str:
    return f"unknown GPU {gpu_id!r}; configured GPUs: {', '.join(config.all_gpus()) or 'none'}"


def _quiet(fn: Callable[[], T]) -> T | None:
    """Call an NVML getter; None where the device does not support it."""
    try:
        return fn()
    except pynvml.NVMLError:
        return None


def _text(value: object) -> str | None:
    if value is None:
        return None
    return value.decode() if isinstance(value, bytes) else str(value)
