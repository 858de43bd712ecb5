"""The server-side tools of one response: its MCP servers' tools, listed, offered and run, this
server's tool search over the request's deferred tools (`oars.tool_search`), its web
searches (`oars.web_run`) and its file searches (`oars.file_run`).

Before the model's first step, each server the request names is listed, unless the context
already holds its listing (`mcp_list_tools`: OpenAI reuses it too), and the calls the client
approved in its input run at once. The model sees a server's tools as `label__name` beside the
request's own tools. A call it writes waits for the client's approval (an
`mcp_approval_request`; the response ends after that step) or runs at once (an `mcp_call`).
After a step that ran calls, the model goes on in a next step that sees their results, until
it answers, calls a tool of the client's, or a limit is reached: `max_tool_calls` (over the
whole response; a call past it gets no item, as OpenAI does) or the server's cap on steps. The
last step offers the servers' tools without letting the model call them, so it answers.

A listing that fails fails the response (424 for one not streamed, as OpenAI answers); a call
that fails is a `failed` item the model reads, and goes on. A tool search is a call like the
others (it counts against `max_tool_calls`): its items name the tools it found, which the steps
after it offer, and whose calls come back as the client's.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import replace
from typing import Any

from oars.errors import DependencyFailed, InvalidRequest
from oars.events import CallTarget, Event, ResponseBuilder
from oars.events.items import arguments_object
from oars.file_run import FileRun, Searchers
from oars.generation import FinishReason
from oars.mcp.client import McpFailure, Session, protocol_error
from oars.mcp.config import McpConfig
from oars.mcp.servers import McpServer, public_url
from oars.step import ServerCall, Step
from oars.tool_search import Entry, catalog, limit_of, mcp_entry, search
from oars.tools import ANY_OBJECT, Tool, ToolSet, load, loaded_definitions, mcp_tool_name
from oars.turn import Turn
from oars.web_run import WebRun
from oars.web_search import WebSearch

log = logging.getLogger("oars.mcp")

Json = dict[str, Any]
Observe = Callable[[str, str, float], None]  # (server, outcome, seconds) of one call
_TOOL_NAME = re.compile(r"[A-Za-z0-9_.-]{1,128}")  # what MCP asks tool names to be
_MAX_TOOL = 65_536  # characters of one listed tool (its schema), offered to the model


class ToolboxFactory:
    """The service's side: the operator's MCP settings, web search backend and vector stores,
    and where calls are counted."""

    def __init__(
        self,
        config: McpConfig,
        observe: Observe | None = None,
        *,
        web: WebSearch | None = None,
        files: Searchers | None = None,
    ) -> None:
        self.config, self.observe, self.web, self.files = config, observe, web, files

    @property
    def labels(self) -> frozenset[str]:
        """The labels of the servers the operator configured."""
        return self.config.labels

    async def open(self, turn: Turn) -> Toolbox:
        """A response's toolbox; 400 for a server URL it may not reach, or an approval for a
        server the request does not name (both before anything is sent)."""
        request = turn.request
        labels = {server.label for server in request.servers}
        for server in request.servers:
            await self.config.check(server)
        for approval, _ in turn.approved():
            if approval.get("server_label") not in labels:
                raise InvalidRequest(
                    f"An approved call is for the MCP server {approval.get('server_label')!r}, "
                    "which no 'mcp' tool in 'tools' names.",
                    param="tools",
                )
        toolbox = Toolbox(turn, self.config, self.observe, self.web)
        wire = next((t for t in request.echo["tools"] if t.get("type") == "file_search"), None)
        if wire is not None and self.files is not None:
            searcher = await self.files(request.tenant, wire["vector_store_ids"])
            toolbox.files = FileRun.of(searcher, turn)
        return toolbox


class Toolbox:
    """One response's MCP servers: their sessions, listed tools, and the calls made; and its
    web searches."""

    def __init__(
        self,
        turn: Turn,
        config: McpConfig,
        observe: Observe | None = None,
        web: WebSearch | None = None,
    ) -> None:
        self.turn, self.config, self.observe = turn, config, observe
        self.request = turn.request
        self.servers = {server.label: server for server in self.request.servers}
        self.tools: dict[str, Tool] = {}  # by the name the model calls them
        self.read_only: dict[str, bool] = {}  # by that name
        self.ran = 0  # calls run, against `max_tool_calls`
        self.asked = False  # an approval was asked for: the response ends after the step
        self._callable: frozenset[str] = frozenset()  # what the model may call in this step
        self._sessions: dict[str, Session] = {}
        self.search = next((t for t in turn.tools.offered if t.kind == "server_tool_search"), None)
        self.found: list[Tool] = []  # what this response's tool searches loaded
        self.searched = 0  # tool searches run (of `ran`)
        # a deferred MCP server's tools not found yet: by model name, the tool and its entry
        self.deferred: dict[str, tuple[Tool, Entry]] = {}
        self.web = WebRun.of(web, turn) if web is not None else None
        self.files: FileRun | None = None

    # ---- before the first step ----------------------------------------------------------

    async def prepare(self, builder: ResponseBuilder) -> AsyncIterator[Event]:
        """List each server (or reuse its listing), then run the calls the client approved."""
        for server in self.servers.values():
            listing = self.turn.listing(server.label)
            if listing is None:
                async for event in self._list(builder, server):
                    yield event
            else:
                self._offer(server, listing["tools"])
        choice = self.request.mcp_choice
        if choice is not None and not any(self._chosen(t) for t in self.tools.values()):
            raise InvalidRequest(
                f"Invalid 'tool_choice': the MCP server {choice.label!r} offers no tool "
                f"{choice.name!r}."
                if choice.name
                else f"Invalid 'tool_choice': the MCP server {choice.label!r} offers no tools.",
                param="tool_choice",
            )
        for approval in _once(a for a, _ in self.turn.approved()):
            async for event in self._approved(builder, approval):
                yield event

    async def _approved(self, builder: ResponseBuilder, approval: Json) -> AsyncIterator[Event]:
        """A call the client approved runs at once, if its tool is still allowed and the
        budget has room (as any call)."""
        server, name = self.servers[str(approval["server_label"])], str(approval["name"])
        allowed = self.tools.get(mcp_tool_name(server.label, name))
        if allowed is None or not self._budget_left():
            log.info("approved call to %s not run: not offered, or max_tool_calls reached", name)
            return
        call = (name, str(approval["arguments"]), str(approval["id"]))
        async for event in self._execute(builder, server, *call):
            yield event

    async def _list(self, builder: ResponseBuilder, server: McpServer) -> AsyncIterator[Event]:
        for event in builder.list_tools(server.label):
            yield event
        try:
            tools = await self._session(server).list_tools()
        except McpFailure as exc:
            message = f"Error retrieving tool list from MCP server: '{server.label}': {exc}"
            for event in builder.tools_not_listed(message):
                yield event
            raise DependencyFailed(message, param=f"{server.param}.server_url") from exc
        kept = [t for t in tools if server.allows(t["name"], _read_only(t))]
        self._offer(server, kept)
        for event in builder.tools_listed(kept):
            yield event

    def _offer(self, server: McpServer, listed: list[Json]) -> None:
        """A server's tools, as the model may call them: those `allowed_tools` keeps, with a
        name a model can write and a schema of a sane size, and a model name no other tool has."""
        taken = {t.model_name for t in self.turn.tools.offered} | set(self.tools)
        found = self._found_on(server.label) if server.deferred else set()
        for listed_tool in listed:
            name = str(listed_tool.get("name", ""))
            model_name = mcp_tool_name(server.label, name)
            usable = _TOOL_NAME.fullmatch(name) and len(json.dumps(listed_tool)) <= _MAX_TOOL
            if (
                not usable
                or model_name in taken
                or not server.allows(name, _read_only(listed_tool))
            ):
                if model_name in taken or not usable:
                    log.warning("MCP server %r: tool %r not offered", server.label, name[:80])
                continue
            tool = Tool(
                name=name,
                kind="mcp",
                description=str(listed_tool.get("description") or ""),
                parameters=_closed(listed_tool.get("input_schema")),
                namespace=server.label,
                offered_as=model_name,
            )
            self.read_only[model_name] = _read_only(listed_tool)
            if server.deferred and name not in found:
                self.deferred[model_name] = (
                    tool,
                    mcp_entry(server.label, server.description, name, listed_tool),
                )
            else:
                self.tools[model_name] = tool

    def _found_on(self, label: str) -> set[str]:
        """The tools of a deferred MCP server that tool searches in the context found."""
        return {
            str(name)
            for definition in loaded_definitions(self.turn.items, self.turn.unseal)
            if definition.get("type") == "mcp" and definition.get("server_label") == label
            for name in definition.get("allowed_tools") or ()
        }

    # ---- each step ----------------------------------------------------------------------

    def toolset(self, steps: int) -> ToolSet:
        """What the model may call in the step after `steps` steps: the request's tools and
        the servers' (these while the budget and the cap on steps allow)."""
        toolset = self._toolset(steps)
        self._callable = toolset.names
        return toolset

    def _toolset(self, steps: int) -> ToolSet:
        base = self.turn.tools.loading(self.found)
        servers = tuple(self.tools.values())
        offered = base.offered + servers
        may_call = self._may_call(steps)
        callable_ = servers if may_call else ()
        # a tool search is not the call `required` asks for: it holds until another call ran
        first = self.ran == self.searched and steps == self.searched
        if base.mode == "none":
            return ToolSet(offered, offered, "none")
        if first and self.request.mcp_choice is not None:
            return ToolSet(offered, tuple(t for t in servers if self._chosen(t)), "required")
        forced_search = bool(base.callable) and all(t.kind in _SEARCHES for t in base.callable)
        if base.mode == "required" and base.callable != base.offered:  # a named tool
            if not (forced_search and self.read):  # a forced search holds until one ran
                return ToolSet(offered, base.callable, "required")
            base = replace(base, callable=base.offered, mode="auto")
        mode = "required" if base.mode == "required" and first else "auto"
        # after a search, a required call is one of the tools it could have loaded
        searching = may_call and not (mode == "required" and self.searched)
        own = tuple(
            t
            for t in base.callable
            if (searching or t.kind != "server_tool_search")
            and (may_call or t.kind not in _SEARCHES)
        )
        if mode == "required" and not own + callable_:  # the searches found nothing to call
            mode, own = "auto", tuple(t for t in base.callable if may_call)
        return ToolSet(offered, own + callable_, mode)

    def _may_call(self, steps: int) -> bool:
        return steps + 1 < self.config.max_rounds and self._budget_left()

    def _budget_left(self) -> bool:
        budget = self.request.max_tool_calls
        return budget is None or self.ran < budget

    def _chosen(self, tool: Tool) -> bool:
        choice = self.request.mcp_choice
        return (
            choice is not None
            and tool.namespace == choice.label
            and choice.name in (None, tool.name)
        )

    def tool(self, model_name: str) -> Tool | None:
        if self.search is not None and model_name == self.search.model_name:
            return self.search
        if self.web is not None and model_name in self.web.tools:
            return self.web.tools[model_name]
        if self.files is not None and model_name == "file_search":
            return next(t for t in self.turn.tools.offered if t.kind == "server_file_search")
        return self.tools.get(model_name)

    @property
    def read(self) -> Mapping[str, str]:
        web = self.web.read if self.web is not None else {}
        return {**web, **self.files.read} if self.files is not None else web

    def goes_on(self, step: Step, steps: int) -> bool:
        """Another step follows this one: it ran calls, and nothing else ends the response."""
        return (
            step.server_calls > 0
            and not self.asked
            and not step.cut
            and step.client_calls == 0
            and step.finish in (FinishReason.STOP, FinishReason.TOOL_CALLS)
            and steps < self.config.max_rounds
        )

    async def run(self, builder: ResponseBuilder, call: ServerCall) -> AsyncIterator[Event]:
        """A call the model wrote: asked for approval, run, or (past `max_tool_calls`)
        dropped."""
        tool = call.tool
        if tool.model_name not in self._callable or not self._budget_left():
            # past `max_tool_calls`, or the last step (an engine that does not hold the model
            # to what it may call, such as an upstream, may still write one): no item
            log.info("call to %s dropped: not callable now", tool.model_name)
            return
        if tool.kind == "server_tool_search":
            for event in self._search(builder, call.arguments):
                yield event
            return
        if tool.kind == "server_web_search" and self.web is not None:
            self.ran += 1
            async for event in self.web.run(builder, tool.name, call.arguments):
                yield event
            return
        if tool.kind == "server_file_search" and self.files is not None:
            self.ran += 1
            async for event in self.files.run(builder, call.arguments):
                yield event
            return
        server = self.servers[str(tool.namespace)]
        if server.needs_approval(tool.name, self.read_only.get(tool.model_name, False)):
            self.asked = True
            for event in builder.approval_request(server.label, tool.name, call.arguments):
                yield event
            return
        async for event in self._execute(builder, server, tool.name, call.arguments):
            yield event

    async def _execute(
        self,
        builder: ResponseBuilder,
        server: McpServer,
        name: str,
        arguments: str,
        approval_request_id: str | None = None,
    ) -> AsyncIterator[Event]:
        for event in builder.mcp_call(server.label, name, arguments, approval_request_id):
            yield event
        self.ran += 1
        started = time.monotonic()
        output: str | None = None
        error: Json | None = None
        try:
            output = await self._session(server).call(name, _arguments(arguments))
        except McpFailure as exc:
            error = exc.error
        self._observed(server, "failed" if error else "completed", time.monotonic() - started)
        for event in builder.mcp_call_done(output, error):
            yield event

    def _search(self, builder: ResponseBuilder, arguments: str) -> list[Event]:
        """Rank the deferred tools for the model's query; what it found is offered next."""
        self.ran += 1
        self.searched += 1
        asked = arguments_object(arguments)  # as its item shows them
        query = asked.get("query")
        entries = catalog(self.request.echo["tools"]) + [e for _, e in self.deferred.values()]
        found = search(entries, query if isinstance(query, str) else "", limit_of(asked))
        loaded = load(found)
        self.found.extend(loaded)
        for definition in found:
            if definition.get("type") == "mcp":
                label = definition["server_label"]
                for name in definition["allowed_tools"]:
                    tool, _ = self.deferred.pop(mcp_tool_name(label, name))
                    self.tools[tool.model_name] = tool
        now = self.turn.tools.loading(self.found).offered  # as the next step offers them
        builder.offer({t.model_name: CallTarget(t.name, t.namespace, t.kind) for t in now})
        return builder.tool_search(arguments, found)

    def _observed(self, server: McpServer, outcome: str, seconds: float) -> None:
        if self.observe is not None:
            where = server.label if server.url is None else public_url(server.url)
            self.observe(where, outcome, seconds)

    # ---- sessions -----------------------------------------------------------------------

    def _session(self, server: McpServer) -> Session:
        session = self._sessions.get(server.label)
        if session is None:
            endpoint = self.config.endpoint(server)
            session = Session(endpoint, self.config.reach, self.config.limits)
            self._sessions[server.label] = session
        return session

    async def close(self) -> None:
        """Close every session the response opened."""
        sessions, self._sessions = list(self._sessions.values()), {}
        if sessions:
            await asyncio.gather(*(s.close() for s in sessions), return_exceptions=True)


