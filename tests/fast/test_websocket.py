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
from oars.http.lanes import MAX_LANES, MAX_QUEUED
from oars.http.steering import MAX_PENDING_STEERS, required_input
from oars.sealing import Sealer
from oars.service import ResponsesService
from oars.settings import ServerSettings
from oars.store import SqlStore
from oars.testing import ScriptedEngine
from oars.validator import validate_events, validate_socket
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


# ---- lanes ------------------------------------------------------------------------------------


class _Session:
    """A socket's frames as they come; `valid()` puts all of them through the validator."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self.frames: Frames = []

    def send(self, message: dict[str, Any]) -> None:
        self.ws.send_text(json.dumps(message))

    def steer(self, previous: str, value: Any = "Answer in French.") -> None:
        self.send({"type": "response.steer", "previous_response_id": previous, "input": value})

    def read(self, done: Any) -> Frames:
        """The frames from now until `done(those frames)`."""
        new: Frames = []
        while not done(new):
            new.append(json.loads(self.ws.receive_text()))
        self.frames += new
        return new

    def started(self, body: dict[str, Any], delta: bool = True) -> str:
        """Send a create; read up to its first text delta (or its `response.created`)."""
        self.send(body)
        kind = "response.output_text.delta" if delta else "response.created"
        return str(self.read(lambda f: bool(f) and f[-1]["type"] == kind)[0]["response"]["id"])

    def valid(self) -> Frames:
        report = validate_socket(self.frames)
        assert report.ok, report.text()
        return self.frames


def _ends(count: int) -> Any:
    return lambda frames: sum(f["type"] in TERMINAL[:3] for f in frames) >= count


def _last_is(kind: str) -> Any:
    return lambda frames: bool(frames) and frames[-1]["type"] == kind


def _of(frames: Frames, lane: str | None) -> Frames:
    return [f for f in frames if f.get("stream_id") == lane]


@pytest.fixture
def session(socket: Any) -> _Session:
    return _Session(socket)


def _slow_session(engine: ScriptedEngine) -> Iterator[tuple[ScriptedEngine, _Session]]:
    with _client(engine) as client, client.websocket_connect("/v1/responses") as ws:
        yield engine, _Session(ws)


@pytest.fixture
def slow() -> Iterator[tuple[ScriptedEngine, _Session]]:
    """A socket on an engine that writes 300 tokens, one each 10 ms, for a first turn (two
    words to a continuation)."""
    engine = ScriptedEngine(
        lambda request: ["word "] * 300 if len(request.messages) == 1 else ["Bien", "."],
        delay=0.01,
    )
    yield from _slow_session(engine)


def test_two_lanes_run_at_once_each_in_order() -> None:
    engine = ScriptedEngine(["a", "b", "c", "d", "e", "f"], delay=0.02)
    with _client(engine) as client, client.websocket_connect("/v1/responses") as ws:
        session = _Session(ws)
        for lane in ("one", "two"):
            session.send(_create(input=f"lane {lane}", stream_id=lane))
        session.read(_ends(2))
        frames = session.valid()
    lanes = [f["stream_id"] for f in frames]
    first_end = min(max(i for i, lane in enumerate(lanes) if lane == x) for x in ("one", "two"))
    assert set(lanes[:first_end]) == {"one", "two"}  # interleaved: both ran before either ended
    for lane in ("one", "two"):
        events = _of(frames, lane)
        assert [e["sequence_number"] for e in events] == list(range(len(events)))
        assert events[-1]["type"] == "response.completed"


def test_a_lane_runs_its_requests_first_in_first_out(session: _Session) -> None:
    for text in ("first", "second"):
        session.send(_create(input=text, stream_id="l"))
    session.read(_ends(2))
    kinds = [f["type"] for f in session.valid()]
    second = [i for i, k in enumerate(kinds) if k == "response.created"][1]
    assert second > kinds.index("response.completed")


def test_a_lane_forks_from_a_response_made_on_another_lane(
    session: _Session, engine: ScriptedEngine
) -> None:
    root = session.started(_create(input="Remember: cobalt.", store=False, stream_id="a"))
    session.read(_ends(1))
    for lane, text in (("a", "On a."), ("b", "On b.")):
        session.send(_create(input=text, store=False, stream_id=lane, previous_response_id=root))
    session.read(_ends(2))
    ended = [f["response"] for f in session.valid() if f["type"] == "response.completed"]
    assert [r["previous_response_id"] for r in ended[1:]] == [root, root]
    prompts = {r.messages[-1].content: [m.content for m in r.messages] for r in engine.requests}
    assert prompts["On a."] == ["Remember: cobalt.", "Hello world!", "On a."]
    assert prompts["On b."] == ["Remember: cobalt.", "Hello world!", "On b."]
    # root is no longer lane a's last: lane a may not go back to it, lane c may fork from it
    session.send(_create(input="x", store=False, stream_id="a", previous_response_id=root))
    [error] = session.read(lambda f: len(f) == 1)
    assert error["error"]["code"] == "previous_response_not_found"
    session.send(_create(input="On c.", store=False, stream_id="c", previous_response_id=root))
    assert session.read(_ends(1))[-1]["response"]["status"] == "completed"
    session.valid()


def test_a_lanes_error_frame_carries_its_stream_id(session: _Session) -> None:
    session.send(_create(stream_id="s1"))
    session.send(_create(input="x", stream_id=""))
    [error, bad] = session.read(lambda f: len(f) == 2)
    assert (error["type"], error["status"], error["stream_id"]) == ("error", 400, "s1")
    assert error["error"]["param"] == "input"
    assert bad["error"]["param"] == "stream_id" and "stream_id" not in bad
    session.valid()


def test_lanes_and_queued_requests_are_limited(slow: tuple[ScriptedEngine, _Session]) -> None:
    _, session = slow
    for i in range(MAX_LANES):
        session.send(_create(input="x", stream_id=f"l{i}"))
    session.send(_create(input="x", stream_id="one too many"))
    for _ in range(MAX_QUEUED + 1):
        session.send(_create(input="x", stream_id="l0"))
    frames = session.read(lambda f: sum(x["type"] == "error" for x in f) == 2)
    refused = [f for f in frames if f["type"] == "error"]
    assert [(f["status"], f["error"]["code"], f["stream_id"]) for f in refused] == [
        (429, "too_many_lanes", "one too many"),
        (429, "too_many_queued_requests", "l0"),
    ]


# ---- steering ---------------------------------------------------------------------------------


def test_a_steered_response_ends_steered_and_a_successor_continues_with_the_input(
    slow: tuple[ScriptedEngine, _Session],
) -> None:
    engine, session = slow
    first = session.started(_create(input="Write a lot.", store=False, stream_id="s"))
    session.steer(first)
    session.read(_ends(2))
    frames = session.valid()
    [accepted] = [f for f in frames if f["type"] == "response.steer.accepted"]
    assert accepted["steer"]["previous_response_id"] == first
    assert (accepted["sequence_number"], accepted["stream_id"]) == (0, "s")
    [ended, successor] = [f["response"] for f in frames if f["type"] in TERMINAL[:3]]
    assert ended["status"] == "incomplete"
    assert ended["incomplete_details"] == {"reason": "steered"}
    assert ended["output"][-1]["status"] == "incomplete"
    assert ended["usage"]["output_tokens"] < 300
    assert (successor["status"], successor["previous_response_id"]) == ("completed", first)
    created = [f for f in frames if f["type"] == "response.created"]
    assert frames.index(accepted) < frames.index(created[1])  # accepted, then committed
    assert all(f.get("stream_id") == "s" for f in frames)
    partial = ended["output"][-1]["content"][0]["text"]
    prompt = [(m.role, m.content) for m in engine.requests[1].messages]
    assert prompt == [
        ("user", "Write a lot."),
        ("assistant", partial),
        ("user", "Answer in French."),
    ]


@pytest.mark.parametrize(
    ("value", "where"),
    [
        ("", "'input'"),
        ([], "'input'"),
        ([{"role": "assistant", "content": "x"}], "input[0]"),
        ([{"type": "function_call_output", "call_id": "c", "output": "x"}], "input[0]"),
        ([{"role": "user", "content": [{"type": "output_text", "text": "x"}]}], "input[0]"),
    ],
)
def test_steering_input_must_be_user_messages(
    slow: tuple[ScriptedEngine, _Session], value: Any, where: str
) -> None:
    _, session = slow
    first = session.started(_create(input="Go."))
    session.steer(first, value)
    [failed] = session.read(_last_is("response.steer.failed"))[-1:]
    assert failed["error"]["code"] == "invalid_input" and where in failed["error"]["message"]
    assert failed["steer"]["previous_response_id"] == first and "id" not in failed["steer"]
    assert failed["steer"]["input"] in (value, [])  # [] where the SDK's type cannot hold it
    assert validate_socket([failed]).ok


def test_steering_what_is_not_running_here_is_refused(session: _Session) -> None:
    session.send(_create(input="x"))
    done = session.read(_ends(1))[-1]["response"]["id"]
    session.steer(done)
    session.steer("resp_elsewhere")
    frames = session.read(lambda f: len(f) == 2)
    codes = [f["error"]["code"] for f in frames]
    assert codes == ["response_already_completed", "response_not_found"]
    session.valid()


def test_steering_is_refused_with_automatic_compaction(
    slow: tuple[ScriptedEngine, _Session],
) -> None:
    _, session = slow
    managed = {"context_management": [{"type": "compaction", "compact_threshold": 100000}]}
    first = session.started(_create(input="Go.", **managed))
    session.steer(first)
    [failed] = session.read(_last_is("response.steer.failed"))[-1:]
    assert failed["error"]["code"] == "steering_not_supported"
    assert failed["steer"] == {"input": "Answer in French.", "previous_response_id": first}
    assert validate_socket([failed]).ok


WEATHER = {
    "type": "function",
    "name": "get_weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}
CALL = ['<tool_call>{"name": "get_weather", ', '"arguments": {"city": "Paris"}}', "</tool_call>"]


def test_a_steer_waits_for_the_client_tool_output_then_goes_first() -> None:
    engine = ScriptedEngine(
        lambda request: ["Sunny."] if request.after_tool_output else CALL, delay=0.05
    )
    with _client(engine) as client, client.websocket_connect("/v1/responses") as ws:
        session = _Session(ws)
        body = _create(input="Weather?", tools=[WEATHER], stream_id="t")
        first = session.started(body, delta=False)
        session.steer(first, "Also say hi.")
        frames = session.read(_last_is("response.steer.pending"))
        assert frames[-2]["type"] == "response.completed"  # pending follows the completion
        [call] = frames[-2]["response"]["output"]
        pending = frames[-1]
        assert (pending["reason"], pending["stream_id"]) == ("waiting_for_required_input", "t")
        assert pending["required_input"] == [
            {"type": "function_call_output", "call_id": call["call_id"], "name": "get_weather"}
        ]
        answer = {"type": "function_call_output", "call_id": call["call_id"], "output": "20C"}
        session.send({**body, "input": [answer], "previous_response_id": first})
        assert session.read(_ends(1))[-1]["response"]["status"] == "completed"
        session.valid()
    prompt = [(m.role, m.content) for m in engine.requests[1].messages]
    assert prompt[2] == ("user", "Also say hi.")  # first in what is new, as the SDK says
    assert prompt[3][0] == "tool"


def test_steers_queued_on_one_response_are_limited() -> None:
    """Steers sent while the model writes a call (no boundary to stop at) all wait on it."""
    slow_call = ['<tool_call>{"name": "get_weather", "arguments": {"city": "', *["P"] * 100]
    engine = ScriptedEngine([*slow_call, '"}}</tool_call>'], delay=0.01)
    with _client(engine) as client, client.websocket_connect("/v1/responses") as ws:
        session = _Session(ws)
        first = session.started(_create(input="Go.", tools=[WEATHER]), delta=False)
        for i in range(MAX_PENDING_STEERS + 1):
            session.steer(first, f"steer {i}")
        session.read(lambda f: sum(x["type"] == "response.steer.pending" for x in f) == 8)
        answers = [f for f in session.valid() if f["type"].startswith("response.steer")]
    kinds = [f["type"] for f in answers]
    assert kinds[: MAX_PENDING_STEERS + 1] == [
        *["response.steer.accepted"] * MAX_PENDING_STEERS,
        "response.steer.failed",
    ]
    assert answers[MAX_PENDING_STEERS]["error"]["code"] == "too_many_pending_steers"
    assert kinds[MAX_PENDING_STEERS + 1 :] == ["response.steer.pending"] * MAX_PENDING_STEERS


def test_the_required_input_of_a_response_is_what_the_client_must_answer() -> None:
    output: list[dict[str, Any]] = [
        {"type": "message", "id": "msg_1", "status": "completed", "content": []},
        {"type": "function_call", "call_id": "c1", "name": "f", "status": "completed"},
        {"type": "function_call", "call_id": "c2", "name": "f", "status": "incomplete"},
        {"type": "shell_call", "call_id": "c3", "status": "completed"},
        {"type": "apply_patch_call", "call_id": "c4", "status": "completed"},
        {"type": "tool_search_call", "call_id": "c5", "status": "completed", "execution": "server"},
        {"type": "tool_search_call", "call_id": "c6", "status": "completed", "execution": "client"},
        {"type": "mcp_approval_request", "id": "mcpr_1"},
    ]
    required = required_input(output)
    assert required == [
        {"type": "function_call_output", "call_id": "c1", "name": "f"},
        {"type": "shell_call_output", "call_id": "c3"},
        {"type": "apply_patch_call_output", "call_id": "c4"},
        {"type": "tool_search_output", "call_id": "c6", "execution": "client"},
        {"type": "mcp_approval_response", "approval_request_id": "mcpr_1"},
    ]
    pending = {
        "type": "response.steer.pending",
        "sequence_number": 0,
        "reason": "waiting_for_required_input",
        "required_input": required,
        "steer": {"id": "steer_1", "previous_response_id": "resp_1"},
    }
    assert validate_socket([pending]).ok
