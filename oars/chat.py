"""Chat Completions as a front door to the Responses path, both ways, as plain values.

`translate(body)` turns a `POST /v1/chat/completions` body into a Responses body (messages →
input items, `tools`, `tool_choice`, `response_format` → `text.format`, `max_completion_tokens`
→ `max_output_tokens`), which the server then validates and runs as any other response: one
generation path, one set of parsers, grammars and limits. What the one state machine makes comes
back as chat's wire forms: its events as `chat.completion.chunk`s (`ChunkStream`), its final
response as a `chat.completion` (`completion`). Chat is stateless, as OpenAI's is: `store` is
accepted and ignored, and nothing is kept.

An error the Responses path finds names a Responses parameter; `Translation.rename` gives it
the chat parameter it came from, so a chat client reads its own names (`messages[2]`, not
`input[3]`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from oars.translation import Json, Role, Translation, ending, message_items
from oars.translation import fail as _fail
from oars.translation import typed as _typed

# Fields passed to the Responses path under the same name (it validates them).
_SAME = frozenset(
    {"model", "temperature", "top_p", "seed", "stop", "parallel_tool_calls", "user"}
    | {"safety_identifier", "prompt_cache_key", "service_tier"}
)
# Fields read here: mapped, checked, or accepted and ignored (`store` and `metadata` are about
# keeping the completion, and chat keeps nothing).
_READ = frozenset(
    {"messages", "stream", "stream_options", "n", "tools", "tool_choice", "response_format"}
    | {"max_completion_tokens", "max_tokens", "reasoning_effort", "verbosity", "logprobs"}
    | {"top_logprobs", "modalities", "frequency_penalty", "presence_penalty", "store"}
    | {"metadata"}
)
# Fields of OpenAI's chat API this server does not serve (a 400 naming them).
_REFUSED = {
    "audio": "audio output",
    "functions": "the deprecated 'functions' (use 'tools')",
    "function_call": "the deprecated 'function_call' (use 'tool_choice')",
    "logit_bias": "'logit_bias'",
    "prediction": "predicted outputs",
    "web_search_options": "web search",
}


@dataclass(frozen=True)
class ChatTranslation(Translation):
    """A chat request as the Responses path takes it, and what only chat's answer needs."""

    include_usage: bool = False

    @property
    def logprobs(self) -> bool:
        return "include" in self.body


# ---- the request ------------------------------------------------------------------------------


def translate(body: Any) -> ChatTranslation:
    """A chat body → a Responses body; 400 naming the chat parameter at fault."""
    if not isinstance(body, dict):
        raise _fail("The request body must be a JSON object.", "body", "invalid_type")
    for key in body:
        if key in _REFUSED:
            raise _fail(f"This server does not support {_REFUSED[key]}.", key, "unsupported")
        if key not in _SAME and key not in _READ:
            raise _fail(f"Unrecognized request argument supplied: {key}", key, "unknown_parameter")
    _check_unsupported(body)
    items, sources = message_items(body.get("messages"), _ROLES)
    out: Json = {k: v for k, v in body.items() if k in _SAME and v is not None}
    out |= {"input": items, "store": False, "stream": _stream(body)}
    out |= _tools(body) | _format(body) | _reasoning(body) | _logprobs(body)
    renames = [(f"input[{k}]", f"messages[{i}]") for k, i in enumerate(sources)]
    renames += [("input", "messages"), ("tool_choice.name", "tool_choice.function.name")]
    renames += [(f"tools[{i}]", f"tools[{i}].function") for i in range(len(out.get("tools", [])))]
    renames += [("text.format.type", "response_format.type")]
    renames += [("text.format", "response_format.json_schema"), ("text.verbosity", "verbosity")]
    tokens = next((k for k in ("max_completion_tokens", "max_tokens") if k in body), None)
    if tokens is not None and body[tokens] is not None:
        out["max_output_tokens"] = body[tokens]
        renames.append(("max_output_tokens", tokens))
    return ChatTranslation(out, tuple(renames), _include_usage(body))


