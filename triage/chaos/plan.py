"""What a chaos run does: scenarios, their sizes, and the reduced sizes CI runs.

Each scenario runs on its own topics (a fresh prefix) against the same local broker,
with the real admission app and two sim workers as child processes, and injects one
kind of fault at a steady pace while tenants send requests at `rate` per second.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Literal, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator


class Scenario(StrEnum):
    APP_KILL = "app-kill"  # kill -9 of the admission app, restarted at once
    DATADIR_WIPE = "datadir-wipe"  # kill -9 and its RocksDB data dir deleted
    WORKER_KILL = "worker-kill"  # kill -9 of a sim worker, restarted at once
    BROKER = "broker"  # the broker stopped for `broker_down_s`, then started
    OVERLOAD = "overload"  # `overload_factor` x the rate for `overload_s`
    SIGTERM = "sigterm"  # SIGTERM while the broker is gone: must exit in 30 s
    POISON = "poison"  # the poison corpus, `poison_rounds` times, amid the traffic
    CONFIG = "config"  # a tenant removed from the config file and one hot-added
    FORGERY = "forgery"  # issue 12's forgeries against a secured broker of its own


ALL = [Scenario.APP_KILL, Scenario.DATADIR_WIPE, Scenario.WORKER_KILL, Scenario.BROKER,
       Scenario.OVERLOAD, Scenario.SIGTERM, Scenario.POISON, Scenario.CONFIG,
       Scenario.FORGERY]


class ChaosPlan(BaseModel):
    """Sizes of a run. The defaults are the full suite of issue 12; `reduced()` is CI's."""

    model_config = ConfigDict(extra="forbid")

    scenarios: list[Scenario] = Field(default_factory=lambda: list(ALL))
    rate: float = Field(80.0, gt=0, description="Requests per second (steady).")
    duration_s: float = Field(180.0, gt=0, description="Traffic time of each scenario.")
    kills: int = Field(5, ge=1, description="kill -9s per kill scenario, evenly spaced.")
    worker_kills: int = Field(2, ge=1)
    broker_down_s: float = Field(60.0, gt=0)
    overload_factor: float = Field(10.0, ge=1)
    overload_s: float = Field(60.0, gt=0)
    drain_s: float = Field(120.0, gt=0, description="Give up waiting for the outstanding "
                           "answers after this long without a new one.")
    sigterm_limit_s: float = Field(30.0, gt=0)
    poison_rounds: int = Field(5, ge=1, description="Times the whole poison corpus is sent.")
    config_live: int = Field(8, ge=1, description="Live requests of the removed tenant.")
    config_added: int = Field(60, ge=1, description="Requests of the hot-added tenant.")
    port: int = Field(9392, description="Port of the broker the run starts and stops.")
    secure_port: int = Field(9394, description="Port of the secured broker (forgery).")
    output_tokens: int = Field(16, ge=1, description="Tokens each sim request generates.")
    app_loglevel: str = Field("warn", description="--loglevel of the admission app.")
    static_membership: bool = Field(True, description="admission.static_membership of the app.")
    session_timeout_s: float = Field(10.0, ge=6.0, le=300.0,
                                     description="admission.session_timeout_s of the app.")
    tenant_topics: Literal["per_tenant", "shared"] = Field(
        "per_tenant", description="kafka.tenant_topics of the app: a topic pair per tenant, "
        "or one pair for every tenant (no tenant principals: no forgery scenario).")

    @model_validator(mode="after")
    def _forgery_needs_tenant_topics(self) -> Self:
        if self.tenant_topics == "shared" and Scenario.FORGERY in self.scenarios:
            raise ValueError("the forgery scenario checks tenants' own principals, which "
                             "shared tenant topics do not have")
        return self

    @classmethod
    def reduced(cls, **overrides: object) -> ChaosPlan:
        """A few minutes in all: small rates and short faults, same assertions."""
        base: dict[str, object] = {
            "rate": 15.0, "duration_s": 36.0, "kills": 2, "worker_kills": 1,
            "broker_down_s": 15.0, "overload_factor": 10.0, "overload_s": 8.0,
            "drain_s": 90.0, "poison_rounds": 2, "config_live": 4, "config_added": 20,
        }
        base.update(overrides)
        return cls.model_validate(base)
