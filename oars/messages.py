"""Anthropic's Messages API as a front door to the Responses path, both ways, as plain values.

`translate(body)` turns a `POST /v1/messages` body into a Responses body (`system` and
`messages` → input items, `tool_use` → `function_call`, `tool_result` → `function_call_output`,
`tools` → function tools, `thinking` → `reasoning.effort`, `max_tokens` → `max_output_tokens`),
which the server then validates and runs as any other response: one generation path. What the
one state machine makes comes back in Anthropic's wire forms: its events as Messages stream
events (`EventStream`), its final response as a `message` (`message`), its errors in
Anthropic's error body (`error_body`). Nothing is stored.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from oars.translation import Json, Translation, ending, message_items
from oars.translation import fail as _fail
from oars.translation import typed as _typed

_SAME = frozenset({"model", "temperature", "top_p", "top_k"})
# `metadata` (a user id), `service_tier` and `inference_geo` are about Anthropic's accounts, and
# `cache_control` about its prompt cache (oars reuses a prompt's prefix unasked): accepted, ignored.
_READ = frozenset(
    {"messages", "max_tokens", "system", "stream", "stop_sequences", "tools", "tool_choice"}
    | {"thinking", "metadata", "service_tier", "inference_geo", "cache_control"}
)
_CHOICES = {"auto": "auto", "any": "required", "none": "none"}
# A thinking budget → the nearest reasoning effort (Anthropic's minimum budget is 1024).
_BUDGETS = ((2048, "low"), (8192, "medium"))


def _required(body: Mapping[str, Any], key: str, param: str) -> Any:
    if body.get(key) is None:
        raise _fail(f"Missing required parameter: '{param}'.", param, "missing_required_parameter")
    return body[key]


# ---- the request ------------------------------------------------------------------------------


def translate(body: Any, *, counting: bool = False) -> Translation:
    """A Messages body → a Responses body; 400 naming the Messages parameter at fault.
    `counting`: for `count_tokens`, which takes no `max_tokens` and no `stream`."""
    _typed(body, dict, "body", "a JSON object")
    known = _SAME | (_READ - {"stream", "max_tokens"} if counting else _READ)
    for key in body:
        if key not in known:
            raise _fail(f"Unrecognized request argument supplied: {key}", key, "unknown_parameter")
    out: Json = {k: v for k, v in body.items() if k in _SAME and v is not None}
    if not counting:
        out["max_output_tokens"] = _required(body, "max_tokens", "max_tokens")
    _required(body, "model", "model")
    items = _system(body.get("system"))
    offset = len(items)
    made, from_messages = message_items(
        body.get("messages"), {"user": _user, "assistant": _assistant}
    )
    items += made
    stream = body.get("stream")
    out |= {"input": items, "store": False, "stream": bool(stream is not None and stream)}
    if stream is not None:
        _typed(stream, bool, "stream", "a boolean")
    if body.get("stop_sequences") is not None:
        out["stop"] = _typed(body["stop_sequences"], list, "stop_sequences", "an array")
    out |= _tools(body) | _thinking(body.get("thinking"))
    renames = [(f"input[{k}]", "system") for k in range(offset)]
    renames += [(f"input[{offset + k}]", f"messages[{i}]") for k, i in enumerate(from_messages)]
    tools = range(len(out.get("tools", [])))
    renames += [(f"tools[{i}].parameters", f"tools[{i}].input_schema") for i in tools]
    renames += [("input", "messages"), ("max_output_tokens", "max_tokens")]
    renames += [("stop", "stop_sequences"), ("reasoning", "thinking")]
    return Translation(out, renames=tuple(renames))


def _system(system: Any) -> list[Json]:
    if system is None:
        return []
    return [{"type": "message", "role": "system", "content": _texts(system, "system")}]


def _texts(content: Any, param: str) -> list[Json]:
    """A string or text blocks as `input_text` parts."""
    if isinstance(content, str):
        return [{"type": "input_text", "text": content}]
    parts = []
    for j, block in enumerate(_typed(content, list, param, "a string or an array of blocks")):
        where = f"{param}[{j}]"
        kind = _typed(block, dict, where, "an object").get("type")
        if kind != "text":
            raise _fail(f"{where}.type: expected 'text', got {kind!r}.", f"{where}.type")
        parts.append({"type": "input_text", "text": _text(block, where)})
    return parts


def _text(block: Mapping[str, Any], where: str) -> str:
    text: str = _typed(_required(block, "text", f"{where}.text"), str, f"{where}.text", "a string")
    return text


def _user(message: Json, param: str) -> list[Json]:
    return _blocks("user", _content(message, param), param)


def _assistant(message: Json, param: str) -> list[Json]:
    return _blocks("assistant", _content(message, param), param)


def _content(message: Json, param: str) -> list[Any]:
    content = _required(message, "content", f"{param}.content")
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return list(_typed(content, list, f"{param}.content", "a string or an array of blocks"))


def _blocks(role: str, blocks: list[Any], param: str) -> list[Json]:
    """A message's blocks in order: runs of text and images as one message item, each call
    and each result as an item of its own."""
    items: list[Json] = []
    parts: list[Json] = []
    for j, block in enumerate(blocks):
        where = f"{param}.content[{j}]"
        kind = _typed(block, dict, where, "an object").get("type")
        handler = _BLOCKS.get((role, kind))
        if handler is None:
            raise _fail(
                f"{where}.type: {kind!r} is not a block this server takes in a {role} message.",
                f"{where}.type",
            )
        part, item = handler(block, where)
        if part is not None:
            parts.append(part)
        if item is not None:
            items += [*_message(role, parts), item]
            parts = []
    return items + _message(role, parts)


def _message(role: str, parts: list[Json]) -> list[Json]:
    if not parts:
        return []
    if role == "assistant":
        parts = [{"type": "output_text", "text": p["text"], "annotations": []} for p in parts]
    return [{"type": "message", "role": role, "content": parts}]


Made = tuple[Json | None, Json | None]  # a part of the message, or an item of its own


def _text_block(block: Json, where: str) -> Made:
    return {"type": "input_text", "text": _text(block, where)}, None


def _image_block(block: Json, where: str) -> Made:
    source = _typed(
        _required(block, "source", f"{where}.source"), dict, f"{where}.source", "an object"
    )
    kind = source.get("type")
    if kind == "base64":
        media = _typed(source.get("media_type"), str, f"{where}.source.media_type", "a string")
        data = _typed(source.get("data"), str, f"{where}.source.data", "a string")
        url = f"data:{media};base64,{data}"
    elif kind == "url":
        url = _typed(source.get("url"), str, f"{where}.source.url", "a string")
    else:
        raise _fail(f"{where}.source.type: expected 'base64' or 'url'.", f"{where}.source.type")
    return {"type": "input_image", "image_url": url, "detail": "auto"}, None


def _tool_use(block: Json, where: str) -> Made:
    call_id = _typed(_required(block, "id", f"{where}.id"), str, f"{where}.id", "a string")
    name = _typed(_required(block, "name", f"{where}.name"), str, f"{where}.name", "a string")
    arguments = _typed(block.get("input", {}), dict, f"{where}.input", "an object")
    call = {"type": "function_call", "call_id": call_id, "name": name}
    return None, call | {"arguments": json.dumps(arguments)}


def _tool_result(block: Json, where: str) -> Made:
    param = f"{where}.tool_use_id"
    call_id = _typed(_required(block, "tool_use_id", param), str, param, "a string")
    content = block.get("content", "")
    output = "".join(p["text"] for p in _texts(content, f"{where}.content"))
    if _typed(block.get("is_error", False), bool, f"{where}.is_error", "a boolean"):
        output = f"Error: {output}"  # the Responses item has no flag: the model reads it
    return None, {"type": "function_call_output", "call_id": call_id, "output": output}


def _thinking_block(block: Json, where: str) -> Made:
    """Earlier thinking is the client's copy of what the model thought; templates of open
    models drop it from the prompt, so it is accepted and not sent."""
    return None, None


_BLOCKS: dict[tuple[str, Any], Callable[[Json, str], Made]] = {
    ("user", "text"): _text_block,
    ("user", "image"): _image_block,
    ("user", "tool_result"): _tool_result,
    ("assistant", "text"): _text_block,
    ("assistant", "tool_use"): _tool_use,
    ("assistant", "thinking"): _thinking_block,
    ("assistant", "redacted_thinking"): _thinking_block,
}


def _tools(body: Mapping[str, Any]) -> Json:
    out: Json = {}
    tools = body.get("tools")
    if tools is not None:
        out["tools"] = [
            _tool(t, f"tools[{i}]") for i, t in enumerate(_typed(tools, list, "tools", "an array"))
        ]
    choice = body.get("tool_choice")
    if choice is None:
        return out
    kind = _typed(choice, dict, "tool_choice", "an object").get("type")
    if kind == "tool":
        out["tool_choice"] = {"type": "function", "name": choice.get("name")}
    elif kind in _CHOICES:
        out["tool_choice"] = _CHOICES[kind]
    else:
        raise _fail(
            "tool_choice.type: expected 'auto', 'any', 'tool' or 'none'.", "tool_choice.type"
        )
    parallel = choice.get("disable_parallel_tool_use")
    if parallel is not None:
        out["parallel_tool_calls"] = not _typed(
            parallel, bool, "tool_choice.disable_parallel_tool_use", "a boolean"
        )
    return out


def _tool(tool: Any, param: str) -> Json:
    _typed(tool, dict, param, "an object")
    if tool.get("type", "custom") != "custom":
        raise _fail(
            f"{param}.type: {tool.get('type')!r}; this server takes client tools (name, "
            "description, input_schema).",
            f"{param}.type",
        )
    schema = _typed(_required(tool, "input_schema", f"{param}.input_schema"), dict,
                    f"{param}.input_schema", "an object")  # fmt: skip
    out = {"type": "function", "name": tool.get("name"), "parameters": schema}
    return out | {k: tool[k] for k in ("description", "strict") if tool.get(k) is not None}


def _thinking(thinking: Any) -> Json:
    """`enabled` with a budget → an effort; `disabled` → none; absent → the model's default."""
    if thinking is None:
        return {}
    kind = _typed(thinking, dict, "thinking", "an object").get("type")
    if kind == "disabled":
        return {"reasoning": {"effort": "none"}}
    if kind == "adaptive":
        return {}
    if kind != "enabled":
        raise _fail("thinking.type: expected 'enabled', 'disabled' or 'adaptive'.", "thinking.type")
    param = "thinking.budget_tokens"
    budget = _typed(_required(thinking, "budget_tokens", param), int, param, "an integer")
    effort = next((e for limit, e in _BUDGETS if budget < limit), "high")
    return {"reasoning": {"effort": effort}}


