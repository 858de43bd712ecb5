"""Plain frozen value types shared between normalize, engines, the service and the builder.

An `EngineRequest` says what the client wants (messages, sampling, the tools it may call, the
output format), never how one engine gets it: the embedded engine compiles grammars from it
through the model's `Family`, an upstream engine translates it to chat completions.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from oars.parsing.segments import Segment
from oars.tools import ToolSet

MIN_TEMPERATURE = 1e-4


class FinishReason(enum.Enum):
    STOP = "stop"  # end-of-generation token or a stop sequence
    LENGTH = "length"  # max_output_tokens (or the context window) reached
    TOOL_CALLS = "tool_calls"  # an upstream stopped after its calls
    CONTENT_FILTER = "content_filter"  # an upstream withheld the rest
    STEERED = "steered"  # the client steered it: stopped at a safe boundary (never an engine's)


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    seed: int | None = None
    max_output_tokens: int | None = None
    stop: tuple[str, ...] = ()
    repetition_penalty: float = 1.0

    @property
    def greedy(self) -> bool:
        # Below MIN_TEMPERATURE, logits / temperature overflows float32 (NaN probabilities),
        # and the choice would be the argmax anyway.
        return self.temperature < MIN_TEMPERATURE or self.top_k == 1


MODALITIES = ("text", "image", "file", "audio")


@dataclass(frozen=True)
class Media:
    """An image, file or audio part of a message, in the chat-completions shape an upstream is
    sent (`part`), with where the request had it (`param`, for a 400 naming it)."""

    kind: str  # the Responses part's type: input_image, input_file or input_audio
    part: Mapping[str, Any]
    param: str

    @property
    def modality(self) -> str:
        return self.kind.removeprefix("input_").replace("_", "")


@dataclass(frozen=True)
class ChatMessage:
    """A message in chat-template form (what `tokenizer.chat_template` expects).

    `content` is its text. A message with images, files or audio also has `parts`: its text
    pieces and its `Media`, in order (what an upstream that takes them is sent)."""

    role: str
    content: str
    tool_calls: tuple[Mapping[str, Any], ...] = ()
    tool_call_id: str | None = None
    reasoning: str = ""  # an assistant turn's reasoning, for templates that replay it
    parts: tuple[str | Media, ...] = ()

    def to_template(self) -> dict[str, Any]:
        out: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.reasoning:
            out["reasoning_content"] = self.reasoning
        if self.tool_calls:
            out["tool_calls"] = [dict(c) for c in self.tool_calls]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        return out


@dataclass(frozen=True)
class OutputFormat:
    """`text.format` as JSON: the reply is one JSON value that follows `schema`."""

    schema: Mapping[str, Any]
    kind: str = "json_schema"  # or "json_object"
    name: str = "response"
    strict: bool | None = None
    param: str = "text.format.schema"


def _no_tools() -> ToolSet:
    return ToolSet((), (), "none")


@dataclass(frozen=True)
class Route:
    """What an engine with several replicas routes on: `follow`, the replica that served the
    response this one continues (or this response's previous step); `cache_key`, the client's
    `prompt_cache_key`. Without either, the prompt's stable prefix decides."""

    follow: str = ""
    cache_key: str = ""


NO_ROUTE = Route()


@dataclass(frozen=True)
class EngineRequest:
    """Everything an engine needs to run one generation."""

    messages: tuple[ChatMessage, ...]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    tools: ToolSet = field(default_factory=_no_tools)  # offered, callable now, and the mode
    parallel_tool_calls: bool = True
    output: OutputFormat | None = None  # None: free text
    top_logprobs: int | None = None  # None: no logprobs; 0..20: logprob plus that many alternatives
    reasoning_effort: str | None = None  # as the request said it (`none` … `max`)
    after_tool_output: bool = False  # the input ends with a tool's output
    route: Route = NO_ROUTE

    def media(self) -> list[Media]:
        """The images, files and audio of its messages, in order."""
        return [p for m in self.messages for p in m.parts if isinstance(p, Media)]


@dataclass(frozen=True)
class TopLogprob:
    token: str
    bytes: tuple[int, ...]
    logprob: float


@dataclass(frozen=True)
class TokenLogprob:
    """One sampled token. `token` is the text it adds to the output (UTF-8 split tokens: see engine)."""

    token: str
    bytes: tuple[int, ...]
    logprob: float
    top_logprobs: tuple[TopLogprob, ...] = ()


@dataclass(frozen=True)
class Usage:
    input_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    reasoning_tokens: int = 0


def usage_wire(usage: Usage) -> dict[str, Any]:
    """A usage as the Responses API writes it (a response's `usage`, a compaction's)."""
    return {
        "input_tokens": usage.input_tokens,
        "input_tokens_details": {"cached_tokens": usage.cached_tokens, "cache_write_tokens": 0},
        "output_tokens": usage.output_tokens,
        "output_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
        "total_tokens": usage.input_tokens + usage.output_tokens,
    }


@dataclass(frozen=True)
class Completion:
    """A plain generation's answer outside any response (the compactor's summary): its text
    and its usage."""

    text: str
    usage: Usage


@dataclass(frozen=True)
class EngineChunk:
    """Output of one or more tokens; the last chunk of a generation carries `finish`.

    `text` is raw model output, read by the generation's parser. An engine that gets output
    already parsed (an upstream's reasoning and indexed call deltas) sends it as `segments`,
    which come after the chunk's text. `stop_sequence`, on the last chunk: the request's stop
    sequence that ended the generation (None: an end-of-generation token, or not known).
    """

    text: str = ""
    num_tokens: int = 0
    logprobs: tuple[TokenLogprob, ...] = ()
    finish: FinishReason | None = None
    usage: Usage | None = None
    segments: tuple[Segment, ...] = ()
    stop_sequence: str | None = None
