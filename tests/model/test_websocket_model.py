"""WebSocket mode and compaction against a real `oars serve` on the default model.

The first test plays the scenarios of the Open Responses compliance suite's WebSocket and
compaction tests (their requests and checks, rewritten here), all at once as the suite runs them,
with its 30-second limit per turn; every response's frames also go through the stream validator.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import openai
import pytest
from websockets.sync.client import connect
from websockets.sync.connection import Connection

from oars.validator import SNAPSHOT_FIELDS, validate_events, validate_socket

pytestmark = pytest.mark.model

MODEL = "qwen2.5-coder-0.5b-instruct"
TERMINAL = ("response.completed", "response.incomplete", "response.failed")
TURN_SECONDS = 30.0  # the compliance suite's limit for one WebSocket turn
Turn = dict[str, Any]  # {"frames": [...], "response": final or None, "error": frame or None}


def _socket(server: str) -> Connection:
    return connect(server.replace("http://", "ws://") + "/responses", open_timeout=10)


def _turn(ws: Connection, body: dict[str, Any]) -> Turn:
    ws.send(
        json.dumps(
            {
                "type": "response.create",
                "model": MODEL,
                "temperature": 0,
                "max_output_tokens": 24,
                **body,
            }
        )
    )
    frames: list[dict[str, Any]] = []
    deadline = time.monotonic() + TURN_SECONDS
    while True:
        frame = json.loads(ws.recv(timeout=max(0.1, deadline - time.monotonic())))
        frames.append(frame)
        if frame["type"] == "error" and len(frames) == 1:
            return {"frames": frames, "response": None, "error": frame}
        if frame["type"] in TERMINAL:
            return {"frames": frames, "response": frame["response"], "error": None}


def _completed(turn: Turn, where: str) -> list[str]:
    """The suite's checks on a response turn, and the validator's."""
    if turn["response"] is None:
        return [f"{where}: no response: {turn['error']}"]
    errors = [f"{where}: {v}" for v in validate_events(turn["frames"]).violations]
    response = turn["response"]
    missing = [k for k in SNAPSHOT_FIELDS if k not in response]
    if missing:
        errors.append(f"{where}: snapshot lacks {missing}")
    if response["status"] != "completed" or not response["output"]:
        errors.append(f"{where}: status {response['status']}, output {response['output']}")
    return errors


def _not_found(turn: Turn, where: str) -> list[str]:
    error = turn["error"] or {}
    code = (error.get("error") or {}).get("code")
    shape = set(error) == {"type", "status", "error"} and set(error.get("error", {})) == {
        "type",
        "code",
        "message",
        "param",
    }
    if code != "previous_response_not_found" or not shape:
        return [f"{where}: expected a previous_response_not_found error frame, got {error}"]
    return []


def _basic(server: str) -> list[str]:
    with _socket(server) as ws:
        turn = _turn(
            ws, {"input": [{"type": "message", "role": "user", "content": "Count from 1 to 3."}]}
        )
    return _completed(turn, "response")


def _sequential(server: str) -> list[str]:
    with _socket(server) as ws:
        first = _turn(ws, {"store": False, "input": "Reply with exactly: first"})
        second = _turn(ws, {"store": False, "input": "Reply with exactly: second"})
    return _completed(first, "turn 1") + _completed(second, "turn 2")


def _remember(ws: Connection, word: str) -> Turn:
    """The first turn of the continuation scenarios (store: false)."""
    return _turn(ws, {"store": False, "input": f"Remember the code word: {word}. Reply with OK."})


def _continuation(server: str) -> list[str]:
    with _socket(server) as ws:
        first = _remember(ws, "cobalt")
        if first["response"] is None:
            return _completed(first, "turn 1")
        second = _turn(
            ws,
            {
                "store": False,
                "previous_response_id": first["response"]["id"],
                "input": "What is the code word? Reply with only the code word.",
            },
        )
    errors = _completed(first, "turn 1") + _completed(second, "turn 2")
    prompt_tokens = second["response"]["usage"]["input_tokens"] if second["response"] else 0
    if prompt_tokens <= first["response"]["usage"]["input_tokens"]:
        errors.append("turn 2's prompt does not hold turn 1")
    return errors


def _reconnect(server: str) -> list[str]:
    with _socket(server) as ws:
        first = _remember(ws, "copper")
    if first["response"] is None:
        return _completed(first, "turn 1")
    with _socket(server) as ws:
        missed = _turn(
            ws,
            {
                "store": False,
                "previous_response_id": first["response"]["id"],
                "input": "Try to continue after reconnect. Reply with exactly: reconnected",
            },
        )
        recovery = _turn(
            ws,
            {
                "store": False,
                "input": [
                    {
                        "type": "message",
                        "role": "user",
                        "content": "Start a new response and reply with exactly: recovered",
                    }
                ],
            },
        )
    return _not_found(missed, "reconnect") + _completed(recovery, "recovery")


def _missing(server: str) -> list[str]:
    with _socket(server) as ws:
        turn = _turn(
            ws,
            {
                "store": False,
                "input": "This should fail.",
                "previous_response_id": f"resp_openresponses_missing_{time.time_ns()}",
            },
        )
    return _not_found(turn, "missing")


def _failed_continuation(server: str) -> list[str]:
    with _socket(server) as ws:
        first = _remember(ws, "ember")
        if first["response"] is None:
            return _completed(first, "turn 1")
        previous = first["response"]["id"]
        failed = _turn(
            ws,
            {
                "store": False,
                "previous_response_id": previous,
                "input": [
                    {
                        "type": "function_call_output",
                        "call_id": "call_openresponses_missing",
                        "output": "No matching tool call exists in the previous response.",
                    }
                ],
            },
        )
        retry = _turn(
            ws,
            {
                "store": False,
                "previous_response_id": previous,
                "input": "Try to continue after the failed turn.",
            },
        )
    errors = _completed(first, "turn 1") + _not_found(retry, "retry")
    if failed["error"] is None and (failed["response"] or {}).get("status") != "failed":
        errors.append(f"the continuation answering no call did not fail: {failed}")
    return errors


def _compact(server: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{server}/responses/compact", json=body, timeout=300)


def _compact_shape(body: dict[str, Any]) -> list[str]:
    errors = []
    if body.get("object") != "response.compaction" or not isinstance(body.get("created_at"), int):
        errors.append(f"not a compaction: {body}")
    output = body.get("output") or []
    if (
        not output
        or output[-1].get("type") != "compaction"
        or not output[-1].get("encrypted_content")
        or not output[-1].get("id")
    ):
        errors.append(f"no compaction item last: {output}")
    if not isinstance((body.get("usage") or {}).get("total_tokens"), int):
        errors.append(f"no usage: {body.get('usage')}")
    return errors


def _compact_response(server: str) -> list[str]:
    r = _compact(
        server,
        {
            "model": MODEL,
            "prompt_cache_key": "openresponses-compact-test",
            "input": [
                {
                    "type": "message",
                    "role": "user",
                    "content": "We agreed to launch on Tuesday and notify support first.",
                },
                {
                    "type": "message",
                    "role": "assistant",
                    "content": "Understood. The launch is Tuesday, with support notified "
                    "beforehand.",
                },
            ],
        },
    )
    return (
        [f"compact: HTTP {r.status_code} {r.text}"]
        if r.status_code != 200
        else (_compact_shape(r.json()))
    )


def _compact_missing_model(server: str) -> list[str]:
    r = _compact(
        server,
        {"input": [{"type": "message", "role": "user", "content": "Compact this conversation."}]},
    )
    return [] if r.status_code in (400, 422) else [f"missing model: HTTP {r.status_code}"]


def _compact_new_chain(server: str) -> list[str]:
    r = _compact(
        server,
        {
            "model": MODEL,
            "input": [
                {
                    "type": "message",
                    "role": "user",
                    "content": [
                        {"type": "input_text", "text": "Remember the compaction code word: slate."}
                    ],
                },
                {
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": "OK."}],
                },
                {
                    "type": "message",
                    "role": "user",
                    "content": [
                        {
                            "type": "input_text",
                            "text": "Compress this conversation for later continuation.",
                        }
                    ],
                },
            ],
        },
    )
    if r.status_code != 200:
        return [f"compact: HTTP {r.status_code} {r.text}"]
    with _socket(server) as ws:
        turn = _turn(
            ws,
            {
                "store": False,
                "tools": [],
                "input": [
                    *r.json()["output"],
                    {
                        "type": "message",
                        "role": "user",
                        "content": "Continue from here. Reply with exactly: compacted",
                    },
                ],
            },
        )
    return _compact_shape(r.json()) + _completed(turn, "new chain")


SCENARIOS: dict[str, Callable[[str], list[str]]] = {
    "websocket-response": _basic,
    "websocket-sequential-responses": _sequential,
    "websocket-continuation": _continuation,
    "websocket-reconnect-store-false-recovery": _reconnect,
    "websocket-previous-response-not-found": _missing,
    "websocket-failed-continuation-evicts-cache": _failed_continuation,
    "websocket-compact-new-chain": _compact_new_chain,
    "compact-response": _compact_response,
    "compact-missing-model": _compact_missing_model,
}


def test_the_compliance_suites_websocket_and_compaction_scenarios_at_once(server: str) -> None:
    with ThreadPoolExecutor(len(SCENARIOS)) as pool:
        results = {name: pool.submit(run, server) for name, run in SCENARIOS.items()}
        failures = {name: errors for name, f in results.items() if (errors := f.result())}
    assert not failures, json.dumps(failures, indent=1)


def test_the_openai_sdk_websocket_client_continues_a_store_false_chain(
    server: str, closing: contextlib.ExitStack
) -> None:
    client = closing.enter_context(openai.OpenAI(base_url=server, api_key="unused", max_retries=0))
    finals: list[Any] = []
    with client.responses.connect() as connection:
        for text in (
            "Remember the code word: cobalt. Reply with OK.",
            "What is the code word? Reply with only the code word.",
        ):
            previous = {"previous_response_id": finals[-1]["id"]} if finals else {}
            connection.response.create(
                model=MODEL,
                input=text,
                store=False,
                temperature=0,
                max_output_tokens=16,
                **previous,
            )
            frames: list[dict[str, Any]] = []
            while not frames or frames[-1]["type"] not in (*TERMINAL, "error"):
                frames.append(json.loads(connection.recv_bytes()))
            report = validate_events(frames)
            assert report.ok, report.text()
            finals.append(frames[-1]["response"])
    assert "cobalt" in finals[1]["output"][0]["content"][0]["text"].lower(), finals[1]


def test_the_openai_sdk_compacts_and_the_model_still_knows_the_task(
    server: str, closing: contextlib.ExitStack
) -> None:
    """A long tool-using history, compacted by the SDK's `responses.compact`; sent back as the
    whole context, the model answers from the summary and the kept task."""
    client = closing.enter_context(openai.OpenAI(base_url=server, api_key="unused", max_retries=0))
    history: list[dict[str, Any]] = [
        {
            "role": "user",
            "content": "Task: rename the function parse_date to parse_day in utils.py.",
        }
    ]
    for i in range(6):
        history += [
            {
                "type": "function_call",
                "call_id": f"c{i}",
                "name": "read_file",
                "arguments": json.dumps({"path": f"src/part{i}.py"}),
            },
            {
                "type": "function_call_output",
                "call_id": f"c{i}",
                "output": f"# part {i}\n" + "x = 1\n" * 40,
            },
        ]
    raw = client.responses.with_raw_response.compact(model=MODEL, input=history)  # type: ignore[arg-type]
    compacted = raw.parse()
    assert compacted.object == "response.compaction"
    assert [item.type for item in compacted.output] == ["message", "compaction"]
    assert compacted.usage.output_tokens > 0
    output = raw.http_response.json()["output"]  # the SDK reads kept user messages as output
    question: Any = {"role": "user", "content": "In one sentence: what is the task?"}
    answer = client.responses.create(
        model=MODEL, temperature=0, max_output_tokens=40, input=[*output, question]
    )
    assert answer.status == "completed"
    assert "parse_da" in answer.output_text, answer.output_text  # parse_date or parse_day
    assert answer.usage is not None and answer.usage.input_tokens < 1000


SEARCH = {
    "type": "function",
    "name": "search",
    "description": "Search one directory for a name.",
    "parameters": {  # bounded, as an agent's tools are: a call cannot run on copying a result
        "type": "object",
        "properties": {"directory": {"type": "string", "maxLength": 48}},
        "required": ["directory"],
        "additionalProperties": False,
    },
}


def test_fifty_turns_of_tool_calls_stay_under_the_context_and_keep_the_task(server: str) -> None:
    """An agent loop of 50 tool calls on one socket (`store: false`), with `context_management`:
    the history would pass the 4,096-token context; compacted, every prompt stays under it, and
    the model still names the task at the end. A call usually takes 17-24 tokens. The small
    model's path at temperature 0 turns on the numerics of its passes: one CI run's turn 23 wrote
    a call's directory past 256 tokens, so the schema bounds it (48 characters, no other
    property); the room left is for a final answer that copies the last result's file list (one
    did, in 82 tokens)."""
    managed = {
        "store": False,
        "tools": [SEARCH],
        "max_output_tokens": 256,
        "parallel_tool_calls": False,
        "context_management": [{"type": "compaction", "compact_threshold": 2000}],
    }
    task = (
        "Task: find the file that defines the constant ZETA_LIMIT. Search the directories "
        "one by one with the search tool."
    )
    prompts, compactions, turn = [], 0, None
    with connect(server.replace("http://", "ws://") + "/responses", open_timeout=10) as ws:
        body: dict[str, Any] = {"input": task, "tool_choice": "required"}
        for i in range(51):
            last = i == 50
            ws.send(
                json.dumps(
                    {"type": "response.create", "model": MODEL, "temperature": 0, **managed, **body}
                )
            )
            frames = [json.loads(ws.recv(timeout=300))]
            while frames[-1]["type"] not in (*TERMINAL, "error"):
                frames.append(json.loads(ws.recv(timeout=300)))
            report = validate_events(frames)
            assert report.ok, (i, report.text())
            turn = frames[-1]["response"]
            assert turn["status"] == "completed", (i, turn["incomplete_details"], turn["output"])
            prompts.append(turn["usage"]["input_tokens"])
            compactions += turn["output"][0]["type"] == "compaction"
            if last:
                break
            [call] = [item for item in turn["output"] if item["type"] == "function_call"]
            result = (
                f"No match for ZETA_LIMIT in {json.loads(call['arguments']).get('directory')}"
                f" (searched {20 + i} files: "
                + ", ".join(f"mod_{i}_{k}.py" for k in range(12))
                + ")."
            )
            answer = {"type": "function_call_output", "call_id": call["call_id"], "output": result}
            body = {
                "previous_response_id": turn["id"],
                "input": [answer],
                "tool_choice": "required",
            }
            if i == 49:
                body = {
                    **body,
                    "tool_choice": "none",
                    "input": [
                        answer,
                        {
                            "role": "user",
                            "content": "Stop searching. In one sentence: what is the "
                            "task you are working on?",
                        },
                    ],
                }
    assert compactions >= 2, prompts
    assert max(prompts) < 4096, prompts
    assert turn is not None
    text = turn["output"][-1]["content"][0]["text"]
    assert "ZETA_LIMIT" in text, text


# ---- lanes and steering, with the SDK's WebSocket client ----------------------------------------


def _frames_until(connection: Any, done: Callable[[list[dict[str, Any]]], bool]) -> list[Any]:
    frames: list[dict[str, Any]] = []
    while not done(frames):
        frames.append(json.loads(connection.recv_bytes()))
    return frames


def _valid(frames: list[dict[str, Any]]) -> None:
    report = validate_socket(frames)
    assert report.ok, report.text()


def _ended(count: int) -> Callable[[list[dict[str, Any]]], bool]:
    return lambda frames: sum(f["type"] in TERMINAL for f in frames) >= count


def test_two_lanes_stream_at_once_and_a_lane_forks_from_another(
    server: str, closing: contextlib.ExitStack
) -> None:
    client = closing.enter_context(openai.OpenAI(base_url=server, api_key="unused", max_retries=0))
    settings: dict[str, Any] = {"model": MODEL, "temperature": 0, "store": False}
    with client.responses.connect() as connection:
        connection.response.create(
            input="Remember the code word: cobalt. Reply with OK.",
            stream_id="memory",
            max_output_tokens=8,
            **settings,
        )
        root = _frames_until(connection, _ended(1))
        root_id = root[-1]["response"]["id"]
        connection.response.create(
            input="Count from 1 to 20, separated by spaces.",
            stream_id="count",
            max_output_tokens=40,
            **settings,
        )
        connection.response.create(
            input="What is the code word? Reply with only the code word.",
            stream_id="fork",
            previous_response_id=root_id,
            max_output_tokens=8,
            **settings,
        )
        frames = _frames_until(connection, _ended(2))
    _valid(root + frames)
    lanes = [f["stream_id"] for f in frames]
    assert set(lanes) == {"count", "fork"}
    ends = {f["stream_id"]: i for i, f in enumerate(frames) if f["type"] in TERMINAL}
    assert set(lanes[: min(ends.values())]) == {"count", "fork"}  # both lanes streamed at once
    fork = frames[ends["fork"]]["response"]
    assert fork["previous_response_id"] == root_id
    assert "cobalt" in fork["output"][-1]["content"][0]["text"].lower(), fork


def test_a_steered_response_stops_and_its_successor_takes_the_input_first(
    server: str, closing: contextlib.ExitStack
) -> None:
    client = closing.enter_context(openai.OpenAI(base_url=server, api_key="unused", max_retries=0))
    steer = "Stop counting now. Reply with exactly: steered"
    with client.responses.connect() as connection:
        connection.response.create(
            model=MODEL,
            input="Count from 1 to 100, separated by spaces.",
            temperature=0,
            max_output_tokens=200,
            stream_id="main",
        )
        opened = _frames_until(
            connection, lambda f: sum(x["type"] == "response.output_text.delta" for x in f) >= 3
        )
        first = opened[0]["response"]["id"]
        connection.response.steer(previous_response_id=first, input=steer)
        frames = opened + _frames_until(connection, _ended(2))
    _valid(frames)
    assert [f["type"] for f in frames if f["type"].startswith("response.steer")] == [
        "response.steer.accepted"
    ]
    ended, successor = [f["response"] for f in frames if f["type"] in TERMINAL]
    assert ended["status"] == "incomplete", ended
    assert ended["incomplete_details"] == {"reason": "steered"}
    assert ended["usage"]["output_tokens"] < 200
    assert successor["status"] == "completed" and successor["previous_response_id"] == first
    assert successor["usage"]["input_tokens"] > ended["usage"]["input_tokens"]
    # what is new in the successor's context, after the stopped response's output: the steer
    url = f"{server}/responses/{successor['id']}/input_items?order=asc"
    texts = [_text(item) for item in httpx.get(url, timeout=30).json()["data"]]
    partial = _text(ended["output"][-1])
    assert texts[texts.index(partial) + 1 :] == [steer], texts


def _text(item: dict[str, Any]) -> str:
    content = item.get("content")
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content or [])
