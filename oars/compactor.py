"""Writing a compaction: the model itself summarizes a long history.

`compact(summarizer, model, items)` turns everything the model currently sees into a plain
transcript, asks the model for a summary that keeps what an agent needs to go on (the task,
files, commands, decisions, open steps), and seals it into a `compaction` item covering what the
assistant and the tools said (see `oars.compaction`); the newest user messages (within a budget)
are returned with it, for a client that replaces its history with the result.

A create request compacts its turn before generating: with `context_management`, when the
prompt would pass the threshold or the model's context, or when the input ends with a
`compaction_trigger` item. The run manager decides it (`plan_compaction`) before the response
starts, and the generation makes it (`Planned.make`) in the response's stream, under
`response.compaction.compacting`. The `/v1/responses/compact` route calls `compact`. Each
hands over a `Summarizer`, the few things compacting asks of the server (the service is one),
so this module sits below the service and the turn stays a value that does no I/O.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from oars.compaction import COMPACTION_TYPES, TRIGGER, Sealed, fingerprint, place
from oars.errors import EngineError, InvalidRequest
from oars.generation import ChatMessage, Completion, EngineRequest, SamplingParams, usage_wire
from oars.ids import new_id
from oars.prompt import error_text
from oars.sealing import Sealer
from oars.store import Json
from oars.tools import loaded_definitions
from oars.turn import Turn

log = logging.getLogger("oars.compaction")

SUMMARY_TOKENS = 400  # the summary's length, at most (it is asked for 200 words)
KEEP_USER_CHARS = 6000  # user messages kept verbatim, newest first (about 1,500 tokens)
TRANSCRIPT_TOKENS = 8192  # the summary prompt, at most (less on a smaller context)
_ENTRY_CHARS = 1600  # one message, call or tool output in the transcript: its head and tail
_RESERVE = 1024  # tokens left for the reply when deciding a prompt fits the context

INSTRUCTIONS = """\
You write the memory of a coding agent whose conversation grew too long. The agent will \
continue the work with only your summary and the user's latest messages. Write these five \
headings, each with a few short bullet points:

Task: what the user asked for, in the user's words where they matter.
Files: the files read, created or changed, with their paths and what was done to them.
Results: what commands and tools showed (errors, test results, values).
Decisions: what was decided and why.
Next: the open steps, in order.

Be concrete (names, paths, numbers) and brief: at most 200 words. Say each fact once; group \
repeated actions into one bullet. Do not greet and do not invent anything."""


class Summarizer(Protocol):
    """What compacting asks of the server: the key a compaction is sealed with, and a model
    to measure and complete a summary prompt with. Narrow, so the compactor needs no service
    (`ResponsesService` is one, structurally) and tests can hand in a fake."""

    @property
    def sealer(self) -> Sealer | None:
        """The server's key (None: it cannot seal, so it cannot compact)."""
        ...

    def context_length(self, model: str) -> int | None:
        """The model's context window in tokens (None: not known here)."""
        ...

    async def count_tokens(self, model: str, request: EngineRequest) -> int:
        """The input tokens a request's prompt takes on that model."""
        ...

    async def complete(self, model: str, request: EngineRequest) -> Completion:
        """A plain generation outside any response: its answer."""
        ...


@dataclass(frozen=True)
class Compacted:
    kept: list[Json]  # user messages kept verbatim
    item: Json  # {"type": "compaction", "id", "encrypted_content"}
    usage: dict[str, Any]


@dataclass(frozen=True)
class Transcript:
    """What a compaction summarizes, written out before the model is asked: the transcript's
    entries, the user messages kept verbatim, and what the sealed item covers and keeps."""

    sealer: Sealer
    entries: list[str]
    kept: list[Json]
    covered: frozenset[str]
    tools: tuple[Mapping[str, Any], ...]

    @classmethod
    def of(cls, sealer: Sealer | None, items: Sequence[Json]) -> Transcript:
        """400 when this server cannot seal, or when there is nothing to compact."""
        if sealer is None:
            raise InvalidRequest(
                "This server has no key to seal a compaction with.",
                param=None,
                code="compaction_unavailable",
            )
        opened = {
            i: Sealed.open(item.get("encrypted_content"), sealer.unseal)
            for i, item in enumerate(items)
            if item.get("type") in COMPACTION_TYPES
        }
        placement = place(items, opened)
        entries: list[str] = []
        visible: list[Json] = []
        for i, item in enumerate(items):
            if i in placement.summaries:
                entries.append(f"[Summary of what came before]\n{placement.summaries[i]}")
            if i not in placement.hidden:
                visible.append(item)
                entry = _entry(item)
                if entry:
                    entries.append(entry)
        if not entries:
            raise InvalidRequest(
                "There is nothing to compact: the input holds no messages.", param="input"
            )
        covered = frozenset(fingerprint(item) for item in items if not _said_by_people(item))
        tools = tuple(loaded_definitions(items, sealer.unseal))
        return cls(sealer, entries, _kept(visible), covered, tools)

    async def write(
        self, summarizer: Summarizer, model: str, item_id: str | None = None
    ) -> Compacted:
        """The model's summary of it, sealed into a compaction item (`item_id`: its id)."""
        summary, usage = await _summarize(summarizer, model, self.entries)
        sealed = Sealed(summary, self.covered, self.tools).seal(self.sealer.seal)
        item = {"id": item_id or new_id("cmp"), "type": "compaction", "encrypted_content": sealed}
        log.info(
            "compacted %d entries into a %d-character summary, %d user messages kept",
            len(self.entries),
            len(summary),
            len(self.kept),
        )
        return Compacted(self.kept, item, usage)


