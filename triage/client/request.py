"""The request a client builds: the wire model, with a generated request_id by default."""

from __future__ import annotations

import uuid

from pydantic import Field

from triage.topics import messages
from triage.topics.messages import RequestId


def new_request_id() -> str:
    """A fresh id (uuid4, 32 hex digits): unique without coordination between clients."""
    return uuid.uuid4().hex


class InferenceRequest(messages.InferenceRequest):
    """``triage.topics.messages.InferenceRequest`` with ``request_id`` optional: omitted,
    it is a fresh uuid4. Same fields, same JSON on the wire, and an instance of the wire
    model (it subclasses it), so it goes wherever that goes. The wire model itself keeps
    the id required: a producer that forgets it gets an error, not an id it never saw."""

    request_id: RequestId = Field(default_factory=new_request_id)
