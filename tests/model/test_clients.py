"""The client matrix: real client packages against `oars serve` on the default model."""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.model

CLIENTS = Path(__file__).parent.parent.parent / "clients"


def _node(script: str, server: str) -> dict[str, Any]:
    assert (CLIENTS / "node_modules").exists(), "`make test` installs the client matrix"
    run = subprocess.run(
        ["node", script, server, "qwen2.5-coder-0.5b-instruct"],
        cwd=CLIENTS,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert run.returncode == 0, f"{script} failed:\n{run.stderr[-3000:]}"
    result: dict[str, Any] = json.loads(run.stdout.strip().splitlines()[-1])
    return result


def test_openai_node_stream_helper(server: str) -> None:
    result = _node("openai_stream.mjs", server)
    assert result["status"] in ("completed", "incomplete") and result["text"].strip()
    assert result["types"][0] == "response.created"


def test_vercel_ai_sdk_stream_text_with_a_tool(server: str) -> None:
    result = _node("aisdk_tool.mjs", server)
    assert result["calls"] and "paris" in result["calls"][0].lower(), result
    assert result["steps"][0] == "tool-calls", result
    assert result["finishReason"] in ("stop", "length"), result


def test_vercel_ai_sdk_second_turn_with_item_reference(server: str) -> None:
    result = _node("aisdk_turns.mjs", server)
    second_input = result["secondInput"]
    assert [i.get("type", i.get("role")) for i in second_input] == [
        "user",
        "item_reference",
        "user",
    ], result
    assert result["first"].strip() and result["second"].strip(), result
    assert result["finishReasons"][1] in ("stop", "length"), result


def test_openai_agents_tool_loop(agent_server: str, guarded: bool = True) -> None:
    """`guarded`: the small model's guards apply (the embedded engine; not an upstream's)."""
    from agents import Agent, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled
    from openai import AsyncOpenAI

    set_tracing_disabled(True)
    seen: list[str] = []

    @function_tool
    def get_weather(location: str) -> str:
        """Get the current weather for a city."""
        seen.append(location)
        return f"18C and light rain in {location}"

    async def run() -> Any:
        client = AsyncOpenAI(base_url=agent_server, api_key="unused", max_retries=0)
        model = OpenAIResponsesModel(model="qwen2.5-coder-0.5b-instruct", openai_client=client)
        agent = Agent(
            name="Weather",
            instructions="Answer weather questions with the tool.",
            tools=[get_weather],
            model=model,
        )
        try:
            return await Runner.run(agent, "What's the weather in Paris?", max_turns=4)
        finally:
            await client.close()

    result = asyncio.run(run())
    assert seen and "paris" in seen[0].lower()
    assert isinstance(result.final_output, str) and result.final_output.strip()
    if guarded:  # the answer reads the tool's result, not a call written again ("Mark{…")
        assert "rain" in result.final_output.lower() and "{" not in result.final_output


def _agent_run(agent_server: str, tools: list[Any], instructions: str, ask: str) -> Any:
    """One Agents SDK run against the embedded model, up to four turns."""
    from agents import Agent, OpenAIResponsesModel, Runner, set_tracing_disabled
    from openai import AsyncOpenAI

    set_tracing_disabled(True)

    async def run() -> Any:
        client = AsyncOpenAI(base_url=agent_server, api_key="unused", max_retries=0)
        model = OpenAIResponsesModel(model="qwen2.5-coder-0.5b-instruct", openai_client=client)
        agent = Agent(name="Agent", instructions=instructions, tools=tools, model=model)
        try:
            return await Runner.run(agent, ask, max_turns=4)
        finally:
            await client.close()

    return asyncio.run(run())


def test_openai_agents_shell_tool(agent_server: str) -> None:
    """The Agents SDK's ShellTool (the `shell` tool type): the model's `shell_call` runs in
    the SDK's executor, whose `shell_call_output` the model reads."""
    from agents import (
        ShellCallOutcome,
        ShellCommandOutput,
        ShellCommandRequest,
        ShellResult,
        ShellTool,
    )

    ran: list[list[str]] = []

    def executor(request: ShellCommandRequest) -> ShellResult:
        ran.append(list(request.data.action.commands))
        return ShellResult(
            output=[
                ShellCommandOutput(
                    stdout="notes.txt  report.pdf\n", outcome=ShellCallOutcome("exit", 0)
                )
                for _ in request.data.action.commands
            ]
        )

    result = _agent_run(
        agent_server,
        [ShellTool(executor=executor)],
        "You run shell commands with the shell tool to answer.",
        "Which files are in the current directory? Run ls.",
    )
    assert ran and all(isinstance(c, str) and c for c in ran[0]), ran
    assert isinstance(result.final_output, str) and result.final_output.strip()


def test_openai_agents_apply_patch_tool(agent_server: str, tmp_path: Path) -> None:
    """The Agents SDK's ApplyPatchTool (the `apply_patch` tool type): the model's
    `apply_patch_call` is applied by the SDK's editor."""
    from agents import ApplyPatchTool
    from agents.apply_diff import apply_diff
    from agents.editor import ApplyPatchOperation, ApplyPatchResult

    class Editor:
        def create_file(self, operation: ApplyPatchOperation) -> ApplyPatchResult:
            path = tmp_path / Path(operation.path).name
            path.write_text(apply_diff("", operation.diff or "", mode="create"))
            return ApplyPatchResult(status="completed", output=f"Created {operation.path}")

        def update_file(self, operation: ApplyPatchOperation) -> ApplyPatchResult:
            path = tmp_path / Path(operation.path).name
            path.write_text(apply_diff(path.read_text(), operation.diff or ""))
            return ApplyPatchResult(status="completed", output=f"Updated {operation.path}")

        def delete_file(self, operation: ApplyPatchOperation) -> ApplyPatchResult:
            (tmp_path / Path(operation.path).name).unlink()
            return ApplyPatchResult(status="completed", output=f"Deleted {operation.path}")

    _agent_run(
        agent_server,
        [ApplyPatchTool(editor=Editor())],
        "You edit files with the apply_patch tool.",
        "Create the file hello.txt containing the line: hi",
    )
    written = list(tmp_path.iterdir())
    assert [p.name for p in written] == ["hello.txt"], written
    assert "hi" in written[0].read_text()
