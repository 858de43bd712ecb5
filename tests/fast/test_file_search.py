"""The `file_search` tool in a response, on the scripted engine and a real store (SQLite and
PostgreSQL): the model's call searches the request's vector stores, the model reads what it
found under handles, and its citation becomes a `file_citation` in every view of the text; the
stored response is what was streamed. A store the key does not own is a 404 before anything
is sent."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx
import openai

from oars.generation import EngineRequest
from oars.testing import ScriptedEngine
from oars.validator import validate_sse
from tests.conftest import files_server, sdk

CORPUS = Path(__file__).parents[1] / "fixtures" / "corpus"
ANSWER = "Feed the starter daily【1】."


def _script(request: EngineRequest) -> list[str]:
    """Search first; then answer, citing the first result."""
    if not any(m.role == "tool" for m in request.messages):
        call = {"name": "file_search", "arguments": {"queries": ["sourdough starter feeding"]}}
        return [f"<tool_call>\n{json.dumps(call)}\n</tool_call>"]
    return ["Feed the starter ", "daily【", "1】."]


def _store(client: openai.OpenAI) -> tuple[str, str]:
    """A completed store of two documents; the sourdough file's id."""
    ids = {
        name: client.files.create(file=CORPUS / name, purpose="assistants").id
        for name in ("sourdough.txt", "volcanoes.md")
    }
    vs = client.vector_stores.create(name="kitchen", file_ids=list(ids.values()))
    for name in ids:
        client.vector_stores.files.poll(ids[name], vector_store_id=vs.id, poll_interval_ms=20)
    return vs.id, ids["sourdough.txt"]


def test_a_forced_file_search_is_read_and_cited(store_url: str, tmp_path: Path) -> None:
    engine = ScriptedEngine(_script)
    with files_server(store_url, tmp_path / "files", engine) as base:
        client = sdk(base)
        vs_id, sourdough = _store(client)
        tool = {"type": "file_search", "vector_store_ids": [vs_id]}
        body = {
            "model": "m",
            "input": "How often do I feed a sourdough starter?",
            "tools": [tool],
            "tool_choice": {"type": "file_search"},
            "include": ["file_search_call.results"],
            "stream": True,
        }
        r = httpx.post(f"{base}/v1/responses", json=body, timeout=60)
        assert r.status_code == 200, r.text
        report = validate_sse(r.text)
        assert report.ok, report.text()
        final = report.final
        assert final is not None and final["status"] == "completed"
        search, message = final["output"]
        assert search["type"] == "file_search_call" and search["status"] == "completed"
        assert search["queries"] == ["sourdough starter feeding"]
        assert search["results"][0]["file_id"] == sourdough
        assert 0 < search["results"][0]["score"] <= 1
        # the model read the results under their handles
        read = "\n".join(m.content for m in engine.requests[-1].messages if m.role == "tool")
        assert "[1] sourdough.txt" in read and "Feed the starter daily" in read
        text = message["content"][0]
        citation = {
            "type": "file_citation",
            "file_id": sourdough,
            "filename": "sourdough.txt",
            "index": len("Feed the starter daily"),
        }
        assert text["text"] == "Feed the starter daily." and text["annotations"] == [citation]
        deltas = [e for e in report.events if e["type"] == "response.output_text.delta"]
        assert "".join(e["delta"] for e in deltas) == text["text"]
        stored = client.responses.retrieve(final["id"]).model_dump(exclude_unset=True)
        assert stored["output"] == final["output"]
        replay = httpx.get(f"{base}/v1/responses/{final['id']}?stream=true", timeout=30)
        assert validate_sse(replay.text).final == final


def test_a_store_another_key_owns_is_a_404_before_anything_runs(
    store_url: str, tmp_path: Path
) -> None:
    engine = ScriptedEngine(_script)
    with files_server(store_url, tmp_path / "files", engine, api_keys=("a", "b")) as base:
        vs_id, _ = _store(sdk(base, "a"))
        body: dict[str, Any] = {
            "model": "m",
            "input": "x",
            "tools": [{"type": "file_search", "vector_store_ids": [vs_id]}],
        }
        for key, status in (("b", 404), ("a", 200)):
            r = httpx.post(
                f"{base}/v1/responses",
                json=body,
                headers={"authorization": f"Bearer {key}"},
                timeout=60,
            )
            assert r.status_code == status, r.text
        assert len(engine.requests) == 2  # the refused request reached no engine


