"""`ws://HOST/v1/responses`: many responses on one socket, one after another.

A client sends text frames `{"type": "response.create", …the create body}`; each response's
events come back one JSON event per text frame, read from the same run log as SSE. A request
that fails before its response starts gets one frame `{"type": "error", "status", "error"}`,
and the socket stays open for the next.

The socket keeps its last response's context (input and output), so a continuation by
`previous_response_id` needs no store, even with `store: false`. It holds one response, as
OpenAI's does: an older id, another socket's, or one evicted by a failed continuation, is
`previous_response_not_found` unless the store has it. Closing the socket stops its
generation.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import Any

from starlette.websockets import WebSocket, WebSocketDisconnect

from oars.errors import ClientError, EngineError, InvalidRequest, StoreUnavailable
from oars.http.common import Shared, create_request, parse_json
from oars.runs import RunHandle
from oars.store import Chain

log = logging.getLogger("oars.http")

_NOT_ON_A_SOCKET = ("stream", "stream_options")  # implied by the transport; ignored
_QUEUED_FRAMES = 8  # read ahead while a response runs; past it, the socket is not read


class _Socket:
    """One client's socket: its frames, the response running, the last response's context."""

    def __init__(self, websocket: WebSocket) -> None:
        self.websocket = websocket
        self.oars: Shared = websocket.app.state.oars
        self.tenant = str(websocket.scope.get("state", {}).get("tenant", ""))
        self.last: tuple[str, Chain] | None = None  # (response id, its chain)
        self.running: RunHandle | None = None
        self.open = True

    async def serve(self) -> None:
        frames: asyncio.Queue[str | None] = asyncio.Queue(_QUEUED_FRAMES)
        reader = asyncio.create_task(self._read(frames))
        try:
            while self.open and (frame := await frames.get()) is not None:
                await self._respond(frame)
        finally:
            self.open = False
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader
            self._stop()

    async def _read(self, frames: asyncio.Queue[str | None]) -> None:
        try:
            while True:
                message = await self.websocket.receive()
                if message["type"] == "websocket.disconnect":
                    break
                text = message.get("text")
                if text is None:  # a binary frame: read as UTF-8 JSON too, or refused
                    text = (message.get("bytes") or b"").decode("utf-8", "replace")
                await frames.put(text)
        finally:
            self.open = False
            self._stop()  # a client that hangs up stops its generation
            with contextlib.suppress(asyncio.QueueFull):
                frames.put_nowait(None)

    def _stop(self) -> None:
        if self.running is not None and not self.running.done:
            log.info("websocket closed; generation stopped")
            self.running.cancel()

    async def _respond(self, frame: str) -> None:
        previous: str | None = None
        try:
            body = _create_body(frame)
            previous = body.get("previous_response_id") if isinstance(body, dict) else None
            req = create_request(self.oars, body)
            known = self.last[1] if self.last and self.last[0] == previous else None
            handle = await self.oars.tenant(self.tenant).submit(req, known)
        except (ClientError, EngineError, StoreUnavailable) as exc:
            await self._error(previous, exc.status, exc.body())
            return
        except Exception:
            log.exception("websocket response.create")
            await self._error(
                previous,
                500,
                {
                    "error": {
                        "type": "server_error",
                        "code": "server_error",
                        "message": "internal server error",
                        "param": None,
                    }
                },
            )
            return
        self.oars.metrics.socket_request("response")
        self.running = handle
        try:
            async for event in handle.events():
                if not await self._send(event):
                    break
        finally:
            self.running = None
            if not handle.done:  # the client went away mid-response
                handle.cancel()
        self._remember(handle, previous)

    async def _error(self, previous: str | None, status: int, body: dict[str, Any]) -> None:
        """A request that failed before its response started: one error frame."""
        self.oars.metrics.socket_request("error")
        self._forget(previous)
        await self._send({"type": "error", "status": status, **body})

    def _remember(self, handle: RunHandle, previous: str | None) -> None:
        """A finished response becomes the one to continue from; a failed continuation
        forgets the response it continued."""
        snapshot = handle.snapshot
        if snapshot["status"] in ("completed", "incomplete"):
            context = (*handle.turn.stored_input, *snapshot["output"])
            self.last = (handle.id, Chain(context, handle.generation.served_by))
        else:
            self._forget(previous)

    def _forget(self, response_id: str | None) -> None:
        if response_id is not None and self.last is not None and self.last[0] == response_id:
            self.last = None

    async def _send(self, event: dict[str, Any]) -> bool:
        """Send one frame; False once the client is gone."""
        if not self.open:
            return False
        try:
            await self.websocket.send_text(json.dumps(event, ensure_ascii=False))
        except (WebSocketDisconnect, RuntimeError, OSError):
            self.open = False
            return False
        except UnicodeEncodeError:  # a lone surrogate the client sent, echoed back
            await self.websocket.send_text(json.dumps(event))
        return True


def _create_body(frame: str) -> Any:
    """The create body of a `response.create` frame (400 for anything else)."""
    message = parse_json(frame.encode("utf-8", "surrogatepass"))
    if not isinstance(message, dict):
        raise InvalidRequest("A frame must be a JSON object.", param=None, code="invalid_type")
    kind = message.get("type")
    if kind != "response.create":
        raise InvalidRequest(
            f"Invalid 'type': {kind!r}; this socket accepts 'response.create'.",
            param="type",
            code="invalid_value",
        )
    if message.get("background"):
        raise InvalidRequest(
            "'background' is not supported over a WebSocket: a response runs "
            "while its socket is open.",
            param="background",
        )
    return {k: v for k, v in message.items() if k != "type" and k not in _NOT_ON_A_SOCKET}


async def responses_socket(websocket: WebSocket) -> None:
    await websocket.accept()
    websocket.app.state.oars.metrics.socket_opened()
    log.info("websocket opened")
    await _Socket(websocket).serve()
    with contextlib.suppress(WebSocketDisconnect, RuntimeError, OSError):
        await websocket.close()  # the client may have closed first
    log.info("websocket closed")