# ---- the answer -------------------------------------------------------------------------------


def message_id(response_id: str) -> str:
    """The message's id: its response's, in Anthropic's form (one id in logs and metrics)."""
    return "msg_" + response_id.removeprefix("resp_")


def stop_reason(response: Mapping[str, Any], stop_sequence: str | None = None) -> str:
    """Why the generation ended, in Anthropic's words. `stop_sequence`: the request's stop
    sequence that ended it (the run knows it; the Responses object has no field for it). A
    turn that ends with calls is `tool_use` whatever stopped it: that is what a client acts on."""
    reason = ending(response)
    if reason == "done" and stop_sequence is not None:
        return "stop_sequence"
    return _STOP_REASONS[reason]


def _ending(response: Mapping[str, Any], stop_sequence: str | None) -> Json:
    """`stop_reason` and `stop_sequence`, as the message and its `message_delta` carry them."""
    reason = stop_reason(response, stop_sequence)
    return {
        "stop_reason": reason,
        "stop_sequence": stop_sequence if reason == "stop_sequence" else None,
    }


_STOP_REASONS = {
    "length": "max_tokens",
    "filtered": "refusal",
    "calls": "tool_use",
    "done": "end_turn",
}


def usage(wire: Mapping[str, Any] | None) -> Json:
    """A Responses usage in Anthropic's form (nothing is cached on purpose, nothing created)."""
    wire = wire or {}
    cached = (wire.get("input_tokens_details") or {}).get("cached_tokens", 0)
    return {
        "input_tokens": wire.get("input_tokens", 0),
        "output_tokens": wire.get("output_tokens", 0),
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached,
    }


