"""Configuration: pydantic models loaded from YAML."""

from triage.config.errors import ConfigError
from triage.config.load import EXAMPLE_CONFIG, config_from_dict, load_config
from triage.config.models import (
    DTYPE_BYTES,
    GIB,
    AdmissionAppConfig,
    GatewayConfig,
    GpuTypeConfig,
    HysteresisConfig,
    KafkaConfig,
    MetricsConfig,
    ModelConfig,
    PolicyConfig,
    PolicyPreset,
    PoolConfig,
    PredictorConfig,
    TenantConfig,
    TriageConfig,
    WorkerConfig,
)
from triage.config.security import KafkaSecurityConfig

__all__ = [
    "DTYPE_BYTES",
    "EXAMPLE_CONFIG",
    "GIB",
    "AdmissionAppConfig",
    "ConfigError",
    "GatewayConfig",
    "GpuTypeConfig",
    "HysteresisConfig",
    "KafkaConfig",
    "KafkaSecurityConfig",
    "MetricsConfig",
    "ModelConfig",
    "PolicyConfig",
    "PolicyPreset",
    "PoolConfig",
    "PredictorConfig",
    "TenantConfig",
    "TriageConfig",
    "WorkerConfig",
    "config_from_dict",
    "load_config",
]
