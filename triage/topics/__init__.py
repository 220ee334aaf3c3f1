"""The wire contract: message models, topic names, reason codes, topic creation."""

import triage.native  # noqa: F401  (reasons.py may be compiled: stale builds go first)
from triage.topics.messages import (
    ALL_MESSAGES,
    AdmittedRequest,
    Completion,
    CompletionStatus,
    ControlKind,
    ControlMessage,
    DeadLetter,
    DecisionInputs,
    DecisionRecord,
    GpuState,
    GpuStatus,
    InferenceRequest,
    Message,
    Reply,
    ScaleDirection,
    ScaleSignal,
    WorkItem,
    json_schemas,
)
from triage.topics.names import TopicKind, TopicNames
from triage.topics.reasons import TERMINAL_STATUSES, Outcome, ReasonCode, ReplyStatus

__all__ = [
    "ALL_MESSAGES",
    "TERMINAL_STATUSES",
    "AdmittedRequest",
    "Completion",
    "CompletionStatus",
    "ControlKind",
    "ControlMessage",
    "DeadLetter",
    "DecisionInputs",
    "DecisionRecord",
    "GpuState",
    "GpuStatus",
    "InferenceRequest",
    "Message",
    "Outcome",
    "ReasonCode",
    "Reply",
    "ReplyStatus",
    "ScaleDirection",
    "ScaleSignal",
    "TopicKind",
    "TopicNames",
    "WorkItem",
    "json_schemas",
]
