"""One generation of an engine inside a response: chunks → parsed segments → builder events.

A response is one step, or several when server-side tools run (see `oars.service`). The step
attributes tokens and logprobs to the segments their text became, holds back answer text whose
tokens are not all out yet, and keeps only the first call under `parallel_tool_calls: false`.
A call to a server-side tool is taken out of the stream whole: once the model has written it,
the step hands it over (`ServerCall`) and goes on only when it has run, so the output stays in
the order the model wrote it.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Protocol

from oars.engines import Engine, Opened
from oars.errors import EngineError
from oars.events import Event, ResponseBuilder
from oars.events.items import arguments_object
from oars.generation import EngineChunk, FinishReason, TokenLogprob, Usage
from oars.metrics import TokenClock
from oars.parsing import Segment, SegmentKind
from oars.tools import Tool, ToolSet
from oars.turn import Turn
from oars.web_run import action_of

if TYPE_CHECKING:
    from oars.file_run import Searchers
    from oars.web_search import WebSearch

log = logging.getLogger("oars.service")


@dataclass(frozen=True)
class ServerCall:
    """A call the model wrote to a tool this server runs."""

    tool: Tool
    arguments: str


class ServerTools(Protocol):
    """What a step needs of the response's server-side tools."""

    def tool(self, model_name: str) -> Tool | None:
        """The server-side tool the model calls by this name, if it is one."""
        ...

    def run(self, builder: ResponseBuilder, call: ServerCall) -> AsyncIterator[Event]:
        """Run a call (or ask for its approval): its item's events."""
        ...


class ServerToolbox(ServerTools, Protocol):
    """What a generation needs of them across its steps (`oars.toolbox.Toolbox` is one):
    declared here, beside the step, so the service names no toolbox, even for its types."""

    def prepare(self, builder: ResponseBuilder) -> AsyncIterator[Event]:
        """Before the first step: the listings and the approved calls, as events."""
        ...

    def toolset(self, steps: int) -> ToolSet:
        """The tools the next step offers, after `steps` steps."""
        ...

    @property
    def read(self) -> Mapping[str, str]:
        """What the web searches of the response read, by their items' ids: their results,
        for the steps after them (the items keep no results)."""
        ...

    def goes_on(self, step: Step, steps: int) -> bool:
        """Whether the model goes on in a next step after this one (the `steps`-th)."""
        ...

    async def close(self) -> None:
        """End the sessions the response opened."""
        ...


class ServerToolsFactory(Protocol):
    """Where a response's server-side tools come from (the operator's MCP settings)."""

    observe: Callable[[str, str, float], None] | None  # told (server, outcome, seconds) of a call
    web: WebSearch | None  # the operator's web search backend (None: web_search is not run)
    files: Searchers | None  # the vector stores file_search runs over (None: it is not run)

    @property
    def labels(self) -> frozenset[str]:
        """The labels of the servers the operator configured (a request may name them)."""
        ...

    async def open(self, turn: Turn) -> ServerToolbox:
        """A response's tools; a client error for what the request may not use, before
        anything is sent."""
        ...


@dataclass
class _Carry:
    """Tokens not yet attributed to a segment (their text may still be held by a parser)."""

    logprobs: list[TokenLogprob] = field(default_factory=list)
    num_tokens: int = 0


@dataclass
class _HeldText:
    """Answer text whose tokens are not all out yet: a parser holds part of one token back
    (a `<` that may open a tag), so a delta with logprobs waits until text and tokens agree."""

    text: str = ""
    logprobs: list[TokenLogprob] = field(default_factory=list)
    phase: str = ""

    def add(self, text: str, logprobs: tuple[TokenLogprob, ...]) -> bool:
        """True when the text so far is what its tokens spell (or never will be)."""
        self.text += text
        self.logprobs.extend(logprobs)
        spelled = "".join(lp.token for lp in self.logprobs)
        return spelled == self.text or not spelled.startswith(self.text)


@dataclass
class _Pending:
    """A server-side call the model is writing."""

    tool: Tool
    arguments: str = ""


