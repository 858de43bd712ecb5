"""A response's builder rebuilt from its event log, for a response whose replica died.

The log holds every event the dead replica made: `replay` reads the items back out of it (the
ones it finished as they were done, the open one as far as its deltas went) and hands them to a
new builder, which goes on numbering after the log. The builder then writes the ending itself
(`oars.events.orphan`), so it stays the one writer of events.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from oars.events.builder import Event, ResponseBuilder
from oars.events.items import Item, Part
from oars.parsing.jsonfield import StringField


def replay(logged: Sequence[Event], snapshot: Mapping[str, Any]) -> ResponseBuilder:
    """The builder of a response whose replica died, as far as its log shows it: the items it
    finished, the one it had open as far as its deltas went. Its `start()` then makes what the
    log lacks of the stream's opening, and `fail()` ends it as this builder would have ended
    it."""
    echo = {k: v for k, v in snapshot.items() if k not in _OWN}
    builder = ResponseBuilder(echo, model=snapshot["model"])
    builder.id, builder.created_at = snapshot["id"], snapshot["created_at"]
    items, open_item = _items(logged)
    builder.resume(items, open_item, len(logged))  # a log's sequence numbers are its positions
    return builder


def _items(logged: Sequence[Event]) -> tuple[list[Item], Item | None]:
    """The output items a log made, and the one it left open."""
    items: list[Item] = []
    open_item: Item | None = None
    for event in logged:
        kind = event["type"]
        if kind == "response.output_item.added":
            open_item = _replayed_item(event["item"], event["output_index"])
            items.append(open_item)
        elif kind == "response.output_item.done":
            items[event["output_index"]].done = event["item"]
            open_item = None
        elif open_item is not None:
            _REPLAYED.get(kind, _ignored)(open_item, event)
    return items, open_item


# The snapshot's fields the builder makes (the rest echo the request).
_OWN = frozenset(
    {
        "id",
        "object",
        "created_at",
        "status",
        "completed_at",
        "error",
        "incomplete_details",
        "model",
        "output",
        "usage",
    }
)


_KEPT = ("call_id", "name", "namespace", "server_label", "execution")


def _replayed_item(wire: Mapping[str, Any], output_index: int) -> Item:
    """An item as its `output_item.added` showed it, open (its deltas follow)."""
    fields = {k: wire[k] for k in _KEPT if k in wire}
    item = Item(type=wire["type"], id=wire["id"], output_index=output_index, **fields)
    item.phase = wire.get("phase") or ""
    item.approval_request_id = wire.get("approval_request_id")
    if isinstance(wire.get("action"), dict):
        item.action = dict(wire["action"])
    if item.type == "custom_tool_call":
        item.input_field = StringField("input")
    return item


def _ignored(item: Item, event: Event) -> None:
    return None


def _part_added(item: Item, event: Event) -> None:
    item.parts.append(Part(event["part"]["type"]))


def _part_delta(item: Item, event: Event) -> None:
    item.parts[-1].text += event["delta"]


def _annotation(item: Item, event: Event) -> None:
    part = item.parts[-1]
    part.annotations.append(event["annotation"])
    part.cited_to = event["annotation"].get("end_index", part.cited_to)  # (a file citation: none)


def _part_done(item: Item, event: Event) -> None:
    item.parts[-1].closed = True


def _arguments_delta(item: Item, event: Event) -> None:
    item.arguments += event["delta"]


def _input_delta(item: Item, event: Event) -> None:
    item.streamed += event["delta"]
    item.arguments = json.dumps({"input": item.streamed})  # what closing it reads back


def _mcp_arguments(item: Item, event: Event) -> None:
    item.streamed += event["delta"]


def _list_running(item: Item, event: Event) -> None:
    item.stage = "running"


def _list_ended(item: Item, event: Event) -> None:
    item.stage = "ended"


def _call_ended(item: Item, event: Event) -> None:
    item.stage = event["type"].rpartition(".")[2]  # completed | failed


_REPLAYED: dict[str, Callable[[Item, Event], None]] = {
    "response.content_part.added": _part_added,
    "response.output_text.delta": _part_delta,
    "response.reasoning_text.delta": _part_delta,
    "response.content_part.done": _part_done,
    "response.output_text.annotation.added": _annotation,
    "response.web_search_call.in_progress": _list_running,
    "response.web_search_call.completed": _call_ended,
    "response.file_search_call.in_progress": _list_running,
    "response.file_search_call.completed": _call_ended,
    "response.function_call_arguments.delta": _arguments_delta,
    "response.custom_tool_call_input.delta": _input_delta,
    "response.mcp_call_arguments.delta": _mcp_arguments,
    "response.mcp_list_tools.in_progress": _list_running,
    "response.mcp_list_tools.completed": _list_ended,
    "response.mcp_list_tools.failed": _list_ended,
    "response.mcp_call.completed": _call_ended,
    "response.mcp_call.failed": _call_ended,
}
