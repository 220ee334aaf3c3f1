"""The admission core: the gate plus one dispatcher per pool, built from configuration.

This is what the simulator, replay, the benchmarks and the unit tests drive; the
Faust app drives the same Gate and Dispatcher objects from two stages.
"""

from __future__ import annotations

from triage.admission.decision import Decision, ScaleEvent
from triage.admission.dispatcher import Dispatcher
from triage.admission.errors import UnknownModelError, UnknownTenantError
from triage.admission.gate import Gate
from triage.admission.hysteresis import HysteresisSettings
from triage.admission.pending import Pending
from triage.admission.placement import PoolSettings
from triage.admission.policy import PolicyFlags, resolve_policy
from triage.admission.predictor import WorkloadPredictor
from triage.config.models import GIB, PolicyConfig, TenantConfig, TriageConfig


def build_predictor(config: TriageConfig, flags: PolicyFlags) -> WorkloadPredictor:
    pc = config.predictor
    return WorkloadPredictor(
        model_priors={
            m.name: (m.prefill_s_per_token, m.decode_s_per_token, m.batch_slowdown)
            for m in config.models
        },
        gpu_speed={g.name: g.speed for g in config.gpu_types},
        tenant_priors={t.name: t.output_ratio_prior for t in config.tenants},
        initial_buffer=pc.initial_variance_buffer,
        adaptive_buffer=pc.adaptive_buffer,
        target_miss_rate=pc.target_miss_rate,
        residual_window=pc.residual_window,
        min_samples=pc.min_samples,
        half_life=pc.learning_half_life,
        fixed_buffer=flags.variance_buffer,
        max_buffer=pc.max_variance_buffer,
    )


def pool_settings(config: TriageConfig, pool_name: str) -> PoolSettings:
    pool = config.pool(pool_name)
    models = config.models_of_pool(pool_name)
    budget = int(pool.kv_budget_gib * GIB)
    model_names = {m.name for m in models}
    tenants = [
        t for t in config.tenants if t.models is None or model_names.intersection(t.models)
    ]
    h = config.hysteresis
    return PoolSettings(
        name=pool_name,
        kv_bytes_per_token={m.name: m.kv_bytes_per_token for m in models},
        model_floors={m.name: int(m.reserved_kv_gib_per_gpu * GIB) for m in models},
        tenant_shares={t.name: t.reserved_kv_share for t in tenants if t.reserved_kv_share > 0},
        weights={t.name: t.weight for t in config.tenants},
        queue_max=pool.queue_max,
        tenant_queue_max={t.name: t.queue_max for t in config.tenants},
        max_queue_wait_s={t.name: t.max_queue_wait_ms / 1000.0 for t in config.tenants},
        max_concurrency={
            t.name: t.max_concurrency for t in config.tenants if t.max_concurrency is not None
        },
        hysteresis=HysteresisSettings(
            low=h.low, high=h.high, autoscale_margin=h.autoscale_margin,
            autoscale_after_s=h.autoscale_after_s, relax_after_s=h.relax_after_s,
            hold_s=h.hold_s, smooth_s=h.smooth_s,
        ),
        gpu_timeout_s=config.policy.gpu_timeout_s,
        result_timeout_s=config.policy.result_timeout_s,
        max_seqs=pool.max_num_seqs,
        tenant_sla_s={t.name: t.sla_ms / 1000.0 for t in tenants},
    ) if budget > 0 else _no_pool(pool_name)


def _no_pool(name: str) -> PoolSettings:  # pragma: no cover - config validation forbids it
    raise ValueError(f"pool {name!r} has no KV budget")


