"""ResponsesService: engine chunks → parsed segments → builder events. Nothing else."""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, field, replace

from oars.engines import Engine, Opened
from oars.errors import EngineError, NotFound
from oars.events import Event, ResponseBuilder
from oars.generation import EngineChunk, EngineRequest, FinishReason, TokenLogprob, Usage
from oars.metrics import TokenClock
from oars.normalize import ResponseRequest
from oars.parsing import Segment, SegmentKind
from oars.sealing import Sealer

log = logging.getLogger("oars.service")


class ResponsesService:
    """The models served (the first is the default) and how a request becomes a run.

    With `strict_models`, a request naming a model not served is a 404; otherwise (one
    embedded model) any name is served by the default model, as llama.cpp's server does.
    """

    def __init__(
        self,
        engines: Engine | dict[str, Engine],
        *,
        default_temperature: float | None = None,
        sealer: Sealer | None = None,
        strict_models: bool = False,
    ) -> None:
        self.engines = engines if isinstance(engines, dict) else {engines.info.id: engines}
        self.default_model = next(iter(self.engines))
        self.strict_models = strict_models or len(self.engines) > 1
        self.default_temperature = 1.0 if default_temperature is None else default_temperature
        self.sealer = sealer  # encrypts reasoning for `include: ["reasoning.encrypted_content"]`

    @property
    def engine(self) -> Engine:
        """The default model's engine."""
        return self.engines[self.default_model]

    def engine_for(self, model: str) -> Engine:
        engine = self.engines.get(model)
        if engine is not None:
            return engine
        if self.strict_models:
            raise NotFound(
                f"The model {model[:200]!r} does not exist; this server serves "
                f"{', '.join(self.engines)}.",
                param="model",
                code="model_not_found",
            )
        return self.engine

    async def start(self, request: ResponseRequest) -> Run:
        """Accept a request; errors before any byte raise here (context length, a model that
        is not served, an upstream that refuses)."""
        engine = self.engine_for(request.model)
        opened = await engine.open(request.engine)
        tools = {t.model_name: t for t in request.tools.callable}
        builder = ResponseBuilder(
            request.echo,
            include_logprobs=request.include_logprobs,
            model=request.model,
            tools=tools,
            background=request.background,
            seal=self.sealer.seal if self.sealer and request.include_encrypted_reasoning else None,
        )
        if not request.generate:
            return Run(
                _Unread(engine, await engine.count_tokens(request.engine)), opened, builder, request
            )
        return Run(engine, opened, builder, request)

    async def count_tokens(self, request: ResponseRequest) -> int:
        """The input tokens the request's prompt takes."""
        return await self.engine_for(request.model).count_tokens(request.engine)

    async def aclose(self) -> None:
        """Close what engines hold open (an upstream's pooled connections)."""
        for engine in self.engines.values():
            close = getattr(engine, "aclose", None)
            if close is not None:
                await close()


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


class _Unread:
    """`generate: false` (Codex prewarms a socket with it): the input is taken and counted, and
    the response completes with no output; a continuation of it renders the input again."""

    def __init__(self, engine: Engine, input_tokens: int) -> None:
        self.engine, self.info, self.input_tokens = engine, engine.info, input_tokens

    @property
    def busy(self) -> bool:
        return self.engine.busy

    async def open(self, request: EngineRequest) -> Opened:
        return await self.engine.open(request)

    async def count_tokens(self, request: EngineRequest) -> int:
        return await self.engine.count_tokens(request)

    async def generate(self, opened: Opened) -> AsyncIterator[EngineChunk]:
        yield EngineChunk("", 0, finish=FinishReason.STOP, usage=Usage(self.input_tokens))