def _check_unsupported(body: Mapping[str, Any]) -> None:
    """`n` other than 1, penalties other than 0, output other than text: a 400 naming them."""
    n = body.get("n")
    if n is not None and _typed(n, int, "n", "an integer") != 1:
        raise _fail("Invalid 'n': this server makes one choice per request (n=1).", "n")
    for key in ("frequency_penalty", "presence_penalty"):
        value = body.get(key)
        if value is not None and _typed(value, (int, float), key, "a number") != 0:
            raise _fail(f"This server does not support '{key}' (only 0).", key, "unsupported")
    modalities = body.get("modalities")
    if modalities is not None and modalities != ["text"]:
        raise _fail("Invalid 'modalities': this server answers text only.", "modalities")


def _stream(body: Mapping[str, Any]) -> bool:
    stream = body.get("stream")
    return bool(stream is not None and _typed(stream, bool, "stream", "a boolean"))


def _include_usage(body: Mapping[str, Any]) -> bool:
    options = body.get("stream_options")
    if options is None:
        return False
    _typed(options, dict, "stream_options", "an object")
    if not _stream(body):
        raise _fail("'stream_options' is only allowed when 'stream' is true.", "stream_options")
    usage = options.get("include_usage")
    param = "stream_options.include_usage"
    return bool(usage is not None and _typed(usage, bool, param, "a boolean"))


def _tools(body: Mapping[str, Any]) -> Json:
    out: Json = {}
    tools = body.get("tools")
    if tools is not None:
        out["tools"] = [_tool(t, f"tools[{i}]") for i, t in enumerate(_list(tools, "tools"))]
    choice = body.get("tool_choice")
    if isinstance(choice, dict):
        function = choice.get("function")
        if choice.get("type") != "function" or not isinstance(function, dict):
            raise _fail(
                "Invalid 'tool_choice': expected 'auto', 'none', 'required' or "
                '{"type": "function", "function": {"name": …}}.',
                "tool_choice",
            )
        choice = {"type": "function", "name": function.get("name")}
    if choice is not None:
        out["tool_choice"] = choice
    return out


def _tool(tool: Any, param: str) -> Json:
    _typed(tool, dict, param, "an object")
    if tool.get("type") != "function":
        raise _fail(
            f"Invalid '{param}.type': {tool.get('type')!r}; this server takes 'function' tools.",
            f"{param}.type",
        )
    function = _typed(tool.get("function"), dict, f"{param}.function", "an object")
    keys = ("name", "description", "parameters", "strict")
    return {"type": "function", **{k: function[k] for k in keys if function.get(k) is not None}}


def _format(body: Mapping[str, Any]) -> Json:
    text: Json = {}
    verbosity = body.get("verbosity")
    if verbosity is not None:
        text["verbosity"] = verbosity
    fmt = body.get("response_format")
    if fmt is not None:
        _typed(fmt, dict, "response_format", "an object")
        if fmt.get("type") == "json_schema":
            schema = _typed(
                fmt.get("json_schema"), dict, "response_format.json_schema", "an object"
            )
            text["format"] = {"type": "json_schema", **schema}
        else:
            text["format"] = {"type": fmt.get("type")}
    return {"text": text} if text else {}


def _reasoning(body: Mapping[str, Any]) -> Json:
    effort = body.get("reasoning_effort")
    return {"reasoning": {"effort": effort}} if effort is not None else {}


def _logprobs(body: Mapping[str, Any]) -> Json:
    """`logprobs` → the output text's logprobs, with `top_logprobs` alternatives each."""
    asked = body.get("logprobs")
    top = body.get("top_logprobs")
    if not (asked is not None and _typed(asked, bool, "logprobs", "a boolean")):
        if top is not None:
            raise _fail("'top_logprobs' needs 'logprobs' to be true.", "top_logprobs")
        return {}
    return {"include": ["message.output_text.logprobs"], "top_logprobs": 0 if top is None else top}


def _list(value: Any, param: str) -> list[Any]:
    return list(_typed(value, list, param, "an array"))


# ---- messages → items -------------------------------------------------------------------------


def _user(message: Json, param: str) -> list[Json]:
    parts = _parts(message.get("content"), f"{param}.content", images=True)
    return [{"type": "message", "role": message["role"], "content": parts}]


def _system(message: Json, param: str) -> list[Json]:
    parts = _parts(message.get("content"), f"{param}.content", images=False)
    return [{"type": "message", "role": message["role"], "content": parts}]


