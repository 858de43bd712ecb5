"""Items → the chat messages a model's template renders: the one renderer (the turn calls it).

Messages in every role (`developer` is `system`), replayed calls and their outputs (arguments as
objects), reasoning (its text, or its sealed `encrypted_content`, goes with the next assistant
turn), compaction items (the items they cover are left out, and their summary is the first
message after the instructions), and the MCP items: an `mcp_call` is the call and its result, a
declined approval is the call and the refusal. A tool search's call and output are a call and
its result (the names of the tools it loaded); so are the calls of the shell and apply_patch
tool types and their outputs (stdout, stderr and how each command ended; the patch's
outcome). A web search is the function the model called and what it read (`Context.read`: the
items keep no results). Listings, unanswered approval requests and `additional_tools` say
nothing to the model (the tools those load are offered, `oars.tools`),
nor do `configuration_update` items (their settings apply, `oars.turn`).
Other items of the SDK's union carry nothing a template can render.

A malformed item is a 400 naming it (`input[i]…`): the turn tells which items came from this
request's input and where they were in it. Rendering is the validation: `validate` runs it for
items that are kept before any model sees them.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from oars.compaction import COMPACTION_TYPES, SUMMARY_PREFIX, Sealed, place
from oars.errors import InvalidRequest
from oars.generation import ChatMessage, Media
from oars.ids import is_id
from oars.tools import TOOL_SEARCH, mcp_tool_name, parse_tools

Json = Mapping[str, Any]
Unseal = Callable[[str], str]  # sealed text → the text; raises ValueError if altered

_ROLES = ("user", "assistant", "system", "developer")
_TEXT_PARTS = ("input_text", "output_text", "text", "summary_text", "reasoning_text")
DECLINED = "The user declined this call, so it was not run."


def _fail(message: str, param: str, code: str = "invalid_value") -> InvalidRequest:
    return InvalidRequest(message, param=param, code=code)


@dataclass(frozen=True)
class Context:
    """What rendering one list of items needs besides the items."""

    unseal: Unseal | None = None
    params: Callable[[int], str] = lambda i: f"input[{i}]"
    # what this response's web searches read, by item id (an item keeps no results)
    read: Mapping[str, str] = field(default_factory=dict)


def render(
    items: Sequence[Json], instructions: str | None = None, context: Context | None = None
) -> list[ChatMessage]:
    """The messages for `items`, `instructions` first (with any leading system messages)."""
    return _with_system(_items(items, context or Context()), instructions)


def validate(raw: Any, unseal: Unseal | None = None, param: str = "input") -> bool:
    """400 naming the first malformed item (`param[i]…`); whether anything in `raw` renders
    as a message. `raw`: a string, or a list of objects with a string `type`.

    The renderer run for its errors, for items no model sees yet (those added to a
    conversation, a history sent to be compacted). A create request's input is validated where
    it is rendered, by its turn, once."""
    if isinstance(raw, str):
        return True
    context = Context(unseal, params=lambda i: f"{param}[{i}]")
    return bool(_items(raw, context))


# ---- content ------------------------------------------------------------------------------------


def content_text(content: Any, param: str) -> str:
    """Message content (a string or a list of parts) → the text the template gets; an image,
    file or audio part is a 400 (a tool's output)."""
    text, parts = content_parts(content, param)
    media = [p for p in parts if isinstance(p, Media)]
    if media:
        raise _fail(
            f"Invalid '{media[0].param}': a tool's output takes text only; "
            f"'{media[0].kind}' is not supported there.",
            media[0].param,
            "unsupported_content",
        )
    return text


def content_parts(content: Any, param: str) -> tuple[str, tuple[str | Media, ...]]:
    """Message content → its text, and (when it has images, files or audio) its text pieces
    and media in order; `()` for text alone."""
    if isinstance(content, str):
        return content, ()
    if not isinstance(content, list):
        raise _fail(f"Invalid '{param}': expected a string or an array of content parts.", param)
    parts: list[str | Media] = []
    for i, part in enumerate(content):
        p = f"{param}[{i}]"
        if not isinstance(part, dict):
            raise _fail(f"Invalid '{p}': expected a content part object.", p)
        kind = part.get("type")
        if kind in _TEXT_PARTS:
            parts.append(_text_field(part, "text", p))
        elif kind == "refusal":
            parts.append(_text_field(part, "refusal", p))
        elif kind in _MEDIA:
            parts.append(_MEDIA[kind](part, p))
        else:
            raise _fail(f"Invalid '{p}.type': unknown content part type {kind!r}.", f"{p}.type")
    text = "\n".join(t for t in parts if isinstance(t, str))
    return text, (tuple(parts) if any(isinstance(t, Media) for t in parts) else ())


# ---- images, files, audio: the chat-completions parts vLLM, llama.cpp and OpenAI take ----------


def _no_file_id(part: Json, param: str, what: str) -> None:
    if "file_id" in part and part["file_id"] is not None:
        raise _fail(
            f"Invalid '{param}.file_id': this server has no files API; send the {what} itself.",
            f"{param}.file_id",
            "unsupported_value",
        )


def _required(part: Json, key: str, param: str) -> str:
    """A part's non-empty string field, or a 400 naming it as missing."""
    value = part.get(key)
    if not isinstance(value, str) or not value:
        raise _fail(
            f"Missing required parameter: '{param}.{key}'.",
            f"{param}.{key}",
            "missing_required_parameter",
        )
    return value


def _image(part: Json, param: str) -> Media:
    _no_file_id(part, param, "image as image_url (a URL or a data URL)")
    image: dict[str, Any] = {"url": _required(part, "image_url", param)}
    detail = part.get("detail")
    if detail is not None:
        if detail not in ("auto", "low", "high"):
            raise _fail(
                f"Invalid '{param}.detail': expected auto, low or high, got {detail!r}.",
                f"{param}.detail",
            )
        image["detail"] = detail
    return Media("input_image", {"type": "image_url", "image_url": image}, param)


def _file(part: Json, param: str) -> Media:
    _no_file_id(part, param, "file's data as file_data")
    if part.get("file_url") is not None:
        raise _fail(
            f"Invalid '{param}.file_url': chat-completions engines take no file URL; send the "
            "file's data as file_data.",
            f"{param}.file_url",
            "unsupported_value",
        )
    file: dict[str, Any] = {"file_data": _required(part, "file_data", param)}
    if isinstance(part.get("filename"), str):
        file["filename"] = part["filename"]
    return Media("input_file", {"type": "file", "file": file}, param)


def _audio(part: Json, param: str) -> Media:
    audio = part.get("input_audio")
    if not isinstance(audio, dict):
        raise _fail(
            f"Missing required parameter: '{param}.input_audio'.",
            f"{param}.input_audio",
            "missing_required_parameter",
        )
    data, form = audio.get("data"), audio.get("format")
    if not isinstance(data, str) or not data or not isinstance(form, str) or not form:
        raise _fail(
            f"Invalid '{param}.input_audio': expected its data (base64) and its format.",
            f"{param}.input_audio",
        )
    return Media(
        "input_audio", {"type": "input_audio", "input_audio": {"data": data, "format": form}}, param
    )


_MEDIA: dict[str, Callable[[Json, str], Media]] = {
    "input_image": _image,
    "input_file": _file,
    "input_audio": _audio,
}


def check_media(messages: Sequence[ChatMessage], modalities: Sequence[str], model: str) -> None:
    """400 naming the first image, file or audio part the model does not take."""
    for message in messages:
        for part in message.parts:
            if isinstance(part, Media) and part.modality not in modalities:
                takes = "text only" if tuple(modalities) == ("text",) else ", ".join(modalities)
                raise _fail(
                    f"Invalid '{part.param}': the model {model[:200]!r} takes {takes}; "
                    f"'{part.kind}' is not supported.",
                    part.param,
                    "unsupported_content",
                )


def _text_field(obj: Json, key: str, param: str) -> str:
    value = obj.get(key)
    if not isinstance(value, str):
        raise _fail(f"Invalid '{param}.{key}': expected a string.", f"{param}.{key}")
    return value


def _call_id(obj: Json, param: str) -> str | None:
    """A call's or an output's `call_id`: a string where given (it keys the pairing of calls
    and outputs)."""
    value = obj.get("call_id")
    if value is not None and not isinstance(value, str):
        raise _fail(f"Invalid '{param}.call_id': expected a string.", f"{param}.call_id")
    return value


def _arguments(text: str) -> Any:
    try:
        return json.loads(text) if text.strip() else {}
    except json.JSONDecodeError:
        return text  # templates get what the model wrote; never fail a replay on it


def _call(call_id: Any, name: str, arguments: Any) -> ChatMessage:
    call = {"type": "function", "id": call_id, "function": {"name": name, "arguments": arguments}}
    return ChatMessage(role="assistant", content="", tool_calls=(call,))


# ---- one item each ------------------------------------------------------------------------------


def _message(item: Json, param: str, ctx: Context) -> list[ChatMessage]:
    role = item.get("role")
    if role not in _ROLES:
        raise _fail(
            f"Invalid '{param}.role': expected one of {', '.join(_ROLES)}, got {role!r}.",
            f"{param}.role",
        )
    if "content" not in item:
        raise _fail(
            f"Missing required parameter: '{param}.content'.",
            f"{param}.content",
            "missing_required_parameter",
        )
    text, parts = content_parts(item["content"], f"{param}.content")
    role = "system" if role == "developer" else role
    return [ChatMessage(role=role, content=text, parts=parts)]


def _function_call(item: Json, param: str, ctx: Context) -> list[ChatMessage]:
    name = _text_field(item, "name", param)
    arguments = _arguments(_text_field(item, "arguments", param))
    return [_call(_call_id(item, param), name, arguments)]


def _custom_tool_call(item: Json, param: str, ctx: Context) -> list[ChatMessage]:
    name = _text_field(item, "name", param)
    return [_call(_call_id(item, param), name, {"input": _text_field(item, "input", param)})]


def _tool_search_call(item: Json, param: str, ctx: Context) -> list[ChatMessage]:
    arguments = item.get("arguments", {})
    if not isinstance(arguments, dict):
        raise _fail(f"Invalid '{param}.arguments': expected an object.", f"{param}.arguments")
    return [_call(_call_id(item, param), TOOL_SEARCH, arguments)]


def _tool_search_output(item: Json, param: str, ctx: Context) -> list[ChatMessage]:
    """What a tool search loaded, as its result: the names of the tools now offered."""
    tools = item.get("tools")
    if not isinstance(tools, list):
        raise _fail(f"Invalid '{param}.tools': expected an array of tools.", f"{param}.tools")
    names = [t.model_name for t in parse_tools(tools, f"{param}.tools", unique=False)] + [
        mcp_tool_name(str(t.get("server_label")), str(name))
        for t in tools
        if t.get("type") == "mcp"
        for name in t.get("allowed_tools") or ()
    ]
    text = f"Tools loaded: {', '.join(names)}." if names else "No tools were found."
    return [ChatMessage(role="tool", content=text, tool_call_id=_call_id(item, param))]


def _object(item: Json, key: str, param: str) -> Json:
    value = item.get(key)
    if not isinstance(value, dict):
        raise _fail(f"Invalid '{param}.{key}': expected an object.", f"{param}.{key}")
    return value


def _strings(obj: Json, key: str, param: str) -> list[str]:
    value = obj.get(key)
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise _fail(f"Invalid '{param}.{key}': expected an array of strings.", f"{param}.{key}")
    return value


def _shell_call(item: Json, param: str, ctx: Context) -> list[ChatMessage]:
    commands = _strings(_object(item, "action", param), "commands", f"{param}.action")
    return [_call(_call_id(item, param), "shell", {"commands": commands})]


def _local_shell_call(item: Json, param: str, ctx: Context) -> list[ChatMessage]:
    command = _strings(_object(item, "action", param), "command", f"{param}.action")
    return [_call(_call_id(item, param), "local_shell", {"command": command})]


def _apply_patch_call(item: Json, param: str, ctx: Context) -> list[ChatMessage]:
    operation = _object(item, "operation", param)
    kind = operation.get("type")
    if kind not in ("create_file", "update_file", "delete_file"):
        raise _fail(
            f"Invalid '{param}.operation.type': expected create_file, update_file or delete_file.",
            f"{param}.operation.type",
        )
    path = _text_field(operation, "path", f"{param}.operation")
    diff = "" if kind == "delete_file" else _text_field(operation, "diff", f"{param}.operation")
    arguments = {"operation": kind, "path": path, "diff": diff}
    return [_call(_call_id(item, param), "apply_patch", arguments)]


def _shell_output(item: Json, param: str, ctx: Context) -> list[ChatMessage]:
    """Each command's output as the model reads it: stdout, stderr, how it ended."""
    outputs = item.get("output")
    if not isinstance(outputs, list) or not all(isinstance(o, dict) for o in outputs):
        raise _fail(f"Invalid '{param}.output': expected an array of outputs.", f"{param}.output")
    texts = []
    for i, output in enumerate(outputs):
        where = f"{param}.output[{i}]"
        stdout, stderr = _text_field(output, "stdout", where), _text_field(output, "stderr", where)
        outcome = output.get("outcome") if isinstance(output.get("outcome"), dict) else {}
        ended = (
            "timed out"
            if outcome.get("type") == "timeout"
            else f"exit code {outcome.get('exit_code')}"
        )
        texts.append(
            "\n".join(t for t in (stdout, f"stderr:\n{stderr}" if stderr else "", ended) if t)
        )
    return [
        ChatMessage(role="tool", content="\n\n".join(texts), tool_call_id=_call_id(item, param))
    ]


def _local_shell_output(item: Json, param: str, ctx: Context) -> list[ChatMessage]:
    """Its `id` is the call's `call_id`, as the API defines it."""
    text = _text_field(item, "output", param)
    return [ChatMessage(role="tool", content=text, tool_call_id=str(item.get("id")))]


def _apply_patch_output(item: Json, param: str, ctx: Context) -> list[ChatMessage]:
    status = item.get("status")
    if status not in ("completed", "failed"):
        raise _fail(f"Invalid '{param}.status': expected completed or failed.", f"{param}.status")
    output = item.get("output")
    said = output if isinstance(output, str) and output else "done"
    text = (
        f"The patch was applied: {said}" if status == "completed" else f"The patch failed: {said}"
    )
    return [ChatMessage(role="tool", content=text, tool_call_id=_call_id(item, param))]


def _additional_tools(item: Json, param: str, ctx: Context) -> list[ChatMessage]:
    """Tools a developer adds at this point: offered from here on, saying nothing else."""
    if item.get("role", "developer") != "developer":
        raise _fail(f"Invalid '{param}.role': only 'developer' adds tools.", f"{param}.role")
    tools = item.get("tools")
    if not isinstance(tools, list):
        raise _fail(f"Invalid '{param}.tools': expected an array of tools.", f"{param}.tools")
    parse_tools(tools, f"{param}.tools", unique=False)
    return []


def _tool_output(item: Json, param: str, ctx: Context) -> list[ChatMessage]:
    output = item.get("output")
    text = output if isinstance(output, str) else content_text(output, f"{param}.output")
    return [ChatMessage(role="tool", content=text, tool_call_id=_call_id(item, param))]


def _mcp_fields(item: Json, param: str, *keys: str) -> list[str]:
    return [_text_field(item, key, param) for key in keys]


def _mcp_call(item: Json, param: str, ctx: Context) -> list[ChatMessage]:
    label, name, arguments = _mcp_fields(item, param, "server_label", "name", "arguments")
    output, error = item.get("output"), item.get("error")
    if isinstance(output, str) and error is None:
        result = output
    elif error is not None:
        result = f"Error: {error_text(error)}"
    else:
        result = "The call did not finish."
    return _call_and_result(item, label, name, arguments, result)


_WEB_ACTIONS = {  # a web search's action → the function the model called, and its arguments
    "search": ("web_search", ("query",)),
    "open_page": ("open_page", ("url",)),
    "find_in_page": ("find_in_page", ("url", "pattern")),
}


def _web_search_call(item: Json, param: str, ctx: Context) -> list[ChatMessage]:
    """A web search as the model sees it: the function it called, then what it read (within
    the response that ran it; later, the sources it found, if the item shows them). One sent
    back without its action says nothing."""
    action = item.get("action")
    if action is None:
        return []
    kind = action.get("type") if isinstance(action, dict) else None
    if not isinstance(kind, str) or kind not in _WEB_ACTIONS:  # a list or object is no kind
        raise _fail(
            f"Invalid '{param}.action': expected a search, open_page or find_in_page action.",
            f"{param}.action",
        )
    name, keys = _WEB_ACTIONS[action["type"]]
    queries = action.get("queries")
    if action["type"] == "search" and not action.get("query") and isinstance(queries, list):
        action = {**action, "query": " ".join(str(q) for q in queries)}
    arguments = json.dumps({key: str(action.get(key) or "") for key in keys})
    listed = action.get("sources") or []
    if not isinstance(listed, list):
        raise _fail(
            f"Invalid '{param}.action.sources': expected an array.", f"{param}.action.sources"
        )
    result = ctx.read.get(str(item.get("id")))
    if result is None:
        sources = [s.get("url") for s in listed if isinstance(s, dict)]
        if item.get("status") == "failed":
            result = "The search failed."
        elif sources:
            result = "Results (their text is not kept):\n" + "\n".join(map(str, sources))
        else:
            result = "What it read is not kept."
    call_id = item.get("id")
    return [
        _call(call_id, name, arguments),
        ChatMessage(role="tool", content=result, tool_call_id=call_id),
    ]


def _file_search_call(item: Json, param: str, ctx: Context) -> list[ChatMessage]:
    """A file search as the model sees it: the function it called, then what it read (within
    the response that ran it; later, the results the item shows, if it was asked to)."""
    queries = item.get("queries")
    if not isinstance(queries, list):
        raise _fail(f"Invalid '{param}.queries': expected an array.", f"{param}.queries")
    result = ctx.read.get(str(item.get("id")))
    if result is None:
        results = item.get("results")
        if item.get("status") == "failed":
            result = "The search failed."
        elif isinstance(results, list) and results:
            found = [r for r in results if isinstance(r, dict)]
            result = "\n\n".join(f"{r.get('filename')}\n{r.get('text')}" for r in found)
        else:
            result = "What it found is not kept."
    call_id = item.get("id")
    return [
        _call(call_id, "file_search", json.dumps({"queries": [str(q) for q in queries]})),
        ChatMessage(role="tool", content=result, tool_call_id=call_id),
    ]


def _call_and_result(
    item: Json, label: str, name: str, arguments: str, result: str
) -> list[ChatMessage]:
    """An MCP item as the model sees it: its call (by the tool's model name), then `result`."""
    call_id = item.get("id")
    return [
        _call(call_id, mcp_tool_name(label, name), _arguments(arguments)),
        ChatMessage(role="tool", content=result, tool_call_id=call_id),
    ]


def error_text(error: Any) -> str:
    """An `mcp_call`'s error as the model reads it."""
    if isinstance(error, str):
        return error
    if not isinstance(error, dict):
        return json.dumps(error)
    if isinstance(error.get("message"), str):
        return str(error["message"])
    content = error.get("content")
    if isinstance(content, list):
        texts = [str(b.get("text")) for b in content if isinstance(b, dict) and "text" in b]
        if texts:
            return "\n".join(texts)
    return json.dumps(error)


def _mcp_check(*keys: str) -> Callable[[Json, str, Context], list[ChatMessage]]:
    """An MCP item that says nothing to the model by itself: checked, not rendered."""

    def check(item: Json, param: str, ctx: Context) -> list[ChatMessage]:
        _mcp_fields(item, param, *keys)
        return []

    return check


def _mcp_list_tools(item: Json, param: str, ctx: Context) -> list[ChatMessage]:
    _text_field(item, "server_label", param)
    tools = item.get("tools")
    if not isinstance(tools, list) or not all(
        isinstance(t, dict) and isinstance(t.get("name"), str) for t in tools
    ):
        raise _fail(f"Invalid '{param}.tools': expected a list of tools.", f"{param}.tools")
    return []


def _approval_response(item: Json, param: str, ctx: Context) -> list[ChatMessage]:
    if not is_id(item.get("approval_request_id")):
        raise _fail(
            f"Invalid '{param}.approval_request_id': expected an id.",
            f"{param}.approval_request_id",
        )
    if not isinstance(item.get("approve"), bool):
        raise _fail(f"Invalid '{param}.approve': expected a boolean.", f"{param}.approve")
    reason = item.get("reason")
    if reason is not None and not isinstance(reason, str):
        raise _fail(f"Invalid '{param}.reason': expected a string.", f"{param}.reason")
    return []


def _declined(request: Json, response: Json, ctx: Context) -> list[ChatMessage]:
    """A call the user declined: the model sees it made the call, and the refusal."""
    reason = response.get("reason")
    text = DECLINED + (f" Their reason: {reason}" if reason else "")
    label, name = str(request.get("server_label")), str(request.get("name"))
    return _call_and_result(request, label, name, str(request.get("arguments", "")), text)


_ITEM_HANDLERS: dict[str, Callable[[Json, str, Context], list[ChatMessage]]] = {
    "message": _message,
    "function_call": _function_call,
    "function_call_output": _tool_output,
    "custom_tool_call": _custom_tool_call,
    "custom_tool_call_output": _tool_output,
    "tool_search_call": _tool_search_call,
    "tool_search_output": _tool_search_output,
    "additional_tools": _additional_tools,
    "configuration_update": lambda item, param, ctx: [],  # settings: `oars.turn` applies them
    "shell_call": _shell_call,
    "shell_call_output": _shell_output,
    "local_shell_call": _local_shell_call,
    "local_shell_call_output": _local_shell_output,
    "apply_patch_call": _apply_patch_call,
    "apply_patch_call_output": _apply_patch_output,
    "mcp_call": _mcp_call,
    "web_search_call": _web_search_call,
    "file_search_call": _file_search_call,
    "mcp_list_tools": _mcp_list_tools,
    "mcp_approval_request": _mcp_check("server_label", "name", "arguments"),
    "mcp_approval_response": _approval_response,
}


# ---- the list -----------------------------------------------------------------------------------


def _items(raw: Sequence[Json], ctx: Context) -> list[ChatMessage]:
    placement = place(raw, _compactions(raw, ctx))
    requests: dict[str, Json] = {}
    messages: list[ChatMessage] = []
    reasoning = ""  # goes with the next assistant turn
    for i, item in enumerate(raw):
        if i in placement.hidden:
            continue
        param, kind = ctx.params(i), item.get("type", "message")
        found: list[ChatMessage] = []
        handler = _ITEM_HANDLERS.get(kind)
        if handler is not None:
            found = handler(item, param, ctx)
        elif kind == "item_reference" and not is_id(item.get("id")):
            raise _fail(f"Invalid '{param}.id': expected an item id.", f"{param}.id")
        elif kind == "reasoning":
            reasoning += _reasoning_text(item, param, ctx.unseal)
        if kind == "mcp_approval_request":
            requests[str(item.get("id"))] = item
        elif kind == "mcp_approval_response" and item.get("approve") is False:
            request = requests.get(str(item["approval_request_id"]))
            found = _declined(request, item, ctx) if request is not None else []
        for message in found:
            if reasoning and message.role == "assistant":
                message, reasoning = replace(message, reasoning=reasoning), ""
            messages.append(message)
    if placement.summaries:  # what came before all that is left: first, after the instructions
        summaries = [placement.summaries[i] for i in sorted(placement.summaries)]
        at = next((i for i, m in enumerate(messages) if m.role != "system"), len(messages))
        messages.insert(at, ChatMessage("user", SUMMARY_PREFIX + "\n\n".join(summaries)))
    return _merge_calls(messages)


def _compactions(raw: Sequence[Json], ctx: Context) -> dict[int, Sealed]:
    """The compaction items' contents by position; 400 for one not sealed by this server."""
    opened: dict[int, Sealed] = {}
    for i, item in enumerate(raw):
        if item.get("type") in COMPACTION_TYPES:
            try:
                opened[i] = Sealed.open(item.get("encrypted_content"), ctx.unseal)
            except ValueError as exc:
                param = f"{ctx.params(i)}.encrypted_content"
                raise _fail(
                    f"Invalid '{param}': it is not a compaction made by this server, or it was "
                    "altered.",
                    param,
                    "invalid_encrypted_content",
                ) from exc
    return opened


def _reasoning_text(item: Json, param: str, unseal: Unseal | None) -> str:
    """A reasoning item's text: its `encrypted_content` (which must be ours and intact), or
    its `reasoning_text` parts."""
    sealed = item.get("encrypted_content")
    if isinstance(sealed, str) and sealed and unseal is not None:
        try:
            return unseal(sealed)
        except ValueError as exc:
            raise _fail(
                f"Invalid '{param}.encrypted_content': it was not made by this server or was "
                "altered.",
                f"{param}.encrypted_content",
                "invalid_encrypted_content",
            ) from exc
    content = item.get("content")
    parts = content if isinstance(content, list) else []
    return "".join(
        p["text"]
        for p in parts
        if isinstance(p, dict)
        and p.get("type") == "reasoning_text"
        and isinstance(p.get("text"), str)
    )


def _merge_calls(messages: list[ChatMessage]) -> list[ChatMessage]:
    """Consecutive calls of one assistant turn become one message with several tool_calls."""
    out: list[ChatMessage] = []
    for msg in messages:
        prev = out[-1] if out else None
        if msg.tool_calls and prev is not None and prev.role == "assistant" and prev.tool_calls:
            out[-1] = ChatMessage("assistant", prev.content, prev.tool_calls + msg.tool_calls)
        elif msg.tool_calls and prev is not None and prev.role == "assistant" and not prev.content:
            out[-1] = ChatMessage("assistant", prev.content, msg.tool_calls)
        else:
            out.append(msg)
    return out


def _with_system(messages: list[ChatMessage], instructions: str | None) -> list[ChatMessage]:
    """Leading system/developer messages and `instructions` become one system message."""
    head: list[str] = [instructions] if instructions else []
    rest = list(messages)
    while rest and rest[0].role == "system" and not rest[0].parts:  # one with media stays itself
        head.append(rest.pop(0).content)
    return ([ChatMessage("system", "\n\n".join(head))] if head else []) + rest
