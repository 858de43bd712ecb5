"""ResponseBuilder: the one state machine behind every stream and every final response.

Item lifecycle (written once, here):

    output_item.added (status in_progress)
      [content_part.added → <kind>.delta* → <kind>.done → content_part.done]*   (messages, reasoning)
      | [function_call_arguments.delta* → function_call_arguments.done]          (function calls)
    output_item.done (status completed, or incomplete for the item cut by max_output_tokens)

Custom tool calls take `custom_tool_call_input.delta/.done` in place of the argument events.
The items of an MCP server's tools, which this server runs, stream as OpenAI streams them:

    mcp_list_tools: output_item.added (tools [])  → mcp_list_tools.in_progress
                    → mcp_list_tools.completed | .failed → output_item.done (the tools | error)
    mcp_call:       output_item.added (arguments "") → mcp_call.in_progress
                    → mcp_call_arguments.delta (all of them, once the model wrote them) → .done
                    … the call runs … → mcp_call.completed | .failed → output_item.done
    mcp_approval_request: output_item.added → output_item.done

This server's tool search: a `tool_search_call` and its `tool_search_output`, each added and done.
A web search this server runs (`oars.web_search`):

    web_search_call: output_item.added (the action) → web_search_call.in_progress → .searching
                     … the backend answers … → .completed (not for a failed one) → output_item.done

A link in the text after it to one of its results (`[title](url)`) is a `url_citation`: it is
added to the text part, and sent as `output_text.annotation.added`, after the delta that ends it.
A file search this server runs streams the same way (`file_search_call`: added with no queries
and no results, in_progress, searching, completed, done with both). The model cites a result by
the handle it was shown it under (`【n】`, `oars.parsing.citations`): the marker leaves the text
and becomes a `file_citation` at the point it stood, sent between the deltas around it, so the
deltas, `output_text.done`, the item and the response hold one text.

A response may be several generations (a server-side tool's result goes back to the model):
the builder goes on across them, so ids, `output_index` and `sequence_number` stay one sequence.

Only this class assigns `output_index` (when an item opens), `content_index` (per item, from 0),
`sequence_number` (through `_emit`) and ids. At most one item is open at a time. The snapshot in
the terminal event is `self.response`, built from the same item state the events came from, so the
stream and the final object cannot disagree.

A response in the background starts `queued` (`response.created`, `response.queued`) and moves to
`in_progress` when its generation starts. Cancelled, the open item closes `incomplete` and the
stream ends with `response.cancelled` (status `cancelled`): the SDKs define no event for it, and a
reader of a resumed stream needs a last event to know the response will not go on.
Steered (a WebSocket client's `response.steer`), the generation stops at a safe boundary and
finishes with `FinishReason.STEERED`: the open item closes `incomplete` and the response ends
`response.incomplete` with `incomplete_details.reason` `steered`, as any early stop does.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from oars.events.items import PART_EVENT, SEGMENT_ITEM, Item, Part, stream_logprob
from oars.generation import FinishReason, TokenLogprob, Usage, usage_wire
from oars.ids import new_id
from oars.parsing import Segment, SegmentKind
from oars.parsing.citations import Marks
from oars.parsing.jsonfield import StringField

Event = dict[str, Any]


@dataclass(frozen=True)
class CallTarget:
    """What the builder knows of a tool the model may call: the name and namespace its call
    item carries, and its kind: a custom tool's input streams as text, not as JSON arguments;
    a client's tool search is a `tool_search_call` whose arguments come whole in its done item.
    The service makes these from the request's tools, so the builder needs nothing else."""

    name: str
    namespace: str | None = None
    kind: str = "function"  # "function" | "custom" | "tool_search" (the tool's kind)

    @property
    def custom(self) -> bool:
        return self.kind == "custom"


