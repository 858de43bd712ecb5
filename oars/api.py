"""Wire shapes: every route's request and response types, for the OpenAPI document.

The Responses, Chat Completions, Conversations and Files shapes are the openai SDK's own types: the ones the stream
validator checks each event and final object against (`oars.validator`) and the ones the SDKs
parse our answers with. What OpenAI's API has no type for (the error body, `/health`, a deleted
response, the model list) is declared here, and the handlers build their answers from it.
"""

from __future__ import annotations

from typing import Any, Literal

from openai.types import (
    CreateEmbeddingResponse,
    Embedding,
    EmbeddingCreateParams,
    FileDeleted,
    FileObject,
    FilePurpose,
    Model,
    VectorStore,
    VectorStoreCreateParams,
    VectorStoreDeleted,
    VectorStoreSearchParams,
    VectorStoreSearchResponse,
    VectorStoreUpdateParams,
)
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
from openai.types.vector_stores import FileBatchCreateParams as VectorStoreFileBatchCreateParams
from openai.types.vector_stores import FileContentResponse as VectorStoreFileContent
from openai.types.vector_stores import FileCreateParams as VectorStoreFileCreateParams
from openai.types.vector_stores import FileUpdateParams as VectorStoreFileUpdateParams
from openai.types.vector_stores import (
    VectorStoreFile,
    VectorStoreFileBatch,
    VectorStoreFileDeleted,
)
from pydantic import BaseModel, Field