def _assistant(message: Json, param: str) -> list[Json]:
    content, calls = message.get("content"), message.get("tool_calls")
    items: list[Json] = []
    if content is not None and content != "":
        texts = _parts(content, f"{param}.content", images=False, refusal=True)
        parts = [{"type": "output_text", "text": p["text"], "annotations": []} for p in texts]
        items.append({"type": "message", "role": "assistant", "content": parts})
    for j, call in enumerate(_list(calls, f"{param}.tool_calls") if calls is not None else []):
        items.append(_call(call, f"{param}.tool_calls[{j}]"))
    if not items:
        raise _fail(
            f"Invalid '{param}': an assistant message needs 'content' or 'tool_calls'.", param
        )
    return items


def _call(call: Any, param: str) -> Json:
    _typed(call, dict, param, "an object")
    call_id = _typed(call.get("id"), str, f"{param}.id", "a string")
    function = _typed(call.get("function"), dict, f"{param}.function", "an object")
    name = _typed(function.get("name"), str, f"{param}.function.name", "a string")
    arguments = _typed(function.get("arguments"), str, f"{param}.function.arguments", "a string")
    return {"type": "function_call", "call_id": call_id, "name": name, "arguments": arguments}


def _tool_result(message: Json, param: str) -> list[Json]:
    call_id = message.get("tool_call_id")
    if call_id is None:
        raise _fail(
            f"Missing required parameter: '{param}.tool_call_id'.",
            f"{param}.tool_call_id",
            "missing_required_parameter",
        )
    _typed(call_id, str, f"{param}.tool_call_id", "a string")
    parts = _parts(message.get("content"), f"{param}.content", images=False)
    output = "".join(p["text"] for p in parts)
    return [{"type": "function_call_output", "call_id": call_id, "output": output}]


_ROLES: dict[str, Role] = {
    "system": _system,
    "developer": _system,
    "user": _user,
    "assistant": _assistant,
    "tool": _tool_result,
}


def _parts(content: Any, param: str, *, images: bool, refusal: bool = False) -> list[Json]:
    """Content (a string, or text and image parts) as Responses input parts."""
    if isinstance(content, str):
        return [{"type": "input_text", "text": content}]
    parts: list[Json] = []
    for j, part in enumerate(_list(content, param)):
        where = f"{param}[{j}]"
        kind = _typed(part, dict, where, "an object").get("type")
        if kind == "text" or (refusal and kind == "refusal"):
            text = _typed(part.get(kind), str, f"{where}.{kind}", "a string")
            parts.append({"type": "input_text", "text": text})
        elif kind == "image_url" and images:
            image = _typed(part.get("image_url"), dict, f"{where}.image_url", "an object")
            url = _typed(image.get("url"), str, f"{where}.image_url.url", "a string")
            parts.append({"type": "input_image", "image_url": url, "detail": "auto"})
        else:
            raise _fail(f"Invalid '{where}.type': {kind!r} is not served here.", f"{where}.type")
    return parts


# ---- the answer -------------------------------------------------------------------------------


def completion_id(response_id: str) -> str:
    """The completion's id: its response's, in chat's form (one id in logs and metrics)."""
    return "chatcmpl-" + response_id.removeprefix("resp_")


def finish_reason(response: Mapping[str, Any]) -> str:
    """Why the generation ended, in chat's words."""
    return _FINISH_REASONS[ending(response)]


_FINISH_REASONS = {
    "length": "length",
    "filtered": "content_filter",
    "calls": "tool_calls",
    "done": "stop",
}


def usage(wire: Mapping[str, Any]) -> Json:
    """A Responses usage in chat's form."""
    return {
        "prompt_tokens": wire["input_tokens"],
        "completion_tokens": wire["output_tokens"],
        "total_tokens": wire["total_tokens"],
        "prompt_tokens_details": {"cached_tokens": wire["input_tokens_details"]["cached_tokens"]},
        "completion_tokens_details": {
            "reasoning_tokens": wire["output_tokens_details"]["reasoning_tokens"]
        },
    }