def _head(response: Mapping[str, Any]) -> Json:
    return {
        "id": message_id(response["id"]),
        "type": "message",
        "role": "assistant",
        "model": response["model"],
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
    }


def _block(item: Mapping[str, Any]) -> Json | None:
    """An output item as a content block, as it opens (None: an item Messages has no block for)."""
    kind = item["type"]
    if kind == "reasoning":
        return {"type": "thinking", "thinking": "", "signature": ""}
    if kind == "message":
        return {"type": "text", "text": "", "citations": None}
    if kind == "function_call":
        return {"type": "tool_use", "id": item["call_id"], "name": item["name"], "input": {}}
    return None


def _filled(item: Mapping[str, Any]) -> Json | None:
    """An output item as its whole content block."""
    block = _block(item)
    if block is None:
        return None
    if block["type"] == "thinking":
        thinking = "".join(p["text"] for p in item.get("content") or [])
        return block | {"thinking": thinking, "signature": item.get("encrypted_content") or ""}
    if block["type"] == "text":
        return block | {"text": "".join(p.get("text", "") for p in item["content"])}
    return block | {"input": _arguments(item["arguments"])}


def _arguments(arguments: str) -> Any:
    try:
        return json.loads(arguments) if arguments else {}
    except json.JSONDecodeError:
        return {}  # a call's arguments are JSON unless the model wrote malformed text


