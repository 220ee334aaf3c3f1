"""Check 2: the KV reservation ledger, its floors and GPU choice."""

from __future__ import annotations

from _core_factory import BYTES_PER_TOKEN, config, model
from hypothesis import given, settings
from hypothesis import strategies as st

from triage.admission.core import AdmissionCore
from triage.admission.kvcache import PoolLedger
from triage.config.models import GIB, ModelConfig
from triage.topics.reasons import Outcome, ReasonCode


def test_bytes_per_token_from_geometry() -> None:
    m = ModelConfig.model_validate(model())
    assert m.kv_bytes_per_token == 2 * 32 * 8 * 128 * 2 == BYTES_PER_TOKEN
    fp8 = ModelConfig.model_validate(model(dtype="fp8", layers=80))
    assert fp8.kv_bytes_per_token == 2 * 80 * 8 * 128 * 1


def _ledger(**kw: object) -> PoolLedger:
    ledger = PoolLedger(
        pool="p", models=["small", "big"],
        model_floors=kw.get("floors", {"small": 30, "big": 0}),  # type: ignore[arg-type]
        tenant_shares=kw.get("shares", {}),  # type: ignore[arg-type]
    )
    for i in range(2):
        ledger.add_gpu(gpu_id=f"g{i}", gpu_type="g", speed=1.0, budget=100)
    return ledger


def test_big_model_may_not_take_a_small_models_floor() -> None:
    ledger = _ledger()
    slot = ledger.best("big", "t", 70)
    assert slot is not None
    ledger.reserve(slot, "big", "t", 70)
    other = ledger.best("big", "t", 70)
    assert other is not None and other is not slot  # worst fit: the empty GPU
    ledger.reserve(other, "big", "t", 70)
    assert ledger.best("big", "t", 1) is None  # 30 left on each, all the small model's floor
    assert ledger.best("small", "t", 30) is not None


def test_small_model_beyond_its_floor_competes_for_the_rest() -> None:
    ledger = _ledger()
    slot = ledger.slot("g0")
    ledger.reserve(slot, "small", "t", 50)  # 30 of floor + 20 of shared space
    assert slot.avail_model("big") == 50
    assert slot.avail_model("small") == 50
    ledger.release(slot, "small", "t", 50)
    assert slot.avail_model("big") == 70 and slot.used == 0 and slot.floors_hold()


def test_reserved_tenant_share_is_held_for_that_tenant() -> None:
    ledger = _ledger(floors={}, shares={"vip": 0.2})
    slot = ledger.slot("g0")
    ledger.reserve(slot, "small", "other", 80)
    assert slot.avail("small", "other") == 0
    assert slot.avail("small", "vip") == 20
    assert ledger.best("small", "vip", 20) is not None


def test_core_queues_for_memory_and_names_the_floor() -> None:
    cfg = config(
        models=[model("m8", reserved_kv_gib_per_gpu=0.25), model("m70", layers=80)],
        gpus=1, kv_budget_gib=1.0,
    )
    core = AdmissionCore(cfg)
    per_token_70 = 2 * 80 * 8 * 128 * 2
    tokens = int(0.7 * GIB / per_token_70)
    d = core.submit("a1", "a", "m70", tokens - 100, 100, now=0.0)[0]
    assert d.outcome is Outcome.ACCEPT
    d = core.submit("a2", "a", "m70", 200, 100, now=0.0)[0]
    assert d.outcome is Outcome.QUEUE
    assert d.reason is ReasonCode.RESERVATION_FLOOR
    assert d.kv_bytes_needed == 300 * per_token_70


def test_request_larger_than_any_gpu_is_refused_for_good() -> None:
    core = AdmissionCore(config(kv_budget_gib=0.25, gpus=2))
    tokens = int(0.25 * GIB / BYTES_PER_TOKEN)
    d = core.submit("x", "a", "m8", tokens, 10, now=0.0)[0]
    assert d.outcome is Outcome.REJECT and d.reason is ReasonCode.NO_CAPACITY
    assert d.retry_after_s is None


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["small", "big"]), st.sampled_from(["vip", "t"]),
                          st.integers(1, 60), st.booleans()), max_size=80))
def test_ledger_never_exceeds_budget_nor_breaks_floors(
    ops: list[tuple[str, str, int, bool]]
) -> None:
    ledger = _ledger(floors={"small": 20, "big": 10}, shares={"vip": 0.25})
    held: list[tuple[object, str, str, int]] = []
    for m, t, n, release in ops:
        if release and held:
            slot, hm, ht, hn = held.pop(0)
            ledger.release(slot, hm, ht, hn)  # type: ignore[arg-type]
        else:
            slot = ledger.best(m, t, n)
            if slot is not None:
                assert slot.avail(m, t) >= n
                ledger.reserve(slot, m, t, n)
                held.append((slot, m, t, n))
        for s in ledger.slots:
            assert s.used <= s.budget
            assert s.floors_hold()
            # what each model was promised is still there for it
            for fm, f in s.model_floor.items():
                assert s.avail_model(fm) >= f - s.model_used.get(fm, 0)
            for ft, f in s.tenant_floor.items():
                assert s.avail("small", ft) >= min(
                    f - s.tenant_used.get(ft, 0), s.avail_model("small")
                )
