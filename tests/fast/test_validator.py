"""The validator catches each bug the peers ship, naming the rule."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from oars.events.builder import Event
from oars.http.sse import encode
from oars.normalize import normalize
from oars.service import ResponsesService
from oars.testing import ScriptedEngine, run_to_end
from oars.validator import validate_events, validate_socket, validate_sse


def _good() -> list[Event]:
    service = ResponsesService(ScriptedEngine(["a", "b", "c"]))
    return run_to_end(service, normalize({"input": "x"}, served_model="m"))


def _renumber(events: list[Event]) -> list[Event]:
    for i, e in enumerate(events):
        e["sequence_number"] = i
    return events


def drift_content_index(ev: list[Event]) -> list[Event]:
    deltas = [e for e in ev if e["type"] == "response.output_text.delta"]
    for n, e in enumerate(deltas):
        e["content_index"] = n  # vLLM's bug: one content_index per delta
    return ev


def drop_item_done(ev: list[Event]) -> list[Event]:
    return _renumber([e for e in ev if e["type"] != "response.output_item.done"])


def change_id(ev: list[Event]) -> list[Event]:
    ev[-1]["response"]["output"][0]["id"] = "msg_other"
    return ev


def no_terminal(ev: list[Event]) -> list[Event]:
    return ev[:-1]


def skip_sequence(ev: list[Event]) -> list[Event]:
    ev[3]["sequence_number"] = 7
    return ev


def completed_with_incomplete_item(ev: list[Event]) -> list[Event]:
    ev[-2]["item"]["status"] = "incomplete"
    ev[-1]["response"]["output"][0]["status"] = "incomplete"
    return ev


def output_index_from_one(ev: list[Event]) -> list[Event]:
    for e in ev:
        if "output_index" in e:
            e["output_index"] = 1
    return ev


def done_text_differs(ev: list[Event]) -> list[Event]:
    next(e for e in ev if e["type"] == "response.output_text.done")["text"] = "zzz"
    return ev


def missing_snapshot_field(ev: list[Event]) -> list[Event]:
    del ev[0]["response"]["truncation"]
    return ev


def unknown_event(ev: list[Event]) -> list[Event]:
    ev.insert(4, {"type": "response.reasoning_part.added", "sequence_number": 4})
    return _renumber(ev)


CASES: list[tuple[Callable[[list[Event]], list[Event]], str]] = [
    (drift_content_index, "I5"),
    (drop_item_done, "I8"),
    (change_id, "I9"),
    (no_terminal, "I2"),
    (skip_sequence, "I1"),
    (completed_with_incomplete_item, "I10"),
    (output_index_from_one, "I4"),
    (done_text_differs, "I7"),
    (missing_snapshot_field, "schema"),
    (unknown_event, "schema"),
]


def test_good_stream_passes() -> None:
    report = validate_events(_good())
    assert report.ok, report.text()


@pytest.mark.parametrize(("breaker", "rule"), CASES, ids=lambda c: getattr(c, "__name__", c))
def test_broken_stream_names_the_rule(
    breaker: Callable[[list[Event]], list[Event]], rule: str
) -> None:
    report = validate_events(breaker(copy.deepcopy(_good())))
    assert not report.ok
    assert rule in {v.rule for v in report.violations}, report.text()


def test_framing_event_name_must_match_type() -> None:
    events = _good()
    text = "".join(encode(e).decode() for e in events)
    text = text.replace("event: response.in_progress", "event: response.progress", 1)
    report = validate_sse(text)
    assert [v.rule for v in report.violations] == ["framing"]


def test_done_marker_is_tolerated() -> None:
    text = "".join(encode(e).decode() for e in _good()) + "data: [DONE]\n\n"
    assert validate_sse(text).ok


def test_error_must_be_followed_by_failed() -> None:
    ev: list[dict[str, Any]] = _good()
    ev.insert(
        -1, {"type": "error", "code": "x", "message": "m", "param": None, "sequence_number": 0}
    )
    assert "I2" in {v.rule for v in validate_events(_renumber(ev)).violations}


def test_a_call_changed_in_output_item_done_breaks_i7() -> None:
    """Codex runs what output_item.done says: it must be what the deltas streamed."""
    weather = {
        "type": "function",
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    }
    call = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
    body = normalize({"input": "x", "tools": [weather]}, served_model="m")
    events = run_to_end(ResponsesService(ScriptedEngine([call])), body)
    assert validate_events(copy.deepcopy(events)).ok
    done = next(e for e in events if e["type"] == "response.output_item.done")
    for item in (done["item"], events[-1]["response"]["output"][0]):
        item["arguments"] = item["arguments"].replace("Paris", "Rome")
    report = validate_events(events)
    assert "I7" in {v.rule for v in report.violations}, report.text()


# ---- a WebSocket's frames ---------------------------------------------------------------------


def _on(lane: str, events: list[Event]) -> list[Event]:
    return [{**event, "stream_id": lane} for event in events]


def _interleaved() -> list[Event]:
    a, b = _on("a", _good()), _on("b", _good())
    accepted = {
        "type": "response.steer.accepted",
        "sequence_number": 0,
        "steer": {"id": "steer_1", "previous_response_id": a[0]["response"]["id"]},
        "stream_id": "a",
    }
    error = {
        "type": "error",
        "status": 400,
        "error": {"type": "invalid_request_error", "code": None, "message": "x", "param": None},
    }
    return [*[e for pair in zip(a, b, strict=False) for e in pair], accepted, error]


def test_a_sockets_interleaved_lanes_and_its_own_frames_pass() -> None:
    report = validate_socket(_interleaved())
    assert report.ok, report.text()


def test_a_socket_names_the_frame_that_breaks_a_rule() -> None:
    frames = _interleaved()
    frames[-2] = {**frames[-2], "sequence_number": 3}  # the socket's first steer event
    del frames[5]["stream_id"]  # lane b's third event, on no lane
    report = validate_socket(frames)
    assert {(v.index, v.rule) for v in report.violations} >= {(len(frames) - 2, "I1")}
    assert any(v.rule == "I2" for v in report.violations), report.text()


def _shell_events() -> list[Event]:
    call = '<tool_call>{"name": "shell", "arguments": {"commands": ["ls", "pwd"]}}</tool_call>'
    service = ResponsesService(ScriptedEngine([call]))
    body = {"input": "x", "tools": [{"type": "shell"}]}
    return run_to_end(service, normalize(body, served_model="m"))


def _alter_done_command(ev: list[Event]) -> list[Event]:
    next(e for e in ev if e["type"] == "response.shell_call_command.done")["command"] = "rm"
    return ev


def _alter_final_commands(ev: list[Event]) -> list[Event]:
    done = next(e for e in ev if e["type"] == "response.output_item.done")
    done["item"]["action"]["commands"] = ["ls"]
    return ev


def _skip_a_command(ev: list[Event]) -> list[Event]:
    return _renumber([e for e in ev if e.get("command_index") != 0])


@pytest.mark.parametrize("alter", [_alter_done_command, _alter_final_commands, _skip_a_command])
def test_a_shell_calls_commands_must_stream_as_the_item_ends(
    alter: Callable[[list[Event]], list[Event]],
) -> None:
    assert validate_events(_shell_events()).ok
    report = validate_events(alter(_shell_events()))
    assert {v.rule for v in report.violations} & {"I5", "I7"}, report.text()


def _compacting(events: list[Event], item_id: str, output_index: int = 0) -> list[Event]:
    event = {
        "type": "response.compaction.compacting",
        "sequence_number": 0,
        "item_id": item_id,
        "output_index": output_index,
    }
    return _renumber([*events[:2], event, *events[2:]])


def test_a_compaction_sampled_must_be_the_next_item_added() -> None:
    """`response.compaction.compacting` names the item added next, at the next output index."""
    report = validate_events(_compacting(_good(), "cmp_1"))
    assert "compaction" in {v.rule for v in report.violations}, report.text()
    report = validate_events(_compacting(_good(), "cmp_1", output_index=1))
    assert "I4" in {v.rule for v in report.violations}, report.text()


def _cited(text: str, start: int, end: int) -> list[Event]:
    """A stream whose one text part carries a url_citation over [start, end)."""
    events = run_to_end(
        ResponsesService(ScriptedEngine([text])), normalize({"input": "x"}, served_model="m")
    )
    annotation = {
        "type": "url_citation",
        "start_index": start,
        "end_index": end,
        "title": "T",
        "url": "https://a.example/",
    }
    at = next(i for i, e in enumerate(events) if e["type"] == "response.output_text.delta") + 1
    delta = events[at - 1]
    added = {
        "type": "response.output_text.annotation.added",
        "sequence_number": 0,
        "item_id": delta["item_id"],
        "output_index": 0,
        "content_index": 0,
        "annotation_index": 0,
        "annotation": annotation,
    }
    events.insert(at, added)
    for e in events:
        part = e.get("part") or {}
        if part.get("type") == "output_text" and e["type"] == "response.content_part.done":
            part["annotations"] = [annotation]
        for item in [e.get("item"), *((e.get("response") or {}).get("output") or [])]:
            if item and item.get("type") == "message" and e["type"] != "response.output_item.added":
                item["content"][0]["annotations"] = [annotation]
    return _renumber(events)


def test_a_url_citation_spans_a_link_to_its_url() -> None:
    link = "[T](https://a.example/)"
    good = _cited(f"See {link}.", 4, 4 + len(link))
    assert validate_events(good).ok, validate_events(good).text()
    bad = _cited(f"See {link}.", 0, 3)
    assert "citation" in {v.rule for v in validate_events(bad).violations}


def test_a_url_citation_missing_from_the_final_text_breaks_i7() -> None:
    link = "[T](https://a.example/)"
    events = _cited(f"See {link}.", 4, 4 + len(link))
    events[-1]["response"]["output"][0]["content"][0]["annotations"] = []
    rules = {v.rule for v in validate_events(events).violations}
    assert "I9" in rules or "I7" in rules
