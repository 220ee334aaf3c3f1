"""The tenant client: submit requests to triage and await their terminal replies.

with TriageClient(bootstrap="127.0.0.1:9092", tenant="rag") as client:
    reply = client.submit_with_retry(request, max_attempts=3)
"""

from triage.client.backoff import (
    PERMANENT_REASONS,
    RetryPolicy,
    is_retryable,
    retry_delay_s,
    retry_request_id,
)
from triage.client.batch import BatchResult
from triage.client.client import TriageClient
from triage.client.errors import (
    ClientClosedError,
    ClientError,
    DeliveryError,
    DuplicateRequestError,
    ReplyTimeoutError,
    ReplyTopicError,
    WrongTenantError,
)
from triage.client.retry import RetryPlan, plan_retry
from triage.client.router import Submission

__all__ = [
    "PERMANENT_REASONS",
    "BatchResult",
    "ClientClosedError",
    "ClientError",
    "DeliveryError",
    "DuplicateRequestError",
    "ReplyTimeoutError",
    "ReplyTopicError",
    "RetryPlan",
    "RetryPolicy",
    "Submission",
    "TriageClient",
    "WrongTenantError",
    "is_retryable",
    "plan_retry",
    "retry_delay_s",
    "retry_request_id",
]
