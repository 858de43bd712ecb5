"""The Engine protocol: open a generation, stream it. Nothing about HTTP or the Responses API."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Protocol

from oars.generation import EngineChunk, EngineRequest
from oars.parsing.pipeline import OutputParser


@dataclass(frozen=True)
class ModelInfo:
    """What oars knows of a model, for its entry in `/v1/models` (`oars.catalog`) and for the
    checks made of a request (context, media). None: not known here (an upstream's)."""

    id: str
    context_length: int | None = None
    owned_by: str = "oars"
    modalities: tuple[str, ...] = ("text",)  # what its input may hold (oars.generation.MODALITIES)
    reasoning: bool | None = None  # it thinks before it answers
    reasoning_efforts: tuple[str, ...] = ()  # the `reasoning.effort` values that change it


@dataclass(frozen=True)
class Opened:
    """A generation the engine accepted; nothing has been generated yet.

    `parser` reads the text of its chunks (the model family's tags and call syntax, for the
    tools the model may call in this reply). Engines subclass it with what they need to run it.
    """

    request: EngineRequest
    parser: OutputParser

    @property
    def served_by(self) -> str:
        """The replica that runs it, for an engine with several ('' otherwise)."""
        return ""

    @property
    def input_tokens(self) -> int:
        """The prompt's length in tokens, where the engine knows it before generating (0: not
        known; the last chunk's usage counts it)."""
        return 0


class Engine(Protocol):
    info: ModelInfo

    @property
    def busy(self) -> bool:
        """A generation is running (for /health and tests of cancellation)."""
        ...

    async def open(self, request: EngineRequest) -> Opened:
        """Accept a request, before any byte of the response is sent: errors raised here
        (`ClientError`: context length, an upstream's 4xx; `EngineError`: unreachable) become
        the HTTP status of the whole response."""
        ...

    def generate(self, opened: Opened) -> AsyncIterator[EngineChunk]:
        """Stream the generation. Closing the iterator early stops it within a few tokens."""
        ...

    async def count_tokens(self, request: EngineRequest) -> int:
        """The input tokens the request's prompt takes."""
        ...

    async def start(self) -> None:
        """Start what runs beside the requests (an upstream's health checks), once the
        server's event loop runs."""
        ...

    async def aclose(self) -> None:
        """Close what it holds open (an upstream's pooled connections) as the server stops."""
        ...
