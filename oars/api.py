"""Wire shapes: every route's request and response types, for the OpenAPI document.

The Responses, Chat Completions and Conversations shapes are the openai SDK's own types: the ones the stream
validator checks each event and final object against (`oars.validator`) and the ones the SDKs
parse our answers with. What OpenAI's API has no type for (the error body, `/health`, a deleted
response, the model list) is declared here, and the handlers build their answers from it.
"""

from __future__ import annotations

from typing import Any, Literal

from openai.types import Model
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.chat import CompletionCreateParams as ChatCompletionCreateParams
from openai.types.conversations import (
    Conversation,
    ConversationCreateParams,
    ConversationDeletedResource,
    ConversationItem,
    ConversationItemList,
    ConversationUpdateParams,
    ItemCreateParams,
)
from openai.types.responses import (
    InputTokenCountParams,
    InputTokenCountResponse,
    Response,
    ResponseCompactionItem,
    ResponseCreateParams,
    ResponseItemList,
    ResponseStreamEvent,
    ResponseUsage,
)
from openai.types.responses import ResponseCompactParams as CompactParams
from pydantic import BaseModel

__all__ = [
    "ChatCompletion",
    "ChatCompletionChunk",
    "ChatCompletionCreateParams",
    "CompactParams",
    "CompactedResponse",
    "Conversation",
    "ConversationCreateParams",
    "ConversationDeletedResource",
    "ConversationItem",
    "ConversationItemList",
    "ConversationUpdateParams",
    "ErrorBody",
    "Health",
    "InputTokenCountParams",
    "InputTokenCountResponse",
    "ItemCreateParams",
    "Model",
    "ModelList",
    "Response",
    "ResponseCreateParams",
    "ResponseDeleted",
    "ResponseItemList",
    "ResponseList",
    "ResponseStreamEvent",
    "ValidationReport",
]


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorBody(BaseModel):
    """Every 4xx and 5xx answer (before a stream's first byte; after it, an `error` event)."""

    error: ErrorDetail


class Health(BaseModel):
    status: Literal["ok"]
    model: str  # the default model
    busy: bool  # any model is generating
    models: dict[str, bool]  # model → generating
    running: int  # responses running on this replica


class ResponseDeleted(BaseModel):
    id: str
    object: Literal["response"]
    deleted: Literal[True]


class ModelList(BaseModel):
    object: Literal["list"]
    data: list[Model]


class ResponseList(BaseModel):
    """The latest stored responses, newest first (an oars route: OpenAI lists none)."""

    object: Literal["list"]
    data: list[Response]


class CompactedResponse(BaseModel):
    """`POST /v1/responses/compact`'s answer: the user messages kept verbatim (as they were
    sent: input parts), then one compaction item. (The SDK's type lists output items only.)"""

    id: str
    object: Literal["response.compaction"]
    created_at: int
    output: list[ConversationItem | ResponseCompactionItem]
    usage: ResponseUsage


class ValidationReport(BaseModel):
    """The stream validator's verdict on one stream (the playground shows it)."""

    ok: bool
    violations: list[str]
    events: int
    final: dict[str, Any] | None
