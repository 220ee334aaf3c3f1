"""The tenant client: submit requests to triage and await their terminal replies.

from triage.client import InferenceRequest, TriageClient

with TriageClient(bootstrap="127.0.0.1:9092", tenant="rag") as client:
    request = InferenceRequest(tenant="rag", model="llama-3.1-8b", prompt_tokens=800,
                               max_tokens=200)  # request_id: a fresh uuid4
    reply = client.submit_with_retry(request, max_attempts=3)

See docs/client.md.
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
from triage.client.request import InferenceRequest, new_request_id
from triage.client.retry import RetryPlan, plan_retry
from triage.client.router import Submission
from triage.client.stream import StreamAssembler
from triage.client.updates import AsyncTextStream, TextStream
from triage.topics.messages import Reply

__all__ = [
    "PERMANENT_REASONS",
    "AsyncTextStream",
    "BatchResult",
    "ClientClosedError",
    "ClientError",
    "DeliveryError",
    "DuplicateRequestError",
    "InferenceRequest",
    "Reply",
    "ReplyTimeoutError",
    "ReplyTopicError",
    "RetryPlan",
    "RetryPolicy",
    "StreamAssembler",
    "Submission",
    "TextStream",
    "TriageClient",
    "WrongTenantError",
    "is_retryable",
    "new_request_id",
    "plan_retry",
    "retry_delay_s",
    "retry_request_id",
]
