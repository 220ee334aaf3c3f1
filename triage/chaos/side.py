"""The poison and config scenarios' own traffic, sent beside the steady tenants' and
counted apart: the poison corpus from an outside producer, and a tenant removed from and
another hot-added to the config file mid-run.

Each is a small object the runner calls at its fault times (`inject`) and at the end
(`count`), which returns the scenario's side groups (report.ScenarioResult.groups).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from typing import Any

from triage.chaos.observe import Observer
from triage.chaos.poison import Expect, Poison, poison_corpus
from triage.chaos.system import TENANT, TENANTS, System
from triage.demo.processes import scrape
from triage.kafka.clients import make_admin, make_producer, produce_waiting
from triage.topics.messages import InferenceRequest
from triage.topics.names import TopicNames

POISON_TENANT = TENANTS[0]
REMOVED, ADDED = "gamma", "delta"
LIVE_TOKENS = 8000  # 16 s each on the sim model: the removed tenant's requests stay live


def _producer(bootstrap: str) -> Any:
    """Large entries travel compressed, as in the issue (past the 1 MB default)."""
    return make_producer(bootstrap, **{"compression.type": "gzip", "linger.ms": 5,
                                       "message.max.bytes": 16_000_000, "log_level": 2})


class PoisonFlow:
    """Sends the whole corpus once per `inject` (fresh ids each round) to one steady
    tenant's request topic, and remembers where each entry landed."""

    def __init__(self, bootstrap: str, names: TopicNames, obs: Observer, tag: str, *,
                 tenant: str = POISON_TENANT, model: str = "small") -> None:
        self._p = _producer(bootstrap)
        self._tenant, self._model = tenant, model
        self._topic = names.requests(tenant)
        self._obs = obs
        self._tag = tag
        self.rounds = 0
        # (entry, [partition, offset] once delivered, delivery error)
        self.sent: list[tuple[Poison, list[int | None], list[str]]] = []
        self.first_at: float | None = None
        self.last_at: float | None = None

    def inject(self) -> int:
        """One round of the corpus; returns how many entries it sent."""
        self.rounds += 1
        now = time.time()
        self.first_at = self.first_at or now
        entries = list(poison_corpus(tenant=self._tenant, model=self._model,
                                     prefix=f"poison{self._tag}r{self.rounds}"))
        for e in entries:
            if e.expect is not Expect.DEAD_LETTER:
                self._obs.expect_side(e.key.decode(), self._tenant, now)
            slot: list[int | None] = [None, None]
            errs: list[str] = []

            def cb(err: Any, msg: Any, slot: list[int | None] = slot,
                   errs: list[str] = errs) -> None:
                if err is None:
                    slot[0], slot[1] = msg.partition(), msg.offset()
                else:
                    errs.append(str(err))

            self.sent.append((e, slot, errs))
            produce_waiting(self._p, self._topic, e.value, e.key, on_delivery=cb)
            self._p.poll(0)
        self._p.flush(120)
        self.last_at = time.time()
        return len(entries)

    def count(self) -> dict[str, dict[str, int]]:
        """Every entry answered (a terminal reply under its id), dead-lettered (a dead
        letter of its offset, with its error) or, for a copy of an earlier id, that id
        still answered once."""
        answered = dead = unaccounted = not_delivered = 0
        for e, slot, errs in self.sent:
            if errs or slot[0] is None or slot[1] is None:
                not_delivered += 1
                continue
            if e.expect is Expect.DEAD_LETTER:
                ok = bool(self._obs.dead.get((self._topic, slot[0], slot[1])))
                dead += ok
            else:
                s = self._obs.side.get(e.key.decode())
                ok = s is not None and s.terminals >= 1
                answered += ok and e.expect is not Expect.DUPLICATE
            unaccounted += not ok
        ids = {e.key.decode() for e, _, _ in self.sent if e.expect is not Expect.DEAD_LETTER}
        dups = sum(1 for i in ids if (s := self._obs.side.get(i)) is not None and s.terminals > 1)
        return {"poison": {"sent": len(self.sent), "rounds": self.rounds, "answered": answered,
                           "dead_lettered": dead, "not_delivered": not_delivered,
                           "unaccounted": unaccounted + not_delivered, "duplicates": dups}}

    def unaccounted(self) -> list[tuple[str, str, list[int | None]]]:
        """The entries `count` has not accounted for yet: (kind, expected, [partition,
        offset]), for a failing test's message."""
        out = []
        for e, slot, errs in self.sent:
            if errs or slot[0] is None or slot[1] is None:
                ok = False
            elif e.expect is Expect.DEAD_LETTER:
                ok = bool(self._obs.dead.get((self._topic, slot[0], slot[1])))
            else:
                s = self._obs.side.get(e.key.decode())
                ok = s is not None and s.terminals >= 1
            if not ok:
                out.append((e.name, e.expect.value, slot))
        return out

    def max_gap_s(self) -> float | None:
        """Longest pause between the app's decisions (any reply's at_ms) from the first
        round sent until 10 s after the last: a restart or stalled agent shows here."""
        if self.first_at is None or self.last_at is None:
            return None
        lo, hi = self.first_at, self.last_at + 10.0
        ts = sorted(t for t in list(self._obs.reply_times) if lo <= t <= hi)
        if len(ts) < 2:
            return None
        return max(b - a for a, b in itertools.pairwise(ts))


