"""ResponsesService: a turn becomes a generation, which owns the response from its first event
to its ending.

A generation is one engine step (`oars.step`), or several: when the model calls a tool this
server runs (an MCP server's), the call runs as soon as it is written, and the model goes on
in a next step that sees the result, until it answers, calls a tool of the client's, asks for
an approval, or reaches a limit. One builder makes every event of every step.

Only the generation ends a response: `batches()` (or `events()`) ends it completed, incomplete or failed (an
engine error after streaming began); the run manager asks it to `cancel()`, `fail()` (a timeout,
a store that failed) or `fail_instead()` (an ending that could not be stored). Before the first
event, errors are raised by `prepare` (a model that is not served, a part it does not take) or by
the generation's `open` (context length, an upstream that refuses; `start` does both) and become
the HTTP status of the whole response.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncGenerator, Sequence
from dataclasses import replace

from oars.compactor import Planned, plan_compaction
from oars.engines import Engine, Opened
from oars.errors import ClientError, EngineError, NotFound, OarsError
from oars.events import CallTarget, Event, ResponseBuilder
from oars.generation import ChatMessage, Completion, EngineRequest, FinishReason, Usage
from oars.metrics import TokenClock
from oars.parsing import SegmentKind
from oars.prompt import Unseal, check_media
from oars.sealing import Sealer
from oars.step import ServerToolbox, ServerToolsFactory, Step
from oars.turn import Turn

log = logging.getLogger("oars.service")


class ResponsesService:
    """The models served (the first is the default) and how a turn becomes a generation.

    With `strict_models`, a request naming a model not served is a 404; otherwise (one
    embedded model) any name is served by the default model, as llama.cpp's server does.
    `toolboxes` runs the MCP servers requests name (None: a request that names one is a 400).
    """

    def __init__(
        self,
        engines: Engine | dict[str, Engine],
        *,
        default_temperature: float | None = None,
        sealer: Sealer | None = None,
        strict_models: bool = False,
        toolboxes: ServerToolsFactory | None = None,
    ) -> None:
        self.engines = engines if isinstance(engines, dict) else {engines.info.id: engines}
        self.default_model = next(iter(self.engines))
        self.strict_models = strict_models or len(self.engines) > 1
        self.default_temperature = 1.0 if default_temperature is None else default_temperature
        self.sealer = sealer  # encrypts reasoning for `include: ["reasoning.encrypted_content"]`
        self.toolboxes = toolboxes

    @property
    def unseal(self) -> Unseal | None:
        """The server's key for sealed reasoning and compactions, opening them."""
        return self.sealer.unseal if self.sealer is not None else None

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

    async def start(self, turn: Turn) -> Generation:
        """Accept a turn and open its engine; errors before any byte raise here."""
        generation = await self.prepare(turn)
        await generation.open()
        return generation

    async def prepare(self, turn: Turn) -> Generation:
        """Accept a turn without asking its engine to generate yet (`Generation.open` does):
        what is wrong with the request itself raises here. A compaction the turn makes first
        is decided here (its prompt's tokens counted) and made in the stream."""
        request = turn.request
        engine = self.engine_for(request.model)
        builder = ResponseBuilder(
            request.echo,
            include_logprobs=request.include_logprobs,
            include_sources=request.include_sources,
            include_results=request.include_results,
            model=request.model,
            tools={
                t.model_name: CallTarget(t.name, t.namespace, t.kind) for t in turn.tools.callable
            },
            background=request.background,
            seal=self.sealer.seal if self.sealer and request.include_encrypted_reasoning else None,
        )
        _check_media(engine, turn.messages)
        toolbox = await self._toolbox(turn)
        compaction = None
        if request.compaction is not None:
            compaction = await plan_compaction(turn, self)
        return Generation(engine, turn, builder, toolbox=toolbox, compaction=compaction)

    async def open(self) -> None:
        """Start what engines run beside the requests (an upstream's health checks)."""
        for engine in self.engines.values():
            await engine.start()

    async def _toolbox(self, turn: Turn) -> ServerToolbox | None:
        searches = any(
            t.kind in ("server_tool_search", "server_web_search", "server_file_search")
            for t in turn.tools.offered
        )
        if not turn.request.generate or not (turn.request.servers or turn.approved() or searches):
            return None
        if self.toolboxes is None:
            raise ClientError(
                "This server runs no server-side tools (MCP servers, tool search).",
                param="tools",
                code="unsupported_value",
            )
        return await self.toolboxes.open(turn)

    def context_length(self, model: str) -> int | None:
        """The model's context window in tokens (None: not known here, an upstream's)."""
        return self.engine_for(model).info.context_length

    async def count_tokens(self, model: str, request: EngineRequest) -> int:
        """The input tokens a request's prompt takes."""
        engine = self.engine_for(model)
        _check_media(engine, request.messages)
        return await engine.count_tokens(request)

    async def complete(self, model: str, request: EngineRequest) -> Completion:
        """A plain generation outside any response (the compactor's summary): its answer."""
        engine = self.engine_for(model)
        _check_media(engine, request.messages)
        opened = await engine.open(request)
        texts: list[str] = []
        usage: Usage | None = None
        async for chunk in engine.generate(opened):
            segments = opened.parser.feed(chunk.text) if chunk.text else []
            if chunk.finish is not None:
                segments += opened.parser.finish()
                usage = chunk.usage or Usage()
            texts += [s.text for s in segments if s.kind is SegmentKind.TEXT]
        if usage is None:
            raise EngineError("the engine stopped without finishing")
        return Completion("".join(texts), usage)

    async def aclose(self) -> None:
        """Close what engines hold open (an upstream's pooled connections), and the web
        search backend's connections."""
        for engine in self.engines.values():
            await engine.aclose()
        if self.toolboxes is not None and self.toolboxes.web is not None:
            await self.toolboxes.web.aclose()


