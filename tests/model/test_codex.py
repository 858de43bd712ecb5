"""The Codex CLI (`codex exec`) completes turns against `oars serve` on the default model."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.model

CODEX = Path(__file__).parent.parent.parent / "clients" / "node_modules" / ".bin" / "codex"


def _exec(server: str, prompt: str, workdir: Path) -> tuple[int, list[dict[str, Any]], str]:
    assert CODEX.exists(), f"{CODEX} missing: `make test` installs the client matrix"
    provider = (f'{{name="oars", base_url="{server}", env_key="OARS_TEST_KEY", '
                'wire_api="responses", request_max_retries=0, stream_max_retries=0, '
                "stream_idle_timeout_ms=600000}")  # fmt: skip
    cmd = [str(CODEX), "exec", "--json", "--skip-git-repo-check", "--ephemeral",
           "--ignore-user-config", "--dangerously-bypass-approvals-and-sandbox",
           "-c", "model_provider=oars", "-c", 'model="qwen2.5-coder-0.5b-instruct"',
           "-c", f"model_providers.oars={provider}", "-C", str(workdir), prompt]  # fmt: skip
    env = {**os.environ, "CODEX_HOME": str(workdir / ".codex"), "OARS_TEST_KEY": "sk-local"}
    (workdir / ".codex").mkdir(exist_ok=True)
    run = subprocess.run(cmd, env=env, stdin=subprocess.DEVNULL, capture_output=True,
                         text=True, timeout=900, check=False)  # fmt: skip
    events = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    return run.returncode, events, run.stderr[-2000:]


def _items(events: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [
        e["item"] for e in events if e["type"] == "item.completed" and e["item"]["type"] == kind
    ]


def test_codex_text_turn(agent_server: str, tmp_path: Path) -> None:
    code, events, err = _exec(agent_server, "Reply in one short sentence: what is the capital "
                              "of France?", tmp_path)  # fmt: skip
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
