"""A turn: one request and everything the model sees for it, rendered once per generation.

`Turn.open(request, store)` resolves what the request continues, from the store: its
conversation's items, then the previous response's input and output, then the new input (its
`item_reference`s replaced by the items they name). The new input may answer only the calls and
approval requests its history holds. What is kept as the response's input is the same minus
the conversation, which keeps its own items.

A turn is a value: it does no I/O after it is opened. Compacting a long context first
(`context_management`, or a `compaction_trigger` item) is the compactor's: the service decides
it (`plan_compaction`) and the generation makes it in the response's stream. `engine_request(tools)` is what an engine is asked, from the items rendered
once. A response that runs server-side tools is several generations: each next one is
`then(output)`, the same turn with the response's output so far after its items.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from oars.errors import InvalidRequest, NotFound
from oars.generation import ChatMessage, EngineRequest, Route
from oars.normalize import Configuration, ResponseRequest, configuration
from oars.prompt import Context, Unseal, render, validate
from oars.store import Chain, Json, Reads
from oars.tools import ToolSet, loaded

# a call's item type → the type of the item that answers it
_ANSWERED = {
    "function_call": "function_call_output",
    "custom_tool_call": "custom_tool_call_output",
    "tool_search_call": "tool_search_output",
    "shell_call": "shell_call_output",
    "local_shell_call": "local_shell_call_output",
    "apply_patch_call": "apply_patch_call_output",
}
_CALLS = tuple(_ANSWERED)
_ANSWERS = tuple(_ANSWERED.values())


@dataclass(frozen=True)
class Turn:
    """A request with the items its model sees: history, new input, then output so far."""

    request: ResponseRequest
    items: tuple[Json, ...]  # history and new input (and a compaction made for it), in order
    stored_input: tuple[Json, ...] = ()  # kept as the response's input items
    new_input: tuple[Json, ...] = ()  # this request's (appended to its conversation)
    new_at: int = 0  # where the new input starts in `items`
    unseal: Unseal | None = field(default=None, compare=False)
    compacted: Json | None = None  # the compaction made for it: its first output item
    output: tuple[Json, ...] = ()  # this response's output, for the generation after it
    messages: tuple[ChatMessage, ...] = ()  # `items` and `output` rendered
    served_by: str = ""  # the engine replica that served what it continues ('' : none known)
    # what this response's web searches read, by item id (for the steps after them)
    read: Mapping[str, str] = field(default_factory=dict, compare=False)

    @classmethod
    async def open(
        cls,
        request: ResponseRequest,
        store: Reads | None,
        unseal: Unseal | None = None,
        previous: Chain | None = None,
    ) -> Turn:
        """The request with its whole context; 404 for an unknown response, conversation or
        item. `previous`: the previous response's chain when the caller holds it (a
        WebSocket keeps its recent responses'); otherwise it is read from the store."""
        chain = Chain(())
        if request.previous_response_id is not None:
            chain = previous or await _previous(request.previous_response_id, store)
        conversation = Chain(())
        if request.conversation_id is not None:
            conversation = await _conversation(request.conversation_id, store)
        earlier = list(chain.items)
        new_input = await _references(request.input_items, store)
        history = [*conversation.items, *earlier]
        turn = cls(
            request,
            (*history, *new_input),
            (*earlier, *new_input),
            new_input,
            len(history),
            _once(unseal),
            served_by=chain.served_by or conversation.served_by,
        ).rendered()  # the one render, which validates the new input's items
        _check_answers(history, new_input)
        return turn.settled()

    @classmethod
    def of(cls, request: ResponseRequest, unseal: Unseal | None = None) -> Turn:
        """A request without history (its input has no item references); 400 naming a
        malformed item."""
        items = request.input_items
        return cls(request, items, items, items, 0, _once(unseal)).rendered().settled()

    # ---- what the model sees ------------------------------------------------------------

    def rendered(self) -> Turn:
        """This turn with its messages: the render is the items' validation (400 naming a
        malformed one, or an input that gives the model nothing to respond to)."""
        context = Context(self.unseal, params=self._param, read=self.read)
        messages = render((*self.items, *self.output), self.request.instructions, context)
        if not messages and self._needs_a_message:
            raise InvalidRequest(
                "Invalid 'input': it holds no message to respond to.", param="input"
            )
        return replace(self, messages=tuple(messages))

    def _param(self, i: int) -> str:
        if self.new_at <= i < self.new_at + len(self.new_input):
            return f"input[{i - self.new_at}]"
        return "previous_response_id" if self.request.previous_response_id else "conversation"

    @property
    def _needs_a_message(self) -> bool:
        """A generation needs a message to respond to (a compaction asked for now generates
        nothing); so does a request that continues nothing and names no stored item, even
        with `generate: false`."""
        r = self.request
        if r.compaction is not None and r.compaction.now:
            return False
        alone = r.previous_response_id is None and r.conversation_id is None
        named = any(item.get("type") == "item_reference" for item in r.input_items)
        return r.generate or (alone and not named)

    def settled(self) -> Turn:
        """This turn, once what its context settles is known to stand: 400 for a tool_choice
        naming a tool no tool search loaded, or a malformed configuration_update."""
        _ = self.tools, self.configured
        return self

    @functools.cached_property
    def configured(self) -> Configuration:
        """What the `configuration_update` items of the context set (400 naming a malformed
        one): they apply to the responses after them, over the request's own settings."""
        return configuration(self.items, self._param)

    @functools.cached_property
    def tools(self) -> ToolSet:
        """The request's tools, with those the tool searches in its context loaded."""
        return self.request.tools.loading(loaded((*self.items, *self.output), self.unseal))

    def engine_request(
        self, tools: ToolSet | None = None, max_output_tokens: int | None = None
    ) -> EngineRequest:
        """What the engine is asked: these messages, the request's settings, and `tools`
        (default: the request's own); `max_output_tokens`: what is left of the request's."""
        r = self.request
        sampling = r.sampling
        if max_output_tokens is not None:
            sampling = replace(sampling, max_output_tokens=max_output_tokens)
        return EngineRequest(
            messages=self.messages,
            sampling=sampling,
            tools=self.tools if tools is None else tools,
            parallel_tool_calls=r.parallel_tool_calls,
            output=self.configured.output if self.configured.formatted else r.output,
            top_logprobs=r.top_logprobs,
            reasoning_effort=self.configured.reasoning_effort or r.reasoning_effort,
            after_tool_output=bool(self.messages) and self.messages[-1].role == "tool",
            route=Route(self.served_by, r.echo.get("prompt_cache_key") or ""),
        )

    def then(self, output: Sequence[Json]) -> Turn:
        """The same turn, the response's output so far after its items (the compaction made
        for it, already among them, once)."""
        known = {item.get("id") for item in self.items}
        fresh = tuple(item for item in output if item.get("id") not in known)
        return replace(self, output=fresh).rendered()

    def conversation_items(self, snapshot: Json) -> list[Json]:
        """Appended to the conversation when the response ends: new input, then output."""
        if self.request.conversation_id is None:
            return []
        return [*self.new_input, *snapshot["output"]]

    def listing(self, label: str) -> Json | None:
        """The latest tool listing of that MCP server in the context, if any."""
        for item in reversed(self.items):
            listed = item.get("type") == "mcp_list_tools" and not item.get("error")
            if listed and item.get("server_label") == label:
                return item
        return None

    def approved(self) -> list[tuple[Json, Json]]:
        """(approval request, approving response) for each approval in the new input whose
        call has not run yet."""
        requests = {i.get("id"): i for i in self.items if i.get("type") == "mcp_approval_request"}
        ran = {i.get("approval_request_id") for i in self.items if i.get("type") == "mcp_call"}
        return [
            (requests[item["approval_request_id"]], item)
            for item in self.new_input
            if item.get("type") == "mcp_approval_response"
            and item.get("approve") is True
            and item["approval_request_id"] not in ran
        ]