@dataclass(frozen=True)
class Planned:
    """A compaction a turn makes before it generates: decided, and its transcript written,
    before the response starts (so a 400 comes before any byte); its summary is sampled in
    the response's stream (`make`), the compaction then leading the output."""

    turn: Turn
    items: tuple[Json, ...]  # the turn's items, the compaction goes after them
    transcript: Transcript
    how: str  # "trigger" (a `compaction_trigger`) | "threshold" (`context_management`)
    summarizer: Summarizer
    item_id: str = field(default_factory=lambda: new_id("cmp"))

    async def make(self) -> Turn:
        """The turn with the compaction made: the prompt is rendered with it."""
        made = await self.transcript.write(self.summarizer, self.turn.request.model, self.item_id)
        items = (*self.items, made.item)
        return replace(self.turn, items=items, compacted=made.item).rendered()


async def plan_compaction(turn: Turn, summarizer: Summarizer) -> Planned | None:
    """The compaction a turn makes before it generates, if any: all of it now (a
    `compaction_trigger`: the response then generates nothing), or, with `context_management`,
    the context before the new input when the prompt would pass the threshold or the model's
    context."""
    request = turn.request
    assert request.compaction is not None
    if request.compaction.now:
        everything = tuple(item for item in turn.items if item.get("type") != TRIGGER)
        transcript = Transcript.of(summarizer.sealer, everything)
        return Planned(turn, everything, transcript, "trigger", summarizer)
    tokens = await summarizer.count_tokens(request.model, turn.engine_request())
    context = summarizer.context_length(request.model)
    threshold = request.compaction.threshold or context
    reserve = request.sampling.max_output_tokens or _RESERVE
    over_context = context is not None and tokens + reserve > context
    if not over_context and (threshold is None or tokens <= threshold):
        return None
    earlier = turn.items[: turn.new_at]
    if not earlier:
        return None  # only new input: nothing earlier to compact
    log.info("context of %d tokens to compact before generating (threshold %s)", tokens, threshold)
    # the compaction hides the earlier items it covers
    transcript = Transcript.of(summarizer.sealer, earlier)
    return Planned(turn, turn.items, transcript, "threshold", summarizer)


async def compact_turn(turn: Turn, summarizer: Summarizer) -> Turn:
    """The turn compacted as `plan_compaction` decides, or as it is."""
    planned = await plan_compaction(turn, summarizer)
    return turn if planned is None else await planned.make()


async def compact(summarizer: Summarizer, model: str, items: Sequence[Json]) -> Compacted:
    """Summarize what `items` show the model; 400 when there is nothing to compact."""
    return await Transcript.of(summarizer.sealer, items).write(summarizer, model)


def _said_by_people(item: Json) -> bool:
    """User, system and developer messages: never covered by a compaction. A client may keep
    them all (OpenAI's compacted output keeps every user message), and Codex sends its
    instructions and environment again after compacting; they stay as sent."""
    return item.get("type", "message") == "message" and item.get("role") != "assistant"


def _kept(visible: Sequence[Json]) -> list[Json]:
    """User messages, newest first, as long as their text fits the budget; in their order."""
    chosen: list[Json] = []
    room = KEEP_USER_CHARS
    for item in reversed(visible):
        if item.get("type", "message") != "message" or item.get("role") != "user":
            continue
        size = len(_text(item.get("content")))
        if size > room:
            continue  # summarized instead; an older, shorter one (the task, often) may fit
        room -= size
        chosen.append({**item, "status": item.get("status", "completed")})
    return chosen[::-1]


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    return "\n".join(
        str(p.get("text", p.get("refusal", ""))) for p in content if isinstance(p, dict)
    )


