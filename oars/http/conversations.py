"""`/v1/conversations`: a conversation is an ordered list of items that responses add to."""

from __future__ import annotations

import time
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from oars.errors import InvalidRequest, NotFound
from oars.http.common import JSON, list_page, page_wire, path_id, read_json, shared, store_of
from oars.ids import new_id
from oars.normalize import canonical_input, check_shape, validate_metadata
from oars.prompt import validate
from oars.store import Conversation, Page

_MAX_ITEMS = 20  # per create or add call, as OpenAI


def _items(request: Request, body: dict[str, Any], *, required: bool) -> tuple[dict[str, Any], ...]:
    raw = body.get("items")
    if raw is None and not required:
        return ()
    if not isinstance(raw, list) or (required and not raw) or len(raw) > _MAX_ITEMS:
        raise InvalidRequest(
            f"Invalid 'items': expected an array of 1 to {_MAX_ITEMS} items.", param="items"
        )
    check_shape(raw, "items")
    # Kept before any model renders them, so validated now, sealed items opened with the key
    # every later turn opens them with.
    validate(raw, shared(request).service.unseal, param="items")
    if any(i.get("type") == "item_reference" for i in raw):
        raise InvalidRequest(
            "Invalid 'items': an item_reference cannot be added to a conversation.", param="items"
        )
    return canonical_input(raw)


async def _body(request: Request) -> dict[str, Any]:
    body = await read_json(request)
    if not isinstance(body, dict):
        raise InvalidRequest(
            "The request body must be a JSON object.", param=None, code="invalid_type"
        )
    return body


def _wire(item: dict[str, Any]) -> dict[str, Any]:
    """A conversation's message as OpenAI lists it: with its status (what was added to a
    conversation is complete)."""
    if item.get("type") == "message" and "status" not in item:
        return {**item, "status": "completed"}
    return item


def _missing(conversation_id: str) -> NotFound:
    return NotFound(f"Conversation with id '{conversation_id}' not found.", param="conversation_id")


async def create(request: Request) -> Response:
    store = store_of(request)
    body = await _body(request)
    conversation = Conversation(new_id("conv"), int(time.time()), validate_metadata(body))
    await store.create_conversation(conversation, _items(request, body, required=False))
    return JSON(conversation.wire())


async def retrieve(request: Request) -> Response:
    conversation_id = path_id(request, "conversation_id")
    conversation = await store_of(request).get_conversation(conversation_id)
    if conversation is None:
        raise _missing(conversation_id)
    return JSON(conversation.wire())


async def update(request: Request) -> Response:
    conversation_id = path_id(request, "conversation_id")
    body = await _body(request)
    if "metadata" not in body:
        raise InvalidRequest(
            "Missing required parameter: 'metadata'.",
            param="metadata",
            code="missing_required_parameter",
        )
    updated = await store_of(request).update_conversation(conversation_id, validate_metadata(body))
    if updated is None:
        raise _missing(conversation_id)
    return JSON(updated.wire())


async def delete(request: Request) -> Response:
    conversation_id = path_id(request, "conversation_id")
    if not await store_of(request).delete_conversation(conversation_id):
        raise _missing(conversation_id)
    return JSON({"id": conversation_id, "object": "conversation.deleted", "deleted": True})


async def list_items(request: Request) -> Response:
    conversation_id = path_id(request, "conversation_id")
    page = await store_of(request).conversation_items(conversation_id, **list_page(request))
    if page is None:
        raise _missing(conversation_id)
    return JSON(page_wire(Page([_wire(i) for i in page.items], page.has_more)))


async def add_items(request: Request) -> Response:
    conversation_id = path_id(request, "conversation_id")
    items = _items(request, await _body(request), required=True)
    if not await store_of(request).add_conversation_items(conversation_id, items):
        raise _missing(conversation_id)
    return JSON(page_wire(Page([_wire(i) for i in items], False)))


async def get_item(request: Request) -> Response:
    conversation_id, item_id = (
        path_id(request, "conversation_id"),
        path_id(request, "item_id"),
    )
    item = await store_of(request).get_conversation_item(conversation_id, item_id)
    if item is None:
        raise NotFound(
            f"Item with id '{item_id}' not found in conversation '{conversation_id}'.",
            param="item_id",
        )
    return JSON(_wire(item))


async def delete_item(request: Request) -> Response:
    conversation_id, item_id = (
        path_id(request, "conversation_id"),
        path_id(request, "item_id"),
    )
    store = store_of(request)
    if not await store.delete_conversation_item(conversation_id, item_id):
        raise NotFound(
            f"Item with id '{item_id}' not found in conversation '{conversation_id}'.",
            param="item_id",
        )
    conversation = await store.get_conversation(conversation_id)
    if conversation is None:
        raise _missing(conversation_id)
    return JSON(conversation.wire())