__all__ = [
    "AnthropicError",
    "AnthropicMessage",
    "AnthropicStreamEvent",
    "CatalogModel",
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
    "EmbeddingCreateParams",
    "EmbeddingList",
    "ErrorBody",
    "FileDeleted",
    "FileList",
    "FileObject",
    "FilePurpose",
    "FileUpload",
    "Health",
    "InputTokenCountParams",
    "InputTokenCountResponse",
    "ItemCreateParams",
    "MessageCountTokensParams",
    "MessageCreateParams",
    "MessageTokensCount",
    "Model",
    "ModelList",
    "Response",
    "ResponseCreateParams",
    "ResponseDeleted",
    "ResponseItemList",
    "ResponseList",
    "ResponseStreamEvent",
    "ValidationReport",
    "VectorStore",
    "VectorStoreCreateParams",
    "VectorStoreDeleted",
    "VectorStoreFile",
    "VectorStoreFileBatch",
    "VectorStoreFileBatchCreateParams",
    "VectorStoreFileContent",
    "VectorStoreFileContentPage",
    "VectorStoreFileCreateParams",
    "VectorStoreFileDeleted",
    "VectorStoreFileList",
    "VectorStoreFileUpdateParams",
    "VectorStoreList",
    "VectorStoreSearchPage",
    "VectorStoreSearchParams",
    "VectorStoreSearchResponse",
    "VectorStoreUpdateParams",
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


class CatalogModel(Model):
    """A model as OpenAI's `Model`, with what oars knows of it (`oars.catalog`; null: not
    known)."""

    context_window: int | None
    input_modalities: list[Literal["text", "image", "file", "audio"]]
    reasoning: bool | None
    reasoning_efforts: list[str]
    server_tools: list[Literal["tool_search", "mcp", "web_search", "file_search"]]
    client_tools: list[str]
    supports_search_tool: bool
    apply_patch_tool_type: Literal["freeform", "function"]
    supports_parallel_tool_calls: bool


class CodexEffort(BaseModel):
    effort: str
    description: str


class CodexTruncation(BaseModel):
    mode: Literal["tokens", "bytes"]
    limit: int


class CodexModel(BaseModel):
    """A model as Codex's `ModelInfo` (what `model_catalog_json` holds)."""

    slug: str
    display_name: str
    description: str | None
    supported_reasoning_levels: list[CodexEffort]
    shell_type: Literal["default", "local", "unified_exec", "disabled", "shell_command"]
    visibility: Literal["list", "hide", "none"]
    supported_in_api: bool
    priority: int
    upgrade: None
    supports_reasoning_summaries: bool
    support_verbosity: bool
    default_verbosity: None
    apply_patch_tool_type: Literal["freeform", "function"] | None
    truncation_policy: CodexTruncation
    supports_parallel_tool_calls: bool
    experimental_supported_tools: list[str]
    input_modalities: list[Literal["text", "image"]]
    supports_search_tool: bool
    context_window: int | None = None


class ModelList(BaseModel):
    """OpenAI's model list, and the same models as Codex's catalog (`models`)."""

    object: Literal["list"]
    data: list[CatalogModel]
    models: list[CodexModel]


class FileUpload(BaseModel):
    """`POST /v1/files`' multipart/form-data body, as the SDK sends it: a nested object's
    fields as `name[key]` (the SDK has a TypedDict for it, which is not a form)."""

    file: bytes
    purpose: FilePurpose
    expires_after_anchor: Literal["created_at"] | None = Field(None, alias="expires_after[anchor]")
    expires_after_seconds: int | None = Field(
        None, alias="expires_after[seconds]", ge=3600, le=2_592_000
    )


class FileList(BaseModel):
    """`GET /v1/files`' page (the SDK reads it as a cursor page, and has no type for it)."""

    object: Literal["list"]
    data: list[FileObject]
    first_id: str | None
    last_id: str | None
    has_more: bool


class VectorStoreList(BaseModel):
    object: Literal["list"]
    data: list[VectorStore]
    first_id: str | None
    last_id: str | None
    has_more: bool


class VectorStoreFileList(BaseModel):
    object: Literal["list"]
    data: list[VectorStoreFile]
    first_id: str | None
    last_id: str | None
    has_more: bool


class VectorStoreFileContentPage(BaseModel):
    """A vector store file's parsed text (the SDK reads it as a page of `data`)."""

    object: Literal["vector_store.file_content.page"]
    data: list[VectorStoreFileContent]
    has_more: bool
    next_page: str | None


class VectorStoreSearchPage(BaseModel):
    """`POST /v1/vector_stores/{id}/search`'s answer: `search_query` is the query as sent
    (oars does not rewrite it)."""

    object: Literal["vector_store.search_results.page"]
    search_query: list[str]
    data: list[VectorStoreSearchResponse]
    has_more: bool
    next_page: str | None


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


# ---- Anthropic's Messages API (`/v1/messages`) ------------------------------------------------
# The anthropic SDK is a test dependency, not a server one: these are the shapes oars answers
# with, declared loosely where a block or an event has many forms (the tests parse every answer
# with the SDK's own types).


class MessageCountTokensParams(BaseModel):
    model: str
    messages: list[dict[str, Any]]
    system: str | list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: dict[str, Any] | None = None
    thinking: dict[str, Any] | None = None


class MessageCreateParams(MessageCountTokensParams):
    max_tokens: int
    stop_sequences: list[str] | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    metadata: dict[str, Any] | None = None
    stream: bool | None = None


class MessageTokensCount(BaseModel):
    input_tokens: int


class AnthropicUsage(BaseModel):
    input_tokens: int
    output_tokens: int
    cache_creation_input_tokens: int | None
    cache_read_input_tokens: int | None


class AnthropicMessage(BaseModel):
    id: str
    type: Literal["message"]
    role: Literal["assistant"]
    model: str
    content: list[dict[str, Any]]  # thinking, text and tool_use blocks
    stop_reason: str | None
    stop_sequence: str | None
    usage: AnthropicUsage


class AnthropicStreamEvent(BaseModel):
    """The `data` of one Messages stream event: `type` names it, as its `event:` line does."""

    type: Literal[
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
        "ping",
        "error",
    ]


class AnthropicErrorDetail(BaseModel):
    type: str
    message: str


class AnthropicError(BaseModel):
    """Every 4xx and 5xx answer of the Messages routes (inside a stream, an `error` event)."""

    type: Literal["error"]
    error: AnthropicErrorDetail
    request_id: str | None = None


class EmbeddingVector(Embedding):
    """One text's vector: floats, or with `encoding_format: base64` their float32 bytes
    (little-endian) in base64, as OpenAI sends them (the SDK's type says floats only)."""

    embedding: list[float] | str  # type: ignore[assignment]


class EmbeddingList(CreateEmbeddingResponse):
    """`POST /v1/embeddings`' answer."""

    data: list[EmbeddingVector]  # type: ignore[assignment]
