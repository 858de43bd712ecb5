"""Test helpers shipped with the package: a scripted engine that needs no model.

engine = ScriptedEngine(["Hel", "lo", "!"])             # three chunks, then stop
engine = ScriptedEngine(["Hi"], finish=FinishReason.LENGTH)
engine = ScriptedEngine(["Hi", ScriptedEngine.FAIL])     # an engine failure mid-stream
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

from oars.engines.base import ModelInfo, Prepared
from oars.errors import ContextLengthExceeded, EngineError
from oars.generation import EngineChunk, EngineRequest, FinishReason, TokenLogprob, Usage


@dataclass
class ScriptedEngine:
    """Replays fixed chunks of text. Each string is one chunk of one token."""

    FAIL = object()

    script: Sequence[object] = ("Hello", " world", "!")
    finish: FinishReason = FinishReason.STOP
    info: ModelInfo = field(default_factory=lambda: ModelInfo("scripted", context_length=4096))
    logprobs: bool = False
    delay: float = 0.0
    busy: bool = False
    requests: list[EngineRequest] = field(default_factory=list)

    def prepare(self, request: EngineRequest) -> Prepared:
        prompt = "\n".join(f"{m.role}: {m.content}" for m in request.messages)
        tokens = tuple(range(len(prompt.split())))
        if len(tokens) > self.info.context_length:
            raise ContextLengthExceeded(
                f"The prompt has {len(tokens)} tokens; this model's context is "
                f"{self.info.context_length}."
            )
        self.requests.append(request)
        return Prepared(request, prompt, tokens)

    async def generate(self, prepared: Prepared) -> AsyncIterator[EngineChunk]:
        limit = prepared.request.sampling.max_output_tokens
        produced = 0
        for piece in self.script:
            if self.delay:
                await asyncio.sleep(self.delay)
            if piece is self.FAIL:
                raise EngineError("scripted engine failure")
            if limit is not None and produced >= limit:
                yield self._last(prepared, produced, FinishReason.LENGTH)
                return
            produced += 1
            text = str(piece)
            yield EngineChunk(text, 1, self._logprobs(text))
        yield self._last(prepared, produced, self.finish)

    def _logprobs(self, text: str) -> tuple[TokenLogprob, ...]:
        if not self.logprobs:
            return ()
        return (TokenLogprob(text, tuple(text.encode()), -0.5),)

    @staticmethod
    def _last(prepared: Prepared, produced: int, reason: FinishReason) -> EngineChunk:
        usage = Usage(input_tokens=len(prepared.prompt_tokens), output_tokens=produced)
        return EngineChunk("", 0, finish=reason, usage=usage)
