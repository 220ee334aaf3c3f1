"""Topic naming, in one place."""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum


class TopicKind(StrEnum):
    REQUESTS = "requests"
    REPLIES = "replies"
    ADMISSION = "admission"
    GPU_WORK = "gpu_work"
    GPU_CONTROL = "gpu_control"
    GPU_STATUS = "gpu_status"
    COMPLETIONS = "completions"
    DECISIONS = "decisions"
    DEADLETTER = "deadletter"
    AUTOSCALE = "autoscale"
    ROUTES = "routes"


@dataclass(frozen=True, slots=True)
class TopicNames:
    """Every topic name derives from the prefix (default ``triage``). `shared`: one
    request and one reply topic for every tenant (`kafka.tenant_topics: shared`), where
    each request names its tenant; otherwise each tenant has its own pair."""

    prefix: str = "triage"
    shared: bool = False

    @classmethod
    def of(cls, topic_prefix: str, tenant_topics: str) -> TopicNames:
        """The names a config's `kafka.topic_prefix` and `kafka.tenant_topics` give."""
        return cls(topic_prefix, shared=tenant_topics == "shared")

    def requests(self, tenant: str) -> str:
        return f"{self.prefix}.requests" if self.shared else f"{self.prefix}.requests.{tenant}"

    def replies(self, tenant: str) -> str:
        return f"{self.prefix}.replies" if self.shared else f"{self.prefix}.replies.{tenant}"

    def gpu_work(self, gpu_id: str) -> str:
        return f"{self.prefix}.gpu.{gpu_id}.work"

    def gpu_control(self, gpu_id: str) -> str:
        return f"{self.prefix}.gpu.{gpu_id}.control"

    @property
    def admission(self) -> str:
        return f"{self.prefix}.admission"

    @property
    def gpu_status(self) -> str:
        return f"{self.prefix}.gpu.status"

    @property
    def completions(self) -> str:
        return f"{self.prefix}.completions"

    @property
    def decisions(self) -> str:
        return f"{self.prefix}.decisions"

    @property
    def deadletter(self) -> str:
        return f"{self.prefix}.deadletter"

    @property
    def autoscale(self) -> str:
        return f"{self.prefix}.autoscale"

    @property
    def routes(self) -> str:
        """model -> the request-topic partition of its pool's shard (compacted; the app
        writes it at start, bare clients read it: topics/routing.py)."""
        return f"{self.prefix}.routes"

    @property
    def requests_pattern(self) -> str:
        """Regex matching every tenant's request topic (new tenants are picked up), or
        the one shared request topic."""
        if self.shared:
            return rf"^{re.escape(self.prefix)}\.requests$"
        return rf"^{re.escape(self.prefix)}\.requests\.[a-z0-9][a-z0-9_-]*$"

    def tenant_of_request_topic(self, topic: str) -> str | None:
        """The tenant whose own request topic this is; None for any other topic, the
        shared request topic included (its requests name their tenant)."""
        head = f"{self.prefix}.requests."
        return topic[len(head) :] if not self.shared and topic.startswith(head) else None

    def is_request_topic(self, topic: str) -> bool:
        """Does a client write requests to this topic (so a bad message on it is answered)?"""
        if self.shared:
            return topic == f"{self.prefix}.requests"
        return self.tenant_of_request_topic(topic) is not None

    def tenant_to_answer(self, topic: str) -> str | None:
        """The tenant an answer to an unreadable message on `topic` goes under: the
        topic's own, `unknown` on the shared topic (clients match replies by request
        id), None when `topic` is no request topic (nobody to answer)."""
        if self.shared:
            return "unknown" if self.is_request_topic(topic) else None
        return self.tenant_of_request_topic(topic)