def _squeeze(text: str) -> str:
    """Runs of one repeated line become one line (a small model copies repetition)."""
    out: list[str] = []
    run = 0
    for line in [*text.split("\n"), None]:
        if out and line == out[-1]:
            run += 1
            continue
        if run:
            out[-1] += f"  [{run + 1} times]"
        run = 0
        if line is not None:
            out.append(line)
    return "\n".join(out)


def _once(summary: str) -> str:
    """The summary with each non-blank line said once (a small model may loop)."""
    seen: set[str] = set()
    kept = []
    for line in summary.split("\n"):
        if line.strip() and line in seen:
            continue
        seen.add(line)
        kept.append(line)
    return "\n".join(kept).strip()


def _cut(text: str, limit: int = _ENTRY_CHARS) -> str:
    text = _squeeze(text)
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n[… {len(text) - 2 * half} characters left out …]\n{text[-half:]}"


def _entry(item: Json) -> str:
    """One item of the history as a line of the transcript ('' for what it need not show)."""
    kind = item.get("type", "message")
    if kind == "message":
        role = {"user": "User", "assistant": "Assistant"}.get(str(item.get("role")), "Instructions")
        return f"{role}: {_cut(_text(item.get('content')))}"
    if kind == "function_call":
        return f"Assistant called {item.get('name')}({_cut(str(item.get('arguments', '')))})"
    if kind == "custom_tool_call":
        return f"Assistant called {item.get('name')} with:\n{_cut(str(item.get('input', '')))}"
    if kind in ("function_call_output", "custom_tool_call_output"):
        output = item.get("output")
        text = output if isinstance(output, str) else _text(output)
        return f"Tool result: {_cut(text)}"
    if kind in ("shell_call", "local_shell_call", "apply_patch_call"):
        what = item.get("action") or item.get("operation")
        return f"Assistant called {kind.removesuffix('_call')} with {_cut(json.dumps(what))}"
    if kind in ("shell_call_output", "local_shell_call_output", "apply_patch_call_output"):
        return f"Tool result: {_cut(json.dumps(item.get('output')))}"
    if kind == "tool_search_call":
        return f"Assistant searched the tools for {_cut(str(item.get('arguments')))}"
    if kind == "tool_search_output":
        names = [str(t.get("name")) for t in item.get("tools") or () if isinstance(t, dict)]
        return f"Tools loaded: {', '.join(names) or 'none'}"
    if kind == "web_search_call" and isinstance(item.get("action"), dict):
        action = item["action"]
        what = action.get("query") or action.get("url") or ""
        return f"Assistant used the web ({action.get('type')}): {_cut(str(what))}"
    if kind == "mcp_call":
        output = item.get("output")
        result = output if isinstance(output, str) else f"Error: {error_text(item.get('error'))}"
        call = f"{item.get('server_label')}.{item.get('name')}({_cut(str(item.get('arguments')))})"
        return f"Assistant called {call}\nTool result: {_cut(result)}"
    return ""


async def _summarize(
    summarizer: Summarizer, model: str, entries: list[str]
) -> tuple[str, dict[str, Any]]:
    context = summarizer.context_length(model)
    budget = min(TRANSCRIPT_TOKENS, (context or TRANSCRIPT_TOKENS) - SUMMARY_TOKENS - 64)
    chars = budget * 3
    for _ in range(4):
        request = _request(_fit(entries, chars))
        tokens = await summarizer.count_tokens(model, request)
        if tokens <= budget:
            break
        chars = int(chars * budget / tokens * 0.9)
    try:
        done = await summarizer.complete(model, request)
    except EngineError as exc:
        raise EngineError(f"the summary could not be written: {exc}") from exc
    summary = _once(done.text)
    return summary or _cut("\n".join(entries), 4000), usage_wire(done.usage)


def _fit(entries: list[str], chars: int) -> str:
    """The first entry (where the task is stated) and as many of the newest as fit."""
    head, tail, used = entries[:1], [], len(entries[0])
    for entry in reversed(entries[1:]):
        if used + len(entry) > chars:
            break
        tail.append(entry)
        used += len(entry)
    left_out = len(entries) - 1 - len(tail)
    gap = [f"[… {left_out} earlier entries left out …]"] if left_out else []
    return "\n\n".join([*head, *gap, *tail[::-1]])


def _request(transcript: str) -> EngineRequest:
    prompt = f"The conversation so far:\n\n{transcript}\n\nWrite the summary now."
    sampling = SamplingParams(
        temperature=0.0, max_output_tokens=SUMMARY_TOKENS, repetition_penalty=1.15
    )
    messages = (ChatMessage("system", INSTRUCTIONS), ChatMessage("user", prompt))
    return EngineRequest(messages, sampling)
