"""The OpenAI request bodies the gateway accepts, and the prompt-token estimate.

Only what admission and the backends use is read; OpenAI's sampling parameters
(temperature, top_p, stop, ...) are accepted and ignored (triage forwards none of them
to the engine yet: docs/gateway.md, Limits). What cannot be honoured is refused with a
400 naming the field: ``n`` > 1, several prompts in one call, token-id prompts.

Prompt tokens: triage admits by token counts, and counting exactly needs the model's
tokenizer, which the gateway does not have (no model files; tiktoken fetches its
encodings over the network at first use, and is OpenAI's tokenizer, not Llama's). So the
gateway estimates ``ceil(UTF-8 bytes / 4)`` per text (OpenAI's rule of thumb of about
four characters of English per token), plus 4 tokens per chat message for the chat
template. A client that knows the count sends it as ``triage.prompt_tokens`` in the body
(``extra_body={"triage": {"prompt_tokens": 812}}`` with the openai client).
"""

from __future__ import annotations

import math
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from triage.topics.messages import MAX_SLA_MS, MAX_TOKENS, ChatMessage

BYTES_PER_TOKEN = 4
CHAT_TOKENS_PER_MESSAGE = 4  # role and separators of a chat template, roughly


class TriageExtension(BaseModel):
    """triage's own fields, under the body key ``triage``."""

    model_config = ConfigDict(extra="forbid")

    prompt_tokens: Annotated[int, Field(ge=1, le=MAX_TOKENS)] | None = None
    sla_ms: Annotated[int, Field(ge=1, le=MAX_SLA_MS)] | None = None


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")

    include_usage: bool = False


class _Common(BaseModel):
    model_config = ConfigDict(extra="ignore")  # OpenAI parameters triage does not use

    model: str = Field(min_length=1, max_length=128)
    max_tokens: Annotated[int, Field(ge=1, le=MAX_TOKENS)] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: Annotated[int, Field(ge=1, le=1)] = 1
    user: str | None = Field(None, max_length=256)
    triage: TriageExtension | None = None

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class CompletionBody(_Common):
    """POST /v1/completions."""

    prompt: str | list[str]

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, v: str | list[str]) -> str | list[str]:
        if isinstance(v, list) and len(v) != 1:
            raise ValueError("send one prompt per request (a list of prompts is not supported)")
        return v

    @property
    def text(self) -> str:
        return self.prompt if isinstance(self.prompt, str) else self.prompt[0]


def _content_text(content: Any) -> str:
    """Message content as text: a string, or the text parts of a list of parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text":
                raise ValueError("only text content parts are supported")
            parts.append(str(part.get("text", "")))
        return "".join(parts)
    raise ValueError("content must be a string or a list of text parts")


class _InMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: str
    content: Any = None
    name: str | None = None


class ChatBody(_Common):
    """POST /v1/chat/completions."""

    messages: list[_InMessage] = Field(min_length=1, max_length=1024)
    max_completion_tokens: Annotated[int, Field(ge=1, le=MAX_TOKENS)] | None = None

    def chat_messages(self) -> list[ChatMessage]:
        """The messages in triage's wire form (ValueError names what is unsupported)."""
        return [
            ChatMessage.model_validate(
                {"role": m.role, "content": _content_text(m.content), "name": m.name}
            )
            for m in self.messages
        ]

    @property
    def wanted_max_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


def estimate_tokens(text: str) -> int:
    """ceil(UTF-8 bytes / 4), at least 1 (see the module docstring)."""
    return max(1, math.ceil(len(text.encode()) / BYTES_PER_TOKEN))


def estimate_chat_tokens(messages: list[ChatMessage]) -> int:
    return sum(estimate_tokens(m.content) + CHAT_TOKENS_PER_MESSAGE for m in messages)