# A Markdown link, as a model cites a page: `[title](https://…)`.
_LINK = re.compile(r"\[([^\[\]\n]{1,500})\]\((https?://[^\s()]{1,2000})\)")
_MAX_LINK = 1 + 500 + 2 + len("https://") + 2000 + 1  # characters, the most `_LINK` matches
# Items a model writes as a call: one open at the end of a generation was cut short.
_CALL_TYPES = (
    "function_call",
    "custom_tool_call",
    "mcp_call",
    "tool_search_call",
    "shell_call",
    "local_shell_call",
    "apply_patch_call",
)
# Those whose arguments the model's call segments write (an mcp_call's are kept by the step).
_MODEL_CALLS = (
    "function_call",
    "custom_tool_call",
    "tool_search_call",
    "shell_call",
    "local_shell_call",
    "apply_patch_call",
)
# Calls of the client's tool types with an item of their own (the tool's kind → the item's
# type, its id prefix): their arguments take no delta events (a shell call streams its
# commands as `shell_call_command.*` once they are whole).
_TYPED_CALLS = {
    "tool_search": ("tool_search_call", "ts"),
    "shell": ("shell_call", "sh"),
    "local_shell": ("local_shell_call", "lsh"),
    "apply_patch": ("apply_patch_call", "apc"),
}
_TYPED_ITEMS = frozenset(item_type for item_type, _ in _TYPED_CALLS.values())

# Why a response that stopped early is `incomplete` (its `incomplete_details.reason`).
_INCOMPLETE_REASONS = {
    FinishReason.LENGTH: "max_output_tokens",
    FinishReason.CONTENT_FILTER: "content_filter",
    FinishReason.STEERED: "steered",
}


@dataclass(frozen=True)
class Found:
    """One result of a file search, shown to the model under `handle`."""

    handle: str
    file_id: str
    filename: str
    score: float  # 0..1
    text: str
    attributes: Mapping[str, Any]

    def wire(self) -> dict[str, Any]:
        return {
            "file_id": self.file_id,
            "filename": self.filename,
            "score": self.score,
            "text": self.text,
            "attributes": dict(self.attributes),
        }

    def citation(self, index: int) -> dict[str, Any]:
        """A `file_citation` at `index` (characters of the text before it)."""
        return {
            "type": "file_citation",
            "file_id": self.file_id,
            "filename": self.filename,
            "index": index,
        }


