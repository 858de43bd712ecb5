"""`ws://HOST/v1/responses`: many responses on one socket, in lanes, and steering.

A client sends text frames `{"type": "response.create", …the create body}`; each response's
events come back one JSON event per text frame, read from the same run log as SSE. A request
that fails before its response starts gets one frame `{"type": "error", "status", "error"}`,
and the socket stays open for the next.

`stream_id` on `response.create` names the request's lane (`oars.http.lanes`): a lane runs its
requests in order, lanes run at once, and every event of a response, its error frame too,
carries its lane's `stream_id`. Without one, a request runs on the default lane, whose events
carry none. The socket keeps its recent responses' contexts, so a continuation by
`previous_response_id` (of its lane's last response, or a fork from one of another lane) needs
no store, even with `store: false`. An older response of the same lane, another socket's, or
one evicted by a failed continuation is `previous_response_not_found` unless the store has it.

`{"type": "response.steer", "previous_response_id", "input"}` steers a running response of this
socket (`oars.http.steering`). Closing the socket stops its generations. A frame that is not a
JSON object with a known `type` is answered at once with an error frame, on no lane.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from starlette.websockets import WebSocket, WebSocketDisconnect

from oars.errors import ClientError, EngineError, InvalidRequest, StoreUnavailable
from oars.http import steering
from oars.http.common import Shared, create_request, parse_json
from oars.http.lanes import MAX_CONTEXTS, Context, Contexts, Lane, Lanes
from oars.http.steering import Steer, SteerRefused
from oars.ids import is_id
from oars.runs import RunHandle
from oars.store import Chain

log = logging.getLogger("oars.http")

_NOT_ON_A_SOCKET = ("stream", "stream_options", "stream_id")  # the transport's, not the body's
_NOT_INHERITED = ("input", "previous_response_id", "generate")  # by an automatic successor
_SERVER_ERROR = {
    "error": {
        "type": "server_error",
        "code": "server_error",
        "message": "internal server error",
        "param": None,
    }
}


class _Refused(Exception):
    """A request refused before its response started: its status and error body."""

    def __init__(self, status: int, body: dict[str, Any]) -> None:
        super().__init__(body["error"]["message"])
        self.status, self.body = status, body


@dataclass(frozen=True)
class _Request:
    """A create body on its lane, and the steers it commits (an explicit continuation of a
    response that waited, or an automatic successor: `explicit` False)."""

    body: dict[str, Any]
    steers: tuple[Steer, ...] = ()
    explicit: bool = True


@dataclass
class _Running:
    """A response running on this socket, and the steers queued on it."""

    handle: RunHandle
    lane: Lane
    body: dict[str, Any]
    steers: list[Steer] = field(default_factory=list)


class _Socket:
    """One client's socket: its lanes, the responses they run, what it keeps of them."""

    def __init__(self, websocket: WebSocket) -> None:
        self.websocket = websocket
        self.oars: Shared = websocket.app.state.oars
        self.tenant = str(websocket.scope.get("state", {}).get("tenant", ""))
        self.contexts = Contexts()
        self.lanes: Lanes[_Request] = Lanes(self._run)
        self.running: dict[str, _Running] = {}
        self.ended: OrderedDict[str, tuple[str, Lane]] = OrderedDict()  # id → (status, lane)
        self.waiting: OrderedDict[str, tuple[Lane, tuple[Steer, ...]]] = OrderedDict()
        self.sequence_number = 0  # of the socket's own events (the steer events)
        self.sending = asyncio.Lock()  # lanes send at once; a frame goes out whole
        self.open = True

    async def serve(self) -> None:
        try:
            while self.open:
                message = await self.websocket.receive()
                if message["type"] == "websocket.disconnect":
                    break
                text = message.get("text")
                if text is None:  # a binary frame: read as UTF-8 JSON too, or refused
                    text = (message.get("bytes") or b"").decode("utf-8", "replace")
                await self._dispatch(text)
        except (WebSocketDisconnect, RuntimeError, OSError):
            pass
        finally:
            self.open = False
            for running in self.running.values():  # a client that hangs up stops its generations
                log.info("websocket closed; generation stopped")
                running.handle.cancel()
            await self.lanes.close()

    async def _dispatch(self, frame: str) -> None:
        try:
            message = _message(frame)
            if message["type"] == "response.steer":
                await self._steer(message)
                return
            lane = _lane(message)
        except ClientError as exc:
            await self._error(None, exc.status, exc.body())
            return
        try:
            self.lanes.add(lane, _Request(_create_body(message)))
        except ClientError as exc:
            await self._error(lane, exc.status, exc.body())

    # ---- a lane's requests ------------------------------------------------------------------

    async def _run(self, lane: Lane, request: _Request) -> None:
        """A request, then the automatic successors its steering asks for."""
        following: _Request | None = request
        while following is not None and self.open:
            following = await self._respond(lane, following)

    async def _respond(self, lane: Lane, request: _Request) -> _Request | None:
        """Run one request on its lane; the automatic successor it leaves, if any."""
        previous = request.body.get("previous_response_id")
        previous = previous if isinstance(previous, str) else None
        steers = request.steers + self._waited(previous, lane)
        body = _with_steers(request.body, steers)
        try:
            handle = await self._start(body, previous, lane)
        except _Refused as refused:
            if request.explicit:
                if self.contexts.get(previous, lane) is not None:  # it was this one's to continue
                    self.contexts.forget(previous)  # a failed continuation forgets it
                await self._error(lane, refused.status, refused.body)
            await self._fail_steers(steers, "successor_creation_failed", str(refused))
            return None
        running = self.running[handle.id] = _Running(handle, lane, body)
        self.oars.metrics.socket_request("response")
        await self._forward(lane, handle)
        del self.running[handle.id]
        self._ended(handle, lane)
        self._remember(handle, lane, body, previous)
        return await self._after(running)

    async def _start(self, body: dict[str, Any], previous: str | None, lane: Lane) -> RunHandle:
        """The response started (`_Refused` when it could not)."""
        try:
            _check_body(body)
            req = create_request(self.oars, body)
            known = self.contexts.get(previous, lane)
            chain = known.chain if known is not None else None
            return await self.oars.tenant(self.tenant).submit(req, chain)
        except (ClientError, EngineError, StoreUnavailable) as exc:
            raise _Refused(exc.status, exc.body()) from exc
        except Exception as exc:
            log.exception("websocket response.create")
            raise _Refused(500, _SERVER_ERROR) from exc

    async def _forward(self, lane: Lane, handle: RunHandle) -> None:
        try:
            async for event in handle.events():
                if not await self._send(_on_lane(event, lane)):
                    break
        finally:
            if not handle.done:  # the client went away mid-response
                handle.cancel()

    def _ended(self, handle: RunHandle, lane: Lane) -> None:
        self.ended[handle.id] = (handle.status, lane)
        while len(self.ended) > 2 * MAX_CONTEXTS:
            self.ended.popitem(last=False)

    def _remember(
        self, handle: RunHandle, lane: Lane, body: dict[str, Any], previous: str | None
    ) -> None:
        """A finished response becomes its lane's to continue from; a failed continuation
        forgets the response it continued."""
        snapshot = handle.snapshot
        if snapshot["status"] in ("completed", "incomplete"):
            context = (*handle.turn.stored_input, *snapshot["output"])
            chain = Chain(context, handle.generation.served_by)
            self.contexts.keep(handle.id, Context(chain, body, lane))
        else:
            self.contexts.forget(previous)

    # ---- steering ---------------------------------------------------------------------------

    async def _steer(self, message: dict[str, Any]) -> None:
        target, value = message.get("previous_response_id"), message.get("input")
        lane = self._lane_of(str(target))
        try:
            target, messages = steering.read_steer(message)
            running = self._steerable(target)
            steer = steering.new_steer(target, value, messages)
            running.steers.append(steer)
            event = steering.accepted(steer)
        except SteerRefused as refused:
            event = steering.failed(str(target or ""), value, refused)
        await self._send_own(event, lane)

    def _steerable(self, target: str) -> _Running:
        """The running response a steer may queue input on (`SteerRefused` otherwise); it is
        asked to stop at its next safe boundary."""
        running = self.running.get(target)
        if running is None:
            raise _not_running(target, self.ended.get(target, (None, None))[0])
        request = running.handle.request
        refused = steering.unsupported(request.conversation_id, request.compaction is not None)
        if refused is not None:
            raise refused
        if len(running.steers) >= steering.MAX_PENDING_STEERS:
            raise SteerRefused(
                "too_many_pending_steers",
                f"{steering.MAX_PENDING_STEERS} steers already wait on this response.",
            )
        if not running.handle.steer():
            raise _not_running(target, running.handle.status)
        return running

    async def _after(self, running: _Running) -> _Request | None:
        """What the steers accepted while a response ran become, once it has ended: its
        automatic successor, steers pending the client's answers, or failures."""
        steers, handle = tuple(running.steers), running.handle
        if not steers:
            return None
        snapshot = handle.snapshot
        if snapshot["status"] not in ("completed", "incomplete"):
            message = f"The response ended {snapshot['status']}; nothing continues it."
            await self._fail_steers(steers, "response_not_active", message)
            return None
        required = steering.required_input(snapshot["output"])
        if not required:
            inherited = {k: v for k, v in running.body.items() if k not in _NOT_INHERITED}
            body = {**inherited, "previous_response_id": handle.id}
            return _Request(body, steers, explicit=False)
        self.waiting[handle.id] = (running.lane, steers)
        while len(self.waiting) > MAX_CONTEXTS:
            self.waiting.popitem(last=False)
        for steer in steers:
            await self._send_own(steering.pending(steer, required), running.lane)
        return None

    def _waited(self, previous: str | None, lane: Lane) -> tuple[Steer, ...]:
        """The steers waiting for the client's continuation of `previous` on this lane."""
        waiting = self.waiting.get(previous or "")
        if waiting is None or waiting[0] != lane:
            return ()
        del self.waiting[previous or ""]
        return waiting[1]

    async def _fail_steers(self, steers: tuple[Steer, ...], code: str, message: str) -> None:
        for steer in steers:
            lane = self._lane_of(steer.previous_response_id)
            await self._send_own(steering.failed_after(steer, code, message), lane)

    def _lane_of(self, response_id: str) -> Lane:
        """The lane of a response of this socket (None: the default lane, or none known)."""
        running = self.running.get(response_id)
        return running.lane if running is not None else self.ended.get(response_id, ("", None))[1]

    # ---- frames -----------------------------------------------------------------------------

    async def _error(self, lane: Lane, status: int, body: dict[str, Any]) -> None:
        """A request that failed before its response started: one error frame."""
        self.oars.metrics.socket_request("error")
        await self._send(_on_lane({"type": "error", "status": status, **body}, lane))

    async def _send_own(self, event: dict[str, Any], lane: Lane) -> None:
        """One of the socket's own events, numbered in their sequence."""
        event = {**event, "sequence_number": self.sequence_number}
        self.sequence_number += 1
        await self._send(_on_lane(event, lane))

    async def _send(self, event: dict[str, Any]) -> bool:
        """Send one frame; False once the client is gone."""
        if not self.open:
            return False
        try:
            async with self.sending:
                await self._send_text(event)
        except (WebSocketDisconnect, RuntimeError, OSError):
            self.open = False
            return False
        return True

    async def _send_text(self, event: dict[str, Any]) -> None:
        try:
            await self.websocket.send_text(json.dumps(event, ensure_ascii=False))
        except UnicodeEncodeError:  # a lone surrogate the client sent, echoed back
            await self.websocket.send_text(json.dumps(event))