def config_tenants() -> list[dict[str, Any]]:
    """The tenant to be removed: one request at a time, so its others stay queued."""
    return [{"name": REMOVED, **TENANT, "max_concurrency": 1}]


class ConfigFlow:
    """At its one fault: `live` requests of the tenant to remove, the config file edited
    (that tenant out, a new one in), then requests of both: the removed one's must each
    get a terminal reply with a reason, the added one's must be served."""

    def __init__(self, bootstrap: str, names: TopicNames, obs: Observer, system: System,
                 *, tag: str, live: int, added: int,
                 say: Callable[[str], None] = lambda _m: None) -> None:
        self._say = say
        self._bootstrap = bootstrap
        self._p = make_producer(bootstrap, log_level=2)
        self._names = names
        self._obs = obs
        self._system = system
        self._tag = tag
        self._n_live, self._n_added = live, added
        self.ids: dict[str, list[str]] = {"removed-live": [], "removed-new": [], "added": []}
        self.notes: list[str] = []
        self.edited_at: float | None = None

    def _send(self, group: str, tenant: str, n: int, tokens: int) -> None:
        for i in range(n):
            rid = f"{tenant}-{self._tag}-{group}-{i}"
            now = time.time()
            req = InferenceRequest(request_id=rid, tenant=tenant, model="small",
                                   prompt_tokens=64, max_tokens=tokens,
                                   created_at_ms=int(now * 1000),
                                   metadata={"sim_output_tokens": str(tokens)})
            self._obs.expect_side(rid, tenant, now)
            self.ids[group].append(rid)
            self._p.produce(self._names.requests(tenant), key=rid.encode(), value=req.to_bytes())
        self._p.flush(60)

    def _wait(self, cond: Any, timeout_s: float, what: str) -> bool:
        self._say(f"  config: waiting for {what}")
        deadline = time.monotonic() + timeout_s
        while not cond():
            if time.monotonic() > deadline:
                self.notes.append(f"timed out waiting for {what}")
                return False
            time.sleep(0.2)
        return True

    def _replied(self, group: str, terminal: bool) -> bool:
        side = self._obs.side
        return all((s := side.get(r)) is not None
                   and (s.terminal is not None if terminal else s.replies > 0)
                   for r in self.ids[group])

    def inject(self) -> None:
        self._send("removed-live", REMOVED, self._n_live, LIVE_TOKENS)
        self._wait(lambda: self._replied("removed-live", terminal=False), 60,
                   "the removed tenant's first replies")
        kept = [t for t in self._system.cfg.model_dump(mode="json")["tenants"]
                if t["name"] != REMOVED]
        self.edited_at = time.time()
        self._system.edit_tenants([*kept, {"name": ADDED, **TENANT}])
        # the removal is in force once the live requests are answered
        self._wait(lambda: self._replied("removed-live", terminal=True), 60,
                   "the removed tenant's live requests to be answered")
        self._send("removed-new", REMOVED, max(3, self._n_live // 2), 16)
        topic = self._names.replies(ADDED)
        admin = make_admin(self._bootstrap, log_level=2)
        ready = self._wait(lambda: topic in admin.list_topics(timeout=10).topics, 60,
                           "the added tenant's topics")
        if ready and self._names.shared:  # the topic was there all along: ask the app
            ready = self._wait(self._app_knows_added, 60, "the app to adopt the added tenant")
        if ready:
            self._obs.follow(ADDED)
            self._send("added", ADDED, self._n_added, 16)

    def _app_knows_added(self) -> bool:
        """The app's per-tenant gauges name the added tenant: it runs the new config."""
        text = scrape(self._system.http + "/metrics") or ""
        return f'triage_tenant_queue_depth{{tenant="{ADDED}"}}' in text

    def count(self) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        side = self._obs.side
        for group, rids in self.ids.items():
            seen = [side[r] for r in rids if r in side]
            answered = sum(1 for s in seen if s.terminal is not None)
            if group == "added":
                good = sum(1 for s in seen if s.terminal == "completed")
                counts = {"sent": len(rids), "answered": answered, "completed": good}
                sent = self._n_added  # never sent (topics missing) is unaccounted too
            else:
                good = sum(1 for s in seen if s.terminal is not None and s.reason)
                counts = {"sent": len(rids), "answered": answered, "with_reason": good}
                sent = len(rids)
            counts["unaccounted"] = max(sent, len(rids)) - good
            counts["duplicates"] = sum(1 for s in seen if s.terminals > 1)
            if self.edited_at is not None and group != "removed-new":
                # from the edit to the last removed request answered / first added one
                ends = [s.terminal_at for s in seen if s.terminal_at is not None]
                if ends:
                    at = max(ends) if group == "removed-live" else min(ends)
                    counts["after_edit_ms"] = int((at - self.edited_at) * 1000)
            out[group] = counts
        return out