class ResponseBuilder:
    """Builds the event stream and the `Response` object of one generation."""

    def __init__(
        self,
        echo: Mapping[str, Any],
        *,
        include_logprobs: bool = False,
        include_sources: bool = False,
        include_results: bool = False,
        model: str,
        tools: Mapping[str, CallTarget] | None = None,  # by the name the model calls it
        background: bool = False,
        seal: Callable[[str], str] | None = None,
    ) -> None:
        self.id = new_id("resp")
        self.created_at = int(time.time())
        self._echo = dict(echo)
        self._model = model
        self._include_logprobs = include_logprobs
        self._include_sources = include_sources
        self._sources: dict[str, str] = {}  # the web searches' result URLs: their titles
        self._include_results = include_results
        self._files: dict[str, Found] = {}  # the file searches' results, by their handles
        self._tools = dict(tools or {})
        self._seq = 0
        self._items: list[Item] = []
        self._open: Item | None = None
        self._pending_space: list[tuple[str, tuple[TokenLogprob, ...]]] = []
        self.status = "queued" if background else "in_progress"
        self._seal = seal
        self._usage: Usage | None = None
        self._error: dict[str, Any] | None = None
        self._incomplete_reason: str | None = None
        self._completed_at: int | None = None

    def resume(self, items: list[Item], open_item: Item | None, logged: int) -> None:
        """Go on from a log of `logged` events that made `items` and left `open_item` open
        (`oars.events.replay`): the next event is numbered `logged`, and the response runs."""
        self._items, self._open, self._seq = items, open_item, logged
        self.status = "in_progress"

    # ---- the snapshot -------------------------------------------------------------------

    @property
    def response(self) -> dict[str, Any]:
        snapshot: dict[str, Any] = {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": self.status,
            "completed_at": self._completed_at,
            "error": self._error,
            "incomplete_details": (
                {"reason": self._incomplete_reason} if self._incomplete_reason else None
            ),
            "model": self._model,
            "output": self.output,
            "usage": usage_wire(self._usage) if self._usage else None,
        }
        snapshot.update(self._echo)
        return snapshot

    @property
    def started(self) -> bool:
        """`response.created` was made."""
        return self._seq > 0

    @property
    def output(self) -> list[dict[str, Any]]:
        """The output items so far (the open one as it is now; not one that is announced
        only once whole, such as an `apply_patch_call` being written)."""
        return [item.wire() for item in self._items if item.stage != "unannounced"]

    # ---- events -------------------------------------------------------------------------

    def _emit(self, type_: str, **fields: Any) -> Event:
        event = {"type": type_, "sequence_number": self._seq, **fields}
        self._seq += 1
        return event

    def start(self) -> list[Event]:
        """The stream's opening: `response.created`, then `response.queued` or
        `response.in_progress`. Resumed from a log, only what the log lacks of them."""
        waiting = "response.queued" if self.status == "queued" else "response.in_progress"
        opening = ("response.created", waiting)[self._seq :]
        return [self._emit(type_, response=self.response) for type_ in opening]

    def progress(self) -> list[Event]:
        """A queued response's generation starts."""
        if self.status != "queued":
            return []
        self.status = "in_progress"
        return [self._emit("response.in_progress", response=self.response)]

    def compacting(self, item_id: str) -> list[Event]:
        """A compaction's summary is being sampled: its item (`item_id`, at the next output
        index) is added once it is made (`compaction`). The event says nothing of its content."""
        events = self._close("completed")
        events.append(
            self._emit(
                "response.compaction.compacting", item_id=item_id, output_index=len(self._items)
            )
        )
        return events

    def compaction(self, item: Mapping[str, Any]) -> list[Event]:
        """A compaction made before generating (`context_management`, a `compaction_trigger`):
        the first output item, added and done at once."""
        added, events = self._add_item(
            type="compaction", id=item["id"], encrypted=item["encrypted_content"]
        )
        self._open = None
        added.status = "completed"
        events.append(
            self._emit(
                "response.output_item.done", output_index=added.output_index, item=added.wire()
            )
        )
        return events

    def cancel(self) -> list[Event]:
        """Stopped on request: what was written stays, the open item closes `incomplete`."""
        events = self._close("incomplete")
        self.status = "cancelled"
        events.append(self._emit("response.cancelled", response=self.response))
        return events

    def add(self, segment: Segment, logprobs: tuple[TokenLogprob, ...] = ()) -> list[Event]:
        """Apply one parsed segment of model output."""
        call_step = _CALL_STEPS.get(segment.kind)
        if call_step is not None:
            return call_step(self, segment)
        if not segment.text:
            return []
        phase = segment.name if segment.kind is SegmentKind.TEXT else ""
        opens_message = segment.kind is SegmentKind.TEXT and not self._is_open("message", phase)
        if opens_message and not segment.text.strip():
            # Whitespace alone does not open a message: it may only separate a call.
            self._pending_space.append((segment.text, logprobs))
            return []
        events = self._open_for(segment.kind, phase)
        assert self._open is not None
        if segment.kind is SegmentKind.TEXT and self._pending_space:
            pending, self._pending_space = self._pending_space, []
            for text, lps in pending:
                events.append(self._delta(self._open, text, lps))
        part = self._open.parts[-1]
        if self._files and part.type == "output_text":
            events += self._file_cited(self._open, part, segment.text, logprobs)
        else:
            events.append(self._delta(self._open, segment.text, logprobs))
        if self._sources and part.type == "output_text":
            events += self._citations(self._open, part)
        return events

    def finish(self, reason: FinishReason, usage: Usage) -> list[Event]:
        """Close the open item and end the stream with `completed` or `incomplete`.

        A call still open when the model stopped by itself has arguments that end mid-way:
        never `completed` (a client would run it), but `failed`, which clients may retry.
        """
        self._usage = usage
        call = self._open if self._open is not None and self._open.type in _CALL_TYPES else None
        if call is not None and reason in (FinishReason.STOP, FinishReason.TOOL_CALLS):
            return self.fail(
                f"The model stopped inside its call to '{call.name or call.type}': the call's "
                "arguments are incomplete."
            )
        incomplete = _INCOMPLETE_REASONS.get(reason)
        events = self._close("incomplete" if incomplete else "completed")
        self._completed_at = int(time.time())
        if incomplete:
            self.status, self._incomplete_reason = "incomplete", incomplete
            events.append(self._emit("response.incomplete", response=self.response))
        else:
            self.status = "completed"
            events.append(self._emit("response.completed", response=self.response))
        return events

    def fail_instead(self, ending: list[Event], message: str, code: str) -> list[Event]:
        """The ending not sent yet (`ending`, from its first event on) cannot stand, e.g. the
        response could not be kept: `error` and `response.failed` take its sequence numbers."""
        self._seq = ending[0]["sequence_number"]
        self.status, self._incomplete_reason = "failed", None
        self._error = {"code": _response_error_code(code), "message": message}
        return [
            self._emit("error", code=code, message=message, param=None),
            self._emit("response.failed", response=self.response),
        ]

    def fail(self, message: str, code: str = "server_error") -> list[Event]:
        """After streaming began: close what is open, then `error` and `response.failed`."""
        events = self._close("incomplete")
        self.status = "failed"
        self._error = {"code": _response_error_code(code), "message": message}
        events.append(self._emit("error", code=code, message=message, param=None))
        events.append(self._emit("response.failed", response=self.response))
        return events

    # ---- item bookkeeping ---------------------------------------------------------------

    def _is_open(self, item_type: str, phase: str = "") -> bool:
        """An item of this type (and message phase) is open: more output goes into it."""
        item = self._open
        return item is not None and item.type == item_type and item.phase == phase

    def _open_for(self, kind: SegmentKind, phase: str = "") -> list[Event]:
        item_type, prefix, part_type = SEGMENT_ITEM[kind]
        if self._is_open(item_type, phase):
            return []
        item, events = self._add_item(type=item_type, id=new_id(prefix), phase=phase)
        item.parts.append(Part(part_type))
        events.append(self._part_event("response.content_part.added", item, 0))
        return events

    def _add_item(self, announce: bool = True, **fields: Any) -> tuple[Item, list[Event]]:
        """Close the open item, open a new one at the next output_index, announce it (or, not
        `announce`d, when it closes: an item whose first form would say what is not known)."""
        events = self._close("completed")
        item = Item(output_index=len(self._items), **fields)
        self._items.append(item)
        self._open = item
        if announce:
            events.append(self._added(item))
        else:
            item.stage = "unannounced"
        return item, events

    def _added(self, item: Item) -> Event:
        return self._emit(
            "response.output_item.added", output_index=item.output_index, item=item.wire()
        )

    def _part_event(self, type_: str, item: Item, content_index: int) -> Event:
        return self._emit(
            type_,
            item_id=item.id,
            output_index=item.output_index,
            content_index=content_index,
            part=item.parts[content_index].wire(),
        )

    def _delta(self, item: Item, text: str, logprobs: tuple[TokenLogprob, ...]) -> Event:
        part = item.parts[-1]
        part.text += text
        fields: dict[str, Any] = {}
        if part.type == "output_text":
            kept = logprobs if self._include_logprobs else ()
            part.logprobs.extend(kept)
            fields["logprobs"] = [stream_logprob(lp) for lp in kept]
        return self._emit(
            f"{PART_EVENT[part.type]}.delta",
            item_id=item.id,
            output_index=item.output_index,
            content_index=len(item.parts) - 1,
            delta=text,
            **fields,
        )

    # ---- tool calls ---------------------------------------------------------------------

    def _call_start(self, segment: Segment) -> list[Event]:
        tool = self._tools.get(segment.name)
        typed = _TYPED_CALLS.get(tool.kind) if tool is not None else None
        if typed is not None:
            item_type, prefix = typed
            _, events = self._add_item(
                announce=item_type != "apply_patch_call",  # its operation is not known yet
                type=item_type,
                id=new_id(prefix),
                call_id=new_id("call"),
                execution="client",
            )
            return events
        custom = tool is not None and tool.custom
        _, events = self._add_item(
            type="custom_tool_call" if custom else "function_call",
            id=new_id("ctc" if custom else "fc"),
            call_id=new_id("call"),
            name=tool.name if tool is not None else segment.name,
            namespace=tool.namespace if tool is not None else None,
            input_field=StringField("input") if custom else None,
        )
        return events

    def _call_args(self, segment: Segment) -> list[Event]:
        item = self._open
        if item is None or item.type not in _MODEL_CALLS or not segment.text:
            return []
        item.arguments += segment.text
        if item.type in _TYPED_ITEMS:  # its arguments come whole, in its done item
            return []
        if item.input_field is not None:
            return self._input_delta(item, item.input_field.feed(segment.text))
        return [
            self._emit(
                "response.function_call_arguments.delta",
                item_id=item.id,
                output_index=item.output_index,
                delta=segment.text,
            )
        ]

    def _input_delta(self, item: Item, delta: str) -> list[Event]:
        if not delta:
            return []
        item.streamed += delta
        return [
            self._emit(
                "response.custom_tool_call_input.delta",
                item_id=item.id,
                output_index=item.output_index,
                delta=delta,
            )
        ]

    def _call_end(self, segment: Segment) -> list[Event]:
        return self._close("completed")

    def _close_call(self, item: Item) -> list[Event]:
        where = {"item_id": item.id, "output_index": item.output_index}
        if item.type == "function_call":
            return [
                self._emit(
                    "response.function_call_arguments.done",
                    **where,
                    arguments=item.arguments,
                    name=item.name,
                )
            ]
        final = _custom_input(item.arguments)
        # What streamed is kept (done must equal the deltas); the rest, if any, goes now.
        events = (
            self._input_delta(item, final[len(item.streamed) :])
            if final.startswith(item.streamed)
            else []
        )
        item.arguments = item.streamed
        events.append(
            self._emit("response.custom_tool_call_input.done", **where, input=item.arguments)
        )
        return events

    def _commands(self, item: Item) -> list[Event]:
        """A shell call's commands, each added, written and done, once the call is whole."""
        events: list[Event] = []
        for index, command in enumerate(item.wire()["action"]["commands"]):
            where = {"output_index": item.output_index, "command_index": index}
            events.append(self._emit("response.shell_call_command.added", **where, command=""))
            events.append(self._emit("response.shell_call_command.delta", **where, delta=command))
            events.append(self._emit("response.shell_call_command.done", **where, command=command))
        return events

    # ---- MCP servers' tools (run by this server) -------------------------------------------

    def _at(self, item: Item) -> dict[str, Any]:
        return {"item_id": item.id, "output_index": item.output_index}

    def list_tools(self, label: str) -> list[Event]:
        """A server's tools are being listed: the item opens with no tools yet."""
        item, events = self._add_item(type="mcp_list_tools", id=new_id("mcpl"), server_label=label)
        return events + self._listing(item)

    def _listing(self, item: Item) -> list[Event]:
        item.stage = "running"
        return [self._emit("response.mcp_list_tools.in_progress", **self._at(item))]

    def tools_listed(self, tools: list[dict[str, Any]]) -> list[Event]:
        item = self._open_of("mcp_list_tools")
        item.tools, item.stage = tools, "ended"
        events = [self._emit("response.mcp_list_tools.completed", **self._at(item))]
        return events + self._close("completed")

    def tools_not_listed(self, error: str) -> list[Event]:
        item = self._open_of("mcp_list_tools")
        item.error, item.stage = error, "ended"
        events = [self._emit("response.mcp_list_tools.failed", **self._at(item))]
        return events + self._close("failed")

    def mcp_call(
        self, label: str, name: str, arguments: str, approval_request_id: str | None = None
    ) -> list[Event]:
        """A call the model wrote (or the client approved): its arguments at once; the item
        stays open while the call runs."""
        item, events = self._add_item(
            type="mcp_call",
            id=new_id("mcp"),
            server_label=label,
            name=name,
            arguments=arguments,
            approval_request_id=approval_request_id,
        )
        events.append(self._emit("response.mcp_call.in_progress", **self._at(item)))
        item.streamed = arguments
        if arguments:
            events.append(
                self._emit("response.mcp_call_arguments.delta", **self._at(item), delta=arguments)
            )
        events.append(
            self._emit("response.mcp_call_arguments.done", **self._at(item), arguments=arguments)
        )
        return events

    def mcp_call_done(self, output: str | None, error: dict[str, Any] | None) -> list[Event]:
        """The open call ran: its output, or its error."""
        item = self._open_of("mcp_call")
        item.output, item.error = (None, error) if error is not None else (output, None)
        outcome = "failed" if error is not None else "completed"
        events = [self._emit(f"response.mcp_call.{outcome}", **self._at(item))]
        return events + self._close(outcome)

    def approval_request(self, label: str, name: str, arguments: str) -> list[Event]:
        """A call that waits for the client's approval: the item, added and done at once."""
        _, events = self._add_item(
            type="mcp_approval_request",
            id=new_id("mcpr"),
            server_label=label,
            name=name,
            arguments=arguments,
        )
        return events + self._close("completed")

    # ---- this server's tool search ---------------------------------------------------------

    def tool_search(self, arguments: str, tools: list[dict[str, Any]]) -> list[Event]:
        """A search this server ran: its call, then its output (the tools it loaded), each
        added and done; the tools are callable by the model from now on."""
        call, events = self._add_item(
            type="tool_search_call",
            id=new_id("ts"),
            call_id=new_id("call"),
            execution="server",
            arguments=arguments,
        )
        events += self._close("completed")
        _, added = self._add_item(
            type="tool_search_output",
            id=new_id("tso"),
            call_id=call.call_id,
            execution="server",
            tools=tools,
        )
        return events + added + self._close("completed")

    # ---- web search ---------------------------------------------------------------------

    def web_search_call(self, action: dict[str, Any]) -> list[Event]:
        """A web search the model asked for (`action`: search, open_page or find_in_page):
        added, then in progress and searching; it stays open while the backend answers."""
        item, events = self._add_item(type="web_search_call", id=new_id("ws"), action=action)
        item.stage = "running"
        for stage in ("in_progress", "searching"):
            events.append(self._emit(f"response.web_search_call.{stage}", **self._at(item)))
        return events

    def web_search_done(
        self, failed: bool, sources: Mapping[str, str] | None = None
    ) -> list[Event]:
        """The open web search answered (`sources`: the result URLs a search found, by URL
        their titles), or failed. A search's sources are shown in its action only with
        `include: ["web_search_call.action.sources"]`; a link to one in the text that follows
        is a `url_citation` either way."""
        item = self._open_of("web_search_call")
        assert item.action is not None
        self._sources.update(sources or {})
        if sources is not None and self._include_sources and item.action["type"] == "search":
            # a new dict: the added event holds the one it was sent with
            found = [{"type": "url", "url": url} for url in sources]
            item.action = {**item.action, "sources": found}
        events: list[Event] = []
        item.stage = "failed" if failed else "completed"
        if not failed:
            events.append(self._emit("response.web_search_call.completed", **self._at(item)))
        return events + self._close(item.stage)

    # ---- file search --------------------------------------------------------------------

    def file_search_call(self) -> list[Event]:
        """A file search the model asked for: added, in progress and searching; it stays open
        while the stores answer."""
        item, events = self._add_item(type="file_search_call", id=new_id("fs"))
        item.stage = "running"
        for stage in ("in_progress", "searching"):
            events.append(self._emit(f"response.file_search_call.{stage}", **self._at(item)))
        return events

    def file_search_done(self, queries: list[str], found: list[Found] | None) -> list[Event]:
        """The open file search ran `queries` and `found` these (best first), or failed (None).
        Its results are in the item only with `include: ["file_search_call.results"]`; the
        model may cite each by its handle either way."""
        item = self._open_of("file_search_call")
        item.queries = list(queries)
        events: list[Event] = []
        if found is None:
            item.stage = "failed"
        else:
            self._files.update((result.handle, result) for result in found)
            if self._include_results:
                item.results = [result.wire() for result in found]
            item.stage = "completed"
            events.append(self._emit("response.file_search_call.completed", **self._at(item)))
        return events + self._close(item.stage)

    def _file_cited(
        self, item: Item, part: Part, text: str, logprobs: tuple[TokenLogprob, ...]
    ) -> list[Event]:
        """`text` with its citation markers out (held back while one may be opening), each a
        `file_citation` sent where it stood; a marker naming no result is dropped."""
        if part.marks is None:
            part.marks = Marks()
        shown, cited = part.marks.feed(text)
        events: list[Event] = []
        for mark in cited:
            before = shown[: mark.index - len(part.text)]
            if before:
                events.append(self._delta(item, before, logprobs))
                shown, logprobs = shown[len(before) :], ()
            found = self._files.get(mark.handle)
            if found is not None:
                events.append(self._annotate(item, part, found.citation(mark.index)))
        if shown:
            events.append(self._delta(item, shown, logprobs))
        return events

    def _annotate(self, item: Item, part: Part, annotation: dict[str, Any]) -> Event:
        part.annotations.append(annotation)
        return self._emit(
            "response.output_text.annotation.added",
            **self._at(item),
            content_index=len(item.parts) - 1,
            annotation_index=len(part.annotations) - 1,
            annotation=annotation,
        )

    def _citations(self, item: Item, part: Part) -> list[Event]:
        """A link the text just finished (`[title](url)`) to one of this response's sources
        is a `url_citation` over the link's span, in characters, added after its delta."""
        events: list[Event] = []
        end = part.cited_to
        for match in _LINK.finditer(part.text, part.cited_to):
            end = match.end()
            url = match.group(2)
            if url not in self._sources:
                continue
            annotation = {
                "type": "url_citation",
                "start_index": match.start(),
                "end_index": match.end(),
                "title": self._sources[url] or match.group(1),
                "url": url,
            }
            events.append(self._annotate(item, part, annotation))
        # a link not finished yet starts at a '[' (its first: a URL may hold one), no further
        # back than the longest link (one before that never becomes one: not scanned again)
        start = part.text.find("[", max(end, len(part.text) - _MAX_LINK))
        part.cited_to = start if start >= 0 else len(part.text)
        return events

    def offer(self, targets: Mapping[str, CallTarget]) -> None:
        """More tools the model may call from now on (a tool search loaded them)."""
        self._tools.update(targets)

    def _open_of(self, item_type: str) -> Item:
        item = self._open
        assert item is not None and item.type == item_type, f"no open {item_type}"
        return item

    def _close(self, status: str) -> list[Event]:
        item, self._open = self._open, None
        self._pending_space = []
        if item is None:
            return []
        if item.stage == "unannounced":
            if status != "completed":  # a call cut before it was whole was never shown: none
                self._items.pop()
                return []
            item.stage = "added"
            events = [self._added(item)]
            return events + self._close_item(item, status)
        return self._close_item(item, status)

    def _close_item(self, item: Item, status: str) -> list[Event]:
        if item.parts:
            events = self._close_part(item)
        elif item.type in ("function_call", "custom_tool_call"):
            events = self._close_call(item)
        elif item.type == "shell_call":
            events = self._commands(item)
        elif item.type == "mcp_list_tools" and item.stage != "ended":  # stopped while listing
            item.error = "The listing of the MCP server's tools did not finish."
            events = self._listing(item) if item.stage == "added" else []
            events.append(self._emit("response.mcp_list_tools.failed", **self._at(item)))
        else:
            events = []  # an mcp_call: cut before it ran or while it ran (or replayed after)
        item.status = item.stage if item.stage in ("completed", "failed") else status
        if item.type == "reasoning" and self._seal is not None:
            item.encrypted = self._seal("".join(p.text for p in item.parts))
        events.append(
            self._emit(
                "response.output_item.done", output_index=item.output_index, item=item.wire()
            )
        )
        return events

    def _close_part(self, item: Item) -> list[Event]:
        events: list[Event] = []
        index = len(item.parts) - 1
        part = item.parts[index]
        if part.closed:
            return events
        held = part.marks.finish() if part.marks is not None else ""
        if held:  # a marker that never closed is text
            events.append(self._delta(item, held, ()))
        part.closed = True
        done_fields: dict[str, Any] = {"text": part.text}
        if part.type == "output_text":
            done_fields["logprobs"] = [stream_logprob(lp) for lp in part.logprobs]
        events.append(
            self._emit(
                f"{PART_EVENT[part.type]}.done",
                item_id=item.id,
                output_index=item.output_index,
                content_index=index,
                **done_fields,
            )
        )
        events.append(self._part_event("response.content_part.done", item, index))
        return events


# `response.error.code` takes only these; other codes (e.g. `store_unavailable`) stay on the
# `error` event and become `server_error` in the response.
_RESPONSE_ERROR_CODES = frozenset({"server_error", "rate_limit_exceeded", "invalid_prompt"})


def _response_error_code(code: str) -> str:
    return code if code in _RESPONSE_ERROR_CODES else "server_error"


def _custom_input(arguments: str) -> str:
    """Custom tools are offered as a function with one string argument, `input`."""
    try:
        value = json.loads(arguments)
    except json.JSONDecodeError:
        return arguments
    return (
        value["input"]
        if isinstance(value, dict) and isinstance(value.get("input"), str)
        else (arguments)
    )


_CALL_STEPS: dict[SegmentKind, Callable[[ResponseBuilder, Segment], list[Event]]] = {
    SegmentKind.CALL_START: ResponseBuilder._call_start,
    SegmentKind.CALL_ARGS: ResponseBuilder._call_args,
    SegmentKind.CALL_END: ResponseBuilder._call_end,
}
