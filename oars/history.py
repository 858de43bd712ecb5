"""History as items: a request's conversation, previous response and item references, resolved
from the store before anything is rendered for the model.

The prompt is the conversation's items, then the previous response's input and output, then the
new input (with `item_reference`s replaced by the items they name). What is kept as the new
response's input is the same minus the conversation, which keeps its own items.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from oars.errors import InvalidRequest, NotFound
from oars.normalize import ResponseRequest
from oars.store import Json, Store


@dataclass(frozen=True)
class History:
    request: ResponseRequest  # its engine request rendered from the whole context
    stored_input: tuple[Json, ...]  # kept as the response's input items
    new_input: tuple[Json, ...]  # what this request added (appended to its conversation)
    conversation_id: str | None = None
    context: tuple[Json, ...] = ()  # every item the prompt was rendered from, in order

    def conversation_items(self, snapshot: Json) -> list[Json]:
        """Appended to the conversation when the response ends: new input, then output."""
        if self.conversation_id is None:
            return []
        return [*self.new_input, *snapshot["output"]]


async def resolve(
    request: ResponseRequest, store: Store | None, previous: Sequence[Json] | None = None
) -> History:
    """The request with its whole context; 404 for an unknown response, conversation or item.

    `previous`: the previous response's context when the caller already holds it (a WebSocket
    keeps its last response's); otherwise it is read from the store."""
    earlier: list[Json] = []
    if request.previous_response_id is not None:
        earlier = (
            list(previous)
            if previous is not None
            else await _previous(request.previous_response_id, store)
        )
    conversation: list[Json] = []
    if request.conversation_id is not None:
        conversation = await _conversation(request.conversation_id, store)
    new_input = await _references(request.input_items, store)
    stored = (*earlier, *new_input)
    context = [*conversation, *stored]
    if earlier or conversation:
        _check_answers(context, new_input)
    rendered = (
        request.with_context(context)
        if earlier or conversation or (new_input != request.input_items)
        else request
    )
    return History(rendered, stored, new_input, request.conversation_id, tuple(context))


async def items_of(
    previous_response_id: str | None, items: Sequence[Json], store: Store | None
) -> list[Json]:
    """A previous response's context followed by these items (references resolved)."""
    earlier = [] if previous_response_id is None else await _previous(previous_response_id, store)
    return [*earlier, *await _references(items, store)]


_CALLS = ("function_call", "custom_tool_call")
_ANSWERS = ("function_call_output", "custom_tool_call_output")


def _check_answers(context: Sequence[Json], new_input: Sequence[Json]) -> None:
    """A continuation may only answer calls its history holds: a tool output for a call that
    was never made is the client's mistake, not a prompt to render."""
    made = {item.get("call_id") for item in context if item.get("type") in _CALLS}
    for position, item in enumerate(new_input):
        if item.get("type") in _ANSWERS and item.get("call_id") not in made:
            raise InvalidRequest(
                f"No tool call found for the tool output with call_id {item.get('call_id')!r}.",
                param=f"input[{position}].call_id",
            )


def _no_store(param: str, what: str, code: str = "not_found") -> NotFound:
    return NotFound(f"{what} not found: this server keeps no stored state.", param=param, code=code)


async def _previous(response_id: str, store: Store | None) -> list[Json]:
    if store is None:
        raise _no_store(
            "previous_response_id",
            f"Previous response with id '{response_id}'",
            "previous_response_not_found",
        )
    context = await store.context(response_id)
    if context is None:
        raise NotFound(
            f"Previous response with id '{response_id}' not found.",
            param="previous_response_id",
            code="previous_response_not_found",
        )
    return context


async def _conversation(conversation_id: str, store: Store | None) -> list[Json]:
    if store is None:
        raise _no_store("conversation", f"Conversation with id '{conversation_id}'")
    page = await store.conversation_items(conversation_id)
    if page is None:
        raise NotFound(f"Conversation with id '{conversation_id}' not found.", param="conversation")
    return page.items


async def _references(items: Sequence[Json], store: Store | None) -> tuple[Json, ...]:
    wanted = [str(i["id"]) for i in items if i.get("type") == "item_reference"]
    if not wanted:
        return tuple(items)
    found = await store.find_items(wanted) if store is not None else {}
    resolved: list[Json] = []
    for position, item in enumerate(items):
        if item.get("type") != "item_reference":
            resolved.append(item)
        elif item["id"] in found:
            resolved.append(found[item["id"]])
        else:
            raise NotFound(f"Item with id '{item['id']}' not found.", param=f"input[{position}].id")
    return tuple(resolved)
