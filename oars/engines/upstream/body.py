"""A request to an upstream: the engine request as a chat-completions body. Pure: no I/O.

Responses' intent (messages with their parts and calls, sampling, logprobs, the tools the model
may call now, the output format) maps onto the fields vLLM, SGLang, llama.cpp's server, Ollama
and TGI take.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from oars.generation import ChatMessage, EngineRequest


def chat_body(
    request: EngineRequest, model: str, *, schema_in_json_object: bool = False
) -> dict[str, Any]:
    s = request.sampling
    body: dict[str, Any] = {
        "model": model,
        "messages": [_chat_message(m) for m in request.messages],
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": s.temperature,
    }
    optional = {
        "top_p": s.top_p if s.top_p != 1.0 else None,
        "seed": s.seed,
        "stop": list(s.stop) or None,
        "max_tokens": s.max_output_tokens,
        "top_k": s.top_k or None,
        "repetition_penalty": s.repetition_penalty if s.repetition_penalty != 1.0 else None,
        "reasoning_effort": _EFFORTS.get(request.reasoning_effort or "", request.reasoning_effort),
    }
    body.update({k: v for k, v in optional.items() if v is not None})
    if request.top_logprobs is not None:
        body.update(logprobs=True, top_logprobs=request.top_logprobs)
    body.update(_tools(request))
    if request.output is not None:
        body["response_format"] = _response_format(request, schema_in_json_object)
    return body


# Efforts beyond OpenAI's chat values, as the nearest one engines take.
_EFFORTS = {"xhigh": "high", "max": "high"}


def _chat_message(message: ChatMessage) -> dict[str, Any]:
    content: Any = message.content
    if message.parts:
        content = [
            {"type": "text", "text": p} if isinstance(p, str) else dict(p.part)
            for p in message.parts
            if p != ""
        ]
    out: dict[str, Any] = {"role": message.role, "content": content}
    if message.tool_calls:
        out["tool_calls"] = [_chat_call(c, i) for i, c in enumerate(message.tool_calls)]
    if message.tool_call_id is not None:
        out["tool_call_id"] = message.tool_call_id
    return out


def _chat_call(call: Mapping[str, Any], i: int) -> dict[str, Any]:
    function = call.get("function") or {}
    arguments = function.get("arguments", {})
    text = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {
        "id": call.get("id") or f"call_{i}",
        "type": "function",
        "function": {"name": function.get("name", ""), "arguments": text},
    }


def _tools(request: EngineRequest) -> dict[str, Any]:
    """The tools the model may call now (namespaces flattened, custom tools as functions of
    one string), `tool_choice` and `parallel_tool_calls`."""
    tools = request.tools
    if tools.mode == "none" or not tools.callable:
        return {}
    choice: Any = tools.mode
    if tools.mode == "required" and len(tools.callable) == 1:
        choice = {"type": "function", "function": {"name": tools.callable[0].model_name}}
    return {
        "tools": [t.to_template() for t in tools.callable],
        "tool_choice": choice,
        "parallel_tool_calls": request.parallel_tool_calls,
    }


def _response_format(request: EngineRequest, schema_in_json_object: bool) -> dict[str, Any]:
    output = request.output
    assert output is not None
    if output.kind == "json_object":
        return {"type": "json_object"}
    if schema_in_json_object:
        return {"type": "json_object", "schema": dict(output.schema)}
    schema: dict[str, Any] = {"name": output.name, "schema": dict(output.schema)}
    if output.strict is not None:
        schema["strict"] = output.strict
    return {"type": "json_schema", "json_schema": schema}
