"""`/v1/responses/compact`, compaction items as input, and `context_management` on create."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.testclient import TestClient

from oars.compaction import SUMMARY_PREFIX
from oars.compactor import INSTRUCTIONS, compact_turn
from oars.generation import Completion, EngineRequest, Usage
from oars.http import create_app
from oars.normalize import normalize
from oars.sealing import Sealer
from oars.service import ResponsesService
from oars.store import SqlStore
from oars.testing import ScriptedEngine
from oars.turn import Turn
from oars.validator import validate_events, validate_sse

KEY = b"1" * 43 + b"="
HISTORY = [
    {"type": "message", "role": "user", "content": "Fix the failing test in calc.py."},
    {"type": "message", "role": "assistant", "content": "Reading the file."},
    {"type": "function_call", "call_id": "c1", "name": "read", "arguments": '{"path": "calc.py"}'},
    {"type": "function_call_output", "call_id": "c1", "output": "def add(a, b): return a - b"},
    {"type": "message", "role": "assistant", "content": "add subtracts; I will fix it."},
]


@asynccontextmanager
async def _client(
    engine: ScriptedEngine, store: SqlStore | None = None
) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(ResponsesService(engine, sealer=Sealer(KEY)), store)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t/v1") as client:
            yield client


def _post(engine: ScriptedEngine, path: str, body: Any) -> httpx.Response:
    async def go() -> httpx.Response:
        async with _client(engine) as client:
            return await client.post(path, json=body)

    return asyncio.run(go())


def _prompt(engine: ScriptedEngine, index: int = -1) -> list[tuple[str, str]]:
    return [(m.role, m.content) for m in engine.requests[index].messages]


def _summarizing(request: Any) -> bool:
    return bool(request.messages[0].content == INSTRUCTIONS)


def _compacted(engine: ScriptedEngine, items: list[Any] = HISTORY) -> dict[str, Any]:
    r = _post(engine, "/responses/compact", {"model": "m", "input": items})
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


def test_compact_keeps_user_messages_and_seals_a_summary_the_model_wrote() -> None:
    engine = ScriptedEngine(["Task: fix add in calc.py."])
    body = _compacted(engine)
    assert body["object"] == "response.compaction" and body["id"].startswith("resp_")
    assert isinstance(body["created_at"], int)
    *kept, item = body["output"]
    assert [(k["role"], k["content"][0]["text"]) for k in kept] == [
        ("user", "Fix the failing test in calc.py.")
    ]
    assert item["type"] == "compaction" and item["id"].startswith("cmp_")
    assert "calc.py" not in item["encrypted_content"]  # sealed, not readable
    assert body["usage"]["output_tokens"] == 1 and body["usage"]["input_tokens"] > 0
    # the summary was asked of the model, with the whole history as a transcript
    [(system, instructions), (user, transcript)] = _prompt(engine)
    assert system == "system" and "Files" in instructions and user == "user"
    for fact in ("Fix the failing test", "Assistant called read", "return a - b", "add subtracts"):
        assert fact in transcript


def test_the_compacted_output_as_input_is_the_summary_in_the_prompt() -> None:
    engine = ScriptedEngine(["Task: fix add in calc.py."])
    output = _compacted(engine)["output"]
    question = {"type": "message", "role": "user", "content": "Go on."}
    r = _post(engine, "/responses", {"model": "m", "input": [*output, question]})
    assert r.status_code == 200, r.text
    assert _prompt(engine) == [
        ("user", SUMMARY_PREFIX + "Task: fix add in calc.py."),
        ("user", "Fix the failing test in calc.py."),
        ("user", "Go on."),
    ]


def test_the_whole_history_sent_back_with_the_item_renders_the_same() -> None:
    engine = ScriptedEngine(["S."])
    item = _compacted(engine)["output"][-1]
    question = {"type": "message", "role": "user", "content": "Go on."}
    _post(engine, "/responses", {"model": "m", "input": [*HISTORY, item, question]})
    assert _prompt(engine) == [
        ("user", SUMMARY_PREFIX + "S."),
        ("user", "Fix the failing test in calc.py."),
        ("user", "Go on."),
    ]


def test_a_second_compaction_covers_the_first() -> None:
    engine = ScriptedEngine(["S."])
    first = _compacted(engine)["output"]
    more = [
        *first,
        {"type": "message", "role": "assistant", "content": "Fixed."},
        {"type": "message", "role": "user", "content": "Now the docs."},
    ]
    second = _compacted(engine, more)["output"]
    assert [i.get("role") or i["type"] for i in second] == ["user", "user", "compaction"]
    _post(engine, "/responses", {"model": "m", "input": [*more, second[-1]]})
    prompt = _prompt(engine)
    assert [c for _, c in prompt].count(SUMMARY_PREFIX + "S.") == 1
    assert ("assistant", "Fixed.") not in prompt


@pytest.mark.parametrize(
    ("body", "param", "code"),
    [
        ({"input": HISTORY}, "model", "missing_required_parameter"),
        ({"model": "m"}, "input", "missing_required_parameter"),
        ({"model": "m", "input": 3}, "input", "invalid_type"),
        (
            {"model": "m", "input": [{"type": "message", "role": "user", "content": 1}]},
            "input[0].content",
            "invalid_value",
        ),
        (
            {"model": "m", "input": [{"type": "compaction", "encrypted_content": "x"}]},
            "input[0].encrypted_content",
            "invalid_encrypted_content",
        ),
    ],
)
def test_a_bad_compact_request_is_400(body: dict[str, Any], param: str, code: str) -> None:
    r = _post(ScriptedEngine(), "/responses/compact", body)
    assert r.status_code == 400, r.text
    assert (r.json()["error"]["param"], r.json()["error"]["code"]) == (param, code)


def test_a_tampered_compaction_is_400_on_create() -> None:
    engine = ScriptedEngine(["S."])
    item = _compacted(engine)["output"][-1]
    sealed = item["encrypted_content"]
    forged = {
        **item,
        "encrypted_content": sealed[:-6] + ("A" if sealed[-6] != "A" else "B") + sealed[-5:],
    }
    r = _post(
        engine, "/responses", {"model": "m", "input": [forged, {"role": "user", "content": "hi"}]}
    )
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "input[0].encrypted_content"


def test_compact_from_a_stored_previous_response(tmp_path: Path) -> None:
    engine = ScriptedEngine(["Noted."])

    async def go() -> None:
        async with _client(engine, SqlStore(f"sqlite:///{tmp_path}/oars.db")) as client:
            first = (await client.post("/responses", json={"model": "m", "input": HISTORY})).json()
            r = await client.post(
                "/responses/compact",
                json={
                    "model": "m",
                    "previous_response_id": first["id"],
                    "input": [{"role": "user", "content": "And the docs."}],
                },
            )
            assert r.status_code == 200, r.text
            kept = [k["content"][0]["text"] for k in r.json()["output"][:-1]]
            assert kept == ["Fix the failing test in calc.py.", "And the docs."]
            missing = await client.post(
                "/responses/compact",
                json={"model": "m", "previous_response_id": "resp_gone", "input": "x"},
            )
            assert missing.status_code == 404
            assert missing.json()["error"]["code"] == "previous_response_not_found"

    asyncio.run(go())


LONG = " ".join(["filler"] * 1200)


def test_context_management_compacts_a_long_chain_first(tmp_path: Path) -> None:
    engine = ScriptedEngine(["Short."])

    async def go() -> None:
        async with _client(engine, SqlStore(f"sqlite:///{tmp_path}/oars.db")) as client:
            first = (
                await client.post(
                    "/responses",
                    json={
                        "model": "m",
                        "input": [
                            {"role": "user", "content": "Task: count."},
                            {
                                "type": "function_call",
                                "call_id": "c0",
                                "name": "read",
                                "arguments": "{}",
                            },
                            {"type": "function_call_output", "call_id": "c0", "output": LONG},
                        ],
                    },
                )
            ).json()
            managed = {"context_management": [{"type": "compaction", "compact_threshold": 1000}]}
            r = await client.post(
                "/responses",
                json={
                    "model": "m",
                    "stream": True,
                    "previous_response_id": first["id"],
                    "input": "Next?",
                    **managed,
                },
            )
            report = validate_sse(r.text)
            assert report.ok, report.text()
            final = report.final
            assert final is not None
            assert [i["type"] for i in final["output"]] == ["compaction", "message"]
            assert [e["type"] for e in report.events][2] == "response.compaction.compacting"
            assert _summarizing(engine.requests[-2])
            prompt = _prompt(engine)
            assert all(LONG not in c for _, c in prompt), "the long message was compacted"
            assert prompt == [
                ("user", SUMMARY_PREFIX + "Short."),
                ("user", "Task: count."),
                ("user", "Next?"),
            ]
            # the chain goes on from the compaction, without compacting again
            calls = len(engine.requests)
            again = await client.post(
                "/responses",
                json={
                    "model": "m",
                    "previous_response_id": final["id"],
                    "input": "And?",
                    **managed,
                },
            )
            assert again.status_code == 200
            assert not [r for r in engine.requests[calls:] if _summarizing(r)]
            assert all(LONG not in c for _, c in _prompt(engine))
            assert [i["type"] for i in again.json()["output"]] == ["message"]

    asyncio.run(go())


def test_context_management_leaves_a_short_context_alone() -> None:
    engine = ScriptedEngine(["Hi."])
    r = _post(
        engine,
        "/responses",
        {
            "model": "m",
            "input": "hi",
            "context_management": [{"type": "compaction", "compact_threshold": 1000}],
        },
    )
    assert [i["type"] for i in r.json()["output"]] == ["message"]
    assert not [r for r in engine.requests if _summarizing(r)]


@pytest.mark.parametrize(
    ("entries", "param"),
    [
        ("x", "context_management"),
        ([{"type": "truncate"}], "context_management[0].type"),
        (
            [{"type": "compaction", "compact_threshold": 10}],
            "context_management[0].compact_threshold",
        ),
        (
            [{"type": "compaction", "compact_threshold": "big"}],
            "context_management[0].compact_threshold",
        ),
    ],
)
def test_bad_context_management_is_400(entries: Any, param: str) -> None:
    r = _post(
        ScriptedEngine(), "/responses", {"model": "m", "input": "x", "context_management": entries}
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == param


def test_a_compacted_history_starts_a_new_websocket_chain() -> None:
    engine = ScriptedEngine(["Code word: slate."])
    output = _compacted(
        engine,
        [
            {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "Remember the code word: slate."}],
            },
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "OK."}],
            },
        ],
    )["output"]
    app = create_app(ResponsesService(engine, sealer=Sealer(KEY)))
    with TestClient(app) as client, client.websocket_connect("/v1/responses") as ws:
        ws.send_text(
            json.dumps(
                {
                    "type": "response.create",
                    "model": "m",
                    "store": False,
                    "tools": [],
                    "input": [*output, {"type": "message", "role": "user", "content": "Continue."}],
                }
            )
        )
        frames = [json.loads(ws.receive_text())]
        while frames[-1]["type"] not in ("response.completed", "response.failed", "error"):
            frames.append(json.loads(ws.receive_text()))
    assert frames[-1]["type"] == "response.completed", frames[-1]
    assert validate_events(frames).ok
    assert ("user", SUMMARY_PREFIX + "Code word: slate.") in _prompt(engine)


def test_repetition_is_squeezed_out_of_the_transcript_and_the_summary() -> None:
    """A small model copies repeated lines and may loop: the transcript shows a run of one line
    once, and the summary keeps each line once."""
    engine = ScriptedEngine(["Task: x\n", "- x = 1\n", "- x = 1\n", "- x = 1\n", "Next: y"])
    output = [{"type": "function_call_output", "call_id": "c1", "output": "x = 1\n" * 40}]
    call = {"type": "function_call", "call_id": "c1", "name": "read", "arguments": "{}"}
    item = _compacted(engine, [HISTORY[0], call, *output])["output"][-1]
    transcript = _prompt(engine)[-1][1]
    assert "x = 1  [40 times]" in transcript and "x = 1\nx = 1" not in transcript
    summary = json.loads(Sealer(KEY).unseal(item["encrypted_content"]))["summary"]
    assert summary == "Task: x\n- x = 1\nNext: y"


def test_a_compaction_trigger_compacts_everything_and_generates_nothing() -> None:
    """Codex's remote compaction (v2): the input ends with `compaction_trigger`; the response's
    only output item is the compaction."""
    engine = ScriptedEngine(["Summary."])
    trigger = {"type": "compaction_trigger"}
    r = _post(engine, "/responses", {"model": "m", "stream": True, "input": [*HISTORY, trigger]})
    report = validate_sse(r.text)
    assert report.ok, report.text()
    assert report.final is not None and report.final["status"] == "completed"
    assert [item["type"] for item in report.final["output"]] == ["compaction"]
    assert report.final["usage"]["output_tokens"] == 0
    assert [r for r in engine.requests if _summarizing(r)]
    # what the next request renders: the user message and the summary
    item = report.final["output"][0]
    question = {"role": "user", "content": "Go on."}
    _post(engine, "/responses", {"model": "m", "input": [*HISTORY, item, question]})
    assert _prompt(engine) == [
        ("user", SUMMARY_PREFIX + "Summary."),
        ("user", "Fix the failing test in calc.py."),
        ("user", "Go on."),
    ]


def test_the_summary_is_sampled_in_the_stream_under_compacting() -> None:
    """The response starts before the summary is sampled: `response.compaction.compacting`
    names the compaction item, which is added once it is made."""
    trigger = {"type": "compaction_trigger"}
    r = _post(
        ScriptedEngine(["Summary."]),
        "/responses",
        {"model": "m", "stream": True, "input": [*HISTORY, trigger]},
    )
    report = validate_sse(r.text)
    assert report.ok, report.text()
    kinds = [e["type"] for e in report.events]
    assert kinds[:5] == [
        "response.created",
        "response.in_progress",
        "response.compaction.compacting",
        "response.output_item.added",
        "response.output_item.done",
    ]
    compacting, added = report.events[2], report.events[3]
    assert compacting["item_id"] == added["item"]["id"] and compacting["output_index"] == 0


def test_a_summary_that_fails_fails_the_response_in_its_stream() -> None:
    engine = ScriptedEngine(["Sum", ScriptedEngine.FAIL])
    trigger = {"type": "compaction_trigger"}
    r = _post(engine, "/responses", {"model": "m", "stream": True, "input": [*HISTORY, trigger]})
    assert r.status_code == 200
    report = validate_sse(r.text)
    assert report.ok, report.text()
    assert [e["type"] for e in report.events][2:] == [
        "response.compaction.compacting",
        "error",
        "response.failed",
    ]
    assert report.final is not None and report.final["output"] == []
    assert "summary could not be written" in report.final["error"]["message"]


def test_nothing_to_compact_is_400_before_the_stream() -> None:
    trigger = {"type": "compaction_trigger"}
    r = _post(
        ScriptedEngine(["S."]),
        "/responses",
        {"model": "m", "stream": True, "input": [{"type": "reasoning", "summary": []}, trigger]},
    )
    assert r.status_code == 400, r.text
    assert "nothing to compact" in r.json()["error"]["message"]


def test_a_compaction_trigger_must_come_last() -> None:
    r = _post(
        ScriptedEngine(),
        "/responses",
        {"model": "m", "input": [{"type": "compaction_trigger"}, {"role": "user", "content": "x"}]},
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "input[0]"


def test_compactions_are_counted_by_how_they_were_asked_for() -> None:
    engine = ScriptedEngine(["S."])
    app = create_app(ResponsesService(engine, sealer=Sealer(KEY)))
    with TestClient(app) as client:
        client.post("/v1/responses/compact", json={"model": "m", "input": HISTORY})
        client.post(
            "/v1/responses",
            json={"model": "m", "input": [*HISTORY, {"type": "compaction_trigger"}]},
        )
        text = client.get("/metrics").text
    assert 'oars_compactions_total{how="endpoint",model="m"} 1.0' in text
    assert 'oars_compactions_total{how="trigger",model="m"} 1.0' in text


class _Summarizer:
    """A `Summarizer` without a service or an engine: what compacting asks of the server."""

    def __init__(self) -> None:
        self.sealer: Sealer | None = Sealer(KEY)
        self.asked: list[EngineRequest] = []

    def context_length(self, model: str) -> int | None:
        return 4096

    async def count_tokens(self, model: str, request: EngineRequest) -> int:
        return 100

    async def complete(self, model: str, request: EngineRequest) -> Completion:
        self.asked.append(request)
        return Completion("Summary by the fake.", Usage(10, 0, 5))


def test_a_turn_compacts_through_a_summarizer_and_stays_a_value() -> None:
    body = {"model": "m", "input": [*HISTORY, {"type": "compaction_trigger"}]}
    turn = Turn.of(normalize(body, served_model="m"), Sealer(KEY).unseal)
    summarizer = _Summarizer()
    compacted = asyncio.run(compact_turn(turn, summarizer))
    assert turn.compacted is None, "the turn it was given is unchanged"
    assert compacted.compacted is not None and compacted.compacted["type"] == "compaction"
    assert compacted.items[-1] is compacted.compacted
    assert len(summarizer.asked) == 1 and summarizer.asked[0].messages[0].content == INSTRUCTIONS
    said = [(m.role, m.content) for m in compacted.messages]
    assert said == [
        ("user", SUMMARY_PREFIX + "Summary by the fake."),
        ("user", "Fix the failing test in calc.py."),
    ]