def _not_running(target: str, status: str | None) -> SteerRefused:
    if status is None:
        return SteerRefused("response_not_found", f"No response {target!r} on this socket.")
    if status == "completed":
        return SteerRefused("response_already_completed", "The response has completed.")
    return SteerRefused("response_not_active", f"The response has ended {status}.")


def _on_lane(event: dict[str, Any], lane: Lane) -> dict[str, Any]:
    return event if lane is None else {**event, "stream_id": lane}


def _with_steers(body: dict[str, Any], steers: tuple[Steer, ...]) -> dict[str, Any]:
    """The body with the steers' messages first in its input, in submission order."""
    if not steers:
        return body
    given = body.get("input")
    if isinstance(given, str):
        given = [{"type": "message", "role": "user", "content": given}]
    messages = [dict(m) for steer in steers for m in steer.messages]
    return {**body, "input": [*messages, *(given if isinstance(given, list) else [])]}


def _message(frame: str) -> dict[str, Any]:
    """A frame as a client event (400 for one that is not)."""
    message = parse_json(frame.encode("utf-8", "surrogatepass"))
    if not isinstance(message, dict):
        raise InvalidRequest("A frame must be a JSON object.", param=None, code="invalid_type")
    kind = message.get("type")
    if kind not in ("response.create", "response.steer"):
        raise InvalidRequest(
            f"Invalid 'type': {kind!r}; this socket accepts 'response.create' and "
            "'response.steer'.",
            param="type",
            code="invalid_value",
        )
    return message


def _lane(message: dict[str, Any]) -> Lane:
    lane = message.get("stream_id")
    if lane is not None and not is_id(lane):
        raise InvalidRequest("'stream_id' must be a non-empty string.", param="stream_id")
    return lane


def _check_body(body: dict[str, Any]) -> None:
    if body.get("background"):
        raise InvalidRequest(
            "'background' is not supported over a WebSocket: a response runs "
            "while its socket is open.",
            param="background",
        )


def _create_body(message: dict[str, Any]) -> dict[str, Any]:
    """The create body of a `response.create` frame."""
    return {k: v for k, v in message.items() if k != "type" and k not in _NOT_ON_A_SOCKET}


async def responses_socket(websocket: WebSocket) -> None:
    await websocket.accept()
    websocket.app.state.oars.metrics.socket_opened()
    log.info("websocket opened")
    await _Socket(websocket).serve()
    with contextlib.suppress(WebSocketDisconnect, RuntimeError, OSError):
        await websocket.close()  # the client may have closed first
    log.info("websocket closed")
