"""The Engine protocol: two methods, nothing about HTTP or the Responses API."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Protocol

from oars.generation import EngineChunk, EngineRequest


@dataclass(frozen=True)
class ModelInfo:
    id: str
    context_length: int
    think_tags: tuple[str, str] | None = None  # the family's reasoning tags, if it reasons
    tool_format: str = "hermes"  # how the family writes tool calls (see oars.parsing.pipeline)


@dataclass(frozen=True)
class Prepared:
    """A request the engine has accepted: rendered, tokenized, and known to fit the context."""

    request: EngineRequest
    prompt: str
    prompt_tokens: tuple[int, ...]
    grammar: str | None = None  # the compiled output constraint, if any


class Engine(Protocol):
    info: ModelInfo
    busy: bool  # a generation is running (for /health and tests of cancellation)

    def prepare(self, request: EngineRequest) -> Prepared:
        """Render and check the prompt; raise a `ClientError` (e.g. context length) if unfit.

        Called before any byte of the response is sent, so its errors become HTTP 4xx.
        """
        ...

    def generate(self, prepared: Prepared) -> AsyncIterator[EngineChunk]:
        """Stream the generation. Closing the iterator early stops it within a few tokens."""
        ...