def test_a_bad_file_search_tool_is_a_400(tmp_path: Path) -> None:
    with files_server(f"sqlite:///{tmp_path}/oars.db", tmp_path / "files") as base:
        for tool, param in (
            ({"type": "file_search", "vector_store_ids": []}, "tools[0].vector_store_ids"),
            (
                {"type": "file_search", "vector_store_ids": ["vs_1"], "max_num_results": 51},
                "tools[0].max_num_results",
            ),
            ({"type": "file_search", "vector_store_ids": ["vs_1"]}, "tools"),
        ):
            body = {"model": "m", "input": "x", "tools": [tool]}
            r = httpx.post(f"{base}/v1/responses", json=body, timeout=30)
            assert r.status_code in (400, 404), r.text
            assert r.json()["error"]["param"] == param, r.text


def test_a_search_the_model_did_not_finish_is_a_file_search_call_cut(
    store_url: str, tmp_path: Path
) -> None:
    """Cut by `max_output_tokens` while writing its call: the item is the search's own,
    closed incomplete, and nothing runs (it was an `mcp_call` of no server)."""
    call = [
        "<tool_call>\n",
        '{"name": "file_search", ',
        '"arguments": {"queries": ["sour',
        'dough"]}}',
    ]
    engine = ScriptedEngine([*call, "\n</tool_call>"])
    with files_server(store_url, tmp_path / "files", engine) as base:
        vs_id, _ = _store(sdk(base))
        body = {
            "model": "m",
            "input": "x",
            "tools": [{"type": "file_search", "vector_store_ids": [vs_id]}],
            "max_output_tokens": 3,
            "stream": True,
        }
        r = httpx.post(f"{base}/v1/responses", json=body, timeout=60)
        report = validate_sse(r.text)
        assert report.ok, report.text()
        final = report.final
        assert final is not None and final["status"] == "incomplete"
        [item] = final["output"]
        assert item["type"] == "file_search_call" and item["status"] == "incomplete", item
        assert len(engine.requests) == 1


def test_file_search_runs_in_the_background_and_over_a_websocket(tmp_path: Path) -> None:
    from websockets.sync.client import connect

    from oars.validator import validate_events

    with files_server(
        f"sqlite:///{tmp_path}/oars.db", tmp_path / "files", ScriptedEngine(_script)
    ) as base:
        client = sdk(base)
        vs_id, sourdough = _store(client)
        asked: dict[str, Any] = {
            "model": "m",
            "input": "How often do I feed a sourdough starter?",
            "tools": [{"type": "file_search", "vector_store_ids": [vs_id]}],
            "tool_choice": {"type": "file_search"},
        }
        queued = client.responses.create(**asked, background=True)
        done = client.responses.retrieve(queued.id)
        while done.status in ("queued", "in_progress"):
            time.sleep(0.02)
            done = client.responses.retrieve(queued.id)
        assert done.status == "completed" and [o.type for o in done.output] == [
            "file_search_call",
            "message",
        ]
        assert done.output_text == "Feed the starter daily."

        with connect(base.replace("http", "ws", 1) + "/v1/responses") as ws:
            ws.send(json.dumps({"type": "response.create", **asked}))
            frames: list[dict[str, Any]] = []
            while not frames or frames[-1]["type"] != "response.completed":
                frames.append(json.loads(ws.recv(timeout=30)))
        report = validate_events(frames)
        assert report.ok, report.text()
        final = frames[-1]["response"]
        assert [o["type"] for o in final["output"]] == ["file_search_call", "message"]
        (citation,) = final["output"][1]["content"][0]["annotations"]
        assert citation["file_id"] == sourdough