class Generation:
    """One response in flight: its builder, and the engine steps that fill it."""

    def __init__(
        self,
        engine: Engine,
        turn: Turn,
        builder: ResponseBuilder,
        *,
        toolbox: ServerToolbox | None = None,
        compaction: Planned | None = None,
    ) -> None:
        self.engine, self.turn, self.builder = engine, turn, builder
        self.toolbox = toolbox
        self.compaction = compaction  # made in the stream, before the first step
        self.error: OarsError | None = None  # what failed it, for a response not streamed
        # the stop sequence that ended its last step, for a door that names it (Messages)
        self.stop_sequence: str | None = None
        self._first: Opened | None = None  # the first step, opened by `open`
        self._unread: int | None = None  # `generate: false`: the input's tokens
        self._step: Step | None = None
        # the engine replica that served its last step (recorded, for the chain's next turn)
        self.served_by = turn.served_by
        self.steering = False  # a client asked it to stop at the next safe boundary

    @property
    def id(self) -> str:
        return self.builder.id

    async def open(self) -> None:
        """Ask the engine for the first step (an upstream: until its status line), or, with
        `generate: false`, for the input's token count. Errors here come before any byte."""
        request = self.turn.request
        if self.compaction is not None:
            return  # the engine is asked once the compaction is made
        if not request.generate:
            self._unread = await self.engine.count_tokens(self.turn.engine_request())
        elif self.toolbox is None:  # with MCP servers, what the model may call is known later
            self._first = await self.engine.open(self.turn.engine_request())
            self.served_by = self._first.served_by

    async def events(self, clock: TokenClock | None = None) -> AsyncGenerator[Event, None]:
        """Every event of the response, its ending included; `clock` is told of the tokens."""
        async with contextlib.aclosing(self.batches(clock)) as batches:
            async for batch in batches:
                for event in batch:
                    yield event

    async def batches(self, clock: TokenClock | None = None) -> AsyncGenerator[list[Event], None]:
        """The events as they are made, a batch at a time (an engine chunk's): a consumer that
        stops between batches leaves no event numbered and unsent."""
        yield self.builder.start() + self.builder.progress()
        try:
            if self.compaction is not None:
                yield self.builder.compacting(self.compaction.item_id)
                self.turn = await self.compaction.make()
                assert self.turn.compacted is not None
                yield self.builder.compaction(self.turn.compacted)
            async for batch in self._run(clock):
                yield batch
        except (EngineError, ClientError) as exc:
            log.warning("generation failed: %s", exc)
            yield self._failed(exc)
        except Exception:  # the stream's boundary: whatever broke, the client gets response.failed
            log.exception("generation crashed")
            yield self._failed(EngineError("internal error during generation"))
        finally:
            if self.toolbox is not None:
                await self.toolbox.close()

    async def _run(self, clock: TokenClock | None) -> AsyncGenerator[list[Event], None]:
        """The events, in batches (one an engine chunk, as the step makes them)."""
        if not self.turn.request.generate:
            unread = self._unread
            if unread is None:  # counted once the compaction is made
                unread = await self.engine.count_tokens(self.turn.engine_request())
            yield self.builder.finish(FinishReason.STOP, Usage(unread))
            return
        toolbox = self.toolbox
        if toolbox is not None:
            async for event in toolbox.prepare(self.builder):
                yield [event]
        usage, rounds, finish = Usage(), 0, FinishReason.STOP
        limit = self.turn.request.sampling.max_output_tokens
        while True:
            step = await self._next_step(rounds, usage, limit)
            if step is None:  # the output tokens are spent
                finish = FinishReason.LENGTH
                break
            async for batch in step.run(self.engine, clock, self._stop_asked):
                yield batch
            assert step.finish is not None
            usage, finish, rounds = _sum(usage, step.usage), step.finish, rounds + 1
            self.stop_sequence = step.stop_sequence
            if toolbox is None or not toolbox.goes_on(step, rounds):
                break
            if self.steering:  # between two steps is a safe boundary too
                finish = FinishReason.STEERED
                break
        yield self._release() + self.builder.finish(finish, usage)

    def steer(self) -> None:
        """Stop at the next safe boundary of the output (see `Step.at_boundary`), or between
        two steps: the response ends `incomplete`, reason `steered`. One that ends first ends
        as it would have."""
        self.steering = True

    def _stop_asked(self) -> bool:
        return self.steering

    async def _next_step(self, rounds: int, usage: Usage, limit: int | None) -> Step | None:
        left = None if limit is None else limit - usage.output_tokens
        if left is not None and left <= 0:
            return None
        opened, self._first = self._first, None
        if opened is None:
            toolset, turn = None, self.turn
            if self.toolbox is not None:
                toolset = self.toolbox.toolset(rounds)
                turn = replace(turn, read=self.toolbox.read)
            turn = replace(turn.then(self.builder.output), served_by=self.served_by)
            opened = await self.engine.open(turn.engine_request(toolset, left))
            self.served_by = opened.served_by or self.served_by
        self._step = Step(
            opened,
            self.builder,
            include_logprobs=self.turn.request.include_logprobs,
            single_call=not self.turn.request.parallel_tool_calls,
            tools=self.toolbox,
        )
        return self._step

    def _release(self) -> list[Event]:
        return self._step.release() if self._step is not None else []

    def _failed(self, exc: OarsError) -> list[Event]:
        """What the model wrote stays in the output; then `error` and `response.failed`."""
        self.error = exc
        code = getattr(exc, "code", None) or "server_error"
        return self._release() + self.builder.fail(str(exc), code)

    # ---- endings asked for from outside (after `events()` was closed) ------------------------

    def fail(self, message: str, code: str = "server_error") -> list[Event]:
        """End the response `failed` (a timeout, a store that failed)."""
        return self._release() + self.builder.fail(message, code)

    def cancel(self) -> list[Event]:
        """End the response `cancelled`; one cancelled before it began starts first."""
        begun = self.builder.started
        start = [] if begun else self.builder.start()
        return start + self._release() + self.builder.cancel()

    def fail_instead(self, ending: list[Event], message: str, code: str) -> list[Event]:
        """The ending not sent yet could not stand (it could not be stored)."""
        return self.builder.fail_instead(ending, message, code)


def _check_media(engine: Engine, messages: Sequence[ChatMessage]) -> None:
    """400 naming an image, file or audio part the model does not take, before any byte."""
    check_media(messages, engine.info.modalities, engine.info.id)


def _sum(a: Usage, b: Usage) -> Usage:
    return replace(
        a,
        input_tokens=a.input_tokens + b.input_tokens,
        cached_tokens=a.cached_tokens + b.cached_tokens,
        output_tokens=a.output_tokens + b.output_tokens,
        reasoning_tokens=a.reasoning_tokens + b.reasoning_tokens,
    )
