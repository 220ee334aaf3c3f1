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
    """Every topic name derives from the prefix (default ``triage``)."""

    prefix: str = "triage"

    def requests(self, tenant: str) -> str:
        return f"{self.prefix}.requests.{tenant}"

    def replies(self, tenant: str) -> str:
        return f"{self.prefix}.replies.{tenant}"

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
        """Regex matching every tenant's request topic (new tenants are picked up)."""
        return rf"^{re.escape(self.prefix)}\.requests\.[a-z0-9][a-z0-9_-]*$"

    def tenant_of_request_topic(self, topic: str) -> str | None:
        head = f"{self.prefix}.requests."
        return topic[len(head) :] if topic.startswith(head) else None
