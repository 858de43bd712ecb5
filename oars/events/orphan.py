"""The ending of a response whose replica died: written by whoever notices, from its log alone.

What the dead replica logged stays. The ending makes the whole log a valid stream: what was not
logged of `response.created` and `response.in_progress` comes first; an item left open is
closed as the builder would have closed it (its open content part's `.done` events, then
`output_item.done` with status `incomplete`); then `error` and `response.failed`, whose output
is every item that got its `output_item.done`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

Event = dict[str, Any]
_PART_EVENT = {"output_text": "response.output_text", "reasoning_text": "response.reasoning_text"}
_CALL_DONE = {
    "function_call": ("response.function_call_arguments.done", "arguments"),
    "custom_tool_call": ("response.custom_tool_call_input.done", "input"),
}
MESSAGE = "The server running this response stopped before it finished."


@dataclass
class _Open:
    """The item being written when the log stops, as far as the log shows it."""

    item: dict[str, Any]
    output_index: int
    parts: list[dict[str, Any]] = field(default_factory=list)
    part_open: bool = False
    arguments: str = ""


def _replay(logged: list[Event]) -> tuple[list[dict[str, Any]], _Open | None]:
    done: list[dict[str, Any]] = []
    current: _Open | None = None
    for event in logged:
        kind = event["type"]
        if kind == "response.output_item.added":
            current = _Open(dict(event["item"]), event["output_index"])
        elif kind == "response.output_item.done":
            done.append(event["item"])
            current = None
        elif current is None:
            continue
        elif kind == "response.content_part.added":
            current.parts.append(dict(event["part"]))
            current.part_open = True
        elif kind == "response.content_part.done":
            current.parts[-1], current.part_open = dict(event["part"]), False
        elif kind in ("response.output_text.delta", "response.reasoning_text.delta"):
            current.parts[-1]["text"] = current.parts[-1].get("text", "") + event["delta"]
        elif kind in (
            "response.function_call_arguments.delta",
            "response.custom_tool_call_input.delta",
        ):
            current.arguments += event["delta"]
    return done, current


class _Writer:
    def __init__(self, first: int) -> None:
        self.events: list[Event] = []
        self.seq = first

    def emit(self, type_: str, **fields: Any) -> None:
        self.events.append({"type": type_, "sequence_number": self.seq, **fields})
        self.seq += 1


def _close(w: _Writer, current: _Open) -> dict[str, Any]:
    item, where = (
        current.item,
        {"item_id": current.item["id"], "output_index": current.output_index},
    )
    if current.parts and current.part_open:
        index, part = len(current.parts) - 1, current.parts[-1]
        part.setdefault("text", "")
        fields: dict[str, Any] = {"text": part["text"]}
        if part["type"] == "output_text":
            fields["logprobs"] = []
        w.emit(f"{_PART_EVENT[part['type']]}.done", **where, content_index=index, **fields)
        w.emit("response.content_part.done", **where, content_index=index, part=part)
    if item["type"] in _CALL_DONE:
        type_, key = _CALL_DONE[item["type"]]
        extra = {"name": item.get("name")} if item["type"] == "function_call" else {}
        w.emit(type_, **where, **{key: current.arguments}, **extra)
        item[key] = current.arguments
    if "content" in item:
        item["content"] = current.parts
    item["status"] = "incomplete"
    w.emit("response.output_item.done", output_index=current.output_index, item=item)
    return item


def orphan_ending(
    logged: list[Event], snapshot: dict[str, Any], *, streamed: bool
) -> tuple[list[Event], dict[str, Any]]:
    """The events to append to `logged` (none when the response kept no log) and the final
    snapshot of a response that ends `failed` because its replica died."""
    w = _Writer(logged[-1]["sequence_number"] + 1 if logged else 0)
    if len(logged) < 1:
        w.emit("response.created", response=snapshot)
    if len(logged) < 2:  # every stream opens with these two
        w.emit("response.in_progress", response={**snapshot, "status": "in_progress"})
    done, current = _replay(logged)
    if current is not None:
        done.append(_close(w, current))
    final = {
        **snapshot,
        "status": "failed",
        "output": done,
        "error": {"code": "server_error", "message": MESSAGE},
    }
    w.emit("error", code="server_error", message=MESSAGE, param=None)
    w.emit("response.failed", response=final)
    return (w.events if streamed else []), final
