"""The `shell`, `local_shell` and `apply_patch` tool types: what the model is offered, the call
items its calls become, and their outputs read back as the model's tool results."""

from __future__ import annotations

from typing import Any

import pytest
from starlette.testclient import TestClient

from oars.events import CallTarget, ResponseBuilder
from oars.generation import EngineRequest
from oars.http import create_app
from oars.parsing import Segment, SegmentKind
from oars.service import ResponsesService
from oars.testing import ScriptedEngine
from oars.validator import validate_sse

SHELL = {"type": "shell", "environment": {"type": "local"}}
PATCH = {"type": "apply_patch"}
ASK = {"role": "user", "content": "Make notes.txt say hi."}


def _answering(request: EngineRequest) -> list[str]:
    """Writes a file, then answers once its tool's result is in."""
    if request.after_tool_output:
        return ["Done."]
    return [
        '<tool_call>\n{"name": "apply_patch", "arguments": {"operation": "create_file", '
        '"path": "notes.txt", "diff": "+hi\\n"}}\n</tool_call>'
    ]


def _post(engine: ScriptedEngine, body: dict[str, Any]) -> Any:
    with TestClient(create_app(ResponsesService(engine))) as client:
        return client.post("/v1/responses", json={"model": "m", **body})


def test_the_tool_types_are_offered_as_functions_the_model_can_call() -> None:
    engine = ScriptedEngine(["Hi."])
    r = _post(engine, {"input": "hi", "tools": [SHELL, {"type": "local_shell"}, PATCH]})
    assert r.status_code == 200, r.text
    offered = {t.name: t for t in engine.requests[-1].tools.offered}
    assert list(offered) == ["shell", "local_shell", "apply_patch"]
    assert offered["shell"].parameters["required"] == ["commands"]
    assert r.json()["tools"] == [SHELL, {"type": "local_shell"}, PATCH]


def test_an_apply_patch_round_trip() -> None:
    engine = ScriptedEngine(_answering)
    first = _post(engine, {"input": [ASK], "tools": [PATCH], "stream": True})
    report = validate_sse(first.text)
    assert report.ok, report.text()
    assert report.final is not None
    (call,) = report.final["output"]
    assert call["operation"] == {"type": "create_file", "path": "notes.txt", "diff": "+hi\n"}
    output = {
        "type": "apply_patch_call_output",
        "call_id": call["call_id"],
        "status": "completed",
        "output": "Created notes.txt",
    }
    second = _post(engine, {"input": [ASK, call, output], "tools": [PATCH]})
    assert second.json()["output"][0]["content"][0]["text"] == "Done."
    messages = engine.requests[-1].messages
    (called,) = messages[-2].tool_calls
    assert called["function"] == {
        "name": "apply_patch",
        "arguments": {"operation": "create_file", "path": "notes.txt", "diff": "+hi\n"},
    }
    assert messages[-1].content == "The patch was applied: Created notes.txt"


def test_shell_outputs_read_as_stdout_stderr_and_how_each_command_ended() -> None:
    engine = ScriptedEngine(["Two files."])
    call = {
        "type": "shell_call",
        "call_id": "call_1",
        "action": {"commands": ["ls", "cat missing"]},
        "status": "completed",
    }
    output = {
        "type": "shell_call_output",
        "call_id": "call_1",
        "output": [
            {"stdout": "a\nb\n", "stderr": "", "outcome": {"type": "exit", "exit_code": 0}},
            {"stdout": "", "stderr": "no such file", "outcome": {"type": "exit", "exit_code": 1}},
        ],
    }
    r = _post(engine, {"input": [ASK, call, output], "tools": [SHELL]})
    assert r.status_code == 200, r.text
    result = engine.requests[-1].messages[-1]
    assert result.role == "tool" and result.tool_call_id == "call_1"
    assert result.content == "a\nb\n\nexit code 0\n\nstderr:\nno such file\nexit code 1"


def test_a_local_shell_output_answers_its_call_by_id() -> None:
    engine = ScriptedEngine(["Listed."])
    call = {
        "type": "local_shell_call",
        "id": "lsh_1",
        "call_id": "call_9",
        "status": "completed",
        "action": {"type": "exec", "command": ["ls"], "env": {}},
    }
    output = {"type": "local_shell_call_output", "id": "call_9", "output": "a b"}
    r = _post(engine, {"input": [ASK, call, output], "tools": [{"type": "local_shell"}]})
    assert r.status_code == 200, r.text
    assert engine.requests[-1].messages[-1].tool_call_id == "call_9"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"tools": [{"type": "shell", "environment": {"type": "container_auto"}}]}, "tools[0]"),
        ({"tools": [SHELL], "tool_choice": {"type": "apply_patch"}}, "tool_choice"),
        (
            {
                "tools": [PATCH],
                "input": [
                    ASK,
                    {"type": "apply_patch_call", "call_id": "c", "status": "completed"},
                ],
            },
            "input[1].operation",
        ),
        (
            {
                "tools": [SHELL],
                "input": [
                    ASK,
                    {"type": "shell_call_output", "call_id": "c", "output": "text"},
                ],
            },
            "input[1].output",
        ),
    ],
)
def test_malformed_tools_choices_and_items_are_400s(body: dict[str, Any], param: str) -> None:
    r = _post(ScriptedEngine(), {"input": "x", **body})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"].startswith(param), r.json()


def test_tool_choice_forces_the_shell() -> None:
    engine = ScriptedEngine(['{"name": "shell", "arguments": {"commands": ["ls"]}}'])
    r = _post(engine, {"input": "x", "tools": [SHELL, PATCH], "tool_choice": {"type": "shell"}})
    assert [t.name for t in engine.requests[-1].tools.callable] == ["shell"]
    constraint = engine.plans[-1].constraint
    assert constraint is not None and constraint.triggers == ()
    assert r.json()["output"][0]["action"]["commands"] == ["ls"]


def test_an_apply_patch_call_being_written_is_in_no_snapshot() -> None:
    """Its operation is not known until it is whole: it shows nowhere before it is announced."""
    builder = ResponseBuilder(
        {}, model="m", tools={"apply_patch": CallTarget("apply_patch", None, "apply_patch")}
    )
    builder.start()
    builder.add(Segment(SegmentKind.CALL_START, name="apply_patch"))
    builder.add(Segment(SegmentKind.CALL_ARGS, '{"operation": "delete_file", "path"'))
    assert builder.output == [] and builder.response["output"] == []
    builder.add(Segment(SegmentKind.CALL_ARGS, ': "a.txt"}'))
    events = builder.add(Segment(SegmentKind.CALL_END))
    assert [e["type"] for e in events] == [
        "response.output_item.added",
        "response.output_item.done",
    ]
    assert builder.output[0]["operation"] == {"type": "delete_file", "path": "a.txt"}
