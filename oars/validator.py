"""A Responses stream validator: the official SDK's types plus invariants I1–I12.

`validate_sse(text)` parses a raw SSE body; `validate_events(events)` checks decoded events;
`validate_socket(frames)` checks a WebSocket's frames: each response's events (by their lane,
`stream_id`) as a stream, and the socket's own frames (steer events, error frames) against the
SDK's types, the steer events numbered in their own sequence. Each violation names the event
number, the rule and a short excerpt. `same_response(a, b)` is I12: two
final objects equal but for ids and timestamps.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Annotated, Any, get_args, get_origin

from openai.types.responses import (
    Response,
    ResponseSteerAcceptedEvent,
    ResponseSteerFailedEvent,
    ResponseSteerPendingEvent,
    ResponseStreamEvent,
)
from openai.types.responses.responses_server_event import ResponseWsError
from pydantic import BaseModel, ValidationError


def _event_classes() -> dict[str, type[BaseModel]]:
    union = (
        get_args(ResponseStreamEvent)[0]
        if get_origin(ResponseStreamEvent) is Annotated
        else (ResponseStreamEvent)
    )
    classes: dict[str, type[BaseModel]] = {}
    for cls in get_args(union):
        literal = cls.model_fields["type"].annotation
        classes[get_args(literal)[0]] = cls
    return classes


_EVENT_CLASSES = _event_classes()
# `response.cancelled` ends a cancelled background response in oars: the SDKs define no event
# for it, so its snapshot is checked as a Response and the event itself by these rules only.
TERMINAL = ("response.completed", "response.incomplete", "response.failed", "response.cancelled")
_TERMINAL_STATUS = dict(
    zip(TERMINAL, ("completed", "incomplete", "failed", "cancelled"), strict=True)
)
_EXTENSIONS = frozenset({"response.cancelled"})
# `tool_choice: {"type": "web_search"}` is what the Agents SDK sends to force a web search, and
# a response echoes it; the openai SDK's `ToolChoiceTypes` names only the preview types, so a
# snapshot is checked with that choice read as the `required` it means.
_CHOICE_EXTENSIONS = ("web_search", "web_search_2025_08_26")

# Open Responses makes these required (null allowed) on every snapshot.
SNAPSHOT_FIELDS = [
    "id",
    "object",
    "created_at",
    "completed_at",
    "status",
    "incomplete_details",
    "model",
    "previous_response_id",
    "instructions",
    "output",
    "error",
    "tools",
    "tool_choice",
    "truncation",
    "parallel_tool_calls",
    "text",
    "top_p",
    "presence_penalty",
    "frequency_penalty",
    "top_logprobs",
    "temperature",
    "reasoning",
    "usage",
    "max_output_tokens",
    "max_tool_calls",
    "store",
    "background",
    "service_tier",
    "metadata",
    "safety_identifier",
    "prompt_cache_key",
]

# item types without a status: added and done (the MCP ones with their own events between)
_STATELESS = ("compaction", "mcp_list_tools", "mcp_approval_request")
# item type → its streamed value
_CALL_VALUE = {"function_call": "arguments", "custom_tool_call": "input", "mcp_call": "arguments"}
# event type → (accumulated field of the open part or item, field holding the full value at done)
_DELTAS = {
    "response.output_text.delta": "part",
    "response.reasoning_text.delta": "part",
    "response.refusal.delta": "part",
    "response.function_call_arguments.delta": "item",
    "response.custom_tool_call_input.delta": "item",
    "response.mcp_call_arguments.delta": "item",
}
_DONES = {
    "response.output_text.done": ("part", "text"),
    "response.reasoning_text.done": ("part", "text"),
    "response.refusal.done": ("part", "refusal"),
    "response.function_call_arguments.done": ("item", "arguments"),
    "response.custom_tool_call_input.done": ("item", "input"),
    "response.mcp_call_arguments.done": ("item", "arguments"),
}
# The lifecycle of the MCP items between added and done (mcp.md §1.3): event → (item type, the
# stages it may follow, the stage after it). OpenAI has sent `mcp_call.in_progress` again after
# the arguments; that is tolerated.
_STAGES = {
    "response.mcp_list_tools.in_progress": ("mcp_list_tools", {"added"}, "running"),
    "response.mcp_list_tools.completed": ("mcp_list_tools", {"running"}, "completed"),
    "response.mcp_list_tools.failed": ("mcp_list_tools", {"running"}, "failed"),
    "response.mcp_call.in_progress": ("mcp_call", {"added", "arguments"}, "running"),
    "response.mcp_call_arguments.delta": ("mcp_call", {"running", "arguments"}, "arguments"),
    "response.mcp_call_arguments.done": ("mcp_call", {"running", "arguments"}, "arguments_done"),
    "response.mcp_call.completed": ("mcp_call", {"arguments_done"}, "completed"),
    "response.mcp_call.failed": ("mcp_call", {"arguments_done"}, "failed"),
    "response.web_search_call.in_progress": ("web_search_call", {"added"}, "running"),
    "response.web_search_call.searching": ("web_search_call", {"running"}, "searching"),
    "response.web_search_call.completed": ("web_search_call", {"searching"}, "completed"),
    "response.file_search_call.in_progress": ("file_search_call", {"added"}, "running"),
    "response.file_search_call.searching": ("file_search_call", {"running"}, "searching"),
    "response.file_search_call.completed": ("file_search_call", {"searching"}, "completed"),
}
# item type → (the stages its done may follow, the status each ends with)
_ENDS: dict[str, dict[str, tuple[str, ...]]] = {
    "mcp_list_tools": {"completed": (), "failed": ()},
    "mcp_call": {"completed": ("completed",), "failed": ("failed",)},
    # a search the backend failed is done `failed` from `searching`; one cut, `incomplete`
    "web_search_call": {"completed": ("completed",), "searching": ("failed", "incomplete")},
    "file_search_call": {"completed": ("completed",), "searching": ("failed", "incomplete")},
}
_RULE = {"mcp_call": "mcp", "web_search_call": "web_search", "file_search_call": "file_search"}


@dataclass(frozen=True)
class Violation:
    index: int  # event number in the stream (-1: the stream as a whole)
    rule: str
    message: str
    excerpt: str = ""

    def describe(self) -> str:
        where = f"event {self.index}" if self.index >= 0 else "stream"
        tail = f" [{self.excerpt}]" if self.excerpt else ""
        return f"{where}: {self.rule}: {self.message}{tail}"


@dataclass
class Report:
    events: list[dict[str, Any]] = field(default_factory=list)
    violations: list[Violation] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations

    @property
    def final(self) -> dict[str, Any] | None:
        last = self.events[-1] if self.events else None
        return last["response"] if last and last.get("type") in TERMINAL else None

    def text(self) -> str:
        return "\n".join(v.describe() for v in self.violations)


def _excerpt(event: Any) -> str:
    raw = json.dumps(event, ensure_ascii=False) if not isinstance(event, str) else event
    return raw if len(raw) <= 120 else raw[:117] + "..."


def parse_sse(text: str) -> list[tuple[str | None, str]]:
    """(event name, data) for each SSE message; comments and `[DONE]` are skipped."""
    messages: list[tuple[str | None, str]] = []
    for block in text.replace("\r\n", "\n").split("\n\n"):
        name, data = None, []
        for line in block.split("\n"):
            if line.startswith("event:"):
                name = line[6:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].removeprefix(" "))
        if data and "\n".join(data).strip() != "[DONE]":
            messages.append((name, "\n".join(data)))
    return messages


def validate_sse(text: str) -> Report:
    report = Report()
    for i, (name, data) in enumerate(parse_sse(text)):
        try:
            event = json.loads(data)
        except json.JSONDecodeError:
            report.violations.append(Violation(i, "framing", "data is not JSON", _excerpt(data)))
            continue
        if name is not None and name != event.get("type"):
            report.violations.append(
                Violation(i, "framing", f"event name {name!r} != type {event.get('type')!r}")
            )
        report.events.append(event)
    checked = validate_events(report.events)
    report.violations.extend(checked.violations)
    return report


def validate_events(events: list[dict[str, Any]]) -> Report:
    checker = _Checker()
    for i, event in enumerate(events):
        checker.check(i, event)
    checker.finish(len(events))
    return Report(list(events), checker.violations)


class _Checker:
    def __init__(self) -> None:
        self.violations: list[Violation] = []
        self.added: list[dict[str, Any]] = []
        self.done: list[dict[str, Any]] = []
        self.open: dict[str, Any] | None = None  # {"item", "index", "acc", "parts", "part"}
        self.first: dict[str, Any] | None = None
        self.terminal_at: int | None = None
        self.ids: set[str] = set()
        self.pending_error = False
        self.compacting: str | None = None  # the compaction item being sampled, not added yet

    def fail(self, i: int, rule: str, message: str, event: Any = "") -> None:
        self.violations.append(Violation(i, rule, message, _excerpt(event) if event else ""))

    def check(self, i: int, event: dict[str, Any]) -> None:
        kind = event.get("type", "")
        cls = _EVENT_CLASSES.get(kind)
        if kind in _EXTENSIONS:
            pass
        elif cls is None:
            self.fail(i, "schema", f"unknown event type {kind!r}", event)
        else:
            try:
                snap = event.get("response")
                cls.model_validate(
                    {**event, "response": _as_typed(snap)} if isinstance(snap, dict) else event
                )
            except ValidationError as exc:
                err = exc.errors()[0]
                self.fail(i, "schema", f"{kind}: {err['loc']} {err['msg']}", event)
        if event.get("sequence_number") != i:
            self.fail(i, "I1", f"sequence_number {event.get('sequence_number')} != {i}", event)
        if self.terminal_at is not None:
            self.fail(i, "I2", "event after the terminal event", event)
        if i == 0 and kind != "response.created":
            self.fail(i, "I2", "first event must be response.created", event)
        if i == 1 and kind not in ("response.in_progress", "response.queued"):
            self.fail(i, "I2", "second event must be response.in_progress", event)
        if "response" in event:
            self.snapshot(i, event)
        if kind in _STAGES:
            self.stage(i, event, *_STAGES[kind])
        handler = _HANDLERS.get(kind)
        if handler is not None:
            handler(self, i, event)
        elif kind in _DELTAS:
            self.delta(i, event, _DELTAS[kind])
        elif kind in _DONES:
            self.value_done(i, event, *_DONES[kind])

    # ---- snapshots ----------------------------------------------------------------------

    def snapshot(self, i: int, event: dict[str, Any]) -> None:
        snap = event["response"]
        if not isinstance(snap, dict):
            return self.fail(i, "schema", "response is not an object", event)
        missing = [f for f in SNAPSHOT_FIELDS if f not in snap]
        if missing:
            self.fail(i, "schema", f"snapshot lacks required fields {missing}", event)
        try:
            Response.model_validate(_as_typed(snap))
        except ValidationError as exc:
            self.fail(i, "schema", f"snapshot: {exc.errors()[0]['loc']} {exc.errors()[0]['msg']}")
        if self.first is None:
            self.first = snap
        else:
            for key in ("id", "created_at", "model", "instructions", "tools", "tool_choice"):
                if snap.get(key) != self.first.get(key):
                    self.fail(i, "I11", f"snapshot {key!r} changed", snap.get(key))

    def terminal(self, i: int, event: dict[str, Any]) -> None:
        self.terminal_at = i
        snap = event.get("response", {})
        if self.pending_error and event["type"] != "response.failed":
            self.fail(i, "I2", "an error event must be followed by response.failed", event)
        if snap.get("status") != _TERMINAL_STATUS[event["type"]]:
            self.fail(i, "I9", f"status {snap.get('status')!r} under {event['type']}")
        if self.open is not None:
            self.fail(i, "I8", f"item {self.open['item'].get('id')} never got output_item.done")
        if snap.get("output") != self.done:
            self.fail(i, "I9", "terminal output differs from the output_item.done items", event)
        if not isinstance(snap.get("usage"), dict) and event["type"] not in (
            "response.failed",
            "response.cancelled",
        ):
            self.fail(i, "I9", "terminal snapshot has no usage", event)
        if event["type"] == "response.failed" and not snap.get("error"):
            self.fail(i, "I9", "response.failed without response.error", event)
        statuses = [item.get("status") for item in self.done]
        if "incomplete" in statuses[:-1]:
            self.fail(i, "I10", "an incomplete item is not the last item")
        if statuses and statuses[-1] == "incomplete" and event["type"] == "response.completed":
            self.fail(i, "I10", "incomplete item in a completed response")

    # ---- items --------------------------------------------------------------------------

    def item_added(self, i: int, event: dict[str, Any]) -> None:
        item = event.get("item", {})
        if self.open is not None:
            self.fail(i, "I3", "item added while another is open", event)
        if event.get("output_index") != len(self.added):
            self.fail(i, "I4", f"output_index {event.get('output_index')} != {len(self.added)}")
        if not item.get("id") or item["id"] in self.ids:
            self.fail(i, "I6", "item id empty or reused", event)
        self.ids.add(item.get("id", ""))
        compacting, self.compacting = self.compacting, None
        if compacting is not None and (item.get("type"), item.get("id")) != (
            "compaction",
            compacting,
        ):
            self.fail(i, "compaction", f"the compaction {compacting} was not the next item", event)
        if item.get("status") != "in_progress" and item.get("type") not in _STATELESS:
            self.fail(i, "I10", f"added item status {item.get('status')!r}", event)
        self.added.append(item)
        acc = item.get("arguments", item.get("input", ""))
        self.open = {"item": item, "index": event.get("output_index"), "acc": acc, "parts": []}
        self.open["stage"] = "added"
        if item.get("type") == "mcp_list_tools" and item.get("tools"):
            self.fail(i, "mcp", "a tool listing is added with no tools yet", event)
        if item.get("type") == "mcp_call" and (acc or item.get("output") or item.get("error")):
            self.fail(i, "mcp", "an mcp_call is added with no arguments, output or error", event)

    def compaction_compacting(self, i: int, event: dict[str, Any]) -> None:
        """A compaction's summary is sampled: the item it names is the next one added."""
        if self.open is not None:
            self.fail(i, "I3", "a compaction is sampled while an item is open", event)
        if event.get("output_index") != len(self.added):
            self.fail(i, "I4", f"output_index {event.get('output_index')} != {len(self.added)}")
        if self.compacting not in (None, event.get("item_id")):
            self.fail(i, "compaction", "another compaction is sampled before the first", event)
        self.compacting = event.get("item_id")

    def stage(self, i: int, event: dict[str, Any], kind: str, after: set[str], to: str) -> None:
        """One step of an MCP item's lifecycle, in its order."""
        if not self.same_item(i, event):
            return
        assert self.open is not None
        item, stage = self.open["item"], self.open["stage"]
        if item.get("type") != kind:
            self.fail(i, "mcp", f"{event['type']} for a {item.get('type')} item", event)
        elif stage not in after:
            self.fail(i, "mcp", f"{event['type']} after {stage}", event)
        self.open["stage"] = to

    def item_ends(self, i: int, item: dict[str, Any]) -> None:
        """A server-run item (an MCP listing or call, a web search) is done only after its
        lifecycle ended, with the status it ended in (one cut short is `incomplete`)."""
        assert self.open is not None
        kind = item.get("type", "")
        ends = _ENDS.get(kind)
        if ends is None:
            return
        stage = self.open["stage"]
        if kind == "mcp_list_tools" and stage not in ends:
            self.fail(i, "mcp", f"a tool listing is done after {stage}", item)
        wanted = ends.get(stage, ("incomplete",))
        if kind != "mcp_list_tools" and item.get("status") not in wanted:
            self.fail(i, _RULE[kind], f"a {kind} done {item.get('status')!r} after {stage}", item)

    def item_done(self, i: int, event: dict[str, Any]) -> None:
        item = event.get("item", {})
        if not self.same_item(i, event):
            return
        assert self.open is not None
        if any(not p["closed"] for p in self.open["parts"]):
            self.fail(i, "I3", "item done with a content part still open", event)
        first = self.open["item"]
        for key in ("id", "type", "call_id", "name"):
            if first.get(key) != item.get(key):
                self.fail(i, "I6", f"item {key!r} changed between added and done", event)
        done_statuses = (
            ("completed", "incomplete", "failed")
            if item.get("type") in ("mcp_call", "web_search_call", "file_search_call")
            else ("completed", "incomplete")
        )
        if item.get("status") not in done_statuses and item.get("type") not in _STATELESS:
            self.fail(i, "I10", f"done item status {item.get('status')!r}", event)
        self.item_ends(i, item)
        content = item.get("content")
        if isinstance(content, list) and self.open["parts"]:
            texts = [p["acc"] for p in self.open["parts"]]
            got = [c.get("text", c.get("refusal")) for c in content]
            if texts != got:
                self.fail(i, "I7", "item content differs from the streamed deltas", event)
            annotations = [p["annotations"] for p in self.open["parts"]]
            if annotations != [c.get("annotations", []) for c in content]:
                self.fail(i, "I7", "item annotations differ from those added", event)
        commands = self.open.get("commands")
        if commands is not None and (
            not all(c["closed"] for c in commands)
            or [c["acc"] for c in commands] != item.get("action", {}).get("commands")
        ):
            self.fail(i, "I7", "the shell call's commands differ from the streamed ones", event)
        streamed = _CALL_VALUE.get(item.get("type", ""))
        if streamed is not None and item.get(streamed) != self.open["acc"]:
            # Codex runs the call in output_item.done: it must be what was streamed.
            self.fail(i, "I7", f"item {streamed} differ from the streamed deltas", event)
        self.done.append(item)
        self.open = None

    def same_item(self, i: int, event: dict[str, Any]) -> bool:
        if self.open is None:
            self.fail(i, "I3", "event for no open item", event)
            return False
        item_id = event.get("item_id", event.get("item", {}).get("id"))
        if not item_id or item_id != self.open["item"].get("id"):
            self.fail(i, "I6", f"item_id {item_id!r} is not the open item", event)
        if event.get("output_index") != self.open["index"]:
            self.fail(i, "I4", f"output_index {event.get('output_index')} != open item's", event)
        return True

    def part_added(self, i: int, event: dict[str, Any]) -> None:
        if not self.same_item(i, event):
            return
        assert self.open is not None
        parts = self.open["parts"]
        if parts and not parts[-1]["closed"]:
            self.fail(i, "I3", "content part added while another is open", event)
        if event.get("content_index") != len(parts):
            self.fail(i, "I5", f"content_index {event.get('content_index')} != {len(parts)}")
        kind = event.get("part", {}).get("type")
        parts.append({"acc": "", "closed": False, "type": kind, "annotations": []})

    def open_part(self, i: int, event: dict[str, Any]) -> dict[str, Any] | None:
        if not self.same_item(i, event):
            return None
        assert self.open is not None
        parts = self.open["parts"]
        if not parts or parts[-1]["closed"]:
            self.fail(i, "I3", "content event with no open content part", event)
            return None
        if event.get("content_index") != len(parts) - 1:
            self.fail(i, "I5", f"content_index {event.get('content_index')} != {len(parts) - 1}")
        return parts[-1]  # type: ignore[no-any-return]

    def part_done(self, i: int, event: dict[str, Any]) -> None:
        part = self.open_part(i, event)
        if part is None:
            return
        body = event.get("part", {})
        if body.get("text", body.get("refusal")) != part["acc"]:
            self.fail(i, "I7", "content_part.done text differs from the deltas", event)
        if body.get("type") == "output_text" and body.get("annotations") != part["annotations"]:
            self.fail(i, "I7", "content_part.done annotations differ from those added", event)
        part["closed"] = True

    def annotation(self, i: int, event: dict[str, Any]) -> None:
        """A citation added to the open text part: numbered in order, over a span of the text
        streamed so far (a URL citation's span is a link to its URL), or at a point of it (a
        file citation's `index`)."""
        part = self.open_part(i, event)
        if part is None:
            return
        annotation = event.get("annotation") or {}
        if event.get("annotation_index") != len(part["annotations"]):
            self.fail(i, "I5", "annotation_index is not the next one", event)
        part["annotations"].append(annotation)
        start, end = annotation.get("start_index"), annotation.get("end_index")
        if annotation.get("type") == "file_citation":
            index = annotation.get("index")
            if not (isinstance(index, int) and 0 <= index <= len(part["acc"])):
                self.fail(i, "citation", "a file_citation's index is past the text", event)
            return
        if annotation.get("type") != "url_citation":
            return
        if not (isinstance(start, int) and isinstance(end, int) and 0 <= start < end):
            self.fail(i, "citation", "a url_citation without a span", event)
        elif end > len(part["acc"]) or annotation.get("url") not in part["acc"][start:end]:
            self.fail(i, "citation", "a url_citation's span does not hold its URL", event)

    def delta(self, i: int, event: dict[str, Any], scope: str) -> None:
        target = self.open_part(i, event) if scope == "part" else self.open_target(i, event)
        if target is not None:
            target["acc"] += event.get("delta", "")

    def open_target(self, i: int, event: dict[str, Any]) -> dict[str, Any] | None:
        return self.open if self.same_item(i, event) else None

    def value_done(self, i: int, event: dict[str, Any], scope: str, key: str) -> None:
        target = self.open_part(i, event) if scope == "part" else self.open_target(i, event)
        if target is not None and event.get(key) != target["acc"]:
            self.fail(i, "I7", f"{key} at done differs from the concatenated deltas", event)

    def error(self, i: int, event: dict[str, Any]) -> None:
        self.pending_error = True

    # ---- a shell call's commands (added, delta*, done; one at a time, in order) -----------

    def command(self, i: int, event: dict[str, Any]) -> dict[str, Any] | None:
        """The command an event is about: of the open shell call, the one last added."""
        if self.open is None or self.open["item"].get("type") != "shell_call":
            self.fail(i, "I3", "a shell command event for no open shell_call", event)
            return None
        if event.get("output_index") != self.open["index"]:
            self.fail(i, "I4", f"output_index {event.get('output_index')} != open item's", event)
        commands = self.open.setdefault("commands", [])
        if event["type"].endswith(".added"):
            if commands and not commands[-1]["closed"]:
                self.fail(i, "I3", "a shell command added while another is open", event)
            if event.get("command_index") != len(commands):
                self.fail(i, "I5", f"command_index {event.get('command_index')} != {len(commands)}")
            commands.append({"acc": event.get("command", ""), "closed": False})
        elif not commands or commands[-1]["closed"]:
            self.fail(i, "I3", "a shell command event with no command open", event)
            return None
        elif event.get("command_index") != len(commands) - 1:
            self.fail(i, "I5", f"command_index {event.get('command_index')} is not the open one")
        return commands[-1]  # type: ignore[no-any-return]

    def command_delta(self, i: int, event: dict[str, Any]) -> None:
        command = self.command(i, event)
        if command is not None:
            command["acc"] += event.get("delta", "")

    def command_done(self, i: int, event: dict[str, Any]) -> None:
        command = self.command(i, event)
        if command is None:
            return
        if event.get("command") != command["acc"]:
            self.fail(i, "I7", "the command at done differs from its deltas", event)
        command["closed"] = True

    def finish(self, count: int) -> None:
        if self.terminal_at is None:
            self.fail(-1, "I2", f"stream of {count} events ended without a terminal event")


