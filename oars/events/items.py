"""The output items as the builder holds them, and their wire forms.

An `Item` is an output item while its events stream (its parts, arguments, MCP stage) and `wire()`
is its form in events and snapshots, one function per item type (`_ITEM_WIRE`). Beside them: which
item and part a segment of model output opens, the prefix of a part's delta and done events, and
the two forms of a token's logprob.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from oars.generation import TokenLogprob
from oars.parsing import SegmentKind
from oars.parsing.citations import Marks
from oars.parsing.jsonfield import StringField


def stream_logprob(lp: TokenLogprob) -> dict[str, Any]:
    """The delta/done event form: no `bytes`."""
    return {
        "token": lp.token,
        "logprob": lp.logprob,
        "top_logprobs": [{"token": t.token, "logprob": t.logprob} for t in lp.top_logprobs],
    }


def item_logprob(lp: TokenLogprob) -> dict[str, Any]:
    """The output_text part form: `bytes` required."""
    return {
        "token": lp.token,
        "bytes": list(lp.bytes),
        "logprob": lp.logprob,
        "top_logprobs": [
            {"token": t.token, "bytes": list(t.bytes), "logprob": t.logprob}
            for t in lp.top_logprobs
        ],
    }


@dataclass
class Part:
    type: str  # "output_text" | "reasoning_text"
    text: str = ""
    logprobs: list[TokenLogprob] = field(default_factory=list)
    closed: bool = False  # its done events are out
    annotations: list[dict[str, Any]] = field(default_factory=list)  # output text's citations
    cited_to: int = 0  # output text: where a citation may still start, for the next delta
    marks: Marks | None = None  # output text after a file search: its citation markers

    def wire(self) -> dict[str, Any]:
        if self.type == "reasoning_text":
            return {"type": "reasoning_text", "text": self.text}
        return {
            "type": "output_text",
            "text": self.text,
            "annotations": list(self.annotations),
            "logprobs": [item_logprob(lp) for lp in self.logprobs],
        }


@dataclass
class Item:
    type: str  # "message" | "reasoning" | "function_call" | "custom_tool_call" | "compaction" | …
    id: str
    output_index: int
    status: str = "in_progress"
    parts: list[Part] = field(default_factory=list)
    call_id: str = ""
    name: str = ""
    arguments: str = ""  # function: the JSON text; custom: the input
    namespace: str | None = None
    input_field: StringField | None = None  # custom calls: decodes `input` out of the arguments
    streamed: str = ""  # custom calls: the input sent in deltas so far
    phase: str = ""  # messages: commentary or final_answer, where the model family marks it
    encrypted: str | None = None  # reasoning: the sealed text, when asked for; compaction: always
    server_label: str = ""  # MCP items
    output: str | None = None  # mcp_call: the tool's result
    error: dict[str, Any] | str | None = None  # mcp_call: an error object; mcp_list_tools: text
    approval_request_id: str | None = None  # mcp_call: the approval it ran after
    execution: str = ""  # tool search items: "client" or "server"
    tools: list[dict[str, Any]] = field(default_factory=list)  # mcp_list_tools, tool searches
    action: dict[str, Any] | None = None  # web_search_call: what the model did with the web
    queries: list[str] = field(default_factory=list)  # file_search_call: what it searched for
    results: list[dict[str, Any]] | None = None  # file_search_call: what it found, if included
    # MCP items: "running" (listing or calling), then "ended" (a listing's end is out) or the
    # call's outcome ("completed", "failed"), which its done item keeps
    stage: str = "added"
    done: dict[str, Any] | None = None  # an item replayed from a log, as it was done

    def wire(self) -> dict[str, Any]:
        return self.done if self.done is not None else _ITEM_WIRE[self.type](self)


def _message_wire(item: Item) -> dict[str, Any]:
    wire = {
        "id": item.id,
        "type": "message",
        "status": item.status,
        "role": "assistant",
        "content": [p.wire() for p in item.parts],
    }
    return {**wire, "phase": item.phase} if item.phase else wire


def _reasoning_wire(item: Item) -> dict[str, Any]:
    return {
        "id": item.id,
        "type": "reasoning",
        "status": item.status,
        "summary": [],
        "content": [p.wire() for p in item.parts],
        "encrypted_content": item.encrypted,
    }


def _call_fields(item: Item) -> dict[str, Any]:
    fields = {
        "id": item.id,
        "type": item.type,
        "status": item.status,
        "call_id": item.call_id,
        "name": item.name,
    }
    if item.namespace:
        fields["namespace"] = item.namespace
    return fields


def _function_call_wire(item: Item) -> dict[str, Any]:
    return {**_call_fields(item), "arguments": item.arguments}


def _custom_call_wire(item: Item) -> dict[str, Any]:
    return {**_call_fields(item), "input": item.streamed}


def arguments_object(text: str) -> dict[str, Any]:
    """Arguments a model wrote, once they are a whole JSON object ({} before), as strict JSON
    keeps them: a number out of a float's range, or NaN, is null."""
    try:
        arguments = (
            json.loads(text, parse_float=_finite, parse_constant=lambda _: None)
            if text.strip()
            else {}
        )
    except (ValueError, RecursionError):  # not JSON, or past what it reads (5000 digits)
        return {}
    return arguments if isinstance(arguments, dict) else {}


