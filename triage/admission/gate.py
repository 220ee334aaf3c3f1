"""The gate: check 1 (tenant quota) for each arriving request, before any pool sees it.

It also fixes what the request is charged: prompt + the tenant's learned share
of max_tokens (expected output), and how hard the tenant is pushing (offered
load / contracted rate), which fairness uses to lower a flooding tenant's priority.

Quota is tenant policy, saturation is system state: with `overage_when_idle`, a
request over quota still runs, at the lower priority class and uncharged, while its
pool is not tightened (work conservation); only a saturated pool refuses it. What a
request was charged is settled when it leaves (`settle`): a refusal or a timeout
costs nothing, a completion costs the tokens it really used.
"""

from __future__ import annotations

from triage.admission.decision import Decision
from triage.admission.pending import CLASS_IDLE, CLASS_OVERAGE, Pending
from triage.admission.policy import PolicyFlags
from triage.admission.predictor import WorkloadPredictor
from triage.admission.quota import EPSILON, OfferedLoad, TokenBucket
from triage.config.models import TenantConfig
from triage.topics.reasons import Outcome, ReasonCode


class TenantQuota:
    """A tenant's bucket, request-rate limiter and offered-load meter."""

    __slots__ = ("allow_overage", "bucket", "cfg", "offered", "promised_until", "rate", "requests")

    def __init__(self, cfg: TenantConfig) -> None:
        self.cfg = cfg
        self.rate = cfg.rate_tokens_per_s  # copied out of the (pydantic) config: read per request
        self.allow_overage = cfg.allow_overage
        self.bucket = TokenBucket(
            rate=cfg.rate_tokens_per_s, burst=cfg.burst_tokens, max_debt=cfg.max_debt_tokens
        )
        r = cfg.max_requests_per_s
        self.requests = (
            TokenBucket(rate=r, burst=max(1.0, r), max_debt=0.0) if r is not None else None
        )
        self.offered = OfferedLoad()
        # when the last quota refusal was told to come back: later refusals queue behind
        # it, so a burst of refused requests is not told to return all at once
        self.promised_until = 0.0


class Gate:
    """Quota checks for every tenant."""

    def __init__(
        self, *, tenants: dict[str, TenantConfig], flags: PolicyFlags, predictor: WorkloadPredictor,
    ) -> None:
        self.flags = flags
        self.predictor = predictor
        self.quotas = {name: TenantQuota(cfg) for name, cfg in tenants.items()}

    def check(
        self, p: Pending, now: float, *, tightened: bool = False, saturated: bool = False,
        under_share: bool = False,
    ) -> Decision | None:
        """None when `p` may go on to its pool (possibly as overage); else the refusal.

        Tightened pools suspend borrowing: debt is for quiet times. Over quota, a request
        still runs as overage (`overage_when_idle`) while its pool is not saturated, or,
        at the contracted-overage class, while its tenant takes less than its weighted
        fair share of the pool: a quota protects the others, and one below its fair share
        takes nothing they are owed."""
        tq = self.quotas[p.tenant]
        flags = self.flags
        if flags.clairvoyant and p.true_out >= 0.0:
            expected_out = p.true_out
        else:
            expected_out = self.predictor.ratio(p.tenant).value * p.max_tokens
        if expected_out < 1.0:
            expected_out = 1.0
        p.expected_out = expected_out
        cost = p.prompt_tokens + expected_out
        p.expected_tokens = cost
        p.pressure = tq.offered.add(cost, now) / tq.rate if flags.pressure else 0.0
        if not flags.quota:
            return None
        bucket = tq.bucket
        bucket.refill(now)
        borrowing = flags.borrowing and not tightened and bucket.max_debt > 0.0
        tokens_ok = bucket.level - cost >= (
            (-bucket.max_debt if borrowing else 0.0) - EPSILON * (1.0 + cost)
        )
        rl = tq.requests
        if rl is None:
            if tokens_ok:
                bucket.level -= cost
                p.charged = cost
                return None
            rate_ok = True
        else:
            rl.refill(now)
            rate_ok = rl.level >= 1.0 - EPSILON
            if tokens_ok and rate_ok:
                bucket.level -= cost
                p.charged = cost
                rl.level -= 1.0
                return None
        if tq.allow_overage:  # the contract allows overage, at reduced priority
            p.overage = True
            p.cls = CLASS_OVERAGE
            return None
        if flags.overage_when_idle and under_share:  # below its fair share of the pool
            p.overage = True
            p.cls = CLASS_OVERAGE
            return None
        if flags.overage_when_idle and not saturated:  # idle capacity only, lowest class
            p.overage = True
            p.cls = CLASS_IDLE
            return None
        # Never fits: not even with the tenant's full borrowing. While a tightened pool
        # suspends borrowing, the hint is the wait without it when that exists, else the
        # wait once borrowing returns.
        can_borrow = flags.borrowing and bucket.max_debt > 0.0
        wait = bucket.wait_s(cost, borrowing)
        if wait is None:
            wait = bucket.wait_s(cost, can_borrow)
        if wait is None:
            return self._refuse(
                p, ReasonCode.QUOTA_NEVER_FITS, now, None, bucket, can_borrow,
                detail=f"costs {cost:.0f} tokens; the bucket never holds more than "
                f"{bucket.burst + (bucket.max_debt if can_borrow else 0.0):.0f}",
            )
        if rl is not None:
            rate_wait = rl.wait_s(1.0, False) or 0.0
            wait = wait if wait > rate_wait else rate_wait
        # Behind the tenant's other refused requests: each was told when the bucket would
        # hold its tokens; this one needs its own tokens after theirs.
        at = now + wait
        if tq.promised_until > now:
            after = tq.promised_until + cost / tq.rate
            at = at if at > after else after
        tq.promised_until = at
        wait = at - now
        reason = (
            ReasonCode.TENANT_QUOTA_EXCEEDED if not tokens_ok else ReasonCode.TENANT_RATE_LIMITED
        )
        return self._refuse(p, reason, now, wait, bucket, borrowing)

    def _refuse(
        self, p: Pending, reason: ReasonCode, now: float, retry_s: float | None,
        bucket: TokenBucket, borrowing: bool, detail: str | None = None,
    ) -> Decision:
        return Decision(
            p.request_id, p.tenant, p.model, p.pool, Outcome.REJECT, reason, now,
            retry_after_s=retry_s, policy=self.flags.name, policy_version=self.flags.version,
            request_tokens=p.expected_tokens, bucket_level=bucket.level,
            bucket_burst=bucket.burst, bucket_debt_ceiling=bucket.max_debt if borrowing else 0.0,
            sla_s=p.sla_s, detail=detail,
        )

    def bucket(self, tenant: str) -> TokenBucket:
        return self.quotas[tenant].bucket

    def settle(self, tenant: str, delta: float) -> None:
        """Give back `delta` tokens of what a request was charged (negative: it used more
        than it was charged). The bucket stays inside [-max_debt, burst]: a settlement
        never puts a tenant deeper in debt than its ceiling."""
        tq = self.quotas.get(tenant)
        if tq is None:
            return
        b = tq.bucket
        level = b.level + delta
        if level > b.burst:
            level = b.burst
        elif level < -b.max_debt and delta < 0.0:
            level = -b.max_debt if b.level > -b.max_debt else b.level
        b.level = level

    def add_tenant(self, cfg: TenantConfig) -> None:
        if cfg.name not in self.quotas:
            self.quotas[cfg.name] = TenantQuota(cfg)