_HANDLERS = {
    "response.output_item.added": _Checker.item_added,
    "response.output_item.done": _Checker.item_done,
    "response.content_part.added": _Checker.part_added,
    "response.content_part.done": _Checker.part_done,
    "response.completed": _Checker.terminal,
    "response.incomplete": _Checker.terminal,
    "response.failed": _Checker.terminal,
    "response.cancelled": _Checker.terminal,
    "error": _Checker.error,
    "response.compaction.compacting": _Checker.compaction_compacting,
    "response.output_text.annotation.added": _Checker.annotation,
    "response.shell_call_command.added": _Checker.command,
    "response.shell_call_command.delta": _Checker.command_delta,
    "response.shell_call_command.done": _Checker.command_done,
}


def _as_typed(snap: dict[str, Any]) -> dict[str, Any]:
    """A snapshot as the SDK's types can read it (`_CHOICE_EXTENSIONS`)."""
    choice = snap.get("tool_choice")
    if isinstance(choice, dict) and choice.get("type") in _CHOICE_EXTENSIONS:
        return {**snap, "tool_choice": "required"}
    return snap


def _strip_ids(value: Any) -> Any:
    volatile = {"id", "item_id", "call_id", "created_at", "completed_at"}
    if isinstance(value, dict):
        return {k: _strip_ids(v) for k, v in value.items() if k not in volatile}
    if isinstance(value, list):
        return [_strip_ids(v) for v in value]
    return value