def _finite(text: str) -> float | None:
    value = float(text)
    return value if math.isfinite(value) else None


def _written(item: Item) -> dict[str, Any]:
    return arguments_object(item.arguments)


def _strings(value: Any) -> list[str]:
    return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []


def _integer(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _typed_call_fields(item: Item) -> dict[str, Any]:
    return {"id": item.id, "type": item.type, "status": item.status, "call_id": item.call_id}


def _tool_search_call_wire(item: Item) -> dict[str, Any]:
    return {**_typed_call_fields(item), "execution": item.execution, "arguments": _written(item)}


def _shell_call_wire(item: Item) -> dict[str, Any]:
    written = _written(item)
    action: dict[str, Any] = {
        "commands": _strings(written.get("commands")),
        "timeout_ms": _integer(written.get("timeout_ms")),
        "max_output_length": None,
    }
    return {**_typed_call_fields(item), "action": action}


def _local_shell_call_wire(item: Item) -> dict[str, Any]:
    written = _written(item)
    directory = written.get("working_directory")
    action: dict[str, Any] = {
        "type": "exec",
        "command": _strings(written.get("command")),
        "env": {},
        "timeout_ms": _integer(written.get("timeout_ms")),
        "user": None,
        "working_directory": directory if isinstance(directory, str) else None,
    }
    return {**_typed_call_fields(item), "action": action}


def _apply_patch_call_wire(item: Item) -> dict[str, Any]:
    """Only ever shown whole (`ResponseBuilder` announces it when it closes)."""
    written = _written(item)
    kind = written.get("operation")
    operation: dict[str, Any] = {
        "type": kind if kind in ("create_file", "update_file", "delete_file") else "update_file",
        "path": str(written.get("path", "")),
    }
    if operation["type"] != "delete_file":
        operation["diff"] = str(written.get("diff", ""))
    return {**_typed_call_fields(item), "operation": operation}


def _tool_search_output_wire(item: Item) -> dict[str, Any]:
    return {**_typed_call_fields(item), "execution": item.execution, "tools": item.tools}


def _web_search_wire(item: Item) -> dict[str, Any]:
    return {"id": item.id, "type": "web_search_call", "status": item.status, "action": item.action}


def _file_search_wire(item: Item) -> dict[str, Any]:
    return {
        "id": item.id,
        "type": "file_search_call",
        "status": item.status,
        "queries": item.queries,
        "results": item.results,
    }


def _compaction_wire(item: Item) -> dict[str, Any]:
    return {"id": item.id, "type": "compaction", "encrypted_content": item.encrypted}


def _mcp_list_wire(item: Item) -> dict[str, Any]:
    """As OpenAI sends it: no `error` key unless the listing failed."""
    wire = {
        "id": item.id,
        "type": "mcp_list_tools",
        "server_label": item.server_label,
        "tools": item.tools,
    }
    return {**wire, "error": item.error} if item.error is not None else wire


def _mcp_call_wire(item: Item) -> dict[str, Any]:
    return {
        "id": item.id,
        "type": "mcp_call",
        "status": item.status,
        "server_label": item.server_label,
        "name": item.name,
        "arguments": item.streamed,
        "output": item.output,
        "error": item.error,
        "approval_request_id": item.approval_request_id,
    }


def _approval_request_wire(item: Item) -> dict[str, Any]:
    return {
        "id": item.id,
        "type": "mcp_approval_request",
        "server_label": item.server_label,
        "name": item.name,
        "arguments": item.arguments,
    }


_ITEM_WIRE: dict[str, Callable[[Item], dict[str, Any]]] = {
    "compaction": _compaction_wire,
    "mcp_list_tools": _mcp_list_wire,
    "mcp_call": _mcp_call_wire,
    "mcp_approval_request": _approval_request_wire,
    "message": _message_wire,
    "reasoning": _reasoning_wire,
    "function_call": _function_call_wire,
    "custom_tool_call": _custom_call_wire,
    "tool_search_call": _tool_search_call_wire,
    "shell_call": _shell_call_wire,
    "local_shell_call": _local_shell_call_wire,
    "apply_patch_call": _apply_patch_call_wire,
    "tool_search_output": _tool_search_output_wire,
    "web_search_call": _web_search_wire,
    "file_search_call": _file_search_wire,
}

# segment kind → (item type, id prefix, part type)
SEGMENT_ITEM = {
    SegmentKind.TEXT: ("message", "msg", "output_text"),
    SegmentKind.REASONING: ("reasoning", "rs", "reasoning_text"),
}
# part type → prefix of its delta/done events
PART_EVENT = {"output_text": "response.output_text", "reasoning_text": "response.reasoning_text"}