def _once(unseal: Unseal | None) -> Unseal | None:
    """The server's key, opening each sealed text of a turn once however often it is read
    (to render, and for the tools its compactions keep)."""
    return functools.lru_cache(maxsize=256)(unseal) if unseal is not None else None


async def items_of(
    previous_response_id: str | None,
    items: Sequence[Json],
    store: Reads | None,
    unseal: Unseal | None = None,
) -> list[Json]:
    """A previous response's context followed by these items (references resolved), for a
    history that is compacted rather than rendered: 400 naming a malformed item of them."""
    validate(items, unseal)
    earlier = (
        () if previous_response_id is None else (await _previous(previous_response_id, store)).items
    )
    return [*earlier, *await _references(items, store)]


def _check_answers(history: Sequence[Json], new_input: Sequence[Json]) -> None:
    """A continuation may only answer what its history holds: a tool output for a call that
    was never made, or an approval of a request never made, is the client's mistake."""
    context = [*history, *new_input]
    made = {item.get("call_id") for item in context if item.get("type") in _CALLS}
    asked = {item.get("id") for item in context if item.get("type") == "mcp_approval_request"}
    for position, item in enumerate(new_input):
        kind = item.get("type")
        key = "id" if kind == "local_shell_call_output" else "call_id"  # as the API has it
        if history and kind in _ANSWERS and item.get(key) not in made:
            raise InvalidRequest(
                f"No tool call found for the tool output with call_id {item.get(key)!r}.",
                param=f"input[{position}].{key}",
            )
        if kind == "mcp_approval_response" and item.get("approval_request_id") not in asked:
            raise InvalidRequest(
                f"No MCP approval request found with id {item.get('approval_request_id')!r}.",
                param=f"input[{position}].approval_request_id",
            )


def _no_store(param: str, what: str, code: str = "not_found") -> NotFound:
    return NotFound(f"{what} not found: this server keeps no stored state.", param=param, code=code)


async def _previous(response_id: str, store: Reads | None) -> Chain:
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


async def _conversation(conversation_id: str, store: Reads | None) -> Chain:
    """A conversation's items, and the replica that served its latest response."""
    if store is None:
        raise _no_store("conversation", f"Conversation with id '{conversation_id}'")
    found = await store.get_conversation(conversation_id)
    page = await store.conversation_items(conversation_id) if found is not None else None
    if found is None or page is None:
        raise NotFound(f"Conversation with id '{conversation_id}' not found.", param="conversation")
    return Chain(page.items, found.served_by)


async def _references(items: Sequence[Json], store: Reads | None) -> tuple[Json, ...]:
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
