"""A replica killed mid-stream (`kill -9`, real processes, a real PostgreSQL and a real SQLite
file shared by two processes): every client that was reading one of its streams resumes on the
replica that lives, after the last sequence number it received, and gets exactly the events
after it: no gap, no number twice, and the text, the reasoning and the call it assembles are the
stored response's. Responses started one after another are cut at every stage of a stream: in
the reasoning, right after a delta, between items, inside a tool call, after the ending."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from oars.validator import validate_events, validate_sse
from tests.conftest import new_database
from tests.fast.test_replicas import _until, replica

CALL = '<tool_call>{"name": "save", "arguments": {"path": "story.txt"}}</tool_call>'
SCRIPT = [
    *("<think>", "A ", "short ", "one.", "</think>"),
    *(f"w{i} " for i in range(16)),
    *(CALL[i : i + 6] for i in range(0, len(CALL), 6)),
]
TOOLS = [
    {
        "type": "function",
        "name": "save",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
    }
]
RESPONSES = 12


class Reader(threading.Thread):
    """A client reading one stream live, as events arrive, until the stream ends or breaks:
    the response `body` asks for (default: a background stream that tells and calls `save`)."""

    def __init__(self, base: str, body: dict[str, Any] | None = None) -> None:
        super().__init__(daemon=True)
        self.base = base
        self.body = body or {"input": "tell", "tools": TOOLS, "stream": True, "background": True}
        self.events: list[dict[str, Any]] = []

    def run(self) -> None:
        try:
            with httpx.stream("POST", f"{self.base}/responses", json=self.body, timeout=60) as s:
                for line in s.iter_lines():
                    if line.startswith("data: "):
                        self.events.append(json.loads(line.removeprefix("data: ")))
        except httpx.HTTPError:
            pass  # the replica died


def _wait_for(reader: Reader, count: int) -> None:
    """Until `reader` has received `count` events, or its stream has ended."""
    while len(reader.events) < count and reader.is_alive():
        time.sleep(0.002)


def _text(events: list[dict[str, Any]], kind: str) -> str:
    return "".join(e["delta"] for e in events if e["type"] == kind)


# Where the last client started is cut in each round, by the first event of that type it
# receives (the clients started before it are further on, up to past the ending).
STAGES = (
    "response.reasoning_text.delta",
    "response.output_text.delta",
    "response.output_item.added",  # the call's: the reasoning's and the message's came before
    "response.function_call_arguments.delta",
)


def _cut_and_resume(url: str) -> None:
    with replica(url, "b", script=SCRIPT) as (b, _):
        for stage in STAGES:
            with replica(url, "a", script=SCRIPT, delay=0.03) as (a, victim):
                readers = [Reader(a)]
                readers[0].start()
                for _ in range(1, RESPONSES):  # each one 4 events behind the one before
                    _wait_for(readers[-1], 4)
                    readers.append(Reader(a))
                    readers[-1].start()
                _wait_for_stage(readers[-1], stage)
                os.kill(victim.pid, signal.SIGKILL)
                victim.wait()
                for reader in readers:
                    reader.join(timeout=10)
            for reader in readers:
                _check_resume(b, reader.events)


def _wait_for_stage(reader: Reader, stage: str) -> None:
    """Until `reader` has received the `stage` event that follows the ones before it."""
    seen = {"response.output_item.added": 3}.get(stage, 1)  # the call's is the third
    while sum(e["type"] == stage for e in list(reader.events)) < seen and reader.is_alive():
        time.sleep(0.001)


def _check_resume(base: str, received: list[dict[str, Any]]) -> None:
    assert received, "no event reached the client before the kill"
    response_id = received[0]["response"]["id"]
    stored = _until(base, response_id, ("failed", "completed"))
    last = received[-1]["sequence_number"]
    params = {"stream": "true", "starting_after": str(last)}
    resumed = httpx.get(f"{base}/responses/{response_id}", params=params, timeout=30)
    rest = validate_sse(resumed.text).events
    numbers = [e["sequence_number"] for e in received + rest]
    assert numbers == list(range(len(numbers))), numbers
    whole = received + rest
    report = validate_events(whole)
    assert report.ok, report.text()
    final = whole[-1]["response"]
    assert final == stored
    output = {item["type"]: item for item in stored["output"]}
    if "message" in output:
        text = output["message"]["content"][0]["text"]
        assert _text(whole, "response.output_text.delta") == text
    if "reasoning" in output:
        reasoning = output["reasoning"]["content"][0]["text"]
        assert _text(whole, "response.reasoning_text.delta") == reasoning
    if "function_call" in output:
        arguments = output["function_call"]["arguments"]
        assert _text(whole, "response.function_call_arguments.delta") == arguments


def test_a_client_resumes_a_killed_replicas_stream_without_contradiction_postgresql(
    postgres_server: str,
) -> None:
    _cut_and_resume(new_database(postgres_server))


def test_a_client_resumes_a_killed_replicas_stream_without_contradiction_sqlite(
    tmp_path: Path,
) -> None:
    _cut_and_resume(f"sqlite:///{tmp_path}/oars.db")
