"""`ws://HOST/v1/responses` on the scripted engine: frames, continuation, errors, hang-ups."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient, WebSocketDenialResponse
from starlette.websockets import WebSocketDisconnect

from oars.http import create_app
from oars.http.common import Shared
from oars.sealing import Sealer
from oars.service import ResponsesService
from oars.settings import ServerSettings
from oars.store import SqlStore
from oars.testing import ScriptedEngine
from oars.validator import validate_events
from tests.conftest import normalize_ids

GOLDEN = Path(__file__).parent.parent / "fixtures" / "golden"
TERMINAL = ("response.completed", "response.incomplete", "response.failed", "error")
Frames = list[dict[str, Any]]


def _client(
    engine: ScriptedEngine | None = None, store: SqlStore | None = None, **kw: Any
) -> TestClient:
    service = ResponsesService(engine or ScriptedEngine(), sealer=Sealer(b"0" * 43 + b"="))
    return TestClient(create_app(service, store, **kw))


def _shared(client: TestClient) -> Shared:
    shared: Shared = client.app.state.oars  # type: ignore[attr-defined]
    return shared


def _turn(ws: Any, body: dict[str, Any] | str) -> Frames:
    """Send one frame; the frames up to its response's end (checked), or its error frame."""
    ws.send_text(body if isinstance(body, str) else json.dumps(body))
    frames: Frames = []
    while not frames or frames[-1]["type"] not in TERMINAL:
        frames.append(json.loads(ws.receive_text()))
    if frames[-1]["type"] == "error" and len(frames) > 1:  # mid-stream: response.failed follows
        frames.append(json.loads(ws.receive_text()))
    if frames[0]["type"] != "error":  # a response: every one goes through the validator
        report = validate_events(frames)
        assert report.ok, report.text()
    return frames


def _create(**body: Any) -> dict[str, Any]:
    return {"type": "response.create", "model": "m", **body}


@pytest.fixture
def engine() -> ScriptedEngine:
    return ScriptedEngine()


@pytest.fixture
def socket(engine: ScriptedEngine) -> Iterator[Any]:
    with _client(engine) as client, client.websocket_connect("/v1/responses") as ws:
        yield ws


def test_a_session_streams_each_response_as_sse_would(socket: Any, engine: ScriptedEngine) -> None:
    first = _turn(socket, _create(input="Remember: cobalt.", store=False))
    second = _turn(
        socket,
        _create(input="The word?", store=False, previous_response_id=first[-1]["response"]["id"]),
    )
    for frames in (first, second):
        report = validate_events(frames)
        assert report.ok, report.text()
    got = normalize_ids([first, second])
    path = GOLDEN / "websocket_session.json"
    if os.environ.get("OARS_UPDATE_GOLDEN"):
        path.write_text(json.dumps(got, indent=1, ensure_ascii=False) + "\n")
    assert got == json.loads(path.read_text())
    # the continuation's prompt holds the first turn, though nothing was stored
    prompt = [(m.role, m.content) for m in engine.requests[1].messages]
    assert prompt == [
        ("user", "Remember: cobalt."),
        ("assistant", "Hello world!"),
        ("user", "The word?"),
    ]


def test_an_unknown_previous_response_is_an_error_frame_and_the_socket_goes_on(socket: Any) -> None:
    [frame] = _turn(socket, _create(input="x", store=False, previous_response_id="resp_nope"))
    message = frame["error"].pop("message")
    assert frame == {
        "type": "error",
        "status": 404,
        "error": {
            "type": "invalid_request_error",
            "code": "previous_response_not_found",
            "param": "previous_response_id",
        },
    }
    assert message.startswith("Previous response with id 'resp_nope' not found")
    assert _turn(socket, _create(input="again"))[-1]["type"] == "response.completed"


def test_only_the_last_response_of_the_same_socket_continues_without_a_store() -> None:
    with _client() as client:
        with client.websocket_connect("/v1/responses") as ws:
            first = _turn(ws, _create(input="one", store=False))[-1]["response"]["id"]
            second = _turn(ws, _create(input="two", store=False))[-1]["response"]["id"]
            [older] = _turn(ws, _create(input="x", previous_response_id=first))
            assert older["error"]["code"] == "previous_response_not_found"
            assert _turn(ws, _create(input="x", previous_response_id=second))[-1]["type"] == (
                "response.completed"
            )
        with client.websocket_connect("/v1/responses") as other:
            [elsewhere] = _turn(other, _create(input="x", previous_response_id=second))
            assert elsewhere["error"]["code"] == "previous_response_not_found"


def test_a_failed_continuation_forgets_the_response_it_continued(socket: Any) -> None:
    first = _turn(socket, _create(input="Remember: ember.", store=False))[-1]["response"]["id"]
    stray = {"type": "function_call_output", "call_id": "call_missing", "output": "x"}
    [failed] = _turn(socket, _create(input=[stray], store=False, previous_response_id=first))
    assert failed["status"] == 400 and failed["error"]["param"] == "input[0].call_id"
    [retry] = _turn(socket, _create(input="again", store=False, previous_response_id=first))
    assert retry["error"]["code"] == "previous_response_not_found"


def test_a_response_failed_mid_stream_also_forgets_what_it_continued() -> None:
    engine = ScriptedEngine(["a", ScriptedEngine.FAIL])
    with _client() as client, client.websocket_connect("/v1/responses") as ws:
        first = _turn(ws, _create(input="one"))[-1]["response"]["id"]
        _shared(client).service.engines["scripted"] = engine  # the next one fails
        _shared(client).service.default_model = "scripted"
        failed = _turn(ws, _create(input="two", previous_response_id=first))
        assert [f["type"] for f in failed[-2:]] == ["error", "response.failed"]
        assert validate_events(failed).ok
        [retry] = _turn(ws, _create(input="three", previous_response_id=first))
        assert retry["error"]["code"] == "previous_response_not_found"


