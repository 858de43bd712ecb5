"""An upstream's answer: chat-completion chunks read into engine chunks. Pure: no I/O.

Reasoning deltas (`reasoning_content` or `reasoning`) and indexed tool-call deltas arrive parsed,
as the typed segments the embedded engine's parsers produce; content stays text, for the model
family's parser when the upstream left calls or `<think>` in it. Usage and logprobs are read
from the chunks that carry them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from oars.errors import EngineError
from oars.generation import EngineChunk, FinishReason, TokenLogprob, TopLogprob, Usage
from oars.jsonfast import loads
from oars.parsing import Segment, SegmentKind


def json_object(data: bytes) -> dict[str, Any]:
    try:
        value = loads(data)
    except ValueError as exc:
        raise EngineError(f"the upstream sent a chunk that is not JSON: {data[:200]!r}") from exc
    if not isinstance(value, dict):
        raise EngineError(f"the upstream sent a chunk that is not an object: {data[:200]!r}")
    error = value.get("error")
    if error:  # vLLM and others report a failure mid-stream as an error chunk
        message = error.get("message") if isinstance(error, dict) else error
        raise EngineError(f"the upstream failed mid-stream: {message}")
    return value


def merged(chunks: list[EngineChunk]) -> list[EngineChunk]:
    """A read's chunks with each run of plain text, or of reasoning, made one chunk. Under load
    a read brings several tokens of a stream; each chunk is a pass through the step, the
    builder, the log and the client's stream, while the tokens of one are one delta event."""
    if len(chunks) < 2:
        return chunks
    out, last_kind = [chunks[0]], _run_kind(chunks[0])
    for chunk in chunks[1:]:
        last, kind = out[-1], _run_kind(chunk)
        if kind is None or kind != last_kind:
            out.append(chunk)
            last_kind = kind
        elif kind == "text":
            joined = last.text + chunk.text
            logprobs = last.logprobs + chunk.logprobs
            out[-1] = EngineChunk(joined, last.num_tokens + chunk.num_tokens, logprobs)
        else:
            segment = Segment(SegmentKind.REASONING, last.segments[0].text + chunk.segments[0].text)
            out[-1] = EngineChunk(
                num_tokens=last.num_tokens + chunk.num_tokens, segments=(segment,)
            )
    return out


def _run_kind(chunk: EngineChunk) -> str | None:
    """ "text" or "reasoning" for a chunk that may join its neighbour of the same kind."""
    if chunk.finish is not None or chunk.usage is not None:
        return None
    if not chunk.segments:
        # whitespace alone stays apart: between two items the builder drops it, in a message
        # it keeps it, and which one depends on what follows it
        return "text" if chunk.text and not chunk.text.isspace() else None
    if chunk.text or len(chunk.segments) != 1:
        return None
    segment = chunk.segments[0]
    return "reasoning" if segment.kind is SegmentKind.REASONING and not segment.name else None


_FINISH = {
    "stop": FinishReason.STOP,
    "length": FinishReason.LENGTH,
    "tool_calls": FinishReason.TOOL_CALLS,
    "function_call": FinishReason.TOOL_CALLS,
    "content_filter": FinishReason.CONTENT_FILTER,
}


@dataclass
class _Call:
    name: str = ""
    arguments: str = ""
    id: str = ""
    started: bool = False