class Step:
    """One engine generation, read into the response's builder."""

    def __init__(
        self,
        opened: Opened,
        builder: ResponseBuilder,
        *,
        include_logprobs: bool = False,
        single_call: bool = False,
        tools: ServerTools | None = None,
    ) -> None:
        self.opened, self.builder, self.tools = opened, builder, tools
        self.parser = opened.parser
        self.finish: FinishReason | None = None
        self.stop_sequence: str | None = None  # the stop sequence that ended it, if one did
        self.usage = Usage()
        self.client_calls = 0  # calls the client runs
        self.server_calls = 0  # calls this server ran (or asked approval for)
        self.cut = False  # it ended inside a call to a server-side tool
        self._single_call = single_call
        self._calls_done = 0
        self._degraded = 0
        self._carry = _Carry()
        self._reasoning_tokens = 0
        self._last_kind: SegmentKind | None = None  # of the last segment sent to the builder
        self._with_logprobs = include_logprobs
        self._held = _HeldText()
        self._pending: _Pending | None = None
        self._produced = 0  # output tokens so far

    async def run(
        self,
        engine: Engine,
        clock: TokenClock | None = None,
        stop: Callable[[], bool] | None = None,
    ) -> AsyncIterator[list[Event]]:
        """The step's events, a chunk's at a time, up to its last chunk; `clock` is told of
        the tokens as they come. An engine that ends without a last chunk is an `EngineError`.
        Once `stop()` is true, the step ends at the first safe boundary (`at_boundary`) with
        `FinishReason.STEERED`: what a parser still holds back (a possible tag) is dropped."""
        finish: EngineChunk | None = None
        chunks = engine.generate(self.opened)
        async for chunk in chunks:
            if clock is not None:
                clock.tokens(chunk.num_tokens)
            self._produced += chunk.num_tokens
            async for events in self._chunk_events(chunk):
                yield events
            if chunk.finish is not None:
                finish = chunk
            elif stop is not None and stop() and self.at_boundary:
                if isinstance(chunks, AsyncGenerator):
                    await chunks.aclose()  # its generation stops now, its slot is free
                self._steered()
                return
        if finish is None or finish.finish is None:
            raise EngineError("the engine stopped without finishing")
        yield self._cut_call()
        usage = finish.usage or Usage()
        if not usage.reasoning_tokens:  # unless the engine counted them itself
            usage = replace(usage, reasoning_tokens=self._reasoning_tokens)
        self.finish, self.usage = finish.finish, usage
        self.stop_sequence = finish.stop_sequence
        if log.isEnabledFor(logging.DEBUG):
            log.debug("%s output: %s", self.builder.id, self.builder.output)

    async def _chunk_events(self, chunk: EngineChunk) -> AsyncIterator[list[Event]]:
        """A chunk's events; a server-side call it completes runs where the model wrote it."""
        events: list[Event] = []
        for out in self._apply(chunk):
            if not isinstance(out, ServerCall):
                events.append(out)
                continue
            yield events  # what came before the call goes out before it runs
            events = []
            async for event in self._run(out):
                yield [event]
        yield events

    @property
    def at_boundary(self) -> bool:
        """The output may stop here: after text or reasoning (between tokens), before any call
        the client runs, never inside a call."""
        return (
            self._pending is None
            and self.client_calls == 0
            and self._last_kind in (None, SegmentKind.TEXT, SegmentKind.REASONING)
        )

    def _steered(self) -> None:
        self.finish = FinishReason.STEERED
        self.usage = Usage(
            input_tokens=self.opened.input_tokens,
            output_tokens=self._produced,
            reasoning_tokens=self._reasoning_tokens,
        )

    def _run(self, call: ServerCall) -> AsyncIterator[Event]:
        assert self.tools is not None
        self.server_calls += 1
        return self.tools.run(self.builder, call)

    def release(self) -> list[Event]:
        """Answer text held back for its tokens goes out now (the step ends, or the response)."""
        held, self._held = self._held, _HeldText()
        if not held.text:
            return []
        segment = Segment(SegmentKind.TEXT, held.text, held.phase)
        return self.builder.add(segment, tuple(held.logprobs))

    def _apply(self, chunk: EngineChunk) -> Iterator[Event | ServerCall]:
        """The chunk's events, made as they are taken: a server call runs before the segments
        after it reach the builder."""
        segments = self._parse(chunk)
        if segments and self._last_kind not in (None, segments[0].kind):
            # Tokens the parser swallowed since the last segment (a closing tag, separators)
            # ended that segment: they count with it, and are in no later text's logprobs.
            self._settle(self._carry, self._last_kind)
            self._carry = _Carry()
        self._carry.logprobs.extend(chunk.logprobs)
        self._carry.num_tokens += chunk.num_tokens
        if not segments:
            return
        # A chunk's tokens belong to the last segment its text completed.
        carry, self._carry = self._carry, _Carry()
        last = segments[-1]
        self._settle(carry, last.kind)
        self._last_kind = last.kind
        for segment in segments[:-1]:
            yield from self._add(segment)
        yield from self._add(last, tuple(carry.logprobs) if last.kind is SegmentKind.TEXT else ())

    def _add(
        self, segment: Segment, logprobs: tuple[TokenLogprob, ...] = ()
    ) -> Sequence[Event | ServerCall]:
        server = self._server_call(segment)
        if server is not None:
            return server
        if segment.kind is SegmentKind.CALL_END:
            self.client_calls += 1
        if segment.kind is not SegmentKind.TEXT or not self._with_logprobs:
            return [*self.release(), *self.builder.add(segment, logprobs)]
        events = self.release() if segment.name != self._held.phase else []
        self._held.phase = segment.name
        if not self._held.add(segment.text, logprobs):
            return events
        return [*events, *self.release()]

    def _server_call(self, segment: Segment) -> list[Event | ServerCall] | None:
        """A segment of a call to a server-side tool: kept until the call is whole (None for
        any other segment)."""
        if self._pending is None:
            if segment.kind is not SegmentKind.CALL_START or self.tools is None:
                return None  # (most segments: text, looked up no further)
            tool = self.tools.tool(segment.name)
            if tool is None:
                return None
            self._pending = _Pending(tool)
            return []
        if segment.kind is SegmentKind.CALL_ARGS:
            self._pending.arguments += segment.text
            return []
        if segment.kind is SegmentKind.CALL_END:
            pending, self._pending = self._pending, None
            return [*self.release(), ServerCall(pending.tool, pending.arguments)]
        return []

    def _cut_call(self) -> list[Event]:
        """A server-side call the model had not finished when it stopped: its item (of its
        tool's type: a search's is searching) shows it, and the response's ending closes it
        as cut (it never runs)."""
        pending, self._pending = self._pending, None
        if pending is None:
            return []
        self.cut = True
        tool = pending.tool
        if tool.kind == "server_file_search":
            item = self.builder.file_search_call()
        elif tool.kind == "server_web_search":
            asked = arguments_object(pending.arguments)
            item = self.builder.web_search_call(action_of(tool.name, asked))
        else:
            item = self.builder.mcp_call(tool.namespace or "", tool.name, pending.arguments)
        return [*self.release(), *item]

    def _settle(self, carry: _Carry, kind: SegmentKind | None) -> None:
        if kind is SegmentKind.REASONING:
            self._reasoning_tokens += carry.num_tokens

    def _parse(self, chunk: EngineChunk) -> list[Segment]:
        segments = self.parser.feed(chunk.text) if chunk.text else []
        if chunk.finish is not None:
            segments += self.parser.finish()
        segments += chunk.segments
        if self.parser.degraded > self._degraded:
            self._degraded = self.parser.degraded
            log.warning("model wrote call-like text that is not a valid call; sent as text")
        return self._limit_calls(segments)

    def _limit_calls(self, segments: list[Segment]) -> list[Segment]:
        """`parallel_tool_calls: false`: nothing after the first complete call."""
        if not self._single_call:
            return segments
        kept: list[Segment] = []
        for seg in segments:
            if self._calls_done:
                break
            kept.append(seg)
            self._calls_done += seg.kind is SegmentKind.CALL_END
        return kept
