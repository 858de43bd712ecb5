"""Faults, with real components: the database crashes under a streaming response (and comes
back); a client that vanishes mid-stream frees its generation, in every mode."""

from __future__ import annotations

import time
from typing import Any

import httpx

from oars.http import create_app
from oars.service import ResponsesService
from oars.settings import ServerSettings
from oars.store import SqlStore
from oars.testing import ScriptedEngine
from oars.validator import validate_sse
from tests.conftest import Postgres, new_database, serving


def _poll(url: str, done: Any, timeout: float = 30) -> httpx.Response:
    deadline = time.monotonic() + timeout
    while True:
        try:
            r = httpx.get(url, timeout=5)
            if done(r):
                return r
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, "never happened"
        time.sleep(0.2)


def test_the_database_crashing_mid_stream_ends_the_stream_and_leaves_nothing_half_written() -> None:
    pg = Postgres()
    pg.start()
    try:
        url = new_database(pg.url)
        engine = ScriptedEngine([f"w{i} " for i in range(300)], delay=0.02)
        settings = ServerSettings(lease_seconds=1.0)
        app = create_app(ResponsesService(engine), SqlStore(url), settings=settings)
        with serving(app) as base:
            body = {"model": "m", "input": "x", "stream": True}
            with httpx.stream("POST", f"{base}/v1/responses", json=body, timeout=60) as r:
                lines = r.iter_lines()
                text = ""
                for line in lines:
                    text += line + "\n"
                    if text.count("output_text.delta") == 5:
                        pg.stop()  # the database crashes while the response streams
                        break
                text += "\n".join(lines)  # the rest: the stream must end, and end well
            report = validate_sse(text)
            assert report.ok, report.text()
            assert report.final is not None and report.final["status"] == "failed"
            rid = report.final["id"]
            down = httpx.post(f"{base}/v1/responses", json={"model": "m", "input": "x"}, timeout=60)
            assert down.status_code == 503 and down.json()["error"]["code"] == "store_unavailable"

            pg.start()  # back: what was kept of the response is whole, and it is not stuck
            got = _poll(
                f"{base}/v1/responses/{rid}",
                lambda r: r.status_code == 200 and r.json()["status"] == "failed",
            ).json()
            assert got["error"] is not None
            replay = httpx.get(f"{base}/v1/responses/{rid}", params={"stream": "true"}, timeout=30)
            kept = validate_sse(replay.text)
            assert kept.ok, kept.text()
            assert kept.final is not None and kept.final["status"] == "failed"
            ok = httpx.post(f"{base}/v1/responses", json={"model": "m", "input": "x"}, timeout=60)
            assert ok.status_code == 200
    finally:
        pg.remove()


def _log_cut_at(script: list[str], cut: int, tools: bool = False) -> tuple[list[Any], Any]:
    """A real run's events, cut after `cut` of them (where its replica died)."""
    from oars.families import Hermes
    from oars.normalize import normalize
    from oars.testing import run_to_end

    body: dict[str, Any] = {"model": "m", "input": "x"}
    if tools:
        body["tools"] = [{"type": "function", "name": "f", "parameters": {"type": "object"}}]
    engine = ScriptedEngine(script, family=Hermes(guards=False))
    events = run_to_end(ResponsesService(engine), normalize(body, served_model="m"))
    return events[:cut], events[0]["response"]


def test_an_orphans_log_is_closed_into_a_valid_stream_wherever_it_stopped() -> None:
    from oars.events.orphan import orphan_ending
    from oars.validator import validate_events

    runs = [
        (["Hello", " world", "!"], False),
        (['<tool_call>{"name": "f", "arguments": {"a": ', "1}}</tool_call>"], True),
    ]
    for script, tools in runs:
        whole, _ = _log_cut_at(script, 10_000, tools)
        for cut in range(len(whole) - 1):  # every point before its terminal event
            logged, snapshot = _log_cut_at(script, cut, tools)
            ending, final = orphan_ending(logged, snapshot, streamed=True)
            report = validate_events(logged + ending)
            assert report.ok, (cut, report.text())
            assert final["status"] == "failed" and ending[-1]["response"] == final
    _, snapshot = _log_cut_at(["x"], 0)
    ending, final = orphan_ending([], snapshot, streamed=False)
    assert ending == [] and final["output"] == [] and final["error"]["code"] == "server_error"


def test_a_client_leaving_stops_a_foreground_stream_but_not_a_background_one(tmp_path: Any) -> None:
    engine = ScriptedEngine([f"w{i} " for i in range(60)], delay=0.03)  # 1.8 s in all
    app = create_app(ResponsesService(engine), SqlStore(str(tmp_path / "o.db")))
    with serving(app) as base:
        ids = {}
        for background in (False, True):
            body = {"model": "m", "input": "x", "stream": True, "background": background}
            with httpx.stream("POST", f"{base}/v1/responses", json=body, timeout=30) as r:
                for line in r.iter_lines():  # leave after the first delta
                    if line.startswith("data:") and '"response.created"' in line:
                        ids[background] = line.split('"id":"', 1)[1].split('"', 1)[0]
                    if "output_text.delta" in line:
                        break
        url = f"{base}/v1/responses/"
        stopped = _poll(url + ids[False], lambda r: r.json()["status"] != "in_progress").json()
        assert stopped["status"] == "cancelled"
        assert len(stopped["output"][0]["content"][0]["text"].split()) < 30
        finished = _poll(
            url + ids[True], lambda r: r.json()["status"] not in ("queued", "in_progress")
        ).json()
        assert finished["status"] == "completed"
        assert len(finished["output"][0]["content"][0]["text"].split()) == 60