def test_stored_responses_continue_from_any_socket(tmp_path: Path) -> None:
    store = SqlStore(f"sqlite:///{tmp_path}/oars.db")
    with _client(store=store) as client:
        with client.websocket_connect("/v1/responses") as ws:
            first = _turn(ws, _create(input="one"))[-1]["response"]
            assert first["store"] is True
            _turn(ws, _create(input="two"))
        with client.websocket_connect("/v1/responses") as other:
            frames = _turn(other, _create(input="x", previous_response_id=first["id"]))
            assert frames[-1]["type"] == "response.completed"
        assert client.get(f"/v1/responses/{first['id']}").json() == first


@pytest.mark.parametrize(
    ("frame", "status", "param", "code"),
    [
        ("not json", 400, None, "invalid_json"),
        ("[1]", 400, None, "invalid_type"),
        (json.dumps({"type": "response.cancel"}), 400, "type", "invalid_value"),
        (json.dumps(_create(input="x", background=True)), 400, "background", "invalid_value"),
        (json.dumps(_create()), 400, "input", "missing_required_parameter"),
        (json.dumps(_create(input="x", temperature=9)), 400, "temperature", "invalid_value"),
    ],
)
def test_a_bad_frame_is_an_error_frame_and_the_socket_goes_on(
    socket: Any, frame: str, status: int, param: str | None, code: str
) -> None:
    [error] = _turn(socket, frame)
    assert error["type"] == "error" and error["status"] == status
    assert (error["error"]["param"], error["error"]["code"]) == (param, code)
    assert set(error["error"]) == {"type", "code", "message", "param"}
    assert _turn(socket, _create(input="still here"))[-1]["type"] == "response.completed"


def test_stream_fields_are_implied_by_the_socket(socket: Any) -> None:
    frames = _turn(socket, _create(input="x", stream=True, stream_options={}))
    assert frames[-1]["type"] == "response.completed"


class _Counting(ScriptedEngine):
    produced = 0

    async def generate(self, opened: Any) -> Any:
        async for chunk in super().generate(opened):
            self.produced += 1
            yield chunk


def test_closing_the_socket_stops_its_generation() -> None:
    engine = _Counting(script=["x"] * 400, delay=0.01)
    with _client(engine) as client:
        with client.websocket_connect("/v1/responses") as ws:
            ws.send_text(json.dumps(_create(input="go")))
            while json.loads(ws.receive_text())["type"] != "response.output_text.delta":
                pass
        shared = _shared(client)
        for _ in range(200):
            if not shared.running:
                break
            time.sleep(0.01)
        assert not shared.running
        assert engine.produced < 100, engine.produced


def test_a_socket_needs_the_key_when_the_server_has_keys() -> None:
    with _client(settings=ServerSettings(api_keys=("k1",))) as client:
        with (
            pytest.raises(WebSocketDenialResponse) as denied,
            client.websocket_connect("/v1/responses"),
        ):
            pass
        assert denied.value.status_code == 401
        assert denied.value.json()["error"]["code"] == "missing_api_key"
        headers = {"Authorization": "Bearer k1"}
        with client.websocket_connect("/v1/responses", headers=headers) as ws:
            assert _turn(ws, _create(input="x"))[-1]["type"] == "response.completed"


def test_a_client_that_leaves_mid_frame_queue_does_not_break_the_server() -> None:
    with _client(ScriptedEngine(delay=0.01)) as client:
        with client.websocket_connect("/v1/responses") as ws:
            for _ in range(3):
                ws.send_text(json.dumps(_create(input="x")))
        with client.websocket_connect("/v1/responses") as ws:
            assert _turn(ws, _create(input="y"))[-1]["type"] == "response.completed"
        assert client.get("/health").status_code == 200


def test_http_is_untouched_on_the_same_path() -> None:
    with _client() as client:
        assert client.post("/v1/responses", json={"model": "m", "input": "x"}).status_code == 200
        with pytest.raises(WebSocketDisconnect), client.websocket_connect("/v1/nowhere"):
            pass


def test_generate_false_takes_the_input_and_a_continuation_renders_it() -> None:
    """Codex prewarms a socket with `generate: false`, then continues from that response."""
    engine = _Counting()
    with _client(engine) as client, client.websocket_connect("/v1/responses") as ws:
        warm = _turn(ws, _create(input="You are terse.", store=False, generate=False))
        assert validate_events(warm).ok
        final = warm[-1]["response"]
        assert final["status"] == "completed" and final["output"] == []
        assert final["usage"]["input_tokens"] > 0 and engine.produced == 0
        frames = _turn(ws, _create(input="Hi.", store=False, previous_response_id=final["id"]))
        assert frames[-1]["type"] == "response.completed" and engine.produced > 0
    prompt = [(m.role, m.content) for m in engine.requests[-1].messages]
    assert prompt == [("user", "You are terse."), ("user", "Hi.")]


def test_sockets_and_their_requests_are_counted() -> None:
    with _client() as client:
        with client.websocket_connect("/v1/responses") as ws:
            _turn(ws, _create(input="x"))
            _turn(ws, _create(input="x", previous_response_id="resp_nope"))
        text = client.get("/metrics").text
    assert "oars_websockets_total 1.0" in text
    assert 'oars_websocket_requests_total{outcome="response"} 1.0' in text
    assert 'oars_websocket_requests_total{outcome="error"} 1.0' in text
