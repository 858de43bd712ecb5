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