class AdmissionCore:
    """Gate + dispatchers. Every handler takes `now` (seconds) and returns decisions."""

    def __init__(
        self, config: TriageConfig, *, policy: PolicyConfig | None = None,
        expect_heartbeats: bool = False, pools: frozenset[str] | None = None,
    ) -> None:
        """`pools`: the pools this core dispatches for (one shard of the app; None: all)."""
        self.config = config
        self.flags = resolve_policy(policy or config.policy)
        self.predictor = build_predictor(config, self.flags)
        self.gate = Gate(
            tenants=config.tenants_by_name, flags=self.flags, predictor=self.predictor
        )
        self.dispatchers: dict[str, Dispatcher] = {}
        for pool in config.pools:
            if pools is not None and pool.name not in pools:
                continue
            d = Dispatcher(
                settings=pool_settings(config, pool.name), flags=self.flags,
                predictor=self.predictor, expect_heartbeats=expect_heartbeats,
            )
            gt = config.gpu_type(pool.gpu_type)
            for gpu_id in pool.gpus:
                d.add_gpu(
                    gpu_id=gpu_id, gpu_type=gt.name, speed=gt.speed,
                    budget=int(pool.kv_budget_gib * GIB),
                )
            self.dispatchers[pool.name] = d
        self.pool_of_model = {m.name: m.pool for m in config.models}
        self._sla_s = {t.name: t.sla_ms / 1000.0 for t in config.tenants}

    def make_pending(
        self, request_id: str, tenant: str, model: str, prompt_tokens: int, max_tokens: int,
        now: float, sla_s: float | None = None, created: float | None = None,
    ) -> Pending:
        """The core's record of an arriving request. Its SLA clock starts when the client
        created it (`created`, clamped to `now`: a client clock ahead of ours cannot buy
        time), not when it reached us."""
        default_sla = self._sla_s.get(tenant)
        if default_sla is None:
            raise UnknownTenantError(f"tenant {tenant!r} is not configured")
        pool = self.pool_of_model.get(model)
        if pool is None:
            raise UnknownModelError(f"model {model!r} is served by no pool")
        arrived = created if created is not None and created < now else now
        return Pending(
            request_id, tenant, model, pool, prompt_tokens, max_tokens, arrived,
            sla_s if sla_s is not None else default_sla,
        )

    def submit(
        self, request_id: str, tenant: str, model: str, prompt_tokens: int, max_tokens: int,
        now: float, sla_s: float | None = None, created: float | None = None,
        true_output: int | None = None,
    ) -> list[Decision]:
        """A request arrives: gate, then its pool's dispatcher. First decision is about it.
        `true_output` is for the clairvoyant reference policy only (the simulator)."""
        p = self.make_pending(
            request_id, tenant, model, prompt_tokens, max_tokens, now, sla_s, created
        )
        if true_output is not None:
            p.true_out = float(true_output)
        return self.admit(p, now)

    def admit(self, p: Pending, now: float) -> list[Decision]:
        """Gate, then dispatcher, for a Pending built by make_pending."""
        d = self.dispatchers[p.pool]
        m = d.monitor
        # over-quota work may take only idle capacity: none while in-quota work waits
        refusal = self.gate.check(
            p, now, tightened=m.tightened, saturated=m.saturated or d.queue.in_quota > 0,
            under_share=d.fair.under_share(p.tenant, self.flags.fair_share_tolerance),
        )
        if refusal is not None:
            return [refusal]
        return self._settled(d, d.admit(p, now))

    def complete(
        self, *, pool: str, request_id: str, attempt: int, ok: bool, output_tokens: int,
        prefill_s: float, decode_s: float, concurrency: float, now: float,
        preempted: bool = False, error: str | None = None,
    ) -> list[Decision]:
        d = self.dispatchers[pool]
        return self._settled(d, d.complete(
            request_id=request_id, attempt=attempt, ok=ok, output_tokens=output_tokens,
            prefill_s=prefill_s, decode_s=decode_s, concurrency=concurrency, now=now,
            preempted=preempted, error=error,
        ))

    def heartbeat(
        self, *, pool: str, gpu_id: str, gpu_type: str, speed: float, kv_budget: int,
        up: bool, now: float,
    ) -> list[Decision]:
        """A GPU reported in. Its busy reading is not an input: saturation comes from the
        core's own state (Dispatcher.utilization)."""
        d = self.dispatchers[pool]
        return self._settled(d, d.heartbeat(
            gpu_id=gpu_id, gpu_type=gpu_type, speed=speed, kv_budget=kv_budget, up=up, now=now,
        ))

    def _settled(self, d: Dispatcher, decisions: list[Decision]) -> list[Decision]:
        """Give the gate's buckets back what requests that left were over-charged."""
        if d.settlements:
            gate = self.gate
            for tenant, delta in d.settlements:
                gate.settle(tenant, delta)
            d.settlements.clear()
        return decisions

    def add_tenant(self, tenant: TenantConfig) -> None:
        """A tenant added to the configuration while running (its reserved KV share, if
        any, takes effect at the next restart)."""
        self.gate.add_tenant(tenant)
        self._sla_s[tenant.name] = tenant.sla_ms / 1000.0
        for d in self.dispatchers.values():
            s = d.settings
            s.weights[tenant.name] = tenant.weight
            s.tenant_queue_max[tenant.name] = tenant.queue_max
            s.max_queue_wait_s[tenant.name] = tenant.max_queue_wait_ms / 1000.0
            s.tenant_sla_s[tenant.name] = tenant.sla_ms / 1000.0  # (tight-SLA class)
            s.tightest_sla_s = min(s.tenant_sla_s.values())
            if tenant.max_concurrency is not None:
                s.max_concurrency[tenant.name] = tenant.max_concurrency
            d.queue.tenant_limits[tenant.name] = tenant.queue_max

    def live(self, request_id: str) -> bool:
        return any(d.knows(request_id) for d in self.dispatchers.values())

    def tick(self, now: float) -> list[Decision]:
        out: list[Decision] = []
        for d in self.dispatchers.values():
            out.extend(self._settled(d, d.tick(now)))
        return out

    def drain_scale_events(self) -> list[ScaleEvent]:
        out: list[ScaleEvent] = []
        for d in self.dispatchers.values():
            out.extend(d.drain_scale_events())
        return out
