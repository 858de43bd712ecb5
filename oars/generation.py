"""Plain frozen value types shared between normalize, engines, the service and the builder."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

MIN_TEMPERATURE = 1e-4


class FinishReason(enum.Enum):
    STOP = "stop"  # end-of-generation token or a stop sequence
    LENGTH = "length"  # max_output_tokens (or the context window) reached


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


@dataclass(frozen=True)
class ChatMessage:
    """A message in chat-template form (what `tokenizer.chat_template` expects)."""

    role: str
    content: str
    tool_calls: tuple[Mapping[str, Any], ...] = ()
    tool_call_id: str | None = None
    reasoning: str = ""  # an assistant turn's reasoning, for templates that replay it

    def to_template(self) -> dict[str, Any]:
        out: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.reasoning:
            out["reasoning_content"] = self.reasoning
        if self.tool_calls:
            out["tool_calls"] = [dict(c) for c in self.tool_calls]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        return out


class GrammarKind(enum.Enum):
    JSON_SCHEMA = "json_schema"
    LARK = "lark"
    REGEX = "regex"


@dataclass(frozen=True)
class Constraint:
    """Output must match a grammar, from the first token or (lazily) from a trigger on.

    With `triggers` (regexes), text is free until one matches the output; the grammar then applies
    from where the match's group 1 starts (the text already there is fed to it first). When the
    grammar completes, generation stops, unless `rearm` and the trigger can match again later.
    `param` names the request field the grammar came from, for error messages; `fallback` is a
    looser grammar to use when the compiler cannot take `source`. A grammar that writes calls as
    JSON call objects (the Hermes way) has `calls`; for families that write calls otherwise it
    is replaced by `without_calls` (None: no constraint).
    """

    kind: GrammarKind
    source: str  # the schema as JSON text, or the grammar text
    param: str = "text.format.schema"
    triggers: tuple[str, ...] = ()
    rearm: bool = False
    fallback: str | None = None
    calls: bool = False
    without_calls: Constraint | None = None


@dataclass(frozen=True)
class EngineRequest:
    """Everything an engine needs to run one generation."""

    messages: tuple[ChatMessage, ...]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    tools: tuple[Mapping[str, Any], ...] = ()  # chat-completions shape, for the template
    top_logprobs: int | None = None  # None: no logprobs; 0..20: logprob plus that many alternatives
    template_kwargs: Mapping[str, Any] = field(default_factory=dict)
    constraint: Constraint | None = None
    # The reply may not open with these (after whitespace). After a tool result, small models
    # tend to repeat the call as a bare JSON object instead of answering: ("{", "`") stops that,
    # while calls in the family's own tags stay possible.
    opening_ban: tuple[str, ...] = ()


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


@dataclass(frozen=True)
class EngineChunk:
    """Text produced by one or more tokens; the last chunk of a generation carries `finish`."""

    text: str
    num_tokens: int = 0
    logprobs: tuple[TokenLogprob, ...] = ()
    finish: FinishReason | None = None
    usage: Usage | None = None
