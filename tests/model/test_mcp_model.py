"""MCP servers' tools on the real model, through real clients: a real `oars serve` (allowed to
reach loopback MCP servers), the tests' MCP server (tests/mcp_server.py, the `mcp` package)."""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import McpProcess
from tests.model.conftest import MODEL, RecordingTransport, stream

pytestmark = pytest.mark.model

CLIENTS = Path(__file__).parent.parent.parent / "clients"
QUESTION = "Open the vault with the code 1234 and tell me the word inside."
WORD = "aubergine"


def _vault(server: McpProcess, **fields: Any) -> dict[str, Any]:
    return {
        "type": "mcp",
        "server_label": "vault",
        "server_url": server.url,
        "allowed_tools": ["open_vault"],
        "require_approval": "never",
        **fields,
    }


def test_a_forced_call_s_result_reaches_the_answer(agent_server: str, mcp_http: McpProcess) -> None:
    body = {
        "model": MODEL,
        "input": QUESTION,
        "tools": [_vault(mcp_http)],
        "tool_choice": {"type": "mcp", "server_label": "vault"},
        "max_output_tokens": 60,
    }
    final = stream(agent_server, body).final
    listing, call, message = final["output"]
    assert listing["type"] == "mcp_list_tools" and call["type"] == "mcp_call", final["output"]
    assert json.loads(call["arguments"]) == {"code": "1234"} and call["status"] == "completed"
    assert WORD in message["content"][0]["text"].lower(), message
    assert final["usage"]["output_tokens"] > 0 and final["status"] == "completed"


def test_the_openai_sdk_reads_the_typed_mcp_events(agent_server: str, mcp_http: McpProcess) -> None:
    from openai import OpenAI
    from openai.types.responses import (
        ResponseMcpCallArgumentsDoneEvent,
        ResponseMcpCallCompletedEvent,
        ResponseMcpListToolsCompletedEvent,
    )

    transport = RecordingTransport()
    import httpx2

    client = OpenAI(
        base_url=agent_server, api_key="unused", http_client=httpx2.Client(transport=transport)
    )
    tools: Any = [_vault(mcp_http)]
    with (
        client,
        client.responses.stream(
            model=MODEL,
            input=QUESTION,
            tools=tools,
            tool_choice={"type": "mcp", "server_label": "vault"},
            max_output_tokens=60,
        ) as events,
    ):
        kinds = [type(event) for event in events]
        final = events.get_final_response()
    assert ResponseMcpListToolsCompletedEvent in kinds and ResponseMcpCallCompletedEvent in kinds
    assert ResponseMcpCallArgumentsDoneEvent in kinds
    assert [item.type for item in final.output] == ["mcp_list_tools", "mcp_call", "message"]
    assert WORD in final.output_text.lower()
    from oars.validator import validate_sse

    report = validate_sse(transport.bodies[-1].decode())
    assert report.ok, report.text()


def _agent(agent_server: str, mcp_http: McpProcess, **hosted: Any) -> Any:
    from agents import Agent, HostedMCPTool, ModelSettings, OpenAIResponsesModel
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=agent_server, api_key="unused", max_retries=0)
    model = OpenAIResponsesModel(model=MODEL, openai_client=client)
    tool = HostedMCPTool(
        tool_config={**_vault(mcp_http), "require_approval": "always"},  # type: ignore[typeddict-item]
        **hosted,
    )
    agent = Agent(
        name="Vault",
        instructions="Use the vault tool, then answer with the word it gives.",
        tools=[tool],
        model=model,
        model_settings=ModelSettings(tool_choice="mcp", max_tokens=60),
    )
    return agent, client


def test_the_agents_sdk_hosted_mcp_tool_approves_by_callback(
    agent_server: str, mcp_http: McpProcess
) -> None:
    from agents import Runner, set_tracing_disabled

    set_tracing_disabled(True)
    asked: list[str] = []

    def approve(request: Any) -> Any:
        asked.append(request.data.name)
        return {"approve": True}

    agent, client = _agent(agent_server, mcp_http, on_approval_request=approve)

    async def run() -> Any:
        try:
            return await Runner.run(agent, QUESTION, max_turns=4)
        finally:
            await client.close()

    result = asyncio.run(run())
    assert asked == ["open_vault"]
    kinds = [item.type for item in result.new_items]
    assert "mcp_approval_request_item" in kinds, kinds
    raw: list[Any] = [getattr(item, "raw_item", None) for item in result.new_items]
    calls = [r for r in raw if getattr(r, "type", None) == "mcp_call"]
    assert calls and WORD in (calls[0].output or ""), kinds
    assert WORD in str(result.final_output).lower(), result.final_output


def test_the_agents_sdk_hosted_mcp_tool_stops_for_approval_without_a_callback(
    agent_server: str, mcp_http: McpProcess
) -> None:
    from agents import Runner, set_tracing_disabled

    set_tracing_disabled(True)
    agent, client = _agent(agent_server, mcp_http)

    async def run() -> tuple[Any, Any]:
        try:
            first = await Runner.run(agent, QUESTION, max_turns=4)
            state = first.to_state()
            for interruption in first.interruptions:
                state.approve(interruption)
            return first, await Runner.run(agent, state, max_turns=4)
        finally:
            await client.close()

    first, second = asyncio.run(run())
    assert first.interruptions, first.new_items
    assert WORD in str(second.final_output).lower(), second.final_output


def test_the_ai_sdk_mcp_tool(agent_server: str, mcp_http: McpProcess) -> None:
    assert (CLIENTS / "node_modules").exists(), "`make test` installs the client matrix"
    run = subprocess.run(
        ["node", "aisdk_mcp.mjs", agent_server, MODEL, mcp_http.url],
        cwd=CLIENTS,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["calls"] and result["calls"][0]["executed"], result
    assert WORD in json.dumps(result["results"]), result
    assert WORD in result["text"].lower(), result
