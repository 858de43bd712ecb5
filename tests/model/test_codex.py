"""The Codex CLI (`codex exec`) completes turns against `oars serve` on the default model."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest

pytestmark = pytest.mark.model

CODEX = Path(__file__).parent.parent.parent / "clients" / "node_modules" / ".bin" / "codex"
MODEL = "qwen2.5-coder-0.5b-instruct"

# A model catalog entry of our own (`model_catalog_json`): it makes Codex offer `apply_patch` as
# a freeform custom tool with its Lark grammar, and replaces Codex's 17k-character base prompt,
# written for much larger models, with a few lines a 0.5B model can follow.
CATALOG_ENTRY = {
    "slug": MODEL,
    "display_name": "Qwen2.5-Coder 0.5B on oars",
    "apply_patch_tool_type": "freeform",
    "shell_type": "shell_command",
    "context_window": 16384,
    "supported_reasoning_levels": [],
    "visibility": "list",
    "supported_in_api": True,
    "priority": 1,
    "support_verbosity": False,
    "truncation_policy": {"mode": "tokens", "limit": 10000},
    "experimental_supported_tools": [],
    "base_instructions": (
        "You are a coding agent working in the user's directory.\n"
        "To create or change a file, call the apply_patch tool with a patch such as:\n"
        "*** Begin Patch\n*** Add File: notes.txt\n+first line\n*** End Patch\n"
        "Every added line starts with '+'. Stop the patch with '*** End Patch' once the "
        "content is written.\nWhen the tool has run, tell the user in one short sentence "
        "what you did."
    ),
}


def _exec(
    server: str, prompt: str, workdir: Path, *extra: str, websockets: bool = False
) -> tuple[int, list[dict[str, Any]], str]:
    assert CODEX.exists(), f"{CODEX} missing: `make test` installs the client matrix"
    provider = (
        f'{{name="oars", base_url="{server}", env_key="OARS_TEST_KEY", '
        'wire_api="responses", request_max_retries=0, stream_max_retries=0, '
        f"stream_idle_timeout_ms=600000, supports_websockets={str(websockets).lower()}}}"
    )
    cmd = [
        str(CODEX),
        "exec",
        "--json",
        "--skip-git-repo-check",
        "--ephemeral",
        "--ignore-user-config",
        "--dangerously-bypass-approvals-and-sandbox",
        "-c",
        "model_provider=oars",
        "-c",
        f'model="{MODEL}"',
        "-c",
        f"model_providers.oars={provider}",
        "-C",
        str(workdir),
        *extra,
        prompt,
    ]
    env = {**os.environ, "CODEX_HOME": str(workdir / ".codex"), "OARS_TEST_KEY": "sk-local"}
    (workdir / ".codex").mkdir(exist_ok=True)
    run = subprocess.run(
        cmd,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    events = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    return run.returncode, events, run.stderr[-2000:]


def _items(events: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [
        e["item"] for e in events if e["type"] == "item.completed" and e["item"]["type"] == kind
    ]


def test_codex_text_turn(agent_server: str, tmp_path: Path) -> None:
    code, events, err = _exec(
        agent_server, "Reply in one short sentence: what is the capital of France?", tmp_path
    )
    assert code == 0, (events, err)
    assert events[-1]["type"] == "turn.completed", events
    messages = _items(events, "agent_message")
    assert messages and messages[-1]["text"].strip(), events


def test_codex_runs_a_shell_command_and_finishes(agent_server: str, tmp_path: Path) -> None:
    code, events, err = _exec(agent_server, "Run the shell command: echo hello-oars", tmp_path)
    assert code == 0, (events, err)
    commands = _items(events, "command_execution")
    assert any("hello-oars" in c["aggregated_output"] and c["exit_code"] == 0 for c in commands)
    assert events[-1]["type"] == "turn.completed", events
    assert _items(events, "agent_message"), events


def _counter(server: str, name: str) -> float:
    text = httpx.get(server.removesuffix("/v1") + "/metrics", timeout=10).text
    lines = [line for line in text.splitlines() if line.startswith(name)]
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines)


def test_codex_runs_a_turn_over_a_websocket(agent_server: str, tmp_path: Path) -> None:
    """With `supports_websockets`, Codex prewarms a socket (`generate: false`) and runs the turn
    on it, continuing from the prewarm by `previous_response_id`."""
    sockets = _counter(agent_server, "oars_websockets_total")
    ran = _counter(agent_server, 'oars_websocket_requests_total{outcome="response"}')
    code, events, err = _exec(
        agent_server, "Run the shell command: echo hello-ws", tmp_path, websockets=True
    )
    assert code == 0, (events, err)
    commands = _items(events, "command_execution")
    assert any("hello-ws" in c["aggregated_output"] for c in commands), events
    assert events[-1]["type"] == "turn.completed", events
    assert _counter(agent_server, "oars_websockets_total") > sockets
    # the prewarm, the call, and the answer after the command's output
    assert _counter(agent_server, 'oars_websocket_requests_total{outcome="response"}') >= ran + 3
    errors = _counter(agent_server, 'oars_websocket_requests_total{outcome="error"}')
    assert errors == 0, errors


def test_codex_edits_a_file_with_freeform_apply_patch(agent_server: str, tmp_path: Path) -> None:
    catalog = tmp_path / "catalog.json"
    catalog.write_text(json.dumps({"models": [CATALOG_ENTRY]}))
    work = tmp_path / "work"
    work.mkdir()
    # Only apply_patch to edit with: offered Codex's other tools too, the 0.5B model picks a
    # wrong one (write_stdin) and the turn never reaches apply_patch.
    lean = [
        "--disable",
        "shell_tool",
        "--disable",
        "multi_agent",
        "--disable",
        "goals",
        "-c",
        'web_search="disabled"',
        "-c",
        f'model_catalog_json="{catalog}"',
    ]
    code, events, err = _exec(
        agent_server, "Create the file hello.txt containing the line: hi", work, *lean
    )
    assert code == 0, (events, err)
    changes = _items(events, "file_change")
    assert changes and changes[0]["status"] == "completed", events
    assert (work / "hello.txt").read_text().strip() == "hi"
    assert events[-1]["type"] == "turn.completed", events
    assert _items(events, "agent_message"), events


def test_codex_compacts_a_long_session_remotely_and_goes_on(
    agent_server: str, tmp_path: Path
) -> None:
    """Codex's own `openai` provider pointed at oars speaks WebSocket and compacts remotely.
    With a low auto-compact limit, the second turn of a session whose first turn read a long
    command output starts with a `compaction_trigger` request, then goes on and completes."""
    home = tmp_path / ".codex"
    home.mkdir()
    env = {**os.environ, "CODEX_HOME": str(home), "OPENAI_API_KEY": "sk-local"}
    base = [
        str(CODEX),
        "exec",
        "--json",
        "--skip-git-repo-check",
        "--ignore-user-config",
        "--dangerously-bypass-approvals-and-sandbox",
        "-c",
        f'openai_base_url="{agent_server}"',
        "-c",
        f'model="{MODEL}"',
        "-c",
        "model_auto_compact_token_limit=9500",
        "-C",
        str(tmp_path),
    ]
    compactions = _counter(agent_server, 'oars_compactions_total{how="trigger"')
    for args in (
        ["Run the shell command: seq 1 300"],
        ["resume", "--last", "Run the shell command: echo done"],
    ):
        run = subprocess.run(
            [*base, *args],
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
        )
        events = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
        assert run.returncode == 0, (events, run.stderr[-2000:])
        assert events[-1]["type"] == "turn.completed", events
    assert _counter(agent_server, 'oars_compactions_total{how="trigger"') > compactions