def completion(response: Mapping[str, Any], *, logprobs: bool = False) -> Json:
    """A final response as a `chat.completion`: its text, reasoning and calls in one message
    (with `logprobs`, its text's logprobs)."""
    texts: list[str] = []
    reasoning: list[str] = []
    calls: list[Json] = []
    tokens: list[Json] = []
    for item in response["output"]:
        if item["type"] == "message":
            texts += [p.get("text", "") for p in item["content"]]
            tokens += [lp for p in item["content"] for lp in p.get("logprobs") or []]
        elif item["type"] == "reasoning":
            reasoning += [p["text"] for p in item.get("content") or []]
        elif item["type"] == "function_call":
            calls.append(_call_wire(item["call_id"], item["name"], item["arguments"]))
    message: Json = {"role": "assistant", "content": "".join(texts) if texts else None}
    message |= {"refusal": None, "tool_calls": calls or None}
    if reasoning:
        message["reasoning_content"] = "".join(reasoning)
    choice = {"index": 0, "message": message, "finish_reason": finish_reason(response)}
    choice["logprobs"] = {"content": tokens, "refusal": None} if logprobs else None
    return {
        "id": completion_id(response["id"]),
        "object": "chat.completion",
        "created": response["created_at"],
        "model": response["model"],
        "choices": [choice],
        "usage": usage(response["usage"]) if response.get("usage") else None,
        "system_fingerprint": None,
    }


def _call_wire(call_id: str, name: str, arguments: str) -> Json:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


@dataclass
class ChunkStream:
    """A response's events → `chat.completion.chunk`s (`feed` per event). The first chunk
    carries the role; text, reasoning (`reasoning_content`) and each call (its id and name
    first, then its arguments) follow as the events come; the terminal event gives the chunk
    with `finish_reason`, then, with `include_usage`, one with `usage` and no choices. A failed
    response becomes one `{"error": …}` chunk, as OpenAI sends an error inside a stream."""

    include_usage: bool = False
    logprobs: bool = False
    _head: Json = field(default_factory=dict)
    _calls: int = 0

    def feed(self, event: Mapping[str, Any]) -> list[Json]:
        handler = _CHUNKS.get(event["type"])
        return handler(self, event) if handler is not None else []

    def _chunk(self, delta: Json, finish: str | None = None, logprobs: Any = None) -> Json:
        choice: Json = {"index": 0, "delta": delta, "finish_reason": finish}
        if self.logprobs:
            choice["logprobs"] = {"content": logprobs or [], "refusal": None}
        chunk = {**self._head, "choices": [choice]}
        return chunk | {"usage": None} if self.include_usage else chunk

    def _created(self, event: Mapping[str, Any]) -> list[Json]:
        response = event["response"]
        self._head = {
            "id": completion_id(response["id"]),
            "object": "chat.completion.chunk",
            "created": response["created_at"],
            "model": response["model"],
            "system_fingerprint": None,
        }
        return [self._chunk({"role": "assistant", "content": ""})]

    def _text(self, event: Mapping[str, Any]) -> list[Json]:
        return [self._chunk({"content": event["delta"]}, logprobs=event.get("logprobs"))]

    def _reasoning(self, event: Mapping[str, Any]) -> list[Json]:
        return [self._chunk({"reasoning_content": event["delta"]})]

    def _call_opened(self, event: Mapping[str, Any]) -> list[Json]:
        item = event["item"]
        if item["type"] != "function_call":
            return []
        call = {"index": self._calls, **_call_wire(item["call_id"], item["name"], "")}
        self._calls += 1
        return [self._chunk({"tool_calls": [call]})]

    def _arguments(self, event: Mapping[str, Any]) -> list[Json]:
        call = {"index": self._calls - 1, "function": {"arguments": event["delta"]}}
        return [self._chunk({"tool_calls": [call]})]

    def _ended(self, event: Mapping[str, Any]) -> list[Json]:
        response = event["response"]
        chunks = [self._chunk({}, finish_reason(response))]
        if self.include_usage and response.get("usage"):
            chunks.append({**self._head, "choices": [], "usage": usage(response["usage"])})
        return chunks

    def _failed(self, event: Mapping[str, Any]) -> list[Json]:
        error = event["response"].get("error") or {}
        message = error.get("message", "The response failed.")
        return [{"error": {"message": message, "type": "server_error", "param": None,
                           "code": error.get("code")}}]  # fmt: skip


_CHUNKS: dict[str, Callable[[ChunkStream, Mapping[str, Any]], list[Json]]] = {
    "response.created": ChunkStream._created,
    "response.output_text.delta": ChunkStream._text,
    "response.reasoning_text.delta": ChunkStream._reasoning,
    "response.output_item.added": ChunkStream._call_opened,
    "response.function_call_arguments.delta": ChunkStream._arguments,
    "response.completed": ChunkStream._ended,
    "response.incomplete": ChunkStream._ended,
    "response.failed": ChunkStream._failed,
}
