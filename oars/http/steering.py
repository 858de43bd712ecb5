"""`response.steer` on a WebSocket: what a submission may hold, and the events that answer it.

A steer names a response running on its socket and brings user input for it. Accepted, it is
queued on that response (`response.steer.accepted`); the response stops at a safe boundary and
ends `incomplete` (reason `steered`), or ends as it would have. Then:

* it ended `completed` or `incomplete` with nothing for the client to answer: an automatic
  successor continues from it with the queued input, in submission order, and the response's
  settings; the successor's `response.created` commits the input;
* it ended waiting for the client (a function, custom, shell, apply_patch or client tool
  search call it runs, an approval it gives): `response.steer.pending` follows `response.completed` with the `required_input`
  stubs, and the input is prepended to the client's continuation of it on the same lane;
* it failed or was cancelled, or the successor could not be created: `response.steer.failed`
  returns the input.

Refused at once (`response.steer.failed`, no steer id): input that is not user messages of
text, image and file parts (`invalid_input`); a response not on this socket
(`response_not_found`), one that ended (`response_already_completed`, `response_not_active`);
one bound to a conversation or compacting automatically (`steering_not_supported`); more than
`MAX_PENDING_STEERS` submissions queued on one response (`too_many_pending_steers`).

Steer events are the socket's, not a response's: their `sequence_number` counts the socket's
own events, from 0.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from openai.types.responses import ResponseSteerInput
from pydantic import TypeAdapter, ValidationError

from oars.ids import new_id

MAX_PENDING_STEERS = 8  # submissions queued on one response
_PARTS = frozenset({"input_text", "input_image", "input_file"})
_MESSAGE_FIELDS = frozenset({"type", "role", "content"})
_STEER_INPUT: TypeAdapter[Any] = TypeAdapter(ResponseSteerInput)

Event = dict[str, Any]


class SteerRefused(Exception):
    """A steer that cannot be taken: its `response.steer.failed` error code and message."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Steer:
    """One accepted submission: its id, the response it steers, its input as sent and as
    user messages."""

    id: str
    previous_response_id: str
    input: Any
    messages: tuple[Mapping[str, Any], ...]


def read_steer(message: Mapping[str, Any]) -> tuple[str, tuple[Mapping[str, Any], ...]]:
    """The target response's id and the input as user messages (`SteerRefused` with
    `invalid_input` for anything the SDK's `ResponseSteerEvent` does not allow)."""
    extra = sorted(set(message) - {"type", "previous_response_id", "input"})
    if extra:
        raise SteerRefused("invalid_input", f"A steer takes no {extra[0]!r}.")
    target = message.get("previous_response_id")
    if not isinstance(target, str) or not target:
        raise SteerRefused("invalid_input", "'previous_response_id' must name a response.")
    return target, steer_messages(message.get("input"))


def steer_messages(value: Any) -> tuple[Mapping[str, Any], ...]:
    """A steer's input as user messages: a non-empty string, or a non-empty list of them."""
    if isinstance(value, str) and value:
        return ({"type": "message", "role": "user", "content": value},)
    if not isinstance(value, list) or not value:
        raise SteerRefused("invalid_input", "'input' must be a non-empty string or list.")
    return tuple(_message(item, i) for i, item in enumerate(value))


def _message(item: Any, index: int) -> Mapping[str, Any]:
    where = f"input[{index}]"
    if not isinstance(item, dict) or item.get("type", "message") != "message":
        raise SteerRefused("invalid_input", f"{where}: a steer takes only messages.")
    if item.get("role") != "user" or not set(item) <= _MESSAGE_FIELDS:
        raise SteerRefused(
            "invalid_input", f"{where}: a steer takes only user messages of type, role, content."
        )
    content = item.get("content")
    parts_ok = isinstance(content, list) and all(
        isinstance(p, dict) and p.get("type") in _PARTS for p in content
    )
    if not (isinstance(content, str) or (parts_ok and content)):
        raise SteerRefused(
            "invalid_input", f"{where}.content: text, or input_text, input_image, input_file parts."
        )
    return {"type": "message", "role": "user", "content": content}


def new_steer(target: str, value: Any, messages: tuple[Mapping[str, Any], ...]) -> Steer:
    return Steer(new_id("steer"), target, value, messages)


def unsupported(conversation_id: str | None, compacting: bool) -> SteerRefused | None:
    """Why a response's execution mode takes no steering (None: it does)."""
    if conversation_id is not None:
        return SteerRefused(
            "steering_not_supported", "A response bound to a conversation cannot be steered."
        )
    if compacting:
        return SteerRefused(
            "steering_not_supported", "A response with automatic compaction cannot be steered."
        )
    return None


# ---- what a response leaves for the client to answer -------------------------------------

# a call the client runs → the type of the item that answers it
_ANSWERS = {
    "function_call": "function_call_output",
    "custom_tool_call": "custom_tool_call_output",
    "shell_call": "shell_call_output",
    "apply_patch_call": "apply_patch_call_output",
    "tool_search_call": "tool_search_output",
}


def required_input(output: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The stubs of what the client must answer before the response can go on: its calls to
    the client's tools, and its approval requests."""
    return [_stub(item) for item in output if _for_the_client(item)]


def _for_the_client(item: Mapping[str, Any]) -> bool:
    """A call the client runs (a tool search only where the client runs it; none cut short),
    or an approval request. A `local_shell_call` has no stub in the SDK's types."""
    if item["type"] == "mcp_approval_request":
        return True
    return (
        item["type"] in _ANSWERS
        and item.get("status", "completed") == "completed"
        and item.get("execution", "client") == "client"
    )


def _stub(item: Mapping[str, Any]) -> dict[str, Any]:
    if item["type"] == "mcp_approval_request":
        return {"type": "mcp_approval_response", "approval_request_id": item["id"]}
    stub = {"type": _ANSWERS[item["type"]], "call_id": item["call_id"]}
    if item["type"] == "function_call":
        stub["name"] = item["name"]
    if item["type"] == "tool_search_call":
        stub["execution"] = "client"
    return stub


# ---- the events --------------------------------------------------------------------------


def accepted(steer: Steer) -> Event:
    return {"type": "response.steer.accepted", "steer": _ids(steer)}


def pending(steer: Steer, required: list[dict[str, Any]]) -> Event:
    return {
        "type": "response.steer.pending",
        "reason": "waiting_for_required_input",
        "required_input": required,
        "steer": _ids(steer),
    }


def failed(target: str, value: Any, refused: SteerRefused, steer_id: str | None = None) -> Event:
    """The input returned, uncommitted; with the steer's id once it had one."""
    steer: dict[str, Any] = {"input": returned(value), "previous_response_id": target}
    if steer_id is not None:
        steer["id"] = steer_id
    error = {"code": refused.code, "message": str(refused), "type": "invalid_request_error"}
    return {"type": "response.steer.failed", "error": error, "steer": steer}


def failed_after(steer: Steer, code: str, message: str) -> Event:
    """An accepted steer that cannot be committed."""
    value = steer.input if returned(steer.input) else [dict(m) for m in steer.messages]
    return failed(steer.previous_response_id, value, SteerRefused(code, message), steer.id)


def returned(value: Any) -> Any:
    """Input as a failed steer returns it: as sent, where the SDK's type can hold it (a
    message without its optional `type` cannot; its accepted form, with it, can), else []."""
    try:
        _STEER_INPUT.validate_python(value)
    except ValidationError:
        return []
    return value


def _ids(steer: Steer) -> dict[str, str]:
    return {"id": steer.id, "previous_response_id": steer.previous_response_id}
