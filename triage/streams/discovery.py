"""Finding new tenants while the app runs: request topics that appeared on the broker,
and tenants added to or removed from the config file (docs/reliability.md, "Config
changes"). The app's discovery timer runs `reload_config` and `new_request_topics` in a
thread (blocking broker calls) and `subscribe` on the event loop, since it changes the
Faust subscription; `subscribe` still makes one blocking call, creating the new
tenants' reply topics, which happens only when tenants appear."""

from __future__ import annotations

import logging
import re
import time
from typing import TYPE_CHECKING

from triage.config.load import load_config, tenant_change
from triage.config.models import TriageConfig
from triage.kafka.clients import make_admin
from triage.streams import faust_fixes
from triage.topics.admin import TopicSpec, create_topics, ensure_topics, topic_layout
from triage.topics.names import TopicKind, TopicNames

if TYPE_CHECKING:
    from triage.streams.app import AdmissionApp

log = logging.getLogger(__name__)


def request_topics_on_broker(config: TriageConfig, names: TopicNames) -> list[str]:
    """Every tenant request topic on the broker, configured or not (blocking)."""
    pattern = re.compile(names.requests_pattern)
    md = make_admin(config.kafka.bootstrap_servers).list_topics(timeout=5.0)
    return [t for t in md.topics if pattern.match(t)]


def new_request_topics(admission: AdmissionApp) -> list[str]:
    """Request topics on the broker that the app does not read yet (new tenants)."""
    found = request_topics_on_broker(admission.shards.config, admission.names)
    return sorted(t for t in found if t not in admission.subscribed)


def subscribe(admission: AdmissionApp, topics: list[str]) -> None:
    """Add topics to the request agent's subscription (Faust resubscribes and rebalances),
    making sure each new tenant can be answered (its reply topic exists)."""
    names = admission.names
    config = admission.shards.config
    template = next(s for s in topic_layout(config, names) if s.kind is TopicKind.REPLIES)
    replies = [
        TopicSpec(names.replies(tenant), TopicKind.REPLIES, template.partitions,
                  template.replication_factor, template.config)
        for tenant in map(names.tenant_of_request_topic, topics) if tenant is not None
    ]
    if replies:
        ensure_topics(config.kafka.bootstrap_servers, replies)
    faust_fixes.extend_subscription(admission.app, admission.request_topic,
                                    admission.subscribed, topics)
    admission.subscribed.update(topics)
    admission.unassigned_since.update((t, time.monotonic()) for t in topics)
    log.info("subscribed to new request topics: %s", ", ".join(topics))


def reload_config(admission: AdmissionApp) -> TriageConfig | None:
    """The config to adopt when tenants were added to or removed from the config file
    (other changes need a restart); creates the added tenants' topics. Runs in a thread:
    it reads the service's config but leaves applying the change to the event loop."""
    path = admission.config_path
    if path is None:
        return None
    try:
        mtime = path.stat().st_mtime
    except OSError:
        return None
    last, admission.config_mtime = admission.config_mtime, mtime
    if last is None or mtime == last:
        return None
    try:
        changed = tenant_change(admission.shards.config, load_config(path))
    except Exception as exc:  # a bad edit must not stop admission
        log.error("config reload failed, keeping the running config: %s", exc)
        return None
    if changed is not None:
        create_topics(changed.kafka.bootstrap_servers, admission.names, changed)
    return changed