class Run:
    """One generation in flight."""

    def __init__(
        self, engine: Engine, opened: Opened, builder: ResponseBuilder, request: ResponseRequest
    ) -> None:
        self.engine, self.opened, self.builder = engine, opened, builder
        self.parser = opened.parser
        self._single_call = not request.parallel_tool_calls
        self._calls_done = 0
        self._degraded = 0
        self._carry = _Carry()
        self._reasoning_tokens = 0
        self._last_kind: SegmentKind | None = None  # of the last segment sent to the builder
        self._with_logprobs = request.include_logprobs
        self._held = _HeldText()
        self._compacted = request.compacted

    async def events(self, clock: TokenClock | None = None) -> AsyncGenerator[Event, None]:
        """The run's events; `clock` is told of the tokens as they come."""
        for event in self.builder.start() + self.builder.progress():
            yield event
        if self._compacted is not None:
            for event in self.builder.compaction(self._compacted):
                yield event
        finish: EngineChunk | None = None
        try:
            async for chunk in self.engine.generate(self.opened):
                if clock is not None:
                    clock.tokens(chunk.num_tokens)
                for event in self._apply(chunk):
                    yield event
                if chunk.finish is not None:
                    finish = chunk
        except EngineError as exc:
            log.warning("generation failed: %s", exc)
            for event in self._fail(str(exc)):
                yield event
            return
        except Exception:  # the stream's boundary: whatever broke, the client gets response.failed
            log.exception("generation crashed")
            for event in self._fail("internal error during generation"):
                yield event
            return
        if finish is None or finish.finish is None:
            for event in self._fail("the engine stopped without finishing"):
                yield event
            return
        usage = finish.usage or Usage()
        if not usage.reasoning_tokens:  # unless the engine counted them itself
            usage = replace(usage, reasoning_tokens=self._reasoning_tokens)
        for event in self._release() + self.builder.finish(finish.finish, usage):
            yield event
        response = self.builder.response
        log.debug("%s output: %s", response["id"], response["output"])

    def _apply(self, chunk: EngineChunk) -> list[Event]:
        segments = self._parse(chunk)
        if segments and self._last_kind not in (None, segments[0].kind):
            # Tokens the parser swallowed since the last segment (a closing tag, separators)
            # ended that segment: they count with it, and are in no later text's logprobs.
            self._settle(self._carry, self._last_kind)
            self._carry = _Carry()
        self._carry.logprobs.extend(chunk.logprobs)
        self._carry.num_tokens += chunk.num_tokens
        if not segments:
            return []
        # A chunk's tokens belong to the last segment its text completed.
        carry, self._carry = self._carry, _Carry()
        last = segments[-1]
        self._settle(carry, last.kind)
        self._last_kind = last.kind
        events: list[Event] = []
        for segment in segments[:-1]:
            events += self._add(segment)
        lps = tuple(carry.logprobs) if last.kind is SegmentKind.TEXT else ()
        return events + self._add(last, lps)

    def _add(self, segment: Segment, logprobs: tuple[TokenLogprob, ...] = ()) -> list[Event]:
        if segment.kind is not SegmentKind.TEXT or not self._with_logprobs:
            return self._release() + self.builder.add(segment, logprobs)
        events = self._release() if segment.name != self._held.phase else []
        self._held.phase = segment.name
        if not self._held.add(segment.text, logprobs):
            return events
        return events + self._release()

    def _fail(self, message: str) -> list[Event]:
        """What the model wrote stays in the output; then `error` and `response.failed`."""
        return self.fail(message)

    def fail(self, message: str, code: str = "server_error") -> list[Event]:
        """End the response `failed` from outside (after `events()` was closed)."""
        return self._release() + self.builder.fail(message, code)

    def cancel(self) -> list[Event]:
        """End the response `cancelled` (after `events()` was closed)."""
        return self._release() + self.builder.cancel()

    def _release(self) -> list[Event]:
        held, self._held = self._held, _HeldText()
        if not held.text:
            return []
        segment = Segment(SegmentKind.TEXT, held.text, held.phase)
        return self.builder.add(segment, tuple(held.logprobs))

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