_SEARCHES = frozenset({"server_web_search", "server_file_search"})  # forced: until one ran


def _once(approvals: Iterable[Json]) -> list[Json]:
    """Each approved request once (a client may send its approval twice)."""
    seen: dict[str, Json] = {}
    for approval in approvals:
        seen.setdefault(str(approval.get("id")), approval)
    return list(seen.values())


def _closed(schema: Any) -> Mapping[str, Any]:
    """A tool's input schema as the model gets it: the arguments it names and no others (a
    server's schema seldom says `additionalProperties`, and small models copy the schema's
    `title` into the arguments), without the generated title."""
    if not isinstance(schema, dict):
        return ANY_OBJECT
    closed = {k: v for k, v in schema.items() if k != "title"}
    if isinstance(closed.get("properties"), dict) and "additionalProperties" not in closed:
        closed["additionalProperties"] = False
    return closed


def _read_only(listed: Mapping[str, Any]) -> bool:
    annotations = listed.get("annotations")
    return isinstance(annotations, dict) and annotations.get("read_only") is True


def _arguments(text: str) -> Json:
    """The model's arguments as the object a tool takes (a failed call otherwise)."""
    try:
        value = json.loads(text) if text.strip() else {}
    except json.JSONDecodeError:
        value = None
    if not isinstance(value, dict):
        raise McpFailure(protocol_error(-32602, "the arguments are not a JSON object"))
    return value