def message(response: Mapping[str, Any], stop_sequence: str | None = None) -> Json:
    """A final response as a `message` (`stop_sequence`: the one that ended it, if one did)."""
    blocks = [_filled(item) for item in response["output"]]
    content = {"content": [b for b in blocks if b is not None]}
    return (
        _head(response)
        | content
        | _ending(response, stop_sequence)
        | {"usage": usage(response.get("usage"))}
    )


_ERRORS = {401: "authentication_error", 403: "permission_error", 404: "not_found_error"}
_ERRORS |= {429: "rate_limit_error", 503: "overloaded_error", 504: "timeout_error"}


def error_body(status: int, message: str, request_id: str | None = None) -> Json:
    """An error in Anthropic's shape, its type from the status."""
    kind = _ERRORS.get(status, "invalid_request_error" if status < 500 else "api_error")
    body: Json = {"type": "error", "error": {"type": kind, "message": message}}
    return body | ({"request_id": request_id} if request_id else {})


Event = tuple[str, Json]  # an SSE event's name and its data


@dataclass
class EventStream:
    """A response's events → Messages stream events (`feed` per event). `message_start` with
    no content; a `content_block_start` when an item opens (thinking, text or tool_use), its
    deltas, a `content_block_stop` when it is done (a thinking block's signature first);
    `message_delta` with the stop reason and usage, then `message_stop`. A failed response
    becomes one `error` event, as Anthropic sends an error inside a stream."""

    _blocks: dict[int, int] = field(default_factory=dict)  # output_index → block index

    def feed(self, event: Mapping[str, Any], stop_sequence: str | None = None) -> list[Event]:
        """The Messages events of one response event; `stop_sequence`, with the terminal event:
        the stop sequence that ended the generation, if one did."""
        if event["type"] in _ENDINGS:
            return self._ended(event, stop_sequence)
        handler = _EVENTS.get(event["type"])
        return handler(self, event) if handler is not None else []

    def _created(self, event: Mapping[str, Any]) -> list[Event]:
        start = _head(event["response"]) | {"usage": usage(None)}
        return [("message_start", {"type": "message_start", "message": start})]

    def _opened(self, event: Mapping[str, Any]) -> list[Event]:
        block = _block(event["item"])
        if block is None:
            return []
        index = self._blocks[event["output_index"]] = len(self._blocks)
        data = {"type": "content_block_start", "index": index, "content_block": block}
        return [("content_block_start", data)]

    def _delta(self, event: Mapping[str, Any], delta: Json) -> list[Event]:
        index = self._blocks.get(event["output_index"])
        if index is None:
            return []
        return [
            ("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta})
        ]

    def _text(self, event: Mapping[str, Any]) -> list[Event]:
        return self._delta(event, {"type": "text_delta", "text": event["delta"]})

    def _reasoning(self, event: Mapping[str, Any]) -> list[Event]:
        return self._delta(event, {"type": "thinking_delta", "thinking": event["delta"]})

    def _arguments(self, event: Mapping[str, Any]) -> list[Event]:
        return self._delta(event, {"type": "input_json_delta", "partial_json": event["delta"]})

    def _done(self, event: Mapping[str, Any]) -> list[Event]:
        index = self._blocks.get(event["output_index"])
        if index is None:
            return []
        item = event["item"]
        out: list[Event] = []
        if item["type"] == "reasoning" and item.get("encrypted_content"):
            signature = {"type": "signature_delta", "signature": item["encrypted_content"]}
            out = self._delta(event, signature)
        return [*out, ("content_block_stop", {"type": "content_block_stop", "index": index})]

    def _ended(self, event: Mapping[str, Any], stop_sequence: str | None) -> list[Event]:
        response = event["response"]
        delta = _ending(response, stop_sequence)
        data = {"type": "message_delta", "delta": delta, "usage": usage(response.get("usage"))}
        return [("message_delta", data), ("message_stop", {"type": "message_stop"})]

    def _failed(self, event: Mapping[str, Any]) -> list[Event]:
        error = event["response"].get("error") or {}
        return [("error", error_body(500, error.get("message", "The response failed.")))]


_EVENTS: dict[str, Callable[[EventStream, Mapping[str, Any]], list[Event]]] = {
    "response.created": EventStream._created,
    "response.output_item.added": EventStream._opened,
    "response.output_text.delta": EventStream._text,
    "response.reasoning_text.delta": EventStream._reasoning,
    "response.function_call_arguments.delta": EventStream._arguments,
    "response.output_item.done": EventStream._done,
    "response.failed": EventStream._failed,
}
_ENDINGS = frozenset({"response.completed", "response.incomplete"})