def same_response(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """I12: equal but for ids and timestamps."""
    return _strip_ids(a) == _strip_ids(b)  # type: ignore[no-any-return]


# ---- WebSocket frames -------------------------------------------------------------------

_SOCKET_EVENTS: dict[str, type[BaseModel]] = {
    "response.steer.accepted": ResponseSteerAcceptedEvent,
    "response.steer.pending": ResponseSteerPendingEvent,
    "response.steer.failed": ResponseSteerFailedEvent,
}


def validate_socket(frames: list[dict[str, Any]]) -> Report:
    """A socket's frames as they came. A lane runs one response at a time, so the events of
    one `stream_id` (or of none) from a `response.created` to its terminal event are one
    stream; a response error frame (with `status`) and the steer events are the socket's."""
    violations: list[Violation] = []
    streams: dict[str | None, list[tuple[int, dict[str, Any]]]] = {}
    own = 0
    for i, frame in enumerate(frames):
        kind = frame.get("type", "")
        if kind in _SOCKET_EVENTS or (kind == "error" and "status" in frame):
            violations += _socket_frame(i, frame, own)
            own += kind != "error"
            continue
        lane = frame.get("stream_id")
        streams.setdefault(lane, []).append((i, frame))
        if kind in TERMINAL:
            violations += _lane_stream(streams.pop(lane))
    for stream in streams.values():
        violations += _lane_stream(stream)
    return Report(list(frames), violations)


def _socket_frame(i: int, frame: dict[str, Any], own: int) -> list[Violation]:
    kind = frame["type"]
    try:
        _SOCKET_EVENTS.get(kind, ResponseWsError).model_validate(frame)
    except ValidationError as exc:
        err = exc.errors()[0]
        return [Violation(i, "schema", f"{kind}: {err['loc']} {err['msg']}", _excerpt(frame))]
    if kind != "error" and frame.get("sequence_number") != own:
        message = f"socket event sequence_number {frame.get('sequence_number')} != {own}"
        return [Violation(i, "I1", message, _excerpt(frame))]
    return []


def _lane_stream(stream: list[tuple[int, dict[str, Any]]]) -> list[Violation]:
    """One response's events, checked as a stream; violations numbered as frames."""
    at = [i for i, _ in stream]
    report = validate_events([event for _, event in stream])
    return [
        Violation(at[v.index] if v.index >= 0 else at[-1], v.rule, v.message, v.excerpt)
        for v in report.violations
    ]
