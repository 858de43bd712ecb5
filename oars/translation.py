"""What the front doors that are not Responses share (Chat Completions, Anthropic Messages): a
request translated into a Responses body, the errors the Responses path finds named in the
door's own words, and the checks every translator makes of a wire value."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from oars.errors import ClientError, InvalidRequest

Json = dict[str, Any]


def ending(response: Mapping[str, Any]) -> str:
    """Why a response's generation ended, for a door to name in its own words: `length` (its
    token limit), `filtered`, `calls` (it ends with calls to make) or `done`."""
    reason = (response.get("incomplete_details") or {}).get("reason")
    if reason == "max_output_tokens":
        return "length"
    if reason == "content_filter":
        return "filtered"
    calls = any(item["type"] == "function_call" for item in response["output"])
    return "calls" if calls else "done"


def fail(message: str, param: str, code: str = "invalid_value") -> InvalidRequest:
    return InvalidRequest(message, param=param, code=code)


def typed(value: Any, kind: type | tuple[type, ...], param: str, wanted: str) -> Any:
    """The value, when it is of `kind` (a bool is no number); else a 400 naming `param`."""
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
        raise fail(f"Invalid type for '{param}': expected {wanted}.", param, "invalid_type")
    return value


@dataclass(frozen=True)
class Translation:
    """A request as the Responses path takes it (`body`), and how to name a Responses
    parameter in the door's words (`renames`, by prefix)."""

    body: Json
    renames: tuple[tuple[str, str], ...] = ()

    @property
    def stream(self) -> bool:
        return bool(self.body.get("stream"))

    def rename(self, exc: ClientError) -> ClientError:
        """The error, naming the door's parameter its Responses parameter came from."""
        param = exc.param or ""
        for old, new in self.renames:
            if param == old or param.startswith((f"{old}.", f"{old}[")):
                exc.param = new + param[len(old) :]
                exc.message = exc.message.replace(f"'{old}", f"'{new}")
                break
        return exc


Role = Callable[[Json, str], list[Json]]  # a message (and its parameter) → its input items


def message_items(messages: Any, roles: Mapping[str, Role]) -> tuple[list[Json], list[int]]:
    """The messages as input items, each made by its role's function, and for each item the
    index of the message it came from (to name it in an error)."""
    if messages is None:
        raise fail(
            "Missing required parameter: 'messages'.", "messages", "missing_required_parameter"
        )
    if not typed(messages, list, "messages", "an array"):
        raise fail("Invalid 'messages': expected at least one message.", "messages")
    items: list[Json] = []
    sources: list[int] = []
    for i, message in enumerate(messages):
        param = f"messages[{i}]"
        role = typed(message, dict, param, "an object").get("role")
        if role not in roles:
            raise fail(
                f"Invalid '{param}.role': expected one of {', '.join(roles)}, got {role!r}.",
                f"{param}.role",
            )
        made = roles[role](message, param)
        items += made
        sources += [i] * len(made)
    return items, sources