@dataclass
class ChunkReader:
    """Reads one stream. A call streams live while it is the open one; another call's deltas
    wait until the open call's arguments are a complete JSON object (upstreams that send calls
    one after another), or until the end (upstreams that interleave them). Text or reasoning
    that arrives while the open call is unfinished waits for it to end."""

    calls: dict[int, _Call] = field(default_factory=dict)
    open_call: int | None = None
    waiting: list[EngineChunk] = field(default_factory=list)  # output held behind a call
    finish_reason: FinishReason | None = None
    stop_sequence: str | None = None  # vLLM and SGLang name the stop string that matched
    usage: Usage | None = None
    reasoning_deltas: int = 0
    content_deltas: int = 0

    def read(self, chunk: Mapping[str, Any]) -> list[EngineChunk]:
        if isinstance(chunk.get("usage"), dict):
            self.usage = _usage(chunk["usage"])
        choices = chunk.get("choices") or []
        choice = choices[0] if choices and isinstance(choices[0], dict) else {}
        delta = choice.get("delta") or {}
        out: list[EngineChunk] = []
        reasoning = delta.get("reasoning_content") or delta.get("reasoning")
        if isinstance(reasoning, str) and reasoning:
            self.reasoning_deltas += 1
            segment = Segment(SegmentKind.REASONING, reasoning)
            out += self._after_calls(EngineChunk(num_tokens=1, segments=(segment,)))
        content = delta.get("content")
        if isinstance(content, str) and content:
            self.content_deltas += 1
            logprobs = _logprobs(choice.get("logprobs"))
            out += self._after_calls(EngineChunk(content, 1, logprobs))
        calls = delta.get("tool_calls")
        if isinstance(calls, list):
            segments = [s for c in calls for s in self._call_delta(c)]
            out += self._released(segments)
        reason = choice.get("finish_reason")
        if reason:
            self.finish_reason = _FINISH.get(str(reason), FinishReason.STOP)
            matched = choice.get("stop_reason")  # a token id when a stop token matched
            self.stop_sequence = matched if isinstance(matched, str) and matched else None
        return out

    def finish(self) -> list[EngineChunk]:
        """The last chunks: what was held, the remaining calls, the reason and the usage."""
        if self.finish_reason is None:
            raise EngineError("the upstream's stream ended before it finished")
        cut = self.finish_reason in (FinishReason.LENGTH, FinishReason.CONTENT_FILTER)
        out = [] if cut else self._released(self._flush_calls())
        out += self.waiting if self.open_call is None else []  # else: the call never ended
        usage = self.usage or Usage(output_tokens=self.reasoning_deltas + self.content_deltas)
        if not usage.reasoning_tokens and self.reasoning_deltas:
            usage = replace(usage, reasoning_tokens=min(self.reasoning_deltas, usage.output_tokens))
        stop = self.stop_sequence if self.finish_reason is FinishReason.STOP else None
        return [*out, EngineChunk(finish=self.finish_reason, usage=usage, stop_sequence=stop)]

    def _after_calls(self, chunk: EngineChunk) -> list[EngineChunk]:
        """Text or reasoning: after the open call if its arguments are whole, else held."""
        closed = self._close_complete()
        if self.open_call is not None:
            self.waiting.append(chunk)
            return []
        return [*self._released(list(closed)), chunk]

    def _released(self, segments: list[Segment]) -> list[EngineChunk]:
        """Call segments, then what waited for the call that just ended."""
        out = [EngineChunk(segments=tuple(segments))] if segments else []
        if self.open_call is None and self.waiting:
            out += self.waiting
            self.waiting = []
        return out

    def _index(self, raw: Mapping[str, Any]) -> int:
        """The call a delta belongs to: its `index`, or (servers that send none) a new call
        for a new `id` and the last call otherwise."""
        index = raw.get("index")
        if isinstance(index, int) and not isinstance(index, bool):
            return index
        last = max(self.calls, default=-1)
        call_id = raw.get("id")
        fresh = last < 0 or (
            isinstance(call_id, str) and call_id and call_id != self.calls[last].id
        )
        return last + 1 if fresh else last

    def _call_delta(self, raw: Any) -> list[Segment]:
        if not isinstance(raw, dict):
            raise EngineError(f"the upstream sent a tool call that is not an object: {raw!r}")
        index = self._index(raw)
        function = raw.get("function") or {}
        call = self.calls.setdefault(index, _Call(id=str(raw.get("id") or "")))
        name, piece = function.get("name"), function.get("arguments") or ""
        if isinstance(name, str) and name and not call.started and not call.arguments:
            # A name in pieces grows until the arguments begin; one repeated in every delta
            # (llama-cpp-python's server) is kept once.
            call.name += name if not call.name.endswith(name) else ""
        if not isinstance(piece, str):
            piece = json.dumps(piece)  # a server that sends the arguments as an object
        call.arguments += piece
        if self.open_call == index:
            return [Segment(SegmentKind.CALL_ARGS, piece)] if piece else []
        if self.open_call is not None and not _complete(self.calls[self.open_call].arguments):
            return []  # interleaved: this call waits
        return list(self._close_complete()) + self._start_next()

    def _close_complete(self) -> tuple[Segment, ...]:
        """Close the open call if its arguments are whole (text or another call follows)."""
        if self.open_call is None or not _complete(self.calls[self.open_call].arguments):
            return ()
        del self.calls[self.open_call]
        self.open_call = None
        return (Segment(SegmentKind.CALL_END),)

    def _start_next(self, *, at_end: bool = False) -> list[Segment]:
        """Start the first waiting call once its arguments have begun (its name is whole)."""
        waiting = [
            i
            for i, c in sorted(self.calls.items())
            if c.name and not c.started and (c.arguments or at_end)
        ]
        if self.open_call is not None or not waiting:
            return []
        index = waiting[0]
        call = self.calls[index]
        call.started, self.open_call = True, index
        head = [Segment(SegmentKind.CALL_START, name=call.name)]
        return head + ([Segment(SegmentKind.CALL_ARGS, call.arguments)] if call.arguments else [])

    def _flush_calls(self) -> list[Segment]:
        """At the end: every call in order. One whose arguments are unfinished stays open (the
        builder fails the response rather than report a half-written call)."""
        out: list[Segment] = []
        while True:
            if self.open_call is not None:
                call = self.calls[self.open_call]
                if not call.arguments:
                    call.arguments = "{}"  # a call without parameters
                    out.append(Segment(SegmentKind.CALL_ARGS, "{}"))
                if not _complete(call.arguments):
                    return out
                out += self._close_complete()
            if not self.calls:
                return out
            started = self._start_next(at_end=True)
            if not started:
                raise EngineError("the upstream sent a tool call without a name")
            out += started


def _complete(arguments: str) -> bool:
    try:
        return isinstance(json.loads(arguments), dict)
    except ValueError:
        return False


def _usage(raw: Mapping[str, Any]) -> Usage:
    prompt = raw.get("prompt_tokens_details") or {}
    completion = raw.get("completion_tokens_details") or {}
    cached = prompt.get("cached_tokens") or raw.get("prompt_cache_hit_tokens") or 0
    return Usage(
        input_tokens=int(raw.get("prompt_tokens") or 0),
        cached_tokens=int(cached),
        output_tokens=int(raw.get("completion_tokens") or 0),
        reasoning_tokens=int(completion.get("reasoning_tokens") or 0),
    )


def _logprobs(raw: Any) -> tuple[TokenLogprob, ...]:
    content = raw.get("content") if isinstance(raw, dict) else None
    if not isinstance(content, list):
        return ()
    return tuple(
        TokenLogprob(
            str(entry.get("token", "")),
            tuple(entry.get("bytes") or ()),
            float(entry.get("logprob", 0.0)),
            tuple(
                TopLogprob(
                    str(t.get("token", "")),
                    tuple(t.get("bytes") or ()),
                    float(t.get("logprob", 0.0)),
                )
                for t in entry.get("top_logprobs") or ()
                if isinstance(t, dict)
            ),
        )
        for entry in content
        if isinstance(entry, dict)
    )
